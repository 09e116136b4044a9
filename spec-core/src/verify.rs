//! Verifying a drafted token tree in one target forward: the forward through the tree's mask,
//! the judging of its rows by an acceptance rule, and the target's cache compacted to the
//! accepted path. [`Verification`] says where the output rows come from (all in the forward,
//! on demand from the hidden states, or with the heads' next guesses in the same pass).

use std::fmt;

use candle_core::{DType, Tensor};
use rand::RngCore;

use crate::acceptance::{Acceptance, SpeculativeSampling, Verdict};
use crate::continuation::forward_after_cached;
use crate::decoder::{Decoder, Forward, LogitRows};
use crate::heads::{check_head_range, check_heads, HiddenStates, TokenHeads};
use crate::logits::Logits;
use crate::sampling::Sampler;
use crate::tree::TokenTree;
use crate::{Error, Result};

/// The outcome of verifying a token tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeVerdict {
    /// Accepted nodes from the root (node 0) down.
    pub path: Vec<usize>,
    /// The target's token after the last accepted node.
    pub next_token: u32,
}

impl TreeVerdict {
    /// The tokens a verified step produces: the accepted nodes' tokens (the root excluded),
    /// then the target's own next token.
    pub fn new_tokens(&self, tree: &TokenTree) -> Vec<u32> {
        self.path[1..]
            .iter()
            .map(|&node| tree.token(node))
            .chain([self.next_token])
            .collect()
    }
}

/// The target's rows after a tree's nodes that a verification looked at, adjusted.
#[derive(Clone, Debug, Default)]
pub struct TreeRows {
    rows: Vec<Option<Vec<f32>>>,
}

impl TreeRows {
    /// The row after `node`, if it was judged (every node of the accepted path but the last
    /// is, and the last is too: it gives the next token).
    pub fn row(&self, node: usize) -> Option<&[f32]> {
        self.rows.get(node)?.as_deref()
    }
}

/// Where a verifying forward's output-layer rows are computed.
#[derive(Clone, Copy, Default)]
pub enum Verification<'a> {
    /// Every tree node's row in the forward: right when the output layer is memory-bound (a
    /// large vocabulary read from memory once serves every row almost for free).
    #[default]
    Batched,
    /// Only the rows the judging reaches, unembedded from the hidden states one by one: a
    /// rejected draft then costs its pass through the layers but not its output row. Right
    /// when the output layer is compute-bound (it fits in the cache, as Whisper's does).
    OnDemand,
    /// Every node's row and, in the same pass over the output layer, the rows of heads
    /// `0..guesses` for every node's state (heads that share the model's output layer,
    /// [`TokenHeads::shares_output_layer`]); those of the last accepted node come back as
    /// [`Verified::guessed`], tokens outside the heads' shortlist at −∞, and the next draft
    /// needs no pass of the heads' own. Right for a small tree where the output layer is
    /// memory-bound, as for Whisper's chain of one.
    WithGuesses {
        heads: &'a dyn TokenHeads,
        guesses: usize,
    },
}

impl fmt::Debug for Verification<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Batched => f.write_str("Batched"),
            Self::OnDemand => f.write_str("OnDemand"),
            Self::WithGuesses { guesses, .. } => f
                .debug_struct("WithGuesses")
                .field("guesses", guesses)
                .finish_non_exhaustive(),
        }
    }
}

/// What one verification found.
#[derive(Clone, Debug)]
pub struct Verified {
    pub verdict: TreeVerdict,
    /// The rows that were judged, adjusted.
    pub judged: TreeRows,
    /// The target's logits after every node when the forward computed them all
    /// ([`Verification::Batched`] and [`Verification::WithGuesses`]: unadjusted; a sampled
    /// chain's: adjusted).
    pub rows: Option<Logits>,
    /// The target's final hidden state after the last accepted node, `[1, hidden]` (the state
    /// that predicted [`TreeVerdict::next_token`]), when it was asked for.
    pub hidden: Option<Tensor>,
    /// The heads' rows for that state ([`Verification::WithGuesses`]), one per head.
    pub guessed: Option<Logits>,
}

