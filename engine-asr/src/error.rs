//! Errors of the ASR engine.

use std::path::PathBuf;

/// Everything reading audio or recognising speech can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A file that is not a WAV file this engine can read (corrupt, truncated, an unsupported
    /// encoding).
    #[error("{path}: not a readable WAV file: {reason}")]
    BadAudio { path: PathBuf, reason: String },

    /// Audio that cannot be used: no samples, a zero sample rate, too short for one frame.
    #[error("invalid audio: {0}")]
    Audio(String),

    /// The resampler refused the rates or the data.
    #[error("resampling from {from} Hz to {to} Hz: {reason}")]
    Resample { from: u32, to: u32, reason: String },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
