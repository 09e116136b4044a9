//! `cargo xtask`: SpecVoice's developer commands (the alias is in `.cargo/config.toml`).

mod bench;
mod ci;
mod demo;
mod docs;
mod fuzz;
mod machine;
mod models;
mod peers;
mod setup;
mod train;

use std::io::IsTerminal;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// SpecVoice's developer commands.
#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    after_help = "The models folder is $SPECVOICE_MODELS, default ~/.cache/specvoice/models. \
                  Logs go to standard error, filtered by RUST_LOG (default info)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Speak a few questions into PredGen and compare its latency with the plain cascade,
    /// then ask them aloud through `specvoice chat` and write the questions' and answers' audio
    /// (first does what `setup` does, where something is missing)
    Demo(demo::DemoArgs),
    /// Make the demo and the real-model tests ready: download the default models when absent,
    /// install espeak-ng (as root with apt; else print the command), build the release binaries
    Setup(setup::SetupArgs),
    /// Known models, and which are in the models folder
    Models {
        /// Also check the SHA-256 of files not yet verified
        #[arg(long)]
        verify: bool,
    },
    /// Fetch models from the Hugging Face Hub into the models folder (resumes, verifies;
    /// HF_TOKEN for gated models, HF_ENDPOINT for a mirror)
    Download {
        /// Registry names (`cargo xtask models` lists them)
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Run the engines' benchmarks and file their reports with the machine and date
    Bench(bench::BenchArgs),
    /// Rewrite the generated sections of docs/ and the README's headline table from results/
    Docs,
    /// Train multi-token prediction heads for a model on its own outputs (speech synthesized
    /// by espeak-ng for Whisper) into the models folder
    TrainHeads(train::TrainArgs),
    /// Train a Speech Speculative Decoding draft (the model's own lower and upper layers, the
    /// lower ones and a shortlist head retrained on its outputs) into the models folder
    TrainSsdDraft(train::TrainArgs),
    /// Build llama.cpp's `llama-bench` (the peer `bench_llm` measures in the same run when
    /// SPECVOICE_LLAMA_BENCH names it) and print that setting
    LlamaBench(peers::LlamaBenchArgs),
    /// Fuzz the parsers (WAV, GGUF, CTranslate2, safetensors, tokenizers, the registry, timed
    /// partials, the WebSocket protocol) for a while each; fails on a crash, a hang, or memory
    /// out of proportion to the input
    Fuzz(fuzz::FuzzArgs),
    /// The server for an hour (or --minutes) under `--sessions` real-time clients: chat and
    /// caption sessions, random barge-ins and disconnects; errors, latency per slice, memory and
    /// open files over time, filed as results/soak.{json,md,svg} (`bench soak` with these settings)
    Soak {
        #[arg(long, default_value_t = 60.0)]
        minutes: f64,
        #[arg(long, default_value_t = 8)]
        sessions: usize,
        /// Then rewrite docs/soak.md's generated section from results/
        #[arg(long)]
        update_docs: bool,
    },
    /// What CI runs: fmt check, clippy -D warnings, the docs with warnings as errors, the
    /// workspace tests, the real-model tests when the models are present, and a short fuzzing
    /// run of every parser
    Ci {
        /// Fail when the real models are missing instead of skipping their tests
        #[arg(long)]
        require_models: bool,
    },
}

/// The cargo that runs this command (or the one on the PATH).
fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The build directory: `CARGO_TARGET_DIR`, else the workspace's `target`.
fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// `cargo metadata` of the workspace's own packages.
fn metadata() -> Result<serde_json::Value> {
    let output = std::process::Command::new(cargo())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        anyhow::bail!(
            "cargo metadata: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

fn main() -> Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match Cli::parse().command {
        Command::Demo(args) => demo::run(&args),
        Command::Setup(args) => setup::run(&args),
        Command::Models { verify } => models::list(verify),
        Command::Download { names } => models::download(&names),
        Command::Bench(args) => bench::run(&args),
        Command::Docs => docs::update(&bench::registered()?, std::path::Path::new(bench::RESULTS)),
        Command::TrainHeads(args) => train::heads(&args),
        Command::TrainSsdDraft(args) => train::ssd_draft(&args),
        Command::LlamaBench(args) => peers::llama_bench(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Soak {
            minutes,
            sessions,
            update_docs,
        } => bench::run(&bench::BenchArgs::full(
            "soak",
            vec![
                "--soak-minutes".into(),
                minutes.to_string(),
                "--sessions".into(),
                sessions.to_string(),
            ],
            update_docs,
        )),
        Command::Ci { require_models } => ci::run(require_models),
    }
}
