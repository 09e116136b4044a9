//! `cargo xtask models` and `cargo xtask download`.

use std::collections::BTreeSet;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use spec_models::download::{DownloadOptions, Downloader, Progress};
use spec_models::{Check, FileState, ModelEntry, Store};

pub fn list(verify: bool) -> Result<()> {
    let level = if verify { Check::Checksum } else { Check::Size };
    let store = Store::from_env()?;
    println!("models folder: {}\n", store.root().display());
    println!(
        "{:<30} {:<9} {:<14} {:>9}  local",
        "name", "kind", "format", "size"
    );
    let mut known = BTreeSet::new();
    for entry in store.registry().models() {
        known.insert(entry.name.clone());
        let states = store.check(entry, level)?;
        println!(
            "{:<30} {:<9} {:<14} {:>9}  {}",
            entry.name,
            entry.kind.to_string(),
            entry.format.to_string(),
            entry.size().map_or("?".into(), human),
            describe(entry, &states, &store)
        );
    }
    let by_hand: Vec<String> = std::fs::read_dir(store.root())
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "data" && !n.starts_with('.') && !known.contains(n))
        .collect();
    if !by_hand.is_empty() {
        println!("\nother folders (used as they are): {}", by_hand.join(", "));
    }
    if level == Check::Size {
        println!("\n(`present`: right size; `cargo xtask models --verify` checks SHA-256 too)");
    }
    Ok(())
}

fn describe(
    entry: &ModelEntry,
    states: &[(spec_models::FileEntry, FileState)],
    store: &Store<'_>,
) -> String {
    if states.iter().all(|(_, s)| *s == FileState::Missing) {
        return "-".into();
    }
    if let Some((file, problem)) = states.iter().find(|(_, s)| !s.is_usable()) {
        return match problem {
            FileState::Missing => format!("incomplete: {} missing", file.local()),
            FileState::Partial { bytes } => format!(
                "interrupted download ({} of {}): `cargo xtask download {}` resumes",
                human(*bytes),
                file.size.map_or("?".into(), human),
                entry.name
            ),
            FileState::WrongSize { actual, .. } => {
                format!("WRONG SIZE: {} is {}", file.local(), human(*actual))
            }
            FileState::ChecksumMismatch { .. } => format!("CORRUPT: {} checksum", file.local()),
            FileState::Verified | FileState::Present => unreachable!("usable"),
        };
    }
    let dir = store.model_dir(&entry.name);
    let bytes: u64 = states
        .iter()
        .filter_map(|(f, _)| std::fs::metadata(dir.join(f.local())).ok())
        .map(|m| m.len())
        .sum();
    let verified = states.iter().all(|(_, s)| *s == FileState::Verified);
    format!(
        "{} {}",
        if verified { "verified" } else { "present" },
        human(bytes)
    )
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.0} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.0} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

pub fn download(names: &[String]) -> Result<()> {
    let store = Store::from_env()?;
    let entries: Vec<&ModelEntry> = names
        .iter()
        .map(|name| {
            store.registry().get(name).ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown model `{name}`; known: {}",
                    store
                        .registry()
                        .models()
                        .iter()
                        .map(|m| m.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        })
        .collect::<Result<_>>()?;
    let downloader = Downloader::new(DownloadOptions::from_env());
    for entry in entries {
        println!(
            "{} ({}) -> {}",
            entry.name,
            entry.repo,
            store.model_dir(&entry.name).display()
        );
        let mut bars = Bars::default();
        downloader.download(&store, entry, &mut bars)?;
    }
    Ok(())
}

/// One progress bar per file.
#[derive(Default)]
struct Bars {
    bar: Option<ProgressBar>,
}

impl Progress for Bars {
    fn start(&mut self, file: &str, total: Option<u64>, done: u64) {
        let bar = match total {
            Some(total) => ProgressBar::new(total).with_style(
                ProgressStyle::with_template(
                    "  {msg:32} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            ),
            None => ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("  {msg:32} {bytes} {bytes_per_sec}")
                    .expect("valid template"),
            ),
        };
        bar.set_message(file.to_string());
        bar.set_position(done);
        self.bar = Some(bar);
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }

    fn finish(&mut self, file: &str) {
        match self.bar.take() {
            Some(bar) => bar.finish_with_message(format!("{file} (verified)")),
            None => println!("  {file}: verified"),
        }
    }

    fn skip(&mut self, file: &str) {
        println!("  {file}: already present and verified");
    }

    fn retry(&mut self, file: &str, reason: &str) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
        tracing::warn!("{file}: {reason}; trying again");
    }
}
