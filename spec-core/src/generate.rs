//! Generic decoding loops over [`Decoder`]s: autoregressive generation, draft-model speculative
//! decoding (fixed or adaptive draft length) and token-tree speculation.
//!
//! Every loop takes the full `context` (prompt and history). Whatever the model's cache shares
//! with it, as its longest common token prefix, is kept and only the rest is forwarded, which
//! reuses the cache across turns or partial prompts. On return the target's cache holds
//! `context` followed by every generated token except the last, which has not been forwarded yet.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use rand::RngCore;

use crate::acceptance::{Acceptance, AcceptanceRule};
use crate::cost::CostAwarePolicy;
use crate::decoder::{common_prefix_len, forward_tokens, rewind_to_prefix, Decoder, LogitRows};
use crate::draft::{draft_chain, DraftInput, TreeDraft, TreeDrafter};
use crate::heads::HiddenStates;
use crate::sampling::{argmax, max_probability, sample, Sampler, SamplingConfig};
use crate::speculate::{speculate, AdjustLogits, Speculation};
use crate::stats::DecodeStats;
use crate::tree::TokenTree;
use crate::verify::Verified;
use crate::{Error, Result};

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was produced (it is the last output token).
    Eos,
    /// `max_new_tokens` were produced.
    MaxTokens,
    /// The stop predicate fired.
    Stop,
    /// The model's context is full.
    ContextFull,
}

/// A predicate over the generated tokens that ends generation when it returns true (e.g. end
/// of sentence).
pub type StopPredicate = Arc<dyn Fn(&[u32]) -> bool + Send + Sync>;

/// When to stop generating.
#[derive(Clone)]
pub struct StopConditions {
    /// Tokens that end generation (kept in the output).
    pub eos: Vec<u32>,
    /// Most tokens to produce.
    pub max_new_tokens: usize,
    /// Checked after every produced token with all tokens produced so far.
    pub predicate: Option<StopPredicate>,
}

impl StopConditions {
    /// Stop after `max_new_tokens` only.
    pub fn new(max_new_tokens: usize) -> Self {
        Self {
            eos: Vec::new(),
            max_new_tokens,
            predicate: None,
        }
    }

    /// Also stop at any of `eos`.
    pub fn with_eos(mut self, eos: impl IntoIterator<Item = u32>) -> Self {
        self.eos.extend(eos);
        self
    }

    /// Also stop when `predicate` returns true.
    pub fn with_predicate(
        mut self,
        predicate: impl Fn(&[u32]) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.predicate = Some(Arc::new(predicate));
        self
    }

    /// The reason to stop after `generated`, if any.
    pub fn check(&self, generated: &[u32]) -> Option<FinishReason> {
        let last = *generated.last()?;
        if self.eos.contains(&last) {
            Some(FinishReason::Eos)
        } else if self.predicate.as_ref().is_some_and(|p| p(generated)) {
            Some(FinishReason::Stop)
        } else if generated.len() >= self.max_new_tokens {
            Some(FinishReason::MaxTokens)
        } else {
            None
        }
    }
}

impl fmt::Debug for StopConditions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopConditions")
            .field("eos", &self.eos)
            .field("max_new_tokens", &self.max_new_tokens)
            .field("predicate", &self.predicate.as_ref().map(|_| "…"))
            .finish()
    }
}

/// The result of a generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Produced tokens (the context not included).
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stats: DecodeStats,
}

/// How long a linear draft is.
#[derive(Clone, Debug, PartialEq)]
pub enum DraftLength {
    /// Always γ tokens.
    Fixed(usize),
    /// Draft until the draft model's top probability falls below `min_confidence` (that token
    /// is still offered), at most `max` tokens.
    Adaptive { min_confidence: f32, max: usize },
    /// Chosen each step to maximise expected tokens per second from measured forward costs and
    /// the running acceptance rate; 0 (plain decoding) when drafting does not pay.
    CostAware(CostAwarePolicy),
}

impl DraftLength {
    /// The most tokens one step drafts.
    pub fn max(&self) -> usize {
        match *self {
            Self::Fixed(gamma) => gamma,
            Self::Adaptive { max, .. } => max,
            Self::CostAware(ref policy) => policy.max_draft(),
        }
    }

