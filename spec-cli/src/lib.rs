//! What SpecVoice's command-line programs (the `specvoice` command, the engines' examples and
//! benchmarks, the training programs) share: one set of model options and one of generation
//! options for `clap`, the kernels' thread count, logging through `tracing` (`RUST_LOG`), and
//! spinners and bars for long work that draw only on a terminal. The inference crates do not
//! depend on it; the training programs' own options are `spec-train`'s (`spec_train::cli`).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::{HeadsDrafter, HeadsTree, SamplingConfig, StopConditions};
use spec_nn::heads::{training_command, MultiTokenHeads};
use tracing_subscriber::EnvFilter;

use engine_llm::{Error, GenerateOptions, LanguageModel, LoadOptions, Result};

/// The chat model `../shared/models/fetch` provides and the examples use by default.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b-instruct";

/// The model to run and the threads to run it on.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// The model: a name in the models folder ($SPECVOICE_MODELS, default
    /// ~/.cache/specvoice/models), a GGUF file, or a folder of safetensors files
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,

    /// Threads for the kernels, the calling thread included [default: one per core, or
    /// $SPECVOICE_THREADS]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
}

impl ModelArgs {
    /// Applies `--threads`; call before any model runs (the kernels' pool starts once).
    pub fn apply_threads(&self) -> Result<()> {
        if let Some(threads) = self.threads {
            spec_kernels::set_threads(threads as usize).map_err(|running| {
                Error::Input(format!(
                    "--threads {threads}: the kernels already run on {running} threads"
                ))
            })?;
        }
        Ok(())
    }

    /// Applies `--threads` and loads `--model` with default options.
    pub fn open(&self) -> Result<LanguageModel> {
        self.apply_threads()?;
        open_model(&self.model, &LoadOptions::default())
    }
}

/// Loads a model by name or path with a spinner on a terminal, and logs how long it took.
pub fn open_model(name: &str, options: &LoadOptions) -> Result<LanguageModel> {
    let spinner = spinner(format!("loading {name}"));
    let start = std::time::Instant::now();
    let model = LanguageModel::open(name, options);
    spinner.finish_and_clear();
    let model = model?;
    tracing::info!(
        model = name,
        weights = %model.weights.display(),
        seconds = format!("{:.1}", start.elapsed().as_secs_f64()),
        "model loaded"
    );
    Ok(model)
}

/// The heads `cargo xtask train-heads MODEL` trained for the model `name` (as the models folder
/// names it): `$SPECVOICE_MODELS/heads/<folder>-<variant>`, e.g. variant `latent-4`. Missing
/// heads are an error that says how to train them.
pub fn open_heads(model: &LanguageModel, name: &str, variant: &str) -> Result<MultiTokenHeads> {
    let store = spec_models::Store::from_env()?;
    let folder = store.resolve(name)?.name;
    let dir = store
        .root()
        .join("heads")
        .join(format!("{folder}-{variant}"));
    if !dir.join("heads.json").is_file() {
        return Err(Error::Config(format!(
            "no heads in {}: train them with `{}`",
            dir.display(),
            training_command(name, variant)
        )));
    }
    model.load_heads(&dir)
}

/// The multi-token prediction heads of PredGen's heads continuation.
#[derive(clap::Args, Clone, Debug)]
pub struct HeadsArgs {
    /// Heads for `--continuation heads`: `$SPECVOICE_MODELS/heads/MODEL-<this>`, as `cargo xtask
    /// train-heads` writes them; one chained head, checked at every step, is the fastest measured
    /// on a CPU where a two-token forward costs about a one-token one
    #[arg(long, default_value = "chained-1")]
    pub heads: String,

    /// With `--continuation heads`, a depth is drafted only while its head is at least this sure
    /// of its guess (0: every depth; about 0.7 suits a chain of four heads)
    #[arg(long, default_value_t = 0.0)]
    pub heads_min_probability: f32,
}

impl HeadsArgs {
    /// The heads trained for `model` (named `name` in the models folder), drafting a chain as
    /// deep as there are heads.
    pub fn drafter(
        &self,
        model: &LanguageModel,
        name: &str,
    ) -> Result<HeadsDrafter<MultiTokenHeads>> {
        let heads = open_heads(model, name, &self.heads)?;
        let depth = heads.info().count;
        Ok(HeadsDrafter::new(heads, HeadsTree::chain(depth))?
            .with_min_probability(self.heads_min_probability)?)
    }
}

