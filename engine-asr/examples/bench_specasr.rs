//! Benchmark of SpecASR ("SpecASR: Accelerating LLM-based Automatic Speech Recognition via
//! Speculative Decoding") on Whisper: greedy decoding against plain speculative decoding (fixed
//! γ) and SpecASR's mechanisms added one at a time (adaptive length, then draft recycling, then
//! the two-pass sparse tree where the draft shares the target's vocabulary), in the same run,
//! on the real clips and on sentences spoken by espeak-ng. Reports decoder time (the draft's
//! decoding included) and speed-up, the draft's encoder, target forwards per word, the draft's
//! share of the time, tokens per verification and identical transcripts, and the cost of one
//! draft step against one target step (what bounds the speed-up on this CPU).
//!
//! ```sh
//! cargo run --release -p engine-asr --example bench_specasr -- [--target whisper-base-ct2]
//!     [--draft whisper-tiny.en-ct2] [--repeats 3] [--json PATH]
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::{LoadOptions, TranscribeOptions, Transcriber};
use spec_core::report::{ratio, speedup, Report, Table};
use spec_core::{DecodeStats, SpecAsrConfig};
use spec_models::{Registry, Store};

#[allow(dead_code)]
#[path = "common/speech_sets.rs"]
mod speech_sets;
use speech_sets::{clips, fastest_transcript, spoken_set, Clip};

#[derive(Parser, Debug)]
#[command(about = "Whisper with SpecASR against greedy decoding and plain speculation")]
struct Args {
    /// Target model (a name in the models folder).
    #[arg(long, default_value = "whisper-base-ct2")]
    target: String,
    /// Draft model; with another vocabulary it drafts text.
    #[arg(long, default_value = "whisper-tiny.en-ct2")]
    draft: String,
    /// Runs per clip and system; the fastest decoder time counts.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Sentences of the spoken test set.
    #[arg(long, default_value_t = 40)]
    spoken_sentences: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Default)]
struct Outcome {
    texts: Vec<String>,
    forwards: usize,
    decoder_time: Duration,
    draft_encoder_time: Duration,
    draft: DecodeStats,
    drafted_windows: usize,
    windows: usize,
    drafted_tokens: usize,
    recycled_tokens: usize,
}

const COLUMNS: [&str; 12] = [
    "decoding",
    "windows drafted (all runs)",
    "decoder time",
    "speed-up",
    "draft encoder",
    "speed-up with it",
    "target forwards/word",
    "draft share",
    "tokens/verification",
    "recycled draft tokens",
    "draft step ÷ target step",
    "same text as greedy",
];

