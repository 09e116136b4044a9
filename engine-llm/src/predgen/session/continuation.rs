//! Continuations: how a guess or answer grows after its verified part (one token a forward,
//! lookup, Jacobi, a draft model or heads), each lossless under greedy verification.

use std::sync::Mutex;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use spec_core::{
    generate, speculate, AcceptanceRate, AcceptanceRule, DraftLength, DraftModelDrafter,
    FinishReason, ForwardCosts, Generation, JacobiDrafter, LookupDrafter, MergedDrafter,
    SamplingConfig, Speculation, StopConditions, TreeDrafter,
};

use spec_voice::{settled_first_piece, SentenceStream};

use super::{Answer, EventKind, PredGen, TurnState};
use crate::predgen::Continuation;
use crate::transformer::Transformer;
use crate::{Error, Result};

/// Most discarded guesses a turn keeps for the lookup continuation.
pub(super) const RECYCLED_GUESSES: usize = 16;

/// A lookup drafter of at most `max_draft` tokens copying from the turn's discarded `guesses`,
/// cut by the measured `costs` at the `acceptance` lookup drafts had so far.
pub(super) fn guess_lookup(
    max_draft: usize,
    costs: Option<&ForwardCosts>,
    acceptance: Option<AcceptanceRate>,
    guesses: &[Vec<u32>],
) -> Result<LookupDrafter> {
    let mut drafter = LookupDrafter::continuing(max_draft, costs, acceptance)?;
    for guess in guesses {
        drafter.add_reference(guess.clone());
    }
    Ok(drafter)
}

/// Most tokens per step the heads continuation copies from the turn's guesses beside the
/// heads' own (the lookup continuation's default length, cut by the same costs).
pub(super) const HEADS_LOOKUP_DRAFT: usize = 8;

/// What a continuation may draft from besides the model, and when it runs.
#[derive(Clone, Copy, Default)]
pub(super) struct Drafting<'a> {
    /// The rejected part of the last guess: Jacobi's starting guess.
    pub(super) tail: &'a [u32],
    /// The turn's discarded guesses, the newest last: lookup's references.
    pub(super) guesses: &'a [Vec<u32>],
    /// While the user speaks, where a step's time is idle time: Jacobi decoding may run on
    /// trial ([`PredGen::runnable`]) and the draft model's policy may try drafts to learn their
    /// acceptance; after the last word each follows its estimate.
    pub(super) listening: bool,
}

/// Where a generation stops, unless an end token, a full context or its budget stops it first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Until {
    /// The answer holds this many complete sentences.
    Sentences(usize),
    /// The answer holds its first sentence, or that sentence's first piece is settled
    /// ([`settled_first_piece`]): the piece can be spoken while the rest is written.
    FirstPiece,
}

/// Weight of the Jacobi continuation's earlier runs in its running rate, per run.
pub(super) const JACOBI_DECAY: f64 = 0.9;

