//! Errors of the translation engine.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Llm(#[from] engine_llm::Error),

    #[error(transparent)]
    Core(#[from] spec_core::Error),

    /// Partial transcripts (`spec-voice`): a malformed file, an empty text.
    #[error(transparent)]
    Voice(#[from] spec_voice::Error),

    #[error("invalid configuration: {0}")]
    Config(String),

    #[error("invalid input: {0}")]
    Input(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
