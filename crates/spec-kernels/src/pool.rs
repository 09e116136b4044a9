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
    sleeping: Vec<AtomicBool>,
}

/// A job pointer with its lifetime erased; `run` waits for every task before returning, so
/// the referent outlives every use.
#[derive(Clone, Copy)]
struct JobRef(*const Job);
// SAFETY: the pointee is `Sync` and outlives its use (see `Pool::run`).
unsafe impl Send for JobRef {}

/// The pool.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<Thread>,
    /// Serialises callers from several threads.
    running: Mutex<()>,
}

impl Pool {
    /// The process-wide pool, one thread per available core.
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let threads = std::env::var("SPECVOICE_THREADS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            Pool::new(threads.max(1))
        })
    }

    fn new(threads: usize) -> Self {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: Mutex::new(None),
            pending: AtomicUsize::new(0),
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
                job(task);
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
