//! Training an SSD draft (`engine_llm::ssd`; §3.2 of "Speech Speculative Decoding"): the
//! draft's lower layers start as the target's first layers and its head as the target's output
//! rows of the shortlist; both are fitted by AdamW to the target's next-token distributions
//! (cross-entropy against its top tokens' probabilities, [`DistilledSequence`]) with the upper
//! layers, the embeddings and the final norm frozen. The gradient flows through the frozen upper
//! layers, so the forward here runs float copies of the layers, [`TrainableDecoderLayer`] (the
//! inference path runs on quantized kernels, which have no gradients). What a draft trains on,
//! its [`Backbone`] and its [`DistilledSequence`]s, is `engine-llm`'s (a speech LM makes its own
//! in `engine-tts`); errors are `engine_llm::Error`.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Linear, Optimizer, ParamsAdamW};
use engine_llm::load::{layer_tensors, Naming, Part};
use engine_llm::ssd::{draft_layers, Backbone, DistilledSequence, SsdDraftInfo, SsdDraftWeights};
use engine_llm::{Error, Result, TransformerConfig};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use spec_nn::heads::TrainedFor;
use spec_nn::{Heads, Rotary};

use crate::trainable::TrainableDecoderLayer;

/// Settings of [`train`].
#[derive(Clone, Debug, PartialEq)]
pub struct SsdTrainConfig {
    /// Retrained lower layers (the paper: 2).
    pub lower_layers: usize,
    /// The target's upper layers the draft keeps (the paper: 6 of 24).
    pub upper_layers: usize,
    pub epochs: usize,
    pub learning_rate: f64,
    pub weight_decay: f64,
    /// Tokens of the target's distribution kept per position as the training label.
    pub label_top_k: usize,
    /// The head scores the tokens with ids below this and every token of the labels.
    pub shortlist_below: u32,
    /// Share of the sequences held out for validation.
    pub validation_fraction: f32,
    pub seed: u64,
}

impl Default for SsdTrainConfig {
    fn default() -> Self {
        Self {
            lower_layers: 2,
            upper_layers: 6,
            epochs: 2,
            learning_rate: 2e-4,
            weight_decay: 0.0,
            label_top_k: 8,
            shortlist_below: 8192,
            validation_fraction: 0.1,
            seed: 0,
        }
    }
}

/// What [`train`] reports as it goes.
#[derive(Clone, Debug, PartialEq)]
pub enum SsdProgress {
    /// A sequence of `steps` done; its loss.
    Step {
        epoch: usize,
        step: usize,
        steps: usize,
        loss: f32,
    },
    /// The validation figures, before training (`epoch` None) and after each epoch.
    Validation(ValidationReport),
}

/// The draft on the held-out sequences.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidationReport {
    pub epoch: Option<usize>,
    /// Mean cross-entropy against the target's labels.
    pub loss: f32,
    /// How often the draft's top token is the target's.
    pub agreement: f32,
    /// Mean Σ min(p, q) over the labelled tokens: a lower bound of the probability that
    /// speculative sampling (β = 0, temperature 1) accepts a drafted token.
    pub overlap: f32,
}

impl std::fmt::Display for ValidationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.epoch {
            Some(e) => write!(f, "epoch {}: ", e + 1)?,
            None => write!(f, "untrained: ")?,
        }
        write!(
            f,
            "validation loss {:.3}, top-1 agreement {:.1} %, overlap {:.1} %",
            self.loss,
            100.0 * self.agreement,
            100.0 * self.overlap
        )
    }
}

/// A trained draft, before it is named and saved.
#[derive(Clone, Debug)]
pub struct TrainedDraft {
    pub lower_layers: usize,
    pub upper_layers: usize,
    pub layers: HashMap<String, Tensor>,
    pub head: Tensor,
    pub head_bias: Option<Tensor>,
    pub shortlist: Vec<u32>,
    /// Validation before training, then after each epoch.
    pub reports: Vec<ValidationReport>,
}

