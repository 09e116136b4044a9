//! `cargo xtask fuzz [TARGET…] --seconds N`: builds and runs the `spec-fuzz` harness (release
//! mode by default, the build CI's real-model tests share), its working folders and findings in
//! `<target dir>/fuzz`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};

/// Seconds per target of CI's short run: eleven targets in about two minutes.
pub const CI_SECONDS: &str = "10";

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Targets (all by default): wav, audio, gguf, ct2, safetensors, tokenizer-json,
    /// vocab-merges, registry, partials, protocol, openai
    targets: Vec<String>,
    /// Seconds per target
    #[arg(long, default_value = "60")]
    seconds: String,
    /// Stop each target after this many cases, if sooner
    #[arg(long)]
    cases: Option<u64>,
    /// Seed of the mutations
    #[arg(long)]
    seed: Option<u64>,
    /// Extra seeds: the files in DIR/TARGET/
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// Build without optimisation, with overflow checks (slower; catches wrapping arithmetic)
    #[arg(long)]
    debug: bool,
    /// List the targets and what they cover
    #[arg(long)]
    list: bool,
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    let mut harness: Vec<String> = args.targets.clone();
    harness.extend(["--seconds".into(), args.seconds.clone()]);
    if let Some(cases) = args.cases {
        harness.extend(["--cases".into(), cases.to_string()]);
    }
    if let Some(seed) = args.seed {
        harness.extend(["--seed".into(), seed.to_string()]);
    }
    if let Some(corpus) = &args.corpus {
        harness.extend(["--corpus".into(), corpus.display().to_string()]);
    }
    if args.list {
        harness.push("--list".into());
    }
    let status = Command::new(crate::cargo())
        .args(cargo_args(!args.debug, &harness))
        .status()?;
    if !status.success() {
        bail!("the fuzzing run failed ({status})");
    }
    Ok(())
}

/// `cargo run` of the harness with `harness` as its arguments.
pub fn cargo_args(release: bool, harness: &[String]) -> Vec<String> {
    let mut args: Vec<String> = ["run", "-p", "spec-fuzz"].map(String::from).to_vec();
    if release {
        args.push("--release".into());
    }
    args.extend(["--".into(), "--out".into(), out_dir().display().to_string()]);
    args.extend(harness.iter().cloned());
    args
}

/// Runs the harness program already built at `program` with `harness` as its arguments.
pub fn run_built(program: &Path, harness: &[String]) -> Result<()> {
    println!("ci: {} {}", program.display(), harness.join(" "));
    let status = Command::new(program)
        .args(["--out".into(), out_dir().display().to_string()])
        .args(harness)
        .status()?;
    if !status.success() {
        bail!("the fuzzing run failed ({status})");
    }
    Ok(())
}

/// `<target dir>/fuzz`.
fn out_dir() -> PathBuf {
    crate::target_dir().join("fuzz")
}
