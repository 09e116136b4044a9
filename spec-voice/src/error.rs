//! Errors of the voice types.

use std::path::PathBuf;

/// What reading partial transcripts or synthesizing speech can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Input that cannot be used: empty text, a bad speaking rate, a malformed line of a
    /// partial-transcript file (the message names the line).
    #[error("invalid input: {0}")]
    Input(String),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A speech synthesizer's own failure (its engine's error inside).
    #[error("speech synthesis failed: {0}")]
    Synthesis(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
