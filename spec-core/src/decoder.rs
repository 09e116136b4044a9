//! The interface between the algorithms and a model: an autoregressive decoder with a KV cache.

use candle_core::{Device, Tensor};

use crate::logits::Logits;
use crate::{Error, Result};

/// What a forward pass consumes.
#[derive(Clone, Copy, Debug)]
pub enum DecoderInput<'a> {
    /// Token ids.
    Tokens(&'a [u32]),
    /// Input embeddings `[1, n, hidden]`, for models fed vectors rather than ids (a TTS language
    /// model conditioned on text and speech-prompt embeddings).
    Embeddings(&'a Tensor),
}

impl DecoderInput<'_> {
    /// Number of new positions.
    pub fn len(&self) -> Result<usize> {
        match self {
            Self::Tokens(t) => Ok(t.len()),
            Self::Embeddings(e) => match e.dims() {
                [1, n, _] => Ok(*n),
                dims => Err(Error::InputShape(format!(
                    "embeddings must be [1, n, hidden], got {dims:?}"
                ))),
            },
        }
    }

    /// True when there is nothing to forward.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }
}

/// Which positions a forward returns logits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// Every new position.
    All,
    /// The last `k` new positions only (a prompt prefill needs one row, and skipping the others
    /// saves most of the output-layer cost).
    Last(usize),
    /// None (a `[0, vocab_size]` tensor): for verifiers that read the hidden states of a
    /// [`HiddenStates`](crate::heads::HiddenStates) model and unembed only the rows they need.
    None,
}

/// One forward pass: new inputs placed after the cached positions.
#[derive(Clone, Copy, Debug)]
pub struct Forward<'a> {
    pub input: DecoderInput<'a>,
    /// Position id of each new input (RoPE positions); `cached_len + depth` inside a token tree.
    pub positions: &'a [usize],
    /// Additive attention bias `[1, 1, n, cached_len + n]` (0 = may attend, −∞ = may not), in
    /// f32 on the decoder's device; `None` means causal attention over the new inputs.
    pub mask: Option<&'a Tensor>,
    pub logits: LogitRows,
}

impl<'a> Forward<'a> {
    /// A causal forward of `tokens` at `positions`, returning every row.
    pub fn tokens(tokens: &'a [u32], positions: &'a [usize]) -> Self {
        Self {
            input: DecoderInput::Tokens(tokens),
            positions,
            mask: None,
            logits: LogitRows::All,
        }
    }

    /// Returns logits for the last `k` positions only.
    pub fn last(mut self, k: usize) -> Self {
        self.logits = LogitRows::Last(k);
        self
    }

    /// Attends through `mask` instead of causally.
    pub fn with_mask(mut self, mask: &'a Tensor) -> Self {
        self.mask = Some(mask);
        self
    }

    /// Checks that positions, mask and requested rows fit `n` inputs after `cached_len`, and
    /// returns how many logit rows the forward produces.
    pub fn validate(&self, cached_len: usize) -> Result<usize> {
        let n = self.input.len()?;
        if n == 0 {
            return Err(Error::EmptyInput("a forward needs at least one new input"));
        }
        if self.positions.len() != n {
            return Err(Error::InputShape(format!(
                "{} position ids for {n} inputs",
                self.positions.len()
            )));
        }
        if let Some(mask) = self.mask {
            let expected = [1, 1, n, cached_len + n];
            if mask.dims() != expected {
                return Err(Error::InputShape(format!(
                    "mask has shape {:?}, expected {expected:?}",
                    mask.dims()
                )));
            }
        }
        match self.logits {
            LogitRows::All => Ok(n),
            LogitRows::None => Ok(0),
            LogitRows::Last(k) if (1..=n).contains(&k) => Ok(k),
            LogitRows::Last(k) => Err(Error::InputShape(format!(
                "asked for the last {k} logit rows of a {n}-input forward"
            ))),
        }
    }
}

/// An autoregressive model with a KV cache, as the speculative loops drive it.
///
/// The cache holds the positions forwarded so far; [`Decoder::truncate`] rolls rejected draft
/// tokens back and [`Decoder::keep_positions`] compacts an accepted token-tree path.
///
/// Encoder–decoder models (Whisper, Marian) implement this for their decoder: the encoder output
/// is given to the model before decoding (outside this trait), its cross-attention keys and
/// values are computed once and kept across [`Decoder::reset`], and `forward` takes only decoder
/// tokens. Models fed embeddings accept [`DecoderInput::Embeddings`]; models that only take ids
/// return [`Error::Unsupported`] for it.
pub trait Decoder {
    /// Size of the output vocabulary (columns of the logits).
    fn vocab_size(&self) -> usize;

