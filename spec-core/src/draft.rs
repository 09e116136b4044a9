//! The draft side of speculation: keeping a draft model's cache in step with the committed
//! tokens, and drafting token trees.

use std::fmt;

use candle_core::Tensor;
use rand::RngCore;

use crate::acceptance::AcceptanceRule;
use crate::decoder::{common_prefix_len, forward_tokens, rewind_to_prefix, Decoder, LogitRows};
use crate::logits::Logits;
use crate::sampling::{argmax, max_probability, top_k_tokens};
use crate::tree::TokenTree;
use crate::verify::Verified;
use crate::{Error, Result};

/// Brings a draft model's cache in line with `committed`: rolls back what is not a prefix of
/// it, forwards the missing tokens, and returns the logits that predict the next token.
pub fn catch_up<D: Decoder + ?Sized>(model: &mut D, committed: &[u32]) -> Result<Vec<f32>> {
    if committed.is_empty() {
        return Err(Error::EmptyInput(
            "the draft needs at least one committed token",
        ));
    }
    let keep = rewind_to_prefix(model, committed)?;
    Ok(forward_tokens(model, &committed[keep..], LogitRows::Last(1))?.into_last_row())
}

/// Forwards one drafted token and returns the logits after it.
pub fn advance<D: Decoder + ?Sized>(model: &mut D, token: u32) -> Result<Vec<f32>> {
    Ok(forward_tokens(model, &[token], LogitRows::Last(1))?.into_last_row())
}

/// Picks a chain's next token from the draft's row, given the tokens drafted before it, and
/// says whether the chain ends with it.
pub type PickToken<'a> = &'a mut dyn FnMut(&[u32], Vec<f32>) -> Result<(u32, bool)>;

/// Drafts a chain with `model` after `committed` (its cache caught up first): at most `depth`
/// tokens, each picked by `pick` from the draft's row after the tokens drafted before it,
/// `pick` also saying whether the chain ends there. The draft's cache then holds `committed`
/// and every drafted token but the last. Returns the tokens and the draft forwards.
pub fn draft_chain<D: Decoder + ?Sized>(
    model: &mut D,
    committed: &[u32],
    depth: usize,
    pick: PickToken<'_>,
) -> Result<(Vec<u32>, usize)> {
    let mut drafted = Vec::with_capacity(depth);
    if depth == 0 {
        return Ok((drafted, 0));
    }
    let mut row = catch_up(model, committed)?;
    let mut forwards = 1;
    loop {
        let (token, last) = pick(&drafted, row)?;
        drafted.push(token);
        if last || drafted.len() == depth {
            return Ok((drafted, forwards));
        }
        row = advance(model, token)?;
        forwards += 1;
    }
}

/// A token tree drafted for one verification step, with the draft passes it cost.
#[derive(Clone, Debug)]
pub struct TreeDraft {
    pub tree: TokenTree,
    pub forwards: usize,
    /// For speculative sampling: the distribution each drafted token of a chain was drawn
    /// from, one per drafted token; empty for drafts judged by deterministic rules.
    pub distributions: Vec<Vec<f32>>,
    /// The deterministic rule this draft is judged by, when not the run's (SSBD's bias trusts
    /// a previous output more than a fresh guess).
    pub rule: Option<AcceptanceRule>,
}

impl TreeDraft {
    /// A draft judged by the run's deterministic rule.
    pub fn new(tree: TokenTree, forwards: usize) -> Self {
        Self {
            tree,
            forwards,
            distributions: Vec::new(),
            rule: None,
        }
    }
}

/// What a drafter is given each step.
pub struct DraftInput<'a> {
    /// The context and every token produced after it; the last is the tree's root (the
    /// target's next input, not in its cache yet).
    pub committed: &'a [u32],
    /// How many tokens of `committed` are the context (the produced ones follow).
    pub context_len: usize,
    /// Deepest node the tree may have.
    pub max_depth: usize,
    /// Tokens the verifying forward carries before the tree's root: on the first step of a
    /// drafter that drafts with the prefill ([`TreeDrafter::drafts_with_prefill`]), the
    /// context's uncached tokens; 0 otherwise. The forward has `forwarded_before + tree.len()`
    /// rows.
    pub forwarded_before: usize,
    /// The target's final hidden state that predicted the root, `[1, hidden]`, for drafters
    /// that read it ([`TreeDrafter::reads_hidden`]).
    pub hidden: Option<&'a Tensor>,
    /// The heads' rows for that state, when the last verification computed them
    /// ([`Verification::WithGuesses`](crate::Verification::WithGuesses)).
    pub guessed: Option<Logits>,
    /// The loop's randomness, when it has one (a drafter that samples its tokens or explores
    /// its draft length draws from it, so that a seed fixes the whole run).
    pub rng: Option<&'a mut dyn RngCore>,
}

