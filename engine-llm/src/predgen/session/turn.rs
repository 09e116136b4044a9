//! A turn's state: its clock, phase, guess and answer, and what it reports.

use std::time::{Duration, Instant};

use spec_core::Interrupt;

use spec_voice::{keeps_words, Clock, FinalSignal, Partial};

use super::end_of_turn::Estimate;
use super::{Answer, Candidates, Completing, Event, EventKind, Turn, RECYCLED_GUESSES};
use crate::predgen::{Continuation, PredGenConfig};
use crate::{Error, Result};

/// What a [`PredGen::step`](super::PredGen::step) did.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// What happened, in order (the sentences ready for speech are
    /// [`EventKind::SpeakAhead`], [`EventKind::FirstSentence`] and [`EventKind::NextSentence`]).
    pub events: Vec<Event>,
    pub status: Status,
}

/// Whether a turn has more to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// There is more to do now: step again (after hearing any partial that arrived).
    Working,
    /// Nothing to do until the next partial arrives.
    Idle,
    /// The answer is complete; the turn has joined the history.
    Done(Box<Turn>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TurnKind {
    Speculative,
    Cascade,
}

/// Where a turn is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// The user is speaking.
    Listening,
    /// The final partial is verified; the first sentence may need generating.
    FirstSentence,
    /// The first sentence is complete and goes to the speaker.
    Speaking,
    /// The rest of the answer.
    Rest,
}

/// How a turn knows, while a step works ahead of the user, that the final partial arrived.
pub(super) enum FinalArrival {
    /// It cannot tell: a step runs to its end (partials handed over with [`PredGen::hear`]).
    Unknown,
    /// At this time of the simulated clock (a replayed turn).
    At(Duration),
    /// When the sender of a live turn's partials has sent it.
    Signalled(FinalSignal),
}

impl FinalArrival {
    /// The interrupt of a step that starts at `started` (the wall clock) and `now` (the session's).
    pub(super) fn interrupt(&self, started: Instant, now: Duration) -> Option<Interrupt> {
        match self {
            Self::Unknown => None,
            // The simulated clock advances by the compute charged, so the step reaches the
            // final partial's time once its compute outlasts the time left.
            Self::At(at) => Some(Interrupt::at(started + at.saturating_sub(now))),
            Self::Signalled(signal) => {
                let signal = signal.clone();
                Some(Interrupt::new(move || signal.arrived()))
            }
        }
    }
}

/// A turn in progress.
pub(super) struct TurnState {
    /// The session's clock (the pipeline's, shared).
    pub(super) clock: Clock,
    pub(super) kind: TurnKind,
    pub(super) phase: Phase,
    /// The newest partial not yet taken up.
    pub(super) pending: Option<Partial>,
    pub(super) final_input: Option<Partial>,
    /// How a step working ahead learns that the final partial arrived.
    pub(super) final_arrival: FinalArrival,
    pub(super) last_heard_at: Option<Duration>,
    /// The last step verified a partial: the next one generates.
    pub(super) just_verified: bool,
    /// The prompt the guess answers (the partial verified last, or its completion), and its
    /// question.
    pub(super) heard_prompt: Option<Vec<u32>>,
    pub(super) heard_text: String,
    /// The question as the model completed it last.
    pub(super) completed: Option<String>,
    /// The words the model last completed, or would not end within
    /// [`MAX_COMPLETION_TOKENS`].
    pub(super) completion_tried: Option<String>,
    /// A completion in progress, a token a step.
    pub(super) completing: Option<Completing>,
    /// The end of the user's turn after the newest partial estimated.
    pub(super) end_of_turn: Option<Estimate>,
    /// The guess, and after the final partial the answer.
    pub(super) guess: Answer,
    /// The rejected part of the last guess: Jacobi's starting guess.
    pub(super) rejected_tail: Vec<u32>,
    /// Every guess of the turn that lost a part to verification, the newest last (at most
    /// [`RECYCLED_GUESSES`]): the lookup continuation copies from them, as SpecASR recycles
    /// its drafts, since a guess made for an earlier partial often says what the answer to
    /// the whole question says a few words later.
    pub(super) recycled: Vec<Vec<u32>>,
    /// Guessed first sentences reported for synthesis ahead of time.
    pub(super) spoken_ahead: Vec<String>,
    /// Candidate questions answered ahead, with `question_candidates` above 1.
    pub(super) candidates: Option<Candidates>,
    pub(super) timeline: Vec<Event>,
    /// Events already returned by a step.
    pub(super) reported: usize,
    pub(super) tokens_during_input: usize,
    pub(super) forwards_during_input: usize,
    pub(super) question: String,
    pub(super) prompt: Vec<u32>,
    pub(super) input_end: Duration,
    pub(super) final_partial_wait: Duration,
    pub(super) guessed_at_end: usize,
    pub(super) kept_at_end: usize,
    pub(super) forwards_to_first_sentence: usize,
    pub(super) first_sentence: String,
    pub(super) first_sentence_at: Duration,
    /// The first piece of the answer's first sentence was reported before the sentence was
    /// complete.
    pub(super) first_piece_reported: bool,
    /// When the answer's first words went to speech (its first piece, or first sentence).
    pub(super) first_words_at: Option<Duration>,
    /// Sentences reported so far.
    pub(super) spoken: usize,
}

