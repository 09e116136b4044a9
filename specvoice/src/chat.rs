//! Voice chat: audio in, streaming Whisper, PredGen (or the plain cascade), speech out.
//!
//! [`VoiceChat`] is driven step by step, so one loop serves a recording replayed on a simulated
//! clock, a recording played in real time, and a microphone: [`VoiceChat::hear_audio`] when
//! audio arrives (the endpoint detector and Whisper run on it), [`VoiceChat::step`] whenever
//! the caller is free (one piece of the language model's work). On the simulated clock the
//! recognizer's and the model's measured compute share one timeline, as they share the CPU.

use std::time::Duration;

use engine_llm::predgen::{Event, EventKind, Status, Turn};
use engine_llm::{PredGen, TurnVoice};
use spec_voice::{AudioChunk, Clock, ClockKind, Partial, SentenceSynthesizer, Speech};

use crate::drive::{play_recording, Pipeline};
use crate::listener::{Heard, Listener};
use crate::turn_end::TurnEnd;
use crate::{Error, Result};

/// How the language model answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatMode {
    /// PredGen: guess the answer while the user speaks, verify it on every partial transcript.
    PredGen,
    /// The plain cascade: wait for the final transcript, then generate the answer.
    Cascade,
}

/// Something that happened, at a time of the stream (from its first sample).
#[derive(Clone, Debug, PartialEq)]
pub struct ChatEvent {
    pub at: Duration,
    pub kind: ChatEventKind,
}

/// The kinds of [`ChatEvent`].
#[derive(Clone, Debug, PartialEq)]
pub enum ChatEventKind {
    /// The endpoint detector heard speech start (at `at`, minus its confirmation time).
    SpeechStarted { started_at: Duration },
    /// A partial transcript.
    Partial { text: String },
    /// The chat model read the transcript of a pause: `probability` that the user's turn ends
    /// there, so the turn ends after `wait` of silence (the semantic end of turn).
    EndOfTurn { probability: f32, wait: Duration },
    /// The end of the turn was declared (the silence passed, or the model judged the
    /// question complete): the user stopped speaking at `speech_end`.
    SpeechEnded { speech_end: Duration },
    /// The user spoke again soon after a turn ended early (at `paused_at`): the answer was
    /// dropped, and the turn goes on with the utterance that started at `utterance_start`.
    SpeechResumed {
        utterance_start: Duration,
        paused_at: Duration,
    },
    /// The final transcript of the utterance.
    Transcript { text: String },
    /// An utterance without words (noise, a cough): ignored.
    NoWords,
    /// The user spoke while an answer was still being generated: it was dropped.
    BargeIn,
    /// The client dropped the answer being made ([`Pipeline::cancel_answer`]).
    AnswerCancelled,
    /// The language model's side of the turn (PredGen's events).
    Answer(EventKind),
    /// A turn is complete.
    TurnDone(Box<VoiceTurn>),
}

impl std::fmt::Display for ChatEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let ChatEventKind::Answer(kind) = &self.kind {
            let event = Event {
                at: self.at,
                kind: kind.clone(),
            };
            return write!(f, "{event}");
        }
        write!(f, "{:>8.3} s  ", self.at.as_secs_f64())?;
        match &self.kind {
            ChatEventKind::SpeechStarted { started_at } => write!(
                f,
                "{:<14} (at {:.3} s)",
                "speech starts",
                started_at.as_secs_f64()
            ),
            ChatEventKind::Partial { text } => write!(f, "{:<14} \"{text}\"", "partial"),
            ChatEventKind::SpeechEnded { speech_end } => write!(
                f,
                "{:<14} (speech ended at {:.3} s)",
                "end of speech",
                speech_end.as_secs_f64()
            ),
            ChatEventKind::EndOfTurn { probability, wait } => write!(
                f,
                "{:<14} P = {probability:.2}: wait {:.0} ms of silence",
                "end of turn?",
                wait.as_secs_f64() * 1e3
            ),
            ChatEventKind::SpeechResumed {
                utterance_start, ..
            } => write!(
                f,
                "{:<14} (the answer was dropped; the utterance from {:.3} s goes on)",
                "speech resumed",
                utterance_start.as_secs_f64()
            ),
            ChatEventKind::Transcript { text } => write!(f, "{:<14} \"{text}\"", "transcript"),
            ChatEventKind::NoWords => write!(f, "{:<14} (no words: ignored)", "noise"),
            ChatEventKind::BargeIn => write!(f, "{:<14} (the answer was dropped)", "barge-in"),
            ChatEventKind::AnswerCancelled => write!(f, "{:<14} (by the client)", "cancelled"),
            ChatEventKind::TurnDone(turn) => write!(
                f,
                "{:<14} first audio {:.0} ms after the end of speech",
                "turn done",
                turn.latency().as_secs_f64() * 1e3
            ),
            ChatEventKind::Answer(_) => unreachable!("answer events are written above"),
        }
    }
}

