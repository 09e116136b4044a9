//! A small fork-join pool for the kernels: one worker per extra core, woken by an epoch
//! counter they spin on between matmuls (a forward runs hundreds of matmuls a few
//! microseconds apart, too short for sleeping threads to wake in time) and park on when idle.
//! The calling thread takes part, so `threads` includes it.
//!
//! Between jobs the caller does serial work (norms, attention, activation quantization) while
//! the memory bus sits idle; a worker that has finished its tasks spends that time pulling the
//! bytes the next job is expected to read ([`Pool::expect_next`]) into the caches.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);

/// Most byte ranges (matrices of the next matmuls) the idle workers are told to warm.
pub(crate) const MAX_WARM_RANGES: usize = 16;

/// Most bytes an idle worker pulls toward the caches for one prediction: a quarter of a large
/// L3, so what it warms is still there when the jobs read it.
const MAX_WARM_BYTES: usize = 8 << 20;

/// Bytes a worker prefetches between looks at whether the next job has started.
const WARM_STRIDE: usize = 4096;

/// The memory the next job is expected to read, `generation` counting the predictions.
#[derive(Clone, Copy, Default)]
struct WarmRanges {
    ranges: [(usize, usize); MAX_WARM_RANGES],
    count: usize,
    generation: u64,
}

type Job = dyn Fn(usize) + Sync;

/// A value alone on its cache lines (two, for the adjacent-line prefetcher), so that the
/// threads writing it do not take the lines the others spin on.
#[repr(align(128))]
struct Alone<T>(T);

/// Most tasks of one hand-out: a job of more runs in rounds of this many.
const MAX_TASKS: usize = u16::MAX as usize;

/// The state word: the job's epoch (bits 32–63, counted modulo 2³²), its task count (16–31)
/// and the next task to hand out (0–15). A worker takes a task with a compare-and-swap on
/// the whole word, so it can never take one of a job other than the one the word names.
#[derive(Clone, Copy, PartialEq)]
struct State(u64);

impl State {
    fn new(epoch: u64, tasks: usize) -> Self {
        Self((epoch << 32) | ((tasks as u64) << 16))
    }

    fn epoch(self) -> u64 {
        self.0 >> 32
    }

    fn tasks(self) -> usize {
        (self.0 >> 16) as usize & MAX_TASKS
    }

    fn next(self) -> usize {
        self.0 as usize & MAX_TASKS
    }
}

struct Shared {
    state: Alone<AtomicU64>,
    /// The current job: the caller's `&Job`, on its stack for the length of [`Pool::run`].
    /// The caller writes it only between jobs and the workers read it without a lock; a worker
    /// calls it only after its compare-and-swap took a task of the epoch it saw before the
    /// read. The caller writes the next job only after every task of this one has finished, so
    /// that read was of this job (the state is a sequence lock for this pointer).
    job: Alone<AtomicPtr<&'static Job>>,
    /// Tasks of the current job that have not finished, and whether one panicked (the
    /// caller panics in turn).
    pending: Alone<(AtomicUsize, AtomicBool)>,
    sleeping: Vec<Alone<AtomicBool>>,
    warm: Mutex<WarmRanges>,
}

static POOL: OnceLock<Pool> = OnceLock::new();
static REQUESTED_THREADS: OnceLock<usize> = OnceLock::new();

/// Sets the kernels' thread count (the caller included) before their first use; `Err` with the
/// count in force when the pool has already started or a count was set before.
pub fn set_threads(threads: usize) -> Result<(), usize> {
    if let Some(pool) = POOL.get() {
        return Err(pool.threads());
    }
    REQUESTED_THREADS.set(threads.max(1))?;
    if Pool::global().threads() != threads.max(1) {
        return Err(Pool::global().threads());
    }
    Ok(())
}

/// The pool.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<Thread>,
    /// Serialises callers from several threads.
    running: Mutex<()>,
}

