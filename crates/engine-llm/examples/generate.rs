//! Generate text with a chat model, optionally with a draft model for speculative decoding.
//!
//! ```sh
//! cargo run --release -p engine-llm --example generate -- \
//!     --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --gamma 4 \
//!     --chat "Explain speculative decoding in two sentences."
//! ```
//!
//! `--model`/`--draft` take a GGUF file, a model folder, or the name of a folder in
//! `$SPECVOICE_MODELS` (default `~/.cache/specvoice/models`).

use std::io::Write;

use anyhow::{bail, Context, Result};
use engine_llm::{forward_costs, LanguageModel, LoadOptions, Message};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::{
    generate, speculative_generate, AcceptanceRule, CostAwarePolicy, DraftLength, SamplingConfig,
    SpeculativeConfig, StopConditions,
};

struct Args {
    model: String,
    draft: Option<String>,
    gamma: usize,
    cost_aware: bool,
    adaptive: Option<f32>,
    chat: Option<String>,
    prompt: Option<String>,
    system: Option<String>,
    max_tokens: usize,
    sampling: SamplingConfig,
    seed: u64,
}

const USAGE: &str =
    "usage: generate --model M [--draft D] [--gamma N] [--adaptive CONFIDENCE] [--cost-aware] \
(--chat TEXT | --prompt TEXT) [--system TEXT] [--max-tokens N] [--temperature T] [--top-k K] \
[--top-p P] [--repetition-penalty R] [--seed S]";

fn parse_args() -> Result<Args> {
    let mut args = Args {
        model: String::new(),
        draft: None,
        gamma: 4,
        cost_aware: false,
        adaptive: None,
        chat: None,
        prompt: None,
        system: None,
        max_tokens: 256,
        sampling: SamplingConfig::greedy(),
        seed: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--model" => args.model = value()?,
            "--draft" => args.draft = Some(value()?),
            "--gamma" => args.gamma = value()?.parse()?,
            "--adaptive" => args.adaptive = Some(value()?.parse()?),
            "--cost-aware" => args.cost_aware = true,
            "--chat" => args.chat = Some(value()?),
            "--prompt" => args.prompt = Some(value()?),
            "--system" => args.system = Some(value()?),
            "--max-tokens" => args.max_tokens = value()?.parse()?,
            "--temperature" => args.sampling.temperature = value()?.parse()?,
            "--top-k" => args.sampling.top_k = Some(value()?.parse()?),
            "--top-p" => args.sampling.top_p = Some(value()?.parse()?),
            "--repetition-penalty" => args.sampling.repetition_penalty = value()?.parse()?,
            "--seed" => args.seed = value()?.parse()?,
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    if args.model.is_empty() || args.chat.is_none() == args.prompt.is_none() {
        bail!("{USAGE}");
    }
    Ok(args)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let options = LoadOptions::default();
    let target = LanguageModel::open(&args.model, &options)?;
    let draft = match &args.draft {
        Some(name) => {
            let draft = LanguageModel::open(name, &options)?;
            target.check_draft(&draft)?;
            Some(draft)
        }
        None => None,
    };
    let context = match (&args.chat, &args.prompt) {
        (Some(chat), _) => {
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(Message::system(system.clone()));
            }
            messages.push(Message::user(chat.clone()));
            target.chat_prompt(&messages)?
        }
        (None, Some(prompt)) => target.tokenizer.encode(prompt)?,
        (None, None) => unreachable!("checked in parse_args"),
    };
    let stop = StopConditions::new(args.max_tokens)
        .with_eos(target.tokenizer.end_tokens().iter().copied());
    let mut rng = StdRng::seed_from_u64(args.seed);
    let tokenizer = target.tokenizer.clone();
    let mut shown = String::new();
    let mut produced = Vec::new();
    let mut on_token = |token: u32| {
        produced.push(token);
        if let Ok(text) = tokenizer.decode_text(&produced) {
            print!("{}", &text[shown.len().min(text.len())..]);
            let _ = std::io::stdout().flush();
            shown = text;
        }
    };
    let mut target_model = target.model;
    let generation = match draft {
        None => generate(
            &mut target_model,
            &context,
            &args.sampling,
            &stop,
            &mut rng,
            &mut on_token,
        )?,
        Some(draft) => {
            let mut draft_model = draft.model;
            let draft_length = if args.cost_aware {
                let target_costs = forward_costs(&mut target_model, &target.weights)?;
                let draft_costs = forward_costs(&mut draft_model, &draft.weights)?;
                DraftLength::CostAware(CostAwarePolicy::new(target_costs, draft_costs, args.gamma))
            } else if let Some(min_confidence) = args.adaptive {
                DraftLength::Adaptive {
                    min_confidence,
                    max: args.gamma,
                }
            } else {
                DraftLength::Fixed(args.gamma)
            };
            let config = SpeculativeConfig {
                draft_length,
                rule: if args.sampling.is_greedy() {
                    AcceptanceRule::greedy()
                } else {
                    AcceptanceRule::speculative_sampling(0.0)
                },
                sampling: args.sampling.clone(),
            };
            speculative_generate(
                &mut target_model,
                &mut draft_model,
                &context,
                &config,
                &stop,
                &mut rng,
                &mut on_token,
            )?
        }
    };
    println!("\n\n[{:?}] {}", generation.finish, generation.stats);
    Ok(())
}
