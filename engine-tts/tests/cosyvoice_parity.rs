//! CosyVoice 2 against the reference PyTorch code: tiny random configurations of each module
//! built by `engine-tts/reference/make_cosyvoice2_fixtures.py` (weights under their checkpoint
//! names, inputs and the reference's outputs in `tests/data/cosyvoice2/*.safetensors`).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use engine_llm::{LoadOptions, Requantize, TransformerConfig};
use engine_tts::cosyvoice::flow::{reference_noise, Flow, FlowConfig, FlowPrompt, FlowStream};
use engine_tts::cosyvoice::hift::{Hift, HiftConfig, SineNoise};
use engine_tts::cosyvoice::lm::{SpeechLm, SpeechLmConfig};
use engine_tts::cosyvoice::CosyVoiceError;
use spec_core::sampling::repetition_aware::Uniforms;

mod common;
use common::{flow, flow_config, hift, hift_config, released_layout, speech_lm, Fixture};

/// The reference's recorded uniform numbers, in order.
struct Replay(std::vec::IntoIter<f64>);

impl Uniforms for Replay {
    fn next_uniform(&mut self) -> f64 {
        self.0
            .next()
            .expect("no more recorded uniform numbers than the reference drew")
    }
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

/// The sine generator's noise as the reference drew it.
struct RecordedNoise(Tensor);

impl SineNoise for RecordedNoise {
    fn noise(
        &mut self,
        (batch, samples, harmonics): (usize, usize, usize),
        _device: &Device,
    ) -> engine_tts::cosyvoice::Result<Tensor> {
        assert_eq!(self.0.dims(), [batch, samples, harmonics]);
        Ok(self.0.clone())
    }
}

/// Asserts `ours` matches the reference tensor `name` within `tolerance`, absolute.
fn assert_close(fixture: &Fixture, name: &str, ours: &Tensor, tolerance: f32) {
    let reference = &fixture.tensors[name];
    assert_eq!(ours.dims(), reference.dims(), "{name}");
    let difference = max_difference(ours, reference);
    eprintln!("{name}: max |difference| {difference:e}");
    assert!(difference < tolerance, "{name} differs by {difference}");
}

#[test]
fn the_hift_vocoder_matches_the_reference() {
    let fixture = Fixture::read("hift_tiny.safetensors");
    let vocoder = hift(&fixture);
    let mel = &fixture.tensors["in.mel"];
    let frames = fixture.config["frames"].as_u64().unwrap() as usize;
    assert_eq!(mel.dims(), [1, 80, frames]);

    // F0: values up to ~200 Hz, compared relative to each value.
    let f0 = vocoder.f0(mel).unwrap();
    let reference = &fixture.tensors["out.f0"];
    assert_eq!(f0.dims(), reference.dims());
    let ours: Vec<f32> = f0.flatten_all().unwrap().to_vec1().unwrap();
    let theirs: Vec<f32> = reference.flatten_all().unwrap().to_vec1().unwrap();
    let relative = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs() / b.abs())
        .fold(0f32, f32::max);
    eprintln!("out.f0: max relative difference {relative:e}");
    assert!(relative < 1e-3, "f0 differs by {relative} relative");
    assert!(theirs.iter().any(|&f| f < 10.0) && theirs.iter().any(|&f| f > 10.0));

    // The source on the reference's noise, then the whole vocoder.
    let source = vocoder
        .source(
            &f0,
            &mut RecordedNoise(fixture.tensors["in.sine_noise"].clone()),
        )
        .unwrap();
    assert_close(&fixture, "out.source", &source, 1e-4);
    let (speech, source) = vocoder
        .inference(
            mel,
            None,
            &mut RecordedNoise(fixture.tensors["in.sine_noise"].clone()),
        )
        .unwrap();
    assert_close(&fixture, "out.source", &source, 1e-4);
    assert_close(&fixture, "out.speech", &speech, 1e-4);

    // Decoding the reference's own source: no noise involved.
    let decoded = vocoder.decode(mel, &fixture.tensors["out.source"]).unwrap();
    assert_close(&fixture, "out.decode_given_source", &decoded, 1e-4);

    // Streaming: the previous chunk's source replaces the start of this one.
    let (speech, source) = vocoder
        .inference(
            mel,
            Some(&fixture.tensors["in.cache_source"]),
            &mut RecordedNoise(fixture.tensors["in.sine_noise_cached"].clone()),
        )
        .unwrap();
    assert_close(&fixture, "out.source_cached", &source, 1e-4);
    assert_close(&fixture, "out.speech_cached", &speech, 1e-4);
}

