//! Speaking an answer: the pipeline's side of speech synthesis.
//!
//! The language model only says which sentences are ready: a guessed first sentence worth
//! preparing while the user still speaks, the answer's first sentence once it holds, each later
//! sentence as it completes. A [`Speaker`] turns them into audio on the session's timeline:
//! prepared audio is kept, and when the answer's first sentence is one of the guesses its audio
//! plays at once instead of after the synthesizer's latency. Synthesis runs beside the model, so
//! its compute is not charged to the clock: audio is ready at the sentence's time plus
//! [`Synthesis::first_audio_after`].

use std::fmt;
use std::time::Duration;

use crate::{PreparedAudio, Result, SentenceSynthesizer, Synthesis};

/// What the speaker did, at a time of the session clock.
#[derive(Clone, Debug, PartialEq)]
pub enum SpeechEvent {
    /// A guessed first sentence was synthesized ahead of time; its audio is ready at `ready_at`.
    Prepared {
        sentence: String,
        ready_at: Duration,
    },
    /// The first sentence's audio starts playing (`prepared`: synthesized ahead of time).
    AudioStarts { prepared: bool, audio: Synthesis },
    /// A later sentence is synthesized; its audio is ready at `ready_at`.
    Sentence {
        text: String,
        ready_at: Duration,
        audio: Synthesis,
    },
}

impl fmt::Display for SpeechEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Prepared { sentence, ready_at } => write!(
                f,
                "{:<14} \"{sentence}\" (audio ready at {:.3} s)",
                "to TTS",
                ready_at.as_secs_f64()
            ),
            Self::AudioStarts { prepared, .. } => write!(
                f,
                "{:<14} {}",
                "audio starts",
                if *prepared {
                    "(synthesized ahead of time)"
                } else {
                    "(synthesized after the sentence)"
                }
            ),
            Self::Sentence { text, ready_at, .. } => write!(
                f,
                "{:<14} \"{text}\" (audio ready at {:.3} s)",
                "next sentence",
                ready_at.as_secs_f64()
            ),
        }
    }
}

/// The speech of one answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Speech {
    /// When the first audio was ready to play, on the session clock (`None` before the first
    /// sentence).
    pub first_audio_at: Option<Duration>,
    /// The first sentence's audio was synthesized ahead of time.
    pub prepared_audio_used: bool,
    /// The answer's audio, sentence by sentence.
    pub audio: Vec<Synthesis>,
}

/// Speaks one answer at a time (see the module's documentation); a new answer starts with
/// [`Speaker::finish`] or [`Speaker::cancel`].
#[derive(Clone, Debug, Default)]
pub struct Speaker {
    prepared: Vec<PreparedAudio>,
    speech: Speech,
}

impl Speaker {
    pub fn new() -> Self {
        Self::default()
    }

    /// A guessed first sentence, complete at `at`: synthesized now unless it was already.
    /// Returns what was done, at its time.
    pub fn prepare(
        &mut self,
        tts: &mut dyn SentenceSynthesizer,
        sentence: &str,
        at: Duration,
    ) -> Result<Option<(Duration, SpeechEvent)>> {
        if self.prepared.iter().any(|p| p.matches(sentence)) {
            return Ok(None);
        }
        let synthesis = tts.synthesize(sentence)?;
        let ready_at = at + synthesis.first_audio_after;
        self.prepared.push(PreparedAudio {
            synthesis,
            ready_at,
        });
        let event = SpeechEvent::Prepared {
            sentence: sentence.to_string(),
            ready_at,
        };
        Ok(Some((at, event)))
    }

    /// The answer's first sentence, complete at `at`: its prepared audio plays if a guess got it
    /// right (once that audio is ready), otherwise it is synthesized now. An empty sentence (an
    /// empty answer) has no audio. Returns the start of the audio.
    pub fn speak_first(
        &mut self,
        tts: &mut dyn SentenceSynthesizer,
        sentence: &str,
        at: Duration,
    ) -> Result<Option<(Duration, SpeechEvent)>> {
        let prepared = self
            .prepared
            .iter()
            .position(|p| !sentence.is_empty() && p.matches(sentence))
            .map(|i| self.prepared.swap_remove(i));
        self.speech.prepared_audio_used = prepared.is_some();
        let (audio_at, audio) = match prepared {
            Some(p) => (p.ready_at.max(at), p.synthesis),
            None if sentence.is_empty() => {
                self.speech.first_audio_at = Some(at);
                return Ok(None);
            }
            None => {
                let synthesis = tts.synthesize(sentence)?;
                (at + synthesis.first_audio_after, synthesis)
            }
        };
        self.speech.first_audio_at = Some(audio_at);
        self.speech.audio.push(audio.clone());
        let event = SpeechEvent::AudioStarts {
            prepared: self.speech.prepared_audio_used,
            audio,
        };
        Ok(Some((audio_at, event)))
    }

