//! Word timestamps against faster-whisper 1.2.1's `word_timestamps=True`: both time the words
//! of the same 16 kHz samples with the same weights, the words both heard are paired in order
//! ([`word_time_differences`]) and the differences of their start and end times reported
//! (median, 90th percentile, largest).
//!
//! faster-whisper runs as the parity harness runs it (`parity_faster_whisper`): f32, greedy,
//! language en, no VAD, no previous-text conditioning, here with `word_timestamps=True` and
//! timestamps decoded (its default with word timestamps; `--without-timestamps` turns them off
//! on both sides). SpecVoice runs twice: with the same settings (f32 weights, the whole window
//! encoded), and with its defaults (Q8_0 decoder, the audio and 10 s of padding encoded,
//! temperature fallback) plus word timestamps. The clips are the parity clips (the real
//! recordings and the espeak-ng sentences, cached under `--dir`, default
//! `$CARGO_TARGET_DIR/parity`).
//!
//! ```sh
//! SPECVOICE_FASTER_WHISPER=/path/to/venv/bin/python \
//!   cargo run --release -p engine-asr --example parity_words -- \
//!   [--models whisper-tiny.en-ct2,whisper-base-ct2] [--without-timestamps]
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine_asr::whisper::alignment::word_time_differences;
use engine_asr::whisper::Word;
use engine_asr::{EncoderLength, LoadOptions, TranscribeOptions, Transcriber};
use serde::Deserialize;
use spec_core::report::{Report, Table};
use spec_models::{Registry, Store};
use spec_nn::Requantize;

#[path = "common/parity_clips.rs"]
mod parity_clips;

use parity_clips::{clip_set, describe, Clip};

#[derive(Parser, Debug)]
#[command(about = "Whisper word timestamps against faster-whisper's")]
struct Args {
    /// Models (names in the models folder or folders).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "whisper-tiny.en-ct2,whisper-base-ct2"
    )]
    models: Vec<String>,
    /// Decode without timestamps on both sides (one segment per window).
    #[arg(long)]
    without_timestamps: bool,
    /// Where the clips' raw samples are cached.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only the first N clips (a quick check).
    #[arg(long)]
    limit: Option<usize>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// `words_faster_whisper.py`'s output.
#[derive(Deserialize)]
struct PeerOutput {
    models: std::collections::BTreeMap<String, Vec<PeerClip>>,
}

#[derive(Deserialize)]
struct PeerClip {
    clip: String,
    segments: Vec<PeerSegment>,
}

#[derive(Deserialize)]
struct PeerSegment {
    words: Vec<(String, f32, f32, f32)>,
}

impl PeerClip {
    fn words(&self) -> Vec<Word> {
        self.segments
            .iter()
            .flat_map(|s| &s.words)
            .map(|(word, start, end, probability)| Word {
                start: *start,
                end: *end,
                word: word.clone(),
                probability: *probability,
            })
            .collect()
    }
}

