//! Multi-token prediction heads ("Faster Speech-LLaMA Inference with Multi-token Prediction",
//! §III, Fig. 2), their files and their training.
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
//! weights file), and refused for any other model. [`train`] fits them on cached hidden states
//! with the trunk frozen (eq. 11).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
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
            "train heads on this model's hidden states (`spec_nn::heads::train`)",
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
/// top-1 after two epochs, 36.9 % with the rows scaled).
fn unit_rms(rows: &Tensor) -> candle_core::Result<Tensor> {
    let rms = rows
        .sqr()?
        .mean_keepdim(D::Minus1)?
        .affine(1.0, 1e-12)?
        .sqrt()?;
    rows.broadcast_div(&rms)
}

/// The latent heads' states from their transforms `z = h·A + b`: `h + SiLU(z)`, with the
/// activation and the residual when set.
fn expand(
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

/// One recording's (or answer's) hidden states and the tokens after them.
#[derive(Debug, Clone)]
struct Sequence {
    /// `[positions, hidden]`.
    hidden: Tensor,
    next: Vec<u32>,
    /// Sequences of one group (one sentence in several voices) are validated together.
    group: u32,
}

/// Hidden states of a model's own outputs, with what each head should predict from them.
#[derive(Debug, Clone)]
pub struct TrainingSet {
    hidden_size: usize,
    sequences: Vec<Sequence>,
}

impl TrainingSet {
    pub fn new(hidden_size: usize) -> Self {
        Self {
            hidden_size,
            sequences: Vec::new(),
        }
    }

    /// Adds one sequence: `hidden` `[n, hidden_size]`, the hidden state at each position, and
    /// `next` (`n` tokens), the token the model emitted after each (its own greedy output:
    /// self-distillation). Head k learns `next[i + k + 1]` from `hidden[i]`. Sequences of one
    /// `group` (the same text spoken in several voices) fall on the same side of the
    /// validation split, so validation measures text the heads never saw.
    pub fn push(&mut self, hidden: Tensor, next: Vec<u32>, group: u32) -> Result<()> {
        let (n, width) = hidden.dims2()?;
        if width != self.hidden_size || n != next.len() {
            return Err(Error::Config(format!(
                "a training sequence of {n} hidden states {width} wide with {} tokens; expected \
                 one token per state and width {}",
                next.len(),
                self.hidden_size
            )));
        }
        self.sequences.push(Sequence {
            hidden: hidden.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
            next,
            group,
        });
        Ok(())
    }

    /// Adds every sequence of `other` (built apart, e.g. from another prompt file), its groups
    /// numbered after this set's so that no two sets share a group.
    pub fn append(&mut self, other: TrainingSet) -> Result<()> {
        if other.hidden_size != self.hidden_size && !other.is_empty() {
            return Err(Error::Config(format!(
                "cannot join training sets of hidden states {} and {} wide",
                self.hidden_size, other.hidden_size
            )));
        }
        let offset = self
            .sequences
            .iter()
            .map(|s| s.group + 1)
            .max()
            .unwrap_or(0);
        self.sequences
            .extend(other.sequences.into_iter().map(|s| Sequence {
                group: s.group + offset,
                ..s
            }));
        Ok(())
    }

    /// Sequences held.
    pub fn len(&self) -> usize {
        self.sequences.len()
    }

    /// True when there is no sequence.
    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    /// Positions held.
    pub fn positions(&self) -> usize {
        self.sequences.iter().map(|s| s.next.len()).sum()
    }

    /// Writes the set to one safetensors file (`hidden.{i}`, `next.{i}`, `group.{i}`), so the
    /// trunk runs once.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors = std::collections::HashMap::new();
        for (i, s) in self.sequences.iter().enumerate() {
            tensors.insert(format!("hidden.{i}"), s.hidden.clone());
            tensors.insert(
                format!("next.{i}"),
                Tensor::from_slice(&s.next, s.next.len(), &Device::Cpu)?,
            );
            tensors.insert(
                format!("group.{i}"),
                Tensor::from_slice(&[s.group], 1, &Device::Cpu)?,
            );
        }
        candle_core::safetensors::save(&tensors, path).map_err(|e| Error::BadWeights {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// The set cached at `path`, or (when absent or `refresh`) the one `build` makes, then
    /// saved there: the trunk's forwards run once per set of inputs.
    pub fn cached<E: From<Error>>(
        path: &Path,
        refresh: bool,
        build: impl FnOnce() -> std::result::Result<Self, E>,
    ) -> std::result::Result<Self, E> {
        if path.is_file() && !refresh {
            return Ok(Self::load(path)?);
        }
        let set = build()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        set.save(path)?;
        Ok(set)
    }

    /// One set per file of text lines (prompts, sentences; blank lines skipped), joined in file
    /// order ([`TrainingSet::append`]), so that a new file costs only its own lines. Each is
    /// cached at `cache_path(fingerprint, used)`, from the first 16 hex digits of the file's
    /// [`weights_fingerprint`] and `all` (or the number of lines when `limit`, a cap over all
    /// the files' lines, cut the file short), and built by `build(lines, file)` when absent or
    /// `refresh` ([`TrainingSet::cached`]). A file without lines is an error naming it.
    pub fn cached_per_file<E: From<Error>>(
        files: &[PathBuf],
        limit: Option<usize>,
        refresh: bool,
        cache_path: impl Fn(&str, &str) -> PathBuf,
        mut build: impl FnMut(&[String], &Path) -> std::result::Result<Self, E>,
    ) -> std::result::Result<Self, E> {
        let mut joined: Option<Self> = None;
        let mut left = limit.unwrap_or(usize::MAX);
        for file in files {
            if left == 0 {
                break;
            }
            let text = std::fs::read_to_string(file).map_err(|source| Error::Io {
                path: file.clone(),
                source,
            })?;
            let all: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect();
            if all.is_empty() {
                return Err(Error::Config(format!("{} holds no lines", file.display())).into());
            }
            let lines = &all[..all.len().min(left)];
            left -= lines.len();
            let used = match lines.len() == all.len() {
                true => "all".to_string(),
                false => lines.len().to_string(),
            };
            let cache = cache_path(&weights_fingerprint(file)?[..16], &used);
            let set = Self::cached(&cache, refresh, || build(lines, file))?;
            match &mut joined {
                Some(joined) => joined.append(set)?,
                None => joined = Some(set),
            }
        }
        joined.ok_or_else(|| Error::Config("no files of lines to train on".into()).into())
    }

    /// Reads a set written by [`TrainingSet::save`].
    pub fn load(path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::BadWeights {
            path: path.to_path_buf(),
            reason,
        };
        let tensors =
            candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| bad(e.to_string()))?;
        let count = tensors.len() / 3;
        let mut set = None;
        for i in 0..count {
            let hidden = tensors
                .get(&format!("hidden.{i}"))
                .ok_or_else(|| bad(format!("no hidden.{i}")))?;
            let next = tensors
                .get(&format!("next.{i}"))
                .ok_or_else(|| bad(format!("no next.{i}")))?
                .to_vec1::<u32>()?;
            let group = tensors
                .get(&format!("group.{i}"))
                .ok_or_else(|| bad(format!("no group.{i}")))?
                .to_vec1::<u32>()?;
            let set = set.get_or_insert_with(|| Self::new(hidden.dim(1).unwrap_or(0)));
            set.push(hidden.clone(), next, group.first().copied().unwrap_or(0))?;
        }
        set.ok_or_else(|| bad("no sequences".into()))
    }

    /// The tokens with ids below `below` (all of `vocab_size` for 0) and every token the set
    /// holds, sorted.
    fn shortlist(&self, below: u32, vocab_size: usize) -> Result<Vec<u32>> {
        let below = if below == 0 {
            vocab_size
        } else {
            (below as usize).min(vocab_size)
        };
        let mut chosen = vec![false; vocab_size];
        chosen[..below].fill(true);
        for s in &self.sequences {
            for &token in &s.next {
                *chosen.get_mut(token as usize).ok_or_else(|| {
                    Error::Config(format!(
                        "a training token {token} outside the vocabulary of {vocab_size}"
                    ))
                })? = true;
            }
        }
        Ok((0..vocab_size as u32)
            .filter(|&t| chosen[t as usize])
            .collect())
    }

    /// For head `k`: the rows of `sequences` that have a target, the targets as columns of
    /// the shortlist (`column[token]`) and, when `with_states`, the model's own state for each
    /// target (the one that predicted it).
    fn examples(
        &self,
        sequences: &[usize],
        k: usize,
        column: &[u32],
        with_states: bool,
    ) -> Result<HeadExamples> {
        let mut rows = Vec::new();
        let mut states = Vec::new();
        let mut targets = Vec::new();
        for &s in sequences {
            let Sequence { hidden, next, .. } = &self.sequences[s];
            let usable = next.len().saturating_sub(k + 1);
            if usable > 0 {
                rows.push(hidden.narrow(0, 0, usable)?);
                if with_states {
                    states.push(hidden.narrow(0, k + 1, usable)?);
                }
                targets.extend(next[k + 1..].iter().map(|&t| column[t as usize]));
            }
        }
        let stack = |rows: &[Tensor]| -> Result<Tensor> {
            Ok(match rows.is_empty() {
                true => Tensor::zeros((0, self.hidden_size), DType::F32, &Device::Cpu)?,
                false => Tensor::cat(rows, 0)?,
            })
        };
        Ok(HeadExamples {
            inputs: stack(&rows)?,
            targets,
            model_states: with_states.then(|| stack(&states)).transpose()?,
        })
    }

    /// For `count` chained heads: every position of `sequences` with a token after the next,
    /// and per head the shortlist row of the token it reads (`none_read` past the end) and of
    /// its target ([`NO_TARGET`] past the end). Head k at position i reads `next[i + k]` and
    /// learns `next[i + k + 1]`, which the model's state `hidden[i + k + 1]` predicted.
    fn chain_examples(
        &self,
        sequences: &[usize],
        count: usize,
        column: &[u32],
        none_read: u32,
        read_table: Tensor,
    ) -> Result<ChainExamples> {
        let mut states = Vec::new();
        let mut starts = Vec::new();
        let mut reads = vec![Vec::new(); count];
        let mut targets = vec![Vec::new(); count];
        let mut first_row = 0u32;
        for &s in sequences {
            let Sequence { hidden, next, .. } = &self.sequences[s];
            let usable = next.len().saturating_sub(1);
            if usable == 0 {
                continue;
            }
            states.push(hidden.clone());
            let column_at = |j: usize| next.get(j).map(|&t| column[t as usize]);
            for i in 0..usable {
                starts.push(first_row + i as u32);
                for k in 0..count {
                    reads[k].push(column_at(i + k).unwrap_or(none_read));
                    targets[k].push(column_at(i + k + 1).unwrap_or(NO_TARGET));
                }
            }
            first_row += next.len() as u32;
        }
        let states = match states.is_empty() {
            true => Tensor::zeros((0, self.hidden_size), DType::F32, &Device::Cpu)?,
            false => Tensor::cat(&states, 0)?,
        };
        Ok(ChainExamples {
            states,
            starts,
            reads,
            targets,
            read_table,
        })
    }
}

/// A chained head's target where the sequence has ended.
const NO_TARGET: u32 = u32::MAX;

/// One head's examples from [`TrainingSet::examples`].
struct HeadExamples {
    /// `[n, hidden]`.
    inputs: Tensor,
    targets: Vec<u32>,
    /// `[n, hidden]`: the model's state for each target, when the loss reads it.
    model_states: Option<Tensor>,
}

/// Training examples of chained heads ([`TrainingSet::chain_examples`]).
struct ChainExamples {
    /// `[positions, hidden]`: every state of the sequences, in order.
    states: Tensor,
    /// Per example, the row of `states` its chain starts from.
    starts: Vec<u32>,
    reads: Vec<Vec<u32>>,
    targets: Vec<Vec<u32>>,
    /// The rows a head reads a token from: the shortlist's unembedding rows ([`unit_rms`]) and
    /// a zero row for "nothing to read".
    read_table: Tensor,
}

/// One head's output on a batch, with what its loss compares it to.
struct HeadOutput {
    head: usize,
    /// `[n, shortlist]`.
    logits: Tensor,
    targets: Vec<u32>,
    /// The head's state `z` before the unembedding (latent and chained heads), `[n, hidden]`.
    state: Option<Tensor>,
    /// The model's own state for each target, `[n, hidden]` (when the loss reads it).
    model_state: Option<Tensor>,
}

impl ChainExamples {
    fn rows(&self) -> usize {
        self.starts.len()
    }

    /// Each head's output over the shortlist at `rows` (those with a target only), the heads
    /// run one after another as at inference: `z_0 = h`,
    /// `z_{k+1} = z_k + SiLU(A_k [z_k; e(read_k)] + b_k)`.
    fn outputs(
        &self,
        heads: &[TrainableHead],
        rows: &[u32],
        output: &Tensor,
        with_states: bool,
    ) -> Result<Vec<HeadOutput>> {
        let device = Device::Cpu;
        let starts: Vec<u32> = rows.iter().map(|&r| self.starts[r as usize]).collect();
        let mut z = self
            .states
            .index_select(&Tensor::from_slice(&starts, starts.len(), &device)?, 0)?;
        let mut out = Vec::with_capacity(heads.len());
        for (k, head) in heads.iter().enumerate() {
            let reads: Vec<u32> = rows.iter().map(|&r| self.reads[k][r as usize]).collect();
            let read = self
                .read_table
                .index_select(&Tensor::from_slice(&reads, reads.len(), &device)?, 0)?;
            let input = Tensor::cat(&[&z, &read], 1)?;
            let step = input.matmul(&head.weight.t()?)?.broadcast_add(&head.bias)?;
            z = expand(step, &z, true, true)?;
            let mut kept = Vec::new();
            let mut targets = Vec::new();
            let mut model_rows = Vec::new();
            for (i, &r) in rows.iter().enumerate() {
                let target = self.targets[k][r as usize];
                if target != NO_TARGET {
                    kept.push(i as u32);
                    targets.push(target);
                    model_rows.push(starts[i] + k as u32 + 1);
                }
            }
            if kept.is_empty() {
                break;
            }
            let state = z.index_select(&Tensor::from_slice(&kept, kept.len(), &device)?, 0)?;
            let model_state = with_states
                .then(|| {
                    self.states.index_select(
                        &Tensor::from_slice(&model_rows, model_rows.len(), &device)?,
                        0,
                    )
                })
                .transpose()?;
            out.push(HeadOutput {
                head: k,
                logits: state.matmul(&output.t()?)?,
                targets,
                state: Some(state),
                model_state,
            });
        }
        Ok(out)
    }
}

/// Settings of [`train`].
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    pub kind: HeadKind,
    pub count: usize,
    pub epochs: usize,
    pub batch_size: usize,
    pub learning_rate: f64,
    pub weight_decay: f64,
    /// λ_k of eq. 11 for each head (the paper: 0.2 for the heads after the first, whose own
    /// λ_1 = 1 belongs to the frozen output layer here).
    pub loss_weights: Vec<f32>,
    /// Share of the groups held out for validation (the last ones after a seeded shuffle).
    pub validation_fraction: f32,
    /// The heads score the tokens with ids below this, and every token of the training data
    /// (0: the whole vocabulary).
    pub shortlist_below: u32,
    /// Weight of a Smooth L1 loss between a latent or chained head's state and the model's own
    /// state for the token it guesses (EAGLE's feature regression; 0: none). That state is what
    /// the model's unembedding turns into the target's logits, so it teaches a whole vector per
    /// position where the token teaches one index.
    pub feature_weight: f32,
    /// Cross-entropy against the model's own distribution over the shortlist (the softmax of
    /// its logits for the target) instead of against its chosen token alone.
    pub soft_targets: bool,
    pub seed: u64,
}

impl TrainConfig {
    /// The paper's weights and settings that train well here for `count` heads of `kind`.
    pub fn new(kind: HeadKind, count: usize) -> Self {
        Self {
            kind,
            count,
            epochs: 8,
            batch_size: 256,
            learning_rate: match kind {
                HeadKind::Projection => 1e-4,
                HeadKind::Latent { .. } | HeadKind::Chained => 1e-3,
            },
            weight_decay: 0.0,
            loss_weights: vec![0.2; count],
            validation_fraction: 0.1,
            shortlist_below: 8192,
            feature_weight: 0.0,
            soft_targets: false,
            seed: 0,
        }
    }
}

/// What [`train`] reports as it goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// A batch of `batches` done; its loss.
    Batch {
        epoch: usize,
        batch: usize,
        batches: usize,
        loss: f32,
    },
    /// An epoch done: mean training loss, validation loss and each head's top-1 accuracy.
    Epoch(EpochReport),
}

