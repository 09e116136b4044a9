//! Benchmark of engine-llm on this machine, every comparison made in the same run:
//! forward costs for 1–32 tokens, greedy autoregressive decoding against candle-transformers'
//! quantized models on the same GGUF files, and 0.5B → 1.5B speculative decoding (fixed γ and
//! the cost-aware policy) against autoregressive decoding of the 1.5B, with a check that every
//! speculative output is identical to the autoregressive one.
//!
//! ```sh
//! cargo run --release -p engine-llm --example bench_llm -- [--questions 10] [--tokens 128] [--json PATH]
//! ```
//!
//! `cargo xtask bench llm` runs it and files the results with the machine and date.
//!
//! With `SPECVOICE_LLAMA_BENCH` set to a `llama-bench` binary (llama.cpp built by you, outside
//! this repository), llama.cpp is measured in the same run on the same GGUF files (decode
//! `tg128`; forwards of k tokens as `pp k`, on an empty context); otherwise its figures
//! recorded on this kind of machine are shown, marked as such.
//! ```text
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::{quantized_llama, quantized_qwen2};
use clap::Parser;
use engine_llm::{LanguageModel, LoadOptions, Message};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_cli::{init_logging, open_model};
use spec_core::report::{ratio, speedup, Report, Table};
use spec_core::sampling::argmax;
use spec_core::{
    generate, speculative_generate, CostAwarePolicy, DecodeStats, Decoder, DraftLength,
    ForwardCosts, Generation, SamplingConfig, SpeculativeConfig, StopConditions,
};
use spec_models::mt_bench;

const SMOLLM: &str = "smollm2-135m-instruct";
const DRAFT: &str = "qwen2.5-coder-0.5b-instruct";
const TARGET: &str = "qwen2.5-coder-1.5b-instruct";
/// llama.cpp decode tokens/s on this machine for the same GGUF files (`../shared/peers/README.md`,
/// midpoints of the recorded ranges).
const LLAMA_CPP_DECODE: [(&str, f64); 3] = [(SMOLLM, 140.0), (DRAFT, 52.5), (TARGET, 32.5)];
const FORWARD_LENGTHS: [usize; 6] = [1, 2, 4, 8, 16, 32];
/// llama.cpp's recorded cost in ms of a forward over 1, 2, 4, 8, 16, 32 tokens on this machine
/// (`../shared/peers/README.md`; None where not recorded).
const LLAMA_CPP_FORWARD_MS: [(&str, [Option<f64>; 6]); 2] = [
    (
        DRAFT,
        [Some(19.0), None, Some(44.0), Some(56.0), Some(71.0), None],
    ),
    (
        TARGET,
        [
            Some(29.0),
            Some(48.0),
            Some(72.0),
            Some(146.0),
            Some(171.0),
            None,
        ],
    ),
];

/// llama.cpp on the same GGUF, measured in this run by a `llama-bench` binary.
struct LlamaCpp {
    binary: PathBuf,
}

impl LlamaCpp {
    fn from_env() -> Option<Self> {
        std::env::var_os("SPECVOICE_LLAMA_BENCH").map(|binary| Self {
            binary: binary.into(),
        })
    }

