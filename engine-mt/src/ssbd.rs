//! Self-Speculative Biased Decoding (Zeng et al., Algorithm 1) on any [`Decoder`].
//!
//! The previous translation is the draft for the new source. One forward over the new part of
//! the prompt followed by the draft gives the target's distribution P at every draft position;
//! each draft token is kept while it is the argmax of P' = (1 − β)·P + β·onehot(draft token)
//! (the paper's biased verification; β = 0 is plain greedy verification), the first token where
//! they differ is the target's own (already the correction), the cache is rolled back to the
//! accepted prefix, and decoding goes on greedily ([`Continuation`]): one token per forward, or
//! with drafts checked greedily, from the rest of the previous output or from a small model.
//! It is one run of `spec_core::speculate`: the previous output is a drafter verified with the
//! prefill, whose draft carries the biased rule, and the continuation's drafts follow it.

use std::cmp::Ordering;
use std::time::{Duration, Instant};

use spec_core::sampling::{argmax, softmax};
use spec_core::{
    speculate, AcceptanceRule, Decoder, DraftInput, DraftLength, DraftModelDrafter, FinishReason,
    HiddenStates, LookupDrafter, PreviousOutput, Speculation, StopConditions, TokenTree, TreeDraft,
    TreeDrafter, Verified,
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
/// described in the module documentation, and `continuation` after the divergence: one
/// [`speculate`](spec_core::speculate()) run whose drafter offers the previous output from the
/// prefill on, judged with the bias, then the continuation's drafts, judged greedily. With
/// β = 0 the result is exactly the target's greedy output, whatever the draft and continuation.
pub fn decode_update<T: HiddenStates + ?Sized>(
    target: &mut T,
    continuation: Continuation<'_>,
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
    let (previous, beta) = match decoding {
        Decoding::Ssbd { beta } if !draft.is_empty() => {
            let bias = AcceptanceRule::biased(*beta);
            bias.validate()?;
            (Some((PreviousOutput::new(draft.to_vec()), bias)), *beta)
        }
        _ => (None, 0.0),
    };
    let mut drafter = UpdateDrafter {
        previous,
        next: match continuation {
            Continuation::Greedy => After::Greedy,
            Continuation::Lookup(lookup) => After::Lookup(lookup),
            Continuation::Assistant { gamma: 0, .. } => After::Greedy,
            Continuation::Assistant { model, gamma } => After::Assistant(Box::new(
                DraftModelDrafter::greedy(model, DraftLength::Fixed(gamma))?,
            )),
        },
        first: true,
        from_previous: false,
        context_len: prompt.len(),
        guess: Vec::new(),
        counts: UpdateDecode::default(),
    };
    // Each output token's probability P under the target, and whether it was the argmax.
    let mut chosen: Vec<(f32, bool)> = Vec::new();
    let on_row = &mut |token: u32, row: &[f32]| {
        chosen.push((softmax(row)[token as usize], argmax(row) == token));
    };
    let greedy = AcceptanceRule::greedy();
    let speculation = Speculation {
        on_row: Some(on_row),
        ..Speculation::new(&greedy)
    };
    let stop = StopConditions::new(max_tokens).with_eos(end_tokens.iter().copied());
    let generation = speculate(
        target,
        &mut drafter,
        prompt,
        speculation,
        &stop,
        &mut |_| {},
    )?;
    let mut out = drafter.counts;
    out.tokens = generation.tokens;
    if generation.finish == FinishReason::Eos {
        out.tokens.pop();
    }
    // An end token inside the kept draft ends the output there.
    out.accepted = out.accepted.min(out.tokens.len());
    for (i, &(p, own)) in chosen.iter().take(out.tokens.len()).enumerate() {
        out.confidence.push(match i.cmp(&out.accepted) {
            Ordering::Less => {
                out.forced += usize::from(!own);
                (1.0 - beta) * p + beta
            }
            // The target's token where the draft was rejected.
            Ordering::Equal if out.accepted < out.drafted => (1.0 - beta) * p,
            _ => p,
        });
    }
    out.target_forwards = generation.stats.target_forwards;
    out.draft_forwards = generation.stats.draft_forwards;
    out.time = started.elapsed();
    Ok(out)
}

/// How the tokens after the previous output are drafted.
enum After<'a> {
    Greedy,
    Lookup(&'a mut LookupDrafter),
    Assistant(Box<DraftModelDrafter<&'a mut dyn Decoder>>),
}

/// The drafts of one update: the previous output with the prefill, judged with the bias, then
/// the continuation's, judged greedily; it counts both.
struct UpdateDrafter<'a> {
    previous: Option<(PreviousOutput, AcceptanceRule)>,
    next: After<'a>,
    /// The next draft is the first (verified with the prefill).
    first: bool,
    /// The last draft was the previous output.
    from_previous: bool,
    context_len: usize,
    /// The last verification's guess of the token after the next one (Jacobi iteration).
    guess: Vec<u32>,
    counts: UpdateDecode,
}

impl TreeDrafter for UpdateDrafter<'_> {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> spec_core::Result<TreeDraft> {
        let first = std::mem::replace(&mut self.first, false);
        if let (true, Some((previous, bias))) = (first, self.previous.as_mut()) {
            self.from_previous = true;
            let draft = previous.draft_tree(input)?;
            return Ok(TreeDraft {
                rule: Some(*bias),
                ..draft
            });
        }
        self.from_previous = false;
        let root = input.root()?;
        let produced = input.produced();
        match &mut self.next {
            After::Greedy => Ok(TreeDraft::new(TokenTree::new(root), 0)),
            // Looked up in the output only: a match in the prompt's template or source words
            // rarely continues into the translation.
            After::Lookup(_) if produced.is_empty() => Ok(TreeDraft::new(TokenTree::new(root), 0)),
            After::Lookup(lookup) => {
                // With no guess from the last forward, the next token repeated starts the
                // iteration (the row after it guesses the token after that).
                match self.guess.is_empty() {
                    true => lookup.offer_probe(root),
                    false => lookup.offer_guess(std::mem::take(&mut self.guess)),
                }
                lookup.draft_tree(DraftInput::new(produced, input.max_depth))
            }
            After::Assistant(assistant) => assistant.draft_tree(input),
        }
    }

    /// SSBD's counters, and the target's own guess of the token after its next one: its argmax
    /// at the row after the first rejected node.
    fn observe(&mut self, tree: &TokenTree, verified: &Verified) -> spec_core::Result<()> {
        let (drafted, accepted) = (tree.len() - 1, verified.verdict.path.len() - 1);
        if self.from_previous {
            self.counts.drafted = drafted;
            self.counts.accepted = accepted;
        } else {
            self.counts.continuation_drafted += drafted;
            self.counts.continuation_accepted += accepted;
        }
        self.guess = match &verified.rows {
            Some(rows) if accepted + 1 < tree.len() => vec![argmax(rows.row(accepted + 1))],
            _ => Vec::new(),
        };
        if let After::Assistant(assistant) = &mut self.next {
            assistant.observe(tree, verified)?;
        }
        Ok(())
    }

    fn drafts_with_prefill(&self) -> bool {
        true
    }

    fn finish(&mut self, committed: &[u32]) -> spec_core::Result<()> {
        match &mut self.next {
            After::Greedy => Ok(()),
            After::Lookup(lookup) => lookup.finish(&committed[self.context_len..]),
            After::Assistant(assistant) => assistant.finish(committed),
        }
    }
}
