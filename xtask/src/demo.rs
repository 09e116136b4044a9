//! `cargo xtask demo`: what SpecVoice is for, in one command. A few questions are spoken into
//! PredGen at a speaking rate; each turn's timeline is printed, then the latency against the
//! plain cascade (wait for the question, generate, synthesize) on the same model.

use std::process::Command;

use anyhow::{bail, Context, Result};
use spec_models::Store;

use crate::models;

/// The default chat model: the one `../shared/models/fetch` provides.
const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b-instruct";

const QUESTIONS: [&str; 3] = [
    "What is the capital of France, and what is it famous for?",
    "Can you give me three tips for sleeping better at night?",
    "How long should I boil an egg if I want the yolk to stay soft?",
];

/// `cargo xtask demo`'s options.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// The chat model (a registry name is downloaded when missing)
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,

    /// Arguments passed on to the predgen example (after `--`)
    #[arg(last = true)]
    extra: Vec<String>,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let model = &args.model;
    let store = Store::from_env()?;
    if let Err(missing) = store.resolve(model) {
        if store.registry().get(model).is_none() {
            return Err(missing).with_context(|| format!("cannot use `{model}`"));
        }
        println!(
            "`{model}` is not in {}: downloading it",
            store.root().display()
        );
        models::download(std::slice::from_ref(model))?;
    }
    let mut command = Command::new(crate::cargo());
    command.args([
        "run",
        "--quiet",
        "--release",
        "-p",
        "engine-llm",
        "--example",
        "predgen",
        "--",
        "--model",
        model,
    ]);
    // Short answers keep the demo to a minute or two on a 2-core CPU; the latency that
    // matters, to the first sentence's audio, does not depend on it.
    command.args(["--max-tokens", "96"]);
    for question in QUESTIONS {
        command.args(["--question", question]);
    }
    command.args(&args.extra);
    let status = command.status().context("running the predgen example")?;
    if !status.success() {
        bail!("the predgen example failed ({status})");
    }
    Ok(())
}
