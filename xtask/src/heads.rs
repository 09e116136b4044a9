//! `cargo xtask train-heads MODEL …`: trains multi-token prediction heads for a model with the
//! engine that runs it (its `train_heads` example: engine-asr for Whisper, engine-llm for chat
//! models), into `$SPECVOICE_MODELS/heads/`.

use std::process::Command;

use anyhow::{bail, Context, Result};

/// `cargo xtask train-heads`' options.
#[derive(clap::Args)]
pub struct TrainHeadsArgs {
    /// The model (a name in the models folder)
    model: String,

    /// Everything else goes to the engine's `train_heads` example (`--heads 4 --kind latent
    /// --data FILE --epochs N --seed S …`; `-- --help` lists them)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    options: Vec<String>,
}

/// The engine whose `train_heads` example trains heads for `model`: Whisper's for whisper-…,
/// the chat models' for the rest.
fn engine(model: &str) -> &'static str {
    if model.starts_with("whisper") {
        "engine-asr"
    } else {
        "engine-llm"
    }
}

pub fn run(args: &TrainHeadsArgs) -> Result<()> {
    let package = engine(&args.model);
    let status = Command::new(crate::cargo())
        .args([
            "run",
            "--quiet",
            "--release",
            "-p",
            package,
            "--example",
            "train_heads",
            "--",
        ])
        .arg(&args.model)
        .args(&args.options)
        .status()
        .context("running the train_heads example")?;
    if !status.success() {
        bail!("training heads failed ({status})");
    }
    Ok(())
}
