#![doc = include_str!("../README.md")]
//!
//! ## Contents
//!
//! - [`KvCache`]: per-layer key/value storage with amortised appends, O(1) rollback
//!   ([`KvCache::truncate`]) and compaction of an accepted tree path ([`KvCache::keep_positions`]);
//! - [`Branches`]: several continuations of one context decoded in lockstep, one forward per
//!   step, each branch computing what it would alone, forks sharing their branch's positions;
//!   [`greedy_in_lockstep`] answers several prompts this way, with the hidden states that
//!   predicted each token (self-distilled training data);
//! - [`TokenTree`]: candidate continuations as pure data, with their attention masks, position
//!   ids and longest-accepted-path search;
//! - acceptance rules ([`AcceptanceRule`]): greedy, top-k, threshold, speculative sampling with a
//!   tolerance factor, biased verification;
//! - the [`Decoder`] trait that model engines implement, and [`mock::MockDecoder`] for tests;
//! - [`speculate()`]: the one speculation loop, where every method is a [`TreeDrafter`] and a
//!   [`Verification`] says how the target's rows are computed; plain [`generate()`] and
//!   draft-model [`speculative_generate`] with sampled acceptance; their [`DecodeStats`];
//! - [`forward_continuation`]: one forward that prefills a changed prompt and verifies a
//!   previous output after it (live re-translation, input-time speculation);
//! - [`specasr`]: SpecASR's drafting for speech recognition (adaptive length, draft recycling,
//!   two-pass sparse trees) as a [`TreeDrafter`];
//! - [`heads`]: multi-token prediction heads on a model's own hidden states ([`HiddenStates`],
//!   [`TokenHeads`]) as a drafter ([`HeadsDrafter`]);
//! - [`lookup`]: drafts copied from tokens already seen (prompt lookup over the context and
//!   reference sequences such as a rejected guess), cut to the length that pays;
//! - [`Interrupt`]: a check a model asks between its layers, to abandon a forward part-way
//!   ([`Error::Interrupted`]) with its cache as it was.

pub mod acceptance;
pub mod branches;
pub mod continuation;
pub mod cost;
pub mod decoder;
pub mod draft;
mod error;
pub mod generate;
pub mod heads;
pub mod interrupt;
pub mod jacobi;
pub mod kv_cache;
pub mod logits;
pub mod lookup;
pub mod math;
pub mod mock;
pub mod report;
pub mod sampling;
pub mod specasr;
pub mod speculate;
pub mod stats;
pub mod tree;
pub mod verify;

pub use acceptance::{Acceptance, AcceptanceRule, DraftCheck, Verdict};
pub use branches::{greedy_in_lockstep, BranchLogits, Branches, LockstepAnswer};
pub use continuation::forward_continuation;
pub use cost::{AcceptanceRate, CostAwarePolicy, ForwardCosts};
pub use decoder::{Decoder, DecoderInput, Forward, LogitRows};
pub use draft::{
    DraftInput, MergedDrafter, PreviousOutput, SparseTreeConfig, SparseTreeDrafter, TreeDraft,
    TreeDrafter,
};
pub use error::{Error, Result};
pub use generate::{
    generate, speculative_generate, DraftLength, DraftModelDrafter, DraftTokens, FinishReason,
    Generation, SpeculativeConfig, StopConditions,
};
pub use heads::{HeadsDrafter, HeadsTree, HiddenStates, TokenHeads};
pub use interrupt::Interrupt;
pub use jacobi::JacobiDrafter;
pub use kv_cache::{DecoderCache, KvCache, LayerKvCache};
pub use logits::Logits;
pub use lookup::{LookupConfig, LookupDrafter};
pub use sampling::{Sampler, SamplingConfig};
pub use specasr::{SpecAsrConfig, SpecAsrCounts, SpecAsrDrafter};
pub use speculate::{speculate, AdjustLogits, OnRow, Speculation};
pub use stats::{DecodeStats, StepRecord};
pub use tree::TokenTree;
pub use verify::{TreeRows, TreeVerdict, Verification, Verified};
