//! A small fork-join pool for the kernels: one worker per extra core, woken by an epoch
//! counter they spin on between matmuls (a forward runs hundreds of matmuls a few
//! microseconds apart, too short for sleeping threads to wake in time) and park on when idle.
//! The calling thread takes part, so `threads` includes it.
//!
//! Between jobs the caller does serial work (norms, attention, activation quantization) while
//! the memory bus sits idle; a worker that has finished its tasks spends that time pulling the
//! bytes the next job is expected to read ([`Pool::expect_next`]) into the caches.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

struct Shared {
    /// The current job's epoch (high 32 bits) and next task to hand out (low 32 bits): a
    /// worker takes a task with a compare-and-swap, so it can never take one of a job other
    /// than the one whose pointer it holds.
    state: AtomicU64,
    /// The current job, its task count and epoch.
    job: Mutex<Option<(JobRef, usize, u64)>>,
    /// Tasks of the current job that have not finished.
    pending: AtomicUsize,
    /// Whether a task of the current job panicked (the caller panics in turn).
    panicked: AtomicBool,
    sleeping: Vec<AtomicBool>,
    warm: Mutex<WarmRanges>,
}

/// A job pointer with its lifetime erased; `run` waits for every task before returning, so
/// the referent outlives every use.
#[derive(Clone, Copy)]
struct JobRef(*const Job);
// SAFETY: the pointee is `Sync` and outlives its use (see `Pool::run`).
unsafe impl Send for JobRef {}

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
            state: AtomicU64::new(0),
            job: Mutex::new(None),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleeping: (1..threads).map(|_| AtomicBool::new(false)).collect(),
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
        let s = &self.shared;
        // SAFETY: only the lifetime is erased; we wait below until no task uses it.
        let erased: *const Job =
            unsafe { std::mem::transmute(job as *const (dyn Fn(usize) + Sync)) };
        let epoch = (s.state.load(Ordering::SeqCst) >> 32) + 1;
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some((JobRef(erased), tasks, epoch));
        s.pending.store(tasks, Ordering::SeqCst);
        s.panicked.store(false, Ordering::SeqCst);
        s.state.store(epoch << 32, Ordering::SeqCst);
        for (thread, sleeping) in self.workers.iter().zip(&s.sleeping) {
            if sleeping.load(Ordering::SeqCst) {
                thread.unpark();
            }
        }
        take_tasks(s, job, tasks, epoch);
        while s.pending.load(Ordering::Acquire) > 0 {
            std::hint::spin_loop();
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if s.panicked.load(Ordering::SeqCst) {
            panic!("a spec-kernels task panicked");
        }
    }
}

/// Runs tasks of the job of `epoch` until none is left or another job has started.
fn take_tasks(s: &Shared, job: &(dyn Fn(usize) + Sync), tasks: usize, epoch: u64) {
    let mut current = s.state.load(Ordering::Acquire);
    loop {
        let task = (current & u64::from(u32::MAX)) as usize;
        if current >> 32 != epoch || task >= tasks {
            return;
        }
        match s.state.compare_exchange_weak(
            current,
            current + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(task)));
                if run.is_err() {
                    s.panicked.store(true, Ordering::SeqCst);
                }
                s.pending.fetch_sub(1, Ordering::AcqRel);
                current = s.state.load(Ordering::Acquire);
            }
            Err(now) => current = now,
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0;
    let mut warmed = (0, 0);
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        while s.state.load(Ordering::Acquire) >> 32 == seen {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(1024) && started.elapsed() > SPIN {
                s.sleeping[index].store(true, Ordering::SeqCst);
                if s.state.load(Ordering::SeqCst) >> 32 == seen {
                    std::thread::park();
                }
                s.sleeping[index].store(false, Ordering::SeqCst);
            }
        }
        seen = s.state.load(Ordering::Acquire) >> 32;
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((JobRef(job), tasks, epoch)) = job {
            // SAFETY: a task is taken only while the state holds this job's epoch, and `run`
            // keeps the job alive until every taken task has finished.
            take_tasks(s, unsafe { &*job }, tasks, epoch);
        }
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
            if s.state.load(Ordering::Relaxed) >> 32 != seen {
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
