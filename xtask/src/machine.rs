//! Where and when results were measured.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cpu: String,
    pub threads: usize,
    pub memory_gib: f64,
    pub os: String,
}

impl Machine {
    pub fn current() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Machine {
            cpu,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_gib: (memory_kib / (1024.0 * 1024.0) * 10.0).round() / 10.0,
            os: std::env::consts::OS.to_string(),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{}, {} threads, {} GiB, {}",
            self.cpu, self.threads, self.memory_gib, self.os
        )
    }
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub fn today() -> String {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The checked-out commit, with `-dirty` when the work tree has changes.
pub fn commit() -> String {
    let output = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(hash) = output(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    let dirty =
        output(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{hash}-dirty")
    } else {
        hash
    }
}

#[cfg(test)]
mod tests {
    use super::civil_from_days;

    #[test]
    fn dates_from_day_counts() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }
}
