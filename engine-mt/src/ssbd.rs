//! Self-Speculative Biased Decoding (Zeng et al., Algorithm 1) on any [`Decoder`].
//!
//! The previous translation is the draft for the new source. One forward over the new part of
//! the prompt followed by the draft gives the target's distribution P at every draft position;
//! each draft token is kept while it is the argmax of P' = (1 − β)·P + β·onehot(draft token)
//! (the paper's biased verification; β = 0 is plain greedy verification), the first token where
//! they differ is the target's own (already the correction), the cache is rolled back to the
//! accepted prefix, and decoding goes on greedily ([`Continuation`]): one token per forward, or
//! with drafts checked greedily, from the rest of the previous output or from a small model.

use std::time::{Duration, Instant};

use spec_core::decoder::forward_tokens;
use spec_core::decoder::rewind_to_prefix;
use spec_core::draft::{advance, catch_up};
use spec_core::sampling::{argmax, softmax};
use spec_core::{
    forward_continuation, Acceptance, AcceptanceRule, Decoder, DraftInput, LogitRows, Logits,
    LookupDrafter, TreeDrafter,
};

use crate::error::{Error, Result};

/// How one update is decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Decoding {
    /// Re-translation from scratch: greedy decoding of the new prompt (the cache still keeps
    /// the prompt prefix it shares with the previous update).
    Autoregressive,
    /// Self-Speculative Biased Decoding with bias `beta` ∈ [0, 1].
    Ssbd { beta: f32 },
}

/// How the tokens after the divergence point are decoded. Every variant gives the target's
/// greedy continuation (drafts are checked greedily); they differ in forwards and time.
pub enum Continuation<'a> {
    /// One target forward per token (the paper's setting).
    Greedy,
    /// The previous output keeps drafting after the divergence: where the last decoded tokens
    /// occur in it (the drafter's reference) or earlier in the new output, the tokens that
    /// followed them there are checked in one forward, as many as the drafter's forward costs
    /// and observed acceptance pay for. A translation of a grown source often rejoins the
    /// previous one after the words the new source inserted (prompt-lookup decoding on the
    /// previous translation; the paper discards the draft after the divergence). Where nothing
    /// matches, the drafter is offered the target's own guess of the token after the next one
    /// (Jacobi iteration): its argmax at the first position past the token the last forward
    /// kept, or, when that forward had none, the next token repeated, so that the forward
    /// yields such a guess.
    Lookup(&'a mut LookupDrafter),
    /// A small model of the same vocabulary drafts `gamma` tokens per step (SSBD + draft-model
    /// speculative decoding, the paper's future work).
    Assistant {
        model: &'a mut dyn Decoder,
        gamma: usize,
    },
}

/// One update's tokens and counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpdateDecode {
    /// The new output (without the end-of-sequence token).
    pub tokens: Vec<u32>,
    /// For each output token, its biased probability P' in the forward that chose it:
    /// (1 − β)·P + β for a kept draft token, (1 − β)·P for the token replacing a rejected one,
    /// P for a token decoded after the divergence.
    pub confidence: Vec<f32>,
    /// Draft tokens offered for biased verification (the previous output, after mask-k).
    pub drafted: usize,
    /// Draft tokens kept.
    pub accepted: usize,
    /// Kept draft tokens that were not the target's own argmax: kept only by the bias.
    pub forced: usize,
    /// Tokens after the divergence drafted by [`Continuation::Lookup`] or
    /// [`Continuation::Assistant`], and how many of them the target kept.
    pub continuation_drafted: usize,
    pub continuation_accepted: usize,
    /// Target forward passes (the verification pass included).
    pub target_forwards: usize,
    /// Forward passes of the draft model, when one continues after the divergence.
    pub draft_forwards: usize,
    pub time: Duration,
}

/// Decodes the output for `prompt`, using `draft` (the previous output, already trimmed) as
/// described in the module documentation, and `continuation` after the divergence. With β = 0
/// the result is exactly the target's greedy output, whatever the draft and continuation.
pub fn decode_update<T: Decoder + ?Sized>(
    target: &mut T,
    mut continuation: Continuation<'_>,
    prompt: &[u32],
    draft: &[u32],
    decoding: &Decoding,
    end_tokens: &[u32],
    max_tokens: usize,
) -> Result<UpdateDecode> {
    if prompt.is_empty() {
        return Err(Error::Input("empty prompt".into()));
    }
    let started = Instant::now();
    let is_end = |t: &u32| end_tokens.contains(t);
    let mut out = UpdateDecode::default();
    let mut guess = Vec::new();

    // The verification pass: the prompt's new tokens and the draft, in one forward.
    let finished = match decoding {
        Decoding::Ssbd { beta } if !draft.is_empty() && max_tokens > 0 => {
            let rule = AcceptanceRule::biased(*beta);
            rule.validate()?;
            let room = target.max_len().saturating_sub(prompt.len());
            let draft = &draft[..draft.len().min(room).min(max_tokens)];
            let logits = forward_continuation(target, prompt, draft)?;
            let verdict = rule.verify_by_judging(draft, &logits)?;
            out.target_forwards += 1;
            out.drafted = draft.len();
            // An end token inside the draft ends the output there.
            let kept = draft[..verdict.accepted]
                .iter()
                .position(is_end)
                .unwrap_or(verdict.accepted);
            out.accepted = kept;
            out.tokens = draft[..kept].to_vec();
            for (i, &token) in out.tokens.iter().enumerate() {
                let row = logits.row(i);
                out.confidence
                    .push((1.0 - beta) * softmax(row)[token as usize] + beta);
                out.forced += usize::from(argmax(row) != token);
            }
            // The model's next token is added only while the budget has room: a draft kept
            // whole may already fill it.
            let finished = if kept < verdict.accepted
                || out.tokens.len() >= max_tokens
                || is_end(&verdict.next_token)
            {
                true
            } else {
                let p = softmax(logits.row(kept))[verdict.next_token as usize];
                let own = if kept < draft.len() { 1.0 - beta } else { 1.0 };
                out.tokens.push(verdict.next_token);
                out.confidence.push(own * p);
                out.tokens.len() >= max_tokens
            };
            // Roll back past an end token inside the draft (the next token is not cached yet).
            target.truncate(prompt.len() + kept)?;
            if kept == verdict.accepted {
                guess = guess_past(&logits, kept + 1);
            }
            finished
        }
        _ => max_tokens == 0,
    };

    if !finished {
        continue_decoding(
            target,
            &mut continuation,
            prompt,
            end_tokens,
            max_tokens,
            &mut out,
            guess,
        )?;
    }
    out.time = started.elapsed();
    Ok(out)
}

