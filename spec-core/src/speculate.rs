//! The one speculation loop: each step a [`TreeDrafter`] proposes a token tree after the
//! committed tokens, the target verifies it in one forward ([`Verification`]) and keeps the
//! longest path the acceptance rule allows, then its own next token. Every method is a drafter
//! (a draft model, prediction heads, lookup, Jacobi iteration, SpecASR's trees, a previous
//! output); the loop is the same for the chat model and Whisper, greedy or sampled.

use std::time::Instant;

use rand::RngCore;

use crate::acceptance::{Acceptance, AcceptanceRule, SpeculativeSampling};
use crate::decoder::common_prefix_len;
use crate::draft::{reborrow, DraftInput, TreeDraft, TreeDrafter};
use crate::generate::{Generation, Output, StepLimits, StopConditions};
use crate::heads::HiddenStates;
use crate::sampling::Sampler;
use crate::stats::{DecodeStats, StepRecord};
use crate::tree::TokenTree;
use crate::verify::{
    verify_prefilled, verify_sampled_chain, verify_with_prefill, Judge, SampledChain, Verification,
    Verified,
};
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
    /// How the target draws its tokens, for a stochastic rule (speculative sampling): each
    /// drafted chain is verified against the distributions its tokens were drawn from
    /// ([`TreeDraft::distributions`]), and the target's own tokens are drawn from this
    /// sampler's distribution of its (adjusted) rows.
    pub sampling: Option<&'a dyn Sampler>,
    /// The run's randomness: for a stochastic rule, and for drafters that draw from it.
    pub rng: Option<&'a mut dyn RngCore>,
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
            sampling: None,
            rng: None,
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
/// is exactly that of greedy [`generate`](crate::generate()) (with the same `adjust`); with
/// speculative sampling (chains only) it follows the target's sampling distribution.
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
        sampling,
        mut rng,
    } = speculation;
    rule.validate()?;
    let sampled: Option<(&SpeculativeSampling, &dyn Sampler)> = match (rule, sampling) {
        (rule, _) if !rule.is_stochastic() => None,
        (AcceptanceRule::SpeculativeSampling(rule), Some(sampler))
            if rng.is_some() && matches!(verification, Verification::Batched) =>
        {
            sampler.validate()?;
            Some((rule, sampler))
        }
        _ => {
            return Err(Error::Unsupported(
                "token trees are verified with deterministic rules (greedy, top-k, threshold, \
                 biased); speculative sampling verifies chains, with a sampler, randomness and \
                 every row in the forward",
            ))
        }
    };
    verification.check(target)?;
    let reads_hidden = drafter.reads_hidden();
    let started = Instant::now();
    let mut stats = DecodeStats::default();
    let mut out = Output::new(stop, on_token);
    let mut committed = context.to_vec();
    let mut hidden = None;
    let mut guessed = None;
    if out.finish.is_none() {
        let root = *context.last().ok_or(Error::EmptyInput(
            "the context must hold at least one token",
        ))?;
        let t_verify;
        let (chain, verified) = match prefilled {
            Some(row) => {
                t_verify = Instant::now();
                let root_only = TreeDraft::new(TokenTree::new(root), 0);
                let verified = verify_prefilled(
                    target,
                    context,
                    row,
                    judgement(sampled, rule, &committed, &root_only, reborrow(&mut rng)),
                    &mut node_adjustment(&mut adjust, &committed, &root_only.tree),
                    reads_hidden,
                )?;
                (root_only.tree, verified)
            }
            None => {
                // The prefill, with the drafter's chain after the context when it drafts one.
                let draft = match drafter.drafts_with_prefill() {
                    true => {
                        let keep = common_prefix_len(target.cached_tokens(), context)
                            .min(context.len() - 1);
                        let room = target.max_len().saturating_sub(context.len());
                        // A previous output may fill the budget (its last row then goes
                        // unused).
                        let max_depth = stop.max_new_tokens.min(room);
                        let t_draft = Instant::now();
                        let draft = drafter.draft_tree(DraftInput {
                            committed: &committed,
                            context_len: context.len(),
                            max_depth,
                            forwarded_before: context.len() - 1 - keep,
                            hidden: None,
                            guessed: None,
                            rng: reborrow(&mut rng),
                        })?;
                        stats.draft_time += t_draft.elapsed();
                        stats.draft_forwards += draft.forwards;
                        check_draft(&draft.tree, root, max_depth)?;
                        draft
                    }
                    false => TreeDraft::new(TokenTree::new(root), 0),
                };
                t_verify = Instant::now();
                let (verified, forwarded) = verify_with_prefill(
                    target,
                    context,
                    &draft.tree,
                    judgement(sampled, rule, &committed, &draft, reborrow(&mut rng)),
                    &mut node_adjustment(&mut adjust, &committed, &draft.tree),
                    reads_hidden,
                )?;
                stats.target_forwards += 1;
                stats.prompt_tokens += forwarded;
                (draft.tree, verified)
            }
        };
        stats.target_time += t_verify.elapsed();
        if chain.len() > 1 {
            stats.steps.push(StepRecord {
                drafted: chain.len() - 1,
                accepted: verified.verdict.path.len() - 1,
            });
            drafter.observe(&chain, &verified)?;
        }
        let cached = context.len() - 1;
        commit(
            &mut out,
            target,
            &mut committed,
            cached,
            &chain,
            &verified,
            &mut on_row,
        )?;
        hidden = verified.hidden;
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
            forwarded_before: 0,
            hidden: hidden.as_ref(),
            guessed: guessed.take(),
            rng: reborrow(&mut rng),
        })?;
        stats.draft_time += t_draft.elapsed();
        stats.draft_forwards += draft.forwards;
        let tree = &draft.tree;
        check_draft(
            tree,
            *committed.last().expect("a token was produced"),
            max_depth,
        )?;

        let t_verify = Instant::now();
        let mut adjust_node = node_adjustment(&mut adjust, &committed, tree);
        let verified = match judgement(sampled, rule, &committed, &draft, reborrow(&mut rng)) {
            Judge::Sampled(chain) => {
                verify_sampled_chain(target, tree, chain, &mut adjust_node, reads_hidden)?
            }
            Judge::Rule(rule) => {
                verification.verify(target, tree, rule, &mut adjust_node, reads_hidden)?
            }
        };
        drop(adjust_node);
        stats.target_time += t_verify.elapsed();
        stats.target_forwards += 1;
        stats.steps.push(StepRecord {
            drafted: tree.len() - 1,
            accepted: verified.verdict.path.len() - 1,
        });
        drafter.observe(tree, &verified)?;
        commit(
            &mut out,
            target,
            &mut committed,
            cached,
            tree,
            &verified,
            &mut on_row,
        )?;
        hidden = verified.hidden;
        guessed = verified.guessed;
    }
    drafter.finish(&committed)?;
    Ok(out.into_generation(stats, started))
}