impl PredGen<'_> {
    /// Generates up to `budget` tokens onto `answer`, greedy, by what of `continuation` runs
    /// now ([`Self::runnable`], listening as `drafting` says), stopping at an end token, a full
    /// context, or where `until` says.
    pub(super) fn extend_with(
        &mut self,
        continuation: Continuation,
        prompt: &[u32],
        answer: &mut Answer,
        drafting: Drafting<'_>,
        budget: usize,
        until: Until,
    ) -> Result<Generation> {
        let continuation = self.runnable(continuation, drafting.listening);
        let context: Vec<u32> = prompt.iter().chain(&answer.tokens).copied().collect();
        let end_tokens = self.model.tokenizer.end_tokens().to_vec();
        let mut stop = StopConditions::new(budget).with_eos(end_tokens.iter().copied());
        // The answer's text is followed token by token: each one decoded once, each sentence
        // found once.
        let mut text = self.model.tokenizer.stream();
        let mut sentences = SentenceStream::new();
        for &token in &answer.tokens {
            if let Some(delta) = text.push(token)? {
                sentences.push(&delta);
            }
        }
        let seen = Mutex::new((text, sentences, 0));
        stop = stop.with_predicate(move |generated| {
            let Ok(mut guard) = seen.lock() else {
                return true;
            };
            let (text, sentences, read) = &mut *guard;
            for &token in &generated[*read..] {
                if let Ok(Some(delta)) = text.push(token) {
                    sentences.push(&delta);
                }
            }
            *read = generated.len();
            match until {
                Until::Sentences(wanted) => sentences.reported() >= wanted,
                Until::FirstPiece => {
                    sentences.reported() >= 1 || settled_first_piece(sentences.text()).is_some()
                }
            }
        });
        let target = &mut self.model.model;
        let mut rng = StdRng::seed_from_u64(0);
        let gen = match continuation {
            Continuation::Autoregressive => generate(
                target,
                &context,
                &SamplingConfig::greedy(),
                &stop,
                &mut rng,
                &mut |_| {},
            )?,
            Continuation::Jacobi { window } => {
                let mut drafter = JacobiDrafter::new(drafting.tail, window)?;
                let gen = greedy_with(target, &mut drafter, &context, &stop, &mut rng)?;
                let (tokens, forwards) = self.jacobi_rate;
                self.jacobi_rate = (
                    JACOBI_DECAY * tokens + gen.tokens.len() as f64,
                    JACOBI_DECAY * forwards + gen.stats.target_forwards as f64,
                );
                gen
            }
            Continuation::DraftModel { gamma } => {
                let draft_length = match &self.draft_policy {
                    Some(policy) if drafting.listening => DraftLength::CostAware(policy.clone()),
                    Some(policy) => DraftLength::CostAware(policy.clone().without_exploration()),
                    None => DraftLength::Fixed(gamma),
                };
                let draft = self.draft.as_deref_mut().ok_or_else(|| {
                    Error::Config("the draft-model continuation needs a draft model".into())
                })?;
                let mut drafter = DraftModelDrafter::greedy(&mut draft.model, draft_length)?;
                let gen = greedy_with(target, &mut drafter, &context, &stop, &mut rng)?;
                if let Some(policy) = &mut self.draft_policy {
                    for step in &gen.stats.steps {
                        policy.observe(step.drafted, step.accepted);
                    }
                }
                gen
            }
            Continuation::Lookup { max_draft } => {
                let mut drafter = guess_lookup(
                    max_draft,
                    self.costs.as_ref(),
                    self.lookup_acceptance,
                    drafting.guesses,
                )?;
                let gen = greedy_with(target, &mut drafter, &context, &stop, &mut rng)?;
                self.lookup_acceptance = Some(drafter.acceptance());
                gen
            }
            Continuation::Heads => {
                let drafter = self
                    .heads
                    .as_ref()
                    .ok_or_else(|| Error::Config("the heads continuation needs heads".into()))?;
                // Beside the heads' guesses, runs copied from the turn's discarded guesses, as
                // the lookup continuation drafts them.
                let copies = guess_lookup(
                    HEADS_LOOKUP_DRAFT,
                    self.costs.as_ref(),
                    self.lookup_acceptance,
                    drafting.guesses,
                )?;
                let mut merged = MergedDrafter {
                    first: drafter,
                    second: copies,
                };
                let gen = greedy_with(target, &mut merged, &context, &stop, &mut rng)?;
                self.lookup_acceptance = Some(merged.second.acceptance());
                gen
            }
        };
        let ended = gen.finish == FinishReason::Eos;
        answer.extend_settled(
            gen.tokens
                .iter()
                .copied()
                .take_while(|t| !end_tokens.contains(t)),
        );
        answer.done = ended
            || gen.finish == FinishReason::ContextFull
            || answer.tokens.len() >= self.config.max_answer_tokens;
        Ok(gen)
    }

    /// Generates up to `budget` tokens onto the turn's guess by `continuation` until the guess
    /// holds a complete first sentence, or with [`Until::FirstPiece`] that sentence's settled
    /// first piece ([`Self::extend_with`]), drafting from the guess's
    /// rejected tail (taken) and the turn's discarded guesses; charges the turn's clock with the
    /// time and records the tokens generated in its timeline. Returns the target's forwards.
    pub(super) fn extend_guess_to_first_sentence(
        &mut self,
        turn: &mut TurnState,
        prompt: &[u32],
        continuation: Continuation,
        listening: bool,
        until: Until,
        budget: usize,
    ) -> Result<usize> {
        let started = Instant::now();
        let before = turn.guess.tokens.len();
        let tail = std::mem::take(&mut turn.rejected_tail);
        let drafting = Drafting {
            tail: &tail,
            guesses: &turn.recycled,
            listening,
        };
        let gen = self.extend_with(
            continuation,
            prompt,
            &mut turn.guess,
            drafting,
            budget,
            until,
        )?;
        turn.clock.charge(started.elapsed());
        let generated = self.generated_event(&turn.guess.tokens[before..])?;
        turn.timeline.push(turn.event(generated));
        Ok(gen.stats.target_forwards)
    }

    /// What runs of `continuation` now: Jacobi decoding only while it is on trial (its first
    /// few forwards of the session, and only while the user speaks, where a slow step costs
    /// idle time) or has shown that it produces tokens faster than one forward per token, from
    /// the tokens per forward it achieved so far and the measured forward costs; plain decoding
    /// otherwise.
    fn runnable(&self, continuation: Continuation, listening: bool) -> Continuation {
        let Continuation::Jacobi { window } = continuation else {
            return continuation;
        };
        let Some(costs) = &self.costs else {
            return continuation;
        };
        let (tokens, forwards) = self.jacobi_rate;
        let pays = match forwards < 8.0 {
            true => listening,
            false => tokens / forwards * costs.cost(1) >= costs.cost(window + 1),
        };
        match pays {
            true => continuation,
            false => Continuation::Autoregressive,
        }
    }

    pub(super) fn generated_event(&self, tokens: &[u32]) -> Result<EventKind> {
        Ok(EventKind::Generated {
            tokens: tokens.len(),
            text: self.model.tokenizer.decode_text(tokens)?,
        })
    }
}

/// Greedy speculation with `drafter` after `context`, lending it `rng` (a cost-aware draft
/// length explores with it).
fn greedy_with(
    target: &mut Transformer,
    drafter: &mut dyn TreeDrafter,
    context: &[u32],
    stop: &StopConditions,
    rng: &mut dyn RngCore,
) -> Result<Generation> {
    let greedy = AcceptanceRule::greedy();
    let speculation = Speculation {
        rng: Some(rng),
        ..Speculation::new(&greedy)
    };
    Ok(speculate(
        target,
        drafter,
        context,
        speculation,
        stop,
        &mut |_| {},
    )?)
}