/// One epoch's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochReport {
    pub epoch: usize,
    pub train_loss: f32,
    pub validation_loss: f32,
    pub validation_accuracy: Vec<f32>,
}

impl std::fmt::Display for EpochReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "epoch {}: train loss {:.3}, validation loss {:.3}, top-1",
            self.epoch + 1,
            self.train_loss,
            self.validation_loss
        )?;
        for (k, accuracy) in self.validation_accuracy.iter().enumerate() {
            let sep = if k == 0 { "" } else { "," };
            write!(f, "{sep} head {}: {:.1} %", k + 1, 100.0 * accuracy)?;
        }
        Ok(())
    }
}

/// Trained heads' tensors, before they are written ([`TrainedHeads::save`]).
pub struct TrainedHeads {
    pub kind: HeadKind,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub reports: Vec<EpochReport>,
    varmap: VarMap,
    count: usize,
    shortlist: Vec<u32>,
}

impl TrainedHeads {
    /// Writes `heads.safetensors` and `heads.json` into `dir` (created if needed).
    pub fn save(
        &self,
        dir: &Path,
        base_model: &str,
        base_fingerprint: &str,
        command: &str,
    ) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let weights = dir.join(HEADS_WEIGHTS);
        let mut tensors: std::collections::HashMap<String, Tensor> = self
            .varmap
            .data()
            .lock()
            .map_err(|_| Error::Config("the trained variables' lock was poisoned".into()))?
            .iter()
            .map(|(name, var)| (name.clone(), var.as_tensor().clone()))
            .collect();
        tensors.insert(
            "shortlist".into(),
            Tensor::from_slice(&self.shortlist, self.shortlist.len(), &Device::Cpu)?,
        );
        candle_core::safetensors::save(&tensors, &weights).map_err(|e| Error::BadWeights {
            path: weights.clone(),
            reason: e.to_string(),
        })?;
        let info = HeadsInfo {
            kind: self.kind,
            count: self.count,
            hidden_size: self.hidden_size,
            vocab_size: self.vocab_size,
            shortlist_size: self.shortlist.len(),
            trained_for: TrainedFor {
                base_model: base_model.into(),
                base_fingerprint: base_fingerprint.into(),
                command: command.into(),
            },
            validation_accuracy: self
                .reports
                .last()
                .map(|r| r.validation_accuracy.clone())
                .unwrap_or_default(),
        };
        let json = serde_json::to_string_pretty(&info).map_err(|e| Error::Config(e.to_string()))?;
        let info_path = dir.join(HEADS_INFO);
        std::fs::write(&info_path, json + "\n").map_err(|source| Error::Io {
            path: info_path,
            source,
        })?;
        Ok(dir.to_path_buf())
    }
}

