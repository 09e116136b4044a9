//! Partial transcripts delivered live, from the recogniser's thread to the assistant's.
//!
//! A plain channel, plus one thing the assistant needs while it computes: whether the final
//! partial has been sent. A model working ahead on a guess can then stop part-way through a
//! forward when the user's last words arrive, instead of making them wait for its end
//! ([`FinalSignal`]).

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvError, SendError, TryRecvError};
use std::sync::Arc;

use crate::Partial;

/// A channel of partial transcripts: [`PartialSender`] for the recogniser's thread,
/// [`PartialReceiver`] for the assistant. It may carry many turns, each ended by a final partial.
pub fn partial_channel() -> (PartialSender, PartialReceiver) {
    let (sender, receiver) = mpsc::channel();
    let finals_sent = Arc::new(AtomicUsize::new(0));
    (
        PartialSender {
            sender,
            finals_sent: finals_sent.clone(),
        },
        PartialReceiver {
            receiver,
            finals_sent,
            finals_received: Cell::new(0),
        },
    )
}

/// The sending half of a [`partial_channel`]; clones send into the same channel.
#[derive(Clone)]
pub struct PartialSender {
    sender: mpsc::Sender<Partial>,
    finals_sent: Arc<AtomicUsize>,
}

impl PartialSender {
    /// Sends `partial`; fails, handing it back, once the receiver is gone.
    pub fn send(&self, partial: Partial) -> Result<(), SendError<Partial>> {
        let is_final = partial.is_final;
        self.sender.send(partial)?;
        if is_final {
            // Counted once it is in the channel: a receiver told of it finds it there.
            self.finals_sent.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }
}

impl fmt::Debug for PartialSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartialSender").finish_non_exhaustive()
    }
}

/// The receiving half of a [`partial_channel`].
pub struct PartialReceiver {
    receiver: mpsc::Receiver<Partial>,
    finals_sent: Arc<AtomicUsize>,
    finals_received: Cell<usize>,
}

impl PartialReceiver {
    /// The next partial if one is waiting.
    pub fn try_recv(&self) -> Result<Partial, TryRecvError> {
        self.receiver.try_recv().inspect(|p| self.count(p))
    }

    /// The next partial, waiting for it; fails once every sender is gone and nothing is left.
    pub fn recv(&self) -> Result<Partial, RecvError> {
        self.receiver.recv().inspect(|p| self.count(p))
    }

    /// Tells, from any thread, whether a final partial has been sent that this receiver had not
    /// received when the signal was made.
    pub fn final_signal(&self) -> FinalSignal {
        FinalSignal {
            finals_sent: self.finals_sent.clone(),
            finals_received: self.finals_received.get(),
        }
    }

    fn count(&self, partial: &Partial) {
        if partial.is_final {
            self.finals_received.set(self.finals_received.get() + 1);
        }
    }
}

impl fmt::Debug for PartialReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartialReceiver").finish_non_exhaustive()
    }
}

/// Whether a final partial is waiting in a [`partial_channel`] (see
/// [`PartialReceiver::final_signal`]). Cheap to ask, `Send` and `Sync`.
#[derive(Clone, Debug)]
pub struct FinalSignal {
    finals_sent: Arc<AtomicUsize>,
    finals_received: usize,
}

impl FinalSignal {
    /// Whether a final partial was sent since the signal was made and not received then.
    pub fn arrived(&self) -> bool {
        self.finals_sent.load(Ordering::Acquire) > self.finals_received
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn partial(text: &str, is_final: bool) -> Partial {
        Partial::new(Duration::ZERO, text, is_final)
    }

    #[test]
    fn the_signal_tells_of_a_final_partial_not_yet_received() {
        let (sender, receiver) = partial_channel();
        let signal = receiver.final_signal();
        sender.send(partial("how", false)).unwrap();
        assert!(!signal.arrived(), "a partial that is not final");
        let from_another_thread = std::thread::spawn({
            let sender = sender.clone();
            move || sender.send(partial("how are you", true)).unwrap()
        });
        from_another_thread.join().unwrap();
        assert!(signal.arrived());
        assert_eq!(receiver.try_recv().unwrap().text, "how");
        assert!(receiver.recv().unwrap().is_final);
        // Received: a signal made now waits for the next turn's final partial.
        let next = receiver.final_signal();
        assert!(!next.arrived());
        sender.send(partial("and you", true)).unwrap();
        assert!(next.arrived());
        assert!(receiver.try_recv().unwrap().is_final);
        assert!(!receiver.final_signal().arrived());
        assert!(matches!(receiver.try_recv(), Err(TryRecvError::Empty)));
        drop(sender);
        assert!(receiver.recv().is_err());
    }

    #[test]
    fn sending_to_a_dropped_receiver_hands_the_partial_back() {
        let (sender, receiver) = partial_channel();
        drop(receiver);
        let err = sender.send(partial("hello", true)).unwrap_err();
        assert_eq!(err.0.text, "hello");
    }
}
