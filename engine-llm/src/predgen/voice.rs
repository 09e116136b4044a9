//! Speaking a PredGen turn: the model only reports which sentences are ready
//! ([`EventKind::SpeakAhead`], [`EventKind::FirstPiece`], [`EventKind::FirstSentence`],
//! [`EventKind::NextSentence`]); the
//! caller's synthesizer speaks them on the session's timeline through a [`TurnVoice`]
//! (`spec_voice::Speaker`: guessed first sentences prepared while the user speaks, their audio
//! played at once when the answer starts with one of them).

use std::time::Duration;

use spec_voice::{Clock, SentenceSynthesizer, Speaker, Speech};

use super::{Event, EventKind, Turn};
use crate::Result;

/// The voice of one turn at a time: feed it every step's events ([`TurnVoice::speak`]) and the
/// finished turn ([`TurnVoice::finish`]).
///
/// Preparing a guessed sentence is a bet: its synthesis takes the CPU the recognizer and the
/// model share, and is wasted when the guess changes. By default a guess is prepared as soon
/// as it is reported; with [`TurnVoice::preparing_when_asked`] the newest guess waits until
/// the caller, who knows when the user pauses, calls [`TurnVoice::prepare_guess`].
#[derive(Debug)]
pub struct TurnVoice {
    speaker: Speaker,
    /// The speech events of the turn so far.
    spoken: Vec<Event>,
    prepare_at_once: bool,
    /// The newest guessed first sentence not prepared yet, with when it was reported.
    guess: Option<(String, Duration)>,
}

impl TurnVoice {
    /// A voice on the session's `clock` (synthesis is charged to it: see [`Speaker`]) that
    /// prepares each guessed first sentence as soon as it is reported.
    pub fn new(clock: Clock) -> Self {
        Self {
            speaker: Speaker::new(clock),
            spoken: Vec::new(),
            prepare_at_once: true,
            guess: None,
        }
    }

    /// The voice keeps the newest guess for [`TurnVoice::prepare_guess`] instead.
    pub fn preparing_when_asked(mut self) -> Self {
        self.prepare_at_once = false;
        self
    }

    /// Speaks what a step reported, in order, with `tts`: guessed first sentences are
    /// synthesized ahead of time (or kept for [`TurnVoice::prepare_guess`]), the answer's
    /// sentences as they are complete. Returns what was spoken, as [`EventKind::Speech`]
    /// events at the times their audio is ready.
    pub fn speak(
        &mut self,
        events: &[Event],
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Vec<Event>> {
        let mut spoken = Vec::new();
        for event in events {
            let speech = match &event.kind {
                EventKind::SpeakAhead { sentence } if self.prepare_at_once => self
                    .speaker
                    .prepare(tts, sentence, event.at)?
                    .into_iter()
                    .collect(),
                EventKind::SpeakAhead { sentence } => {
                    self.guess = Some((sentence.clone(), event.at));
                    Vec::new()
                }
                EventKind::FirstPiece { text } => {
                    self.guess = None;
                    self.speaker.speak_first_piece(tts, text, event.at)?
                }
                EventKind::FirstSentence { text } => {
                    self.guess = None;
                    self.speaker.speak_first(tts, text, event.at)?
                }
                EventKind::NextSentence { text } => {
                    vec![self.speaker.speak(tts, text, event.at)?]
                }
                _ => Vec::new(),
            };
            spoken.extend(speech.into_iter().map(|(at, speech)| Event {
                at,
                kind: EventKind::Speech(speech),
            }));
        }
        self.spoken.extend(spoken.iter().cloned());
        Ok(spoken)
    }

    /// Prepares the newest guessed first sentence kept by a voice
    /// [`preparing_when_asked`](TurnVoice::preparing_when_asked), if there is one not prepared
    /// yet; what was spoken, as [`TurnVoice::speak`] returns it.
    pub fn prepare_guess(&mut self, tts: &mut dyn SentenceSynthesizer) -> Result<Option<Event>> {
        let Some((sentence, at)) = self.guess.take() else {
            return Ok(None);
        };
        let Some((at, speech)) = self.speaker.prepare(tts, &sentence, at)? else {
            return Ok(None);
        };
        let event = Event {
            at,
            kind: EventKind::Speech(speech),
        };
        self.spoken.push(event.clone());
        Ok(Some(event))
    }

    /// Whether a guess waits for [`TurnVoice::prepare_guess`].
    pub fn has_guess(&self) -> bool {
        self.guess.is_some()
    }

    /// The turn is complete: the turn with its speech, the speech events in its timeline.
    /// The voice is ready for the next turn.
    pub fn finish(&mut self, mut turn: Turn) -> SpokenTurn {
        self.guess = None;
        turn.timeline.append(&mut self.spoken);
        turn.timeline.sort_by_key(|e| e.at);
        SpokenTurn {
            turn,
            speech: self.speaker.finish(),
        }
    }

    /// The turn is dropped (barge-in): what was spoken or prepared for it is discarded.
    pub fn cancel(&mut self) {
        self.guess = None;
        self.spoken.clear();
        self.speaker.cancel();
    }
}

/// A turn answered and spoken: the model's [`Turn`] and the [`Speech`] of its answer.
#[derive(Clone, Debug, PartialEq)]
pub struct SpokenTurn {
    pub turn: Turn,
    pub speech: Speech,
}

impl SpokenTurn {
    /// From the end of input until the first audio plays.
    pub fn audio_latency(&self) -> Duration {
        self.speech
            .first_audio_at
            .map_or(Duration::ZERO, |at| at.saturating_sub(self.turn.input_end))
    }

    /// The first sentence's audio was synthesized ahead of time.
    pub fn prepared_audio_used(&self) -> bool {
        self.speech.prepared_audio_used
    }
}
