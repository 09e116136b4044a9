//! Token trees for verifying many draft continuations in one forward pass.
//!
//! A [`TokenTree`] is pure data: a token, a parent and a depth per node, with node 0 the root
//! (the last committed token, not yet in the target's cache). Nodes are stored in topological
//! order (a parent always precedes its children), so a root-to-node path has increasing indices
//! and the cache entries of an accepted path can be compacted with
//! [`KvCache::keep_positions`](crate::KvCache::keep_positions).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use crate::{Error, Result};

/// A tree of candidate continuations rooted at the last committed token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenTree {
    tokens: Vec<u32>,
    parents: Vec<Option<usize>>,
    depths: Vec<usize>,
}

impl TokenTree {
    /// A tree holding only the root.
    pub fn new(root: u32) -> Self {
        Self {
            tokens: vec![root],
            parents: vec![None],
            depths: vec![0],
        }
    }

    /// Adds `token` as a child of node `parent` and returns the new node's index.
    pub fn push(&mut self, parent: usize, token: u32) -> Result<usize> {
        if parent >= self.len() {
            return Err(Error::InvalidTree(format!(
                "parent {parent} does not exist in a tree of {} nodes",
                self.len()
            )));
        }
        self.tokens.push(token);
        self.parents.push(Some(parent));
        self.depths.push(self.depths[parent] + 1);
        Ok(self.len() - 1)
    }

    /// A chain: the root followed by a linear draft.
    pub fn linear(root: u32, draft: &[u32]) -> Self {
        let mut tree = Self::new(root);
        for (i, &t) in draft.iter().enumerate() {
            tree.push(i, t).expect("the previous node exists");
        }
        tree
    }

    /// A sparse tree (SpecASR): `candidates[i]` are the tokens considered at draft position `i`,
    /// the first being the trunk (the draft's choice) and any others alternatives, added where
    /// the draft was unsure. The trunk is a chain; each alternative is a leaf beside the trunk
    /// token it competes with. Deeper branches can be grown afterwards with [`TokenTree::push`].
    pub fn from_candidates(root: u32, candidates: &[Vec<u32>]) -> Result<Self> {
        let mut tree = Self::new(root);
        let mut trunk_parent = 0;
        for (i, options) in candidates.iter().enumerate() {
            let (&trunk, alternatives) = options.split_first().ok_or_else(|| {
                Error::InvalidTree(format!("draft position {i} has no candidate"))
            })?;
            let trunk_node = tree.push(trunk_parent, trunk)?;
            for &alt in alternatives {
                tree.push(trunk_parent, alt)?;
            }
            trunk_parent = trunk_node;
        }
        Ok(tree)
    }

    /// A Medusa-style tree. `candidates[d]` are the top tokens proposed for depth `d + 1` (one
    /// list per head, most likely first); each choice is a path of indices into those lists, e.g.
    /// `[0, 1]` = the top token of head 0 followed by the second token of head 1. Every prefix
    /// of a choice must itself be a choice.
    pub fn from_choices(
        root: u32,
        candidates: &[Vec<u32>],
        choices: &[Vec<usize>],
    ) -> Result<Self> {
        let mut sorted: Vec<&Vec<usize>> = choices.iter().collect();
        sorted.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        let mut tree = Self::new(root);
        let mut node_of: HashMap<&[usize], usize> = HashMap::new();
        node_of.insert(&[], 0);
        for choice in sorted {
            let Some((&index, parent_path)) = choice.split_last() else {
                return Err(Error::InvalidTree("an empty choice".into()));
            };
            let depth = choice.len() - 1;
            let token = *candidates
                .get(depth)
                .and_then(|c| c.get(index))
                .ok_or_else(|| {
                    Error::InvalidTree(format!(
                        "choice {choice:?} asks for candidate {index} at depth {}, which is not there",
                        depth + 1
                    ))
                })?;
            let &parent = node_of.get(parent_path).ok_or_else(|| {
                Error::InvalidTree(format!(
                    "choice {choice:?} has no parent choice {parent_path:?}"
                ))
            })?;
            if node_of.contains_key(choice.as_slice()) {
                return Err(Error::InvalidTree(format!("choice {choice:?} is repeated")));
            }
            let node = tree.push(parent, token)?;
            node_of.insert(choice, node);
        }
        Ok(tree)
    }

