//! Tiny random-weight Qwen2 / Llama checkpoints written to real GGUF and safetensors files,
//! the helpers of the chat API's ([`chat`]) and PredGen's ([`predgen`]) tests, and the real
//! models the real-model tests load ([`real`]). Shared with `spec-train`'s tests of trained
//! heads and drafts on these models.

pub mod chat;
pub mod predgen;
pub mod real;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Qwen2,
    Llama,
}

pub const FAMILIES: [Family; 2] = [Family::Qwen2, Family::Llama];

pub struct Tiny {
    pub family: Family,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub tied: bool,
}

impl Tiny {
    pub fn new(family: Family) -> Self {
        Self {
            family,
            vocab: 96,
            hidden: 64,
            intermediate: 96,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            tied: family == Family::Qwen2,
        }
    }

    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Random weights under Hugging Face names, scaled so activations stay O(1).
    pub fn hf_weights(&self, seed: u64) -> HashMap<String, Tensor> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut t = |shape: &[usize], scale: f32| {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n)
                .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale)
                .collect();
            Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
        };
        let (h, i, d) = (self.hidden, self.intermediate, self.head_dim());
        let (q, kv) = (self.heads * d, self.kv_heads * d);
        let w = 1.0 / (h as f32).sqrt() * 1.7;
        let mut m = HashMap::new();
        m.insert("model.embed_tokens.weight".into(), t(&[self.vocab, h], 1.0));
        if !self.tied {
            m.insert("lm_head.weight".into(), t(&[self.vocab, h], w));
        }
        m.insert("model.norm.weight".into(), (t(&[h], 0.2) + 1.0).unwrap());
        for l in 0..self.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            m.insert(p("self_attn.q_proj.weight"), t(&[q, h], w));
            m.insert(p("self_attn.k_proj.weight"), t(&[kv, h], w));
            m.insert(p("self_attn.v_proj.weight"), t(&[kv, h], w));
            m.insert(p("self_attn.o_proj.weight"), t(&[h, q], w));
            m.insert(p("mlp.gate_proj.weight"), t(&[i, h], w));
            m.insert(p("mlp.up_proj.weight"), t(&[i, h], w));
            m.insert(
                p("mlp.down_proj.weight"),
                t(&[h, i], 1.0 / (i as f32).sqrt()),
            );
            m.insert(p("input_layernorm.weight"), (t(&[h], 0.2) + 1.0).unwrap());
            m.insert(
                p("post_attention_layernorm.weight"),
                (t(&[h], 0.2) + 1.0).unwrap(),
            );
            if self.family == Family::Qwen2 {
                m.insert(p("self_attn.q_proj.bias"), t(&[q], 0.3));
                m.insert(p("self_attn.k_proj.bias"), t(&[kv], 0.3));
                m.insert(p("self_attn.v_proj.bias"), t(&[kv], 0.3));
            }
        }
        m
    }

    pub fn config_json(&self) -> String {
        format!(
            r#"{{"model_type":"{}","vocab_size":{},"hidden_size":{},"intermediate_size":{},
            "num_hidden_layers":{},"num_attention_heads":{},"num_key_value_heads":{},
            "rms_norm_eps":1e-6,"rope_theta":10000.0,"max_position_embeddings":512,
            "tie_word_embeddings":{}}}"#,
            self.arch(),
            self.vocab,
            self.hidden,
            self.intermediate,
            self.layers,
            self.heads,
            self.kv_heads,
            self.tied
        )
    }

    fn arch(&self) -> &'static str {
        match self.family {
            Family::Qwen2 => "qwen2",
            Family::Llama => "llama",
        }
    }

    /// Writes `config.json` + `model.safetensors` into `dir`; returns (config, shard).
    pub fn write_safetensors(&self, dir: &Path, seed: u64) -> (PathBuf, PathBuf) {
        let config = dir.join("config.json");
        std::fs::write(&config, self.config_json()).unwrap();
        let shard = dir.join("model.safetensors");
        candle_core::safetensors::save(&self.hf_weights(seed), &shard).unwrap();
        (config, shard)
    }

    /// Writes the same weights as a GGUF file with GGML names, matrices in `dtype`. Llama's
    /// Q and K rows are permuted as the GGUF converter does, for interleaved rotation.
    pub fn write_gguf(
        &self,
        dir: &Path,
        seed: u64,
        dtype: GgmlDType,
        extra: &[(&str, gguf_file::Value)],
    ) -> PathBuf {
        let hf = self.hf_weights(seed);
        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        let d = self.head_dim();
        let mut put = |name: String, t: &Tensor, matrix: bool| {
            let q = QTensor::quantize(t, if matrix { dtype } else { GgmlDType::F32 }).unwrap();
            tensors.push((name, q));
        };
        put(
            "token_embd.weight".into(),
            &hf["model.embed_tokens.weight"],
            true,
        );
        if !self.tied {
            put("output.weight".into(), &hf["lm_head.weight"], true);
        }
        put("output_norm.weight".into(), &hf["model.norm.weight"], false);
        for l in 0..self.layers {
            let hfn = |s: &str| format!("model.layers.{l}.{s}");
            let g = |s: &str| format!("blk.{l}.{s}");
            let permute = |t: &Tensor, heads: usize| -> Tensor {
                if self.family == Family::Llama {
                    let (rows, cols) = t.dims2().unwrap();
                    t.reshape((heads, 2, d / 2, cols))
                        .unwrap()
                        .transpose(1, 2)
                        .unwrap()
                        .reshape((rows, cols))
                        .unwrap()
                } else {
                    t.clone()
                }
            };
            put(
                g("attn_q.weight"),
                &permute(&hf[&hfn("self_attn.q_proj.weight")], self.heads),
                true,
            );
            put(
                g("attn_k.weight"),
                &permute(&hf[&hfn("self_attn.k_proj.weight")], self.kv_heads),
                true,
            );
            put(
                g("attn_v.weight"),
                &hf[&hfn("self_attn.v_proj.weight")],
                true,
            );
            put(
                g("attn_output.weight"),
                &hf[&hfn("self_attn.o_proj.weight")],
                true,
            );
            put(
                g("ffn_gate.weight"),
                &hf[&hfn("mlp.gate_proj.weight")],
                true,
            );
            put(g("ffn_up.weight"), &hf[&hfn("mlp.up_proj.weight")], true);
            put(
                g("ffn_down.weight"),
                &hf[&hfn("mlp.down_proj.weight")],
                true,
            );
            put(
                g("attn_norm.weight"),
                &hf[&hfn("input_layernorm.weight")],
                false,
            );
            put(
                g("ffn_norm.weight"),
                &hf[&hfn("post_attention_layernorm.weight")],
                false,
            );
            if self.family == Family::Qwen2 {
                for (s, n) in [
                    ("q", "attn_q.bias"),
                    ("k", "attn_k.bias"),
                    ("v", "attn_v.bias"),
                ] {
                    put(g(n), &hf[&hfn(&format!("self_attn.{s}_proj.bias"))], false);
                }
            }
        }
        let arch = self.arch();
        let u = |v: usize| gguf_file::Value::U32(v as u32);
        let mut meta: Vec<(String, gguf_file::Value)> = vec![
            (
                "general.architecture".into(),
                gguf_file::Value::String(arch.into()),
            ),
            (format!("{arch}.block_count"), u(self.layers)),
            (format!("{arch}.embedding_length"), u(self.hidden)),
            (format!("{arch}.feed_forward_length"), u(self.intermediate)),
            (format!("{arch}.attention.head_count"), u(self.heads)),
            (format!("{arch}.attention.head_count_kv"), u(self.kv_heads)),
            (
                format!("{arch}.attention.layer_norm_rms_epsilon"),
                gguf_file::Value::F32(1e-6),
            ),
            (
                format!("{arch}.rope.freq_base"),
                gguf_file::Value::F32(10000.0),
            ),
            (format!("{arch}.context_length"), u(512)),
        ];
        meta.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let path = dir.join("model.gguf");
        let mut file = std::fs::File::create(&path).unwrap();
        let meta_refs: Vec<(&str, &gguf_file::Value)> =
            meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> =
            tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
        path
    }
}

