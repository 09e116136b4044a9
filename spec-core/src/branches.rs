//! Several continuations of one context decoded in lockstep: one forward advances every open
//! branch by its pending tokens (beyond the papers: PredGen answers several candidate
//! completions of a question being spoken this way).
//!
//! The branches share the decoder's first `shared` cached positions; each branch's own
//! positions lie after them, interleaved with the other branches' in the order they were
//! forwarded. A branch's rows attend to the shared context and to its own positions only, with
//! the position ids it would have alone, so on a batch-invariant model every branch computes
//! exactly what decoding it alone computes. A branch can fork: the fork shares the forwarded
//! tokens it starts with, positions and all, so a tree of continuations costs each token
//! once. [`Branches::select`] compacts the cache to one branch, which then continues as an
//! ordinary sequence.

use candle_core::Tensor;

use crate::decoder::{forward_tokens, rewind_to_prefix, Decoder, Forward, LogitRows};
use crate::generate::{FinishReason, StopConditions};
use crate::heads::HiddenStates;
use crate::logits::Logits;
use crate::sampling::argmax;
use crate::{Error, Result};

/// Branches after a shared context; see the module documentation.
#[derive(Clone, Debug)]
pub struct Branches {
    shared: usize,
    branches: Vec<Branch>,
    /// Cached positions the decoder holds once every forwarded token is in it.
    cached: usize,
}

#[derive(Clone, Debug)]
struct Branch {
    /// Cache position of each forwarded token, in order.
    slots: Vec<usize>,
    /// The forwarded tokens (one per slot), then the pending ones.
    tokens: Vec<u32>,
    open: bool,
}

/// What a [`Branches::step`] gave one branch.
#[derive(Clone, Debug, PartialEq)]
pub struct BranchLogits {
    pub branch: usize,
    /// The step's input row of the branch's last token (its row of the decoder's hidden states).
    pub row: usize,
    /// The logits after the branch's last token.
    pub logits: Vec<f32>,
}

impl Branches {
    /// Branches continuing the decoder's first `shared` cached positions (at least one: a
    /// branch set continues a context).
    pub fn new(shared: usize) -> Result<Self> {
        if shared == 0 {
            return Err(Error::EmptyInput(
                "branches continue a context of at least one cached position",
            ));
        }
        Ok(Self {
            shared,
            branches: Vec::new(),
            cached: shared,
        })
    }

    /// Positions every branch shares.
    pub fn shared(&self) -> usize {
        self.shared
    }

    /// Opens a branch whose first tokens are `tokens` (forwarded by the next step) and returns
    /// its index.
    pub fn open(&mut self, tokens: Vec<u32>) -> usize {
        self.branches.push(Branch {
            slots: Vec::new(),
            tokens,
            open: true,
        });
        self.branches.len() - 1
    }

    /// Opens a branch that shares the first `len` tokens of `branch`, already forwarded, with
    /// their cache positions (nothing is forwarded again), and returns its index.
    pub fn fork(&mut self, branch: usize, len: usize) -> Result<usize> {
        let parent = self.branch_mut(branch)?;
        if len > parent.slots.len() {
            return Err(Error::InvalidConfig(format!(
                "a fork of branch {branch} shares {len} tokens, but {} are forwarded",
                parent.slots.len()
            )));
        }
        let fork = Branch {
            slots: parent.slots[..len].to_vec(),
            tokens: parent.tokens[..len].to_vec(),
            open: true,
        };
        self.branches.push(fork);
        Ok(self.branches.len() - 1)
    }

    /// Appends a token to `branch`, forwarded by the next step.
    pub fn push(&mut self, branch: usize, token: u32) -> Result<()> {
        self.branch_mut(branch)?.tokens.push(token);
        Ok(())
    }

    /// Stops forwarding `branch`: its positions stay cached (masked from the others) until
    /// [`Branches::select`].
    pub fn close(&mut self, branch: usize) -> Result<()> {
        self.branch_mut(branch)?.open = false;
        Ok(())
    }

    /// True while some open branch has tokens to forward.
    pub fn has_pending(&self) -> bool {
        self.branches
            .iter()
            .any(|b| b.open && b.tokens.len() > b.slots.len())
    }

    /// Every token of `branch` after the shared context, forwarded or pending.
    pub fn tokens(&self, branch: usize) -> &[u32] {
        self.branches.get(branch).map_or(&[], |b| &b.tokens)
    }

