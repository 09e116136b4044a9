//! Whisper on real weights from `../shared/models/fetch` (found in `$SPECVOICE_MODELS`,
//! default `~/.cache/specvoice/models`) and the real clips of `data/speech`. Ignored by plain
//! `cargo test`; CI runs them with `cargo test --release -- --ignored` after fetching the models.

use std::collections::BTreeMap;
use std::path::PathBuf;

use engine_asr::{
    Audio, EncoderLength, LoadOptions, StreamingTranscriber, TranscribeOptions, Transcriber,
    WhisperInput,
};
use spec_core::decoder::forward_tokens;
use spec_core::{Decoder, LogitRows, SpecAsrConfig};
use spec_models::{Registry, Store};

const TINY_EN: &str = "whisper-tiny.en-ct2";
const BASE: &str = "whisper-base-ct2";

fn store() -> Store<'static> {
    Store::new(
        spec_models::models_dir().expect("models folder"),
        Registry::builtin(),
    )
}

fn transcriber(name: &str) -> Transcriber {
    let model = store()
        .resolve(name)
        .unwrap_or_else(|e| panic!("{name}: {e} (run ../shared/models/fetch)"));
    Transcriber::load(&model.dir, &LoadOptions::default()).unwrap()
}

/// The multilingual tokenizer beside the English-only model numbers every special token one
/// higher (its end of text is 50257, the model's 50256): refused, not a transcript that never
/// ends.
#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn a_tokenizer_of_another_whisper_is_refused() {
    let (tiny, base) = (
        store().resolve(TINY_EN).unwrap(),
        store().resolve(BASE).unwrap(),
    );
    let mixed = tempfile::tempdir().unwrap();
    for name in ["model.bin", "config.json"] {
        std::os::unix::fs::symlink(tiny.dir.join(name), mixed.path().join(name)).unwrap();
    }
    std::os::unix::fs::symlink(
        base.dir.join("tokenizer.json"),
        mixed.path().join("tokenizer.json"),
    )
    .unwrap();
    let err = Transcriber::load(mixed.path(), &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(err, engine_asr::Error::Config(_)) && err.to_string().contains("50257"),
        "{err}"
    );
}

/// The clips, keyed as in `expected_transcripts.json` (`folder/file.wav`).
fn clips() -> Vec<(String, Vec<f32>)> {
    let root = store().root().join("data/speech");
    let mut out = Vec::new();
    for folder in ["librivox", "cards"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(folder))
            .unwrap_or_else(|e| panic!("{}: {e} (run ../shared/models/fetch)", root.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "wav"))
            .collect();
        files.sort();
        for file in files {
            let key = format!("{folder}/{}", file.file_name().unwrap().to_string_lossy());
            out.push((key, Audio::read_wav(&file).unwrap().to_16k().unwrap()));
        }
    }
    assert_eq!(out.len(), 10);
    out
}

type Expected = BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>;

