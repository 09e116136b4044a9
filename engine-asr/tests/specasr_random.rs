//! SpecASR on tiny random-weight Whisper models: whatever the draft (the target itself, a
//! perturbed copy that agrees most of the time, an unrelated model) and whatever the drafting
//! settings, the transcript is exactly greedy decoding's, in no more target forwards; a draft
//! with another vocabulary is refused.

use std::path::Path;

use candle_core::Tensor;
use engine_asr::testing::{self, hf_weights, tones, write_hf};
use engine_asr::{LoadOptions, TranscribeOptions, Transcriber};
use proptest::prelude::*;
use spec_core::SpecAsrConfig;

const TARGET_SEED: u64 = 31;

fn greedy_options(timestamps: bool) -> TranscribeOptions {
    TranscribeOptions {
        timestamps,
        ..testing::greedy_options()
    }
}

/// The target's weights with the decoder's position embeddings pushed far off at a few
/// positions: a draft that disagrees with the target there and agrees elsewhere, as a small
/// ASR model does around one hard word.
fn write_perturbed(dir: &Path) {
    write_hf(dir, TARGET_SEED).unwrap();
    let mut weights = hf_weights(TARGET_SEED).unwrap();
    let name = "model.decoder.embed_positions.weight";
    let positions = weights[name].clone();
    let (rows, hidden) = positions.dims2().unwrap();
    let mut values: Vec<f32> = positions.flatten_all().unwrap().to_vec1().unwrap();
    for row in [6, 11, 19, 30, 44] {
        for (j, v) in values[row * hidden..(row + 1) * hidden]
            .iter_mut()
            .enumerate()
        {
            *v += if j % 3 == 0 { 4.0 } else { -2.0 };
        }
    }
    let perturbed = Tensor::from_vec(values, (rows, hidden), positions.device()).unwrap();
    weights.insert(name.into(), perturbed);
    candle_core::safetensors::save(&weights, dir.join("model.safetensors")).unwrap();
}

/// A target transcriber and, per draft kind, a transcriber with that draft set.
struct Models {
    _dirs: Vec<tempfile::TempDir>,
    target: Transcriber,
    with_draft: Vec<(&'static str, Transcriber)>,
}

fn models() -> Models {
    let load = |dir: &Path| Transcriber::load(dir, &LoadOptions::default()).unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    write_hf(target_dir.path(), TARGET_SEED).unwrap();
    let mut dirs = Vec::new();
    let mut with_draft = Vec::new();
    for (name, write) in [
        (
            "itself",
            Box::new(|d: &Path| write_hf(d, TARGET_SEED).unwrap()) as Box<dyn Fn(&Path)>,
        ),
        ("perturbed", Box::new(write_perturbed)),
        ("unrelated", Box::new(|d: &Path| write_hf(d, 77).unwrap())),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path());
        let mut t = load(target_dir.path());
        t.set_draft(load(dir.path())).unwrap();
        with_draft.push((name, t));
        dirs.push(dir);
    }
    let target = load(target_dir.path());
    dirs.push(target_dir);
    Models {
        _dirs: dirs,
        target,
        with_draft,
    }
}

#[test]
fn every_ablation_step_transcribes_exactly_as_greedy_decoding() {
    let mut m = models();
    let recordings: Vec<Vec<f32>> = [(0.7, 220.0), (1.3, 330.0), (1.9, 180.0)]
        .iter()
        .map(|&(s, p)| tones(s, p))
        .collect();
    let mut rejections = 0;
    for timestamps in [false, true] {
        let plain = greedy_options(timestamps);
        for (i, samples) in recordings.iter().enumerate() {
            let greedy = m.target.transcribe(samples, &plain).unwrap();
            for (draft, transcriber) in &mut m.with_draft {
                for config in [
                    SpecAsrConfig::plain(4),
                    SpecAsrConfig::adaptive(),
                    SpecAsrConfig::recycling(),
                    SpecAsrConfig::sparse_tree(),
                ] {
                    let options = TranscribeOptions {
                        draft: Some(config),
                        ..plain.clone()
                    };
                    let fast = transcriber.transcribe(samples, &options).unwrap();
                    assert_eq!(
                        fast.segments, greedy.segments,
                        "draft {draft}, recording {i}, {config:?}"
                    );
                    assert!(fast.stats.forwards <= greedy.stats.forwards);
                    if *draft == "perturbed" {
                        rejections += fast
                            .stats
                            .draft
                            .steps
                            .iter()
                            .filter(|s| s.accepted < s.drafted)
                            .count();
                    }
                    if *draft == "itself" {
                        assert!(
                            fast.stats.draft.steps.iter().all(|s| s.accepted > 0),
                            "a draft equal to the target has every trunk accepted"
                        );
                    }
                }
            }
        }
    }
    let (_, itself) = &m.with_draft[0];
    assert!(itself.draft_counts().unwrap().drafted > 0);
    let (_, perturbed) = &m.with_draft[1];
    assert!(rejections > 0, "the perturbed draft was never rejected");
    assert!(
        perturbed.draft_counts().unwrap().branch_nodes > 0,
        "the sparse tree never branched: {:?}",
        perturbed.draft_counts()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_drafting_settings_are_lossless(
        threshold in 0.0f32..1.0,
        max_len in 1usize..25,
        branches in 0usize..5,
        adaptive in any::<bool>(),
        recycle in any::<bool>(),
        cost_aware in any::<bool>(),
        draft in 0usize..3,
        seconds in 0.4f32..1.9,
        timestamps in any::<bool>(),
    ) {
        thread_local! {
            static MODELS: std::cell::RefCell<Option<Models>> = const { std::cell::RefCell::new(None) };
        }
        MODELS.with(|cell| {
            let mut cell = cell.borrow_mut();
            let m = cell.get_or_insert_with(models);
            let samples = tones(seconds, 250.0);
            let plain = greedy_options(timestamps);
            let greedy = m.target.transcribe(&samples, &plain).unwrap();
            let config = SpecAsrConfig { threshold, max_len, adaptive, recycle, branches, cost_aware };
            let options = TranscribeOptions { draft: Some(config), ..plain };
            let fast = m.with_draft[draft].1.transcribe(&samples, &options).unwrap();
            prop_assert_eq!(fast.segments, greedy.segments);
            prop_assert!(fast.stats.forwards <= greedy.stats.forwards);
            Ok(())
        })?;
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused_and_drafting_needs_a_draft() {
    let target_dir = tempfile::tempdir().unwrap();
    write_hf(target_dir.path(), TARGET_SEED).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    write_hf(other_dir.path(), TARGET_SEED).unwrap();
    let tokenizer = other_dir.path().join("tokenizer.json");
    let text = std::fs::read_to_string(&tokenizer).unwrap();
    std::fs::write(&tokenizer, text.replacen("\"a\"", "\"A\"", 1)).unwrap();
    let load = |dir: &Path| Transcriber::load(dir, &LoadOptions::default()).unwrap();
    let mut target = load(target_dir.path());
    let err = target.set_draft(load(other_dir.path())).unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
    let options = TranscribeOptions {
        draft: Some(SpecAsrConfig::default()),
        ..greedy_options(false)
    };
    let err = target.transcribe(&tones(0.5, 220.0), &options).unwrap_err();
    assert!(err.to_string().contains("none was set"), "{err}");
}