    /// Adds the branches of `other` (a tree with the same root) that this tree lacks: a node of
    /// `other` whose parent maps to a node here with a child of the same token maps to that
    /// child, else it is added. Two drafts of different sources verified in one forward then
    /// share the nodes they agree on.
    pub fn merge(&mut self, other: &TokenTree) -> Result<()> {
        if other.tokens[0] != self.tokens[0] {
            return Err(Error::InvalidTree(format!(
                "a tree rooted at token {} cannot merge one rooted at {}",
                self.tokens[0], other.tokens[0]
            )));
        }
        let mut here = vec![0; other.len()];
        for node in 1..other.len() {
            let parent = here[other.parents[node].expect("only the root has no parent")];
            let token = other.tokens[node];
            let shared = self.children(parent).find(|&c| self.tokens[c] == token);
            here[node] = match shared {
                Some(child) => child,
                None => self.push(parent, token)?,
            };
        }
        Ok(())
    }

    /// Number of nodes, the root included.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Token of every node.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Token of `node`.
    pub fn token(&self, node: usize) -> u32 {
        self.tokens[node]
    }

    /// Parent of `node` (`None` for the root).
    pub fn parent(&self, node: usize) -> Option<usize> {
        self.parents[node]
    }

    /// Depth of `node` (the root is 0).
    pub fn depth(&self, node: usize) -> usize {
        self.depths[node]
    }

    /// Largest depth in the tree.
    pub fn max_depth(&self) -> usize {
        self.depths.iter().copied().max().unwrap_or(0)
    }