impl Verification<'_> {
    /// Fails unless this verification can run on `target`.
    pub fn check<T: HiddenStates + ?Sized>(&self, target: &T) -> Result<()> {
        if let Self::WithGuesses { heads, guesses } = *self {
            if !heads.shares_output_layer() {
                return Err(Error::Unsupported(
                    "guesses in the verification's output pass need heads that share the \
                     model's output layer",
                ));
            }
            check_head_range(&(0..guesses), heads.count())?;
            check_heads(heads, target)?;
        }
        Ok(())
    }

    /// Verifies `tree` (rooted at the last committed token, which the target has not cached)
    /// in one forward, keeps the longest path `rule` accepts and compacts the target's cache
    /// to it: afterwards the cache holds the root and the accepted nodes. `adjust(node, row)`
    /// is applied once to the target's row after `node` before it is judged (Whisper's
    /// suppression and timestamp rules, a repetition penalty), so the kept path is the one
    /// the adjusted greedy decoding takes. With `hidden`, also returns the hidden state after
    /// the accepted path.
    pub fn verify<T: HiddenStates + ?Sized>(
        &self,
        target: &mut T,
        tree: &TokenTree,
        rule: &dyn Acceptance,
        adjust: &mut dyn FnMut(usize, &mut [f32]),
        hidden: bool,
    ) -> Result<Verified> {
        self.check(target)?;
        check_deterministic(rule)?;
        let prefix = target.cached_len();
        let nodes = tree.len();
        let (verdict, judged, rows, guessed) = match *self {
            Self::Batched => {
                let logits = tree_forward(target, tree, LogitRows::All)?;
                let rows = Logits::from_tensor(&logits, nodes, target.vocab_size())?;
                let (verdict, judged) =
                    judge_tree(tree, rule, &mut |node| Ok(rows.row(node).to_vec()), adjust)?;
                (verdict, judged, Some(rows), None)
            }
            Self::OnDemand => {
                tree_forward(target, tree, LogitRows::None)?;
                let states = target.last_hidden()?;
                let model = &*target;
                let mut fetch = |node: usize| -> Result<Vec<f32>> {
                    Ok(model.unembed(&states.narrow(0, node, 1)?)?.into_last_row())
                };
                let (verdict, judged) = judge_tree(tree, rule, &mut fetch, adjust)?;
                (verdict, judged, None, None)
            }
            Self::WithGuesses { heads, guesses } => {
                // One output pass: the tree's rows first, then each node's heads.
                tree_forward(target, tree, LogitRows::None)?;
                let states = target.last_hidden()?;
                let head_states = heads.output_states(&states, 0..guesses)?;
                let all = target.unembed(&Tensor::cat(&[&states, &head_states], 0)?)?;
                let (vocab_size, expected) = (target.vocab_size(), nodes * (1 + guesses));
                if all.len() != expected || all.vocab_size() != vocab_size {
                    return Err(Error::LogitsShape {
                        got: vec![all.len(), all.vocab_size()],
                        expected: format!("[{expected}, {vocab_size}]"),
                    });
                }
                let (verdict, judged) =
                    judge_tree(tree, rule, &mut |node| Ok(all.row(node).to_vec()), adjust)?;
                let last = *verdict.path.last().expect("the path holds the root");
                let first_guess = nodes + last * guesses;
                let mut predicted = Vec::with_capacity(guesses * vocab_size);
                for r in first_guess..first_guess + guesses {
                    extend_on_shortlist(&mut predicted, all.row(r), heads.shortlist());
                }
                let guessed = Logits::from_flat(predicted, vocab_size)?;
                let mut rows = all;
                rows.truncate(nodes);
                (verdict, judged, Some(rows), Some(guessed))
            }
        };
        keep_path(target, prefix, &verdict.path)?;
        // The hidden states are the tree forward's, one per node (compaction does not change
        // them).
        let hidden = match hidden {
            true => {
                let last = *verdict.path.last().expect("the path holds the root");
                Some(hidden_after(target, last)?)
            }
            false => None,
        };
        Ok(Verified {
            verdict,
            judged,
            rows,
            hidden,
            guessed,
        })
    }
}

