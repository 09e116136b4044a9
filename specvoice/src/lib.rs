#![doc = include_str!("../README.md")]

pub mod chat;
pub mod endpoint;
mod error;
pub mod listener;

pub use chat::{
    play_recording, ChatEvent, ChatEventKind, ChatMode, ClockKind, LatencyBreakdown, VoiceChat,
    VoiceTurn,
};
pub use endpoint::{Boundary, EndpointConfig, EndpointDetector, SAMPLE_RATE};
pub use error::{Error, Result};
pub use listener::{Heard, Listener, ListenerConfig};
