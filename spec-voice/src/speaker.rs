//! Speaking an answer: the pipeline's side of speech synthesis.
//!
//! The language model only says which sentences are ready: a guessed first sentence worth
//! preparing while the user still speaks, the answer's first sentence once it holds, each later
//! sentence as it completes. A [`Speaker`] turns them into audio on the session's timeline.
//!
//! - A long first sentence is spoken in two pieces ([`split_first_piece`]): the audio of the
//!   first is ready after a fraction of the sentence's compute, and the second is made while it
//!   plays.
//! - A guessed first sentence's first piece is prepared ahead; when the answer's first sentence
//!   is one of the guesses, that audio plays at once instead of after the synthesizer's latency.
//! - The synthesizer shares the CPU with the recognizer and the model, so its compute is charged
//!   to the session's clock (on the wall clock it simply takes its time): a synthesis starts
//!   when the speaker is called and its audio is ready [`Synthesis::first_audio_after`] later.

use std::fmt;
use std::time::Duration;

use crate::{split_first_piece, Clock, PreparedAudio, Result, SentenceSynthesizer, Synthesis};

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

/// Speaks one answer at a time (see the module's documentation) on a session's clock; a new
/// answer starts with [`Speaker::finish`] or [`Speaker::cancel`].
#[derive(Clone, Debug)]
pub struct Speaker {
    clock: Clock,
    prepared: Vec<PreparedAudio>,
    speech: Speech,
}

impl Speaker {
    /// A speaker charging its synthesis to `clock`.
    pub fn new(clock: Clock) -> Self {
        Self {
            clock,
            prepared: Vec::new(),
            speech: Speech::default(),
        }
    }

    /// A guessed first sentence, complete at `at`: its first piece is synthesized now (not
    /// before `at`) unless it was already. Returns what was done, at the time it started.
    pub fn prepare(
        &mut self,
        tts: &mut dyn SentenceSynthesizer,
        sentence: &str,
        at: Duration,
    ) -> Result<Option<(Duration, SpeechEvent)>> {
        if self.prepared.iter().any(|p| p.matches(sentence)) {
            return Ok(None);
        }
        let sentence = sentence.trim();
        let (first_piece, _) = split_first_piece(sentence);
        let (start, synthesis) = self.synthesize(tts, first_piece, at)?;
        let ready_at = start + synthesis.first_audio_after;
        self.prepared.push(PreparedAudio {
            sentence: sentence.to_string(),
            synthesis,
            ready_at,
        });
        let event = SpeechEvent::Prepared {
            sentence: sentence.to_string(),
            ready_at,
        };
        Ok(Some((start, event)))
    }

