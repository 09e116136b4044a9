#![doc = include_str!("../README.md")]
//!
//! ## Contents
//!
//! - [`heads`]: multi-token prediction heads (`spec_nn::heads`) trained on a model's own
//!   hidden states with the trunk frozen: the training data ([`heads::TrainingSet`], a chat
//!   model's [`heads::SelfDistill`]) and [`heads::train`].
//! - [`cli`]: the training programs' command-line options (`clap`) and progress display.
//! - `testing` (hidden): trained fixtures for tests (`tiny_heads`).

pub mod cli;
pub mod heads;
#[doc(hidden)]
pub mod testing;
