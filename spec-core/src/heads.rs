//! Multi-token prediction heads as a drafter ("Faster Speech-LLaMA Inference with Multi-token
//! Prediction", §III; Medusa).
//!
//! Extra heads read the target's own last hidden state and guess the tokens after the one the
//! target predicts itself: from the hidden state at position t the model's output layer gives
//! token t+1 and head k gives token t+1+k (eq. 8, conditional independence). The guesses form a
//! token tree rooted at the target's next token; the target verifies it in one forward
//! ("predict-verify-accept", §III-A), and the hidden state of the last accepted node feeds the
//! heads for the next step, so drafting costs no extra target forward. Heads may also read the
//! token guessed before their own ([`TokenHeads::reads_guesses`]): head 0 then knows the
//! target's next token, which eq. 8's independent heads must do without.
//!
//! A model exposes its hidden states through [`HiddenStates`]; heads implement [`TokenHeads`]
//! (the networks and their training live in `spec-nn`); [`HeadsDrafter`] turns their logits into
//! trees, a drafter for [`speculate`](crate::speculate()).

use std::ops::Range;

use candle_core::Tensor;

use crate::decoder::Decoder;
use crate::draft::{DraftInput, TreeDraft, TreeDrafter};
use crate::logits::Logits;
use crate::sampling::{argmax, max_probability, top_k_tokens};
use crate::tree::TokenTree;
#[cfg(doc)]
use crate::verify::Verification;
use crate::{Error, Result};

/// A decoder that also returns the hidden states its output layer reads.
pub trait HiddenStates: Decoder {
    /// Width of a hidden state.
    fn hidden_size(&self) -> usize;

    /// The last forward's final hidden states (after the last norm: the output layer's input),
    /// `[n, hidden_size]`, one per input position, whichever logits rows it returned.
    fn last_hidden(&self) -> Result<Tensor>;

    /// The model's output layer (its unembedding): `[n, hidden_size]` → `n` rows of
    /// `vocab_size` logits, written straight into the table where the layer allows (a
    /// verification's rows are large: four of Whisper's are 830 KB, a copy the caller's thread
    /// would make while the kernels' threads wait).
    fn unembed(&self, hidden: &Tensor) -> Result<Logits>;

    /// Rows `ids` of the output matrix, dequantized, `[ids.len(), hidden_size]` f32 (heads that
    /// share the model's unembedding take theirs from here).
    fn unembedding_rows(&self, ids: &[u32]) -> Result<Tensor>;
}

/// Prediction heads over a model's hidden state.
pub trait TokenHeads {
    /// Number of heads: tokens guessed beyond the model's own next token.
    fn count(&self) -> usize;

    /// Width of the hidden state the heads read.
    fn hidden_size(&self) -> usize;

    /// Logits of the heads in `heads` (a range within `0..count`) for one hidden state
    /// `[1, hidden_size]`, one row per head: head `k` guesses the token `k + 2` positions after
    /// the hidden state's (head 0 the token after the model's own next one). A drafter that
    /// stops at an unsure head asks for one head at a time and never pays for the deeper ones.
    fn predict(&self, hidden: &Tensor, heads: Range<usize>) -> Result<Logits>;

    /// True when each head also reads the token guessed just before its own (chained heads,
    /// as in Hydra and EAGLE: head 0 reads the target's next token, head k the guess of head
    /// k − 1): they are asked one head at a time through [`TokenHeads::predict_after`].
    fn reads_guesses(&self) -> bool {
        false
    }

    /// Head `k`'s logits (one row) from `state` and `previous`, the token just before the one
    /// head `k` guesses, and the state head `k + 1` reads. Head 0 reads the hidden state
    /// `[1, hidden_size]`. Heads that do not read guesses ignore `previous` and pass the
    /// hidden state on unchanged.
    fn predict_after(&self, state: &Tensor, k: usize, previous: u32) -> Result<(Logits, Tensor)> {
        let _ = previous;
        Ok((self.predict(state, k..k + 1)?, state.clone()))
    }

