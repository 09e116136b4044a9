//! Loading Qwen2 / Llama weights from GGUF (quantized, with the tokenizer inside) or Hugging
//! Face safetensors: the two formats differ only in their tensor names and in where the
//! hyper-parameters are kept; the blocks, shapes and re-quantization policy are `spec-nn`'s.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use spec_nn::{
    GgufFile, InMemoryWeights, Linear, Norm, Requantize, SafetensorsFiles, SelfAttention, SwiGlu,
    WeightLoader, WeightSource,
};

use crate::config::{Architecture, RopeLayout, TransformerConfig};
use crate::transformer::{Layer, Transformer, Weights};
use crate::{Error, Result};

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub device: Device,
    /// Cap on the KV cache (defaults to the model's maximum context).
    pub max_context: Option<usize>,
    pub requantize: Requantize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            max_context: None,
            requantize: Requantize::default(),
        }
    }
}

impl TransformerConfig {
    /// Reads the model hyper-parameters from a GGUF header.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let arch_name = gguf.value("general.architecture")?.to_string()?.clone();
        let architecture = Architecture::parse(&arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let num_heads = gguf.usize(&key("attention.head_count"))?;
        let hidden_size = gguf.usize(&key("embedding_length"))?;
        let embed_shape =
            gguf.dims("token_embd.weight")
                .ok_or_else(|| spec_nn::Error::MissingTensor {
                    path: gguf.path().to_path_buf(),
                    name: "token_embd.weight".into(),
                })?;
        let &[vocab_size, _] = embed_shape.as_slice() else {
            return Err(spec_nn::Error::BadWeights {
                path: gguf.path().to_path_buf(),
                reason: format!(
                    "the embedding table `token_embd.weight` has shape {embed_shape:?}, not [vocabulary, hidden]"
                ),
            }
            .into());
        };
        let head_dim = match gguf.usize(&key("attention.key_length")) {
            Ok(d) => d,
            Err(_) => hidden_size / num_heads.max(1),
        };
        let config = TransformerConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: gguf.usize(&key("feed_forward_length"))?,
            num_layers: gguf.usize(&key("block_count"))?,
            num_heads,
            num_kv_heads: gguf
                .usize(&key("attention.head_count_kv"))
                .unwrap_or(num_heads),
            head_dim,
            rms_norm_eps: gguf.f32(&key("attention.layer_norm_rms_epsilon"))? as f64,
            rope_theta: gguf.f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            // The GGUF converter permutes Llama's Q/K rows for interleaved rotation.
            rope_layout: match architecture {
                Architecture::Qwen2 => RopeLayout::Halves,
                Architecture::Llama => RopeLayout::Interleaved,
            },
            rope_freq_factors: None,
            rope_scaling: None,
            max_position_embeddings: gguf.usize(&key("context_length"))?,
            tie_word_embeddings: !gguf.contains("output.weight"),
            attention_bias: gguf.contains("blk.0.attn_q.bias"),
        };
        config.validate()?;
        Ok(config)
    }
}

/// The tensor naming of a checkpoint format. Public for the SSD drafts' training
/// (`spec-train`), which names a layer's tensors as the loaders do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    Gguf,
    HuggingFace,
}

/// The parts of a layer (each a matrix, with a bias for some, or a norm's weight), as
/// [`Naming::layer`] names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Query,
    Key,
    Value,
    Output,
    Gate,
    Up,
    Down,
    AttentionNorm,
    FfnNorm,
}

