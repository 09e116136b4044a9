//! The decoder-only transformer of the Qwen2 / Qwen2.5 and Llama / Llama-3 / SmolLM2 families.
//!
//! RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, optional q/k/v biases (Qwen2)
//! and optional tied embeddings. What differs from candle-transformers' models: explicit
//! position ids per token (token trees put siblings at the same position), an optional additive
//! attention mask, logits for every requested position, input embeddings as an alternative to
//! token ids, and `spec-core`'s KV cache with O(1) rollback and tree-path compaction. Grouped
//! query heads attend to their shared key/value head without copying it (the query heads of a
//! group are folded into the row dimension of one matmul). Quantized matrices run on
//! `spec-kernels` on the CPU (see [`crate::load`]).

use candle_core::{DType, Device, Module, Tensor, D};
use spec_core::decoder::input_tokens;
use spec_core::kv_cache::keep_positions_of;
use spec_core::{Decoder, DecoderInput, Forward, KvCache, LogitRows};

use crate::attention::{row_attention, RowMask};
use crate::config::{RopeLayout, TransformerConfig};
use crate::linear::QLinear;
use crate::swiglu::swiglu;
use crate::{Error, Result};

/// Initial KV capacity per layer; it doubles as needed.
const INITIAL_CACHE_CAPACITY: usize = 256;

/// One attention block's projections.
#[derive(Debug)]
pub(crate) struct Attention {
    pub q: QLinear,
    pub k: QLinear,
    pub v: QLinear,
    pub o: QLinear,
    /// q/k/v biases (Qwen2).
    pub bias: Option<[Tensor; 3]>,
}

/// SwiGLU feed-forward: down(silu(gate(x)) · up(x)).
#[derive(Debug)]
pub(crate) struct FeedForward {
    pub gate: QLinear,
    pub up: QLinear,
    pub down: QLinear,
}

/// One transformer layer.
#[derive(Debug)]
pub(crate) struct Layer {
    pub attention_norm: Tensor,
    pub attention: Attention,
    pub ffn_norm: Tensor,
    pub ffn: FeedForward,
}

/// All weights, as the loaders produce them.
#[derive(Debug)]
pub(crate) struct Weights {
    /// Token embeddings `[vocab, hidden]` (looked up row by row, never dequantized whole).
    pub embeddings: QLinear,
    pub layers: Vec<Layer>,
    pub final_norm: Tensor,
    /// Output projection; shares the embedding tensor when the checkpoint ties them.
    pub lm_head: QLinear,
}

/// A loaded model with its KV cache. Batch size 1.
#[derive(Debug)]
pub struct Transformer {
    config: TransformerConfig,
    weights: Weights,
    inverse_frequencies: Tensor,
    cache: KvCache,
    /// Token id of every cached position.
    tokens: Vec<u32>,
    max_len: usize,
    device: Device,
}