    /// True when the heads' logits are the model's own output layer applied to states of their
    /// own (the paper's latent-space expansion, which shares the unembedding among the heads):
    /// [`TokenHeads::output_states`] gives those states, so a verification can compute the
    /// next step's guesses in the pass that computes its own output rows
    /// ([`Verification::WithGuesses`]).
    fn shares_output_layer(&self) -> bool {
        false
    }

    /// For heads that share the model's output layer: the states of the heads in `heads` for
    /// each row of `hidden` `[n, hidden_size]`, as `[n · heads.len(), hidden_size]` (row
    /// `i · heads.len() + k` for head `heads.start + k` on row i). The model's logits for such a
    /// state, with every token outside [`TokenHeads::shortlist`] at −∞, are the head's.
    fn output_states(&self, hidden: &Tensor, heads: Range<usize>) -> Result<Tensor> {
        let _ = (hidden, heads);
        Err(Error::Unsupported(
            "these heads have output layers of their own, not the model's",
        ))
    }

    /// The tokens the heads can guess, when not the whole vocabulary (every other token's logit
    /// is −∞).
    fn shortlist(&self) -> Option<&[u32]> {
        None
    }
}

impl<H: TokenHeads + ?Sized> TokenHeads for &H {
    fn count(&self) -> usize {
        (**self).count()
    }
    fn hidden_size(&self) -> usize {
        (**self).hidden_size()
    }
    fn predict(&self, hidden: &Tensor, heads: Range<usize>) -> Result<Logits> {
        (**self).predict(hidden, heads)
    }
    fn reads_guesses(&self) -> bool {
        (**self).reads_guesses()
    }
    fn predict_after(&self, state: &Tensor, k: usize, previous: u32) -> Result<(Logits, Tensor)> {
        (**self).predict_after(state, k, previous)
    }
    fn shares_output_layer(&self) -> bool {
        (**self).shares_output_layer()
    }
    fn output_states(&self, hidden: &Tensor, heads: Range<usize>) -> Result<Tensor> {
        (**self).output_states(hidden, heads)
    }
    fn shortlist(&self) -> Option<&[u32]> {
        (**self).shortlist()
    }
}

/// The shape of the trees drafted from the heads' guesses, as Medusa choices: each choice is a
/// path of indices into the heads' ranked candidates (see [`TokenTree::from_choices`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadsTree {
    choices: Vec<Vec<usize>>,
}

impl HeadsTree {
    /// Each head's top token, one after another: a chain `depth` deep.
    pub fn chain(depth: usize) -> Self {
        Self {
            choices: (1..=depth).map(|d| vec![0; d]).collect(),
        }
    }

    /// The top-1 chain `depth` deep, and at every depth the next `width - 1` candidates, each
    /// followed by the deeper heads' top tokens (an independent head's guess does not depend on
    /// the token chosen before it, so a runner-up is as likely to be followed by the same
    /// tokens; heads that read guesses read the first candidate's).
    pub fn branching(depth: usize, width: usize) -> Self {
        let mut choices = Self::chain(depth).choices;
        for d in 0..depth {
            for alternative in 1..width {
                for end in d + 1..=depth {
                    let mut choice = vec![0; end];
                    choice[d] = alternative;
                    choices.push(choice);
                }
            }
        }
        Self { choices }
    }

    /// Any Medusa choice list; every prefix of a choice must itself be a choice. A candidate
    /// index beyond [`MAX_CANDIDATE_INDEX`] asks a head for more candidates than there can be
    /// tokens and is refused.
    pub fn choices(choices: Vec<Vec<usize>>) -> Result<Self> {
        if let Some(choice) = choices
            .iter()
            .find(|choice| choice.iter().any(|&index| index > MAX_CANDIDATE_INDEX))
        {
            return Err(Error::InvalidTree(format!(
                "choice {choice:?} asks a head for a candidate past index {MAX_CANDIDATE_INDEX}, \
                 and token ids are u32"
            )));
        }
        let (candidates, renumbered) = renumbered_densely(&choices);
        TokenTree::from_choices(0, &candidates, &renumbered)?;
        Ok(Self { choices })
    }

