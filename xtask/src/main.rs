//! `cargo xtask`: SpecVoice's developer commands (the alias is in `.cargo/config.toml`).

mod bench;
mod ci;
mod demo;
mod machine;
mod models;

use std::process::ExitCode;

use anyhow::{bail, Result};

const USAGE: &str = "\
usage: cargo xtask <command>

  demo [--model NAME]          speak a few questions into PredGen and compare its latency with
                               the plain cascade (downloads the model when it is missing)
  models [--verify]            known models, and which are in the models folder
                               (--verify: also check SHA-256 of files not yet verified)
  download NAME…               fetch models from the Hugging Face Hub into the models folder
                               (resumes, verifies; HF_TOKEN for gated models, HF_ENDPOINT for a mirror)
  bench [ENGINE…] [--quick] [--update-readme] [--out DIR] [-- ARGS…]
                               run the engines' benchmarks (all by default), write
                               DIR/ENGINE.{json,md} (DIR: results), optionally refresh the README
  ci [--require-models]        what CI runs: fmt check, clippy -D warnings, the workspace tests,
                               and the real-model tests when the models are present

The models folder is $SPECVOICE_MODELS, default ~/.cache/specvoice/models.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<()> {
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("models") => models::list(rest),
        Some("download") => models::download(rest),
        Some("bench") => bench::run(rest),
        Some("ci") => ci::run(rest),
        Some("demo") => demo::run(rest),
        Some("help" | "--help" | "-h") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}
