//! Chat with a model, streaming its answer, optionally with a draft model for speculative
//! decoding.
//!
//! ```sh
//! cargo run --release -p engine-llm --example generate -- \
//!     --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --gamma 4 \
//!     --chat "Explain speculative decoding in two sentences."
//! ```
//!
//! `--model`/`--draft` take a GGUF file, a model folder, or the name of a folder in
//! `$SPECVOICE_MODELS` (default `~/.cache/specvoice/models`). `--heads chained-1` decodes with
//! the model's prediction heads instead (trained by `cargo xtask train-heads`; greedy, the same
//! tokens as plain decoding). `--cancel-after N` cancels the answer after N streamed pieces of
//! text, as a user interface's stop button would.

use std::io::Write;

use anyhow::Result;
use clap::Parser;
use engine_llm::{
    forward_costs, CancelToken, DraftLength, Flow, LoadOptions, Message, Speculation,
};
use spec_cli::{init_logging, open_heads, open_model, GenerationArgs, ModelArgs};
use spec_core::{CostAwarePolicy, HeadsDrafter, HeadsTree};

/// Chat with a model, streaming its answer, optionally with a draft model for speculative
/// decoding.
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

    /// Decode with the model's prediction heads `$SPECVOICE_MODELS/heads/MODEL-<this>` (greedy)
    #[arg(long, conflicts_with = "draft")]
    heads: Option<String>,

    /// With --heads, also verify runs of at most this many tokens copied from where the last
    /// tokens occurred before (0: none)
    #[arg(long, default_value_t = 2, requires = "heads")]
    lookup: usize,

    /// A user message, sent with the model's chat template
    #[arg(long)]
    chat: Option<String>,

    /// Raw text to continue, without a chat template
    #[arg(long)]
    prompt: Option<String>,

    /// A system message before --chat
    #[arg(long, requires = "chat")]
    system: Option<String>,

    /// End the answer before this string (may be repeated)
    #[arg(long = "stop", value_name = "TEXT")]
    stops: Vec<String>,

    /// Cancel the answer after this many streamed pieces of text (about one per token)
    #[arg(long, value_name = "N")]
    cancel_after: Option<usize>,

    #[command(flatten)]
    generation: GenerationArgs,
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let mut model = args.model.open()?;
    let mut options = args.generation.options();
    for stop in &args.stops {
        options = options.stop_string(stop.clone());
    }
    if let Some(name) = &args.draft {
        let mut draft = open_model(name, &LoadOptions::default())?;
        let gamma = args.gamma as usize;
        let length = if args.cost_aware {
            let target_costs = forward_costs(&mut model.model, &model.weights)?;
            let draft_costs = forward_costs(&mut draft.model, &draft.weights)?;
            DraftLength::CostAware(CostAwarePolicy::new(target_costs, draft_costs, gamma))
        } else if let Some(min_confidence) = args.adaptive {
            DraftLength::Adaptive {
                min_confidence,
                max: gamma,
            }
        } else {
            DraftLength::Fixed(gamma)
        };
        model.set_draft(draft)?;
        options = options.speculation(Speculation::Draft(length));
    }
    if let Some(variant) = &args.heads {
        let heads = open_heads(&model, &args.model.model, variant)?;
        let depth = heads.info().count;
        model.set_heads(HeadsDrafter::new(heads, HeadsTree::chain(depth))?)?;
        options = options.speculation(Speculation::Heads {
            lookup: args.lookup,
        });
    }
    let cancel = CancelToken::new();
    options = options.cancel_token(cancel.clone());

    let mut pieces = 0;
    let on_delta = |delta: &str| {
        print!("{delta}");
        let _ = std::io::stdout().flush();
        pieces += 1;
        if args.cancel_after.is_some_and(|n| pieces >= n) {
            cancel.cancel();
        }
        Flow::Continue
    };
    let answer = match (&args.chat, &args.prompt) {
        (Some(chat), _) => {
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(Message::system(system.clone()));
            }
            messages.push(Message::user(chat.clone()));
            model.chat_stream(&messages, &options, on_delta)?
        }
        (None, Some(prompt)) => {
            let ids = model.tokenizer.encode(prompt)?;
            model.complete_stream(&ids, &options, on_delta)?
        }
        (None, None) => unreachable!("clap requires one of them"),
    };
    println!("\n\n[{:?}] {}", answer.finish, answer.stats);
    Ok(())
}
