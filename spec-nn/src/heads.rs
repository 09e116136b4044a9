//! Multi-token prediction heads ("Faster Speech-LLaMA Inference with Multi-token Prediction",
//! §III, Fig. 2) and their files. Their training is the `spec-train` crate's
//! (`spec_train::heads::train`).
//!
//! Both kinds of the paper read the model's last hidden state `h` (after its final norm):
//! - [`HeadKind::Projection`]: head k has its own output matrix, `logits_k = W_k h` (Fig. 2a);
//! - [`HeadKind::Latent`] ("latent-space expansion"): head k is a `d × d` transform followed by
//!   the model's own unembedding, `logits_k = U (h + SiLU(A_k h + b_k))` with the optional
//!   activation and residual (Fig. 2b): `d²` parameters per head instead of `d·|V|`.
//!
//! A third kind goes beyond the paper: [`HeadKind::Chained`] latent heads, each of which also
//! reads the token guessed just before its own and the state the head before it left (as
//! Hydra's sequentially dependent heads and EAGLE do), `z_0 = h`,
//! `z_{k+1} = z_k + SiLU(A_k [z_k; e(x_{t+k+1})] + b_k)`, `logits_k = U z_{k+1}`, where `e(x)`
//! is the token's row of the unembedding scaled to a root mean square of 1. The paper's heads
//! must guess token t+2 without knowing token t+1, which the target itself has just chosen
//! (eq. 8's conditional independence); a chained head 0 reads it. `2d²` parameters per head.
//!
//! What differs from the paper: the heads score a shortlist of the vocabulary (the lowest
//! token ids, which byte-pair encoders give their most frequent merges, plus every token of the
//! training data), not all of it. On a CPU the output layer of a small model is compute-bound,
//! and scoring Whisper's 51 864 tokens for four heads would cost two decoder steps; the heads
//! only guess, the target's verification still scores every token.
//!
//! Heads are stored as `heads.safetensors` (`head.{k}.weight`, `head.{k}.bias`, `shortlist`) beside
//! `heads.json` ([`HeadsInfo`]: kind, count, sizes, the base model and a fingerprint of its
//! weights file), and refused for any other model. `spec_train::heads::train` fits them on cached
//! hidden states with the trunk frozen (eq. 11).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Module, Tensor, D};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use spec_core::heads::{check_head_range, HiddenStates, TokenHeads};
use spec_core::Logits;

use crate::linear::{Linear, QLinear};
use crate::{Error, Result};

/// File names inside a heads folder.
pub const HEADS_WEIGHTS: &str = "heads.safetensors";
pub const HEADS_INFO: &str = "heads.json";

/// The two head architectures of the paper.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum HeadKind {
    /// Its own `[vocab, hidden]` output matrix per head.
    Projection,
    /// A `[hidden, hidden]` transform per head (with SiLU and a residual connection when set),
    /// then the model's unembedding.
    Latent { activation: bool, residual: bool },
    /// A `[hidden, 2 · hidden]` transform per head over the previous head's state and the
    /// unembedding row of the token guessed before this head's, with SiLU and a residual
    /// connection, then the model's unembedding (see the module's documentation).
    Chained,
}

impl HeadKind {
    /// Latent heads with SiLU and residual (Medusa's block), the default.
    pub fn latent() -> Self {
        Self::Latent {
            activation: true,
            residual: true,
        }
    }
}

/// What `heads.json` records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeadsInfo {
    #[serde(flatten)]
    pub kind: HeadKind,
    pub count: usize,
    pub hidden_size: usize,
    pub vocab_size: usize,
    /// Tokens the heads score.
    pub shortlist_size: usize,
    #[serde(flatten)]
    pub trained_for: TrainedFor,
    /// Top-1 accuracy of each head on the validation split when they were saved.
    pub validation_accuracy: Vec<f32>,
}

/// The model something was trained for (heads, a draft): recorded beside it, checked when it
/// is loaded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainedFor {
    /// The model (a folder name of the model store).
    pub base_model: String,
    /// [`weights_fingerprint`] of that model's weights file.
    pub base_fingerprint: String,
    /// The command that trained it, to reproduce it.
    pub command: String,
}

impl HeadsInfo {
    /// Fails unless heads of this shape read `model`'s hidden states and predict its
    /// vocabulary.
    pub fn check_fits(&self, model: &dyn HiddenStates) -> Result<()> {
        if self.hidden_size != model.hidden_size() || self.vocab_size != model.vocab_size() {
            return Err(Error::Config(format!(
                "heads for hidden states {} wide and {} tokens, the model has {} and {}",
                self.hidden_size,
                self.vocab_size,
                model.hidden_size(),
                model.vocab_size()
            )));
        }
        Ok(())
    }
}

