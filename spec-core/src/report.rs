//! Benchmark reports: captioned tables that print as Markdown and serialize to JSON, the format
//! every engine's benchmark writes and `cargo xtask bench` collects.

use serde::{Deserialize, Serialize};

/// One results table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub caption: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(caption: impl Into<String>, columns: &[&str]) -> Self {
        Table {
            caption: caption.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; it must have one cell per column.
    pub fn push(&mut self, row: Vec<String>) {
        assert_eq!(
            row.len(),
            self.columns.len(),
            "row width of `{}`",
            self.caption
        );
        self.rows.push(row);
    }

    pub fn markdown(&self) -> String {
        let mut out = format!(
            "**{}**\n\n| {} |\n|{}\n",
            self.caption,
            self.columns.join(" | "),
            "---|".repeat(self.columns.len())
        );
        for row in &self.rows {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out
    }
}

/// A benchmark's results: the command that reproduces it, its tables, and notes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The command line that produced the report.
    pub command: String,
    pub tables: Vec<Table>,
    /// Remarks printed after the tables (one paragraph each).
    pub notes: Vec<String>,
    /// Tables kept in the JSON only, not in the markdown: per-item rows (every turn, every
    /// clip) behind the summary tables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<Table>,
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for table in &self.tables {
            out.push_str(&table.markdown());
            out.push('\n');
        }
        for note in &self.notes {
            out.push_str(note);
            out.push_str("\n\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_render_as_markdown() {
        let mut table = Table::new("Speed", &["method", "tokens/s"]);
        table.push(vec!["greedy".into(), "30.1".into()]);
        assert_eq!(
            table.markdown(),
            "**Speed**\n\n| method | tokens/s |\n|---|---|\n| greedy | 30.1 |\n"
        );
        let report = Report {
            command: "x".into(),
            tables: vec![table.clone()],
            notes: vec!["Note.".into()],
            details: vec![table.clone()],
        };
        assert_eq!(
            report.markdown(),
            format!("{}\nNote.\n\n", table.markdown())
        );
    }

    #[test]
    #[should_panic(expected = "row width")]
    fn rows_must_match_the_columns() {
        Table::new("t", &["a", "b"]).push(vec!["1".into()]);
    }
}
