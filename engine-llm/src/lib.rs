//! # engine-llm
//!
//! Qwen2 / Llama chat models on [`spec_core`]: one transformer ([`Transformer`]) for both
//! families, loaded from GGUF or safetensors, implementing [`spec_core::Decoder`] so that every
//! loop of `spec-core` (autoregressive, draft-model speculative, token trees) runs on it, and
//! [`predgen`]: input-time speculation for voice assistants.

pub mod chat;
#[cfg(feature = "cli")]
pub mod cli;
pub mod config;
mod error;
pub mod load;
pub mod predgen;
pub mod template;
pub mod tokenizer;
pub mod transformer;

pub use chat::{LanguageModel, Message, Role};
pub use config::{Architecture, RopeLayout, TransformerConfig};
pub use error::{Error, Result};
pub use load::LoadOptions;
pub use predgen::{Continuation, PredGen, PredGenConfig, Turn, Verifier};
pub use spec_nn::{forward_costs, GgufFile, Requantize};
pub use template::{ChatTemplate, JinjaTemplate, PromptPart};
pub use tokenizer::{TextStream, TextTokenizer};
pub use transformer::{CacheState, Transformer};
