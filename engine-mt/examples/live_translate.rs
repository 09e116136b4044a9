//! Shows a live caption as the source grows: each update's display, with what SSBD kept. The
//! final update of a sentence is verified without bias unless `--biased-final` is given.
//!
//! ```sh
//! cargo run --release -p engine-mt --example live-translate -- --to German \
//!     --sentence "The meeting has been moved to Thursday afternoon because the manager is travelling."
//! cargo run --release -p engine-mt --example live-translate -- --to Chinese \
//!     --partials engine-mt/data/partials.txt --beta 0.3 --mask-draft 3
//! ```

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use engine_llm::cli::{init_logging, open_model, ModelArgs};
use engine_llm::LoadOptions;
use engine_mt::{
    lag_k, read_partials, Decoding, LiveConfig, LiveTranslator, Masking, StreamSummary,
};

/// A live caption as the source grows: each update's display, with what SSBD kept.
#[derive(Parser)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["sentence", "partials"])))]
#[command(group(clap::ArgGroup::new("decoding").args(["beta", "autoregressive"])))]
#[command(group(clap::ArgGroup::new("masking").args(["mask_display", "mask_draft", "no_mask"])))]
struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// A smaller model with the same vocabulary that drafts the tokens past the previous output
    #[arg(long)]
    assistant: Option<String>,

    /// Language to translate into
    #[arg(long, default_value = "German")]
    to: String,

    /// Language of the source
    #[arg(long, default_value = "English")]
    from: String,

    /// A sentence revealed word by word with lag-k updates
    #[arg(long)]
    sentence: Option<String>,

    /// A file of timed source updates (ASR partials) to replay instead
    #[arg(long)]
    partials: Option<PathBuf>,

    /// Words per update of --sentence
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    lag: u64,

    /// SSBD's bias toward the previous output [default: 0.2]
    #[arg(long)]
    beta: Option<f32>,

    /// Plain autoregressive re-translation instead of SSBD
    #[arg(long)]
    autoregressive: bool,

    /// Hide the last K tokens of each non-final caption (they still draft the next) [default: 3]
    #[arg(long, value_name = "K")]
    mask_display: Option<usize>,

    /// Drop the last K tokens of each output from the display and the next draft
    #[arg(long, value_name = "K")]
    mask_draft: Option<usize>,

    /// Show and draft every token
    #[arg(long)]
    no_mask: bool,

    /// Verify the final update with β too (default: without bias)
    #[arg(long)]
    biased_final: bool,

    /// Most tokens in one output
    #[arg(long, default_value_t = LiveConfig::new("").max_tokens)]
    max_tokens: usize,
}

impl Args {
    fn config(&self) -> LiveConfig {
        let mut config = LiveConfig::new(self.to.clone());
        config.task.source_language = self.from.clone();
        if let Some(beta) = self.beta {
            config.decoding = Decoding::Ssbd { beta };
        }
        if self.autoregressive {
            config.decoding = Decoding::Autoregressive;
        }
        if let Some(k) = self.mask_display {
            config.masking = Masking::Display(k);
        }
        if let Some(k) = self.mask_draft {
            config.masking = Masking::Draft(k);
        }
        if self.no_mask {
            config.masking = Masking::None;
        }
        config.unbiased_final = !self.biased_final;
        config.max_tokens = self.max_tokens;
        config
    }
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let config = args.config();
    let sentences = match (&args.sentence, &args.partials) {
        (Some(text), _) => vec![lag_k(text, args.lag as usize)?],
        (None, Some(path)) => read_partials(path)?,
        (None, None) => unreachable!("clap requires one of them"),
    };
    let mut model = args.model.open()?;
    let mut assistant = match &args.assistant {
        Some(name) => Some(open_model(name, &LoadOptions::default())?),
        None => None,
    };
    let by_characters = config.task.target_uses_characters();
    let mut live = LiveTranslator::new(&mut model, config.clone())?;
    if let Some(assistant) = assistant.as_mut() {
        live = live.with_assistant(assistant)?;
    }
    println!(
        "{}: {} → {}, {:?}, {:?}, final update {:?}\n",
        args.model.model,
        config.task.source_language,
        config.task.target_language,
        config.decoding,
        config.masking,
        config.decoding_for(true)
    );
    let mut summary = StreamSummary::default();
    for updates in &sentences {
        live.reset();
        let mut captions = Vec::new();
        for update in updates {
            let caption = live.update(update)?;
            let d = &caption.decode;
            println!(
                "source  | {}{}",
                update.text,
                if update.is_final { "  [final]" } else { "" }
            );
            println!("caption | {}", caption.display);
            println!(
                "        | kept {}/{} draft tokens, {} new, {} forwards, {:.0} ms\n",
                d.accepted,
                d.drafted,
                d.tokens.len() - d.accepted,
                d.target_forwards,
                d.time.as_secs_f64() * 1e3
            );
            captions.push(caption);
        }
        summary.add_sentence(&captions, by_characters);
    }
    println!(
        "{} updates: NE {:.2}, A/D {:.2}, A/O {:.2}, {:.1} output tokens/s, {} target forwards",
        summary.updates,
        summary.normalized_erasure(),
        summary.accepted_per_drafted(),
        summary.accepted_per_output(),
        summary.tokens_per_second(),
        summary.target_forwards
    );
    Ok(())
}
