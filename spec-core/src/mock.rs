//! A deterministic stand-in for a language model, for testing the loops without weights.
//!
//! [`MockDecoder`] is an n-gram model defined by hashing: the logits at a position are a
//! pseudo-random function of the last `window` tokens the position may attend to and of its
//! position id. It honours everything a real decoder must: the cache, rollback, tree-path
//! compaction, explicit position ids and attention masks. A wrong position id or a mask that
//! lets a node see a sibling changes its logits, so tests built on it catch those bugs. A draft
//! is the same function plus seeded noise, so draft and target agree often but not always.

use std::ops::Range;

use candle_core::{Device, Tensor};

use crate::decoder::{check_token_range, Decoder, DecoderInput, Forward, LogitRows};
use crate::heads::{check_head_range, HiddenStates, TokenHeads};
use crate::kv_cache::keep_positions_of;
use crate::logits::Logits;
use crate::sampling::argmax;
use crate::verify::extend_on_shortlist;
use crate::{Error, Result};

/// Parameters of a [`MockDecoder`].
#[derive(Clone, Debug, PartialEq)]
pub struct MockConfig {
    pub vocab_size: usize,
    /// How many preceding visible tokens the logits depend on.
    pub window: usize,
    pub seed: u64,
    /// Scale of the logits: larger gives peakier distributions.
    pub sharpness: f32,
    /// Scale of the seeded noise added to the logits (0 for the target).
    pub noise: f32,
    pub noise_seed: u64,
    pub max_len: usize,
}

impl MockConfig {
    /// A target model over `vocab_size` tokens.
    pub fn target(vocab_size: usize, seed: u64) -> Self {
        Self {
            vocab_size,
            window: 3,
            seed,
            sharpness: 4.0,
            noise: 0.0,
            noise_seed: 0,
            max_len: 4096,
        }
    }

    /// A draft that approximates this model: the same logits plus noise of scale `noise`.
    pub fn draft(&self, noise: f32, noise_seed: u64) -> Self {
        Self {
            noise,
            noise_seed,
            ..self.clone()
        }
    }
}

/// The deterministic mock model. See the module documentation.
#[derive(Clone, Debug)]
pub struct MockDecoder {
    config: MockConfig,
    /// Cached token ids.
    tokens: Vec<u32>,
    forwards: usize,
    device: Device,
    /// The last forward's hidden states (see [`HiddenStates`]).
    hidden: Vec<f32>,
}

impl MockDecoder {
    pub fn new(config: MockConfig) -> Self {
        Self {
            config,
            tokens: Vec::new(),
            forwards: 0,
            device: Device::Cpu,
            hidden: Vec::new(),
        }
    }

    /// Forward passes run so far.
    pub fn forward_count(&self) -> usize {
        self.forwards
    }

    /// Logits after a visible context (tokens in order) for a token at `position`.
    pub fn logits_for(&self, visible: &[u32], position: usize) -> Vec<f32> {
        let context = &visible[visible.len().saturating_sub(self.config.window)..];
        let mut h = mix(self.config.seed ^ 0x5eed);
        for &t in context {
            h = mix(h ^ u64::from(t));
        }
        h = mix(h ^ (position as u64).wrapping_mul(0x9e37_79b9));
        let noise_key = mix(h ^ self.config.noise_seed.wrapping_add(0xabcd));
        (0..self.config.vocab_size as u64)
            .map(|v| {
                let base = unit(mix(h ^ v.wrapping_mul(0x2545_f491)));
                let noise = unit(mix(noise_key ^ v.wrapping_mul(0x6a09_e667)));
                self.config.sharpness * base * base + self.config.noise * noise
            })
            .collect()
    }
}

