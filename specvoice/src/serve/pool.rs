//! The engines, loaded once and lent to one session at a time, and the bounded queue of
//! sessions waiting for one.
//!
//! A session takes an engine at once when one is free, else waits in the queue (first come,
//! first served) if the queue has room, else is refused. An engine comes back when its session
//! ends; an engine a session lost (its thread panicked mid-work) is rebuilt with the engine
//! factory, and if that fails the pool shrinks, and waiting sessions are refused once it is
//! empty.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{oneshot, watch};

use super::Engine;
use crate::Result;

/// Builds an engine in place of a lost one.
pub(crate) type Factory<E> = Arc<dyn Fn() -> Result<E> + Send + Sync>;

/// Why a session gets no engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Every engine is busy and the queue is full.
    Full,
    /// No engine is left (every rebuild failed).
    NoEngines,
}

struct State<E> {
    free: Vec<E>,
    /// Waiting sessions in order: their ticket and where their engine goes.
    waiting: VecDeque<(u64, oneshot::Sender<E>)>,
    next_ticket: u64,
    /// Engines in the pool, free or lent.
    engines: usize,
}

/// The pool of engines (any type, so that it can be tested without models).
pub(crate) struct Pool<E = Engine> {
    state: Mutex<State<E>>,
    queue_bound: usize,
    factory: Factory<E>,
    /// Bumped whenever the queue changes, so waiting sessions can report their position.
    changed: watch::Sender<u64>,
}

/// An engine now, or a place in the queue.
pub(crate) enum Acquired<E> {
    Now(Box<E>),
    Queued(Waiter<E>),
}

impl<E> Pool<E> {
    pub fn new(engines: Vec<E>, queue_bound: usize, factory: Factory<E>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                engines: engines.len(),
                free: engines,
                waiting: VecDeque::new(),
                next_ticket: 0,
            }),
            queue_bound,
            factory,
            changed: watch::Sender::new(0),
        })
    }

    /// A thread that panicked while holding the lock left the queue consistent: every change
    /// is a single push or pop.
    fn lock(&self) -> MutexGuard<'_, State<E>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn acquire(self: &Arc<Self>) -> Result<Acquired<E>, Refusal> {
        let mut state = self.lock();
        if state.engines == 0 {
            return Err(Refusal::NoEngines);
        }
        if state.waiting.is_empty() {
            if let Some(engine) = state.free.pop() {
                return Ok(Acquired::Now(Box::new(engine)));
            }
        }
        if state.waiting.len() >= self.queue_bound {
            return Err(Refusal::Full);
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let (sender, receiver) = oneshot::channel();
        state.waiting.push_back((ticket, sender));
        drop(state);
        self.notify();
        Ok(Acquired::Queued(Waiter {
            pool: Arc::clone(self),
            ticket,
            receiver,
            changes: self.changed.subscribe(),
        }))
    }

    /// An engine comes back: to the first waiting session, else to the free ones.
    pub fn release(&self, engine: E) {
        let mut state = self.lock();
        let mut engine = engine;
        while let Some((_, sender)) = state.waiting.pop_front() {
            match sender.send(engine) {
                Ok(()) => {
                    drop(state);
                    self.notify();
                    return;
                }
                // That session left the queue meanwhile.
                Err(back) => engine = back,
            }
        }
        state.free.push(engine);
        drop(state);
        self.notify();
    }

    /// Engines free now, and sessions waiting for one.
    pub fn occupancy(&self) -> (usize, usize) {
        let state = self.lock();
        (state.free.len(), state.waiting.len())
    }

    /// A session lost its engine: a new one is built in its place (on the calling thread), or
    /// the pool shrinks.
    pub fn rebuild(&self) {
        match (self.factory)() {
            Ok(engine) => self.release(engine),
            Err(e) => {
                tracing::error!("an engine was lost and could not be rebuilt: {e}");
                let mut state = self.lock();
                state.engines -= 1;
                if state.engines == 0 {
                    // Their engines will never come: dropping the senders tells them.
                    state.waiting.clear();
                }
                drop(state);
                self.notify();
            }
        }
    }
}

/// A session's place in the queue; leaving it (drop) gives up the place.
pub(crate) struct Waiter<E> {
    pool: Arc<Pool<E>>,
    ticket: u64,
    receiver: oneshot::Receiver<E>,
    changes: watch::Receiver<u64>,
}

impl<E> Waiter<E> {
    /// Place in the queue, 1 first.
    pub fn position(&self) -> usize {
        let state = self.pool.lock();
        state
            .waiting
            .iter()
            .position(|(ticket, _)| *ticket == self.ticket)
            .map_or(0, |i| i + 1)
    }

