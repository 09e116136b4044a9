//! Speaking an answer: the pipeline's side of speech synthesis.
//!
//! The language model only says which sentences are ready: a guessed first sentence worth
//! preparing while the user still speaks, the first piece of the answer's first sentence as
//! soon as it is settled, the answer's first sentence once it holds, each later sentence as it
//! completes. A [`Speaker`] turns them into audio on the session's timeline.
//!
//! - A long first sentence is spoken in two pieces ([`split_first_piece`]): the audio of the
//!   first is ready after a fraction of the sentence's compute, and the second is made while it
//!   plays. The first piece can even be spoken before the model has written the rest of the
//!   sentence ([`Speaker::speak_first_piece`], once [`settled_first_piece`] finds it).
//! - A guessed first sentence's first piece is prepared ahead; when the answer's first sentence
//!   opens with that piece, its audio plays at once instead of after the synthesizer's latency.
//! - The synthesizer shares the CPU with the recognizer and the model, so its compute is charged
//!   to the session's clock (on the wall clock it simply takes its time): a synthesis starts
//!   when the speaker is called and its audio is ready [`Synthesis::first_audio_after`] later.
//!
//! [`settled_first_piece`]: crate::settled_first_piece

use std::fmt;
use std::time::Duration;

use crate::{
    split_first_piece, Clock, Error, PreparedAudio, Result, SentenceSynthesizer, Synthesis,
};

/// What the speaker did, at a time of the session clock.
#[derive(Clone, Debug, PartialEq)]
pub enum SpeechEvent {
    /// A guessed first sentence was synthesized ahead of time; its audio is ready at `ready_at`.
    Prepared {
        sentence: String,
        ready_at: Duration,
    },
    /// The answer's audio starts playing: the first piece of its first sentence (the whole
    /// sentence when it is not cut), `prepared` when synthesized ahead of time.
    AudioStarts { prepared: bool, audio: Synthesis },
    /// The rest of the first sentence, after its first piece, is synthesized; its audio is
    /// ready at `ready_at`.
    FirstSentenceRest {
        text: String,
        ready_at: Duration,
        audio: Synthesis,
    },
    /// A later sentence is synthesized; its audio is ready at `ready_at`.
    Sentence {
        text: String,
        ready_at: Duration,
        audio: Synthesis,
    },
}

impl fmt::Display for SpeechEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ready = |f: &mut fmt::Formatter<'_>, what: &str, text: &str, at: &Duration| {
            write!(
                f,
                "{what:<14} \"{text}\" (audio ready at {:.3} s)",
                at.as_secs_f64()
            )
        };
        match self {
            Self::Prepared { sentence, ready_at } => ready(f, "to TTS", sentence, ready_at),
            Self::AudioStarts { prepared, audio } => write!(
                f,
                "{:<14} \"{}\" {}",
                "audio starts",
                audio.sentence,
                if *prepared {
                    "(synthesized ahead of time)"
                } else {
                    "(synthesized after its text)"
                }
            ),
            Self::FirstSentenceRest { text, ready_at, .. } => {
                ready(f, "rest of first", text, ready_at)
            }
            Self::Sentence { text, ready_at, .. } => ready(f, "next sentence", text, ready_at),
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
    /// The first piece of the answer's first sentence, once spoken.
    first_piece: Option<String>,
    speech: Speech,
}

/// What a speaker call did: the events, each at the time it starts.
pub type Spoken = Vec<(Duration, SpeechEvent)>;

impl Speaker {
    /// A speaker charging its synthesis to `clock`.
    pub fn new(clock: Clock) -> Self {
        Self {
            clock,
            prepared: Vec::new(),
            first_piece: None,
            speech: Speech::default(),
        }
    }

    /// A guessed first sentence, complete at `at`: its first piece is synthesized now (not
    /// before `at`) unless a guess with the same first piece was. Returns what was done, at the
    /// time it started.
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

