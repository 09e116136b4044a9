//! Trains the Speech Speculative Decoding draft of CosyVoice 2's speech-token LM (the paper's
//! §3.2): the LM's own lower 2 and upper 6 layers, the lower ones and `llm_decoder` retrained on
//! the LM's outputs. Data: speech tokens the LM draws for the sentences of
//! `engine-asr/data/heads_training_sentences.txt` (written for the project), in the voice of a
//! speaker prompt when one is given, each labelled with the LM's top next-token probabilities
//! (`SpeechLm::distill`).
//!
//! ```sh
//! cargo run --release -p spec-train --example train_cosyvoice_ssd_draft -- cosyvoice2-0.5b \
//!     [--speaker speaker.safetensors] [--epochs 2]
//! ```
//!
//! `cargo xtask train-ssd-draft cosyvoice2-0.5b …` runs it. The draft goes to
//! `$SPECVOICE_MODELS/ssd/NAME/` unless `--out` says otherwise; `speak --ssd-draft DIR` and
//! `CosyVoice2::with_ssd` use it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use engine_llm::ssd::{draft_dir, DistilledSequence};
use engine_llm::LoadOptions;
use engine_tts::cosyvoice::lm::{SpeechLm, SpeechLmConfig};
use engine_tts::cosyvoice::pipeline::load_tokenizer;
use engine_tts::cosyvoice::SpeakerPrompt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_cli::{init_logging, progress_bar};
use spec_models::Store;
use spec_nn::heads::weights_fingerprint;
use spec_train::cli::{read_text_lines, SsdTrainArgs};

#[derive(Parser, Debug)]
#[command(about = "Train the SSD draft of CosyVoice 2's speech-token LM")]
struct Args {
    /// CosyVoice 2: a name in the models folder, or its folder (llm.pt, CosyVoice-BlankEN/).
    model: String,
    /// Sentences to speak, one per line.
    #[arg(long, default_value = "engine-asr/data/heads_training_sentences.txt")]
    sentences: PathBuf,
    /// The voice the sentences are spoken in (a speaker prompt, as `speak --speaker` takes);
    /// none by default.
    #[arg(long)]
    speaker: Option<PathBuf>,
    /// Use only the first N sentences.
    #[arg(long)]
    limit: Option<usize>,
    #[command(flatten)]
    training: SsdTrainArgs,
    /// Output folder [default: $SPECVOICE_MODELS/ssd/NAME].
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let store = Store::from_env()?;
    let model = store.resolve(&args.model)?;
    let llm = model.dir.join("llm.pt");
    let backbone = model.dir.join("CosyVoice-BlankEN");
    let mut lm = SpeechLm::load(
        &llm,
        &backbone.join("config.json"),
        SpeechLmConfig::default(),
        &LoadOptions::default(),
    )
    .with_context(|| format!("loading CosyVoice 2's LM from {}", model.dir.display()))?;
    let tokenizer = load_tokenizer(&backbone)?;
    let (prompt_text, prompt_speech) = match &args.speaker {
        Some(path) => {
            let prompt = SpeakerPrompt::load(path)?;
            (prompt.text, prompt.speech_tokens)
        }
        None => (Vec::new(), Vec::new()),
    };
    let sentences = read_text_lines(&[&args.sentences], args.limit)?;

    let mut rng = StdRng::seed_from_u64(args.training.seed);
    let bar = progress_bar(sentences.len(), "speaking");
    let mut data: Vec<DistilledSequence> = Vec::with_capacity(sentences.len());
    for sentence in &sentences {
        let ids = tokenizer
            .encode(sentence.as_str(), false)
            .map_err(|e| anyhow::anyhow!("tokenizing {sentence:?}: {e}"))?
            .get_ids()
            .to_vec();
        data.push(lm.distill(
            &ids,
            &prompt_text,
            &prompt_speech,
            args.training.top_k,
            &mut rng,
        )?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let positions: usize = data.iter().map(|s| s.labels.len()).sum();
    println!(
        "training set: {} utterances, {positions} positions",
        data.len()
    );

    let backbone_model = lm.ssd_backbone();
    let trained = args.training.train(&backbone_model, &data)?;
    let classes = lm.config().speech_token_size + 3;
    let name = model.name.clone();
    let command = format!(
        "cargo xtask train-ssd-draft {name} {}{}{}",
        args.training.arguments(),
        args.speaker
            .as_ref()
            .map_or(String::new(), |s| format!(" --speaker {}", s.display())),
        args.limit
            .map_or(String::new(), |limit| format!(" --limit {limit}"))
    );
    let config = backbone_model.model.config().clone();
    let weights = trained.into_weights(
        &config,
        classes,
        &name,
        &weights_fingerprint(&llm)?,
        &command,
    );
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| draft_dir(store.root(), &name));
    weights.save(&out)?;
    println!(
        "SSD draft written to {} (top-1 agreement with the LM {:.1} % → {:.1} %)",
        out.display(),
        100.0 * weights.info.untrained_agreement,
        100.0 * weights.info.validation_agreement
    );
    Ok(())
}
