//! Jacobi decoding: greedy decoding that guesses a window of future tokens and refines the
//! guess by fixed-point iteration, S ← [S₀, argmax LLM(S)[0 : L−1]], committing each iteration
//! the prefix of the guess that the model reproduced (Santilli et al.; PredGen's alternative to
//! autoregressive continuation, seeded with the previous answer).
//!
//! Every committed token is the model's argmax given the committed tokens before it, so the
//! output is exactly that of greedy autoregressive decoding; what changes is how many forwards
//! produce it.

use std::time::Instant;

use crate::acceptance::{Acceptance, AcceptanceRule};
use crate::decoder::{forward_tokens, Decoder, LogitRows};
use crate::generate::{Generation, Output, StepLimits, StopConditions};
use crate::sampling::argmax;
use crate::stats::{DecodeStats, StepRecord};
use crate::{Error, Result};

/// Greedy generation by Jacobi iteration over a window of `window` guessed tokens, starting
/// from `initial_guess` (e.g. the rest of a previous answer, for the positions after the first
/// produced token; padded by repeating its last token when shorter than the window).
pub fn jacobi_generate<D: Decoder + ?Sized>(
    model: &mut D,
    context: &[u32],
    initial_guess: &[u32],
    window: usize,
    stop: &StopConditions,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation> {
    if window == 0 {
        return Err(Error::InvalidConfig(
            "the Jacobi window must be at least 1".into(),
        ));
    }
    let started = Instant::now();
    let mut stats = DecodeStats::default();
    let mut out = Output::new(stop, on_token);
    let mut committed = context.to_vec();
    let greedy = AcceptanceRule::greedy();
    // Guessed tokens for the positions after the last committed one; the first `window` are
    // checked each pass, the rest wait their turn.
    let mut guess: Vec<u32> = initial_guess.to_vec();
    out.first_token(model, context, &mut stats, &mut committed, |logits, _| {
        argmax(logits)
    })?;
    while let Some(StepLimits {
        cached,
        room,
        remaining,
    }) = out.next_step(model)
    {
        let width = window.min(remaining - 1).min(room - 1);
        let pending = *committed.last().expect("at least one token was produced");
        let pad = guess
            .iter()
            .take(width)
            .next_back()
            .copied()
            .unwrap_or(pending);
        let mut draft: Vec<u32> = guess.iter().copied().take(width).collect();
        draft.resize(width, pad);

        let t0 = Instant::now();
        let input: Vec<u32> = std::iter::once(pending)
            .chain(draft.iter().copied())
            .collect();
        let rows = forward_tokens(model, &input, LogitRows::All)?;
        stats.target_forwards += 1;
        let verdict = greedy.verify_by_judging(&draft, &rows)?;
        model.truncate(cached + 1 + verdict.accepted)?;
        stats.target_time += t0.elapsed();
        stats.steps.push(StepRecord {
            drafted: draft.len(),
            accepted: verdict.accepted,
        });
        // Row j predicts the token at the position of draft[j]: the Jacobi update of the guess
        // after the committed prefix, followed by the guesses this pass did not reach.
        let mut next_guess: Vec<u32> = rows.rows().skip(verdict.accepted + 1).map(argmax).collect();
        next_guess.extend(guess.iter().skip(width + 1).copied());
        let new_tokens: Vec<u32> = draft[..verdict.accepted]
            .iter()
            .copied()
            .chain([verdict.next_token])
            .collect();
        out.commit_step(model, &mut committed, cached, &new_tokens)?;
        guess = next_guess;
    }
    Ok(out.into_generation(stats, started))
}