/// The trainable part of the heads during training.
struct TrainableHead {
    weight: Tensor,
    bias: Tensor,
}

/// Trains `config.count` heads on `data` with the trunk frozen: AdamW on Σ_k λ_k · CE_k (eq. 11)
/// over the model's unembedding `unembedding` `[vocab, hidden]` (f32). Latent and chained heads
/// start as the identity (zero transform, so every head first predicts what the model's own
/// head does); projection heads start from the unembedding. Chained heads learn as they draft:
/// one after another along the model's own tokens (teacher forcing). Deterministic for a seed.
pub fn train(
    data: &TrainingSet,
    unembedding: &Tensor,
    config: &TrainConfig,
    on_progress: &mut dyn FnMut(&Progress),
) -> Result<TrainedHeads> {
    let (vocab_size, hidden_size) = unembedding.dims2()?;
    if hidden_size != data.hidden_size {
        return Err(Error::Config(format!(
            "hidden states {} wide but an unembedding of width {hidden_size}",
            data.hidden_size
        )));
    }
    if config.count == 0 || config.loss_weights.len() != config.count || config.batch_size == 0 {
        return Err(Error::Config(format!(
            "training needs at least one head, one loss weight per head and a batch size; got \
             {} heads, {} weights, batch {}",
            config.count,
            config.loss_weights.len(),
            config.batch_size
        )));
    }
    if let Some(bad) = config
        .loss_weights
        .iter()
        .find(|w| !w.is_finite() || **w <= 0.0)
    {
        return Err(Error::Config(format!(
            "a head's loss weight must be finite and positive, not {bad}"
        )));
    }
    if config.feature_weight < 0.0 || !config.feature_weight.is_finite() {
        return Err(Error::Config(format!(
            "a feature loss weight must be finite and not negative, not {}",
            config.feature_weight
        )));
    }
    if config.feature_weight > 0.0 && config.kind == HeadKind::Projection {
        return Err(Error::Config(
            "projection heads have no state to compare with the model's: a feature loss needs \
             latent or chained heads"
                .into(),
        ));
    }
    let with_states = config.feature_weight > 0.0 || config.soft_targets;
    let mut groups: Vec<u32> = data.sequences.iter().map(|s| s.group).collect();
    groups.sort_unstable();
    groups.dedup();
    if groups.len() < 2 {
        return Err(Error::Config(
            "training needs at least two groups of sequences (one for validation)".into(),
        ));
    }
    let device = Device::Cpu;
    let shortlist = data.shortlist(config.shortlist_below, vocab_size)?;
    let mut column = vec![u32::MAX; vocab_size];
    for (i, &token) in shortlist.iter().enumerate() {
        column[token as usize] = i as u32;
    }
    let output = unembedding
        .to_dtype(DType::F32)?
        .to_device(&device)?
        .index_select(
            &Tensor::from_slice(&shortlist, shortlist.len(), &device)?,
            0,
        )?;
    let mut rng = StdRng::seed_from_u64(config.seed);
    groups.shuffle(&mut rng);
    let held_out = ((groups.len() as f32 * config.validation_fraction).round() as usize)
        .clamp(1, groups.len() - 1);
    let validation_groups = &groups[groups.len() - held_out..];
    let (validation_sequences, train_sequences): (Vec<usize>, Vec<usize>) =
        (0..data.len()).partition(|&i| validation_groups.contains(&data.sequences[i].group));

    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let mut heads = Vec::with_capacity(config.count);
    // A chained head reads the state before it and a token's unembedding row.
    let input_width = match config.kind {
        HeadKind::Chained => 2 * hidden_size,
        _ => hidden_size,
    };
    for k in 0..config.count {
        let vb = vb.pp(format!("head.{k}"));
        heads.push(match config.kind {
            HeadKind::Projection => TrainableHead {
                weight: vb.get_with_hints(
                    (shortlist.len(), hidden_size),
                    "weight",
                    candle_nn::Init::Const(0.0),
                )?,
                bias: vb.get_with_hints(shortlist.len(), "bias", candle_nn::Init::Const(0.0))?,
            },
            HeadKind::Latent { .. } | HeadKind::Chained => TrainableHead {
                weight: vb.get_with_hints(
                    (hidden_size, input_width),
                    "weight",
                    candle_nn::Init::Const(0.0),
                )?,
                bias: vb.get_with_hints(hidden_size, "bias", candle_nn::Init::Const(0.0))?,
            },
        });
    }
    if config.kind == HeadKind::Projection {
        for var in varmap.all_vars() {
            if var.dims() == [shortlist.len(), hidden_size] {
                var.set(&output)?;
            }
        }
    }
    let mut optimizer = AdamW::new(
        varmap.all_vars(),
        ParamsAdamW {
            lr: config.learning_rate,
            weight_decay: config.weight_decay,
            ..Default::default()
        },
    )?;

    let (train_set, validation_set) = match config.kind {
        HeadKind::Chained => {
            // The shortlist's unembedding rows at unit scale, and a zero row for nothing to read.
            let read_table = Tensor::cat(
                &[
                    &unit_rms(&output)?,
                    &Tensor::zeros((1, hidden_size), DType::F32, &device)?,
                ],
                0,
            )?;
            let chain = |sequences: &[usize]| -> Result<Examples> {
                Ok(Examples::Chained(data.chain_examples(
                    sequences,
                    config.count,
                    &column,
                    shortlist.len() as u32,
                    read_table.clone(),
                )?))
            };
            (chain(&train_sequences)?, chain(&validation_sequences)?)
        }
        _ => {
            let independent = |sequences: &[usize]| -> Result<Examples> {
                Ok(Examples::Independent(
                    (0..config.count)
                        .map(|k| data.examples(sequences, k, &column, with_states))
                        .collect::<Result<_>>()?,
                ))
            };
            (
                independent(&train_sequences)?,
                independent(&validation_sequences)?,
            )
        }
    };
    let frozen = Frozen {
        kind: config.kind,
        output,
    };
    let rows = train_set.rows();
    if rows == 0 {
        return Err(Error::Config("no training positions".into()));
    }
    let batches = rows.div_ceil(config.batch_size);
    let mut reports = Vec::with_capacity(config.epochs);
    for epoch in 0..config.epochs {
        // Each head's examples are shuffled alike by position index; a later head simply
        // has fewer (the last positions of each sequence have nothing k tokens ahead).
        let mut permutation: Vec<u32> = (0..rows as u32).collect();
        permutation.shuffle(&mut rng);
        let mut total = 0f32;
        for batch in 0..batches {
            let chosen =
                &permutation[batch * config.batch_size..rows.min((batch + 1) * config.batch_size)];
            let mut loss: Option<Tensor> = None;
            for head in train_set.outputs(&heads, chosen, &frozen, with_states)? {
                let weighted = (head_loss(&head, config, &frozen.output)?
                    * f64::from(config.loss_weights[head.head]))?;
                loss = Some(match loss {
                    Some(l) => (l + weighted)?,
                    None => weighted,
                });
            }
            let Some(loss) = loss else { continue };
            optimizer.backward_step(&loss)?;
            let value = loss.to_scalar::<f32>()?;
            total += value;
            on_progress(&Progress::Batch {
                epoch,
                batch,
                batches,
                loss: value,
            });
        }
        let (validation_loss, validation_accuracy) =
            evaluate(&heads, &validation_set, &config.loss_weights, &frozen)?;
        let report = EpochReport {
            epoch,
            train_loss: total / batches as f32,
            validation_loss,
            validation_accuracy,
        };
        on_progress(&Progress::Epoch(report.clone()));
        reports.push(report);
    }
    Ok(TrainedHeads {
        kind: config.kind,
        hidden_size,
        vocab_size,
        reports,
        varmap,
        count: config.count,
        shortlist,
    })
}

