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

/// At or below this many seconds a latency prints as "no wait" instead of dividing by it: the answer's
/// audio was ready when the user stopped (the latency prints as 0 ms).
pub const NO_WAIT_SECONDS: f64 = 0.5e-3;

/// `numerator / denominator`, None where the ratio has no meaning: a denominator that is zero,
/// negative or not finite, or a numerator that is not finite.
fn meaningful_ratio(numerator: f64, denominator: f64) -> Option<f64> {
    (numerator.is_finite() && denominator.is_finite() && denominator > 0.0)
        .then(|| numerator / denominator)
}

/// `numerator / denominator` with two decimals, "0.41"; "–" where it has no meaning (a
/// denominator that is zero, negative or not finite, or a numerator that is not finite).
pub fn ratio(numerator: f64, denominator: f64) -> String {
    meaningful_ratio(numerator, denominator).map_or("–".into(), |r| format!("{r:.2}"))
}

/// [`ratio`] as a speed-up, "2.35×" (or "–").
pub fn speedup(numerator: f64, denominator: f64) -> String {
    meaningful_ratio(numerator, denominator).map_or("–".into(), |r| format!("{r:.2}×"))
}

/// How many times lower `latency` is than `baseline` (both in seconds): "2.35×", or "no wait"
/// when `latency` is at most [`NO_WAIT_SECONDS`] (never a ratio to zero), "–" when either is
/// negative or not finite.
pub fn latency_speedup(baseline: f64, latency: f64) -> String {
    if !(baseline.is_finite() && latency.is_finite()) || baseline < 0.0 || latency < 0.0 {
        "–".into()
    } else if latency <= NO_WAIT_SECONDS {
        "no wait".into()
    } else {
        speedup(baseline, latency)
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
    fn speedups_never_divide_by_zero() {
        assert_eq!(ratio(1.0, 4.0), "0.25");
        assert_eq!(ratio(1.0, 0.0), "–");
        assert_eq!(speedup(3.0, 2.0), "1.50×");
        assert_eq!(speedup(3.0, 0.0), "–");
        assert_eq!(speedup(3.0, -1.0), "–");
        assert_eq!(speedup(f64::NAN, 1.0), "–");
        assert_eq!(speedup(1.0, f64::INFINITY), "–");
        assert_eq!(speedup(0.0, 2.0), "0.00×");
    }

    #[test]
    fn a_latency_that_prints_as_zero_is_no_wait() {
        assert_eq!(latency_speedup(0.808, 0.317), "2.55×");
        assert_eq!(latency_speedup(0.408, 0.0), "no wait");
        // The demo once printed 2509201.1× for a turn shown as 0 ms.
        assert_eq!(latency_speedup(0.408, 1.6e-7), "no wait");
        assert_eq!(latency_speedup(0.408, NO_WAIT_SECONDS), "no wait");
        assert_eq!(latency_speedup(0.408, 0.0006), "680.00×");
        assert_eq!(latency_speedup(0.0, 0.0), "no wait");
        assert_eq!(latency_speedup(f64::NAN, 0.3), "–");
        assert_eq!(latency_speedup(0.3, -0.1), "–");
    }

    #[test]
    #[should_panic(expected = "row width")]
    fn rows_must_match_the_columns() {
        Table::new("t", &["a", "b"]).push(vec!["1".into()]);
    }
}