impl TrainedFor {
    /// Fails with [`Error::Config`] unless `fingerprint` is the base model's; `what` names the
    /// trained thing ("the heads in DIR") and `remedy` says how to get one for this model.
    pub fn check(&self, fingerprint: &str, what: &str, remedy: &str) -> Result<()> {
        if self.base_fingerprint == fingerprint {
            return Ok(());
        }
        Err(Error::Config(format!(
            "{what}: trained for `{}` (weights fingerprint {}), not for this model \
             (fingerprint {}); {remedy}",
            self.base_model,
            short(&self.base_fingerprint),
            short(fingerprint),
        )))
    }
}

/// The command that trains the heads of folder `MODEL-<variant>`: for a `KIND-COUNT` variant, as
/// the training programs name their output, exactly that; for any other name, the options to
/// choose and an `--out` into that folder.
pub fn training_command(model: &str, variant: &str) -> String {
    match variant.rsplit_once('-').filter(|(kind, count)| {
        ["latent", "projection", "chained"].contains(kind) && count.parse::<usize>().is_ok()
    }) {
        Some((kind, count)) => {
            format!("cargo xtask train-heads {model} --heads {count} --kind {kind}")
        }
        None => format!(
            "cargo xtask train-heads {model} --heads COUNT --kind latent|projection|chained \
             --variant {variant}"
        ),
    }
}