/// The frozen tensors the heads' logits read.
struct Frozen {
    kind: HeadKind,
    /// The shortlist's unembedding rows, `[shortlist, hidden]`.
    output: Tensor,
}

/// What the heads learn from: each head's own rows, or positions the chained heads run along.
enum Examples {
    /// Per head (a later head has fewer).
    Independent(Vec<HeadExamples>),
    Chained(ChainExamples),
}

impl Examples {
    /// Positions of the first head.
    fn rows(&self) -> usize {
        match self {
            Self::Independent(sets) => sets.first().map_or(0, |set| set.targets.len()),
            Self::Chained(set) => set.rows(),
        }
    }

    /// Each head's output at those of `rows` where it has a target, with the model's states
    /// for them when `with_states`.
    fn outputs(
        &self,
        heads: &[TrainableHead],
        rows: &[u32],
        frozen: &Frozen,
        with_states: bool,
    ) -> Result<Vec<HeadOutput>> {
        let device = Device::Cpu;
        match self {
            Self::Chained(set) => set.outputs(heads, rows, &frozen.output, with_states),
            Self::Independent(sets) => {
                let mut out = Vec::with_capacity(heads.len());
                for (k, (head, set)) in heads.iter().zip(sets).enumerate() {
                    let picked: Vec<u32> = rows
                        .iter()
                        .copied()
                        .filter(|&i| (i as usize) < set.targets.len())
                        .collect();
                    if picked.is_empty() {
                        continue;
                    }
                    let index = Tensor::from_slice(&picked, picked.len(), &device)?;
                    let x = set.inputs.index_select(&index, 0)?;
                    let (logits, state) = match frozen.kind {
                        HeadKind::Latent {
                            activation,
                            residual,
                        } => {
                            let z = x.matmul(&head.weight.t()?)?.broadcast_add(&head.bias)?;
                            let z = expand(z, &x, activation, residual)?;
                            (z.matmul(&frozen.output.t()?)?, Some(z))
                        }
                        _ => (
                            x.matmul(&head.weight.t()?)?.broadcast_add(&head.bias)?,
                            None,
                        ),
                    };
                    let model_state = match (&set.model_states, with_states) {
                        (Some(states), true) => Some(states.index_select(&index, 0)?),
                        _ => None,
                    };
                    out.push(HeadOutput {
                        head: k,
                        logits,
                        targets: picked.iter().map(|&i| set.targets[i as usize]).collect(),
                        state,
                        model_state,
                    });
                }
                Ok(out)
            }
        }
    }
}

