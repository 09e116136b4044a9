//! Self-speculative drafts of Speech Speculative Decoding (SSD, Lin et al., §3.2) for any
//! Qwen2/Llama model: the draft is the target's own lower and upper layers (the paper: the
//! lower 2 and upper 6 of 24), sharing the embeddings, the upper layers and the final norm;
//! only its lower layers and its output ("classification") head are retrained, with
//! cross-entropy on the target's outputs (`spec_train::ssd::train`, on a [`Backbone`] and
//! [`DistilledSequence`]s). Drafts are verified by
//! `spec_core`'s speculative sampling with a tolerance β (eq. 5, r < min(1, q/p) + β;
//! [`spec_core::AcceptanceRule::speculative_sampling`]): β = 0 samples exactly from the target.
//!
//! What differs from the paper: the retrained head scores a shortlist of the vocabulary (the
//! ids below 8192, which byte-pair encoders give their most frequent merges, and every token
//! of the training labels), not all of it. A 151 936-row output layer would cost the draft as
//! much as several of its layers on a CPU; the draft simply never proposes the other tokens,
//! and the target's residual distribution q − p still covers them, so sampling stays exact.
//!
//! A draft is stored as `draft.safetensors` (the lower layers under Hugging Face names,
//! `head.weight`, `shortlist`) beside `draft.json` ([`SsdDraftInfo`]), and refused for any
//! model but the one it was trained for.

mod distill;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use spec_core::Decoder;
use spec_nn::heads::TrainedFor;
use spec_nn::{InMemoryWeights, Requantize, ShortlistOutput, WeightLoader};

use crate::load::{load_layer, Naming};
use crate::{Error, Result, Transformer};

pub use distill::{top_labels, Backbone, DistilledSequence, RowsOf};

/// File names inside a draft folder.
pub const DRAFT_WEIGHTS: &str = "draft.safetensors";
pub const DRAFT_INFO: &str = "draft.json";

/// What `draft.json` records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SsdDraftInfo {
    /// Retrained lower layers (the target's first ones at the start of training).
    pub lower_layers: usize,
    /// The target's last layers the draft runs after them, unchanged.
    pub upper_layers: usize,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub shortlist_size: usize,
    #[serde(flatten)]
    pub trained_for: TrainedFor,
    /// On the validation positions: how often the draft's top token is the target's, before
    /// and after training.
    pub untrained_agreement: f32,
    pub validation_agreement: f32,
}

/// A draft's trained weights, f32.
#[derive(Clone, Debug)]
pub struct SsdDraftWeights {
    pub info: SsdDraftInfo,
    /// The lower layers, `model.layers.{i}.…` for i < `info.lower_layers`.
    pub layers: HashMap<String, Tensor>,
    /// `[shortlist, hidden]`: the output layer's row of each shortlisted token.
    pub head: Tensor,
    /// `[shortlist]`, for output layers with a bias (a speech LM's decoder).
    pub head_bias: Option<Tensor>,
    pub shortlist: Vec<u32>,
}

impl SsdDraftWeights {
    /// Reads `dir/draft.json` and `dir/draft.safetensors`; fails unless the draft was trained
    /// for the model whose weights file has `fingerprint`.
    pub fn load(dir: &Path, fingerprint: &str) -> Result<Self> {
        let info_path = dir.join(DRAFT_INFO);
        let text = std::fs::read_to_string(&info_path).map_err(|source| Error::Io {
            path: info_path.clone(),
            source,
        })?;
        let info: SsdDraftInfo = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", info_path.display())))?;
        info.trained_for.check(
            fingerprint,
            &format!("the SSD draft in {}", dir.display()),
            "train one for this model (`cargo xtask train-ssd-draft MODEL`)",
        )?;
        let weights_path = dir.join(DRAFT_WEIGHTS);
        let mut tensors =
            candle_core::safetensors::load(&weights_path, &Device::Cpu).map_err(|e| {
                spec_nn::Error::BadWeights {
                    path: weights_path.clone(),
                    reason: e.to_string(),
                }
            })?;
        let mut take = |name: &str| {
            tensors.remove(name).ok_or_else(|| {
                Error::Config(format!("{} has no tensor `{name}`", weights_path.display()))
            })
        };
        let head = take("head.weight")?;
        let shortlist: Vec<u32> = take("shortlist")?.to_vec1()?;
        let head_bias = tensors.remove("head.bias");
        if head.dims() != [info.shortlist_size, info.hidden_size]
            || shortlist.len() != info.shortlist_size
            || head_bias
                .as_ref()
                .is_some_and(|b| b.dims() != [info.shortlist_size])
        {
            return Err(Error::Config(format!(
                "{}: a head of shape {:?} and {} shortlisted tokens, but {DRAFT_INFO} says {} \
                 tokens of width {}",
                weights_path.display(),
                head.dims(),
                shortlist.len(),
                info.shortlist_size,
                info.hidden_size
            )));
        }
        Ok(Self {
            info,
            layers: tensors,
            head,
            head_bias,
            shortlist,
        })
    }

