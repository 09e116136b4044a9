//! CosyVoice 2 (Du et al., 2024): a speech-token language model on a Qwen2.5-0.5B backbone
//! ([`lm`]), the flow-matching decoder from speech tokens to mel frames ([`flow`]) and the HiFT
//! vocoder ([`hift`]), joined into a synthesizer by [`pipeline`] ([`CosyVoice2`],
//! [`CosyVoiceSynthesizer`]). Each part is proven by parity with the reference PyTorch code on tiny
//! random configurations (`engine-tts/reference/make_cosyvoice2_fixtures.py`, fixtures in
//! `tests/data/cosyvoice2`).

pub mod flow;
pub mod hift;
pub mod lm;
pub mod pipeline;
pub mod sampling;

pub use pipeline::{CosyVoice2, CosyVoiceSynthesizer, SpeakerPrompt, Speech};

use std::path::PathBuf;

/// What can go wrong building or running CosyVoice 2.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CosyVoiceError {
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// The Qwen2 backbone (`engine-llm`): its configuration, weights or a forward.
    #[error(transparent)]
    Backbone(#[from] engine_llm::Error),

    /// A decoding step of the backbone (`spec-core`).
    #[error(transparent)]
    Core(#[from] spec_core::Error),

    /// A weight the model needs is missing or has the wrong shape.
    #[error("{name}: {reason}")]
    Weights { name: String, reason: String },

    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },

    /// Input the model cannot take: empty text, a token outside its vocabulary.
    #[error("invalid input: {0}")]
    Input(String),

    /// The model drew a token that the decoding cannot continue from (the reference raises
    /// there too).
    #[error("{0}")]
    Generation(String),

    /// A setting out of range.
    #[error("invalid setting: {0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, CosyVoiceError>;

/// The tensors of a released checkpoint (`llm.pt`, `flow.pt`, `hift.pt`: PyTorch state dicts,
/// read by candle's pickle reader) or of its safetensors conversion (by extension), on the CPU.
pub fn read_weights(
    path: &std::path::Path,
) -> Result<std::collections::HashMap<String, candle_core::Tensor>> {
    let bad = |reason: String| CosyVoiceError::File {
        path: path.to_path_buf(),
        reason,
    };
    if path.extension().is_some_and(|e| e == "safetensors") {
        candle_core::safetensors::load(path, &candle_core::Device::Cpu)
            .map_err(|e| bad(e.to_string()))
    } else {
        Ok(candle_core::pickle::read_all(path)
            .map_err(|e| bad(e.to_string()))?
            .into_iter()
            .collect())
    }
}
