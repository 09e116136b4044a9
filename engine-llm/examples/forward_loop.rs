//! Runs forwards of a fixed number of tokens in a loop, for profilers (`perf record`).
//!
//! ```sh
//! cargo run --release -p engine-llm --example forward_loop -- --model qwen2.5-coder-1.5b-instruct --tokens 1 --seconds 10
//! ```

use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use spec_cli::{init_logging, ModelArgs};
use spec_core::{Decoder, ForwardCosts, LogitRows};

/// Runs forwards of a fixed number of tokens in a loop, for profilers.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// Tokens per forward
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=512))]
    tokens: u64,

    /// Cached tokens before each forward
    #[arg(long, default_value_t = 64)]
    context: usize,

    /// How long to loop
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let tokens = args.tokens as usize;
    let loading = Instant::now();
    let mut model = args.model.open()?;
    let vocab = model.model.vocab_size() as u32;
    let (_, batch) = ForwardCosts::probe_tokens(vocab, tokens);
    let context = ForwardCosts::probe_context(vocab, args.context);
    model.model.forward_tokens(&context, LogitRows::Last(1))?;
    model.model.forward_tokens(&batch, LogitRows::All)?;
    model.model.truncate(context.len())?;
    tracing::info!(
        "loaded and warmed up in {:.2} s",
        loading.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let mut forwards = 0usize;
    while started.elapsed().as_secs_f64() < args.seconds {
        model.model.forward_tokens(&batch, LogitRows::All)?;
        model.model.truncate(context.len())?;
        forwards += 1;
    }
    let per = started.elapsed().as_secs_f64() / forwards as f64;
    println!(
        "{}: {forwards} forwards of {tokens} tokens after {} cached, {:.2} ms each",
        args.model.model,
        args.context,
        per * 1e3
    );
    Ok(())
}
