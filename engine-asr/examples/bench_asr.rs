//! Benchmark of Whisper transcription: SpecVoice's engine (30-second and audio-length encoder,
//! Q8_0 and Q4_0 decoder, greedy and beam 5) against candle-transformers' Whisper on the same
//! weights and, when `SPECVOICE_FASTER_WHISPER` names a Python with faster-whisper 1.2.1,
//! against faster-whisper (int8 and float32) in the same run. WER with Whisper's English
//! normalizer on the real clips of `$SPECVOICE_MODELS/data/speech`, real-time factors split
//! into encoder and decoder, decoder forwards per word.
//!
//! ```sh
//! cargo run --release -p engine-asr --example bench_asr -- [--models whisper-tiny.en-ct2,whisper-base-ct2]
//!     [--repeats 3] [--margins 500,1000,1500] [--json PATH]
//! ```
//!
//! `cargo xtask bench asr` runs it and files the results with the machine and date.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use candle_core::quantized::GgmlDType;
use candle_core::{Device, IndexOp, Tensor};
use candle_transformers::models::whisper as candle_whisper;
use clap::Parser;
use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::wer::{word_errors, WordErrors};
use engine_asr::whisper::{hugging_face_tensors, LogitRules};
use engine_asr::{
    EncoderLength, LoadOptions, TranscribeOptions, Transcriber, TranscriptStats, WhisperInput,
};
use spec_core::report::{ratio, Report, Table};
use spec_models::{Registry, Store};
use spec_nn::Requantize;

#[path = "bench_asr/long_form.rs"]
mod long_form;
#[path = "common/parity.rs"]
mod parity;
#[path = "common/parity_clips.rs"]
mod parity_clips;
#[path = "common/speech_sets.rs"]
mod speech_sets;
use speech_sets::{clips, fastest_transcript, spoken_set, Clip};

#[derive(Parser, Debug)]
#[command(about = "Whisper transcription benchmark")]
struct Args {
    /// Models (names in the models folder or folders).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "whisper-tiny.en-ct2,whisper-base-ct2"
    )]
    models: Vec<String>,
    /// Runs per clip and system; the fastest counts.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Padding frames (10 ms) encoded after the audio in the audio-length encoder rows.
    #[arg(long, value_delimiter = ',', default_value = "500,1000,1500")]
    margins: Vec<usize>,
    /// Skip candle-transformers' Whisper.
    #[arg(long)]
    skip_candle: bool,
    /// Skip beam search.
    #[arg(long)]
    skip_beam: bool,
    /// Sentences of the synthetic set (the first sentence of MT-Bench questions, spoken by
    /// `espeak-ng` at 22.05 kHz); 0 or no `espeak-ng` skips it.
    #[arg(long, default_value_t = 40)]
    spoken_sentences: usize,
    /// Skip the token parity with faster-whisper (run when `SPECVOICE_FASTER_WHISPER` is set).
    #[arg(long)]
    skip_parity: bool,
    /// Only the first N clips of the parity set.
    #[arg(long)]
    parity_limit: Option<usize>,
    /// Minutes of the long recording (the real clips joined by silences), transcribed whole
    /// with and without the VAD filter; 0 skips it.
    #[arg(long, default_value_t = 5.0)]
    long_minutes: f64,
    /// Recording lengths (minutes) whose peak memory is measured, each in a process of its
    /// own, with the first model; none skips it.
    #[arg(long, value_delimiter = ',', default_value = "1,30")]
    memory_minutes: Vec<f64>,
    /// Internal: transcribe this many minutes of the long recording and print the peak memory.
    #[arg(long, hide = true)]
    memory_probe: Option<f64>,
    /// Internal: the memory probe uses the VAD filter.
    #[arg(long, hide = true)]
    probe_vad: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One system's results over the clips.
#[derive(Default)]
struct Outcome {
    texts: Vec<String>,
    total: Duration,
    encoder: Duration,
    decoder: Duration,
    forwards: usize,
}

impl Outcome {
    fn add(
        &mut self,
        text: String,
        total: Duration,
        encoder: Duration,
        decoder: Duration,
        forwards: usize,
    ) {
        self.texts.push(text);
        self.total += total;
        self.encoder += encoder;
        self.decoder += decoder;
        self.forwards += forwards;
    }
}

