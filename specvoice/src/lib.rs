#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! - [`endpoint`]: the end-of-speech detector; [`listener`]: the detector and streaming
//!   Whisper on one stream, partial and final transcripts; [`turn_end`]: when the user's turn
//!   is over (a fixed silence, or the chat model's semantic end of turn).
//! - [`chat`]: [`VoiceChat`], Whisper → PredGen (or the cascade) → speech, with each turn's
//!   latency breakdown; [`caption`]: [`LiveCaptions`], Whisper → live re-translation.
//! - [`drive`](mod@drive): the [`Pipeline`] step API and the one loop that drives a pipeline from an
//!   [`AudioSource`] (a [`Recording`], a connection) on the session's [`Clock`].

pub mod caption;
pub mod chat;
pub mod drive;
pub mod endpoint;
mod error;
pub mod listener;
#[cfg(feature = "server")]
pub mod serve;
pub mod turn_end;

pub use caption::{CaptionEvent, CaptionEventKind, LiveCaptions};
pub use chat::{ChatEvent, ChatEventKind, ChatMode, LatencyBreakdown, VoiceChat, VoiceTurn};
pub use drive::{drive, play_recording, Arrival, AudioSource, Ended, Pipeline, Recording, PACKET};
pub use endpoint::{Boundary, EndpointConfig, EndpointDetector, SileroSettings, Vad, SAMPLE_RATE};
pub use error::{Error, Result};
pub use listener::{utterances_of, Heard, Listener, ListenerConfig, Pause};
pub use spec_voice::{Clock, ClockKind};
pub use turn_end::{SemanticTurnEnd, TurnEnd};

/// The workspace README's Rust examples, compiled (and those that need no download run) as
/// doc-tests of this crate, which depends on every engine they use.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct WorkspaceReadme;
