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
    /// The decoder's matrix formats. The default (Q8_0 on `spec-kernels`) keeps verification
    /// bit-identical to decoding; `Requantize::Dense(GgmlDType::Q4_0)` is smaller and faster;
    /// `Keep` runs the stored precision on candle's matmuls (not batch-invariant).
    pub requantize: Requantize,
    /// The encoder's matrix formats. Its products have 1500 rows, where dense f32 matrix
    /// products are faster than the quantized kernels (and exact); the default keeps them.
    pub encoder_requantize: Requantize,
    pub device: Device,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            requantize: Requantize::default(),
            encoder_requantize: Requantize::Keep,
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

impl ModelFiles {
    /// The weights file.
    pub fn weights(&self) -> &Path {
        match self {
            Self::Ct2 { model } => model,
            Self::HuggingFace { weights, .. } => weights,
        }
    }
}

/// The fingerprint of a model folder's weights file, which heads trained for it record
/// ([`spec_nn::heads::weights_fingerprint`]).
pub fn model_fingerprint(folder: &Path) -> Result<String> {
    Ok(spec_nn::heads::weights_fingerprint(
        ModelFiles::find(folder)?.weights(),
    )?)
}

pub(crate) fn load(folder: &Path, options: &LoadOptions) -> Result<Whisper> {
    let mut model = load_weights(folder, options)?;
    if let Some(heads) = crate::whisper::config::read_alignment_heads(folder)? {
        model.set_alignment_heads(heads)?;
    }
    Ok(model)
}

/// The model of `folder` without its alignment heads (the default ones).
fn load_weights(folder: &Path, options: &LoadOptions) -> Result<Whisper> {
    let device = &options.device;
    match ModelFiles::find(folder)? {
        ModelFiles::Ct2 { model } => {
            let mut file = Ct2File::open(&model)?;
            let config = WhisperConfig::from_ct2(&mut file)?;
            let loader = WeightLoader::new(file, device, options.requantize);
            build(loader, config, &Names::CT2, options)
        }
        ModelFiles::HuggingFace { weights, config } => {
            let config = WhisperConfig::from_hf_json(&config)?;
            let source = SafetensorsFiles::open(&[weights], device)?;
            let loader = WeightLoader::new(source, device, options.requantize);
            build(loader, config, &Names::HUGGING_FACE, options)
        }
    }
}

/// Tensors stored whole under both names: CTranslate2's and Hugging Face's.
pub(crate) const CT2_DIRECT_TENSORS: [(&str, &str); 7] = [
    ("encoder/conv1/weight", "model.encoder.conv1.weight"),
    ("encoder/conv1/bias", "model.encoder.conv1.bias"),
    ("encoder/conv2/weight", "model.encoder.conv2.weight"),
    ("encoder/conv2/bias", "model.encoder.conv2.bias"),
    (
        "encoder/position_encodings/encodings",
        "model.encoder.embed_positions.weight",
    ),
    (
        "decoder/embeddings/weight",
        "model.decoder.embed_tokens.weight",
    ),
    (
        "decoder/position_encodings/encodings",
        "model.decoder.embed_positions.weight",
    ),
];

