//! CosyVoice 2 end to end on the three tiny parity fixtures (LM speech tokens 48 < flow
//! vocabulary 100; flow mel 80 = HiFT input 80), a word-level tokenizer over the LM's 96 text
//! tokens and a made-up speaker prompt of the right shapes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use candle_core::{Device, Tensor};
use engine_tts::cosyvoice::flow::Flow;
use engine_tts::cosyvoice::hift::Hift;
use engine_tts::cosyvoice::lm::{SpeechLm, SsdConfig};
use engine_tts::cosyvoice::pipeline::load_tokenizer;
use engine_tts::cosyvoice::{CosyVoice2, CosyVoiceError, CosyVoiceSynthesizer, SpeakerPrompt};
use spec_voice::SentenceSynthesizer;

mod common;
use common::Fixture;

/// Samples per mel frame, and mel frames per speech token.
const SAMPLES_PER_FRAME: usize = 480;
const FRAMES_PER_TOKEN: usize = 2;
/// HiFT's held-back audio between streamed chunks: 8 mel frames.
const OVERLAP: usize = 8 * SAMPLES_PER_FRAME;
/// The hop the fixtures' streaming uses (CosyVoice 2's is 25).
const HOP: usize = 5;
const PROMPT_TOKENS: [u32; 7] = [3, 17, 29, 5, 41, 8, 22];
const WORDS: [&str; 12] = [
    "the", "cat", "sat", "on", "a", "warm", "mat", "today", "and", "then", "slept", "well",
];
/// Eight words: at least 16 speech tokens, enough for two streamed chunks at hop 5.
const TEXT: &str = "the cat sat on a warm mat today";

fn lm() -> SpeechLm {
    common::speech_lm(&Fixture::read("llm_tiny.safetensors"))
}

fn flow() -> Flow {
    common::flow(&Fixture::read("flow_tiny.safetensors"))
}

fn hift() -> Hift {
    common::hift(&Fixture::read("hift_tiny.safetensors"))
}

/// A word-level tokenizer: `[UNK]` is 0, the words 1 to 12.
fn tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> =
        std::iter::once(("[UNK]".to_string(), 0.into()))
            .chain(
                WORDS
                    .iter()
                    .enumerate()
                    .map(|(i, w)| (w.to_string(), (i + 1).into())),
            )
            .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
}

/// Prompt mel `[frames, 80]` of smooth made-up log-mel values, and a speaker vector `[192]`.
fn prompt_tensors(frames: usize) -> (Tensor, Tensor) {
    let mel: Vec<f32> = (0..frames * 80)
        .map(|i| -4.0 + 2.0 * (i as f32 * 0.37).sin())
        .collect();
    let speaker: Vec<f32> = (0..192).map(|i| (i as f32 * 0.11).cos()).collect();
    (
        Tensor::from_vec(mel, (frames, 80), &Device::Cpu).unwrap(),
        Tensor::from_vec(speaker, 192, &Device::Cpu).unwrap(),
    )
}

fn prompt() -> SpeakerPrompt {
    let (mel, speaker) = prompt_tensors(2 * PROMPT_TOKENS.len());
    SpeakerPrompt::new(vec![9, 10], PROMPT_TOKENS.to_vec(), mel, speaker).unwrap()
}

fn model(hop: usize) -> CosyVoice2 {
    let tokenizer = tokenizers::Tokenizer::from_str(&tokenizer_json()).unwrap();
    CosyVoice2::from_parts(lm(), flow(), hift(), tokenizer, prompt())
        .unwrap()
        .with_token_hop(hop)
        .unwrap()
}

fn stream(model: &mut CosyVoice2, text: &str) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut chunks = Vec::new();
    let tokens = model
        .synthesize_stream(text, &mut |chunk| {
            chunks.push(chunk);
            Ok(())
        })
        .unwrap();
    (tokens, chunks)
}