    /// The first piece of the answer's first sentence, settled at `at` before the rest of the
    /// sentence is written ([`settled_first_piece`](crate::settled_first_piece)): its prepared
    /// audio plays if a guess opened with it (once that audio is ready), otherwise it is
    /// synthesized now. Nothing when a first piece was spoken already.
    pub fn speak_first_piece(
        &mut self,
        tts: &mut dyn SentenceSynthesizer,
        first_piece: &str,
        at: Duration,
    ) -> Result<Spoken> {
        let first_piece = first_piece.trim();
        if self.first_piece.is_some() || first_piece.is_empty() {
            return Ok(Vec::new());
        }
        let prepared = self
            .prepared
            .iter()
            .position(|p| p.synthesis.sentence == first_piece)
            .map(|i| self.prepared.swap_remove(i));
        self.speech.prepared_audio_used = prepared.is_some();
        let (ready_at, audio) = match prepared {
            Some(p) => (p.ready_at, p.synthesis),
            None => {
                let (start, synthesis) = self.synthesize(tts, first_piece, at)?;
                (start + synthesis.first_audio_after, synthesis)
            }
        };
        let audio_at = ready_at.max(at);
        self.first_piece = Some(first_piece.to_string());
        self.speech.first_audio_at = Some(audio_at);
        self.speech.audio.push(audio.clone());
        let event = SpeechEvent::AudioStarts {
            prepared: self.speech.prepared_audio_used,
            audio,
        };
        Ok(vec![(audio_at, event)])
    }

