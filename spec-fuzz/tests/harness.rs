//! The `spec-fuzz` program as CI runs it: it lists its targets, refuses an unknown one, and
//! fuzzes a few thousand cases of two parsers without a finding. (Being an integration test, it
//! also makes `cargo test --release` build the program with the workspace's features, which CI's
//! fuzzing step then runs without a second build.)

use std::process::{Command, Output};

fn spec_fuzz(args: &[&str], out: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spec-fuzz"))
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("spec-fuzz runs")
}

#[test]
fn lists_every_target() {
    let out = tempfile::tempdir().unwrap();
    let listed = spec_fuzz(&["--list"], out.path());
    assert!(listed.status.success());
    let names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(String::from))
        .collect();
    for name in ["wav", "gguf", "ct2", "protocol", "openai"] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} missing from {names:?}"
        );
    }
}

#[test]
fn refuses_an_unknown_target_by_name() {
    let out = tempfile::tempdir().unwrap();
    let refused = spec_fuzz(&["mp5"], out.path());
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("no fuzz target `mp5`"), "{message}");
}

#[test]
fn fuzzes_two_parsers_without_a_finding() {
    let out = tempfile::tempdir().unwrap();
    let run = spec_fuzz(
        &["wav", "partials", "--cases", "2000", "--seconds", "60"],
        out.path(),
    );
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{report}");
    assert!(report.contains("fuzz: 4000 cases, 0 findings"), "{report}");
}