/// How a verification judges the target's rows after a drafted tree.
pub(crate) enum Judge<'a> {
    /// Node by node, by a deterministic rule: any tree.
    Rule(&'a dyn Acceptance),
    /// By speculative sampling: a chain.
    Sampled(SampledChain<'a>),
}

/// Speculative sampling's view of a drafted chain.
pub(crate) struct SampledChain<'a> {
    pub rule: &'a SpeculativeSampling,
    /// What the target draws with.
    pub sampler: &'a dyn Sampler,
    /// The tokens before the row after the chain's root (the root last).
    pub committed: &'a [u32],
    /// The distribution each drafted token was drawn from.
    pub distributions: &'a [Vec<f32>],
    pub rng: &'a mut dyn RngCore,
}

impl Judge<'_> {
    /// Judges `tree` from `rows`, the target's logits after each of its nodes, each adjusted
    /// once before use (a sampled chain's in place); returns the accepted path, the token after
    /// it and the rows used.
    fn judge(
        self,
        tree: &TokenTree,
        rows: &mut Logits,
        adjust: &mut dyn FnMut(usize, &mut [f32]),
    ) -> Result<(TreeVerdict, TreeRows)> {
        match self {
            Self::Rule(rule) => {
                judge_tree(tree, rule, &mut |node| Ok(rows.row(node).to_vec()), adjust)
            }
            Self::Sampled(chain) => chain.judge(tree, rows, adjust),
        }
    }
}

impl SampledChain<'_> {
    /// The rule's draws against the target's distributions after each node of `chain`.
    fn judge(
        self,
        chain: &TokenTree,
        rows: &mut Logits,
        adjust: &mut dyn FnMut(usize, &mut [f32]),
    ) -> Result<(TreeVerdict, TreeRows)> {
        let nodes = chain.len();
        if chain.max_depth() + 1 != nodes || self.distributions.len() != nodes - 1 {
            return Err(Error::InvalidTree(format!(
                "speculative sampling verifies a chain with one distribution per drafted token; \
                 got {nodes} nodes {} deep and {} distributions",
                chain.max_depth(),
                self.distributions.len()
            )));
        }
        let drafted = &chain.tokens()[1..];
        let mut before = self.committed.to_vec();
        let mut targets = Vec::with_capacity(nodes);
        for node in 0..nodes {
            adjust(node, rows.row_mut(node));
            if node > 0 {
                before.push(drafted[node - 1]);
            }
            targets.push(self.sampler.distribution(&before, rows.row(node))?);
        }
        let Verdict {
            accepted,
            next_token,
        } = self
            .rule
            .verify_distributions(drafted, self.distributions, &targets, self.rng)?;
        let judged = TreeRows {
            rows: (0..nodes)
                .map(|node| (node <= accepted).then(|| rows.row(node).to_vec()))
                .collect(),
        };
        let path = (0..=accepted).collect();
        Ok((TreeVerdict { path, next_token }, judged))
    }
}

