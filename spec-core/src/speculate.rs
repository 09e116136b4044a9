//! The one speculation loop: each step a [`TreeDrafter`] proposes a token tree after the
//! committed tokens, the target verifies it in one forward ([`Verification`]) and keeps the
//! longest path the acceptance rule allows, then its own next token. Every method is a drafter
//! (a draft model, prediction heads, lookup, Jacobi iteration, SpecASR's trees); the loop is
//! the same for the chat model and Whisper.

use std::time::Instant;

use crate::acceptance::{Acceptance, AcceptanceRule};
use crate::draft::{DraftInput, TreeDrafter};
use crate::generate::{prefill, Generation, Output, StepLimits, StopConditions};
use crate::heads::HiddenStates;
use crate::stats::{DecodeStats, StepRecord};
use crate::verify::Verification;
use crate::{Error, Result};

/// Adjusts the target's logits after `tokens` (the context and the tokens before the row)
/// before a token is chosen from them.
pub type AdjustLogits<'a> = &'a mut dyn FnMut(&[u32], &mut [f32]);

/// Sees each produced token with the (adjusted) row it was chosen from.
pub type OnRow<'a> = &'a mut dyn FnMut(u32, &[f32]);

/// How [`speculate`] verifies and what it reports besides the tokens.
pub struct Speculation<'a> {
    /// Which drafted tokens are kept, and the token after them.
    pub rule: &'a AcceptanceRule,
    /// Where the verification's output rows come from.
    pub verification: Verification<'a>,
    /// Applied to every row before it is judged or a token is chosen from it (Whisper's
    /// suppression and timestamp rules): the kept tokens are those the adjusted greedy
    /// decoding produces.
    pub adjust: Option<AdjustLogits<'a>>,
    /// Called with each produced token and the (adjusted) row it was chosen from, e.g. to sum
    /// log-probabilities.
    pub on_row: Option<OnRow<'a>>,
    /// The target's logits after the context, when its cache already holds exactly the
    /// context (an encoder–decoder's prompt forwarded beforehand): no prefill is run.
    pub prefilled: Option<Vec<f32>>,
}

impl<'a> Speculation<'a> {
    /// Verification of every row in the forward, under `rule`, with nothing else.
    pub fn new(rule: &'a AcceptanceRule) -> Self {
        Self {
            rule,
            verification: Verification::Batched,
            adjust: None,
            on_row: None,
            prefilled: None,
        }
    }

    /// The same with `verification`.
    pub fn verified(mut self, verification: Verification<'a>) -> Self {
        self.verification = verification;
        self
    }
}

/// Token-tree speculative decoding with any drafter: each step the drafter proposes a tree
/// after the committed tokens, the target verifies it in one forward and keeps the longest
/// path the rule accepts, then its own next token. With [`AcceptanceRule::Greedy`] the output
/// is exactly that of greedy [`generate`](crate::generate()) (with the same `adjust`).
pub fn speculate<T: HiddenStates + ?Sized>(
    target: &mut T,
    drafter: &mut dyn TreeDrafter,
    context: &[u32],
    speculation: Speculation<'_>,
    stop: &StopConditions,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation> {
    let Speculation {
        rule,
        verification,
        mut adjust,
        mut on_row,
        prefilled,
    } = speculation;
    rule.validate()?;
    if rule.is_stochastic() {
        return Err(Error::Unsupported(
            "token trees are verified with deterministic rules (greedy, top-k, threshold, biased)",
        ));
    }
    verification.check(target)?;
    let reads_hidden = drafter.reads_hidden();
    let started = Instant::now();
    let mut stats = DecodeStats::default();
    let mut out = Output::new(stop, on_token);
    let mut committed = context.to_vec();
    let mut hidden = None;
    let mut guessed = None;
    if out.finish.is_none() {
        let mut row = match prefilled {
            Some(row) if target.cached_tokens() == context && row.len() == target.vocab_size() => {
                row
            }
            Some(_) => {
                return Err(Error::InvalidConfig(
                    "prefilled logits need the context, and only it, in the target's cache".into(),
                ))
            }
            None => prefill(target, context, &mut stats)?,
        };
        if let Some(adjust) = adjust.as_mut() {
            adjust(&committed, &mut row);
        }
        let token = rule.correction(&row);
        committed.push(token);
        if out.emit([token]) == 1 {
            if let Some(on_row) = on_row.as_mut() {
                on_row(token, &row);
            }
        }
        if reads_hidden {
            let states = target.last_hidden()?;
            hidden = Some(states.narrow(0, states.dim(0)? - 1, 1)?);
        }
    }
    while let Some(StepLimits {
        cached,
        room,
        remaining,
    }) = out.next_step(target)
    {
        let max_depth = remaining.saturating_sub(1).min(room - 1);
        let t_draft = Instant::now();
        let draft = drafter.draft_tree(DraftInput {
            committed: &committed,
            context_len: context.len(),
            max_depth,
            hidden: hidden.as_ref(),
            guessed: guessed.take(),
        })?;
        stats.draft_time += t_draft.elapsed();
        stats.draft_forwards += draft.forwards;
        let tree = draft.tree;
        if tree.token(0) != *committed.last().expect("a token was produced") {
            return Err(Error::InvalidTree(
                "the drafted tree's root is not the last committed token".into(),
            ));
        }
        if tree.max_depth() > max_depth {
            return Err(Error::InvalidTree(format!(
                "the drafted tree is {} deep, the step allows {max_depth}",
                tree.max_depth()
            )));
        }

        let t_verify = Instant::now();
        let mut no_adjust = |_: usize, _: &mut [f32]| {};
        let mut adjust_node;
        let adjust_row: &mut dyn FnMut(usize, &mut [f32]) = match adjust.as_mut() {
            Some(adjust) => {
                adjust_node = |node: usize, row: &mut [f32]| {
                    let before: Vec<u32> = committed
                        .iter()
                        .copied()
                        .chain(tree.path_to(node)[1..].iter().map(|&n| tree.token(n)))
                        .collect();
                    adjust(&before, row);
                };
                &mut adjust_node
            }
            None => &mut no_adjust,
        };
        let verified = verification.verify(target, &tree, rule, adjust_row, reads_hidden)?;
        stats.target_time += t_verify.elapsed();
        stats.target_forwards += 1;
        stats.steps.push(StepRecord {
            drafted: tree.len() - 1,
            accepted: verified.verdict.path.len() - 1,
        });
        drafter.observe(&tree, &verified)?;
        let new_tokens = verified.verdict.new_tokens(&tree);
        let emitted = out.commit_step(target, &mut committed, cached, &new_tokens)?;
        if let Some(on_row) = on_row.as_mut() {
            // Each produced token was chosen from the row after the node before it.
            for (&token, &node) in new_tokens[..emitted].iter().zip(&verified.verdict.path) {
                on_row(token, verified.judged.row(node).expect("a judged row"));
            }
        }
        hidden = verified.hidden;
        guessed = verified.guessed;
    }
    drafter.finish(&committed)?;
    Ok(out.into_generation(stats, started))
}