    /// Writes `draft.safetensors` and `draft.json` into `dir` (created if needed).
    pub fn save(&self, dir: &Path) -> Result<PathBuf> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut tensors = self.layers.clone();
        tensors.insert("head.weight".into(), self.head.clone());
        if let Some(bias) = &self.head_bias {
            tensors.insert("head.bias".into(), bias.clone());
        }
        tensors.insert(
            "shortlist".into(),
            Tensor::from_slice(&self.shortlist, self.shortlist.len(), &Device::Cpu)?,
        );
        let weights_path = dir.join(DRAFT_WEIGHTS);
        candle_core::safetensors::save(&tensors, &weights_path)?;
        let json =
            serde_json::to_string_pretty(&self.info).map_err(|e| Error::Config(e.to_string()))?;
        let info_path = dir.join(DRAFT_INFO);
        std::fs::write(&info_path, json + "\n").map_err(io(&info_path))?;
        Ok(dir.to_path_buf())
    }
}

/// Where a model's trained SSD draft lives in the models folder `root`: `root/ssd/MODEL`.
pub fn draft_dir(root: &Path, model: &str) -> PathBuf {
    root.join("ssd").join(model)
}

/// The layers an SSD draft of a model with `num_layers` layers starts from: the lower `lower`
/// and the upper `upper`.
pub fn draft_layers(num_layers: usize, lower: usize, upper: usize) -> Result<Vec<usize>> {
    if lower == 0
        || lower
            .checked_add(upper)
            .is_none_or(|both| both > num_layers)
    {
        return Err(Error::Config(format!(
            "an SSD draft of the lower {lower} and upper {upper} layers of a model with \
             {num_layers} (it needs at least one lower layer, and no more than the model has)"
        )));
    }
    Ok((0..lower).chain(num_layers - upper..num_layers).collect())
}

impl Transformer {
    /// The SSD draft of this model: `weights`' retrained lower layers, this model's upper
    /// layers (shared), and the retrained head over its shortlist. Its matrices are quantized
    /// as the model's loader would quantize dense weights (Q8_0 by default).
    pub fn ssd_draft(&self, weights: &SsdDraftWeights) -> Result<Transformer> {
        let info = &weights.info;
        let config = self.config();
        if info.vocab_size != config.vocab_size {
            return Err(Error::Config(format!(
                "an SSD draft over {} output classes for a model of {} tokens",
                info.vocab_size, config.vocab_size
            )));
        }
        let layers = self.ssd_draft_layers(weights)?;
        let mut loader = WeightLoader::new(
            InMemoryWeights::dense(HashMap::from([(
                "head.weight".to_string(),
                weights.head.clone(),
            )])),
            self.device(),
            Requantize::default(),
        );
        let head = loader.matrix("head.weight", [weights.shortlist.len(), info.hidden_size])?;
        let shortlist = ShortlistOutput::new(
            head,
            weights.head_bias.clone(),
            weights.shortlist.clone(),
            config.vocab_size,
        )?;
        self.with_parts(layers, Some(shortlist))
    }

    /// The backbone of an SSD draft without its head: `weights`' retrained lower layers and
    /// this model's upper layers, scoring with this model's output layer (for models whose
    /// own output layer sits outside the transformer, like a speech LM's decoder).
    pub fn ssd_draft_backbone(&self, weights: &SsdDraftWeights) -> Result<Transformer> {
        let layers = self.ssd_draft_layers(weights)?;
        self.with_parts(layers, None)
    }

    fn ssd_draft_layers(
        &self,
        weights: &SsdDraftWeights,
    ) -> Result<Vec<crate::transformer::Layer>> {
        let info = &weights.info;
        let config = self.config();
        if info.hidden_size != config.hidden_size {
            return Err(Error::Config(format!(
                "an SSD draft of hidden size {} for a model of hidden size {}",
                info.hidden_size, config.hidden_size
            )));
        }
        let layer_ids = draft_layers(config.num_layers, info.lower_layers, info.upper_layers)?;
        let mut loader = WeightLoader::new(
            InMemoryWeights::dense(weights.layers.clone()),
            self.device(),
            Requantize::default(),
        );
        let mut layers = (0..info.lower_layers)
            .map(|i| load_layer(&mut loader, config, Naming::HuggingFace, i))
            .collect::<Result<Vec<_>>>()?;
        layers.extend(
            layer_ids[info.lower_layers..]
                .iter()
                .map(|&i| self.layer(i).clone()),
        );
        Ok(layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_layers_are_the_lower_and_upper_ones_and_refuse_what_does_not_fit() {
        assert_eq!(draft_layers(6, 2, 1).unwrap(), [0, 1, 5]);
        assert_eq!(draft_layers(6, 6, 0).unwrap(), [0, 1, 2, 3, 4, 5]);
        // The last two would wrap around in unchecked arithmetic (2 + usize::MAX = 1).
        for (lower, upper) in [(0, 2), (4, 3), (2, usize::MAX), (usize::MAX, 2)] {
            assert!(
                matches!(draft_layers(6, lower, upper), Err(Error::Config(_))),
                "lower {lower}, upper {upper}"
            );
        }
    }
}
