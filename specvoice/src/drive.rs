//! The one loop that drives a pipeline: audio from a source (a recording on the simulated or
//! the wall clock, a connection's stream) goes to the pipeline's listener, the pipeline works
//! whenever no audio is waiting, and its events go out as they happen.

use std::time::Duration;

use spec_voice::Clock;

use crate::endpoint::{duration_of, samples_in};
use crate::listener::{Heard, Listener};
use crate::{Error, Result};

/// Something audio flows into through a [`Listener`], driven step by step: a voice chat, live
/// captions. Audio goes to the listener ([`Pipeline::hear_audio`]) and what it hears to
/// [`Pipeline::on_heard`]; work that can wait for a free moment is done in
/// [`Pipeline::step`].
pub trait Pipeline {
    /// What it reports.
    type Event;

    /// The pipeline's clock (shared with its parts).
    fn clock(&self) -> &Clock;

    fn listener(&self) -> &Listener;

    fn listener_mut(&mut self) -> &mut Listener;

    /// Acts on what the listener heard (called by [`Pipeline::hear_audio`] and
    /// [`Pipeline::end_of_audio`]).
    fn on_heard(&mut self, heard: Vec<Heard>) -> Result<()>;

    /// One piece of work besides hearing; whether there is more to do now. Nothing by default.
    fn step(&mut self) -> Result<bool> {
        Ok(false)
    }

    /// Whether work remains that only more steps complete (an answer being made).
    fn in_turn(&self) -> bool {
        false
    }

    /// Events since the last call.
    fn take_events(&mut self) -> Vec<Self::Event>;

    /// Stream time of the audio heard so far.
    fn audio_time(&self) -> Duration {
        self.listener().audio_time()
    }

    /// Audio arrived (16 kHz mono): the listener runs on it now.
    fn hear_audio(&mut self, samples: &[f32]) -> Result<()> {
        let clock = self.clock().clone();
        let heard = self.listener_mut().push(samples, &clock)?;
        self.on_heard(heard)
    }

    /// The client says the utterance is complete (a Realtime client's commit): it ends now if
    /// the speaker has paused, as after the detector's silence.
    fn end_utterance(&mut self) -> Result<()> {
        let clock = self.clock().clone();
        let heard = self.listener_mut().end_utterance(&clock)?;
        self.on_heard(heard.into_iter().collect())
    }

    /// The client drops the answer being made (a Realtime client's cancel). Nothing by default.
    fn cancel_answer(&mut self) -> Result<()> {
        Ok(())
    }

    /// The audio stream ended: an utterance in progress ends with it.
    fn end_of_audio(&mut self) -> Result<()> {
        let clock = self.clock().clone();
        let heard = self.listener_mut().finish(&clock)?;
        self.on_heard(heard.into_iter().collect())
    }
}

/// Size of the packets audio arrives in from a recording: 20 ms, as from a microphone.
pub const PACKET: Duration = Duration::from_millis(20);

/// What an [`AudioSource`] has for the pipeline.
#[derive(Clone, Debug, PartialEq)]
pub enum Arrival {
    /// Audio (16 kHz mono).
    Audio(Vec<f32>),
    /// The audio stream ended.
    End,
    /// The client declares the utterance complete ([`Pipeline::end_utterance`]).
    EndUtterance,
    /// The client drops the answer being made ([`Pipeline::cancel_answer`]).
    CancelAnswer,
    /// Nothing yet.
    Nothing,
    /// The other side is gone: no more audio will come, and events have nowhere to go.
    Gone,
}

/// Where a pipeline's audio comes from: a recording, a microphone, a client's connection.
pub trait AudioSource {
    /// What has arrived by the clock's now, without waiting.
    fn poll(&mut self, clock: &Clock) -> Arrival;

    /// The pipeline is idle: waits for the next arrival (a simulated clock jumps to it).
    fn wait(&mut self, clock: &Clock) -> Arrival;
}

/// How [`drive`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The audio ended and all its work is done.
    Finished,
    /// The source or the receiver of the events is gone.
    Disconnected,
}

