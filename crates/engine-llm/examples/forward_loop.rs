//! Runs forwards of a fixed number of tokens in a loop, for profilers (`perf record`).
//!
//! ```sh
//! cargo run --release -p engine-llm --example forward_loop -- --model qwen2.5-coder-1.5b-instruct --tokens 1 --seconds 10
//! ```

use std::time::Instant;

use anyhow::{bail, Context, Result};
use engine_llm::{LanguageModel, LoadOptions};
use spec_core::{Decoder, ForwardCosts, LogitRows};

fn main() -> Result<()> {
    let mut model_name = String::from("qwen2.5-coder-1.5b-instruct");
    let mut tokens = 1usize;
    let mut seconds = 10.0f64;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--model" => model_name = args.next().context("--model NAME")?,
            "--tokens" => tokens = args.next().context("--tokens K")?.parse()?,
            "--seconds" => seconds = args.next().context("--seconds S")?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    let loading = Instant::now();
    let mut model = LanguageModel::open(&model_name, &LoadOptions::default())?;
    let (context, batch) = ForwardCosts::probe_tokens(model.model.vocab_size() as u32, tokens);
    model.model.forward_tokens(&context, LogitRows::Last(1))?;
    model.model.forward_tokens(&batch, LogitRows::All)?;
    model.model.truncate(context.len())?;
    eprintln!(
        "loaded and warmed up in {:.2} s",
        loading.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let mut forwards = 0usize;
    while started.elapsed().as_secs_f64() < seconds {
        model.model.forward_tokens(&batch, LogitRows::All)?;
        model.model.truncate(context.len())?;
        forwards += 1;
    }
    let per = started.elapsed().as_secs_f64() / forwards as f64;
    println!(
        "{model_name}: {forwards} forwards of {tokens} tokens, {:.2} ms each",
        per * 1e3
    );
    Ok(())
}
