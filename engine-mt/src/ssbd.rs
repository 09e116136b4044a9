//! Self-Speculative Biased Decoding (Zeng et al., Algorithm 1) on any [`Decoder`].
//!
//! The previous translation is the draft for the new source. One forward over the new part of
//! the prompt followed by the draft gives the target's distribution P at every draft position;
//! each draft token is kept while it is the argmax of P' = (1 − β)·P + β·onehot(draft token)
//! (the paper's biased verification; β = 0 is plain greedy verification), the first token where
//! they differ is the target's own (already the correction), the cache is rolled back to the
//! accepted prefix, and decoding goes on greedily, optionally with a draft model.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::{
    generate, speculative_generate, verify_continuation, AcceptanceRule, Decoder, DraftLength,
    Generation, SamplingConfig, SpeculativeConfig, StopConditions,
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

/// One update's tokens and counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpdateDecode {
    /// The new output (without the end-of-sequence token).
    pub tokens: Vec<u32>,
    /// Draft tokens offered for biased verification (the previous output, after mask-k).
    pub drafted: usize,
    /// Draft tokens kept.
    pub accepted: usize,
    /// Target forward passes (the verification pass included).
    pub target_forwards: usize,
    /// Forward passes of the draft model, when one continues after the divergence.
    pub draft_forwards: usize,
    pub time: Duration,
}

/// Decodes the output for `prompt`, using `draft` (the previous output, already trimmed) as
/// described in the module documentation. `assistant` (a small model with the same vocabulary)
/// speculates the tokens after the divergence point with draft length `gamma`; with β = 0 the
/// result is still exactly the target's greedy output.
#[allow(clippy::too_many_arguments)]
pub fn decode_update<T: Decoder + ?Sized>(
    target: &mut T,
    assistant: Option<(&mut dyn Decoder, usize)>,
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

    // The verification pass: the prompt's new tokens and the draft, in one forward.
    let (mut tokens, finished) = match decoding {
        Decoding::Ssbd { beta } if !draft.is_empty() && max_tokens > 0 => {
            let rule = AcceptanceRule::biased(*beta);
            rule.validate()?;
            let room = target.max_len().saturating_sub(prompt.len());
            let draft = &draft[..draft.len().min(room).min(max_tokens)];
            let verdict = verify_continuation(target, prompt, draft, &rule)?;
            out.target_forwards += 1;
            out.drafted = draft.len();
            // An end token inside the draft ends the output there.
            let kept = draft[..verdict.accepted]
                .iter()
                .position(is_end)
                .unwrap_or(verdict.accepted);
            out.accepted = kept;
            let mut tokens = draft[..kept].to_vec();
            // The model's next token is added only while the budget has room: a draft kept
            // whole may already fill it.
            let finished = if kept < verdict.accepted
                || tokens.len() >= max_tokens
                || is_end(&verdict.next_token)
            {
                true
            } else {
                tokens.push(verdict.next_token);
                tokens.len() >= max_tokens
            };
            // Roll back past an end token inside the draft (the next token is not cached yet).
            target.truncate(prompt.len() + kept)?;
            (tokens, finished)
        }
        _ => (Vec::new(), max_tokens == 0),
    };

    if !finished {
        let context: Vec<u32> = prompt.iter().chain(&tokens).copied().collect();
        let stop =
            StopConditions::new(max_tokens - tokens.len()).with_eos(end_tokens.iter().copied());
        let rest = continue_greedy(target, assistant, &context, &stop)?;
        out.target_forwards += rest.stats.target_forwards;
        out.draft_forwards += rest.stats.draft_forwards;
        tokens.extend(rest.tokens.iter().copied().take_while(|t| !is_end(t)));
    }
    out.tokens = tokens;
    out.time = started.elapsed();
    Ok(out)
}

fn continue_greedy<T: Decoder + ?Sized>(
    target: &mut T,
    assistant: Option<(&mut dyn Decoder, usize)>,
    context: &[u32],
    stop: &StopConditions,
) -> Result<Generation> {
    let mut rng = StdRng::seed_from_u64(0);
    Ok(match assistant {
        Some((draft_model, gamma)) => speculative_generate(
            target,
            draft_model,
            context,
            &SpeculativeConfig {
                draft_length: DraftLength::Fixed(gamma.max(1)),
                ..Default::default()
            },
            stop,
            &mut rng,
            &mut |_| {},
        )?,
        None => generate(
            target,
            context,
            &SamplingConfig::greedy(),
            stop,
            &mut rng,
            &mut |_| {},
        )?,
    })
}
