//! Forward costs measured once per model file and machine, cached beside the weights.
//!
//! The cost-aware draft policy needs what a forward of 1…32 tokens costs the target and the
//! draft here. Measuring takes a few seconds, so the result is written next to the model as
//! `<weights file>.forward-costs.json`, tagged with the CPU, the kernels (version and source
//! fingerprint) and thread count it was measured on, and measured again when any of them
//! differs, the file cannot be read, or a one-token forward timed at load disagrees with it
//! (machines with the same CPU name differ in memory speed, and so in forward costs). Once
//! read and checked, or measured, the costs are kept for the rest of the process, so that the
//! sessions opened on a loaded model (the server opens one per connection) pay for neither.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use spec_core::{Decoder, ForwardCosts};

use crate::Result;

/// The longest forward measured (the longest draft plus one).
pub const MEASURED_FORWARD: usize = 32;

#[derive(Serialize, Deserialize, PartialEq)]
struct CachedCosts {
    cpu: String,
    kernels: String,
    threads: usize,
    /// (tokens, seconds)
    points: Vec<(usize, f64)>,
}

/// This machine's CPU model, the kernels and their threads, as cached costs are keyed.
fn machine() -> (String, String, usize) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|name| name.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let kernels = format!(
        "spec-kernels {} {:016x} {:?}",
        spec_kernels::VERSION,
        spec_kernels::SOURCE_FINGERPRINT,
        spec_kernels::Isa::best()
    );
    (cpu, kernels, spec_kernels::threads())
}

fn cache_path(weights: &Path) -> PathBuf {
    let mut name = weights.file_name().unwrap_or_default().to_os_string();
    name.push(".forward-costs.json");
    weights.with_file_name(name)
}

/// How far a one-token forward timed at load may be from the cached cost before all costs are
/// measured again: relatively (this machine drifts by ±15–20 % between runs) and absolutely
/// (forwards of tiny models differ by more than that from call to call).
const STALE_RATIO: f64 = 1.3;
const STALE_SECONDS: f64 = 1e-3;

/// Whether a one-token forward of `now` seconds says the cached `cached` seconds are stale.
fn stale(cached: f64, now: f64) -> bool {
    let (low, high) = (cached.min(now), cached.max(now));
    high > low * STALE_RATIO && high - low > STALE_SECONDS
}

/// Costs this process has settled, by weights file and kernel threads.
static SETTLED: Mutex<BTreeMap<(PathBuf, usize), ForwardCosts>> = Mutex::new(BTreeMap::new());

/// The forward costs of `model` (loaded from `weights`): the ones this process settled before,
/// else cached ones when they were measured on this machine and a one-token forward timed now
/// agrees with them, else measured now (leaving the model's cache empty) and cached if the
/// folder is writable. A model not loaded from a file (built in memory) is measured every time
/// and nothing is written.
pub fn forward_costs<D: Decoder>(model: &mut D, weights: &Path) -> Result<ForwardCosts> {
    if !weights.is_file() {
        return Ok(ForwardCosts::measure(model, MEASURED_FORWARD, 3)?);
    }
    let key = (weights.to_path_buf(), spec_kernels::threads());
    let known = SETTLED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
        .cloned();
    if let Some(costs) = known {
        return Ok(costs);
    }
    let costs = checked_or_measured(model, weights)?;
    SETTLED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key, costs.clone());
    Ok(costs)
}

/// The cached costs of `weights` if they fit this machine and a forward timed now, else new
/// measurements, written beside the weights.
fn checked_or_measured<D: Decoder>(model: &mut D, weights: &Path) -> Result<ForwardCosts> {
    let (cpu, kernels, threads) = machine();
    let path = cache_path(weights);
    let cached = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str::<CachedCosts>(&text).ok())
        .filter(|c| c.cpu == cpu && c.kernels == kernels && c.threads == threads)
        .and_then(|c| ForwardCosts::from_points(&c.points).ok());
    if let Some(costs) = cached {
        let now = ForwardCosts::measure(model, 1, 3)?;
        if !stale(costs.cost(1), now.cost(1)) {
            return Ok(costs);
        }
    }
    let costs = ForwardCosts::measure(model, MEASURED_FORWARD, 3)?;
    let record = CachedCosts {
        cpu,
        kernels,
        threads,
        points: costs.table(),
    };
    if let Ok(text) = serde_json::to_string(&record) {
        // A read-only models folder only means measuring again next time.
        let _ = std::fs::write(&path, text);
    }
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use spec_core::mock::{MockConfig, MockDecoder};

    use super::*;

    #[test]
    fn costs_are_cached_beside_a_weights_file_and_never_for_a_model_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = MockDecoder::new(MockConfig::target(50, 1));
        let in_memory = dir.path().join("(random)");
        forward_costs(&mut model, &in_memory).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

        let weights = dir.path().join("model.gguf");
        std::fs::write(&weights, b"weights").unwrap();
        let measured = forward_costs(&mut model, &weights).unwrap();
        let cache = dir.path().join("model.gguf.forward-costs.json");
        assert!(cache.is_file());
        let again = forward_costs(&mut model, &weights).unwrap();
        assert_eq!(again.table(), measured.table());
    }

    #[test]
    fn costs_cached_by_other_kernels_or_far_from_a_forward_timed_now_are_measured_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = MockDecoder::new(MockConfig::target(50, 1));
        let (cpu, kernels, threads) = machine();
        // A mock's forward takes microseconds, not seconds.
        let slow: Vec<(usize, f64)> = (1..=MEASURED_FORWARD).map(|k| (k, k as f64)).collect();
        // A weights file of its own per case: costs settled in this process are not read again.
        for (i, kernels) in [format!("{kernels} (older)"), kernels]
            .into_iter()
            .enumerate()
        {
            let weights = dir.path().join(format!("model-{i}.gguf"));
            std::fs::write(&weights, b"weights").unwrap();
            let cache = dir
                .path()
                .join(format!("model-{i}.gguf.forward-costs.json"));
            let record = CachedCosts {
                cpu: cpu.clone(),
                kernels,
                threads,
                points: slow.clone(),
            };
            std::fs::write(&cache, serde_json::to_string(&record).unwrap()).unwrap();
            let costs = forward_costs(&mut model, &weights).unwrap();
            assert!(costs.cost(1) < 0.5, "stale costs kept: {}", costs.cost(1));
            let rewritten: CachedCosts =
                serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
            assert_eq!(rewritten.points, costs.table());
        }
    }

    #[test]
    fn costs_settled_once_are_kept_for_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = MockDecoder::new(MockConfig::target(50, 1));
        let weights = dir.path().join("model.gguf");
        std::fs::write(&weights, b"weights").unwrap();
        let first = forward_costs(&mut model, &weights).unwrap();
        // Whatever the file says now, this process does not read it or time a forward again.
        let cache = dir.path().join("model.gguf.forward-costs.json");
        std::fs::write(&cache, "not json").unwrap();
        let again = forward_costs(&mut model, &weights).unwrap();
        assert_eq!(again.table(), first.table());
    }

    #[test]
    fn only_a_clear_difference_makes_costs_stale() {
        assert!(!stale(0.020, 0.024));
        assert!(stale(0.020, 0.030));
        assert!(stale(0.030, 0.020));
        // Tiny models: 50 µs against 100 µs is noise.
        assert!(!stale(50e-6, 100e-6));
    }
}