/// One question and its answer, with the times of the whole pipeline on the stream's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct VoiceTurn {
    /// The language model's turn (question, answer, its timeline with the speech events).
    pub turn: Turn,
    /// The answer's speech.
    pub speech: Speech,
    pub speech_start: Duration,
    /// The end of the last voiced audio.
    pub speech_end: Duration,
    /// When the endpoint detector's silence had passed.
    pub endpoint_at: Duration,
    /// When the final transcript was ready.
    pub transcript_at: Duration,
    /// When the answer's first words could go to speech: the first piece of its first
    /// sentence when that was settled before the sentence was complete, the first sentence
    /// otherwise (`Turn::time_to_first_words`).
    pub first_words_at: Duration,
    /// When the first audio of the answer was ready to play.
    pub first_audio_at: Duration,
}

/// Where the time from the end of speech to the first audio went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyBreakdown {
    /// Waiting for the end-of-speech silence.
    pub endpointing: Duration,
    /// Whisper's final transcript after the silence.
    pub asr: Duration,
    /// The language model, from the final transcript to the first words that go to speech.
    pub llm: Duration,
    /// Speech synthesis of those words, beyond the language model's time.
    pub tts: Duration,
}

impl VoiceTurn {
    /// What the user waits for: from the end of speech to the first audio of the answer.
    pub fn latency(&self) -> Duration {
        self.first_audio_at.saturating_sub(self.speech_end)
    }

    pub fn breakdown(&self) -> LatencyBreakdown {
        LatencyBreakdown {
            endpointing: self.endpoint_at.saturating_sub(self.speech_end),
            asr: self.transcript_at.saturating_sub(self.endpoint_at),
            llm: self.first_words_at.saturating_sub(self.transcript_at),
            tts: self
                .first_audio_at
                .saturating_sub(self.first_words_at.max(self.transcript_at)),
        }
    }

    /// The answer's audio, sentence by sentence.
    pub fn audio(&self) -> impl Iterator<Item = &AudioChunk> {
        self.speech.audio.iter().flat_map(|s| s.chunks.iter())
    }
}

/// A turn in progress.
#[derive(Clone, Debug)]
struct TurnTimes {
    speech_start: Duration,
    /// Set once the utterance has ended: speech end, endpoint, final transcript.
    ended: Option<(Duration, Duration, Duration)>,
}

/// A voice conversation: a [`Listener`] (endpoint detector and streaming Whisper), a PredGen
/// session and a sentence synthesizer on one clock. PredGen reports the sentences that are
/// ready; the conversation speaks them ([`TurnVoice`]), preparing the audio of the newest
/// guessed first sentence when the user pauses.
pub struct VoiceChat<'m> {
    listener: Listener,
    predgen: PredGen<'m>,
    tts: Box<dyn SentenceSynthesizer + 'm>,
    voice: TurnVoice,
    mode: ChatMode,
    clock: Clock,
    turn: Option<TurnTimes>,
    events: Vec<ChatEvent>,
    /// When the last partial was reported: a recogniser that fell behind the audio (a slow
    /// machine) reports a partial after the end of speech was detected, and the end of speech
    /// is then reported after it, so that events stay in order of time.
    last_partial_at: Duration,
    /// The pause transcript whose end-of-turn estimate was reported last, and the estimate.
    estimated: Option<(String, f32)>,
    /// When the speech of the last completed turn ended: speech resuming it takes it back.
    last_turn_end: Option<Duration>,
}

impl<'m> VoiceChat<'m> {
    /// A conversation starting now (the wall clock starts here).
    pub fn new(
        listener: Listener,
        predgen: PredGen<'m>,
        tts: Box<dyn SentenceSynthesizer + 'm>,
        mode: ChatMode,
        clock: ClockKind,
    ) -> Self {
        let clock = Clock::start(clock);
        let mut predgen = predgen;
        predgen
            .set_estimate_end_of_turn(matches!(listener.config().turn_end, TurnEnd::Semantic(_)));
        Self {
            listener,
            predgen,
            tts,
            voice: TurnVoice::new(clock.clone()).preparing_when_asked(),
            mode,
            clock,
            turn: None,
            events: Vec::new(),
            last_partial_at: Duration::ZERO,
            estimated: None,
            last_turn_end: None,
        }
    }

