#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! - [`audio`]: WAV, FLAC, MP3, OGG/Vorbis and M4A/AAC files (symphonia), mono downmix,
//!   resampling to 16 kHz, whole or piece by piece ([`AudioFile`]);
//!   [`mel`]: Whisper's log-mel spectrogram (checked against the Python implementation) and
//!   [`WhisperInput`], a recording padded as Whisper pads it and cut into 30-second windows.
//! - [`whisper`]: the model ([`Whisper`], a `spec_core::Decoder`: KV cache with rollback and
//!   tree masks, cross-attention keys/values kept per window, batch-invariant forwards), its
//!   weights (CTranslate2 `model.bin`, Hugging Face safetensors), tokenizer, logit rules
//!   (suppression, the timestamp grammar), greedy/sampled/beam decoding with the temperature
//!   fallback and prediction heads, and [`Transcriber`], which seeks through a recording
//!   window by window.
//! - [`streaming`]: [`StreamingTranscriber`], partial transcripts of growing audio, each equal
//!   to greedy decoding from scratch, the previous partial verified as a free draft.
//! - [`vad`]: [`SileroVad`], Silero's voice activity detector (v5/v6, 16 kHz) in plain Rust:
//!   the probability of speech in each 32 ms window of a stream.
//! - [`subtitles`]: a transcript as text, SubRip, WebVTT or JSON ([`OutputFormat`]).
//! - [`normalize`] and [`wer`]: Whisper's English text normalizer and the word error rate.
//! - `testing` (hidden): the tiny random-weight Whisper of the tests and of the example above.

pub mod audio;
mod error;
pub mod mel;
pub mod normalize;
pub mod streaming;
pub mod subtitles;
#[doc(hidden)]
pub mod testing;
pub mod vad;
pub mod wer;
pub mod whisper;

pub use audio::{resample, Audio, AudioDecoder, AudioFile, SampleSource, Samples, SAMPLE_RATE};
pub use error::{Error, Result};
pub use mel::{log_mel_spectrogram, LogMel, MelFilters, WhisperInput};
pub use streaming::{StreamStats, StreamUpdate, StreamingTranscriber};
pub use subtitles::OutputFormat;
pub use vad::SileroVad;
pub use whisper::{
    EncoderLength, LoadOptions, Task, TranscribeOptions, Transcriber, Transcript, TranscriptStats,
    Whisper, WhisperTokenizer,
};
