//! Shows a live caption as the source grows: each update's display, with what SSBD kept. The
//! final update of a sentence is verified without bias unless `--biased-final` is given.
//!
//! ```sh
//! cargo run --release -p engine-mt --example live-translate -- --to German \
//!     --sentence "The meeting has been moved to Thursday afternoon because the manager is travelling."
//! cargo run --release -p engine-mt --example live-translate -- --to Chinese \
//!     --partials crates/engine-mt/data/partials.txt --beta 0.3 --mask-draft 3
//! ```

use anyhow::{bail, Context, Result};
use engine_llm::{LanguageModel, LoadOptions};
use engine_mt::{
    lag_k, read_partials, Decoding, LiveConfig, LiveTranslator, Masking, StreamSummary,
};

const USAGE: &str = "usage: live-translate [--model NAME|PATH] [--to LANGUAGE] [--from LANGUAGE]
    (--sentence TEXT [--lag K] | --partials FILE)
    [--beta B | --autoregressive] [--mask-display K | --mask-draft K | --no-mask]
    [--biased-final] [--assistant NAME|PATH] [--max-tokens N]
defaults: --model qwen2.5-coder-1.5b-instruct --to German --from English --lag 3 --beta 0.2
          --mask-display 3, final updates verified with β = 0 (--biased-final: with β too)";

fn main() -> Result<()> {
    let mut model_name = "qwen2.5-coder-1.5b-instruct".to_string();
    let mut assistant_name = None;
    let mut config = LiveConfig::new("German");
    let (mut sentence, mut partials, mut lag) = (None, None, 3);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--model" => model_name = value()?,
            "--assistant" => assistant_name = Some(value()?),
            "--to" => config.task.target_language = value()?,
            "--from" => config.task.source_language = value()?,
            "--sentence" => sentence = Some(value()?),
            "--partials" => partials = Some(value()?),
            "--lag" => lag = value()?.parse()?,
            "--beta" => {
                config.decoding = Decoding::Ssbd {
                    beta: value()?.parse()?,
                }
            }
            "--autoregressive" => config.decoding = Decoding::Autoregressive,
            "--mask-display" => config.masking = Masking::Display(value()?.parse()?),
            "--mask-draft" => config.masking = Masking::Draft(value()?.parse()?),
            "--no-mask" => config.masking = Masking::None,
            "--biased-final" => config.unbiased_final = false,
            "--max-tokens" => config.max_tokens = value()?.parse()?,
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    let sentences = match (sentence, partials) {
        (Some(text), None) => vec![lag_k(&text, lag)?],
        (None, Some(path)) => read_partials(path.as_ref())?,
        _ => bail!("give one of --sentence or --partials\n{USAGE}"),
    };
    let options = LoadOptions::default();
    let mut model = LanguageModel::open(&model_name, &options)?;
    let mut assistant = match &assistant_name {
        Some(name) => Some(LanguageModel::open(name, &options)?),
        None => None,
    };
    let by_characters = config.task.target_uses_characters();
    let mut live = LiveTranslator::new(&mut model, config.clone())?;
    if let Some(assistant) = assistant.as_mut() {
        live = live.with_assistant(assistant)?;
    }
    println!(
        "{model_name}: {} → {}, {:?}, {:?}, final update {:?}\n",
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