impl Naming {
    fn embeddings(self) -> &'static str {
        match self {
            Self::Gguf => "token_embd.weight",
            Self::HuggingFace => "model.embed_tokens.weight",
        }
    }

    fn output(self) -> &'static str {
        match self {
            Self::Gguf => "output.weight",
            Self::HuggingFace => "lm_head.weight",
        }
    }

    fn final_norm(self) -> &'static str {
        match self {
            Self::Gguf => "output_norm.weight",
            Self::HuggingFace => "model.norm.weight",
        }
    }

    /// The name of `part` of layer `layer`; `suffix`: "weight" or "bias".
    pub fn layer(self, layer: usize, part: Part, suffix: &str) -> String {
        let (gguf, hf) = match part {
            Part::Query => ("attn_q", "self_attn.q_proj"),
            Part::Key => ("attn_k", "self_attn.k_proj"),
            Part::Value => ("attn_v", "self_attn.v_proj"),
            Part::Output => ("attn_output", "self_attn.o_proj"),
            Part::Gate => ("ffn_gate", "mlp.gate_proj"),
            Part::Up => ("ffn_up", "mlp.up_proj"),
            Part::Down => ("ffn_down", "mlp.down_proj"),
            Part::AttentionNorm => ("attn_norm", "input_layernorm"),
            Part::FfnNorm => ("ffn_norm", "post_attention_layernorm"),
        };
        match self {
            Self::Gguf => format!("blk.{layer}.{gguf}.{suffix}"),
            Self::HuggingFace => format!("model.layers.{layer}.{hf}.{suffix}"),
        }
    }
}

impl Transformer {
    /// Loads a Qwen2 or Llama model from a GGUF file.
    pub fn from_gguf(path: &Path, options: &LoadOptions) -> Result<Self> {
        Self::from_gguf_file(GgufFile::open(path)?, options)
    }

    /// Loads a Qwen2 or Llama model from an open GGUF file (whose header the caller may also
    /// have read, e.g. for the tokenizer).
    pub fn from_gguf_file(gguf: GgufFile, options: &LoadOptions) -> Result<Self> {
        let mut config = TransformerConfig::from_gguf(&gguf)?;
        let mut loader = WeightLoader::new(gguf, &options.device, options.requantize);
        if loader.contains("rope_freqs.weight") {
            let factors = loader.dense("rope_freqs.weight", &[config.head_dim / 2])?;
            config.rope_freq_factors = Some(factors.to_vec1()?);
        }
        build(loader, config, Naming::Gguf, options)
    }

    /// Loads a Hugging Face checkpoint: `config.json` and one or more safetensors shards
    /// (f32, f16 or bf16).
    pub fn from_safetensors(
        config_path: &Path,
        shards: &[PathBuf],
        options: &LoadOptions,
    ) -> Result<Self> {
        let text = std::fs::read_to_string(config_path).map_err(|source| Error::Io {
            path: config_path.to_path_buf(),
            source,
        })?;
        let config = TransformerConfig::from_hf_json(&text)?;
        let files = SafetensorsFiles::open(shards, &options.device)?;
        let loader = WeightLoader::new(files, &options.device, options.requantize);
        build(loader, config, Naming::HuggingFace, options)
    }
}

impl Transformer {
    /// A model from tensors under Hugging Face names (`model.embed_tokens.weight`, ...), as
    /// weights made or converted in memory come.
    pub fn from_tensors(
        config: TransformerConfig,
        tensors: HashMap<String, Tensor>,
        options: &LoadOptions,
    ) -> Result<Self> {
        config.validate()?;
        let loader = WeightLoader::new(
            InMemoryWeights::dense(tensors),
            &options.device,
            options.requantize,
        );
        build(loader, config, Naming::HuggingFace, options)
    }
}

