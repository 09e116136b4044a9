//! Loading weights: GGUF (quantized, with the tokenizer inside) and Hugging Face safetensors.
//!
//! On the CPU, matrices run on `spec-kernels` (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), whose
//! results do not depend on how many tokens a forward carries, so speculative verification
//! reproduces single-token decoding bit for bit. By default
//! ([`Requantize::FastAndBatchInvariant`]) the other formats are re-quantized to Q8_0 at load
//! so that they run there too; candle's own kernels pick different code for one row than for
//! several and would break that guarantee.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::config::{Architecture, RopeLayout, TransformerConfig};
use crate::linear::QLinear;
use crate::transformer::{Attention, FeedForward, Layer, Transformer, Weights};
use crate::{Error, Result};

/// Which matrices are re-quantized at load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Requantize {
    /// Formats `spec-kernels` has no kernel for (Q5_1, Q2K, Q3K, Q5K, and dense f16/bf16/f32
    /// matrices) become Q8_0, so that every matrix runs on the fast, batch-invariant kernels.
    #[default]
    FastAndBatchInvariant,
    /// Keep every tensor as stored (dense safetensors weights stay f32).
    Keep,
}

impl Requantize {
    fn wants(self, dtype: GgmlDType, row_len: usize) -> bool {
        let kept = crate::linear::kernel_format(dtype).is_some();
        self == Self::FastAndBatchInvariant
            && !kept
            && row_len.is_multiple_of(GgmlDType::Q8_0.block_size())
    }
}

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

/// An open GGUF file: its header (metadata, tensor index) and a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    file: File,
    content: gguf_file::Content,
}

