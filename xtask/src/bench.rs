//! `cargo xtask bench`: runs the benchmarks the engines register in their `Cargo.toml`
//! (`[[package.metadata.specvoice.bench]]`: name, example, args, quick-args, and what must be
//! trained first: prepare, quick-prepare), files each report
//! as `results/NAME.json` and `results/NAME.md` with the machine, date and commit, and can
//! refresh the README section between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use spec_core::report::Report;

use crate::machine::{self, Machine};

/// A benchmark registered by an engine.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct Benchmark {
    name: String,
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
#[derive(Serialize)]
struct Filed<'a> {
    benchmark: &'a str,
    date: String,
    commit: String,
    machine: Machine,
    command: String,
    report: Report,
}

/// `cargo xtask bench`'s options.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Benchmarks to run [default: every registered one]
    names: Vec<String>,

    /// Run each benchmark with its lighter `quick-args`
    #[arg(long)]
    quick: bool,

    /// Replace the section between `<!-- bench:NAME -->` markers of the workspace README and the
    /// engine's own README with the new table
    #[arg(long)]
    update_readme: bool,

    /// Folder for NAME.json and NAME.md
    #[arg(long, default_value = "results")]
    out: PathBuf,

    /// Arguments passed on to every benchmark (after `--`)
    #[arg(last = true)]
    extra: Vec<String>,
}

/// The benchmarks every workspace package registers.
fn registered() -> Result<Vec<Benchmark>> {
    let output = Command::new(crate::cargo())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
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
    std::fs::create_dir_all(&options.out).with_context(|| options.out.display().to_string())?;
    for benchmark in selected {
        let filed = run_one(benchmark, options)?;
        let markdown = markdown(&filed);
        let base = options.out.join(&benchmark.name);
        std::fs::write(
            base.with_extension("json"),
            serde_json::to_string_pretty(&filed)?,
        )?;
        std::fs::write(base.with_extension("md"), &markdown)?;
        println!("wrote {}.{{json,md}}", base.display());
        if options.update_readme {
            let readmes = [
                PathBuf::from("README.md"),
                Path::new(&benchmark.package).join("README.md"),
            ];
            update_readmes(&readmes, &benchmark.name, &markdown)?;
        }
    }
    Ok(())
}

fn run_one<'a>(benchmark: &'a Benchmark, options: &BenchArgs) -> Result<Filed<'a>> {
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
        benchmark: &benchmark.name,
        date: machine::today(),
        commit: machine::commit(),
        machine: Machine::current(),
        command,
        report,
    })
}

fn markdown(filed: &Filed) -> String {
    format!(
        "Measured {} on {} (commit {}) with `{}` (runs `{}`).\n\n{}",
        filed.date,
        filed.machine.describe(),
        filed.commit,
        filed.command,
        filed.report.command,
        filed.report.markdown()
    )
}

/// Replaces the text between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` in every one of
/// `paths` that has the section (the workspace README and the engine's own).
fn update_readmes(paths: &[PathBuf], name: &str, markdown: &str) -> Result<()> {
    let mut updated = false;
    for path in paths.iter().filter(|p| p.is_file()) {
        let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
        if let Some(new_text) = replace_section(&text, name, markdown) {
            std::fs::write(path, new_text)?;
            println!("updated the `{name}` section of {}", path.display());
            updated = true;
        }
    }
    if !updated {
        println!("no README has a `<!-- bench:{name} -->` … `<!-- /bench:{name} -->` section; left as is");
    }
    Ok(())
}

fn replace_section(text: &str, name: &str, body: &str) -> Option<String> {
    let open = format!("<!-- bench:{name} -->");
    let close = format!("<!-- /bench:{name} -->");
    let start = text.find(&open)? + open.len();
    let end = start + text[start..].find(&close)?;
    Some(format!("{}\n{}{}", &text[..start], body, &text[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readme_sections_are_replaced_in_place() {
        let text = "intro\n<!-- bench:llm -->\nold\n<!-- /bench:llm -->\nrest\n";
        assert_eq!(
            replace_section(text, "llm", "new\n").unwrap(),
            "intro\n<!-- bench:llm -->\nnew\n<!-- /bench:llm -->\nrest\n"
        );
        assert!(replace_section(text, "mt", "x").is_none());
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
    fn every_registered_benchmark_names_an_existing_example() {
        let benchmarks = registered().unwrap();
        assert!(benchmarks.iter().any(|b| b.name == "llm"));
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for b in &benchmarks {
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