impl fmt::Debug for DraftInput<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DraftInput")
            .field("committed", &self.committed)
            .field("context_len", &self.context_len)
            .field("max_depth", &self.max_depth)
            .field("forwarded_before", &self.forwarded_before)
            .field("hidden", &self.hidden.map(Tensor::shape))
            .field("guessed", &self.guessed.as_ref().map(Logits::len))
            .finish_non_exhaustive()
    }
}

impl<'a> DraftInput<'a> {
    /// A request for a tree after `committed` (all of it context) no deeper than `max_depth`,
    /// with no hidden state.
    pub fn new(committed: &'a [u32], max_depth: usize) -> Self {
        Self {
            committed,
            context_len: committed.len(),
            max_depth,
            forwarded_before: 0,
            hidden: None,
            guessed: None,
            rng: None,
        }
    }

    /// The tree's root: the last committed token.
    pub fn root(&self) -> Result<u32> {
        self.committed
            .last()
            .copied()
            .ok_or(Error::EmptyInput("a tree needs a committed root token"))
    }

    /// This request for another drafter of the same step: the same tokens, limits and hidden
    /// state, the randomness lent, the heads' guesses taken (they serve one drafter).
    pub fn lend(&mut self) -> DraftInput<'_> {
        DraftInput {
            committed: self.committed,
            context_len: self.context_len,
            max_depth: self.max_depth,
            forwarded_before: self.forwarded_before,
            hidden: self.hidden,
            guessed: self.guessed.take(),
            rng: reborrow(&mut self.rng),
        }
    }

    /// The tokens produced after the context.
    pub fn produced(&self) -> &'a [u32] {
        &self.committed[self.context_len.min(self.committed.len())..]
    }
}

/// Anything that proposes token trees: a draft model, extra prediction heads, a cache of
/// earlier outputs, the model's own previous guesses (Jacobi iteration). A speculation method
/// is a drafter: [`speculate`](crate::speculate()) is the loop that verifies its trees.
pub trait TreeDrafter {
    /// Proposes a tree rooted at `input.committed`'s last token no deeper than
    /// `input.max_depth`.
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft>;

    /// True when the drafter reads the target's hidden state ([`DraftInput::hidden`]).
    fn reads_hidden(&self) -> bool {
        false
    }

    /// True when the drafter proposes a chain after the context itself, verified in the
    /// prefill's forward (a previous output: the prefill of a changed prompt is at once the
    /// verification of what followed it). Otherwise the first draft comes after the target's
    /// first token.
    fn drafts_with_prefill(&self) -> bool {
        false
    }

    /// Sees what the target made of the tree just drafted, for drafters that learn from the
    /// verification. Nothing by default.
    fn observe(&mut self, tree: &TokenTree, verified: &Verified) -> Result<()> {
        let _ = (tree, verified);
        Ok(())
    }

    /// Called when generation ends with the final committed tokens, to drop draft state that
    /// is not a prefix of them.
    fn finish(&mut self, committed: &[u32]) -> Result<()>;
}

impl<D: TreeDrafter + ?Sized> TreeDrafter for &mut D {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        (**self).draft_tree(input)
    }
    fn reads_hidden(&self) -> bool {
        (**self).reads_hidden()
    }
    fn drafts_with_prefill(&self) -> bool {
        (**self).drafts_with_prefill()
    }
    fn observe(&mut self, tree: &TokenTree, verified: &Verified) -> Result<()> {
        (**self).observe(tree, verified)
    }
    fn finish(&mut self, committed: &[u32]) -> Result<()> {
        (**self).finish(committed)
    }
}

/// No drafter drafts nothing (a tree of its root alone): an optional companion of a
/// [`MergedDrafter`].
impl<D: TreeDrafter> TreeDrafter for Option<D> {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        match self {
            Some(drafter) => drafter.draft_tree(input),
            None => Ok(TreeDraft::new(TokenTree::new(input.root()?), 0)),
        }
    }
    fn reads_hidden(&self) -> bool {
        self.as_ref().is_some_and(D::reads_hidden)
    }
    fn drafts_with_prefill(&self) -> bool {
        self.as_ref().is_some_and(D::drafts_with_prefill)
    }
    fn observe(&mut self, tree: &TokenTree, verified: &Verified) -> Result<()> {
        match self {
            Some(drafter) => drafter.observe(tree, verified),
            None => Ok(()),
        }
    }
    fn finish(&mut self, committed: &[u32]) -> Result<()> {
        match self {
            Some(drafter) => drafter.finish(committed),
            None => Ok(()),
        }
    }
}

