//! Training the heads with the trunk frozen (eq. 11): AdamW on the heads' cross-entropy over
//! cached hidden states, with validation and progress reports.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use spec_nn::heads::{
    expand, unit_rms, HeadKind, HeadsInfo, TrainedFor, HEADS_INFO, HEADS_WEIGHTS,
};
use spec_nn::{Error, Result};

use super::dataset::{ChainExamples, HeadExamples, HeadOutput, TrainingSet};

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
pub(super) struct TrainableHead {
    pub(super) weight: Tensor,
    pub(super) bias: Tensor,
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
pub(super) struct Frozen {
    pub(super) kind: HeadKind,
    /// The shortlist's unembedding rows, `[shortlist, hidden]`.
    pub(super) output: Tensor,
}

/// What the heads learn from: each head's own rows, or positions the chained heads run along.
pub(super) enum Examples {
    /// Per head (a later head has fewer).
    Independent(Vec<HeadExamples>),
    Chained(ChainExamples),
}

impl Examples {
    /// Positions of the first head.
    pub(super) fn rows(&self) -> usize {
        match self {
            Self::Independent(sets) => sets.first().map_or(0, |set| set.targets.len()),
            Self::Chained(set) => set.rows(),
        }
    }

    /// Each head's output at those of `rows` where it has a target, with the model's states
    /// for them when `with_states`.
    pub(super) fn outputs(
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
pub(super) fn head_loss(
    head: &HeadOutput,
    config: &TrainConfig,
    output: &Tensor,
) -> Result<Tensor> {
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
pub(super) fn evaluate(
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
