//! The SSD tests' speech-token LM (the fixture's, with as many speech tokens as asked) and
//! what they speak; shared with `spec-train`'s test of a trained draft.

use std::collections::HashMap;

use candle_core::Tensor;
use engine_llm::{LoadOptions, Requantize, TransformerConfig};
use engine_tts::cosyvoice::lm::{SpeechLm, SpeechLmConfig};

use super::Fixture;

/// Speech tokens of the SSD tests' LM.
pub const SPEECH_TOKENS: usize = 48;

/// The fixture LM's weights (state-dict names) and its backbone's configuration.
pub fn fixture() -> (HashMap<String, Tensor>, TransformerConfig) {
    let fixture = Fixture::read("llm_tiny.safetensors");
    let backbone = TransformerConfig::from_hf_json(&fixture.config["qwen2"].to_string()).unwrap();
    (fixture.with_prefix("w."), backbone)
}

/// A speech-token LM of `backbone` with `weights` and `speech` speech tokens, its weights kept
/// exact (f32).
pub fn model(
    weights: HashMap<String, Tensor>,
    backbone: TransformerConfig,
    speech: usize,
) -> SpeechLm {
    let config = SpeechLmConfig {
        speech_token_size: speech,
        ..SpeechLmConfig::default()
    };
    let options = LoadOptions {
        requantize: Requantize::Keep,
        ..LoadOptions::default()
    };
    SpeechLm::from_tensors(weights, backbone, config, &options).unwrap()
}

/// The text the SSD tests speak, and the speaker prompt's text and speech tokens.
pub const TEXT: [u32; 3] = [5, 17, 40];
pub const PROMPT_TEXT: [u32; 2] = [3, 9];
pub const PROMPT_SPEECH: [u32; 4] = [1, 30, 30, 7];
