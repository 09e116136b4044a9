//! Speak a text into a WAV file, sentence by sentence as the voice pipeline does, and report
//! the time to first audio.
//!
//! ```sh
//! cargo run -p engine-tts --example speak -- --out answer.wav "Hello there. How are you?"
//! ```
//!
//! The voice is espeak-ng's (`apt-get install espeak-ng`) until CosyVoice 2's weights and code
//! exist in engine-tts.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine_tts::espeak::{EspeakSettings, EspeakSynthesizer};
use spec_voice::{split_sentences, write_wav, AudioChunk, SentenceSynthesizer};
use tracing::info;
use tracing_subscriber::EnvFilter;

/// Speak a text into a 16-bit WAV file with espeak-ng, used until CosyVoice 2's weights and
/// code exist in engine-tts.
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
    let mut tts = EspeakSynthesizer::new(EspeakSettings {
        voice: args.voice,
        words_per_minute: args.wpm,
        pitch: args.pitch,
        program: args.espeak,
    })?;
    info!("{}", tts.version());

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
        bail!("espeak-ng produced no audio");
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
