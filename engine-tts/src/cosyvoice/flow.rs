//! CosyVoice 2's flow-matching decoder (the reference's `CausalMaskedDiffWithXvec`): speech
//! tokens (25 Hz) and a prompt → mel frames (80 × 2 per token, 50 Hz).
//!
//! * Token embedding, then the `UpsampleConformerEncoder`: a linear embedding with LayerNorm
//!   and ×√D, the pre-lookahead layer (a k4 convolution that sees three tokens ahead, a causal
//!   k3 convolution, residual), conformer layers with ESPnet relative-position attention
//!   (`pos_bias_u` / `pos_bias_v`, `rel_shift`) and a SiLU feed-forward, ×2 nearest upsampling
//!   with a causal k5 convolution, a second embedding and more conformer layers, a final
//!   LayerNorm; `encoder_proj` gives μ. In streaming, attention is chunk-causal (full left
//!   context).
//! * `CausalConditionalCFM`: Euler steps on the cosine schedule `1 − cos(π t / 2)`, each on a
//!   batch of two (conditioned; μ, speaker and prompt mel zeroed) mixed with classifier-free
//!   guidance `(1 + 0.7) v_cond − 0.7 v_uncond`, from a fixed noise.
//! * The estimator `CausalConditionalDecoder`: a one-level U-Net of causal ResNet blocks (Mish,
//!   LayerNorm over channels, the time embedding added) and Matcha/diffusers transformer
//!   blocks (LayerNorm, bias-free q/k/v, additive −1e10 mask bias, exact-GELU feed-forward),
//!   on `[x, μ, speaker, prompt mel]`, with a sinusoidal time embedding through an MLP.
//!
//! What differs from the reference: the noise is an argument (the reference draws
//! `torch.randn(1, 80, 15000)` once after seeding torch's RNG with 0 and slices it for every
//! call; [`reference_noise`] reproduces that tensor, or pass any other); batches are of one utterance (the reference asserts
//! it too), so there is no padding mask; dropout is absent (inference only).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{LayerNorm, Linear};

use crate::cosyvoice::{CosyVoiceError, Result};

/// Settings of a [`Flow`]; the defaults are CosyVoice 2's.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowConfig {
    /// Speech-token vocabulary.
    pub vocab_size: usize,
    /// Width of the token embedding and of the encoder (D).
    pub encoder_dim: usize,
    pub encoder_heads: usize,
    /// Inner width of the encoder's feed-forward layers.
    pub encoder_ffn: usize,
    /// Conformer layers before the upsampling.
    pub encoder_blocks: usize,
    /// Conformer layers after the upsampling.
    pub up_blocks: usize,
    /// Tokens a streaming attention chunk holds (doubled after the upsampling).
    pub encoder_chunk: usize,
    /// Tokens the pre-lookahead layer sees ahead.
    pub pre_lookahead: usize,
    /// Mel channels.
    pub mel_channels: usize,
    /// Size of the speaker embedding (x-vector).
    pub speaker_dim: usize,
    /// Channels of the estimator's U-Net.
    pub decoder_channels: usize,
    pub decoder_heads: usize,
    pub decoder_head_dim: usize,
    /// Transformer blocks per U-Net stage.
    pub decoder_transformer_blocks: usize,
    pub decoder_mid_blocks: usize,
    /// Frames a streaming attention chunk of the estimator holds.
    pub decoder_chunk: usize,
    /// Euler steps.
    pub n_timesteps: usize,
    /// Classifier-free guidance weight.
    pub cfg_rate: f64,
}

impl Default for FlowConfig {
    fn default() -> Self {
        Self {
            vocab_size: 6561,
            encoder_dim: 512,
            encoder_heads: 8,
            encoder_ffn: 2048,
            encoder_blocks: 6,
            up_blocks: 4,
            encoder_chunk: 25,
            pre_lookahead: 3,
            mel_channels: 80,
            speaker_dim: 192,
            decoder_channels: 256,
            decoder_heads: 8,
            decoder_head_dim: 64,
            decoder_transformer_blocks: 4,
            decoder_mid_blocks: 12,
            decoder_chunk: 50,
            n_timesteps: 10,
            cfg_rate: 0.7,
        }
    }
}

impl FlowConfig {
    fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(CosyVoiceError::Config(format!("flow: {what}")));
        if self.encoder_heads == 0 || !self.encoder_dim.is_multiple_of(2 * self.encoder_heads) {
            return bad("the encoder width must be an even multiple of its heads");
        }
        if self.n_timesteps == 0 {
            return bad("at least one Euler step");
        }
        if self.pre_lookahead == 0 {
            return bad("the pre-lookahead must be at least one token");
        }
        Ok(())
    }

    /// Channels the estimator's input concatenates: noise, μ, speaker and prompt mel.
    fn estimator_in(&self) -> usize {
        4 * self.mel_channels
    }
}