#[test]
fn hift_bad_weights_and_input_are_typed_errors() {
    let fixture = Fixture::read("hift_tiny.safetensors");
    let config = hift_config(&fixture);
    let mut missing = fixture.with_prefix("w.");
    missing.remove("ups.1.parametrizations.weight.original0");
    let err = Hift::from_tensors(missing, config.clone(), &Device::Cpu).unwrap_err();
    assert!(
        matches!(err, CosyVoiceError::Weights { ref name, .. }
            if name == "ups.1.parametrizations.weight.original0"),
        "{err}"
    );
    let wider = HiftConfig {
        base_channels: 64,
        ..config.clone()
    };
    let err = Hift::from_tensors(fixture.with_prefix("w."), wider, &Device::Cpu).unwrap_err();
    assert!(
        matches!(err, CosyVoiceError::Weights { ref reason, .. } if reason.contains("shape")),
        "{err}"
    );

    let vocoder = hift(&fixture);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
    let wrong_mel = Tensor::zeros((1, 40, 3), DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        vocoder.inference(&wrong_mel, None, &mut rng),
        Err(CosyVoiceError::Input(_))
    ));
    let mel = &fixture.tensors["in.mel"];
    let too_long = Tensor::zeros((1, 1, 6000), DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        vocoder.inference(mel, Some(&too_long), &mut rng),
        Err(CosyVoiceError::Input(_))
    ));
}

#[test]
fn hift_draws_its_own_noise_from_a_random_number_generator() {
    let fixture = Fixture::read("hift_tiny.safetensors");
    let vocoder = hift(&fixture);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let noise = rng.noise((2, 5000, 9), &Device::Cpu).unwrap();
    assert_eq!(noise.dims(), [2, 5000, 9]);
    let values: Vec<f32> = noise.flatten_all().unwrap().to_vec1().unwrap();
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let variance = values
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    assert!(mean.abs() < 0.02, "mean {mean}");
    assert!((variance - 1.0).abs() < 0.03, "variance {variance}");

    // Fresh noise changes the source only by the noise term: the speech stays close to the
    // reference's and within the audio limit.
    let mel = &fixture.tensors["in.mel"];
    let (speech, _) = vocoder.inference(mel, None, &mut rng).unwrap();
    let peak: f32 = speech
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert!(peak <= 0.99 && peak > 0.0, "peak {peak}");
    let distance = max_difference(&speech, &fixture.tensors["out.speech"]);
    assert!(
        distance < 0.1,
        "speech moved by {distance} with other noise"
    );
}

#[test]
fn hift_loads_other_weight_names_and_files() {
    let fixture = Fixture::read("hift_tiny.safetensors");
    let config = hift_config(&fixture);
    let mel = &fixture.tensors["in.mel"];
    let source = &fixture.tensors["out.source"];

    // Older weight norm (`weight_g` / `weight_v`) under a `generator.` prefix.
    let renamed: HashMap<String, Tensor> = fixture
        .with_prefix("w.")
        .into_iter()
        .map(|(name, t)| {
            let name = name
                .replace(".parametrizations.weight.original0", ".weight_g")
                .replace(".parametrizations.weight.original1", ".weight_v");
            (format!("generator.{name}"), t)
        })
        .collect();
    let vocoder = Hift::from_tensors(renamed, config.clone(), &Device::Cpu).unwrap();
    assert_close(
        &fixture,
        "out.decode_given_source",
        &vocoder.decode(mel, source).unwrap(),
        1e-4,
    );

    // A safetensors file of the state dict.
    let path = std::env::temp_dir().join(format!("hift_tiny_{}.safetensors", std::process::id()));
    candle_core::safetensors::save(&fixture.with_prefix("w."), &path).unwrap();
    let loaded = Hift::load(&path, config.clone(), &Device::Cpu);
    std::fs::remove_file(&path).unwrap();
    assert_close(
        &fixture,
        "out.decode_given_source",
        &loaded.unwrap().decode(mel, source).unwrap(),
        1e-4,
    );
    let err = Hift::load(&path, config, &Device::Cpu).unwrap_err();
    assert!(matches!(err, CosyVoiceError::File { .. }), "{err}");
}

/// The released `hift.pt`'s names and shapes (`reference/hift_pt_keys_full_config.txt`) load
/// with the default configuration.
#[test]
fn hift_takes_the_released_checkpoints_names_and_shapes() {
    let tensors = released_layout("hift_pt_keys_full_config.txt", 1.0);
    assert_eq!(tensors.len(), 328);
    let vocoder = Hift::from_tensors(tensors, HiftConfig::default(), &Device::Cpu).unwrap();
    let mel = Tensor::zeros((1, 80, 2), DType::F32, &Device::Cpu).unwrap();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
    let (speech, source) = vocoder.inference(&mel, None, &mut rng).unwrap();
    assert_eq!(speech.dims(), [1, 960]);
    assert_eq!(source.dims(), [1, 1, 960]);
}

