//! `cargo xtask setup`: what the demo and the real-model tests need, done once and said as it
//! is done: the default models (downloaded when absent), espeak-ng (installed with apt when
//! running as root, else the one command to run is printed), and the release binaries built
//! with cargo's progress shown.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use spec_models::Store;

use crate::models;

/// The chat model the demo and `specvoice chat` answer with.
pub const CHAT_MODEL: &str = "qwen2.5-coder-1.5b-instruct";
/// The recognizer `specvoice chat` listens with by default.
pub const WHISPER: &str = "whisper-tiny.en-ct2";

/// `cargo xtask setup`'s options.
#[derive(clap::Args)]
pub struct SetupArgs {
    /// Models to make present [default: the demo's chat model and Whisper]
    #[arg(long = "model")]
    models: Vec<String>,
}

pub fn run(args: &SetupArgs) -> Result<()> {
    let models = if args.models.is_empty() {
        vec![CHAT_MODEL.to_string(), WHISPER.to_string()]
    } else {
        args.models.clone()
    };
    ensure_models(&models)?;
    let espeak = ensure_espeak()?;
    let programs = build_release()?;
    println!(
        "the programs: {} and {}",
        programs.predgen.display(),
        programs.specvoice.display()
    );
    if espeak {
        println!(
            "set-up done: `cargo xtask demo` runs the demo, `cargo test --workspace --release` the tests"
        );
    } else {
        println!("set-up done but for espeak-ng (above): `cargo xtask demo` runs the typed part");
    }
    Ok(())
}

/// Downloads each of `names` that the models folder lacks, saying so. A download that cannot
/// reach the hub is an error that says where else the files can come from.
pub fn ensure_models(names: &[String]) -> Result<()> {
    let store = Store::from_env()?;
    let mut missing = Vec::new();
    for name in names {
        if let Err(problem) = store.resolve(name) {
            if store.registry().get(name).is_none() {
                return Err(problem).with_context(|| {
                    format!(
                        "`{name}` is neither in {} nor a registry model",
                        store.root().display()
                    )
                });
            }
            missing.push(name.clone());
        }
    }
    if missing.is_empty() {
        println!(
            "models: {} present in {}",
            names.join(", "),
            store.root().display()
        );
        return Ok(());
    }
    println!(
        "models: {} missing from {}; downloading",
        missing.join(", "),
        store.root().display()
    );
    models::download(&missing).with_context(|| {
        format!(
            "could not download {}: place the files by hand (`cargo xtask models` lists them), \
             set SPECVOICE_MODELS to a folder that has them, or, in the project's own \
             development environment, run ../shared/models/fetch",
            missing.join(", ")
        )
    })
}

/// Whether espeak-ng is there, installing it first when this runs as root on a system with
/// apt; otherwise prints the command to run and returns false.
pub fn ensure_espeak() -> Result<bool> {
    if runs("espeak-ng", &["--version"]) {
        return Ok(true);
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.trim_ascii() == b"0");
    if !(root && runs("apt-get", &["--version"])) {
        println!(
            "espeak-ng is not installed (the spoken part of the demo speaks the questions and \
             answers with it): run `sudo apt-get install espeak-ng` (Debian, Ubuntu) or your \
             system's equivalent"
        );
        return Ok(false);
    }
    println!("espeak-ng is not installed: apt-get update && apt-get install -y espeak-ng");
    let update = Command::new("apt-get").args(["update", "-qq"]).status();
    let install = Command::new("apt-get")
        .args(["install", "-y", "-qq", "espeak-ng"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    if !install.success() || !runs("espeak-ng", &["--version"]) {
        bail!(
            "installing espeak-ng failed (apt-get update: {update:?}, install: {install}); \
             install it by hand or run the demo with --spoken 0"
        );
    }
    Ok(true)
}

/// The demo's release programs, built by [`build_release`].
pub struct ReleasePrograms {
    /// engine-llm's `predgen` example.
    pub predgen: PathBuf,
    /// The `specvoice` command.
    pub specvoice: PathBuf,
}

/// Builds the demo's release programs in one cargo run (one set of features for the
/// dependencies both share, so nothing is compiled twice), showing cargo's progress; says how
/// long it took.
pub fn build_release() -> Result<ReleasePrograms> {
    println!(
        "building the release programs (the first build takes several minutes: candle and the \
         kernels compile with the CPU's own instructions)"
    );
    let start = Instant::now();
    let status = Command::new(crate::cargo())
        .args(["build", "--release", "-p", "engine-llm", "-p", "specvoice"])
        .args(["--example", "predgen", "--bin", "specvoice"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build --release failed ({status})");
    }
    println!("built in {:.0} s", start.elapsed().as_secs_f64());
    let metadata = crate::metadata()?;
    let release = PathBuf::from(
        metadata["target_directory"]
            .as_str()
            .context("cargo metadata: target_directory")?,
    )
    .join("release");
    let programs = ReleasePrograms {
        predgen: release.join("examples").join("predgen"),
        specvoice: release.join("specvoice"),
    };
    for program in [&programs.predgen, &programs.specvoice] {
        if !program.is_file() {
            bail!("the build finished but {} is missing", program.display());
        }
    }
    Ok(programs)
}

/// Whether `program ARGS` runs and succeeds.
fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}
