//! `spec-fuzz [TARGET…] --seconds N`: fuzzes SpecVoice's parsers (every target by default) and
//! fails when one crashed, held memory out of proportion to its input, or hung.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use spec_fuzz::alloc::CountingAllocator;
use spec_fuzz::run::{fuzz, Settings};
use spec_fuzz::targets;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Fuzzes SpecVoice's parsers.
#[derive(Parser)]
#[command(name = "spec-fuzz")]
struct Args {
    /// Targets to fuzz (all by default; `--list` names them)
    targets: Vec<String>,
    /// Seconds per target
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Stop each target after this many cases, if sooner
    #[arg(long)]
    cases: Option<u64>,
    /// Seed of the mutations (a run is repeatable case for case)
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Working folders and findings
    #[arg(long, default_value = "target/fuzz")]
    out: PathBuf,
    /// Seconds one parse may take before it counts as a hang
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Extra seeds: the files in DIR/TARGET/
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// List the targets and what they cover
    #[arg(long)]
    list: bool,
    /// Run the one target named on this input once and say what its parse did
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,
}

fn main() -> Result<()> {
    // candle's errors capture a backtrace when these ask for one: megabytes and milliseconds
    // per refused input, which would be measured as the parser's.
    std::env::set_var("RUST_BACKTRACE", "0");
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
    let args = Args::parse();
    let all = targets::all();
    if args.list {
        for target in &all {
            println!("{:<15} {}", target.name, target.covers);
        }
        return Ok(());
    }
    for name in &args.targets {
        if !all.iter().any(|t| t.name == name) {
            let names: Vec<&str> = all.iter().map(|t| t.name).collect();
            bail!("no fuzz target `{name}` (targets: {})", names.join(", "));
        }
    }
    if let Some(input) = &args.replay {
        let [name] = args.targets.as_slice() else {
            bail!("--replay takes one target");
        };
        let target = all.iter().find(|t| t.name == name).expect("checked above");
        return replay(target, input, &args.out.join("replay"));
    }
    let memory = Path::new("/dev/shm");
    let work = match memory.is_dir() {
        true => memory.join(format!("spec-fuzz-{}", std::process::id())),
        false => args.out.join("work"),
    };
    let settings = Settings {
        duration: Duration::from_secs_f64(args.seconds),
        max_cases: args.cases,
        seed: args.seed,
        out: args.out.clone(),
        work: work.clone(),
        timeout: Duration::from_secs_f64(args.timeout),
        corpus: args.corpus.clone(),
    };
    println!(
        "{:<15} {:>10} {:>8} {:>10} {:>7} {:>9} {:>12} {:>9}",
        "target", "cases", "seconds", "cases/s", "corpus", "outcomes", "peak B/byte", "findings"
    );
    let (mut cases, mut findings) = (0, 0);
    for target in all
        .iter()
        .filter(|t| args.targets.is_empty() || args.targets.iter().any(|n| n == t.name))
    {
        eprintln!(
            "{}: fuzzing; should the process die, the input it died on is {}",
            target.name,
            work.join(target.name).join("current-input").display()
        );
        let report = fuzz(target, &settings)?;
        let seconds = report.elapsed.as_secs_f64();
        let found = report.findings.len() as u64 + report.repeated_findings;
        println!(
            "{:<15} {:>10} {:>8.1} {:>10.0} {:>7} {:>9} {:>12.1} {:>9}",
            report.target,
            report.cases,
            seconds,
            report.cases as f64 / seconds.max(1e-9),
            report.corpus,
            report.outcomes,
            report.worst_memory_per_byte,
            found
        );
        cases += report.cases;
        findings += found;
    }
    if work.starts_with(memory) {
        std::fs::remove_dir_all(&work)?;
    }
    println!("fuzz: {cases} cases, {findings} findings");
    if findings > 0 {
        bail!(
            "{findings} findings; their inputs are in {}",
            args.out.join("findings").display()
        );
    }
    Ok(())
}

/// Parses `input` once with `target`, printing its steps and the memory it held.
fn replay(target: &targets::Target, input: &Path, work: &Path) -> Result<()> {
    let bytes = std::fs::read(input)?;
    std::fs::create_dir_all(work)?;
    (target.prepare)(work)?;
    let (result, peak) = spec_fuzz::alloc::watch(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (target.parse)(work, &bytes)
        }))
    });
    println!(
        "{} bytes in; held at most {peak} bytes (limit {})",
        bytes.len(),
        target.memory_limit(bytes.len())
    );
    match result {
        Ok(trace) => println!("{}", trace.summary()),
        Err(_) => bail!("the parse panicked"),
    }
    Ok(())
}
