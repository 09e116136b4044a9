//! Whisper on tiny random-weight models written in both layouts: loading, bit-exact batched
//! and tree forwards, rollback, beam search against a from-scratch reference, the logit rules
//! and the errors of bad input.

use candle_core::Device;
use candle_core::{DType, Tensor};
use engine_asr::testing::*;
use engine_asr::whisper::decode::{beam_window, run_prompt, sample_window};
use engine_asr::whisper::{LogitRules, WhisperTokenizer};
use engine_asr::{
    EncoderLength, Error, LoadOptions, StreamingTranscriber, TranscribeOptions, Transcriber,
    Whisper,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::decoder::forward_tokens;
use spec_core::{AcceptanceRule, Decoder, Forward, LogitRows, Logits};

fn load(dir: &std::path::Path) -> Whisper {
    Whisper::load(dir, &LoadOptions::default()).unwrap()
}

fn hf_model(seed: u64) -> (tempfile::TempDir, Whisper) {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), seed).unwrap();
    let model = load(dir.path());
    (dir, model)
}

fn rows(logits: &Logits) -> Vec<Vec<f32>> {
    logits.rows().map(<[f32]>::to_vec).collect()
}

#[test]
fn ctranslate2_and_hugging_face_layouts_give_identical_logits() {
    let hf = tempfile::tempdir().unwrap();
    write_hf(hf.path(), 3).unwrap();
    let mut a = load(hf.path());
    let mel = mel(2 * SOURCE_POSITIONS, 9).unwrap();
    a.encode(&mel).unwrap();
    let tokens = [START_OF_TRANSCRIPT, NO_TIMESTAMPS, 5, 9, 13];
    let expected = rows(&forward_tokens(&mut a, &tokens, LogitRows::All).unwrap());
    for dtype in [DType::F32, DType::F16] {
        let ct2 = tempfile::tempdir().unwrap();
        write_ct2(ct2.path(), 3, dtype).unwrap();
        let mut b = load(ct2.path());
        assert_eq!(b.config(), a.config());
        b.encode(&mel).unwrap();
        let got = rows(&forward_tokens(&mut b, &tokens, LogitRows::All).unwrap());
        if dtype == DType::F32 {
            // Same values, fused projections split: the very same matrices.
            assert_eq!(got, expected);
        } else {
            let diff = got
                .iter()
                .flatten()
                .zip(expected.iter().flatten())
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            let scale = expected.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
            assert!(
                diff < 0.03 * scale,
                "f16 storage moved a logit by {diff} (largest {scale})"
            );
        }
    }
}

#[test]
fn batched_forwards_match_single_token_decoding_bit_for_bit() {
    let (_dir, mut model) = hf_model(5);
    model
        .encode(&mel(2 * SOURCE_POSITIONS, 1).unwrap())
        .unwrap();
    let tokens = [START_OF_TRANSCRIPT, NO_TIMESTAMPS, 7, 3, 30, 12, 1, 0, 22];
    let all = rows(&forward_tokens(&mut model, &tokens, LogitRows::All).unwrap());
    model.reset();
    let mut one_by_one = Vec::new();
    for &t in &tokens {
        one_by_one.push(
            forward_tokens(&mut model, &[t], LogitRows::Last(1))
                .unwrap()
                .into_last_row(),
        );
    }
    assert_eq!(all, one_by_one);
    // Rolling back and re-forwarding gives the same rows again.
    model.truncate(4).unwrap();
    let again = rows(&forward_tokens(&mut model, &tokens[4..], LogitRows::All).unwrap());
    assert_eq!(again, all[4..].to_vec());
    assert_eq!(model.cached_tokens(), &tokens);
}