fn flow_prompt(fixture: &Fixture) -> FlowPrompt {
    FlowPrompt {
        tokens: fixture.ids("in.prompt_token"),
        mel: fixture.tensors["in.prompt_feat"].clone(),
        speaker: fixture.tensors["in.embedding"].clone(),
    }
}

#[test]
fn the_flow_encoder_matches_the_reference() {
    let fixture = Fixture::read("flow_tiny.safetensors");
    let flow = flow(&fixture);
    let prompt = fixture.ids("in.prompt_token");
    let tokens: Vec<u32> = prompt
        .iter()
        .chain(&fixture.ids("in.token"))
        .copied()
        .collect();
    let x = flow.embed_tokens(&tokens).unwrap();
    let n = tokens.len() - 3;
    for streaming in [false, true] {
        let s = u8::from(streaming);
        let full = flow.encode(&x, None, streaming).unwrap();
        assert_close(
            &fixture,
            &format!("out.encoder_full_stream{s}"),
            &full,
            1e-4,
        );
        let head = x.narrow(1, 0, n).unwrap();
        let context = x.narrow(1, n, 3).unwrap();
        let with_context = flow.encode(&head, Some(&context), streaming).unwrap();
        assert_close(
            &fixture,
            &format!("out.encoder_ctx_stream{s}"),
            &with_context,
            1e-4,
        );
    }
}

#[test]
fn the_flow_estimator_matches_the_reference() {
    let fixture = Fixture::read("flow_tiny.safetensors");
    let flow = flow(&fixture);
    let input = |name: &str| &fixture.tensors[&format!("in.est_{name}")];
    for streaming in [false, true] {
        let velocity = flow
            .estimate(
                input("x"),
                input("mask"),
                input("mu"),
                input("t"),
                input("spks"),
                input("cond"),
                streaming,
            )
            .unwrap();
        let name = format!("out.estimator_stream{}", u8::from(streaming));
        assert_close(&fixture, &name, &velocity, 1e-4);
    }
}

#[test]
fn the_flow_matches_the_reference_offline() {
    let fixture = Fixture::read("flow_tiny.safetensors");
    let flow = flow(&fixture);
    let noise = &fixture.tensors["in.rand_noise"];
    let mel = flow
        .inference(
            &fixture.ids("in.token"),
            &flow_prompt(&fixture),
            noise,
            false,
            true,
        )
        .unwrap();
    assert_close(&fixture, "out.mel_offline", &mel, 1e-4);
}

#[test]
fn flow_bad_weights_and_input_are_typed_errors() {
    let fixture = Fixture::read("flow_tiny.safetensors");
    let config = flow_config(&fixture);
    let mut missing = fixture.with_prefix("w.");
    let name = "decoder.estimator.mid_blocks.1.1.0.attn1.to_k.weight";
    missing.remove(name).unwrap();
    let err = Flow::from_tensors(missing, config.clone(), &Device::Cpu).unwrap_err();
    assert!(
        matches!(err, CosyVoiceError::Weights { name: ref n, .. } if n == name),
        "{err}"
    );
    let wider = FlowConfig {
        encoder_ffn: 128,
        ..config
    };
    let err = Flow::from_tensors(fixture.with_prefix("w."), wider, &Device::Cpu).unwrap_err();
    assert!(
        matches!(err, CosyVoiceError::Weights { ref reason, .. } if reason.contains("shape")),
        "{err}"
    );

    let flow = flow(&fixture);
    let prompt = flow_prompt(&fixture);
    let noise = &fixture.tensors["in.rand_noise"];
    assert!(matches!(
        flow.inference(&[3, 100], &prompt, noise, false, true),
        Err(CosyVoiceError::Input(_))
    ));
    let short_prompt_mel = FlowPrompt {
        mel: prompt.mel.narrow(1, 0, 10).unwrap(),
        ..prompt.clone()
    };
    assert!(matches!(
        flow.inference(&[1, 2, 3, 4], &short_prompt_mel, noise, false, true),
        Err(CosyVoiceError::Input(_))
    ));
    assert!(matches!(
        flow.inference(&[1, 2], &prompt, noise, true, false),
        Err(CosyVoiceError::Input(_))
    ));
    assert!(matches!(
        FlowStream::new(&flow, &prompt, noise, 0),
        Err(CosyVoiceError::Config(_))
    ));
    let short_noise = noise.narrow(2, 0, 20).unwrap();
    assert!(matches!(
        flow.inference(&[1, 2, 3, 4], &prompt, &short_noise, false, true),
        Err(CosyVoiceError::Input(_))
    ));
}