/// One head's training loss on a batch: cross-entropy against the model's token (or, with
/// soft targets, its distribution over the shortlist `output`), plus the weighted Smooth L1
/// distance between the head's state and the model's.
fn head_loss(head: &HeadOutput, config: &TrainConfig, output: &Tensor) -> Result<Tensor> {
    let model_state = || {
        head.model_state.as_ref().ok_or_else(|| {
            Error::Config("the loss needs the model's states, which were not gathered".into())
        })
    };
    let mut loss = if config.soft_targets {
        let teacher = candle_nn::ops::softmax_last_dim(&model_state()?.matmul(&output.t()?)?)?;
        let log_student = candle_nn::ops::log_softmax(&head.logits, D::Minus1)?;
        (teacher * log_student)?.sum(D::Minus1)?.mean_all()?.neg()?
    } else {
        let y = Tensor::from_slice(&head.targets, head.targets.len(), &Device::Cpu)?;
        candle_nn::loss::cross_entropy(&head.logits, &y)?
    };
    if config.feature_weight > 0.0 {
        let state = head
            .state
            .as_ref()
            .ok_or_else(|| Error::Config("a feature loss needs latent or chained heads".into()))?;
        let distance = (state - model_state()?)?.abs()?;
        // Smooth L1: d²/2 below 1, d - 1/2 above.
        let smooth = distance
            .lt(1.0)?
            .where_cond(&(distance.sqr()? * 0.5)?, &(distance.clone() - 0.5)?)?;
        loss = (loss + (smooth.mean_all()? * f64::from(config.feature_weight))?)?;
    }
    Ok(loss)
}

/// Weighted validation loss and each head's top-1 accuracy.
fn evaluate(
    heads: &[TrainableHead],
    set: &Examples,
    weights: &[f32],
    frozen: &Frozen,
) -> Result<(f32, Vec<f32>)> {
    const CHUNK: usize = 512;
    let mut correct = vec![0usize; heads.len()];
    let mut ce_sum = vec![0f32; heads.len()];
    let mut seen = vec![0usize; heads.len()];
    let rows = set.rows() as u32;
    for start in (0..rows).step_by(CHUNK) {
        let chunk: Vec<u32> = (start..rows.min(start + CHUNK as u32)).collect();
        for HeadOutput {
            head: k,
            logits,
            targets,
            ..
        } in set.outputs(heads, &chunk, frozen, false)?
        {
            let logits = logits.detach();
            let n = targets.len();
            let y = Tensor::from_slice(&targets, n, &Device::Cpu)?;
            ce_sum[k] +=
                candle_nn::loss::cross_entropy(&logits, &y)?.to_scalar::<f32>()? * n as f32;
            let best = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            correct[k] += best.iter().zip(&targets).filter(|(a, b)| a == b).count();
            seen[k] += n;
        }
    }
    let mut loss = 0f32;
    let mut accuracy = Vec::with_capacity(heads.len());
    for k in 0..heads.len() {
        let n = seen[k].max(1) as f32;
        loss += weights[k] * ce_sum[k] / n;
        accuracy.push(correct[k] as f32 / n);
    }
    Ok((loss, accuracy))
}

/// The options every `train_heads` program takes, and its progress display.
#[cfg(feature = "cli")]
pub mod cli {
    use std::path::{Path, PathBuf};

    use indicatif::{ProgressBar, ProgressStyle};

    use super::{train, HeadKind, Progress, TrainConfig, TrainingSet};
    use crate::Result;

    /// The head architectures, as a command-line value.
    #[derive(Clone, Copy, Debug, clap::ValueEnum)]
    pub enum Kind {
        /// d×d transforms before the model's own unembedding (SiLU, residual)
        Latent,
        /// An output matrix per head
        Projection,
        /// Latent heads that also read the token before their guess and the state of the
        /// head before them
        Chained,
    }

