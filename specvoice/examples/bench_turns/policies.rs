//! The end-of-turn policies compared, and what each did with one utterance: its endpoints, the
//! pauses it cut, the turn answered last and when its first audio was ready.

use std::time::{Duration, Instant};

use anyhow::Result;
use engine_asr::Transcriber;
use engine_llm::predgen::EventKind;
use engine_llm::{LanguageModel, PredGen, PredGenConfig};
use spec_voice::SentenceSynthesizer;
use specvoice::{
    Boundary, ChatEventKind, ChatMode, ClockKind, EndpointConfig, EndpointDetector, Listener,
    ListenerConfig, SemanticTurnEnd, SileroSettings, TurnEnd, Vad, VoiceChat, VoiceTurn,
};

/// How a turn's end is found.
#[derive(Clone, Debug)]
pub struct Policy {
    pub name: String,
    pub listener: ListenerConfig,
}

impl Policy {
    /// A fixed silence after the energy detector's last voiced frame.
    pub fn fixed(silence_ms: u64, base: &ListenerConfig) -> Self {
        let mut listener = ListenerConfig {
            turn_end: TurnEnd::Silence,
            ..base.clone()
        };
        listener.endpoint.silence = Duration::from_millis(silence_ms);
        Self {
            name: format!("fixed {silence_ms} ms"),
            listener,
        }
    }

    /// A fixed silence after Silero VAD's last voiced window (weights at `model`).
    pub fn silero_fixed(silence_ms: u64, model: &std::path::Path, base: &ListenerConfig) -> Self {
        let mut policy = Self::fixed(silence_ms, base);
        policy.listener.endpoint.vad = Vad::Silero(SileroSettings::new(model.to_path_buf()));
        policy.name = format!("Silero + fixed {silence_ms} ms");
        policy
    }

    /// The chat model's end-of-turn probability sets the silence.
    pub fn semantic(policy: SemanticTurnEnd, base: &ListenerConfig) -> Self {
        Self {
            name: "semantic".to_string(),
            listener: ListenerConfig {
                turn_end: TurnEnd::Semantic(policy),
                ..base.clone()
            },
        }
    }

    /// The reference: a fixed silence as long as the semantic policy's longest wait, which no
    /// pause of the set reaches.
    pub fn long_silence(base: &ListenerConfig) -> Self {
        let longest = SemanticTurnEnd::default().longest;
        let mut policy = Self::fixed(longest.as_millis() as u64, base);
        policy.name = format!("reference (fixed {} ms)", longest.as_millis());
        policy
    }

    /// Silence to play after an utterance: the longest wait and a margin.
    pub fn trailing(&self) -> Duration {
        self.listener.detector().silence + Duration::from_millis(300)
    }
}

/// One utterance of the set as the runner needs it.
pub struct Spoken<'a> {
    pub samples: &'a [f32],
    /// Each mid-utterance pause: the end of the voiced audio before it and the start after.
    pub pauses: &'a [(Duration, Duration)],
}

/// What one policy did with one utterance.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Pauses in which it declared an end of turn.
    pub cut_pauses: usize,
    /// The turn answered last (the whole question's, unless a cut split it), if any.
    pub last_turn: Option<VoiceTurn>,
    /// Answers begun to a question cut short: audio of them was ready before the user went on.
    pub wrong_answers_begun: usize,
    /// The end-of-turn estimates reported (probability, wait).
    pub estimates: Vec<(f32, Duration)>,
}

/// A speech end declared at most this long before a pause counts as declared in it (a frame
/// of the detector, and the level trimming of the set's ground truth).
const PAUSE_TOLERANCE: Duration = Duration::from_millis(100);

/// Plays `spoken` through a fresh conversation hearing with `policy` and answering in `mode`.
#[allow(clippy::too_many_arguments)]
pub fn play(
    policy: &Policy,
    mode: ChatMode,
    spoken: &Spoken<'_>,
    whisper: &mut Option<Transcriber>,
    model: &mut LanguageModel,
    predgen: &PredGenConfig,
    voice: Box<dyn SentenceSynthesizer + '_>,
) -> Result<Outcome> {
    let listener = Listener::new(
        whisper.take().expect("Whisper is back"),
        policy.listener.clone(),
    )?;
    let session = PredGen::new(model, predgen.clone())?;
    let mut chat = VoiceChat::new(listener, session, voice, mode, ClockKind::Simulated);
    let mut events = Vec::new();
    let played = chat.play(spoken.samples, policy.trailing(), &mut |event| {
        events.push(event.clone());
    });
    *whisper = Some(chat.into_parts().0.into_transcriber());
    let turns = played?;
    let cut = |speech_end: Duration| {
        spoken
            .pauses
            .iter()
            .position(|&(start, end)| speech_end + PAUSE_TOLERANCE >= start && speech_end < end)
    };
    let mut cut_pauses: Vec<usize> = events
        .iter()
        .filter_map(|e| match e.kind {
            ChatEventKind::SpeechEnded { speech_end } => cut(speech_end),
            _ => None,
        })
        .collect();
    cut_pauses.dedup();
    // A cut question's answer was begun if its first audio was ready before speech resumed:
    // a turn completed before the last, or one dropped after its audio started.
    let mut wrong_answers_begun = turns.len().saturating_sub(1);
    let mut audio_started = false;
    for event in &events {
        match &event.kind {
            ChatEventKind::Answer(EventKind::Speech(spec_voice::SpeechEvent::AudioStarts {
                ..
            })) => audio_started = true,
            ChatEventKind::TurnDone(_) | ChatEventKind::SpeechStarted { .. } => {
                audio_started = false;
            }
            ChatEventKind::SpeechResumed { .. } => {
                if audio_started {
                    wrong_answers_begun += 1;
                }
                audio_started = false;
            }
            _ => {}
        }
    }
    let estimates = events
        .iter()
        .filter_map(|e| match e.kind {
            ChatEventKind::EndOfTurn { probability, wait } => Some((probability, wait)),
            _ => None,
        })
        .collect();
    Ok(Outcome {
        cut_pauses: cut_pauses.len(),
        last_turn: turns.into_iter().last(),
        wrong_answers_begun,
        estimates,
    })
}

/// The boundaries `config`'s detector finds in `samples` pushed in 20 ms packets, and the
/// time it took.
pub fn detect(config: &EndpointConfig, samples: &[f32]) -> Result<(Vec<Boundary>, Duration)> {
    let mut detector = EndpointDetector::new(config.clone())?;
    let started = Instant::now();
    let mut boundaries: Vec<Boundary> = samples
        .chunks(320)
        .flat_map(|packet| detector.push(packet))
        .collect();
    boundaries.extend(detector.finish());
    Ok((boundaries, started.elapsed()))
}
