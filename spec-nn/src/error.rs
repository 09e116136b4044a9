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

    /// A GGUF file whose `general.alignment` cannot lay out its tensor data (0, or another
    /// number that is not a power of two, or a value candle's reader would ignore).
    #[error(
        "{path}: GGUF metadata `general.alignment` is {found}, where a power of two stored as \
         an integer of at most 32 bits (a uint32 by the GGUF specification) is needed: the file \
         is corrupt or was written wrongly; re-export or re-download it"
    )]
    GgufAlignment { path: PathBuf, found: String },

    /// Logits asked of more positions than a forward has.
    #[error("logits of the last {rows} positions asked of a forward of {positions}")]
    RowsBeyondPositions { rows: usize, positions: usize },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
