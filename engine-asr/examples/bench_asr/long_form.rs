//! `bench_asr`'s long recordings: the real clips joined by silences of 0.6–6 s into minutes of
//! audio, transcribed whole (30-second windows, timestamp seeking, previous-text conditioning)
//! with and without the VAD filter, by SpecVoice and by faster-whisper in the same run; and the
//! peak memory of transcribing 1 and 30 minutes, each in a process of its own.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::testing::JoinedSpeech;
use engine_asr::vad::{SpeechOptions, MODEL_FILE};
use engine_asr::wer::word_errors;
use engine_asr::{LoadOptions, SileroVad, TranscribeOptions, Transcriber};
use spec_core::report::{ratio, Table};
use spec_models::Store;

use crate::speech_sets::Clip;

/// Silences between the clips, in turn: pauses within speech and breaks the VAD removes.
const GAPS: [f32; 4] = [0.6, 3.0, 1.2, 6.0];

/// The clips joined into at least `minutes` of audio, and its reference transcript.
pub fn recording(clips: &[Clip], minutes: f64) -> Result<(JoinedSpeech, String)> {
    let joined = JoinedSpeech::new(
        clips.iter().map(|c| c.samples.clone()).collect(),
        &GAPS,
        minutes * 60.0,
    )?;
    let reference = joined
        .order()
        .iter()
        .map(|&c| clips[c].reference.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    Ok((joined, reference))
}

pub const COLUMNS: [&str; 7] = [
    "model",
    "system",
    "VAD",
    "WER %",
    "RTF",
    "RTF ÷ faster-whisper's",
    "windows / segments",
];

struct Run {
    system: String,
    vad: bool,
    text: String,
    seconds: f64,
    pieces: String,
}

fn silero(store: &Store<'_>) -> Result<SileroVad> {
    let path = store.resolve("silero-vad")?.dir.join(MODEL_FILE);
    Ok(SileroVad::load(&path, &candle_core::Device::Cpu)?)
}

/// What every model's long-form run shares.
pub struct LongForm<'a> {
    pub store: &'a Store<'a>,
    pub joined: JoinedSpeech,
    pub reference: String,
    pub normalizer: &'a EnglishTextNormalizer,
    /// A Python with faster-whisper 1.2.1.
    pub python: Option<&'a Path>,
}