/// The checkpoint's tensors, taken by name with their shapes checked.
struct Weights<'a> {
    tensors: HashMap<String, Tensor>,
    device: &'a Device,
}

impl Weights<'_> {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let tensor = self
            .tensors
            .remove(name)
            .ok_or_else(|| CosyVoiceError::Weights {
                name: name.into(),
                reason: "missing".into(),
            })?;
        if tensor.dims() != shape {
            return Err(CosyVoiceError::Weights {
                name: name.into(),
                reason: format!("shape {:?}, expected {shape:?}", tensor.dims()),
            });
        }
        Ok(tensor.to_dtype(DType::F32)?.to_device(self.device)?)
    }

    fn linear(&mut self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear::new(
            self.take(&format!("{prefix}.weight"), &[out, inp])?,
            Some(self.take(&format!("{prefix}.bias"), &[out])?),
        ))
    }

    fn linear_no_bias(&mut self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear::new(
            self.take(&format!("{prefix}.weight"), &[out, inp])?,
            None,
        ))
    }

    fn layer_norm(&mut self, prefix: &str, dim: usize, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm::new(
            self.take(&format!("{prefix}.weight"), &[dim])?,
            self.take(&format!("{prefix}.bias"), &[dim])?,
            eps,
        ))
    }

    fn conv(&mut self, prefix: &str, out: usize, inp: usize, kernel: usize) -> Result<Conv> {
        Ok(Conv {
            weight: self.take(&format!("{prefix}.weight"), &[out, inp, kernel])?,
            bias: self
                .take(&format!("{prefix}.bias"), &[out])?
                .reshape((1, out, 1))?,
            kernel,
        })
    }
}

/// A 1-d convolution with its bias, run causally (left zero padding of `kernel − 1`) or
/// without padding.
#[derive(Debug)]
struct Conv {
    weight: Tensor,
    bias: Tensor,
    kernel: usize,
}

impl Conv {
    /// `x` `[B, C, T]` without padding.
    fn valid(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.contiguous()?
            .conv1d(&self.weight, 0, 1, 1, 1)?
            .broadcast_add(&self.bias)?)
    }

    /// `x` `[B, C, T]` → `[B, C', T]`, each output frame seeing only frames up to its own.
    fn causal(&self, x: &Tensor) -> Result<Tensor> {
        self.valid(&x.pad_with_zeros(D::Minus1, self.kernel - 1, 0)?)
    }
}

/// `x · tanh(softplus(x))`.
fn mish(x: &Tensor) -> Result<Tensor> {
    let softplus = (x.exp()? + 1.0)?.log()?;
    // Like torch's softplus, keep large inputs as they are (exp would overflow).
    let softplus = x.gt(20.0)?.where_cond(x, &softplus)?;
    Ok((x * softplus.tanh()?)?)
}

/// LayerNorm over the channels of `[B, C, T]`.
fn channel_norm(norm: &LayerNorm, x: &Tensor) -> Result<Tensor> {
    Ok(norm
        .forward(&x.transpose(1, 2)?.contiguous()?)?
        .transpose(1, 2)?
        .contiguous()?)
}

/// `[T, T]` additive attention bias: 0 where query `i` may see key `j` (`j < (⌊i/c⌋ + 1) c`),
/// `blocked` elsewhere; `None` when every key is visible.
fn chunk_bias(
    frames: usize,
    chunk: usize,
    blocked: f32,
    device: &Device,
) -> Result<Option<Tensor>> {
    if chunk == 0 {
        return Ok(None);
    }
    let values: Vec<f32> = (0..frames)
        .flat_map(|i| {
            (0..frames).map(move |j| {
                if j < (i / chunk + 1) * chunk {
                    0.0
                } else {
                    blocked
                }
            })
        })
        .collect();
    Ok(Some(Tensor::from_vec(values, (frames, frames), device)?))
}

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

/// ESPnet's relative-position multi-head attention (`RelPositionMultiHeadedAttention`).
#[derive(Debug)]
struct RelAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    pos: Linear,
    /// `[1, H, 1, d_k]`.
    bias_u: Tensor,
    bias_v: Tensor,
    heads: usize,
}

impl RelAttention {
    fn load(w: &mut Weights, prefix: &str, dim: usize, heads: usize) -> Result<Self> {
        let dk = dim / heads;
        let bias = |w: &mut Weights, name: &str| -> Result<Tensor> {
            Ok(w.take(&format!("{prefix}.{name}"), &[heads, dk])?
                .reshape((1, heads, 1, dk))?)
        };
        Ok(Self {
            q: w.linear(&format!("{prefix}.linear_q"), dim, dim)?,
            k: w.linear(&format!("{prefix}.linear_k"), dim, dim)?,
            v: w.linear(&format!("{prefix}.linear_v"), dim, dim)?,
            out: w.linear(&format!("{prefix}.linear_out"), dim, dim)?,
            pos: w.linear_no_bias(&format!("{prefix}.linear_pos"), dim, dim)?,
            bias_u: bias(w, "pos_bias_u")?,
            bias_v: bias(w, "pos_bias_v")?,
            heads,
        })
    }