/// How much to generate and how to pick tokens.
#[derive(clap::Args, Clone, Debug)]
pub struct GenerationArgs {
    /// Most new tokens per answer
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,

    /// Softmax temperature; 0 is greedy decoding
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    pub temperature: f32,

    /// Sample only among the k most likely tokens
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub top_k: Option<u64>,

    /// Sample only among the most likely tokens whose probabilities add up to p
    #[arg(long, value_parser = probability)]
    pub top_p: Option<f32>,

    /// Penalty > 1 for tokens seen recently (1 = none)
    #[arg(long, default_value_t = 1.0, value_parser = positive)]
    pub repetition_penalty: f32,

    /// Seed of the sampler
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl GenerationArgs {
    pub fn sampling(&self) -> SamplingConfig {
        SamplingConfig {
            temperature: self.temperature,
            top_k: self.top_k.map(|k| k as usize),
            top_p: self.top_p,
            repetition_penalty: self.repetition_penalty,
            ..SamplingConfig::greedy()
        }
    }

    /// `--max-tokens`, ending at any of `end_tokens`.
    pub fn stop(&self, end_tokens: &[u32]) -> StopConditions {
        StopConditions::new(self.max_tokens).with_eos(end_tokens.iter().copied())
    }

    pub fn rng(&self) -> StdRng {
        StdRng::seed_from_u64(self.seed)
    }

    /// The options of [`LanguageModel::chat`]: sampling, `--max-tokens` and `--seed`.
    pub fn options(&self) -> GenerateOptions {
        let mut options = GenerateOptions::default()
            .max_tokens(self.max_tokens)
            .seed(self.seed);
        options.sampling = self.sampling();
        options
    }
}

fn parse_f32(text: &str) -> std::result::Result<f32, String> {
    text.parse::<f32>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("`{text}` is not a number"))
}

fn non_negative(text: &str) -> std::result::Result<f32, String> {
    parse_f32(text).and_then(|v| (v >= 0.0).then_some(v).ok_or("must be ≥ 0".into()))
}

fn positive(text: &str) -> std::result::Result<f32, String> {
    parse_f32(text).and_then(|v| (v > 0.0).then_some(v).ok_or("must be > 0".into()))
}

fn probability(text: &str) -> std::result::Result<f32, String> {
    parse_f32(text).and_then(|v| {
        (v > 0.0 && v <= 1.0)
            .then_some(v)
            .ok_or("must be in (0, 1]".into())
    })
}

/// Sends `tracing` events to standard error, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A second call (a test harness, an embedding program) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

/// A spinner with `message` on standard error while long work runs; draws nothing when
/// standard error is not a terminal.
pub fn spinner(message: impl Into<String>) -> ProgressBar {
    let spinner = ProgressBar::new_spinner().with_message(message.into());
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("a valid template"),
    );
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner
}

/// A bar over `len` steps of long work (benchmark questions, sentences), drawn only on a
/// terminal.
pub fn progress_bar(len: usize, message: impl Into<String>) -> ProgressBar {
    let bar = ProgressBar::new(len as u64).with_message(message.into());
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("a valid template"),
    );
    bar
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        generation: GenerationArgs,
    }

    #[test]
    fn defaults_and_bad_values() {
        let c = Command::try_parse_from(["x"]).unwrap();
        assert_eq!(c.model.model, DEFAULT_MODEL);
        assert!(c.generation.sampling().is_greedy());
        assert_eq!(c.generation.max_tokens, 256);
        let c = Command::try_parse_from([
            "x",
            "--temperature",
            "0.7",
            "--top-k",
            "5",
            "--top-p",
            "0.9",
        ])
        .unwrap();
        let sampling = c.generation.sampling();
        assert_eq!(
            (sampling.temperature, sampling.top_k, sampling.top_p),
            (0.7, Some(5), Some(0.9))
        );
        for bad in [
            &["x", "--temperature", "-1"][..],
            &["x", "--top-p", "1.5"],
            &["x", "--top-k", "0"],
            &["x", "--threads", "0"],
            &["x", "--max-tokens", "many"],
            &["x", "--repetition-penalty", "nan"],
        ] {
            assert!(Command::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }
}
