//! The `UpsampleConformerEncoder`: token embeddings → frames at twice the token rate.

use candle_core::{Module, Tensor};
use candle_nn::{Conv1d, LayerNorm, Linear};
use spec_nn::{RelPositionAttention, RelativePositions, SequenceAttention};

use super::{causal_conv, chunk_bias, FlowConfig, Weights};
use crate::cosyvoice::{CosyVoiceError, Result};

/// The encoder's linear embedding: `LayerNorm(W x + b) · √D`.
#[derive(Debug)]
struct Embed {
    linear: Linear,
    norm: LayerNorm,
    scale: f64,
}

impl Embed {
    fn load(w: &mut Weights, prefix: &str, out: usize, inp: usize) -> Result<Self> {
        Ok(Self {
            linear: w.linear(&format!("{prefix}.out.0"), out, inp)?,
            norm: w.layer_norm(&format!("{prefix}.out.1"), out, 1e-5)?,
            scale: (out as f64).sqrt(),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok((self.norm.forward(&self.linear.forward(x)?)? * self.scale)?)
    }
}

/// ESPnet's `RelPositionMultiHeadedAttention`, named as the checkpoint names it.
fn rel_attention(
    w: &mut Weights,
    prefix: &str,
    dim: usize,
    heads: usize,
) -> Result<RelPositionAttention> {
    let head_dim = dim / heads;
    Ok(RelPositionAttention {
        attention: SequenceAttention {
            q: w.linear(&format!("{prefix}.linear_q"), dim, dim)?,
            k: w.linear(&format!("{prefix}.linear_k"), dim, dim)?,
            v: w.linear(&format!("{prefix}.linear_v"), dim, dim)?,
            out: w.linear(&format!("{prefix}.linear_out"), dim, dim)?,
            heads,
            head_dim,
        },
        pos: w.linear_no_bias(&format!("{prefix}.linear_pos"), dim, dim)?,
        bias_u: w.take(&format!("{prefix}.pos_bias_u"), &[heads, head_dim])?,
        bias_v: w.take(&format!("{prefix}.pos_bias_v"), &[heads, head_dim])?,
    })
}

/// A conformer layer with pre-norm, relative-position attention and a SiLU feed-forward (no
/// macaron, no convolution module).
#[derive(Debug)]
struct ConformerLayer {
    norm_mha: LayerNorm,
    attention: RelPositionAttention,
    norm_ff: LayerNorm,
    w1: Linear,
    w2: Linear,
}

impl ConformerLayer {
    fn load(w: &mut Weights, prefix: &str, config: &FlowConfig) -> Result<Self> {
        let (dim, ffn) = (config.encoder_dim, config.encoder_ffn);
        Ok(Self {
            norm_mha: w.layer_norm(&format!("{prefix}.norm_mha"), dim, 1e-12)?,
            attention: rel_attention(w, &format!("{prefix}.self_attn"), dim, config.encoder_heads)?,
            norm_ff: w.layer_norm(&format!("{prefix}.norm_ff"), dim, 1e-12)?,
            w1: w.linear(&format!("{prefix}.feed_forward.w_1"), ffn, dim)?,
            w2: w.linear(&format!("{prefix}.feed_forward.w_2"), dim, ffn)?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        positions: &RelativePositions,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let attended = self
            .attention
            .forward(&self.norm_mha.forward(x)?, positions, bias)
            .map_err(CosyVoiceError::Layers)?;
        let x = (x + attended)?;
        let h = self.w1.forward(&self.norm_ff.forward(&x)?)?.silu()?;
        Ok((&x + self.w2.forward(&h)?)?)
    }
}

/// A stack of conformer layers sharing one relative-position table and chunk mask.
fn conformer_stack(
    layers: &[ConformerLayer],
    x: &Tensor,
    chunk: usize,
    heads: usize,
) -> Result<Tensor> {
    let (_, t, dim) = x.dims3()?;
    let positions =
        RelativePositions::new(t, dim, heads, x.device()).map_err(CosyVoiceError::Layers)?;
    let bias = chunk_bias(t, chunk, f32::NEG_INFINITY, x.device())?;
    let mut x = x.clone();
    for layer in layers {
        x = layer.forward(&x, &positions, bias.as_ref())?;
    }
    Ok(x)
}

/// The `UpsampleConformerEncoder`.
#[derive(Debug)]
pub(super) struct Encoder {
    embed: Embed,
    /// Sees `pre_lookahead` frames ahead (run without padding on frames padded on the right).
    lookahead1: Conv1d,
    /// Causal.
    lookahead2: Conv1d,
    layers: Vec<ConformerLayer>,
    /// Causal, after the ×2 upsampling.
    up_conv: Conv1d,
    up_embed: Embed,
    up_layers: Vec<ConformerLayer>,
    after_norm: LayerNorm,
    /// Tokens the pre-lookahead layer sees ahead.
    pre_lookahead: usize,
    heads: usize,
    /// Tokens a streaming attention chunk holds.
    chunk: usize,
}

impl Encoder {
    pub(super) fn load(w: &mut Weights, config: &FlowConfig) -> Result<Self> {
        let dim = config.encoder_dim;
        let layers = |w: &mut Weights, name: &str, n: usize| -> Result<Vec<ConformerLayer>> {
            (0..n)
                .map(|i| ConformerLayer::load(w, &format!("encoder.{name}.{i}"), config))
                .collect()
        };
        Ok(Self {
            embed: Embed::load(w, "encoder.embed", dim, dim)?,
            lookahead1: w.unpadded_conv(
                "encoder.pre_lookahead_layer.conv1",
                [dim, dim, config.pre_lookahead + 1],
            )?,
            lookahead2: w.unpadded_conv("encoder.pre_lookahead_layer.conv2", [dim, dim, 3])?,
            layers: layers(w, "encoders", config.encoder_blocks)?,
            up_conv: w.unpadded_conv("encoder.up_layer.conv", [dim, dim, 5])?,
            up_embed: Embed::load(w, "encoder.up_embed", dim, dim)?,
            up_layers: layers(w, "up_encoders", config.up_blocks)?,
            after_norm: w.layer_norm("encoder.after_norm", dim, 1e-5)?,
            pre_lookahead: config.pre_lookahead,
            heads: config.encoder_heads,
            chunk: config.encoder_chunk,
        })
    }

    /// See [`Flow::encode`](super::Flow::encode).
    pub(super) fn forward(
        &self,
        xs: &Tensor,
        context: Option<&Tensor>,
        streaming: bool,
    ) -> Result<Tensor> {
        let look = self.pre_lookahead;
        let h = self.embed.forward(xs)?;
        let mut y = h.transpose(1, 2)?;
        let mut seen = 0;
        if let Some(context) = context {
            seen = context.dim(1)?;
            if seen > look {
                return Err(CosyVoiceError::Input(format!(
                    "{seen} context frames; the pre-lookahead layer sees {look}"
                )));
            }
            y = Tensor::cat(&[&y, &self.embed.forward(context)?.transpose(1, 2)?], 2)?;
        }
        let y = y.pad_with_zeros(2, 0, look - seen)?;
        let y = candle_nn::ops::leaky_relu(&self.lookahead1.forward(&y)?, 0.01)?;
        let y = causal_conv(&self.lookahead2, &y)?;
        let h = (y.transpose(1, 2)? + h)?;
        let heads = self.heads;
        let chunk = if streaming { self.chunk } else { 0 };
        let h = conformer_stack(&self.layers, &h, chunk, heads)?;

        let (b, t, dim) = h.dims3()?;
        let up = h
            .transpose(1, 2)?
            .unsqueeze(3)?
            .broadcast_as((b, dim, t, 2))?
            .reshape((b, dim, 2 * t))?;
        let up = causal_conv(&self.up_conv, &up)?.transpose(1, 2)?;
        let h = self.up_embed.forward(&up)?;
        let h = conformer_stack(&self.up_layers, &h, 2 * chunk, heads)?;
        Ok(self.after_norm.forward(&h)?)
    }
}
