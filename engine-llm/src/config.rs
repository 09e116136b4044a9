//! Hyper-parameters of the Qwen2 / Llama decoder family, read from a GGUF header or a Hugging
//! Face `config.json`.

use serde::Deserialize;
pub use spec_nn::RopeLayout;

use crate::{Error, Result};

/// The model families this engine runs. They share one transformer; Qwen2 adds biases to the
/// query/key/value projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Qwen2,
    Llama,
}

impl Architecture {
    /// Parses a GGUF `general.architecture` or HF `model_type` value.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "qwen2" => Ok(Self::Qwen2),
            "llama" => Ok(Self::Llama),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }
}

/// Llama 3.1 / 3.2 frequency scaling for long contexts.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// Everything the transformer needs to know about its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f32,
    pub rope_layout: RopeLayout,
    /// Per-frequency divisors (GGUF `rope_freqs.weight`), `head_dim / 2` of them.
    pub rope_freq_factors: Option<Vec<f32>>,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
}

impl TransformerConfig {
    /// Checks that the dimensions fit together.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if [
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_layers,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.max_position_embeddings,
        ]
        .contains(&0)
        {
            return bad(format!("a dimension is zero: {self:?}"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} attention heads are not a multiple of {} key/value heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim
            ));
        }
        if let Some(f) = &self.rope_freq_factors {
            if f.len() != self.head_dim / 2 {
                return bad(format!(
                    "{} rope frequency factors for head_dim {}",
                    f.len(),
                    self.head_dim
                ));
            }
        }
        Ok(())
    }

    /// Rotary inverse frequencies `θ^(−2i/d)`, with Llama 3 scaling or per-frequency factors.
    pub fn rope_inverse_frequencies(&self) -> Vec<f32> {
        let d = self.head_dim;
        (0..d / 2)
            .map(|i| {
                let mut inv = 1.0 / self.rope_theta.powf(2.0 * i as f32 / d as f32);
                if let Some(s) = &self.rope_scaling {
                    inv = llama3_scale(inv, s);
                }
                if let Some(f) = &self.rope_freq_factors {
                    inv /= f[i];
                }
                inv
            })
            .collect()
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let raw: HfConfig =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("config.json: {e}")))?;
        let architecture = Architecture::parse(&raw.model_type)?;
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        let rope_scaling = match raw.rope_scaling {
            None | Some(serde_json::Value::Null) => None,
            Some(value) => {
                let kind = value
                    .get("rope_type")
                    .or_else(|| value.get("type"))
                    .and_then(|v| v.as_str())
                    .unwrap_or_default();
                if kind != "llama3" {
                    return Err(Error::Config(format!(
                        "rope_scaling of type `{kind}` is not supported (only llama3)"
                    )));
                }
                Some(
                    serde_json::from_value(value)
                        .map_err(|e| Error::Config(format!("rope_scaling: {e}")))?,
                )
            }
        };
        let config = Self {
            architecture,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim: raw
                .head_dim
                .unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1)),
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta: raw.rope_theta.unwrap_or(10_000.0),
            rope_layout: RopeLayout::Halves,
            rope_freq_factors: None,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: architecture == Architecture::Qwen2
                || raw.attention_bias.unwrap_or(false),
        };
        config.validate()?;
        Ok(config)
    }
}

/// Llama 3 frequency scaling: long wavelengths are divided by `factor`, short ones kept, and
/// the band between interpolated.
fn llama3_scale(inv_freq: f32, s: &Llama3RopeScaling) -> f32 {
    let original = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = original / s.low_freq_factor;
    let high_freq_wavelen = original / s.high_freq_factor;
    let wavelen = 2.0 * std::f32::consts::PI / inv_freq;
    if wavelen < high_freq_wavelen {
        inv_freq
    } else if wavelen > low_freq_wavelen {
        inv_freq / s.factor
    } else {
        let smooth =
            (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq
    }
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    rope_theta: Option<f32>,
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: usize,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: &str = r#"{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":151936,
        "hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,"num_attention_heads":14,
        "num_key_value_heads":2,"rms_norm_eps":1e-6,"rope_theta":1000000.0,
        "max_position_embeddings":32768,"tie_word_embeddings":true,"torch_dtype":"bfloat16"}"#;

    #[test]
    fn reads_a_qwen_config() {
        let c = TransformerConfig::from_hf_json(QWEN).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen2);
        assert_eq!((c.head_dim, c.num_kv_heads), (64, 2));
        assert!(c.attention_bias && c.tie_word_embeddings);
        assert_eq!(c.rope_inverse_frequencies()[0], 1.0);
    }

    #[test]
    fn llama3_scaling_changes_only_long_wavelengths() {
        let text = r#"{"model_type":"llama","vocab_size":128256,"hidden_size":2048,"intermediate_size":8192,
            "num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,"rms_norm_eps":1e-5,
            "rope_theta":500000.0,"max_position_embeddings":131072,"tie_word_embeddings":true,
            "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#;
        let c = TransformerConfig::from_hf_json(text).unwrap();
        let plain = TransformerConfig {
            rope_scaling: None,
            ..c.clone()
        };
        let (scaled, unscaled) = (
            c.rope_inverse_frequencies(),
            plain.rope_inverse_frequencies(),
        );
        assert_eq!(scaled[0], unscaled[0], "the highest frequency is kept");
        let last = scaled.len() - 1;
        assert!(
            (scaled[last] * 32.0 - unscaled[last]).abs() < 1e-9,
            "the lowest is divided by 32"
        );
        assert!(!c.attention_bias);
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(matches!(
            TransformerConfig::from_hf_json(&QWEN.replace("qwen2", "gpt_neox")),
            Err(Error::UnsupportedArchitecture(_))
        ));
        assert!(matches!(
            TransformerConfig::from_hf_json(
                &QWEN.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3")
            ),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            TransformerConfig::from_hf_json("{}"),
            Err(Error::Config(_))
        ));
    }
}
