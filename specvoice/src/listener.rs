//! Hearing: the endpoint detector and streaming Whisper on one stream of 16 kHz audio. Each
//! utterance the detector finds is transcribed as it arrives, a partial transcript every
//! [`ListenerConfig::partial_every`] of audio (each equal to greedy decoding of the audio so
//! far, `engine_asr::StreamingTranscriber`), and one more as soon as the speaker pauses for
//! [`ListenerConfig::final_margin`]. If the speaker does not resume before the end-of-speech
//! silence, that pause's transcript is final: the final transcript is ready when the silence
//! ends, with no recognition left to do, and everything downstream (PredGen) has had the
//! rest of the silence to work on the whole question.
//!
//! With a semantic end of turn ([`TurnEnd::Semantic`]) the caller ends the utterance earlier
//! ([`Listener::end_utterance`]) when the chat model reads the pause's transcript
//! ([`Listener::pause`]) as a complete question, and speech that resumes within the longest
//! silence continues the utterance it ended ([`Heard::Resumed`]): its audio is transcribed
//! again from the first start, so the transcript is the one a long silence would have given.

use std::time::{Duration, Instant};

use engine_asr::{StreamingTranscriber, TranscribeOptions, Transcriber};
use spec_voice::{Clock, Partial};

use crate::drive::{play_recording, Pipeline};
use crate::endpoint::{duration_of, samples_in, Boundary, EndpointConfig, EndpointDetector};
use crate::turn_end::TurnEnd;
use crate::{Error, Result};

/// Settings of a [`Listener`].
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    pub endpoint: EndpointConfig,
    /// Audio between partial transcripts. Default 500 ms. At most one partial is made per
    /// [`Listener::push`], so a listener that falls behind transcribes less often.
    pub partial_every: Duration,
    /// Audio before the detected start of speech that is transcribed with it (the detector
    /// misses soft onsets). Default 200 ms.
    pub pre_roll: Duration,
    /// Silence after the last voiced audio that a transcript must include to be final (so the
    /// last word is never cut), and the pause after which a partial is made at once. Default
    /// 150 ms; at most the endpoint detector's silence.
    pub final_margin: Duration,
    /// Whisper's settings (greedy); English by default.
    pub transcribe: TranscribeOptions,
    /// How the end of the user's turn is decided: the endpoint detector's silence by default
    /// ([`TurnEnd::Silence`]); with [`TurnEnd::Semantic`], the detector waits the semantic
    /// policy's longest silence and the caller may end an utterance sooner.
    pub turn_end: TurnEnd,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        Self {
            endpoint: EndpointConfig::default(),
            partial_every: Duration::from_millis(500),
            pre_roll: Duration::from_millis(200),
            final_margin: Duration::from_millis(150),
            transcribe: TranscribeOptions {
                language: Some("en".to_string()),
                ..TranscribeOptions::default()
            },
            turn_end: TurnEnd::Silence,
        }
    }
}

impl ListenerConfig {
    /// The settings of a voice conversation: the semantic end of turn with its default
    /// settings.
    pub fn conversation() -> Self {
        Self {
            turn_end: TurnEnd::Semantic(Default::default()),
            ..Self::default()
        }
    }

    /// The endpoint detector's settings: with the semantic end of turn, its silence is the
    /// longest wait.
    pub fn detector(&self) -> EndpointConfig {
        match &self.turn_end {
            TurnEnd::Silence => self.endpoint.clone(),
            TurnEnd::Semantic(policy) => EndpointConfig {
                silence: policy.longest,
                ..self.endpoint.clone()
            },
        }
    }
}

/// What the listener heard, in stream time (from the first sample pushed). Transcripts are
/// [`Partial`]s stamped on the session's clock when they are ready (Whisper's compute charged to
/// it first): the very values the language model and the translator take.
#[derive(Clone, Debug, PartialEq)]
pub enum Heard {
    /// Speech started at `at`.
    Started { at: Duration },
    /// A partial transcript of the utterance so far.
    Partial(Partial),
    /// Speech resumed at `at`, within the longest silence after an utterance that the caller
    /// ended early ([`Listener::end_utterance`]): it continues that utterance, which started at
    /// `utterance_start` and whose speech ended at `paused_at`. Its partials and final
    /// transcript hear the whole utterance from its first start.
    Resumed {
        at: Duration,
        utterance_start: Duration,
        paused_at: Duration,
    },
    /// The utterance ended: speech stopped at `speech_end`, and the detector noticed at
    /// `detected_at`. `transcript` (final; its text empty for an utterance without words: a
    /// cough, noise) is stamped when it was ready.
    Final {
        transcript: Partial,
        speech_end: Duration,
        detected_at: Duration,
    },
}

