//! `cargo xtask bench`: runs the benchmarks the engines register in their `Cargo.toml`
//! (`[[package.metadata.specvoice.bench]]`: name, example, args, quick-args, what must be
//! trained first (prepare, quick-prepare), the docs page that shows it and its headline
//! figures), files each report as `results/NAME.json` and `results/NAME.md` with the machine,
//! date and commit, and can refresh the generated sections of the docs and the README
//! ([`crate::docs`]). `--quick` runs file elsewhere and never replace a full run's results.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use spec_core::report::Report;

use crate::docs::{self, Headline};
use crate::machine::{self, Machine};

/// Where full runs file their reports, and the docs read them from.
pub const RESULTS: &str = "results";
/// Where `--quick` runs file theirs unless `--out` says otherwise.
const QUICK_RESULTS: &str = "target/bench-quick";

/// A benchmark registered by an engine.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Benchmark {
    pub name: String,
    example: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    quick_args: Vec<String>,
    /// What the benchmark needs trained into the models folder (heads, drafts) before it runs.
    #[serde(default)]
    prepare: Vec<Preparation>,
    /// The same for `--quick` runs.
    #[serde(default)]
    quick_prepare: Vec<Preparation>,
    /// The docs page (from the workspace root) whose `<!-- bench:NAME -->` section shows the
    /// report.
    pub doc: String,
    /// The figures the README's headline table takes from the report.
    #[serde(default)]
    pub headline: Vec<Headline>,
    #[serde(skip)]
    package: String,
}

/// A folder of the models folder a benchmark needs, and the `cargo xtask` command that makes
/// it: run on first use, skipped once the folder exists.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct Preparation {
    creates: String,
    xtask: Vec<String>,
}

impl Preparation {
    /// Runs the command unless `models`/`creates` already exists; returns whether it ran.
    fn ensure(&self, models: &Path) -> Result<bool> {
        let target = models.join(&self.creates);
        if target.exists() {
            return Ok(false);
        }
        println!(
            "== {} is missing: cargo xtask {}",
            target.display(),
            self.xtask.join(" ")
        );
        let status = Command::new(std::env::current_exe().context("finding xtask")?)
            .args(&self.xtask)
            .status()
            .context("running xtask")?;
        if !status.success() {
            bail!("`cargo xtask {}` failed ({status})", self.xtask.join(" "));
        }
        if !target.exists() {
            bail!(
                "`cargo xtask {}` finished but {} is still missing",
                self.xtask.join(" "),
                target.display()
            );
        }
        Ok(true)
    }
}

/// What `results/NAME.json` holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct Filed {
    pub benchmark: String,
    pub date: String,
    pub commit: String,
    pub machine: Machine,
    pub command: String,
    pub report: Report,
}

impl Filed {
    /// The report as the docs show it: where, when and how it was measured, then its tables.
    pub fn markdown(&self) -> String {
        format!(
            "Measured {} on {} with `{}` (runs `{}`).\n\n{}",
            self.date,
            self.machine.describe(),
            self.command,
            self.report.command,
            self.report.markdown()
        )
    }
}

/// `cargo xtask bench`'s options.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Benchmarks to run [default: every registered one]
    names: Vec<String>,

    /// Run each benchmark with its lighter `quick-args`; the reports go to target/bench-quick
    /// (or --out), never over a full run's in results/
    #[arg(long)]
    quick: bool,

    /// Then rewrite the benchmark's section of its docs page and the README's headline table
    /// from results/ (full runs only)
    #[arg(long, conflicts_with = "quick")]
    update_readme: bool,

    /// Folder for NAME.json and NAME.md [default: results, or target/bench-quick with --quick]
    #[arg(long)]
    out: Option<PathBuf>,

    /// Arguments passed on to every benchmark (after `--`)
    #[arg(last = true)]
    extra: Vec<String>,
}

impl BenchArgs {
    /// A full run of the benchmark `name` with `extra` arguments after its own (later ones
    /// win), refreshing its docs section if `update_docs`.
    pub fn full(name: &str, extra: Vec<String>, update_docs: bool) -> Self {
        Self {
            names: vec![name.to_string()],
            quick: false,
            update_readme: update_docs,
            out: None,
            extra,
        }
    }

    /// Where this run files its reports.
    fn out(&self) -> PathBuf {
        match (&self.out, self.quick) {
            (Some(out), _) => out.clone(),
            (None, true) => PathBuf::from(QUICK_RESULTS),
            (None, false) => PathBuf::from(RESULTS),
        }
    }
}

/// The benchmarks every workspace package registers.
pub fn registered() -> Result<Vec<Benchmark>> {
    let metadata = crate::metadata()?;
    let mut benchmarks = Vec::new();
    for package in metadata["packages"].as_array().context("packages")? {
        let Some(list) = package["metadata"]["specvoice"]["bench"].as_array() else {
            continue;
        };
        let package_name = package["name"].as_str().context("package name")?;
        for item in list {
            let mut benchmark: Benchmark = serde_json::from_value(item.clone())
                .with_context(|| format!("{package_name}: package.metadata.specvoice.bench"))?;
            benchmark.package = package_name.to_string();
            benchmarks.push(benchmark);
        }
    }
    Ok(benchmarks)
}

