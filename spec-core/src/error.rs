//! Errors returned by `spec-core` and by the [`Decoder`](crate::Decoder)s built on it.

/// Everything that can go wrong in the core algorithms.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// More positions were requested than the cache or the model's context allows.
    #[error("context overflow: {requested} positions needed but the maximum is {max}")]
    ContextOverflow { requested: usize, max: usize },

    /// `truncate` was asked to keep more positions than are cached.
    #[error("cannot truncate to {requested} positions: only {len} are cached")]
    TruncateBeyondLength { requested: usize, len: usize },

    /// `keep_positions` got a list that is empty, unsorted or out of range.
    #[error("invalid positions for keep_positions: {0}")]
    InvalidPositions(String),

    /// Keys or values whose shape does not fit the cache.
    #[error("KV shape mismatch: {0}")]
    KvShape(String),

    /// A token tree that cannot be built or used as asked.
    #[error("invalid token tree: {0}")]
    InvalidTree(String),

    /// Draft and target do not share a vocabulary.
    #[error("vocabulary mismatch: the draft has {draft} tokens, the target {target}")]
    VocabMismatch { draft: usize, target: usize },

    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { token: u32, vocab: usize },

    /// A configuration value out of its valid range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// An input that must not be empty was empty.
    #[error("empty input: {0}")]
    EmptyInput(&'static str),

    /// Inputs of a forward that do not fit together (position ids, mask, token count).
    #[error("invalid forward input: {0}")]
    InputShape(String),

    /// Logits of an unexpected shape.
    #[error("logits have shape {got:?}, expected {expected}")]
    LogitsShape { got: Vec<usize>, expected: String },

    /// A request that this decoder or rule does not support.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),

    /// A forward was abandoned part-way because its [`Interrupt`](crate::Interrupt) said stop;
    /// the model's cache is as it was before the forward.
    #[error("interrupted: the forward was abandoned part-way")]
    Interrupted,

    /// An error from a model implementation (weights, tokenizer, ...).
    #[error("model error: {0}")]
    Model(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// The engine error of type `E` that travelled through a loop as [`Error::Model`], so the
    /// engine's callers can match it directly; any other error as it is.
    pub fn into_model_error<E>(self) -> std::result::Result<E, Error>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        match self {
            Error::Model(inner) => inner.downcast::<E>().map(|e| *e).map_err(Error::Model),
            other => Err(other),
        }
    }
}

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
