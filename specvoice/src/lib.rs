#![doc = include_str!("../README.md")]

pub mod caption;
pub mod chat;
pub mod clock;
pub mod endpoint;
mod error;
pub mod listener;

pub use caption::{CaptionEvent, CaptionEventKind, LiveCaptions};
pub use chat::{ChatEvent, ChatEventKind, ChatMode, LatencyBreakdown, VoiceChat, VoiceTurn};
pub use clock::{play_recording, ClockKind, Pipeline, PipelineClock, PACKET};
pub use endpoint::{Boundary, EndpointConfig, EndpointDetector, SAMPLE_RATE};
pub use error::{Error, Result};
pub use listener::{utterances_of, Heard, Listener, ListenerConfig};
