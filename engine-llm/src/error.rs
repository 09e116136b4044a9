//! Errors of the LLM engine.

use std::path::PathBuf;

/// Everything loading or running a model can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    #[error(transparent)]
    Core(#[from] spec_core::Error),

    #[error(transparent)]
    Store(#[from] spec_models::Error),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The model's building blocks or their weights (`spec-nn`): an unreadable, truncated or
    /// foreign weight file, a missing tensor, a tensor whose shape does not match the
    /// configuration.
    #[error(transparent)]
    Nn(#[from] spec_nn::Error),

    /// Partial transcripts or speech synthesis (`spec-voice`).
    #[error(transparent)]
    Voice(#[from] spec_voice::Error),

    /// A configuration value that is missing, malformed or inconsistent.
    #[error("invalid model configuration: {0}")]
    Config(String),

    /// An architecture this engine does not implement.
    #[error("unsupported architecture `{0}` (supported: qwen2, llama)")]
    UnsupportedArchitecture(String),

    /// Tokenizer construction or use failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// Draft and target cannot be paired.
    #[error("draft and target do not share a vocabulary: {0}")]
    VocabularyMismatch(String),

    /// Input that cannot be used: empty text, a bad rate, a malformed partial-transcript file.
    #[error("invalid input: {0}")]
    Input(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for spec_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(c) => spec_core::Error::Candle(c),
            Error::Core(c) => c,
            other => spec_core::Error::Model(Box::new(other)),
        }
    }
}
