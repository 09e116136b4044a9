//! Trains a Speech Speculative Decoding draft for a chat model (`engine_llm::ssd`, trained by
//! `spec_train::ssd`): the model's own lower 2 and upper 6 layers, the lower ones and a
//! shortlist head retrained on the model's outputs. Data: the model's sampled answers to the
//! prompts of `engine-llm/data/ssd_training_prompts.txt` and `heads_training_prompts.txt`
//! (written for the project; none from MT-Bench or the voice set), each teacher-forced once to
//! keep the model's top next-token probabilities at every answer position.
//!
//! ```sh
//! cargo run --release -p spec-train --example train_ssd_draft -- qwen2.5-coder-0.5b-instruct
//! ```
//!
//! `cargo xtask train-ssd-draft MODEL …` runs it. The draft goes to `$SPECVOICE_MODELS/ssd/MODEL/`
//! unless `--out` says otherwise; the labelled answers are cached beside it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Parser;
use engine_llm::ssd::{draft_dir, Backbone, DistilledSequence, SsdDraftWeights};
use engine_llm::{LanguageModel, LoadOptions, Message};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_cli::{open_model, progress_bar};
use spec_core::{generate, SamplingConfig, StopConditions};
use spec_models::Store;
use spec_nn::heads::weights_fingerprint;
use spec_train::cli::{read_text_lines, SsdTrainArgs};

#[derive(Parser, Debug)]
#[command(about = "Train an SSD draft (the model's own lower and upper layers) for a chat model")]
struct Args {
    /// Model (a name in the models folder, or a path).
    model: String,
    /// Prompt files, one prompt per line.
    #[arg(
        long,
        num_args = 1..,
        default_values = [
            "engine-llm/data/ssd_training_prompts.txt",
            "engine-llm/data/heads_training_prompts.txt",
        ]
    )]
    data: Vec<PathBuf>,
    /// Longest answer generated per prompt.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Temperature of the answers (the contexts the draft will see when sampling).
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Use only the first N prompts.
    #[arg(long)]
    limit: Option<usize>,
    #[command(flatten)]
    training: SsdTrainArgs,
    /// Output folder [default: $SPECVOICE_MODELS/ssd/MODEL].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Answer and label again even when the cached labels exist.
    #[arg(long)]
    refresh: bool,
}

fn main() -> Result<()> {
    spec_cli::init_logging();
    let args = Args::parse();
    let store = Store::from_env()?;
    let mut lm = open_model(&args.model, &LoadOptions::default())
        .with_context(|| format!("opening {}", args.model))?;
    let name = store.resolve(&args.model)?.name;
    let fingerprint = weights_fingerprint(&lm.weights)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| draft_dir(store.root(), &name));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    let files: Vec<&Path> = args.data.iter().map(PathBuf::as_path).collect();
    let prompts = read_text_lines(&files, args.limit)?;
    let cache = out.join(format!(
        "labels-{}-{}-{}-t{}-k{}.json",
        &fingerprint[..16],
        prompts.len(),
        args.max_tokens,
        args.temperature,
        args.training.top_k
    ));
    let data: Vec<DistilledSequence> = match std::fs::read(&cache) {
        Ok(bytes) if !args.refresh => serde_json::from_slice(&bytes)
            .with_context(|| format!("reading the cached labels {}", cache.display()))?,
        _ => {
            let data = self_distilled(&args, &prompts, &mut lm)?;
            std::fs::write(&cache, serde_json::to_vec(&data)?)
                .with_context(|| format!("writing {}", cache.display()))?;
            data
        }
    };
    let positions: usize = data.iter().map(|s| s.labels.len()).sum();
    println!(
        "training set: {} answers, {positions} positions",
        data.len()
    );

    let trained = args.training.train(&Backbone::text(&lm.model), &data)?;
    let command = format!(
        "cargo xtask train-ssd-draft {name} --max-tokens {} --temperature {} {}{}",
        args.max_tokens,
        args.temperature,
        args.training.arguments(),
        args.limit
            .map_or(String::new(), |limit| format!(" --limit {limit}"))
    );
    let weights: SsdDraftWeights = trained.into_weights(
        lm.model.config(),
        lm.model.config().vocab_size,
        &name,
        &fingerprint,
        &command,
    );
    weights.save(&out)?;
    println!(
        "SSD draft written to {} (top-1 agreement with the model {:.1} % → {:.1} %)",
        out.display(),
        100.0 * weights.info.untrained_agreement,
        100.0 * weights.info.validation_agreement
    );
    Ok(())
}

/// The model's sampled answer to every prompt, labelled with its own next-token
/// probabilities from the prompt's last position on.
fn self_distilled(
    args: &Args,
    prompts: &[String],
    lm: &mut LanguageModel,
) -> Result<Vec<DistilledSequence>> {
    let stop =
        StopConditions::new(args.max_tokens).with_eos(lm.tokenizer.end_tokens().iter().copied());
    let sampling = SamplingConfig::with_temperature(args.temperature);
    let mut rng = StdRng::seed_from_u64(args.training.seed);
    let bar = progress_bar(prompts.len(), "answering");
    let mut data = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let context = lm.chat_prompt(&[Message::user(prompt.as_str())])?;
        let answer = generate(
            &mut lm.model,
            &context,
            &sampling,
            &stop,
            &mut rng,
            &mut |_| {},
        )?;
        let tokens: Vec<u32> = context.iter().chain(&answer.tokens).copied().collect();
        data.push(DistilledSequence::label(
            &mut lm.model,
            tokens,
            context.len() - 1,
            args.training.top_k,
        )?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(data)
}
