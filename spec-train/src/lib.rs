#![doc = include_str!("../README.md")]
//!
//! ## Contents
//!
//! - [`heads`]: multi-token prediction heads (`spec_nn::heads`) trained on a model's own
//!   hidden states with the trunk frozen: the training data ([`heads::TrainingSet`], a chat
//!   model's [`heads::SelfDistill`]) and [`heads::train`].
//! - [`ssd`]: Speech Speculative Decoding's layer drafts (`engine_llm::ssd`): a model's own
//!   lower layers and a shortlist head retrained on its outputs through its frozen upper layers
//!   ([`ssd::train`]).
//! - [`trainable`]: a Llama/Qwen2 decoder layer in float weights and differentiable operations,
//!   which the SSD training runs in place of the quantized inference layers.
//! - [`cli`]: the training programs' command-line options (`clap`) and progress display.
//! - `testing` (hidden): trained fixtures for tests (`tiny_heads`).

pub mod cli;
pub mod heads;
pub mod ssd;
#[doc(hidden)]
pub mod testing;
pub mod trainable;
