//! Speak a text into a WAV file, sentence by sentence as the voice pipeline does, and report
//! the time to first audio.
//!
//! ```sh
//! cargo run -p engine-tts --example speak -- --out answer.wav "Hello there. How are you?"
//! ```
//!
//! The voice is `--voice` (the names `specvoice --voice` takes: `auto`, the default, is Kokoro's
//! `af_heart` when its files and ONNX Runtime are in the models folder and espeak-ng's
//! otherwise; `kokoro:bm_george`, `piper:joe`, `espeak`; `list` lists those there). With a
//! speaker prompt (`--speaker`, a safetensors file: see `engine_tts::cosyvoice::SpeakerPrompt`)
//! it is CosyVoice 2's, from `cosyvoice2-0.5b` in the models folder. The log says which one
//! spoke.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine_llm::ssd::SsdDraftWeights;
use engine_tts::cosyvoice::lm::SsdConfig;
use engine_tts::cosyvoice::{CosyVoice2, CosyVoiceSynthesizer};
use engine_tts::espeak::{EspeakSettings, EspeakSynthesizer};
use engine_tts::voices::{self, VoiceChoice};
use spec_models::{Registry, Store};
use spec_nn::heads::weights_fingerprint;
use spec_voice::{split_sentences, write_wav, AudioChunk, SentenceSynthesizer};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

/// Speak a text into a 16-bit WAV file with one of the product's voices (Kokoro, Piper,
/// espeak-ng), or with CosyVoice 2 given a speaker prompt.
///
/// The text is split into sentences and each is synthesized in turn, as the voice pipeline
/// does; the time to first audio is the first sentence's. Install espeak-ng with
/// `apt-get install espeak-ng`.
#[derive(Parser)]
struct Args {
    /// The text to speak (after `--` when it starts with `-`)
    text: Option<String>,

    /// The WAV file to write
    #[arg(long, value_name = "WAV")]
    out: Option<PathBuf>,

    /// The voice: auto (Kokoro's af_heart when its files are in the models folder, espeak-ng
    /// otherwise), kokoro:NAME, piper:NAME or espeak; `list` lists the voices there
    #[arg(long, default_value = "auto")]
    voice: String,

    /// The pace: 2 speaks twice as fast (Kokoro and Piper; espeak-ng takes `--wpm`)
    #[arg(long, default_value_t = 1.0)]
    speed: f32,

    /// CosyVoice 2's speaker prompt (safetensors: prompt_text, prompt_speech_token, prompt_mel,
    /// speaker_embedding); without it the `--voice` speaks
    #[arg(long, value_name = "SAFETENSORS")]
    speaker: Option<PathBuf>,

    /// CosyVoice 2: a name in the models folder, or a folder
    #[arg(long, value_name = "MODEL", default_value = "cosyvoice2-0.5b")]
    cosyvoice: String,

    /// CosyVoice 2's seed (its sampling and noise)
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// CosyVoice 2 draws its speech tokens by Speech Speculative Decoding with the SSD draft in
    /// this folder (trained for its llm.pt with `spec_train::ssd::train` on
    /// `SpeechLm::ssd_backbone`: `cargo xtask train-ssd-draft`); γ = 3
    #[arg(long, value_name = "DIR")]
    ssd_draft: Option<PathBuf>,

    /// SSD's tolerance β (0: exactly the model's distribution)
    #[arg(long, default_value_t = SsdConfig::default().tolerance)]
    ssd_tolerance: f32,

    /// espeak-ng's own voice, with `--voice espeak` (`espeak-ng --voices` lists them)
    #[arg(long, default_value_t = EspeakSettings::default().voice)]
    espeak_voice: String,

    /// Speaking rate in words per minute (80 to 450)
    #[arg(long, default_value_t = EspeakSettings::default().words_per_minute)]
    wpm: u32,

    /// Pitch (0 to 99)
    #[arg(long, default_value_t = EspeakSettings::default().pitch)]
    pitch: u32,

