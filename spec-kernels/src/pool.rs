//! A small fork-join pool for the kernels: one worker per extra core, woken by an epoch
//! counter they spin on between matmuls (a forward runs hundreds of matmuls a few
//! microseconds apart, too short for sleeping threads to wake in time) and park on when idle.
//! The calling thread takes part, so `threads` includes it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);

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
    }
}

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
