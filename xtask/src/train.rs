//! `cargo xtask train-heads MODEL …` and `cargo xtask train-ssd-draft MODEL …`: train what a
//! speculative method needs for a model with the engine that runs it (its `train_heads`,
//! `train_heads_llm`, `train_ssd_draft` or `train_cosyvoice_ssd_draft` example), into the models
//! folder (`heads/`, `ssd/`).

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

/// The engine and its example that train heads for `model`: Whisper's `train_heads` for
/// whisper-…, the chat models' `train_heads_llm` for the rest (distinct names: the examples of
/// a workspace share one output folder).
fn heads_trainer(model: &str) -> (&'static str, &'static str) {
    if model.starts_with("whisper") {
        ("engine-asr", "train_heads")
    } else {
        ("engine-llm", "train_heads_llm")
    }
}

/// Multi-token prediction heads (`--heads 4 --kind latent --data FILE --epochs N …`).
pub fn heads(args: &TrainArgs) -> Result<()> {
    let (engine, example) = heads_trainer(&args.model);
    run(engine, example, args)
}

/// An SSD draft of a model's own layers (`--lower 2 --upper 6 --epochs N …`): CosyVoice 2's
/// speech-token LM with engine-tts (cosyvoice…), a chat model with engine-llm.
pub fn ssd_draft(args: &TrainArgs) -> Result<()> {
    if args.model.starts_with("cosyvoice") {
        run("engine-tts", "train_cosyvoice_ssd_draft", args)
    } else {
        run("engine-llm", "train_ssd_draft", args)
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