/// One model on the joined recording: SpecVoice's defaults and faster-whisper int8 (greedy,
/// its long-form defaults), each without and with the VAD filter.
pub fn measure(long: &LongForm<'_>, name: &str, folder: &Path, table: &mut Table) -> Result<()> {
    let LongForm {
        store,
        joined,
        reference,
        normalizer,
        python,
    } = long;
    let audio_seconds = joined.len() as f64 / 16_000.0;
    let mut transcriber = Transcriber::load(folder, &LoadOptions::default())?;
    let mut vad = silero(store)?;
    let options = TranscribeOptions::default();
    let mut runs = Vec::new();
    for with_vad in [false, true] {
        eprintln!("long-form, SpecVoice, VAD {with_vad}");
        let start = Instant::now();
        let transcript = if with_vad {
            transcriber.transcribe_speech(
                joined.clone(),
                &mut vad,
                &SpeechOptions::default(),
                &options,
            )?
        } else {
            transcriber.transcribe_source(joined.clone(), &options)?
        };
        runs.push(Run {
            system: "SpecVoice greedy, Q8_0 (defaults)".into(),
            vad: with_vad,
            text: transcript.text,
            seconds: start.elapsed().as_secs_f64(),
            pieces: format!(
                "{} / {}",
                transcript.stats.windows,
                transcript.segments.len()
            ),
        });
    }
    if let Some(python) = *python {
        let raw =
            std::env::temp_dir().join(format!("specvoice-long-form-{}.f32", std::process::id()));
        std::fs::write(
            &raw,
            joined
                .samples()
                .iter()
                .flat_map(|s| s.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        for with_vad in [false, true] {
            eprintln!("long-form, faster-whisper, VAD {with_vad}");
            let peer = faster_whisper(python, folder, &raw, with_vad);
            let peer = match peer {
                Ok(peer) => peer,
                Err(e) => {
                    std::fs::remove_file(&raw).ok();
                    return Err(e);
                }
            };
            runs.push(Run {
                system: "faster-whisper 1.2.1 greedy, int8".into(),
                vad: with_vad,
                text: peer["text"].as_str().context("text")?.to_string(),
                seconds: peer["seconds"].as_f64().context("seconds")?,
                pieces: format!("– / {}", peer["segments"]),
            });
        }
        std::fs::remove_file(&raw).ok();
    }
    let reference = normalizer.normalize(reference);
    for run in &runs {
        let peer = runs
            .iter()
            .find(|r| r.vad == run.vad && r.system.starts_with("faster-whisper"));
        let errors = word_errors(&reference, &normalizer.normalize(&run.text));
        table.push(vec![
            name.to_string(),
            run.system.clone(),
            if run.vad { "Silero" } else { "–" }.into(),
            format!("{:.2}", 100.0 * errors.rate()),
            format!("{:.4}", run.seconds / audio_seconds),
            match peer {
                Some(peer) if !run.system.starts_with("faster-whisper") => {
                    ratio(run.seconds, peer.seconds)
                }
                _ => "–".into(),
            },
            run.pieces.clone(),
        ]);
    }
    Ok(())
}

fn faster_whisper(
    python: &Path,
    folder: &Path,
    samples: &Path,
    vad: bool,
) -> Result<serde_json::Value> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/peers/long_form_faster_whisper.py");
    let mut command = std::process::Command::new(python);
    command
        .arg(&script)
        .args([
            "--model",
            &folder.to_string_lossy(),
            "--compute-type",
            "int8",
        ])
        .arg(samples);
    if vad {
        command.arg("--vad");
    }
    run_peer(&mut command, python)
}

/// Runs a faster-whisper peer script and parses the one JSON object it prints.
pub fn run_peer(command: &mut std::process::Command, python: &Path) -> Result<serde_json::Value> {
    let output = command
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !output.status.success() {
        bail!(
            "faster-whisper: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("faster-whisper's JSON")
}

pub const MEMORY_COLUMNS: [&str; 6] = [
    "model",
    "VAD",
    "recording",
    "peak memory (MiB)",
    "growth from the shortest",
    "RTF",
];

/// Peak memory of transcribing each of `minutes` (and with the VAD filter), each measured in a
/// child process of this benchmark (`--memory-probe`), so one run's peak is not another's.
pub fn memory(model: &str, minutes: &[f64], table: &mut Table) -> Result<()> {
    let exe = std::env::current_exe()?;
    for vad in [false, true] {
        let mut shortest: Option<f64> = None;
        for &m in minutes {
            eprintln!("memory probe: {model}, {m} min, VAD {vad}");
            let mut command = std::process::Command::new(&exe);
            command.args(["--models", model, "--memory-probe", &m.to_string()]);
            if vad {
                command.arg("--probe-vad");
            }
            let output = command.output()?;
            if !output.status.success() {
                bail!("memory probe: {}", String::from_utf8_lossy(&output.stderr));
            }
            let probe: serde_json::Value = serde_json::from_slice(&output.stdout)?;
            let peak = probe["peak_rss_mib"].as_f64().context("peak")?;
            let base = *shortest.get_or_insert(peak);
            table.push(vec![
                model.to_string(),
                if vad { "Silero" } else { "–" }.into(),
                format!(
                    "{:.1} min",
                    probe["audio_seconds"].as_f64().unwrap_or(0.0) / 60.0
                ),
                format!("{peak:.0}"),
                format!("{:+.1} %", 100.0 * (peak / base - 1.0)),
                format!("{:.4}", probe["rtf"].as_f64().unwrap_or(0.0)),
            ]);
        }
    }
    Ok(())
}

/// The child of [`memory`]: transcribes `minutes` of the joined clips (made as they are read,
/// never held whole) and prints its peak resident memory as JSON.
pub fn probe(
    store: &Store<'_>,
    folder: &Path,
    clips: &[Clip],
    minutes: f64,
    vad: bool,
) -> Result<()> {
    let (joined, _) = recording(clips, minutes)?;
    let audio_seconds = joined.len() as f64 / 16_000.0;
    let mut transcriber = Transcriber::load(folder, &LoadOptions::default())?;
    let options = TranscribeOptions::default();
    let start = Instant::now();
    let transcript = if vad {
        let mut vad = silero(store)?;
        transcriber.transcribe_speech(joined, &mut vad, &SpeechOptions::default(), &options)?
    } else {
        transcriber.transcribe_source(joined, &options)?
    };
    let seconds = start.elapsed().as_secs_f64();
    let status = std::fs::read_to_string("/proc/self/status")?;
    let peak_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .context("VmHWM in /proc/self/status")?
        .parse()?;
    println!(
        "{}",
        serde_json::json!({
            "audio_seconds": audio_seconds,
            "peak_rss_mib": peak_kib / 1024.0,
            "rtf": seconds / audio_seconds,
            "words": transcript.text.split_whitespace().count(),
        })
    );
    Ok(())
}