    /// `x` `[B, T, D]`; `pos` the `[2T − 1, D]` table of relative positions `T − 1 … −(T − 1)`;
    /// `shift` the `[B, H, T, T]` indices `T − 1 − i + j` into it; `bias` the chunk mask.
    fn forward(
        &self,
        x: &Tensor,
        pos: &Tensor,
        shift: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, t, dim) = x.dims3()?;
        let (h, dk) = (self.heads, dim / self.heads);
        let split = |y: Tensor| -> Result<Tensor> {
            Ok(y.reshape((b, t, h, dk))?.transpose(1, 2)?.contiguous()?)
        };
        let q = split(self.q.forward(x)?)?;
        let k = split(self.k.forward(x)?)?;
        let v = split(self.v.forward(x)?)?;
        let p = self
            .pos
            .forward(pos)?
            .reshape((2 * t - 1, h, dk))?
            .transpose(0, 1)?
            .contiguous()?
            .unsqueeze(0)?;
        let content = q
            .broadcast_add(&self.bias_u)?
            .matmul(&k.transpose(2, 3)?.contiguous()?)?;
        let position = q
            .broadcast_add(&self.bias_v)?
            .broadcast_matmul(&p.transpose(2, 3)?.contiguous()?)?
            .contiguous()?
            .gather(shift, 3)?;
        let mut scores = ((content + position)? / (dk as f64).sqrt())?;
        if let Some(bias) = bias {
            scores = scores.broadcast_add(bias)?;
        }
        let attention = candle_nn::ops::softmax_last_dim(&scores.contiguous()?)?;
        let merged = attention
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, t, dim))?;
        Ok(self.out.forward(&merged)?)
    }
}

/// A conformer layer with pre-norm, relative-position attention and a SiLU feed-forward (no
/// macaron, no convolution module).
#[derive(Debug)]
struct ConformerLayer {
    norm_mha: LayerNorm,
    attention: RelAttention,
    norm_ff: LayerNorm,
    w1: Linear,
    w2: Linear,
}

impl ConformerLayer {
    fn load(w: &mut Weights, prefix: &str, config: &FlowConfig) -> Result<Self> {
        let (dim, ffn) = (config.encoder_dim, config.encoder_ffn);
        Ok(Self {
            norm_mha: w.layer_norm(&format!("{prefix}.norm_mha"), dim, 1e-12)?,
            attention: RelAttention::load(
                w,
                &format!("{prefix}.self_attn"),
                dim,
                config.encoder_heads,
            )?,
            norm_ff: w.layer_norm(&format!("{prefix}.norm_ff"), dim, 1e-12)?,
            w1: w.linear(&format!("{prefix}.feed_forward.w_1"), ffn, dim)?,
            w2: w.linear(&format!("{prefix}.feed_forward.w_2"), dim, ffn)?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        pos: &Tensor,
        shift: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let x = (x + self
            .attention
            .forward(&self.norm_mha.forward(x)?, pos, shift, bias)?)?;
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
    let (b, t, dim) = x.dims3()?;
    let device = x.device();
    let pos = relative_positions(t, dim, device)?;
    let indices: Vec<u32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| (t - 1 - i + j) as u32))
        .collect();
    let shift = Tensor::from_vec(indices, (1, 1, t, t), device)?
        .broadcast_as((b, heads, t, t))?
        .contiguous()?;
    let bias = chunk_bias(t, chunk, f32::NEG_INFINITY, device)?;
    let mut x = x.clone();
    for layer in layers {
        x = layer.forward(&x, &pos, &shift, bias.as_ref())?;
    }
    Ok(x)
}

/// ESPnet's relative positional encoding for `t` frames: row `k` is the sinusoid of position
/// `t − 1 − k` (`sin` on even, `cos` on odd channels), computed in f32 as the reference does.
fn relative_positions(t: usize, dim: usize, device: &Device) -> Result<Tensor> {
    let step = -(10000f64.ln() / dim as f64) as f32;
    let frequencies: Vec<f32> = (0..dim / 2)
        .map(|i| ((2 * i) as f32 * step).exp())
        .collect();
    let mut table = Vec::with_capacity((2 * t - 1) * dim);
    for k in 0..2 * t - 1 {
        let p = (t as f32 - 1.0) - k as f32;
        for &f in &frequencies {
            let angle = p * f;
            table.push(angle.sin());
            table.push(angle.cos());
        }
    }
    Ok(Tensor::from_vec(table, (2 * t - 1, dim), device)?)
}

/// The `UpsampleConformerEncoder`.
#[derive(Debug)]
struct Encoder {
    embed: Embed,
    lookahead1: Conv,
    lookahead2: Conv,
    layers: Vec<ConformerLayer>,
    up_conv: Conv,
    up_embed: Embed,
    up_layers: Vec<ConformerLayer>,
    after_norm: LayerNorm,
}

/// CosyVoice 2's flow-matching decoder: speech tokens → mel frames.
#[derive(Debug)]
pub struct Flow {
    embedding: Tensor,
    speaker: Linear,
    encoder: Encoder,
    encoder_proj: Linear,
    estimator: Estimator,
    config: FlowConfig,
    device: Device,
}

/// The prompt of a [`Flow::inference`]: the reference utterance's speech tokens, its mel
/// frames (two per token) and the speaker's x-vector.
#[derive(Clone, Debug)]
pub struct FlowPrompt {
    pub tokens: Vec<u32>,
    /// `[1, 2 · tokens, 80]`.
    pub mel: Tensor,
    /// `[1, 192]`.
    pub speaker: Tensor,
}

impl Flow {
    /// The decoder from the tensors of `flow.pt` (names as its state dict has them).
    pub fn from_tensors(
        tensors: HashMap<String, Tensor>,
        config: FlowConfig,
        device: &Device,
    ) -> Result<Self> {
        config.validate()?;
        let mut w = Weights { tensors, device };
        let (dim, mel) = (config.encoder_dim, config.mel_channels);
        let embedding = w.take("input_embedding.weight", &[config.vocab_size, dim])?;
        let speaker = w.linear("spk_embed_affine_layer", mel, config.speaker_dim)?;
        let layers = |w: &mut Weights, name: &str, n: usize| -> Result<Vec<ConformerLayer>> {
            (0..n)
                .map(|i| ConformerLayer::load(w, &format!("encoder.{name}.{i}"), &config))
                .collect()
        };
        let encoder = Encoder {
            embed: Embed::load(&mut w, "encoder.embed", dim, dim)?,
            lookahead1: w.conv(
                "encoder.pre_lookahead_layer.conv1",
                dim,
                dim,
                config.pre_lookahead + 1,
            )?,
            lookahead2: w.conv("encoder.pre_lookahead_layer.conv2", dim, dim, 3)?,
            layers: layers(&mut w, "encoders", config.encoder_blocks)?,
            up_conv: w.conv("encoder.up_layer.conv", dim, dim, 5)?,
            up_embed: Embed::load(&mut w, "encoder.up_embed", dim, dim)?,
            up_layers: layers(&mut w, "up_encoders", config.up_blocks)?,
            after_norm: w.layer_norm("encoder.after_norm", dim, 1e-5)?,
        };
        let encoder_proj = w.linear("encoder_proj", mel, dim)?;
        let estimator = Estimator::load(&mut w, &config)?;
        Ok(Self {
            embedding,
            speaker,
            encoder,
            encoder_proj,
            estimator,
            config,
            device: device.clone(),
        })
    }

