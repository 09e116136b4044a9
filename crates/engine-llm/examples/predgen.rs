//! Speak a question into PredGen and watch the answer being prepared while you talk.
//!
//! ```sh
//! cargo run --release -p engine-llm --example predgen -- \
//!     --question "What are three tips for staying productive while working from home?"
//! cargo run --release -p engine-llm --example predgen -- --verifier top3 \
//!     --partials crates/engine-llm/data/partials.txt
//! cargo run --release -p engine-llm --example predgen -- --continuation draft \
//!     --draft qwen2.5-coder-0.5b-instruct --question "How do vaccines work?"
//! ```
//!
//! The question is revealed word by word at a speaking rate (or replayed from a file of ASR
//! partials); each turn prints PredGen's timeline, then the plain cascade's latency on the same
//! question for comparison. Time is simulated: it advances by the measured compute of each step
//! and skips ahead while the model waits for the next word.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use engine_llm::predgen::input::{read_partials, spoken_at_rate, PartialInput};
use engine_llm::predgen::tts::FixedLatencySynthesizer;
use engine_llm::{
    Continuation, LanguageModel, LoadOptions, Message, PredGen, PredGenConfig, Turn, Verifier,
};
use spec_core::{Decoder, LogitRows};

const USAGE: &str = "usage: predgen [--model M] [--draft D] [--verifier greedy|topK|reflection] \
[--continuation ar|jacobi[:L]|draft[:γ]] (--question TEXT… | --partials FILE) [--rate CPM] \
[--tts-latency MS] [--max-tokens N] [--no-baseline]";

struct Args {
    model: String,
    draft: Option<String>,
    config: PredGenConfig,
    turns: Vec<Vec<PartialInput>>,
    tts_latency: Duration,
    baseline: bool,
}

/// `greedy`, `top3` (any K), `reflection`.
fn parse_verifier(text: &str) -> Result<Verifier> {
    Ok(match text {
        "greedy" => Verifier::Greedy,
        "reflection" => Verifier::Reflection,
        top if top.starts_with("top") => Verifier::TopK(top[3..].parse().context("topK")?),
        other => bail!("unknown verifier `{other}`\n{USAGE}"),
    })
}

/// `ar`, `jacobi`, `jacobi:L`, `draft`, `draft:γ`.
fn parse_continuation(text: &str) -> Result<Continuation> {
    let (name, value) = text.split_once(':').unwrap_or((text, ""));
    let number = |default: usize| -> Result<usize> {
        if value.is_empty() {
            Ok(default)
        } else {
            Ok(value.parse()?)
        }
    };
    Ok(match name {
        "ar" => Continuation::Autoregressive,
        "jacobi" => Continuation::Jacobi { window: number(8)? },
        "draft" => Continuation::DraftModel { gamma: number(3)? },
        other => bail!("unknown continuation `{other}`\n{USAGE}"),
    })
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        model: "qwen2.5-coder-1.5b-instruct".into(),
        draft: None,
        config: PredGenConfig::default(),
        turns: Vec::new(),
        tts_latency: Duration::from_millis(200),
        baseline: true,
    };
    let mut questions = Vec::new();
    let mut partials = None;
    let mut rate = engine_llm::predgen::input::DEFAULT_CHARS_PER_MINUTE;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--model" => args.model = value()?,
            "--draft" => args.draft = Some(value()?),
            "--verifier" => args.config.verifier = parse_verifier(&value()?)?,
            "--continuation" => args.config.continuation = parse_continuation(&value()?)?,
            "--question" => questions.push(value()?),
            "--partials" => partials = Some(value()?),
            "--rate" => rate = value()?.parse()?,
            "--tts-latency" => args.tts_latency = Duration::from_millis(value()?.parse()?),
            "--max-tokens" => args.config.max_answer_tokens = value()?.parse()?,
            "--no-baseline" => args.baseline = false,
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    args.turns = match (questions.is_empty(), partials) {
        (false, None) => questions
            .iter()
            .map(|q| spoken_at_rate(q, rate))
            .collect::<Result<_, _>>()?,
        (true, Some(path)) => read_partials(path.as_ref())?,
        _ => bail!("give --question (one or more) or --partials\n{USAGE}"),
    };
    if matches!(args.config.continuation, Continuation::DraftModel { .. }) && args.draft.is_none() {
        args.draft = Some("qwen2.5-coder-0.5b-instruct".into());
    }
    Ok(args)
}

fn summary(label: &str, turn: &Turn) -> String {
    format!(
        "{label:<10} TTFS {:>6.0} ms  NFETFS {:>3}  audio latency {:>6.0} ms  answer {:>6.0} ms  \
         tokens during input {:>3}",
        turn.time_to_first_sentence.as_secs_f64() * 1e3,
        turn.forwards_to_first_sentence,
        turn.audio_latency.as_secs_f64() * 1e3,
        turn.answer_latency.as_secs_f64() * 1e3,
        turn.tokens_during_input
    )
}

fn warm_up(model: &mut LanguageModel) -> Result<()> {
    let prompt = model.chat_prompt(&[Message::user("Hello!")])?;
    model.model.forward_tokens(&prompt, LogitRows::Last(1))?;
    model.model.reset();
    Ok(())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let options = LoadOptions::default();
    let mut model = LanguageModel::open(&args.model, &options)?;
    let mut draft = match &args.draft {
        Some(name) => Some(LanguageModel::open(name, &options)?),
        None => None,
    };
    // The first forward repacks the weights (seconds for the 1.5B): do it before timing.
    warm_up(&mut model)?;
    if let Some(draft) = draft.as_mut() {
        warm_up(draft)?;
    }
    let mut tts = FixedLatencySynthesizer::new(args.tts_latency);
    let mut predgen_turns = Vec::new();
    {
        let mut session = PredGen::new(&mut model, args.config.clone())?;
        if let Some(draft) = draft.as_mut() {
            session = session.with_draft(draft)?;
        }
        for inputs in &args.turns {
            let turn = session.turn(inputs, &mut tts)?;
            println!(
                "\n=== PredGen ({:?}, {:?}) ===",
                args.config.verifier, args.config.continuation
            );
            for event in &turn.timeline {
                println!("{event}");
            }
            println!("\nanswer: {}\n", turn.answer);
            predgen_turns.push(turn);
        }
    }
    if args.baseline {
        let mut session = PredGen::new(&mut model, args.config.clone())?;
        let mut rows = Vec::new();
        for (inputs, predgen) in args.turns.iter().zip(&predgen_turns) {
            let baseline = session.baseline_turn(inputs, &mut tts)?;
            println!("question: {}", baseline.question);
            println!("{}", summary("PredGen", predgen));
            println!("{}\n", summary("cascade", &baseline));
            rows.push((baseline, predgen));
        }
        println!(
            "| question | cascade audio latency | PredGen audio latency | speed-up | same answer |"
        );
        println!("|---|---|---|---|---|");
        for (baseline, predgen) in rows {
            let (before, after) = (
                baseline.audio_latency.as_secs_f64(),
                predgen.audio_latency.as_secs_f64(),
            );
            println!(
                "| {} | {:.0} ms | {:.0} ms | {} | {} |",
                baseline.question,
                before * 1e3,
                after * 1e3,
                if after > 0.0 {
                    format!("{:.1}×", before / after)
                } else {
                    "—".into()
                },
                if predgen.answer == baseline.answer {
                    "yes"
                } else {
                    "no"
                }
            );
        }
    }
    Ok(())
}