/// How a draft's rows are judged: by speculative sampling when the run samples, otherwise by
/// the draft's own rule or the run's.
fn judgement<'a>(
    sampled: Option<(&'a SpeculativeSampling, &'a dyn Sampler)>,
    rule: &'a AcceptanceRule,
    committed: &'a [u32],
    draft: &'a TreeDraft,
    rng: Option<&'a mut dyn RngCore>,
) -> Judge<'a> {
    match (sampled, rng) {
        (Some((rule, sampler)), Some(rng)) => Judge::Sampled(SampledChain {
            rule,
            sampler,
            committed,
            distributions: &draft.distributions,
            rng,
        }),
        _ => Judge::Rule(draft.rule.as_ref().unwrap_or(rule)),
    }
}

/// `adjust` applied to the row after a node of `tree` (rooted after `committed`), given the
/// tokens before that row; nothing without an adjustment.
fn node_adjustment<'a, 'b>(
    adjust: &'a mut Option<AdjustLogits<'b>>,
    committed: &'a [u32],
    tree: &'a TokenTree,
) -> impl FnMut(usize, &mut [f32]) + use<'a, 'b> {
    move |node, row| {
        if let Some(adjust) = adjust.as_mut() {
            let before: Vec<u32> = committed
                .iter()
                .copied()
                .chain(tree.path_to(node)[1..].iter().map(|&n| tree.token(n)))
                .collect();
            adjust(&before, row);
        }
    }
}

/// Emits a verified step's tokens (the target's cache held `cached` positions before the
/// tree's root) and hands each emitted token to `on_row` with the row it was chosen from.
fn commit<T: HiddenStates + ?Sized>(
    out: &mut Output<'_>,
    target: &mut T,
    committed: &mut Vec<u32>,
    cached: usize,
    tree: &TokenTree,
    verified: &Verified,
    on_row: &mut Option<OnRow<'_>>,
) -> Result<()> {
    let new_tokens = verified.verdict.new_tokens(tree);
    let emitted = out.commit_step(target, committed, cached, &new_tokens)?;
    if let Some(on_row) = on_row.as_mut() {
        // Each produced token was chosen from the row after the node before it.
        for (&token, &node) in new_tokens[..emitted].iter().zip(&verified.verdict.path) {
            on_row(token, verified.judged.row(node).expect("a judged row"));
        }
    }
    Ok(())
}

/// Fails unless `tree` is rooted at `root` and no deeper than `max_depth`.
fn check_draft(tree: &TokenTree, root: u32, max_depth: usize) -> Result<()> {
    if tree.token(0) != root {
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
    Ok(())
}
