//! PredGen benchmark (`cargo xtask bench predgen`): two sets of spoken questions, every turn
//! with the conversation's history kept, spoken at a speaking rate into PredGen with each
//! verifier and continuation, against the plain cascade (wait for the whole question, generate,
//! synthesize) of the same model in the same run:
//! - MT-Bench: long written questions, both turns;
//! - voice: everyday questions a voice assistant hears (`engine-llm/data/voice_questions.txt`,
//!   written for this benchmark: short, single and two-turn conversations).
//!
//! Every setup answers a conversation back to back, and the cascade answers it again after
//! every method: a method's turn is compared with the two cascade runs right around it, so the
//! machine's drift over a round does not decide a turn's comparison.
//!
//! ```sh
//! cargo run --release -p engine-llm --example bench_predgen -- [--questions 4 | --all] \
//!     [--conversations N] [--set both|mt-bench|voice] [--model M] [--draft D] \
//!     [--max-tokens N] [--rate CPM] [--repeats N] [--json PATH] [--plots DIR]
//! ```
//!
//! Writes the paper's Table 1 (TTFS, NFETFS, audio latency, agreement, speed-up) per set, every
//! turn's latencies in the JSON (`details`), and per set an SVG of the latency distribution
//! (`predgen-latency-SET.svg`) and one of each turn against the cascade
//! (`predgen-turns-SET.svg`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use engine_llm::predgen::spoken_at_rate;
use engine_llm::predgen::FixedLatencySynthesizer;
use engine_llm::predgen::{answer_similarity, EventKind};
use engine_llm::spec_voice::DEFAULT_CHARS_PER_MINUTE;
use engine_llm::{
    Continuation, LanguageModel, LoadOptions, PredGen, PredGenConfig, SpokenTurn, Verifier,
};
use spec_cli::{init_logging, open_model, progress_bar, HeadsArgs, ModelArgs};
use spec_core::report::{latency_speedup, Report, Table};
use spec_core::HeadsDrafter;
use spec_models::mt_bench;
use spec_nn::heads::MultiTokenHeads;

mod plots;

use plots::{latency_svg, turns_svg};

const DEFAULT_VOICE_QUESTIONS: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/data/voice_questions.txt");

struct Setup {
    label: &'static str,
    /// Its name for `--methods`.
    key: &'static str,
    /// `None`: the plain cascade.
    method: Option<(Verifier, Continuation)>,
    /// Guess the end of the question first (`PredGenConfig::complete_questions`).
    complete_questions: bool,
    /// Answer candidate questions ahead (`PredGenConfig::question_candidates` from
    /// `--question-candidates`).
    candidate_questions: bool,
}

fn setups() -> Vec<Setup> {
    let predgen = |label, key, verifier, continuation| Setup {
        label,
        key,
        method: Some((verifier, continuation)),
        complete_questions: true,
        candidate_questions: false,
    };
    vec![
        Setup {
            label: "Baseline (plain cascade)",
            key: "cascade",
            method: None,
            complete_questions: false,
            candidate_questions: false,
        },
        predgen(
            "Greedy",
            "greedy",
            Verifier::Greedy,
            Continuation::Autoregressive,
        ),
        Setup {
            complete_questions: false,
            ..predgen(
                "Greedy, no question completion",
                "greedy-no-completion",
                Verifier::Greedy,
                Continuation::Autoregressive,
            )
        },
        predgen(
            "Top-3",
            "top3",
            Verifier::TopK(3),
            Continuation::Autoregressive,
        ),
        predgen(
            "Reflection",
            "reflection",
            Verifier::Reflection,
            Continuation::Autoregressive,
        ),
        predgen(
            "Greedy + Jacobi",
            "jacobi",
            Verifier::Greedy,
            Continuation::Jacobi { window: 8 },
        ),
        predgen(
            "Greedy + draft model",
            "draft",
            Verifier::Greedy,
            Continuation::DraftModel { gamma: 3 },
        ),
        predgen(
            "Greedy + lookup",
            "lookup",
            Verifier::Greedy,
            Continuation::Lookup { max_draft: 8 },
        ),
        predgen(
            "Greedy + heads",
            "heads",
            Verifier::Greedy,
            Continuation::Heads,
        ),
        Setup {
            candidate_questions: true,
            ..predgen(
                "Greedy, candidate questions",
                "greedy-candidates",
                Verifier::Greedy,
                Continuation::Autoregressive,
            )
        },
        Setup {
            candidate_questions: true,
            ..predgen(
                "Greedy + lookup, candidate questions",
                "lookup-candidates",
                Verifier::Greedy,
                Continuation::Lookup { max_draft: 8 },
            )
        },
        // The cascade against itself, measured like every method between two cascade runs: how
        // often this machine's noise alone makes a turn more than 5 % slower, the floor under
        // every method's count of such turns.
        Setup {
            label: "Plain cascade again (noise floor)",
            key: "cascade-again",
            method: None,
            complete_questions: false,
            candidate_questions: false,
        },
    ]
}

