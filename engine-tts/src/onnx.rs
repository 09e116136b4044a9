//! ONNX Runtime for the neural voices (Kokoro, Piper), through the `ort` crate with the library
//! loaded at run time: from `ORT_DYLIB_PATH` when it is set, otherwise from the models folder's
//! `onnxruntime/`. Nothing is downloaded when building. Also the voices' error type.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::environment::Environment;
use ort::session::{Session, SessionOutputs};

use crate::espeak::EspeakError;

/// The environment variable naming the ONNX Runtime library to load.
pub const LIBRARY_VARIABLE: &str = "ORT_DYLIB_PATH";

/// The library's file name in the models folder's `onnxruntime/`.
pub const LIBRARY_FILE: &str = "libonnxruntime.so";

/// What can go wrong with a neural voice: ONNX Runtime, its model files, its phonemes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VoiceError {
    /// The runtime library is not where it was looked for.
    #[error(
        "ONNX Runtime not found at {}: put its library (1.31) in the models folder's \
         onnxruntime/, or set {LIBRARY_VARIABLE} to the library's path",
        path.display()
    )]
    LibraryMissing { path: PathBuf },

    /// The library could not be loaded (a wrong version, another platform's file).
    #[error("loading ONNX Runtime from {}: {reason}", path.display())]
    Library { path: PathBuf, reason: String },

    /// A model file is missing or ONNX Runtime refused it.
    #[error("{}: {reason}", path.display())]
    Model { path: PathBuf, reason: String },

    /// A run of a model failed, or gave outputs of an unexpected shape.
    #[error("running {model}: {reason}")]
    Run { model: String, reason: String },

    /// A file of the voice's folder is missing or malformed.
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },

    /// A voice that is not in the model folder.
    #[error("no voice `{name}` (the voices: {available})")]
    UnknownVoice { name: String, available: String },

    /// espeak-ng, which gives the phonemes.
    #[error(transparent)]
    Phonemes(#[from] EspeakError),

    /// Text or settings the voice cannot speak with.
    #[error("invalid input: {0}")]
    Input(String),
}

/// `Result` with [`VoiceError`].
pub type Result<T, E = VoiceError> = std::result::Result<T, E>;

impl From<VoiceError> for spec_voice::Error {
    fn from(error: VoiceError) -> Self {
        match error {
            VoiceError::Input(reason) => spec_voice::Error::Input(reason),
            other => spec_voice::Error::Synthesis(Box::new(other)),
        }
    }
}

/// Fails unless `speed` (a voice's pace, 1 its own) is in 0.5..=2.
pub(crate) fn check_speed(speed: f32) -> Result<()> {
    if !(0.5..=2.0).contains(&speed) {
        return Err(VoiceError::Input(format!(
            "speed {speed} is outside 0.5..=2"
        )));
    }
    Ok(())
}

/// The library to load: `ORT_DYLIB_PATH` when set, else `onnxruntime/libonnxruntime.so` in
/// `models` (the models folder).
pub fn library_path(models: &Path) -> PathBuf {
    match std::env::var_os(LIBRARY_VARIABLE) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => models.join("onnxruntime").join(LIBRARY_FILE),
    }
}

/// The process's ONNX Runtime environment, the library at `library` loaded on first use (a
/// process loads one library: once one is loaded, or has failed to load, later calls get that
/// environment or that failure).
pub fn environment(library: &Path) -> Result<&'static Environment> {
    static ENVIRONMENT: OnceLock<std::result::Result<Environment, String>> = OnceLock::new();
    if ENVIRONMENT.get().is_none() && !library.is_file() {
        return Err(VoiceError::LibraryMissing {
            path: library.to_path_buf(),
        });
    }
    ENVIRONMENT
        .get_or_init(|| {
            ort::init_from(library)
                .map_err(|e| e.to_string())?
                .with_name("specvoice")
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|reason| VoiceError::Library {
            path: library.to_path_buf(),
            reason: reason.clone(),
        })
}

/// A failed run of `model` as a [`VoiceError::Run`].
pub(crate) fn run_failed(model: &'static str) -> impl Fn(ort::Error) -> VoiceError + Copy {
    move |e| VoiceError::Run {
        model: model.into(),
        reason: e.to_string(),
    }
}

/// The f32 output `name` of a run of `model`; an error, not a panic, when a model file has no
/// such output.
pub(crate) fn f32_output(
    outputs: &SessionOutputs<'_>,
    model: &'static str,
    name: &str,
) -> Result<Vec<f32>> {
    let value = outputs.get(name).ok_or_else(|| VoiceError::Run {
        model: model.into(),
        reason: format!("the model has no output `{name}`"),
    })?;
    let (_, values) = value
        .try_extract_tensor::<f32>()
        .map_err(run_failed(model))?;
    Ok(values.to_vec())
}

/// A session of the model at `path` on `threads` threads. Its threads do not spin waiting
/// for work between runs: the voice shares the cores with the recognizer and the language
/// model, and spinning threads take their time (measured: a busy 2-core machine synthesized
/// 25–35 % slower with spinning).
pub fn session(environment: &Environment, path: &Path, threads: usize) -> Result<Session> {
    let failed = |reason: String| VoiceError::Model {
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_file() {
        return Err(failed("no such file".into()));
    }
    Session::builder(environment)
        .map_err(|e| failed(e.to_string()))?
        .with_intra_threads(threads.max(1))
        .map_err(|e| failed(e.to_string()))?
        .with_intra_op_spinning(false)
        .map_err(|e| failed(e.to_string()))?
        .commit_from_file(path)
        .map_err(|e| failed(e.to_string()))
}
