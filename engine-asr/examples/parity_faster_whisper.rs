//! Token-for-token parity with faster-whisper 1.2.1: both decode the very same 16 kHz samples
//! with the same weights and settings (the whole 30-second window encoded, f32 matrices,
//! greedy, no timestamps, language en, blank and non-speech suppression, no VAD, no
//! previous-text conditioning) and their token ids are compared clip by clip; WER with
//! Whisper's English normalizer on both sides.
//!
//! The clips: the real recordings of `$SPECVOICE_MODELS/data/speech` and the sentences of
//! `engine-asr/data/parity_sentences.txt` spoken by `espeak-ng` in two voices (American at 160
//! words a minute, British RP at 140), cached with the raw samples both sides read under
//! `--dir` (default `$CARGO_TARGET_DIR/parity`).
//!
//! ```sh
//! SPECVOICE_FASTER_WHISPER=/path/to/venv/bin/python \
//!   cargo run --release -p engine-asr --example parity_faster_whisper -- \
//!   [--models whisper-tiny.en-ct2,whisper-base-ct2] [--fallback]
//! ```
//!
//! faster-whisper's answers are cached beside the clips (delete them after changing its
//! version or the set).
//!
//! `--fallback` runs both with the default temperature fallback (0, 0.2 … 1.0, one sample per
//! temperature) instead of temperature 0 only: windows that fall back are sampled, so they
//! match only by chance; the table then counts the windows each side re-decoded.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use engine_asr::normalize::EnglishTextNormalizer;
use spec_core::report::Report;
use spec_models::{Registry, Store};

#[path = "common/parity.rs"]
mod parity;
#[path = "common/parity_clips.rs"]
mod parity_clips;

use parity::{notes, token_parity, Parity};
use parity_clips::clip_set;

#[derive(Parser, Debug)]
#[command(about = "Whisper token parity with faster-whisper")]
struct Args {
    /// Models (names in the models folder or folders).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "whisper-tiny.en-ct2,whisper-base-ct2"
    )]
    models: Vec<String>,
    /// The default temperature fallback on both sides instead of temperature 0 only.
    #[arg(long)]
    fallback: bool,
    /// Where the clips' raw samples are cached.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only the first N clips (a quick check).
    #[arg(long)]
    limit: Option<usize>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write every differing clip's raw samples path and both sides' tokens here (JSON lines),
    /// to study the first difference.
    #[arg(long)]
    differences: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let python = std::env::var_os("SPECVOICE_FASTER_WHISPER")
        .map(PathBuf::from)
        .context("set SPECVOICE_FASTER_WHISPER to a Python with faster-whisper 1.2.1")?;
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let normalizer = EnglishTextNormalizer::from_file(&store.data_file("whisper/english.json")?)?;
    let dir = parity_clips::parity_dir(args.dir.as_deref());
    let mut clips = clip_set(&store, &dir)?;
    if let Some(limit) = args.limit {
        clips.truncate(limit);
    }
    let Parity {
        table,
        details,
        differences,
    } = token_parity(
        &store,
        &normalizer,
        &python,
        &args.models,
        &clips,
        args.fallback,
        &dir,
    )?;
    let report = Report {
        command: format!(
            "cargo run --release -p engine-asr --example parity_faster_whisper -- --models {}{}",
            args.models.join(","),
            if args.fallback { " --fallback" } else { "" }
        ),
        tables: vec![table, details],
        notes: notes(&clips),
        ..Report::default()
    };
    print!("{}", report.markdown());
    if let Some(path) = &args.differences {
        let lines: Vec<String> = differences.iter().map(|d| d.to_string()).collect();
        std::fs::write(path, lines.join("\n")).with_context(|| path.display().to_string())?;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