    /// Waits for the engine (`Some`), or until the queue moves (`None`: the position may have
    /// changed). Cancel-safe.
    pub async fn wait(&mut self) -> Option<Result<E, Refusal>> {
        tokio::select! {
            engine = &mut self.receiver => Some(engine.map_err(|_| Refusal::NoEngines)),
            moved = self.changes.changed() => match moved {
                Ok(()) => None,
                // The pool is gone with its sender: no engine will come.
                Err(_) => Some(Err(Refusal::NoEngines)),
            },
        }
    }
}

impl<E> Drop for Waiter<E> {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        state.waiting.retain(|(ticket, _)| *ticket != self.ticket);
        drop(state);
        // An engine sent just before leaving goes back.
        self.receiver.close();
        if let Ok(engine) = self.receiver.try_recv() {
            self.pool.release(engine);
        }
        self.pool.notify();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::Error;

    fn pool(engines: Vec<u32>, bound: usize, rebuilt: u32) -> Arc<Pool<u32>> {
        Pool::new(engines, bound, Arc::new(move || Ok(rebuilt)))
    }

    fn queued(acquired: Result<Acquired<u32>, Refusal>) -> Waiter<u32> {
        match acquired {
            Ok(Acquired::Queued(waiter)) => waiter,
            Ok(Acquired::Now(engine)) => panic!("engine {engine} at once"),
            Err(refusal) => panic!("{refusal:?}"),
        }
    }

    fn now(acquired: Result<Acquired<u32>, Refusal>) -> u32 {
        match acquired {
            Ok(Acquired::Now(engine)) => *engine,
            _ => panic!("no engine at once"),
        }
    }

    /// The engine the waiter gets, skipping queue moves.
    async fn engine(waiter: &mut Waiter<u32>) -> Result<u32, Refusal> {
        let wait = async {
            loop {
                if let Some(engine) = waiter.wait().await {
                    return engine;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), wait)
            .await
            .expect("the engine comes")
    }

    #[tokio::test]
    async fn sessions_queue_first_come_first_served_up_to_the_bound() {
        let pool = pool(vec![7], 2, 0);
        let first = now(pool.acquire());
        let mut second = queued(pool.acquire());
        let mut third = queued(pool.acquire());
        assert!(matches!(pool.acquire(), Err(Refusal::Full)));
        assert_eq!((second.position(), third.position()), (1, 2));
        pool.release(first);
        assert_eq!(engine(&mut second).await, Ok(7));
        assert_eq!(third.position(), 1);
        // The queue has room again.
        let fourth = queued(pool.acquire());
        assert_eq!(fourth.position(), 2);
        pool.release(7);
        assert_eq!(engine(&mut third).await, Ok(7));
    }

    #[tokio::test]
    async fn leaving_the_queue_gives_up_the_place_and_any_engine_sent_meanwhile() {
        let pool = pool(vec![1], 2, 0);
        let first = now(pool.acquire());
        let second = queued(pool.acquire());
        let third = queued(pool.acquire());
        drop(second);
        assert_eq!(third.position(), 1);
        // An engine handed to a session that leaves before taking it goes to the next one.
        let mut fourth = queued(pool.acquire());
        pool.release(first);
        drop(third);
        assert_eq!(engine(&mut fourth).await, Ok(1));
        // With nobody waiting, it is free for the next session at once.
        pool.release(1);
        assert_eq!(now(pool.acquire()), 1);
    }

    #[tokio::test]
    async fn a_lost_engine_is_rebuilt_or_the_pool_shrinks() {
        let pool = pool(vec![1], 1, 9);
        now(pool.acquire());
        let mut waiter = queued(pool.acquire());
        pool.rebuild();
        assert_eq!(engine(&mut waiter).await, Ok(9));

        let failing = Arc::new(AtomicBool::new(true));
        let fails = Arc::clone(&failing);
        let pool: Arc<Pool<u32>> = Pool::new(
            vec![1],
            1,
            Arc::new(move || match fails.load(Ordering::SeqCst) {
                true => Err(Error::Serve("the models are gone".into())),
                false => Ok(2),
            }),
        );
        now(pool.acquire());
        let mut waiter = queued(pool.acquire());
        pool.rebuild();
        assert_eq!(engine(&mut waiter).await, Err(Refusal::NoEngines));
        assert!(matches!(pool.acquire(), Err(Refusal::NoEngines)));
    }
}