#[test]
fn a_token_tree_forward_gives_each_branch_its_linear_logits() {
    let (_dir, mut model) = hf_model(6);
    model.encode(&mel(120, 2).unwrap()).unwrap();
    let prefix = [START_OF_TRANSCRIPT, NO_TIMESTAMPS];
    forward_tokens(&mut model, &prefix, LogitRows::All).unwrap();
    // Branches a→b and c, siblings at the same position.
    let tree_tokens = [4u32, 9, 17];
    let positions = [2usize, 3, 2];
    let ninf = f32::NEG_INFINITY;
    #[rustfmt::skip]
    let mask = Tensor::from_vec(
        vec![0.0, 0.0, 0.0, ninf, ninf,
             0.0, 0.0, 0.0, 0.0, ninf,
             0.0, 0.0, ninf, ninf, 0.0],
        (1, 1, 3, 5),
        &Device::Cpu,
    )
    .unwrap();
    let step = Forward::tokens(&tree_tokens, &positions).with_mask(&mask);
    let tree = Logits::from_tensor(&model.forward(&step).unwrap(), 3, VOCAB).unwrap();
    for (path, row) in [(vec![4u32, 9], 1usize), (vec![17], 2)] {
        model.reset();
        let linear = forward_tokens(
            &mut model,
            &[prefix.as_slice(), &path].concat(),
            LogitRows::Last(1),
        )
        .unwrap();
        assert_eq!(tree.row(row), linear.row(0), "path {path:?}");
    }
}

#[test]
fn the_encoded_window_survives_reset_and_bad_input_is_refused() {
    let (_dir, mut model) = hf_model(7);
    let tokens = [START_OF_TRANSCRIPT];
    assert!(matches!(
        model.forward_step(&Forward::tokens(&tokens, &[0])),
        Err(Error::NotEncoded)
    ));
    assert!(matches!(
        model.encode(&mel(201, 1).unwrap()),
        Err(Error::Audio(_))
    ));
    assert!(matches!(
        model.encode(&mel(2 * SOURCE_POSITIONS + 2, 1).unwrap()),
        Err(Error::Audio(_))
    ));
    let mut wrong_bins = mel(100, 1).unwrap();
    wrong_bins.n_mels = 40;
    wrong_bins.data.truncate(40 * 100);
    assert!(matches!(model.encode(&wrong_bins), Err(Error::Config(_))));
    model.encode(&mel(100, 1).unwrap()).unwrap();
    let first = forward_tokens(&mut model, &tokens, LogitRows::All).unwrap();
    model.reset();
    assert_eq!(model.cached_len(), 0);
    let again = forward_tokens(&mut model, &tokens, LogitRows::All).unwrap();
    assert_eq!(rows(&first), rows(&again));
    let out_of_range = [VOCAB as u32];
    assert!(forward_tokens(&mut model, &out_of_range, LogitRows::All).is_err());
    let long: Vec<u32> = vec![5; TARGET_POSITIONS + 1];
    model.reset();
    assert!(forward_tokens(&mut model, &long, LogitRows::All).is_err());
    assert_eq!(
        model.cached_len(),
        0,
        "a failed forward leaves the cache as it was"
    );
}

#[test]
fn damaged_and_mismatched_model_folders_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Whisper::load(dir.path(), &LoadOptions::default()),
        Err(Error::Config(_))
    ));
    write_ct2(dir.path(), 1, DType::F16).unwrap();
    let path = dir.path().join("model.bin");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let err = Whisper::load(dir.path(), &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(err, Error::Nn(spec_nn::Error::BadWeights { .. })),
        "{err}"
    );
    // A configuration that does not match the tensors.
    let hf = tempfile::tempdir().unwrap();
    write_hf(hf.path(), 1).unwrap();
    let mut config = hf_config();
    config["d_model"] = serde_json::json!(2 * HIDDEN);
    std::fs::write(hf.path().join("config.json"), config.to_string()).unwrap();
    let err = Whisper::load(hf.path(), &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(err, Error::Nn(spec_nn::Error::ShapeMismatch { .. })),
        "{err}"
    );
    config["d_model"] = serde_json::json!(HIDDEN);
    config["encoder_attention_heads"] = serde_json::json!(5);
    std::fs::write(hf.path().join("config.json"), config.to_string()).unwrap();
    assert!(matches!(
        Whisper::load(hf.path(), &LoadOptions::default()),
        Err(Error::Config(_))
    ));
    std::fs::remove_file(hf.path().join("tokenizer.json")).unwrap();
    config["encoder_attention_heads"] = serde_json::json!(HEADS);
    std::fs::write(hf.path().join("config.json"), config.to_string()).unwrap();
    assert!(matches!(
        Transcriber::load(hf.path(), &LoadOptions::default()),
        Err(Error::Io { .. })
    ));
}