    /// One forward of the open branches' pending tokens, at most `max_inputs` of them (the
    /// branches in order, the last one taken perhaps only in part, so that no step grows long);
    /// returns the logits after the last token of each branch forwarded whole, by branch. Fails
    /// if the decoder's cache changed since the last step.
    pub fn step<D: Decoder + ?Sized>(
        &mut self,
        decoder: &mut D,
        max_inputs: usize,
    ) -> Result<Vec<BranchLogits>> {
        if max_inputs == 0 {
            return Err(Error::InvalidConfig(
                "a step of branches needs room for at least one input".into(),
            ));
        }
        self.check_cache(decoder)?;
        // (branch, tokens forwarded now, whether that is all it has pending)
        let mut forwarded: Vec<(usize, usize, bool)> = Vec::new();
        let mut room = max_inputs;
        for (index, branch) in self.branches.iter().enumerate() {
            let pending = branch.tokens.len() - branch.slots.len();
            if !branch.open || pending == 0 || room == 0 {
                continue;
            }
            let taken = pending.min(room);
            room -= taken;
            forwarded.push((index, taken, taken == pending));
        }
        let n = max_inputs - room;
        if n == 0 {
            return Ok(Vec::new());
        }
        let width = self.cached + n;
        let mut bias = vec![f32::NEG_INFINITY; n * width];
        let mut inputs = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        let mut last_rows = Vec::with_capacity(forwarded.len());
        for &(index, taken, _) in &forwarded {
            let branch = &self.branches[index];
            let first_new = self.cached + inputs.len();
            let first_row = inputs.len();
            for j in 0..taken {
                let row = &mut bias[(first_row + j) * width..(first_row + j + 1) * width];
                row[..self.shared].fill(0.0);
                for &slot in &branch.slots {
                    row[slot] = 0.0;
                }
                row[first_new..=first_new + j].fill(0.0);
                positions.push(self.shared + branch.slots.len() + j);
            }
            let first_taken = branch.slots.len();
            inputs.extend_from_slice(&branch.tokens[first_taken..first_taken + taken]);
            last_rows.push(first_row + taken - 1);
        }
        let mask = Tensor::from_vec(bias, (1, 1, n, width), decoder.device())?;
        let step = Forward::tokens(&inputs, &positions).with_mask(&mask);
        let rows = step.validate(self.cached)?;
        let logits = Logits::from_tensor(&decoder.forward(&step)?, rows, decoder.vocab_size())?;
        let mut slot = self.cached;
        for &(index, taken, _) in &forwarded {
            let branch = &mut self.branches[index];
            branch.slots.extend(slot..slot + taken);
            slot += taken;
        }
        self.cached = slot;
        Ok(forwarded
            .iter()
            .zip(last_rows)
            .filter(|((_, _, whole), _)| *whole)
            .map(|(&(branch, _, _), row)| BranchLogits {
                branch,
                row,
                logits: logits.row(row).to_vec(),
            })
            .collect())
    }

    /// Keeps the shared context and `branch`'s forwarded tokens in the decoder's cache, in
    /// order, dropping every other branch: the decoder then holds the branch as one sequence.
    pub fn select<D: Decoder + ?Sized>(self, decoder: &mut D, branch: usize) -> Result<()> {
        let chosen = self.branches.get(branch).ok_or_else(|| {
            Error::InvalidConfig(format!("no branch {branch} among {}", self.branches.len()))
        })?;
        self.check_cache(decoder)?;
        if chosen.slots.is_empty() {
            return decoder.truncate(self.shared);
        }
        // The last shared position leads the list: everything before it stays where it is.
        let mut keep = Vec::with_capacity(chosen.slots.len() + 1);
        keep.push(self.shared - 1);
        keep.extend_from_slice(&chosen.slots);
        decoder.keep_positions(&keep)
    }

    /// Fails if the decoder's cache changed since the last step.
    fn check_cache<D: Decoder + ?Sized>(&self, decoder: &D) -> Result<()> {
        match decoder.cached_len() == self.cached {
            true => Ok(()),
            false => Err(Error::InputShape(format!(
                "the branches expect {} cached positions, the decoder holds {}",
                self.cached,
                decoder.cached_len()
            ))),
        }
    }

    fn branch_mut(&mut self, branch: usize) -> Result<&mut Branch> {
        let count = self.branches.len();
        self.branches
            .get_mut(branch)
            .ok_or_else(|| Error::InvalidConfig(format!("no branch {branch} among {count}")))
    }
}

