//! Word timestamps on real weights and the real clips of `data/speech`, against faster-whisper
//! 1.2.1's `word_timestamps=True` on the same clips and weights. Its words are in
//! `tests/data/words_faster_whisper.json`, made by the command stored in it (the output of
//! `examples/peers/words_faster_whisper.py`, with that command added, pretty-printed).
//! Ignored by plain `cargo test` (they need `../shared/models/fetch`).

use std::collections::BTreeMap;

use engine_asr::whisper::alignment::word_time_differences;
use engine_asr::whisper::Word;
use engine_asr::{Audio, EncoderLength, LoadOptions, TranscribeOptions, Transcriber};
use serde::Deserialize;
use spec_models::{Registry, Store};
use spec_nn::Requantize;

#[derive(Deserialize)]
struct Fixture {
    compute_type: String,
    without_timestamps: bool,
    models: BTreeMap<String, Vec<PeerClip>>,
}

#[derive(Deserialize)]
struct PeerClip {
    clip: String,
    segments: Vec<PeerSegment>,
}

#[derive(Deserialize)]
struct PeerSegment {
    text: String,
    words: Vec<(String, f32, f32, f32)>,
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/words_faster_whisper.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &mut [f32]) -> f32 {
    values.sort_by(f32::total_cmp);
    let n = values.len();
    assert!(n > 0, "no values");
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Each model's words on the ten real clips, with the parity settings (f32 weights, the whole
/// window encoded, greedy, timestamps, language en): the words hold the text, their times run
/// forward inside their segments, and they are within 100 ms of faster-whisper's (median of
/// the start and end differences, each side; the target of issue 77).
#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn word_times_match_faster_whisper_on_the_real_clips() {
    let fixture = fixture();
    assert_eq!(fixture.compute_type, "float32");
    let store = Store::new(
        spec_models::models_dir().expect("models folder"),
        Registry::builtin(),
    );
    let speech = store.root().join("data/speech");
    let load = LoadOptions {
        requantize: Requantize::Keep,
        ..LoadOptions::default()
    };
    let options = TranscribeOptions {
        language: Some("en".into()),
        timestamps: !fixture.without_timestamps,
        temperatures: vec![0.0],
        best_of: 1,
        condition_on_previous_text: false,
        encoder_length: EncoderLength::Full,
        word_timestamps: true,
        ..TranscribeOptions::default()
    };
    assert_eq!(fixture.models.len(), 2);
    for (name, clips) in &fixture.models {
        let model = store
            .resolve(name)
            .unwrap_or_else(|e| panic!("{name}: {e} (run ../shared/models/fetch)"));
        let mut transcriber = Transcriber::load(&model.dir, &load).unwrap();
        let (mut starts, mut ends) = (Vec::new(), Vec::new());
        let mut peer_words = 0;
        assert_eq!(clips.len(), 10);
        for clip in clips {
            let samples = Audio::read_wav(&speech.join(&clip.clip))
                .unwrap()
                .to_16k()
                .unwrap();
            let transcript = transcriber.transcribe(&samples, &options).unwrap();
            let words: Vec<Word> = transcript
                .segments
                .iter()
                .flat_map(|s| s.words.clone())
                .collect();
            let joined: String = words.iter().map(|w| w.word.as_str()).collect();
            let text: String = transcript
                .segments
                .iter()
                .map(|s| s.text.as_str())
                .collect();
            assert_eq!(joined, text, "{name} {}", clip.clip);
            assert!(!words.is_empty(), "{name} {}: no words", clip.clip);
            for segment in &transcript.segments {
                for w in &segment.words {
                    assert!(
                        w.start <= w.end && w.start >= segment.start && w.end <= segment.end,
                        "{name} {}: {w:?} in {}–{}",
                        clip.clip,
                        segment.start,
                        segment.end
                    );
                }
            }
            for pair in words.windows(2) {
                assert!(
                    pair[1].start >= pair[0].start && pair[1].end >= pair[0].end,
                    "{name} {}: {pair:?}",
                    clip.clip
                );
            }
            let peer: Vec<Word> = clip
                .segments
                .iter()
                .flat_map(|s| &s.words)
                .map(|(word, start, end, probability)| Word {
                    start: *start,
                    end: *end,
                    word: word.clone(),
                    probability: *probability,
                })
                .collect();
            let peer_text: String = clip.segments.iter().map(|s| s.text.as_str()).collect();
            eprintln!("{name} {}:\n  ours: {text}\n  peer: {peer_text}", clip.clip);
            peer_words += peer.len();
            for (start, end) in word_time_differences(&words, &peer) {
                starts.push(start.abs());
                ends.push(end.abs());
            }
        }
        let matched = starts.len();
        let (start, end) = (median(&mut starts), median(&mut ends));
        eprintln!(
            "{name}: {matched} of faster-whisper's {peer_words} words matched; median |Δstart| \
             {:.0} ms, |Δend| {:.0} ms",
            1000.0 * start,
            1000.0 * end
        );
        assert!(
            matched * 10 >= peer_words * 9,
            "{name}: only {matched} of {peer_words} words in common"
        );
        assert!(start <= 0.1, "{name}: median start difference {start} s");
        assert!(end <= 0.1, "{name}: median end difference {end} s");
    }
}