impl GgufFile {
    /// Opens and parses the header; a truncated or foreign file is a [`Error::BadWeights`].
    pub fn open(path: &Path) -> Result<Self> {
        let mut file = File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content = gguf_file::Content::read(&mut file).map_err(|e| Error::BadWeights {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let data_end = content
            .tensor_infos
            .values()
            .map(|info| {
                let elems = info.shape.elem_count();
                let bytes = elems / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
                content.tensor_data_offset + info.offset + bytes as u64
            })
            .max()
            .unwrap_or(0);
        let size = file
            .metadata()
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        if size < data_end {
            return Err(Error::BadWeights {
                path: path.to_path_buf(),
                reason: format!("file is truncated: {size} bytes, the tensors need {data_end}"),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            content,
        })
    }

    /// The header's key/value metadata.
    pub fn metadata(&self) -> &std::collections::HashMap<String, gguf_file::Value> {
        &self.content.metadata
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A metadata value that must be present.
    pub fn value(&self, key: &str) -> Result<&gguf_file::Value> {
        self.content.metadata.get(key).ok_or_else(|| {
            Error::Config(format!(
                "{}: missing GGUF metadata `{key}`",
                self.path.display()
            ))
        })
    }

    fn usize(&self, key: &str) -> Result<usize> {
        let v = self.value(key)?;
        v.to_u64()
            .map(|x| x as usize)
            .or_else(|_| v.to_u32().map(|x| x as usize))
            .or_else(|_| v.to_i32().map(|x| x.max(0) as usize))
            .map_err(|_| Error::Config(format!("GGUF `{key}` is not an integer: {v:?}")))
    }

    fn f32(&self, key: &str) -> Result<f32> {
        let v = self.value(key)?;
        v.to_f32()
            .or_else(|_| v.to_f64().map(|x| x as f32))
            .map_err(|_| Error::Config(format!("GGUF `{key}` is not a number: {v:?}")))
    }

    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.content
            .tensor_infos
            .get(name)
            .map(|i| i.shape.dims().to_vec())
    }

    fn tensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        if !self.has(name) {
            return Err(Error::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            });
        }
        self.content
            .tensor(&mut self.file, name, device)
            .map_err(|e| Error::BadWeights {
                path: self.path.clone(),
                reason: format!("tensor `{name}`: {e}"),
            })
    }

    /// Reads the model hyper-parameters from the header.
    pub fn config(&self) -> Result<TransformerConfig> {
        let arch_name = self.value("general.architecture")?.to_string()?.clone();
        let architecture = Architecture::parse(&arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let num_heads = self.usize(&key("attention.head_count"))?;
        let hidden_size = self.usize(&key("embedding_length"))?;
        let embed_shape = self
            .shape("token_embd.weight")
            .ok_or_else(|| Error::MissingTensor {
                path: self.path.clone(),
                name: "token_embd.weight".into(),
            })?;
        let head_dim = match self.usize(&key("attention.key_length")) {
            Ok(d) => d,
            Err(_) => hidden_size / num_heads.max(1),
        };
        let config = TransformerConfig {
            architecture,
            vocab_size: embed_shape[0],
            hidden_size,
            intermediate_size: self.usize(&key("feed_forward_length"))?,
            num_layers: self.usize(&key("block_count"))?,
            num_heads,
            num_kv_heads: self
                .usize(&key("attention.head_count_kv"))
                .unwrap_or(num_heads),
            head_dim,
            rms_norm_eps: self.f32(&key("attention.layer_norm_rms_epsilon"))? as f64,
            rope_theta: self.f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            // The GGUF converter permutes Llama's Q/K rows for interleaved rotation.
            rope_layout: match architecture {
                Architecture::Qwen2 => RopeLayout::Halves,
                Architecture::Llama => RopeLayout::Interleaved,
            },
            rope_freq_factors: None,
            rope_scaling: None,
            max_position_embeddings: self.usize(&key("context_length"))?,
            tie_word_embeddings: !self.has("output.weight"),
            attention_bias: self.has("blk.0.attn_q.bias"),
        };
        config.validate()?;
        Ok(config)
    }
}

impl Transformer {
    /// Loads a Qwen2 or Llama model from a GGUF file.
    pub fn from_gguf(path: &Path, options: &LoadOptions) -> Result<Self> {
        let mut gguf = GgufFile::open(path)?;
        let mut config = gguf.config()?;
        let device = &options.device;
        if gguf.has("rope_freqs.weight") {
            let factors = gguf
                .tensor("rope_freqs.weight", device)?
                .dequantize(device)?;
            config.rope_freq_factors = Some(factors.to_vec1()?);
        }
        let c = config.clone();
        let (q_out, kv_out) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let matrix = |gguf: &mut GgufFile, name: &str, shape: [usize; 2]| -> Result<Arc<QTensor>> {
            let t = gguf.tensor(name, device)?;
            check_shape(name, t.shape().dims(), &shape)?;
            Ok(Arc::new(requantized(t, options.requantize, device)?))
        };
        let vector = |gguf: &mut GgufFile, name: &str, len: usize| -> Result<Tensor> {
            let t = gguf.tensor(name, device)?.dequantize(device)?;
            check_shape(name, t.dims(), &[len])?;
            Ok(t)
        };
        // Tied output weights share the embeddings' matrix, converted once.
        let embeddings = QLinear::new(
            matrix(
                &mut gguf,
                "token_embd.weight",
                [c.vocab_size, c.hidden_size],
            )?,
            device,
        )?;
        let lm_head = if c.tie_word_embeddings {
            embeddings.clone()
        } else {
            QLinear::new(
                matrix(&mut gguf, "output.weight", [c.vocab_size, c.hidden_size])?,
                device,
            )?
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            let mut linear = |name: &str, shape| -> Result<QLinear> {
                QLinear::new(matrix(&mut gguf, &p(name), shape)?, device)
            };
            let attention = Attention {
                q: linear("attn_q.weight", [q_out, c.hidden_size])?,
                k: linear("attn_k.weight", [kv_out, c.hidden_size])?,
                v: linear("attn_v.weight", [kv_out, c.hidden_size])?,
                o: linear("attn_output.weight", [c.hidden_size, q_out])?,
                bias: None,
            };
            let ffn = FeedForward {
                gate: linear("ffn_gate.weight", [c.intermediate_size, c.hidden_size])?,
                up: linear("ffn_up.weight", [c.intermediate_size, c.hidden_size])?,
                down: linear("ffn_down.weight", [c.hidden_size, c.intermediate_size])?,
            };
            let bias = if c.attention_bias {
                Some([
                    vector(&mut gguf, &p("attn_q.bias"), q_out)?,
                    vector(&mut gguf, &p("attn_k.bias"), kv_out)?,
                    vector(&mut gguf, &p("attn_v.bias"), kv_out)?,
                ])
            } else {
                None
            };
            layers.push(Layer {
                attention_norm: vector(&mut gguf, &p("attn_norm.weight"), c.hidden_size)?,
                attention: Attention { bias, ..attention },
                ffn_norm: vector(&mut gguf, &p("ffn_norm.weight"), c.hidden_size)?,
                ffn,
            });
        }
        let weights = Weights {
            embeddings,
            final_norm: vector(&mut gguf, "output_norm.weight", c.hidden_size)?,
            lm_head,
            layers,
        };
        Transformer::new(config, weights, options.max_context, device)
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
        if shards.is_empty() {
            return Err(Error::Config("no safetensors shard given".into()));
        }
        let device = &options.device;
        let mut tensors = std::collections::HashMap::new();
        for shard in shards {
            let loaded =
                candle_core::safetensors::load(shard, device).map_err(|e| Error::BadWeights {
                    path: shard.clone(),
                    reason: e.to_string(),
                })?;
            tensors.extend(loaded);
        }
        let mut take = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let t = tensors.remove(name).ok_or_else(|| Error::MissingTensor {
                path: shards[0].clone(),
                name: name.to_string(),
            })?;
            check_shape(name, t.dims(), shape)?;
            Ok(t.to_dtype(DType::F32)?)
        };
        let c = config.clone();
        let (q_out, kv_out) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let dense = |t: Tensor| -> Result<Arc<QTensor>> {
            let (_, row_len) = t.dims2()?;
            Ok(Arc::new(
                if options.requantize.wants(GgmlDType::F32, row_len) {
                    QTensor::quantize(&t, GgmlDType::Q8_0)?
                } else {
                    QTensor::quantize(&t, GgmlDType::F32)?
                },
            ))
        };
        // Tied output weights share the embeddings' matrix, converted once.
        let embeddings = QLinear::new(
            dense(take(
                "model.embed_tokens.weight",
                &[c.vocab_size, c.hidden_size],
            )?)?,
            device,
        )?;
        let lm_head = if c.tie_word_embeddings {
            embeddings.clone()
        } else {
            QLinear::new(
                dense(take("lm_head.weight", &[c.vocab_size, c.hidden_size])?)?,
                device,
            )?
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let mut linear = |name: &str, shape: [usize; 2]| -> Result<QLinear> {
                QLinear::new(dense(take(&p(name), &shape)?)?, device)
            };
            let q = linear("self_attn.q_proj.weight", [q_out, c.hidden_size])?;
            let k = linear("self_attn.k_proj.weight", [kv_out, c.hidden_size])?;
            let v = linear("self_attn.v_proj.weight", [kv_out, c.hidden_size])?;
            let o = linear("self_attn.o_proj.weight", [c.hidden_size, q_out])?;
            let gate = linear("mlp.gate_proj.weight", [c.intermediate_size, c.hidden_size])?;
            let up = linear("mlp.up_proj.weight", [c.intermediate_size, c.hidden_size])?;
            let down = linear("mlp.down_proj.weight", [c.hidden_size, c.intermediate_size])?;
            let bias = if c.attention_bias {
                Some([
                    take(&p("self_attn.q_proj.bias"), &[q_out])?,
                    take(&p("self_attn.k_proj.bias"), &[kv_out])?,
                    take(&p("self_attn.v_proj.bias"), &[kv_out])?,
                ])
            } else {
                None
            };
            layers.push(Layer {
                attention_norm: take(&p("input_layernorm.weight"), &[c.hidden_size])?,
                attention: Attention { q, k, v, o, bias },
                ffn_norm: take(&p("post_attention_layernorm.weight"), &[c.hidden_size])?,
                ffn: FeedForward { gate, up, down },
            });
        }
        let weights = Weights {
            embeddings,
            final_norm: take("model.norm.weight", &[c.hidden_size])?,
            lm_head,
            layers,
        };
        Transformer::new(config, weights, options.max_context, device)
    }
}

fn requantized(t: QTensor, policy: Requantize, device: &Device) -> Result<QTensor> {
    let row_len = *t.shape().dims().last().unwrap_or(&0);
    if t.shape().rank() == 2 && policy.wants(t.dtype(), row_len) {
        Ok(QTensor::quantize(&t.dequantize(device)?, GgmlDType::Q8_0)?)
    } else {
        Ok(t)
    }
}

fn check_shape(name: &str, got: &[usize], expected: &[usize]) -> Result<()> {
    if got != expected {
        return Err(Error::ShapeMismatch {
            name: name.to_string(),
            got: got.to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}