fn ours(
    transcriber: &mut Transcriber,
    clips: &[Clip],
    options: &TranscribeOptions,
    repeats: usize,
) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    for clip in clips {
        let t = fastest_transcript(
            transcriber,
            &clip.samples,
            options,
            repeats,
            TranscriptStats::total_time,
            &mut |_| {},
        )?;
        outcome.add(
            t.text,
            t.stats.total_time(),
            t.stats.encoder_time,
            t.stats.decoder_time,
            t.stats.forwards,
        );
    }
    Ok(outcome)
}

/// candle-transformers' Whisper on the same weights, decoding greedily as its example does
/// (the whole token sequence re-run each step; cross-attention keys cached), with the same
/// logit rules and our log-mel input.
fn candle(
    folder: &Path,
    transcriber: &Transcriber,
    clips: &[Clip],
    repeats: usize,
) -> Result<Outcome> {
    let device = Device::Cpu;
    let (config, tensors) = hugging_face_tensors(folder, &device)?;
    let candle_config = candle_whisper::Config {
        num_mel_bins: config.n_mels,
        max_source_positions: config.max_source_positions,
        d_model: config.hidden_size,
        encoder_attention_heads: config.encoder_attention_heads,
        encoder_layers: config.encoder_layers,
        vocab_size: config.vocab_size,
        max_target_positions: config.max_target_positions,
        decoder_attention_heads: config.decoder_attention_heads,
        decoder_layers: config.decoder_layers,
        suppress_tokens: vec![],
    };
    let vb = candle_nn::VarBuilder::from_tensors(tensors, candle_core::DType::F32, &device);
    let mut model = candle_whisper::model::Whisper::load(&vb, candle_config)?;
    let options = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    let rules: LogitRules = transcriber.rules(&options);
    let (prompt, _) = transcriber.prompt(&options, Some("en"), &[])?;
    let tokenizer = transcriber.tokenizer();
    let end = tokenizer.end_of_text;
    let max_tokens = config.max_target_positions / 2;
    let mut outcome = Outcome::default();
    for clip in clips {
        let mut best: Option<(String, Duration, Duration, Duration, usize)> = None;
        for _ in 0..repeats.max(1) {
            let start = Instant::now();
            let mut input = WhisperInput::from_samples(&clip.samples, transcriber.filters())?;
            let window = input.window(0)?;
            let mel = Tensor::from_vec(window.data, (1, window.n_mels, window.frames), &device)?;
            let encode_start = Instant::now();
            let audio = model.encoder.forward(&mel, true)?;
            let encoder = encode_start.elapsed();
            let decode_start = Instant::now();
            let mut tokens = prompt.clone();
            let mut sampled = Vec::new();
            let mut forwards = 0;
            for i in 0..max_tokens {
                let input = Tensor::new(tokens.as_slice(), &device)?.unsqueeze(0)?;
                let hidden = model.decoder.forward(&input, &audio, i == 0)?;
                forwards += 1;
                let last = hidden.dim(1)? - 1;
                let logits = model
                    .decoder
                    .final_linear(&hidden.i((..1, last..))?)?
                    .i(0)?
                    .i(0)?;
                let mut row = logits.to_vec1::<f32>()?;
                rules.apply(&mut row, &sampled);
                let next = spec_core::sampling::argmax(&row);
                if next == end {
                    break;
                }
                tokens.push(next);
                sampled.push(next);
            }
            let decoder = decode_start.elapsed();
            let text = tokenizer.decode(&sampled)?.trim().to_string();
            let total = start.elapsed();
            if best.as_ref().is_none_or(|b| total < b.1) {
                best = Some((text, total, encoder, decoder, forwards));
            }
        }
        let (text, total, encoder, decoder, forwards) = best.expect("one run");
        outcome.add(text, total, encoder, decoder, forwards);
    }
    Ok(outcome)
}