/// The first step of [`speculate`](crate::speculate()) when the target's cache already holds
/// exactly `context` and `row` is its logits after it (an encoder–decoder's prompt, forwarded
/// beforehand): the root alone, judged from that row, with no forward.
pub(crate) fn verify_prefilled<T: HiddenStates + ?Sized>(
    target: &T,
    context: &[u32],
    row: Vec<f32>,
    judge: Judge<'_>,
    adjust: &mut dyn FnMut(usize, &mut [f32]),
    hidden: bool,
) -> Result<Verified> {
    if target.cached_tokens() != context || row.len() != target.vocab_size() {
        return Err(Error::InvalidConfig(
            "prefilled logits need the context, and only it, in the target's cache".into(),
        ));
    }
    if let Judge::Rule(rule) = &judge {
        rule.validate()?;
    }
    let root = TokenTree::new(*context.last().ok_or(Error::EmptyInput(
        "the context must hold at least one token",
    ))?);
    let mut rows = Logits::from_flat(row, target.vocab_size())?;
    let (verdict, judged) = judge.judge(&root, &mut rows, adjust)?;
    let hidden = match hidden {
        true => {
            let states = target.last_hidden()?;
            Some(states.narrow(0, states.dim(0)? - 1, 1)?)
        }
        false => None,
    };
    Ok(Verified {
        verdict,
        judged,
        rows: None,
        hidden,
        guessed: None,
    })
}

/// The first step of [`speculate`](crate::speculate()): forwards the part of `context` the
/// target has not cached (its last token always) followed by `chain`'s drafted tokens in one
/// causal pass, which is at once the prefill and the verification of a chain drafted after the
/// context (a previous output, a draft model's first guesses); judges the chain as the later
/// steps do and rolls the cache back to the context and the accepted tokens. A root-only chain
/// is a plain prefill. Returns the verification and the statistics' prompt tokens (those
/// forwarded).
pub(crate) fn verify_with_prefill<T: HiddenStates + ?Sized>(
    target: &mut T,
    context: &[u32],
    chain: &TokenTree,
    judge: Judge<'_>,
    adjust: &mut dyn FnMut(usize, &mut [f32]),
    hidden: bool,
) -> Result<(Verified, usize)> {
    if chain.max_depth() + 1 != chain.len() {
        return Err(Error::InvalidTree(
            "a draft verified with the prefill must be a chain".into(),
        ));
    }
    if let Judge::Rule(rule) = &judge {
        // A root alone is a plain prefill, whatever the rule.
        match chain.len() {
            1 => rule.validate()?,
            _ => check_deterministic(*rule)?,
        }
    }
    let drafted = &chain.tokens()[1..];
    let (mut rows, keep) = forward_after_cached(target, context, drafted)?;
    let (verdict, judged) = judge.judge(chain, &mut rows, adjust)?;
    target.truncate(context.len() + verdict.path.len() - 1)?;
    let hidden = match hidden {
        true => {
            let before = context.len() - 1 - keep;
            let last = *verdict.path.last().expect("the path holds the root");
            Some(hidden_after(target, before + last)?)
        }
        false => None,
    };
    let verified = Verified {
        verdict,
        judged,
        rows: Some(rows),
        hidden,
        guessed: None,
    };
    Ok((verified, context.len() - keep))
}

/// Speculative sampling's verification of a drafted `chain` (rooted at the last committed
/// token, which the target has not cached): one forward, every row adjusted, the rule's draws
/// against the target's distributions, and the cache rolled back to the root and the accepted
/// tokens.
pub(crate) fn verify_sampled_chain<T: HiddenStates + ?Sized>(
    target: &mut T,
    chain: &TokenTree,
    sampled: SampledChain<'_>,
    adjust: &mut dyn FnMut(usize, &mut [f32]),
    hidden: bool,
) -> Result<Verified> {
    let prefix = target.cached_len();
    let logits = tree_forward(target, chain, LogitRows::All)?;
    let mut rows = Logits::from_tensor(&logits, chain.len(), target.vocab_size())?;
    let (verdict, judged) = sampled.judge(chain, &mut rows, adjust)?;
    let accepted = verdict.path.len() - 1;
    target.truncate(prefix + 1 + accepted)?;
    let hidden = match hidden {
        true => Some(hidden_after(target, accepted)?),
        false => None,
    };
    Ok(Verified {
        verdict,
        judged,
        rows: Some(rows),
        hidden,
        guessed: None,
    })
}

