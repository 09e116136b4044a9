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

    /// An audio file this engine cannot read: corrupt, truncated, empty, without an audio
    /// track, or with impossible parameters (no channels, no sample rate).
    #[error("{path}: not a readable audio file: {reason}")]
    BadAudio { path: PathBuf, reason: String },

    /// An audio file in a container or codec this engine has no decoder for (Opus, WMA, a
    /// video file…): the readable ones are WAV, FLAC, MP3, OGG/Vorbis and M4A/AAC.
    #[error("{path}: unsupported audio: {reason} (readable: WAV, FLAC, MP3, OGG/Vorbis, M4A/AAC)")]
    UnsupportedAudio { path: PathBuf, reason: String },

    /// Audio longer than a caller's limit (found while decoding, before all of it is held).
    #[error("{path}: the audio lasts more than {limit_seconds} s, the most accepted")]
    AudioTooLong { path: PathBuf, limit_seconds: f64 },

    /// Audio that cannot be used: no samples, a zero sample rate, too short for one frame.
    #[error("invalid audio: {0}")]
    Audio(String),

    /// A sample that is NaN or infinite: no spectrogram or resampling can use it.
    #[error("invalid audio: sample {index} is {value}, not a finite number")]
    NonFiniteSample { index: usize, value: f32 },

    /// A sample far outside [-1, 1] (beyond [`crate::audio::MAX_SAMPLE_MAGNITUDE`]): a corrupt
    /// file, whose values would overflow the resampler's FFTs.
    #[error("invalid audio: sample {index} is {value}, where samples lie in [-1, 1]")]
    SampleTooLarge { index: usize, value: f32 },

    #[error(transparent)]
    Nn(#[from] spec_nn::Error),

    #[error(transparent)]
    Core(#[from] spec_core::Error),

    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// A model folder or configuration that does not describe a Whisper model this engine can
    /// run (a missing file, an unknown layout, inconsistent sizes), or decoding options it
    /// cannot follow (a temperature that is not a finite number ≥ 0, say).
    #[error("invalid Whisper model or options: {0}")]
    Config(String),

    /// The tokenizer file cannot be read or lacks Whisper's special tokens.
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },

    /// A tokenizer of another Whisper model than the one it is paired with: its vocabulary
    /// does not end where the model's does, or it numbers a special token the model's
    /// configuration names differently.
    #[error(
        "tokenizer {path} does not belong to this model: {reason}; use the tokenizer.json that \
         came with the model (English-only and multilingual Whisper number their special tokens \
         differently, and large-v3 adds a language)"
    )]
    TokenizerMismatch { path: PathBuf, reason: String },

    /// A decoder forward before any audio was encoded.
    #[error("the decoder needs an encoded audio window first (call `Whisper::encode`)")]
    NotEncoded,

    /// A language Whisper does not know, or a language or translation asked of an
    /// English-only model (the message says which).
    #[error("{0}")]
    Language(String),

    /// A voice-activity window of the wrong length (Silero VAD reads exactly
    /// [`crate::vad::WINDOW`] samples at a time).
    #[error("a voice-activity window is {expected} samples, not {got}")]
    VadWindow { expected: usize, got: usize },

    /// The resampler refused the rates or the data.
    #[error("resampling from {from} Hz to {to} Hz: {reason}")]
    Resample { from: u32, to: u32, reason: String },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for spec_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(c) => spec_core::Error::Candle(c),
            Error::Core(c) => c,
            other => spec_core::Error::Model(Box::new(other)),
        }
    }
}
