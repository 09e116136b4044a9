//! Benchmark of live re-translation: autoregressive re-translation against Self-Speculative
//! Biased Decoding (β from 0 to 0.5, mask-k and display-only mask-k, and SSBD with a draft model
//! after the divergence, all with the final update biased as in the paper; then β = 0.2 with an
//! unbiased final update, with and without display-only mask-3, the library's default), on
//! lag-k reveals of English sentences, every configuration of a sentence run back to back in
//! the same process.
//!
//! ```sh
//! cargo run --release -p engine-mt --example bench_mt -- [--model NAME] [--assistant NAME]
//!     [--sentences 8] [--lag 3] [--languages German,Chinese] [--json PATH]
//! ```
//!
//! `cargo xtask bench mt` runs it and files the results with the machine and date.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine_llm::cli::{init_logging, open_model, progress_bar, ModelArgs};
use engine_llm::{LanguageModel, LoadOptions};
use engine_mt::metrics::chrf;
use engine_mt::{
    lag_k, Caption, Decoding, LiveConfig, LiveTranslator, Masking, Partial, StreamSummary,
};
use spec_core::report::{Report, Table};

/// One row of the tables.
struct Setup {
    label: String,
    decoding: Decoding,
    masking: Masking,
    assisted: bool,
    /// [`LiveConfig::unbiased_final`]: off for the paper's configurations.
    unbiased_final: bool,
}

const AR: &str = "AR re-translation";
const BETA_0: &str = "SSBD β=0";
const BETA_02: &str = "SSBD β=0.2";
const ASSISTED: &str = "SSBD β=0 + draft model";
/// `LiveConfig::new`'s configuration, the recommended one.
const DEFAULT: &str = "SSBD β=0.2, display-only mask-3, unbiased final";

fn setups() -> Vec<Setup> {
    let setup = |label: &str, decoding, masking, assisted, unbiased_final| Setup {
        label: label.to_string(),
        decoding,
        masking,
        assisted,
        unbiased_final,
    };
    let ssbd = |beta| Decoding::Ssbd { beta };
    let mut all = vec![setup(
        AR,
        Decoding::Autoregressive,
        Masking::None,
        false,
        false,
    )];
    for beta in [0.0, 0.1, 0.2, 0.3, 0.4, 0.5] {
        all.push(setup(
            &format!("SSBD β={beta}"),
            ssbd(beta),
            Masking::None,
            false,
            false,
        ));
    }
    for k in [3, 5] {
        all.push(setup(
            &format!("SSBD β=0.2, mask-{k}"),
            ssbd(0.2),
            Masking::Draft(k),
            false,
            false,
        ));
        all.push(setup(
            &format!("SSBD β=0.2, display-only mask-{k}"),
            ssbd(0.2),
            Masking::Display(k),
            false,
            false,
        ));
    }
    all.push(setup(ASSISTED, ssbd(0.0), Masking::None, true, false));
    all.push(setup(
        "SSBD β=0.2, unbiased final",
        ssbd(0.2),
        Masking::None,
        false,
        true,
    ));
    all.push(setup(DEFAULT, ssbd(0.2), Masking::Display(3), false, true));
    all
}

/// Accumulated results of one setup over the sentences.
#[derive(Default)]
struct Outcome {
    summary: StreamSummary,
    finals: Vec<String>,
    /// Every update's output, in order.
    outputs: Vec<String>,
}

impl Outcome {
    fn same_outputs(&self, other: &Outcome) -> usize {
        same(&self.outputs, &other.outputs)
    }

    fn same_finals(&self, other: &Outcome) -> usize {
        same(&self.finals, &other.finals)
    }

    fn finals(&self) -> Vec<&str> {
        self.finals.iter().map(String::as_str).collect()
    }
}

fn same(a: &[String], b: &[String]) -> usize {
    a.iter().zip(b).filter(|(a, b)| a == b).count()
}

/// The issue's targets for one configuration against AR re-translation: speed-up ≥ 1.5×, NE at
/// least 30 % lower, chrF of the final outputs against AR's within 1 point of identical.
fn targets(label: &str, outcome: &Outcome, ar: &Outcome) -> String {
    let verdict = |met: bool| if met { "met" } else { "missed" };
    let speedup = ar.summary.time.as_secs_f64() / outcome.summary.time.as_secs_f64();
    let ne_drop =
        1.0 - outcome.summary.normalized_erasure() / ar.summary.normalized_erasure().max(1e-9);
    let quality = chrf(&outcome.finals(), &ar.finals());
    format!(
        "{label}: {speedup:.2}× the speed (target ≥ 1.5×: {}), NE {:.0} % lower (target ≥ 30 %: \
         {}), chrF against AR's output {quality:.1} (target ≥ 99: {}); final captions identical \
         to AR's on {} of {} sentences.",
        verdict(speedup >= 1.5),
        100.0 * ne_drop,
        verdict(ne_drop >= 0.3),
        verdict(quality >= 99.0),
        outcome.same_finals(ar),
        ar.finals.len()
    )
}

struct Sentence {
    english: String,
    references: Vec<(String, String)>,
}

fn read_sentences(count: usize) -> Result<Vec<Sentence>> {
    let text = include_str!("../data/sentences.tsv");
    let mut sentences = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let columns: Vec<&str> = line.split('\t').collect();
        if columns.len() != 3 {
            bail!("data/sentences.tsv: expected 3 columns in {line:?}");
        }
        sentences.push(Sentence {
            english: columns[0].to_string(),
            references: vec![
                ("German".into(), columns[1].to_string()),
                ("Chinese".into(), columns[2].to_string()),
            ],
        });
    }
    sentences.truncate(count);
    Ok(sentences)
}