pub fn run(options: &BenchArgs) -> Result<()> {
    let all = registered()?;
    let known = || {
        all.iter()
            .map(|b| b.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let selected: Vec<&Benchmark> = if options.names.is_empty() {
        all.iter().collect()
    } else {
        options
            .names
            .iter()
            .map(|name| {
                all.iter()
                    .find(|b| &b.name == name)
                    .with_context(|| format!("no benchmark `{name}`; registered: {}", known()))
            })
            .collect::<Result<_>>()?
    };
    let out = options.out();
    if options.update_readme && out != Path::new(RESULTS) {
        bail!("--update-readme shows results/ in the docs: run without --out");
    }
    std::fs::create_dir_all(&out).with_context(|| out.display().to_string())?;
    for benchmark in selected {
        let filed = run_one(benchmark, options)?;
        let base = out.join(&benchmark.name);
        std::fs::write(
            base.with_extension("json"),
            serde_json::to_string_pretty(&filed)?,
        )?;
        std::fs::write(base.with_extension("md"), filed.markdown())?;
        println!("wrote {}.{{json,md}}", base.display());
        if options.update_readme {
            docs::update(&all, Path::new(RESULTS))?;
        }
    }
    Ok(())
}

fn run_one(benchmark: &Benchmark, options: &BenchArgs) -> Result<Filed> {
    let json = std::env::temp_dir().join(format!(
        "specvoice-bench-{}-{}.json",
        benchmark.name,
        std::process::id()
    ));
    let preparations = if options.quick {
        &benchmark.quick_prepare
    } else {
        &benchmark.prepare
    };
    if !preparations.is_empty() {
        let models = spec_models::models_dir()?;
        for preparation in preparations {
            preparation.ensure(&models)?;
        }
    }
    let mut args = if options.quick && !benchmark.quick_args.is_empty() {
        benchmark.quick_args.clone()
    } else {
        benchmark.args.clone()
    };
    args.extend(options.extra.iter().cloned());
    println!(
        "== {} ({} example {}) {}",
        benchmark.name,
        benchmark.package,
        benchmark.example,
        args.join(" ")
    );
    let status = Command::new(crate::cargo())
        .args([
            "run",
            "--release",
            "--quiet",
            "--package",
            &benchmark.package,
        ])
        .args(["--example", &benchmark.example, "--"])
        .args(&args)
        .arg("--json")
        .arg(&json)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("benchmark `{}` failed ({status})", benchmark.name);
    }
    let text = std::fs::read_to_string(&json)
        .with_context(|| format!("{}: the benchmark wrote no report", json.display()))?;
    let _ = std::fs::remove_file(&json);
    let report: Report = serde_json::from_str(&text).context("reading the benchmark's report")?;
    let mut command = format!("cargo xtask bench {}", benchmark.name);
    if options.quick {
        command.push_str(" --quick");
    }
    if !options.extra.is_empty() {
        command.push_str(&format!(" -- {}", options.extra.join(" ")));
    }
    Ok(Filed {
        benchmark: benchmark.name.clone(),
        date: machine::today(),
        commit: machine::commit(),
        machine: Machine::current(),
        command,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_runs_never_file_into_results() {
        let parse = |args: &[&str]| {
            #[derive(clap::Parser)]
            struct Cli {
                #[command(flatten)]
                bench: BenchArgs,
            }
            <Cli as clap::Parser>::try_parse_from(
                std::iter::once("bench").chain(args.iter().copied()),
            )
            .map(|cli| cli.bench)
        };
        assert_eq!(parse(&["llm"]).unwrap().out(), Path::new(RESULTS));
        assert_eq!(
            parse(&["llm", "--quick"]).unwrap().out(),
            Path::new(QUICK_RESULTS)
        );
        assert_eq!(
            parse(&["llm", "--quick", "--out", "elsewhere"])
                .unwrap()
                .out(),
            Path::new("elsewhere")
        );
        assert!(parse(&["llm", "--quick", "--update-readme"]).is_err());
    }

    #[test]
    fn preparations_run_xtask_commands_into_the_models_folder() {
        let commands = ["train-heads", "train-ssd-draft"];
        for b in registered().unwrap() {
            for p in b.prepare.iter().chain(&b.quick_prepare) {
                assert!(
                    Path::new(&p.creates).is_relative(),
                    "{}: {}",
                    b.name,
                    p.creates
                );
                assert!(
                    commands.contains(&p.xtask[0].as_str()),
                    "{}: cargo xtask {}",
                    b.name,
                    p.xtask.join(" ")
                );
            }
        }
        let heads = registered()
            .unwrap()
            .into_iter()
            .find(|b| b.name == "heads");
        assert!(!heads.expect("the heads benchmark").prepare.is_empty());
    }

    #[test]
    fn a_preparation_whose_folder_exists_does_not_run() {
        let models = std::env::temp_dir().join(format!("xtask-prepare-{}", std::process::id()));
        std::fs::create_dir_all(models.join("heads/done")).unwrap();
        let done = Preparation {
            creates: "heads/done".into(),
            xtask: vec!["no-such-command".into()],
        };
        assert!(!done.ensure(&models).unwrap());
        std::fs::remove_dir_all(&models).unwrap();
    }

    #[test]
    fn every_registered_benchmark_names_an_existing_example_and_docs_page() {
        let benchmarks = registered().unwrap();
        assert!(benchmarks.iter().any(|b| b.name == "llm"));
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for b in &benchmarks {
            assert!(root.join(&b.doc).is_file(), "{}: no page {}", b.name, b.doc);
            let examples = root.join(&b.package).join("examples");
            let file = examples.join(format!("{}.rs", b.example));
            let folder = examples.join(&b.example).join("main.rs");
            assert!(
                file.is_file() || folder.is_file(),
                "{}: neither {} nor {}",
                b.name,
                file.display(),
                folder.display()
            );
        }
    }
}
