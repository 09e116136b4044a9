//! Token-for-token parity with faster-whisper 1.2.1 on the parity clips, shared by the
//! `parity_faster_whisper` example and `bench_asr`: both sides decode the very same 16 kHz
//! samples with the same weights and settings (the whole 30-second window encoded, f32
//! matrices, greedy, no timestamps, language en, blank and non-speech suppression, no VAD, no
//! previous-text conditioning) and their token ids are compared clip by clip; WER with
//! Whisper's English normalizer on both sides, and SpecVoice's defaults beside them.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::wer::{word_errors, WordErrors};
use engine_asr::{EncoderLength, LoadOptions, TranscribeOptions, Transcriber};
use serde::Deserialize;
use spec_core::report::Table;
use spec_models::Store;
use spec_nn::Requantize;

use crate::parity_clips::{describe, Clip};

/// The comparison's tables: one row per model, one per clip that differs, and the differing
/// clips' tokens (JSON) to study the first difference.
pub struct Parity {
    pub table: Table,
    pub details: Table,
    pub differences: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct PeerOutput {
    results: Vec<PeerClip>,
}

#[derive(Deserialize)]
struct PeerClip {
    clip: String,
    tokens: Vec<u32>,
    text: String,
    temperatures: Vec<f32>,
}

/// faster-whisper's output on `clips`, cached in `cache` (its run is most of the harness's
/// time, and its answer depends only on the model, the clips and the settings).
fn faster_whisper(
    python: &Path,
    model: &Path,
    clips: &[Clip],
    fallback: bool,
    cache: &Path,
) -> Result<Vec<PeerClip>> {
    if let Ok(text) = std::fs::read(cache) {
        let cached: PeerOutput = serde_json::from_slice(&text)?;
        let raws: Vec<String> = clips.iter().map(|c| c.raw.display().to_string()).collect();
        let cached_raws: Vec<&String> = cached.results.iter().map(|r| &r.clip).collect();
        if cached_raws
            .iter()
            .eq(raws.iter().collect::<Vec<_>>().iter())
        {
            return Ok(cached.results);
        }
    }
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/peers/parity_faster_whisper.py");
    let mut command = Command::new(python);
    command.arg(&script).arg("--model").arg(model);
    if fallback {
        command.arg("--fallback");
    }
    command.args(clips.iter().map(|c| &c.raw));
    let output = command.output().context("running faster-whisper")?;
    if !output.status.success() {
        bail!(
            "faster-whisper failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let parsed: PeerOutput = serde_json::from_slice(&output.stdout)?;
    std::fs::write(cache, &output.stdout).with_context(|| cache.display().to_string())?;
    if parsed.results.len() != clips.len() {
        bail!(
            "faster-whisper answered for {} clips of {}",
            parsed.results.len(),
            clips.len()
        );
    }
    Ok(parsed.results)
}

/// Every model of `models` against faster-whisper (through `python`) on `clips`, greedy or
/// with the temperature fallback on both sides; faster-whisper's answers cached in `dir`.
pub fn token_parity(
    store: &Store<'_>,
    normalizer: &EnglishTextNormalizer,
    python: &Path,
    models: &[String],
    clips: &[Clip],
    fallback: bool,
    dir: &Path,
) -> Result<Parity> {
    let options = TranscribeOptions {
        language: Some("en".into()),
        best_of: 1,
        condition_on_previous_text: false,
        encoder_length: EncoderLength::Full,
        ..if fallback {
            TranscribeOptions::default()
        } else {
            TranscribeOptions {
                temperatures: vec![0.0],
                ..TranscribeOptions::default()
            }
        }
    };
    // The library's defaults (Q8_0 decoder, audio + 10 s encoder, temperature fallback) for
    // the last column.
    let default_options = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    let load = LoadOptions {
        requantize: Requantize::Keep,
        ..LoadOptions::default()
    };
    let mut table = Table::new(
        format!(
            "Token parity with faster-whisper 1.2.1 (float32), {} clips, {}",
            clips.len(),
            if fallback {
                "temperature fallback 0, 0.2 … 1.0 (one sample each)"
            } else {
                "greedy (temperature 0 only)"
            }
        ),
        &[
            "model",
            "identical tokens",
            "differing",
            "WER % SpecVoice",
            "WER % faster-whisper",
            "windows re-decoded SpecVoice / faster-whisper",
            "WER % SpecVoice default settings",
        ],
    );
    let mut details = Table::new(
        "Clips whose tokens differ",
        &[
            "model",
            "clip",
            "first difference at token",
            "SpecVoice",
            "faster-whisper",
        ],
    );
    let mut differences = Vec::new();
    for name in models {
        let model = store.resolve(name)?;
        eprintln!("== {name}: faster-whisper");
        let cache = dir.join(format!(
            "faster-whisper-{}-{}.json",
            name.replace('/', "_"),
            if fallback { "fallback" } else { "greedy" }
        ));
        let peers = faster_whisper(python, &model.dir, clips, fallback, &cache)?;
        eprintln!("== {name}: SpecVoice");
        let mut transcriber = Transcriber::load(&model.dir, &load)?;
        let mut default_transcriber = Transcriber::load(&model.dir, &LoadOptions::default())?;
        let mut default_errors = WordErrors::default();
        let (mut identical, mut ours_errors, mut peer_errors) =
            (0, WordErrors::default(), WordErrors::default());
        let (mut ours_fallbacks, mut peer_fallbacks) = (0, 0);
        for (clip, peer) in clips.iter().zip(&peers) {
            let transcript = transcriber.transcribe(&clip.samples, &options)?;
            let tokens: Vec<u32> = transcript
                .segments
                .iter()
                .flat_map(|s| s.tokens.iter().copied())
                .collect();
            ours_fallbacks += transcript.stats.fallbacks;
            peer_fallbacks += peer.temperatures.iter().filter(|&&t| t > 0.0).count();
            let reference = normalizer.normalize(&clip.reference);
            let default = default_transcriber.transcribe(&clip.samples, &default_options)?;
            default_errors += word_errors(&reference, &normalizer.normalize(&default.text));
            ours_errors += word_errors(&reference, &normalizer.normalize(&transcript.text));
            peer_errors += word_errors(&reference, &normalizer.normalize(&peer.text));
            if tokens == peer.tokens {
                identical += 1;
                continue;
            }
            let first = tokens
                .iter()
                .zip(&peer.tokens)
                .take_while(|(a, b)| a == b)
                .count();
            eprintln!(
                "{name} {}: differs at token {first}\n  ours: {}\n  peer: {}",
                clip.name, transcript.text, peer.text
            );
            differences.push(serde_json::json!({
                "model": model.dir,
                "clip": clip.raw,
                "ours": tokens,
                "peer": peer.tokens,
            }));
            details.push(vec![
                name.clone(),
                clip.name.clone(),
                first.to_string(),
                transcript.text.clone(),
                peer.text.clone(),
            ]);
        }
        table.push(vec![
            name.clone(),
            identical.to_string(),
            (clips.len() - identical).to_string(),
            format!("{:.2}", 100.0 * ours_errors.rate()),
            format!("{:.2}", 100.0 * peer_errors.rate()),
            format!("{ours_fallbacks} / {peer_fallbacks}"),
            format!("{:.2}", 100.0 * default_errors.rate()),
        ]);
    }
    Ok(Parity {
        table,
        details,
        differences,
    })
}

/// What both sides ran.
const SETTINGS: &str = "Both sides: the whole 30-second window encoded, f32 weights \
    (faster-whisper's compute_type float32, SpecVoice's Requantize::Keep), beam 1, best_of 1, \
    no timestamps, language en, suppress_blank, suppress_tokens [-1], no VAD, no previous-text \
    conditioning. The last column is SpecVoice with its defaults (Q8_0 decoder, the audio and \
    10 s of padding encoded, temperature fallback).";

/// What both sides ran, and on which clips.
pub fn notes(clips: &[Clip]) -> Vec<String> {
    vec![SETTINGS.into(), describe(clips)]
}
