//! Forward costs measured once per model file and machine, cached beside the weights.
//!
//! The cost-aware draft policy needs what a forward of 1…32 tokens costs the target and the
//! draft here. Measuring takes a few seconds, so the result is written next to the model as
//! `<weights file>.forward-costs.json`, tagged with the CPU and thread count it was measured on,
//! and measured again when either differs or the file cannot be read.

use std::path::{Path, PathBuf};

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
        "spec-kernels {} {:?}",
        spec_kernels::VERSION,
        spec_kernels::Isa::best()
    );
    (cpu, kernels, spec_kernels::threads())
}

fn cache_path(weights: &Path) -> PathBuf {
    let mut name = weights.file_name().unwrap_or_default().to_os_string();
    name.push(".forward-costs.json");
    weights.with_file_name(name)
}

/// The forward costs of `model` (loaded from `weights`): cached ones when they were measured
/// on this machine, else measured now (leaving the model's cache empty) and cached if the
/// folder is writable. A model not loaded from a file (built in memory) is measured every
/// time and nothing is written.
pub fn forward_costs<D: Decoder>(model: &mut D, weights: &Path) -> Result<ForwardCosts> {
    if !weights.is_file() {
        return Ok(ForwardCosts::measure(model, MEASURED_FORWARD, 3)?);
    }
    let (cpu, kernels, threads) = machine();
    let path = cache_path(weights);
    let cached = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str::<CachedCosts>(&text).ok())
        .filter(|c| c.cpu == cpu && c.kernels == kernels && c.threads == threads);
    if let Some(costs) = cached.and_then(|c| ForwardCosts::from_points(&c.points).ok()) {
        return Ok(costs);
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
}
