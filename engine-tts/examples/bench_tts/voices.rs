//! The product's voices on the same sentences (`engine-tts/data/spoken_answers.txt`, everyday
//! spoken answers): real-time factor, time to first audio, peak memory and round-trip
//! intelligibility (Whisper base transcribes each sentence's audio; WER against the sentence,
//! both through Whisper's English normalizer).
//!
//! Each voice runs in a child process of this program (`--voice-child`), so that its peak
//! resident memory is its own; the parent transcribes the audio the children wrote.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::wer::word_errors;
use engine_asr::{Audio, LoadOptions, TranscribeOptions, Transcriber};
use engine_tts::kokoro::{KokoroSettings, KokoroSynthesizer, PhonemeSource};
use engine_tts::voices::{self, VoiceChoice};
use serde::{Deserialize, Serialize};
use spec_core::report::Table;
use spec_models::{Registry, Store};
use spec_voice::silence::{silence_after, silence_before};
use spec_voice::{AudioChunk, SentenceSynthesizer};

use crate::Section;

/// The sentences, one per line (`#` lines are comments).
const SENTENCES: &str = include_str!("../../data/spoken_answers.txt");

/// What the voices section measures.
#[derive(Clone, Debug, clap::Args)]
pub struct VoiceArgs {
    /// Voices to measure, by the names `specvoice --voice` takes. Each speaks a long sentence in
    /// two pieces, as the pipeline speaks an answer's first sentence
    /// (`spec_voice::first_piece_end`), unless `+whole` follows its name; a Kokoro voice with
    /// `+espeak` takes all its phonemes from espeak-ng (no lexicons), with `+untrimmed` keeps
    /// the model's own silence before and after speech; `none` skips the section
    #[arg(
        long,
        num_args = 1..,
        value_delimiter = ',',
        default_values = ["kokoro:af_heart", "kokoro:af_heart+whole", "kokoro:af_heart+untrimmed", "kokoro:bm_george", "piper:joe", "espeak"]
    )]
    pub voices: Vec<String>,
    /// Sentences each voice speaks (0: all 55)
    #[arg(long, default_value_t = 0)]
    pub voice_sentences: usize,
    /// Measure the one voice of `--voices` in this process and write the results there (the
    /// section runs each voice so)
    #[arg(long, hide = true)]
    pub voice_child: Option<PathBuf>,
}

/// One sentence as a voice spoke it.
#[derive(Debug, Deserialize, Serialize)]
struct Spoken {
    sentence: String,
    wav: PathBuf,
    compute_seconds: f64,
    first_audio_seconds: f64,
    audio_seconds: f64,
    /// Silence before the first word of the first audio chunk.
    silence_before_seconds: f64,
    /// Silence between the first piece's last word and the rest's first (spoken in two pieces).
    pause_at_cut_seconds: Option<f64>,
}

/// What a child measured.
#[derive(Debug, Deserialize, Serialize)]
struct VoiceRun {
    load_seconds: f64,
    spoken: Vec<Spoken>,
    /// Peak resident memory of the child (`VmHWM`), MiB.
    peak_mib: f64,
}

fn sentences(count: usize) -> Vec<&'static str> {
    let all = SENTENCES
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'));
    match count {
        0 => all.collect(),
        n => all.take(n).collect(),
    }
}

