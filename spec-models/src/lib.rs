#![doc = include_str!("../README.md")]
//!
//! ## Contents
//!
//! - [`Registry`]: the models SpecVoice knows by name (`models.toml`): Hub repository, revision,
//!   files with their pinned sizes and SHA-256, kind and weight format.
//! - [`Store`]: the models folder (`$SPECVOICE_MODELS`, default `~/.cache/specvoice/models`,
//!   one sub-folder per model) and the resolver every engine and example uses: a name or a path
//!   → [`ModelFiles`]. Names resolve in the models folder, without any network, so models placed
//!   there by hand are found as they are.
//! - [`mt_bench`]: the MT-Bench questions kept in the models folder's `data/`; [`speech`]: the
//!   speech clips there with their reference transcripts.
//! - `download` (feature `download`): resumable, verified downloads from the Hugging Face Hub
//!   (`download::Downloader`).
//!
//! ```no_run
//! let store = spec_models::Store::from_env()?;
//! let model = store.resolve("qwen2.5-coder-0.5b-instruct")?;
//! let gguf = model.file("model.gguf").expect("a GGUF model");
//! # Ok::<(), spec_models::Error>(())
//! ```

#[cfg(feature = "download")]
pub mod download;
mod error;
pub mod mt_bench;
mod registry;
pub mod speech;
mod store;

pub use error::{Error, Result};
pub use registry::{FileEntry, ModelEntry, ModelKind, Registry, WeightFormat};
pub use store::{
    models_dir, partial_path, sha256_file, Check, FileState, ModelFiles, Store, PARTIAL_SUFFIX,
    VERIFIED_RECORD,
};