impl TurnState {
    /// Keeps a discarded guess for lookup, dropping the oldest beyond [`RECYCLED_GUESSES`].
    pub(super) fn recycle(&mut self, discarded: Option<Vec<u32>>) {
        if let Some(guess) = discarded.filter(|g| !g.is_empty()) {
            if self.recycled.len() == RECYCLED_GUESSES {
                self.recycled.remove(0);
            }
            self.recycled.push(guess);
        }
    }

    pub(super) fn new(clock: Clock, kind: TurnKind) -> Self {
        Self {
            clock,
            kind,
            phase: Phase::Listening,
            pending: None,
            final_input: None,
            final_arrival: FinalArrival::Unknown,
            last_heard_at: None,
            just_verified: false,
            heard_prompt: None,
            heard_text: String::new(),
            completed: None,
            completion_tried: None,
            completing: None,
            end_of_turn: None,
            guess: Answer::default(),
            rejected_tail: Vec::new(),
            recycled: Vec::new(),
            spoken_ahead: Vec::new(),
            candidates: None,
            timeline: Vec::new(),
            reported: 0,
            tokens_during_input: 0,
            forwards_during_input: 0,
            question: String::new(),
            prompt: Vec::new(),
            input_end: Duration::ZERO,
            final_partial_wait: Duration::ZERO,
            guessed_at_end: 0,
            kept_at_end: 0,
            forwards_to_first_sentence: 0,
            first_sentence: String::new(),
            first_sentence_at: Duration::ZERO,
            first_piece_reported: false,
            first_words_at: None,
            spoken: 0,
        }
    }

    /// Reports a guessed first sentence for synthesis ahead of time, once.
    pub(super) fn speak_ahead(&mut self, sentence: String) {
        if !self
            .spoken_ahead
            .iter()
            .any(|s| s.trim() == sentence.trim())
        {
            self.spoken_ahead.push(sentence.clone());
            self.timeline
                .push(self.event(EventKind::SpeakAhead { sentence }));
        }
    }

    /// The question the words `heard` ask, as far as the model's completions tell: the
    /// completed question while `heard` fits it, `heard` itself when the model was asked to
    /// complete exactly these words and would not end them; `None` when it was not asked yet.
    pub(super) fn question_for(&self, heard: &str) -> Option<String> {
        if let Some(completed) = &self.completed {
            if keeps_words(heard, completed) {
                return Some(completed.clone());
            }
        }
        (self.completion_tried.as_deref() == Some(heard)).then(|| heard.to_string())
    }

    pub(super) fn event(&self, kind: EventKind) -> Event {
        Event {
            at: self.clock.now(),
            kind,
        }
    }

    /// How the answer is generated after the final partial.
    pub(super) fn continuation(&self, config: &PredGenConfig) -> Continuation {
        match self.kind {
            TurnKind::Speculative => config.continuation,
            TurnKind::Cascade => Continuation::Autoregressive,
        }
    }
}

pub(super) fn check_inputs(inputs: &[Partial]) -> Result<()> {
    let Some(last) = inputs.last() else {
        return Err(Error::Input("a turn needs at least one input".into()));
    };
    if !last.is_final || inputs[..inputs.len() - 1].iter().any(|p| p.is_final) {
        return Err(Error::Input(
            "the last input of a turn, and only the last, must be final".into(),
        ));
    }
    if inputs.windows(2).any(|w| w[1].at < w[0].at) {
        return Err(Error::Input("inputs must arrive in order of time".into()));
    }
    if last.text.trim().is_empty() {
        return Err(Error::Input("the final input is empty".into()));
    }
    Ok(())
}

pub(super) fn heard_event(input: &Partial) -> EventKind {
    EventKind::Heard {
        text: input.text.clone(),
        is_final: input.is_final,
    }
}