    /// How to train the heads.
    #[derive(Debug, clap::Args)]
    pub struct TrainArgs {
        #[arg(long, default_value_t = 4)]
        pub heads: usize,
        #[arg(long, value_enum, default_value_t = Kind::Latent)]
        pub kind: Kind,
        #[arg(long, default_value_t = 8)]
        pub epochs: usize,
        #[arg(long)]
        pub learning_rate: Option<f64>,
        /// AdamW's decoupled weight decay.
        #[arg(long, default_value_t = 0.0)]
        pub weight_decay: f64,
        #[arg(long, default_value_t = 256)]
        pub batch_size: usize,
        /// Weight of the Smooth L1 loss between a latent or chained head's state and the
        /// model's own state for its target (EAGLE's feature regression; 0: none).
        #[arg(long, default_value_t = 0.0)]
        pub feature_weight: f32,
        /// Learn the model's whole distribution for each target, not only its token.
        #[arg(long)]
        pub soft_targets: bool,
        /// λ_k of the loss Σ_k λ_k · CE_k, one per head [default: 0.2 each, the paper's]. Chained
        /// heads pass their state on, so a deeper head's loss also trains the heads before it;
        /// smaller weights for the deeper heads keep the first head's accuracy.
        #[arg(long, value_delimiter = ',')]
        pub loss_weights: Vec<f32>,
        #[arg(long, default_value_t = 0)]
        pub seed: u64,
        /// Output folder [default: $SPECVOICE_MODELS/heads/MODEL-KIND-COUNT].
        #[arg(long)]
        pub out: Option<PathBuf>,
        /// Write to `$SPECVOICE_MODELS/heads/MODEL-<this>` instead (the name benchmarks and
        /// `--heads` options take), e.g. `chained-1-quick` for a small trial.
        #[arg(long, conflicts_with = "out")]
        pub variant: Option<String>,
    }

    impl TrainArgs {
        /// The training settings these options ask for.
        pub fn config(&self) -> TrainConfig {
            let kind = match self.kind {
                Kind::Latent => HeadKind::latent(),
                Kind::Projection => HeadKind::Projection,
                Kind::Chained => HeadKind::Chained,
            };
            let mut config = TrainConfig::new(kind, self.heads);
            config.epochs = self.epochs;
            config.batch_size = self.batch_size;
            config.seed = self.seed;
            config.weight_decay = self.weight_decay;
            config.feature_weight = self.feature_weight;
            config.soft_targets = self.soft_targets;
            if !self.loss_weights.is_empty() {
                config.loss_weights = self.loss_weights.clone();
            }
            if let Some(lr) = self.learning_rate {
                config.learning_rate = lr;
            }
            config
        }

        /// Trains on `data` with a progress bar and each epoch's figures printed, and writes the
        /// heads for `model` (its name and weights fingerprint) to `--out` or
        /// `heads_root/MODEL-VARIANT` (`KIND-COUNT` unless `--variant` names it); returns the
        /// folder.
        pub fn train_and_save(
            &self,
            data: &TrainingSet,
            unembedding: &candle_core::Tensor,
            heads_root: &Path,
            model: &str,
            fingerprint: &str,
        ) -> Result<PathBuf> {
            let bar = ProgressBar::new(0).with_style(
                ProgressStyle::with_template(
                    "epoch {prefix} {bar:30} {pos}/{len} batches, loss {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let trained = train(
                data,
                unembedding,
                &self.config(),
                &mut |progress| match progress {
                    Progress::Batch {
                        epoch,
                        batch,
                        batches,
                        loss,
                    } => {
                        bar.set_length(*batches as u64);
                        bar.set_prefix(format!("{}", epoch + 1));
                        bar.set_position(*batch as u64 + 1);
                        bar.set_message(format!("{loss:.3}"));
                    }
                    Progress::Epoch(report) => {
                        bar.suspend(|| println!("{report}"));
                        bar.reset();
                    }
                },
            )?;
            bar.finish_and_clear();
            let kind = match self.kind {
                Kind::Latent => "latent",
                Kind::Projection => "projection",
                Kind::Chained => "chained",
            };
            let variant = self
                .variant
                .clone()
                .unwrap_or_else(|| format!("{kind}-{}", self.heads));
            let out = self
                .out
                .clone()
                .unwrap_or_else(|| heads_root.join(format!("{model}-{variant}")));
            let command = std::env::args().collect::<Vec<_>>().join(" ");
            trained.save(&out, model, fingerprint, &command)
        }
    }
}

#[cfg(test)]
mod tests {
    use spec_core::mock::{MockConfig, MockDecoder};

    use super::*;

    /// A tiny synthetic task: hidden states are one-hot codes of a token, and the "model" says
    /// the tokens of a fixed cycle, so the token k + 1 ahead is a function of the state.
    fn cycle_task(vocab: usize, sequences: usize, len: usize) -> (TrainingSet, Tensor) {
        let hidden_size = vocab;
        let unembedding = (Tensor::eye(vocab, DType::F32, &Device::Cpu).unwrap() * 4.0).unwrap();
        let mut set = TrainingSet::new(hidden_size);
        for s in 0..sequences {
            let tokens: Vec<u32> = (0..len).map(|i| ((s + 3 * i) % vocab) as u32).collect();
            // The state at position i "is" token tokens[i]; the model's next token follows it.
            let hidden = one_hot(&tokens, vocab);
            let next: Vec<u32> = tokens.iter().map(|&t| (t + 3) % vocab as u32).collect();
            set.push(hidden, next, s as u32).unwrap();
        }
        (set, unembedding)
    }

    /// Two heads trained briskly on a tiny task.
    fn small_task_config(kind: HeadKind) -> TrainConfig {
        let mut config = TrainConfig::new(kind, 2);
        config.epochs = 30;
        config.batch_size = 32;
        config.learning_rate = 0.05;
        config
    }

    /// The epoch reports of a training run, checked to be the same when trained again.
    fn trained_twice(
        data: &TrainingSet,
        unembedding: &Tensor,
        config: &TrainConfig,
    ) -> Vec<EpochReport> {
        let first = train(data, unembedding, config, &mut |_| {}).unwrap();
        let again = train(data, unembedding, config, &mut |_| {}).unwrap();
        assert_eq!(first.reports, again.reports, "same seed, same run");
        first.reports
    }

    #[test]
    fn training_lowers_the_loss_and_is_reproducible() {
        let (data, unembedding) = cycle_task(16, 12, 20);
        for kind in [HeadKind::latent(), HeadKind::Projection, HeadKind::Chained] {
            let reports = trained_twice(&data, &unembedding, &small_task_config(kind));
            let (start, end) = (&reports[0], reports.last().unwrap());
            assert!(
                end.validation_loss < 0.5 * start.validation_loss,
                "{kind:?}: {start:?} → {end:?}"
            );
            assert!(end.validation_accuracy.iter().all(|&a| a > 0.95), "{end:?}");
        }
    }

