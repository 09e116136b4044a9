//! The decoder-only transformer of the Qwen2 / Qwen2.5 and Llama / Llama-3 / SmolLM2 families.
//!
//! RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, optional q/k/v biases (Qwen2)
//! and optional tied embeddings. What differs from candle-transformers' models: explicit
//! position ids per token (token trees put siblings at the same position), an optional additive
//! attention mask, logits for every requested position, input embeddings as an alternative to
//! token ids, and `spec-core`'s KV cache with O(1) rollback and tree-path compaction. Grouped
//! query heads attend to their shared key/value head without copying it (the query heads of a
//! group are folded into the row dimension of one matmul). Quantized matrices run on
//! `spec-kernels` on the CPU. The blocks (attention, norms, SwiGLU, rotary) are `spec-nn`'s.

use candle_core::{DType, Device, Tensor, D};
use spec_core::decoder::check_token_range;
use spec_core::{
    Decoder, DecoderCache, DecoderInput, Forward, HiddenStates, Interrupt, LogitRows, Logits,
};
use spec_nn::elementwise::add;
use spec_nn::{
    decoder_output, unembed_logits, AttentionMask, Norm, QLinear, Rotary, SelfAttention,
    ShortlistOutput, SwiGlu,
};

use crate::config::TransformerConfig;
use crate::{Error, Result};

/// Initial KV capacity per layer; it doubles as needed.
const INITIAL_CACHE_CAPACITY: usize = 256;

/// One transformer layer: pre-norm attention and pre-norm SwiGLU, each added to the residual.
/// Cloning shares the weights. Public (read through [`Transformer::layer`]) for the SSD drafts'
/// training (`spec-train`), which copies a model's layers to float
/// ([`crate::load::layer_tensors`]).
#[derive(Clone, Debug)]
pub struct Layer {
    pub attention_norm: Norm,
    pub attention: SelfAttention,
    pub ffn_norm: Norm,
    pub ffn: SwiGlu,
}

/// All weights, as the loaders produce them.
#[derive(Debug)]
pub(crate) struct Weights {
    /// Token embeddings `[vocab, hidden]` (looked up row by row, never dequantized whole).
    pub embeddings: QLinear,
    pub layers: Vec<Layer>,
    pub final_norm: Norm,
    /// Output projection; shares the embedding tensor when the checkpoint ties them.
    pub lm_head: QLinear,
    /// When set, forwards score only these tokens (an SSD draft's trained head) instead of
    /// `lm_head`'s whole vocabulary.
    pub shortlist: Option<ShortlistOutput>,
}

/// A loaded model with its KV cache. Batch size 1.
#[derive(Debug)]
pub struct Transformer {
    config: TransformerConfig,
    weights: Weights,
    rotary: Rotary,
    cache: DecoderCache,
    max_len: usize,
    /// The last forward's final hidden states, one per new position (for prediction heads).
    hidden: Option<Tensor>,
    /// How the layers run (values on the CPU when every matrix is on the kernels).
    layer_path: LayerPath,
    /// Asked before each layer and before the output: a forward it stops fails with
    /// [`spec_core::Error::Interrupted`].
    interrupt: Option<Interrupt>,
    device: Device,
}