/// The cascade and the setups named in `methods` (all when empty), in the table's order.
fn chosen_setups(methods: &[String]) -> Result<Vec<Setup>> {
    let all = setups();
    if let Some(unknown) = methods
        .iter()
        .find(|m| !all.iter().any(|s| s.key == m.as_str()))
    {
        let known: Vec<&str> = all.iter().skip(1).map(|s| s.key).collect();
        anyhow::bail!("unknown method `{unknown}` (known: {})", known.join(", "));
    }
    Ok(all
        .into_iter()
        .filter(|s| s.key == "cascade" || methods.is_empty() || methods.iter().any(|m| m == s.key))
        .collect())
}

/// Which question sets to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Sets {
    Both,
    MtBench,
    Voice,
}

/// PredGen against the plain cascade on MT-Bench and on everyday voice questions, every setup
/// in the same run.
#[derive(Parser)]
struct Options {
    #[command(flatten)]
    model: ModelArgs,

    /// Draft model of the draft-model continuation
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    draft: String,

    #[command(flatten)]
    heads: HeadsArgs,

    /// The question sets
    #[arg(long, value_enum, default_value_t = Sets::Both)]
    set: Sets,

    /// MT-Bench questions, spread evenly over its categories
    #[arg(long = "questions", default_value_t = 4, conflicts_with = "all")]
    count: usize,

    /// All 80 MT-Bench questions
    #[arg(long)]
    all: bool,

    /// Conversations of the voice set [default: all]
    #[arg(long)]
    conversations: Option<usize>,

    /// The voice set's file: one conversation per block, one question per line
    #[arg(long, default_value = DEFAULT_VOICE_QUESTIONS)]
    voice_questions: PathBuf,

    /// Most tokens per answer
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,

    /// Runs of every conversation per setup (interleaved with the other setups); each turn
    /// keeps its median run, so one noisy forward does not decide a turn's comparison
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    repeats: u64,

    /// The methods to run beside the cascade (always run), by name: greedy,
    /// greedy-no-completion, top3, reflection, jacobi, draft, lookup, heads, greedy-candidates,
    /// lookup-candidates, cascade-again (the cascade once more, like a method: the noise floor of
    /// "turns > 5 % slower") [default: all]
    #[arg(long, value_delimiter = ',')]
    methods: Vec<String>,

    /// Candidate questions the `*-candidates` methods answer ahead
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..=16))]
    question_candidates: u64,

    /// Speaking rate in characters per minute
    #[arg(long, default_value_t = DEFAULT_CHARS_PER_MINUTE)]
    rate: f64,

    /// Also write the report as JSON here
    #[arg(long)]
    json: Option<PathBuf>,

    /// Folder for the plots (SVG)
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../results"))]
    plots: PathBuf,
}

/// What the setups run on.
struct Models {
    target: LanguageModel,
    /// The draft-model continuation's draft.
    draft: LanguageModel,
    /// The heads continuation's drafter, when a chosen setup uses it.
    heads: Option<HeadsDrafter<MultiTokenHeads>>,
}