    pub fn mode(&self) -> ChatMode {
        self.mode
    }

    /// The time on the stream's clock.
    pub fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Gives the listener and the PredGen session back.
    pub fn into_parts(self) -> (Listener, PredGen<'m>) {
        (self.listener, self.predgen)
    }

    /// Plays a recording into the conversation ([`play_recording`]): the turns it completes.
    pub fn play(
        &mut self,
        audio: &[f32],
        trailing_silence: Duration,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Vec<VoiceTurn>> {
        let mut turns = Vec::new();
        play_recording(self, audio, trailing_silence, &mut |event: ChatEvent| {
            on_event(&event);
            if let ChatEventKind::TurnDone(turn) = event.kind {
                turns.push(*turn);
            }
        })?;
        Ok(turns)
    }

    /// Does one piece of the language model's work. Returns whether there is more to do now
    /// (`false`: idle until more audio arrives).
    fn model_step(&mut self) -> Result<bool> {
        let Some(times) = self.turn.clone() else {
            return Ok(false);
        };
        let progress = self.predgen.step()?;
        let spoken = self.voice.speak(&progress.events, self.tts.as_mut())?;
        self.events.extend(
            progress
                .events
                .into_iter()
                .chain(spoken)
                .map(|event| ChatEvent {
                    at: event.at,
                    kind: ChatEventKind::Answer(event.kind),
                }),
        );
        match progress.status {
            Status::Working => Ok(true),
            Status::Idle => Ok(false),
            Status::Done(turn) => {
                self.turn = None;
                self.last_turn_end = times.ended.map(|(speech_end, ..)| speech_end);
                let (speech_end, endpoint_at, transcript_at) = times
                    .ended
                    .ok_or_else(|| Error::Input("a turn ended before its utterance did".into()))?;
                let spoken = self.voice.finish(*turn);
                let voice_turn = VoiceTurn {
                    speech_start: times.speech_start,
                    speech_end,
                    endpoint_at,
                    transcript_at,
                    first_words_at: spoken.turn.input_end + spoken.turn.time_to_first_words,
                    first_audio_at: spoken.turn.input_end + spoken.audio_latency(),
                    turn: spoken.turn,
                    speech: spoken.speech,
                };
                let at = self.now();
                self.events.push(ChatEvent {
                    at,
                    kind: ChatEventKind::TurnDone(Box::new(voice_turn)),
                });
                Ok(false)
            }
        }
    }

    /// With the semantic end of turn, while the user pauses: reports the model's estimate for
    /// the pause's transcript once, and ends the utterance when the silence has lasted the
    /// wait it calls for.
    fn end_turn_if_due(&mut self) -> Result<()> {
        let TurnEnd::Semantic(policy) = &self.listener.config().turn_end else {
            return Ok(());
        };
        let Some(pause) = self.listener.pause() else {
            return Ok(());
        };
        let Some(estimate) = self
            .predgen
            .end_of_turn()
            .filter(|e| e.words == pause.transcript)
        else {
            return Ok(());
        };
        let wait = policy.wait(estimate.probability);
        let reported = (pause.transcript.to_string(), estimate.probability);
        if self.estimated.as_ref() != Some(&reported) {
            self.estimated = Some(reported);
            self.events.push(ChatEvent {
                at: self.clock.now(),
                kind: ChatEventKind::EndOfTurn {
                    probability: estimate.probability,
                    wait,
                },
            });
        }
        if pause.silence >= wait {
            let clock = self.clock.clone();
            if let Some(heard) = self.listener.end_utterance(&clock)? {
                self.on_heard(vec![heard])?;
            }
        }
        Ok(())
    }

    /// Starts a turn for speech that started at `speech_start`.
    fn begin_turn(&mut self, speech_start: Duration) -> Result<()> {
        match self.mode {
            ChatMode::PredGen => self.predgen.begin_turn(&self.clock)?,
            ChatMode::Cascade => self.predgen.begin_cascade_turn(&self.clock)?,
        }
        self.turn = Some(TurnTimes {
            speech_start,
            ended: None,
        });
        Ok(())
    }

    /// Hands a transcript to the turn in progress.
    fn hear(&mut self, transcript: Partial) -> Result<()> {
        if self.turn.is_none() {
            return Err(Error::Input("a transcript outside an utterance".into()));
        }
        Ok(self.predgen.hear(transcript)?)
    }
}

impl Pipeline for VoiceChat<'_> {
    type Event = ChatEvent;

