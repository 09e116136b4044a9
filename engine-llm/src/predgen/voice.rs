//! Speaking a PredGen turn: the model only reports which sentences are ready
//! ([`EventKind::SpeakAhead`], [`EventKind::FirstSentence`], [`EventKind::NextSentence`]); the
//! caller's synthesizer speaks them on the session's timeline through a [`TurnVoice`]
//! (`spec_voice::Speaker`: guessed first sentences prepared while the user speaks, their audio
//! played at once when the answer starts with one of them).

use std::time::Duration;

use spec_voice::{SentenceSynthesizer, Speaker, Speech};

use super::{Event, EventKind, Turn};
use crate::Result;

/// The voice of one turn at a time: feed it every step's events ([`TurnVoice::speak`]) and the
/// finished turn ([`TurnVoice::finish`]).
#[derive(Debug, Default)]
pub struct TurnVoice {
    speaker: Speaker,
    /// The speech events of the turn so far.
    spoken: Vec<Event>,
}

impl TurnVoice {
    pub fn new() -> Self {
        Self::default()
    }

    /// Speaks what a step reported, in order, with `tts`: guessed first sentences are
    /// synthesized ahead of time, the answer's sentences as they are complete. Returns what
    /// was spoken, as [`EventKind::Speech`] events at the times their audio is ready.
    pub fn speak(
        &mut self,
        events: &[Event],
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Vec<Event>> {
        let mut spoken = Vec::new();
        for event in events {
            let speech = match &event.kind {
                EventKind::SpeakAhead { sentence } => {
                    self.speaker.prepare(tts, sentence, event.at)?
                }
                EventKind::FirstSentence { text } => {
                    self.speaker.speak_first(tts, text, event.at)?
                }
                EventKind::NextSentence { text } => Some(self.speaker.speak(tts, text, event.at)?),
                _ => None,
            };
            if let Some((at, speech)) = speech {
                spoken.push(Event {
                    at,
                    kind: EventKind::Speech(speech),
                });
            }
        }
        self.spoken.extend(spoken.iter().cloned());
        Ok(spoken)
    }

    /// The turn is complete: the turn with its speech, the speech events in its timeline.
    /// The voice is ready for the next turn.
    pub fn finish(&mut self, mut turn: Turn) -> SpokenTurn {
        turn.timeline.append(&mut self.spoken);
        turn.timeline.sort_by_key(|e| e.at);
        SpokenTurn {
            turn,
            speech: self.speaker.finish(),
        }
    }

    /// The turn is dropped (barge-in): what was spoken or prepared for it is discarded.
    pub fn cancel(&mut self) {
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
