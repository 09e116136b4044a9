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
//! trees and [`heads_generate`] is the generic loop.

use std::ops::Range;
use std::time::Instant;

use candle_core::Tensor;

use crate::acceptance::{Acceptance, AcceptanceRule};
use crate::decoder::{Decoder, LogitRows};
use crate::draft::TreeDrafter;
use crate::generate::{
    judge_tree, keep_path, tree_forward, verify_tree_adjusted, Generation, Output, StepLimits,
    TreeRows, TreeVerdict,
};
use crate::logits::Logits;
use crate::sampling::{argmax, max_probability, top_k_tokens};
use crate::stats::DecodeStats;
use crate::tree::TokenTree;
use crate::{Error, Result, StopConditions};

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
    /// ([`verify_tree_guessing`]).
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

    /// Any Medusa choice list; every prefix of a choice must itself be a choice.
    pub fn choices(choices: Vec<Vec<usize>>) -> Result<Self> {
        let tree = Self { choices };
        let widths = tree.widths();
        let candidates: Vec<Vec<u32>> = widths.iter().map(|&w| (0..w as u32).collect()).collect();
        TokenTree::from_choices(0, &candidates, &tree.choices)?;
        Ok(tree)
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
                *w = (*w).max(index + 1);
            }
        }
        widths
    }
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
    /// (`predicted`: a row per head from the first, as [`verify_tree_guessing`] returns them).
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

/// Where a verifying forward's output-layer rows are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputRows {
    /// Every tree node's row in the forward: right when the output layer is memory-bound (a
    /// large vocabulary read from memory once serves every row almost for free).
    #[default]
    Batched,
    /// Only the rows the judging reaches, unembedded from the hidden states one by one: a
    /// rejected draft then costs its pass through the layers but not its output row. Right
    /// when the output layer is compute-bound (it fits in the cache, as Whisper's does).
    OnDemand,
    /// Every node's row and, in the same pass, the heads' guesses for the next step
    /// ([`verify_tree_guessing`]; heads that share the model's output layer only): right for a
    /// small tree where the output layer is memory-bound, as for Whisper's chain of one.
    WithGuesses,
}

/// Verifies `tree` (rooted at the last committed token, not yet in the target's cache) in one
/// forward, as [`verify_tree_adjusted`] does, with the output rows
/// computed as `output_rows` says. Compacts the cache to the accepted path and returns the
/// verdict, the judged rows and the hidden state after the path's last node (`[1, hidden]`),
/// which the heads read next.
pub fn verify_tree_hidden<T: HiddenStates + ?Sized>(
    target: &mut T,
    tree: &TokenTree,
    rule: &dyn Acceptance,
    output_rows: OutputRows,
    adjust: &mut dyn FnMut(usize, &mut [f32]),
) -> Result<(TreeVerdict, TreeRows, Tensor)> {
    let (verdict, judged) = match output_rows {
        OutputRows::WithGuesses => {
            return Err(Error::Unsupported(
                "output rows with the heads' guesses are verified with the heads: \
                 verify_tree_guessing",
            ))
        }
        OutputRows::Batched => verify_tree_adjusted(target, tree, rule, adjust)?,
        OutputRows::OnDemand => {
            let prefix = target.cached_len();
            tree_forward(target, tree, rule, LogitRows::None)?;
            let hidden = target.last_hidden()?;
            let model = &*target;
            let mut fetch = |node: usize| -> Result<Vec<f32>> {
                Ok(model.unembed(&hidden.narrow(0, node, 1)?)?.into_last_row())
            };
            let judged = judge_tree(tree, rule, &mut fetch, adjust)?;
            keep_path(target, prefix, &judged.0.path)?;
            judged
        }
    };
    // The hidden states are the tree forward's, one per node (compaction does not change them).
    let last = *verdict.path.last().expect("the path holds the root");
    Ok((verdict, judged, target.last_hidden()?.narrow(0, last, 1)?))
}

