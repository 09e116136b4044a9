//! Errors of the voice pipeline: its own settings and input, and what the engines report.

use std::path::PathBuf;

/// Everything the pipeline can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting that cannot work (a zero-length frame, a silence shorter than a frame).
    #[error("invalid setting: {0}")]
    Config(String),

    /// Input the pipeline cannot use (a wrong sample rate, an empty recording, a call out of
    /// order).
    #[error("invalid input: {0}")]
    Input(String),

    /// Speech recognition failed (the model files, the audio).
    #[error(transparent)]
    Asr(#[from] engine_asr::Error),

    /// The language model failed (PredGen, the chat model).
    #[error(transparent)]
    Llm(#[from] engine_llm::Error),

    /// Live translation failed.
    #[error(transparent)]
    Mt(#[from] engine_mt::Error),

    /// Speech synthesis or the shared speech types failed.
    #[error(transparent)]
    Voice(#[from] spec_voice::Error),

    /// The server could not listen on its address.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },

    /// The server stopped with an error (accepting connections, a task that died).
    #[error("the server failed: {0}")]
    Serve(String),

    /// An audio file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    WriteAudio {
        path: PathBuf,
        #[source]
        source: hound::Error,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
