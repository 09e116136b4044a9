//! Errors of the LLM engine.

use std::path::PathBuf;

/// Everything loading or running a model can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// A decoding loop failed (an engine error raised inside a loop is returned as itself,
    /// not wrapped here).
    #[error(transparent)]
    Core(spec_core::Error),

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

    /// A chat template that cannot be compiled or rendered, or that alters message contents
    /// in a way prompts cannot be built from.
    #[error("chat template `{template}`: {reason}")]
    Template { template: String, reason: String },

    /// A prompt longer than the model's context.
    #[error("the prompt has {tokens} tokens but the model's context holds {max}")]
    PromptTooLong { tokens: usize, max: usize },

    /// Input that cannot be used: empty text, a bad rate, a malformed partial-transcript file.
    #[error("invalid input: {0}")]
    Input(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<spec_core::Error> for Error {
    /// Unwraps an engine error that travelled through a `spec-core` loop as
    /// [`spec_core::Error::Model`], so callers can match it directly.
    fn from(e: spec_core::Error) -> Self {
        e.into_model_error().unwrap_or_else(Error::Core)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_come_back_out_of_core_errors() {
        let through_core = spec_core::Error::from(Error::Input("bad".into()));
        assert!(matches!(Error::from(through_core), Error::Input(m) if m == "bad"));
        let foreign = spec_core::Error::Model("other".into());
        assert!(matches!(
            Error::from(foreign),
            Error::Core(spec_core::Error::Model(_))
        ));
        let core = spec_core::Error::EmptyInput("x");
        assert!(matches!(
            Error::from(core),
            Error::Core(spec_core::Error::EmptyInput(_))
        ));
    }
}
