//! SpecASR's drafting ("SpecASR: Accelerating LLM-based Automatic Speech Recognition via
//! Speculative Decoding", §IV): a small model's transcript of the same audio agrees with the
//! target's almost everywhere, so drafts are long, rejected drafts are reused, and uncertainty
//! is local.
//!
//! - **Adaptive single-sequence drafting** (§IV-A): the draft continues while its confidence
//!   (the probability of its top token) stays at or above a threshold (0.4), up to 24 tokens;
//!   the first uncertain token ends the draft (it is still proposed).
//! - **Draft recycling** (§IV-B): after a rejection, the rejected draft's tail is realigned
//!   behind the target's correction (as a substitution: the tokens after the rejected one keep
//!   their offsets) and fed to the draft in the same forward that catches its cache up; the
//!   tail's tokens are kept while the draft, now conditioned on the correction, still predicts
//!   them, so only what changed is drafted again one token at a time.
//! - **Two-pass sparse token tree** (§IV-C): the first pass drafts the trunk without stopping,
//!   marking its uncertain positions; the second pass forwards every marked position's
//!   runner-up token at once (each attending to the trunk before it through a tree mask) and
//!   extends each by the draft's next token; a branch whose next token rejoins the trunk
//!   carries the trunk's remainder, so a one-token substitution does not end the round. The
//!   target verifies the whole tree in one forward.
//!
//! [`SpecAsrDrafter`] is a [`TreeDrafter`]: [`speculate`](crate::speculate()) verifies its
//! trees (for Whisper, with its logit rules as the rows' adjustment); with greedy acceptance the
//! output is the target's greedy output.

use candle_core::Tensor;

use crate::continuation::forward_continuation;
use crate::decoder::{rewind_to_prefix, Decoder, Forward};
use crate::draft::{draft_chain, DraftInput, TreeDraft, TreeDrafter};
use crate::logits::Logits;
use crate::sampling::top_two_confidence;
use crate::tree::TokenTree;
use crate::{Error, Result};

/// Settings of a [`SpecAsrDrafter`]; the presets are the paper's ablation ladder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecAsrConfig {
    /// A drafted token is uncertain when the draft's top probability is below this (paper:
    /// 0.4 on normalized logits).
    pub threshold: f32,
    /// Longest draft (paper: 24).
    pub max_len: usize,
    /// End the draft at its first uncertain token (adaptive length); otherwise always draft
    /// `max_len` tokens (plain speculative decoding's fixed γ).
    pub adaptive: bool,
    /// Reuse the tail of a rejected draft.
    pub recycle: bool,
    /// Two-pass sparse tree: branch at up to this many uncertain positions (the least
    /// confident first); 0 drafts a single sequence.
    pub branches: usize,
    /// Draft only where it pays: an engine measures what a round costs per token against
    /// plain decoding's step and decodes without the draft when drafting loses (engine-asr
    /// decides per window). The drafter itself ignores it.
    pub cost_aware: bool,
}

impl SpecAsrConfig {
    /// Plain speculative decoding: `gamma` tokens every round, nothing reused.
    pub fn plain(gamma: usize) -> Self {
        Self {
            threshold: 0.4,
            max_len: gamma,
            adaptive: false,
            recycle: false,
            branches: 0,
            cost_aware: false,
        }
    }

    /// Adaptive single-sequence drafting (threshold 0.4, at most 24 tokens).
    pub fn adaptive() -> Self {
        Self {
            threshold: 0.4,
            max_len: 24,
            adaptive: true,
            recycle: false,
            branches: 0,
            cost_aware: false,
        }
    }

    /// Adaptive drafting with draft recycling.
    pub fn recycling() -> Self {
        Self {
            recycle: true,
            ..Self::adaptive()
        }
    }

    /// Recycling with the two-pass sparse tree (top-2 at up to 4 uncertain positions); the
    /// trunk is drafted to full length, uncertainty marks branches instead of ending it.
    pub fn sparse_tree() -> Self {
        Self {
            adaptive: false,
            branches: 4,
            ..Self::recycling()
        }
    }