impl Pool {
    /// The process-wide pool: [`set_threads`]'s count, else `SPECVOICE_THREADS`, else one
    /// thread per available core.
    pub fn global() -> &'static Pool {
        POOL.get_or_init(|| {
            let threads = REQUESTED_THREADS.get().copied().unwrap_or_else(|| {
                std::env::var("SPECVOICE_THREADS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            });
            Pool::new(threads.max(1))
        })
    }

    fn new(threads: usize) -> Self {
        let shared = Arc::new(Shared {
            state: Alone(AtomicU64::new(0)),
            job: Alone(AtomicPtr::new(std::ptr::null_mut())),
            pending: Alone((AtomicUsize::new(0), AtomicBool::new(false))),
            sleeping: (1..threads)
                .map(|_| Alone(AtomicBool::new(false)))
                .collect(),
            warm: Mutex::new(WarmRanges::default()),
        });
        let workers = (1..threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("spec-kernels-{i}"))
                    .spawn(move || worker(&shared, i - 1))
                    .expect("spawning a kernel thread")
                    .thread()
                    .clone()
            })
            .collect();
        Self {
            shared,
            workers,
            running: Mutex::new(()),
        }
    }

    /// Threads that run tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Tells idle workers which memory the jobs after the one about to run are expected to read
    /// (the `(address, length)` of each of their matrices), so they warm the caches with it once
    /// their tasks are done. Only a hint: the workers prefetch, which never faults, so a range whose
    /// memory has been freed since is harmless.
    pub fn expect_next(&self, ranges: &[(usize, usize)]) {
        let mut warm = self.shared.warm.lock().unwrap_or_else(|e| e.into_inner());
        let count = ranges.len().min(MAX_WARM_RANGES);
        warm.ranges[..count].copy_from_slice(&ranges[..count]);
        warm.count = count;
        warm.generation += 1;
    }

    /// Runs `job(0..tasks)` on the pool's threads and the caller's; returns when all are done.
    pub fn run(&self, tasks: usize, job: &(dyn Fn(usize) + Sync)) {
        if tasks <= 1 || self.workers.is_empty() {
            (0..tasks).for_each(job);
            return;
        }
        let _guard = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if tasks <= MAX_TASKS {
            self.hand_out(tasks, job);
            return;
        }
        for first in (0..tasks).step_by(MAX_TASKS) {
            let round = MAX_TASKS.min(tasks - first);
            self.hand_out(round, &|task| job(first + task));
        }
    }

    /// [`Pool::run`] of at most [`MAX_TASKS`] tasks, under the `running` lock.
    fn hand_out(&self, tasks: usize, job: &(dyn Fn(usize) + Sync)) {
        let s = &self.shared;
        // SAFETY: only the lifetime is erased; the workers dereference this only for a task
        // they took, and we wait below until every task has finished.
        let erased: &'static Job = unsafe { std::mem::transmute(job) };
        let job_ref: *const &'static Job = &erased;
        // Epochs count modulo 2³² (a long-running server passes 2³² jobs within a day).
        let epoch = (State(s.state.0.load(Ordering::Relaxed)).epoch() + 1) & u64::from(u32::MAX);
        s.job.0.store(job_ref.cast_mut(), Ordering::Relaxed);
        let (pending, panicked) = &s.pending.0;
        pending.store(tasks, Ordering::Relaxed);
        panicked.store(false, Ordering::Relaxed);
        // Publishes the stores above; sequentially consistent against a worker that announces
        // its sleep and then checks the state (see `worker`).
        s.state
            .0
            .store(State::new(epoch, tasks).0, Ordering::SeqCst);
        for (thread, sleeping) in self.workers.iter().zip(&s.sleeping) {
            if sleeping.0.load(Ordering::SeqCst) {
                thread.unpark();
            }
        }
        take_tasks(s, job_ref, epoch);
        while pending.load(Ordering::Acquire) > 0 {
            std::hint::spin_loop();
        }
        if panicked.load(Ordering::Relaxed) {
            panic!("a spec-kernels task panicked");
        }
    }
}