/// A model whose start-of-window suppression lacks the tokenizer's end of text was configured
/// for another tokenizer: refused.
#[test]
fn a_tokenizer_whose_end_of_text_the_model_does_not_suppress_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 27).unwrap();
    let tokenizer = || WhisperTokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    let model = || Whisper::load(dir.path(), &LoadOptions::default()).unwrap();
    assert!(Transcriber::new(model(), tokenizer(), vec![3, 4], vec![26, END_OF_TEXT]).is_ok());
    let err =
        Transcriber::new(model(), tokenizer(), vec![3, 4], vec![26, END_OF_TEXT + 1]).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

/// Writes `tokenizer_json()` with `extra` added tokens (id, text) to `dir` and reads it.
fn tokenizer_with(dir: &std::path::Path, extra: &[(u32, String)]) -> WhisperTokenizer {
    let mut json = tokenizer_json();
    let added = json["added_tokens"].as_array_mut().unwrap();
    for (id, content) in extra {
        added.push(
            serde_json::json!({"id": id, "content": content, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
        );
    }
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    WhisperTokenizer::from_file(&path).unwrap()
}

/// A tokenizer whose ids run past the model's vocabulary, or whose listed timestamps end
/// before it does, is another Whisper's: refused.
#[test]
fn a_tokenizer_whose_vocabulary_does_not_end_with_the_models_is_refused() {
    let (dir, _) = hf_model(29);
    let model = || load(dir.path());
    let transcriber = |tokenizer| {
        Transcriber::new(model(), tokenizer, vec![3, 4], vec![26, END_OF_TEXT]).map(|_| ())
    };
    let timestamps = |count: u32| -> Vec<(u32, String)> {
        (0..count)
            .map(|i| (NO_TIMESTAMPS + 1 + i, format!("<|{:.2}|>", i as f32 * 0.02)))
            .collect()
    };
    transcriber(tokenizer_with(dir.path(), &timestamps(TIMESTAMPS))).unwrap();
    for extra in [
        timestamps(TIMESTAMPS + 1),
        timestamps(TIMESTAMPS - 1),
        // Tokens of other kinds up to the same id: the vocabulary runs past the model's too.
        (NO_TIMESTAMPS + 1..=VOCAB as u32)
            .map(|id| (id, format!("<|extra{id}|>")))
            .collect(),
    ] {
        let err = transcriber(tokenizer_with(dir.path(), &extra)).unwrap_err();
        assert!(matches!(err, Error::TokenizerMismatch { .. }), "{err}");
    }
}

/// A tokenizer that numbers a special token otherwise than the model folder's configuration
/// names it (`eos_token_id`, `decoder_start_token_id`, `no_timestamps_token_id`, the language
/// tokens) is another Whisper's: refused.
#[test]
fn a_tokenizer_numbering_the_configured_special_tokens_otherwise_is_refused() {
    let hf = tempfile::tempdir().unwrap();
    write_hf(hf.path(), 31).unwrap();
    let ct2 = tempfile::tempdir().unwrap();
    write_ct2(ct2.path(), 31, DType::F32).unwrap();
    let (hf, ct2) = (hf.path(), ct2.path());
    let load_with = |dir: &std::path::Path, file: &str, key: &str, value: serde_json::Value| {
        let path = dir.join(file);
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        config[key] = value;
        std::fs::write(&path, config.to_string()).unwrap();
        Transcriber::load(dir, &LoadOptions::default()).map(|_| ())
    };
    let refused = |result: Result<(), Error>| {
        let err = result.unwrap_err();
        assert!(matches!(err, Error::TokenizerMismatch { .. }), "{err}");
    };
    for (file, key, right, wrong) in [
        ("config.json", "eos_token_id", END_OF_TEXT, END_OF_TEXT + 1),
        (
            "config.json",
            "decoder_start_token_id",
            START_OF_TRANSCRIPT,
            END_OF_TEXT,
        ),
        (
            "generation_config.json",
            "no_timestamps_token_id",
            NO_TIMESTAMPS,
            NO_TIMESTAMPS + 1,
        ),
    ] {
        refused(load_with(hf, file, key, wrong.into()));
        load_with(hf, file, key, right.into()).unwrap();
    }
    // The tiny tokenizer has no language tokens: none lies between its start of transcript
    // and <|translate|>, the token after it.
    let language = START_OF_TRANSCRIPT + 1;
    let lang_to_id = serde_json::json!({ "<|en|>": language });
    refused(load_with(
        hf,
        "generation_config.json",
        "lang_to_id",
        lang_to_id,
    ));
    load_with(ct2, "config.json", "lang_ids", serde_json::json!([])).unwrap();
    refused(load_with(
        ct2,
        "config.json",
        "lang_ids",
        serde_json::json!([language]),
    ));
}

#[test]
fn the_logit_rules_follow_whispers_grammar() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 1).unwrap();
    let (tokenizer, no_ts) = logit_rules(dir.path(), false).unwrap();
    assert_eq!(tokenizer.timestamp_begin, NO_TIMESTAMPS + 1);
    let ts0 = tokenizer.timestamp_begin;
    let blocked = |logits: &[f32]| -> Vec<u32> {
        (0..logits.len() as u32)
            .filter(|&t| logits[t as usize] == f32::NEG_INFINITY)
            .collect()
    };
    let mut logits = vec![0f32; VOCAB];
    no_ts.apply(&mut logits, &[]);
    let b = blocked(&logits);
    for t in [
        3,
        4,
        26,
        END_OF_TEXT,
        START_OF_TRANSCRIPT,
        NO_TIMESTAMPS,
        ts0,
        ts0 + 5,
    ] {
        assert!(b.contains(&t), "{t} not blocked at the start");
    }
    let mut logits = vec![0f32; VOCAB];
    no_ts.apply(&mut logits, &[7]);
    let b = blocked(&logits);
    assert!(!b.contains(&26) && !b.contains(&END_OF_TEXT) && b.contains(&3));

    let (_, ts) = logit_rules(dir.path(), true).unwrap();
    // The first token is a timestamp no later than 0.1 s (5 steps).
    let mut logits = vec![0f32; VOCAB];
    ts.apply(&mut logits, &[]);
    let allowed: Vec<u32> = (0..VOCAB as u32)
        .filter(|&t| logits[t as usize] > f32::NEG_INFINITY)
        .collect();
    assert_eq!(allowed, (ts0..=ts0 + 5).collect::<Vec<_>>());
    // After the opening timestamp: text only.
    let mut logits = vec![0f32; VOCAB];
    ts.apply(&mut logits, &[ts0 + 2]);
    assert!(logits[ts0 as usize..]
        .iter()
        .all(|&l| l == f32::NEG_INFINITY));
    // After text and a timestamp: a (later or equal) timestamp or the end, no text.
    let mut logits = vec![0f32; VOCAB];
    logits[5] = 10.0;
    ts.apply(&mut logits, &[ts0 + 2, 5, 6, ts0 + 9]);
    assert!(logits[..END_OF_TEXT as usize]
        .iter()
        .all(|&l| l == f32::NEG_INFINITY));
    assert!(logits[(ts0 + 8) as usize] == f32::NEG_INFINITY);
    assert!(logits[(ts0 + 9) as usize] > f32::NEG_INFINITY);
    // Timestamps much more probable than any text force a timestamp.
    let mut logits = vec![0f32; VOCAB];
    for l in &mut logits[ts0 as usize..] {
        *l = 5.0;
    }
    ts.apply(&mut logits, &[ts0, 5]);
    assert!(logits[..ts0 as usize]
        .iter()
        .all(|&l| l == f32::NEG_INFINITY));
}

