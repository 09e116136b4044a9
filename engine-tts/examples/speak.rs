//! Speak a text into a WAV file, sentence by sentence as the voice pipeline does, and report
//! the time to first audio.
//!
//! ```sh
//! cargo run -p engine-tts --example speak -- --out answer.wav "Hello there. How are you?"
//! ```
//!
//! The voice is CosyVoice 2's when its weights are in the models folder (`cosyvoice2-0.5b`,
//! with `CosyVoice-BlankEN/tokenizer.json`) and a speaker prompt is given (`--speaker`, a
//! safetensors file: see `engine_tts::cosyvoice::SpeakerPrompt`); espeak-ng's
//! (`apt-get install espeak-ng`) otherwise. The log says which one spoke.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine_llm::ssd::SsdDraftWeights;
use engine_tts::cosyvoice::lm::SsdConfig;
use engine_tts::cosyvoice::{CosyVoice2, CosyVoiceSynthesizer};
use engine_tts::espeak::{EspeakSettings, EspeakSynthesizer};
use spec_models::{Registry, Store};
use spec_nn::heads::weights_fingerprint;
use spec_voice::{split_sentences, write_wav, AudioChunk, SentenceSynthesizer};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

/// Speak a text into a 16-bit WAV file with CosyVoice 2, or espeak-ng without its weights or a
/// speaker prompt.
///
/// The text is split into sentences and each is synthesized in turn, as the voice pipeline
/// does; the time to first audio is the first sentence's. Install espeak-ng with
/// `apt-get install espeak-ng`.
#[derive(Parser)]
struct Args {
    /// The text to speak (after `--` when it starts with `-`)
    text: String,

    /// The WAV file to write
    #[arg(long, value_name = "WAV")]
    out: PathBuf,

    /// CosyVoice 2's speaker prompt (safetensors: prompt_text, prompt_speech_token, prompt_mel,
    /// speaker_embedding); without it espeak-ng speaks
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

    /// espeak-ng voice (`espeak-ng --voices` lists them)
    #[arg(long, default_value_t = EspeakSettings::default().voice)]
    voice: String,

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
    let (mut tts, voice) = synthesizer(&args)?;
    info!("speaking with {voice}");

    let (sentences, _) = split_sentences(&args.text, true);
    if sentences.is_empty() {
        bail!("nothing to speak in {:?}", args.text);
    }
    let mut first_audio_after = None;
    let mut chunks: Vec<AudioChunk> = Vec::new();
    for sentence in &sentences {
        let synthesis = tts.synthesize(sentence)?;
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

    write_wav(&args.out, &chunks).with_context(|| format!("writing {}", args.out.display()))?;

    let audio: Duration = chunks.iter().map(AudioChunk::duration).sum();
    let first = first_audio_after.unwrap_or_default();
    println!("time to first audio: {:.1} ms", first.as_secs_f64() * 1e3);
    println!(
        "audio: {:.2} s at {sample_rate} Hz, {} sentence(s), written to {}",
        audio.as_secs_f64(),
        sentences.len(),
        args.out.display()
    );
    Ok(())
}

/// CosyVoice 2 when its weights resolve and a speaker prompt is given, espeak-ng otherwise; and
/// which one it is.
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
            Err(e) => warn!("CosyVoice 2 unavailable ({e}); espeak-ng speaks instead"),
        }
    }
    let tts = EspeakSynthesizer::new(EspeakSettings {
        voice: args.voice.clone(),
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
