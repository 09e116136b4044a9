//! # engine-asr (in progress)
//!
//! Speech recognition on `spec-core`. **Only the audio front end runs yet**: this crate holds
//! the place and the layout of the ASR engine so that it is built from the shared `spec-nn`
//! blocks (attention with a rollback-able KV cache and tree masks, cross-attention, linears on
//! `spec-kernels`, LayerNorm, GELU MLPs, sinusoidal and learned positions, weight loading)
//! rather than from a copy of them. Module by module:
//!
//! - [`audio`] (works): WAV reading in any common PCM encoding, mono downmix, resampling to
//!   16 kHz; [`mel`] (works): Whisper's log-mel spectrogram, checked against the Python
//!   implementation, and [`WhisperInput`]: a recording padded as Whisper pads it and cut into
//!   30-second windows at any seek.
//! - `whisper`: the encoder and the decoder (implementing `spec_core::Decoder`, cross-attention
//!   keys/values kept per audio window), from CTranslate2's `model.bin` and Hugging Face
//!   safetensors, and Whisper's tokenizer and decoding rules.
//! - `heads`: multi-token prediction heads on the decoder's last hidden state (Speech-LLaMA).
//! - `specasr`: SpecASR's adaptive drafts, draft recycling and two-pass sparse token trees.
//!
//! The README of this crate tracks what works.

pub mod audio;
mod error;
pub mod mel;
pub mod normalize;
pub mod streaming;
pub mod wer;
pub mod whisper;

pub use audio::{resample, Audio, SAMPLE_RATE};
pub use error::{Error, Result};
pub use mel::{log_mel_spectrogram, LogMel, MelFilters, WhisperInput};
pub use streaming::{Partial, StreamStats, StreamingTranscriber};
pub use whisper::{
    EncoderLength, LoadOptions, Task, TranscribeOptions, Transcriber, Transcript, Whisper,
    WhisperTokenizer,
};
