//! Transcribes WAV files with Whisper.
//!
//! ```text
//! cargo run --release -p engine-asr --example transcribe -- clip.wav
//! cargo run --release -p engine-asr --example transcribe -- --model whisper-base-ct2 --beam 5 --timestamps clip.wav
//! cargo run --release -p engine-asr --example transcribe -- --stream 0.5 clip.wav
//! ```
//!
//! `--model` is a name in the models folder (`$SPECVOICE_MODELS`, see `cargo xtask models`) or
//! a folder holding `model.bin` (CTranslate2) or `model.safetensors` + `config.json`, with
//! `tokenizer.json`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_core::quantized::GgmlDType;
use clap::{Parser, ValueEnum};
use engine_asr::{
    Audio, EncoderLength, LoadOptions, StreamingTranscriber, TranscribeOptions, Transcriber,
};
use spec_models::{Registry, Store};
use spec_nn::Requantize;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Precision {
    /// Q8_0 on the batch-invariant kernels (default).
    Q8,
    /// Q4_0 on the kernels: smaller and faster, a little less accurate.
    Q4,
    /// The stored precision on candle's matmuls.
    Stored,
}

#[derive(Parser, Debug)]
#[command(about = "Transcribe WAV files with Whisper")]
struct Args {
    /// Model name in the models folder, or a model folder.
    #[arg(long, default_value = "whisper-tiny.en-ct2")]
    model: String,
    /// Beams (1 = greedy).
    #[arg(long, default_value_t = 1)]
    beam: usize,
    /// Print timed segments.
    #[arg(long)]
    timestamps: bool,
    /// Language code (multilingual models; detected when absent).
    #[arg(long)]
    language: Option<String>,
    /// Weight precision.
    #[arg(long, value_enum, default_value_t = Precision::Q8)]
    precision: Precision,
    /// Encode all 30 s of each window (Whisper's training condition) instead of the audio and
    /// 10 s of padding.
    #[arg(long)]
    full_encoder: bool,
    /// Padding frames (10 ms each) encoded after the audio [default: 1000].
    #[arg(long, conflicts_with = "full_encoder")]
    encoder_margin: Option<usize>,
    /// Feed the audio in chunks of this many seconds and print every partial transcript
    /// (greedy; the previous partial is verified as a draft).
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "0.5")]
    stream: Option<f64>,
    /// WAV files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let model = store.resolve(&args.model)?;
    let requantize = match args.precision {
        Precision::Q8 => Requantize::FastAndBatchInvariant,
        Precision::Q4 => Requantize::Dense(GgmlDType::Q4_0),
        Precision::Stored => Requantize::Keep,
    };
    let mut transcriber = Transcriber::load(
        &model.dir,
        &LoadOptions {
            requantize,
            ..LoadOptions::default()
        },
    )
    .with_context(|| format!("loading {}", model.dir.display()))?;
    let mut options = TranscribeOptions {
        beam_size: args.beam,
        timestamps: args.timestamps,
        language: args.language,
        ..TranscribeOptions::default()
    };
    if args.full_encoder {
        options.encoder_length = EncoderLength::Full;
    } else if let Some(margin_frames) = args.encoder_margin {
        options.encoder_length = EncoderLength::Audio { margin_frames };
    }
    if let Some(chunk_seconds) = args.stream {
        return stream(transcriber, options, &args.files, chunk_seconds);
    }
    for file in &args.files {
        let audio = Audio::read_wav(file)?;
        let samples = audio.to_16k()?;
        let transcript = transcriber.transcribe(&samples, &options)?;
        if args.timestamps {
            for s in &transcript.segments {
                println!("[{:6.2} → {:6.2}] {}", s.start, s.end, s.text.trim());
            }
        } else {
            println!("{}", transcript.text);
        }
        let seconds = audio.duration_seconds();
        let stats = &transcript.stats;
        eprintln!(
            "{}: {:.1} s of audio, log-mel {:.0} ms, encoder {:.0} ms, decoder {:.0} ms ({} forwards, {} tokens), RTF {:.3}",
            file.display(),
            seconds,
            stats.front_end_time.as_secs_f64() * 1e3,
            stats.encoder_time.as_secs_f64() * 1e3,
            stats.decoder_time.as_secs_f64() * 1e3,
            stats.forwards,
            stats.tokens,
            stats.total_time().as_secs_f64() / seconds
        );
    }
    Ok(())
}

/// Feeds each file in chunks and prints the partial transcripts as they come.
fn stream(
    transcriber: Transcriber,
    options: TranscribeOptions,
    files: &[PathBuf],
    chunk_seconds: f64,
) -> Result<()> {
    if chunk_seconds.is_nan() || chunk_seconds <= 0.0 {
        anyhow::bail!("--stream needs a positive chunk length, got {chunk_seconds}");
    }
    let chunk = (chunk_seconds * f64::from(engine_asr::SAMPLE_RATE)).round() as usize;
    let mut transcriber = transcriber;
    for file in files {
        let samples = Audio::read_wav(file)?.to_16k()?;
        let mut stream = StreamingTranscriber::new(transcriber, options.clone())?;
        println!("{}", file.display());
        for piece in samples.chunks(chunk.max(1)) {
            if let Some(partial) = stream.push(piece)? {
                println!(
                    "  [{:5.2} s] {:>4.0} ms, {:>2} draft tokens kept, {:>2} forwards: {}",
                    partial.audio_seconds,
                    partial.latency.as_secs_f64() * 1e3,
                    partial.accepted_draft,
                    partial.forwards,
                    partial.text
                );
            }
        }
        let stats = stream.stats().clone();
        eprintln!(
            "  {} partials, {} of {} draft tokens kept, {} decoder forwards, encoder {:.0} ms, decoder {:.0} ms",
            stats.partials,
            stats.accepted,
            stats.drafted,
            stats.forwards,
            stats.encoder_time.as_secs_f64() * 1e3,
            stats.decoder_time.as_secs_f64() * 1e3
        );
        transcriber = stream.into_inner();
    }
    Ok(())
}
