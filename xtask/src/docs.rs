//! The generated parts of the docs, made from the reports in `results/`: each benchmark's
//! section of its docs page (between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`) and the
//! README's headline table (between `<!-- headlines -->` and `<!-- /headlines -->`), whose
//! figures each benchmark names in its registration (`headline`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::bench::{Benchmark, Filed};

/// The README, from the workspace root.
const README: &str = "README.md";
const HEADLINES_OPEN: &str = "<!-- headlines -->";
const HEADLINES_CLOSE: &str = "<!-- /headlines -->";

/// One line of the README's headline table: cells of one row of one of the benchmark's tables.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Headline {
    /// What the figures are, as the table's first column says it.
    pub what: String,
    /// Text the table's caption contains.
    pub table: String,
    /// The row's first cells.
    pub row: Vec<String>,
    /// The columns shown, each as "column: value".
    pub columns: Vec<String>,
}

impl Headline {
    /// The figures this headline names in `filed`'s report.
    fn figures(&self, filed: &Filed) -> Result<String> {
        let table = filed
            .report
            .tables
            .iter()
            .find(|t| t.caption.contains(&self.table))
            .with_context(|| format!("no table whose caption contains `{}`", self.table))?;
        let row = table
            .rows
            .iter()
            .find(|r| r.starts_with(&self.row))
            .with_context(|| format!("`{}` has no row {:?}", self.table, self.row))?;
        let cells = self
            .columns
            .iter()
            .map(|name| {
                let index = table
                    .columns
                    .iter()
                    .position(|c| c == name)
                    .with_context(|| format!("`{}` has no column `{name}`", self.table))?;
                Ok(format!("{name}: {}", row[index]))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(cells.join("; "))
    }
}

/// Rewrites every generated section from `results` (`cargo xtask docs`, and `cargo xtask bench
/// --update-readme` after a run).
pub fn update(benchmarks: &[Benchmark], results: &Path) -> Result<()> {
    for (path, text) in generated(benchmarks, results, Path::new("."))? {
        let old = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        if old != text {
            std::fs::write(&path, text).with_context(|| path.display().to_string())?;
            println!("updated {}", path.display());
        }
    }
    Ok(())
}

/// Each file with generated sections (paths from `root`), with those sections made anew from
/// the reports in `results`. A benchmark not run yet keeps its section as it is and shows in
/// the headline table as not measured.
fn generated(
    benchmarks: &[Benchmark],
    results: &Path,
    root: &Path,
) -> Result<Vec<(PathBuf, String)>> {
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    let mut headlines = String::from("| | figures | measured | details |\n|---|---|---|---|\n");
    for benchmark in benchmarks {
        let name = &benchmark.name;
        let filed = read(results, name)?;
        let path = root.join(&benchmark.doc);
        let index = match files.iter().position(|(p, _)| *p == path) {
            Some(index) => index,
            None => {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("{name}'s docs page {}", path.display()))?;
                files.push((path.clone(), text));
                files.len() - 1
            }
        };
        if let Some(filed) = &filed {
            let (open, close) = (
                format!("<!-- bench:{name} -->"),
                format!("<!-- /bench:{name} -->"),
            );
            files[index].1 = replace_section(&files[index].1, &open, &close, &filed.markdown())
                .with_context(|| format!("{} has no `{open}` … `{close}`", benchmark.doc))?;
        }
        for headline in &benchmark.headline {
            let figures = match &filed {
                Some(filed) => headline
                    .figures(filed)
                    .with_context(|| format!("the `{name}` headline `{}`", headline.what))?,
                None => format!("not measured yet: `cargo xtask bench {name}`"),
            };
            let measured = filed
                .as_ref()
                .map_or("–".into(), |f| format!("{}, {}", f.date, f.machine.cpu));
            headlines.push_str(&format!(
                "| {} | {figures} | {measured} | [{}]({}) |\n",
                headline.what, benchmark.doc, benchmark.doc
            ));
        }
    }
    let readme = root.join(README);
    let text = std::fs::read_to_string(&readme).with_context(|| readme.display().to_string())?;
    let text = replace_section(&text, HEADLINES_OPEN, HEADLINES_CLOSE, &headlines)
        .with_context(|| format!("{README} has no `{HEADLINES_OPEN}` … `{HEADLINES_CLOSE}`"))?;
    files.push((readme, text));
    Ok(files)
}

/// `results/NAME.json`, or None when the benchmark has not been run.
fn read(results: &Path, name: &str) -> Result<Option<Filed>> {
    let path = results.join(format!("{name}.json"));
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    match serde_json::from_str(&text) {
        Ok(filed) => Ok(Some(filed)),
        Err(e) => bail!("{}: not a benchmark report: {e}", path.display()),
    }
}

/// `text` with what stands between `open` and `close` replaced by `body`; None when either
/// marker is missing.
fn replace_section(text: &str, open: &str, close: &str, body: &str) -> Option<String> {
    let start = text.find(open)? + open.len();
    let end = start + text[start..].find(close)?;
    Some(format!("{}\n{}{}", &text[..start], body, &text[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{registered, RESULTS};

    #[test]
    fn sections_are_replaced_in_place() {
        let text = "intro\n<!-- bench:llm -->\nold\n<!-- /bench:llm -->\nrest\n";
        assert_eq!(
            replace_section(text, "<!-- bench:llm -->", "<!-- /bench:llm -->", "new\n").unwrap(),
            "intro\n<!-- bench:llm -->\nnew\n<!-- /bench:llm -->\nrest\n"
        );
        assert!(replace_section(text, "<!-- bench:mt -->", "<!-- /bench:mt -->", "x").is_none());
    }

    /// The README and the docs pages show exactly what results/ holds: a full benchmark run
    /// that is not followed by `cargo xtask docs` (or run with `--update-readme`) fails here.
    #[test]
    fn the_docs_show_the_current_results() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let benchmarks = registered().unwrap();
        let files = generated(&benchmarks, &root.join(RESULTS), &root).unwrap();
        assert!(files.len() > 2);
        for (path, text) in files {
            let on_disk = std::fs::read_to_string(&path).unwrap();
            assert!(
                on_disk == text,
                "{} is not what results/ gives: run `cargo xtask docs`",
                path.display()
            );
        }
    }

    #[test]
    fn every_headline_finds_its_figures() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let benchmarks = registered().unwrap();
        assert!(benchmarks.iter().map(|b| b.headline.len()).sum::<usize>() >= 5);
        for benchmark in &benchmarks {
            let Some(filed) = read(&root.join(RESULTS), &benchmark.name).unwrap() else {
                continue;
            };
            for headline in &benchmark.headline {
                let figures = headline.figures(&filed).unwrap();
                assert_eq!(figures.matches(": ").count(), headline.columns.len());
            }
        }
    }
}