    /// Children of `node`, in insertion order.
    pub fn children(&self, node: usize) -> impl Iterator<Item = usize> + '_ {
        (node + 1..self.len()).filter(move |&c| self.parents[c] == Some(node))
    }

    /// Nodes from the root to `node`, both included.
    pub fn path_to(&self, node: usize) -> Vec<usize> {
        let mut path = vec![node];
        let mut current = node;
        while let Some(p) = self.parents[current] {
            path.push(p);
            current = p;
        }
        path.reverse();
        path
    }

    /// Every root-to-leaf path.
    pub fn paths(&self) -> Vec<Vec<usize>> {
        let mut has_child = vec![false; self.len()];
        for p in self.parents.iter().flatten() {
            has_child[*p] = true;
        }
        (0..self.len())
            .filter(|&n| !has_child[n])
            .map(|leaf| self.path_to(leaf))
            .collect()
    }

    /// `mask[i][j]` is true when node `i` may attend to node `j`: `j` is `i` or an ancestor.
    pub fn ancestry_mask(&self) -> Vec<Vec<bool>> {
        let n = self.len();
        let mut mask = vec![vec![false; n]; n];
        for (i, row) in mask.iter_mut().enumerate() {
            let mut current = Some(i);
            while let Some(j) = current {
                row[j] = true;
                current = self.parents[j];
            }
        }
        mask
    }

    /// The additive attention bias for verifying the tree after `prefix_len` cached positions:
    /// `[1, 1, n, prefix_len + n]`, 0 where a node may attend (the whole prefix, itself and its
    /// ancestors) and −∞ elsewhere.
    pub fn attention_bias(
        &self,
        prefix_len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let n = self.len();
        let width = prefix_len + n;
        let mut bias = vec![0f32; n * width];
        for (i, row) in self.ancestry_mask().into_iter().enumerate() {
            for (j, visible) in row.into_iter().enumerate() {
                if !visible {
                    bias[i * width + prefix_len + j] = f32::NEG_INFINITY;
                }
            }
        }
        Ok(Tensor::from_vec(bias, (1, 1, n, width), device)?.to_dtype(dtype)?)
    }

    /// Position id of every node: `prefix_len + depth`.
    pub fn position_ids(&self, prefix_len: usize) -> Vec<usize> {
        self.depths.iter().map(|d| prefix_len + d).collect()
    }

    /// The longest root-started path whose every step the target accepts; `accepts(parent, child)`
    /// judges node `child` given the target's output at `parent`. On equal lengths the path that
    /// comes first in node order wins. Always starts with the root.
    pub fn longest_path_where(&self, mut accepts: impl FnMut(usize, usize) -> bool) -> Vec<usize> {
        // Nodes are topologically ordered, so one forward sweep finds every accepted node.
        let mut reachable = vec![false; self.len()];
        reachable[0] = true;
        let mut deepest = 0;
        for node in 1..self.len() {
            let parent = self.parents[node].expect("only the root has no parent");
            if reachable[parent] && accepts(parent, node) {
                reachable[node] = true;
                if self.depths[node] > self.depths[deepest] {
                    deepest = node;
                }
            }
        }
        self.path_to(deepest)
    }

    /// The longest path along which every token equals the target's prediction at its parent
    /// (`predictions[i]` = the target's next token after node `i`, e.g. its argmax).
    pub fn longest_accepted_path(&self, predictions: &[u32]) -> Result<Vec<usize>> {
        if predictions.len() != self.len() {
            return Err(Error::InvalidTree(format!(
                "{} predictions for {} nodes",
                predictions.len(),
                self.len()
            )));
        }
        Ok(self.longest_path_where(|parent, child| predictions[parent] == self.tokens[child]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// root(9) ─┬─ a(1) ─┬─ c(3) ── e(5)
    ///          │        └─ d(4)
    ///          └─ b(2)
    fn sample_tree() -> TokenTree {
        let mut t = TokenTree::new(9);
        let a = t.push(0, 1).unwrap();
        t.push(0, 2).unwrap();
        let c = t.push(a, 3).unwrap();
        t.push(a, 4).unwrap();
        t.push(c, 5).unwrap();
        t
    }

    #[test]
    fn merging_shares_the_nodes_two_trees_agree_on() {
        let mut t = sample_tree();
        // 9 → 1 → 3 → 6 shares a and c, then adds a leaf under c; 9 → 7 is new.
        let mut other = TokenTree::linear(9, &[1, 3, 6]);
        other.push(0, 7).unwrap();
        t.merge(&other).unwrap();
        assert_eq!(t.len(), 8);
        let paths: Vec<Vec<u32>> = t
            .paths()
            .iter()
            .map(|p| p.iter().map(|&n| t.token(n)).collect())
            .collect();
        for expected in [
            vec![9, 1, 3, 5],
            vec![9, 1, 3, 6],
            vec![9, 1, 4],
            vec![9, 2],
            vec![9, 7],
        ] {
            assert!(paths.contains(&expected), "{expected:?} in {paths:?}");
        }
        // Merging a tree into itself adds nothing; a different root is refused.
        let before = t.clone();
        t.merge(&before).unwrap();
        assert_eq!(t, before);
        assert!(t.merge(&TokenTree::linear(8, &[1])).is_err());
    }

    #[test]
    fn mask_and_positions_by_hand() {
        let t = sample_tree();
        let m = t.ancestry_mask();
        let expected = [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 1],
        ];
        for (row, exp) in m.iter().zip(expected) {
            let row: Vec<i32> = row.iter().map(|&b| b as i32).collect();
            assert_eq!(row, exp);
        }
        assert_eq!(t.position_ids(10), vec![10, 11, 11, 12, 12, 13]);
        assert_eq!(t.max_depth(), 3);
        assert_eq!(t.children(1).collect::<Vec<_>>(), vec![3, 4]);
    }

    #[test]
    fn attention_bias_sees_prefix_and_ancestors_only() {
        let t = sample_tree();
        let bias = t.attention_bias(2, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(bias.dims(), &[1, 1, 6, 8]);
        let rows: Vec<Vec<f32>> = bias
            .squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2()
            .unwrap();
        let ninf = f32::NEG_INFINITY;
        assert_eq!(rows[0], vec![0.0, 0.0, 0.0, ninf, ninf, ninf, ninf, ninf]);
        assert_eq!(rows[4], vec![0.0, 0.0, 0.0, 0.0, ninf, ninf, 0.0, ninf]);
        assert_eq!(rows[5], vec![0.0, 0.0, 0.0, 0.0, ninf, 0.0, ninf, 0.0]);
        let half = t.attention_bias(0, DType::F16, &Device::Cpu).unwrap();
        assert_eq!(half.dtype(), DType::F16);
    }

    #[test]
    fn paths_from_root_to_each_leaf() {
        let t = sample_tree();
        assert_eq!(t.paths(), vec![vec![0, 2], vec![0, 1, 4], vec![0, 1, 3, 5]]);
        assert_eq!(t.path_to(5), vec![0, 1, 3, 5]);
    }

    #[test]
    fn linear_tree_is_a_chain() {
        let t = TokenTree::linear(7, &[1, 2, 3]);
        assert_eq!(t.tokens(), &[7, 1, 2, 3]);
        assert_eq!(t.paths(), vec![vec![0, 1, 2, 3]]);
        assert_eq!(t.position_ids(5), vec![5, 6, 7, 8]);
    }

    #[test]
    fn sparse_tree_from_candidates() {
        // Position 0 sure (trunk 1), position 1 unsure (trunk 2, alternatives 5, 6), position 2 sure.
        let t = TokenTree::from_candidates(0, &[vec![1], vec![2, 5, 6], vec![3]]).unwrap();
        assert_eq!(t.tokens(), &[0, 1, 2, 5, 6, 3]);
        assert_eq!(t.parent(2), Some(1));
        assert_eq!(t.parent(3), Some(1));
        assert_eq!(t.parent(4), Some(1));
        assert_eq!(t.parent(5), Some(2));
        assert!(TokenTree::from_candidates(0, &[vec![1], vec![]]).is_err());
    }

    #[test]
    fn medusa_choices_build_the_expected_tree() {
        let candidates = vec![vec![10, 11, 12], vec![20, 21], vec![30]];
        let choices = vec![
            vec![0],
            vec![1],
            vec![0, 0],
            vec![0, 1],
            vec![1, 0],
            vec![0, 0, 0],
        ];
        let t = TokenTree::from_choices(5, &candidates, &choices).unwrap();
        assert_eq!(t.tokens(), &[5, 10, 11, 20, 21, 20, 30]);
        assert_eq!(t.parent(3), Some(1));
        assert_eq!(t.parent(5), Some(2));
        assert_eq!(t.parent(6), Some(3));
        assert!(
            TokenTree::from_choices(5, &candidates, &[vec![0, 0]]).is_err(),
            "missing parent"
        );
        assert!(
            TokenTree::from_choices(5, &candidates, &[vec![3]]).is_err(),
            "out of range"
        );
        assert!(
            TokenTree::from_choices(5, &candidates, &[vec![0], vec![0]]).is_err(),
            "repeat"
        );
    }

    #[test]
    fn longest_accepted_path_with_several_matching_branches() {
        // root(9): children 1 and 1 (a duplicate branch); the second continues further.
        let mut t = TokenTree::new(9);
        let a = t.push(0, 1).unwrap();
        let b = t.push(0, 1).unwrap();
        t.push(a, 2).unwrap();
        let d = t.push(b, 3).unwrap();
        t.push(d, 4).unwrap();
        // Target: after 9 → 1, after a → 7 (rejects 2), after b → 3, after d → 4.
        let predictions = [1, 7, 3, 0, 4, 8];
        assert_eq!(
            t.longest_accepted_path(&predictions).unwrap(),
            vec![0, 2, 4, 5]
        );
        // Nothing accepted: the root alone.
        assert_eq!(
            t.longest_accepted_path(&[6, 0, 0, 0, 0, 0]).unwrap(),
            vec![0]
        );
        // Equal depth: the first branch in node order wins.
        let lenient = t.longest_path_where(|_, c| t.depth(c) <= 1);
        assert_eq!(lenient, vec![0, 1]);
        assert!(t.longest_accepted_path(&[1]).is_err());
    }

    #[test]
    fn push_rejects_missing_parent() {
        let mut t = TokenTree::new(0);
        assert!(matches!(t.push(3, 1), Err(Error::InvalidTree(_))));
    }
}