/// [`verify_tree_hidden`] for heads that share the model's output layer
/// ([`TokenHeads::shares_output_layer`]), which also returns the next step's guesses: the one
/// output pass that gives the tree's rows also gives heads `0..guesses`' rows for every node's
/// state (the target's rows first, then each node's heads), and those of the last accepted node
/// come back, tokens outside the heads' shortlist at −∞, for [`HeadsDrafter::draft_predicted`].
/// Where the output layer is memory-bound (a large vocabulary, a few rows) its extra rows cost
/// almost nothing, and the heads' own pass over their output rows is saved. Every output row is
/// computed, as with [`OutputRows::Batched`].
pub fn verify_tree_guessing<T: HiddenStates + ?Sized, H: TokenHeads + ?Sized>(
    target: &mut T,
    tree: &TokenTree,
    rule: &dyn Acceptance,
    heads: &H,
    guesses: usize,
    adjust: &mut dyn FnMut(usize, &mut [f32]),
) -> Result<(TreeVerdict, TreeRows, Tensor, Logits)> {
    if !heads.shares_output_layer() {
        return Err(Error::Unsupported(
            "guesses in the verification's output pass need heads that share the model's output layer",
        ));
    }
    check_head_range(&(0..guesses), heads.count())?;
    let prefix = target.cached_len();
    tree_forward(target, tree, rule, LogitRows::None)?;
    let hidden = target.last_hidden()?;
    let states = heads.output_states(&hidden, 0..guesses)?;
    let nodes = tree.len();
    let rows = target.unembed(&Tensor::cat(&[&hidden, &states], 0)?)?;
    let (vocab_size, expected) = (target.vocab_size(), nodes * (1 + guesses));
    if rows.len() != expected || rows.vocab_size() != vocab_size {
        return Err(Error::LogitsShape {
            got: vec![rows.len(), rows.vocab_size()],
            expected: format!("[{expected}, {vocab_size}]"),
        });
    }
    let (verdict, judged) =
        judge_tree(tree, rule, &mut |node| Ok(rows.row(node).to_vec()), adjust)?;
    keep_path(target, prefix, &verdict.path)?;
    let last = *verdict.path.last().expect("the path holds the root");
    let first_guess = nodes + last * guesses;
    let mut predicted = Vec::with_capacity(guesses * vocab_size);
    for r in first_guess..first_guess + guesses {
        extend_on_shortlist(&mut predicted, rows.row(r), heads.shortlist());
    }
    Ok((
        verdict,
        judged,
        hidden.narrow(0, last, 1)?,
        Logits::from_flat(predicted, vocab_size)?,
    ))
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
    if heads.hidden_size() != model.hidden_size() {
        return Err(Error::InvalidConfig(format!(
            "the heads read hidden states of width {}, the model's are {} wide",
            heads.hidden_size(),
            model.hidden_size()
        )));
    }
    Ok(())
}

/// Decoding with prediction heads: each step the heads' tree after the target's next token is
/// verified in one target forward, which also gives the hidden state for the next step's heads.
/// A `companion` drafter's tree (e.g. a [`LookupDrafter`](crate::LookupDrafter) chain copied
/// from where the last tokens occurred before) is merged into the heads' tree each step, so one
/// forward verifies both (beyond the paper; the heads' one guess and a copied run are right at
/// different places). With [`AcceptanceRule::Greedy`] the output is exactly that of greedy
/// [`generate`](crate::generate()); top-k and threshold acceptance (§III-A, eqs. 9–10) trade
/// exactness for longer accepted runs.
#[allow(clippy::too_many_arguments)]
pub fn heads_generate<T: HiddenStates, H: TokenHeads>(
    target: &mut T,
    drafter: &HeadsDrafter<H>,
    mut companion: Option<&mut dyn TreeDrafter>,
    context: &[u32],
    rule: &AcceptanceRule,
    output_rows: OutputRows,
    stop: &StopConditions,
    on_token: &mut dyn FnMut(u32),
) -> Result<Generation> {
    rule.validate()?;
    check_heads(&drafter.heads, target)?;
    let started = Instant::now();
    let mut stats = DecodeStats::default();
    let mut out = Output::new(stop, on_token);
    let mut committed = context.to_vec();
    let mut hidden = None;
    // The heads' rows for `hidden`, when the last verification computed them.
    let mut predicted = None;
    out.first_token(target, context, &mut stats, &mut committed, |logits, _| {
        rule.correction(logits)
    })?;
    if out.finish.is_none() {
        let state = target.last_hidden()?;
        hidden = Some(state.narrow(0, state.dim(0)? - 1, 1)?);
    }
    while let Some(StepLimits {
        cached,
        room,
        remaining,
    }) = out.next_step(target)
    {
        let state = hidden.take().expect("every step leaves a hidden state");
        let max_depth = remaining.saturating_sub(1).min(room - 1);
        let root = *committed.last().expect("a token was produced");
        let t_draft = Instant::now();
        let mut tree = match predicted.take() {
            Some(rows) => drafter.draft_predicted(rows, root, max_depth, &mut |_, _| {})?,
            None => drafter.draft(&state, root, max_depth, &mut |_, _| {})?,
        };
        stats.draft_forwards += 1;
        if let Some(companion) = companion.as_deref_mut() {
            let draft = companion.draft_tree(&committed, max_depth)?;
            tree.merge(&draft.tree)?;
            stats.draft_forwards += draft.forwards;
        }
        stats.draft_time += t_draft.elapsed();

        let t_verify = Instant::now();
        let (verdict, state) = match output_rows {
            OutputRows::WithGuesses => {
                let guesses = drafter.tree.depth().max(1);
                let (verdict, _, state, rows) = verify_tree_guessing(
                    target,
                    &tree,
                    rule,
                    &drafter.heads,
                    guesses,
                    &mut |_, _| {},
                )?;
                predicted = Some(rows);
                (verdict, state)
            }
            rows => {
                let (verdict, _, state) =
                    verify_tree_hidden(target, &tree, rule, rows, &mut |_, _| {})?;
                (verdict, state)
            }
        };
        hidden = Some(state);
        stats.target_time += t_verify.elapsed();
        out.commit_tree_step(target, &mut committed, cached, &tree, &verdict, &mut stats)?;
    }
    if let Some(companion) = companion {
        companion.finish(&committed)?;
    }
    Ok(out.into_generation(stats, started))
}

#[cfg(test)]
mod tests;
