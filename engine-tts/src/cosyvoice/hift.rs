//! CosyVoice 2's vocoder (the reference's `HiFTGenerator`, HiFi-GAN with an iSTFT head and a
//! neural source filter): mel frames (80 × T at 50 Hz) → 24 kHz audio (480 samples a frame).
//!
//! * F0 predictor (`ConvRNNF0Predictor`): five weight-normed k3 convolutions with ELU, a
//!   linear layer and `|·|` → f0 per frame.
//! * Source (`SourceModuleHnNSF` + `SineGen2`): f0 held for 480 samples; nine harmonics
//!   whose phase is the cumulated per-frame phase increment, linearly interpolated to the
//!   sample rate; sines of amplitude 0.1 where f0 > 10 Hz plus Gaussian noise (σ 0.003 voiced,
//!   0.1/3 unvoiced), merged by a linear layer and `tanh`.
//! * Decoder: `conv_pre`, three stages of leaky ReLU, transposed convolution (×8, ×5, ×3),
//!   the source's STFT (n_fft 16, hop 4) brought to the stage's rate and passed through a
//!   Snake residual block, added, then the mean of three Snake residual blocks; `conv_post`
//!   gives log-magnitudes and phases of an STFT that the iSTFT turns into audio.
//!
//! What differs from the reference: weight norm is folded into plain weights at load time;
//! the sine generator's Gaussian noise comes from a [`SineNoise`] source (the reference draws
//! it with `torch.randn_like` from torch's global RNG; tests replay the recorded numbers); the
//! sine generator's random initial phase is left out — at 24 kHz it never reaches the output
//! (the ×1/480 resampling reads no sample it touches), and so is the second noise of
//! `SourceModuleHnNSF`, which HiFT does not use. The STFT and iSTFT are direct DFTs
//! accumulated in f64.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Conv1d, Conv1dConfig, ConvTranspose1d, ConvTranspose1dConfig};
use rand::Rng;

use crate::cosyvoice::{read_weights, ConvWeight, CosyVoiceError, Result, Weights};

/// Settings of a [`Hift`]; the defaults are CosyVoice 2's.
#[derive(Clone, Debug, PartialEq)]
pub struct HiftConfig {
    /// Mel channels.
    pub in_channels: usize,
    /// Channels after `conv_pre`; halved by each upsampling stage.
    pub base_channels: usize,
    /// Channels of the F0 predictor's convolutions.
    pub cond_channels: usize,
    /// Harmonics above the fundamental.
    pub nb_harmonics: usize,
    pub sampling_rate: usize,
    pub upsample_rates: Vec<usize>,
    pub upsample_kernel_sizes: Vec<usize>,
    pub n_fft: usize,
    pub hop_len: usize,
    pub resblock_kernel_sizes: Vec<usize>,
    pub resblock_dilations: Vec<usize>,
    pub source_resblock_kernel_sizes: Vec<usize>,
    pub source_resblock_dilations: Vec<usize>,
    pub lrelu_slope: f64,
    pub audio_limit: f64,
    /// Amplitude of the sines.
    pub nsf_alpha: f32,
    /// Standard deviation of the noise on voiced samples.
    pub nsf_sigma: f32,
    /// F0 (Hz) above which a sample is voiced.
    pub nsf_voiced_threshold: f32,
}

impl Default for HiftConfig {
    fn default() -> Self {
        Self {
            in_channels: 80,
            base_channels: 512,
            cond_channels: 512,
            nb_harmonics: 8,
            sampling_rate: 24000,
            upsample_rates: vec![8, 5, 3],
            upsample_kernel_sizes: vec![16, 11, 7],
            n_fft: 16,
            hop_len: 4,
            resblock_kernel_sizes: vec![3, 7, 11],
            resblock_dilations: vec![1, 3, 5],
            source_resblock_kernel_sizes: vec![7, 7, 11],
            source_resblock_dilations: vec![1, 3, 5],
            lrelu_slope: 0.1,
            audio_limit: 0.99,
            nsf_alpha: 0.1,
            nsf_sigma: 0.003,
            nsf_voiced_threshold: 10.0,
        }
    }
}

impl HiftConfig {
    /// Audio samples per mel frame (480).
    pub fn samples_per_frame(&self) -> usize {
        self.upsample_rates.iter().product::<usize>() * self.hop_len
    }