    /// Largest number of positions the cache can hold.
    fn max_len(&self) -> usize;

    /// Device the model runs on (masks are built there).
    fn device(&self) -> &Device;

    /// Positions currently cached.
    fn cached_len(&self) -> usize {
        self.cached_tokens().len()
    }

    /// The token id at every cached position ([`EMBEDDING_INPUT`] where an embedding was fed).
    /// The loops reuse the longest common prefix of this and a new context.
    fn cached_tokens(&self) -> &[u32];

    /// Runs the model over the new inputs, appends them to the cache and returns f32 logits
    /// `[rows, vocab_size]`, one row per requested position (see [`Forward::logits`]).
    fn forward(&mut self, step: &Forward<'_>) -> Result<Tensor>;

    /// Keeps the first `len` cached positions.
    fn truncate(&mut self, len: usize) -> Result<()>;

    /// Compacts the cache after tree verification; see
    /// [`LayerKvCache::keep_positions`](crate::LayerKvCache::keep_positions).
    fn keep_positions(&mut self, positions: &[usize]) -> Result<()>;

    /// Forgets every cached position.
    fn reset(&mut self);
}

impl<D: Decoder + ?Sized> Decoder for &mut D {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }
    fn max_len(&self) -> usize {
        (**self).max_len()
    }
    fn device(&self) -> &Device {
        (**self).device()
    }
    fn cached_len(&self) -> usize {
        (**self).cached_len()
    }
    fn cached_tokens(&self) -> &[u32] {
        (**self).cached_tokens()
    }
    fn forward(&mut self, step: &Forward<'_>) -> Result<Tensor> {
        (**self).forward(step)
    }
    fn truncate(&mut self, len: usize) -> Result<()> {
        (**self).truncate(len)
    }
    fn keep_positions(&mut self, positions: &[usize]) -> Result<()> {
        (**self).keep_positions(positions)
    }
    fn reset(&mut self) {
        (**self).reset();
    }
}

/// The token id recorded for a position fed as an embedding; it matches no real token.
pub const EMBEDDING_INPUT: u32 = u32::MAX;

/// The token ids a forward of `input` adds to the cache.
pub fn input_tokens(input: &DecoderInput<'_>) -> Result<Vec<u32>> {
    Ok(match input {
        DecoderInput::Tokens(t) => t.to_vec(),
        DecoderInput::Embeddings(_) => vec![EMBEDDING_INPUT; input.len()?],
    })
}

/// Checks that every token id is below `vocab`.
pub fn check_token_range(tokens: &[u32], vocab: usize) -> Result<()> {
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(&token) => Err(Error::TokenOutOfRange { token, vocab }),
        None => Ok(()),
    }
}

/// Length of the longest common prefix of two token sequences.
pub fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Length of the longest common suffix of two token sequences (what two chat prompts of
/// different messages share after the message: the end of its turn and the next opening).
pub fn common_suffix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

/// Rolls `model` back to its longest common prefix with `context`, keeping at least the last
/// token of `context` out of the cache, and returns the number of positions kept.
pub fn rewind_to_prefix<D: Decoder + ?Sized>(model: &mut D, context: &[u32]) -> Result<usize> {
    let common = common_prefix_len(model.cached_tokens(), context);
    let keep = common.min(context.len().saturating_sub(1));
    model.truncate(keep)?;
    Ok(keep)
}

/// Position ids `start..start + n`.
pub fn causal_positions(start: usize, n: usize) -> Vec<usize> {
    (start..start + n).collect()
}

/// Causal forward of `tokens` right after the cache; returns the requested logit rows.
pub fn forward_tokens<D: Decoder + ?Sized>(
    model: &mut D,
    tokens: &[u32],
    rows: LogitRows,
) -> Result<Logits> {
    let positions = causal_positions(model.cached_len(), tokens.len());
    let step = Forward {
        logits: rows,
        ..Forward::tokens(tokens, &positions)
    };
    let n_rows = step.validate(model.cached_len())?;
    let logits = model.forward(&step)?;
    Logits::from_tensor(&logits, n_rows, model.vocab_size())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_and_suffix_lengths() {
        assert_eq!(common_prefix_len(&[1, 2, 3, 9], &[1, 2, 4, 9]), 2);
        assert_eq!(common_suffix_len(&[7, 1, 2, 3], &[8, 8, 2, 3]), 2);
        assert_eq!(common_suffix_len(&[1, 2], &[1, 2]), 2);
        assert_eq!(common_suffix_len(&[], &[1]), 0);
        assert_eq!(common_suffix_len(&[1, 2], &[2, 1]), 0);
    }
}