/// faster-whisper through the Python named by `SPECVOICE_FASTER_WHISPER`.
fn faster_whisper(
    python: &Path,
    folder: &Path,
    compute_type: &str,
    clips: &[Clip],
    repeats: usize,
) -> Result<Outcome> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/peers/run_faster_whisper.py");
    let report = long_form::run_peer(
        std::process::Command::new(python)
            .arg(&script)
            .args([
                "--model",
                &folder.to_string_lossy(),
                "--compute-type",
                compute_type,
            ])
            .args(["--threads", "2", "--repeats", &repeats.max(1).to_string()])
            .args(clips.iter().map(|c| c.path.as_os_str())),
        python,
    )?;
    let mut outcome = Outcome::default();
    for result in report["results"].as_array().context("results")? {
        let seconds = result["seconds"].as_f64().context("seconds")?;
        let text = result["text"].as_str().context("text")?.to_string();
        outcome.add(
            text,
            Duration::from_secs_f64(seconds),
            Duration::ZERO,
            Duration::ZERO,
            0,
        );
    }
    Ok(outcome)
}

/// Every system on `clips` with one model; the slow ones (beam search, candle-transformers)
/// only when `all`.
fn measure(
    args: &Args,
    folder: &Path,
    clips: &[Clip],
    python: Option<&Path>,
    all: bool,
    repeats: usize,
) -> Result<Vec<(String, Outcome)>> {
    let mut rows: Vec<(String, Outcome)> = Vec::new();
    if let Some(python) = python {
        for compute_type in ["int8", "float32"] {
            eprintln!("faster-whisper {compute_type}");
            let outcome = faster_whisper(python, folder, compute_type, clips, repeats)?;
            rows.push((
                format!("faster-whisper 1.2.1 greedy, {compute_type}"),
                outcome,
            ));
        }
    }
    let mut transcriber = Transcriber::load(folder, &LoadOptions::default())?;
    let greedy = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    let full = TranscribeOptions {
        encoder_length: EncoderLength::Full,
        ..greedy.clone()
    };
    eprintln!("SpecVoice greedy");
    rows.push((
        "SpecVoice greedy, Q8_0 decoder, 30 s encoder".into(),
        ours(&mut transcriber, clips, &full, repeats)?,
    ));
    for &margin_frames in &args.margins {
        let options = TranscribeOptions {
            encoder_length: EncoderLength::Audio { margin_frames },
            ..greedy.clone()
        };
        let default = if options.encoder_length == EncoderLength::default() {
            " (default)"
        } else {
            ""
        };
        rows.push((
            format!(
                "SpecVoice greedy, Q8_0 decoder, audio + {:.0} s encoder{default}",
                margin_frames as f64 / 100.0
            ),
            ours(&mut transcriber, clips, &options, repeats)?,
        ));
    }
    if all && !args.skip_beam {
        eprintln!("SpecVoice beam 5");
        let beam = TranscribeOptions {
            beam_size: 5,
            ..full.clone()
        };
        rows.push((
            "SpecVoice beam 5, Q8_0 decoder, 30 s encoder".into(),
            ours(&mut transcriber, clips, &beam, repeats)?,
        ));
    }
    if all && !args.skip_candle {
        eprintln!("candle-transformers");
        let outcome = candle(folder, &transcriber, clips, repeats)?;
        rows.push((
            "candle-transformers 0.11 greedy, f32, 30 s encoder".into(),
            outcome,
        ));
    }
    drop(transcriber);
    let mut q4 = Transcriber::load(
        folder,
        &LoadOptions {
            requantize: Requantize::Dense(GgmlDType::Q4_0),
            ..LoadOptions::default()
        },
    )?;
    eprintln!("SpecVoice Q4_0");
    rows.push((
        "SpecVoice greedy, Q4_0 decoder, 30 s encoder".into(),
        ours(&mut q4, clips, &full, repeats)?,
    ));
    Ok(rows)
}

