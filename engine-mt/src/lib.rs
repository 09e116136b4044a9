#![doc = include_str!("../README.md")]

pub mod bias;
pub mod display;
mod error;
pub mod live;
pub mod metrics;
pub mod ssbd;

pub use bias::{AdaptiveBias, BiasInputs};
pub use display::{DisplayPolicy, DisplayStage, UpdateView};
pub use error::{Error, Result};
pub use live::{
    display_text, replay_display, Caption, LiveConfig, LiveTranslator, Masking, StreamSummary,
    TranslationTask,
};
pub use spec_voice::{lag_k, parse_partials, read_partials, Partial};
pub use ssbd::{decode_update, Continuation, Decoding, UpdateDecode};
