//! `cargo xtask train-heads MODEL …` and `cargo xtask train-ssd-draft MODEL …`: train what a
//! speculative method needs for a model with `spec-train`'s program for its engine (its
//! `train_heads`, `train_heads_llm`, `train_ssd_draft` or `train_cosyvoice_ssd_draft` example),
//! into the models folder (`heads/`, `ssd/`).

use std::process::Command;

use anyhow::{bail, Context, Result};

/// The options of both training commands.
#[derive(clap::Args)]
pub struct TrainArgs {
    /// The model (a name in the models folder)
    model: String,

    /// Everything else goes to the engine's training example (`-- --help` lists its options)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    options: Vec<String>,
}

/// The example of `spec-train` that trains heads for `model`: Whisper's `train_heads` for
/// whisper-…, the chat models' `train_heads_llm` for the rest (distinct names: the examples of
/// a workspace share one output folder).
fn heads_trainer(model: &str) -> &'static str {
    if model.starts_with("whisper") {
        "train_heads"
    } else {
        "train_heads_llm"
    }
}

/// Multi-token prediction heads (`--heads 4 --kind latent --data FILE --epochs N …`).
pub fn heads(args: &TrainArgs) -> Result<()> {
    run("spec-train", heads_trainer(&args.model), args)
}

/// An SSD draft of a model's own layers (`--lower 2 --upper 6 --epochs N …`): CosyVoice 2's
/// speech-token LM's (`train_cosyvoice_ssd_draft`, cosyvoice…), or a chat model's
/// (`train_ssd_draft`).
pub fn ssd_draft(args: &TrainArgs) -> Result<()> {
    if args.model.starts_with("cosyvoice") {
        run("spec-train", "train_cosyvoice_ssd_draft", args)
    } else {
        run("spec-train", "train_ssd_draft", args)
    }
}

fn run(package: &str, example: &str, args: &TrainArgs) -> Result<()> {
    let status = Command::new(crate::cargo())
        .args([
            "run",
            "--quiet",
            "--release",
            "-p",
            package,
            "--example",
            example,
            "--",
        ])
        .arg(&args.model)
        .args(&args.options)
        .status()
        .with_context(|| format!("running the {example} example"))?;
    if !status.success() {
        bail!("{example} failed ({status})");
    }
    Ok(())
}
