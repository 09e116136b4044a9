//! A tiny chat model with random weights, built in memory, for examples and tests: two Qwen2
//! layers, a byte-level vocabulary of single characters (space, newline, printable ASCII up
//! to `|`) and the ChatML control tokens, and the hand-written ChatML template. Its answers
//! are random characters. (`spec_train::testing::tiny_heads` trains prediction heads for it.)

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::TransformerConfig;
use crate::template::ChatTemplate;
use crate::tokenizer::TextTokenizer;
use crate::{LanguageModel, LoadOptions, Result, Transformer};

const HIDDEN: usize = 64;
const INTERMEDIATE: usize = 96;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
/// Positions the model holds.
pub const CONTEXT: usize = 512;

/// The tiny model; `seed` picks its weights.
pub fn tiny_chat_model(seed: u64) -> Result<LanguageModel> {
    let tokenizer = tiny_tokenizer()?;
    let model = tiny_transformer(tokenizer.vocab_size(), seed)?;
    let template = ChatTemplate::ChatMl {
        default_system: None,
    };
    LanguageModel::from_parts(model, tokenizer, template, PathBuf::from("(random)"))
}

/// The byte-level vocabulary: `Ġ` (space), `Ċ` (newline), `!` to `|`, then the ChatML control
/// tokens, `<|im_end|>` last (the end-of-text token).
pub fn tiny_tokenizer() -> Result<TextTokenizer> {
    let mut tokens: Vec<String> = ["Ġ", "Ċ"].map(String::from).to_vec();
    tokens.extend(('!'..='|').map(String::from));
    let mut types = vec![1; tokens.len()];
    tokens.extend(["<|im_start|>", "<|im_end|>"].map(String::from));
    types.extend([3, 3]);
    let eos = tokens.len() as u32 - 1;
    TextTokenizer::byte_level(&tokens, &[], &types, "gpt2", Some(eos))
}

fn tiny_transformer(vocab: usize, seed: u64) -> Result<Transformer> {
    let config = TransformerConfig::from_hf_json(&format!(
        r#"{{"model_type":"qwen2","vocab_size":{vocab},"hidden_size":{HIDDEN},
        "intermediate_size":{INTERMEDIATE},"num_hidden_layers":{LAYERS},
        "num_attention_heads":{HEADS},"num_key_value_heads":{KV_HEADS},"rms_norm_eps":1e-6,
        "rope_theta":10000.0,"max_position_embeddings":{CONTEXT},"tie_word_embeddings":true}}"#
    ))?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut random = |shape: &[usize], scale: f32, offset: f32| {
        let n = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| offset + (rng.random::<f32>() * 2.0 - 1.0) * scale)
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu)
    };
    let head_dim = HIDDEN / HEADS;
    let (q, kv) = (HEADS * head_dim, KV_HEADS * head_dim);
    // Scaled so that activations stay of order 1.
    let w = 1.7 / (HIDDEN as f32).sqrt();
    let down = 1.0 / (INTERMEDIATE as f32).sqrt();
    let mut tensors = HashMap::from([
        (
            "model.embed_tokens.weight".to_string(),
            random(&[vocab, HIDDEN], 0.5, 0.0)?,
        ),
        (
            "model.norm.weight".to_string(),
            random(&[HIDDEN], 0.2, 1.0)?,
        ),
    ]);
    for layer in 0..LAYERS {
        let parts = [
            ("self_attn.q_proj.weight", vec![q, HIDDEN], w, 0.0),
            ("self_attn.k_proj.weight", vec![kv, HIDDEN], w, 0.0),
            ("self_attn.v_proj.weight", vec![kv, HIDDEN], w, 0.0),
            ("self_attn.o_proj.weight", vec![HIDDEN, q], w, 0.0),
            ("self_attn.q_proj.bias", vec![q], 0.3, 0.0),
            ("self_attn.k_proj.bias", vec![kv], 0.3, 0.0),
            ("self_attn.v_proj.bias", vec![kv], 0.3, 0.0),
            ("mlp.gate_proj.weight", vec![INTERMEDIATE, HIDDEN], w, 0.0),
            ("mlp.up_proj.weight", vec![INTERMEDIATE, HIDDEN], w, 0.0),
            (
                "mlp.down_proj.weight",
                vec![HIDDEN, INTERMEDIATE],
                down,
                0.0,
            ),
            ("input_layernorm.weight", vec![HIDDEN], 0.2, 1.0),
            ("post_attention_layernorm.weight", vec![HIDDEN], 0.2, 1.0),
        ];
        for (name, shape, scale, offset) in parts {
            let tensor = random(&shape, scale, offset)?;
            tensors.insert(format!("model.layers.{layer}.{name}"), tensor);
        }
    }
    Transformer::from_tensors(config, tensors, &LoadOptions::default())
}