/// How a forward runs the layers. Both give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LayerPath {
    /// candle tensors between the blocks (any device, any weights).
    Tensors,
    /// Plain values between the blocks ([`SelfAttention::forward_rows`] and the like): on the
    /// CPU with every matrix on the kernels, without a tensor per operation.
    Rows,
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
        let rotary = Rotary::new(
            config.rope_inverse_frequencies(),
            config.rope_layout,
            device,
        )?;
        let cache = DecoderCache::new(
            config.num_layers,
            INITIAL_CACHE_CAPACITY.min(max_len),
            max_len,
        );
        let on_kernels = weights.layers.iter().all(|layer| {
            let (a, f) = (&layer.attention, &layer.ffn);
            [&a.q, &a.k, &a.v, &a.o, &f.gate, &f.up, &f.down]
                .iter()
                .all(|linear| linear.on_kernels())
        });
        let layer_path = if device.is_cpu() && on_kernels {
            LayerPath::Rows
        } else {
            LayerPath::Tensors
        };
        Ok(Self {
            weights,
            rotary,
            cache,
            max_len,
            hidden: None,
            layer_path,
            interrupt: None,
            device: device.clone(),
            config,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// A model of some of this one's layers, in the order given (self-speculative drafts:
    /// Speech Speculative Decoding's draft starts from the lower 2 and upper 6 of 24), sharing
    /// the embeddings, the layers' weights, the final norm and the output layer, with a cache
    /// of its own.
    pub fn with_layers(&self, layers: &[usize]) -> Result<Transformer> {
        if let Some(&bad) = layers.iter().find(|&&l| l >= self.weights.layers.len()) {
            return Err(Error::Config(format!(
                "layer {bad} of a model with {} layers",
                self.weights.layers.len()
            )));
        }
        let layers = layers
            .iter()
            .map(|&l| self.weights.layers[l].clone())
            .collect();
        self.with_parts(layers, self.weights.shortlist.clone())
    }

    /// A model of `layers` on this one's embeddings and final norm, scoring `shortlist`'s
    /// tokens only when given, with a cache of its own.
    pub(crate) fn with_parts(
        &self,
        layers: Vec<Layer>,
        shortlist: Option<ShortlistOutput>,
    ) -> Result<Transformer> {
        if layers.is_empty() {
            return Err(Error::Config("a model needs at least one layer".into()));
        }
        let config = TransformerConfig {
            num_layers: layers.len(),
            ..self.config.clone()
        };
        let weights = Weights {
            embeddings: self.weights.embeddings.clone(),
            layers,
            final_norm: self.weights.final_norm.clone(),
            lm_head: self.weights.lm_head.clone(),
            shortlist,
        };
        Transformer::new(config, weights, Some(self.max_len), &self.device)
    }

    /// Layer `i`; panics unless `i < config().num_layers`.
    pub fn layer(&self, i: usize) -> &Layer {
        &self.weights.layers[i]
    }

    /// The norm after the last layer.
    pub fn final_norm(&self) -> &Norm {
        &self.weights.final_norm
    }

    /// From now on, every forward asks `interrupt` before each layer and before the output,
    /// and is abandoned with [`spec_core::Error::Interrupted`] (the cache as it was) once it
    /// says stop; `None` lets forwards run to their end.
    pub fn set_interrupt(&mut self, interrupt: Option<Interrupt>) {
        self.interrupt = interrupt;
    }

    /// Fails with [`spec_core::Error::Interrupted`] if the interrupt says stop.
    fn check_interrupt(&self) -> Result<()> {
        match &self.interrupt {
            Some(interrupt) if interrupt.requested() => {
                Err(Error::Core(spec_core::Error::Interrupted))
            }
            _ => Ok(()),
        }
    }

    /// Runs the model; on failure (an interrupt included) the cache is left as it was.
    pub fn forward_step(&mut self, step: &Forward<'_>) -> Result<Tensor> {
        DecoderCache::forward(
            self,
            |model| &mut model.cache,
            &step.input,
            |model| model.forward_inner(step),
        )
    }

    /// [`Transformer::forward_step`] of embeddings that stand for `ids` in the caller's own
    /// input space (a TTS language model's text, speech and special inputs): the cache records
    /// the ids, so the speculative loops reuse a cached prefix and roll drafts back as for
    /// tokens.
    pub fn forward_embedded(&mut self, step: &Forward<'_>, ids: &[u32]) -> Result<Tensor> {
        if !matches!(step.input, DecoderInput::Embeddings(_)) || step.input.len()? != ids.len() {
            return Err(Error::Input(format!(
                "an embedded forward takes embeddings for each of its {} ids",
                ids.len()
            )));
        }
        DecoderCache::forward(
            self,
            |model| &mut model.cache,
            &DecoderInput::Tokens(ids),
            |model| model.forward_inner(step),
        )
    }

    fn forward_inner(&mut self, step: &Forward<'_>) -> Result<Tensor> {
        let cached = self.cache.len();
        let rows = step.validate(cached)?;
        let n = step.input.len()?;
        self.cache.check_room(n)?;
        let mut x = self.embed(&step.input)?;
        let rotary = self.rotary.tables(step.positions)?;
        let mask = AttentionMask::new(step.mask, n, cached, &self.device)?;
        match self.layer_path {
            LayerPath::Tensors => {
                for (index, layer) in self.weights.layers.iter().enumerate() {
                    self.check_interrupt()?;
                    let normed = layer.attention_norm.forward(&x)?;
                    let cache = self.cache.layer_mut(index);
                    let attended = layer
                        .attention
                        .forward(&normed, Some(&rotary), &mask, cache)?;
                    x = add(&x, &attended)?;
                    let normed = layer.ffn_norm.forward(&x)?;
                    x = add(&x, &layer.ffn.forward(&normed)?)?;
                }
            }
            LayerPath::Rows => {
                let shape = x.shape().clone();
                let mut values: Vec<f32> = x.flatten_all()?.to_vec1()?;
                // `x + y` value by value, as `add` sums the tensors.
                let add_to = |values: &mut [f32], y: &[f32]| {
                    values.iter_mut().zip(y).for_each(|(v, y)| *v += y);
                };
                for (index, layer) in self.weights.layers.iter().enumerate() {
                    self.check_interrupt()?;
                    let normed = layer.attention_norm.forward_rows(&values)?;
                    let cache = self.cache.layer_mut(index);
                    let attended =
                        layer
                            .attention
                            .forward_rows(&normed, n, Some(&rotary), &mask, cache)?;
                    add_to(&mut values, &attended);
                    let normed = layer.ffn_norm.forward_rows(&values)?;
                    add_to(&mut values, &layer.ffn.forward_rows(&normed, n)?);
                }
                x = Tensor::from_vec(values, shape, &self.device)?;
            }
        }
        self.check_interrupt()?;
        let full_rows = if self.weights.shortlist.is_some() {
            0
        } else {
            rows
        };
        let out = decoder_output(
            &x,
            full_rows,
            &self.weights.final_norm,
            &self.weights.lm_head,
            self.config.vocab_size,
        )?;
        let logits = match &self.weights.shortlist {
            Some(shortlist) => shortlist.logits(&out.hidden.narrow(0, n - rows, rows)?)?,
            None => out.logits,
        };
        self.hidden = Some(out.hidden);
        Ok(logits)
    }

    /// The input embeddings of token ids, `[n, hidden]` f32: what a forward of the ids feeds
    /// the first layer, for models that mix token embeddings with other vectors (a TTS
    /// language model's text, then speech-token embeddings).
    pub fn embed_tokens(&self, tokens: &[u32]) -> Result<Tensor> {
        check_token_range(tokens, self.config.vocab_size)?;
        Ok(self.weights.embeddings.embedding(tokens, &self.device)?)
    }

    /// Token ids or given embeddings → `[1, n, hidden]` f32.
    fn embed(&self, input: &DecoderInput<'_>) -> Result<Tensor> {
        match input {
            DecoderInput::Tokens(tokens) => Ok(self.embed_tokens(tokens)?.unsqueeze(0)?),
            DecoderInput::Embeddings(e) => {
                let hidden = e.dim(D::Minus1)?;
                if hidden != self.config.hidden_size {
                    return Err(spec_nn::Error::ShapeMismatch {
                        name: "input embeddings".into(),
                        got: e.dims().to_vec(),
                        expected: vec![1, e.dim(1)?, self.config.hidden_size],
                    }
                    .into());
                }
                Ok(e.to_dtype(DType::F32)?.to_device(&self.device)?)
            }
        }
    }
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
        self.cache.tokens()
    }

    fn forward(&mut self, step: &Forward<'_>) -> spec_core::Result<Tensor> {
        Ok(self.forward_step(step)?)
    }

    fn truncate(&mut self, len: usize) -> spec_core::Result<()> {
        self.cache.truncate(len)
    }

    fn keep_positions(&mut self, positions: &[usize]) -> spec_core::Result<()> {
        self.cache.keep_positions(positions)
    }

    fn reset(&mut self) {
        self.cache.reset();
    }
}