/// The reference's token schedule for `tokens` speech tokens after `prompt` prompt tokens:
/// the hops of the streamed chunks and the tokens of the last call.
fn schedule(tokens: usize, prompt: usize, hop: usize) -> (Vec<usize>, usize) {
    let pad = prompt.div_ceil(hop) * hop - prompt;
    let (mut hop_now, mut offset, mut hops) = (hop, 0, Vec::new());
    loop {
        let this = if offset == 0 { hop_now + pad } else { hop_now };
        if tokens - offset < this + 3 {
            return (hops, tokens - offset);
        }
        hops.push(this);
        offset += this;
        hop_now = (2 * hop_now).min(4 * hop);
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("cosyvoice-pipeline-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn one_shot_audio_has_480_samples_per_mel_frame_of_the_tokens() {
    let mut model = model(HOP);
    assert_eq!(model.sample_rate(), 24000);
    let speech = model.speak(TEXT).unwrap();
    assert!(
        speech.tokens.len() >= 2 * 8,
        "{} tokens",
        speech.tokens.len()
    );
    assert!(speech.tokens.iter().all(|&t| t < 48));
    assert_eq!(
        speech.audio.len(),
        SAMPLES_PER_FRAME * FRAMES_PER_TOKEN * speech.tokens.len()
    );
    assert!(speech
        .audio
        .iter()
        .all(|s| s.is_finite() && s.abs() <= 0.99));
    assert!(speech.audio.iter().any(|&s| s != 0.0));
    assert_eq!(model.synthesize(TEXT).unwrap(), speech.audio);
}

/// Streaming draws the same tokens, and its chunks have the lengths the schedule gives: the first
/// holds back HiFT's 3840-sample overlap, the last adds it, so the total is the one-shot length.
/// The samples differ from the one-shot audio (chunk-causal attention, vocoding in pieces,
/// cross-fades) but stay bounded and continuous across chunks.
#[test]
fn streamed_chunks_follow_the_schedule() {
    let mut model = model(HOP);
    let one_shot = model.speak(TEXT).unwrap();
    let (tokens, chunks) = stream(&mut model, TEXT);
    assert_eq!(tokens, one_shot.tokens);
    let (hops, rest) = schedule(tokens.len(), PROMPT_TOKENS.len(), HOP);
    assert!(hops.len() >= 2, "hops {hops:?}");
    assert_eq!(
        hops[0], 8,
        "the first hop is lengthened from 5 to fill whole hops with the 7 prompt tokens"
    );
    let per_token = SAMPLES_PER_FRAME * FRAMES_PER_TOKEN;
    let mut expected: Vec<usize> = hops.iter().map(|h| h * per_token).collect();
    expected[0] -= OVERLAP;
    expected.push(rest * per_token + OVERLAP);
    let lengths: Vec<usize> = chunks.iter().map(Vec::len).collect();
    assert_eq!(lengths, expected);
    let streamed: Vec<f32> = chunks.concat();
    assert_eq!(streamed.len(), one_shot.audio.len());
    assert!(streamed.iter().all(|s| s.is_finite() && s.abs() <= 0.99));
    assert_ne!(streamed, one_shot.audio);
    // No click where chunks meet: no step there is larger than the largest inside a chunk.
    let step = |a: f32, b: f32| (b - a).abs();
    let inside = chunks
        .iter()
        .flat_map(|c| c.windows(2).map(|w| step(w[0], w[1])))
        .fold(0.0, f32::max);
    for pair in chunks.windows(2) {
        let at_boundary = step(*pair[0].last().unwrap(), pair[1][0]);
        assert!(
            at_boundary <= inside,
            "a step of {at_boundary} between chunks, at most {inside} inside them"
        );
    }
}

/// When the tokens never hold a hop and its look-ahead, the stream is the one-shot call.
#[test]
fn a_stream_shorter_than_its_first_hop_is_the_one_shot_audio() {
    let mut model = model(100);
    let one_shot = model.speak(TEXT).unwrap();
    let (tokens, chunks) = stream(&mut model, TEXT);
    assert!(tokens.len() < 100 + 3);
    assert_eq!(tokens, one_shot.tokens);
    assert_eq!(chunks, vec![one_shot.audio]);
}

#[test]
fn the_seed_decides_the_audio() {
    let mut model = model(HOP).with_seed(7);
    let first = model.synthesize(TEXT).unwrap();
    assert_eq!(model.synthesize(TEXT).unwrap(), first);
    let (_, chunks) = stream(&mut model, TEXT);
    assert_eq!(stream(&mut model, TEXT).1, chunks);
    let mut model = model.with_seed(8);
    assert_eq!(model.seed(), 8);
    assert_ne!(model.synthesize(TEXT).unwrap(), first);
}

#[test]
fn empty_text_and_bad_settings_are_typed_errors() {
    let mut model = model(HOP);
    for text in ["", "  \n"] {
        assert!(matches!(
            model.synthesize(text),
            Err(CosyVoiceError::Input(_))
        ));
        let result = model.synthesize_stream(text, &mut |_| Ok(()));
        assert!(matches!(result, Err(CosyVoiceError::Input(_))));
    }
    assert!(matches!(
        model.with_token_hop(3),
        Err(CosyVoiceError::Config(_))
    ));
}

fn expect_missing(result: engine_tts::cosyvoice::Result<CosyVoice2>, path: &Path) {
    match result {
        Err(CosyVoiceError::File { path: missing, .. }) => assert_eq!(missing, path),
        Err(other) => panic!("expected a missing {}, got {other}", path.display()),
        Ok(_) => panic!("expected a missing {}", path.display()),
    }
}

#[test]
fn a_missing_model_file_is_a_typed_error_naming_it() {
    let dir = temp_dir("missing");
    let speaker = dir.join("speaker.safetensors");
    expect_missing(CosyVoice2::load(&dir, &speaker), &dir.join("llm.pt"));
    for name in ["llm.pt", "flow.pt", "hift.pt"] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    expect_missing(
        CosyVoice2::load(&dir, &speaker),
        &dir.join("CosyVoice-BlankEN/config.json"),
    );
    std::fs::create_dir_all(dir.join("CosyVoice-BlankEN")).unwrap();
    std::fs::write(dir.join("CosyVoice-BlankEN/config.json"), b"{}").unwrap();
    // Without a tokenizer.json, the release's vocab.json and merges.txt.
    let blank = dir.join("CosyVoice-BlankEN");
    expect_missing(CosyVoice2::load(&dir, &speaker), &blank.join("vocab.json"));
    std::fs::write(blank.join("vocab.json"), r#"{"h":0,"i":1,"hi":2}"#).unwrap();
    expect_missing(CosyVoice2::load(&dir, &speaker), &blank.join("merges.txt"));
    std::fs::write(blank.join("merges.txt"), "#version: 0.2\nh i\n").unwrap();
    expect_missing(CosyVoice2::load(&dir, &speaker), &speaker);
    let rebuilt = load_tokenizer(&blank).unwrap();
    assert_eq!(rebuilt.encode("hi", false).unwrap().get_ids(), [2]);
    // A tokenizer.json, when present, is the tokenizer.
    std::fs::write(blank.join("tokenizer.json"), tokenizer_json()).unwrap();
    let word_level = load_tokenizer(&blank).unwrap();
    assert_eq!(
        word_level.get_vocab_size(true),
        tokenizers::Tokenizer::from_str(&tokenizer_json())
            .unwrap()
            .get_vocab_size(true)
    );
    expect_missing(CosyVoice2::load(&dir, &speaker), &speaker);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The safetensors prompt: its four tensors, cut by the zero-shot rule (tokens and mel frames to
/// `min(frames / 2, tokens)` and twice that); a missing tensor names itself.
#[test]
fn a_speaker_prompt_loads_from_safetensors() {
    let dir = temp_dir("prompt");
    let path = dir.join("speaker.safetensors");
    let (mel, speaker) = prompt_tensors(2 * PROMPT_TOKENS.len() + 1);
    let ids = |v: &[u32]| {
        Tensor::new(
            v.iter().map(|&t| i64::from(t)).collect::<Vec<_>>(),
            &Device::Cpu,
        )
        .unwrap()
    };
    let mut tensors = HashMap::from([
        ("prompt_text".to_string(), ids(&[9, 10])),
        ("prompt_speech_token".to_string(), ids(&PROMPT_TOKENS)),
        ("prompt_mel".to_string(), mel),
        ("speaker_embedding".to_string(), speaker),
    ]);
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let prompt = SpeakerPrompt::load(&path).unwrap();
    assert_eq!(prompt.text, [9, 10]);
    assert_eq!(prompt.speech_tokens, PROMPT_TOKENS);
    assert_eq!(prompt.mel.dims(), [14, 80]);
    assert_eq!(prompt.speaker.dims(), [192]);

    let (short_mel, _) = prompt_tensors(9);
    tensors.insert("prompt_mel".to_string(), short_mel);
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let prompt = SpeakerPrompt::load(&path).unwrap();
    assert_eq!(prompt.speech_tokens, PROMPT_TOKENS[..4]);
    assert_eq!(prompt.mel.dims(), [8, 80]);

    tensors.remove("speaker_embedding");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let err = SpeakerPrompt::load(&path).unwrap_err();
    assert!(
        matches!(&err, CosyVoiceError::File { reason, .. } if reason.contains("speaker_embedding")),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_sentence_synthesizer_streams_24_khz_chunks() {
    let mut reference = model(HOP);
    let (_, expected) = stream(&mut reference, TEXT);
    let mut tts = CosyVoiceSynthesizer::new(model(HOP));
    let synthesis = tts.synthesize(&format!("  {TEXT} ")).unwrap();
    assert_eq!(synthesis.sentence, TEXT);
    assert!(synthesis.chunks.iter().all(|c| c.sample_rate == 24000));
    let chunks: Vec<Vec<f32>> = synthesis.chunks.iter().map(|c| c.samples.clone()).collect();
    assert_eq!(chunks, expected);
    assert!(synthesis.first_audio_after > std::time::Duration::ZERO);
    assert!(matches!(
        tts.synthesize(" "),
        Err(spec_voice::Error::Input(_))
    ));
}

/// With an SSD draft attached, one-shot and streamed synthesis draw their tokens by
/// speculative decoding: the same tokens for the same seed, on the same chunk schedule; a draft
/// with other speech tokens and bad settings are refused.
#[test]
fn synthesis_with_an_ssd_draft_streams_on_the_same_schedule() {
    let plain = model(HOP);
    let draft = plain.lm().draft_from_layers(&[0]).unwrap();
    let config = SsdConfig::default();
    let mut speculative = plain.with_ssd(draft, config).unwrap();
    let one_shot = speculative.speak(TEXT).unwrap();
    assert!(one_shot.tokens.len() >= 2 * 8);
    assert_eq!(
        one_shot.audio.len(),
        SAMPLES_PER_FRAME * FRAMES_PER_TOKEN * one_shot.tokens.len()
    );
    let (tokens, chunks) = stream(&mut speculative, TEXT);
    assert_eq!(tokens, one_shot.tokens);
    let (hops, rest) = schedule(tokens.len(), PROMPT_TOKENS.len(), HOP);
    let per_token = SAMPLES_PER_FRAME * FRAMES_PER_TOKEN;
    let mut expected: Vec<usize> = hops.iter().map(|h| h * per_token).collect();
    expected[0] -= OVERLAP;
    expected.push(rest * per_token + OVERLAP);
    assert_eq!(chunks.iter().map(Vec::len).collect::<Vec<_>>(), expected);

    let other = {
        let mut weights = Fixture::read("llm_tiny.safetensors").with_prefix("w.");
        for name in ["speech_embedding.weight", "llm_decoder.weight"] {
            let t = weights[name].narrow(0, 0, 41).unwrap();
            weights.insert(name.into(), t);
        }
        let b = weights["llm_decoder.bias"].narrow(0, 0, 41).unwrap();
        weights.insert("llm_decoder.bias".into(), b);
        common::speech_lm_with(&Fixture::read("llm_tiny.safetensors"), weights, 38)
    };
    assert!(model(HOP).with_ssd(other, config).is_err());
    let bad = SsdConfig {
        gamma: 0,
        ..SsdConfig::default()
    };
    let draft = model(HOP).lm().draft_from_layers(&[0]).unwrap();
    assert!(model(HOP).with_ssd(draft, bad).is_err());
}
