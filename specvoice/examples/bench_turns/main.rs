//! Benchmark of end-of-turn policies (issue 75), every policy on the same recordings in one
//! run: the turn-taking set ([`set`]: `turns.txt`, everyday questions, a third complete, the
//! rest with 300–900 ms pauses at hesitation points or fillers, spoken by three Kokoro voices
//! and espeak-ng, clean and in white, pink and babble noise at 10 dB SNR) is played into the
//! voice pipeline (streaming Whisper, the chat model, the answer's voice) on a simulated clock
//! with each policy: a fixed 500 ms or 300 ms silence, and the semantic end of turn (the chat
//! model's end-of-turn probability for each pause's transcript sets the silence), each with
//! PredGen and the plain cascade. Measured: end of speech → first audio (median, p90), pauses
//! cut by a declared end (cut-ins), answers begun to a cut question, late ends, answers equal
//! to the reference (a fixed silence as long as the semantic policy's longest wait, which no
//! pause reaches), and the voice-activity detector's cost on every copy.
//!
//! ```sh
//! cargo run --release -p specvoice --example bench_turns -- [--limit N] [--noisy]
//!     [--model NAME] [--whisper whisper-tiny.en-ct2] [--voice auto] [--json PATH]
//! cargo run --release -p specvoice --example bench_turns -- --make-set [--set-dir DIR]
//!     [--voices kokoro:af_heart,kokoro:am_michael,kokoro:bf_emma,espeak]
//!     [--asr whisper-base-ct2]
//! ```
//!
//! `--make-set` makes the set (or loads it from its folder), checks it and prints a summary;
//! the benchmark makes it too when it is missing. The checks fail the program: each utterance
//! is `turns.txt`'s line with its pauses of the marked length; in the clean version the audio
//! reaches the voiced threshold at both ends of every voiced span and stays below it outside
//! them (so the pauses and the end of speech are where the ground truth says); every noisy copy
//! has the clean version's ground truth and an SNR of 10 ± 0.5 dB measured back from its
//! samples. Whisper's word error rate on the clean versions is reported by voice.
//!
//! The pure parts (parsing, noise, mixing, the voiced extent) are tested by
//! `cargo test --release -p specvoice --example bench_turns`.
//!
//! `cargo xtask bench turns` runs it and files the results with the machine and date.

mod policies;
mod set;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::wer::word_errors;
use engine_asr::{LoadOptions, TranscribeOptions, Transcriber};
use engine_tts::voices::VoiceChoice;
use spec_cli::{init_logging, progress_bar};
use spec_core::report::{Report, Table};
use spec_models::{Registry, Store};
use tracing::warn;

use set::{Noise, TurnSet, TurnUtterance};

#[derive(Parser)]
struct Args {
    /// Make the turn-taking set (or load it from its folder), check it and print a summary
    #[arg(long)]
    make_set: bool,

    /// The set's folder (default: `turn-set` in the target folder this program was built in)
    #[arg(long)]
    set_dir: Option<PathBuf>,

    /// The voices that speak the set, in rotation, by the names `specvoice --voice` takes
    #[arg(long, num_args = 1.., value_delimiter = ',', default_values = set::DEFAULT_VOICES)]
    voices: Vec<String>,

    /// The Whisper model that transcribes the clean versions (`--make-set`)
    #[arg(long, default_value = "whisper-base-ct2")]
    asr: String,

    /// The pipeline's Whisper model
    #[arg(long, default_value = "whisper-tiny.en-ct2")]
    whisper: String,

    /// The chat model
    #[arg(long, default_value = spec_cli::DEFAULT_MODEL)]
    model: String,

    /// The answers' voice: auto (Kokoro's af_heart when its files are in the models folder,
    /// espeak-ng otherwise, as the pipeline's default), or a name `specvoice --voice` takes
    #[arg(long, default_value = "auto")]
    voice: String,

    /// Most tokens per answer
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,

    /// Play only N utterances of the set through the pipeline, evenly spread over it
    #[arg(long)]
    limit: Option<usize>,

    /// Also play the noisy copies through the pipeline (the VAD is measured on them always)
    #[arg(long)]
    noisy: bool,

