//! Trained fixtures for tests and examples: prediction heads for the tiny random-weight chat
//! model of `engine_llm::testing`, trained in a moment.

use std::path::Path;

use engine_llm::{LanguageModel, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::{generate, Decoder, HiddenStates, LogitRows, SamplingConfig, StopConditions};
use spec_nn::heads::{HeadKind, MultiTokenHeads};

use crate::heads::{train, TrainConfig, TrainingSet};

/// Three latent heads for `model`, trained for a few epochs on its own greedy continuations
/// of eight made-up prompts, saved in `dir` and loaded back (marked as trained for the model
/// whatever its weights file: tests of the refusal of other models' heads are the heads
/// training's own).
pub fn tiny_heads(model: &mut LanguageModel, dir: &Path) -> Result<MultiTokenHeads> {
    let vocab = model.model.vocab_size() as u32;
    let mut data = TrainingSet::new(model.model.hidden_size());
    for group in 0..8u32 {
        let prompt: Vec<u32> = (0..5).map(|i| (group * 11 + i * 5 + 3) % vocab).collect();
        model.model.reset();
        let out = generate(
            &mut model.model,
            &prompt,
            &SamplingConfig::greedy(),
            &StopConditions::new(16),
            &mut StdRng::seed_from_u64(0),
            &mut |_| {},
        )?;
        model.model.reset();
        let sequence: Vec<u32> = prompt.iter().chain(&out.tokens).copied().collect();
        model.model.forward_tokens(&sequence, LogitRows::None)?;
        let hidden = model.model.last_hidden()?;
        let hidden = hidden.narrow(0, prompt.len() - 1, out.tokens.len())?;
        data.push(hidden, out.tokens, group)?;
    }
    model.model.reset();
    let mut config = TrainConfig::new(HeadKind::latent(), 3);
    config.epochs = 10;
    let all: Vec<u32> = (0..vocab).collect();
    let unembedding = model.model.unembedding_rows(&all)?;
    let trained = train(&data, &unembedding, &config, &mut |_| {})?;
    const FINGERPRINT: &str = "tiny";
    trained.save(dir, "tiny", FINGERPRINT, "spec_train::testing::tiny_heads")?;
    Ok(MultiTokenHeads::load(
        dir,
        &model.model,
        FINGERPRINT,
        Decoder::device(&model.model),
    )?)
}