    /// `[tokens, vocab]`: each token's one-hot code.
    fn one_hot(tokens: &[u32], vocab: usize) -> Tensor {
        let rows: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| (0..vocab).map(move |j| if j == t as usize { 1.0 } else { 0.0 }))
            .collect();
        Tensor::from_vec(rows, (tokens.len(), vocab), &Device::Cpu).unwrap()
    }

    /// A cycle task whose states are the model's own: the state at position i is the one-hot
    /// code of the token it predicts, so the unembedding of a target's state gives the target.
    fn self_consistent_cycle_task(vocab: usize, sequences: usize, len: usize) -> TrainingSet {
        let mut set = TrainingSet::new(vocab);
        for s in 0..sequences {
            let next: Vec<u32> = (0..len).map(|i| ((s + 3 * i) % vocab) as u32).collect();
            set.push(one_hot(&next, vocab), next, s as u32).unwrap();
        }
        set
    }

    #[test]
    fn feature_and_soft_target_losses_train_and_are_reproducible() {
        let data = self_consistent_cycle_task(16, 12, 20);
        let unembedding = (Tensor::eye(16, DType::F32, &Device::Cpu).unwrap() * 4.0).unwrap();
        for kind in [HeadKind::latent(), HeadKind::Chained] {
            for (feature_weight, soft_targets) in [(1.0, false), (0.0, true), (1.0, true)] {
                let mut config = small_task_config(kind);
                config.feature_weight = feature_weight;
                config.soft_targets = soft_targets;
                let reports = trained_twice(&data, &unembedding, &config);
                // Soft targets keep the model's own uncertainty (its peak token at 78 % here), so
                // the training loss, not the validation's cross-entropy to the token, must fall.
                let (start, end) = (&reports[0], reports.last().unwrap());
                assert!(
                    end.train_loss < 0.75 * start.train_loss,
                    "{kind:?} {feature_weight} {soft_targets}: {start:?} → {end:?}"
                );
                assert!(end.validation_accuracy.iter().all(|&a| a > 0.95), "{end:?}");
            }
        }
    }

    #[test]
    fn appended_sets_keep_their_groups_apart() {
        let mut first = self_consistent_cycle_task(8, 3, 5);
        first.append(self_consistent_cycle_task(8, 2, 4)).unwrap();
        assert_eq!(first.len(), 5);
        assert_eq!(first.positions(), 3 * 5 + 2 * 4);
        let groups: Vec<u32> = first.sequences.iter().map(|s| s.group).collect();
        assert_eq!(groups, [0, 1, 2, 3, 4]);
        let error = first
            .append(self_consistent_cycle_task(6, 1, 4))
            .unwrap_err()
            .to_string();
        assert!(error.contains("8 and 6 wide"), "{error}");
    }