/// Whisper either waiting for speech, or transcribing an utterance.
#[derive(Debug)]
enum Recognizer {
    Idle(Box<Transcriber>),
    Utterance {
        stream: Box<StreamingTranscriber>,
        /// The last partial's text.
        text: String,
    },
    /// Only while switching between the two.
    Switching,
}

/// A pause in an utterance ([`Listener::pause`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pause<'a> {
    /// The transcript of the utterance up to the pause (its final margin included).
    pub transcript: &'a str,
    /// How long the speaker has been silent.
    pub silence: Duration,
}

/// Finds utterances in an audio stream and transcribes them as they arrive.
#[derive(Debug)]
pub struct Listener {
    config: ListenerConfig,
    detector: EndpointDetector,
    recognizer: Recognizer,
    /// Audio kept: the current utterance's audio not yet sent to Whisper, or recent audio for
    /// a pre-roll.
    audio: Vec<f32>,
    /// Stream index of `audio[0]`, in samples.
    audio_start: usize,
    /// Why a call failed midway, after which the listener refuses more audio.
    failed: Option<String>,
    /// With the semantic end of turn: the audio of the current utterance from its pre-roll
    /// on, kept after an utterance ended early for as long as speech may resume it.
    utterance: Option<KeptUtterance>,
}

/// The audio of an utterance that speech may continue.
#[derive(Debug)]
struct KeptUtterance {
    /// Stream index of `audio[0]`, in samples.
    start: usize,
    audio: Vec<f32>,
    /// When its speech started.
    speech_start: Duration,
    /// Once it ended early: when its speech ended (resumed speech must start within the
    /// longest silence of it).
    ended: Option<Duration>,
}

impl Listener {
    pub fn new(transcriber: Transcriber, config: ListenerConfig) -> Result<Self> {
        if config.partial_every.is_zero() {
            return Err(Error::Config(
                "partial_every must be longer than zero".into(),
            ));
        }
        if config.final_margin > config.endpoint.silence {
            return Err(Error::Config(format!(
                "the final margin ({:?}) is longer than the end-of-speech silence ({:?})",
                config.final_margin, config.endpoint.silence
            )));
        }
        if config.transcribe.beam_size != 1 {
            return Err(Error::Config(
                "the listener decodes greedily: set beam_size to 1".into(),
            ));
        }
        // The prompt every partial starts with: a language or task the model lacks (German or
        // translation on an English-only model) is refused here rather than mid-utterance.
        transcriber.prompt(
            &config.transcribe,
            config.transcribe.language.as_deref(),
            &[],
        )?;
        if let TurnEnd::Semantic(policy) = &config.turn_end {
            policy.validate()?;
            if config.final_margin > policy.longest {
                return Err(Error::Config(format!(
                    "the final margin ({:?}) is longer than the longest end-of-turn silence ({:?})",
                    config.final_margin, policy.longest
                )));
            }
        }
        Ok(Self {
            detector: EndpointDetector::new(config.detector())?,
            config,
            recognizer: Recognizer::Idle(Box::new(transcriber)),
            audio: Vec::new(),
            audio_start: 0,
            failed: None,
            utterance: None,
        })
    }

    pub fn config(&self) -> &ListenerConfig {
        &self.config
    }

    /// Whether an utterance is in progress.
    pub fn in_speech(&self) -> bool {
        self.detector.in_speech()
    }

    /// Whether the speaker is not speaking now: no utterance is in progress, or its last
    /// voiced audio is at least [`ListenerConfig::final_margin`] old (a pause, perhaps the end).
    pub fn speaker_paused(&self) -> bool {
        self.detector
            .last_voiced_end()
            .is_none_or(|end| self.detector.now() >= end + self.config.final_margin)
    }