/// Two drafters' trees merged into one and verified in one forward (e.g. heads' guesses and a
/// chain copied by a [`LookupDrafter`](crate::LookupDrafter): right at different places). The
/// heads' guesses of a verification go to the first.
#[derive(Debug)]
pub struct MergedDrafter<A, B> {
    pub first: A,
    pub second: B,
}

impl<A: TreeDrafter, B: TreeDrafter> TreeDrafter for MergedDrafter<A, B> {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        let mut input = input;
        let mut draft = self.first.draft_tree(input.lend())?;
        let other = self.second.draft_tree(input)?;
        draft.tree.merge(&other.tree)?;
        draft.forwards += other.forwards;
        Ok(draft)
    }
    fn reads_hidden(&self) -> bool {
        self.first.reads_hidden() || self.second.reads_hidden()
    }
    /// Only when both do: the first step's merged tree must be a chain verified without a
    /// hidden state.
    fn drafts_with_prefill(&self) -> bool {
        self.first.drafts_with_prefill() && self.second.drafts_with_prefill()
    }
    fn observe(&mut self, tree: &TokenTree, verified: &Verified) -> Result<()> {
        self.first.observe(tree, verified)?;
        self.second.observe(tree, verified)
    }
    fn finish(&mut self, committed: &[u32]) -> Result<()> {
        self.first.finish(committed)?;
        self.second.finish(committed)
    }
}

/// A previous output as the draft (the last decoding of a growing audio window, the last
/// translation of a growing source): while the tokens produced are a prefix of it, its rest as
/// a chain, verified from the prefill on ([`TreeDrafter::drafts_with_prefill`]); nothing once
/// the output has left it. Costs no forward.
#[derive(Clone, Debug)]
pub struct PreviousOutput {
    tokens: Vec<u32>,
    max_rows: usize,
}

impl PreviousOutput {
    /// Drafts `tokens`.
    pub fn new(tokens: Vec<u32>) -> Self {
        Self {
            tokens,
            max_rows: usize::MAX,
        }
    }

    /// Caps the rows of a verifying forward (the context's uncached tokens, the root and the
    /// drafted ones) at `rows`, for a model whose rows are exactly its one-token rows only up to
    /// a batch size (Whisper's row attention); at least 2, so that a token can be drafted.
    pub fn with_max_rows(mut self, rows: usize) -> Result<Self> {
        if rows < 2 {
            return Err(Error::InvalidConfig(format!(
                "a verifying forward needs at least 2 rows to check a draft, got {rows}"
            )));
        }
        self.max_rows = rows;
        Ok(self)
    }

    /// How many of the previous tokens `produced` kept.
    pub fn kept(&self, produced: &[u32]) -> usize {
        common_prefix_len(&self.tokens, produced)
    }
}

impl TreeDrafter for PreviousOutput {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        let produced = input.produced();
        let rest = match self.tokens.starts_with(produced) {
            true => &self.tokens[produced.len()..],
            false => &[],
        };
        let rows = self.max_rows.saturating_sub(input.forwarded_before + 1);
        let n = rest.len().min(input.max_depth).min(rows);
        Ok(TreeDraft::new(
            TokenTree::linear(input.root()?, &rest[..n]),
            0,
        ))
    }
    fn drafts_with_prefill(&self) -> bool {
        true
    }
    fn finish(&mut self, _committed: &[u32]) -> Result<()> {
        Ok(())
    }
}

/// The loop's randomness lent for one call.
pub(crate) fn reborrow<'b>(rng: &'b mut Option<&mut dyn RngCore>) -> Option<&'b mut dyn RngCore> {
    match rng {
        Some(rng) => Some(&mut **rng),
        None => None,
    }
}

/// Settings of a [`SparseTreeDrafter`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SparseTreeConfig {
    /// Length of the greedy trunk.
    pub depth: usize,
    /// Branch where the draft's top probability is below this.
    pub branch_below: f32,
    /// Candidates at a branching position, the trunk token included.
    pub branch_width: usize,
}

impl Default for SparseTreeConfig {
    fn default() -> Self {
        Self {
            depth: 6,
            branch_below: 0.6,
            branch_width: 3,
        }
    }
}