    /// Deepest choice: the heads the tree uses.
    pub fn depth(&self) -> usize {
        self.choices.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Nodes besides the root.
    pub fn nodes(&self) -> usize {
        self.choices.len()
    }

    /// Candidates needed from each head (one more than the largest index used at its depth).
    fn widths(&self) -> Vec<usize> {
        let mut widths = vec![0; self.depth()];
        for choice in &self.choices {
            if let Some((&index, _)) = choice.split_last() {
                let w = &mut widths[choice.len() - 1];
                *w = (*w).max(index.saturating_add(1));
            }
        }
        widths
    }
}

/// The largest candidate index a [`HeadsTree`] choice may use: a head ranks at most every u32
/// token id.
pub const MAX_CANDIDATE_INDEX: usize = u32::MAX as usize;

/// `choices` with each depth's indices renumbered 0, 1, … in increasing order, and for each
/// depth candidates for those numbers: the same tree shape as `choices`, checkable by
/// [`TokenTree::from_choices`] in memory that grows with the choices, not with the indices.
fn renumbered_densely(choices: &[Vec<usize>]) -> (Vec<Vec<u32>>, Vec<Vec<usize>>) {
    let depth = choices.iter().map(Vec::len).max().unwrap_or(0);
    let mut used: Vec<Vec<usize>> = vec![Vec::new(); depth];
    for choice in choices {
        for (d, &index) in choice.iter().enumerate() {
            used[d].push(index);
        }
    }
    for indices in &mut used {
        indices.sort_unstable();
        indices.dedup();
    }
    let renumbered = choices
        .iter()
        .map(|choice| {
            choice
                .iter()
                .zip(&used)
                .map(|(index, indices)| indices.partition_point(|used| used < index))
                .collect()
        })
        .collect();
    let candidates = used
        .iter()
        .map(|indices| (0..).take(indices.len()).collect())
        .collect();
    (candidates, renumbered)
}

/// Where a drafter's head rows come from: asked of the heads one at a time from a state (gated
/// or chained heads), or all given at once.
enum HeadRows {
    Ask(Tensor),
    Given(Logits),
}

/// Drafts token trees from prediction heads.
#[derive(Clone, Debug)]
pub struct HeadsDrafter<H> {
    heads: H,
    tree: HeadsTree,
    widths: Vec<usize>,
    min_probability: f32,
    ungated_depths: usize,
}

impl<H: TokenHeads> HeadsDrafter<H> {
    /// Fails when `tree` is deeper than there are heads.
    pub fn new(heads: H, tree: HeadsTree) -> Result<Self> {
        if tree.depth() > heads.count() {
            return Err(Error::InvalidConfig(format!(
                "a tree {} deep needs {} heads, these have {}",
                tree.depth(),
                tree.depth(),
                heads.count()
            )));
        }
        let widths = tree.widths();
        Ok(Self {
            heads,
            tree,
            widths,
            min_probability: 0.0,
            ungated_depths: 0,
        })
    }

    /// Drafts a depth only while its head gives its first guess at least `probability` (the
    /// softmax of its logits), and nothing deeper once one falls short: where the heads are
    /// unsure, the verifying forward is shorter (one row when the first head is unsure), which
    /// on a CPU costs less than verifying guesses that will fail. Lossless under greedy
    /// acceptance at any value; 0 (the default) drafts the whole tree every step.
    pub fn with_min_probability(mut self, probability: f32) -> Result<Self> {
        if !(0.0..=1.0).contains(&probability) {
            return Err(Error::InvalidConfig(format!(
                "a head's least probability to draft must lie in [0, 1], got {probability}"
            )));
        }
        self.min_probability = probability;
        Ok(self)
    }

