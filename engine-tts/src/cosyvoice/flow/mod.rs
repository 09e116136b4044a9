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
//! call; [`reference_noise`] reproduces that tensor, or pass any other); the encoder takes
//! utterances of equal length without a padding mask (the reference's flow asserts a batch of
//! one; the estimator does take a frame mask); dropout is absent (inference only).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Conv1d, Conv1dConfig, LayerNorm, Linear};

use crate::cosyvoice::{read_weights, ConvWeight, CosyVoiceError, Result, Weights};

mod encoder;
mod estimator;
mod noise;

use encoder::Encoder;
use estimator::Estimator;
pub use noise::{reference_noise, REFERENCE_NOISE_FRAMES};

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

impl Weights {
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

    /// A convolution with weight `shape` `[out, in, kernel]` and its bias, run without padding
    /// (through [`causal_conv`] where the model's convolution is causal).
    fn unpadded_conv(&mut self, prefix: &str, shape: [usize; 3]) -> Result<Conv1d> {
        self.conv1d(prefix, shape, ConvWeight::Plain, Conv1dConfig::default())
    }
}

/// `x` `[B, C, T]` → `[B, C', T]` through `conv` (built without padding), each output frame
/// seeing only frames up to its own: the input is padded on the left with `kernel − 1` zeros.
fn causal_conv(conv: &Conv1d, x: &Tensor) -> Result<Tensor> {
    let kernel = conv.weight().dim(D::Minus1)?;
    Ok(conv.forward(&x.pad_with_zeros(D::Minus1, kernel - 1, 0)?)?)
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
        let mut w = Weights::new(tensors, device);
        let (dim, mel) = (config.encoder_dim, config.mel_channels);
        let embedding = w.take("input_embedding.weight", &[config.vocab_size, dim])?;
        let speaker = w.linear("spk_embed_affine_layer", mel, config.speaker_dim)?;
        let encoder = Encoder::load(&mut w, &config)?;
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
        let tensors = read_weights(weights)?;
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
        self.encoder.forward(xs, context, streaming)
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
