//! Benchmark of multi-token prediction heads on a chat model: greedy decoding against decoding
//! with trained heads (greedy acceptance: lossless; chains, a branching tree, chains gated on
//! the heads' confidence, a chain with lookup chains merged in) on the first turns of MT-Bench
//! (never used to train the heads), same model, same run, prompt by prompt (greedy, then each
//! drafter). Reports decoding tokens per second after the first token, the speed-up, target
//! forwards per token, acceptance per depth and whether every answer is identical.
//!
//! ```sh
//! cargo run --release -p engine-llm --example bench_heads_llm -- [--model qwen2.5-coder-1.5b-instruct]
//!     [--heads chained-1] [--chains 1,2,4] [--questions 10] [--tokens 128] [--lookup 2,3]
//!     [--json PATH]
//! ```
//!
//! The heads come from `cargo xtask train-heads MODEL` (`$SPECVOICE_MODELS/heads/NAME-KIND-COUNT`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine_llm::{lookup_drafter, LanguageModel, LoadOptions, Message};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_cli::open_heads;
use spec_core::report::{speedup, Report, Table};
use spec_core::{
    generate, speculate, AcceptanceRule, DecodeStats, Decoder, HeadsDrafter, HeadsTree,
    MergedDrafter, SamplingConfig, Speculation, StopConditions, Verification,
};
use spec_models::{mt_bench, Store};

#[derive(Parser, Debug)]
#[command(about = "A chat model with multi-token prediction heads against greedy decoding")]
struct Args {
    #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct")]
    model: String,
    /// The heads: `$SPECVOICE_MODELS/heads/MODEL-<this>`.
    #[arg(long, default_value = "chained-1")]
    heads: String,
    /// MT-Bench first turns.
    #[arg(long, default_value_t = 10)]
    questions: usize,
    /// Take the questions spread evenly over MT-Bench's eight categories instead of the first
    /// ones (the first ten are all writing).
    #[arg(long)]
    spread: bool,
    /// Longest answer.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Chains to measure, by depth (the shorter ones draft with the first heads only); by
    /// default 1, 2 and all the heads. A chain of one costs a two-token forward, which on
    /// memory-bound machines is about a one-token one.
    #[arg(long, value_delimiter = ',')]
    chains: Vec<usize>,
    /// Compute the output layer's rows only where the verification reaches them.
    #[arg(long)]
    rows_on_demand: bool,
    /// Also the chain drafting only the depths whose head is at least this sure of its guess,
    /// once per value.
    #[arg(long, value_delimiter = ',', default_values_t = [0.4, 0.7])]
    min_probability: Vec<f32>,
    /// The first depths drafted whatever the heads' certainty in the `--min-probability` rows
    /// (the gate applies to the deeper ones).
    #[arg(long, default_value_t = 0)]
    ungated_depths: usize,
    /// Also the chains of `--lookup-chains` with lookup chains of at most this many tokens
    /// merged in (copied from where the last two or three tokens occurred before in the prompt
    /// or answer), once per value.
    #[arg(long, value_delimiter = ',')]
    lookup: Vec<usize>,
    /// The heads' chains the lookup chains are merged into, by depth (by default the chain of
    /// one).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    lookup_chains: Vec<usize>,
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let store = Store::from_env()?;
    let mut lm = LanguageModel::open(&args.model, &LoadOptions::default())?;
    let name = store.resolve(&args.model)?.name;
    let heads = open_heads(&lm, &args.model, &args.heads)?;
    let count = heads.info().count;
    let chains = if args.chains.is_empty() {
        let mut defaults = vec![1, 2, count];
        defaults.retain(|&d| d <= count);
        defaults.dedup();
        defaults
    } else {
        args.chains.clone()
    };
    if let Some(&bad) = chains
        .iter()
        .chain(&args.lookup_chains)
        .find(|&&d| d == 0 || d > count)
    {
        bail!("a chain of {bad} (--chains, --lookup-chains): chains are 1 to {count} heads deep");
    }
    let questions = match args.spread {
        true => mt_bench::spread(mt_bench::questions(&store)?, Some(args.questions)),
        false => mt_bench::questions(&store)?
            .into_iter()
            .take(args.questions)
            .collect(),
    };
    let prompts: Vec<Vec<u32>> = questions
        .iter()
        .map(|q| lm.chat_prompt(&[Message::user(q.turns[0].as_str())]))
        .collect::<engine_llm::Result<_>>()?;
    let stop = StopConditions::new(args.tokens).with_eos(lm.tokenizer.end_tokens().iter().copied());