/// Runs tasks of the job of `epoch`, which `job` points to, until none is left or another job
/// has started; `job` is dereferenced only for a task taken in that epoch.
fn take_tasks(s: &Shared, job: *const &'static Job, epoch: u64) {
    let mut current = State(s.state.0.load(Ordering::Acquire));
    loop {
        if current.epoch() != epoch || current.next() >= current.tasks() {
            return;
        }
        let task = current.next();
        match s.state.0.compare_exchange_weak(
            current.0,
            current.0 + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                // SAFETY: the task was taken in `epoch`, whose caller waits in `run` until it
                // finishes, so `job` points to that caller's live reference (see `Shared::job`).
                let job = unsafe { *job };
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(task)));
                let (pending, panicked) = &s.pending.0;
                if run.is_err() {
                    panicked.store(true, Ordering::Relaxed);
                }
                pending.fetch_sub(1, Ordering::Release);
                current = State(s.state.0.load(Ordering::Acquire));
            }
            Err(now) => current = State(now),
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0;
    let mut warmed = (0, 0);
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        let mut state = State(s.state.0.load(Ordering::Acquire));
        while state.epoch() == seen {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(1024) && started.elapsed() > SPIN {
                let sleeping = &s.sleeping[index].0;
                sleeping.store(true, Ordering::SeqCst);
                if State(s.state.0.load(Ordering::SeqCst)).epoch() == seen {
                    std::thread::park();
                }
                sleeping.store(false, Ordering::SeqCst);
            }
            state = State(s.state.0.load(Ordering::Acquire));
        }
        seen = state.epoch();
        take_tasks(s, s.job.0.load(Ordering::Relaxed), seen);
        warm_caches(s, seen, &mut warmed);
    }
}

/// Prefetches the memory the next job is expected to read, from where this worker left off
/// for the same prediction (`warmed`: its generation and the bytes done); stops as soon as a
/// job after epoch `seen` starts.
fn warm_caches(s: &Shared, seen: u64, warmed: &mut (u64, usize)) {
    let warm = *s.warm.lock().unwrap_or_else(|e| e.into_inner());
    if warm.generation != warmed.0 {
        *warmed = (warm.generation, 0);
    }
    let mut skip = warmed.1;
    let mut budget = MAX_WARM_BYTES.saturating_sub(skip);
    for &(start, len) in &warm.ranges[..warm.count] {
        if skip >= len {
            skip -= len;
            continue;
        }
        let (start, len) = (start + skip, (len - skip).min(budget));
        skip = 0;
        budget -= len;
        for chunk in (start..start + len).step_by(WARM_STRIDE) {
            if State(s.state.0.load(Ordering::Relaxed)).epoch() != seen {
                return;
            }
            let bytes = WARM_STRIDE.min(start + len - chunk);
            prefetch(chunk, bytes);
            warmed.1 += bytes;
        }
    }
}

/// Asks for the cache lines of `len` bytes at `address` (a hint; it cannot fault).
#[cfg(target_arch = "x86_64")]
fn prefetch(address: usize, len: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    for line in (address..address + len).step_by(64) {
        // SAFETY: a prefetch is a hint that never faults and reads nothing into the program.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(line as *const i8) };
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn prefetch(_address: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let pool = Pool::new(3);
        for tasks in [0, 1, 2, 7, 64] {
            for _ in 0..50 {
                let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.run(tasks, &|t| {
                    counts[t].fetch_add(1, Ordering::SeqCst);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::SeqCst) == 1));
            }
        }
    }

    /// Jobs of alternating sizes back to back: a worker that read one job's state finds the
    /// next job's fields in place while the caller has finished the first alone.
    #[test]
    fn jobs_of_alternating_sizes_each_run_every_task_once() {
        let pool = Pool::new(2);
        let counts: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
        for round in 0..20_000 {
            let tasks = [2, 64, 3, 17][round % 4];
            pool.run(tasks, &|t| {
                counts[t].fetch_add(1, Ordering::Relaxed);
            });
            for (t, count) in counts.iter().enumerate() {
                assert_eq!(count.swap(0, Ordering::Relaxed), usize::from(t < tasks));
            }
        }
    }

    #[test]
    fn a_job_of_more_tasks_than_a_hand_out_holds_runs_in_rounds() {
        let pool = Pool::new(2);
        let tasks = 2 * MAX_TASKS + 5;
        let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
        pool.run(tasks, &|t| {
            counts[t].fetch_add(1, Ordering::Relaxed);
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn callers_on_several_threads_take_turns() {
        let pool = Pool::new(2);
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        pool.run(5, &|t| {
                            total.fetch_add(t, Ordering::SeqCst);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::SeqCst), 4 * 100 * 10);
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_leaves_the_pool_usable() {
        let pool = Pool::new(2);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(4, &|t| assert_ne!(t, 2, "task 2 fails"));
        }));
        assert!(result.is_err());
        let done = AtomicUsize::new(0);
        pool.run(4, &|_| {
            done.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 4);
    }
}
