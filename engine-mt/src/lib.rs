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
//! - [`LiveTranslator`]: the streaming API over a `LanguageModel`: feed [`Partial`] transcripts, get
//!   each update's output, what to display (display-only mask-k) and its counters. By default
//!   the final update of a sentence is verified without bias ([`LiveConfig::unbiased_final`]),
//!   so the committed caption is exactly autoregressive re-translation's.
//! - Source partials are `spec-voice`'s [`Partial`]s (re-exported with [`lag_k`] and the
//!   partial-transcript file format, [`read_partials`]); [`metrics`]: normalized erasure and
//!   chrF.
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

pub use error::{Error, Result};
pub use live::{Caption, LiveConfig, LiveTranslator, Masking, StreamSummary, TranslationTask};
pub use spec_voice::{lag_k, parse_partials, read_partials, Partial};
pub use ssbd::{decode_update, Decoding, UpdateDecode};