fn run(
    transcriber: &mut Transcriber,
    draft: Option<SpecAsrConfig>,
    clips: &[Clip],
    repeats: usize,
) -> Result<Outcome> {
    let options = TranscribeOptions {
        language: Some("en".into()),
        temperatures: vec![0.0],
        draft,
        ..TranscribeOptions::default()
    };
    transcriber.reset_draft_policy();
    let counts_before = transcriber.draft_counts().unwrap_or_default();
    let mut outcome = Outcome::default();
    for clip in clips {
        let t = fastest_transcript(
            transcriber,
            &clip.samples,
            &options,
            repeats,
            |s| s.decoder_time,
            &mut |t| {
                outcome.drafted_windows += t.stats.drafted_windows;
                outcome.windows += t.stats.windows;
            },
        )?;
        outcome.forwards += t.stats.forwards;
        outcome.decoder_time += t.stats.decoder_time;
        outcome.draft_encoder_time += t.stats.draft_encoder_time;
        outcome.draft.merge(&t.stats.draft);
        outcome.texts.push(t.text);
    }
    let counts = transcriber.draft_counts().unwrap_or_default();
    outcome.drafted_tokens = counts.drafted - counts_before.drafted;
    outcome.recycled_tokens = counts.recycled - counts_before.recycled;
    Ok(outcome)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let normalizer = EnglishTextNormalizer::from_file(&store.data_file("whisper/english.json")?)?;
    let real = clips(&store)?;
    let spoken_dir = tempfile::tempdir()?;
    let Some(spoken) = spoken_set(&store, args.spoken_sentences, spoken_dir.path())? else {
        bail!("the spoken test set needs espeak-ng: apt-get install espeak-ng");
    };
    let target_dir = store.resolve(&args.target)?.dir;
    let draft_dir = store.resolve(&args.draft)?.dir;
    let mut transcriber = Transcriber::load(&target_dir, &LoadOptions::default())?;
    let draft = Transcriber::load(&draft_dir, &LoadOptions::default())?;
    let same_vocabulary = transcriber.tokenizer().same_vocabulary(draft.tokenizer());
    if same_vocabulary {
        transcriber.set_draft(draft)?;
    } else {
        transcriber.set_text_draft(draft)?;
    }
    let mut systems: Vec<(String, Option<SpecAsrConfig>)> = vec![
        ("greedy".into(), None),
        ("speculative, γ = 4".into(), Some(SpecAsrConfig::plain(4))),
        ("speculative, γ = 8".into(), Some(SpecAsrConfig::plain(8))),
        (
            "+ adaptive length (0.4, ≤ 24)".into(),
            Some(SpecAsrConfig::adaptive()),
        ),
        ("+ draft recycling".into(), Some(SpecAsrConfig::recycling())),
    ];
    if same_vocabulary {
        systems.push((
            "+ two-pass sparse tree".into(),
            Some(SpecAsrConfig::sparse_tree()),
        ));
    }
    systems.push((
        "SpecASR, cost-aware (the default)".into(),
        Some(SpecAsrConfig::default()),
    ));
    let mut tables = Vec::new();
    for (set, clips) in [
        ("the real clips of data/speech", &real),
        ("MT-Bench sentences spoken by espeak-ng", &spoken),
    ] {
        let seconds: f64 = clips.iter().map(|c| c.seconds).sum();
        let mut table = Table::new(
            format!(
                "{} drafted by {} ({}) on {set} ({} clips, {seconds:.1} s), best of {} run(s) per clip, 2 threads",
                args.target,
                args.draft,
                if same_vocabulary { "same vocabulary" } else { "text drafts" },
                clips.len(),
                args.repeats
            ),
            &COLUMNS,
        );
        eprintln!("== {set}");
        let mut outcomes = Vec::new();
        for (name, config) in &systems {
            eprintln!("   {name}");
            outcomes.push(run(&mut transcriber, *config, clips, args.repeats)?);
        }
        let words: usize = clips
            .iter()
            .map(|c| {
                normalizer
                    .normalize(&c.reference)
                    .split_whitespace()
                    .count()
            })
            .sum();
        let greedy = &outcomes[0];
        let target_step = greedy.decoder_time.as_secs_f64() / greedy.forwards.max(1) as f64;
        for ((name, config), o) in systems.iter().zip(&outcomes) {
            let same = o
                .texts
                .iter()
                .zip(&greedy.texts)
                .filter(|(a, b)| a == b)
                .count();
            let steps = o.draft.steps.len().max(1) as f64;
            let tokens: usize = o.draft.steps.iter().map(|s| s.accepted + 1).sum();
            let draft_step =
                o.draft.draft_time.as_secs_f64() / o.draft.draft_forwards.max(1) as f64;
            let speculative = config.is_some() && !o.draft.steps.is_empty();
            let dash = || "–".to_string();
            table.push(vec![
                name.clone(),
                format!("{}/{}", o.drafted_windows, o.windows),
                format!("{:.0} ms", o.decoder_time.as_secs_f64() * 1e3),
                speedup(
                    greedy.decoder_time.as_secs_f64(),
                    o.decoder_time.as_secs_f64(),
                ),
                if speculative {
                    format!("{:.0} ms", o.draft_encoder_time.as_secs_f64() * 1e3)
                } else {
                    dash()
                },
                speedup(
                    greedy.decoder_time.as_secs_f64(),
                    (o.decoder_time + o.draft_encoder_time).as_secs_f64(),
                ),
                format!("{:.3}", o.forwards as f64 / words.max(1) as f64),
                if speculative {
                    format!(
                        "{:.0} %",
                        100.0 * o.draft.draft_time.as_secs_f64() / o.decoder_time.as_secs_f64()
                    )
                } else {
                    dash()
                },
                if speculative {
                    format!("{:.2}", tokens as f64 / steps)
                } else {
                    "1".into()
                },
                if speculative {
                    format!(
                        "{:.0} %",
                        100.0 * o.recycled_tokens as f64 / o.drafted_tokens.max(1) as f64
                    )
                } else {
                    dash()
                },
                if speculative {
                    ratio(draft_step, target_step)
                } else {
                    dash()
                },
                format!("{same}/{}", clips.len()),
            ]);
        }
        tables.push(table);
    }
    let notes = vec![
        "Decoder time covers the target's prompt and verifying forwards and the draft's decoding; the target's encoder is the same for every row, the draft's encoder is listed apart (\"speed-up with it\" includes it). Target forwards/word counts the prompt. Draft step ÷ target step compares one draft forward with one greedy target step (the greedy row's decoder time per forward): a draft costing c of a step bounds the speed-up below 1/c. The cost-aware row decodes the first window greedily (it measures the target's step), then drafts a window only when the draft's encoder (estimated from the target's by their multiply-adds) costs less than the steps the window's tokens could save at most, and only while drafted windows cost less per token (draft encoder included) than a step; each row starts with the policy's memory cleared. Greedy verification: every transcript must equal greedy decoding's.".into(),
    ];
    let report = Report {
        command: format!(
            "cargo run --release -p engine-asr --example bench_specasr -- --target {} --draft {} --repeats {} --spoken-sentences {}",
            args.target, args.draft, args.repeats, args.spoken_sentences
        ),
        tables,
        notes,
        ..Report::default()
    };
    print!("{}", report.markdown());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
