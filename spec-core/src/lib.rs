//! # spec-core
//!
//! The speculative-decoding algorithms of SpecVoice, independent of any model:
//!
//! - [`KvCache`]: per-layer key/value storage with amortised appends, O(1) rollback
//!   ([`KvCache::truncate`]) and compaction of an accepted tree path ([`KvCache::keep_positions`]);
//! - [`TokenTree`]: candidate continuations as pure data, with their attention masks, position
//!   ids and longest-accepted-path search;
//! - acceptance rules ([`AcceptanceRule`]): greedy, top-k, threshold, speculative sampling with a
//!   tolerance factor, biased verification;
//! - the [`Decoder`] trait that model engines implement, and [`mock::MockDecoder`] for tests;
//! - generic loops ([`generate`], [`speculative_generate`], [`tree_speculative_generate`],
//!   [`jacobi_generate`]) and their [`DecodeStats`];
//! - [`verify_continuation`]: one forward that prefills a changed prompt and verifies a previous
//!   output after it (live re-translation, input-time speculation);
//! - [`heads`]: multi-token prediction heads on a model's own hidden states ([`HiddenStates`],
//!   [`TokenHeads`]) as a drafter ([`HeadsDrafter`], [`heads_generate`]).
//!
//! The loops keep the target's output: with greedy acceptance, speculative decoding returns
//! exactly the tokens of greedy autoregressive decoding.
//!
//! ```
//! use rand::{rngs::StdRng, SeedableRng};
//! use spec_core::mock::{MockConfig, MockDecoder};
//! use spec_core::{generate, speculative_generate, DraftLength, SamplingConfig, SpeculativeConfig, StopConditions};
//!
//! # fn main() -> spec_core::Result<()> {
//! let target_config = MockConfig::target(64, 7);
//! let mut target = MockDecoder::new(target_config.clone());
//! let mut draft = MockDecoder::new(target_config.draft(1.0, 8));
//! let stop = StopConditions::new(32);
//! let mut rng = StdRng::seed_from_u64(0);
//!
//! let config = SpeculativeConfig { draft_length: DraftLength::Fixed(4), ..Default::default() };
//! let fast = speculative_generate(&mut target, &mut draft, &[1, 2, 3], &config, &stop, &mut rng, &mut |_| {})?;
//! println!("{}", fast.stats);
//!
//! let mut plain = MockDecoder::new(target_config);
//! let slow = generate(&mut plain, &[1, 2, 3], &SamplingConfig::greedy(), &stop, &mut rng, &mut |_| {})?;
//! assert_eq!(fast.tokens, slow.tokens);
//! assert!(fast.stats.target_forwards < slow.stats.target_forwards);
//! # Ok(())
//! # }
//! ```

pub mod acceptance;
pub mod continuation;
pub mod cost;
pub mod decoder;
pub mod draft;
mod error;
pub mod generate;
pub mod heads;
pub mod jacobi;
pub mod kv_cache;
pub mod logits;
pub mod mock;
pub mod report;
pub mod sampling;
pub mod stats;
pub mod tree;

pub use acceptance::{Acceptance, AcceptanceRule, DraftCheck, Verdict};
pub use continuation::{forward_continuation, verify_continuation};
pub use cost::{CostAwarePolicy, ForwardCosts};
pub use decoder::{Decoder, DecoderInput, Forward, LogitRows};
pub use draft::{SparseTreeConfig, SparseTreeDrafter, TreeDraft, TreeDrafter};
pub use error::{Error, Result};
pub use generate::{
    generate, speculative_generate, tree_speculative_generate, verify_tree, verify_tree_adjusted,
    DraftLength, FinishReason, Generation, SpeculativeConfig, StopConditions, TreeVerdict,
};
pub use heads::{
    heads_generate, verify_tree_hidden, HeadsDrafter, HeadsTree, HiddenStates, OutputRows,
    TokenHeads,
};
pub use jacobi::jacobi_generate;
pub use kv_cache::{KvCache, LayerKvCache};
pub use logits::Logits;
pub use sampling::SamplingConfig;
pub use stats::{DecodeStats, StepRecord};
pub use tree::TokenTree;