fn run_sentence(
    model: &mut LanguageModel,
    assistant: &mut LanguageModel,
    setup: &Setup,
    language: &str,
    updates: &[Partial],
) -> Result<Vec<Caption>> {
    let config = LiveConfig {
        decoding: setup.decoding.clone(),
        masking: setup.masking,
        unbiased_final: setup.unbiased_final,
        ..LiveConfig::new(language)
    };
    let mut live = LiveTranslator::new(model, config)?;
    if setup.assisted {
        live = live.with_assistant(assistant)?;
    }
    Ok(live.sentence(updates)?)
}

/// Autoregressive re-translation against SSBD's configurations, every one in the same run.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// Draft model of the assisted configuration
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    assistant: String,

    /// Sentences of the benchmark set to translate
    #[arg(long, default_value_t = 8)]
    sentences: usize,

    /// Words per update
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    lag: u64,

    /// Target languages
    #[arg(long, value_delimiter = ',', default_value = "German,Chinese")]
    languages: Vec<String>,

    /// Also write the report as JSON here
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let (count, lag, languages) = (args.sentences, args.lag as usize, &args.languages);
    let (model_name, assistant_name) = (&args.model.model, &args.assistant);
    let sentences = read_sentences(count)?;
    let mut model = args.model.open()?;
    let mut assistant = open_model(assistant_name, &LoadOptions::default())?;
    let setups = setups();

    let mut tables = Vec::new();
    let mut notes = Vec::new();
    let bar = progress_bar(sentences.len() * languages.len(), "sentences");
    for language in languages {
        let by_characters =
            engine_mt::TranslationTask::new("English", language.as_str()).target_uses_characters();
        // Warm-up (weights are repacked on first use): one sentence, every setup, untimed.
        for setup in &setups {
            let updates = lag_k(&sentences[0].english, lag)?;
            run_sentence(&mut model, &mut assistant, setup, language, &updates)?;
        }
        let mut outcomes: Vec<Outcome> = setups.iter().map(|_| Outcome::default()).collect();
        let mut references = Vec::new();
        for sentence in &sentences {
            let updates = lag_k(&sentence.english, lag)?;
            // Every setup on this sentence back to back, so that the machine's drift hits all.
            for (setup, outcome) in setups.iter().zip(outcomes.iter_mut()) {
                let captions = run_sentence(&mut model, &mut assistant, setup, language, &updates)?;
                outcome.summary.add_sentence(&captions, by_characters);
                outcome.finals.push(
                    captions
                        .last()
                        .map(|c| c.output.clone())
                        .unwrap_or_default(),
                );
                outcome
                    .outputs
                    .extend(captions.iter().map(|c| c.output.clone()));
            }
            if let Some((_, reference)) = sentence.references.iter().find(|(l, _)| l == language) {
                references.push(reference.clone());
            }
            bar.inc(1);
            tracing::info!("{language}: {}", outcomes[0].finals.last().unwrap());
        }
        let ar = &outcomes[0];
        let ar_finals = ar.finals();
        let mut table = Table::new(
            format!(
                "English → {language}, {} sentences revealed {lag} words at a time ({} updates), {model_name}",
                sentences.len(),
                ar.summary.updates
            ),
            &[
                "decoding",
                "NE",
                "A/D",
                "A/O",
                "output tok/s",
                "speed-up",
                "target forwards",
                "chrF vs reference",
                "chrF vs AR",
                "outputs = AR",
            ],
        );
        for (setup, outcome) in setups.iter().zip(&outcomes) {
            let s = &outcome.summary;
            let finals = outcome.finals();
            let with_reference = if references.len() == finals.len() {
                format!(
                    "{:.1}",
                    chrf(
                        &finals,
                        &references.iter().map(String::as_str).collect::<Vec<_>>()
                    )
                )
            } else {
                "—".into()
            };
            table.push(vec![
                setup.label.clone(),
                format!("{:.2}", s.normalized_erasure()),
                if s.drafted == 0 {
                    "—".into()
                } else {
                    format!("{:.2}", s.accepted_per_drafted())
                },
                if s.drafted == 0 {
                    "—".into()
                } else {
                    format!("{:.2}", s.accepted_per_output())
                },
                format!("{:.1}", s.tokens_per_second()),
                format!(
                    "{:.2}×",
                    ar.summary.time.as_secs_f64() / s.time.as_secs_f64()
                ),
                format!("{}", s.target_forwards),
                with_reference,
                format!("{:.1}", chrf(&finals, &ar_finals)),
                format!("{}/{}", outcome.same_outputs(ar), ar.outputs.len()),
            ]);
        }
        tables.push(table);

        // The issue's targets, checked on this run for the default configuration and for plain
        // SSBD β = 0.2 (the paper's, biased final update, no mask).
        let outcome = |label: &str| {
            setups
                .iter()
                .position(|s| s.label == label)
                .map(|i| &outcomes[i])
                .with_context(|| format!("no setup {label}"))
        };
        notes.push(format!(
            "English → {language} against AR re-translation. {} {} β = 0 and β = 0 + draft model \
             gave AR's output on {} and {} of {} updates.",
            targets(
                "Default (SSBD β = 0.2, display-only mask-3, unbiased final)",
                outcome(DEFAULT)?,
                ar
            ),
            targets("Plain SSBD β = 0.2", outcome(BETA_02)?, ar),
            outcome(BETA_0)?.same_outputs(ar),
            outcome(ASSISTED)?.same_outputs(ar),
            ar.outputs.len()
        ));
    }
    bar.finish_and_clear();

    let report = Report {
        command: format!(
            "cargo run --release -p engine-mt --example bench_mt -- --model {model_name} --assistant {assistant_name} --sentences {count} --lag {lag} --languages {}",
            languages.join(",")
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
