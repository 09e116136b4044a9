//! `cargo xtask ci`: what `.ci/run` runs after fetching the real models.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use spec_models::{Check, Store};

/// Passed and failed tests, summed over the `test result:` lines of cargo's output.
#[derive(Default, Debug, PartialEq)]
struct Tally {
    passed: u64,
    failed: u64,
}

impl Tally {
    fn add_line(&mut self, line: &str) {
        // test result: ok. 46 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; …
        let Some(rest) = line.trim_start().strip_prefix("test result:") else {
            return;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        for pair in words.windows(2) {
            let count = pair[0].parse::<u64>().unwrap_or(0);
            match pair[1].trim_end_matches([';', ',']) {
                "passed" => self.passed += count,
                "failed" => self.failed += count,
                _ => {}
            }
        }
    }
}

pub fn run(require_models: bool) -> Result<()> {
    let mut tally = Tally::default();
    step(&["fmt", "--all", "--", "--check"], &[], None)?;
    // Every crate with its default features, then the voice pipeline without its server
    // (specvoice's `server` feature off), which must still build.
    for selection in [
        &["--workspace"][..],
        &["-p", "specvoice", "--no-default-features"],
    ] {
        let args: Vec<&str> = ["clippy", "--all-targets"]
            .into_iter()
            .chain(selection.iter().copied())
            .chain(["--", "-D", "warnings"])
            .collect();
        step(&args, &[], None)?;
    }
    // The API docs users read on docs.rs: a broken or private intra-doc link fails here.
    step(
        &["doc", "--workspace", "--no-deps"],
        &[("RUSTDOCFLAGS", "-D warnings")],
        None,
    )?;
    // The README's test command. In release mode, as the real-model tests after it: they share
    // one build (a debug build of the workspace and its tests took CI 20 minutes more).
    step(&["test", "--workspace", "--release"], &[], Some(&mut tally))?;
    let release_tests_ran = match missing_models()? {
        missing if missing.is_empty() => {
            step(
                &["test", "--workspace", "--release", "--", "--ignored"],
                &[],
                Some(&mut tally),
            )?;
            true
        }
        missing if require_models => bail!(
            "real models missing: {}; run ../shared/models/fetch or cargo xtask download",
            missing.join("; ")
        ),
        missing => {
            println!(
                "skipping the real-model tests, models missing: {}",
                missing.join("; ")
            );
            false
        }
    };
    // Every parser fuzzed briefly. The release tests built the harness program with the
    // workspace's features (spec-fuzz's own integration test needs it); `cargo run -p
    // spec-fuzz` alone would resolve fewer features and rebuild serde and all above it.
    let harness = ["--seconds".to_string(), crate::fuzz::CI_SECONDS.to_string()];
    let built = crate::target_dir().join("release").join("spec-fuzz");
    if release_tests_ran && built.is_file() {
        crate::fuzz::run_built(&built, &harness)?;
    } else {
        let fuzz_args = crate::fuzz::cargo_args(true, &harness);
        let fuzz_args: Vec<&str> = fuzz_args.iter().map(String::as_str).collect();
        step(&fuzz_args, &[], None)?;
    }
    println!("ci: {} passed, {} failed", tally.passed, tally.failed);
    Ok(())
}

/// Runs `cargo ARGS…` with the variables `env` set, echoing its output; counts test results
/// when asked.
fn step(args: &[&str], env: &[(&str, &str)], tally: Option<&mut Tally>) -> Result<()> {
    let assignments: Vec<String> = env.iter().map(|(k, v)| format!("{k}='{v}' ")).collect();
    println!("$ {}cargo {}", assignments.concat(), args.join(" "));
    let started = Instant::now();
    let mut command = Command::new(crate::cargo());
    command.args(args).envs(env.iter().copied());
    let status = match tally {
        None => command.status()?,
        Some(tally) => {
            let mut child = command.stdout(Stdio::piped()).spawn()?;
            let stdout = child.stdout.take().context("piped stdout")?;
            for line in BufReader::new(stdout).lines() {
                let line = line?;
                println!("{line}");
                tally.add_line(&line);
            }
            child.wait()?
        }
    };
    println!(
        "(`cargo {}`: {:.0} s)",
        args[0],
        started.elapsed().as_secs_f64()
    );
    print_target_size();
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Prints how much disk the build directory takes: a clean CI build must fit the CI machine's disk.
fn print_target_size() {
    let target = crate::target_dir();
    let gib = directory_size(&target) as f64 / (1u64 << 30) as f64;
    println!("ci: {} holds {gib:.1} GiB", target.display());
}

/// Total size of the files under `dir`; unreadable entries count as empty.
fn directory_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => directory_size(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// The pinned registry models (every file with a size and checksum: the ones the tests use)
/// and the evaluation data that are not in the models folder.
fn missing_models() -> Result<Vec<String>> {
    let store = Store::from_env()?;
    let mut missing = Vec::new();
    for entry in store.registry().models() {
        let pinned = entry
            .files
            .iter()
            .all(|f| f.size.is_some() && f.sha256.is_some());
        if !pinned {
            continue;
        }
        let states = store.check(entry, Check::Checksum)?;
        if let Some((file, state)) = states.iter().find(|(_, s)| !s.is_usable()) {
            missing.push(format!("{}: {} {state:?}", entry.name, file.local()));
        }
    }
    if let Err(e) = store.data_file(spec_models::mt_bench::QUESTIONS_FILE) {
        missing.push(e.to_string());
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn test_result_lines_are_counted() {
        let mut tally = Tally::default();
        for line in [
            "test result: ok. 46 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.3s",
            "running 3 tests",
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
        ] {
            tally.add_line(line);
        }
        assert_eq!(
            tally,
            Tally {
                passed: 48,
                failed: 1
            }
        );
    }
}
