//! # engine-llm
//!
//! Qwen2 / Llama chat models on [`spec_core`]: one transformer ([`Transformer`]) for both
//! families, loaded from GGUF or safetensors, implementing [`spec_core::Decoder`] so that every
//! loop of `spec-core` (autoregressive, draft-model speculative, token trees) runs on it, and
//! [`predgen`]: input-time speculation for voice assistants.

mod attention;
pub mod chat;
pub mod config;
pub mod costs;
mod error;
mod linear;
pub mod load;
pub(crate) mod math;
pub mod predgen;
mod swiglu;
pub mod tokenizer;
pub mod transformer;

pub use chat::{ChatTemplate, LanguageModel, Message, Role};
pub use config::{Architecture, RopeLayout, TransformerConfig};
pub use costs::forward_costs;
pub use error::{Error, Result};
pub use load::{GgufFile, LoadOptions, Requantize};
pub use predgen::{Continuation, PredGen, PredGenConfig, Turn, Verifier};
pub use tokenizer::TextTokenizer;
pub use transformer::{CacheState, Transformer};
