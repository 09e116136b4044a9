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

use crate::acceptance::{Acceptance, AcceptanceRule, DraftCheck};
use crate::cost::CostAwarePolicy;
use crate::decoder::{common_prefix_len, forward_tokens, rewind_to_prefix, Decoder, LogitRows};
use crate::draft::{advance, catch_up};
use crate::sampling::{argmax, max_probability, sample, SamplingConfig};
use crate::stats::{DecodeStats, StepRecord};
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

    /// Unless a stop condition already holds: forwards `context` into `target` and emits the
    /// first token, `pick(last logits, committed tokens)`, appending it to `committed`.
    pub(crate) fn first_token<D: Decoder + ?Sized>(
        &mut self,
        target: &mut D,
        context: &[u32],
        stats: &mut DecodeStats,
        committed: &mut Vec<u32>,
        pick: impl FnOnce(&[f32], &[u32]) -> u32,
    ) -> Result<()> {
        if self.finish.is_none() {
            let logits = prefill(target, context, stats)?;
            let token = pick(&logits, committed);
            committed.push(token);
            self.emit([token]);
        }
        Ok(())
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
            let token = sampling.choose(&logits, &committed, rng);
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

/// Chooses the first token after the prefill the way the rule's corrections are chosen.
fn first_token(
    rule: &AcceptanceRule,
    sampling: &SamplingConfig,
    logits: &[f32],
    context: &[u32],
    rng: &mut dyn RngCore,
) -> u32 {
    let logits = sampling.penalize(logits, context);
    if rule.is_stochastic() {
        sample(&sampling.probabilities(&logits), rng)
    } else {
        rule.correction(&logits)
    }
}

/// Draft-model speculative decoding with a linear draft. With [`AcceptanceRule::Greedy`] the
/// output is exactly that of greedy [`generate`] on the target.
pub fn speculative_generate<T: Decoder + ?Sized, D: Decoder + ?Sized>(
    target: &mut T,
    draft: &mut D,
    context: &[u32],
    config: &SpeculativeConfig,
    stop: &StopConditions,
    rng: &mut dyn RngCore,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation> {
    config.draft_length.validate()?;
    config.rule.validate()?;
    config.sampling.validate()?;
    if draft.vocab_size() != target.vocab_size() {
        return Err(Error::VocabMismatch {
            draft: draft.vocab_size(),
            target: target.vocab_size(),
        });
    }
    let started = Instant::now();
    let mut stats = DecodeStats::default();
    let mut out = Output::new(stop, on_token);
    let mut committed = context.to_vec();
    let stochastic = config.rule.is_stochastic();
    let sampling = &config.sampling;
    let mut policy = match &config.draft_length {
        DraftLength::CostAware(policy) => Some(policy.clone()),
        _ => None,
    };

    out.first_token(
        target,
        context,
        &mut stats,
        &mut committed,
        |logits, committed| first_token(&config.rule, sampling, logits, committed, rng),
    )?;
    while let Some(StepLimits {
        cached,
        room,
        remaining,
    }) = out.next_step(target)
    {
        // Never draft beyond what may still be produced or what fits in either cache.
        let draft_room = draft.max_len().saturating_sub(committed.len());
        let limit = remaining.saturating_sub(1).min(room - 1).min(draft_room);
        let budget = match &mut policy {
            Some(policy) => {
                let seen = common_prefix_len(draft.cached_tokens(), &committed);
                policy.choose(limit, committed.len() - seen, rng)
            }
            None => config.draft_length.max().min(limit),
        };

        let t_draft = Instant::now();
        let mut drafted = Vec::with_capacity(budget);
        let mut draft_probs = Vec::new();
        if budget > 0 {
            let mut row = catch_up(draft, &committed)?;
            stats.draft_forwards += 1;
            for i in 0..budget {
                let context_i: Vec<u32> = committed.iter().chain(&drafted).copied().collect();
                let row_p = sampling.penalize(&row, &context_i);
                let token = if stochastic {
                    let probs = sampling.probabilities(&row_p);
                    let token = sample(&probs, rng);
                    draft_probs.push(probs);
                    token
                } else {
                    argmax(&row_p)
                };
                drafted.push(token);
                let unsure = matches!(config.draft_length,
                    DraftLength::Adaptive { min_confidence, .. } if max_probability(&row_p) < min_confidence);
                if unsure || i + 1 == budget {
                    break;
                }
                row = advance(draft, token)?;
                stats.draft_forwards += 1;
            }
        }
        stats.draft_time += t_draft.elapsed();

        let t_verify = Instant::now();
        let pending = *committed.last().expect("at least one token was produced");
        let input: Vec<u32> = std::iter::once(pending)
            .chain(drafted.iter().copied())
            .collect();
        let mut rows = forward_tokens(target, &input, LogitRows::All)?;
        stats.target_forwards += 1;
        if sampling.repetition_penalty != 1.0 {
            for i in 0..rows.len() {
                let context_i: Vec<u32> = committed.iter().chain(&drafted[..i]).copied().collect();
                sampling.apply_penalty(rows.row_mut(i), &context_i);
            }
        }
        let check = DraftCheck {
            draft: &drafted,
            target_logits: &rows,
            draft_probs: &draft_probs,
            sampling,
        };
        let verdict = config.rule.verify(&check, rng)?;
        target.truncate(cached + 1 + verdict.accepted)?;
        stats.target_time += t_verify.elapsed();
        stats.steps.push(StepRecord {
            drafted: drafted.len(),
            accepted: verdict.accepted,
        });
        if let Some(policy) = &mut policy {
            policy.observe(drafted.len(), verdict.accepted);
        }

        let accepted = drafted[..verdict.accepted].iter().copied();
        let new_tokens: Vec<u32> = accepted.chain([verdict.next_token]).collect();
        out.commit_step(target, &mut committed, cached, &new_tokens)?;
    }
    rewind_to_prefix(draft, &committed)?;
    Ok(out.into_generation(stats, started))
}
