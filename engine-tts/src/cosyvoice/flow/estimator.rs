//! The estimator `CausalConditionalDecoder`: a one-level U-Net of causal ResNet blocks and
//! Matcha/diffusers transformer blocks that predicts the flow's velocity.

use candle_core::{DType, Module, Tensor};
use candle_nn::{Conv1d, LayerNorm, Linear};
use spec_nn::SequenceAttention;

use super::{causal_conv, channel_norm, chunk_bias, mish, FlowConfig, Weights};
use crate::cosyvoice::{CosyVoiceError, Result};

/// `CausalBlock1D`: causal k3 convolution, LayerNorm over channels, Mish, masked.
#[derive(Debug)]
struct CausalBlock {
    /// Causal.
    conv: Conv1d,
    norm: LayerNorm,
}

impl CausalBlock {
    fn load(w: &mut Weights, prefix: &str, out: usize, inp: usize) -> Result<Self> {
        Ok(Self {
            conv: w.unpadded_conv(&format!("{prefix}.block.0"), [out, inp, 3])?,
            norm: w.layer_norm(&format!("{prefix}.block.2"), out, 1e-5)?,
        })
    }

    fn forward(&self, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let y = causal_conv(&self.conv, &x.broadcast_mul(mask)?)?;
        Ok(mish(&channel_norm(&self.norm, &y)?)?.broadcast_mul(mask)?)
    }
}

/// `CausalResnetBlock1D`: two causal blocks with the time embedding added between them, and a
/// 1×1 convolution on the residual path.
#[derive(Debug)]
struct ResnetBlock {
    block1: CausalBlock,
    time: Linear,
    block2: CausalBlock,
    /// 1×1.
    res_conv: Conv1d,
}

impl ResnetBlock {
    fn load(w: &mut Weights, prefix: &str, out: usize, inp: usize, time: usize) -> Result<Self> {
        Ok(Self {
            block1: CausalBlock::load(w, &format!("{prefix}.block1"), out, inp)?,
            time: w.linear(&format!("{prefix}.mlp.1"), out, time)?,
            block2: CausalBlock::load(w, &format!("{prefix}.block2"), out, out)?,
            res_conv: w.unpadded_conv(&format!("{prefix}.res_conv"), [out, inp, 1])?,
        })
    }

    fn forward(&self, x: &Tensor, mask: &Tensor, temb: &Tensor) -> Result<Tensor> {
        let h = self.block1.forward(x, mask)?;
        let h = h.broadcast_add(&self.time.forward(&mish(temb)?)?.unsqueeze(2)?)?;
        let h = self.block2.forward(&h, mask)?;
        Ok((h + self.res_conv.forward(&x.broadcast_mul(mask)?)?)?)
    }
}

/// Matcha's `BasicTransformerBlock` (diffusers attention): self-attention and an exact-GELU
/// feed-forward, each after a LayerNorm, each residual.
#[derive(Debug)]
struct TransformerBlock {
    norm1: LayerNorm,
    attention: SequenceAttention,
    norm3: LayerNorm,
    ff_in: Linear,
    ff_out: Linear,
}

impl TransformerBlock {
    fn load(w: &mut Weights, prefix: &str, config: &FlowConfig) -> Result<Self> {
        let c = config.decoder_channels;
        let inner = config.decoder_heads * config.decoder_head_dim;
        Ok(Self {
            norm1: w.layer_norm(&format!("{prefix}.norm1"), c, 1e-5)?,
            attention: SequenceAttention {
                q: w.linear_no_bias(&format!("{prefix}.attn1.to_q"), inner, c)?,
                k: w.linear_no_bias(&format!("{prefix}.attn1.to_k"), inner, c)?,
                v: w.linear_no_bias(&format!("{prefix}.attn1.to_v"), inner, c)?,
                out: w.linear(&format!("{prefix}.attn1.to_out.0"), c, inner)?,
                heads: config.decoder_heads,
                head_dim: config.decoder_head_dim,
            },
            norm3: w.layer_norm(&format!("{prefix}.norm3"), c, 1e-5)?,
            ff_in: w.linear(&format!("{prefix}.ff.net.0.proj"), 4 * c, c)?,
            ff_out: w.linear(&format!("{prefix}.ff.net.2"), c, 4 * c)?,
        })
    }

    /// `x` `[B, T, C]`; `bias` `[B, 1, T, T]` additive.
    fn forward(&self, x: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let attended = self
            .attention
            .forward(&self.norm1.forward(x)?, Some(bias))
            .map_err(CosyVoiceError::Layers)?;
        let x = (x + attended)?;
        let n = self.norm3.forward(&x)?;
        Ok((&x + self.ff_out.forward(&self.ff_in.forward(&n)?.gelu_erf()?)?)?)
    }
}

/// A U-Net stage: a ResNet block then transformer blocks.
#[derive(Debug)]
struct Stage {
    resnet: ResnetBlock,
    transformers: Vec<TransformerBlock>,
}

