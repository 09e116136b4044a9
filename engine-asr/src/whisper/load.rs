//! Whisper weights from a model folder: CTranslate2's `model.bin` (faster-whisper's format:
//! fused query/key/value projections, split here) or Hugging Face's `model.safetensors` with
//! its `config.json`. Every tensor is checked against the configuration's shape.

use std::path::{Path, PathBuf};

use candle_core::Device;
use spec_nn::{
    CrossAttention, Ct2File, GeluMlp, Heads, LearnedPositions, Linear, Norm, Requantize,
    SafetensorsFiles, SelfAttention, WeightLoader, WeightSource,
};

use crate::whisper::config::WhisperConfig;
use crate::whisper::model::{DecoderLayer, Encoder, EncoderLayer, TextDecoder, Whisper};
use crate::{Error, Result};

/// Whisper's LayerNorm epsilon.
const LAYER_NORM_EPS: f32 = 1e-5;

/// How a model is loaded.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Matrix formats. The default (Q8_0 on `spec-kernels`) keeps verification bit-identical to
    /// decoding; `Requantize::Dense(GgmlDType::Q4_0)` is smaller and faster; `Keep` runs the
    /// stored precision on candle's matmuls (not batch-invariant).
    pub requantize: Requantize,
    pub device: Device,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            requantize: Requantize::default(),
            device: Device::Cpu,
        }
    }
}

/// The files of a model folder in one of the two supported layouts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelFiles {
    /// `model.bin` (CTranslate2).
    Ct2 { model: PathBuf },
    /// `model.safetensors` and `config.json` (Hugging Face).
    HuggingFace { weights: PathBuf, config: PathBuf },
}

impl ModelFiles {
    /// Finds the weights in `folder`.
    pub fn find(folder: &Path) -> Result<Self> {
        let model = folder.join("model.bin");
        let weights = folder.join("model.safetensors");
        let config = folder.join("config.json");
        if model.is_file() {
            Ok(Self::Ct2 { model })
        } else if weights.is_file() && config.is_file() {
            Ok(Self::HuggingFace { weights, config })
        } else {
            Err(Error::Config(format!(
                "{} holds neither a CTranslate2 `model.bin` nor `model.safetensors` with `config.json`",
                folder.display()
            )))
        }
    }
}

pub(crate) fn load(folder: &Path, options: &LoadOptions) -> Result<Whisper> {
    let device = &options.device;
    match ModelFiles::find(folder)? {
        ModelFiles::Ct2 { model } => {
            let mut file = Ct2File::open(&model)?;
            let config = WhisperConfig::from_ct2(&mut file)?;
            let loader = WeightLoader::new(file, device, options.requantize);
            build(loader, config, &Ct2Names, device)
        }
        ModelFiles::HuggingFace { weights, config } => {
            let config = WhisperConfig::from_hf_json(&config)?;
            let source = SafetensorsFiles::open(&[weights], device)?;
            let loader = WeightLoader::new(source, device, options.requantize);
            build(loader, config, &HuggingFaceNames, device)
        }
    }
}

/// Where a checkpoint layout keeps each tensor.
trait Names {
    /// The tensor `leaf` (`weight`, `bias`) of the block at `base`.
    fn param(&self, base: &str, leaf: &str) -> String;
    fn conv(&self, index: usize) -> String;
    fn positions(&self, stack: Stack) -> String;
    fn embeddings(&self) -> String;
    /// A norm's weight and bias.
    fn norm(&self, stack: Stack, layer: Option<usize>, which: NormSite) -> (String, String);
    fn mlp(&self, stack: Stack, layer: usize) -> (String, String);
    /// Query, key, value and output projections of an attention block.
    fn attention<S: WeightSource>(
        &self,
        loader: &mut WeightLoader<S>,
        stack: Stack,
        layer: usize,
        cross: bool,
        hidden: usize,
    ) -> Result<[Linear; 4]>;
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stack {
    Encoder,
    Decoder,
}

#[derive(Clone, Copy)]
enum NormSite {
    SelfAttention,
    CrossAttention,
    Mlp,
    Final,
}

struct Ct2Names;

impl Ct2Names {
    fn stack(stack: Stack) -> &'static str {
        match stack {
            Stack::Encoder => "encoder",
            Stack::Decoder => "decoder",
        }
    }
}

impl Names for Ct2Names {
    fn param(&self, base: &str, leaf: &str) -> String {
        format!("{base}/{leaf}")
    }

    fn conv(&self, index: usize) -> String {
        format!("encoder/conv{index}")
    }

    fn positions(&self, stack: Stack) -> String {
        format!("{}/position_encodings/encodings", Self::stack(stack))
    }

    fn embeddings(&self) -> String {
        "decoder/embeddings/weight".into()
    }