    fn clock(&self) -> &Clock {
        &self.clock
    }

    fn listener(&self) -> &Listener {
        &self.listener
    }

    fn listener_mut(&mut self) -> &mut Listener {
        &mut self.listener
    }

    /// Starts and ends turns, and hands the transcripts to the language model.
    fn on_heard(&mut self, heard: Vec<Heard>) -> Result<()> {
        for item in heard {
            let at = self.now();
            match item {
                Heard::Started { at: started_at } => {
                    if self.turn.take().is_some() {
                        self.predgen.cancel_turn()?;
                        self.voice.cancel();
                        self.events.push(ChatEvent {
                            at,
                            kind: ChatEventKind::BargeIn,
                        });
                    }
                    self.begin_turn(started_at)?;
                    self.events.push(ChatEvent {
                        at,
                        kind: ChatEventKind::SpeechStarted { started_at },
                    });
                }
                Heard::Resumed {
                    utterance_start,
                    paused_at,
                    ..
                } => {
                    // The end of the turn was declared too early: its answer is dropped (or,
                    // complete already, taken back), and the turn goes on.
                    if self.turn.take().is_some() {
                        self.predgen.cancel_turn()?;
                    } else if self.last_turn_end == Some(paused_at) {
                        self.predgen.retract_last_turn()?;
                    }
                    self.voice.cancel();
                    self.last_turn_end = None;
                    self.estimated = None;
                    self.begin_turn(utterance_start)?;
                    self.events.push(ChatEvent {
                        at,
                        kind: ChatEventKind::SpeechResumed {
                            utterance_start,
                            paused_at,
                        },
                    });
                }
                Heard::Partial(partial) => {
                    if !partial.text.trim().is_empty() {
                        let text = partial.text.clone();
                        self.hear(partial)?;
                        self.last_partial_at = at;
                        self.events.push(ChatEvent {
                            at,
                            kind: ChatEventKind::Partial { text },
                        });
                    }
                }
                Heard::Final {
                    transcript,
                    speech_end,
                    detected_at,
                } => {
                    self.events.push(ChatEvent {
                        at: detected_at.max(self.last_partial_at),
                        kind: ChatEventKind::SpeechEnded { speech_end },
                    });
                    if transcript.text.trim().is_empty() {
                        self.turn = None;
                        self.predgen.cancel_turn()?;
                        self.voice.cancel();
                        self.events.push(ChatEvent {
                            at,
                            kind: ChatEventKind::NoWords,
                        });
                        continue;
                    }
                    if let Some(times) = &mut self.turn {
                        times.ended = Some((speech_end, detected_at, at));
                    }
                    let text = transcript.text.clone();
                    self.hear(transcript)?;
                    self.events.push(ChatEvent {
                        at,
                        kind: ChatEventKind::Transcript { text },
                    });
                }
            }
        }
        Ok(())
    }

    /// One piece of work (`false`: idle until more audio arrives): the language model's; once
    /// it has nothing to do and the user pauses (or has stopped), the audio of its guessed first
    /// sentence. A pause is when the question is most likely complete and the CPU otherwise
    /// idle, so that a synthesis that a later guess makes useless seldom delays the recognizer.
    fn step(&mut self) -> Result<bool> {
        self.end_turn_if_due()?;
        if self.model_step()? {
            return Ok(true);
        }
        if !(self.voice.has_guess() && self.listener.speaker_paused()) {
            return Ok(false);
        }
        if let Some(event) = self.voice.prepare_guess(self.tts.as_mut())? {
            self.events.push(ChatEvent {
                at: event.at,
                kind: ChatEventKind::Answer(event.kind),
            });
        }
        Ok(true)
    }

    /// Drops the answer being made, if the user's turn has ended; an utterance in progress
    /// goes on.
    fn cancel_answer(&mut self) -> Result<()> {
        if self.turn.as_ref().is_some_and(|turn| turn.ended.is_some()) {
            self.turn = None;
            self.predgen.cancel_turn()?;
            self.voice.cancel();
            self.events.push(ChatEvent {
                at: self.now(),
                kind: ChatEventKind::AnswerCancelled,
            });
        }
        Ok(())
    }

    /// A turn is in progress: the user speaking, or an answer being made.
    fn in_turn(&self) -> bool {
        self.turn.is_some()
    }

    fn take_events(&mut self) -> Vec<ChatEvent> {
        std::mem::take(&mut self.events)
    }
}