    /// While the speaker pauses in an utterance and the pause's transcript is made (it hears
    /// the final margin after the last voiced audio: if the pause lasts, it is the final
    /// transcript): that transcript and how long the silence has lasted.
    pub fn pause(&self) -> Option<Pause<'_>> {
        let voiced_end = self.detector.last_voiced_end()?;
        let silence = self.detector.silence()?;
        (silence >= self.config.final_margin
            && self.covered() >= voiced_end + self.config.final_margin)
            .then(|| Pause {
                transcript: self.current_text(),
                silence,
            })
    }

    /// Ends the utterance in progress now, in a pause (see [`Listener::pause`]); its final
    /// transcript is the pause's. With the semantic end of turn, speech that resumes within
    /// its longest silence continues it ([`Heard::Resumed`]). `None` when no utterance is in
    /// progress or the speaker is not pausing.
    pub fn end_utterance(&mut self, clock: &Clock) -> Result<Option<Heard>> {
        self.refuse_after_failure()?;
        if self.pause().is_none() {
            return Ok(None);
        }
        let Some(boundary) = self.detector.end_now() else {
            return Ok(None);
        };
        let heard = self.on_boundary(boundary, clock);
        if let (Ok(Heard::Final { speech_end, .. }), Some(kept)) = (&heard, &mut self.utterance) {
            kept.ended = Some(*speech_end);
        }
        self.note_failure(heard).map(Some)
    }

    /// Stream time of the audio pushed so far.
    pub fn audio_time(&self) -> Duration {
        duration_of(self.audio_start + self.audio.len())
    }

    /// Gives Whisper back (an utterance in progress is dropped).
    pub fn into_transcriber(self) -> Transcriber {
        match self.recognizer {
            Recognizer::Idle(transcriber) => *transcriber,
            Recognizer::Utterance { stream, .. } => stream.into_inner(),
            Recognizer::Switching => unreachable!("the recognizer is only switching inside a call"),
        }
    }

    /// Takes the next piece of 16 kHz mono audio and returns what it completes: the starts
    /// and ends of utterances, and at most one partial transcript.
    ///
    /// A piece with a sample that is not finite is refused unheard, and the listener goes on.
    /// Any other error (recognition failing) comes after the piece was partly heard, so the
    /// listener stops there: later calls to `push` and [`Listener::finish`] are refused with
    /// [`Error::Input`], and [`Listener::into_transcriber`] gives Whisper back for a new one.
    ///
    /// Whisper's compute is charged to `clock` (the session's), and transcripts are stamped
    /// with it.
    pub fn push(&mut self, samples: &[f32], clock: &Clock) -> Result<Vec<Heard>> {
        self.refuse_after_failure()?;
        engine_asr::audio::check_finite(samples).map_err(|e| Error::Input(e.to_string()))?;
        let heard = self.hear(samples, clock);
        self.note_failure(heard)
    }

    /// The stream ends: an utterance in progress ends with it. Refused after a failed call,
    /// as [`Listener::push`] is.
    pub fn finish(&mut self, clock: &Clock) -> Result<Option<Heard>> {
        self.refuse_after_failure()?;
        let heard = self
            .detector
            .finish()
            .map(|boundary| self.on_boundary(boundary, clock))
            .transpose();
        self.note_failure(heard)
    }

    fn refuse_after_failure(&self) -> Result<()> {
        match &self.failed {
            Some(reason) => Err(Error::Input(format!(
                "the listener stopped after an error ({reason}): start a new one"
            ))),
            None => Ok(()),
        }
    }

    fn note_failure<T>(&mut self, result: Result<T>) -> Result<T> {
        if let Err(error) = &result {
            self.failed = Some(error.to_string());
        }
        result
    }

    /// [`Listener::push`] of finite samples.
    fn hear(&mut self, samples: &[f32], clock: &Clock) -> Result<Vec<Heard>> {
        self.audio.extend_from_slice(samples);
        self.keep_utterance(samples);
        let mut heard = Vec::new();
        for boundary in self.detector.push(samples) {
            heard.push(self.on_boundary(boundary, clock)?);
        }
        self.forget_unresumable();
        if let Some(voiced_end) = self.detector.last_voiced_end() {
            // While the speaker pauses, one partial of the speech and the final margin (the
            // same audio, however it arrived, so that it can be final); while they speak, one
            // partial per `partial_every` of new audio.
            let margin_end = voiced_end + self.config.final_margin;
            let in_pause = self.detector.now() >= margin_end;
            let end = if in_pause {
                Some(samples_in(margin_end)).filter(|_| self.covered() < margin_end)
            } else {
                Some(self.audio_start + self.audio.len())
                    .filter(|_| self.audio.len() >= samples_in(self.config.partial_every))
            };
            if let Some(end) = end {
                let text = self.transcribe_until(end, clock)?;
                let mut partial = Partial::new(clock.now(), text, false);
                if in_pause
                    && matches!(&self.config.turn_end, TurnEnd::Semantic(policy) if policy.weigh_last_word)
                {
                    if let Some(probability) = self.last_word_probability(clock)? {
                        partial = partial.with_last_word_probability(probability);
                    }
                }
                heard.push(Heard::Partial(partial));
            }
        } else {
            self.keep_recent();
        }
        Ok(heard)
    }

    fn on_boundary(&mut self, boundary: Boundary, clock: &Clock) -> Result<Heard> {
        match boundary {
            Boundary::Started { at } => {
                let resumed = self.resumable(at);
                match (resumed, &self.utterance) {
                    (Some(_), Some(kept)) => {
                        // The utterance goes on: Whisper hears it again from its start.
                        self.audio = kept.audio.clone();
                        self.audio_start = kept.start;
                    }
                    _ => {
                        let from = (samples_in(at)
                            .saturating_sub(samples_in(self.config.pre_roll)))
                        .max(self.audio_start);
                        self.audio.drain(..from - self.audio_start);
                        self.audio_start = from;
                        if matches!(self.config.turn_end, TurnEnd::Semantic(_)) {
                            self.utterance = Some(KeptUtterance {
                                start: from,
                                audio: self.audio.clone(),
                                speech_start: at,
                                ended: None,
                            });
                        }
                    }
                }
                let Recognizer::Idle(transcriber) =
                    std::mem::replace(&mut self.recognizer, Recognizer::Switching)
                else {
                    unreachable!("the detector starts an utterance only after the last ended")
                };
                self.recognizer = Recognizer::Utterance {
                    stream: Box::new(StreamingTranscriber::new(
                        *transcriber,
                        self.config.transcribe.clone(),
                    )?),
                    text: String::new(),
                };
                Ok(match resumed {
                    Some((utterance_start, paused_at)) => {
                        self.detector.continue_from(utterance_start);
                        if let Some(kept) = &mut self.utterance {
                            kept.ended = None;
                        }
                        Heard::Resumed {
                            at,
                            utterance_start,
                            paused_at,
                        }
                    }
                    None => Heard::Started { at },
                })
            }
            Boundary::Ended {
                speech_end,
                detected_at,
            } => {
                // The final transcript hears the speech and the margin after it: usually the
                // pause's partial, made already.
                let end = samples_in(speech_end + self.config.final_margin)
                    .min(self.audio_start + self.audio.len());
                let text = if self.covered() >= duration_of(end) {
                    self.current_text().to_string()
                } else {
                    self.transcribe_until(end, clock)?
                };
                let Recognizer::Utterance { stream, .. } =
                    std::mem::replace(&mut self.recognizer, Recognizer::Switching)
                else {
                    unreachable!("the detector ends only an utterance it started")
                };
                self.recognizer = Recognizer::Idle(Box::new(stream.into_inner()));
                Ok(Heard::Final {
                    transcript: Partial::new(clock.now(), text, true),
                    speech_end,
                    detected_at,
                })
            }
        }
    }

    /// Whether speech starting at `at` continues the utterance that ended early last: it
    /// resumes within the longest silence, and the two together are shorter than the longest
    /// utterance. Its start and the end of its speech.
    fn resumable(&self, at: Duration) -> Option<(Duration, Duration)> {
        let TurnEnd::Semantic(policy) = &self.config.turn_end else {
            return None;
        };
        let kept = self.utterance.as_ref()?;
        let paused_at = kept.ended?;
        (at.saturating_sub(paused_at) < policy.longest
            && at.saturating_sub(kept.speech_start) < self.config.endpoint.max_utterance)
            .then_some((kept.speech_start, paused_at))
    }

    /// With the semantic end of turn, keeps the audio of the utterance in progress, and of one
    /// that ended early while speech may still resume it.
    fn keep_utterance(&mut self, samples: &[f32]) {
        if let Some(kept) = &mut self.utterance {
            kept.audio.extend_from_slice(samples);
        }
    }

    /// Forgets the audio of an utterance that no speech can resume any more: it ended at the
    /// detector's silence, or ended early longer than the longest silence ago. (Checked after
    /// the audio's boundaries: a piece of audio that arrives late, all at once, may hold the
    /// speech that resumes it.)
    fn forget_unresumable(&mut self) {
        let TurnEnd::Semantic(policy) = &self.config.turn_end else {
            return;
        };
        let now = self.audio_time();
        let in_speech = self.detector.in_speech();
        if let Some(kept) = &self.utterance {
            let resumable = match kept.ended {
                None => in_speech,
                Some(paused_at) => in_speech || now < paused_at + policy.longest,
            };
            if !resumable {
                self.utterance = None;
            }
        }
    }

    /// In an utterance, stream time of the end of the audio sent to Whisper: the audio kept
    /// starts there (before the first partial, at the utterance's start, which no final
    /// margin reaches back to).
    fn covered(&self) -> Duration {
        duration_of(self.audio_start)
    }

    fn current_text(&self) -> &str {
        match &self.recognizer {
            Recognizer::Utterance { text, .. } => text,
            _ => "",
        }
    }

    /// Sends the utterance's audio up to stream index `end` to Whisper and charges its compute
    /// to `clock`: the partial transcript of everything sent.
    fn transcribe_until(&mut self, end: usize, clock: &Clock) -> Result<String> {
        let Recognizer::Utterance { stream, text } = &mut self.recognizer else {
            unreachable!("transcribing only inside an utterance")
        };
        let started = Instant::now();
        let piece: Vec<f32> = self.audio.drain(..end - self.audio_start).collect();
        self.audio_start = end;
        if let Some(update) = stream.push(&piece)? {
            *text = update.text;
        }
        clock.charge(started.elapsed());
        Ok(text.clone())
    }

    /// Whisper's probability of the last word of the utterance's newest transcript (one
    /// decoder forward, charged to `clock`), for the semantic end of turn: a word heard in the
    /// silence after the speech is seldom probable.
    fn last_word_probability(&mut self, clock: &Clock) -> Result<Option<f32>> {
        let Recognizer::Utterance { stream, .. } = &mut self.recognizer else {
            return Ok(None);
        };
        let started = Instant::now();
        let word = stream.last_word()?;
        clock.charge(started.elapsed());
        Ok(word.map(|word| word.probability as f32))
    }

    /// Outside an utterance, keeps only the audio a pre-roll may need.
    fn keep_recent(&mut self) {
        let endpoint = &self.config.endpoint;
        let keep = samples_in(self.config.pre_roll + endpoint.min_speech + endpoint.frame * 2);
        if self.audio.len() > keep {
            let drop = self.audio.len() - keep;
            self.audio.drain(..drop);
            self.audio_start += drop;
        }
    }
}

