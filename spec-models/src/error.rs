//! Errors of the model store.

use std::path::PathBuf;

/// What can go wrong finding, checking or downloading a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("model registry: {0}")]
    Registry(String),

    #[error("neither SPECVOICE_MODELS nor HOME is set: cannot find the models folder")]
    NoModelsFolder,

    /// A name that is neither a path, nor a folder in the models folder, nor a registry entry.
    #[error(
        "unknown model `{name}`: not a path, not a folder in {searched}, and not in the \
         model registry (`spec_models::Registry::models` lists the known names)"
    )]
    UnknownModel { name: String, searched: PathBuf },

    /// A known model whose files are not (all) in the models folder.
    #[error(
        "model `{name}` is not in {dir}: {problems}.\nDownload it from the Hugging Face Hub \
         with `spec_models::download::Downloader` (feature `download`), or: {how_to_get}"
    )]
    NotPresent {
        name: String,
        dir: PathBuf,
        problems: String,
        how_to_get: String,
    },

    #[error("{path} has {actual} bytes, expected {expected}: truncated or a different file")]
    WrongSize {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    #[error("{path} has SHA-256 {actual}, expected {expected}: corrupt or a different file")]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },

    /// An evaluation data file that cannot be parsed.
    #[error("{path}: {reason}")]
    Data { path: PathBuf, reason: String },

    /// The Hub (or the configured endpoint) could not be reached or refused the file.
    #[error("cannot download `{name}` from {url}: {reason}.\n{how_to_get}")]
    Download {
        name: String,
        url: String,
        reason: String,
        how_to_get: String,
    },

    /// A known model whose files the downloader cannot fetch (they come in an archive), not
    /// in the models folder.
    #[error("`{name}` cannot be downloaded by SpecVoice. {how_to_get}")]
    ManualOnly { name: String, how_to_get: String },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_error(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}
