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

use anyhow::Result;
use clap::Parser;
use engine_llm::cli::{init_logging, open_model, GenerationArgs, ModelArgs};
use engine_llm::{forward_costs, LoadOptions, Message};
use spec_core::{
    generate, speculative_generate, AcceptanceRule, CostAwarePolicy, DraftLength, SpeculativeConfig,
};

/// Generate text with a chat model, optionally with a draft model for speculative decoding.
#[derive(Parser)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["chat", "prompt"])))]
struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// Draft model (same vocabulary) for speculative decoding
    #[arg(long)]
    draft: Option<String>,

    /// Tokens drafted per step (the most, with --adaptive or --cost-aware)
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=31))]
    gamma: u64,

    /// Stop drafting once the draft's probability of its token falls below this
    #[arg(long, value_name = "CONFIDENCE", conflicts_with = "cost_aware")]
    adaptive: Option<f32>,

    /// Choose each step's draft length from the measured forward costs of both models
    #[arg(long)]
    cost_aware: bool,

    /// A user message, sent with the model's chat template
    #[arg(long)]
    chat: Option<String>,

    /// Raw text to continue, without a chat template
    #[arg(long)]
    prompt: Option<String>,

    /// A system message before --chat
    #[arg(long, requires = "chat")]
    system: Option<String>,

    #[command(flatten)]
    generation: GenerationArgs,
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let target = args.model.open()?;
    let draft = match &args.draft {
        Some(name) => {
            let draft = open_model(name, &LoadOptions::default())?;
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
        (None, None) => unreachable!("clap requires one of them"),
    };
    let stop = args.generation.stop(target.tokenizer.end_tokens());
    let sampling = args.generation.sampling();
    let mut rng = args.generation.rng();
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
            &sampling,
            &stop,
            &mut rng,
            &mut on_token,
        )?,
        Some(draft) => {
            let mut draft_model = draft.model;
            let gamma = args.gamma as usize;
            let draft_length = if args.cost_aware {
                let target_costs = forward_costs(&mut target_model, &target.weights)?;
                let draft_costs = forward_costs(&mut draft_model, &draft.weights)?;
                DraftLength::CostAware(CostAwarePolicy::new(target_costs, draft_costs, gamma))
            } else if let Some(min_confidence) = args.adaptive {
                DraftLength::Adaptive {
                    min_confidence,
                    max: gamma,
                }
            } else {
                DraftLength::Fixed(gamma)
            };
            let config = SpeculativeConfig {
                draft_length,
                rule: if sampling.is_greedy() {
                    AcceptanceRule::greedy()
                } else {
                    AcceptanceRule::speculative_sampling(0.0)
                },
                sampling: sampling.clone(),
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
