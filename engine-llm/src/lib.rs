#![doc = include_str!("../README.md")]

pub mod answer;
pub mod chat;
pub mod config;
mod error;
pub mod load;
pub mod predgen;
pub mod ssd;
pub mod template;
#[doc(hidden)]
pub mod testing;
pub mod tokenizer;
pub mod transformer;

pub use answer::{
    lookup_drafter, Answer, CancelToken, FinishReason, Flow, GenerateOptions, Speculation,
};
pub use chat::{LanguageModel, Message, Role};
pub use config::{Architecture, RopeLayout, TransformerConfig};
pub use error::{Error, Result};
pub use load::LoadOptions;
pub use predgen::{Continuation, PredGen, PredGenConfig, SpokenTurn, Turn, TurnVoice, Verifier};
pub use spec_core::{DecodeStats, DraftLength, SamplingConfig};
pub use spec_nn::{forward_costs, GgufFile, Requantize};
pub use spec_voice;
pub use template::{ChatTemplate, JinjaTemplate, PromptPart};
pub use tokenizer::{TextStream, TextTokenizer};
pub use transformer::{CacheState, Transformer};