    fn validate(&self) -> Result<()> {
        let stages = self.upsample_rates.len();
        let bad = |what: &str| Err(CosyVoiceError::Config(format!("HiFT: {what}")));
        if stages == 0
            || self.upsample_kernel_sizes.len() != stages
            || self.source_resblock_kernel_sizes.len() != stages
        {
            return bad("one upsampling kernel and one source block kernel per upsampling rate");
        }
        if self.base_channels >> stages == 0 {
            return bad("too few base channels for the upsampling stages");
        }
        if self.n_fft == 0 || !self.n_fft.is_multiple_of(2) || self.hop_len == 0 {
            return bad("n_fft must be even and hop_len positive");
        }
        let odd = |ks: &[usize]| ks.iter().all(|k| !k.is_multiple_of(2));
        if self.resblock_kernel_sizes.is_empty()
            || !odd(&self.resblock_kernel_sizes)
            || !odd(&self.source_resblock_kernel_sizes)
        {
            return bad("residual block kernels must be odd");
        }
        Ok(())
    }
}

/// Standard normal numbers for the sine generator's noise.
pub trait SineNoise {
    /// Numbers from N(0, 1) of `shape` `(batch, samples, harmonics)`, as f32 on `device`.
    fn noise(&mut self, shape: (usize, usize, usize), device: &Device) -> Result<Tensor>;
}

/// Any random number generator, through the Box–Muller transform.
impl<R: Rng> SineNoise for R {
    fn noise(&mut self, shape: (usize, usize, usize), device: &Device) -> Result<Tensor> {
        let (batch, samples, harmonics) = shape;
        let n = batch * samples * harmonics;
        let mut values = Vec::with_capacity(n + 1);
        while values.len() < n {
            let u1: f64 = 1.0 - self.random::<f64>();
            let u2: f64 = self.random::<f64>();
            let r = (-2.0 * u1.ln()).sqrt();
            let angle = 2.0 * std::f64::consts::PI * u2;
            values.push((r * angle.cos()) as f32);
            values.push((r * angle.sin()) as f32);
        }
        values.truncate(n);
        Ok(Tensor::from_vec(values, shape, device)?)
    }
}

impl Weights {
    /// A Snake activation's α, as `[1, channels, 1]`.
    fn alpha(&mut self, name: &str, channels: usize) -> Result<Tensor> {
        Ok(self.take(name, &[channels])?.reshape((1, channels, 1))?)
    }

    /// A weight-normed convolution with weight `shape` `[out, in, kernel]` (kernel odd), spread
    /// by `dilation`, that keeps the length: `dilation · (kernel − 1) / 2` zeros on each side.
    fn same_length_conv(
        &mut self,
        prefix: &str,
        shape: [usize; 3],
        dilation: usize,
    ) -> Result<Conv1d> {
        let config = Conv1dConfig {
            padding: dilation * (shape[2] - 1) / 2,
            dilation,
            ..Default::default()
        };
        self.conv1d(prefix, shape, ConvWeight::WeightNormed, config)
    }
}

/// `x + sin²(α x) / (α + 1e-9)`, α per channel.
fn snake(x: &Tensor, alpha: &Tensor) -> Result<Tensor> {
    let scale = (alpha + 1e-9)?.recip()?;
    Ok((x + x
        .broadcast_mul(alpha)?
        .sin()?
        .sqr()?
        .broadcast_mul(&scale)?)?)
}

/// One Snake step of a residual block: Snake, dilated convolution, Snake, convolution, each
/// convolution keeping the length.
#[derive(Debug)]
struct ResidualUnit {
    alpha1: Tensor,
    conv1: Conv1d,
    alpha2: Tensor,
    conv2: Conv1d,
}

/// The reference's `ResBlock`: residual units of growing dilation, all of one odd kernel.
#[derive(Debug)]
struct ResBlock {
    units: Vec<ResidualUnit>,
}