impl TrainedDraft {
    /// The draft's weights, recorded as trained for `base_model` (whose weights file has
    /// `base_fingerprint`) by `command`; `config` is the backbone's, `classes` its outputs'.
    pub fn into_weights(
        self,
        config: &TransformerConfig,
        classes: usize,
        base_model: &str,
        base_fingerprint: &str,
        command: &str,
    ) -> SsdDraftWeights {
        let agreement = |r: Option<&ValidationReport>| r.map_or(0.0, |r| r.agreement);
        SsdDraftWeights {
            info: SsdDraftInfo {
                lower_layers: self.lower_layers,
                upper_layers: self.upper_layers,
                hidden_size: config.hidden_size,
                vocab_size: classes,
                shortlist_size: self.shortlist.len(),
                trained_for: TrainedFor {
                    base_model: base_model.into(),
                    base_fingerprint: base_fingerprint.into(),
                    command: command.into(),
                },
                untrained_agreement: agreement(self.reports.first()),
                validation_agreement: agreement(self.reports.last()),
            },
            layers: self.layers,
            head: self.head,
            head_bias: self.head_bias,
            shortlist: self.shortlist,
        }
    }
}

/// A wrapper of tensors by name: makes the trained layers' tensors variables.
type Wrap<'a> = dyn FnMut(&str, &Tensor) -> Result<Tensor> + 'a;

/// Layer `i` of `tensors` (Hugging Face names) as a differentiable float layer, each tensor
/// passed through `wrap`.
fn trainable_layer(
    tensors: &HashMap<String, Tensor>,
    i: usize,
    config: &TransformerConfig,
    wrap: &mut Wrap<'_>,
) -> Result<TrainableDecoderLayer> {
    let mut linear = |part: Part| -> Result<Linear> {
        let weight = required(tensors, i, part, wrap)?;
        Ok(Linear::new(weight, take(tensors, i, part, "bias", wrap)?))
    };
    let (q, k, v, o) = (
        linear(Part::Query)?,
        linear(Part::Key)?,
        linear(Part::Value)?,
        linear(Part::Output)?,
    );
    let (gate, up, down) = (linear(Part::Gate)?, linear(Part::Up)?, linear(Part::Down)?);
    Ok(TrainableDecoderLayer {
        q,
        k,
        v,
        o,
        gate,
        up,
        down,
        attention_norm: required(tensors, i, Part::AttentionNorm, wrap)?,
        ffn_norm: required(tensors, i, Part::FfnNorm, wrap)?,
        heads: Heads::new(config.num_heads, config.num_kv_heads, config.head_dim)?,
        eps: config.rms_norm_eps as f32,
    })
}

fn take(
    tensors: &HashMap<String, Tensor>,
    i: usize,
    part: Part,
    suffix: &str,
    wrap: &mut Wrap<'_>,
) -> Result<Option<Tensor>> {
    let name = Naming::HuggingFace.layer(i, part, suffix);
    tensors.get(&name).map(|t| wrap(&name, t)).transpose()
}

fn required(
    tensors: &HashMap<String, Tensor>,
    i: usize,
    part: Part,
    wrap: &mut Wrap<'_>,
) -> Result<Tensor> {
    take(tensors, i, part, "weight", wrap)?.ok_or_else(|| {
        Error::Config(format!(
            "no {}",
            Naming::HuggingFace.layer(i, part, "weight")
        ))
    })
}

/// The draft during training: trainable lower layers and head, frozen upper layers.
struct Trainee<'a, 'b> {
    config: &'a TransformerConfig,
    backbone: &'a Backbone<'b>,
    rotary: Rotary,
    layers: Vec<TrainableDecoderLayer>,
    final_norm: Tensor,
    head: Tensor,
    head_bias: Option<Tensor>,
}

impl Trainee<'_, '_> {
    /// The head's logits `[tokens.len() − first, shortlist]` at positions `first..`.
    fn logits(&self, tokens: &[u32], first: usize) -> Result<Tensor> {
        let device = Device::Cpu;
        let n = tokens.len();
        let mut x = (self.backbone.embed)(tokens)?
            .to_dtype(DType::F32)?
            .to_device(&device)?;
        let positions: Vec<usize> = (0..n).collect();
        let rotary = self.rotary.tables(&positions)?;
        for layer in &self.layers {
            x = layer.forward(&x, &rotary)?;
        }
        let h = candle_nn::ops::rms_norm_slow(
            &x.narrow(0, first, n - first)?,
            &self.final_norm,
            self.config.rms_norm_eps as f32,
        )?;
        let logits = h.matmul(&self.head.t()?)?;
        Ok(match &self.head_bias {
            Some(bias) => logits.broadcast_add(bias)?,
            None => logits,
        })
    }
}