    fn validate(&self) -> Result<()> {
        if self.max() == 0 {
            return Err(Error::InvalidConfig(
                "the draft length must be at least 1".into(),
            ));
        }
        match *self {
            Self::Adaptive { min_confidence, .. } if !(0.0..=1.0).contains(&min_confidence) => {
                Err(Error::InvalidConfig(format!(
                    "min_confidence must be in [0, 1], got {min_confidence}"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// Settings of [`speculative_generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct SpeculativeConfig {
    pub draft_length: DraftLength,
    pub rule: AcceptanceRule,
    /// Repetition penalty for every rule; temperature, top-k and top-p for speculative sampling,
    /// whose draft samples from this distribution (other rules draft and correct by argmax).
    pub sampling: SamplingConfig,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self {
            draft_length: DraftLength::Fixed(4),
            rule: AcceptanceRule::greedy(),
            sampling: SamplingConfig::greedy(),
        }
    }
}

/// What the next step of a loop may use.
pub(crate) struct StepLimits {
    /// Positions in the target's cache before the step.
    pub(crate) cached: usize,
    /// Positions left in the target's cache (at least 1).
    pub(crate) room: usize,
    /// Tokens that may still be produced (at least 1).
    pub(crate) remaining: usize,
}

/// Collects produced tokens, streams them and applies the stop conditions.
pub(crate) struct Output<'a> {
    pub(crate) tokens: Vec<u32>,
    stop: &'a StopConditions,
    on_token: &'a mut dyn FnMut(u32),
    pub(crate) finish: Option<FinishReason>,
    first_token_at: Option<Instant>,
}

impl<'a> Output<'a> {
    pub(crate) fn new(stop: &'a StopConditions, on_token: &'a mut dyn FnMut(u32)) -> Self {
        Self {
            tokens: Vec::new(),
            stop,
            on_token,
            finish: (stop.max_new_tokens == 0).then_some(FinishReason::MaxTokens),
            first_token_at: None,
        }
    }

    /// Room left in `target`'s cache, or `None` (and the finish reason set) when it is full.
    pub(crate) fn room<T: Decoder + ?Sized>(&mut self, target: &T) -> Option<usize> {
        let room = target.max_len().saturating_sub(target.cached_len());
        if room == 0 {
            self.finish = Some(FinishReason::ContextFull);
            return None;
        }
        Some(room)
    }

    /// The limits of the next step of a draft/verify loop, or `None` once a stop condition
    /// holds or `target`'s cache is full (which sets the finish reason).
    pub(crate) fn next_step<T: Decoder + ?Sized>(&mut self, target: &T) -> Option<StepLimits> {
        if self.finish.is_some() {
            return None;
        }
        Some(StepLimits {
            cached: target.cached_len(),
            room: self.room(target)?,
            remaining: self.stop.max_new_tokens - self.tokens.len(),
        })
    }

    /// Emits a verified step's tokens (the target's cache holds `cached` positions before the
    /// step's input, and the step's accepted ones after it). When a stop condition fires
    /// mid-step, the cache is rolled back to the last emitted token. Returns how many were
    /// emitted.
    pub(crate) fn commit_step<T: Decoder + ?Sized>(
        &mut self,
        target: &mut T,
        committed: &mut Vec<u32>,
        cached: usize,
        new_tokens: &[u32],
    ) -> Result<usize> {
        let emitted = self.emit(new_tokens.iter().copied());
        committed.extend_from_slice(&new_tokens[..emitted]);
        if emitted < new_tokens.len() {
            target.truncate(cached + emitted)?;
        }
        Ok(emitted)
    }

    /// The result, with the run's statistics completed.
    pub(crate) fn into_generation(self, mut stats: DecodeStats, started: Instant) -> Generation {
        stats.generated_tokens = self.tokens.len();
        stats.total_time = started.elapsed();
        stats.first_token_time = self
            .first_token_at
            .map_or(stats.total_time, |at| at.duration_since(started));
        stats.runs = 1;
        Generation {
            tokens: self.tokens,
            finish: self.finish.expect("the loop ends only with a reason"),
            stats,
        }
    }

    /// Emits `tokens` in order until a stop condition fires; returns how many were emitted.
    pub(crate) fn emit(&mut self, tokens: impl IntoIterator<Item = u32>) -> usize {
        let mut emitted = 0;
        for t in tokens {
            if self.finish.is_some() {
                break;
            }
            self.tokens.push(t);
            self.first_token_at.get_or_insert_with(Instant::now);
            (self.on_token)(t);
            emitted += 1;
            self.finish = self.stop.check(&self.tokens);
        }
        emitted
    }
}

/// Forwards the part of `context` the target has not cached and returns the last logits.
pub(crate) fn prefill<D: Decoder + ?Sized>(
    model: &mut D,
    context: &[u32],
    stats: &mut DecodeStats,
) -> Result<Vec<f32>> {
    if context.is_empty() {
        return Err(Error::EmptyInput(
            "the context must hold at least one token",
        ));
    }
    if context.len() > model.max_len() {
        return Err(Error::ContextOverflow {
            requested: context.len(),
            max: model.max_len(),
        });
    }
    let keep = rewind_to_prefix(model, context)?;
    let started = Instant::now();
    let row = forward_tokens(model, &context[keep..], LogitRows::Last(1))?.into_last_row();
    stats.target_time += started.elapsed();
    stats.prompt_tokens += context.len() - keep;
    stats.target_forwards += 1;
    Ok(row)
}

/// Plain autoregressive generation (greedy or sampled), one target forward per token.
pub fn generate<D: Decoder + ?Sized>(
    model: &mut D,
    context: &[u32],
    sampling: &SamplingConfig,
    stop: &StopConditions,
    rng: &mut dyn RngCore,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation> {
    sampling.validate()?;
    let started = Instant::now();
    let mut stats = DecodeStats::default();
    let mut out = Output::new(stop, on_token);
    let mut committed = context.to_vec();
    if out.finish.is_none() {
        let mut logits = prefill(model, context, &mut stats)?;
        loop {
            let token = sampling.choose(&logits, &committed, rng)?;
            committed.push(token);
            out.emit([token]);
            if out.finish.is_some() {
                break;
            }
            if out.room(model).is_none() {
                break;
            }
            let t0 = Instant::now();
            logits = forward_tokens(model, &[token], LogitRows::Last(1))?.into_last_row();
            stats.target_time += t0.elapsed();
            stats.target_forwards += 1;
        }
    }
    Ok(out.into_generation(stats, started))
}

/// How a draft model picks its tokens.
#[derive(Debug)]
pub enum DraftTokens {
    /// Its argmax after the configuration's repetition penalty (if any).
    Greedy(SamplingConfig),
    /// Drawn from the sampler's distribution, which speculative sampling then judges them by.
    Sampled(Box<dyn Sampler>),
}

/// A draft model proposing a chain each step, as long as [`DraftLength`] says, its tokens
/// picked as [`DraftTokens`] says. The draft's cache is kept in step with the committed tokens.
#[derive(Debug)]
pub struct DraftModelDrafter<D> {
    model: D,
    length: DraftLength,
    policy: Option<CostAwarePolicy>,
    tokens: DraftTokens,
    with_prefill: bool,
}

impl<D: Decoder> DraftModelDrafter<D> {
    /// Drafts with `model`, `length` tokens a step, picked as `tokens` says.
    pub fn new(model: D, length: DraftLength, tokens: DraftTokens) -> Result<Self> {
        length.validate()?;
        match &tokens {
            DraftTokens::Greedy(sampling) => sampling.validate()?,
            DraftTokens::Sampled(sampler) => sampler.validate()?,
        }
        let policy = match &length {
            DraftLength::CostAware(policy) => Some(policy.clone()),
            _ => None,
        };
        Ok(Self {
            model,
            length,
            policy,
            tokens,
            with_prefill: false,
        })
    }

    /// Drafts `model`'s greedy tokens, `length` a step.
    pub fn greedy(model: D, length: DraftLength) -> Result<Self> {
        Self::new(model, length, DraftTokens::Greedy(SamplingConfig::greedy()))
    }

    /// Also drafts after the context, so the target's prefill verifies the first chain (one
    /// target forward fewer per generation).
    pub fn drafting_with_prefill(mut self) -> Self {
        self.with_prefill = true;
        self
    }
}

impl<D: Decoder> TreeDrafter for DraftModelDrafter<D> {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        let (root, committed) = (input.root()?, input.committed);
        let mut rng = input.rng;
        // Never draft beyond what fits in the draft's cache.
        let draft_room = self.model.max_len().saturating_sub(committed.len());
        let limit = input.max_depth.min(draft_room);
        let budget = match (&mut self.policy, rng.as_mut()) {
            (Some(policy), Some(rng)) => {
                let seen = common_prefix_len(self.model.cached_tokens(), committed);
                policy.choose(limit, committed.len() - seen, *rng)
            }
            (Some(_), None) => {
                return Err(Error::InvalidConfig(
                    "a cost-aware draft length explores with the run's randomness".into(),
                ))
            }
            (None, _) => self.length.max().min(limit),
        };
        let (tokens, length) = (&self.tokens, &self.length);
        let mut distributions = Vec::new();
        let mut pick = |drafted: &[u32], row: Vec<f32>| -> Result<(u32, bool)> {
            let before: Vec<u32> = committed.iter().chain(drafted).copied().collect();
            let (token, confidence) = match (tokens, rng.as_mut()) {
                (DraftTokens::Sampled(sampler), Some(rng)) => {
                    distributions.push(sampler.distribution(&before, &row)?);
                    let probs = distributions.last().expect("just pushed");
                    (sample(probs, *rng), max_probability(&row))
                }
                (DraftTokens::Sampled(_), None) => {
                    return Err(Error::InvalidConfig(
                        "a sampled draft draws from the run's randomness".into(),
                    ))
                }
                (DraftTokens::Greedy(sampling), _) => {
                    let row = sampling.penalize(&row, &before);
                    (argmax(&row), max_probability(&row))
                }
            };
            let unsure = matches!(length,
                DraftLength::Adaptive { min_confidence, .. } if confidence < *min_confidence);
            Ok((token, unsure))
        };
        let (drafted, forwards) = draft_chain(&mut self.model, committed, budget, &mut pick)?;
        Ok(TreeDraft {
            distributions,
            ..TreeDraft::new(TokenTree::linear(root, &drafted), forwards)
        })
    }

    fn drafts_with_prefill(&self) -> bool {
        self.with_prefill
    }

    fn observe(&mut self, tree: &TokenTree, verified: &Verified) -> Result<()> {
        if let Some(policy) = &mut self.policy {
            policy.observe(tree.len() - 1, verified.verdict.path.len() - 1);
        }
        Ok(())
    }

    fn finish(&mut self, committed: &[u32]) -> Result<()> {
        rewind_to_prefix(&mut self.model, committed).map(|_| ())
    }
}

/// Draft-model speculative decoding with a linear draft: [`speculate`] with a
/// [`DraftModelDrafter`]. With [`AcceptanceRule::Greedy`] the output is exactly that of greedy
/// [`generate`] on the target; with speculative sampling it follows the target's sampling
/// distribution.
pub fn speculative_generate<T: HiddenStates + ?Sized, D: Decoder + ?Sized>(
    target: &mut T,
    draft: &mut D,
    context: &[u32],
    config: &SpeculativeConfig,
    stop: &StopConditions,
    rng: &mut dyn RngCore,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation> {
    config.rule.validate()?;
    if draft.vocab_size() != target.vocab_size() {
        return Err(Error::VocabMismatch {
            draft: draft.vocab_size(),
            target: target.vocab_size(),
        });
    }
    let sampling = &config.sampling;
    let sampled = config.rule.is_stochastic();
    let tokens = match sampled {
        true => DraftTokens::Sampled(Box::new(sampling.clone())),
        false => DraftTokens::Greedy(sampling.clone()),
    };
    let mut drafter = DraftModelDrafter::new(draft, config.draft_length.clone(), tokens)?;
    // A sampler's distribution carries the penalty; greedy rules judge penalized rows.
    let penalize = &mut |tokens: &[u32], row: &mut [f32]| sampling.apply_penalty(row, tokens);
    let speculation = Speculation {
        adjust: (sampling.has_penalty() && !sampled).then_some(penalize as AdjustLogits<'_>),
        sampling: Some(sampling),
        rng: Some(rng),
        ..Speculation::new(&config.rule)
    };
    speculate(target, &mut drafter, context, speculation, stop, on_token)
}