/// Beam search recomputing every candidate's logits from scratch (no shared cache).
fn reference_beam(
    model: &mut Whisper,
    rules: &LogitRules,
    prompt: &[u32],
    beam_size: usize,
    max_tokens: usize,
) -> Vec<u32> {
    let logits_after = |model: &mut Whisper, tokens: &[u32]| -> Vec<f32> {
        model.reset();
        let input = [prompt, tokens].concat();
        forward_tokens(model, &input, LogitRows::Last(1))
            .unwrap()
            .into_last_row()
    };
    let log_softmax = |l: &[f32], t: u32| {
        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = l.iter().map(|&v| (v - max).exp()).sum();
        l[t as usize] - max - sum.ln()
    };
    let mut beams: Vec<(Vec<u32>, f32)> = vec![(vec![], 0.0)];
    let mut finished: Vec<(Vec<u32>, f32)> = vec![];
    let mut unfinished: Vec<(Vec<u32>, f32)> = vec![];
    loop {
        let mut proposals = vec![];
        for (b, (tokens, score)) in beams.iter().enumerate() {
            let mut logits = logits_after(model, tokens);
            rules.apply(&mut logits, tokens);
            for t in spec_core::sampling::top_k_tokens(&logits, beam_size + 1) {
                let s = score + log_softmax(&logits, t);
                if s.is_finite() {
                    proposals.push((s, b, t));
                }
            }
        }
        proposals.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut next = vec![];
        for (s, b, t) in proposals {
            if t == END_OF_TEXT {
                if finished.len() < beam_size {
                    finished.push((beams[b].0.clone(), s));
                }
            } else {
                next.push(([beams[b].0.as_slice(), &[t]].concat(), s));
                if next.len() == beam_size {
                    break;
                }
            }
        }
        if finished.len() >= beam_size || next.is_empty() {
            break;
        }
        if next[0].0.len() >= max_tokens {
            unfinished = next;
            break;
        }
        beams = next;
    }
    let missing = beam_size.saturating_sub(finished.len());
    let mut pool = finished;
    pool.extend(unfinished.into_iter().take(missing));
    pool.into_iter()
        .max_by(|a, b| (a.1 / a.0.len().max(1) as f32).total_cmp(&(b.1 / b.0.len().max(1) as f32)))
        .unwrap()
        .0
}