/// The utterances of a recording with their partial transcripts, each stamped with when the
/// listener has it on a simulated clock (its audio arrived in [`crate::PACKET`]s, then Whisper
/// computed): what a live pipeline downstream of the listener would be given. Utterances
/// without words are left out; the recording is followed by `trailing_silence`.
pub fn utterances_of(
    listener: &mut Listener,
    audio: &[f32],
    trailing_silence: Duration,
) -> Result<Vec<Vec<Partial>>> {
    let mut transcription = Transcription {
        listener,
        clock: Clock::simulated(),
        current: Vec::new(),
        done: Vec::new(),
    };
    play_recording(&mut transcription, audio, trailing_silence, &mut |()| {})?;
    Ok(transcription.done)
}

/// The listener alone as a pipeline, collecting utterances.
struct Transcription<'l> {
    listener: &'l mut Listener,
    clock: Clock,
    current: Vec<Partial>,
    done: Vec<Vec<Partial>>,
}

impl Pipeline for Transcription<'_> {
    type Event = ();

    fn clock(&self) -> &Clock {
        &self.clock
    }

    fn listener(&self) -> &Listener {
        self.listener
    }

    fn listener_mut(&mut self) -> &mut Listener {
        self.listener
    }

    fn on_heard(&mut self, heard: Vec<Heard>) -> Result<()> {
        for item in heard {
            match item {
                Heard::Started { .. } | Heard::Resumed { .. } => self.current.clear(),
                Heard::Partial(partial) => {
                    if !partial.text.trim().is_empty() {
                        self.current.push(partial);
                    }
                }
                Heard::Final { transcript, .. } => {
                    let mut utterance = std::mem::take(&mut self.current);
                    if !transcript.text.trim().is_empty() {
                        utterance.push(transcript);
                        self.done.push(utterance);
                    }
                }
            }
        }
        Ok(())
    }

    fn take_events(&mut self) -> Vec<()> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use engine_asr::testing::{greedy_options, write_hf};
    use engine_asr::{LoadOptions, Task};

    use super::*;

    fn transcriber(dir: &tempfile::TempDir) -> Transcriber {
        write_hf(dir.path(), 41).unwrap();
        Transcriber::load(dir.path(), &LoadOptions::default()).unwrap()
    }

    /// English greedy decoding without the thresholds a random model's transcripts never pass.
    fn config() -> ListenerConfig {
        ListenerConfig {
            transcribe: TranscribeOptions {
                language: Some("en".into()),
                ..greedy_options()
            },
            ..ListenerConfig::default()
        }
    }

    /// Silence, a second of a tone, and a pause longer than the end-of-speech silence.
    fn utterance() -> Vec<f32> {
        let tone = (0..16_000)
            .map(|i| 0.3 * (2.0 * std::f32::consts::PI * 220.0 * i as f32 / 16_000.0).sin());
        [vec![0.0; 8_000], tone.collect(), vec![0.0; 16_000]].concat()
    }

    #[test]
    fn settings_the_model_or_the_audio_cannot_follow_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut whisper = transcriber(&dir);
        let german = ListenerConfig {
            transcribe: TranscribeOptions {
                language: Some("de".into()),
                ..config().transcribe
            },
            ..config()
        };
        let translate = ListenerConfig {
            transcribe: TranscribeOptions {
                task: Task::Translate,
                ..config().transcribe
            },
            ..config()
        };
        for bad in [german, translate] {
            let refused = Listener::new(whisper, bad).unwrap_err();
            assert!(
                matches!(refused, Error::Asr(engine_asr::Error::Language(_))),
                "{refused:?}"
            );
            whisper = transcriber(&dir);
        }
        // A frame of 320.48 samples: counted in frames, the stream would run ahead of its audio.
        let uneven = ListenerConfig {
            endpoint: EndpointConfig {
                frame: Duration::from_micros(20_030),
                ..EndpointConfig::default()
            },
            ..config()
        };
        assert!(matches!(
            Listener::new(whisper, uneven),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn the_transcript_of_a_pause_carries_whispers_probability_of_its_last_word() {
        let dir = tempfile::tempdir().unwrap();
        let mut whisper = Some(transcriber(&dir));
        for weigh_last_word in [true, false] {
            let semantic = ListenerConfig {
                turn_end: TurnEnd::Semantic(crate::SemanticTurnEnd {
                    weigh_last_word,
                    ..Default::default()
                }),
                ..config()
            };
            let mut listener = Listener::new(whisper.take().unwrap(), semantic).unwrap();
            let clock = Clock::simulated();
            let (mut in_speech, mut in_pause) = (Vec::new(), Vec::new());
            for packet in utterance().chunks(320) {
                for heard in listener.push(packet, &clock).unwrap() {
                    if let Heard::Partial(partial) = heard {
                        let paused = listener.pause().is_some();
                        (if paused {
                            &mut in_pause
                        } else {
                            &mut in_speech
                        })
                        .push(partial);
                    }
                }
            }
            assert!(!in_speech.is_empty() && !in_pause.is_empty());
            assert!(in_speech.iter().all(|p| p.last_word_probability.is_none()));
            for partial in &in_pause {
                match partial.last_word_probability {
                    Some(p) => {
                        assert!(weigh_last_word && !partial.text.trim().is_empty());
                        assert!((0.0..=1.0).contains(&p), "{p}");
                    }
                    None => assert!(!weigh_last_word || partial.text.trim().is_empty()),
                }
            }
            if weigh_last_word {
                assert!(
                    in_pause.iter().any(|p| p.last_word_probability.is_some()),
                    "{in_pause:?}"
                );
            }
            whisper = Some(listener.into_transcriber());
        }
    }

    #[test]
    fn a_listener_whose_recognition_failed_refuses_more_audio() {
        let dir = tempfile::tempdir().unwrap();
        let mut listener = Listener::new(transcriber(&dir), config()).unwrap();
        let clock = Clock::simulated();
        // Unusable audio is refused unheard: the listener goes on.
        assert!(matches!(
            listener.push(&[0.1, f32::NAN], &clock),
            Err(Error::Input(_))
        ));
        // Recognition fails at the end of an utterance (the whole utterance in one piece, so
        // its final transcript is the first): a language the model lacks, after the check.
        listener.config.transcribe.language = Some("de".into());
        let failed = listener.push(&utterance(), &clock).unwrap_err();
        assert!(
            matches!(failed, Error::Asr(engine_asr::Error::Language(_))),
            "{failed:?}"
        );
        // The next utterance is refused, not started on a recognizer still in the last one.
        assert!(matches!(
            listener.push(&utterance(), &clock),
            Err(Error::Input(_))
        ));
        assert!(matches!(listener.finish(&clock), Err(Error::Input(_))));
        // Whisper comes back, and a new listener hears the same audio.
        let mut listener = Listener::new(listener.into_transcriber(), config()).unwrap();
        let heard = listener.push(&utterance(), &clock).unwrap();
        assert!(
            matches!(heard.first(), Some(Heard::Started { .. })),
            "{heard:?}"
        );
        assert!(
            matches!(heard.last(), Some(Heard::Final { .. })),
            "{heard:?}"
        );
    }

    #[test]
    fn speech_resuming_an_early_end_continues_the_utterance_however_late_its_audio_arrives() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::simulated();
        let tone = |seconds: f32| -> Vec<f32> {
            (0..(seconds * 16_000.0) as usize)
                .map(|i| 0.3 * (2.0 * std::f32::consts::PI * 220.0 * i as f32 / 16_000.0).sin())
                .collect()
        };
        let silence = |seconds: f32| vec![0.0; (seconds * 16_000.0) as usize];
        let semantic = ListenerConfig {
            turn_end: TurnEnd::Semantic(Default::default()),
            ..config()
        };
        // The reference: one utterance across a 700 ms pause, as a long silence hears it.
        let mut long = config();
        long.endpoint.silence = Duration::from_millis(1200);
        let audio = [
            silence(0.5),
            tone(0.8),
            silence(0.7),
            tone(0.8),
            silence(1.5),
        ]
        .concat();
        let mut reference = Listener::new(transcriber(&dir), long).unwrap();
        let mut expected = reference.push(&audio, &clock).unwrap();
        expected.extend(reference.finish(&clock).unwrap());
        let Some(Heard::Final {
            transcript: expected,
            speech_end: expected_end,
            ..
        }) = expected.pop()
        else {
            panic!("no final transcript")
        };
        assert_eq!(expected_end, Duration::from_millis(2800));
        for piece in [320, audio.len()] {
            let mut listener = Listener::new(transcriber(&dir), semantic.clone()).unwrap();
            // Up to 200 ms into the pause, where the turn is ended early.
            let (before, after) = audio.split_at(16_000 * 3 / 2);
            for chunk in before.chunks(320) {
                listener.push(chunk, &clock).unwrap();
            }
            assert!(listener.pause().is_some());
            let ended = listener.end_utterance(&clock).unwrap();
            assert!(
                matches!(ended, Some(Heard::Final { speech_end, .. }) if speech_end == Duration::from_millis(1300))
            );
            // The rest arrives in 20 ms packets, or all at once (a pipeline busy for a while).
            let mut heard = Vec::new();
            for chunk in after.chunks(piece) {
                heard.extend(listener.push(chunk, &clock).unwrap());
            }
            heard.extend(listener.finish(&clock).unwrap());
            assert!(
                heard.iter().any(
                    |h| matches!(h, Heard::Resumed { utterance_start, paused_at, .. }
                    if *utterance_start == Duration::from_millis(500)
                        && *paused_at == Duration::from_millis(1300))
                ),
                "piece {piece}: {heard:?}"
            );
            match heard.last() {
                Some(Heard::Final {
                    transcript,
                    speech_end,
                    ..
                }) => {
                    assert_eq!(transcript.text, expected.text, "piece {piece}");
                    assert_eq!(*speech_end, expected_end);
                }
                other => panic!("piece {piece}: {other:?}"),
            }
        }
        // With a fixed silence nothing resumes: the speech after the end is a new utterance.
        let mut fixed = Listener::new(transcriber(&dir), config()).unwrap();
        let heard = fixed.push(&audio, &clock).unwrap();
        assert!(heard.iter().all(|h| !matches!(h, Heard::Resumed { .. })));
    }
}