impl Transformer {
    pub(crate) fn new(
        config: TransformerConfig,
        weights: Weights,
        max_context: Option<usize>,
        device: &Device,
    ) -> Result<Self> {
        config.validate()?;
        let max_len = max_context.map_or(config.max_position_embeddings, |m| {
            m.min(config.max_position_embeddings)
        });
        let inverse_frequencies = Tensor::new(config.rope_inverse_frequencies(), device)?;
        let cache = KvCache::new(
            config.num_layers,
            INITIAL_CACHE_CAPACITY.min(max_len),
            max_len,
        );
        Ok(Self {
            weights,
            inverse_frequencies,
            cache,
            tokens: Vec::new(),
            max_len,
            device: device.clone(),
            config,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// Runs the model; on failure the cache is left as it was.
    pub fn forward_step(&mut self, step: &Forward<'_>) -> Result<Tensor> {
        let start = self.cache.len();
        match self.forward_inner(step) {
            Ok(logits) => {
                self.tokens.extend(input_tokens(&step.input)?);
                Ok(logits)
            }
            Err(e) => {
                self.cache.truncate(start)?;
                Err(e)
            }
        }
    }

    fn forward_inner(&mut self, step: &Forward<'_>) -> Result<Tensor> {
        let cached = self.cache.len();
        let rows = step.validate(cached)?;
        let n = step.input.len()?;
        self.cache.check_room(n)?;
        let mut x = self.embed(&step.input)?;
        let (cos, sin) = self.rotary_tables(step.positions)?;
        let mask = self.attention_mask(step, n, cached)?;
        for (index, layer) in self.weights.layers.iter().enumerate() {
            let eps = self.config.rms_norm_eps as f32;
            let normed = candle_nn::ops::rms_norm(&x, &layer.attention_norm, eps)?;
            let attended = attention(
                &self.config,
                &layer.attention,
                &normed,
                &cos,
                &sin,
                &mask,
                &mut self.cache,
                index,
            )?;
            x = (x + attended)?;
            let normed = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, eps)?;
            let ffn = &layer.ffn;
            let [gate, up] = QLinear::forward_many([&ffn.gate, &ffn.up], &normed)?;
            let hidden = swiglu(&gate, &up)?;
            x = (x + ffn.down.forward(&hidden)?)?;
        }
        let x = if rows < n {
            x.narrow(1, n - rows, rows)?
        } else {
            x
        };
        let x = candle_nn::ops::rms_norm(
            &x,
            &self.weights.final_norm,
            self.config.rms_norm_eps as f32,
        )?;
        Ok(self
            .weights
            .lm_head
            .forward(&x)?
            .squeeze(0)?
            .to_dtype(DType::F32)?)
    }

    /// The mask in the form the attention path for `n` rows needs.
    fn attention_mask(&self, step: &Forward<'_>, n: usize, cached: usize) -> Result<AttentionMask> {
        let width = cached + n;
        let row_path = n <= ROW_ATTENTION_MAX_ROWS && self.device.is_cpu();
        Ok(match (step.mask, row_path) {
            (None, true) => AttentionMask::Rows { bias: None, cached },
            (Some(mask), true) => AttentionMask::Rows {
                bias: Some(mask.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?),
                cached,
            },
            (None, false) => AttentionMask::Batched(
                causal_mask(n, cached, &self.device)?.reshape((1, 1, 1, n, width))?,
            ),
            (Some(mask), false) => {
                AttentionMask::Batched(mask.to_dtype(DType::F32)?.reshape((1, 1, 1, n, width))?)
            }
        })
    }

    /// Token ids or given embeddings → `[1, n, hidden]` f32.
    fn embed(&self, input: &DecoderInput<'_>) -> Result<Tensor> {
        match input {
            DecoderInput::Tokens(tokens) => {
                if let Some(&bad) = tokens
                    .iter()
                    .find(|&&t| t as usize >= self.config.vocab_size)
                {
                    return Err(spec_core::Error::TokenOutOfRange {
                        token: bad,
                        vocab: self.config.vocab_size,
                    }
                    .into());
                }
                Ok(self
                    .weights
                    .embeddings
                    .embedding(tokens, &self.device)?
                    .unsqueeze(0)?)
            }
            DecoderInput::Embeddings(e) => {
                let hidden = e.dim(D::Minus1)?;
                if hidden != self.config.hidden_size {
                    return Err(Error::ShapeMismatch {
                        name: "input embeddings".into(),
                        got: e.dims().to_vec(),
                        expected: vec![1, e.dim(1)?, self.config.hidden_size],
                    });
                }
                Ok(e.to_dtype(DType::F32)?.to_device(&self.device)?)
            }
        }
    }

    /// cos/sin of `position · inverse_frequency`, `[n, head_dim / 2]`.
    fn rotary_tables(&self, positions: &[usize]) -> Result<(Tensor, Tensor)> {
        let positions: Vec<f32> = positions.iter().map(|&p| p as f32).collect();
        let n = positions.len();
        let angles = Tensor::from_vec(positions, (n, 1), &self.device)?
            .broadcast_mul(&self.inverse_frequencies.unsqueeze(0)?)?;
        Ok((angles.cos()?, angles.sin()?))
    }
}

/// Largest forward whose attention runs row by row ([`crate::attention`]), so that decoding and
/// verification agree bit for bit. Longer forwards (prompts) use candle's batched matmuls.
const ROW_ATTENTION_MAX_ROWS: usize = 64;

/// The attention mask of one forward, prepared once for all layers.
enum AttentionMask {
    /// Row-by-row attention: causal after `cached` positions, or an additive bias `[n, L]`.
    Rows {
        bias: Option<Vec<f32>>,
        cached: usize,
    },
    /// Batched attention: an additive bias `[1, 1, 1, n, L]`.
    Batched(Tensor),
}

/// Additive causal mask `[1, 1, n, cached + n]` for n new tokens after `cached` ones.
fn causal_mask(n: usize, cached: usize, device: &Device) -> Result<Tensor> {
    let width = cached + n;
    let data: Vec<f32> = (0..n)
        .flat_map(|i| {
            (0..width).map(move |j| {
                if j <= cached + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Ok(Tensor::from_vec(data, (1, 1, n, width), device)?)
}

#[allow(clippy::too_many_arguments)]
fn attention(
    config: &TransformerConfig,
    weights: &Attention,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    mask: &AttentionMask,
    cache: &mut KvCache,
    layer: usize,
) -> Result<Tensor> {
    let (_, n, _) = x.dims3()?;
    let (heads, kv_heads, d) = (config.num_heads, config.num_kv_heads, config.head_dim);
    let group = heads / kv_heads;
    let [mut q, mut k, mut v] = QLinear::forward_many([&weights.q, &weights.k, &weights.v], x)?;
    if let Some([bq, bk, bv]) = &weights.bias {
        q = q.broadcast_add(bq)?;
        k = k.broadcast_add(bk)?;
        v = v.broadcast_add(bv)?;
    }
    let split = |t: Tensor, h: usize| -> Result<Tensor> {
        Ok(t.reshape((1, n, h, d))?.transpose(1, 2)?.contiguous()?)
    };
    let rotate = |t: &Tensor| -> Result<Tensor> {
        Ok(match config.rope_layout {
            RopeLayout::Halves => candle_nn::rotary_emb::rope(t, cos, sin)?,
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(t, cos, sin)?,
        })
    };
    let q = rotate(&split(q, heads)?)?;
    let k = rotate(&split(k, kv_heads)?)?;
    let v = split(v, kv_heads)?;
    let (keys, values) = cache.layer_mut(layer).append(&k, &v)?;
    let total = keys.dim(2)?;
    // The `group` query heads sharing a key/value head become rows of one matmul.
    let q = (q.reshape((1, kv_heads, group * n, d))? * (1.0 / (d as f64).sqrt()))?;
    let out = match mask {
        AttentionMask::Rows { bias, cached } => {
            let rows = match bias {
                Some(bias) => RowMask::Bias(bias),
                None => RowMask::Causal { cached: *cached },
            };
            row_attention(&q, &keys, &values, n, &rows)?
        }
        AttentionMask::Batched(mask) => {
            let scores = q
                .matmul(&keys.t()?)?
                .reshape((1, kv_heads, group, n, total))?
                .broadcast_add(mask)?
                .reshape((1, kv_heads, group * n, total))?;
            candle_nn::ops::softmax_last_dim(&scores)?.matmul(&values)?
        }
    };
    let out = out
        .reshape((1, heads, n, d))?
        .transpose(1, 2)?
        .reshape((1, n, heads * d))?;
    Ok(weights.o.forward(&out)?)
}

impl Decoder for Transformer {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_len(&self) -> usize {
        self.max_len
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn cached_tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn forward(&mut self, step: &Forward<'_>) -> spec_core::Result<Tensor> {
        Ok(self.forward_step(step)?)
    }

    fn truncate(&mut self, len: usize) -> spec_core::Result<()> {
        self.cache.truncate(len)?;
        self.tokens.truncate(len);
        Ok(())
    }

    fn keep_positions(&mut self, positions: &[usize]) -> spec_core::Result<()> {
        self.cache.keep_positions(positions)?;
        keep_positions_of(&mut self.tokens, positions)
    }

    fn reset(&mut self) {
        self.cache.reset();
        self.tokens.clear();
    }
}

/// A KV cache detached from its model, with the tokens it holds: one set of weights can keep
/// several contexts (a conversation and a judge prompt) and switch between them without
/// recomputing either.
#[derive(Debug)]
pub struct CacheState {
    cache: KvCache,
    tokens: Vec<u32>,
}

impl Transformer {
    /// An empty cache shaped for this model, to use with [`Transformer::swap_cache`].
    pub fn new_cache(&self) -> CacheState {
        CacheState {
            cache: KvCache::new(
                self.config.num_layers,
                INITIAL_CACHE_CAPACITY.min(self.max_len),
                self.max_len,
            ),
            tokens: Vec::new(),
        }
    }

    /// Exchanges the model's cache with `other` in O(1). Fails for a cache shaped for another
    /// model.
    pub fn swap_cache(&mut self, other: &mut CacheState) -> Result<()> {
        if other.cache.num_layers() != self.config.num_layers
            || other.cache.max_len() != self.max_len
        {
            return Err(Error::Config(format!(
                "a cache of {} layers and {} positions does not fit a model of {} layers and {}",
                other.cache.num_layers(),
                other.cache.max_len(),
                self.config.num_layers,
                self.max_len
            )));
        }
        std::mem::swap(&mut self.cache, &mut other.cache);
        std::mem::swap(&mut self.tokens, &mut other.tokens);
        Ok(())
    }
}

impl Transformer {
    /// Logits for the last `rows` of `tokens`, forwarded causally after the cache (convenience
    /// over [`Decoder::forward`]).
    pub fn forward_tokens(&mut self, tokens: &[u32], rows: LogitRows) -> Result<spec_core::Logits> {
        Ok(spec_core::decoder::forward_tokens(self, tokens, rows)?)
    }
}
