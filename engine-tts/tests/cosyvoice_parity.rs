//! CosyVoice 2 against the reference PyTorch code: tiny random configurations of each module
//! built by `engine-tts/reference/make_cosyvoice2_fixtures.py` (weights under their checkpoint
//! names, inputs and the reference's outputs in `tests/data/cosyvoice2/*.safetensors`).

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use engine_llm::{LoadOptions, Requantize, TransformerConfig};
use engine_tts::cosyvoice::lm::{SpeechLm, SpeechLmConfig};
use engine_tts::cosyvoice::sampling::Uniforms;
use engine_tts::cosyvoice::CosyVoiceError;

/// A fixture's tensors by prefix (`w.`, `in.`, `out.`) and its configuration.
struct Fixture {
    tensors: HashMap<String, Tensor>,
    config: serde_json::Value,
}

impl Fixture {
    fn read(name: &str) -> Self {
        let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests/data/cosyvoice2", name]
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
    fn with_prefix(&self, prefix: &str) -> HashMap<String, Tensor> {
        self.tensors
            .iter()
            .filter_map(|(k, t)| k.strip_prefix(prefix).map(|k| (k.to_string(), t.clone())))
            .collect()
    }

    fn ids(&self, name: &str) -> Vec<u32> {
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

/// The reference's recorded uniform numbers, in order.
struct Replay(std::vec::IntoIter<f64>);

impl Uniforms for Replay {
    fn next_uniform(&mut self) -> f64 {
        self.0
            .next()
            .expect("no more recorded uniform numbers than the reference drew")
    }
}

fn speech_lm(fixture: &Fixture) -> SpeechLm {
    let backbone = TransformerConfig::from_hf_json(&fixture.config["qwen2"].to_string()).unwrap();
    let config = SpeechLmConfig {
        speech_token_size: fixture.config["speech_token_size"].as_u64().unwrap() as usize,
        ..SpeechLmConfig::default()
    };
    let options = LoadOptions {
        requantize: Requantize::Keep,
        ..LoadOptions::default()
    };
    SpeechLm::from_tensors(fixture.with_prefix("w."), backbone, config, &options).unwrap()
}

fn max_difference(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

#[test]
fn the_speech_lm_matches_the_reference() {
    let fixture = Fixture::read("llm_tiny.safetensors");
    let mut lm = speech_lm(&fixture);
    let (text, prompt_text) = (fixture.ids("in.text"), fixture.ids("in.prompt_text"));
    let prompt_speech = fixture.ids("in.prompt_speech_token");
    let all_text: Vec<u32> = prompt_text.iter().chain(&text).copied().collect();

    // Teacher forcing over [sos, text, task id, prompt speech, speech].
    let ours = lm
        .log_probabilities(
            &all_text,
            &prompt_speech,
            &fixture.ids("in.teacher_speech_token"),
        )
        .unwrap();
    let reference = fixture.tensors["out.teacher_logp"].squeeze(0).unwrap();
    assert_eq!(ours.dims(), reference.dims());
    let difference = max_difference(&ours, &reference);
    assert!(
        difference < 1e-4,
        "log-probabilities differ by {difference}"
    );

    // Decoding with repetition-aware sampling on the reference's uniform numbers.
    let uniforms: Vec<f64> = fixture.tensors["in.unistream_uniforms"]
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap();
    let drawn = uniforms.len();
    let mut replay = Replay(uniforms.into_iter());
    let tokens = lm
        .generate(&text, &prompt_text, &prompt_speech, &mut replay)
        .unwrap();
    assert_eq!(tokens, fixture.ids("out.unistream_tokens"));
    assert_eq!(replay.0.len(), 0, "all {drawn} recorded draws were used");

    // Bistreaming, the text arriving one token at a time.
    let uniforms: Vec<f64> = fixture.tensors["in.bistream_uniforms"]
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap();
    let mut replay = Replay(uniforms.into_iter());
    let mut stream = lm.bistream(&prompt_text, &prompt_speech).unwrap();
    let mut tokens = Vec::new();
    for &t in &text {
        tokens.extend(stream.push_text(&[t], &mut replay).unwrap());
    }
    tokens.extend(stream.finish(&mut replay).unwrap());
    assert_eq!(tokens, fixture.ids("out.bistream_tokens"));
    assert_eq!(replay.0.len(), 0);
}

#[test]
fn bad_weights_and_input_are_typed_errors() {
    let fixture = Fixture::read("llm_tiny.safetensors");
    let backbone = TransformerConfig::from_hf_json(&fixture.config["qwen2"].to_string()).unwrap();
    let config = SpeechLmConfig {
        speech_token_size: 48,
        ..SpeechLmConfig::default()
    };
    let options = LoadOptions {
        requantize: Requantize::Keep,
        ..LoadOptions::default()
    };
    let mut missing = fixture.with_prefix("w.");
    missing.remove("llm_decoder.bias");
    let err = SpeechLm::from_tensors(missing, backbone.clone(), config, &options).unwrap_err();
    assert!(
        matches!(err, CosyVoiceError::Weights { ref name, .. } if name == "llm_decoder.bias"),
        "{err}"
    );
    let other_size = SpeechLmConfig {
        speech_token_size: 6561,
        ..config
    };
    let err = SpeechLm::from_tensors(fixture.with_prefix("w."), backbone, other_size, &options)
        .unwrap_err();
    assert!(err.to_string().contains("shape"), "{err}");

    let mut lm = speech_lm(&fixture);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
    assert!(matches!(
        lm.generate(&[], &[], &[], &mut rng),
        Err(CosyVoiceError::Input(_))
    ));
    assert!(matches!(
        lm.generate(&[1, 2], &[], &[51], &mut rng),
        Err(CosyVoiceError::Input(_))
    ));
    assert!(lm.generate(&[1, 2], &[], &[], &mut rng).is_ok());
    let err = lm.generate(&[500], &[], &[], &mut rng).unwrap_err();
    assert!(err.to_string().contains("500"), "{err}");
}