    /// These settings, drafting only where it pays.
    pub fn cost_aware(self) -> Self {
        Self {
            cost_aware: true,
            ..self
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.max_len == 0 {
            return Err(Error::InvalidConfig("a draft needs max_len >= 1".into()));
        }
        if !(0.0..=1.0).contains(&self.threshold) {
            return Err(Error::InvalidConfig(format!(
                "the confidence threshold must be in [0, 1], got {}",
                self.threshold
            )));
        }
        Ok(())
    }
}

impl Default for SpecAsrConfig {
    /// The full method, [`SpecAsrConfig::sparse_tree`], drafting only where it pays.
    fn default() -> Self {
        Self::sparse_tree().cost_aware()
    }
}

/// Adjusts a draft row before a token is chosen from it (an engine's logit rules), given the
/// whole sequence before the predicted position.
pub type RowAdjust = Box<dyn FnMut(&[u32], &mut [f32]) + Send>;

/// What the drafter did over its life, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecAsrCounts {
    /// Trunk tokens proposed.
    pub drafted: usize,
    /// Of those, tokens taken from a previous draft's tail instead of drafted one by one.
    pub recycled: usize,
    /// Branch nodes proposed by the second pass.
    pub branch_nodes: usize,
    /// Rounds whose trunk ended at an uncertain token (adaptive length).
    pub early_stops: usize,
}

/// A trunk token with what the draft thought of it.
#[derive(Clone, Copy, Debug)]
struct Drafted {
    token: u32,
    confidence: f32,
    runner_up: Option<u32>,
}

/// Judges a draft row after `sequence`: the row (adjusted by `adjust`)'s top token, its
/// probability and the runner-up.
fn judge(adjust: &mut Option<RowAdjust>, sequence: &[u32], mut row: Vec<f32>) -> Drafted {
    if let Some(adjust) = adjust.as_mut() {
        adjust(sequence, &mut row);
    }
    let (token, runner_up, confidence) = top_two_confidence(&row);
    Drafted {
        token,
        confidence,
        runner_up,
    }
}

/// When a trunk ends.
struct TrunkEnd<'a> {
    config: &'a SpecAsrConfig,
    end_token: Option<u32>,
    depth: usize,
}

impl TrunkEnd<'_> {
    /// Whether the trunk ends after `drafted`, its `len`-th token (counting an early stop of
    /// the adaptive length in `counts`).
    fn after(&self, drafted: &Drafted, len: usize, counts: &mut SpecAsrCounts) -> bool {
        if len >= self.depth || Some(drafted.token) == self.end_token {
            return true;
        }
        let uncertain = drafted.confidence < self.config.threshold;
        if uncertain && self.config.adaptive && self.config.branches == 0 {
            counts.early_stops += 1;
            return true;
        }
        false
    }
}

/// SpecASR's drafter over a draft model with the target's vocabulary. See the module docs.
pub struct SpecAsrDrafter<D> {
    model: D,
    config: SpecAsrConfig,
    adjust: Option<RowAdjust>,
    end_token: Option<u32>,
    /// The last round's trunk and the committed length it was drafted after.
    previous: Option<(usize, Vec<u32>)>,
    counts: SpecAsrCounts,
}

