//! The draft side of speculation: keeping a draft model's cache in step with the committed
//! tokens, and drafting token trees.

use crate::decoder::{forward_tokens, rewind_to_prefix, Decoder, LogitRows};
use crate::generate::TreeVerdict;
use crate::logits::Logits;
use crate::sampling::{argmax, max_probability, top_k_tokens};
use crate::tree::TokenTree;
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

/// A token tree drafted for one verification step, with the draft passes it cost.
#[derive(Clone, Debug)]
pub struct TreeDraft {
    pub tree: TokenTree,
    pub forwards: usize,
}

/// Anything that proposes token trees: a draft model, extra prediction heads, a cache of
/// earlier outputs, the model's own previous guesses (Jacobi iteration). A speculation method
/// is a drafter: [`tree_speculative_generate`](crate::tree_speculative_generate) is the loop
/// that verifies its trees.
pub trait TreeDrafter {
    /// Proposes a tree rooted at `committed.last()` no deeper than `max_depth`.
    fn draft_tree(&mut self, committed: &[u32], max_depth: usize) -> Result<TreeDraft>;

    /// Sees what the target made of the tree just drafted: the verdict, and the target's logits
    /// after every node (`rows.row(node)`), for drafters that learn from the verification.
    /// Nothing by default.
    fn observe(&mut self, tree: &TokenTree, verdict: &TreeVerdict, rows: &Logits) -> Result<()> {
        let _ = (tree, verdict, rows);
        Ok(())
    }

    /// Called when generation ends with the final committed tokens, to drop draft state that
    /// is not a prefix of them.
    fn finish(&mut self, committed: &[u32]) -> Result<()>;
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
    fn draft_tree(&mut self, committed: &[u32], max_depth: usize) -> Result<TreeDraft> {
        let root = *committed
            .last()
            .ok_or(Error::EmptyInput("a tree needs a committed root token"))?;
        let depth = self.config.depth.min(max_depth);
        if depth == 0 {
            return Ok(TreeDraft {
                tree: TokenTree::new(root),
                forwards: 0,
            });
        }
        let mut row = catch_up(&mut self.model, committed)?;
        let mut forwards = 1;
        let mut candidates = Vec::with_capacity(depth);
        for i in 0..depth {
            let trunk = argmax(&row);
            candidates.push(if max_probability(&row) < self.config.branch_below {
                top_k_tokens(&row, self.config.branch_width)
            } else {
                vec![trunk]
            });
            if i + 1 < depth {
                row = advance(&mut self.model, trunk)?;
                forwards += 1;
            }
        }
        Ok(TreeDraft {
            tree: TokenTree::from_candidates(root, &candidates)?,
            forwards,
        })
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
        let chain = d.draft_tree(&[1, 2], 10).unwrap();
        assert_eq!(chain.tree.len(), 5, "never unsure: a plain chain");
        assert_eq!(chain.forwards, 4);
        let unsure = SparseTreeConfig {
            depth: 4,
            branch_below: 1.1,
            branch_width: 3,
        };
        let mut d = SparseTreeDrafter::new(MockDecoder::new(target), unsure).unwrap();
        let tree = d.draft_tree(&[1, 2], 2).unwrap().tree;
        assert_eq!(
            tree.len(),
            1 + 2 * 3,
            "always unsure: three candidates at each of 2 depths"
        );
        assert_eq!(tree.max_depth(), 2);
        assert_eq!(tree.token(1), chain.tree.token(1));
    }
}