/// A sequence's labels as a dense `[positions, shortlist]` target distribution (labelled
/// tokens outside the shortlist dropped, the rest renormalized), and the target's top token's
/// column per position (`None` when not shortlisted).
fn dense_labels(
    sequence: &DistilledSequence,
    column: &HashMap<u32, usize>,
    width: usize,
) -> Result<(Tensor, Vec<Option<usize>>)> {
    let rows = sequence.labels.len();
    let mut dense = vec![0f32; rows * width];
    let mut top = Vec::with_capacity(rows);
    for (row, labels) in dense.chunks_exact_mut(width).zip(&sequence.labels) {
        let mut mass = 0.0;
        for &(token, p) in labels {
            if let Some(&c) = column.get(&token) {
                row[c] = p;
                mass += p;
            }
        }
        if mass > 0.0 {
            row.iter_mut().for_each(|v| *v /= mass);
        }
        top.push(labels.first().and_then(|(t, _)| column.get(t).copied()));
    }
    Ok((Tensor::from_vec(dense, (rows, width), &Device::Cpu)?, top))
}

/// Trains an SSD draft of `backbone` on `data` (see the module docs). Deterministic for a seed.
pub fn train(
    backbone: &Backbone<'_>,
    data: &[DistilledSequence],
    config: &SsdTrainConfig,
    on_progress: &mut dyn FnMut(&SsdProgress),
) -> Result<TrainedDraft> {
    let target = backbone.model;
    let model_config = target.config();
    let layer_ids = draft_layers(
        model_config.num_layers,
        config.lower_layers,
        config.upper_layers,
    )?;
    if data.len() < 2 || config.label_top_k == 0 {
        return Err(Error::Input(format!(
            "training an SSD draft needs at least two sequences (one for validation) and \
             labels; got {} sequences, top {}",
            data.len(),
            config.label_top_k
        )));
    }
    if let Some((i, s)) = data
        .iter()
        .enumerate()
        .find(|(_, s)| s.first >= s.tokens.len() || s.labels.len() != s.tokens.len() - s.first)
    {
        return Err(Error::Input(format!(
            "training sequence {i} has {} tokens, labels from position {} and {} label lists \
             (one per position from `first` to the end is needed)",
            s.tokens.len(),
            s.first,
            s.labels.len()
        )));
    }
    let vocab = backbone.classes;
    if let Some(bad) = data
        .iter()
        .flat_map(|s| s.labels.iter().flatten().map(|(t, _)| t))
        .find(|&&t| t as usize >= vocab)
    {
        return Err(Error::Input(format!(
            "label {bad} in the training data of a model with {vocab} output classes"
        )));
    }
    let device = Device::Cpu;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut order: Vec<usize> = (0..data.len()).collect();
    order.shuffle(&mut rng);
    let held_out = ((data.len() as f32 * config.validation_fraction).round() as usize)
        .clamp(1, data.len() - 1);
    let (validation, training) = order.split_at(held_out);

    // The shortlist: low ids and every label of the training sequences.
    let mut listed = vec![false; vocab];
    listed[..(config.shortlist_below as usize).min(vocab)].fill(true);
    for &i in training {
        for &(token, _) in data[i].labels.iter().flatten() {
            listed[token as usize] = true;
        }
    }
    let shortlist: Vec<u32> = (0..vocab as u32).filter(|&t| listed[t as usize]).collect();
    let column: HashMap<u32, usize> = shortlist.iter().enumerate().map(|(c, &t)| (t, c)).collect();

    // Variables: the lower layers (as layers 0..lower) and the head; frozen copies of the rest.
    let mut vars: Vec<Var> = Vec::new();
    let mut lower_names: Vec<(String, usize)> = Vec::new();
    let mut layers = Vec::with_capacity(layer_ids.len());
    for (position, &id) in layer_ids.iter().enumerate() {
        let tensors = layer_tensors(target.layer(id), position, &device)?;
        let trained = position < config.lower_layers;
        let mut wrap = |name: &str, t: &Tensor| -> Result<Tensor> {
            if trained {
                let var = Var::from_tensor(&t.to_dtype(DType::F32)?)?;
                let tensor = var.as_tensor().clone();
                lower_names.push((name.to_string(), vars.len()));
                vars.push(var);
                Ok(tensor)
            } else {
                Ok(t.to_dtype(DType::F32)?)
            }
        };
        layers.push(trainable_layer(
            &tensors,
            position,
            model_config,
            &mut wrap,
        )?);
    }
    let head = Var::from_tensor(
        &(backbone.output_rows)(&shortlist)?
            .to_dtype(DType::F32)?
            .to_device(&device)?,
    )?;
    let head_bias = match &backbone.output_bias {
        Some(bias) => {
            let index = Tensor::from_slice(&shortlist, shortlist.len(), bias.device())?;
            let picked = bias.index_select(&index, 0)?.to_dtype(DType::F32)?;
            Some(Var::from_tensor(&picked.to_device(&device)?)?)
        }
        None => None,
    };
    let trainee = Trainee {
        config: model_config,
        backbone,
        rotary: Rotary::new(
            model_config.rope_inverse_frequencies(),
            model_config.rope_layout,
            &device,
        )?,
        layers,
        final_norm: target.final_norm().weight().to_dtype(DType::F32)?,
        head: head.as_tensor().clone(),
        head_bias: head_bias.as_ref().map(|b| b.as_tensor().clone()),
    };
    vars.push(head.clone());
    vars.extend(head_bias.clone());
    let mut optimizer = AdamW::new(
        vars.clone(),
        ParamsAdamW {
            lr: config.learning_rate,
            weight_decay: config.weight_decay,
            ..Default::default()
        },
    )?;

    let width = shortlist.len();
    let validate = |epoch: Option<usize>| -> Result<ValidationReport> {
        let (mut loss, mut agree, mut overlap, mut positions) = (0f64, 0usize, 0f64, 0usize);
        for &i in validation {
            let sequence = &data[i];
            let logits = trainee.logits(&sequence.tokens, sequence.first)?.detach();
            let (labels, top) = dense_labels(sequence, &column, width)?;
            let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            loss -= f64::from((&labels * &log_p)?.sum_all()?.to_scalar::<f32>()?);
            let p = log_p.exp()?;
            overlap += f64::from(labels.minimum(&p)?.sum_all()?.to_scalar::<f32>()?);
            let best = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            agree += best
                .iter()
                .zip(&top)
                .filter(|(b, t)| Some(**b as usize) == **t)
                .count();
            positions += top.len();
        }
        let positions = positions.max(1) as f64;
        Ok(ValidationReport {
            epoch,
            loss: (loss / positions) as f32,
            agreement: (agree as f64 / positions) as f32,
            overlap: (overlap / positions) as f32,
        })
    };
    let mut reports = vec![validate(None)?];
    on_progress(&SsdProgress::Validation(reports[0].clone()));
    let mut training = training.to_vec();
    for epoch in 0..config.epochs {
        training.shuffle(&mut rng);
        for (step, &i) in training.iter().enumerate() {
            let sequence = &data[i];
            let logits = trainee.logits(&sequence.tokens, sequence.first)?;
            let (labels, _) = dense_labels(sequence, &column, width)?;
            let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let loss = ((&labels * &log_p)?.sum_all()?.neg()? / labels.dim(0)? as f64)?;
            optimizer.backward_step(&loss)?;
            on_progress(&SsdProgress::Step {
                epoch,
                step,
                steps: training.len(),
                loss: loss.to_scalar::<f32>()?,
            });
        }
        let report = validate(Some(epoch))?;
        on_progress(&SsdProgress::Validation(report.clone()));
        reports.push(report);
    }
    let layers = lower_names
        .into_iter()
        .map(|(name, v)| (name, vars[v].as_tensor().detach()))
        .collect();
    Ok(TrainedDraft {
        lower_layers: config.lower_layers,
        upper_layers: config.upper_layers,
        layers,
        head: head.as_tensor().detach(),
        head_bias: head_bias.map(|b| b.as_tensor().detach()),
        shortlist,
        reports,
    })
}