    /// The answer's first sentence, complete at `at`. Its first piece plays unless it did
    /// already ([`Speaker::speak_first_piece`]), then the rest of a sentence spoken in two
    /// pieces is synthesized. An empty sentence (an empty answer) has no audio; a sentence that
    /// does not open with the first piece already played is an error.
    pub fn speak_first(
        &mut self,
        tts: &mut dyn SentenceSynthesizer,
        sentence: &str,
        at: Duration,
    ) -> Result<Spoken> {
        let sentence = sentence.trim();
        if sentence.is_empty() {
            self.speech.first_audio_at.get_or_insert(at);
            return Ok(Vec::new());
        }
        let (first_piece, rest) = split_first_piece(sentence);
        let mut spoken = match &self.first_piece {
            None => self.speak_first_piece(tts, first_piece, at)?,
            Some(played) if played == first_piece => Vec::new(),
            Some(played) => {
                return Err(Error::Input(format!(
                    "the first sentence {sentence:?} does not open with {played:?}, whose \
                     audio already played"
                )))
            }
        };
        if let Some(rest) = rest {
            let (start, audio) = self.synthesize(tts, rest, at)?;
            if let Some(first) = self.speech.audio.first_mut() {
                first.chunks.extend(audio.chunks.iter().cloned());
                first.compute += audio.compute;
                first.sentence = sentence.to_string();
            }
            let event = SpeechEvent::FirstSentenceRest {
                text: rest.to_string(),
                ready_at: start + audio.first_audio_after,
                audio,
            };
            spoken.push((at, event));
        }
        Ok(spoken)
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
        self.first_piece = None;
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

    /// The one event of a call that made one.
    fn only(mut spoken: Spoken) -> (Duration, SpeechEvent) {
        assert_eq!(spoken.len(), 1, "{spoken:?}");
        spoken.remove(0)
    }

    fn samples(text: &str) -> usize {
        let mut tts = FixedLatencySynthesizer::new(ms(200));
        tts.synthesize(text)
            .unwrap()
            .joined()
            .unwrap()
            .samples
            .len()
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
        let (start, event) = only(
            speaker
                .speak_first(&mut tts, "Boil it for six minutes.", ms(1_050))
                .unwrap(),
        );
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
        let (start, event) = only(
            speaker
                .speak_first(&mut tts, "Boil it for six minutes.", ms(1_000))
                .unwrap(),
        );
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
        let clock = Clock::simulated();
        let mut speaker = Speaker::new(clock.clone());
        // Ahead of time, only the first piece is made.
        speaker.prepare(&mut tts, sentence, ms(1_000)).unwrap();
        assert_eq!(speaker.prepared[0].synthesis.sentence, first);
        assert_eq!(clock.now(), ms(1_200));
        let spoken = speaker.speak_first(&mut tts, sentence, ms(1_500)).unwrap();
        assert_eq!(
            clock.now(),
            ms(1_700),
            "the rest is made when the answer holds"
        );
        let [(start, SpeechEvent::AudioStarts { prepared, audio }), (
            rest_at,
            SpeechEvent::FirstSentenceRest {
                text,
                ready_at,
                audio: rest_audio,
            },
        )] = spoken.as_slice()
        else {
            panic!("{spoken:?}")
        };
        assert_eq!((*start, *prepared), (ms(1_500), true));
        assert_eq!(audio.sentence, first);
        assert_eq!(
            (*rest_at, text.as_str(), *ready_at),
            (ms(1_500), rest, ms(1_700))
        );
        assert_eq!(rest_audio.joined().unwrap().samples.len(), samples(rest));
        let speech = speaker.finish();
        assert_eq!(speech.audio.len(), 1, "one sentence");
        assert_eq!(speech.audio[0].sentence, sentence);
        assert_eq!(
            speech.audio[0].joined().unwrap().samples.len(),
            samples(first) + samples(rest)
        );
        assert_eq!(speech.audio[0].compute, ms(400));
        // Unprepared, its first audio is ready after the first piece alone.
        let spoken = speaker.speak_first(&mut tts, sentence, ms(2_000)).unwrap();
        assert_eq!(spoken[0].0, ms(2_200));
        assert_eq!(clock.now(), ms(2_400));
    }

    #[test]
    fn a_first_piece_plays_before_its_sentence_is_written_and_guesses_share_it() {
        let mut tts = FixedLatencySynthesizer::new(ms(200));
        let clock = Clock::simulated();
        let mut speaker = Speaker::new(clock.clone());
        let guess = "If you water it too often, the roots will rot.";
        let answer = "If you water it too often, the leaves turn yellow and soft.";
        speaker.prepare(&mut tts, guess, ms(1_000)).unwrap();
        assert_eq!(
            speaker.prepare(&mut tts, answer, ms(1_100)).unwrap(),
            None,
            "a guess with the same first piece is not synthesized again"
        );
        assert_eq!(clock.now(), ms(1_200));
        // The piece settles before the model has written the answer's first sentence.
        let (start, event) = only(
            speaker
                .speak_first_piece(&mut tts, "If you water it too often,", ms(1_300))
                .unwrap(),
        );
        assert_eq!(start, ms(1_300));
        assert!(matches!(
            event,
            SpeechEvent::AudioStarts { prepared: true, .. }
        ));
        assert!(speaker
            .speak_first_piece(&mut tts, "If you water it too often,", ms(1_300))
            .unwrap()
            .is_empty());
        let (_, event) = only(speaker.speak_first(&mut tts, answer, ms(1_800)).unwrap());
        assert!(
            matches!(&event, SpeechEvent::FirstSentenceRest { text, .. } if text == "the leaves turn yellow and soft."),
            "{event:?}"
        );
        let speech = speaker.finish();
        assert_eq!(speech.first_audio_at, Some(ms(1_300)));
        assert_eq!(speech.audio[0].sentence, answer);
        // Unprepared, the piece is synthesized when it settles; a first sentence that does not
        // open with it cannot be spoken after it.
        let (start, _) = only(
            speaker
                .speak_first_piece(&mut tts, "If you water it too often,", ms(3_000))
                .unwrap(),
        );
        assert_eq!(start, ms(3_200));
        assert!(matches!(
            speaker.speak_first(
                &mut tts,
                "If you water it daily, the roots will rot.",
                ms(3_500)
            ),
            Err(Error::Input(_))
        ));
    }

    #[test]
    fn an_empty_answer_has_no_audio_and_a_cancelled_one_leaves_nothing() {
        let mut tts = FixedLatencySynthesizer::default();
        let mut speaker = Speaker::new(Clock::simulated());
        assert!(speaker
            .speak_first(&mut tts, "", ms(700))
            .unwrap()
            .is_empty());
        let speech = speaker.finish();
        assert_eq!(speech.first_audio_at, Some(ms(700)));
        assert!(speech.audio.is_empty());
        speaker.prepare(&mut tts, "Yes.", ms(100)).unwrap();
        speaker
            .speak_first_piece(&mut tts, "Sure thing, here is the plan", ms(200))
            .unwrap();
        speaker.cancel();
        let (_, event) = only(speaker.speak_first(&mut tts, "Yes.", ms(900)).unwrap());
        assert!(matches!(
            event,
            SpeechEvent::AudioStarts {
                prepared: false,
                ..
            }
        ));
    }
}
