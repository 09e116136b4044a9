//! Benchmark of the quantized kernels on this machine, every comparison in the same run:
//! each format on a 8960 × 1536 matrix (the 1.5B model's FFN up-projection) for 1, 4 and 16
//! tokens (copies of it cycled through, as a model's weights come from memory, not cache), with
//! each instruction set and with candle's quantized matmul on the same bytes,
//! plus this machine's memory bandwidth with two threads (the limit of one-token decoding).
//!
//! ```sh
//! cargo run --release -p spec-kernels --example bench_kernels -- [--repeats 20] [--json PATH]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use spec_core::report::{speedup, Report, Table};
use spec_kernels::{Format, Isa, QMatrix};

const ROWS: usize = 8960;
const COLS: usize = 1536;
const TOKENS: [usize; 3] = [1, 4, 16];
/// Least bytes of weights each timing cycles through; more where the last-level cache is large
/// ([`spec_kernels::beyond_caches`]).
const WORKING_SET_FLOOR: usize = 256 << 20;

fn candle_dtype(format: Format) -> GgmlDType {
    match format {
        Format::Q4_0 => GgmlDType::Q4_0,
        Format::Q4_1 => GgmlDType::Q4_1,
        Format::Q5_0 => GgmlDType::Q5_0,
        Format::Q8_0 => GgmlDType::Q8_0,
        Format::Q4K => GgmlDType::Q4K,
        Format::Q6K => GgmlDType::Q6K,
    }
}

/// Best time of `repeats` calls, after one warm-up call.
fn best(repeats: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..repeats {
        let started = Instant::now();
        f()?;
        best = best.min(started.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Each kernel format against candle's quantized matmul on the same bytes.
#[derive(Parser)]
struct Args {
    /// Timed calls per measurement (the best is kept)
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    repeats: u64,

    /// Also write the report as JSON here
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> Result<()> {
    let Args { repeats, json } = Args::parse();
    let repeats = repeats as usize;
    // Drawn only when standard error is a terminal.
    let bar = ProgressBar::new(Format::ALL.len() as u64).with_style(
        ProgressStyle::with_template("formats [{bar:30}] {pos}/{len} {elapsed}")
            .expect("a valid template"),
    );
    let device = Device::Cpu;
    let weights = Tensor::randn(0f32, 0.05, (ROWS, COLS), &device)?;
    let mut rows = Vec::new();
    let working_set = spec_kernels::beyond_caches(WORKING_SET_FLOOR);
    for format in Format::ALL {
        // Enough copies of the matrix that they do not fit in the caches: a model's weights are
        // read from memory, never from cache.
        let quantized = QTensor::quantize(&weights, candle_dtype(format))?;
        let bytes = quantized.data()?.into_owned();
        let size = bytes.len() as f64;
        let copies = (working_set / bytes.len()).max(1);
        let ours: Vec<QMatrix> = (0..copies)
            .map(|_| QMatrix::new(format, ROWS, COLS, bytes.clone()))
            .collect::<Result<_, _>>()?;
        let theirs: Vec<QMatMul> = (0..copies)
            .map(|_| QMatMul::from_qtensor(QTensor::quantize(&weights, candle_dtype(format))?))
            .collect::<Result<_, _>>()?;
        for tokens in TOKENS {
            let x: Vec<f32> = Tensor::randn(0f32, 1.0, (tokens, COLS), &device)?
                .flatten_all()?
                .to_vec1()?;
            let input = Tensor::from_vec(x.clone(), (1, tokens, COLS), &device)?;
            let mut out = vec![0f32; tokens * ROWS];
            let mut row = vec![format!("{format:?}"), tokens.to_string()];
            for isa in [Isa::Avx512Vnni, Isa::Avx2] {
                if isa.available() {
                    let t = best(repeats, || {
                        for m in &ours {
                            m.matmul_with(isa, &x, tokens, &mut out)?;
                        }
                        Ok(())
                    })? / copies as f64;
                    row.push(format!("{:.3}", t * 1e3));
                } else {
                    row.push("—".into());
                }
            }
            let candle = best(repeats, || {
                for m in &theirs {
                    std::hint::black_box(m.forward(&input)?);
                }
                Ok(())
            })? / copies as f64;
            let fastest = best(repeats, || {
                for m in &ours {
                    m.matmul(&x, tokens, &mut out)?;
                }
                Ok(())
            })? / copies as f64;
            row.push(format!("{:.3}", candle * 1e3));
            row.push(speedup(candle, fastest));
            row.push(format!("{:.1}", size / fastest / 1e9));
            rows.push(row);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let gbs = spec_kernels::read_bandwidth_gbs(2);
    let report = Report {
        command: format!(
            "cargo run --release -p spec-kernels --example bench_kernels -- --repeats {repeats}"
        ),
        tables: vec![Table {
            caption: format!(
                "One {ROWS} × {COLS} matrix × a batch of tokens, ms (best of {repeats}), 2 threads; \
                 this machine reads {gbs:.1} GB/s with 2 threads"
            ),
            columns: [
                "format",
                "tokens",
                "AVX-512 VNNI",
                "AVX2",
                "candle 0.11",
                "speed-up over candle",
                "weights read (GB/s)",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        }],
        notes: vec![format!(
            "The instruction set used by default here: {:?}. All paths give bit-identical results.",
            Isa::best()
        )],
        ..Report::default()
    };
    print!("{}", report.markdown());
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