fn expected() -> Expected {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/expected_transcripts.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn full_window(beam_size: usize) -> TranscribeOptions {
    TranscribeOptions {
        language: Some("en".into()),
        beam_size,
        encoder_length: EncoderLength::Full,
        ..TranscribeOptions::default()
    }
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn the_clips_give_their_stored_transcripts() {
    let expected = expected();
    let clips = clips();
    let mut mismatches = Vec::new();
    let default = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    for (model, mode, options) in [
        (TINY_EN, "greedy", full_window(1)),
        (TINY_EN, "beam5", full_window(5)),
        (TINY_EN, "default", default.clone()),
        (BASE, "greedy", full_window(1)),
        (BASE, "default", default.clone()),
    ] {
        let mut transcriber = transcriber(model);
        for (key, samples) in &clips {
            let transcript = transcriber.transcribe(samples, &options).unwrap();
            if transcript.text != expected[model][mode][key] {
                mismatches.push(format!("{model} {mode} {key}: {:?}", transcript.text));
            }
            assert_eq!(transcript.language.as_deref(), Some("en"));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// tiny.en on the "cards" clips with the default audio-length encoder: greedy decoding used to
/// repeat digits to the length limit (the window past the audio held the log-mel of silence;
/// Whisper pads it with zeros), and no longer does, with or without the guards. With a 5 s
/// margin the encoder misses the end of the speech and unguarded greedy decoding loops; no
/// temperature escapes that loop (sampling repeats "10 of clubs" too, and faster-whisper's
/// choice among failed attempts keeps the most probable loop), so the default guards decode
/// a window still looping after the fallback again from the whole 30 s window.
#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn the_default_guards_stop_repetition_loops() {
    let greedy = TranscribeOptions {
        language: Some("en".into()),
        ..engine_asr::testing::greedy_options()
    };
    let guarded = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    let short_margin = EncoderLength::Audio { margin_frames: 500 };
    let mut transcriber = transcriber(TINY_EN);
    let words = |text: &str| text.split_whitespace().count();
    let mut loops = 0;
    for (key, samples) in clips().iter().filter(|(key, _)| key.starts_with("cards/")) {
        // The clips hold at most a dozen words.
        for options in [&greedy, &guarded] {
            let text = transcriber.transcribe(samples, options).unwrap().text;
            assert!(words(&text) <= 12, "{key}: {text}");
        }
        let looping = transcriber
            .transcribe(
                samples,
                &TranscribeOptions {
                    encoder_length: short_margin,
                    ..greedy.clone()
                },
            )
            .unwrap();
        if words(&looping.text) < 100 {
            continue;
        }
        loops += 1;
        let checked = transcriber
            .transcribe(
                samples,
                &TranscribeOptions {
                    encoder_length: short_margin,
                    ..guarded.clone()
                },
            )
            .unwrap();
        assert!(checked.stats.fallbacks > 0, "{key}");
        assert!(
            words(&checked.text) * 2 < words(&looping.text),
            "{key}: {}",
            checked.text
        );
    }
    assert!(
        loops > 0,
        "greedy decoding no longer loops with a 5 s margin: the test checks nothing"
    );
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn the_multilingual_model_detects_english() {
    let mut transcriber = transcriber(BASE);
    let (_, samples) = &clips()[0];
    let options = TranscribeOptions {
        language: None,
        ..full_window(1)
    };
    let transcript = transcriber.transcribe(samples, &options).unwrap();
    assert_eq!(transcript.language.as_deref(), Some("en"));
    assert!(
        transcript.text.starts_with("And Mr. John Dashwood"),
        "{}",
        transcript.text
    );
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn batched_decoder_forwards_equal_one_token_forwards_bit_for_bit() {
    for model in [TINY_EN, BASE] {
        let mut transcriber = transcriber(model);
        let (_, samples) = &clips()[0];
        let options = full_window(1);
        let transcript = transcriber.transcribe(samples, &options).unwrap();
        let (prompt, _) = transcriber.prompt(&options, Some("en"), &[]).unwrap();
        let tokens: Vec<u32> = prompt
            .iter()
            .chain(transcript.segments.iter().flat_map(|s| s.tokens.iter()))
            .copied()
            .collect();
        assert!(tokens.len() > 20);
        let whisper = transcriber.model();
        whisper.reset();
        let all: Vec<Vec<f32>> = forward_tokens(whisper, &tokens, LogitRows::All)
            .unwrap()
            .rows()
            .map(<[f32]>::to_vec)
            .collect();
        whisper.reset();
        for (i, &token) in tokens.iter().enumerate() {
            let one = forward_tokens(whisper, &[token], LogitRows::Last(1))
                .unwrap()
                .into_last_row();
            assert!(one == all[i], "{model}: row {i} differs");
        }
    }
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn streaming_partials_equal_greedy_transcripts_of_the_same_audio() {
    let options = TranscribeOptions {
        language: Some("en".into()),
        temperatures: vec![0.0],
        compression_ratio_threshold: None,
        log_prob_threshold: None,
        no_speech_threshold: None,
        encoder_length: EncoderLength::Audio {
            margin_frames: 1500,
        },
        ..TranscribeOptions::default()
    };
    let mut reference = transcriber(TINY_EN);
    let mut stream = StreamingTranscriber::new(transcriber(TINY_EN), options.clone()).unwrap();
    let (_, samples) = &clips()[0];
    let chunk = 8_000;
    let mut kept = 0;
    for (i, piece) in samples.chunks(chunk).enumerate() {
        let partial = stream.push(piece).unwrap().expect("a partial per chunk");
        let heard = &samples[..i * chunk + piece.len()];
        let expected = reference.transcribe(heard, &options).unwrap();
        assert_eq!(
            partial.text, expected.text,
            "after {:.1} s",
            partial.audio_seconds
        );
        kept += partial.accepted_draft;
    }
    let stats = stream.stats().clone();
    assert!(kept > stats.drafted / 2, "{stats:?}");
    assert!(stats.forwards < stats.partials * 6, "{stats:?}");
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn silence_and_too_short_audio() {
    let mut transcriber = transcriber(TINY_EN);
    let options = full_window(1);
    let silence = vec![0f32; 16_000 * 3];
    let transcript = transcriber.transcribe(&silence, &options).unwrap();
    assert!(
        transcript.text.len() < 20,
        "silence gave {:?}",
        transcript.text
    );
    assert!(transcriber.transcribe(&[0.1; 100], &options).is_err());
    assert!(WhisperInput::from_samples(&[], transcriber.filters()).is_err());
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn timestamped_segments_lie_within_the_audio_in_order() {
    let mut transcriber = transcriber(TINY_EN);
    let options = TranscribeOptions {
        timestamps: true,
        ..full_window(1)
    };
    for (key, samples) in clips() {
        let seconds = samples.len() as f32 / 16_000.0;
        let transcript = transcriber.transcribe(&samples, &options).unwrap();
        assert!(!transcript.segments.is_empty(), "{key}");
        let mut previous_end = 0.0;
        for segment in &transcript.segments {
            assert!(segment.start >= previous_end - 1e-3, "{key}: {segment:?}");
            assert!(segment.end > segment.start, "{key}: {segment:?}");
            assert!(
                segment.end <= seconds + 0.5,
                "{key}: {segment:?} in {seconds} s"
            );
            assert!(!segment.text.trim().is_empty());
            previous_end = segment.end;
        }
    }
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn a_recording_longer_than_a_window_is_transcribed_whole() {
    use engine_asr::normalize::EnglishTextNormalizer;
    use engine_asr::wer::word_errors;

    let clips = clips();
    let audio: Vec<f32> = clips.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    assert!(audio.len() > 16_000 * 30);
    let expected = expected();
    let reference: String = clips
        .iter()
        .map(|(key, _)| expected[TINY_EN]["greedy"][key].clone())
        .collect::<Vec<_>>()
        .join(" ");
    let normalizer =
        EnglishTextNormalizer::from_file(&store().data_file("whisper/english.json").unwrap())
            .unwrap();
    let mut transcriber = transcriber(TINY_EN);
    let transcript = transcriber
        .transcribe(&audio, &TranscribeOptions::default())
        .unwrap();
    assert!(transcript.stats.windows >= 2, "{:?}", transcript.stats);
    let errors = word_errors(
        &normalizer.normalize(&reference),
        &normalizer.normalize(&transcript.text),
    );
    // Every clip is there: a skipped one would cost at least three words.
    assert!(errors.deletions <= 2, "{errors:?}: {}", transcript.text);
    assert!(errors.rate() < 0.15, "{errors:?}: {}", transcript.text);
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn specasr_with_a_text_draft_transcribes_exactly_as_greedy_decoding() {
    let greedy = TranscribeOptions {
        language: Some("en".into()),
        ..engine_asr::testing::greedy_options()
    };
    let mut target = transcriber(BASE);
    let mut fast = transcriber(BASE);
    // tiny.en's tokenizer is not base's: a same-vocabulary draft is refused, a text draft
    // is taken.
    assert!(fast.set_draft(transcriber(TINY_EN)).is_err());
    fast.set_text_draft(transcriber(TINY_EN)).unwrap();
    let mut forwards = (0, 0);
    for (key, samples) in clips() {
        let reference = target.transcribe(&samples, &greedy).unwrap();
        for config in [SpecAsrConfig::plain(4), SpecAsrConfig::recycling()] {
            let options = TranscribeOptions {
                draft: Some(config),
                ..greedy.clone()
            };
            let t = fast.transcribe(&samples, &options).unwrap();
            assert_eq!(t.segments, reference.segments, "{key}, {config:?}");
            forwards.0 += reference.stats.forwards;
            forwards.1 += t.stats.forwards;
        }
    }
    assert!(
        2 * forwards.1 < forwards.0,
        "tiny.en's drafts should halve base's forwards at least: {forwards:?}"
    );
}