impl<D: Decoder> SpecAsrDrafter<D> {
    /// Wraps a draft model with the target's vocabulary.
    pub fn new(model: D, config: SpecAsrConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            model,
            config,
            adjust: None,
            end_token: None,
            previous: None,
            counts: SpecAsrCounts::default(),
        })
    }

    /// Stops every draft path after `token` (the end of the transcript).
    pub fn with_end_token(mut self, token: u32) -> Self {
        self.end_token = Some(token);
        self
    }

    /// Applies `adjust` to every draft row before choosing from it; `None` removes it.
    pub fn set_adjust(&mut self, adjust: Option<RowAdjust>) {
        self.adjust = adjust;
    }

    pub fn config(&self) -> &SpecAsrConfig {
        &self.config
    }

    pub fn set_config(&mut self, config: SpecAsrConfig) -> Result<()> {
        config.validate()?;
        self.config = config;
        self.previous = None;
        Ok(())
    }

    pub fn model(&self) -> &D {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut D {
        &mut self.model
    }

    pub fn counts(&self) -> SpecAsrCounts {
        self.counts
    }

    /// Forgets the previous draft (a new utterance).
    pub fn forget(&mut self) {
        self.previous = None;
    }

    /// The previous trunk's tail realigned after `committed`: the trunk's tokens from the
    /// offset `committed` has reached, when `committed` went past the trunk's first
    /// disagreement with it.
    fn recyclable_tail(&self, committed: &[u32]) -> Vec<u32> {
        let Some((base, trunk)) = &self.previous else {
            return Vec::new();
        };
        if !self.config.recycle || committed.len() <= *base {
            return Vec::new();
        }
        let new = &committed[*base..];
        let agreed = new.iter().zip(trunk).take_while(|(a, b)| a == b).count();
        if agreed == new.len().min(trunk.len()) || new.len() >= trunk.len() {
            return Vec::new();
        }
        trunk[new.len()..].to_vec()
    }

    /// First pass: the trunk after `committed`, at most `depth` tokens. Leaves the draft's
    /// cache holding `committed` and every trunk token but the last.
    fn draft_trunk(&mut self, committed: &[u32], depth: usize) -> Result<(Vec<Drafted>, usize)> {
        let mut tail = self.recyclable_tail(committed);
        tail.truncate(depth.saturating_sub(1));
        // One forward catches the draft up with `committed` and checks the recycled tail.
        let rows = forward_continuation(&mut self.model, committed, &tail)?;
        let end = TrunkEnd {
            config: &self.config,
            end_token: self.end_token,
            depth,
        };
        let mut sequence = committed.to_vec();
        let mut trunk: Vec<Drafted> = Vec::new();
        // Rows of the recycled tail: keep its tokens while the draft still predicts them.
        for (row, recycled) in rows.rows().zip(tail.iter().map(Some).chain([None])) {
            let drafted = judge(&mut self.adjust, &sequence, row.to_vec());
            trunk.push(drafted);
            sequence.push(drafted.token);
            if end.after(&drafted, trunk.len(), &mut self.counts) {
                self.model.truncate(committed.len() + trunk.len() - 1)?;
                return Ok((trunk, 1));
            }
            if recycled != Some(&drafted.token) {
                break;
            }
            self.counts.recycled += 1;
        }
        // The rest one token at a time, after positions of the tail past the first
        // disagreement (tokens no longer drafted) are rolled back.
        self.model.truncate(committed.len() + trunk.len() - 1)?;
        let (adjust, counts) = (&mut self.adjust, &mut self.counts);
        let (_, more) = draft_chain(
            &mut self.model,
            &sequence,
            depth - trunk.len(),
            &mut |rest, row| {
                let before: Vec<u32> = sequence.iter().chain(rest).copied().collect();
                let drafted = judge(adjust, &before, row);
                trunk.push(drafted);
                Ok((drafted.token, end.after(&drafted, trunk.len(), counts)))
            },
        )?;
        Ok((trunk, 1 + more))
    }

    /// Second pass: the runner-ups at the least confident trunk positions, forwarded together
    /// after the trunk (each sees only the trunk before it), each extended by the draft's next
    /// token; added to `tree` as branches. Returns the forwards spent (0 or 1).
    fn add_branches(
        &mut self,
        committed: &[u32],
        trunk: &[Drafted],
        depth: usize,
        tree: &mut TokenTree,
    ) -> Result<usize> {
        let mut marked: Vec<usize> = (0..trunk.len())
            .filter(|&i| {
                trunk[i].confidence < self.config.threshold
                    && trunk[i].runner_up.is_some()
                    && Some(trunk[i].token) != self.end_token
            })
            .collect();
        marked.sort_by(|&a, &b| trunk[a].confidence.total_cmp(&trunk[b].confidence));
        marked.truncate(self.config.branches);
        marked.sort_unstable();
        let room = self.model.max_len().saturating_sub(self.model.cached_len());
        marked.truncate(room);
        if marked.is_empty() {
            return Ok(0);
        }
        let cached = self.model.cached_len();
        let base = committed.len();
        let alternatives: Vec<u32> = marked
            .iter()
            .map(|&i| {
                trunk[i]
                    .runner_up
                    .expect("marked positions have a runner-up")
            })
            .collect();
        let positions: Vec<usize> = marked.iter().map(|&i| base + i).collect();
        let n = alternatives.len();
        let width = cached + n;
        let mut bias = vec![f32::NEG_INFINITY; n * width];
        for (k, &i) in marked.iter().enumerate() {
            // The committed tokens and the trunk before position i, then itself.
            bias[k * width..k * width + base + i].fill(0.0);
            bias[k * width + cached + k] = 0.0;
        }
        let mask = Tensor::from_vec(bias, (1, 1, n, width), self.model.device())?;
        let step = Forward::tokens(&alternatives, &positions).with_mask(&mask);
        let n_rows = step.validate(cached)?;
        let rows =
            Logits::from_tensor(&self.model.forward(&step)?, n_rows, self.model.vocab_size())?;
        self.model.truncate(cached)?;
        let budget = 2 * self.config.max_len;
        for (k, &i) in marked.iter().enumerate() {
            let alternative = alternatives[k];
            // Trunk token i is node i + 1; its parent is node i.
            let node = tree.push(i, alternative)?;
            self.counts.branch_nodes += 1;
            if Some(alternative) == self.end_token || i + 2 > depth || tree.len() >= budget {
                continue;
            }
            let mut sequence: Vec<u32> = committed.to_vec();
            sequence.extend(trunk[..i].iter().map(|d| d.token));
            sequence.push(alternative);
            let next = judge(&mut self.adjust, &sequence, rows.row(k).to_vec());
            let mut node = tree.push(node, next.token)?;
            self.counts.branch_nodes += 1;
            if Some(next.token) == self.end_token {
                continue;
            }
            // The branch rejoins the trunk: carry the trunk's remainder (recycling).
            if trunk.get(i + 1).is_some_and(|d| d.token == next.token) {
                for d in trunk.iter().take(depth).skip(i + 2) {
                    if tree.len() >= budget {
                        break;
                    }
                    node = tree.push(node, d.token)?;
                    self.counts.branch_nodes += 1;
                }
            }
        }
        Ok(1)
    }
}