    /// Loads `flow.pt` (a PyTorch state dict) or its safetensors conversion.
    pub fn load(weights: &Path, config: FlowConfig, device: &Device) -> Result<Self> {
        let bad = |reason: String| CosyVoiceError::File {
            path: weights.to_path_buf(),
            reason,
        };
        let tensors: HashMap<String, Tensor> =
            if weights.extension().is_some_and(|e| e == "safetensors") {
                candle_core::safetensors::load(weights, &Device::Cpu)
                    .map_err(|e| bad(e.to_string()))?
            } else {
                candle_core::pickle::read_all(weights)
                    .map_err(|e| bad(e.to_string()))?
                    .into_iter()
                    .collect()
            };
        Self::from_tensors(tensors, config, device)
    }

    pub fn config(&self) -> &FlowConfig {
        &self.config
    }

    /// The token embeddings `[1, L, D]` of `tokens`.
    pub fn embed_tokens(&self, tokens: &[u32]) -> Result<Tensor> {
        if let Some(&bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(CosyVoiceError::Input(format!(
                "speech token {bad} outside the flow's vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let ids = Tensor::from_slice(tokens, tokens.len(), &self.device)?;
        Ok(self.embedding.index_select(&ids, 0)?.unsqueeze(0)?)
    }

    /// The encoder's output `[B, 2T, D]` for token embeddings `xs` `[B, T, D]`; `context`
    /// `[B, n ≤ 3, D]` are the embeddings of the tokens after `xs` that the pre-lookahead layer
    /// may see (zeros stand in for the missing ones). `streaming` makes attention chunk-causal.
    pub fn encode(&self, xs: &Tensor, context: Option<&Tensor>, streaming: bool) -> Result<Tensor> {
        let e = &self.encoder;
        let look = self.config.pre_lookahead;
        let h = e.embed.forward(xs)?;
        let mut y = h.transpose(1, 2)?;
        let mut seen = 0;
        if let Some(context) = context {
            seen = context.dim(1)?;
            if seen > look {
                return Err(CosyVoiceError::Input(format!(
                    "{seen} context frames; the pre-lookahead layer sees {look}"
                )));
            }
            y = Tensor::cat(&[&y, &e.embed.forward(context)?.transpose(1, 2)?], 2)?;
        }
        let y = y.pad_with_zeros(2, 0, look - seen)?;
        let y = candle_nn::ops::leaky_relu(&e.lookahead1.valid(&y)?, 0.01)?;
        let y = e.lookahead2.causal(&y)?;
        let h = (y.transpose(1, 2)? + h)?;
        let heads = self.config.encoder_heads;
        let chunk = if streaming {
            self.config.encoder_chunk
        } else {
            0
        };
        let h = conformer_stack(&e.layers, &h, chunk, heads)?;

        let (b, t, dim) = h.dims3()?;
        let up = h
            .transpose(1, 2)?
            .unsqueeze(3)?
            .broadcast_as((b, dim, t, 2))?
            .reshape((b, dim, 2 * t))?;
        let up = e.up_conv.causal(&up)?.transpose(1, 2)?;
        let h = e.up_embed.forward(&up)?;
        let h = conformer_stack(&e.up_layers, &h, 2 * chunk, heads)?;
        Ok(e.after_norm.forward(&h)?)
    }

    /// One velocity estimate `[B, 80, T]` for the noisy mel `x` `[B, 80, T]` at times `t`
    /// `[B]`, given the frame mask `[B, 1, T]`, μ `[B, 80, T]`, speaker projections `spks`
    /// `[B, 80]` and prompt mel `cond` `[B, 80, T]`. `streaming` makes attention chunk-causal.
    #[allow(clippy::too_many_arguments)]
    pub fn estimate(
        &self,
        x: &Tensor,
        mask: &Tensor,
        mu: &Tensor,
        t: &Tensor,
        spks: &Tensor,
        cond: &Tensor,
        streaming: bool,
    ) -> Result<Tensor> {
        let frames = x.dim(2)?;
        let spks = spks
            .unsqueeze(2)?
            .broadcast_as((spks.dim(0)?, spks.dim(1)?, frames))?;
        let h = Tensor::cat(&[x, mu, &spks, cond], 1)?;
        let chunk = if streaming {
            self.config.decoder_chunk
        } else {
            0
        };
        self.estimator.forward(&h, mask, t, chunk)
    }

    /// Mel frames `[1, 80, 2 · tokens]` for `tokens` after the prompt. `noise` `[1, 80, n]`
    /// is the starting point of the flow, sliced to the frames needed (prompt and tokens).
    /// `finalize: false` keeps the last [`FlowConfig::pre_lookahead`] tokens as look-ahead
    /// only (their frames are not returned), as in streaming; `streaming` makes attention
    /// chunk-causal.
    pub fn inference(
        &self,
        tokens: &[u32],
        prompt: &FlowPrompt,
        noise: &Tensor,
        streaming: bool,
        finalize: bool,
    ) -> Result<Tensor> {
        let mel_channels = self.config.mel_channels;
        if prompt.mel.dims() != [1, 2 * prompt.tokens.len(), mel_channels] {
            return Err(CosyVoiceError::Input(format!(
                "prompt mel of shape {:?} for {} prompt tokens; expected [1, {}, {mel_channels}]",
                prompt.mel.dims(),
                prompt.tokens.len(),
                2 * prompt.tokens.len()
            )));
        }
        if prompt.speaker.dims() != [1, self.config.speaker_dim] {
            return Err(CosyVoiceError::Input(format!(
                "speaker embedding of shape {:?}; expected [1, {}]",
                prompt.speaker.dims(),
                self.config.speaker_dim
            )));
        }
        let all: Vec<u32> = prompt.tokens.iter().chain(tokens).copied().collect();
        let x = self.embed_tokens(&all)?;
        let h = if finalize {
            self.encode(&x, None, streaming)?
        } else {
            let look = self.config.pre_lookahead;
            if tokens.len() < look {
                return Err(CosyVoiceError::Input(format!(
                    "{} tokens; a chunk that is not the last needs at least the {look} look-ahead tokens",
                    tokens.len()
                )));
            }
            let n = all.len() - look;
            self.encode(&x.narrow(1, 0, n)?, Some(&x.narrow(1, n, look)?), streaming)?
        };
        let mu = self
            .encoder_proj
            .forward(&h)?
            .transpose(1, 2)?
            .contiguous()?;
        let frames = mu.dim(2)?;
        let prompt_frames = prompt.mel.dim(1)?;
        if noise.dims().len() != 3 || noise.dim(1)? != mel_channels || noise.dim(2)? < frames {
            return Err(CosyVoiceError::Input(format!(
                "noise of shape {:?}; {frames} frames of {mel_channels} channels needed",
                noise.dims()
            )));
        }
        let cond = prompt
            .mel
            .to_dtype(DType::F32)?
            .to_device(&self.device)?
            .transpose(1, 2)?
            .pad_with_zeros(2, 0, frames - prompt_frames)?;
        let speaker = prompt
            .speaker
            .to_dtype(DType::F32)?
            .to_device(&self.device)?;
        let norm = speaker.sqr()?.sum_keepdim(1)?.sqrt()?.maximum(1e-12)?;
        let spks = self.speaker.forward(&speaker.broadcast_div(&norm)?)?;
        let z = noise.to_device(&self.device)?.narrow(2, 0, frames)?;
        let feat = self.solve(z, &mu, &spks, &cond, streaming)?;
        Ok(feat.narrow(2, prompt_frames, frames - prompt_frames)?)
    }

    /// The Euler steps of `CausalConditionalCFM` on the cosine schedule, with classifier-free
    /// guidance; `t` is accumulated in f32 as the reference does.
    fn solve(
        &self,
        mut z: Tensor,
        mu: &Tensor,
        spks: &Tensor,
        cond: &Tensor,
        streaming: bool,
    ) -> Result<Tensor> {
        let steps = self.config.n_timesteps;
        let schedule: Vec<f32> = linspace(steps + 1)
            .into_iter()
            .map(|v| 1.0 - (v * 0.5 * std::f32::consts::PI).cos())
            .collect();
        let frames = z.dim(2)?;
        let mask = Tensor::ones((2, 1, frames), DType::F32, &self.device)?;
        let mu2 = Tensor::cat(&[mu, &mu.zeros_like()?], 0)?;
        let spks2 = Tensor::cat(&[spks, &spks.zeros_like()?], 0)?;
        let cond2 = Tensor::cat(&[cond, &cond.zeros_like()?], 0)?;
        let cfg = self.config.cfg_rate;
        let (mut t, mut dt) = (schedule[0], schedule[1] - schedule[0]);
        for step in 1..=steps {
            let x2 = Tensor::cat(&[&z, &z], 0)?;
            let t2 = Tensor::from_vec(vec![t, t], 2, &self.device)?;
            let v = self.estimate(&x2, &mask, &mu2, &t2, &spks2, &cond2, streaming)?;
            let v = ((v.narrow(0, 0, 1)? * (1.0 + cfg))? - (v.narrow(0, 1, 1)? * cfg)?)?;
            z = (z + (v * f64::from(dt))?)?;
            t += dt;
            if step < steps {
                dt = schedule[step + 1] - t;
            }
        }
        Ok(z)
    }
}

/// The reference's streaming over the flow (the token loop of `CosyVoice2Model.tts`): each
/// chunk recomputes the flow over the prompt and every token so far, chunk-causal, with the last
/// [`FlowConfig::pre_lookahead`] tokens as look-ahead only, and returns the frames of the `hop`
/// new tokens; the first hop is lengthened so that prompt and first hop fill whole hops, and the
/// hop doubles after each chunk up to 4× its start. The last call runs with full attention over
/// all tokens, as the reference's does. Unlike the reference, whose hop is an attribute of the
/// model that keeps growing across utterances, each stream starts at its own hop.
#[derive(Debug)]
pub struct FlowStream<'a> {
    flow: &'a Flow,
    prompt: &'a FlowPrompt,
    noise: &'a Tensor,
    hop: usize,
    max_hop: usize,
    /// Extra tokens of the first hop.
    pad: usize,
    /// Tokens whose frames have been returned.
    offset: usize,
}

impl<'a> FlowStream<'a> {
    /// A stream of hops starting at `hop` tokens (25 in CosyVoice 2).
    pub fn new(
        flow: &'a Flow,
        prompt: &'a FlowPrompt,
        noise: &'a Tensor,
        hop: usize,
    ) -> Result<Self> {
        if hop == 0 {
            return Err(CosyVoiceError::Config(
                "flow stream: a hop of at least one token".into(),
            ));
        }
        let prompt_tokens = prompt.tokens.len();
        Ok(Self {
            flow,
            prompt,
            noise,
            hop,
            max_hop: 4 * hop,
            pad: prompt_tokens.div_ceil(hop) * hop - prompt_tokens,
            offset: 0,
        })
    }

    /// Tokens whose frames have been returned so far.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The mel frames `[1, 80, 2 · hop]` of the next hop once `tokens` (every token generated
    /// so far) hold it and the look-ahead; `None` while they do not.
    pub fn next_chunk(&mut self, tokens: &[u32]) -> Result<Option<Tensor>> {
        let hop = if self.offset == 0 {
            self.hop + self.pad
        } else {
            self.hop
        };
        let end = self.offset + hop + self.flow.config.pre_lookahead;
        if tokens.len() < end {
            return Ok(None);
        }
        let mel = self
            .flow
            .inference(&tokens[..end], self.prompt, self.noise, true, false)?;
        let start = 2 * self.offset;
        let chunk = mel.narrow(2, start, mel.dim(2)? - start)?;
        self.offset += hop;
        self.hop = (2 * self.hop).min(self.max_hop);
        Ok(Some(chunk))
    }

    /// The frames of the tokens left after the last chunk, once `tokens` are all there are.
    pub fn finish(self, tokens: &[u32]) -> Result<Tensor> {
        if tokens.len() < self.offset {
            return Err(CosyVoiceError::Input(format!(
                "{} tokens; {} were streamed already",
                tokens.len(),
                self.offset
            )));
        }
        let mel = self
            .flow
            .inference(tokens, self.prompt, self.noise, false, true)?;
        let start = 2 * self.offset;
        Ok(mel.narrow(2, start, mel.dim(2)? - start)?)
    }
}

/// `torch.linspace(0, 1, n)` in f32: the first half counted up from 0, the second down from 1.
fn linspace(n: usize) -> Vec<f32> {
    let step = 1.0 / (n - 1) as f32;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                step * i as f32
            } else {
                1.0 - step * (n - 1 - i) as f32
            }
        })
        .collect()
}

/// `CausalBlock1D`: causal k3 convolution, LayerNorm over channels, Mish, masked.
#[derive(Debug)]
struct CausalBlock {
    conv: Conv,
    norm: LayerNorm,
}

impl CausalBlock {
    fn load(w: &mut Weights, prefix: &str, out: usize, inp: usize) -> Result<Self> {
        Ok(Self {
            conv: w.conv(&format!("{prefix}.block.0"), out, inp, 3)?,
            norm: w.layer_norm(&format!("{prefix}.block.2"), out, 1e-5)?,
        })
    }

