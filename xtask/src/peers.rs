//! `cargo xtask llama-bench`: builds llama.cpp's `llama-bench`, the peer that `bench_llm`
//! measures in the same run (`SPECVOICE_LLAMA_BENCH`), from the llama.cpp source vendored in
//! the llama-cpp-python sdist on PyPI (a registry these machines reach), as
//! `../shared/peers/README.md` describes: native instructions (but not AMX, see [`NO_AMX_FLAGS`]),
//! OpenMP, release.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

/// The llama-cpp-python release whose vendored llama.cpp the README's figures were measured with.
const LLAMA_CPP_PYTHON: &str = "0.3.36";

/// The build folder inside the llama.cpp source. Named for its flags, so that a build made
/// with AMX (which crashed) is not taken for this one.
const BUILD_DIR: &str = "build-no-amx";

/// Compiler flags added to `-march=native`. This llama.cpp's AMX kernels stop with an illegal
/// instruction on Xeons with AMX (Sapphire/Emerald Rapids): its worker threads run tile
/// instructions without the tile configuration and XTILEDATA permission that only the main
/// thread asked for (llama.cpp pull request 26954). `bench_llm` therefore compares with its
/// AVX-512 kernels there, the instructions SpecVoice's kernels use; on machines without AMX
/// the flags change nothing.
const NO_AMX_FLAGS: &str = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16";

#[derive(Args)]
pub struct LlamaBenchArgs {
    /// Where to download and build [default: next to the models folder, in peers/]
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Builds `llama-bench` unless it is already built, and prints its path.
pub fn llama_bench(args: &LlamaBenchArgs) -> Result<()> {
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => spec_models::models_dir()?
            .parent()
            .context("the models folder has no parent folder")?
            .join("peers"),
    };
    let source = dir
        .join(format!("llama_cpp_python-{LLAMA_CPP_PYTHON}"))
        .join("vendor/llama.cpp");
    let binary = source.join(BUILD_DIR).join("bin/llama-bench");
    if !binary.is_file() {
        build(&dir, &source)?;
    }
    println!("SPECVOICE_LLAMA_BENCH={}", binary.display());
    Ok(())
}

fn build(dir: &Path, source: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if !source.is_dir() {
        let sdist = dir.join(format!("llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"));
        if !sdist.is_file() {
            // `--no-binary` names only this package: with `:all:` pip builds cmake from source.
            run(Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps"])
                .args(["--no-binary", "llama-cpp-python"])
                .arg(format!("llama-cpp-python=={LLAMA_CPP_PYTHON}"))
                .arg("-d")
                .arg(dir))?;
        }
        run(Command::new("tar")
            .arg("xzf")
            .arg(&sdist)
            .arg("-C")
            .arg(dir))?;
    }
    if Command::new("cmake").arg("--version").output().is_err() {
        tracing::info!("cmake is missing: installing it from PyPI");
        run(Command::new("python3").args(["-m", "pip", "install", "cmake"]))?;
    }
    run(Command::new("cmake").current_dir(source).args([
        "-B",
        BUILD_DIR,
        &format!("-DCMAKE_C_FLAGS={NO_AMX_FLAGS}"),
        &format!("-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}"),
        "-DGGML_NATIVE=ON",
        "-DLLAMA_CURL=OFF",
        "-DGGML_OPENMP=ON",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_BUILD_TESTS=OFF",
    ]))?;
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    tracing::info!("building llama-bench with {jobs} jobs (3-10 minutes on two cores)");
    run(Command::new("cmake")
        .current_dir(source)
        .args(["--build", BUILD_DIR, "--target", "llama-bench", "-j"])
        .arg(jobs.to_string()))
}

fn run(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}
