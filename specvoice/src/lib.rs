#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! - [`endpoint`]: the end-of-speech detector; [`listener`]: the detector and streaming
//!   Whisper on one stream, partial and final transcripts.
//! - [`chat`]: [`VoiceChat`], Whisper → PredGen (or the cascade) → speech, with each turn's
//!   latency breakdown; [`caption`]: [`LiveCaptions`], Whisper → live re-translation.
//! - [`clock`]: the simulated and wall clocks, the [`Pipeline`] step API and
//!   [`play_recording`].

pub mod caption;
pub mod chat;
pub mod clock;
pub mod endpoint;
mod error;
pub mod listener;
pub mod serve;

pub use caption::{CaptionEvent, CaptionEventKind, LiveCaptions};
pub use chat::{ChatEvent, ChatEventKind, ChatMode, LatencyBreakdown, VoiceChat, VoiceTurn};
pub use clock::{play_recording, ClockKind, Pipeline, PipelineClock, PACKET};
pub use endpoint::{Boundary, EndpointConfig, EndpointDetector, SAMPLE_RATE};
pub use error::{Error, Result};
pub use listener::{utterances_of, Heard, Listener, ListenerConfig};

/// The workspace README's Rust examples, compiled (and those that need no download run) as
/// doc-tests of this crate, which depends on every engine they use.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct WorkspaceReadme;