    fn forward(&self, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let y = self.conv.causal(&x.broadcast_mul(mask)?)?;
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
    res_conv: Conv,
}

impl ResnetBlock {
    fn load(w: &mut Weights, prefix: &str, out: usize, inp: usize, time: usize) -> Result<Self> {
        Ok(Self {
            block1: CausalBlock::load(w, &format!("{prefix}.block1"), out, inp)?,
            time: w.linear(&format!("{prefix}.mlp.1"), out, time)?,
            block2: CausalBlock::load(w, &format!("{prefix}.block2"), out, out)?,
            res_conv: w.conv(&format!("{prefix}.res_conv"), out, inp, 1)?,
        })
    }

    fn forward(&self, x: &Tensor, mask: &Tensor, temb: &Tensor) -> Result<Tensor> {
        let h = self.block1.forward(x, mask)?;
        let h = h.broadcast_add(&self.time.forward(&mish(temb)?)?.unsqueeze(2)?)?;
        let h = self.block2.forward(&h, mask)?;
        Ok((h + self.res_conv.valid(&x.broadcast_mul(mask)?)?)?)
    }
}

/// Matcha's `BasicTransformerBlock` (diffusers attention): self-attention and an exact-GELU
/// feed-forward, each after a LayerNorm, each residual.
#[derive(Debug)]
struct TransformerBlock {
    norm1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    norm3: LayerNorm,
    ff_in: Linear,
    ff_out: Linear,
    heads: usize,
    head_dim: usize,
}

impl TransformerBlock {
    fn load(w: &mut Weights, prefix: &str, config: &FlowConfig) -> Result<Self> {
        let c = config.decoder_channels;
        let inner = config.decoder_heads * config.decoder_head_dim;
        Ok(Self {
            norm1: w.layer_norm(&format!("{prefix}.norm1"), c, 1e-5)?,
            q: w.linear_no_bias(&format!("{prefix}.attn1.to_q"), inner, c)?,
            k: w.linear_no_bias(&format!("{prefix}.attn1.to_k"), inner, c)?,
            v: w.linear_no_bias(&format!("{prefix}.attn1.to_v"), inner, c)?,
            out: w.linear(&format!("{prefix}.attn1.to_out.0"), c, inner)?,
            norm3: w.layer_norm(&format!("{prefix}.norm3"), c, 1e-5)?,
            ff_in: w.linear(&format!("{prefix}.ff.net.0.proj"), 4 * c, c)?,
            ff_out: w.linear(&format!("{prefix}.ff.net.2"), c, 4 * c)?,
            heads: config.decoder_heads,
            head_dim: config.decoder_head_dim,
        })
    }