    fn norm(&self, stack: Stack, layer: Option<usize>, which: NormSite) -> (String, String) {
        let s = Self::stack(stack);
        let base = match (layer, which) {
            (Some(i), NormSite::SelfAttention) => {
                format!("{s}/layer_{i}/self_attention/layer_norm")
            }
            (Some(i), NormSite::CrossAttention) => format!("{s}/layer_{i}/attention/layer_norm"),
            (Some(i), NormSite::Mlp) => format!("{s}/layer_{i}/ffn/layer_norm"),
            (_, _) => format!("{s}/layer_norm"),
        };
        (format!("{base}/gamma"), format!("{base}/beta"))
    }

    fn mlp(&self, stack: Stack, layer: usize) -> (String, String) {
        let base = format!("{}/layer_{layer}/ffn", Self::stack(stack));
        (format!("{base}/linear_0"), format!("{base}/linear_1"))
    }

    fn attention<S: WeightSource>(
        &self,
        loader: &mut WeightLoader<S>,
        stack: Stack,
        layer: usize,
        cross: bool,
        hidden: usize,
    ) -> Result<[Linear; 4]> {
        let s = Self::stack(stack);
        let part = |name: &str| (format!("{name}/weight"), format!("{name}/bias"));
        if cross {
            // linear_0: query; linear_1: key and value fused; linear_2: output.
            let base = format!("{s}/layer_{layer}/attention");
            let (qw, qb) = part(&format!("{base}/linear_0"));
            let (kvw, kvb) = part(&format!("{base}/linear_1"));
            let (ow, ob) = part(&format!("{base}/linear_2"));
            let q = loader.linear(&qw, Some(&qb), [hidden, hidden])?;
            let [k, v] = two(loader.split_linear(&kvw, Some(&kvb), &[hidden, hidden], hidden)?);
            let o = loader.linear(&ow, Some(&ob), [hidden, hidden])?;
            Ok([q, k, v, o])
        } else {
            // linear_0: query, key and value fused; linear_1: output.
            let base = format!("{s}/layer_{layer}/self_attention");
            let (qkvw, qkvb) = part(&format!("{base}/linear_0"));
            let (ow, ob) = part(&format!("{base}/linear_1"));
            let parts = loader.split_linear(&qkvw, Some(&qkvb), &[hidden; 3], hidden)?;
            let [q, k, v] = three(parts);
            let o = loader.linear(&ow, Some(&ob), [hidden, hidden])?;
            Ok([q, k, v, o])
        }
    }
}

fn two(parts: Vec<Linear>) -> [Linear; 2] {
    parts
        .try_into()
        .unwrap_or_else(|_| unreachable!("split into two parts"))
}

fn three(parts: Vec<Linear>) -> [Linear; 3] {
    parts
        .try_into()
        .unwrap_or_else(|_| unreachable!("split into three parts"))
}

struct HuggingFaceNames;

impl HuggingFaceNames {
    fn stack(stack: Stack) -> &'static str {
        match stack {
            Stack::Encoder => "model.encoder",
            Stack::Decoder => "model.decoder",
        }
    }
}

impl Names for HuggingFaceNames {
    fn param(&self, base: &str, leaf: &str) -> String {
        format!("{base}.{leaf}")
    }

    fn conv(&self, index: usize) -> String {
        format!("model.encoder.conv{index}")
    }

    fn positions(&self, stack: Stack) -> String {
        format!("{}.embed_positions.weight", Self::stack(stack))
    }

    fn embeddings(&self) -> String {
        "model.decoder.embed_tokens.weight".into()
    }

    fn norm(&self, stack: Stack, layer: Option<usize>, which: NormSite) -> (String, String) {
        let s = Self::stack(stack);
        let base = match (layer, which) {
            (Some(i), NormSite::SelfAttention) => format!("{s}.layers.{i}.self_attn_layer_norm"),
            (Some(i), NormSite::CrossAttention) => {
                format!("{s}.layers.{i}.encoder_attn_layer_norm")
            }
            (Some(i), NormSite::Mlp) => format!("{s}.layers.{i}.final_layer_norm"),
            (_, _) => format!("{s}.layer_norm"),
        };
        (format!("{base}.weight"), format!("{base}.bias"))
    }

    fn mlp(&self, stack: Stack, layer: usize) -> (String, String) {
        let base = format!("{}.layers.{layer}", Self::stack(stack));
        (format!("{base}.fc1"), format!("{base}.fc2"))
    }

    fn attention<S: WeightSource>(
        &self,
        loader: &mut WeightLoader<S>,
        stack: Stack,
        layer: usize,
        cross: bool,
        hidden: usize,
    ) -> Result<[Linear; 4]> {
        let block = if cross { "encoder_attn" } else { "self_attn" };
        let base = format!("{}.layers.{layer}.{block}", Self::stack(stack));
        let mut projection = |name: &str, bias: bool| {
            let weight = format!("{base}.{name}.weight");
            let bias = bias.then(|| format!("{base}.{name}.bias"));
            loader.linear(&weight, bias.as_deref(), [hidden, hidden])
        };
        // Whisper's key projections have no bias.
        Ok([
            projection("q_proj", true)?,
            projection("k_proj", false)?,
            projection("v_proj", true)?,
            projection("out_proj", true)?,
        ])
    }
}

