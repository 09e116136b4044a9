//! Live re-translation with **Self-Speculative Biased Decoding** (Zeng et al., "Self-Speculative
//! Biased Decoding for Faster Live Translation").
//!
//! Live captions translate a source that keeps growing (speech-recognition partials).
//! Re-translating every update from scratch is slow and makes the caption flicker. SSBD drafts
//! each update with the previous translation: one forward of the chat LLM (loaded through
//! `engine-llm`) verifies it, decoding continues greedily from the first divergence, and the
//! verification is biased toward the draft (β), so needless rephrasing drops.
//!
//! - [`ssbd::decode_update`]: the algorithm on any `spec_core::Decoder` (β = 0 is exactly
//!   greedy re-translation), optionally with a draft model after the divergence point.
//! - [`LiveTranslator`]: the streaming API over a `LanguageModel`: feed [`SourceUpdate`]s, get
//!   each update's output, what to display (display-only mask-k) and its counters. By default
//!   the final update of a sentence is verified without bias ([`LiveConfig::unbiased_final`]),
//!   so the committed caption is exactly autoregressive re-translation's.
//! - [`stream`]: lag-k reveals and replays of partial transcripts; [`metrics`]: normalized
//!   erasure and chrF.
//!
//! ```no_run
//! use engine_llm::{LanguageModel, LoadOptions};
//! use engine_mt::{lag_k, LiveConfig, LiveTranslator};
//!
//! let mut model = LanguageModel::open("qwen2.5-coder-1.5b-instruct", &LoadOptions::default())?;
//! let mut live = LiveTranslator::new(&mut model, LiveConfig::new("German"))?;
//! for update in lag_k("The weather is lovely today, so we are going for a walk.", 3)? {
//!     let caption = live.update(&update)?;
//!     println!("{}", caption.display);
//! }
//! # Ok::<(), engine_mt::Error>(())
//! ```

mod error;
pub mod live;
pub mod metrics;
pub mod ssbd;
pub mod stream;

pub use error::{Error, Result};
pub use live::{Caption, LiveConfig, LiveTranslator, Masking, StreamSummary, TranslationTask};
pub use ssbd::{decode_update, Decoding, UpdateDecode};
pub use stream::{lag_k, parse_partials, read_partials, SourceUpdate};