    /// `x` `[B, T, C]`; `bias` `[B, 1, T, T]` additive.
    fn forward(&self, x: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (h, d) = (self.heads, self.head_dim);
        let n = self.norm1.forward(x)?;
        let split = |y: Tensor| -> Result<Tensor> {
            Ok(y.reshape((b, t, h, d))?.transpose(1, 2)?.contiguous()?)
        };
        let q = split(self.q.forward(&n)?)?;
        let k = split(self.k.forward(&n)?)?;
        let v = split(self.v.forward(&n)?)?;
        let scores = (q.matmul(&k.transpose(2, 3)?.contiguous()?)? / (d as f64).sqrt())?
            .broadcast_add(bias)?;
        let attention = candle_nn::ops::softmax_last_dim(&scores.contiguous()?)?;
        let merged = attention
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, t, h * d))?;
        let x = (x + self.out.forward(&merged)?)?;
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
struct Estimator {
    time1: Linear,
    time2: Linear,
    down: Stage,
    down_conv: Conv,
    mid: Vec<Stage>,
    up: Stage,
    up_conv: Conv,
    final_block: CausalBlock,
    final_proj: Conv,
    /// Width of the sinusoidal time embedding.
    time_in: usize,
}

impl Estimator {
    fn load(w: &mut Weights, config: &FlowConfig) -> Result<Self> {
        let p = "decoder.estimator";
        let c = config.decoder_channels;
        let time_in = config.estimator_in();
        Ok(Self {
            time1: w.linear(&format!("{p}.time_mlp.linear_1"), 4 * c, time_in)?,
            time2: w.linear(&format!("{p}.time_mlp.linear_2"), 4 * c, 4 * c)?,
            down: Stage::load(w, &format!("{p}.down_blocks.0"), time_in, config)?,
            down_conv: w.conv(&format!("{p}.down_blocks.0.2"), c, c, 3)?,
            mid: (0..config.decoder_mid_blocks)
                .map(|m| Stage::load(w, &format!("{p}.mid_blocks.{m}"), c, config))
                .collect::<Result<_>>()?,
            up: Stage::load(w, &format!("{p}.up_blocks.0"), 2 * c, config)?,
            up_conv: w.conv(&format!("{p}.up_blocks.0.2"), c, c, 3)?,
            final_block: CausalBlock::load(w, &format!("{p}.final_block"), c, c)?,
            final_proj: w.conv(&format!("{p}.final_proj"), config.mel_channels, c, 1)?,
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
    fn forward(&self, h: &Tensor, mask: &Tensor, t: &Tensor, chunk: usize) -> Result<Tensor> {
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
        let mut h = self.down_conv.causal(&h.broadcast_mul(mask)?)?;
        for stage in &self.mid {
            h = stage.forward(&h, mask, &temb, &bias)?;
        }
        let h = Tensor::cat(&[&h, &skip], 1)?;
        let h = self.up.forward(&h, mask, &temb, &bias)?;
        let h = self.up_conv.causal(&h.broadcast_mul(mask)?)?;
        let h = self.final_block.forward(&h, mask)?;
        Ok(self
            .final_proj
            .valid(&h.broadcast_mul(mask)?)?
            .broadcast_mul(mask)?)
    }
}

/// Frames of the reference's fixed noise (`CausalConditionalCFM.rand_noise`, 300 s of mel).
pub const REFERENCE_NOISE_FRAMES: usize = 15000;

/// The reference's fixed flow noise `[1, 80, 15000]`: `torch.randn(1, 80, 15000)` on the CPU
/// after `torch.manual_seed(0)`. Torch fills it from MT19937 (seeded by `init_genrand`) with
/// 24-bit uniforms `d`, turned into normals by Box–Muller over blocks of 16 (`u1 = 1 − d[j]`,
/// `u2 = d[j + 8]` give `d[j]`, `d[j + 8]`); recomputed here in f32, within an ulp or so of
/// torch's vectorised `log`/`sin`/`cos`.
pub fn reference_noise(mel_channels: usize, device: &Device) -> Result<Tensor> {
    let n = mel_channels * REFERENCE_NOISE_FRAMES;
    let mut rng = Mt19937::new(0);
    let mut values: Vec<f32> = (0..n)
        .map(|_| (rng.next_u32() & 0xFF_FFFF) as f32 / (1u32 << 24) as f32)
        .collect();
    let box_muller = |block: &mut [f32]| {
        for j in 0..8 {
            let radius = (-2.0 * (1.0 - block[j]).ln()).sqrt();
            let angle = 2.0 * std::f32::consts::PI * block[j + 8];
            block[j] = radius * angle.cos();
            block[j + 8] = radius * angle.sin();
        }
    };
    for block in values.chunks_exact_mut(16) {
        box_muller(block);
    }
    if !n.is_multiple_of(16) {
        // Torch redraws the last 16 numbers from fresh uniforms.
        let mut tail: Vec<f32> = (0..16)
            .map(|_| (rng.next_u32() & 0xFF_FFFF) as f32 / (1u32 << 24) as f32)
            .collect();
        box_muller(&mut tail);
        values[n - 16..].copy_from_slice(&tail);
    }
    Ok(Tensor::from_vec(
        values,
        (1, mel_channels, REFERENCE_NOISE_FRAMES),
        device,
    )?)
}

/// The Mersenne twister MT19937 (32-bit), as torch's CPU generator runs it.
struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    fn new(seed: u32) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Self { state, index: 624 }
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            for i in 0..624 {
                let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7FFF_FFFF);
                let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    next ^= 0x9908_B0DF;
                }
                self.state[i] = next;
            }
            self.index = 0;
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9D2C_5680;
        y ^= (y << 15) & 0xEFC6_0000;
        y ^ (y >> 18)
    }
}