    /// Drafts the first `depths` depths whatever the heads' certainty, and gates only the
    /// deeper ones by [`HeadsDrafter::with_min_probability`]: where a forward of a few tokens
    /// costs what a one-token forward does, the first guesses are worth checking even when
    /// unsure. 0 (the default) gates every depth.
    pub fn with_ungated_depths(mut self, depths: usize) -> Self {
        self.ungated_depths = depths;
        self
    }

    /// The heads.
    pub fn heads(&self) -> &H {
        &self.heads
    }

    /// The tree shape.
    pub fn tree(&self) -> &HeadsTree {
        &self.tree
    }

    /// The tree after `root` (the target's next token, not yet forwarded) from the hidden state
    /// `[1, hidden]` that predicted it, no deeper than `max_depth`. `adjust(depth, row)` may
    /// change head `depth`'s logits first (e.g. suppress tokens the decoder never emits).
    pub fn draft(
        &self,
        hidden: &Tensor,
        root: u32,
        max_depth: usize,
        adjust: &mut dyn FnMut(usize, &mut [f32]),
    ) -> Result<TokenTree> {
        let depth = self.tree.depth().min(max_depth);
        if depth == 0 {
            return Ok(TokenTree::new(root));
        }
        // Ungated independent heads: every head the tree uses in one call. Gated, one head at a
        // time, so an unsure head spares the cost of those after it; heads that read guesses
        // are asked one at a time anyway, each after its parent's first candidate.
        let gated = self.min_probability > 0.0 && depth > self.ungated_depths;
        let rows = match gated || self.heads.reads_guesses() {
            true => HeadRows::Ask(hidden.clone()),
            false => HeadRows::Given(self.predict_checked(hidden, 0..depth)?),
        };
        self.tree_from(rows, root, depth, adjust)
    }

    /// [`HeadsDrafter::draft`] from the heads' rows for the hidden state, computed before
    /// (`predicted`: a row per head from the first, as [`Verification::WithGuesses`] gives them).
    /// For heads that do not read guesses.
    pub fn draft_predicted(
        &self,
        predicted: Logits,
        root: u32,
        max_depth: usize,
        adjust: &mut dyn FnMut(usize, &mut [f32]),
    ) -> Result<TokenTree> {
        let depth = self.tree.depth().min(max_depth);
        if self.heads.reads_guesses() {
            return Err(Error::Unsupported(
                "heads that read the guess before their own are asked one head at a time",
            ));
        }
        if predicted.len() < depth {
            return Err(Error::LogitsShape {
                got: vec![predicted.len(), predicted.vocab_size()],
                expected: format!("at least {depth} head rows"),
            });
        }
        if depth == 0 {
            return Ok(TokenTree::new(root));
        }
        self.tree_from(HeadRows::Given(predicted), root, depth, adjust)
    }

    /// The tree for a step of [`speculate`](crate::speculate()): from the heads' rows when the
    /// last verification computed them ([`DraftInput::guessed`]), else from the hidden state.
    /// `adjust(depth, row)` as for [`HeadsDrafter::draft`].
    pub fn draft_input(
        &self,
        input: DraftInput<'_>,
        adjust: &mut dyn FnMut(usize, &mut [f32]),
    ) -> Result<TreeDraft> {
        let (root, max_depth) = (input.root()?, input.max_depth);
        let tree = match (input.guessed, input.hidden) {
            (Some(rows), _) => self.draft_predicted(rows, root, max_depth, adjust)?,
            (None, Some(hidden)) => {
                check_width(self.heads.hidden_size(), hidden.dim(1)?)?;
                self.draft(hidden, root, max_depth, adjust)?
            }
            (None, None) => {
                return Err(Error::InvalidConfig(
                    "heads draft from the target's hidden state, and none was given".into(),
                ))
            }
        };
        Ok(TreeDraft::new(tree, 1))
    }

