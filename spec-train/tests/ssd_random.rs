//! SSD drafts (lower layers and head retrained, upper layers shared) on tiny random models of
//! both families: the float training copy computes what the model computes, training fits the
//! target, the files round-trip and are refused for other models, and the draft decodes
//! losslessly under greedy verification. And CosyVoice 2's speech-token LM (the tiny reference
//! fixture of `engine-tts`), whose draft of its own layers trains and decodes (`cosyvoice_ssd`).

#[path = "../../engine-llm/tests/common/mod.rs"]
#[allow(dead_code)] // each test binary uses part of the shared helpers
mod common;
#[path = "../../engine-tts/tests/common/mod.rs"]
mod tts_common;

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use common::{Family, Tiny, FAMILIES};
use engine_llm::ssd::{Backbone, DistilledSequence, SsdDraftWeights};
use engine_llm::{Error, LoadOptions, Transformer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spec_core::{
    generate, speculative_generate, AcceptanceRule, Decoder, DraftLength, LogitRows,
    SamplingConfig, SpeculativeConfig, StopConditions,
};
use spec_nn::heads::weights_fingerprint;
use spec_train::ssd::{train, SsdProgress, SsdTrainConfig};

/// A four-layer model written to GGUF, loaded, and its weights file.
fn model(family: Family, seed: u64, dir: &std::path::Path) -> (Transformer, PathBuf) {
    let mut tiny = Tiny::new(family);
    tiny.layers = 4;
    let path = tiny.write_gguf(dir, seed, GgmlDType::Q8_0, &[]);
    (
        Transformer::from_gguf(&path, &LoadOptions::default()).unwrap(),
        path,
    )
}

/// Random sequences labelled by `target` from their fourth position.
fn distilled(target: &mut Transformer, count: usize, top_k: usize) -> Vec<DistilledSequence> {
    let mut rng = StdRng::seed_from_u64(5);
    let vocab = target.vocab_size() as u32;
    (0..count)
        .map(|_| {
            let len = rng.random_range(8..20);
            let tokens: Vec<u32> = (0..len).map(|_| rng.random_range(0..vocab)).collect();
            DistilledSequence::label(target, tokens, 3, top_k).unwrap()
        })
        .collect()
}

fn quiet(_: &SsdProgress) {}

#[test]
fn the_float_training_copy_computes_what_the_model_computes() {
    let scratch = tempfile::tempdir().unwrap();
    for family in FAMILIES {
        let (mut target, _) = model(family, 3, scratch.path());
        let vocab = target.vocab_size();
        let data = distilled(&mut target, 12, vocab);
        // Every layer kept, nothing trained: the draft is the model, computed in float.
        let config = SsdTrainConfig {
            lower_layers: 1,
            upper_layers: 3,
            epochs: 0,
            shortlist_below: vocab as u32,
            ..Default::default()
        };
        let trained = train(&Backbone::text(&target), &data, &config, &mut quiet).unwrap();
        let before = &trained.reports[0];
        assert!(before.agreement > 0.95, "{family:?}: {before}");
        assert!(before.overlap > 0.97, "{family:?}: {before}");
        // The draft built from those weights gives the model's logits (both Q8_0).
        let weights =
            trained.into_weights(target.config(), target.vocab_size(), "tiny", "fp", "test");
        let mut draft = target.ssd_draft(&weights).unwrap();
        let tokens = [5u32, 17, 30, 2, 64];
        let ours: Vec<Vec<f32>> = draft
            .forward_tokens(&tokens, LogitRows::All)
            .unwrap()
            .rows()
            .map(<[f32]>::to_vec)
            .collect();
        target.reset();
        let theirs: Vec<Vec<f32>> = target
            .forward_tokens(&tokens, LogitRows::All)
            .unwrap()
            .rows()
            .map(<[f32]>::to_vec)
            .collect();
        for (a, b) in ours.iter().flatten().zip(theirs.iter().flatten()) {
            assert!((a - b).abs() < 1e-3, "{family:?}: {a} vs {b}");
        }
    }
}

#[test]
fn training_fits_the_target_deterministically() {
    let scratch = tempfile::tempdir().unwrap();
    for family in FAMILIES {
        let (mut target, _) = model(family, 8, scratch.path());
        let data = distilled(&mut target, 24, 8);
        // The middle two layers dropped, as SSD drops the middle of the model.
        let config = SsdTrainConfig {
            lower_layers: 1,
            upper_layers: 1,
            epochs: 4,
            learning_rate: 2e-3,
            shortlist_below: 32,
            ..Default::default()
        };
        let mut steps = 0;
        let trained = train(&Backbone::text(&target), &data, &config, &mut |p| {
            if matches!(p, SsdProgress::Step { .. }) {
                steps += 1;
            }
        })
        .unwrap();
        assert_eq!(
            steps,
            4 * (24 - 2),
            "every training sequence once per epoch"
        );
        let (before, after) = (&trained.reports[0], trained.reports.last().unwrap());
        assert!(after.loss < before.loss, "{family:?}: {before} → {after}");
        assert!(
            after.overlap > before.overlap,
            "{family:?}: {before} → {after}"
        );
        // The shortlist: every id below 32 and every label of the training sequences.
        assert!(trained
            .shortlist
            .starts_with(&(0..32).collect::<Vec<u32>>()));
        let again = train(&Backbone::text(&target), &data, &config, &mut quiet).unwrap();
        assert_eq!(again.reports, trained.reports, "same seed, same training");
        let a: Vec<f32> = trained.head.flatten_all().unwrap().to_vec1().unwrap();
        let b: Vec<f32> = again.head.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(a, b);
    }
}

#[test]
fn a_trained_draft_decodes_losslessly_and_only_proposes_its_shortlist() {
    let scratch = tempfile::tempdir().unwrap();
    for family in FAMILIES {
        let (mut target, path) = model(family, 21, scratch.path());
        let data = distilled(&mut target, 16, 8);
        let config = SsdTrainConfig {
            lower_layers: 1,
            upper_layers: 1,
            epochs: 2,
            learning_rate: 2e-3,
            shortlist_below: 48,
            ..Default::default()
        };
        let trained = train(&Backbone::text(&target), &data, &config, &mut quiet).unwrap();
        let fingerprint = weights_fingerprint(&path).unwrap();
        let weights = trained.into_weights(
            target.config(),
            target.vocab_size(),
            "tiny",
            &fingerprint,
            "test",
        );
        let dir = scratch.path().join(format!("draft-{family:?}"));
        weights.save(&dir).unwrap();
        let loaded = SsdDraftWeights::load(&dir, &fingerprint).unwrap();
        assert_eq!(loaded.info, weights.info);
        assert_eq!(loaded.shortlist, weights.shortlist);
        let mut draft = target.ssd_draft(&loaded).unwrap();
        assert_eq!(draft.config().num_layers, 2);

        let logits = draft
            .forward_tokens(&[1, 2, 3], LogitRows::Last(1))
            .unwrap();
        for (token, &score) in logits.row(0).iter().enumerate() {
            let listed = loaded.shortlist.contains(&(token as u32));
            assert_eq!(score.is_finite(), listed, "token {token}: {score}");
        }
        draft.reset();

        let prompt = [4u32, 9, 33, 7];
        let stop = StopConditions::new(30);
        let mut rng = StdRng::seed_from_u64(0);
        target.reset();
        let greedy = generate(
            &mut target,
            &prompt,
            &SamplingConfig::greedy(),
            &stop,
            &mut rng,
            &mut |_| {},
        )
        .unwrap();
        target.reset();
        let speculative = speculative_generate(
            &mut target,
            &mut draft,
            &prompt,
            &SpeculativeConfig {
                draft_length: DraftLength::Fixed(3),
                rule: AcceptanceRule::greedy(),
                sampling: SamplingConfig::greedy(),
            },
            &stop,
            &mut rng,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(speculative.tokens, greedy.tokens, "{family:?}");
        assert!(speculative.stats.target_forwards < greedy.stats.target_forwards);
    }
}

#[test]
fn drafts_for_other_models_and_bad_settings_are_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let (mut target, path) = model(Family::Qwen2, 2, scratch.path());
    let data = distilled(&mut target, 4, 4);
    let config = SsdTrainConfig {
        lower_layers: 1,
        upper_layers: 1,
        epochs: 0,
        ..Default::default()
    };
    let fingerprint = weights_fingerprint(&path).unwrap();
    let weights = train(&Backbone::text(&target), &data, &config, &mut quiet)
        .unwrap()
        .into_weights(
            target.config(),
            target.vocab_size(),
            "tiny",
            &fingerprint,
            "test",
        );
    let dir = scratch.path().join("draft");
    weights.save(&dir).unwrap();
    let err = SsdDraftWeights::load(&dir, "0123456789abcdef").unwrap_err();
    assert!(
        matches!(err, Error::Nn(spec_nn::Error::Config(_)))
            && err.to_string().contains("trained for `tiny`"),
        "{err}"
    );
    let missing = SsdDraftWeights::load(&scratch.path().join("nowhere"), &fingerprint);
    assert!(matches!(missing, Err(Error::Io { .. })));

    // A model of another width.
    let mut wide = Tiny::new(Family::Qwen2);
    wide.hidden = 128;
    let other_dir = scratch.path().join("wide");
    std::fs::create_dir_all(&other_dir).unwrap();
    let other = Transformer::from_gguf(
        &wide.write_gguf(&other_dir, 1, GgmlDType::Q8_0, &[]),
        &LoadOptions::default(),
    )
    .unwrap();
    assert!(matches!(other.ssd_draft(&weights), Err(Error::Config(_))));

    for (lower, upper) in [(0, 2), (3, 2)] {
        let bad = SsdTrainConfig {
            lower_layers: lower,
            upper_layers: upper,
            ..config.clone()
        };
        assert!(
            matches!(
                train(&Backbone::text(&target), &data, &bad, &mut quiet),
                Err(Error::Config(_))
            ),
            "{lower} + {upper} of 4"
        );
    }
    assert!(matches!(
        train(&Backbone::text(&target), &data[..1], &config, &mut quiet),
        Err(Error::Input(_))
    ));
    // A sequence whose labels start past its end, or do not cover it.
    for (first, drop_labels) in [(data[0].tokens.len() + 1, 0), (data[0].first, 1)] {
        let mut broken = data.clone();
        broken[0].first = first;
        let kept = broken[0].labels.len().saturating_sub(drop_labels);
        broken[0].labels.truncate(kept);
        let err = train(&Backbone::text(&target), &broken, &config, &mut quiet).unwrap_err();
        assert!(
            matches!(err, Error::Input(_)) && err.to_string().contains("sequence 0"),
            "{err}"
        );
    }
}

/// CosyVoice 2's speech-token LM (the tiny reference fixture of `engine-tts`'s tests), whose
/// draft of its own layers is trained on its own speech.
mod cosyvoice_ssd {
    use engine_tts::cosyvoice::lm::SsdConfig;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use spec_train::ssd::{train, SsdTrainConfig};

    use super::tts_common::ssd::{fixture, model, PROMPT_SPEECH, PROMPT_TEXT, SPEECH_TOKENS, TEXT};

    #[test]
    fn a_trained_draft_of_the_lms_own_layers_fits_it_and_decodes() {
        let (weights, backbone) = fixture();
        let mut target = model(weights, backbone, SPEECH_TOKENS);
        let mut uniforms = StdRng::seed_from_u64(3);
        let texts: Vec<Vec<u32>> = (0..12u32)
            .map(|i| vec![5 + i, 17, 40 - i, 2 * i + 1])
            .collect();
        let data: Vec<_> = texts
            .iter()
            .map(|text| {
                target
                    .distill(text, &PROMPT_TEXT, &PROMPT_SPEECH, 8, &mut uniforms)
                    .unwrap()
            })
            .collect();
        let layers = target.ssd_backbone().model.config().num_layers;
        // SSD's construction at this size: the lower layer retrained, the upper ones dropped.
        let config = SsdTrainConfig {
            lower_layers: 1,
            upper_layers: 0,
            epochs: 6,
            learning_rate: 3e-3,
            ..Default::default()
        };
        let trained = train(&target.ssd_backbone(), &data, &config, &mut |_| {}).unwrap();
        let (before, after) = (&trained.reports[0], trained.reports.last().unwrap());
        assert!(after.loss < before.loss, "{before} → {after}");
        assert_eq!(
            trained.shortlist,
            (0..SPEECH_TOKENS as u32 + 3).collect::<Vec<_>>(),
            "a speech LM's draft scores every speech token"
        );
        let backbone_config = target.ssd_backbone().model.config().clone();
        let weights =
            trained.into_weights(&backbone_config, SPEECH_TOKENS + 3, "tiny", "fp", "test");
        let mut draft = target.ssd_draft(&weights).unwrap();
        assert!(layers > 1);
        let mut rng = StdRng::seed_from_u64(0);
        let (speech, stats) = target
            .generate_speculative(
                &mut draft,
                &TEXT,
                &PROMPT_TEXT,
                &PROMPT_SPEECH,
                &SsdConfig {
                    gamma: 3,
                    tolerance: 0.0,
                    max_tokens: Some(12),
                },
                &mut rng,
                None,
            )
            .unwrap();
        assert!(!speech.is_empty() && stats.drafted_tokens() > 0);

        // A text model's draft (a shortlist head without a bias) does not fit a speech LM.
        let mut text_like = weights.clone();
        text_like.head_bias = None;
        assert!(target.ssd_draft(&text_like).is_err());
    }
}
