//! PredGen benchmark (`cargo xtask bench predgen`): MT-Bench questions, both turns with the
//! history kept, spoken at a speaking rate into PredGen with each verifier and continuation,
//! against the plain cascade (wait for the whole question, generate, synthesize) of the same
//! model in the same run. Every setup answers a question back to back, so the machine's drift
//! hits all of them alike.
//!
//! ```sh
//! cargo run --release -p engine-llm --example bench_predgen -- [--questions 4 | --all] \
//!     [--model M] [--draft D] [--max-tokens N] [--rate CPM] [--json PATH] [--plot SVG]
//! ```
//!
//! Writes the paper's Table 1 (TTFS, NFETFS, audio latency, agreement, speed-up) and an SVG of
//! the latency distribution (default `results/predgen-latency.svg`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use engine_llm::cli::{init_logging, open_model, progress_bar, ModelArgs};
use engine_llm::predgen::answer_similarity;
use engine_llm::predgen::spoken_at_rate;
use engine_llm::predgen::FixedLatencySynthesizer;
use engine_llm::spec_voice::DEFAULT_CHARS_PER_MINUTE;
use engine_llm::{
    Continuation, LanguageModel, LoadOptions, PredGen, PredGenConfig, Turn, Verifier,
};
use spec_core::report::{Report, Table};
use spec_models::mt_bench;

struct Setup {
    label: &'static str,
    /// `None`: the plain cascade.
    method: Option<(Verifier, Continuation)>,
}

fn setups() -> Vec<Setup> {
    let predgen = |label, verifier, continuation| Setup {
        label,
        method: Some((verifier, continuation)),
    };
    vec![
        Setup {
            label: "Baseline (plain cascade)",
            method: None,
        },
        predgen("Greedy", Verifier::Greedy, Continuation::Autoregressive),
        predgen("Top-3", Verifier::TopK(3), Continuation::Autoregressive),
        predgen(
            "Reflection",
            Verifier::Reflection,
            Continuation::Autoregressive,
        ),
        predgen(
            "Greedy + Jacobi",
            Verifier::Greedy,
            Continuation::Jacobi { window: 8 },
        ),
        predgen(
            "Greedy + draft model",
            Verifier::Greedy,
            Continuation::DraftModel { gamma: 3 },
        ),
    ]
}

/// PredGen against the plain cascade on MT-Bench, every setup in the same run.
#[derive(Parser)]
struct Options {
    #[command(flatten)]
    model: ModelArgs,

    /// Draft model of the draft-model continuation
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    draft: String,

    /// MT-Bench questions, spread evenly over its categories
    #[arg(long = "questions", default_value_t = 4, conflicts_with = "all")]
    count: usize,

    /// All 80 questions
    #[arg(long)]
    all: bool,

    /// Most tokens per answer
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,

    /// Speaking rate in characters per minute
    #[arg(long, default_value_t = DEFAULT_CHARS_PER_MINUTE)]
    rate: f64,

    /// Also write the report as JSON here
    #[arg(long)]
    json: Option<PathBuf>,

    /// Where to draw the latency distribution (SVG)
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../results/predgen-latency.svg"))]
    plot: PathBuf,
}

/// Both turns of one question with one setup, in a fresh conversation.
fn run_question(
    model: &mut LanguageModel,
    draft: &mut LanguageModel,
    setup: &Setup,
    turns: &[String],
    options: &Options,
) -> Result<Vec<Turn>> {
    let (verifier, continuation) = setup
        .method
        .unwrap_or((Verifier::Greedy, Continuation::Autoregressive));
    let config = PredGenConfig {
        verifier,
        continuation,
        max_answer_tokens: options.max_tokens,
        ..PredGenConfig::default()
    };
    let mut session = PredGen::new(model, config)?;
    if matches!(continuation, Continuation::DraftModel { .. }) {
        session = session.with_draft(draft)?;
    }
    let mut tts = FixedLatencySynthesizer::default();
    turns
        .iter()
        .map(|text| {
            let inputs = spoken_at_rate(text, options.rate)?;
            Ok(match setup.method {
                None => session.baseline_turn(&inputs, &mut tts)?,
                Some(_) => session.turn(&inputs, &mut tts)?,
            })
        })
        .collect()
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let values: Vec<f64> = values.collect();
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p * (sorted.len().saturating_sub(1)) as f64).round() as usize;
    sorted.get(rank).copied().unwrap_or(f64::NAN)
}