    /// The espeak-ng program: a path, or a name on PATH
    #[arg(long, value_name = "PROGRAM", default_value = "espeak-ng")]
    espeak: PathBuf,
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    if args.voice == "list" {
        for voice in voices::available(&spec_models::models_dir()?)? {
            println!("{voice}");
        }
        return Ok(());
    }
    let (Some(text), Some(out)) = (&args.text, &args.out) else {
        bail!("a text to speak and `--out WAV` are needed (or `--voice list`)");
    };
    let (mut tts, voice) = synthesizer(&args)?;
    info!("speaking with {voice}");

    let (sentences, _) = split_sentences(text, true);
    if sentences.is_empty() {
        bail!("nothing to speak in {text:?}");
    }
    let mut first_audio_after = None;
    let mut chunks: Vec<AudioChunk> = Vec::new();
    for sentence in &sentences {
        let synthesis = tts.synthesize_at(sentence, args.speed)?;
        let played: Duration = synthesis.chunks.iter().map(AudioChunk::duration).sum();
        info!(
            "{sentence:?}: {:.2} s of audio after {:.1} ms",
            played.as_secs_f64(),
            synthesis.first_audio_after.as_secs_f64() * 1e3
        );
        first_audio_after.get_or_insert(synthesis.first_audio_after);
        chunks.extend(synthesis.chunks);
    }
    let Some(sample_rate) = chunks.first().map(|c| c.sample_rate) else {
        bail!("{voice} produced no audio");
    };

    write_wav(out, &chunks).with_context(|| format!("writing {}", out.display()))?;

    let audio: Duration = chunks.iter().map(AudioChunk::duration).sum();
    let first = first_audio_after.unwrap_or_default();
    println!("time to first audio: {:.1} ms", first.as_secs_f64() * 1e3);
    println!(
        "audio: {:.2} s at {sample_rate} Hz, {} sentence(s), written to {}",
        audio.as_secs_f64(),
        sentences.len(),
        out.display()
    );
    Ok(())
}

/// CosyVoice 2 when its weights resolve and a speaker prompt is given, the `--voice` otherwise;
/// and which one it is.
fn synthesizer(args: &Args) -> Result<(Box<dyn SentenceSynthesizer>, String)> {
    if let Some(speaker) = &args.speaker {
        let resolved = spec_models::models_dir()
            .and_then(|root| Store::new(root, Registry::builtin()).resolve(&args.cosyvoice));
        match resolved {
            Ok(model) => {
                let mut cosyvoice = CosyVoice2::load(&model.dir, speaker)
                    .with_context(|| format!("loading CosyVoice 2 from {}", model.dir.display()))?
                    .with_seed(args.seed);
                let mut voice =
                    format!("CosyVoice 2 ({}, seed {})", model.dir.display(), args.seed);
                if let Some(dir) = &args.ssd_draft {
                    let fingerprint = weights_fingerprint(&model.dir.join("llm.pt"))?;
                    let weights = SsdDraftWeights::load(dir, &fingerprint)?;
                    let draft = cosyvoice.lm().ssd_draft(&weights)?;
                    let config = SsdConfig {
                        tolerance: args.ssd_tolerance,
                        ..SsdConfig::default()
                    };
                    cosyvoice = cosyvoice.with_ssd(draft, config)?;
                    voice.push_str(&format!(", SSD β = {}", args.ssd_tolerance));
                }
                return Ok((Box::new(CosyVoiceSynthesizer::new(cosyvoice)), voice));
            }
            Err(e) => warn!(
                "CosyVoice 2 unavailable ({e}); --voice {} speaks",
                args.voice
            ),
        }
    }
    let models = spec_models::models_dir()?;
    let choice = args.voice.parse::<VoiceChoice>()?.resolve(&models)?;
    if choice != VoiceChoice::Espeak {
        return Ok((voices::open(&choice, &models)?, choice.to_string()));
    }
    let tts = EspeakSynthesizer::new(EspeakSettings {
        voice: args.espeak_voice.clone(),
        words_per_minute: args.wpm,
        pitch: args.pitch,
        program: args.espeak.clone(),
    })?;
    let voice = format!("espeak-ng ({})", tts.version());
    Ok((Box::new(tts), voice))
}

/// Log lines on standard error, at `RUST_LOG`'s level (default `info`).
fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