#[test]
fn beam_search_in_one_token_tree_equals_beam_search_from_scratch() {
    let (dir, mut model) = hf_model(11);
    let (_, rules) = logit_rules(dir.path(), false).unwrap();
    let prompt = [START_OF_TRANSCRIPT, NO_TIMESTAMPS];
    for seed in 0..3 {
        model.encode(&mel(160, seed).unwrap()).unwrap();
        for beam_size in [1, 3, 5] {
            let max_tokens = 12;
            let (_, next) = run_prompt(&mut model, &prompt, 0, NO_TIMESTAMPS - 1).unwrap();
            let tree =
                beam_window(&mut model, &rules, next, END_OF_TEXT, max_tokens, beam_size).unwrap();
            let reference = reference_beam(&mut model, &rules, &prompt, beam_size, max_tokens);
            assert_eq!(tree.tokens, reference, "seed {seed}, beam {beam_size}");
            assert!(tree.forwards <= max_tokens + 1);
            if beam_size == 1 {
                let (_, next) = run_prompt(&mut model, &prompt, 0, NO_TIMESTAMPS - 1).unwrap();
                let mut rng = StdRng::seed_from_u64(0);
                let greedy = sample_window(
                    &mut model,
                    &rules,
                    next,
                    END_OF_TEXT,
                    max_tokens,
                    0.0,
                    &mut rng,
                )
                .unwrap();
                assert_eq!(greedy.tokens, tree.tokens);
            }
        }
    }
}

#[test]
fn ctranslate2_weights_export_under_hugging_face_names() {
    let ct2 = tempfile::tempdir().unwrap();
    write_ct2(ct2.path(), 4, DType::F32).unwrap();
    let (config, exported) =
        engine_asr::whisper::hugging_face_tensors(ct2.path(), &Device::Cpu).unwrap();
    assert_eq!(config.vocab_size, VOCAB);
    let original = hf_weights(4).unwrap();
    let mut names: Vec<&String> = exported.keys().collect();
    names.sort();
    let mut expected: Vec<&String> = original.keys().collect();
    expected.sort();
    assert_eq!(names, expected);
    for (name, tensor) in &original {
        let a: Vec<f32> = tensor.flatten_all().unwrap().to_vec1().unwrap();
        let b: Vec<f32> = exported[name].flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(a, b, "{name}");
    }
}

