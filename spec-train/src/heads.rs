//! Training multi-token prediction heads ([`spec_nn::heads`]; "Faster Speech-LLaMA Inference
//! with Multi-token Prediction", §III) with the trunk frozen (eq. 11).
//!
//! The data is self-distilled: a model's own outputs with the final hidden state that predicted
//! each token, a [`TrainingSet`], made for a chat model by [`SelfDistill::self_distilled`] and
//! for Whisper from `engine_asr::Transcriber::self_distill`. [`train`] fits the heads on it
//! (AdamW, validation on held-out groups, progress reports); [`TrainedHeads::save`] writes them
//! as `spec_nn::heads::MultiTokenHeads::load` reads them, recorded as trained for one model.
//!
//! Errors are `spec-nn`'s ([`spec_nn::Error`]), as the heads' own, except the chat model's
//! self-distillation, which runs the model (`engine_llm::Error`).

mod dataset;
mod distill;
mod train;

pub use dataset::TrainingSet;
pub use distill::SelfDistill;
pub use train::{train, EpochReport, Progress, TrainConfig, TrainedHeads};

#[cfg(test)]
mod tests;