/// The fixed noise recomputed in Rust is the reference's (`in.rand_noise` is its first frames).
#[test]
fn flow_reference_noise_is_torchs_seed_0_normals() {
    let fixture = Fixture::read("flow_tiny.safetensors");
    let recorded = &fixture.tensors["in.rand_noise"];
    let noise = reference_noise(80, &Device::Cpu).unwrap();
    assert_eq!(noise.dims(), [1, 80, 15000]);
    let ours = noise.narrow(2, 0, recorded.dim(2).unwrap()).unwrap();
    assert_close(&fixture, "in.rand_noise", &ours, 1e-6);

    // Through the whole flow, the offline mel stays at parity.
    let flow = flow(&fixture);
    let mel = flow
        .inference(
            &fixture.ids("in.token"),
            &flow_prompt(&fixture),
            &noise,
            false,
            true,
        )
        .unwrap();
    assert_close(&fixture, "out.mel_offline", &mel, 1e-4);
}

#[test]
fn flow_loads_a_safetensors_file() {
    let fixture = Fixture::read("flow_tiny.safetensors");
    let config = flow_config(&fixture);
    let path = std::env::temp_dir().join(format!("flow_tiny_{}.safetensors", std::process::id()));
    candle_core::safetensors::save(&fixture.with_prefix("w."), &path).unwrap();
    let loaded = Flow::load(&path, config.clone(), &Device::Cpu);
    std::fs::remove_file(&path).unwrap();
    let flow = loaded.unwrap();
    let noise = &fixture.tensors["in.rand_noise"];
    let mel = flow
        .inference(
            &fixture.ids("in.token"),
            &flow_prompt(&fixture),
            noise,
            false,
            true,
        )
        .unwrap();
    assert_close(&fixture, "out.mel_offline", &mel, 1e-4);
    let err = Flow::load(&path, config, &Device::Cpu).unwrap_err();
    assert!(matches!(err, CosyVoiceError::File { .. }), "{err}");
}

/// The released `flow.pt`'s names and shapes (`reference/flow_pt_keys_full_config.txt`) load
/// with the default configuration and run: with every weight zero the velocity is zero, so the
/// new frames are the noise's.
#[test]
fn flow_takes_the_released_checkpoints_names_and_shapes() {
    let tensors = released_layout("flow_pt_keys_full_config.txt", 0.0);
    assert_eq!(tensors.len(), 1121);
    let flow = Flow::from_tensors(tensors, FlowConfig::default(), &Device::Cpu).unwrap();
    let prompt = FlowPrompt {
        tokens: vec![1, 2],
        mel: Tensor::zeros((1, 4, 80), DType::F32, &Device::Cpu).unwrap(),
        speaker: Tensor::ones((1, 192), DType::F32, &Device::Cpu).unwrap(),
    };
    let noise = reference_noise(80, &Device::Cpu).unwrap();
    let mel = flow
        .inference(&[6560, 0, 7, 8, 9], &prompt, &noise, true, false)
        .unwrap();
    let expected = noise.narrow(2, 4, 4).unwrap();
    assert_eq!(mel.dims(), expected.dims());
    assert_eq!(max_difference(&mel, &expected), 0.0);
}

/// `FlowStream` computes the reference's schedule itself: fed one token at a time, it returns
/// the fixture's chunks at the fixture's hops (hop 5 growing to at most 20), then the rest.
#[test]
fn flow_stream_follows_the_reference_schedule() {
    let fixture = Fixture::read("flow_tiny.safetensors");
    let flow = flow(&fixture);
    let prompt = flow_prompt(&fixture);
    let tokens = fixture.ids("in.token");
    let noise = &fixture.tensors["in.rand_noise"];
    let hop = fixture.config["token_hop_len"].as_u64().unwrap() as usize;
    let mut stream = FlowStream::new(&flow, &prompt, noise, hop).unwrap();
    let mut chunks = Vec::new();
    let mut offsets = vec![0];
    for generated in 1..=tokens.len() {
        if let Some(chunk) = stream.next_chunk(&tokens[..generated]).unwrap() {
            chunks.push(chunk);
            offsets.push(stream.offset());
        }
    }
    let hops: Vec<usize> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
    let reference_hops: Vec<usize> = fixture
        .ids("out.stream_hops")
        .into_iter()
        .map(|h| h as usize)
        .collect();
    assert_eq!(hops, reference_hops);
    chunks.push(stream.finish(&tokens).unwrap());
    for (i, chunk) in chunks.iter().enumerate() {
        assert_close(&fixture, &format!("out.mel_stream_chunk{i}"), chunk, 1e-4);
    }
}