/// Drives `pipeline` with the audio of `source` until the audio has ended and its work is
/// done: hears all the audio that has arrived, then does one step of work, and waits for more
/// audio only when there is no work. `on_event` sees every event as it happens and returns
/// `false` when its receiver is gone. Recordings ([`play_recording`]) and the server's
/// sessions run on this loop.
pub fn drive<P: Pipeline + ?Sized>(
    pipeline: &mut P,
    source: &mut dyn AudioSource,
    on_event: &mut dyn FnMut(P::Event) -> bool,
) -> Result<Ended> {
    let mut ended = false;
    let mut send = |pipeline: &mut P| pipeline.take_events().into_iter().all(&mut *on_event);
    loop {
        loop {
            let arrival = source.poll(pipeline.clock());
            if arrival == Arrival::Nothing {
                break;
            }
            if !hear(pipeline, arrival, &mut ended)? || !send(pipeline) {
                return Ok(Ended::Disconnected);
            }
        }
        let working = pipeline.step()?;
        if !send(pipeline) {
            return Ok(Ended::Disconnected);
        }
        if working {
            continue;
        }
        if ended {
            if pipeline.in_turn() {
                return Err(Error::Input(
                    "the audio ended and the turn in progress has nothing left to do".into(),
                ));
            }
            return Ok(Ended::Finished);
        }
        let arrival = source.wait(pipeline.clock());
        if !hear(pipeline, arrival, &mut ended)? || !send(pipeline) {
            return Ok(Ended::Disconnected);
        }
    }
}

/// Hands an arrival to the pipeline; `false` when the source is gone.
fn hear<P: Pipeline + ?Sized>(
    pipeline: &mut P,
    arrival: Arrival,
    ended: &mut bool,
) -> Result<bool> {
    match arrival {
        Arrival::Audio(_) if *ended => {
            return Err(Error::Input("audio after the end of the stream".into()))
        }
        Arrival::Audio(samples) => pipeline.hear_audio(&samples)?,
        Arrival::End if !*ended => {
            *ended = true;
            pipeline.end_of_audio()?;
        }
        Arrival::EndUtterance if !*ended => pipeline.end_utterance()?,
        Arrival::CancelAnswer => pipeline.cancel_answer()?,
        Arrival::End | Arrival::EndUtterance | Arrival::Nothing => {}
        Arrival::Gone => return Ok(false),
    }
    Ok(true)
}

/// A recording (16 kHz mono) followed by silence, arriving in [`PACKET`]s as its time comes on
/// the pipeline's clock: on the simulated clock the models compute in between and an idle
/// pipeline jumps to the next packet; on the wall clock it plays in real time.
#[derive(Debug)]
pub struct Recording<'a> {
    audio: &'a [f32],
    /// Samples of the recording and the silence after it.
    total: usize,
    /// Stream time of the recording's first sample.
    start: Duration,
    fed: usize,
    ended: bool,
}

impl<'a> Recording<'a> {
    /// `audio` followed by `trailing_silence` (the microphone stays open after the user stops),
    /// its first sample at stream time `start`.
    pub fn new(audio: &'a [f32], trailing_silence: Duration, start: Duration) -> Result<Self> {
        if audio.is_empty() {
            return Err(Error::Input("the recording has no samples".into()));
        }
        Ok(Self {
            audio,
            total: audio.len() + samples_in(trailing_silence),
            start,
            fed: 0,
            ended: false,
        })
    }
}

impl AudioSource for Recording<'_> {
    fn poll(&mut self, clock: &Clock) -> Arrival {
        let packet = samples_in(PACKET);
        let elapsed = clock.now().saturating_sub(self.start);
        let arrived = (samples_in(elapsed) / packet * packet).min(self.total);
        if arrived > self.fed {
            let piece = (self.fed..arrived)
                .map(|i| self.audio.get(i).copied().unwrap_or(0.0))
                .collect();
            self.fed = arrived;
            Arrival::Audio(piece)
        } else if self.fed == self.total && !self.ended {
            self.ended = true;
            Arrival::End
        } else {
            Arrival::Nothing
        }
    }

    fn wait(&mut self, clock: &Clock) -> Arrival {
        if self.fed < self.total {
            let packet = samples_in(PACKET);
            let next = self.start + duration_of((self.fed / packet + 1) * packet);
            clock.wait_until(next);
        }
        self.poll(clock)
    }
}

/// Plays a recording (16 kHz mono) into `pipeline` on its clock ([`Recording`]), followed by
/// `trailing_silence`, until all its work is done; `on_event` sees every event as it happens.
/// Silence fills the time between the audio heard last and the recording's start (the
/// microphone was open).
pub fn play_recording<P: Pipeline>(
    pipeline: &mut P,
    audio: &[f32],
    trailing_silence: Duration,
    on_event: &mut dyn FnMut(P::Event),
) -> Result<()> {
    let mut recording = Recording::new(audio, trailing_silence, Duration::ZERO)?;
    let packet = samples_in(PACKET);
    let gap =
        samples_in(pipeline.clock().now().saturating_sub(pipeline.audio_time())) / packet * packet;
    if gap > 0 {
        pipeline.hear_audio(&vec![0.0; gap])?;
    }
    // The recording starts where the silence ended.
    recording.start = pipeline.audio_time();
    drive(pipeline, &mut recording, &mut |event| {
        on_event(event);
        true
    })?;
    Ok(())
}