/// faster-whisper's words on `clips`, cached in `cache`.
fn faster_whisper(
    python: &Path,
    model: &Path,
    clips: &[Clip],
    without_timestamps: bool,
    cache: &Path,
) -> Result<Vec<PeerClip>> {
    let raws: Vec<String> = clips.iter().map(|c| c.raw.display().to_string()).collect();
    let parse = |bytes: &[u8]| -> Result<Vec<PeerClip>> {
        let output: PeerOutput = serde_json::from_slice(bytes)?;
        let results = output
            .models
            .into_values()
            .next()
            .context("faster-whisper answered for no model")?;
        if results.iter().map(|r| &r.clip).ne(raws.iter()) {
            bail!("faster-whisper answered for other clips");
        }
        Ok(results)
    };
    if let Some(cached) = std::fs::read(cache).ok().and_then(|b| parse(&b).ok()) {
        return Ok(cached);
    }
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/peers/words_faster_whisper.py");
    let mut command = Command::new(python);
    command.arg(&script).arg("--model").arg(model);
    if without_timestamps {
        command.arg("--without-timestamps");
    }
    command.args(&raws);
    let output = command.output().context("running faster-whisper")?;
    if !output.status.success() {
        bail!(
            "faster-whisper failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let results = parse(&output.stdout)?;
    std::fs::write(cache, &output.stdout).with_context(|| cache.display().to_string())?;
    Ok(results)
}

/// The `q`-quantile of `values` (nearest rank), in milliseconds.
fn quantile_ms(values: &mut [f32], q: f32) -> String {
    if values.is_empty() {
        return "–".into();
    }
    values.sort_by(f32::total_cmp);
    let rank = ((q * values.len() as f32).ceil() as usize).clamp(1, values.len());
    format!("{:.0}", 1000.0 * values[rank - 1])
}

fn main() -> Result<()> {
    let args = Args::parse();
    let python = std::env::var_os("SPECVOICE_FASTER_WHISPER")
        .map(PathBuf::from)
        .context("set SPECVOICE_FASTER_WHISPER to a Python with faster-whisper 1.2.1")?;
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let dir = parity_clips::parity_dir(args.dir.as_deref());
    let mut clips = clip_set(&store, &dir)?;
    if let Some(limit) = args.limit {
        clips.truncate(limit);
    }
    let timestamps = !args.without_timestamps;
    let parity = TranscribeOptions {
        language: Some("en".into()),
        timestamps,
        temperatures: vec![0.0],
        best_of: 1,
        condition_on_previous_text: false,
        encoder_length: EncoderLength::Full,
        word_timestamps: true,
        ..TranscribeOptions::default()
    };
    let defaults = TranscribeOptions {
        language: Some("en".into()),
        timestamps,
        word_timestamps: true,
        ..TranscribeOptions::default()
    };
    let f32_weights = LoadOptions {
        requantize: Requantize::Keep,
        ..LoadOptions::default()
    };
    let settings = [
        ("parity (f32, 30 s encoder, greedy)", &f32_weights, &parity),
        (
            "defaults (Q8_0, audio + 10 s encoder, fallback)",
            &LoadOptions::default(),
            &defaults,
        ),
    ];
    let mut table = Table::new(
        format!(
            "Word times against faster-whisper 1.2.1 (float32, word_timestamps=True), {} clips, \
             {}; |difference| in ms",
            clips.len(),
            if timestamps {
                "timestamps decoded"
            } else {
                "without timestamps"
            }
        ),
        &[
            "model",
            "SpecVoice settings",
            "words paired / faster-whisper's",
            "start median",
            "start p90",
            "start max",
            "end median",
            "end p90",
            "end max",
            "both median",
        ],
    );
    for name in &args.models {
        let model = store.resolve(name)?;
        eprintln!("== {name}: faster-whisper");
        let cache = dir.join(format!(
            "words-faster-whisper-{}-{}.json",
            name.replace('/', "_"),
            if timestamps {
                "timestamps"
            } else {
                "no-timestamps"
            }
        ));
        let peers = faster_whisper(&python, &model.dir, &clips, !timestamps, &cache)?;
        let peer_words: usize = peers.iter().map(|p| p.words().len()).sum();
        for (label, load, options) in settings {
            eprintln!("== {name}: SpecVoice, {label}");
            let mut transcriber = Transcriber::load(&model.dir, load)?;
            let (mut starts, mut ends) = (Vec::new(), Vec::new());
            for (clip, peer) in clips.iter().zip(&peers) {
                let transcript = transcriber.transcribe(&clip.samples, options)?;
                let words: Vec<Word> = transcript
                    .segments
                    .iter()
                    .flat_map(|s| s.words.clone())
                    .collect();
                for (start, end) in word_time_differences(&words, &peer.words()) {
                    starts.push(start.abs());
                    ends.push(end.abs());
                }
            }
            let paired = starts.len();
            let mut both: Vec<f32> = starts.iter().chain(&ends).copied().collect();
            table.push(vec![
                name.clone(),
                label.to_string(),
                format!("{paired} / {peer_words}"),
                quantile_ms(&mut starts, 0.5),
                quantile_ms(&mut starts, 0.9),
                quantile_ms(&mut starts, 1.0),
                quantile_ms(&mut ends, 0.5),
                quantile_ms(&mut ends, 0.9),
                quantile_ms(&mut ends, 1.0),
                quantile_ms(&mut both, 0.5),
            ]);
        }
    }
    let report = Report {
        command: format!(
            "cargo run --release -p engine-asr --example parity_words -- --models {}{}",
            args.models.join(","),
            if timestamps {
                ""
            } else {
                " --without-timestamps"
            }
        ),
        tables: vec![table],
        notes: vec![
            "Words are paired in order by their text (lower case, letters and digits only; a \
             longest common subsequence), so words only one side heard are left out; times are \
             faster-whisper's, rounded to 10 ms on both sides. Medians and percentiles by nearest \
             rank."
                .into(),
            describe(&clips),
        ],
        ..Report::default()
    };
    print!("{}", report.markdown());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
