//! Transcribes (or translates to English) audio files with Whisper, and writes the transcript
//! as text, SubRip or WebVTT subtitles, or JSON.
//!
//! ```text
//! cargo run --release -p engine-asr --example transcribe -- clip.flac
//! cargo run --release -p engine-asr --example transcribe -- --model whisper-base-ct2 --format srt talk.mp3
//! cargo run --release -p engine-asr --example transcribe -- --model whisper-base-ct2 --task translate --format vtt --output-dir subs/ interview.m4a
//! cargo run --release -p engine-asr --example transcribe -- --vad --format srt lecture.ogg
//! cargo run --release -p engine-asr --example transcribe -- --stream 0.5 clip.wav
//! ```
//!
//! Files: WAV, FLAC, MP3, OGG/Vorbis, M4A/AAC (found from the content), read piece by piece, so
//! a recording of any length is never held whole. `--model` is a name in the models folder
//! (`$SPECVOICE_MODELS`, see `cargo xtask models`) or a folder holding `model.bin`
//! (CTranslate2) or `model.safetensors` + `config.json`, with `tokenizer.json`. The transcript
//! goes to standard output, or with `--output-dir` to `<dir>/<file stem>.<format>`; the
//! language (detected when not given, on multilingual models) and the timings go to standard
//! error.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::quantized::GgmlDType;
use clap::{Parser, ValueEnum};
use engine_asr::{
    Audio, AudioFile, EncoderLength, LoadOptions, OutputFormat, SileroVad, StreamingTranscriber,
    Task, TranscribeOptions, Transcriber,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// The text (with `--timestamps`, one timed segment a line).
    Txt,
    /// SubRip subtitles.
    Srt,
    /// WebVTT subtitles.
    Vtt,
    /// The text, the language and the timed segments (and words, with --word-timestamps).
    Json,
}

impl From<Format> for OutputFormat {
    fn from(format: Format) -> Self {
        match format {
            Format::Txt => OutputFormat::Txt,
            Format::Srt => OutputFormat::Srt,
            Format::Vtt => OutputFormat::Vtt,
            Format::Json => OutputFormat::Json,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TaskArg {
    /// Text in the language spoken.
    Transcribe,
    /// English text of speech in any language (multilingual models).
    Translate,
}

#[derive(Parser, Debug)]
#[command(about = "Transcribe or translate audio files with Whisper")]
struct Args {
    /// Model name in the models folder, or a model folder.
    #[arg(long, default_value = "whisper-tiny.en-ct2")]
    model: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Txt)]
    format: Format,
    /// Write each transcript to DIR/<file stem>.<format> instead of standard output.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Transcribe, or translate to English (multilingual models).
    #[arg(long, value_enum, default_value_t = TaskArg::Transcribe)]
    task: TaskArg,
    /// Language code of the speech (`en`, `de`, …); detected when absent (multilingual
    /// models).
    #[arg(long)]
    language: Option<String>,
    /// Beams (1 = greedy).
    #[arg(long, default_value_t = 1)]
    beam: usize,
    /// Print timed segments (txt; the other formats are always timed).
    #[arg(long)]
    timestamps: bool,
    /// Time every word (from the cross-attention alignment); the JSON lists them.
    #[arg(long)]
    word_timestamps: bool,
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
    /// Transcribe only the speech: Silero VAD (the models folder's `silero-vad`) finds it,
    /// as faster-whisper's `vad_filter`; times stay those of the file.
    #[arg(long, conflicts_with = "stream")]
    vad: bool,
    /// Feed the audio in chunks of this many seconds and print every partial transcript
    /// (greedy; the previous partial is verified as a draft).
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "0.5")]
    stream: Option<f64>,
    /// Audio files: WAV, FLAC, MP3, OGG/Vorbis, M4A/AAC.
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
    let format = OutputFormat::from(args.format);
    let task = match args.task {
        TaskArg::Transcribe => Task::Transcribe,
        TaskArg::Translate => Task::Translate,
    };
    let language = args.language.map(|l| l.trim().to_ascii_lowercase());
    check_language(&mut transcriber, &args.model, task, language.as_deref())?;
    let mut options = TranscribeOptions {
        beam_size: args.beam,
        timestamps: args.timestamps || args.word_timestamps || format.needs_timestamps(),
        word_timestamps: args.word_timestamps,
        language,
        task,
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
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut vad = if args.vad {
        let path = store
            .resolve("silero-vad")?
            .dir
            .join(engine_asr::vad::MODEL_FILE);
        Some(SileroVad::load(&path, &candle_core::Device::Cpu)?)
    } else {
        None
    };
    for file in &args.files {
        let audio = AudioFile::open(file)?;
        let source_rate = audio.source_sample_rate();
        let seconds = audio.declared_seconds();
        let transcript = match vad.as_mut() {
            Some(vad) => transcriber.transcribe_speech(
                audio,
                vad,
                &engine_asr::vad::SpeechOptions::default(),
                &options,
            ),
            None => transcriber.transcribe_source(audio, &options),
        }
        .with_context(|| format!("transcribing {}", file.display()))?;
        let rendered = if format == OutputFormat::Txt && options.timestamps {
            transcript
                .segments
                .iter()
                .map(|s| format!("[{:6.2} → {:6.2}] {}\n", s.start, s.end, s.text.trim()))
                .collect()
        } else {
            format.render(&transcript)
        };
        match &args.output_dir {
            Some(dir) => {
                let path = output_path(dir, file, format)?;
                std::fs::write(&path, rendered)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("{} → {}", file.display(), path.display());
            }
            None => print!("{rendered}"),
        }
        let stats = &transcript.stats;
        let language = match (&options.language, &transcript.language) {
            (Some(given), _) => format!("{given} (given)"),
            (None, Some(found)) if transcriber.model().config().is_multilingual() => {
                format!("{found} (detected)")
            }
            _ => "en (English-only model)".into(),
        };
        eprintln!(
            "{}: {source_rate} Hz, language {language}, {} segments, log-mel {:.0} ms, encoder {:.0} ms, \
             decoder {:.0} ms ({} forwards, {} tokens, {} windows){}",
            file.display(),
            transcript.segments.len(),
            stats.front_end_time.as_secs_f64() * 1e3,
            stats.encoder_time.as_secs_f64() * 1e3,
            stats.decoder_time.as_secs_f64() * 1e3,
            stats.forwards,
            stats.tokens,
            stats.windows,
            match seconds.filter(|&s| s > 0.0) {
                Some(seconds) => format!(
                    ", {seconds:.1} s of audio, RTF {:.3}",
                    stats.total_time().as_secs_f64() / seconds
                ),
                None => String::new(),
            }
        );
    }
    Ok(())
}

