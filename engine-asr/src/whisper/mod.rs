//! Whisper on the shared blocks: the model ([`Whisper`], a `spec_core::Decoder`), its weights
//! ([`load`]: CTranslate2 or Hugging Face), tokenizer, logit rules, window decoding (greedy,
//! sampling, beam search) and the transcription loop ([`Transcriber`]).

pub mod alignment;
pub mod config;
pub mod decode;
pub mod load;
pub mod model;
pub mod rules;
pub mod tokenizer;
pub mod transcribe;

pub use alignment::Word;
pub use config::WhisperConfig;
pub use decode::{compression_ratio, Candidate};
pub use load::{hugging_face_tensors, model_fingerprint, LoadOptions, ModelFiles};
pub use model::Whisper;
pub use rules::LogitRules;
pub use tokenizer::WhisperTokenizer;
pub use transcribe::{
    EncoderLength, Segment, Task, TranscribeOptions, Transcriber, Transcript, TranscriptStats,
};