    /// The policies compared: fixed500, fixed300, silero500, semantic, semantic-last-word (the
    /// semantic policy weighing Whisper's probability of the last word), silero-semantic (the
    /// product's default)
    #[arg(long, num_args = 1.., value_delimiter = ',', default_values = ["fixed500", "fixed300", "silero500", "semantic", "silero-semantic"])]
    policies: Vec<String>,

    /// Only utterances of this kind (complete, paused, filler)
    #[arg(long)]
    kind: Option<String>,

    /// Also write the report as JSON here
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A voice whose clean versions Whisper gets more words wrong of than this is called badly
/// intelligible.
const BAD_WER: f64 = 0.15;

/// How far from [`set::SNR_DB`] a noisy copy's measured SNR may be, in dB.
const SNR_TOLERANCE_DB: f64 = 0.5;

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let models = spec_models::models_dir()?;
    let dir = match &args.set_dir {
        Some(dir) => dir.clone(),
        None => default_set_dir()?,
    };
    let voices = args
        .voices
        .iter()
        .map(|name| name.parse::<VoiceChoice>())
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let set = set::load_or_make(&dir, &models, &voices)?;
    let took = started.elapsed();
    if !args.make_set {
        return bench(&args, &set, &models);
    }

    println!("{}\n", summary(&set, &dir, took));
    check_ground_truth(&set)?;
    println!(
        "Ground truth checked: every utterance is its line of turns.txt with pauses of the \
         marked length, its clean audio is voiced (within {} dB of its piece's peak) exactly \
         between the edges of the ground truth, and its noisy copies share them.\n",
        -set::VOICED_THRESHOLD_DB
    );
    println!("{}", check_snr(&set)?.markdown());
    for table in transcribe(&set, &models, &args.asr)? {
        if !table.rows.is_empty() {
            println!("{}", table.markdown());
        }
    }
    Ok(())
}