impl Stage {
    fn load(w: &mut Weights, prefix: &str, inp: usize, config: &FlowConfig) -> Result<Self> {
        let c = config.decoder_channels;
        Ok(Self {
            resnet: ResnetBlock::load(w, &format!("{prefix}.0"), c, inp, 4 * c)?,
            transformers: (0..config.decoder_transformer_blocks)
                .map(|j| TransformerBlock::load(w, &format!("{prefix}.1.{j}"), config))
                .collect::<Result<_>>()?,
        })
    }

    fn forward(&self, x: &Tensor, mask: &Tensor, temb: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let mut h = self
            .resnet
            .forward(x, mask, temb)?
            .transpose(1, 2)?
            .contiguous()?;
        for block in &self.transformers {
            h = block.forward(&h, bias)?;
        }
        Ok(h.transpose(1, 2)?.contiguous()?)
    }
}

/// The estimator `CausalConditionalDecoder` (one channel level, as CosyVoice 2 has it).
#[derive(Debug)]
pub(super) struct Estimator {
    time1: Linear,
    time2: Linear,
    down: Stage,
    /// Causal.
    down_conv: Conv1d,
    mid: Vec<Stage>,
    up: Stage,
    /// Causal.
    up_conv: Conv1d,
    final_block: CausalBlock,
    /// 1×1.
    final_proj: Conv1d,
    /// Width of the sinusoidal time embedding.
    time_in: usize,
}

impl Estimator {
    pub(super) fn load(w: &mut Weights, config: &FlowConfig) -> Result<Self> {
        let p = "decoder.estimator";
        let c = config.decoder_channels;
        let time_in = config.estimator_in();
        Ok(Self {
            time1: w.linear(&format!("{p}.time_mlp.linear_1"), 4 * c, time_in)?,
            time2: w.linear(&format!("{p}.time_mlp.linear_2"), 4 * c, 4 * c)?,
            down: Stage::load(w, &format!("{p}.down_blocks.0"), time_in, config)?,
            down_conv: w.unpadded_conv(&format!("{p}.down_blocks.0.2"), [c, c, 3])?,
            mid: (0..config.decoder_mid_blocks)
                .map(|m| Stage::load(w, &format!("{p}.mid_blocks.{m}"), c, config))
                .collect::<Result<_>>()?,
            up: Stage::load(w, &format!("{p}.up_blocks.0"), 2 * c, config)?,
            up_conv: w.unpadded_conv(&format!("{p}.up_blocks.0.2"), [c, c, 3])?,
            final_block: CausalBlock::load(w, &format!("{p}.final_block"), c, c)?,
            final_proj: w.unpadded_conv(&format!("{p}.final_proj"), [config.mel_channels, c, 1])?,
            time_in,
        })
    }

    /// The sinusoidal embedding of `1000 t` (`[sin, cos]`, frequencies `10000^(−i/(half−1))`)
    /// through the time MLP.
    fn time_embedding(&self, t: &Tensor) -> Result<Tensor> {
        let half = self.time_in / 2;
        let step = (10000f64.ln() / (half - 1) as f64) as f32;
        let frequencies: Vec<f32> = (0..half).map(|i| (i as f32 * -step).exp()).collect();
        let frequencies = Tensor::from_vec(frequencies, (1, half), t.device())?;
        let angles = (t.to_dtype(DType::F32)? * 1000.0)?
            .unsqueeze(1)?
            .broadcast_mul(&frequencies)?;
        let temb = Tensor::cat(&[angles.sin()?, angles.cos()?], 1)?;
        Ok(self.time2.forward(&self.time1.forward(&temb)?.silu()?)?)
    }

    /// `h` `[B, 320, T]` → velocity `[B, 80, T]`; `chunk` frames per attention chunk (0: full
    /// attention).
    pub(super) fn forward(
        &self,
        h: &Tensor,
        mask: &Tensor,
        t: &Tensor,
        chunk: usize,
    ) -> Result<Tensor> {
        let (b, _, frames) = h.dims3()?;
        let temb = self.time_embedding(t)?;
        // Bias −1e10 where a key is padding or outside the query's chunk.
        let keys = mask.broadcast_as((b, frames, frames))?;
        let mut allowed = keys.clone();
        if let Some(chunk) = chunk_bias(frames, chunk, 1.0, h.device())? {
            allowed = allowed.broadcast_mul(&(1.0 - chunk)?.unsqueeze(0)?)?;
        }
        let bias = ((1.0 - allowed)? * -1.0e10)?.unsqueeze(1)?;

        let h = self.down.forward(h, mask, &temb, &bias)?;
        let skip = h.clone();
        let mut h = causal_conv(&self.down_conv, &h.broadcast_mul(mask)?)?;
        for stage in &self.mid {
            h = stage.forward(&h, mask, &temb, &bias)?;
        }
        let h = Tensor::cat(&[&h, &skip], 1)?;
        let h = self.up.forward(&h, mask, &temb, &bias)?;
        let h = causal_conv(&self.up_conv, &h.broadcast_mul(mask)?)?;
        let h = self.final_block.forward(&h, mask)?;
        Ok(self
            .final_proj
            .forward(&h.broadcast_mul(mask)?)?
            .broadcast_mul(mask)?)
    }
}