impl Decoder for MockDecoder {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_len(&self) -> usize {
        self.config.max_len
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn cached_tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn forward(&mut self, step: &Forward<'_>) -> Result<Tensor> {
        let cached = self.tokens.len();
        let rows = step.validate(cached)?;
        let DecoderInput::Tokens(tokens) = step.input else {
            return Err(Error::Unsupported("the mock decoder takes token ids only"));
        };
        let n = tokens.len();
        if cached + n > self.config.max_len {
            return Err(Error::ContextOverflow {
                requested: cached + n,
                max: self.config.max_len,
            });
        }
        check_token_range(tokens, self.config.vocab_size)?;
        let visible: Option<Vec<Vec<f32>>> = match step.mask {
            Some(mask) => Some(mask.squeeze(0)?.squeeze(0)?.to_vec2()?),
            None => None,
        };
        let all: Vec<u32> = self.tokens.iter().chain(tokens).copied().collect();
        let first_row = match step.logits {
            LogitRows::All => 0,
            LogitRows::Last(k) => n - k,
            LogitRows::None => n,
        };
        let mut out = Vec::with_capacity(rows * self.config.vocab_size);
        self.hidden.clear();
        for i in 0..n {
            let context: Vec<u32> = match &visible {
                Some(mask) => (0..=cached + i)
                    .filter(|&j| mask[i][j].is_finite())
                    .map(|j| all[j])
                    .collect(),
                None => all[..=cached + i].to_vec(),
            };
            if i >= first_row {
                out.extend(self.logits_for(&context, step.positions[i]));
            }
            self.hidden.extend(hidden_state(
                &context,
                step.positions[i],
                self.config.window,
            ));
        }
        self.tokens.extend_from_slice(tokens);
        self.forwards += 1;
        Ok(Tensor::from_vec(
            out,
            (rows, self.config.vocab_size),
            &self.device,
        )?)
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.tokens.len() {
            return Err(Error::TruncateBeyondLength {
                requested: len,
                len: self.tokens.len(),
            });
        }
        self.tokens.truncate(len);
        Ok(())
    }

    fn keep_positions(&mut self, positions: &[usize]) -> Result<()> {
        keep_positions_of(&mut self.tokens, positions)
    }

    fn reset(&mut self) {
        self.tokens.clear();
    }
}

/// The mock's hidden state: the position, then the last `window` visible tokens (−1 where the
/// context is shorter), everything its logits depend on.
fn hidden_state(visible: &[u32], position: usize, window: usize) -> Vec<f32> {
    let context = &visible[visible.len().saturating_sub(window)..];
    let mut state = vec![-1.0; window + 1];
    state[0] = position as f32;
    for (slot, &t) in state[1 + window - context.len()..].iter_mut().zip(context) {
        *slot = t as f32;
    }
    state
}

/// The position and visible tokens a [`hidden_state`] row holds.
fn read_hidden_state(row: &[f32]) -> (usize, Vec<u32>) {
    let tokens = row[1..]
        .iter()
        .filter(|&&t| t >= 0.0)
        .map(|&t| t as u32)
        .collect();
    (row[0] as usize, tokens)
}

impl HiddenStates for MockDecoder {
    fn hidden_size(&self) -> usize {
        self.config.window + 1
    }

    fn last_hidden(&self) -> Result<Tensor> {
        let width = self.hidden_size();
        Ok(Tensor::from_vec(
            self.hidden.clone(),
            (self.hidden.len() / width, width),
            &self.device,
        )?)
    }

    fn unembed(&self, hidden: &Tensor) -> Result<Logits> {
        let rows: Vec<Vec<f32>> = hidden.to_vec2()?;
        let logits: Vec<f32> = rows
            .iter()
            .flat_map(|row| {
                let (position, visible) = read_hidden_state(row);
                self.logits_for(&visible, position)
            })
            .collect();
        Logits::from_flat(logits, self.config.vocab_size)
    }

    fn unembedding_rows(&self, _ids: &[u32]) -> Result<Tensor> {
        Err(Error::Unsupported(
            "the mock's output layer is a hash, it has no matrix",
        ))
    }
}

/// Prediction heads for a [`MockDecoder`]: from a hidden state they roll a model with
/// `config`'s logits (the target's plus noise) greedily forward, guessing the model's next token
/// and then giving the logits of the `count` tokens after it. Noise 0 makes perfect heads.
/// [`MockHeads::chained`] heads read guesses instead: each rolls on from the token it is given.
#[derive(Clone, Debug)]
pub struct MockHeads {
    model: MockDecoder,
    count: usize,
    chained: bool,
    /// The model whose output layer the heads share, if they do.
    shared_output: Option<MockDecoder>,
    shortlist: Option<Vec<u32>>,
}

impl MockHeads {
    pub fn new(config: MockConfig, count: usize) -> Self {
        Self {
            model: MockDecoder::new(config),
            count,
            chained: false,
            shared_output: None,
            shortlist: None,
        }
    }

    /// Heads that share `target`'s output layer ([`TokenHeads::shares_output_layer`]): head
    /// k's state is a hidden state k + 1 positions on, holding the guesses before its own
    /// (`guesses`' argmax tokens), and its logits are `target`'s for that state.
    pub fn sharing_output(target: MockConfig, guesses: MockConfig, count: usize) -> Self {
        Self {
            shared_output: Some(MockDecoder::new(target)),
            ..Self::new(guesses, count)
        }
    }

    /// Heads that guess among `tokens` only (the others' logits −∞).
    pub fn with_shortlist(mut self, tokens: Vec<u32>) -> Self {
        self.shortlist = Some(tokens);
        self
    }

