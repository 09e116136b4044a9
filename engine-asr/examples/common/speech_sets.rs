//! The speech the Whisper benchmarks run on: the real clips of `data/speech` with their
//! transcripts, and sentences of MT-Bench questions spoken by `espeak-ng` (never used to train
//! anything).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use engine_asr::{Audio, TranscribeOptions, Transcriber, Transcript, TranscriptStats};
use spec_models::Store;

/// A recording with its reference transcript.
pub struct Clip {
    pub path: PathBuf,
    pub reference: String,
    pub samples: Vec<f32>,
    pub seconds: f64,
}

/// Every clip of `data/speech` ([`spec_models::speech::clips`]) with its audio at 16 kHz.
pub fn clips(store: &Store<'_>) -> Result<Vec<Clip>> {
    spec_models::speech::clips(store)?
        .into_iter()
        .map(|clip| {
            let audio = Audio::read_wav(&clip.wav)?;
            Ok(Clip {
                samples: audio.to_16k()?,
                seconds: audio.duration_seconds(),
                path: clip.wav,
                reference: clip.transcript,
            })
        })
        .collect()
}

/// The first sentence (at most 25 words) of the first MT-Bench questions, spoken by
/// `espeak-ng` (US English, 160 words per minute) into `dir`. `None` without `espeak-ng`.
pub fn spoken_set(store: &Store<'_>, count: usize, dir: &Path) -> Result<Option<Vec<Clip>>> {
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

/// Transcribes `samples` `repeats` times (at least once), shows each run to `each`, and keeps
/// the run whose time `by` measures (decoder time, total time) is least.
pub fn fastest_transcript(
    transcriber: &mut Transcriber,
    samples: &[f32],
    options: &TranscribeOptions,
    repeats: usize,
    by: fn(&TranscriptStats) -> Duration,
    each: &mut dyn FnMut(&Transcript),
) -> Result<Transcript> {
    let mut best: Option<Transcript> = None;
    for _ in 0..repeats.max(1) {
        let t = transcriber.transcribe(samples, options)?;
        each(&t);
        if best.as_ref().is_none_or(|b| by(&t.stats) < by(&b.stats)) {
            best = Some(t);
        }
    }
    Ok(best.expect("at least one run"))
}