    /// The tree `depth` (≥ 1) deep after `root` from the heads' rows.
    fn tree_from(
        &self,
        rows: HeadRows,
        root: u32,
        depth: usize,
        adjust: &mut dyn FnMut(usize, &mut [f32]),
    ) -> Result<TokenTree> {
        let gated = self.min_probability > 0.0;
        let mut source = rows;
        let mut previous = root;
        let mut candidates: Vec<Vec<u32>> = Vec::with_capacity(depth);
        for d in 0..depth {
            let mut own;
            let (rows, row) = match &mut source {
                HeadRows::Given(all) => (all, d),
                HeadRows::Ask(state) => {
                    let (logits, next) = self.heads.predict_after(state, d, previous)?;
                    check_rows(&logits, 1)?;
                    (own, *state) = (logits, next);
                    (&mut own, 0)
                }
            };
            adjust(d, rows.row_mut(row));
            let row = rows.row(row);
            if gated && d >= self.ungated_depths {
                // A row without a finite logit (NaN) is unsure too.
                let sure = max_probability(row);
                if sure.is_nan() || sure < self.min_probability {
                    break;
                }
            }
            // A chain's single guess is the argmax, in one vectorised pass.
            let ranked = match self.widths[d] {
                1 => vec![argmax(row)],
                width => top_k_tokens(row, width),
            };
            previous = ranked[0];
            candidates.push(ranked);
        }
        let depth = candidates.len();
        if depth == 0 {
            return Ok(TokenTree::new(root));
        }
        let choices: Vec<Vec<usize>> = self
            .tree
            .choices
            .iter()
            .filter(|c| c.len() <= depth)
            .cloned()
            .collect();
        TokenTree::from_choices(root, &candidates, &choices)
    }

    /// The heads' logits for `heads`, one row per head, or an error naming the shape they gave.
    fn predict_checked(&self, hidden: &Tensor, heads: Range<usize>) -> Result<Logits> {
        let logits = self.heads.predict(hidden, heads.clone())?;
        check_rows(&logits, heads.len())?;
        Ok(logits)
    }
}

/// Fails unless the heads gave `rows` rows, naming the shape they gave.
fn check_rows(logits: &Logits, rows: usize) -> Result<()> {
    if logits.len() != rows {
        return Err(Error::LogitsShape {
            got: vec![logits.len(), logits.vocab_size()],
            expected: format!("{rows} head rows"),
        });
    }
    Ok(())
}

/// Fails unless `heads` is a non-empty range within `0..count` (what [`TokenHeads::predict`]
/// accepts).
pub fn check_head_range(heads: &Range<usize>, count: usize) -> Result<()> {
    if heads.is_empty() || heads.end > count {
        return Err(Error::InvalidConfig(format!(
            "heads {heads:?} asked of {count} heads"
        )));
    }
    Ok(())
}

/// Checks that `heads` read hidden states of `model`'s width.
pub fn check_heads<H: TokenHeads + ?Sized, D: HiddenStates + ?Sized>(
    heads: &H,
    model: &D,
) -> Result<()> {
    check_width(heads.hidden_size(), model.hidden_size())
}

/// Fails unless heads reading states `heads` wide fit a model's `model` wide ones.
fn check_width(heads: usize, model: usize) -> Result<()> {
    if heads != model {
        return Err(Error::InvalidConfig(format!(
            "the heads read hidden states of width {heads}, the model's are {model} wide"
        )));
    }
    Ok(())
}

/// The heads' tree after the root from the target's hidden state, or from the heads' rows when
/// the last verification computed them ([`Verification::WithGuesses`]): a drafter that costs
/// no target forward, since every verifying forward also gives the hidden state the heads read
/// next. Counted as one draft pass a step. Heads draft from a shared reference: `&mut &heads`.
impl<H: TokenHeads> TreeDrafter for &HeadsDrafter<H> {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        self.draft_input(input, &mut |_, _| {})
    }
    fn reads_hidden(&self) -> bool {
        true
    }
    fn finish(&mut self, _committed: &[u32]) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