/// GGUF metadata for a tiny byte-level BPE tokenizer of `vocab` tokens (no merges): `Ġ`, `Ċ`,
/// printable ASCII, and the ChatML control tokens last.
pub fn chatml_tokenizer_metadata(vocab: usize) -> Vec<(&'static str, gguf_file::Value)> {
    chatml_tokenizer_metadata_with_words(vocab, &[])
}

/// [`chatml_tokenizer_metadata`] with whole `words` (`Ġ` for a leading space) as tokens of
/// their own in place of the last characters: a random model writes words, and sentences long
/// enough to be cut in pieces.
pub fn chatml_tokenizer_metadata_with_words(
    vocab: usize,
    words: &[&str],
) -> Vec<(&'static str, gguf_file::Value)> {
    let specials = ["<|im_start|>", "<|im_end|>"];
    let mut tokens: Vec<String> = ["Ġ", "Ċ"].map(String::from).to_vec();
    tokens.extend(('!'..='~').map(String::from));
    tokens.truncate(vocab - specials.len() - words.len());
    tokens.extend(words.iter().map(|w| w.to_string()));
    let mut types = vec![1i32; tokens.len()];
    tokens.extend(specials.map(String::from));
    types.extend([3, 3]);
    let strings = |v: Vec<String>| {
        gguf_file::Value::Array(v.into_iter().map(gguf_file::Value::String).collect())
    };
    vec![
        (
            "tokenizer.ggml.model",
            gguf_file::Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre",
            gguf_file::Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.tokens", strings(tokens)),
        ("tokenizer.ggml.merges", strings(Vec::new())),
        (
            "tokenizer.ggml.token_type",
            gguf_file::Value::Array(types.into_iter().map(gguf_file::Value::I32).collect()),
        ),
        (
            "tokenizer.ggml.eos_token_id",
            gguf_file::Value::U32(vocab as u32 - 1),
        ),
    ]
}

/// The model's plain greedy continuation of `prompt` from an empty cache: at most
/// `max_tokens` tokens, up to and including an end token. What lossless decoding reproduces.
pub fn greedy_tokens(
    model: &mut engine_llm::LanguageModel,
    prompt: &[u32],
    max_tokens: usize,
) -> Vec<u32> {
    let ends = model.tokenizer.end_tokens().to_vec();
    let stop = spec_core::StopConditions::new(max_tokens).with_eos(ends);
    spec_core::Decoder::reset(&mut model.model);
    spec_core::generate(
        &mut model.model,
        prompt,
        &spec_core::SamplingConfig::greedy(),
        &stop,
        &mut StdRng::seed_from_u64(0),
        &mut |_| {},
    )
    .unwrap()
    .tokens
}