/// A cheap checksum of a weights file: SHA-256 over its length and 16 evenly spaced 64 KiB
/// samples (hashing a 1.5 GB model whole on every load would take seconds). Tells models
/// apart; it does not prove a file intact (the model store's full checksums do that).
pub fn weights_fingerprint(path: &Path) -> Result<String> {
    const SAMPLES: u64 = 16;
    const SAMPLE: u64 = 64 * 1024;
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut hasher = Sha256::new();
    hasher.update(len.to_le_bytes());
    let mut buffer = vec![0u8; SAMPLE as usize];
    for i in 0..SAMPLES {
        let start = len.saturating_sub(SAMPLE) * i / (SAMPLES - 1);
        file.seek(SeekFrom::Start(start)).map_err(io)?;
        let n = (len - start).min(SAMPLE) as usize;
        file.read_exact(&mut buffer[..n]).map_err(io)?;
        hasher.update(&buffer[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The heads at inference, their matrices quantized to Q8_0 for the kernels.
#[derive(Debug, Clone)]
enum Layers {
    /// One output layer over the shortlist per head.
    Projection(Vec<Linear>),
    /// Latent and chained heads: each head's transform (`[hidden, hidden]`, a chained head's
    /// `[hidden, 2 · hidden]`), and the model's unembedding rows of the shortlist (one pass
    /// for the rows of all the heads asked for; a chained head also reads its token's row
    /// there).
    Latent {
        transforms: Vec<Linear>,
        output: Linear,
    },
}

/// Trained heads, ready to draft ([`TokenHeads`]).
#[derive(Debug, Clone)]
pub struct MultiTokenHeads {
    info: HeadsInfo,
    layers: Layers,
    /// The token of each shortlist column.
    shortlist: Vec<u32>,
}

impl MultiTokenHeads {
    /// Reads `dir/heads.json` and `dir/heads.safetensors` for `model`, whose weights file has
    /// the fingerprint `fingerprint` ([`weights_fingerprint`]); fails unless they were trained
    /// for it. Latent heads take the model's unembedding rows of their shortlist. The matrices
    /// are quantized to Q8_0 for the kernels.
    pub fn load(
        dir: &Path,
        model: &dyn HiddenStates,
        fingerprint: &str,
        device: &Device,
    ) -> Result<Self> {
        let info_path = dir.join(HEADS_INFO);
        let text = std::fs::read_to_string(&info_path).map_err(|source| Error::Io {
            path: info_path.clone(),
            source,
        })?;
        let info: HeadsInfo = serde_json::from_str(&text).map_err(|e| Error::BadWeights {
            path: info_path.clone(),
            reason: e.to_string(),
        })?;
        info.trained_for.check(
            fingerprint,
            &format!("the heads in {}", dir.display()),
            "train heads on this model's hidden states (`spec_train::heads::train`)",
        )?;
        let weights_path = dir.join(HEADS_WEIGHTS);
        let tensors = candle_core::safetensors::load(&weights_path, device).map_err(|e| {
            Error::BadWeights {
                path: weights_path.clone(),
                reason: e.to_string(),
            }
        })?;
        info.check_fits(model)?;
        let shortlist = tensors
            .get("shortlist")
            .ok_or_else(|| Error::MissingTensor {
                path: weights_path.clone(),
                name: "shortlist".into(),
            })?
            .to_vec1::<u32>()?;
        // Sorted, so a token's row is found by binary search.
        if shortlist.len() != info.shortlist_size
            || shortlist.iter().any(|&t| t as usize >= info.vocab_size)
            || shortlist.windows(2).any(|pair| pair[0] >= pair[1])
        {
            return Err(Error::BadWeights {
                path: weights_path.clone(),
                reason: format!(
                    "a shortlist of {} distinct tokens within {}, in increasing order, expected",
                    info.shortlist_size, info.vocab_size
                ),
            });
        }
        let mut weights = Vec::with_capacity(info.count);
        let mut biases = Vec::with_capacity(info.count);
        for k in 0..info.count {
            let get = |part: &str| -> Result<Tensor> {
                let name = format!("head.{k}.{part}");
                let t = tensors.get(&name).ok_or_else(|| Error::MissingTensor {
                    path: weights_path.clone(),
                    name: name.clone(),
                })?;
                let (rows, columns) = match info.kind {
                    HeadKind::Projection => (info.shortlist_size, info.hidden_size),
                    HeadKind::Latent { .. } => (info.hidden_size, info.hidden_size),
                    HeadKind::Chained => (info.hidden_size, 2 * info.hidden_size),
                };
                let expected = if part == "weight" {
                    vec![rows, columns]
                } else {
                    vec![rows]
                };
                if t.dims() != expected {
                    return Err(Error::ShapeMismatch {
                        name,
                        got: t.dims().to_vec(),
                        expected,
                    });
                }
                Ok(t.to_dtype(DType::F32)?)
            };
            weights.push(get("weight")?);
            biases.push(get("bias")?);
        }
        // Q8_0 blocks are 32 wide; a narrower hidden state (a test model) stays f32.
        let dtype = if info.hidden_size.is_multiple_of(32) {
            GgmlDType::Q8_0
        } else {
            GgmlDType::F32
        };
        let layer = |weight: &Tensor, bias: Option<Tensor>| -> Result<Linear> {
            let q = QTensor::quantize(weight, dtype)?;
            Ok(Linear::new(
                QLinear::new(std::sync::Arc::new(q), device)?,
                bias,
            ))
        };
        let per_head: Vec<Linear> = weights
            .iter()
            .zip(biases)
            .map(|(w, b)| layer(w, Some(b)))
            .collect::<Result<_>>()?;
        let layers = match info.kind {
            HeadKind::Projection => Layers::Projection(per_head),
            HeadKind::Latent { .. } | HeadKind::Chained => Layers::Latent {
                transforms: per_head,
                output: layer(&model.unembedding_rows(&shortlist)?, None)?,
            },
        };
        Ok(Self {
            info,
            layers,
            shortlist,
        })
    }

    /// What `heads.json` says.
    pub fn info(&self) -> &HeadsInfo {
        &self.info
    }
}

fn short(fingerprint: &str) -> &str {
    &fingerprint[..fingerprint.len().min(12)]
}

impl TokenHeads for MultiTokenHeads {
    fn count(&self) -> usize {
        self.info.count
    }

    fn hidden_size(&self) -> usize {
        self.info.hidden_size
    }

    fn predict(&self, hidden: &Tensor, heads: Range<usize>) -> spec_core::Result<Logits> {
        let (count, width) = (self.info.count, self.info.hidden_size);
        check_head_range(&heads, count)?;
        let hidden = hidden.reshape((1, width))?;
        let scores = match (&self.layers, self.info.kind) {
            (Layers::Projection(layers), _) => {
                let rows = layers[heads]
                    .iter()
                    .map(|layer| layer.forward(&hidden))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&rows, 0)?
            }
            (Layers::Latent { output, .. }, HeadKind::Latent { .. }) => {
                output.forward(&self.output_states(&hidden, heads)?)?
            }
            (Layers::Latent { .. }, HeadKind::Chained) => {
                return Err(spec_core::Error::Unsupported(
                    "chained heads read the token before each guess: ask them one head at a \
                     time with predict_after",
                ))
            }
            (Layers::Latent { .. }, HeadKind::Projection) => {
                unreachable!("layers are built for their kind")
            }
        };
        self.full_rows(&scores)
    }

    fn reads_guesses(&self) -> bool {
        self.info.kind == HeadKind::Chained
    }

    /// Latent heads: their output layer is the model's unembedding (over the shortlist).
    fn shares_output_layer(&self) -> bool {
        matches!(self.info.kind, HeadKind::Latent { .. })
    }

    fn output_states(&self, hidden: &Tensor, heads: Range<usize>) -> spec_core::Result<Tensor> {
        check_head_range(&heads, self.info.count)?;
        let (
            Layers::Latent { transforms, .. },
            HeadKind::Latent {
                activation,
                residual,
            },
        ) = (&self.layers, self.info.kind)
        else {
            return Err(spec_core::Error::Unsupported(
                "only latent heads share the model's output layer",
            ));
        };
        let rows = hidden.dim(0)?;
        let states = transforms[heads.clone()]
            .iter()
            .map(|transform| expand(transform.forward(hidden)?, hidden, activation, residual))
            .collect::<candle_core::Result<Vec<_>>>()?;
        // Row i · heads + k: head k's state for hidden row i.
        Ok(Tensor::stack(&states, 1)?.reshape((rows * heads.len(), self.info.hidden_size))?)
    }

    fn shortlist(&self) -> Option<&[u32]> {
        Some(&self.shortlist)
    }

    fn predict_after(
        &self,
        state: &Tensor,
        k: usize,
        previous: u32,
    ) -> spec_core::Result<(Logits, Tensor)> {
        let (Layers::Latent { transforms, output }, HeadKind::Chained) =
            (&self.layers, self.info.kind)
        else {
            return Ok((self.predict(state, k..k + 1)?, state.clone()));
        };
        check_head_range(&(k..k + 1), self.info.count)?;
        let width = self.info.hidden_size;
        let state = state.reshape((1, width))?;
        // A token off the shortlist, which training never showed the heads, is read as zeros.
        let read = match self.shortlist.binary_search(&previous) {
            Ok(row) => unit_rms(
                &output
                    .weight
                    .embedding(&[row as u32], state.device())
                    .map_err(|e| spec_core::Error::Model(Box::new(e)))?,
            )?,
            Err(_) => Tensor::zeros((1, width), DType::F32, state.device())?,
        };
        let input = Tensor::cat(&[&state, &read], 1)?;
        let next = expand(transforms[k].forward(&input)?, &state, true, true)?;
        Ok((self.full_rows(&output.forward(&next)?)?, next))
    }
}

impl MultiTokenHeads {
    /// Shortlist scores `[heads, shortlist]` as logits over the whole vocabulary: tokens off
    /// the shortlist are never guessed.
    fn full_rows(&self, scores: &Tensor) -> spec_core::Result<Logits> {
        let scores: Vec<Vec<f32>> = scores.to_dtype(DType::F32)?.to_vec2()?;
        let rows: Vec<Vec<f32>> = scores
            .iter()
            .map(|row| {
                let mut full = vec![f32::NEG_INFINITY; self.info.vocab_size];
                for (&token, &score) in self.shortlist.iter().zip(row) {
                    full[token as usize] = score;
                }
                full
            })
            .collect();
        Logits::from_rows(&rows)
    }
}

/// Each row scaled to a root mean square of 1: a chained head reads token rows at about the
/// scale of the hidden states. Unembedding rows are far smaller; read unscaled, the token's
/// half of the transform learned too slowly to help (the 1.5B chat model's first head: 29.5 %
/// top-1 after two epochs, 36.9 % with the rows scaled). Public for the heads' training
/// (`spec-train`), which must read the rows as the heads do.
pub fn unit_rms(rows: &Tensor) -> candle_core::Result<Tensor> {
    let rms = rows
        .sqr()?
        .mean_keepdim(D::Minus1)?
        .affine(1.0, 1e-12)?
        .sqrt()?;
    rows.broadcast_div(&rms)
}

/// The latent heads' states from their transforms `z = h·A + b`: `h + SiLU(z)`, with the
/// activation and the residual when set. Public for the heads' training (`spec-train`), which
/// must compute the states as the heads do.
pub fn expand(
    mut z: Tensor,
    hidden: &Tensor,
    activation: bool,
    residual: bool,
) -> candle_core::Result<Tensor> {
    if activation {
        z = candle_nn::ops::silu(&z)?;
    }
    if residual {
        z = z.broadcast_add(hidden)?;
    }
    Ok(z)
}

#[cfg(test)]
mod tests;
