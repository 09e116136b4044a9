#![doc = include_str!("../README.md")]

mod error;
pub mod live;
pub mod metrics;
pub mod ssbd;

pub use error::{Error, Result};
pub use live::{Caption, LiveConfig, LiveTranslator, Masking, StreamSummary, TranslationTask};
pub use spec_voice::{lag_k, parse_partials, read_partials, Partial};
pub use ssbd::{decode_update, Decoding, UpdateDecode};
