//! The PredGen tests' chat models, settings, partial prompts and turns.

use std::path::Path;
use std::time::Duration;

use candle_core::quantized::GgmlDType;
use engine_llm::predgen::{spoken_at_rate, FixedLatencySynthesizer, Partial};
use engine_llm::{
    Continuation, LanguageModel, LoadOptions, PredGen, PredGenConfig, SpokenTurn, Verifier,
};

use super::{Family, Tiny};

pub fn tiny_chat_model(dir: &Path, seed: u64) -> LanguageModel {
    // Untied output weights: a tiny random model with tied embeddings only repeats its input.
    let tiny = Tiny {
        tied: false,
        ..Tiny::new(Family::Qwen2)
    };
    let metadata = super::chatml_tokenizer_metadata(tiny.vocab);
    let folder = dir.join(format!("chat-{seed}"));
    std::fs::create_dir_all(&folder).unwrap();
    let path = tiny.write_gguf(&folder, seed, GgmlDType::Q8_0, &metadata);
    LanguageModel::load(&path, &LoadOptions::default()).unwrap()
}

/// Words of [`word_chat_model`]'s vocabulary: openers and commas where a sentence is cut.
const WORDS: [&str; 32] = [
    "Ġwater", "Ġthe", "Ġplant", "Ġonce", "Ġa", "Ġweek", "Ġand", "Ġbut", "Ġfor", "Ġwith", "Ġin",
    "Ġit", "Ġis", "Ġyou", "Ġcan", "Ġsoil", "Ġdry", "Ġroots", "Ġrot", "Ġleaves", ",", "Ġso",
    "Ġwhen", "Ġevery", "Ġday", "Ġlight", "Ġpot", "Ġgrow", "Ġslowly", "Ġsun", "Ġwarm", "Ġcool",
];

/// A tiny random chat model whose vocabulary holds [`WORDS`] besides characters: its answers
/// have long first sentences, which are spoken from their first piece.
pub fn word_chat_model(dir: &Path, seed: u64) -> LanguageModel {
    let tiny = Tiny {
        tied: false,
        vocab: 128,
        ..Tiny::new(Family::Qwen2)
    };
    let metadata = super::chatml_tokenizer_metadata_with_words(tiny.vocab, &WORDS);
    let folder = dir.join(format!("words-{seed}"));
    std::fs::create_dir_all(&folder).unwrap();
    let path = tiny.write_gguf(&folder, seed, GgmlDType::Q8_0, &metadata);
    LanguageModel::load(&path, &LoadOptions::default()).unwrap()
}

pub fn config(verifier: Verifier, continuation: Continuation) -> PredGenConfig {
    PredGenConfig {
        verifier,
        continuation,
        max_guess_tokens: 12,
        max_answer_tokens: 24,
        tokens_per_step: 4,
        ..PredGenConfig::default()
    }
}

/// Partial prompts with self-corrections: earlier words change, as ASR partials do.
pub fn corrected_inputs(final_text: &str) -> Vec<Partial> {
    let mut inputs = vec![
        Partial::new(Duration::from_millis(100), "what is", false),
        Partial::new(Duration::from_millis(400), "what is one plus twenty", false),
    ];
    let spoken = spoken_at_rate(final_text, 600.0).unwrap();
    inputs.extend(spoken.into_iter().map(|mut p| {
        p.at += Duration::from_millis(800);
        p
    }));
    inputs
}

pub fn run_turns(
    session: &mut PredGen<'_>,
    turns: &[Vec<Partial>],
    baseline: bool,
) -> Vec<SpokenTurn> {
    let mut tts = FixedLatencySynthesizer::default();
    turns
        .iter()
        .map(|inputs| {
            if baseline {
                session.baseline_turn(inputs, &mut tts).unwrap()
            } else {
                session.turn(inputs, &mut tts).unwrap()
            }
        })
        .collect()
}