/// The model's blocks from its tensors.
fn build<S: WeightSource>(
    mut loader: WeightLoader<S>,
    config: TransformerConfig,
    naming: Naming,
    options: &LoadOptions,
) -> Result<Transformer> {
    let c = &config;
    let hidden = c.hidden_size;
    let eps = c.rms_norm_eps as f32;
    // Tied output weights share the embeddings' matrix, converted once.
    let embeddings = loader.matrix(naming.embeddings(), [c.vocab_size, hidden])?;
    let lm_head = if c.tie_word_embeddings {
        embeddings.clone()
    } else {
        loader.matrix(naming.output(), [c.vocab_size, hidden])?
    };
    let layers = (0..c.num_layers)
        .map(|i| load_layer(&mut loader, c, naming, i))
        .collect::<Result<Vec<_>>>()?;
    let weights = Weights {
        embeddings,
        final_norm: Norm::rms(loader.dense(naming.final_norm(), &[hidden])?, eps),
        lm_head,
        layers,
        shortlist: None,
    };
    Transformer::new(config, weights, options.max_context, &options.device)
}

/// Layer `i` of a model with configuration `c`, from `loader`'s tensors.
pub(crate) fn load_layer<S: WeightSource>(
    loader: &mut WeightLoader<S>,
    c: &TransformerConfig,
    naming: Naming,
    i: usize,
) -> Result<Layer> {
    let (hidden, ffn) = (c.hidden_size, c.intermediate_size);
    let (q_out, kv_out) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let heads = spec_nn::Heads::new(c.num_heads, c.num_kv_heads, c.head_dim)?;
    let mut linear = |part: Part, shape: [usize; 2], biased: bool| -> Result<Linear> {
        let bias = biased.then(|| naming.layer(i, part, "bias"));
        Ok(loader.linear(&naming.layer(i, part, "weight"), bias.as_deref(), shape)?)
    };
    let biased = c.attention_bias;
    let attention = SelfAttention {
        q: linear(Part::Query, [q_out, hidden], biased)?,
        k: linear(Part::Key, [kv_out, hidden], biased)?,
        v: linear(Part::Value, [kv_out, hidden], biased)?,
        o: linear(Part::Output, [hidden, q_out], false)?,
        heads,
    };
    let ffn = SwiGlu {
        gate: linear(Part::Gate, [ffn, hidden], false)?,
        up: linear(Part::Up, [ffn, hidden], false)?,
        down: linear(Part::Down, [hidden, ffn], false)?,
    };
    let eps = c.rms_norm_eps as f32;
    let mut norm = |part: Part| -> Result<Norm> {
        let weight = loader.dense(&naming.layer(i, part, "weight"), &[hidden])?;
        Ok(Norm::rms(weight, eps))
    };
    Ok(Layer {
        attention_norm: norm(Part::AttentionNorm)?,
        attention,
        ffn_norm: norm(Part::FfnNorm)?,
        ffn,
    })
}

/// Layer `layer`'s weights dequantized to f32 under Hugging Face names of layer `i`
/// (`model.layers.{i}.self_attn.q_proj.weight`, ...): the same layer as plain tensors. Public for
/// the SSD drafts' training (`spec-train`), which trains float copies of a model's layers.
pub fn layer_tensors(layer: &Layer, i: usize, device: &Device) -> Result<HashMap<String, Tensor>> {
    let naming = Naming::HuggingFace;
    let mut tensors = HashMap::new();
    let attention = &layer.attention;
    let ffn = &layer.ffn;
    for (part, linear) in [
        (Part::Query, &attention.q),
        (Part::Key, &attention.k),
        (Part::Value, &attention.v),
        (Part::Output, &attention.o),
        (Part::Gate, &ffn.gate),
        (Part::Up, &ffn.up),
        (Part::Down, &ffn.down),
    ] {
        tensors.insert(
            naming.layer(i, part, "weight"),
            linear.weight.dequantize(device)?,
        );
        if let Some(bias) = &linear.bias {
            tensors.insert(naming.layer(i, part, "bias"), bias.to_device(device)?);
        }
    }
    for (part, norm) in [
        (Part::AttentionNorm, &layer.attention_norm),
        (Part::FfnNorm, &layer.ffn_norm),
    ] {
        tensors.insert(
            naming.layer(i, part, "weight"),
            norm.weight().to_device(device)?,
        );
    }
    Ok(tensors)
}
