//! The parity clips both `parity_faster_whisper` and `parity_words` run faster-whisper and
//! SpecVoice on: the real recordings of `$SPECVOICE_MODELS/data/speech` and the sentences of
//! `engine-asr/data/parity_sentences.txt` spoken by `espeak-ng`, with their raw 16 kHz f32
//! samples written under a folder (what faster-whisper reads).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use engine_asr::Audio;
use spec_models::Store;

/// The folder the clips are cached in: `dir`, or `$CARGO_TARGET_DIR/parity` (default
/// `target/parity`).
pub fn parity_dir(dir: Option<&Path>) -> PathBuf {
    match dir {
        Some(dir) => dir.to_path_buf(),
        None => {
            PathBuf::from(std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()))
                .join("parity")
        }
    }
}

/// A clip of the set: its raw 16 kHz f32 samples on disk (what faster-whisper reads) and in
/// memory, with the reference transcript.
pub struct Clip {
    pub name: String,
    pub raw: PathBuf,
    pub samples: Vec<f32>,
    /// The words said (`parity_words` times words, it reads no reference).
    #[allow(dead_code)]
    pub reference: String,
}

/// The espeak-ng voices the written sentences are spoken in: (voice, words per minute).
pub const VOICES: [(&str, &str); 2] = [("en-us", "160"), ("en-gb-x-rp", "140")];

/// Writes raw little-endian f32 samples.
fn write_raw(path: &Path, samples: &[f32]) -> Result<()> {
    let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| path.display().to_string())
}

/// The clips, their raw samples written under `dir` (the espeak-ng WAVs too, made once).
pub fn clip_set(store: &Store<'_>, dir: &Path) -> Result<Vec<Clip>> {
    std::fs::create_dir_all(dir)?;
    let mut clips = Vec::new();
    for clip in spec_models::speech::clips(store)? {
        let samples = Audio::read_wav(&clip.wav)?.to_16k()?;
        let stem = clip.wav.file_stem().unwrap_or_default().to_string_lossy();
        let parent = clip
            .wav
            .parent()
            .and_then(Path::file_name)
            .unwrap_or_default()
            .to_string_lossy();
        let name = format!("{parent}/{stem}");
        let raw = dir.join(format!("{parent}-{stem}.f32"));
        write_raw(&raw, &samples)?;
        clips.push(Clip {
            name,
            raw,
            samples,
            reference: clip.transcript,
        });
    }
    let sentences = include_str!("../../data/parity_sentences.txt");
    for (voice, rate) in VOICES {
        for (i, sentence) in sentences
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
        {
            let wav = dir.join(format!("{voice}-{i:02}.wav"));
            if !wav.is_file() {
                let status = Command::new("espeak-ng")
                    .args(["-v", voice, "-s", rate, "-w"])
                    .arg(&wav)
                    .arg(sentence)
                    .status()
                    .context("espeak-ng (apt-get install espeak-ng)")?;
                if !status.success() {
                    bail!("espeak-ng failed on {sentence:?}");
                }
            }
            let samples = Audio::read_wav(&wav)?.to_16k()?;
            let raw = wav.with_extension("f32");
            write_raw(&raw, &samples)?;
            clips.push(Clip {
                name: format!("{voice}/{i:02}"),
                raw,
                samples,
                reference: sentence.to_string(),
            });
        }
    }
    Ok(clips)
}

/// What the set holds, for a report's notes.
pub fn describe(clips: &[Clip]) -> String {
    format!(
        "Clips: the {} real recordings of data/speech and {} sentences of \
         engine-asr/data/parity_sentences.txt spoken by espeak-ng ({}).",
        clips.iter().filter(|c| !c.name.starts_with("en-")).count(),
        clips.iter().filter(|c| c.name.starts_with("en-")).count(),
        VOICES
            .iter()
            .map(|(v, r)| format!("{v} at {r} words a minute"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}