/// The target's final hidden state at row `row` of its last forward, `[1, hidden]`.
fn hidden_after<T: HiddenStates + ?Sized>(target: &T, row: usize) -> Result<Tensor> {
    Ok(target.last_hidden()?.narrow(0, row, 1)?)
}

/// Fails unless `rule` is valid and deterministic (trees are judged node by node).
fn check_deterministic(rule: &dyn Acceptance) -> Result<()> {
    rule.validate()?;
    if rule.is_stochastic() {
        return Err(Error::Unsupported(
            "token trees are verified with deterministic rules (greedy, top-k, threshold, biased)",
        ));
    }
    Ok(())
}

/// Appends `row` to `rows`, with every token outside `shortlist` (when there is one) at −∞
/// (tokens past the row's end are ignored).
pub(crate) fn extend_on_shortlist(rows: &mut Vec<f32>, row: &[f32], shortlist: Option<&[u32]>) {
    let Some(shortlist) = shortlist else {
        rows.extend_from_slice(row);
        return;
    };
    let start = rows.len();
    rows.resize(start + row.len(), f32::NEG_INFINITY);
    let masked = &mut rows[start..];
    for &token in shortlist {
        if let (Some(slot), Some(&logit)) =
            (masked.get_mut(token as usize), row.get(token as usize))
        {
            *slot = logit;
        }
    }
}

/// Forwards `tree` after the target's cache (which must not hold its root yet) through its
/// tree mask, returning the logit rows asked for.
fn tree_forward<T: Decoder + ?Sized>(
    target: &mut T,
    tree: &TokenTree,
    logits: LogitRows,
) -> Result<Tensor> {
    let prefix = target.cached_len();
    let bias = tree.attention_bias(prefix, DType::F32, target.device())?;
    let positions = tree.position_ids(prefix);
    let step = Forward {
        logits,
        ..Forward::tokens(tree.tokens(), &positions).with_mask(&bias)
    };
    target.forward(&step)
}

/// Compacts the target's cache (`prefix` positions before the tree) to the accepted path.
fn keep_path<T: Decoder + ?Sized>(target: &mut T, prefix: usize, path: &[usize]) -> Result<()> {
    let kept: Vec<usize> = path.iter().map(|&node| prefix + node).collect();
    target.keep_positions(&kept)
}

/// Judges `tree` with rows fetched on demand (`fetch(node)`: the target's logits after
/// `node`), each adjusted once before use; returns the longest accepted path, the token after
/// it and the rows used.
fn judge_tree(
    tree: &TokenTree,
    rule: &dyn Acceptance,
    fetch: &mut dyn FnMut(usize) -> Result<Vec<f32>>,
    adjust: &mut dyn FnMut(usize, &mut [f32]),
) -> Result<(TreeVerdict, TreeRows)> {
    let mut rows = TreeRows {
        rows: vec![None; tree.len()],
    };
    let mut failure = None;
    let mut ensure = |rows: &mut TreeRows, node: usize| -> bool {
        if rows.rows[node].is_none() {
            match fetch(node) {
                Ok(mut row) => {
                    adjust(node, &mut row);
                    rows.rows[node] = Some(row);
                }
                Err(e) => {
                    failure.get_or_insert(e);
                    return false;
                }
            }
        }
        true
    };
    let path = tree.longest_path_where(|parent, child| {
        ensure(&mut rows, parent)
            && rule.judge(tree.token(child), rows.row(parent).expect("fetched")) == Some(true)
    });
    let last = *path.last().expect("the path holds the root");
    ensure(&mut rows, last);
    if let Some(e) = failure {
        return Err(e);
    }
    let next_token = rule.correction(rows.row(last).expect("fetched"));
    Ok((TreeVerdict { path, next_token }, rows))
}