    /// `row` with every token outside the shortlist at −∞.
    fn masked(&self, row: Vec<f32>) -> Vec<f32> {
        match &self.shortlist {
            Some(tokens) => {
                let mut masked = Vec::with_capacity(row.len());
                extend_on_shortlist(&mut masked, &row, Some(tokens));
                masked
            }
            None => row,
        }
    }

    /// The position, guesses and logits of each head up to `heads.end` for a hidden state:
    /// head k guesses the tokens k + 1 positions on, after the model's own argmax guesses.
    fn guesses(&self, row: &[f32], heads: &Range<usize>) -> Vec<(usize, Vec<u32>, Vec<f32>)> {
        let (position, mut visible) = read_hidden_state(row);
        let mut logits = self.model.logits_for(&visible, position);
        let output = self.shared_output.as_ref().unwrap_or(&self.model);
        let mut out = Vec::with_capacity(heads.len());
        for k in 1..=heads.end {
            visible.push(argmax(&logits));
            logits = self.model.logits_for(&visible, position + k);
            if heads.contains(&(k - 1)) {
                let row = output.logits_for(&visible, position + k);
                out.push((position + k, visible.clone(), row));
            }
        }
        out
    }

    /// Heads that read the token before each guess ([`TokenHeads::reads_guesses`]).
    pub fn chained(config: MockConfig, count: usize) -> Self {
        Self {
            chained: true,
            ..Self::new(config, count)
        }
    }
}

impl TokenHeads for MockHeads {
    fn count(&self) -> usize {
        self.count
    }

    fn hidden_size(&self) -> usize {
        self.model.hidden_size()
    }

    fn predict(&self, hidden: &Tensor, heads: Range<usize>) -> Result<Logits> {
        check_head_range(&heads, self.count)?;
        let row: Vec<f32> = hidden.flatten_all()?.to_vec1()?;
        let rows: Vec<Vec<f32>> = self
            .guesses(&row, &heads)
            .into_iter()
            .map(|(_, _, logits)| self.masked(logits))
            .collect();
        Logits::from_rows(&rows)
    }

    fn shares_output_layer(&self) -> bool {
        self.shared_output.is_some()
    }

    fn output_states(&self, hidden: &Tensor, heads: Range<usize>) -> Result<Tensor> {
        if self.shared_output.is_none() {
            return Err(Error::Unsupported("these mock heads have their own output"));
        }
        check_head_range(&heads, self.count)?;
        let window = self.model.hidden_size() - 1;
        let rows: Vec<Vec<f32>> = hidden.to_vec2()?;
        let states: Vec<f32> = rows
            .iter()
            .flat_map(|row| self.guesses(row, &heads))
            .flat_map(|(position, visible, _)| hidden_state(&visible, position, window))
            .collect();
        Ok(Tensor::from_vec(
            states,
            (rows.len() * heads.len(), window + 1),
            hidden.device(),
        )?)
    }

    fn shortlist(&self) -> Option<&[u32]> {
        self.shortlist.as_deref()
    }

    fn reads_guesses(&self) -> bool {
        self.chained
    }