/// The child: speaks the sentences with `voice`, writes their audio beside `out`, and its
/// measurements to `out` (JSON).
pub fn run_child(args: &VoiceArgs, out: &Path) -> Result<()> {
    let [voice] = args.voices.as_slice() else {
        bail!("--voice-child measures one voice");
    };
    let models = spec_models::models_dir()?;
    let loading = Instant::now();
    let mut options = voice.split('+');
    let name = options.next().unwrap_or_default();
    let (mut whole, mut espeak_phonemes, mut untrimmed) = (false, false, false);
    for option in options {
        match option {
            "whole" => whole = true,
            "espeak" => espeak_phonemes = true,
            "untrimmed" => untrimmed = true,
            other => {
                bail!("unknown option `+{other}` of {voice}: `+whole`, `+espeak` or `+untrimmed`")
            }
        }
    }
    let kokoro_only = espeak_phonemes || untrimmed;
    let mut tts: Box<dyn SentenceSynthesizer> = match name.parse()? {
        VoiceChoice::Kokoro(name) if kokoro_only => {
            let defaults = KokoroSettings::default();
            let settings = KokoroSettings {
                voice: name,
                phonemes: match espeak_phonemes {
                    true => PhonemeSource::Espeak,
                    false => defaults.phonemes,
                },
                silence: defaults.silence.filter(|_| !untrimmed),
                ..defaults
            };
            Box::new(KokoroSynthesizer::load(&models, &settings)?)
        }
        _ if kokoro_only => {
            bail!("`+espeak` and `+untrimmed` go with a Kokoro voice, not `{name}`")
        }
        choice => voices::open(&choice, &models)?,
    };
    let load_seconds = loading.elapsed().as_secs_f64();
    // One sentence first, unmeasured: the first run of a model pays for its set-up.
    tts.synthesize("Hello.")?;
    let mut spoken = Vec::new();
    for (i, sentence) in sentences(args.voice_sentences).into_iter().enumerate() {
        let pieces: Vec<&str> = match spec_voice::split_first_piece(sentence) {
            (first, Some(rest)) if !whole => vec![first, rest],
            _ => vec![sentence],
        };
        let started = Instant::now();
        let mut first_audio_seconds = None;
        let mut chunks: Vec<AudioChunk> = Vec::new();
        let mut pause_at_cut_seconds = None;
        for piece in pieces {
            let synthesis = tts.synthesize(piece)?;
            first_audio_seconds.get_or_insert(synthesis.first_audio_after.as_secs_f64());
            if let (Some(before), Some(after)) = (chunks.last(), synthesis.chunks.first()) {
                pause_at_cut_seconds =
                    Some((silence_after(before) + silence_before(after)).as_secs_f64());
            }
            chunks.extend(synthesis.chunks);
        }
        let compute_seconds = started.elapsed().as_secs_f64();
        let wav = out.with_extension(format!("{i}.wav"));
        spec_voice::write_wav(&wav, &chunks)?;
        spoken.push(Spoken {
            sentence: sentence.to_string(),
            wav,
            compute_seconds,
            first_audio_seconds: first_audio_seconds.unwrap_or(compute_seconds),
            audio_seconds: chunks.iter().map(|c| c.duration().as_secs_f64()).sum(),
            silence_before_seconds: chunks
                .first()
                .map_or(0.0, |c| silence_before(c).as_secs_f64()),
            pause_at_cut_seconds,
        });
    }
    let run = VoiceRun {
        load_seconds,
        spoken,
        peak_mib: peak_resident_mib()?,
    };
    std::fs::write(out, serde_json::to_string(&run)?)?;
    Ok(())
}

/// This process's peak resident memory (`VmHWM` of `/proc/self/status`), MiB.
fn peak_resident_mib() -> Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/self/status")?;
    Ok(kib / 1024.0)
}

