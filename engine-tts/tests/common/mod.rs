//! The CosyVoice 2 fixtures (`tests/data/cosyvoice2/*.safetensors`, written by
//! `reference/make_cosyvoice2_fixtures.py`) and the modules built from their tiny
//! configurations, shared by the parity, pipeline and SSD tests ([`ssd`]), and by `spec-train`'s
//! test of a trained SSD draft (which includes this module by path: the files are found from
//! the workspace, `../engine-tts/…` of either crate).

#![allow(dead_code)]

pub mod ssd;

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use engine_llm::{LoadOptions, Requantize, TransformerConfig};
use engine_tts::cosyvoice::flow::{Flow, FlowConfig};
use engine_tts::cosyvoice::hift::{Hift, HiftConfig};
use engine_tts::cosyvoice::lm::{SpeechLm, SpeechLmConfig};

/// A fixture's tensors by prefix (`w.`, `in.`, `out.`) and its configuration.
pub struct Fixture {
    pub tensors: HashMap<String, Tensor>,
    pub config: serde_json::Value,
}

impl Fixture {
    pub fn read(name: &str) -> Self {
        let path: PathBuf = [
            env!("CARGO_MANIFEST_DIR"),
            "../engine-tts/tests/data/cosyvoice2",
            name,
        ]
        .iter()
        .collect();
        let bytes = std::fs::read(&path).unwrap();
        let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let config = metadata.metadata().as_ref().unwrap()["config"].clone();
        Self {
            tensors: candle_core::safetensors::load(&path, &Device::Cpu).unwrap(),
            config: serde_json::from_str(&config).unwrap(),
        }
    }

    /// The tensors named `prefix…`, without the prefix.
    pub fn with_prefix(&self, prefix: &str) -> HashMap<String, Tensor> {
        self.tensors
            .iter()
            .filter_map(|(k, t)| k.strip_prefix(prefix).map(|k| (k.to_string(), t.clone())))
            .collect()
    }

    pub fn ids(&self, name: &str) -> Vec<u32> {
        let t = &self.tensors[name];
        t.flatten_all()
            .unwrap()
            .to_vec1::<i64>()
            .unwrap()
            .into_iter()
            .map(|v| v as u32)
            .collect()
    }
}

/// The fixture's speech-token LM, its weights kept exact (f32).
pub fn speech_lm(fixture: &Fixture) -> SpeechLm {
    let speech_tokens = fixture.config["speech_token_size"].as_u64().unwrap() as usize;
    speech_lm_with(fixture, fixture.with_prefix("w."), speech_tokens)
}

/// A speech-token LM of the fixture's backbone configuration with other `weights` (state-dict
/// names) and `speech_tokens` speech tokens.
pub fn speech_lm_with(
    fixture: &Fixture,
    weights: HashMap<String, Tensor>,
    speech_tokens: usize,
) -> SpeechLm {
    let backbone = TransformerConfig::from_hf_json(&fixture.config["qwen2"].to_string()).unwrap();
    let config = SpeechLmConfig {
        speech_token_size: speech_tokens,
        ..SpeechLmConfig::default()
    };
    let options = LoadOptions {
        requantize: Requantize::Keep,
        ..LoadOptions::default()
    };
    SpeechLm::from_tensors(weights, backbone, config, &options).unwrap()
}

/// The tiny HiFT configuration of the fixture.
pub fn hift_config(fixture: &Fixture) -> HiftConfig {
    let c = &fixture.config;
    let size = |key: &str| c[key].as_u64().unwrap() as usize;
    let sizes = |key: &str| -> Vec<usize> {
        c[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect()
    };
    HiftConfig {
        base_channels: size("base_channels"),
        cond_channels: size("cond_channels"),
        nb_harmonics: size("nb_harmonics"),
        sampling_rate: size("sampling_rate"),
        upsample_rates: sizes("upsample_rates"),
        upsample_kernel_sizes: sizes("upsample_kernel_sizes"),
        n_fft: size("n_fft"),
        hop_len: size("hop_len"),
        resblock_kernel_sizes: sizes("resblock_kernel_sizes"),
        resblock_dilations: sizes("dilations"),
        source_resblock_kernel_sizes: sizes("source_resblock_kernel_sizes"),
        source_resblock_dilations: sizes("dilations"),
        lrelu_slope: c["lrelu_slope"].as_f64().unwrap(),
        audio_limit: c["audio_limit"].as_f64().unwrap(),
        nsf_alpha: c["nsf_alpha"].as_f64().unwrap() as f32,
        nsf_sigma: c["nsf_sigma"].as_f64().unwrap() as f32,
        nsf_voiced_threshold: c["nsf_voiced_threshold"].as_f64().unwrap() as f32,
        ..HiftConfig::default()
    }
}

pub fn hift(fixture: &Fixture) -> Hift {
    Hift::from_tensors(
        fixture.with_prefix("w."),
        hift_config(fixture),
        &Device::Cpu,
    )
    .unwrap()
}

/// The tiny flow configuration of the fixture.
pub fn flow_config(fixture: &Fixture) -> FlowConfig {
    let c = &fixture.config;
    let n = |key: &str| c[key].as_u64().unwrap() as usize;
    FlowConfig {
        vocab_size: n("vocab"),
        encoder_dim: n("D"),
        encoder_heads: n("heads"),
        encoder_ffn: n("linear_units"),
        encoder_blocks: n("num_blocks"),
        up_blocks: n("up_blocks"),
        encoder_chunk: n("static_chunk_size"),
        pre_lookahead: n("pre_lookahead_len"),
        decoder_channels: c["decoder_channels"][0].as_u64().unwrap() as usize,
        decoder_heads: n("num_heads"),
        decoder_head_dim: n("attention_head_dim"),
        decoder_transformer_blocks: n("n_blocks"),
        decoder_mid_blocks: n("num_mid_blocks"),
        decoder_chunk: n("decoder_static_chunk_size"),
        n_timesteps: n("n_timesteps"),
        cfg_rate: c["inference_cfg_rate"].as_f64().unwrap(),
        ..FlowConfig::default()
    }
}

pub fn flow(fixture: &Fixture) -> Flow {
    Flow::from_tensors(
        fixture.with_prefix("w."),
        flow_config(fixture),
        &Device::Cpu,
    )
    .unwrap()
}

/// Every tensor of a released checkpoint's layout (`reference/NAME`: one `name<TAB>[shape]` per
/// line), filled with `value`.
pub fn released_layout(name: &str, value: f32) -> HashMap<String, Tensor> {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "../engine-tts/reference", name]
        .iter()
        .collect();
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, shape) = line.split_once('\t').unwrap();
            let shape: Vec<usize> = shape
                .trim_matches(|c| c == '[' || c == ']')
                .split(", ")
                .map(|d| d.parse().unwrap())
                .collect();
            let tensor = Tensor::full(value, shape, &Device::Cpu).unwrap();
            (name.to_string(), tensor)
        })
        .collect()
}