    /// The answer's first sentence, complete at `at`: its prepared audio plays if a guess got it
    /// right (once that audio is ready), otherwise it is synthesized now; the rest of a sentence
    /// spoken in two pieces is synthesized after the first. An empty sentence (an empty answer)
    /// has no audio. Returns the start of the audio.
    pub fn speak_first(
        &mut self,
        tts: &mut dyn SentenceSynthesizer,
        sentence: &str,
        at: Duration,
    ) -> Result<Option<(Duration, SpeechEvent)>> {
        let sentence = sentence.trim();
        if sentence.is_empty() {
            self.speech.first_audio_at = Some(at);
            return Ok(None);
        }
        let prepared = self
            .prepared
            .iter()
            .position(|p| p.matches(sentence))
            .map(|i| self.prepared.swap_remove(i));
        self.speech.prepared_audio_used = prepared.is_some();
        let (first_piece, rest) = split_first_piece(sentence);
        let (ready_at, mut audio) = match prepared {
            Some(p) => (p.ready_at, p.synthesis),
            None => {
                let (start, synthesis) = self.synthesize(tts, first_piece, at)?;
                (start + synthesis.first_audio_after, synthesis)
            }
        };
        if let Some(rest) = rest {
            let (_, rest) = self.synthesize(tts, rest, at)?;
            audio.chunks.extend(rest.chunks);
            audio.compute += rest.compute;
            audio.sentence = sentence.to_string();
        }
        let audio_at = ready_at.max(at);
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
        let (start, audio) = self.synthesize(tts, sentence, at)?;
        self.speech.audio.push(audio.clone());
        let event = SpeechEvent::Sentence {
            text: sentence.trim().to_string(),
            ready_at: start + audio.first_audio_after,
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

    /// Synthesizes `text`, asked for at `at`, now (not before `at`), charging its compute to the
    /// clock: when it started, and the synthesis.
    fn synthesize(
        &self,
        tts: &mut dyn SentenceSynthesizer,
        text: &str,
        at: Duration,
    ) -> Result<(Duration, Synthesis)> {
        self.clock.wait_until(at);
        let start = self.clock.now();
        let synthesis = tts.synthesize(text)?;
        self.clock.charge(synthesis.compute);
        Ok((start, synthesis))
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
        let clock = Clock::simulated();
        let mut speaker = Speaker::new(clock.clone());
        let (at, event) = speaker
            .prepare(&mut tts, "Boil it for six minutes.", ms(1_000))
            .unwrap()
            .unwrap();
        assert_eq!(at, ms(1_000));
        assert!(matches!(event, SpeechEvent::Prepared { ready_at, .. } if ready_at == ms(1_200)));
        assert_eq!(clock.now(), ms(1_200), "the synthesis is charged");
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
        assert_eq!(clock.now(), ms(1_200), "nothing more to synthesize");
        let (at, event) = speaker.speak(&mut tts, "Then cool it.", ms(1_300)).unwrap();
        assert_eq!(at, ms(1_300));
        assert!(matches!(event, SpeechEvent::Sentence { ready_at, .. } if ready_at == ms(1_500)));
        let speech = speaker.finish();
        assert_eq!(speech.first_audio_at, Some(ms(1_200)));
        assert!(speech.prepared_audio_used);
        assert_eq!(speech.audio.len(), 2);
        assert_eq!(speaker.finish(), Speech::default());
    }

    #[test]
    fn a_first_sentence_no_guess_had_is_synthesized_when_it_is_complete() {
        let mut tts = FixedLatencySynthesizer::new(ms(200));
        let mut speaker = Speaker::new(Clock::simulated());
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
    fn a_long_first_sentence_plays_after_its_first_piece_and_the_rest_follows() {
        let sentence = "If you water it too often, the roots will rot in the pot.";
        let (first, rest) = (
            "If you water it too often,",
            "the roots will rot in the pot.",
        );
        let mut tts = FixedLatencySynthesizer::new(ms(200));
        let audio_of = |text: &str| {
            let mut tts = FixedLatencySynthesizer::new(ms(200));
            tts.synthesize(text)
                .unwrap()
                .joined()
                .unwrap()
                .samples
                .len()
        };
        let clock = Clock::simulated();
        let mut speaker = Speaker::new(clock.clone());
        // Ahead of time, only the first piece is made.
        speaker.prepare(&mut tts, sentence, ms(1_000)).unwrap();
        assert_eq!(speaker.prepared[0].synthesis.sentence, first);
        assert_eq!(clock.now(), ms(1_200));
        let (start, event) = speaker
            .speak_first(&mut tts, sentence, ms(1_500))
            .unwrap()
            .unwrap();
        assert_eq!(start, ms(1_500));
        assert_eq!(
            clock.now(),
            ms(1_700),
            "the rest is made when the answer holds"
        );
        let SpeechEvent::AudioStarts { prepared, audio } = event else {
            panic!("{event:?}")
        };
        assert!(prepared);
        assert_eq!(audio.sentence, sentence);
        assert_eq!(
            audio.joined().unwrap().samples.len(),
            audio_of(first) + audio_of(rest)
        );
        assert_eq!(audio.compute, ms(400));
        speaker.finish();
        // Unprepared, its first audio is ready after the first piece alone.
        let (start, _) = speaker
            .speak_first(&mut tts, sentence, ms(2_000))
            .unwrap()
            .unwrap();
        assert_eq!(start, ms(2_200));
        assert_eq!(clock.now(), ms(2_400));
    }

    #[test]
    fn an_empty_answer_has_no_audio_and_a_cancelled_one_leaves_nothing() {
        let mut tts = FixedLatencySynthesizer::default();
        let mut speaker = Speaker::new(Clock::simulated());
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