impl ResBlock {
    fn load(
        w: &mut Weights,
        prefix: &str,
        channels: usize,
        kernel: usize,
        dilations: &[usize],
    ) -> Result<Self> {
        let shape = [channels, channels, kernel];
        let units = dilations
            .iter()
            .enumerate()
            .map(|(i, &dilation)| {
                Ok(ResidualUnit {
                    alpha1: w.alpha(&format!("{prefix}.activations1.{i}.alpha"), channels)?,
                    conv1: w.same_length_conv(&format!("{prefix}.convs1.{i}"), shape, dilation)?,
                    alpha2: w.alpha(&format!("{prefix}.activations2.{i}.alpha"), channels)?,
                    conv2: w.same_length_conv(&format!("{prefix}.convs2.{i}"), shape, 1)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self { units })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for unit in &self.units {
            let h = unit.conv1.forward(&snake(&x, &unit.alpha1)?)?;
            let h = unit.conv2.forward(&snake(&h, &unit.alpha2)?)?;
            x = (x + h)?;
        }
        Ok(x)
    }
}

/// One upsampling stage of the decoder.
#[derive(Debug)]
struct Stage {
    /// Upsamples by the stage's rate.
    up: ConvTranspose1d,
    /// Brings the source's STFT to this stage's rate.
    source_down: Conv1d,
    source_block: ResBlock,
    blocks: Vec<ResBlock>,
}

/// The HiFT vocoder. See the module docs.
#[derive(Debug)]
pub struct Hift {
    f0_convs: Vec<Conv1d>,
    /// `f0_predictor.classifier`: `[1, cond]` and `[1]`.
    f0_weight: Tensor,
    f0_bias: Tensor,
    /// `m_source.l_linear`: merges the harmonics, `[harmonics + 1]` and its bias.
    source_weight: Vec<f32>,
    source_bias: f32,
    conv_pre: Conv1d,
    stages: Vec<Stage>,
    conv_post: Conv1d,
    /// The periodic Hann window of the STFT.
    window: Vec<f64>,
    config: HiftConfig,
    device: Device,
}

impl Hift {
    /// The vocoder from the tensors of `hift.pt` (names as its state dict has them, without
    /// the `generator.` prefix some checkpoints carry).
    pub fn from_tensors(
        tensors: HashMap<String, Tensor>,
        config: HiftConfig,
        device: &Device,
    ) -> Result<Self> {
        config.validate()?;
        let tensors = tensors
            .into_iter()
            .map(|(name, t)| match name.strip_prefix("generator.") {
                Some(rest) => (rest.to_string(), t),
                None => (name, t),
            })
            .collect();
        let mut w = Weights::new(tensors, device);
        let (mel, cond) = (config.in_channels, config.cond_channels);
        let f0_convs = (0..5)
            .map(|i| {
                let inp = if i == 0 { mel } else { cond };
                w.same_length_conv(
                    &format!("f0_predictor.condnet.{}", 2 * i),
                    [cond, inp, 3],
                    1,
                )
            })
            .collect::<Result<_>>()?;
        let f0_weight = w.take("f0_predictor.classifier.weight", &[1, cond])?;
        let f0_bias = w.take("f0_predictor.classifier.bias", &[1])?;
        let harmonics = config.nb_harmonics + 1;
        let source_weight = w
            .take("m_source.l_linear.weight", &[1, harmonics])?
            .flatten_all()?
            .to_vec1()?;
        let source_bias = w.take("m_source.l_linear.bias", &[1])?.to_vec1::<f32>()?[0];
        let base = config.base_channels;
        let conv_pre = w.same_length_conv("conv_pre", [base, mel, 7], 1)?;
        let bins = config.n_fft + 2;
        let rates = &config.upsample_rates;
        let kernels = config.resblock_kernel_sizes.len();
        let stages = (0..rates.len())
            .map(|i| {
                let (inp, out) = (base >> i, base >> (i + 1));
                let (rate, kernel) = (rates[i], config.upsample_kernel_sizes[i]);
                let stride: usize = rates[i + 1..].iter().product();
                let (source_kernel, source_padding) = if stride == 1 {
                    (1, 0)
                } else {
                    (2 * stride, stride / 2)
                };
                Ok(Stage {
                    up: w.weight_normed_conv_transpose1d(
                        &format!("ups.{i}"),
                        [inp, out, kernel],
                        ConvTranspose1dConfig {
                            padding: kernel.saturating_sub(rate) / 2,
                            stride: rate,
                            ..Default::default()
                        },
                    )?,
                    source_down: w.conv1d(
                        &format!("source_downs.{i}"),
                        [out, bins, source_kernel],
                        ConvWeight::Plain,
                        Conv1dConfig {
                            padding: source_padding,
                            stride,
                            ..Default::default()
                        },
                    )?,
                    source_block: ResBlock::load(
                        &mut w,
                        &format!("source_resblocks.{i}"),
                        out,
                        config.source_resblock_kernel_sizes[i],
                        &config.source_resblock_dilations,
                    )?,
                    blocks: (0..kernels)
                        .map(|j| {
                            ResBlock::load(
                                &mut w,
                                &format!("resblocks.{}", kernels * i + j),
                                out,
                                config.resblock_kernel_sizes[j],
                                &config.resblock_dilations,
                            )
                        })
                        .collect::<Result<_>>()?,
                })
            })
            .collect::<Result<_>>()?;
        let conv_post = w.same_length_conv("conv_post", [bins, base >> rates.len(), 7], 1)?;
        let n = config.n_fft;
        let window = (0..n)
            .map(|i| {
                let angle = 2.0 * std::f64::consts::PI * i as f64 / n as f64;
                f64::from((0.5 - 0.5 * angle.cos()) as f32)
            })
            .collect();
        Ok(Self {
            f0_convs,
            f0_weight: f0_weight.to_device(device)?,
            f0_bias: f0_bias.to_device(device)?,
            source_weight,
            source_bias,
            conv_pre,
            stages,
            conv_post,
            window,
            config,
            device: device.clone(),
        })
    }

    /// Loads `hift.pt` (a PyTorch state dict) or its safetensors conversion.
    pub fn load(weights: &Path, config: HiftConfig, device: &Device) -> Result<Self> {
        let tensors = read_weights(weights)?;
        Self::from_tensors(tensors, config, device)
    }

    pub fn config(&self) -> &HiftConfig {
        &self.config
    }

    /// Audio `[batch, 480 T]` and the source signal `[batch, 1, 480 T]` for mel frames
    /// `[batch, 80, T]`. `cache_source` `[batch, 1, n]` (the previous chunk's source, in
    /// streaming) replaces the first `n` samples of the source.
    pub fn inference(
        &self,
        mel: &Tensor,
        cache_source: Option<&Tensor>,
        noise: &mut dyn SineNoise,
    ) -> Result<(Tensor, Tensor)> {
        let f0 = self.f0(mel)?;
        let mut source = self.source(&f0, noise)?;
        if let Some(cache) = cache_source {
            let (batch, samples) = (source.dim(0)?, source.dim(2)?);
            let (cache_batch, one, n) = cache.dims3()?;
            if cache_batch != batch || one != 1 || n > samples {
                return Err(CosyVoiceError::Input(format!(
                    "cache_source {:?} does not fit a source of shape {:?}",
                    cache.dims(),
                    source.dims()
                )));
            }
            let cache = cache.to_dtype(DType::F32)?.to_device(&self.device)?;
            source = Tensor::cat(&[cache, source.narrow(2, n, samples - n)?], 2)?;
        }
        let speech = self.decode(mel, &source)?;
        Ok((speech, source))
    }

    /// F0 (Hz) per frame, `[batch, T]`, for mel frames `[batch, 80, T]`.
    pub fn f0(&self, mel: &Tensor) -> Result<Tensor> {
        let mut h = self.check_mel(mel)?;
        for conv in &self.f0_convs {
            h = conv.forward(&h)?.elu(1.0)?;
        }
        let f0 = h
            .transpose(1, 2)?
            .broadcast_matmul(&self.f0_weight.t()?)?
            .broadcast_add(&self.f0_bias)?
            .squeeze(2)?
            .abs()?;
        Ok(f0)
    }

    fn check_mel(&self, mel: &Tensor) -> Result<Tensor> {
        let (_, channels, frames) = mel.dims3()?;
        if channels != self.config.in_channels || frames == 0 {
            return Err(CosyVoiceError::Input(format!(
                "mel of shape {:?}, expected [batch, {}, frames > 0]",
                mel.dims(),
                self.config.in_channels
            )));
        }
        Ok(mel.to_dtype(DType::F32)?.to_device(&self.device)?)
    }

    /// The neural source filter's excitation `[batch, 1, 480 T]` for f0 `[batch, T]`.
    pub fn source(&self, f0: &Tensor, noise: &mut dyn SineNoise) -> Result<Tensor> {
        let c = &self.config;
        let (batch, frames) = f0.dims2()?;
        let up = c.samples_per_frame();
        let harmonics = c.nb_harmonics + 1;
        let samples = frames * up;
        let f0: Vec<Vec<f32>> = f0.to_dtype(DType::F32)?.to_vec2()?;
        let noise = noise.noise((batch, samples, harmonics), &Device::Cpu)?;
        if noise.dims() != [batch, samples, harmonics] {
            return Err(CosyVoiceError::Input(format!(
                "sine noise of shape {:?}, expected {:?}",
                noise.dims(),
                [batch, samples, harmonics]
            )));
        }
        let noise: Vec<Vec<Vec<f32>>> = noise.to_dtype(DType::F32)?.to_vec3()?;
        let rate = c.sampling_rate as f32;
        let two_pi = 2.0 * std::f32::consts::PI;
        let inverse = 1.0 / up as f32;
        let unvoiced_amplitude = c.nsf_alpha / 3.0;
        let mut out = Vec::with_capacity(batch * samples);
        for (f0, noise) in f0.iter().zip(&noise) {
            // Phase per frame: the cumulated phase increment (in f64, as torch's cumsum),
            // in radians, scaled to the sample rate.
            let mut cumulated = vec![0f64; harmonics];
            let phase: Vec<Vec<f32>> = f0
                .iter()
                .map(|&f| {
                    (0..harmonics)
                        .map(|h| {
                            let r = f * (h + 1) as f32 / rate;
                            cumulated[h] += f64::from(r - r.floor());
                            cumulated[h] as f32 * two_pi * up as f32
                        })
                        .collect()
                })
                .collect();
            for (j, noise) in noise.iter().enumerate() {
                // Linear interpolation (align_corners = false) of the frame phases.
                let position = (inverse * (j as f32 + 0.5) - 0.5).max(0.0);
                let i0 = position as usize;
                let i1 = (i0 + 1).min(frames - 1);
                let (l1, l0) = (position - i0 as f32, 1.0 - (position - i0 as f32));
                let voiced = f0[j / up] > c.nsf_voiced_threshold;
                let amplitude = if voiced {
                    c.nsf_sigma
                } else {
                    unvoiced_amplitude
                };
                let mut merged = self.source_bias;
                for h in 0..harmonics {
                    let angle = phase[i0][h] * l0 + phase[i1][h] * l1;
                    let sine = if voiced {
                        angle.sin() * c.nsf_alpha
                    } else {
                        0.0
                    };
                    merged += (sine + amplitude * noise[h]) * self.source_weight[h];
                }
                out.push(merged.tanh());
            }
        }
        Ok(Tensor::from_vec(out, (batch, 1, samples), &self.device)?)
    }

    /// Audio `[batch, 480 T]` from mel frames `[batch, 80, T]` and the source
    /// `[batch, 1, 480 T]` (the reference's `decode`).
    pub fn decode(&self, mel: &Tensor, source: &Tensor) -> Result<Tensor> {
        let mel = self.check_mel(mel)?;
        let samples = mel.dim(2)? * self.config.samples_per_frame();
        let (batch, one, n) = source.dims3()?;
        if batch != mel.dim(0)? || one != 1 || n != samples {
            return Err(CosyVoiceError::Input(format!(
                "source of shape {:?}, expected [{}, 1, {samples}]",
                source.dims(),
                mel.dim(0)?
            )));
        }
        let spectrum = self.stft(source)?;
        let mut x = self.conv_pre.forward(&mel)?;
        let last = self.stages.len() - 1;
        for (i, stage) in self.stages.iter().enumerate() {
            x = candle_nn::ops::leaky_relu(&x, self.config.lrelu_slope)?;
            x = stage.up.forward(&x)?;
            if i == last {
                // Reflection padding of one sample on the left.
                x = Tensor::cat(&[x.narrow(2, 1, 1)?, x], 2)?;
            }
            let s = stage.source_down.forward(&spectrum)?;
            x = (x + stage.source_block.forward(&s)?)?;
            let mut sum = stage.blocks[0].forward(&x)?;
            for block in &stage.blocks[1..] {
                sum = (sum + block.forward(&x)?)?;
            }
            x = (sum / stage.blocks.len() as f64)?;
        }
        let x = candle_nn::ops::leaky_relu(&x, 0.01)?;
        let x = self.conv_post.forward(&x)?;
        let bins = self.config.n_fft / 2 + 1;
        let magnitude = x.narrow(1, 0, bins)?.exp()?.minimum(100f32)?;
        let phase = x.narrow(1, bins, bins)?.sin()?;
        let real = (&magnitude * phase.cos()?)?;
        let imaginary = (&magnitude * phase.sin()?)?;
        let limit = self.config.audio_limit;
        Ok(self.istft(&real, &imaginary)?.clamp(-limit, limit)?)
    }

    /// `torch.stft(center = True, pad_mode = 'reflect', onesided)` of `[batch, 1, N]` with the
    /// Hann window: real and imaginary parts stacked, `[batch, n_fft + 2, N / hop + 1]`.
    fn stft(&self, signal: &Tensor) -> Result<Tensor> {
        let (n_fft, hop) = (self.config.n_fft, self.config.hop_len);
        let half = n_fft / 2;
        let bins = half + 1;
        let signals: Vec<Vec<f32>> = signal.squeeze(1)?.to_dtype(DType::F32)?.to_vec2()?;
        let batch = signals.len();
        let length = signals[0].len();
        if length <= half {
            return Err(CosyVoiceError::Input(format!(
                "a source of {length} samples is too short for the STFT's reflection padding"
            )));
        }
        let frames = length / hop + 1;
        let (cos, sin) = self.dft_table();
        let mut out = vec![0f32; batch * 2 * bins * frames];
        for (b, s) in signals.iter().enumerate() {
            // Index into the signal reflected `half` samples at both ends.
            let at = |p: usize| -> f64 {
                let i = p as isize - half as isize;
                let i = if i < 0 {
                    -i
                } else if i >= length as isize {
                    2 * (length as isize - 1) - i
                } else {
                    i
                };
                f64::from(s[i as usize])
            };
            for f in 0..frames {
                let frame: Vec<f64> = (0..n_fft)
                    .map(|n| at(f * hop + n) * self.window[n])
                    .collect();
                for k in 0..bins {
                    let (mut re, mut im) = (0f64, 0f64);
                    for (n, v) in frame.iter().enumerate() {
                        re += v * cos[k * n_fft + n];
                        im -= v * sin[k * n_fft + n];
                    }
                    out[(b * 2 * bins + k) * frames + f] = re as f32;
                    out[(b * 2 * bins + bins + k) * frames + f] = im as f32;
                }
            }
        }
        Ok(Tensor::from_vec(
            out,
            (batch, 2 * bins, frames),
            &self.device,
        )?)
    }

    /// `torch.istft(center = True)` with the Hann window of `[batch, n_fft / 2 + 1, F]` real
    /// and imaginary parts: `[batch, hop (F − 1)]`. As an inverse real FFT, it ignores the
    /// imaginary parts of the DC and Nyquist bins.
    fn istft(&self, real: &Tensor, imaginary: &Tensor) -> Result<Tensor> {
        let (n_fft, hop) = (self.config.n_fft, self.config.hop_len);
        let half = n_fft / 2;
        let real: Vec<Vec<Vec<f32>>> = real.to_vec3()?;
        let imaginary: Vec<Vec<Vec<f32>>> = imaginary.to_vec3()?;
        let batch = real.len();
        let frames = real[0][0].len();
        let length = hop * (frames - 1);
        let total = length + n_fft;
        let (cos, sin) = self.dft_table();
        let mut envelope = vec![0f64; total];
        for f in 0..frames {
            for (n, w) in self.window.iter().enumerate() {
                envelope[f * hop + n] += w * w;
            }
        }
        let mut out = Vec::with_capacity(batch * length);
        for (re, im) in real.iter().zip(&imaginary) {
            let mut y = vec![0f64; total];
            for f in 0..frames {
                for (n, w) in self.window.iter().enumerate() {
                    let mut v = 0f64;
                    for k in 0..=half {
                        let weight = if k == 0 || k == half { 1.0 } else { 2.0 };
                        v += weight
                            * (f64::from(re[k][f]) * cos[k * n_fft + n]
                                - f64::from(im[k][f]) * sin[k * n_fft + n]);
                    }
                    y[f * hop + n] += v / n_fft as f64 * w;
                }
            }
            out.extend((half..half + length).map(|i| (y[i] / envelope[i]) as f32));
        }
        Ok(Tensor::from_vec(out, (batch, length), &self.device)?)
    }

    /// `cos` and `sin` of `2π k n / n_fft`, indexed `k · n_fft + n`, for `k ≤ n_fft / 2`.
    fn dft_table(&self) -> (Vec<f64>, Vec<f64>) {
        let n_fft = self.config.n_fft;
        let angles = (0..=n_fft / 2).flat_map(|k| {
            (0..n_fft).map(move |n| 2.0 * std::f64::consts::PI * (k * n) as f64 / n_fft as f64)
        });
        angles.map(|a| (a.cos(), a.sin())).unzip()
    }
}