fn build<S: WeightSource>(
    mut loader: WeightLoader<S>,
    config: WhisperConfig,
    names: &impl Names,
    device: &Device,
) -> Result<Whisper> {
    let hidden = config.hidden_size;
    let norm = |loader: &mut WeightLoader<S>, stack, layer, site| -> Result<Norm> {
        let (weight, bias) = names.norm(stack, layer, site);
        Ok(Norm::layer(
            loader.dense(&weight, &[hidden])?,
            loader.dense(&bias, &[hidden])?,
            LAYER_NORM_EPS,
        ))
    };
    let mlp = |loader: &mut WeightLoader<S>, stack, layer, ffn: usize| -> Result<GeluMlp> {
        let (fc1, fc2) = names.mlp(stack, layer);
        Ok(GeluMlp {
            fc1: loader.linear(
                &names.param(&fc1, "weight"),
                Some(&names.param(&fc1, "bias")),
                [ffn, hidden],
            )?,
            fc2: loader.linear(
                &names.param(&fc2, "weight"),
                Some(&names.param(&fc2, "bias")),
                [hidden, ffn],
            )?,
        })
    };
    let cross_attention = |loader: &mut WeightLoader<S>, stack, layer, cross, heads| {
        let [q, k, v, o] = names.attention(loader, stack, layer, cross, hidden)?;
        Ok::<_, Error>(CrossAttention {
            q,
            k,
            v,
            o,
            heads: Heads::new(heads, heads, hidden / heads)?,
        })
    };
    let conv = |loader: &mut WeightLoader<S>, index: usize, inputs: usize| -> Result<_> {
        let base = names.conv(index);
        Ok((
            loader.dense(&names.param(&base, "weight"), &[hidden, inputs, 3])?,
            loader.dense(&names.param(&base, "bias"), &[hidden])?,
        ))
    };

    let encoder_heads = config.encoder_attention_heads;
    let encoder = Encoder {
        conv1: conv(&mut loader, 1, config.n_mels)?,
        conv2: conv(&mut loader, 2, hidden)?,
        positions: loader.dense(
            &names.positions(Stack::Encoder),
            &[config.max_source_positions, hidden],
        )?,
        layers: (0..config.encoder_layers)
            .map(|i| {
                Ok(EncoderLayer {
                    attention_norm: norm(
                        &mut loader,
                        Stack::Encoder,
                        Some(i),
                        NormSite::SelfAttention,
                    )?,
                    attention: cross_attention(
                        &mut loader,
                        Stack::Encoder,
                        i,
                        false,
                        encoder_heads,
                    )?,
                    mlp_norm: norm(&mut loader, Stack::Encoder, Some(i), NormSite::Mlp)?,
                    mlp: mlp(&mut loader, Stack::Encoder, i, config.encoder_ffn_dim)?,
                })
            })
            .collect::<Result<_>>()?,
        final_norm: norm(&mut loader, Stack::Encoder, None, NormSite::Final)?,
    };

    let decoder_heads = config.decoder_attention_heads;
    let head_dim = hidden / decoder_heads;
    let decoder = TextDecoder {
        embeddings: loader.matrix(&names.embeddings(), [config.vocab_size, hidden])?,
        positions: LearnedPositions::new(loader.dense(
            &names.positions(Stack::Decoder),
            &[config.max_target_positions, hidden],
        )?)?,
        layers: (0..config.decoder_layers)
            .map(|i| {
                let self_attention_norm = norm(
                    &mut loader,
                    Stack::Decoder,
                    Some(i),
                    NormSite::SelfAttention,
                )?;
                let [q, k, v, o] =
                    names.attention(&mut loader, Stack::Decoder, i, false, hidden)?;
                Ok(DecoderLayer {
                    self_attention_norm,
                    self_attention: SelfAttention {
                        q,
                        k,
                        v,
                        o,
                        heads: Heads::new(decoder_heads, decoder_heads, head_dim)?,
                    },
                    cross_attention_norm: norm(
                        &mut loader,
                        Stack::Decoder,
                        Some(i),
                        NormSite::CrossAttention,
                    )?,
                    cross_attention: cross_attention(
                        &mut loader,
                        Stack::Decoder,
                        i,
                        true,
                        decoder_heads,
                    )?,
                    mlp_norm: norm(&mut loader, Stack::Decoder, Some(i), NormSite::Mlp)?,
                    mlp: mlp(&mut loader, Stack::Decoder, i, config.decoder_ffn_dim)?,
                })
            })
            .collect::<Result<_>>()?,
        final_norm: norm(&mut loader, Stack::Decoder, None, NormSite::Final)?,
    };
    Ok(Whisper::new(config, encoder, decoder, device))
}
