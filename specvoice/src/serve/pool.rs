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

use super::{Engine, EngineFactory};

/// Why a session gets no engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Every engine is busy and the queue is full.
    Full,
    /// No engine is left (every rebuild failed).
    NoEngines,
}

struct State {
    free: Vec<Engine>,
    /// Waiting sessions in order: their ticket and where their engine goes.
    waiting: VecDeque<(u64, oneshot::Sender<Engine>)>,
    next_ticket: u64,
    /// Engines in the pool, free or lent.
    engines: usize,
}

pub(crate) struct Pool {
    state: Mutex<State>,
    queue_bound: usize,
    factory: EngineFactory,
    /// Bumped whenever the queue changes, so waiting sessions can report their position.
    changed: watch::Sender<u64>,
}

/// An engine now, or a place in the queue.
pub(crate) enum Acquired {
    Now(Box<Engine>),
    Queued(Waiter),
}

impl Pool {
    pub fn new(engines: Vec<Engine>, queue_bound: usize, factory: EngineFactory) -> Arc<Self> {
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
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn acquire(self: &Arc<Self>) -> Result<Acquired, Refusal> {
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
    pub fn release(&self, engine: Engine) {
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
pub(crate) struct Waiter {
    pool: Arc<Pool>,
    ticket: u64,
    receiver: oneshot::Receiver<Engine>,
    changes: watch::Receiver<u64>,
}

impl Waiter {
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
    pub async fn wait(&mut self) -> Option<Result<Engine, Refusal>> {
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

impl Drop for Waiter {
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
