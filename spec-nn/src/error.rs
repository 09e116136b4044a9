//! Errors of the building blocks and of weight loading.

use std::path::PathBuf;

/// Everything building or running a block, or reading weights, can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    #[error(transparent)]
    Core(#[from] spec_core::Error),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A weight file that cannot be read as its format (truncated, corrupt, foreign).
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

    /// A configuration value, or a block's input, that is missing, malformed or inconsistent.
    #[error("invalid model configuration: {0}")]
    Config(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