impl HiddenStates for Transformer {
    fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    fn last_hidden(&self) -> spec_core::Result<Tensor> {
        self.hidden
            .clone()
            .ok_or(spec_core::Error::EmptyInput("no forward has run yet"))
    }

    fn unembed(&self, hidden: &Tensor) -> spec_core::Result<Logits> {
        Ok(unembed_logits(&self.weights.lm_head, hidden).map_err(Error::from)?)
    }

    fn unembedding_rows(&self, ids: &[u32]) -> spec_core::Result<Tensor> {
        Ok(self
            .weights
            .lm_head
            .embedding(ids, &self.device)
            .map_err(Error::from)?)
    }
}

/// A KV cache detached from its model, with the tokens it holds: one set of weights can keep
/// several contexts (a conversation and a judge prompt) and switch between them without
/// recomputing either.
#[derive(Debug)]
pub struct CacheState {
    cache: DecoderCache,
}

impl Transformer {
    /// An empty cache shaped for this model, to use with [`Transformer::swap_cache`].
    pub fn new_cache(&self) -> CacheState {
        CacheState {
            cache: DecoderCache::new(
                self.config.num_layers,
                INITIAL_CACHE_CAPACITY.min(self.max_len),
                self.max_len,
            ),
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
        Ok(())
    }
}

impl Transformer {
    /// Logits for the last `rows` of `tokens`, forwarded causally after the cache (convenience
    /// over [`Decoder::forward`]).
    pub fn forward_tokens(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Logits> {
        Ok(spec_core::decoder::forward_tokens(self, tokens, rows)?)
    }
}

#[cfg(test)]
mod tests {
    use spec_core::{Logits, TokenTree};