/// Greedy decoding of `prompt + out.tokens` onward until an end token or `max_tokens`, each
/// step one target forward over the uncached tokens and a draft from `continuation`, keeping
/// the draft while it is the target's argmax. `guess` is the verification forward's guess for
/// the token after the next one ([`guess_past`]). Stops early, as [`spec_core::generate`] does,
/// when the cache is full.
fn continue_decoding<T: Decoder + ?Sized>(
    target: &mut T,
    continuation: &mut Continuation<'_>,
    prompt: &[u32],
    end_tokens: &[u32],
    max_tokens: usize,
    out: &mut UpdateDecode,
    mut guess: Vec<u32>,
) -> Result<()> {
    let mut context: Vec<u32> = prompt.iter().chain(&out.tokens).copied().collect();
    let mut first = true;
    while out.tokens.len() < max_tokens {
        if context.len() > target.max_len() {
            if first {
                return Err(spec_core::Error::ContextOverflow {
                    requested: context.len(),
                    max: target.max_len(),
                }
                .into());
            }
            break;
        }
        first = false;
        let keep = rewind_to_prefix(target, &context)?;
        // Draft tokens beyond the next one; the last of them is never followed by a bonus
        // token past the budget or the cache.
        let limit = (max_tokens - out.tokens.len() - 1).min(target.max_len() - context.len());
        let draft = match continuation {
            Continuation::Greedy => Vec::new(),
            // Looked up in the output only: a match in the prompt's template or source words
            // rarely continues into the translation.
            Continuation::Lookup(drafter) if !out.tokens.is_empty() => {
                // With no guess from the last forward, the next token repeated starts the
                // iteration (the row after it guesses the token after that).
                match guess.is_empty() {
                    true => drafter.offer_probe(*context.last().expect("a prompt is never empty")),
                    false => drafter.offer_guess(std::mem::take(&mut guess)),
                }
                drafter
                    .draft_tree(DraftInput::new(&out.tokens, limit))?
                    .tree
                    .tokens()[1..]
                    .to_vec()
            }
            Continuation::Lookup(_) => Vec::new(),
            Continuation::Assistant { model, gamma } if limit > 0 => {
                let draft = assistant_draft(&mut **model, &context, (*gamma).min(limit))?;
                out.draft_forwards += draft.len();
                draft
            }
            Continuation::Assistant { .. } => Vec::new(),
        };
        let input: Vec<u32> = context[keep..].iter().chain(&draft).copied().collect();
        let logits = forward_tokens(target, &input, LogitRows::Last(draft.len() + 1))?;
        out.target_forwards += 1;
        out.continuation_drafted += draft.len();
        let mut ended = false;
        for (i, row) in logits.rows().enumerate() {
            let token = argmax(row);
            if end_tokens.contains(&token) {
                ended = true;
                break;
            }
            out.tokens.push(token);
            out.confidence.push(softmax(row)[token as usize]);
            context.push(token);
            let matched = draft.get(i) == Some(&token);
            out.continuation_accepted += usize::from(matched);
            if !matched || out.tokens.len() >= max_tokens {
                guess = guess_past(&logits, i + 1);
                break;
            }
        }
        // The cache keeps the context but its last token (not forwarded yet).
        target.truncate(context.len() - usize::from(!ended))?;
        if ended {
            break;
        }
    }
    if let Continuation::Lookup(drafter) = continuation {
        drafter.finish(&out.tokens)?;
    }
    Ok(())
}

/// The target's argmax at row `row`, the one after a rejected draft token: a guess of the
/// token after the one that replaces it (empty when the forward has no such row).
fn guess_past(logits: &Logits, row: usize) -> Vec<u32> {
    logits.rows().nth(row).map(argmax).into_iter().collect()
}

/// `gamma` tokens greedily drafted by `model` after `context`.
fn assistant_draft(model: &mut dyn Decoder, context: &[u32], gamma: usize) -> Result<Vec<u32>> {
    let mut logits = catch_up(model, context)?;
    let mut draft = Vec::with_capacity(gamma);
    while draft.len() < gamma {
        let token = argmax(&logits);
        draft.push(token);
        if draft.len() < gamma {
            logits = advance(model, token)?;
        }
    }
    Ok(draft)
}