/// A strip plot of audio latencies: one row per setup, a dot per turn, the interquartile box
/// and the median.
fn latency_svg(rows: &[(&str, Vec<f64>)], caption: &str) -> String {
    let (left, width, row_height, top) = (190.0, 520.0, 44.0, 40.0);
    let max = rows
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.5f64, f64::max);
    let step = [0.25, 0.5, 1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|s| max / s <= 8.0)
        .unwrap_or(20.0);
    let scale_max = (max / step).ceil() * step;
    let x = |v: f64| left + v / scale_max * width;
    let height = top + rows.len() as f64 * row_height + 50.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="13">"#,
        w = left + width + 30.0
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="22" font-weight="bold">{caption}</text>"#
    );
    let mut tick = 0.0;
    while tick <= scale_max + 1e-9 {
        let _ = writeln!(
            svg,
            r##"<line x1="{0}" x2="{0}" y1="{top}" y2="{1}" stroke="#ddd"/><text x="{0}" y="{2}" text-anchor="middle">{tick}</text>"##,
            x(tick),
            height - 40.0,
            height - 24.0
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">audio latency after the end of speech (s)</text>"#,
        left + width / 2.0,
        height - 6.0
    );
    for (i, (label, values)) in rows.iter().enumerate() {
        let y = top + (i as f64 + 0.5) * row_height;
        let (q1, median, q3) = (
            percentile(values, 0.25),
            percentile(values, 0.5),
            percentile(values, 0.75),
        );
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" text-anchor="end">{label}</text><rect x="{}" y="{}" width="{}" height="22" fill="#cfe0f5" stroke="#4a7ab5"/><line x1="{m}" x2="{m}" y1="{}" y2="{}" stroke="#1f3f6e" stroke-width="3"/>"##,
            left - 10.0,
            y + 4.0,
            x(q1),
            y - 11.0,
            (x(q3) - x(q1)).max(1.0),
            y - 13.0,
            y + 13.0,
            m = x(median)
        );
        for v in values {
            let _ = writeln!(
                svg,
                r##"<circle cx="{}" cy="{y}" r="3" fill="#c0392b" fill-opacity="0.6"/>"##,
                x(*v)
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn main() -> Result<()> {
    init_logging();
    let options = Options::parse();
    let store = spec_models::Store::from_env()?;
    let count = (!options.all).then_some(options.count);
    let questions: Vec<Vec<String>> = mt_bench::spread(mt_bench::questions(&store)?, count)
        .into_iter()
        .map(|q| q.turns)
        .collect();
    let mut model = options.model.open()?;
    let mut draft = open_model(&options.draft, &LoadOptions::default())?;
    let setups = setups();

    // Warm-up (weights are repacked on first use), untimed.
    let warm_up = vec!["What is the capital of France?".to_string()];
    for setup in &setups {
        run_question(&mut model, &mut draft, setup, &warm_up, &options)?;
    }
    let mut results: Vec<Vec<Turn>> = setups.iter().map(|_| Vec::new()).collect();
    let bar = progress_bar(questions.len(), "questions");
    for (i, turns) in questions.iter().enumerate() {
        for (setup, result) in setups.iter().zip(results.iter_mut()) {
            result.extend(run_question(
                &mut model, &mut draft, setup, turns, &options,
            )?);
        }
        let latest = |s: usize| seconds(results[s].last().unwrap().audio_latency);
        bar.inc(1);
        tracing::info!(
            "question {}/{}: audio latency {}",
            i + 1,
            questions.len(),
            setups
                .iter()
                .enumerate()
                .map(|(s, setup)| format!("{} {:.2} s", setup.label, latest(s)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    bar.finish_and_clear();

    let baseline = &results[0];
    let baseline_latency = mean(baseline.iter().map(|t| seconds(t.audio_latency)));
    let turn_count = baseline.len();
    let mut table = Table::new(
        format!(
            "MT-Bench, {} questions × 2 turns, spoken at {} characters per minute, {} (draft {}), answers up to {} tokens, TTS latency 200 ms",
            questions.len(),
            options.rate,
            options.model.model,
            options.draft,
            options.max_tokens
        ),
        &[
            "method",
            "TTFS (s)",
            "NFETFS",
            "audio latency (s)",
            "median / p90 (s)",
            "speed-up",
            "first sentence = baseline",
            "answer similarity",
            "answer = baseline",
            "audio prepared ahead",
            "tokens during input",
        ],
    );
    let mut plot_rows = Vec::new();
    for (setup, turns) in setups.iter().zip(&results) {
        let latencies: Vec<f64> = turns.iter().map(|t| seconds(t.audio_latency)).collect();
        let latency = mean(latencies.iter().copied());
        let same = |f: &dyn Fn(&Turn, &Turn) -> bool| {
            turns.iter().zip(baseline).filter(|(a, b)| f(a, b)).count()
        };
        table.push(vec![
            setup.label.to_string(),
            format!(
                "{:.2}",
                mean(turns.iter().map(|t| seconds(t.time_to_first_sentence)))
            ),
            format!(
                "{:.2}",
                mean(turns.iter().map(|t| t.forwards_to_first_sentence as f64))
            ),
            format!("{latency:.2}"),
            format!(
                "{:.2} / {:.2}",
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.9)
            ),
            format!("{:.2}×", baseline_latency / latency.max(1e-9)),
            format!(
                "{}/{turn_count}",
                same(&|a, b| a.first_sentence == b.first_sentence)
            ),
            format!(
                "{:.3}",
                mean(
                    turns
                        .iter()
                        .zip(baseline)
                        .map(|(a, b)| answer_similarity(&a.answer, &b.answer))
                )
            ),
            format!("{}/{turn_count}", same(&|a, b| a.answer == b.answer)),
            format!(
                "{}/{turn_count}",
                turns.iter().filter(|t| t.prepared_audio_used).count()
            ),
            format!(
                "{:.1}",
                mean(turns.iter().map(|t| t.tokens_during_input as f64))
            ),
        ]);
        plot_rows.push((setup.label, latencies));
    }
    let svg = latency_svg(
        &plot_rows,
        &format!(
            "PredGen: audio latency per turn, MT-Bench ({} turns), {}",
            turn_count, options.model.model
        ),
    );
    std::fs::write(&options.plot, svg).with_context(|| options.plot.display().to_string())?;

    let mut notes = Vec::new();
    for (setup, turns) in setups.iter().zip(&results).skip(1) {
        let latency = mean(turns.iter().map(|t| seconds(t.audio_latency)));
        notes.push(format!(
            "{}: audio latency {:.2} s against {:.2} s, {:.2}× faster than the plain cascade; {} of {} answers identical to it.",
            setup.label,
            latency,
            baseline_latency,
            baseline_latency / latency.max(1e-9),
            turns.iter().zip(baseline).filter(|(a, b)| a.answer == b.answer).count(),
            turn_count
        ));
    }
    let count_flag = match count {
        Some(n) => format!("--questions {n}"),
        None => "--all".into(),
    };
    let report = Report {
        command: format!(
            "cargo run --release -p engine-llm --example bench_predgen -- {count_flag} --max-tokens {}",
            options.max_tokens
        ),
        tables: vec![table],
        notes,
    };
    print!("{}", report.markdown());
    if let Some(path) = options.json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
