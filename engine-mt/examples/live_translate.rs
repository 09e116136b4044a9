//! Shows a live caption as the source grows: each update's display, with what SSBD kept. The
//! final update of a sentence is verified without bias unless `--biased-final` is given.
//!
//! ```sh
//! cargo run --release -p engine-mt --example live-translate -- --to German \
//!     --sentence "The meeting has been moved to Thursday afternoon because the manager is travelling."
//! cargo run --release -p engine-mt --example live-translate -- --to Chinese \
//!     --partials engine-mt/data/partials.txt --beta 0.3 --mask-draft 3
//! cargo run --release -p engine-mt --example live-translate -- --to German \
//!     --sentence "Can we meet at half past three tomorrow?" --local-agreement 2 --hold
//! ```

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use engine_llm::LoadOptions;
use engine_mt::{
    lag_k, read_partials, BiasInputs, Decoding, DisplayPolicy, LiveConfig, LiveTranslator, Masking,
    StreamSummary,
};
use spec_cli::{init_logging, open_model, ModelArgs};

/// A live caption as the source grows: each update's display, with what SSBD kept.
#[derive(Parser)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["sentence", "partials"])))]
#[command(group(clap::ArgGroup::new("decoding").args(["beta", "autoregressive"])))]
#[command(group(clap::ArgGroup::new("masking").multiple(true).args(["mask_display", "local_agreement", "stability", "hold"]).conflicts_with("no_mask")))]
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

    /// SSBD's bias toward the previous output (with the adaptive rule, its most) [default: 0.5]
    #[arg(long)]
    beta: Option<f32>,

    /// Plain autoregressive re-translation instead of SSBD
    #[arg(long)]
    autoregressive: bool,

    /// Display: hide the last K tokens of each non-final caption (they still draft the next);
    /// with the other display options, a caption shows what all of them allow
    #[arg(long, value_name = "K")]
    mask_display: Option<usize>,

    /// Display: show only what the last N outputs agree on
    #[arg(long, value_name = "N")]
    local_agreement: Option<usize>,

    /// Display: show only the prefix of tokens with a biased probability of at least P
    #[arg(long, value_name = "P")]
    stability: Option<f32>,

    /// Display: never take back a shown prefix the new output still starts with
    #[arg(long)]
    hold: bool,

    /// Drop the last K tokens of each output from the next draft (mask-k)
    #[arg(long, value_name = "K")]
    mask_draft: Option<usize>,

    /// Show every token of every caption
    #[arg(long)]
    no_mask: bool,

    /// Use --beta as it is on every update instead of scaling it per update
    /// (engine_mt::AdaptiveBias)
    #[arg(long)]
    fixed_beta: bool,

    /// Let the previous output draft up to N tokens at a time after the divergence (0: off)
    #[arg(long, value_name = "N")]
    lookup: Option<usize>,

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
        let mut stages = Vec::new();
        if let Some(k) = self.mask_display {
            stages.push(DisplayPolicy::mask_k(k));
        }
        if let Some(n) = self.local_agreement {
            stages.push(DisplayPolicy::local_agreement(n));
        }
        if let Some(p) = self.stability {
            stages.push(DisplayPolicy::stability(p));
        }
        if !stages.is_empty() || self.hold {
            config.display = match stages.len() {
                0 => config.display.clone(),
                1 => stages.remove(0),
                _ => DisplayPolicy::all_of(stages),
            };
            if self.hold {
                config.display = DisplayPolicy::hold(config.display.clone());
            }
        }
        if self.no_mask {
            config.display = DisplayPolicy::full();
        }
        if let Some(k) = self.mask_draft {
            config.masking = Masking::Draft(k);
        }
        if self.fixed_beta {
            config.adaptive_bias = None;
        }
        if let Some(n) = self.lookup {
            config.lookup_draft = n;
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
        "{}: {} → {}, {:?}, adaptive β {:?}, draft {:?}, display {}, lookup {}, final update {:?}\n",
        args.model.model,
        config.task.source_language,
        config.task.target_language,
        config.decoding,
        config.adaptive_bias,
        config.masking,
        config.display.label(),
        config.lookup_draft,
        config.decoding_for(true, &BiasInputs::default())
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
                "        | β {:.2}, kept {}/{} draft tokens, {} new, {} forwards, {:.0} ms\n",
                caption.beta,
                d.accepted,
                d.drafted,
                d.tokens.len() - d.accepted,
                d.target_forwards,
                d.time.as_secs_f64() * 1e3
            );
            captions.push(caption);
        }
        summary.add_timed_sentence(updates, &captions, by_characters);
    }
    println!(
        "{} updates: NE {:.2}, A/D {:.2}, A/O {:.2}, {:.1} output tokens/s, {} target forwards, \
         {:.2} s to a stable caption, final caption {:.2} s after the last update",
        summary.updates,
        summary.normalized_erasure(),
        summary.accepted_per_drafted(),
        summary.accepted_per_output(),
        summary.tokens_per_second(),
        summary.target_forwards,
        summary.time_to_stable().as_secs_f64(),
        summary.final_caption_delay().as_secs_f64()
    );
    Ok(())
}