    /// Runs `llama-bench` with two threads and JSON output; its records.
    fn run(&self, gguf: &Path, args: &[&str]) -> Result<Vec<serde_json::Value>> {
        let output = std::process::Command::new(&self.binary)
            .arg("-m")
            .arg(gguf)
            .args(["-t", "2", "-r", "3", "-o", "json"])
            .args(args)
            .output()
            .with_context(|| format!("running {}", self.binary.display()))?;
        if !output.status.success() {
            // A signal (an illegal instruction, say) leaves stderr empty: the status names it.
            bail!(
                "{} failed ({}): {}",
                self.binary.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        serde_json::from_slice(&output.stdout).context("llama-bench's JSON output")
    }

    /// The ms of a forward over each of [`FORWARD_LENGTHS`] new tokens on an empty context.
    fn forward_ms(&self, gguf: &Path) -> Result<Vec<Option<f64>>> {
        let lengths: Vec<String> = FORWARD_LENGTHS.iter().map(|k| k.to_string()).collect();
        let forwards = self.run(gguf, &["-n", "0", "-p", &lengths.join(",")])?;
        Ok(FORWARD_LENGTHS
            .iter()
            .map(|&k| {
                forwards
                    .iter()
                    .find(|r| r["n_prompt"].as_u64() == Some(k as u64))
                    .and_then(|r| r["avg_ns"].as_f64())
                    .map(|ns| ns / 1e6)
            })
            .collect())
    }

    /// Decode tokens/s (`tg128`).
    fn decode(&self, gguf: &Path) -> Result<f64> {
        let decode = self.run(gguf, &["-p", "0", "-n", "128"])?;
        decode
            .first()
            .and_then(|r| r["avg_ts"].as_f64())
            .context("llama-bench reported no decode rate")
    }
}

/// Bytes of weights a one-token forward reads: every tensor but the embedding table (of
/// which it reads one row), which it reads whole as the output layer when they are tied.
fn weight_bytes_per_token(path: &Path) -> Result<f64> {
    let mut file = std::fs::File::open(path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let tied = !content.tensor_infos.contains_key("output.weight");
    Ok(content
        .tensor_infos
        .iter()
        .filter(|(name, _)| tied || name.as_str() != "token_embd.weight")
        .map(|(_, info)| {
            (info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size())
                as f64
        })
        .sum())
}

/// Greedy decoding speed of SpecVoice's engine against candle-transformers and llama.cpp, and
/// 0.5B → 1.5B speculative decoding, all in one run.
#[derive(Parser)]
struct Args {
    /// MT-Bench first turns to answer
    #[arg(long, default_value_t = 10)]
    questions: usize,

    /// Most new tokens per answer
    #[arg(long, default_value_t = 128)]
    tokens: usize,

    /// Also write the report as JSON here
    #[arg(long)]
    json: Option<PathBuf>,
}

/// candle-transformers' quantized models, decoding greedily on the same prompt tokens.
enum Reference {
    Qwen2(quantized_qwen2::ModelWeights),
    Llama(quantized_llama::ModelWeights),
}

impl Reference {
    fn load(path: &Path) -> Result<Self> {
        let mut file = std::fs::File::open(path)?;
        let content = gguf_file::Content::read(&mut file)?;
        let arch = content.metadata["general.architecture"]
            .to_string()?
            .clone();
        Ok(match arch.as_str() {
            "qwen2" => Self::Qwen2(quantized_qwen2::ModelWeights::from_gguf(
                content,
                &mut file,
                &Device::Cpu,
            )?),
            _ => Self::Llama(quantized_llama::ModelWeights::from_gguf(
                content,
                &mut file,
                &Device::Cpu,
            )?),
        })
    }

    /// Seconds for a forward over 1…32 new tokens after 64 cached ones (best of `repeats`),
    /// measured as [`ForwardCosts::measure`] measures ours.
    fn forward_costs(&mut self, vocab: u32, repeats: usize) -> Result<Vec<f64>> {
        let (context, batch) = ForwardCosts::probe_tokens(vocab, 32);
        let mut costs = Vec::new();
        for k in FORWARD_LENGTHS {
            let mut best = f64::INFINITY;
            for _ in 0..repeats {
                self.clear();
                self.forward(&context, 0)?;
                let started = Instant::now();
                let x = Tensor::new(&batch[..k], &Device::Cpu)?.unsqueeze(0)?;
                match self {
                    Self::Qwen2(m) => m.forward(&x, context.len())?,
                    Self::Llama(m) => m.forward(&x, context.len())?,
                };
                best = best.min(started.elapsed().as_secs_f64());
            }
            costs.push(best);
        }
        Ok(costs)
    }

    fn clear(&mut self) {
        match self {
            Self::Qwen2(m) => m.clear_kv_cache(),
            Self::Llama(m) => m.clear_kv_cache(),
        }
    }

    fn forward(&mut self, tokens: &[u32], position: usize) -> Result<Vec<f32>> {
        let x = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?;
        let logits = match self {
            Self::Qwen2(m) => m.forward(&x, position)?,
            Self::Llama(m) => m.forward(&x, position)?,
        };
        Ok(logits.squeeze(0)?.to_vec1()?)
    }

    /// Greedy decoding of up to `max_tokens` after `prompt`, timed as `spec-core` times ours
    /// (tokens produced, wall time of the run and until the first token).
    fn generate(&mut self, prompt: &[u32], max_tokens: usize, end: &[u32]) -> Result<DecodeStats> {
        self.clear();
        let started = Instant::now();
        let mut logits = self.forward(prompt, 0)?;
        let first_token_time = started.elapsed();
        let mut produced = 0;
        loop {
            let token = argmax(&logits);
            produced += 1;
            if produced == max_tokens || end.contains(&token) {
                break;
            }
            logits = self.forward(&[token], prompt.len() + produced - 1)?;
        }
        Ok(DecodeStats {
            generated_tokens: produced,
            total_time: started.elapsed(),
            first_token_time,
            runs: 1,
            ..Default::default()
        })
    }
}

/// Greedy answers of `model` to every prompt.
fn autoregressive(
    model: &mut LanguageModel,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Result<Vec<Generation>> {
    let stop =
        StopConditions::new(max_tokens).with_eos(model.tokenizer.end_tokens().iter().copied());
    prompts
        .iter()
        .map(|p| {
            model.model.reset();
            Ok(generate(
                &mut model.model,
                p,
                &SamplingConfig::greedy(),
                &stop,
                &mut StdRng::seed_from_u64(0),
                &mut |_| {},
            )?)
        })
        .collect()
}

fn main() -> Result<()> {
    init_logging();
    let Args {
        questions,
        tokens: max_tokens,
        json: json_path,
    } = Args::parse();
    let turns = mt_bench::first_turns(&spec_models::Store::from_env()?, questions)?;
    let mut tables = Vec::new();

    // Forward costs: ours, candle-transformers' on the same GGUF, and llama.cpp's (measured
    // here when a llama-bench binary is given, else recorded).
    // Models are loaded once; measuring their costs also warms them, so no timing below
    // includes one-time work.
    let mut costs = std::collections::HashMap::new();
    let mut models = std::collections::HashMap::new();
    let mut weight_bytes = std::collections::HashMap::new();
    let mut cost_rows = Vec::new();
    let llama_cpp = LlamaCpp::from_env();
    let cost_row = |name: &str, who: &str, ms: Vec<Option<f64>>| {
        let mut row = vec![name.to_string(), who.to_string()];
        row.extend(
            ms.iter()
                .map(|m| m.map_or("—".into(), |m| format!("{m:.1}"))),
        );
        row.push(ms[0].map_or("—".into(), |m| format!("{:.1}", 1e3 / m)));
        row.push(match (ms[0], ms[2]) {
            (Some(one), Some(four)) => ratio(four, one),
            _ => "—".into(),
        });
        row
    };
    for name in [SMOLLM, DRAFT, TARGET] {
        let mut model = open_model(name, &LoadOptions::default())?;
        let c = ForwardCosts::measure(&mut model.model, 32, 3)?;
        let ours: Vec<Option<f64>> = FORWARD_LENGTHS
            .iter()
            .map(|&k| Some(c.cost(k) * 1e3))
            .collect();
        cost_rows.push(cost_row(name, "SpecVoice", ours));
        let mut reference = Reference::load(&model.weights)?;
        let theirs = reference.forward_costs(model.model.vocab_size() as u32, 3)?;
        cost_rows.push(cost_row(
            name,
            "candle-transformers",
            theirs.iter().map(|&s| Some(s * 1e3)).collect(),
        ));
        if let Some(llama_cpp) = &llama_cpp {
            let forward_ms = llama_cpp.forward_ms(&model.weights)?;
            cost_rows.push(cost_row(name, "llama.cpp (this run)", forward_ms));
        } else if let Some((_, ms)) = LLAMA_CPP_FORWARD_MS.iter().find(|(n, _)| *n == name) {
            cost_rows.push(cost_row(name, "llama.cpp (recorded)", ms.to_vec()));
        }
        weight_bytes.insert(name, weight_bytes_per_token(&model.weights)?);
        costs.insert(name, c);
        models.insert(name, model);
    }
    let mut columns = vec!["model", "implementation"];
    columns.extend(["1 tok (ms)", "2", "4", "8", "16", "32"]);
    columns.extend(["tok/s at 1", "4 tok ÷ 1 tok"]);
    tables.push(Table {
        caption: "Forward cost by number of new tokens (64 cached), best of 3".into(),
        columns: columns.into_iter().map(String::from).collect(),
        rows: cost_rows,
    });

    // Autoregressive greedy decoding: ours against candle-transformers on the same prompts.
    let mut ar_rows = Vec::new();
    let mut target_reference = Vec::new();
    for name in [SMOLLM, DRAFT, TARGET] {
        let model = models.get_mut(name).expect("loaded above");
        let prompts: Vec<Vec<u32>> = turns
            .iter()
            .map(|q| model.chat_prompt(&[Message::user(q.clone())]))
            .collect::<engine_llm::Result<_>>()?;
        // The memory probe right before and after the decoding it bounds, the better of the two,
        // and llama.cpp's decoding of the same model between them: this machine's bandwidth
        // drifts by 10-20 % over minutes (once from 69 to 45 GB/s within twenty), so figures
        // measured minutes apart do not compare.
        let before = spec_kernels::read_bandwidth_gbs(2);
        let ours = autoregressive(model, &prompts, max_tokens)?;
        let llama_cpp_decode = llama_cpp
            .as_ref()
            .map(|llama_cpp| llama_cpp.decode(&model.weights))
            .transpose()?;
        let bandwidth = before.max(spec_kernels::read_bandwidth_gbs(2));
        let mut ours_stats = DecodeStats::default();
        ours.iter().for_each(|g| ours_stats.merge(&g.stats));
        let mut reference = Reference::load(&model.weights)?;
        let end = model.tokenizer.end_tokens().to_vec();
        reference.generate(&prompts[0], 2, &end)?;
        let mut theirs = DecodeStats::default();
        for p in &prompts {
            theirs.merge(&reference.generate(p, max_tokens, &end)?);
        }
        let llama_cpp_rate = llama_cpp_decode.unwrap_or_else(|| {
            LLAMA_CPP_DECODE
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(f64::NAN, |(_, r)| *r)
        });
        let limit = bandwidth * 1e9 / weight_bytes[name];
        let decode = ours_stats.decode_tokens_per_second();
        let their_decode = theirs.decode_tokens_per_second();
        ar_rows.push(vec![
            name.to_string(),
            format!("{decode:.1}"),
            format!("{:.0} %", 100.0 * decode / limit),
            format!("{bandwidth:.1}"),
            format!("{their_decode:.1}"),
            speedup(decode, their_decode),
            format!("{llama_cpp_rate:.1}"),
            format!("{:.0} %", 100.0 * llama_cpp_rate / limit),
            ratio(decode, llama_cpp_rate),
            format!("{:.1}", ours_stats.tokens_per_second()),
            format!("{:.1}", theirs.tokens_per_second()),
        ]);
        if name == TARGET {
            target_reference = ours.into_iter().zip(prompts).collect::<Vec<_>>();
        }
    }
    tables.push(Table {
        caption: format!("Greedy autoregressive decoding, {questions} MT-Bench first turns, up to {max_tokens} new tokens: decoding rate (tokens/s after the first token, as llama-bench's tg), and overall with the prompt's prefill; bandwidth limit = the memory read rate measured right before and after the model's decoding and llama.cpp's (the better of the two) ÷ its weight bytes per token"),
        columns: [
            "model",
            "SpecVoice decode",
            "of the bandwidth limit",
            "memory read (GB/s)",
            "candle-transformers decode",
            "ratio",
            if llama_cpp.is_some() { "llama.cpp tg128 (this run)" } else { "llama.cpp tg128 (recorded)" },
            "llama.cpp of the limit",
            "ratio to llama.cpp",
            "SpecVoice with prompt",
            "candle-transformers with prompt",
        ]
        .map(String::from)
        .to_vec(),
        rows: ar_rows,
    });

    // Speculative decoding 0.5B → 1.5B against the 1.5B's own greedy decoding above.
    let mut target = models.remove(TARGET).expect("loaded above");
    let mut draft = models.remove(DRAFT).expect("loaded above");
    target.check_draft(&draft)?;
    let stop =
        StopConditions::new(max_tokens).with_eos(target.tokenizer.end_tokens().iter().copied());
    let policy = CostAwarePolicy::new(costs[TARGET].clone(), costs[DRAFT].clone(), 8);
    let configs: Vec<(String, DraftLength)> = vec![
        ("γ = 2".into(), DraftLength::Fixed(2)),
        ("γ = 4".into(), DraftLength::Fixed(4)),
        ("γ = 8".into(), DraftLength::Fixed(8)),
        ("cost-aware (γ ≤ 8)".into(), DraftLength::CostAware(policy)),
    ];
    // Each prompt runs plain decoding and every configuration back to back, so that the
    // machine's drift (±15 % here) affects them alike.
    let mut plain = DecodeStats::default();
    let mut runs: Vec<(DecodeStats, usize, Vec<f64>)> =
        vec![(Default::default(), 0, Vec::new()); configs.len()];
    for (reference, prompt) in &target_reference {
        target.model.reset();
        let ar = generate(
            &mut target.model,
            prompt,
            &SamplingConfig::greedy(),
            &stop,
            &mut StdRng::seed_from_u64(0),
            &mut |_| {},
        )?;
        plain.merge(&ar.stats);
        for ((_, draft_length), (stats, identical, speedups)) in configs.iter().zip(runs.iter_mut())
        {
            let config = SpeculativeConfig {
                draft_length: draft_length.clone(),
                ..Default::default()
            };
            target.model.reset();
            draft.model.reset();
            let out = speculative_generate(
                &mut target.model,
                &mut draft.model,
                prompt,
                &config,
                &stop,
                &mut StdRng::seed_from_u64(0),
                &mut |_| {},
            )?;
            *identical += usize::from(out.tokens == reference.tokens && out.tokens == ar.tokens);
            speedups.push(ar.stats.total_time.as_secs_f64() / out.stats.total_time.as_secs_f64());
            stats.merge(&out.stats);
        }
    }
    let plain_rate = plain.tokens_per_second();
    let mut spec_rows = Vec::new();
    for ((label, _), (stats, identical, speedups)) in configs.iter().zip(&runs) {
        let spec_rate = stats.tokens_per_second();
        let (lo, hi) = speedups
            .iter()
            .fold((f64::INFINITY, 0f64), |(lo, hi), &s| (lo.min(s), hi.max(s)));
        spec_rows.push(vec![
            label.clone(),
            format!("{spec_rate:.1}"),
            speedup(spec_rate, plain_rate),
            format!("{lo:.2}× / {hi:.2}×"),
            format!("{:.0} %", 100.0 * stats.acceptance_rate()),
            format!("{:.2}", stats.tokens_per_target_pass()),
            format!("{:.2}", stats.mean_draft_length()),
            format!("{identical}/{}", target_reference.len()),
        ]);
    }
    spec_rows.insert(
        0,
        vec![
            "1.5B alone".into(),
            format!("{plain_rate:.1}"),
            "1.00×".into(),
            "—".into(),
            "—".into(),
            "1.00".into(),
            "0".into(),
            "—".into(),
        ],
    );
    tables.push(Table {
        caption: format!(
            "Speculative decoding, draft {DRAFT} → target {TARGET}, greedy, same prompts"
        ),
        columns: [
            "decoding",
            "tokens/s",
            "speed-up",
            "per-prompt min / max",
            "acceptance",
            "tokens per target pass",
            "mean draft length",
            "identical to greedy",
        ]
        .map(String::from)
        .to_vec(),
        rows: spec_rows,
    });

    let report = Report {
        command: format!(
            "cargo run --release -p engine-llm --example bench_llm -- --questions {questions} --tokens {max_tokens}"
        ),
        tables,
        notes: Vec::new(),
        ..Report::default()
    };
    print!("{}", report.markdown());
    if let Some(path) = json_path {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