/// Drafts a sparse tree with a small model in one pass: a greedy trunk of fixed depth, plus the
/// draft's runner-up tokens as alternatives wherever its confidence was low (SpecASR's two-pass
/// tree with recycling is [`SpecAsrDrafter`](crate::SpecAsrDrafter)).
#[derive(Debug)]
pub struct SparseTreeDrafter<D> {
    model: D,
    config: SparseTreeConfig,
}

impl<D: Decoder> SparseTreeDrafter<D> {
    /// Wraps a draft model.
    pub fn new(model: D, config: SparseTreeConfig) -> Result<Self> {
        if config.depth == 0 || config.branch_width == 0 {
            return Err(Error::InvalidConfig(
                "a sparse tree needs depth >= 1 and branch_width >= 1".into(),
            ));
        }
        Ok(Self { model, config })
    }

    /// The draft model.
    pub fn model(&self) -> &D {
        &self.model
    }
}

impl<D: Decoder> TreeDrafter for SparseTreeDrafter<D> {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        let (root, committed) = (input.root()?, input.committed);
        let depth = self.config.depth.min(input.max_depth);
        if depth == 0 {
            return Ok(TreeDraft::new(TokenTree::new(root), 0));
        }
        let (branch_below, width) = (self.config.branch_below, self.config.branch_width);
        let mut candidates = Vec::with_capacity(depth);
        let (_, forwards) = draft_chain(&mut self.model, committed, depth, &mut |_, row| {
            let trunk = argmax(&row);
            candidates.push(if max_probability(&row) < branch_below {
                top_k_tokens(&row, width)
            } else {
                vec![trunk]
            });
            Ok((trunk, false))
        })?;
        Ok(TreeDraft::new(
            TokenTree::from_candidates(root, &candidates)?,
            forwards,
        ))
    }

    fn finish(&mut self, committed: &[u32]) -> Result<()> {
        rewind_to_prefix(&mut self.model, committed).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::{MockConfig, MockDecoder};

    #[test]
    fn catch_up_forwards_only_what_is_missing() {
        let mut m = MockDecoder::new(MockConfig::target(16, 3));
        let row = catch_up(&mut m, &[1, 2, 3]).unwrap();
        assert_eq!(row, m.logits_for(&[1, 2, 3], 2));
        advance(&mut m, 7).unwrap();
        advance(&mut m, 8).unwrap();
        assert_eq!(m.cached_tokens(), [1, 2, 3, 7, 8]);
        // 7 was accepted, 8 rejected and replaced by 9: only 9 is fed.
        let before = m.forward_count();
        let row = catch_up(&mut m, &[1, 2, 3, 7, 9]).unwrap();
        assert_eq!(m.forward_count(), before + 1);
        assert_eq!(m.cached_tokens(), [1, 2, 3, 7, 9]);
        assert_eq!(row, m.logits_for(&[1, 2, 3, 7, 9], 4));
        // Everything already cached: the last token is re-fed to get its logits.
        catch_up(&mut m, &[1, 2, 3, 7, 9]).unwrap();
        assert_eq!(m.cached_tokens(), [1, 2, 3, 7, 9]);
        // A different conversation shares nothing: the cache starts over.
        catch_up(&mut m, &[4, 5]).unwrap();
        assert_eq!(m.cached_tokens(), [4, 5]);
    }

    #[test]
    fn sparse_drafter_branches_where_unsure() {
        let target = MockConfig::target(16, 3);
        let sure = SparseTreeConfig {
            depth: 4,
            branch_below: 0.0,
            branch_width: 3,
        };
        let mut d = SparseTreeDrafter::new(MockDecoder::new(target.clone()), sure).unwrap();
        let chain = d.draft_tree(DraftInput::new(&[1, 2], 10)).unwrap();
        assert_eq!(chain.tree.len(), 5, "never unsure: a plain chain");
        assert_eq!(chain.forwards, 4);
        let unsure = SparseTreeConfig {
            depth: 4,
            branch_below: 1.1,
            branch_width: 3,
        };
        let mut d = SparseTreeDrafter::new(MockDecoder::new(target), unsure).unwrap();
        let tree = d.draft_tree(DraftInput::new(&[1, 2], 2)).unwrap().tree;
        assert_eq!(
            tree.len(),
            1 + 2 * 3,
            "always unsure: three candidates at each of 2 depths"
        );
        assert_eq!(tree.max_depth(), 2);
        assert_eq!(tree.token(1), chain.tree.token(1));
    }
}
