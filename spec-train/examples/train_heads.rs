//! Trains multi-token prediction heads for a Whisper model on self-distilled data: sentences
//! spoken by `espeak-ng` in several voices and rates, transcribed greedily by the model itself,
//! whose decoder hidden states (teacher-forced over its own transcript) are cached once (one
//! file of states per file of sentences); then the heads are fitted on them with the trunk
//! frozen (`spec_train::heads::train`).
//!
//! The sentences: `engine-asr/data/heads_training_sentences.txt` (322 everyday sentences) and
//! the 1 993 prompts written for the chat model's heads and SSD draft
//! (`engine-llm/data/heads_*_prompts.txt`, `ssd_training_prompts.txt`: requests, questions and
//! word problems, none from MT-Bench or the voice set): 2 315 lines, 9 260 recordings in the
//! four default voices. On the 322 sentences alone tiny.en's heads overfit within a few
//! epochs (training loss 3.2 against 5.9 on held-out sentences).
//!
//! ```sh
//! cargo run --release -p spec-train --example train_heads -- whisper-base-ct2 \
//!     --heads 4 --kind latent [--data FILE…]
//! ```
//!
//! `cargo xtask train-heads MODEL …` runs it. The heads go to
//! `$SPECVOICE_MODELS/heads/MODEL-KIND-COUNT/` unless `--out` says otherwise. The benchmark's
//! test audio (the real clips, MT-Bench sentences) is never used here.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine_asr::whisper::model_fingerprint;
use engine_asr::{Audio, LoadOptions, TranscribeOptions, Transcriber};
use indicatif::{ProgressBar, ProgressStyle};
use spec_core::HiddenStates;
use spec_models::{Registry, Store};
use spec_train::cli::TrainArgs;
use spec_train::heads::TrainingSet;

#[derive(Parser, Debug)]
#[command(about = "Train multi-token prediction heads for a Whisper model")]
struct Args {
    /// Model (a name in the models folder, or a folder).
    model: String,
    /// Files of sentences to speak, one per line.
    #[arg(
        long,
        num_args = 1..,
        default_values = [
            "engine-asr/data/heads_training_sentences.txt",
            "engine-llm/data/heads_training_prompts.txt",
            "engine-llm/data/ssd_training_prompts.txt",
            "engine-llm/data/heads_general_prompts.txt",
            "engine-llm/data/heads_more_prompts.txt",
            "engine-llm/data/heads_extra_prompts.txt",
            "engine-llm/data/heads_broad_prompts.txt",
            "engine-llm/data/heads_template_prompts.txt",
        ]
    )]
    data: Vec<PathBuf>,
    /// espeak-ng voices and rates (words per minute), `voice:rate`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "en-us:160,en-gb:145,en-us+f3:185,en-gb-x-rp+m3:130"
    )]
    voices: Vec<String>,
    /// Use only the first N sentences.
    #[arg(long)]
    limit: Option<usize>,
    #[command(flatten)]
    training: TrainArgs,
    /// Transcribe again even when the cached hidden states exist.
    #[arg(long)]
    refresh: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let model = store.resolve(&args.model)?;
    let fingerprint = model_fingerprint(&model.dir)?;
    let heads_root = store.root().join("heads");
    let mut transcriber = Transcriber::load(&model.dir, &LoadOptions::default())?;
    // The hidden states depend on the model, the sentences, the voices and the limit: one
    // cached set per file of sentences, so that a new file costs only its own recordings.
    let voices = args.voices.join(",").replace([':', ','], "_");
    let data = TrainingSet::cached_per_file(
        &args.data,
        args.limit,
        args.refresh,
        |sentences, used| {
            heads_root.join(format!(
                "{}-training-set-{sentences}-{voices}-{used}.safetensors",
                model.name
            ))
        },
        |sentences, _| self_distilled(&args, &mut transcriber, sentences),
    )?;
    println!(
        "training set: {} recordings, {} positions",
        data.len(),
        data.positions()
    );

    let vocab: Vec<u32> = (0..transcriber.model().config().vocab_size as u32).collect();
    let unembedding = transcriber.model().unembedding_rows(&vocab)?;
    let out = args.training.train_and_save(
        &data,
        &unembedding,
        &heads_root,
        &model.name,
        &fingerprint,
    )?;
    println!("heads written to {}", out.display());
    Ok(())
}

/// Speaks every sentence in every voice and keeps the model's own transcripts' hidden states.
fn self_distilled(
    args: &Args,
    transcriber: &mut Transcriber,
    sentences: &[String],
) -> Result<TrainingSet> {
    if Command::new("espeak-ng").arg("--version").output().is_err() {
        bail!("espeak-ng is needed to synthesize the training speech: apt-get install espeak-ng");
    }
    let voices: Vec<(&str, &str)> = args
        .voices
        .iter()
        .map(|v| v.split_once(':').context("voices are `voice:rate`"))
        .collect::<Result<_>>()?;
    let hidden_size = transcriber.model().config().hidden_size;
    let mut data = TrainingSet::new(hidden_size);
    let dir = tempfile::tempdir()?;
    let bar = ProgressBar::new((sentences.len() * voices.len()) as u64).with_style(
        ProgressStyle::with_template("speaking and transcribing {bar:30} {pos}/{len} {msg}")?,
    );
    let options = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    for (i, sentence) in sentences.iter().enumerate() {
        for (voice, rate) in &voices {
            let wav = dir.path().join(format!("{i}.wav"));
            let status = Command::new("espeak-ng")
                .args(["-v", voice, "-s", rate, "-w"])
                .arg(&wav)
                .arg(sentence)
                .status()?;
            if !status.success() {
                bail!("espeak-ng failed on {sentence:?} with voice {voice}");
            }
            let samples = Audio::read_wav(&wav)?.to_16k()?;
            if let Some((hidden, next)) = transcriber.self_distill(&samples, &options)? {
                data.push(hidden, next, i as u32)?;
            }
            bar.inc(1);
            bar.set_message(format!("{} positions", data.positions()));
        }
    }
    bar.finish_and_clear();
    Ok(data)
}