/// Every tensor of a model folder in f32 under Hugging Face's names, CTranslate2's fused
/// projections split (the key projections' zero biases dropped): for other implementations
/// of Whisper (candle-transformers' in the benchmark) to run the very same weights.
pub fn hugging_face_tensors(
    folder: &Path,
    device: &Device,
) -> Result<(
    WhisperConfig,
    std::collections::HashMap<String, candle_core::Tensor>,
)> {
    let model = match ModelFiles::find(folder)? {
        ModelFiles::HuggingFace { weights, config } => {
            let config = WhisperConfig::from_hf_json(&config)?;
            let tensors = candle_core::safetensors::load(&weights, device)?
                .into_iter()
                .map(|(name, t)| Ok((name, t.to_dtype(candle_core::DType::F32)?)))
                .collect::<Result<_>>()?;
            return Ok((config, tensors));
        }
        ModelFiles::Ct2 { model } => model,
    };
    let mut file = Ct2File::open(&model)?;
    let config = WhisperConfig::from_ct2(&mut file)?;
    let hidden = config.hidden_size;
    let mut out = std::collections::HashMap::new();
    let read = |file: &mut Ct2File, name: &str| -> Result<candle_core::Tensor> {
        Ok(file.tensor(name, device)?.into_f32(device)?)
    };
    for (ct2, hf) in CT2_DIRECT_TENSORS {
        out.insert(hf.to_string(), read(&mut file, ct2)?);
    }
    for (stack, layers) in [
        (Stack::Encoder, config.encoder_layers),
        (Stack::Decoder, config.decoder_layers),
    ] {
        let (hf_stack, ct2_stack) = (Names::HUGGING_FACE.stack(stack), Names::CT2.stack(stack));
        let (w, b) = Names::CT2.norm(stack, None, NormSite::Final);
        let (hw, hb) = Names::HUGGING_FACE.norm(stack, None, NormSite::Final);
        out.insert(hw, read(&mut file, &w)?);
        out.insert(hb, read(&mut file, &b)?);
        for i in 0..layers {
            let mut sites = vec![NormSite::SelfAttention, NormSite::Mlp];
            if stack == Stack::Decoder {
                sites.push(NormSite::CrossAttention);
            }
            for site in sites {
                let (w, b) = Names::CT2.norm(stack, Some(i), site);
                let (hw, hb) = Names::HUGGING_FACE.norm(stack, Some(i), site);
                out.insert(hw, read(&mut file, &w)?);
                out.insert(hb, read(&mut file, &b)?);
            }
            let (fc1, fc2) = Names::CT2.mlp(stack, i);
            let (hf1, hf2) = Names::HUGGING_FACE.mlp(stack, i);
            for (c, h) in [(fc1, hf1), (fc2, hf2)] {
                out.insert(
                    format!("{h}.weight"),
                    read(&mut file, &format!("{c}/weight"))?,
                );
                out.insert(format!("{h}.bias"), read(&mut file, &format!("{c}/bias"))?);
            }
            let hf_layer = format!("{hf_stack}.layers.{i}");
            let ct2_layer = format!("{ct2_stack}/layer_{i}");
            let mut split =
                |file: &mut Ct2File, fused: &str, parts: &[&str], block: &str| -> Result<()> {
                    let weight = read(file, &format!("{fused}/weight"))?;
                    let bias = read(file, &format!("{fused}/bias"))?;
                    for (j, part) in parts.iter().enumerate() {
                        let name = format!("{hf_layer}.{block}.{part}");
                        out.insert(
                            format!("{name}.weight"),
                            weight.narrow(0, j * hidden, hidden)?,
                        );
                        if *part != "k_proj" {
                            out.insert(format!("{name}.bias"), bias.narrow(0, j * hidden, hidden)?);
                        }
                    }
                    Ok(())
                };
            let attention = format!("{ct2_layer}/self_attention");
            split(
                &mut file,
                &format!("{attention}/linear_0"),
                &["q_proj", "k_proj", "v_proj"],
                "self_attn",
            )?;
            split(
                &mut file,
                &format!("{attention}/linear_1"),
                &["out_proj"],
                "self_attn",
            )?;
            if stack == Stack::Decoder {
                let cross = format!("{ct2_layer}/attention");
                split(
                    &mut file,
                    &format!("{cross}/linear_0"),
                    &["q_proj"],
                    "encoder_attn",
                )?;
                split(
                    &mut file,
                    &format!("{cross}/linear_1"),
                    &["k_proj", "v_proj"],
                    "encoder_attn",
                )?;
                split(
                    &mut file,
                    &format!("{cross}/linear_2"),
                    &["out_proj"],
                    "encoder_attn",
                )?;
            }
        }
    }
    Ok((config, out))
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

/// Where a checkpoint layout keeps each tensor: CTranslate2's converted models
/// ([`Names::CT2`]) or Hugging Face's `WhisperForConditionalGeneration` ([`Names::HUGGING_FACE`]).
struct Names {
    /// Between the parts of a name.
    separator: &'static str,
    /// The encoder's and the decoder's prefixes.
    stacks: [&'static str; 2],
    /// Before a layer's index.
    layer: &'static str,
    /// The norms before self-attention, cross-attention and the MLP (in a layer), and the
    /// stack's final norm.
    norms: [&'static str; 4],
    /// A norm's weight and bias.
    norm_params: [&'static str; 2],
    /// The MLP's two projections, in a layer.
    mlp: [&'static str; 2],
    /// The input convolutions, in the encoder (before their 1-based index).
    conv: &'static str,
    /// The position table, in a stack.
    positions: &'static str,
    /// The token embeddings, in the decoder.
    embeddings: &'static str,
    /// Whether attention's projections are fused (query, key and value in self-attention;
    /// key and value in cross-attention) as CTranslate2 stores them.
    fused_attention: bool,
}

impl Names {
    const CT2: Names = Names {
        separator: "/",
        stacks: ["encoder", "decoder"],
        layer: "layer_",
        norms: [
            "self_attention/layer_norm",
            "attention/layer_norm",
            "ffn/layer_norm",
            "layer_norm",
        ],
        norm_params: ["gamma", "beta"],
        mlp: ["ffn/linear_0", "ffn/linear_1"],
        conv: "conv",
        positions: "position_encodings/encodings",
        embeddings: "embeddings/weight",
        fused_attention: true,
    };

    const HUGGING_FACE: Names = Names {
        separator: ".",
        stacks: ["model.encoder", "model.decoder"],
        layer: "layers.",
        norms: [
            "self_attn_layer_norm",
            "encoder_attn_layer_norm",
            "final_layer_norm",
            "layer_norm",
        ],
        norm_params: ["weight", "bias"],
        mlp: ["fc1", "fc2"],
        conv: "conv",
        positions: "embed_positions.weight",
        embeddings: "embed_tokens.weight",
        fused_attention: false,
    };

    fn stack(&self, stack: Stack) -> &'static str {
        self.stacks[stack as usize]
    }

    /// The tensor `leaf` (`weight`, `bias`) of the block at `base`.
    fn param(&self, base: &str, leaf: &str) -> String {
        format!("{base}{}{leaf}", self.separator)
    }

    /// `part` of layer `layer` of `stack`.
    fn in_layer(&self, stack: Stack, layer: usize, part: &str) -> String {
        let sep = self.separator;
        format!("{}{sep}{}{layer}{sep}{part}", self.stack(stack), self.layer)
    }

    fn conv(&self, index: usize) -> String {
        let (encoder, conv) = (self.stack(Stack::Encoder), self.conv);
        format!("{encoder}{}{conv}{index}", self.separator)
    }

    fn positions(&self, stack: Stack) -> String {
        self.param(self.stack(stack), self.positions)
    }

    fn embeddings(&self) -> String {
        self.param(self.stack(Stack::Decoder), self.embeddings)
    }

    /// A norm's weight and bias (`layer` `None` for the stack's final norm).
    fn norm(&self, stack: Stack, layer: Option<usize>, which: NormSite) -> (String, String) {
        let base = match (layer, which) {
            (Some(i), NormSite::SelfAttention) => self.in_layer(stack, i, self.norms[0]),
            (Some(i), NormSite::CrossAttention) => self.in_layer(stack, i, self.norms[1]),
            (Some(i), NormSite::Mlp) => self.in_layer(stack, i, self.norms[2]),
            (_, _) => self.param(self.stack(stack), self.norms[3]),
        };
        let [weight, bias] = self.norm_params;
        (self.param(&base, weight), self.param(&base, bias))
    }

    fn mlp(&self, stack: Stack, layer: usize) -> (String, String) {
        let [fc1, fc2] = self.mlp;
        (
            self.in_layer(stack, layer, fc1),
            self.in_layer(stack, layer, fc2),
        )
    }

    /// Query, key, value and output projections of an attention block.
    fn attention<S: WeightSource>(
        &self,
        loader: &mut WeightLoader<S>,
        stack: Stack,
        layer: usize,
        cross: bool,
        hidden: usize,
    ) -> Result<[Linear; 4]> {
        let square = [hidden, hidden];
        if !self.fused_attention {
            let block = if cross { "encoder_attn" } else { "self_attn" };
            let base = self.in_layer(stack, layer, block);
            let mut projection = |name: &str, bias: bool| {
                let base = self.param(&base, name);
                let bias = bias.then(|| self.param(&base, "bias"));
                loader.linear(&self.param(&base, "weight"), bias.as_deref(), square)
            };
            // Whisper's key projections have no bias.
            return Ok([
                projection("q_proj", true)?,
                projection("k_proj", false)?,
                projection("v_proj", true)?,
                projection("out_proj", true)?,
            ]);
        }
        let part = |name: &str| (format!("{name}/weight"), format!("{name}/bias"));
        if cross {
            // linear_0: query; linear_1: key and value fused; linear_2: output.
            let base = self.in_layer(stack, layer, "attention");
            let (qw, qb) = part(&format!("{base}/linear_0"));
            let (kvw, kvb) = part(&format!("{base}/linear_1"));
            let (ow, ob) = part(&format!("{base}/linear_2"));
            let q = loader.linear(&qw, Some(&qb), square)?;
            let [k, v] = two(loader.split_linear(&kvw, Some(&kvb), &[hidden, hidden], hidden)?);
            let o = loader.linear(&ow, Some(&ob), square)?;
            Ok([q, k, v, o])
        } else {
            // linear_0: query, key and value fused; linear_1: output.
            let base = self.in_layer(stack, layer, "self_attention");
            let (qkvw, qkvb) = part(&format!("{base}/linear_0"));
            let (ow, ob) = part(&format!("{base}/linear_1"));
            let parts = loader.split_linear(&qkvw, Some(&qkvb), &[hidden; 3], hidden)?;
            let [q, k, v] = three(parts);
            let o = loader.linear(&ow, Some(&ob), square)?;
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

fn build<S: WeightSource>(
    mut loader: WeightLoader<S>,
    config: WhisperConfig,
    names: &Names,
    options: &LoadOptions,
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
    loader.set_requantize(options.encoder_requantize);
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

    loader.set_requantize(options.requantize);
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
    Ok(Whisper::new(config, encoder, decoder, &options.device))
}