#[test]
fn streaming_partials_equal_greedy_decoding_from_scratch() {
    for (seed, encoder_length) in [
        (21, EncoderLength::Full),
        (22, EncoderLength::Audio { margin_frames: 10 }),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_hf(dir.path(), seed).unwrap();
        let options = TranscribeOptions {
            encoder_length,
            ..greedy_options()
        };
        let mut reference = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
        let streaming = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
        // The random model says far more than speech carries: no token limit.
        let mut stream = StreamingTranscriber::new(streaming, options.clone())
            .unwrap()
            .with_token_limit(None)
            .unwrap();
        let audio = tones(1.9, 220.0);
        let mut longest_draft = 0;
        let mut drafts_used = 0;
        for (i, chunk) in audio.chunks(2_000).enumerate() {
            let Some(partial) = stream.push(chunk).unwrap() else {
                continue;
            };
            let prefix = &audio[..(i * 2_000 + chunk.len())];
            let expected = reference.transcribe(prefix, &options).unwrap();
            let expected_tokens: Vec<u32> = expected
                .segments
                .iter()
                .flat_map(|s| s.tokens.clone())
                .collect();
            assert_eq!(partial.tokens, expected_tokens, "seed {seed}, chunk {i}");
            assert_eq!(partial.text, expected.text);
            assert_eq!(partial.audio_seconds, prefix.len() as f64 / 16_000.0);
            longest_draft = longest_draft.max(partial.tokens.len());
            drafts_used += partial.accepted_draft;
        }
        let stats = stream.stats().clone();
        assert!(stats.partials >= 10);
        assert!(
            longest_draft > 64,
            "the draft must span several verification forwards"
        );
        assert!(drafts_used > 0, "no draft token was ever kept");
        let (text, _) = stream.finish().unwrap();
        let expected = reference.transcribe(&audio, &options).unwrap();
        assert_eq!(text, expected.text);
    }
}

#[test]
fn streaming_partials_stop_at_the_token_limit_with_the_greedy_tokens() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 23).unwrap();
    let options = greedy_options();
    let limited = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let unlimited = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let mut limited = StreamingTranscriber::new(limited, options.clone())
        .unwrap()
        .with_token_limit(Some(10.0))
        .unwrap();
    let mut unlimited = StreamingTranscriber::new(unlimited, options)
        .unwrap()
        .with_token_limit(None)
        .unwrap();
    let audio = tones(1.5, 220.0);
    let mut cut = 0;
    for (i, chunk) in audio.chunks(4_000).enumerate() {
        let (Some(short), Some(full)) =
            (limited.push(chunk).unwrap(), unlimited.push(chunk).unwrap())
        else {
            continue;
        };
        let seconds = ((i + 1) * 4_000).min(audio.len()) as f64 / 16_000.0;
        let limit = 8 + (10.0 * seconds).ceil() as usize;
        assert_eq!(
            short.tokens.len(),
            full.tokens.len().min(limit),
            "chunk {i}"
        );
        assert_eq!(short.tokens[..], full.tokens[..short.tokens.len()]);
        cut += usize::from(short.tokens.len() < full.tokens.len());
    }
    assert!(cut > 0, "the random model never reached the limit");
    let whisper = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let stream = StreamingTranscriber::new(whisper, greedy_options()).unwrap();
    assert!(matches!(
        stream.with_token_limit(Some(0.0)),
        Err(Error::Config(_))
    ));
}

#[test]
fn a_huge_token_rate_means_no_practical_limit() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 23).unwrap();
    let stream = |limit| {
        let transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
        StreamingTranscriber::new(transcriber, greedy_options())
            .unwrap()
            .with_token_limit(limit)
            .unwrap()
    };
    let (mut huge, mut unlimited) = (stream(Some(f64::MAX)), stream(None));
    for chunk in tones(1.5, 220.0).chunks(8_000) {
        let (Some(a), Some(b)) = (huge.push(chunk).unwrap(), unlimited.push(chunk).unwrap()) else {
            panic!("a chunk of 0.5 s gives a partial");
        };
        assert_eq!(a.tokens, b.tokens);
    }
}

#[test]
fn non_finite_audio_is_refused_by_transcription_and_streaming() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 24).unwrap();
    let mut transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let good = tones(1.0, 220.0);
    let mut bad = good.clone();
    bad[5_000] = f32::NAN;
    assert!(matches!(
        transcriber.transcribe(&bad, &greedy_options()),
        Err(Error::NonFiniteSample { index: 5_000, .. })
    ));
    let mut reference = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let mut stream = StreamingTranscriber::new(transcriber, greedy_options())
        .unwrap()
        .with_token_limit(None)
        .unwrap();
    bad[5_000] = f32::INFINITY;
    assert!(matches!(
        stream.push(&bad),
        Err(Error::NonFiniteSample { index: 5_000, .. })
    ));
    // The refused chunk left nothing behind.
    let partial = stream.push(&good).unwrap().unwrap();
    let expected = reference.transcribe(&good, &greedy_options()).unwrap();
    assert_eq!(partial.text, expected.text);
}

