//! The pipeline's clock and the loop that plays a recording into a pipeline.

use std::time::{Duration, Instant};

use spec_voice::SimClock;

use crate::endpoint::{duration_of, samples_in};
use crate::listener::{Heard, Listener};
use crate::{Error, Result};

/// How time runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockKind {
    /// Real time: audio arrives as it is spoken, and waiting is sleeping.
    Wall,
    /// Compute time: time advances by the measured compute of the recognizer and the models,
    /// and jumps to the next audio when they are idle; every latency is real measured compute,
    /// but a recording replays as fast as the machine allows.
    Simulated,
}

/// A pipeline's clock: stream time from its start.
#[derive(Clone, Copy, Debug)]
pub enum PipelineClock {
    Wall(Instant),
    Simulated(SimClock),
}

impl PipelineClock {
    /// A clock at zero now.
    pub fn start(kind: ClockKind) -> Self {
        match kind {
            ClockKind::Wall => Self::Wall(Instant::now()),
            ClockKind::Simulated => Self::Simulated(SimClock::new()),
        }
    }

    pub fn kind(&self) -> ClockKind {
        match self {
            Self::Wall(_) => ClockKind::Wall,
            Self::Simulated(_) => ClockKind::Simulated,
        }
    }

    pub fn now(&self) -> Duration {
        match self {
            Self::Wall(start) => start.elapsed(),
            Self::Simulated(clock) => clock.now(),
        }
    }

    /// Compute was spent: the simulated clock advances (the wall clock has seen it pass).
    pub fn charge(&mut self, compute: Duration) {
        if let Self::Simulated(clock) = self {
            clock.advance(compute);
        }
    }

    /// Nothing to do until `at`: the simulated clock jumps there, the wall clock sleeps.
    pub fn wait_until(&mut self, at: Duration) {
        match self {
            Self::Simulated(clock) => clock.wait_until(at),
            Self::Wall(start) => std::thread::sleep(at.saturating_sub(start.elapsed())),
        }
    }
}

/// Something audio flows into through a [`Listener`], driven step by step: a voice chat, live
/// captions. Audio goes to the listener ([`Pipeline::hear_audio`]) and what it hears to
/// [`Pipeline::on_heard`]; work that can wait for a free moment is done in
/// [`Pipeline::step`].
pub trait Pipeline {
    /// What it reports.
    type Event;

    fn clock(&mut self) -> &mut PipelineClock;

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
        let heard = self.listener_mut().push(samples)?;
        self.on_heard(heard)
    }

    /// The audio stream ended: an utterance in progress ends with it.
    fn end_of_audio(&mut self) -> Result<()> {
        let heard = self.listener_mut().finish()?;
        self.on_heard(heard.into_iter().collect())
    }
}

/// Size of the packets audio arrives in from a recording: 20 ms, as from a microphone.
pub const PACKET: Duration = Duration::from_millis(20);

/// Plays a recording (16 kHz mono) into `pipeline` on its clock, followed by
/// `trailing_silence` (the microphone stays open after the user stops), until all its work is
/// done. Audio arrives in [`PACKET`]s: on the simulated clock each when its time comes, the
/// models computing in between; on the wall clock in real time. `on_event` sees every event
/// as it happens.
pub fn play_recording<P: Pipeline>(
    pipeline: &mut P,
    audio: &[f32],
    trailing_silence: Duration,
    on_event: &mut dyn FnMut(P::Event),
) -> Result<()> {
    if audio.is_empty() {
        return Err(Error::Input("the recording has no samples".into()));
    }
    let packet = samples_in(PACKET);
    // The microphone was open and silent since the audio heard last.
    let now = pipeline.clock().now();
    let gap = samples_in(now.saturating_sub(pipeline.audio_time())) / packet * packet;
    if gap > 0 {
        pipeline.hear_audio(&vec![0.0; gap])?;
    }
    let total = audio.len() + samples_in(trailing_silence);
    let start = pipeline.audio_time();
    let mut fed = 0;
    let mut ended = false;
    loop {
        let elapsed = pipeline.clock().now().saturating_sub(start);
        let arrived = (samples_in(elapsed) / packet * packet).min(total);
        if arrived > fed {
            let piece: Vec<f32> = (fed..arrived)
                .map(|i| audio.get(i).copied().unwrap_or(0.0))
                .collect();
            pipeline.hear_audio(&piece)?;
            fed = arrived;
        } else if fed == total && !ended {
            pipeline.end_of_audio()?;
            ended = true;
        }
        let working = pipeline.step()?;
        pipeline.take_events().into_iter().for_each(&mut *on_event);
        if working {
            continue;
        }
        if ended {
            if pipeline.in_turn() {
                return Err(Error::Input(
                    "the audio ended and the turn in progress has nothing left to do".into(),
                ));
            }
            return Ok(());
        }
        if fed < total {
            let next = start + duration_of((fed / packet + 1) * packet);
            pipeline.clock().wait_until(next);
        }
    }
}
