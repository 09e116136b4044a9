//! What the pipeline's tests share: speech-like test audio, the settings under which tiny
//! random-weight models run the pipeline, and real speech from espeak-ng. Each test binary uses
//! part of it.
#![allow(dead_code)]

use std::time::Duration;

use engine_asr::{resample, TranscribeOptions};
use engine_llm::PredGenConfig;
use engine_tts::espeak::{EspeakSettings, EspeakSynthesizer};
use spec_voice::SentenceSynthesizer;
use specvoice::endpoint::{duration_of, samples_in};
use specvoice::ListenerConfig;

pub const RATE: f32 = 16_000.0;

pub fn silence(seconds: f32) -> Vec<f32> {
    vec![0.0; (seconds * RATE) as usize]
}

/// Speech-like sound: two tones under a syllable-rate envelope.
pub fn voice(seconds: f32) -> Vec<f32> {
    (0..(seconds * RATE) as usize)
        .map(|i| {
            let t = i as f32 / RATE;
            let envelope = 0.6 + 0.4 * (2.0 * std::f32::consts::PI * 4.0 * t).sin();
            envelope
                * (0.3 * (2.0 * std::f32::consts::PI * 220.0 * t).sin()
                    + 0.2 * (2.0 * std::f32::consts::PI * 1375.0 * t).sin())
        })
        .collect()
}

/// Hearing with a random Whisper: greedy decoding without the thresholds a random model's
/// transcripts never pass.
pub fn random_listener_config() -> ListenerConfig {
    ListenerConfig {
        transcribe: TranscribeOptions {
            temperatures: vec![0.0],
            compression_ratio_threshold: None,
            log_prob_threshold: None,
            no_speech_threshold: None,
            ..ListenerConfig::default().transcribe
        },
        ..ListenerConfig::default()
    }
}

/// PredGen on the tiny chat model (a 512-token context): a short system prompt and answers.
pub fn random_predgen_config() -> PredGenConfig {
    PredGenConfig {
        system_prompt: "Answer briefly.".to_string(),
        max_guess_tokens: 12,
        max_answer_tokens: 24,
        ..PredGenConfig::default()
    }
}

/// `text` spoken by espeak-ng at 16 kHz after `lead_in` of silence, and where its speech ends.
pub fn spoken(text: &str, lead_in: Duration) -> (Vec<f32>, Duration) {
    let audio = EspeakSynthesizer::new(EspeakSettings::default())
        .expect("espeak-ng (apt-get install espeak-ng)")
        .synthesize(text)
        .unwrap()
        .joined()
        .unwrap();
    let samples = resample(&audio.samples, audio.sample_rate, 16_000).unwrap();
    let last_loud = samples.iter().rposition(|s| s.abs() > 0.01).unwrap();
    let lead = samples_in(lead_in);
    let speech_end = duration_of(lead + last_loud);
    ([vec![0.0; lead], samples].concat(), speech_end)
}
