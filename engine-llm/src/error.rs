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

    /// A weight file that is not a readable GGUF or safetensors file (truncated, corrupt).
    #[error("cannot read weights from {path}: {reason}")]
    BadWeights { path: PathBuf, reason: String },

    /// A tensor the architecture needs is absent from the weights.
    #[error("{path}: missing tensor `{name}`")]
    MissingTensor { path: PathBuf, name: String },

    /// A tensor whose shape does not match the configuration.
    #[error("tensor `{name}` has shape {got:?}, the configuration implies {expected:?}")]
    ShapeMismatch {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },

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

/// The building blocks' errors under the same names here, so that callers match one enum.
impl From<spec_nn::Error> for Error {
    fn from(e: spec_nn::Error) -> Self {
        match e {
            spec_nn::Error::Candle(e) => Self::Candle(e),
            spec_nn::Error::Core(e) => Self::Core(e),
            spec_nn::Error::Io { path, source } => Self::Io { path, source },
            spec_nn::Error::BadWeights { path, reason } => Self::BadWeights { path, reason },
            spec_nn::Error::MissingTensor { path, name } => Self::MissingTensor { path, name },
            spec_nn::Error::ShapeMismatch {
                name,
                got,
                expected,
            } => Self::ShapeMismatch {
                name,
                got,
                expected,
            },
            spec_nn::Error::Config(m) => Self::Config(m),
        }
    }
}

impl From<Error> for spec_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(c) => spec_core::Error::Candle(c),
            Error::Core(c) => c,
            other => spec_core::Error::Model(Box::new(other)),
        }
    }
}