#[test]
fn temperatures_must_be_finite_and_not_negative() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 25).unwrap();
    let mut transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let audio = tones(1.0, 220.0);
    for bad in [f32::INFINITY, f32::NAN, -0.2] {
        let options = TranscribeOptions {
            temperatures: vec![0.0, bad],
            ..greedy_options()
        };
        assert!(
            matches!(
                transcriber.transcribe(&audio, &options),
                Err(Error::Config(_))
            ),
            "temperature {bad}"
        );
    }
}

#[test]
fn a_huge_encoder_margin_reads_the_whole_window() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 26).unwrap();
    let mut transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let audio = tones(1.0, 220.0);
    let window = engine_asr::WhisperInput::from_samples(&audio, transcriber.filters())
        .unwrap()
        .window(0)
        .unwrap();
    let huge = EncoderLength::Audio {
        margin_frames: usize::MAX,
    };
    let full = transcriber.encoder_input(window.clone(), 100, EncoderLength::Full);
    assert_eq!(full.frames, 2 * SOURCE_POSITIONS);
    assert_eq!(transcriber.encoder_input(window, 100, huge), full);
    let options = |encoder_length| TranscribeOptions {
        encoder_length,
        ..greedy_options()
    };
    let expected = transcriber
        .transcribe(&audio, &options(EncoderLength::Full))
        .unwrap();
    let got = transcriber.transcribe(&audio, &options(huge)).unwrap();
    assert_eq!(got.text, expected.text);
}

/// The window past the audio is zeros, where the model may still put timestamps (tiny.en ended
/// a segment at 2.0 s of a 1.1 s clip): segment times stay within the audio.
#[test]
fn timestamps_in_the_padding_are_clamped_to_the_audio() {
    let audio = tones(0.25, 220.0);
    let options = TranscribeOptions {
        timestamps: true,
        encoder_length: EncoderLength::Full,
        ..greedy_options()
    };
    let mut segments = 0;
    for seed in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        write_hf(dir.path(), seed).unwrap();
        let mut transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
        let transcript = transcriber.transcribe(&audio, &options).unwrap();
        for segment in &transcript.segments {
            assert!(
                0.0 <= segment.start && segment.start <= segment.end && segment.end <= 0.25,
                "seed {seed}: {segment:?}"
            );
            segments += 1;
        }
    }
    assert!(segments > 0, "no segment checked");
}

/// A window whose decoding is still a repetition loop after the fallback, with the encoder cut
/// short of the window, is decoded again from the whole window (a threshold of 0 makes every
/// text a loop): the transcript of the 30-second encoder.
#[test]
fn a_loop_under_a_short_encoder_is_decoded_again_from_the_whole_window() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 11).unwrap();
    let mut transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let audio = tones(0.3, 330.0);
    let options = |encoder_length, compression_ratio_threshold| TranscribeOptions {
        encoder_length,
        compression_ratio_threshold,
        ..greedy_options()
    };
    let short = EncoderLength::Audio { margin_frames: 10 };
    let full = transcriber
        .transcribe(&audio, &options(EncoderLength::Full, None))
        .unwrap();
    let plain = transcriber
        .transcribe(&audio, &options(short, None))
        .unwrap();
    assert_ne!(plain.segments[0].tokens, full.segments[0].tokens);
    let retried = transcriber
        .transcribe(&audio, &options(short, Some(0.0)))
        .unwrap();
    assert_eq!(retried.segments[0].tokens, full.segments[0].tokens);
    assert_eq!(retried.stats.fallbacks, 1);
    // With the whole window from the start there is nothing to retry.
    let whole = transcriber
        .transcribe(&audio, &options(EncoderLength::Full, Some(0.0)))
        .unwrap();
    assert_eq!(whole.stats.fallbacks, 0);
}

#[test]
fn streaming_refuses_beam_search() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 1).unwrap();
    let transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let options = TranscribeOptions {
        beam_size: 5,
        ..TranscribeOptions::default()
    };
    assert!(matches!(
        StreamingTranscriber::new(transcriber, options),
        Err(Error::Config(_))
    ));
}