/// Both turns of one question with one setup, in a fresh conversation.
fn run_question(
    models: &mut Models,
    setup: &Setup,
    turns: &[String],
    options: &Options,
) -> Result<Vec<SpokenTurn>> {
    let (verifier, continuation) = setup
        .method
        .unwrap_or((Verifier::Greedy, Continuation::Autoregressive));
    let config = PredGenConfig {
        verifier,
        continuation,
        max_answer_tokens: options.max_tokens,
        complete_questions: setup.complete_questions,
        question_candidates: match setup.candidate_questions {
            true => options.question_candidates as usize,
            false => 1,
        },
        ..PredGenConfig::default()
    };
    let mut session = PredGen::new(&mut models.target, config)?;
    if matches!(continuation, Continuation::DraftModel { .. }) {
        session = session.with_draft(&mut models.draft)?;
    }
    if let (Continuation::Heads, Some(heads)) = (continuation, &models.heads) {
        session = session.with_heads(heads.clone())?;
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

/// The options that chose the questions, as the report's command gives them.
fn question_args(options: &Options) -> String {
    let questions = match options.all {
        true => "--all".to_string(),
        false => format!("--questions {}", options.count),
    };
    let mut conversations = options
        .conversations
        .map(|n| format!(" --conversations {n}"))
        .unwrap_or_default();
    if options.voice_questions != Path::new(DEFAULT_VOICE_QUESTIONS) {
        conversations = format!(
            " --voice-questions {}{conversations}",
            options.voice_questions.display()
        );
    }
    match options.set {
        Sets::Both => format!("{questions}{conversations}"),
        Sets::MtBench => format!("--set mt-bench {questions}"),
        Sets::Voice => format!("--set voice{conversations}"),
    }
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

/// One question set's turns for every setup, the plain cascade first.
struct SetRun {
    /// The set's name in file names and tables.
    name: &'static str,
    title: String,
    /// Per setup, every turn in order.
    results: Vec<Vec<SpokenTurn>>,
    /// Per setup, every turn's cascade latency right around the kept run (s): the mean of the
    /// cascade's runs just before and just after it (the cascade's own kept latency for the
    /// cascade).
    adjacent: Vec<Vec<f64>>,
}

impl SetRun {
    /// A turn's audio latency over the cascade's right around it.
    fn ratio(&self, setup: usize, turn: usize) -> f64 {
        ratio_to_adjacent(&self.results[setup][turn], self.adjacent[setup][turn])
    }
}

/// A turn's audio latency over `adjacent`, the mean latency of the cascade runs around it (s).
fn ratio_to_adjacent(turn: &SpokenTurn, adjacent: f64) -> f64 {
    seconds(turn.audio_latency()) / adjacent.max(1e-9)
}

/// One run of a method on a conversation, with the cascade's latencies just before and after.
struct BracketedRun {
    turns: Vec<SpokenTurn>,
    /// Per turn, the mean of the two cascade runs' audio latencies (s).
    adjacent: Vec<f64>,
}

/// Runs every setup on every conversation of a set, `options.repeats` times over. In each
/// round the cascade answers the conversation first and again after every method, and a
/// method's turn is compared with the mean of the two cascade runs around it: this machine's
/// speed drifts over seconds, and the cascade a whole round earlier is not a fair yardstick.
/// The cascade keeps each turn's median over all its runs; a method keeps, per turn, the run
/// whose ratio to its adjacent cascades is the median.
fn run_set(
    models: &mut Models,
    setups: &[Setup],
    conversations: &[Vec<String>],
    options: &Options,
    name: &'static str,
    title: String,
) -> Result<SetRun> {
    let (cascade, methods) = setups.split_first().context("no cascade")?;
    let mut results: Vec<Vec<SpokenTurn>> = setups.iter().map(|_| Vec::new()).collect();
    let mut adjacent: Vec<Vec<f64>> = setups.iter().map(|_| Vec::new()).collect();
    let bar = progress_bar(conversations.len(), name);
    let mut run = |setup: &Setup, turns: &[String]| run_question(models, setup, turns, options);
    for (i, turns) in conversations.iter().enumerate() {
        let mut cascade_runs: Vec<Vec<SpokenTurn>> = Vec::new();
        let mut method_runs: Vec<Vec<BracketedRun>> = methods.iter().map(|_| Vec::new()).collect();
        for _ in 0..options.repeats {
            let mut before = run(cascade, turns)?;
            for (setup, runs) in methods.iter().zip(method_runs.iter_mut()) {
                let method_turns = run(setup, turns)?;
                let after = run(cascade, turns)?;
                let adjacent = before
                    .iter()
                    .zip(&after)
                    .map(|(b, a)| (seconds(b.audio_latency()) + seconds(a.audio_latency())) / 2.0)
                    .collect();
                runs.push(BracketedRun {
                    turns: method_turns,
                    adjacent,
                });
                cascade_runs.push(std::mem::replace(&mut before, after));
            }
            cascade_runs.push(before);
        }
        let cascade_turns = median_turns(cascade_runs);
        adjacent[0].extend(cascade_turns.iter().map(|t| seconds(t.audio_latency())));
        results[0].extend(cascade_turns);
        for (s, runs) in method_runs.into_iter().enumerate() {
            let (turns, around) = median_ratio_turns(runs);
            results[s + 1].extend(turns);
            adjacent[s + 1].extend(around);
        }
        bar.inc(1);
        let latest = |s: usize| seconds(results[s].last().unwrap().audio_latency());
        tracing::info!(
            "{name} {}/{}: audio latency {}",
            i + 1,
            conversations.len(),
            setups
                .iter()
                .enumerate()
                .map(|(s, setup)| format!("{} {:.2} s", setup.label, latest(s)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    bar.finish_and_clear();
    Ok(SetRun {
        name,
        title,
        results,
        adjacent,
    })
}

/// The item with the median `key` (the lower middle of an even count).
fn lower_median<T>(mut items: Vec<T>, key: impl Fn(&T) -> f64) -> T {
    items.sort_by(|a, b| key(a).total_cmp(&key(b)));
    items.swap_remove((items.len() - 1) / 2)
}

/// Turn by turn, the run with the median audio latency (the lower middle of an even count).
fn median_turns(runs: Vec<Vec<SpokenTurn>>) -> Vec<SpokenTurn> {
    let turns = runs.first().map_or(0, Vec::len);
    (0..turns)
        .map(|t| {
            let candidates: Vec<&SpokenTurn> = runs.iter().map(|run| &run[t]).collect();
            lower_median(candidates, |turn| seconds(turn.audio_latency())).clone()
        })
        .collect()
}

/// Turn by turn, the run whose latency over its adjacent cascades' is the median (the lower
/// middle of an even count), with those cascades' mean latency.
fn median_ratio_turns(runs: Vec<BracketedRun>) -> (Vec<SpokenTurn>, Vec<f64>) {
    let turns = runs.first().map_or(0, |run| run.turns.len());
    (0..turns)
        .map(|t| {
            let kept = lower_median(runs.iter().collect(), |run: &&BracketedRun| {
                ratio_to_adjacent(&run.turns[t], run.adjacent[t])
            });
            (kept.turns[t].clone(), kept.adjacent[t])
        })
        .unzip()
}

/// The paper's Table 1 for one set.
fn summary_table(run: &SetRun, setups: &[Setup]) -> Table {
    let baseline = &run.results[0];
    let baseline_latency = mean(baseline.iter().map(|t| seconds(t.audio_latency())));
    let turn_count = baseline.len();
    let mut table = Table::new(
        run.title.clone(),
        &[
            "method",
            "TTFS (s)",
            "NFETFS",
            "audio latency (s)",
            "median / p90 (s)",
            "speed-up",
            "turns > 5 % slower",
            "first sentence = baseline",
            "answer similarity",
            "answer = baseline",
            "audio prepared ahead",
            "question guessed",
            "tokens during input",
            "step in flight at the last word: abandoned / longest wait (ms)",
        ],
    );
    for (s, (setup, turns)) in setups.iter().zip(&run.results).enumerate() {
        let latencies: Vec<f64> = turns.iter().map(|t| seconds(t.audio_latency())).collect();
        let latency = mean(latencies.iter().copied());
        let same = |f: &dyn Fn(&SpokenTurn, &SpokenTurn) -> bool| {
            turns.iter().zip(baseline).filter(|(a, b)| f(a, b)).count()
        };
        table.push(vec![
            setup.label.to_string(),
            format!(
                "{:.2}",
                mean(turns.iter().map(|t| seconds(t.turn.time_to_first_sentence)))
            ),
            format!(
                "{:.2}",
                mean(
                    turns
                        .iter()
                        .map(|t| t.turn.forwards_to_first_sentence as f64)
                )
            ),
            format!("{latency:.2}"),
            format!(
                "{:.2} / {:.2}",
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.9)
            ),
            latency_speedup(baseline_latency, latency),
            format!(
                "{}/{turn_count}",
                (0..turn_count).filter(|&t| run.ratio(s, t) > 1.05).count()
            ),
            format!(
                "{}/{turn_count}",
                same(&|a, b| a.turn.first_sentence == b.turn.first_sentence)
            ),
            format!(
                "{:.3}",
                mean(
                    turns
                        .iter()
                        .zip(baseline)
                        .map(|(a, b)| answer_similarity(&a.turn.answer, &b.turn.answer))
                )
            ),
            format!(
                "{}/{turn_count}",
                same(&|a, b| a.turn.answer == b.turn.answer)
            ),
            format!(
                "{}/{turn_count}",
                turns.iter().filter(|t| t.prepared_audio_used()).count()
            ),
            format!(
                "{}/{turn_count}",
                turns
                    .iter()
                    .filter(|t| t.turn.guessed_question.as_ref() == Some(&t.turn.question))
                    .count()
            ),
            format!(
                "{:.1}",
                mean(turns.iter().map(|t| t.turn.tokens_during_input as f64))
            ),
            format!(
                "{}/{turn_count} / {:.1}",
                turns
                    .iter()
                    .filter(|t| t
                        .turn
                        .timeline
                        .iter()
                        .any(|e| e.kind == EventKind::Interrupted))
                    .count(),
                turns
                    .iter()
                    .map(|t| t.turn.final_partial_wait.as_secs_f64() * 1e3)
                    .fold(0.0, f64::max)
            ),
        ]);
    }
    table
}

/// Every turn's audio latency per setup (ms) and whether its answer is the cascade's.
fn turns_table(run: &SetRun, setups: &[Setup]) -> Table {
    let mut columns = vec!["turn".to_string(), "question".to_string()];
    for setup in setups {
        columns.push(format!("{} (ms)", setup.label));
    }
    for setup in &setups[1..] {
        columns.push(format!("{}: ÷ adjacent cascades", setup.label));
    }
    for setup in &setups[1..] {
        columns.push(format!("{}: answer = baseline", setup.label));
    }
    let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
    let mut table = Table::new(format!("{}: every turn", run.title), &columns);
    let baseline = &run.results[0];
    for (i, turn) in baseline.iter().enumerate() {
        let mut row = vec![(i + 1).to_string(), turn.turn.question.clone()];
        for turns in &run.results {
            row.push(format!("{:.0}", seconds(turns[i].audio_latency()) * 1e3));
        }
        for s in 1..run.results.len() {
            row.push(format!("{:.2}", run.ratio(s, i)));
        }
        for turns in &run.results[1..] {
            row.push((turns[i].turn.answer == turn.turn.answer).to_string());
        }
        table.push(row);
    }
    table
}

fn set_notes(run: &SetRun, setups: &[Setup]) -> Vec<String> {
    let baseline = &run.results[0];
    let baseline_latency = mean(baseline.iter().map(|t| seconds(t.audio_latency())));
    let turn_count = baseline.len();
    setups
        .iter()
        .zip(&run.results)
        .enumerate()
        .skip(1)
        .map(|(s, (setup, turns))| {
            let latency = mean(turns.iter().map(|t| seconds(t.audio_latency())));
            let worst = (0..turn_count).map(|t| run.ratio(s, t)).fold(0.0, f64::max);
            format!(
                "{}, {}: audio latency {:.2} s against {:.2} s, {} faster than the plain cascade; slowest turn {:.2}× the latency of the cascade runs right before and after it; {} of {} answers identical to it.",
                run.name,
                setup.label,
                latency,
                baseline_latency,
                latency_speedup(baseline_latency, latency),
                worst,
                turns.iter().zip(baseline).filter(|(a, b)| a.turn.answer == b.turn.answer).count(),
                turn_count
            )
        })
        .collect()
}

fn write_plots(run: &SetRun, setups: &[Setup], folder: &Path) -> Result<()> {
    let latencies = |turns: &[SpokenTurn]| -> Vec<f64> {
        turns.iter().map(|t| seconds(t.audio_latency())).collect()
    };
    let rows: Vec<(&str, Vec<f64>)> = setups
        .iter()
        .zip(&run.results)
        .map(|(s, turns)| (s.label, latencies(turns)))
        .collect();
    let turns = run.results[0].len();
    let strip = latency_svg(
        &rows,
        &format!(
            "PredGen: audio latency per turn, {} ({turns} turns)",
            run.name
        ),
    );
    let pairs: Vec<(&str, Vec<(f64, f64)>)> = rows[1..]
        .iter()
        .zip(&run.adjacent[1..])
        .map(|((label, latencies), around)| {
            (
                *label,
                around
                    .iter()
                    .copied()
                    .zip(latencies.iter().copied())
                    .collect(),
            )
        })
        .collect();
    let scatter = turns_svg(
        &pairs,
        &format!(
            "PredGen: each turn against the cascade, {} ({turns} turns)",
            run.name
        ),
    );
    std::fs::create_dir_all(folder).with_context(|| folder.display().to_string())?;
    for (kind, svg) in [("latency", strip), ("turns", scatter)] {
        let path = folder.join(format!("predgen-{kind}-{}.svg", run.name));
        std::fs::write(&path, svg).with_context(|| path.display().to_string())?;
    }
    Ok(())
}

fn main() -> Result<()> {
    init_logging();
    let options = Options::parse();
    let store = spec_models::Store::from_env()?;
    let count = (!options.all).then_some(options.count);
    let mut sets: Vec<(&'static str, String, Vec<Vec<String>>)> = Vec::new();
    if options.set != Sets::Voice {
        let questions: Vec<Vec<String>> = mt_bench::spread(mt_bench::questions(&store)?, count)
            .into_iter()
            .map(|q| q.turns)
            .collect();
        let title = format!("MT-Bench, {} questions × 2 turns", questions.len());
        sets.push(("mt-bench", title, questions));
    }
    if options.set != Sets::MtBench {
        let mut conversations = spec_voice::read_conversations(&options.voice_questions)?;
        conversations.truncate(options.conversations.unwrap_or(usize::MAX));
        let turns: usize = conversations.iter().map(Vec::len).sum();
        let title = format!(
            "Voice questions, {} conversations ({turns} turns)",
            conversations.len()
        );
        sets.push(("voice", title, conversations));
    }
    let target = options.model.open()?;
    let draft = open_model(&options.draft, &LoadOptions::default())?;
    let setups = chosen_setups(&options.methods)?;
    let heads = match setups
        .iter()
        .any(|s| matches!(s.method, Some((_, Continuation::Heads))))
    {
        true => Some(options.heads.drafter(&target, &options.model.model)?),
        false => None,
    };
    let mut models = Models {
        target,
        draft,
        heads,
    };

    // Warm-up (weights are repacked on first use), untimed.
    let warm_up = vec!["What is the capital of France?".to_string()];
    for setup in &setups {
        run_question(&mut models, setup, &warm_up, &options)?;
    }
    let mut report = Report {
        command: format!(
            "cargo run --release -p engine-llm --example bench_predgen -- {} --max-tokens {} --repeats {}{}{}{}",
            question_args(&options),
            options.max_tokens,
            options.repeats,
            if options.methods.is_empty() {
                String::new()
            } else {
                format!(" --methods {}", options.methods.join(","))
            },
            match setups.iter().any(|s| s.candidate_questions) {
                true => format!(" --question-candidates {}", options.question_candidates),
                false => String::new(),
            },
            match models.heads.is_some() {
                true => format!(
                    " --heads {} --heads-min-probability {}",
                    options.heads.heads, options.heads.heads_min_probability
                ),
                false => String::new(),
            }
        ),
        ..Report::default()
    };
    for (name, title, conversations) in sets {
        let title = format!(
            "{title}, spoken at {} characters per minute, {} (draft {}), answers up to {} tokens, TTS latency 200 ms, {} run(s) per turn and method, each between two runs of the cascade (a turn keeps its median ratio to them)",
            options.rate, options.model.model, options.draft, options.max_tokens, options.repeats
        );
        let run = run_set(&mut models, &setups, &conversations, &options, name, title)?;
        report.tables.push(summary_table(&run, &setups));
        report.details.push(turns_table(&run, &setups));
        report.notes.extend(set_notes(&run, &setups));
        write_plots(&run, &setups, &options.plots)?;
    }
    print!("{}", report.markdown());
    if let Some(path) = options.json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