    /// A later sentence of the answer, complete at `at`: synthesized now.
    pub fn speak(
        &mut self,
        tts: &mut dyn SentenceSynthesizer,
        sentence: &str,
        at: Duration,
    ) -> Result<(Duration, SpeechEvent)> {
        let audio = tts.synthesize(sentence)?;
        let ready_at = at + audio.first_audio_after;
        self.speech.audio.push(audio.clone());
        let event = SpeechEvent::Sentence {
            text: sentence.to_string(),
            ready_at,
            audio,
        };
        Ok((at, event))
    }

    /// The answer is spoken: its speech; the speaker is ready for the next answer.
    pub fn finish(&mut self) -> Speech {
        self.prepared.clear();
        std::mem::take(&mut self.speech)
    }

    /// The answer is dropped (barge-in): its prepared audio and speech are discarded.
    pub fn cancel(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FixedLatencySynthesizer;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn a_prepared_first_sentence_plays_once_its_audio_is_ready() {
        let mut tts = FixedLatencySynthesizer::new(ms(200));
        let mut speaker = Speaker::new();
        let (at, event) = speaker
            .prepare(&mut tts, "Boil it for six minutes.", ms(1_000))
            .unwrap()
            .unwrap();
        assert_eq!(at, ms(1_000));
        assert!(matches!(event, SpeechEvent::Prepared { ready_at, .. } if ready_at == ms(1_200)));
        assert_eq!(
            speaker
                .prepare(&mut tts, "  Boil it for six minutes. ", ms(1_100))
                .unwrap(),
            None,
            "prepared once"
        );
        // The answer's first sentence is the guess, before its audio is ready: it plays then.
        let (start, event) = speaker
            .speak_first(&mut tts, "Boil it for six minutes.", ms(1_050))
            .unwrap()
            .unwrap();
        assert_eq!(start, ms(1_200));
        assert!(matches!(
            event,
            SpeechEvent::AudioStarts { prepared: true, .. }
        ));
        let (at, _) = speaker.speak(&mut tts, "Then cool it.", ms(1_300)).unwrap();
        assert_eq!(at, ms(1_300));
        let speech = speaker.finish();
        assert_eq!(speech.first_audio_at, Some(ms(1_200)));
        assert!(speech.prepared_audio_used);
        assert_eq!(speech.audio.len(), 2);
        assert_eq!(speaker.finish(), Speech::default());
    }

    #[test]
    fn a_first_sentence_no_guess_had_is_synthesized_when_it_is_complete() {
        let mut tts = FixedLatencySynthesizer::new(ms(200));
        let mut speaker = Speaker::new();
        speaker
            .prepare(&mut tts, "Boil it for seven minutes.", ms(500))
            .unwrap();
        let (start, event) = speaker
            .speak_first(&mut tts, "Boil it for six minutes.", ms(1_000))
            .unwrap()
            .unwrap();
        assert_eq!(start, ms(1_200));
        assert!(matches!(
            event,
            SpeechEvent::AudioStarts {
                prepared: false,
                ..
            }
        ));
        assert!(!speaker.finish().prepared_audio_used);
    }

    #[test]
    fn an_empty_answer_has_no_audio_and_a_cancelled_one_leaves_nothing() {
        let mut tts = FixedLatencySynthesizer::default();
        let mut speaker = Speaker::new();
        assert_eq!(speaker.speak_first(&mut tts, "", ms(700)).unwrap(), None);
        let speech = speaker.finish();
        assert_eq!(speech.first_audio_at, Some(ms(700)));
        assert!(speech.audio.is_empty());
        speaker.prepare(&mut tts, "Yes.", ms(100)).unwrap();
        speaker.cancel();
        let (_, event) = speaker
            .speak_first(&mut tts, "Yes.", ms(900))
            .unwrap()
            .unwrap();
        assert!(matches!(
            event,
            SpeechEvent::AudioStarts {
                prepared: false,
                ..
            }
        ));
    }
}