    #[test]
    fn sets_are_cached_per_file_and_joined() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = [
            ("a.txt", "one\n\n two \nthree\n"),
            ("b.txt", "four\nfive\n"),
        ]
        .iter()
        .map(|(name, text)| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect();
        let cache_path = |fingerprint: &str, used: &str| {
            dir.path()
                .join(format!("set-{fingerprint}-{used}.safetensors"))
        };
        // Each line becomes a sequence of as many positions as it has characters.
        let built = std::cell::RefCell::new(Vec::new());
        let build = |lines: &[String], _: &Path| -> Result<TrainingSet> {
            built.borrow_mut().push(lines.to_vec());
            let mut set = TrainingSet::new(4);
            for (i, line) in lines.iter().enumerate() {
                set.push(
                    Tensor::zeros((line.len(), 4), DType::F32, &Device::Cpu)?,
                    vec![0; line.len()],
                    i as u32,
                )?;
            }
            Ok(set)
        };
        let joined = TrainingSet::cached_per_file(&files, None, false, cache_path, build).unwrap();
        assert_eq!(joined.len(), 5);
        assert_eq!(joined.positions(), 3 + 3 + 5 + 4 + 4);
        let groups: Vec<u32> = joined.sequences.iter().map(|s| s.group).collect();
        assert_eq!(groups, [0, 1, 2, 3, 4]);
        assert_eq!(
            built.take(),
            [vec!["one", "two", "three"], vec!["four", "five"]]
        );

        // Cached: nothing is built again; a limit cuts the second file and caches that apart.
        let limited =
            TrainingSet::cached_per_file(&files, Some(4), false, cache_path, build).unwrap();
        assert_eq!(limited.len(), 4);
        assert_eq!(built.take(), [vec!["four"]]);

        std::fs::write(&files[1], "\n  \n").unwrap();
        let error = TrainingSet::cached_per_file(&files, None, false, cache_path, build)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("b.txt holds no lines"), "{error}");
    }

    #[test]
    fn a_feature_loss_is_refused_for_projection_heads_and_bad_weights() {
        let data = self_consistent_cycle_task(16, 4, 8);
        let unembedding = Tensor::eye(16, DType::F32, &Device::Cpu).unwrap();
        let mut config = TrainConfig::new(HeadKind::Projection, 1);
        config.feature_weight = 1.0;
        let error = train(&data, &unembedding, &config, &mut |_| {})
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("projection heads have no state"), "{error}");
        for weight in [-1.0, f32::NAN] {
            let mut config = TrainConfig::new(HeadKind::Chained, 1);
            config.feature_weight = weight;
            let error = train(&data, &unembedding, &config, &mut |_| {})
                .err()
                .unwrap()
                .to_string();
            assert!(error.contains("finite and not negative"), "{error}");
        }
    }

    #[test]
    fn loss_weights_must_be_finite_and_positive() {
        let data = self_consistent_cycle_task(16, 4, 8);
        let unembedding = Tensor::eye(16, DType::F32, &Device::Cpu).unwrap();
        for weights in [vec![0.2, 0.0], vec![0.2, -0.1], vec![f32::NAN, 0.2]] {
            let mut config = TrainConfig::new(HeadKind::Chained, 2);
            config.loss_weights = weights;
            let error = train(&data, &unembedding, &config, &mut |_| {})
                .err()
                .unwrap()
                .to_string();
            assert!(error.contains("finite and positive"), "{error}");
        }
        let mut config = TrainConfig::new(HeadKind::Chained, 2);
        config.epochs = 1;
        config.loss_weights = vec![0.2, 0.05];
        assert!(train(&data, &unembedding, &config, &mut |_| {}).is_ok());
    }

    /// The model's next token is a coin toss its state does not tell, and the token after it
    /// follows from that one: only heads that read the next token can guess the one after.
    #[test]
    fn chained_heads_learn_what_follows_the_token_they_read() {
        let vocab = 16;
        let mut rng = StdRng::seed_from_u64(7);
        let mut set = TrainingSet::new(vocab);
        for s in 0..24u32 {
            // Tokens alternate: a random one, then (it + 5) mod 16.
            let tokens: Vec<u32> = (0..21)
                .scan(0u32, |last, i| {
                    *last = match i % 2 {
                        0 => rand::Rng::random_range(&mut rng, 0..vocab as u32),
                        _ => (*last + 5) % vocab as u32,
                    };
                    Some(*last)
                })
                .collect();
            let rows: Vec<f32> = tokens[..20]
                .iter()
                .flat_map(|&t| (0..vocab).map(move |j| if j == t as usize { 1.0 } else { 0.0 }))
                .collect();
            let hidden = Tensor::from_vec(rows, (20, vocab), &Device::Cpu).unwrap();
            set.push(hidden, tokens[1..].to_vec(), s).unwrap();
        }
        let unembedding = (Tensor::eye(vocab, DType::F32, &Device::Cpu).unwrap() * 4.0).unwrap();
        let first_head = |kind: HeadKind| {
            let mut config = TrainConfig::new(kind, 1);
            config.epochs = 40;
            config.batch_size = 32;
            config.learning_rate = 0.05;
            config.validation_fraction = 0.25;
            let trained = train(&set, &unembedding, &config, &mut |_| {}).unwrap();
            trained.reports.last().unwrap().validation_accuracy[0]
        };
        // 9 of every 19 positions are followed by a random token and then its follower: a head
        // that reads the random token can be right there; one that does not, one time in 16.
        let chained = first_head(HeadKind::Chained);
        let latent = first_head(HeadKind::latent());
        assert!(chained > 0.3, "chained {chained}, latent {latent}");
        assert!(latent < 0.15, "chained {chained}, latent {latent}");
    }

    #[test]
    fn saved_heads_load_only_for_their_model() {
        let (data, unembedding) = cycle_task(8, 4, 10);
        let mut config = TrainConfig::new(HeadKind::Projection, 2);
        config.epochs = 1;
        let trained = train(&data, &unembedding, &config, &mut |_| {}).unwrap();
        let dir = tempfile::tempdir().unwrap();
        trained.save(dir.path(), "tiny", "abc123", "test").unwrap();
        // A stand-in model with 8-wide hidden states over 8 tokens.
        let model = MockDecoder::new(MockConfig {
            window: 7,
            ..MockConfig::target(8, 1)
        });
        let heads = MultiTokenHeads::load(dir.path(), &model, "abc123", &Device::Cpu).unwrap();
        assert_eq!(heads.count(), 2);
        assert_eq!(heads.info().trained_for.base_model, "tiny");
        let guesses = heads
            .predict(
                &Tensor::zeros((1, 8), DType::F32, &Device::Cpu).unwrap(),
                0..2,
            )
            .unwrap();
        assert_eq!((guesses.len(), guesses.vocab_size()), (2, 8));
        let err = MultiTokenHeads::load(dir.path(), &model, "fff", &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("trained for `tiny`"), "{err}");
        let wider = MockDecoder::new(MockConfig::target(8, 1));
        assert!(MultiTokenHeads::load(dir.path(), &wider, "abc123", &Device::Cpu).is_err());
        // A shortlist out of order (chained heads find a token's row by binary search).
        let weights = dir.path().join(HEADS_WEIGHTS);
        let mut tensors = candle_core::safetensors::load(&weights, &Device::Cpu).unwrap();
        let mut shortlist: Vec<u32> = tensors["shortlist"].to_vec1().unwrap();
        shortlist.swap(0, 1);
        let n = shortlist.len();
        tensors.insert(
            "shortlist".into(),
            Tensor::from_vec(shortlist, n, &Device::Cpu).unwrap(),
        );
        candle_core::safetensors::save(&tensors, &weights).unwrap();
        let err = MultiTokenHeads::load(dir.path(), &model, "abc123", &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("increasing order"), "{err}");
        std::fs::write(dir.path().join(HEADS_WEIGHTS), b"cut").unwrap();
        assert!(matches!(
            MultiTokenHeads::load(dir.path(), &model, "abc123", &Device::Cpu),
            Err(Error::BadWeights { .. })
        ));
    }

    #[test]
    fn training_sets_round_trip_and_check_shapes() {
        let (data, _) = cycle_task(8, 3, 5);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("set.safetensors");
        data.save(&path).unwrap();
        let back = TrainingSet::load(&path).unwrap();
        assert_eq!((back.len(), back.positions()), (3, 15));
        let mut set = TrainingSet::new(8);
        let hidden = Tensor::zeros((4, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(set.push(hidden, vec![1, 2], 0).is_err());
    }

    #[test]
    fn missing_heads_name_the_command_for_their_variant() {
        assert_eq!(
            training_command("m", "chained-3"),
            "cargo xtask train-heads m --heads 3 --kind chained"
        );
        for odd in ["latent", "big-4", "latent-x"] {
            assert_eq!(
                training_command("m", odd),
                format!(
                    "cargo xtask train-heads m --heads COUNT --kind latent|projection|chained \
                     --variant {odd}"
                )
            );
        }
    }

    #[cfg(feature = "cli")]
    #[test]
    fn a_named_variant_is_written_where_the_benchmarks_look() {
        use clap::Parser;

        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            training: cli::TrainArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(["train"].iter().chain(args));
        assert!(parse(&["--variant", "quick", "--out", "/tmp/heads"]).is_err());
        let cli = parse(&["--kind", "chained", "--heads", "1", "--epochs", "1"]).unwrap();
        assert_eq!(cli.training.config().loss_weights, vec![0.2]);
        let weighted = parse(&["--heads", "3", "--loss-weights", "0.2,0.1,0.05"]).unwrap();
        assert_eq!(
            weighted.training.config().loss_weights,
            vec![0.2, 0.1, 0.05]
        );
        let named = parse(&[
            "--kind",
            "chained",
            "--heads",
            "1",
            "--epochs",
            "1",
            "--variant",
            "chained-1-quick",
        ])
        .unwrap();
        let (data, unembedding) = cycle_task(16, 4, 8);
        let root = tempfile::tempdir().unwrap();
        let save = |cli: &Cli| {
            cli.training
                .train_and_save(&data, &unembedding, root.path(), "m", "f")
                .unwrap()
        };
        assert_eq!(save(&cli), root.path().join("m-chained-1"));
        assert_eq!(save(&named), root.path().join("m-chained-1-quick"));
        assert!(root.path().join("m-chained-1-quick/heads.json").is_file());
    }

    #[test]
    fn fingerprints_tell_files_apart() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, vec![1u8; 300_000]).unwrap();
        let mut other = vec![1u8; 300_000];
        other[150_000] = 2;
        std::fs::write(&b, other).unwrap();
        assert_ne!(
            weights_fingerprint(&a).unwrap(),
            weights_fingerprint(&b).unwrap()
        );
        assert_eq!(
            weights_fingerprint(&a).unwrap(),
            weights_fingerprint(&a).unwrap()
        );
        assert!(weights_fingerprint(&dir.path().join("none")).is_err());
    }
}