#[test]
fn an_improbable_window_is_decoded_again_at_each_higher_temperature() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 8).unwrap();
    let mut transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let audio = tones(1.0, 220.0);
    // No decoding is probable enough: every temperature is tried, with best-of-2 sampling.
    let options = TranscribeOptions {
        log_prob_threshold: Some(0.0),
        no_speech_threshold: None,
        temperatures: vec![0.0, 0.5, 1.0],
        best_of: 2,
        ..TranscribeOptions::default()
    };
    let transcript = transcriber.transcribe(&audio, &options).unwrap();
    assert_eq!(transcript.stats.fallbacks, 2);
    let kept = &transcript.segments[0];
    assert!([0.0, 0.5, 1.0].contains(&kept.temperature));
    // The same seed samples the same text.
    let again = transcriber.transcribe(&audio, &options).unwrap();
    assert_eq!(again.text, transcript.text);
    // Without thresholds the greedy decoding stands.
    let plain = transcriber.transcribe(&audio, &greedy_options()).unwrap();
    assert_eq!(plain.stats.fallbacks, 0);
    let greedy = &plain.segments[0];
    assert_eq!(greedy.temperature, 0.0);
    // All three failed: the most probable attempt that is no repetition loop is kept
    // (faster-whisper), so never one less probable than the greedy one when that passed.
    if greedy.compression_ratio <= 2.4 {
        assert!(
            kept.avg_logprob >= greedy.avg_logprob,
            "{kept:?} {greedy:?}"
        );
    }
}

#[test]
fn repetitive_text_compresses_well() {
    use engine_asr::whisper::compression_ratio;
    let varied = "The quick brown fox jumps over the lazy dog near the river bank.";
    let looped = "ten of clubs ".repeat(20);
    assert!(
        compression_ratio(varied) < 2.4,
        "{}",
        compression_ratio(varied)
    );
    assert!(
        compression_ratio(&looped) > 2.4,
        "{}",
        compression_ratio(&looped)
    );
    assert_eq!(compression_ratio(""), 0.0);
}

#[test]
fn heads_need_a_model_of_their_shape_and_decoding_with_them_needs_heads() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 32).unwrap();
    let mut transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let options = TranscribeOptions {
        heads: Some(AcceptanceRule::greedy()),
        ..greedy_options()
    };
    let err = transcriber
        .transcribe(&tones(0.5, 220.0), &options)
        .unwrap_err();
    assert!(err.to_string().contains("no heads were set"), "{err}");
}

#[test]
fn a_partials_last_word_is_its_texts_last_word_with_a_probability_and_times() {
    for seed in [23, 24, 25] {
        let dir = tempfile::tempdir().unwrap();
        write_hf(dir.path(), seed).unwrap();
        let options = TranscribeOptions {
            encoder_length: EncoderLength::Audio { margin_frames: 10 },
            ..greedy_options()
        };
        let streaming = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
        let mut stream = StreamingTranscriber::new(streaming, options)
            .unwrap()
            .with_token_limit(Some(40.0))
            .unwrap();
        assert_eq!(stream.last_word().unwrap(), None, "no partial yet");
        let audio = tones(1.2, 330.0);
        let mut words = 0;
        for (i, chunk) in audio.chunks(4_000).enumerate() {
            let Some(partial) = stream.push(chunk).unwrap() else {
                continue;
            };
            let last = stream.last_word().unwrap();
            match partial.text.split_whitespace().last() {
                Some(expected) => {
                    let last = last.unwrap_or_else(|| panic!("seed {seed}, chunk {i}: no word"));
                    assert_eq!(last.word.trim(), expected, "seed {seed}, chunk {i}");
                    assert!(last.probability > 0.0 && last.probability <= 1.0);
                    assert!(0.0 <= last.start && last.start <= last.end);
                    assert!(last.end <= partial.audio_seconds + 0.02);
                    // Asked again: the same word, the window still encoded.
                    assert_eq!(stream.last_word().unwrap(), Some(last));
                    words += 1;
                }
                None => assert_eq!(last, None),
            }
        }
        assert!(words >= 2, "seed {seed}: only {words} partials had words");
    }
}