/// Runs every voice in a child process, then transcribes what each said.
pub fn run(args: &VoiceArgs) -> Result<Section> {
    let mut section = Section::default();
    if args.voices.iter().any(|v| v == "none") {
        return Ok(section);
    }
    let scratch = tempfile::tempdir()?;
    let mut runs = Vec::new();
    for (i, voice) in args.voices.iter().enumerate() {
        // A voice may be measured twice (runs interleaved with another's): each its own files.
        let out = scratch
            .path()
            .join(format!("{i}_{}", voice.replace(':', "_")));
        let status = Command::new(std::env::current_exe()?)
            .args(["--voices", voice, "--voice-sentences"])
            .arg(args.voice_sentences.to_string())
            .arg("--voice-child")
            .arg(&out)
            .status()
            .with_context(|| format!("measuring {voice}"))?;
        if !status.success() {
            section
                .notes
                .push(format!("{voice} could not speak ({status}): skipped."));
            continue;
        }
        let run: VoiceRun = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
        runs.push((voice.clone(), run));
    }
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let whisper = store.resolve("whisper-base-ct2")?;
    let mut transcriber = Transcriber::load(&whisper.dir, &LoadOptions::default())?;
    let normalizer = EnglishTextNormalizer::from_file(&store.data_file("whisper/english.json")?)?;
    let options = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    let mut table = Table::new(
        format!(
            "The voices on {} everyday spoken answers (engine-tts/data/spoken_answers.txt), each in its own process; RTF = synthesis time ÷ audio time; first audio = compute time to the first audio chunk; first word = first audio + the silence before the first word; pause at the cut = silence between a first piece's last word and the rest's first; WER = Whisper base's transcript of the audio against the sentence, after Whisper's English normalizer",
            runs.first().map_or(0, |(_, r)| r.spoken.len())
        ),
        &[
            "voice",
            "load (s)",
            "RTF mean",
            "RTF worst",
            "first audio, median (ms)",
            "first audio, 10–14 words (ms)",
            "first word, 10–14 words (ms)",
            "silence before speech, median (ms)",
            "pause at the cut, median (ms)",
            "peak memory (MiB)",
            "round-trip WER",
        ],
    );
    let mut details = Table::new(
        "Each sentence of each voice",
        &["voice", "sentence", "RTF", "first audio (ms)", "heard"],
    );
    for (voice, run) in &runs {
        let (mut errors, mut words) = (0, 0);
        for spoken in &run.spoken {
            let audio = Audio::read_wav(&spoken.wav)?.to_16k()?;
            let heard = transcriber.transcribe(&audio, &options)?.text;
            let reference = normalizer.normalize(&spoken.sentence);
            errors += word_errors(&reference, &normalizer.normalize(&heard)).errors();
            words += reference.split_whitespace().count();
            details.rows.push(vec![
                voice.clone(),
                spoken.sentence.clone(),
                format!("{:.3}", spoken.compute_seconds / spoken.audio_seconds),
                format!("{:.0}", 1000.0 * spoken.first_audio_seconds),
                heard.trim().to_string(),
            ]);
        }
        let rtfs: Vec<f64> = run
            .spoken
            .iter()
            .map(|s| s.compute_seconds / s.audio_seconds)
            .collect();
        let first_ms = |filter: &dyn Fn(&Spoken) -> bool| {
            median(
                run.spoken
                    .iter()
                    .filter(|s| filter(s))
                    .map(|s| 1000.0 * s.first_audio_seconds)
                    .collect(),
            )
        };
        let twelve_words = |s: &Spoken| (10..=14).contains(&s.sentence.split_whitespace().count());
        let first_word_ms = median(
            run.spoken
                .iter()
                .filter(|s| twelve_words(s))
                .map(|s| 1000.0 * (s.first_audio_seconds + s.silence_before_seconds))
                .collect(),
        );
        let silence_ms = median(
            run.spoken
                .iter()
                .map(|s| 1000.0 * s.silence_before_seconds)
                .collect(),
        );
        let cut_ms = median(
            run.spoken
                .iter()
                .filter_map(|s| s.pause_at_cut_seconds.map(|p| 1000.0 * p))
                .collect(),
        );
        table.rows.push(vec![
            voice.clone(),
            format!("{:.2}", run.load_seconds),
            format!("{:.3}", rtfs.iter().sum::<f64>() / rtfs.len().max(1) as f64),
            format!("{:.3}", rtfs.iter().copied().fold(0.0, f64::max)),
            format!("{:.0}", first_ms(&|_| true)),
            format!("{:.0}", first_ms(&twelve_words)),
            format!("{first_word_ms:.0}"),
            format!("{silence_ms:.0}"),
            match cut_ms.is_nan() {
                true => "–".into(),
                false => format!("{cut_ms:.0}"),
            },
            format!("{:.0}", run.peak_mib),
            format!("{:.1} %", 100.0 * errors as f64 / words.max(1) as f64),
        ]);
    }
    section.notes.push(
        "espeak-ng runs as a program of its own: its peak memory is the benchmark process's, not \
         the synthesizer's."
            .into(),
    );
    section.tables.push(table);
    section.details.push(details);
    Ok(section)
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