    use super::*;
    use crate::testing::tiny_chat_model;

    fn bits(t: &Tensor) -> Vec<u32> {
        let values: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn layers_on_values_give_the_bits_of_layers_on_tensors() {
        let mut on_values = tiny_chat_model(7).unwrap().model;
        let mut on_tensors = tiny_chat_model(7).unwrap().model;
        assert_eq!(on_values.layer_path, LayerPath::Rows);
        on_tensors.layer_path = LayerPath::Tensors;
        let mut tree = TokenTree::new(40);
        let a = tree.push(0, 41).unwrap();
        tree.push(0, 42).unwrap();
        tree.push(a, 43).unwrap();
        let prompt: Vec<u32> = (0..9).map(|i| (i * 13 + 5) % 90).collect();
        let mut both = [&mut on_values, &mut on_tensors].map(|model| {
            let prompt_logits = model.forward_tokens(&prompt, LogitRows::All).unwrap();
            let step = model.forward_tokens(&[17], LogitRows::All).unwrap();
            let cached = model.cache.len();
            let bias = tree
                .attention_bias(cached, DType::F32, &Device::Cpu)
                .unwrap();
            let positions = tree.position_ids(cached);
            let tree_logits = model
                .forward_step(&Forward::tokens(tree.tokens(), &positions).with_mask(&bias))
                .unwrap();
            let rows = |l: &Logits| l.rows().flatten().map(|v| v.to_bits()).collect::<Vec<_>>();
            (
                rows(&prompt_logits),
                rows(&step),
                bits(&tree_logits),
                bits(model.hidden.as_ref().unwrap()),
            )
        });
        let [values, tensors] = &mut both;
        assert_eq!(values, tensors);
    }

    #[test]
    fn an_interrupted_forward_leaves_the_cache_as_it_was() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;

        let prompt: Vec<u32> = (0..9).map(|i| (i * 7 + 3) % 90).collect();
        let mut plain = tiny_chat_model(3).unwrap().model;
        plain.forward_tokens(&prompt, LogitRows::All).unwrap();
        let expected = plain.forward_tokens(&[11, 12], LogitRows::All).unwrap();

        let mut model = tiny_chat_model(3).unwrap().model;
        model.forward_tokens(&prompt, LogitRows::All).unwrap();
        let layers = model.config().num_layers;
        // Stop after each number of layers in turn, the output's check included.
        for allowed in 0..=layers {
            let asked = Arc::new(AtomicUsize::new(0));
            model.set_interrupt(Some(Interrupt::new({
                let asked = asked.clone();
                move || asked.fetch_add(1, Ordering::Relaxed) >= allowed
            })));
            let err = model.forward_tokens(&[11, 12], LogitRows::All).unwrap_err();
            assert!(
                matches!(err, Error::Core(spec_core::Error::Interrupted)),
                "{err}"
            );
            assert_eq!(asked.load(Ordering::Relaxed), allowed + 1);
            assert_eq!(model.cached_tokens(), prompt.as_slice());
            assert_eq!(model.cache.len(), prompt.len());
        }
        model.set_interrupt(None);
        let resumed = model.forward_tokens(&[11, 12], LogitRows::All).unwrap();
        let rows = |l: &Logits| l.rows().flatten().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(rows(&resumed), rows(&expected));
    }
}