/// Most input rows of one lockstep step: the contexts' first step is cut into forwards of this
/// many rows, each returning a logits row per input.
const LOCKSTEP_ROWS: usize = 64;

/// A greedy answer decoded by [`greedy_in_lockstep`].
#[derive(Clone, Debug)]
pub struct LockstepAnswer {
    /// The answer's tokens, an end-of-sequence token that ended it included.
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    /// The model's final hidden state that predicted each token, `[tokens.len(), hidden_size]`.
    pub hidden: Tensor,
}

/// Greedy answers to several contexts `shared ++ tails[i]` decoded in lockstep: `shared` is
/// forwarded once (or kept, if the model's cache already begins with it), then each forward
/// advances every unfinished answer by one token. On a batch-invariant model each answer and
/// each of its hidden states is exactly what greedy [`generate`](crate::generate()) and a
/// teacher-forced forward give for that context alone; on a CPU one forward of `n` rows costs
/// far less than `n` forwards of one (self-distilled training data is made this way).
///
/// Every tail needs at least one token. Answers stop as `stop` says; when the cache cannot hold
/// another step, the unfinished ones end with [`FinishReason::ContextFull`]. The model's cache
/// is left holding `shared`.
pub fn greedy_in_lockstep<D: HiddenStates + ?Sized>(
    model: &mut D,
    shared: &[u32],
    tails: &[Vec<u32>],
    stop: &StopConditions,
) -> Result<Vec<LockstepAnswer>> {
    if shared.is_empty() {
        return Err(Error::EmptyInput(
            "answers in lockstep share a context of at least one token",
        ));
    }
    if tails.iter().any(Vec::is_empty) {
        return Err(Error::EmptyInput(
            "each context needs at least one token after the shared one",
        ));
    }
    let prompts = shared.len() + tails.iter().map(Vec::len).sum::<usize>();
    if prompts > model.max_len() {
        return Err(Error::ContextOverflow {
            requested: prompts,
            max: model.max_len(),
        });
    }
    let keep = rewind_to_prefix(model, shared)?;
    forward_tokens(model, &shared[keep..], LogitRows::Last(1))?;
    let mut branches = Branches::new(shared.len())?;
    let nothing_wanted = stop.max_new_tokens == 0;
    for tail in tails {
        let branch = branches.open(tail.clone());
        if nothing_wanted {
            branches.close(branch)?;
        }
    }
    let finish = nothing_wanted.then_some(FinishReason::MaxTokens);
    let mut answers: Vec<(Vec<u32>, Vec<Tensor>, Option<FinishReason>)> =
        vec![(Vec::new(), Vec::new(), finish); tails.len()];
    while branches.has_pending() {
        let rows = LOCKSTEP_ROWS.min(model.max_len() - model.cached_len());
        if rows == 0 {
            break;
        }
        let stepped = branches.step(model, rows)?;
        let hidden = model.last_hidden()?;
        for BranchLogits {
            branch,
            row,
            logits,
        } in stepped
        {
            let (tokens, states, finish) = &mut answers[branch];
            let token = argmax(&logits);
            tokens.push(token);
            states.push(hidden.narrow(0, row, 1)?);
            *finish = stop.check(tokens);
            match finish {
                Some(_) => branches.close(branch)?,
                None => branches.push(branch, token)?,
            }
        }
    }
    model.truncate(shared.len())?;
    let width = model.hidden_size();
    answers
        .into_iter()
        .map(|(tokens, states, finish)| {
            let hidden = match states.is_empty() {
                true => Tensor::zeros((0, width), candle_core::DType::F32, model.device())?,
                false => Tensor::cat(&states, 0)?,
            };
            Ok(LockstepAnswer {
                tokens,
                finish: finish.unwrap_or(FinishReason::ContextFull),
                hidden,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::{forward_tokens, LogitRows};
    use crate::mock::{MockConfig, MockDecoder};
    use crate::sampling::argmax;
    use proptest::prelude::*;

    /// Greedy decoding of `first` then `steps` more tokens after `context`, alone.
    fn alone(model: &MockDecoder, context: &[u32], first: &[u32], steps: usize) -> Vec<u32> {
        let mut model = model.clone();
        model.truncate(0).unwrap();
        forward_tokens(&mut model, context, LogitRows::Last(1)).unwrap();
        let mut tokens = first.to_vec();
        let mut feed = first.to_vec();
        for _ in 0..steps {
            let logits = forward_tokens(&mut model, &feed, LogitRows::Last(1)).unwrap();
            let next = argmax(&logits.into_last_row());
            tokens.push(next);
            feed = vec![next];
        }
        tokens
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Every branch decodes what it decodes alone, whatever the other branches hold, however
        /// many tokens each starts with and however few a step takes, forks included (sharing
        /// all or the first of their branch's tokens, then another token); selecting one
        /// leaves the decoder holding it as one sequence, from which it continues as if never
        /// branched.
        #[test]
        fn lockstep_branches_decode_as_each_alone(
            seed in 0u64..1000,
            context_len in 1usize..6,
            openings in prop::collection::vec(prop::collection::vec(0u32..40, 1..4), 1..5),
            closed_after in prop::collection::vec(1usize..6, 8),
            forks in prop::collection::vec((0usize..8, 1usize..4, 0usize..3), 0..4),
            chosen in 0usize..8,
            max_inputs in 1usize..8,
        ) {
            let mut model = MockDecoder::new(MockConfig::target(40, seed));
            let context: Vec<u32> = (0..context_len as u32).map(|t| (t * 7 + 3) % 40).collect();
            forward_tokens(&mut model, &context, LogitRows::Last(1)).unwrap();
            let mut branches = Branches::new(context.len()).unwrap();
            let mut openings = openings;
            for opening in &openings {
                branches.open(opening.clone());
            }
            let mut steps = vec![0usize; openings.len()];
            while branches.has_pending() {
                for out in branches.step(&mut model, max_inputs).unwrap() {
                    let b = out.branch;
                    steps[b] += 1;
                    let next = argmax(&out.logits);
                    let fork_at = forks.iter().find(|&&(fb, at, _)| (fb, at) == (b, steps[b]));
                    if let Some(&(_, _, unshared)) = fork_at.filter(|_| openings.len() < 8) {
                        let shared = branches.tokens(b).len().saturating_sub(unshared);
                        let fork = branches.fork(b, shared).unwrap();
                        branches.push(fork, (next + 1) % 40).unwrap();
                        openings.push(branches.tokens(fork).to_vec());
                        steps.push(0);
                    }
                    branches.push(b, next).unwrap();
                    if steps[b] == closed_after[b] {
                        branches.close(b).unwrap();
                    }
                }
            }
            for (b, opening) in openings.iter().enumerate() {
                let expected = alone(&model, &context, opening, steps[b]);
                prop_assert_eq!(branches.tokens(b), expected.as_slice());
            }
            let chosen = chosen % openings.len();
            let tokens = branches.tokens(chosen).to_vec();
            branches.select(&mut model, chosen).unwrap();
            // The chosen branch's last token was never forwarded (it was closed with it pending).
            let forwarded = &tokens[..tokens.len() - 1];
            let expected: Vec<u32> = context.iter().chain(forwarded).copied().collect();
            prop_assert_eq!(model.cached_tokens(), expected.as_slice());
            let next = forward_tokens(&mut model, &tokens[tokens.len() - 1..], LogitRows::Last(1))
                .unwrap()
                .into_last_row();
            let whole = alone(&model, &context, &openings[chosen], steps[chosen] + 1);
            prop_assert_eq!(argmax(&next), *whole.last().unwrap());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Answers decoded in lockstep are greedy `generate`'s for each context alone, stopped
        /// by the same conditions, and each hidden state is the teacher-forced one that
        /// predicted its token; the cache is left holding the shared context.
        #[test]
        fn answers_in_lockstep_are_each_contexts_greedy_answer(
            seed in 0u64..1000,
            shared_len in 1usize..5,
            tails in prop::collection::vec(prop::collection::vec(0u32..30, 1..5), 1..6),
            max_new_tokens in 0usize..9,
            eos in 0u32..30,
            cached_first in any::<bool>(),
        ) {
            let mut model = MockDecoder::new(MockConfig::target(30, seed));
            let shared: Vec<u32> = (0..shared_len as u32).map(|t| (t * 11 + 5) % 30).collect();
            if cached_first {
                forward_tokens(&mut model, &shared, LogitRows::Last(1)).unwrap();
            }
            let stop = StopConditions::new(max_new_tokens).with_eos([eos]);
            let answers = greedy_in_lockstep(&mut model, &shared, &tails, &stop).unwrap();
            prop_assert_eq!(model.cached_tokens(), shared.as_slice());
            for (tail, answer) in tails.iter().zip(&answers) {
                let context: Vec<u32> = shared.iter().chain(tail).copied().collect();
                let mut alone = model.clone();
                alone.reset();
                let expected = crate::generate(
                    &mut alone,
                    &context,
                    &crate::SamplingConfig::greedy(),
                    &stop,
                    &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0),
                    &mut |_| {},
                )
                .unwrap();
                prop_assert_eq!(&answer.tokens, &expected.tokens);
                prop_assert_eq!(answer.finish, expected.finish);
                alone.reset();
                let forced: Vec<u32> = context.iter().chain(&answer.tokens).copied().collect();
                forward_tokens(&mut alone, &forced, LogitRows::All).unwrap();
                let teacher = alone
                    .last_hidden()
                    .unwrap()
                    .narrow(0, context.len() - 1, answer.tokens.len())
                    .unwrap();
                prop_assert_eq!(
                    answer.hidden.to_vec2::<f32>().unwrap(),
                    teacher.to_vec2::<f32>().unwrap()
                );
            }
        }
    }

    #[test]
    fn answers_in_lockstep_refuse_empty_contexts_and_end_when_the_cache_is_full() {
        let mut model = MockDecoder::new(MockConfig {
            max_len: 12,
            ..MockConfig::target(20, 3)
        });
        let stop = StopConditions::new(50);
        assert!(greedy_in_lockstep(&mut model, &[], &[vec![1]], &stop).is_err());
        assert!(greedy_in_lockstep(&mut model, &[1], &[vec![2], vec![]], &stop).is_err());
        let overflow = greedy_in_lockstep(&mut model, &[1, 2, 3], &[vec![4; 5], vec![5; 5]], &stop);
        assert!(matches!(
            overflow,
            Err(Error::ContextOverflow {
                requested: 13,
                max: 12
            })
        ));
        // After 2 shared and 2 + 2 own positions, 8 positions are left: each answer's first
        // three tokens are forwarded, and its fourth ends it.
        let answers =
            greedy_in_lockstep(&mut model, &[1, 2], &[vec![3, 4], vec![5, 6]], &stop).unwrap();
        for answer in &answers {
            assert_eq!(answer.finish, FinishReason::ContextFull);
            assert_eq!(answer.hidden.dims()[0], answer.tokens.len());
        }
        assert_eq!(
            answers.iter().map(|a| a.tokens.len()).collect::<Vec<_>>(),
            [4, 4]
        );
    }

    #[test]
    fn a_changed_cache_and_an_empty_context_are_errors() {
        assert!(Branches::new(0).is_err());
        let mut model = MockDecoder::new(MockConfig::target(20, 1));
        forward_tokens(&mut model, &[1, 2, 3], LogitRows::Last(1)).unwrap();
        let mut branches = Branches::new(3).unwrap();
        assert!(branches.step(&mut model, 4).unwrap().is_empty());
        branches.open(vec![4]);
        branches.open(vec![5, 6]);
        assert!(branches.step(&mut model, 0).is_err());
        // Two inputs: branch 0 whole, branch 1 only in part (no logits for it yet).
        let out = branches.step(&mut model, 2).unwrap();
        assert_eq!(out.iter().map(|o| o.branch).collect::<Vec<_>>(), [0]);
        let out = branches.step(&mut model, 2).unwrap();
        assert_eq!(out.iter().map(|o| o.branch).collect::<Vec<_>>(), [1]);
        assert_eq!(model.cached_len(), 6);
        assert_eq!(model.forward_count(), 3);
        model.truncate(5).unwrap();
        branches.push(0, 7).unwrap();
        assert!(branches.step(&mut model, 4).is_err());
        assert!(branches.push(9, 1).is_err());
        assert!(branches.fork(9, 0).is_err());
        // Branch 0's last token is pending: a fork may share only what is forwarded.
        assert!(branches.fork(0, 2).is_err());
        assert_eq!(branches.fork(0, 1).unwrap(), 2);
        assert!(branches.clone().select(&mut model, 0).is_err());
        assert!(branches.select(&mut model, 7).is_err());
    }

    #[test]
    fn a_branch_with_nothing_forwarded_selects_the_shared_context() {
        let mut model = MockDecoder::new(MockConfig::target(20, 2));
        forward_tokens(&mut model, &[1, 2, 3], LogitRows::Last(1)).unwrap();
        let mut branches = Branches::new(3).unwrap();
        branches.open(vec![4, 5]);
        let unforwarded = branches.open(Vec::new());
        branches.step(&mut model, 4).unwrap();
        branches.select(&mut model, unforwarded).unwrap();
        assert_eq!(model.cached_tokens(), &[1, 2, 3]);
    }
}