    /// Chained: the state is a hidden state one position on per head, holding `previous`.
    fn predict_after(&self, state: &Tensor, k: usize, previous: u32) -> Result<(Logits, Tensor)> {
        if !self.chained {
            return Ok((self.predict(state, k..k + 1)?, state.clone()));
        }
        check_head_range(&(k..k + 1), self.count)?;
        let row: Vec<f32> = state.flatten_all()?.to_vec1()?;
        let (position, mut visible) = read_hidden_state(&row);
        visible.push(previous);
        let logits = self.model.logits_for(&visible, position + 1);
        let window = self.model.hidden_size() - 1;
        let next = hidden_state(&visible, position + 1, window);
        Ok((
            Logits::from_rows(&[logits])?,
            Tensor::from_vec(next, (1, window + 1), state.device())?,
        ))
    }
}

/// SplitMix64 finaliser.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A hash mapped to [0, 1).
fn unit(h: u64) -> f32 {
    (h >> 40) as f32 / (1u64 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::{causal_positions, forward_tokens};
    use crate::logits::Logits;
    use crate::tree::TokenTree;

    fn model() -> MockDecoder {
        MockDecoder::new(MockConfig::target(32, 1))
    }

    #[test]
    fn incremental_equals_full_forward() {
        let tokens = [3, 1, 4, 1, 5, 9, 2, 6];
        let mut full = model();
        let all = forward_tokens(&mut full, &tokens, LogitRows::All).unwrap();
        let all: Vec<&[f32]> = all.rows().collect();
        let mut step = model();
        let mut rows: Vec<Vec<f32>> = forward_tokens(&mut step, &tokens[..5], LogitRows::All)
            .unwrap()
            .rows()
            .map(<[f32]>::to_vec)
            .collect();
        for &t in &tokens[5..] {
            rows.push(
                forward_tokens(&mut step, &[t], LogitRows::All)
                    .unwrap()
                    .into_last_row(),
            );
        }
        assert_eq!(all, rows);
        assert_eq!(step.forward_count(), 4);
        let last = forward_tokens(&mut model(), &tokens, LogitRows::Last(2)).unwrap();
        assert_eq!(last.rows().collect::<Vec<_>>(), all[6..].to_vec());
    }

    #[test]
    fn tree_forward_matches_each_path_run_linearly() {
        let prefix = [7, 8, 9];
        let mut tree = TokenTree::new(10);
        let a = tree.push(0, 11).unwrap();
        tree.push(0, 12).unwrap();
        tree.push(a, 13).unwrap();
        let mut m = model();
        forward_tokens(&mut m, &prefix, LogitRows::Last(1)).unwrap();
        let bias = tree
            .attention_bias(3, candle_core::DType::F32, m.device())
            .unwrap();
        let positions = tree.position_ids(3);
        let step = Forward::tokens(tree.tokens(), &positions).with_mask(&bias);
        let rows = Logits::from_tensor(&m.forward(&step).unwrap(), 4, 32).unwrap();
        for (node, row) in rows.rows().enumerate() {
            let path: Vec<u32> = tree.path_to(node).iter().map(|&n| tree.token(n)).collect();
            let mut linear = model();
            let seq: Vec<u32> = prefix.iter().copied().chain(path).collect();
            let expected = forward_tokens(&mut linear, &seq, LogitRows::Last(1)).unwrap();
            assert_eq!(row, expected.row(0), "node {node}");
        }
        // Wrong position ids change the logits.
        let mut m2 = model();
        forward_tokens(&mut m2, &prefix, LogitRows::Last(1)).unwrap();
        let wrong = causal_positions(3, 4);
        let rows2 = Logits::from_tensor(
            &m2.forward(&Forward::tokens(tree.tokens(), &wrong).with_mask(&bias))
                .unwrap(),
            4,
            32,
        )
        .unwrap();
        assert_ne!(rows2.row(2), rows.row(2));
    }

    #[test]
    fn rollback_then_continue_equals_fresh_run() {
        let mut m = model();
        forward_tokens(&mut m, &[1, 2, 3, 4, 5], LogitRows::All).unwrap();
        m.truncate(2).unwrap();
        let continued = forward_tokens(&mut m, &[6, 7], LogitRows::All).unwrap();
        let fresh = forward_tokens(&mut model(), &[1, 2, 6, 7], LogitRows::Last(2)).unwrap();
        assert_eq!(continued, fresh);
        assert_eq!(m.cached_tokens(), [1, 2, 6, 7]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let mut m = MockDecoder::new(MockConfig {
            max_len: 4,
            ..MockConfig::target(8, 0)
        });
        assert!(matches!(
            forward_tokens(&mut m, &[], LogitRows::All),
            Err(Error::EmptyInput(_))
        ));
        assert!(matches!(
            forward_tokens(&mut m, &[9], LogitRows::All),
            Err(Error::TokenOutOfRange { .. })
        ));
        assert!(matches!(
            forward_tokens(&mut m, &[1; 5], LogitRows::All),
            Err(Error::ContextOverflow { .. })
        ));
        assert!(matches!(
            forward_tokens(&mut m, &[1, 2], LogitRows::Last(3)),
            Err(Error::InputShape(_))
        ));
        assert!(matches!(
            m.forward(&Forward::tokens(&[1, 2], &[0])),
            Err(Error::InputShape(_))
        ));
        let emb = Tensor::zeros((1, 2, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let step = Forward {
            input: DecoderInput::Embeddings(&emb),
            ..Forward::tokens(&[], &[0, 1])
        };
        assert!(matches!(m.forward(&step), Err(Error::Unsupported(_))));
        assert_eq!(m.cached_len(), 0, "failed forwards cache nothing");
    }

    #[test]
    fn draft_agrees_with_target_often_but_not_always() {
        let target = model();
        let draft = MockDecoder::new(target.config.draft(1.0, 9));
        let mut agree = 0;
        for pos in 0..200u32 {
            let ctx = [pos % 7, pos % 5, pos % 3];
            let t = argmax(&target.logits_for(&ctx, pos as usize));
            let d = argmax(&draft.logits_for(&ctx, pos as usize));
            agree += usize::from(t == d);
        }
        assert!((60..190).contains(&agree), "agreement {agree}/200");
    }
}
