//! Trains multi-token prediction heads for a chat model on self-distilled data: the model's own
//! greedy answers to the prompts of `engine-llm/data/heads_training_prompts.txt` (written for
//! this, none from MT-Bench), teacher-forced once to cache the last hidden states; then the heads
//! are fitted with the trunk frozen (`spec_nn::heads::train`).
//!
//! ```sh
//! cargo run --release -p engine-llm --example train_heads_llm -- qwen2.5-coder-1.5b-instruct \
//!     --heads 4 --kind latent [--max-tokens 160]
//! ```
//!
//! `cargo xtask train-heads MODEL …` runs it. The heads go to
//! `$SPECVOICE_MODELS/heads/MODEL-KIND-COUNT/` unless `--out` says otherwise.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use engine_llm::cli::read_text_lines;
use engine_llm::{LanguageModel, LoadOptions, Message};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::{generate, Decoder, HiddenStates, LogitRows, SamplingConfig, StopConditions};
use spec_models::Store;
use spec_nn::heads::cli::TrainArgs;
use spec_nn::heads::{weights_fingerprint, TrainingSet};

#[derive(Parser, Debug)]
#[command(about = "Train multi-token prediction heads for a chat model")]
struct Args {
    /// Model (a name in the models folder, or a path).
    model: String,
    /// Prompts, one per line.
    #[arg(long, default_value = "engine-llm/data/heads_training_prompts.txt")]
    data: PathBuf,
    /// Longest answer generated per prompt.
    #[arg(long, default_value_t = 160)]
    max_tokens: usize,
    /// Use only the first N prompts.
    #[arg(long)]
    limit: Option<usize>,
    #[command(flatten)]
    training: TrainArgs,
    /// Generate again even when the cached hidden states exist.
    #[arg(long)]
    refresh: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let store = Store::from_env()?;
    let mut lm = LanguageModel::open(&args.model, &LoadOptions::default())
        .with_context(|| format!("opening {}", args.model))?;
    let name = store.resolve(&args.model)?.name;
    let fingerprint = weights_fingerprint(&lm.weights)?;
    let heads_root = store.root().join("heads");
    let prompts_fingerprint = weights_fingerprint(&args.data)
        .with_context(|| format!("reading {}", args.data.display()))?;
    let limit = args.limit.map_or("all".into(), |l| l.to_string());
    let cache = heads_root.join(format!(
        "{name}-training-set-{}-{}-{limit}.safetensors",
        &prompts_fingerprint[..16],
        args.max_tokens
    ));
    let data = TrainingSet::cached(&cache, args.refresh, || self_distilled(&args, &mut lm))?;
    println!(
        "training set: {} answers, {} positions",
        data.len(),
        data.positions()
    );

    let vocab: Vec<u32> = (0..lm.model.vocab_size() as u32).collect();
    let unembedding = lm.model.unembedding_rows(&vocab)?;
    let out =
        args.training
            .train_and_save(&data, &unembedding, &heads_root, &name, &fingerprint)?;
    println!("heads written to {}", out.display());
    Ok(())
}

/// The model's greedy answer to every prompt, with the hidden states that predicted each token.
fn self_distilled(args: &Args, lm: &mut LanguageModel) -> Result<TrainingSet> {
    let prompts = read_text_lines(&[&args.data], args.limit)?;
    let mut data = TrainingSet::new(lm.model.hidden_size());
    let stop =
        StopConditions::new(args.max_tokens).with_eos(lm.tokenizer.end_tokens().iter().copied());
    let mut rng = StdRng::seed_from_u64(0);
    let bar = ProgressBar::new(prompts.len() as u64).with_style(ProgressStyle::with_template(
        "answering {bar:30} {pos}/{len} {msg}",
    )?);
    for (i, prompt) in prompts.iter().enumerate() {
        let context = lm.chat_prompt(&[Message::user(prompt.as_str())])?;
        let answer = generate(
            &mut lm.model,
            &context,
            &SamplingConfig::greedy(),
            &stop,
            &mut rng,
            &mut |_| {},
        )?;
        // Teacher-forced once: the state at the prompt's last position predicts the first
        // answer token, and so on.
        let sequence: Vec<u32> = context.iter().chain(&answer.tokens).copied().collect();
        lm.model.reset();
        lm.model.forward_tokens(&sequence, LogitRows::None)?;
        let hidden = lm
            .model
            .last_hidden()?
            .narrow(0, context.len() - 1, answer.tokens.len())?;
        data.push(hidden, answer.tokens, i as u32)?;
        bar.inc(1);
        bar.set_message(format!("{} positions", data.positions()));
    }
    bar.finish_and_clear();
    Ok(data)
}