/// The rows of one model on one set.
fn push_rows(
    table: &mut Table,
    model: &str,
    rows: &[(String, Outcome)],
    clips: &[Clip],
    normalizer: &EnglishTextNormalizer,
) {
    let audio_seconds: f64 = clips.iter().map(|c| c.seconds).sum();
    let reference_words: usize = clips
        .iter()
        .map(|c| {
            normalizer
                .normalize(&c.reference)
                .split_whitespace()
                .count()
        })
        .sum();
    let peer = rows
        .iter()
        .filter(|(label, _)| label.starts_with("faster-whisper"))
        .min_by_key(|(_, o)| o.total)
        .map(|(_, o)| (o.total, o.texts.clone()));
    for (label, outcome) in rows {
        let mut errors = WordErrors::default();
        for (clip, text) in clips.iter().zip(&outcome.texts) {
            errors += word_errors(
                &normalizer.normalize(&clip.reference),
                &normalizer.normalize(text),
            );
        }
        let rtf = |d: Duration| d.as_secs_f64() / audio_seconds;
        let is_peer = label.starts_with("faster-whisper");
        let split = |d: Duration| {
            if is_peer {
                "–".to_string()
            } else {
                format!("{:.4}", rtf(d))
            }
        };
        let (versus, same) = match &peer {
            Some((peer_total, peer_texts)) => (
                ratio(outcome.total.as_secs_f64(), peer_total.as_secs_f64()),
                format!(
                    "{}/{}",
                    outcome
                        .texts
                        .iter()
                        .zip(peer_texts)
                        .filter(|(a, b)| a == b)
                        .count(),
                    clips.len()
                ),
            ),
            None => ("–".into(), "–".into()),
        };
        table.push(vec![
            model.to_string(),
            label.clone(),
            format!("{:.2}", 100.0 * errors.rate()),
            format!("{:.4}", rtf(outcome.total)),
            split(outcome.encoder),
            split(outcome.decoder),
            if is_peer {
                "–".into()
            } else {
                format!("{:.2}", outcome.forwards as f64 / reference_words as f64)
            },
            versus,
            same,
        ]);
    }
}

const COLUMNS: [&str; 9] = [
    "model",
    "system",
    "WER %",
    "RTF",
    "encoder RTF",
    "decoder RTF",
    "decoder forwards / word",
    "RTF ÷ faster-whisper's",
    "same text as faster-whisper",
];

fn caption(
    set: &str,
    clips: &[Clip],
    normalizer: &EnglishTextNormalizer,
    repeats: usize,
) -> String {
    let seconds: f64 = clips.iter().map(|c| c.seconds).sum();
    let words: usize = clips
        .iter()
        .map(|c| {
            normalizer
                .normalize(&c.reference)
                .split_whitespace()
                .count()
        })
        .sum();
    format!(
        "Whisper on {} ({} clips, {seconds:.1} s of speech, {words} words), best of {repeats} run(s) per clip, 2 threads",
        set,
        clips.len()
    )
}