    let output_rows = if args.rows_on_demand {
        Verification::OnDemand
    } else {
        Verification::Batched
    };
    let mut drafters = Vec::new();
    for &depth in &chains {
        drafters.push((
            format!("heads, chain of {depth}"),
            HeadsDrafter::new(&heads, HeadsTree::chain(depth))?,
            None,
        ));
    }
    drafters.push((
        format!("heads, tree ({count} deep, 2 wide)"),
        HeadsDrafter::new(&heads, HeadsTree::branching(count, 2))?,
        None,
    ));
    for &p in &args.min_probability {
        let depths = match args.ungated_depths {
            0 => "depths".to_string(),
            n => format!("depths after the first {n}"),
        };
        drafters.push((
            format!("heads, chain of {count}, {depths} with p ≥ {p}"),
            HeadsDrafter::new(&heads, HeadsTree::chain(count))?
                .with_min_probability(p)?
                .with_ungated_depths(args.ungated_depths),
            None,
        ));
    }
    for &max_draft in &args.lookup {
        lookup_drafter(max_draft)?;
        for &depth in &args.lookup_chains {
            drafters.push((
                format!("heads, chain of {depth} + lookup ≤ {max_draft}"),
                HeadsDrafter::new(&heads, HeadsTree::chain(depth))?,
                Some(max_draft),
            ));
        }
    }
    // Prompt by prompt, greedy decoding and then every drafter: this machine's speed drifts
    // from minute to minute, and each system meets the same minutes.
    let mut greedy = DecodeStats::default();
    let mut results = vec![(DecodeStats::default(), 0usize); drafters.len()];
    // Per category (in question order): greedy decoding's and the first drafter's statistics.
    let mut by_category: Vec<(&str, DecodeStats, DecodeStats)> = Vec::new();
    for (prompt, question) in prompts.iter().zip(&questions) {
        lm.model.reset();
        let expected = generate(
            &mut lm.model,
            prompt,
            &SamplingConfig::greedy(),
            &stop,
            &mut StdRng::seed_from_u64(0),
            &mut |_| {},
        )?;
        greedy.merge(&expected.stats);
        if by_category
            .last()
            .is_none_or(|(c, ..)| *c != question.category)
        {
            let empty = DecodeStats::default();
            by_category.push((&question.category, empty.clone(), empty));
        }
        let last = by_category.len() - 1;
        let category = &mut by_category[last];
        category.1.merge(&expected.stats);
        for (i, ((_, drafter, lookup), (stats, same))) in
            drafters.iter().zip(results.iter_mut()).enumerate()
        {
            lm.model.reset();
            let mut drafting = MergedDrafter {
                first: drafter,
                second: lookup.map(lookup_drafter).transpose()?,
            };
            let rule = AcceptanceRule::greedy();
            let out = speculate(
                &mut lm.model,
                &mut drafting,
                prompt,
                Speculation::new(&rule).verified(output_rows),
                &stop,
                &mut |_| {},
            )?;
            *same += usize::from(out.tokens == expected.tokens);
            stats.merge(&out.stats);
            if i == 0 {
                category.2.merge(&out.stats);
            }
        }
    }
    let mut table = Table::new(
        format!(
            "{name} with {count} {:?} heads on {} MT-Bench first turns ({}{}; ≤ {} tokens), greedy acceptance, output rows {:?}, 2 threads",
            heads.info().kind,
            prompts.len(),
            if args.spread { "spread evenly: " } else { "" },
            by_category.iter().map(|c| c.0).collect::<Vec<_>>().join(", "),
            args.tokens,
            output_rows
        ),
        &[
            "decoding",
            "decode tok/s",
            "speed-up",
            "target forwards / token",
            "tokens / forward",
            "accepted at depth 1…K",
            "heads' share",
            "same answers",
        ],
    );
    let per_token = |s: &DecodeStats| s.target_forwards as f64 / s.generated_tokens.max(1) as f64;
    table.push(vec![
        "greedy".into(),
        format!("{:.2}", greedy.decode_tokens_per_second()),
        "1.00×".into(),
        format!("{:.3}", per_token(&greedy)),
        "1".into(),
        "–".into(),
        "–".into(),
        format!("{0}/{0}", prompts.len()),
    ]);
    for ((label, ..), (stats, same)) in drafters.iter().zip(&results) {
        let steps = stats.steps.len().max(1) as f64;
        let depths: Vec<String> = (1..=count)
            .map(|k| {
                let reached = stats.steps.iter().filter(|s| s.accepted >= k).count();
                format!("{:.0}", 100.0 * reached as f64 / steps)
            })
            .collect();
        table.push(vec![
            label.clone(),
            format!("{:.2}", stats.decode_tokens_per_second()),
            speedup(
                stats.decode_tokens_per_second(),
                greedy.decode_tokens_per_second(),
            ),
            format!("{:.3}", per_token(stats)),
            format!("{:.2}", stats.tokens_per_target_pass()),
            format!("{} %", depths.join(" / ")),
            format!(
                "{:.0} %",
                100.0 * stats.draft_time.as_secs_f64() / stats.total_time.as_secs_f64()
            ),
            format!("{same}/{}", prompts.len()),
        ]);
    }
    let mut tables = vec![table];
    if by_category.len() > 1 {
        let mut per_category = Table::new(
            format!("By MT-Bench category: {}", drafters[0].0),
            &[
                "category",
                "questions",
                "greedy tok/s",
                "with heads",
                "speed-up",
                "accepted at depth 1",
            ],
        );
        for (category, plain, drafted) in &by_category {
            let accepted = drafted.steps.iter().filter(|s| s.accepted >= 1).count();
            per_category.push(vec![
                category.to_string(),
                questions
                    .iter()
                    .filter(|q| q.category == *category)
                    .count()
                    .to_string(),
                format!("{:.2}", plain.decode_tokens_per_second()),
                format!("{:.2}", drafted.decode_tokens_per_second()),
                speedup(
                    drafted.decode_tokens_per_second(),
                    plain.decode_tokens_per_second(),
                ),
                format!(
                    "{:.0} %",
                    100.0 * accepted as f64 / drafted.steps.len().max(1) as f64
                ),
            ]);
        }
        tables.push(per_category);
    }
    let report = Report {
        command: format!(
            "cargo run --release -p engine-llm --example bench_heads_llm -- --model {} --heads {} --questions {}{} --tokens {} --chains {} --min-probability {}{}{}{}",
            args.model,
            args.heads,
            args.questions,
            if args.spread { " --spread" } else { "" },
            args.tokens,
            comma_separated(&chains),
            comma_separated(&args.min_probability),
            match args.ungated_depths {
                0 => String::new(),
                n => format!(" --ungated-depths {n}"),
            },
            if args.rows_on_demand { " --rows-on-demand" } else { "" },
            if args.lookup.is_empty() {
                String::new()
            } else if args.lookup_chains == [1] {
                format!(" --lookup {}", comma_separated(&args.lookup))
            } else {
                format!(
                    " --lookup {} --lookup-chains {}",
                    comma_separated(&args.lookup),
                    comma_separated(&args.lookup_chains)
                )
            }
        ),
        tables,
        notes: vec![format!(
            "Heads trained by `{}` (validation top-1 {:?}). Decode tok/s counts the tokens after each answer's first over the time after it (the prompt's prefill excluded), as in the llm table. \"p ≥ x\": a depth is drafted only while its head's softmax gives its first guess at least x, and none deeper after one falls short (`HeadsDrafter::with_min_probability`: shorter verifying forwards where the heads are unsure; lossless).",
            heads.info().trained_for.command,
            heads
                .info()
                .validation_accuracy
                .iter()
                .map(|a| format!("{:.1} %", 100.0 * a))
                .collect::<Vec<_>>()
        )],
        ..Report::default()
    };
    print!("{}", report.markdown());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}

/// `values` as a command line lists them: `1,2,4`.
fn comma_separated<T: ToString>(values: &[T]) -> String {
    values
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
