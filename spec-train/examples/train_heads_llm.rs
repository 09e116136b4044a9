//! Trains multi-token prediction heads for a chat model on self-distilled data: the model's own
//! greedy answers to the prompts of `engine-llm/data/heads_training_prompts.txt`,
//! `ssd_training_prompts.txt` (both mostly about programming), `heads_general_prompts.txt`,
//! `heads_more_prompts.txt`, `heads_extra_prompts.txt` and `heads_broad_prompts.txt` (writing,
//! role play, reasoning, maths, coding, extraction, science, humanities, advice), all written
//! for the project, none from MT-Bench or the voice set, several answered in lockstep
//! (`spec_core::greedy_in_lockstep`),
//! with the last hidden state that predicted each token cached (one file of states per prompt
//! file, so a new prompt file costs only its own answers); then the heads are fitted with the
//! trunk frozen (`spec_train::heads::train`).
//!
//! ```sh
//! cargo run --release -p spec-train --example train_heads_llm -- qwen2.5-coder-1.5b-instruct \
//!     --heads 4 --kind latent [--max-tokens 160]
//! ```
//!
//! `cargo xtask train-heads MODEL …` runs it. The heads go to
//! `$SPECVOICE_MODELS/heads/MODEL-KIND-COUNT/` unless `--out` says otherwise.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use engine_llm::{LanguageModel, LoadOptions};
use indicatif::{ProgressBar, ProgressStyle};
use spec_core::{Decoder, HiddenStates};
use spec_models::Store;
use spec_nn::heads::weights_fingerprint;
use spec_train::cli::TrainArgs;
use spec_train::heads::{SelfDistill, TrainingSet};

#[derive(Parser, Debug)]
#[command(about = "Train multi-token prediction heads for a chat model")]
struct Args {
    /// Model (a name in the models folder, or a path).
    model: String,
    /// Prompt files, one prompt per line.
    #[arg(
        long,
        num_args = 1..,
        default_values = [
            "engine-llm/data/heads_training_prompts.txt",
            "engine-llm/data/ssd_training_prompts.txt",
            "engine-llm/data/heads_general_prompts.txt",
            "engine-llm/data/heads_more_prompts.txt",
            "engine-llm/data/heads_extra_prompts.txt",
            "engine-llm/data/heads_broad_prompts.txt",
        ]
    )]
    data: Vec<PathBuf>,
    /// Longest answer generated per prompt.
    #[arg(long, default_value_t = 160)]
    max_tokens: usize,
    /// Use only the first N prompts.
    #[arg(long)]
    limit: Option<usize>,
    /// Prompts answered in lockstep, one forward advancing each answer.
    #[arg(long, default_value_t = 8)]
    lockstep: usize,
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
    // One cached set per prompt file, so that a new file costs only its own answers.
    let data = TrainingSet::cached_per_file(
        &args.data,
        args.limit,
        args.refresh,
        |prompts, used| {
            heads_root.join(format!(
                "{name}-training-set-{prompts}-{}-{used}.safetensors",
                args.max_tokens
            ))
        },
        |prompts, path| self_distilled(&args, &mut lm, prompts, path),
    )?;
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

/// The model's greedy answer to every prompt (those of file `path`), with the hidden states that
/// predicted each token ([`SelfDistill::self_distilled`], `--lockstep` prompts at a time).
fn self_distilled(
    args: &Args,
    lm: &mut LanguageModel,
    prompts: &[String],
    path: &Path,
) -> Result<TrainingSet> {
    let bar = ProgressBar::new(prompts.len() as u64).with_style(ProgressStyle::with_template(
        "answering {bar:30} {pos}/{len} {msg}",
    )?);
    let started = Instant::now();
    let data = lm.self_distilled(
        prompts,
        args.max_tokens,
        args.lockstep,
        &mut |done, positions| {
            bar.set_position(done as u64);
            bar.set_message(format!("{positions} positions"));
        },
    )?;
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "answered the {} prompts of {}, {} in lockstep: {} tokens in {seconds:.1} s ({:.1} \
         tokens/s)",
        prompts.len(),
        path.display(),
        args.lockstep,
        data.positions(),
        data.positions() as f64 / seconds
    );
    Ok(data)
}