fn main() -> Result<()> {
    let args = Args::parse();
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let clips = clips(&store)?;
    if let Some(minutes) = args.memory_probe {
        let model = store.resolve(&args.models[0])?;
        return long_form::probe(&store, &model.dir, &clips, minutes, args.probe_vad);
    }
    let normalizer = EnglishTextNormalizer::from_file(&store.data_file("whisper/english.json")?)?;
    let python = std::env::var_os("SPECVOICE_FASTER_WHISPER").map(PathBuf::from);
    let spoken_dir = tempfile::tempdir()?;
    let spoken = spoken_set(&store, args.spoken_sentences, spoken_dir.path())?;
    let mut real = Table::new(
        caption(
            "the real clips of data/speech",
            &clips,
            &normalizer,
            args.repeats,
        ),
        &COLUMNS,
    );
    let mut synthetic = spoken.as_ref().map(|set| {
        Table::new(
            caption("sentences spoken by espeak-ng", set, &normalizer, 1),
            &COLUMNS,
        )
    });
    for name in &args.models {
        let model = store.resolve(name)?;
        eprintln!("== {name}");
        let rows = measure(
            &args,
            &model.dir,
            &clips,
            python.as_deref(),
            true,
            args.repeats,
        )?;
        push_rows(&mut real, name, &rows, &clips, &normalizer);
        if let (Some(set), Some(table)) = (&spoken, synthetic.as_mut()) {
            eprintln!("== {name}, espeak-ng sentences");
            let rows = measure(&args, &model.dir, set, python.as_deref(), false, 1)?;
            push_rows(table, name, &rows, set, &normalizer);
        }
    }
    let (mut parity_tables, mut parity_notes) = (Vec::new(), Vec::new());
    if let (Some(python), false) = (python.as_deref(), args.skip_parity) {
        eprintln!("== token parity with faster-whisper");
        let dir = parity_clips::parity_dir(None);
        let mut set = parity_clips::clip_set(&store, &dir)?;
        if let Some(limit) = args.parity_limit {
            set.truncate(limit);
        }
        let parity =
            parity::token_parity(&store, &normalizer, python, &args.models, &set, false, &dir)?;
        parity_notes = parity::notes(&set);
        parity_tables.push(parity.table);
        if !parity.differences.is_empty() {
            parity_tables.push(parity.details);
        }
    }
    let mut long = None;
    if args.long_minutes > 0.0 {
        let (joined, reference) = long_form::recording(&clips, args.long_minutes)?;
        let mut table = Table::new(
            format!(
                "Long-form: the real clips joined by silences of 0.6–6 s into {:.1} minutes ({} clips), transcribed whole, one run each, 2 threads",
                joined.len() as f64 / 16_000.0 / 60.0,
                joined.order().len()
            ),
            &long_form::COLUMNS,
        );
        let long_form = long_form::LongForm {
            store: &store,
            joined,
            reference,
            normalizer: &normalizer,
            python: python.as_deref(),
        };
        for name in &args.models {
            let model = store.resolve(name)?;
            eprintln!("== {name}, long-form");
            long_form::measure(&long_form, name, &model.dir, &mut table)?;
        }
        long = Some(table);
    }
    let mut memory = None;
    if !args.memory_minutes.is_empty() {
        let mut table = Table::new(
            "Peak memory of long-form transcription (the whole process: model, runtime, recording read piece by piece)",
            &long_form::MEMORY_COLUMNS,
        );
        long_form::memory(&args.models[0], &args.memory_minutes, &mut table)?;
        memory = Some(table);
    }
    let mut notes = Vec::new();
    if python.is_none() {
        notes.push("faster-whisper was not measured: set SPECVOICE_FASTER_WHISPER to a Python with faster-whisper 1.2.1 installed.".into());
    }
    if spoken.is_none() {
        notes.push("The espeak-ng set was skipped: `apt-get install espeak-ng` adds it.".into());
    }
    notes.push("RTF = processing time ÷ audio duration, front end (log-mel) included; faster-whisper's time is its `transcribe` call on the decoded audio (greedy, language en, no timestamps, no previous-text conditioning, no VAD). WER uses Whisper's English normalizer on both sides. \"Audio + N s encoder\" encodes the audio and N s of the padding instead of the whole 30-second window (whisper.cpp's `audio_ctx`). Beam search and candle-transformers run on the real clips only.".into());
    notes.extend(
        parity_notes
            .into_iter()
            .map(|n| format!("Token parity. {n}")),
    );
    if args.long_minutes > 0.0 {
        notes.push("Long-form: both sides transcribe the same samples with timestamps, previous-text conditioning and the temperature fallback (their long-audio defaults), greedy, language en; faster-whisper's time excludes loading and a warm-up. With VAD: Silero VAD v6 and faster-whisper's `vad_filter` defaults (threshold 0.5, 2 s of silence ends speech, 400 ms of padding) on both sides; only the speech is transcribed and times are mapped back.".into());
    }
    let report = Report {
        command: format!(
            "cargo run --release -p engine-asr --example bench_asr -- --models {} --repeats {} --margins {} --spoken-sentences {} --long-minutes {} --memory-minutes {}",
            args.models.join(","),
            args.repeats,
            args.margins
                .iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
                .join(","),
            args.spoken_sentences,
            args.long_minutes,
            args.memory_minutes
                .iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ),
        tables: std::iter::once(real)
            .chain(synthetic)
            .chain(parity_tables)
            .chain(long)
            .chain(memory)
            .collect(),
        notes,
        ..Report::default()
    };
    print!("{}", report.markdown());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