/// Fails early, with what to do instead, when the model cannot follow the task or language:
/// an English-only model neither translates nor hears other languages, and a language must be
/// one Whisper knows.
fn check_language(
    transcriber: &mut Transcriber,
    model: &str,
    task: Task,
    language: Option<&str>,
) -> Result<()> {
    let multilingual = transcriber.model().config().is_multilingual();
    if !multilingual && task == Task::Translate {
        bail!(
            "--task translate needs a multilingual model; {model} is English-only \
             (try --model whisper-base-ct2)"
        );
    }
    if let Some(code) = language {
        if !multilingual && code != "en" {
            bail!(
                "--language {code}: {model} is English-only (try --model whisper-base-ct2, or \
                 leave --language out)"
            );
        }
        if multilingual && transcriber.tokenizer().language(code).is_err() {
            let known: Vec<&str> = transcriber
                .tokenizer()
                .languages()
                .iter()
                .map(|(c, _)| *c)
                .collect();
            bail!(
                "--language {code} is not a language Whisper knows (codes: {})",
                known.join(" ")
            );
        }
    }
    Ok(())
}

/// `<dir>/<stem of file>.<format's extension>`.
fn output_path(dir: &Path, file: &Path, format: OutputFormat) -> Result<PathBuf> {
    let stem = file
        .file_stem()
        .with_context(|| format!("{} has no file name", file.display()))?;
    Ok(dir.join(stem).with_extension(format.extension()))
}

/// Feeds each file in chunks and prints the partial transcripts as they come.
fn stream(
    transcriber: Transcriber,
    options: TranscribeOptions,
    files: &[PathBuf],
    chunk_seconds: f64,
) -> Result<()> {
    if chunk_seconds.is_nan() || chunk_seconds <= 0.0 {
        bail!("--stream needs a positive chunk length, got {chunk_seconds}");
    }
    let chunk = (chunk_seconds * f64::from(engine_asr::SAMPLE_RATE)).round() as usize;
    let mut transcriber = transcriber;
    for file in files {
        let samples = Audio::read(file)?.to_16k()?;
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
