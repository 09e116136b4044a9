//! CosyVoice 2 (Du et al., 2024): a speech-token language model on a Qwen2.5-0.5B backbone
//! ([`lm`]), the flow-matching decoder from speech tokens to mel frames ([`flow`]) and the HiFT
//! vocoder ([`hift`]), joined into a synthesizer by [`pipeline`] ([`CosyVoice2`],
//! [`CosyVoiceSynthesizer`]). Each part is proven by parity with the reference PyTorch code on tiny
//! random configurations (`engine-tts/reference/make_cosyvoice2_fixtures.py`, fixtures in
//! `tests/data/cosyvoice2`).

pub mod flow;
pub mod hift;
pub mod lm;
pub mod pipeline;

pub use pipeline::{CosyVoice2, CosyVoiceSynthesizer, SpeakerPrompt, Speech};

use std::path::PathBuf;

use candle_core::Tensor;
use candle_nn::{Conv1d, Conv1dConfig, ConvTranspose1d, ConvTranspose1dConfig};

/// What can go wrong building or running CosyVoice 2.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CosyVoiceError {
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// The Qwen2 backbone (`engine-llm`): its configuration, weights or a forward.
    #[error(transparent)]
    Backbone(#[from] engine_llm::Error),

    /// A decoding step of the backbone (`spec-core`).
    #[error(transparent)]
    Core(spec_core::Error),

    /// The shared building blocks (`spec-nn`) reading the weights.
    #[error(transparent)]
    Layers(spec_nn::Error),

    /// A weight the model needs is missing or has the wrong shape.
    #[error("{name}: {reason}")]
    Weights { name: String, reason: String },

    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },

    /// Input the model cannot take: empty text, a token outside its vocabulary.
    #[error("invalid input: {0}")]
    Input(String),

    /// The model drew a token that the decoding cannot continue from (the reference raises
    /// there too).
    #[error("{0}")]
    Generation(String),

    /// A setting out of range.
    #[error("invalid setting: {0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, CosyVoiceError>;

impl From<spec_core::Error> for CosyVoiceError {
    /// Unwraps an error of this crate that travelled through a `spec-core` loop.
    fn from(e: spec_core::Error) -> Self {
        e.into_model_error().unwrap_or_else(CosyVoiceError::Core)
    }
}

impl From<CosyVoiceError> for spec_core::Error {
    fn from(e: CosyVoiceError) -> Self {
        match e {
            CosyVoiceError::Candle(c) => spec_core::Error::Candle(c),
            CosyVoiceError::Core(c) => c,
            other => spec_core::Error::Model(Box::new(other)),
        }
    }
}

/// The tensors of a released checkpoint (`llm.pt`, `flow.pt`, `hift.pt`: PyTorch state dicts,
/// read by candle's pickle reader) or of its safetensors conversion (by extension), on the CPU.
pub fn read_weights(path: &std::path::Path) -> Result<std::collections::HashMap<String, Tensor>> {
    let bad = |reason: String| CosyVoiceError::File {
        path: path.to_path_buf(),
        reason,
    };
    if path.extension().is_some_and(|e| e == "safetensors") {
        candle_core::safetensors::load(path, &candle_core::Device::Cpu)
            .map_err(|e| bad(e.to_string()))
    } else {
        Ok(candle_core::pickle::read_all(path)
            .map_err(|e| bad(e.to_string()))?
            .into_iter()
            .collect())
    }
}

/// A checkpoint's tensors, taken by name with their shapes checked (`spec-nn`'s loader), each
/// in f32 on the model's device. The convolutions of the flow and of HiFT are taken here; the
/// modules add their own ways of taking other layers.
pub(crate) struct Weights(spec_nn::WeightLoader<spec_nn::InMemoryWeights>);

impl Weights {
    pub(crate) fn new(
        tensors: std::collections::HashMap<String, Tensor>,
        device: &candle_core::Device,
    ) -> Self {
        Self(spec_nn::WeightLoader::new(
            spec_nn::InMemoryWeights::dense(tensors),
            device,
            spec_nn::Requantize::Keep,
        ))
    }

    /// Whether `name` is stored (and not yet taken).
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }

    /// Takes `name`, which must have `shape`.
    pub(crate) fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.0.dense(name, shape).map_err(|e| match e {
            spec_nn::Error::MissingTensor { name, .. } => CosyVoiceError::Weights {
                name,
                reason: "missing".into(),
            },
            spec_nn::Error::ShapeMismatch {
                name,
                got,
                expected,
            } => CosyVoiceError::Weights {
                name,
                reason: format!("shape {got:?}, expected {expected:?}"),
            },
            other => CosyVoiceError::Layers(other),
        })
    }

    /// A 1-d convolution with its bias `{prefix}.bias`, run with `config`: the weight, of
    /// `shape` `[out, in, kernel]`, stored as `stored` says.
    pub(crate) fn conv1d(
        &mut self,
        prefix: &str,
        shape: [usize; 3],
        stored: ConvWeight,
        config: Conv1dConfig,
    ) -> Result<Conv1d> {
        let weight = match stored {
            ConvWeight::Plain => self.take(&format!("{prefix}.weight"), &shape)?,
            ConvWeight::WeightNormed => self.weight_normed(prefix, &shape)?,
        };
        Ok(Conv1d::new(
            weight,
            Some(self.bias(prefix, shape[0])?),
            config,
        ))
    }

    /// A transposed 1-d convolution with a weight-normed weight of `shape` `[in, out, kernel]`
    /// and its bias `{prefix}.bias`, run with `config`.
    pub(crate) fn weight_normed_conv_transpose1d(
        &mut self,
        prefix: &str,
        shape: [usize; 3],
        config: ConvTranspose1dConfig,
    ) -> Result<ConvTranspose1d> {
        let weight = self.weight_normed(prefix, &shape)?;
        let bias = self.bias(prefix, shape[1])?;
        Ok(ConvTranspose1d::new(weight, Some(bias), config))
    }

    /// A weight-normed weight `g · v / ‖v‖` (norm over all dimensions but the first), stored
    /// as `parametrizations.weight.original0/1` (torch ≥ 2.1) or `weight_g` / `weight_v`.
    fn weight_normed(&mut self, prefix: &str, shape: &[usize]) -> Result<Tensor> {
        let (g_name, v_name) = if self.contains(&format!("{prefix}.weight_g")) {
            (format!("{prefix}.weight_g"), format!("{prefix}.weight_v"))
        } else {
            (
                format!("{prefix}.parametrizations.weight.original0"),
                format!("{prefix}.parametrizations.weight.original1"),
            )
        };
        let g = self.take(&g_name, &[shape[0], 1, 1])?;
        let v = self.take(&v_name, shape)?;
        let norm = v.sqr()?.sum_keepdim(2)?.sum_keepdim(1)?.sqrt()?;
        Ok(v.broadcast_mul(&g.broadcast_div(&norm)?)?)
    }

    /// A layer's bias `{prefix}.bias`, `[channels]`.
    fn bias(&mut self, prefix: &str, channels: usize) -> Result<Tensor> {
        self.take(&format!("{prefix}.bias"), &[channels])
    }
}

/// How a checkpoint stores a convolution's weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConvWeight {
    /// As it is, under `{prefix}.weight`.
    Plain,
    /// Weight-normed, as a magnitude and a direction ([`Weights::weight_normed`]), folded into
    /// one weight at load time.
    WeightNormed,
}