impl<D: Decoder> TreeDrafter for SpecAsrDrafter<D> {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        let (root, committed, max_depth) = (input.root()?, input.committed, input.max_depth);
        let room = self.model.max_len().saturating_sub(committed.len() + 1);
        let depth = self.config.max_len.min(max_depth).min(room);
        if depth == 0 {
            return Ok(TreeDraft::new(TokenTree::new(root), 0));
        }
        let (trunk, mut forwards) = self.draft_trunk(committed, depth)?;
        self.counts.drafted += trunk.len();
        let tokens: Vec<u32> = trunk.iter().map(|d| d.token).collect();
        let mut tree = TokenTree::linear(root, &tokens);
        if self.config.branches > 0 {
            forwards += self.add_branches(committed, &trunk, depth, &mut tree)?;
        }
        self.previous = Some((committed.len(), tokens));
        Ok(TreeDraft::new(tree, forwards))
    }

    fn finish(&mut self, committed: &[u32]) -> Result<()> {
        self.previous = None;
        rewind_to_prefix(&mut self.model, committed).map(|_| ())
    }
}

impl<D: std::fmt::Debug> std::fmt::Debug for SpecAsrDrafter<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecAsrDrafter")
            .field("model", &self.model)
            .field("config", &self.config)
            .field("end_token", &self.end_token)
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::{MockConfig, MockDecoder};
    use crate::sampling::{argmax, max_probability, top_k_tokens};

    const PROMPT: [u32; 3] = [5, 9, 2];

    /// The model's greedy continuation of `context`, `n` tokens.
    fn greedy(config: &MockConfig, context: &[u32], n: usize) -> Vec<u32> {
        let m = MockDecoder::new(config.clone());
        let mut seq = context.to_vec();
        for _ in 0..n {
            let next = argmax(&m.logits_for(&seq, seq.len() - 1));
            seq.push(next);
        }
        seq[context.len()..].to_vec()
    }

    fn drafter(config: SpecAsrConfig) -> (MockConfig, SpecAsrDrafter<MockDecoder>) {
        let model = MockConfig::target(32, 7);
        let d = SpecAsrDrafter::new(MockDecoder::new(model.clone()), config).unwrap();
        (model, d)
    }

    fn trunk_of(tree: &TokenTree) -> Vec<u32> {
        let mut node = 0;
        let mut tokens = Vec::new();
        while let Some(child) = tree.children(node).next() {
            tokens.push(tree.token(child));
            node = child;
        }
        tokens
    }

    #[test]
    fn adaptive_drafts_end_at_the_first_uncertain_token() {
        let never_sure = SpecAsrConfig {
            threshold: 1.0,
            ..SpecAsrConfig::adaptive()
        };
        let (model, mut d) = drafter(never_sure);
        let draft = d.draft_tree(DraftInput::new(&PROMPT, 30)).unwrap();
        assert_eq!(
            draft.tree.len(),
            2,
            "one uncertain token, then verification"
        );
        assert_eq!(draft.forwards, 1);
        assert_eq!(d.counts().early_stops, 1);
        let always_sure = SpecAsrConfig {
            threshold: 0.0,
            ..SpecAsrConfig::adaptive()
        };
        d.set_config(always_sure).unwrap();
        let draft = d.draft_tree(DraftInput::new(&PROMPT, 30)).unwrap();
        assert_eq!(trunk_of(&draft.tree), greedy(&model, &PROMPT, 24));
        assert_eq!(draft.forwards, 24);
        // The target's room caps the draft.
        let draft = d.draft_tree(DraftInput::new(&PROMPT, 5)).unwrap();
        assert_eq!(draft.tree.len(), 6);
    }

    #[test]
    fn a_rejected_drafts_tail_is_reused_where_the_draft_still_predicts_it() {
        let config = SpecAsrConfig {
            threshold: 0.0,
            max_len: 9,
            ..SpecAsrConfig::recycling()
        };
        let (model, mut d) = drafter(config);
        let g = greedy(&model, &PROMPT, 12);
        // The last round drafted g0, X, g2 … g8 after the prompt; the target kept g0 and
        // corrected X to g1.
        let mut previous = g[..9].to_vec();
        previous[1] = (g[1] + 1) % 32;
        d.previous = Some((PROMPT.len(), previous));
        let committed: Vec<u32> = PROMPT.iter().chain(&g[..2]).copied().collect();
        let before = d.model().forward_count();
        let draft = d.draft_tree(DraftInput::new(&committed, 30)).unwrap();
        assert_eq!(trunk_of(&draft.tree), g[2..11].to_vec());
        assert_eq!(d.counts().recycled, 7, "g2 … g8 came from the old draft");
        assert_eq!(
            draft.forwards, 2,
            "one forward for the tail, one for g9 → g10"
        );
        assert_eq!(d.model().forward_count() - before, 2);
        // The cache holds the committed tokens and the trunk but its last token.
        let mut cached = committed.clone();
        cached.extend_from_slice(&g[2..10]);
        assert_eq!(d.model().cached_tokens(), cached);

        // A tail the draft no longer predicts is dropped after one row.
        let (_, mut fresh) = drafter(config);
        let mut wrong = g[..9].to_vec();
        wrong[1] = (g[1] + 1) % 32;
        for t in &mut wrong[2..] {
            *t = (*t + 3) % 32;
        }
        fresh.previous = Some((PROMPT.len(), wrong));
        let draft = fresh.draft_tree(DraftInput::new(&committed, 30)).unwrap();
        assert_eq!(trunk_of(&draft.tree), g[2..11].to_vec());
        assert_eq!(fresh.counts().recycled, 0);
        assert_eq!(draft.forwards, 9);
    }

    #[test]
    fn the_second_pass_branches_at_the_least_confident_positions() {
        let config = SpecAsrConfig {
            threshold: 1.0,
            max_len: 6,
            adaptive: false,
            recycle: false,
            branches: 2,
            cost_aware: false,
        };
        let (model, mut d) = drafter(config);
        let draft = d.draft_tree(DraftInput::new(&PROMPT, 30)).unwrap();
        let trunk = greedy(&model, &PROMPT, 6);
        assert_eq!(trunk_of(&draft.tree), trunk);
        assert_eq!(
            draft.forwards,
            6 + 1,
            "the trunk, then one forward for all branches"
        );
        // The second pass left the cache as the first did.
        let mut cached = PROMPT.to_vec();
        cached.extend_from_slice(&trunk[..5]);
        assert_eq!(d.model().cached_tokens(), cached);
        // Every branch: the runner-up at a trunk position, then the draft's next token.
        let oracle = MockDecoder::new(model.clone());
        let confidence = |i: usize| {
            let mut seq = PROMPT.to_vec();
            seq.extend_from_slice(&trunk[..i]);
            let row = oracle.logits_for(&seq, seq.len() - 1);
            (max_probability(&row), top_k_tokens(&row, 2)[1])
        };
        let mut expected: Vec<usize> = (0..6).collect();
        expected.sort_by(|&a, &b| confidence(a).0.total_cmp(&confidence(b).0));
        expected.truncate(2);
        expected.sort_unstable();
        let branch_roots: Vec<usize> = (7..draft.tree.len())
            .filter(|&n| draft.tree.parent(n).is_some_and(|p| p <= 6))
            .collect();
        assert_eq!(branch_roots.len(), 2);
        for (&node, &i) in branch_roots.iter().zip(&expected) {
            assert_eq!(draft.tree.parent(node), Some(i));
            assert_eq!(draft.tree.token(node), confidence(i).1);
            let mut seq = PROMPT.to_vec();
            seq.extend_from_slice(&trunk[..i]);
            seq.push(confidence(i).1);
            let next = argmax(&oracle.logits_for(&seq, seq.len() - 1));
            let child = draft.tree.children(node).next().expect("an extension");
            assert_eq!(draft.tree.token(child), next);
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let zero = SpecAsrConfig {
            max_len: 0,
            ..SpecAsrConfig::default()
        };
        assert!(SpecAsrDrafter::new(MockDecoder::new(MockConfig::target(8, 1)), zero).is_err());
        let above_one = SpecAsrConfig {
            threshold: 1.5,
            ..SpecAsrConfig::default()
        };
        assert!(above_one.validate().is_err());
    }
}