/// `turn-set` in the target folder of this program (`TARGET/release/examples/bench_turns`).
fn default_set_dir() -> Result<PathBuf> {
    let program = std::env::current_exe()?;
    let target = program
        .ancestors()
        .nth(3)
        .with_context(|| format!("no target folder above {}", program.display()))?;
    Ok(target.join("turn-set"))
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// The set's size, make-up and pauses, and where it is.
fn summary(set: &TurnSet, dir: &Path, took: Duration) -> String {
    let clean: Vec<&TurnUtterance> = clean_versions(set).collect();
    let seconds: f64 = set
        .utterances
        .iter()
        .map(|u| u.samples.len() as f64 / f64::from(set::SAMPLE_RATE))
        .sum();
    let count_by = |key: &dyn Fn(&TurnUtterance) -> String| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for u in &clean {
            *counts.entry(key(u)).or_default() += 1;
        }
        counts
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let pauses: Vec<f64> = clean
        .iter()
        .flat_map(|u| u.pauses.iter().map(|&(start, end)| ms(end - start)))
        .collect();
    let speech: Vec<f64> = clean
        .iter()
        .map(|u| ms(u.speech_end - u.speech_start))
        .collect();
    let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len().max(1) as f64;
    let extreme = |values: &[f64], f: fn(f64, f64) -> f64| values.iter().copied().reduce(f);
    format!(
        "The turn set in {}: {} utterances × {} versions ({}) = {} recordings, {:.1} min of audio \
         ({:.1} min clean), ready in {:.1} s. Kinds: {}. Voices: {}. Speech {:.1} s on average \
         (from {:.0} ms of leading silence; {:.0} ms of silence after it); {} pauses of {:.0} to \
         {:.0} ms, {:.0} ms on average.",
        dir.display(),
        clean.len(),
        Noise::ALL.len(),
        Noise::ALL.map(|n| n.to_string()).join(", "),
        set.utterances.len(),
        seconds / 60.0,
        seconds / 60.0 / Noise::ALL.len() as f64,
        took.as_secs_f64(),
        count_by(&|u| u.kind.to_string()),
        count_by(&|u| u.voice.clone()),
        mean(&speech) / 1e3,
        ms(set::LEAD),
        ms(set::TAIL),
        pauses.len(),
        extreme(&pauses, f64::min).unwrap_or(0.0),
        extreme(&pauses, f64::max).unwrap_or(0.0),
        mean(&pauses),
    )
}

fn clean_versions(set: &TurnSet) -> impl Iterator<Item = &TurnUtterance> {
    set.utterances.iter().filter(|u| u.noise == Noise::Clean)
}

/// The set's utterances by id, each with its versions in the order of [`Noise::ALL`].
fn by_utterance(set: &TurnSet) -> Result<Vec<&[TurnUtterance]>> {
    let groups: Vec<&[TurnUtterance]> = set.utterances.chunks(Noise::ALL.len()).collect();
    for group in &groups {
        ensure!(
            group.iter().map(|u| u.noise).eq(Noise::ALL)
                && group.iter().all(|u| u.id == group[0].id),
            "the versions of {} are not in order",
            group[0].id
        );
    }
    Ok(groups)
}

/// The silent parts of a recording of `len` samples whose voiced audio is `voiced`.
fn silences(voiced: &[Range<usize>], len: usize) -> Vec<Range<usize>> {
    let mut starts = vec![0];
    let mut ends = Vec::new();
    for range in voiced {
        ends.push(range.start);
        starts.push(range.end);
    }
    ends.push(len);
    starts.into_iter().zip(ends).map(|(s, e)| s..e).collect()
}

/// Fails unless every utterance is its line of `turns.txt`, its clean audio is voiced exactly
/// where the ground truth says, and its noisy copies share that ground truth.
fn check_ground_truth(set: &TurnSet) -> Result<()> {
    let turns = set::parse_turns(set::TURNS)?;
    let groups = by_utterance(set)?;
    ensure!(
        groups.len() == turns.len(),
        "{} utterances for {} lines",
        groups.len(),
        turns.len()
    );
    let threshold = 10f32.powf(set::VOICED_THRESHOLD_DB / 20.0);
    for (group, turn) in groups.iter().zip(&turns) {
        let clean = &group[0];
        let id = &clean.id;
        ensure!(
            clean.kind == turn.kind && clean.question == turn.question(),
            "{id} is not its line of turns.txt"
        );
        let lengths: Vec<Duration> = clean.pauses.iter().map(|&(s, e)| e - s).collect();
        let marked: Vec<Duration> = turn
            .pauses_ms
            .iter()
            .map(|&ms| Duration::from_millis(u64::from(ms)))
            .collect();
        ensure!(
            lengths == marked,
            "{id}: pauses of {lengths:?}, marked {marked:?}"
        );
        ensure!(
            clean.speech_start == set::LEAD
                && clean.speech_end + set::TAIL
                    == specvoice::endpoint::duration_of(clean.samples.len()),
            "{id}: the speech is not between the leading silence and the tail"
        );
        let voiced = clean.voiced();
        for range in &voiced {
            ensure!(
                set::voiced_extent(&clean.samples[range.clone()], set::VOICED_THRESHOLD_DB)
                    == Some(0..range.len()),
                "{id}: the voiced audio at {range:?} does not reach the threshold at its ends"
            );
        }
        let peak = |ranges: &[Range<usize>]| {
            ranges
                .iter()
                .flat_map(|r| &clean.samples[r.clone()])
                .fold(0f32, |peak, s| peak.max(s.abs()))
        };
        let (speech_peak, silence_peak) =
            (peak(&voiced), peak(&silences(&voiced, clean.samples.len())));
        ensure!(
            silence_peak < speech_peak * threshold,
            "{id}: voiced audio in the pauses or the silence around the speech"
        );
        for copy in &group[1..] {
            ensure!(
                copy.pauses == clean.pauses
                    && copy.speech_start == clean.speech_start
                    && copy.speech_end == clean.speech_end
                    && copy.samples.len() == clean.samples.len()
                    && copy.question == clean.question
                    && copy.voice == clean.voice,
                "{id}: the {} copy's ground truth is not the clean version's",
                copy.noise
            );
        }
    }
    Ok(())
}

/// The SNR of every noisy copy measured back from its samples, against the clean version
/// (exact: the noise is the copy minus the clean version) and from the copy alone (the noise
/// power in the silences, the speech power in the voiced audio less it); fails unless every
/// exact one is within [`SNR_TOLERANCE_DB`] of [`set::SNR_DB`].
fn check_snr(set: &TurnSet) -> Result<Table> {
    let mut measured: BTreeMap<Noise, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for group in by_utterance(set)? {
        let clean = &group[0];
        let voiced = clean.voiced();
        let silent = silences(&voiced, clean.samples.len());
        for copy in &group[1..] {
            let exact = set::snr_db(&clean.samples, &copy.samples, &voiced);
            ensure!(
                (exact - set::SNR_DB).abs() <= SNR_TOLERANCE_DB,
                "{} {}: {exact:.2} dB SNR",
                clean.id,
                copy.noise
            );
            let noise = set::power(&copy.samples, &silent);
            let speech = set::power(&copy.samples, &voiced) - noise;
            let blind = 10.0 * (speech / noise).log10();
            let (exacts, blinds) = measured.entry(copy.noise).or_default();
            exacts.push(exact);
            blinds.push(blind);
        }
    }
    let mut table = Table::new(
        format!(
            "SNR of the noisy copies, measured back (target {} dB): against the clean version, \
             and from the copy alone (noise power in the silences, speech power in the voiced \
             audio less it)",
            set::SNR_DB
        ),
        &[
            "noise",
            "copies",
            "exact: min",
            "exact: max",
            "from the copy alone: mean",
            "min",
            "max",
        ],
    );
    let stats = |values: &[f64]| {
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        (min, mean, max)
    };
    for (noise, (exacts, blinds)) in &measured {
        let (exact_min, _, exact_max) = stats(exacts);
        let (blind_min, blind_mean, blind_max) = stats(blinds);
        table.push(vec![
            noise.to_string(),
            exacts.len().to_string(),
            format!("{exact_min:.3}"),
            format!("{exact_max:.3}"),
            format!("{blind_mean:.2}"),
            format!("{blind_min:.2}"),
            format!("{blind_max:.2}"),
        ]);
    }
    Ok(table)
}

/// Whisper's word error rate on the clean versions, by voice, and what it misheard.
fn transcribe(set: &TurnSet, models: &Path, asr: &str) -> Result<[Table; 2]> {
    let store = Store::new(models.to_path_buf(), Registry::builtin());
    let files = store.resolve(asr)?;
    let mut whisper = Transcriber::load(&files.dir, &LoadOptions::default())
        .with_context(|| format!("loading {}", files.dir.display()))?;
    let normalizer = EnglishTextNormalizer::from_file(&store.data_file("whisper/english.json")?)?;
    let options = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    let clean: Vec<&TurnUtterance> = clean_versions(set).collect();
    let bar = progress_bar(clean.len(), format!("transcribing with {asr}"));
    // Per voice: utterances, words, errors, utterances heard without an error.
    let mut by_voice: BTreeMap<&str, (usize, usize, usize, usize)> = BTreeMap::new();
    let mut misheard = Table::new(
        format!("The clean versions {asr} did not hear word for word"),
        &["id", "voice", "said", "heard", "word errors"],
    );
    for utterance in clean {
        let heard = whisper.transcribe(&utterance.samples, &options)?.text;
        let said = normalizer.normalize(&utterance.question);
        let errors = word_errors(&said, &normalizer.normalize(&heard)).errors();
        let counts = by_voice.entry(&utterance.voice).or_default();
        counts.0 += 1;
        counts.1 += said.split_whitespace().count();
        counts.2 += errors;
        if errors == 0 {
            counts.3 += 1;
        } else {
            misheard.push(vec![
                utterance.id.clone(),
                utterance.voice.clone(),
                utterance.question.clone(),
                heard.trim().to_string(),
                errors.to_string(),
            ]);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut table = Table::new(
        format!(
            "Intelligibility of the clean versions: {asr}'s transcript against the question, \
             both through Whisper's English normalizer (which drops \"um\" and \"uh\")"
        ),
        &[
            "voice",
            "utterances",
            "words",
            "WER %",
            "heard word for word",
        ],
    );
    for (voice, (utterances, words, errors, exact)) in &by_voice {
        let wer = *errors as f64 / (*words).max(1) as f64;
        if wer > BAD_WER {
            warn!(
                "{voice} is badly intelligible: {asr} gets {:.0} % of its words wrong",
                100.0 * wer
            );
        }
        table.push(vec![
            voice.to_string(),
            utterances.to_string(),
            words.to_string(),
            format!("{:.1}", 100.0 * wer),
            format!("{exact}/{utterances}"),
        ]);
    }
    Ok([table, misheard])
}

/// The benchmark: the VAD on every copy, then every policy with PredGen and the cascade on the
/// utterances played through the pipeline, against the long-silence reference.
fn bench(args: &Args, set: &TurnSet, models: &Path) -> Result<()> {
    let store = Store::new(models.to_path_buf(), Registry::builtin());
    let whisper_dir = store.resolve(&args.whisper)?.dir;
    let mut whisper = Some(
        Transcriber::load(&whisper_dir, &LoadOptions::default())
            .with_context(|| format!("loading {}", whisper_dir.display()))?,
    );
    let mut model = spec_cli::open_model(&args.model, &engine_llm::LoadOptions::default())?;
    let voice_choice = args.voice.parse::<VoiceChoice>()?.resolve(models)?;
    let voice = engine_tts::voices::open_shared(&voice_choice, models)
        .with_context(|| format!("opening the voice {voice_choice}"))?;
    let predgen = engine_llm::PredGenConfig {
        max_answer_tokens: args.max_tokens,
        ..engine_llm::PredGenConfig::default()
    };
    let base = specvoice::ListenerConfig::default();
    let silero = models.join("silero-vad").join(engine_asr::vad::MODEL_FILE);
    let compared = args
        .policies
        .iter()
        .map(|name| {
            Ok(match name.as_str() {
                "fixed500" => policies::Policy::fixed(500, &base),
                "fixed300" => policies::Policy::fixed(300, &base),
                "silero500" => policies::Policy::silero_fixed(500, &silero, &base),
                "semantic" => {
                    policies::Policy::semantic(specvoice::SemanticTurnEnd::default(), &base)
                }
                "semantic-last-word" => {
                    let mut policy = policies::Policy::semantic(
                        specvoice::SemanticTurnEnd {
                            weigh_last_word: true,
                            ..Default::default()
                        },
                        &base,
                    );
                    policy.name = "semantic, last word weighed".into();
                    policy
                }
                "silero-semantic" => {
                    let mut policy = policies::Policy::silero_fixed(500, &silero, &base);
                    policy.listener.turn_end =
                        specvoice::TurnEnd::Semantic(specvoice::SemanticTurnEnd::default());
                    policy.name = "Silero + semantic".into();
                    policy
                }
                other => anyhow::bail!("unknown policy `{other}`"),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // The reference of each voice-activity detector the policies use: a long fixed silence
    // after that detector's speech (another detector hears other utterance bounds, so Whisper
    // other audio).
    let mut references: Vec<policies::Policy> = Vec::new();
    for policy in &compared {
        let vad = &policy.listener.endpoint.vad;
        if !references.iter().any(|r| &r.listener.endpoint.vad == vad) {
            let mut reference = policies::Policy::long_silence(&base);
            reference.listener.endpoint.vad = vad.clone();
            references.push(reference);
        }
    }
    let reference_of: Vec<usize> = compared
        .iter()
        .map(|p| {
            references
                .iter()
                .position(|r| r.listener.endpoint.vad == p.listener.endpoint.vad)
                .expect("every detector has its reference")
        })
        .collect();
    let candidates: Vec<&TurnUtterance> = set
        .utterances
        .iter()
        .filter(|u| args.noisy || u.noise == Noise::Clean)
        .filter(|u| {
            args.kind
                .as_ref()
                .is_none_or(|kind| format!("{:?}", u.kind).eq_ignore_ascii_case(kind))
        })
        .collect();
    // With a limit, utterances evenly spread over the set (its kinds come in blocks).
    let wanted = args.limit.unwrap_or(candidates.len()).min(candidates.len());
    let played: Vec<&TurnUtterance> = (0..wanted)
        .map(|i| candidates[i * candidates.len() / wanted.max(1)])
        .collect();
    let modes = [specvoice::ChatMode::PredGen, specvoice::ChatMode::Cascade];
    let bar = progress_bar(
        played.len() * (references.len() + compared.len() * modes.len()),
        "end-of-turn policies",
    );
    // outcomes[policy][mode][utterance], heard[reference][utterance]
    let mut outcomes = vec![vec![Vec::new(); modes.len()]; compared.len()];
    let mut heard = vec![Vec::new(); references.len()];
    for utterance in &played {
        let spoken = policies::Spoken {
            samples: &utterance.samples,
            pauses: &utterance.pauses,
        };
        let mut play = |policy: &policies::Policy, mode| {
            policies::play(
                policy,
                mode,
                &spoken,
                &mut whisper,
                &mut model,
                &predgen,
                Box::new(voice.clone()),
            )
        };
        for (reference, runs) in references.iter().zip(&mut heard) {
            runs.push(play(reference, specvoice::ChatMode::Cascade)?);
            bar.inc(1);
        }
        for (p, policy) in compared.iter().enumerate() {
            for (m, &mode) in modes.iter().enumerate() {
                outcomes[p][m].push(play(policy, mode)?);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();

    let mut report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        ..Report::default()
    };
    let reference_runs: Vec<&[policies::Outcome]> =
        reference_of.iter().map(|&r| heard[r].as_slice()).collect();
    report.tables.push(policy_table(
        &compared,
        &modes,
        &outcomes,
        &reference_runs,
        &played,
        &voice_choice.to_string(),
    ));
    if let Some(semantic) = compared.iter().position(|p| p.name == "semantic") {
        report
            .tables
            .push(estimate_table(&outcomes[semantic][0], &played));
        report.details.push(detail_table(
            &outcomes[semantic][0],
            reference_runs[semantic],
            &played,
        ));
    }
    report.tables.push(vad_table(set, &silero)?);
    report.notes.push(format!(
        "Every utterance is a fresh conversation played into the pipeline on a simulated clock: \
         audio arrives in 20 ms packets at its real time, and Whisper ({}), the chat model ({}) \
         and the voice ({voice_choice}) charge their measured compute to one timeline, as they \
         share the CPU. Latency is from the end of speech (the set's ground truth: the end of the \
         last voiced audio, whatever the detector heard) to the first audio of the answer to the \
         whole question; endpointing is the part until the end of the turn was declared. A cut-in is an end of \
         turn declared inside a pause of the speaker (per pause); an answer begun to a cut \
         question is one whose audio was ready before the speaker went on. A late end is one \
         declared a second or more after the speech. The reference is a fixed {} ms silence \
         after the same voice-activity detector, answered by the cascade: same answer counts the \
         turns whose last answer is the reference's, word for word.",
        args.whisper,
        args.model,
        specvoice::SemanticTurnEnd::default().longest.as_millis(),
    ));
    print!("{}", report.markdown());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// The value at quantile `q` of `values` (nearest rank), `NaN` for none.
fn quantile(mut values: Vec<f64>, q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn percent(count: usize, total: usize) -> String {
    if total == 0 {
        return "–".into();
    }
    format!(
        "{count}/{total} ({:.0} %)",
        100.0 * count as f64 / total as f64
    )
}

fn policy_table(
    policies: &[policies::Policy],
    modes: &[specvoice::ChatMode],
    outcomes: &[Vec<Vec<policies::Outcome>>],
    references: &[&[policies::Outcome]],
    played: &[&TurnUtterance],
    voice: &str,
) -> Table {
    let pauses: usize = played.iter().map(|u| u.pauses.len()).sum();
    let mut table = Table::new(
        format!(
            "End-of-turn policies: end of speech → first audio, {} utterances ({} pauses), voice {voice}",
            played.len(),
            pauses
        ),
        &[
            "policy",
            "answered by",
            "median latency (ms)",
            "p90 latency (ms)",
            "median endpointing (ms)",
            "cut-ins (per pause)",
            "answers begun to a cut question",
            "late or missed ends",
            "same answer as the reference",
        ],
    );
    for ((policy, by_mode), references) in policies.iter().zip(outcomes).zip(references) {
        for (mode, runs) in modes.iter().zip(by_mode) {
            // From the true end of speech (the set's ground truth), whatever the detector heard.
            let turns: Vec<(&specvoice::VoiceTurn, Duration)> = runs
                .iter()
                .zip(played)
                .filter_map(|(o, u)| o.last_turn.as_ref().map(|t| (t, u.speech_end)))
                .collect();
            let latencies: Vec<f64> = turns
                .iter()
                .map(|(t, end)| ms(t.first_audio_at.saturating_sub(*end)))
                .collect();
            let endpointing: Vec<f64> = turns
                .iter()
                .map(|(t, end)| ms(t.endpoint_at.saturating_sub(*end)))
                .collect();
            let late = runs
                .iter()
                .zip(played)
                .filter(|(o, u)| {
                    o.last_turn.as_ref().is_none_or(|t| {
                        t.endpoint_at.saturating_sub(u.speech_end) >= Duration::from_secs(1)
                    })
                })
                .count();
            let same = runs
                .iter()
                .zip(references.iter())
                .filter(|(o, r)| match (&o.last_turn, &r.last_turn) {
                    (Some(a), Some(b)) => a.turn.answer == b.turn.answer,
                    _ => false,
                })
                .count();
            table.push(vec![
                policy.name.clone(),
                format!("{mode:?}"),
                format!("{:.0}", quantile(latencies.clone(), 0.5)),
                format!("{:.0}", quantile(latencies, 0.9)),
                format!("{:.0}", quantile(endpointing, 0.5)),
                percent(runs.iter().map(|o| o.cut_pauses).sum(), pauses),
                runs.iter()
                    .map(|o| o.wrong_answers_begun)
                    .sum::<usize>()
                    .to_string(),
                percent(late, runs.len()),
                percent(same, runs.len()),
            ]);
        }
    }
    table
}

/// Every utterance with the semantic policy and PredGen: the question heard, the reference's,
/// the pauses cut and the latency.
fn detail_table(
    runs: &[policies::Outcome],
    references: &[policies::Outcome],
    played: &[&TurnUtterance],
) -> Table {
    let mut table = Table::new(
        "Every utterance, semantic end of turn with PredGen",
        &[
            "utterance",
            "voice, noise",
            "question heard",
            "the reference heard",
            "pauses cut",
            "estimates (P)",
            "latency (ms)",
            "same answer",
        ],
    );
    let question = |o: &policies::Outcome| {
        o.last_turn
            .as_ref()
            .map_or_else(|| "(none)".to_string(), |t| t.turn.question.clone())
    };
    for ((run, reference), utterance) in runs.iter().zip(references).zip(played) {
        let same = match (&run.last_turn, &reference.last_turn) {
            (Some(a), Some(b)) => a.turn.answer == b.turn.answer,
            _ => false,
        };
        table.push(vec![
            utterance.id.clone(),
            format!("{}, {:?}", utterance.voice, utterance.noise),
            question(run),
            question(reference),
            format!("{}/{}", run.cut_pauses, utterance.pauses.len()),
            run.estimates
                .iter()
                .map(|(p, _)| format!("{p:.2}"))
                .collect::<Vec<_>>()
                .join(" "),
            run.last_turn.as_ref().map_or("–".into(), |t| {
                format!(
                    "{:.0}",
                    ms(t.first_audio_at.saturating_sub(utterance.speech_end))
                )
            }),
            same.to_string(),
        ]);
    }
    table
}

/// The semantic policy's estimates: the end-of-turn probability the model gave the pauses'
/// transcripts, by kind of utterance: at the last (the real end) and at the others.
fn estimate_table(runs: &[policies::Outcome], played: &[&TurnUtterance]) -> Table {
    let mut table = Table::new(
        "Semantic end of turn: the model's end-of-turn probability for the transcripts of pauses",
        &[
            "utterances",
            "estimates",
            "median P at the real end",
            "median P in mid-sentence pauses",
            "median wait at the real end (ms)",
        ],
    );
    /// One kind's estimates: at the real end, in pauses, the waits at the end, how many.
    #[derive(Default)]
    struct Estimates {
        at_end: Vec<f64>,
        in_pauses: Vec<f64>,
        waits: Vec<f64>,
        count: usize,
    }
    let mut by_kind: BTreeMap<String, Estimates> = BTreeMap::new();
    for (run, utterance) in runs.iter().zip(played) {
        let entry = by_kind.entry(format!("{:?}", utterance.kind)).or_default();
        entry.count += run.estimates.len();
        if let Some((&(p, wait), earlier)) = run.estimates.split_last() {
            entry.at_end.push(f64::from(p));
            entry.waits.push(ms(wait));
            entry
                .in_pauses
                .extend(earlier.iter().map(|&(p, _)| f64::from(p)));
        }
    }
    for (kind, estimates) in by_kind {
        table.push(vec![
            kind,
            estimates.count.to_string(),
            format!("{:.2}", quantile(estimates.at_end, 0.5)),
            format!("{:.2}", quantile(estimates.in_pauses, 0.5)),
            format!("{:.0}", quantile(estimates.waits, 0.5)),
        ]);
    }
    table
}

/// Each voice-activity detector with a fixed 500 ms silence on every copy: pauses cut, ends
/// found, utterances found beyond the one spoken, and its cost.
fn vad_table(set: &TurnSet, silero: &Path) -> Result<Table> {
    let mut table = Table::new(
        "Voice activity on clean and noisy copies (fixed 500 ms silence)",
        &[
            "VAD",
            "copies",
            "cut-ins (per pause)",
            "ends found within 200 ms",
            "extra utterances",
            "CPU per second of audio (ms)",
        ],
    );
    let detectors = [
        ("energy", specvoice::EndpointConfig::default()),
        (
            "Silero",
            specvoice::EndpointConfig {
                vad: specvoice::Vad::Silero(specvoice::SileroSettings::new(silero.to_path_buf())),
                ..specvoice::EndpointConfig::default()
            },
        ),
    ];
    for (name, config) in &detectors {
        for noise in Noise::ALL {
            let copies: Vec<&TurnUtterance> =
                set.utterances.iter().filter(|u| u.noise == noise).collect();
            let pauses: usize = copies.iter().map(|u| u.pauses.len()).sum();
            let (mut cut, mut found, mut extra) = (0, 0, 0);
            let (mut compute, mut seconds) = (Duration::ZERO, 0.0);
            for copy in &copies {
                let (boundaries, took) = policies::detect(config, &copy.samples)?;
                compute += took;
                seconds += copy.samples.len() as f64 / 16_000.0;
                let mut ends = Vec::new();
                let mut starts = 0usize;
                for boundary in boundaries {
                    match boundary {
                        specvoice::Boundary::Started { .. } => starts += 1,
                        specvoice::Boundary::Ended { speech_end, .. } => ends.push(speech_end),
                    }
                }
                let cuts = copy
                    .pauses
                    .iter()
                    .filter(|&&(start, end)| {
                        ends.iter()
                            .any(|&e| e + Duration::from_millis(100) >= start && e < end)
                    })
                    .count();
                cut += cuts;
                if ends.iter().any(|&e| {
                    e.max(copy.speech_end) - e.min(copy.speech_end) <= Duration::from_millis(200)
                }) {
                    found += 1;
                }
                // Each cut pause starts one more utterance; any other start is noise taken
                // for speech.
                extra += starts.saturating_sub(1 + cuts);
            }
            table.push(vec![
                name.to_string(),
                format!("{noise:?} ({})", copies.len()),
                percent(cut, pauses),
                percent(found, copies.len()),
                extra.to_string(),
                format!("{:.2}", compute.as_secs_f64() * 1e3 / seconds.max(1e-9)),
            ]);
        }
    }
    Ok(table)
}
