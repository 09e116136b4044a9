//! The speech the Whisper benchmarks run on: the real clips of `data/speech` with their
//! transcripts, and sentences of MT-Bench questions spoken by `espeak-ng` (never used to train
//! anything).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use engine_asr::Audio;
use spec_models::Store;

/// A recording with its reference transcript.
pub struct Clip {
    pub path: PathBuf,
    pub reference: String,
    pub samples: Vec<f32>,
    pub seconds: f64,
}

/// Reads every `*transcription` file under `data/speech` (`<s> text </s> (id)` per line, the
/// WAV file `id.wav` beside it).
pub fn clips(store: &Store) -> Result<Vec<Clip>> {
    let root = store.root().join("data/speech");
    let mut clips = Vec::new();
    let mut folders: Vec<PathBuf> = std::fs::read_dir(&root)
        .with_context(|| format!("{} (run ../shared/models/fetch)", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    folders.sort();
    for folder in folders {
        let mut lists: Vec<PathBuf> = std::fs::read_dir(&folder)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().ends_with("transcription"))
            })
            .collect();
        lists.sort();
        for list in lists {
            for line in std::fs::read_to_string(&list)?.lines() {
                let Some((text, id)) = line.rsplit_once('(') else {
                    continue;
                };
                let id = id.trim().trim_end_matches(')');
                let text = text.replace("<s>", "").replace("</s>", "");
                let path = folder.join(format!("{id}.wav"));
                let audio = Audio::read_wav(&path)?;
                clips.push(Clip {
                    samples: audio.to_16k()?,
                    seconds: audio.duration_seconds(),
                    path,
                    reference: text.split_whitespace().collect::<Vec<_>>().join(" "),
                });
            }
        }
    }
    if clips.is_empty() {
        bail!("no clips with transcripts under {}", root.display());
    }
    Ok(clips)
}

/// The first sentence (at most 25 words) of the first MT-Bench questions, spoken by
/// `espeak-ng` (US English, 160 words per minute) into `dir`. `None` without `espeak-ng`.
pub fn spoken_set(store: &Store, count: usize, dir: &Path) -> Result<Option<Vec<Clip>>> {
    if count == 0
        || std::process::Command::new("espeak-ng")
            .arg("--version")
            .output()
            .is_err()
    {
        return Ok(None);
    }
    let mut clips = Vec::new();
    for (i, turn) in spec_models::mt_bench::first_turns(store, 80)?
        .iter()
        .enumerate()
    {
        if clips.len() == count {
            break;
        }
        let sentence = turn
            .split_inclusive(['.', '?', '!'])
            .next()
            .unwrap_or(turn)
            .trim()
            .replace(['"', '\n'], " ");
        let words = sentence.split_whitespace().count();
        if !(4..=25).contains(&words) {
            continue;
        }
        let path = dir.join(format!("{i:02}.wav"));
        let status = std::process::Command::new("espeak-ng")
            .args(["-v", "en-us", "-s", "160", "-w"])
            .arg(&path)
            .arg(&sentence)
            .status()?;
        if !status.success() {
            bail!("espeak-ng failed on {sentence:?}");
        }
        let audio = Audio::read_wav(&path)?;
        clips.push(Clip {
            samples: audio.to_16k()?,
            seconds: audio.duration_seconds(),
            path,
            reference: sentence,
        });
    }
    Ok(Some(clips))
}
