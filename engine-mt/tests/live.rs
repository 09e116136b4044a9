//! `LiveTranslator` on tiny random-weight chat models: display policies, adaptive bias, the
//! lookup continuation and the caption timing, end to end through a real tokenizer and chat
//! template.

use engine_mt::{
    lag_k, replay_display, AdaptiveBias, BiasInputs, Caption, Decoding, DisplayPolicy, LiveConfig,
    LiveTranslator, Partial, StreamSummary,
};

const SENTENCE: &str = "Please call me back at half past four when you get this message.";

fn config(decoding: Decoding) -> LiveConfig {
    LiveConfig {
        decoding,
        max_tokens: 20,
        ..LiveConfig::new("German")
    }
}

fn captions(seed: u64, config: LiveConfig, updates: &[Partial]) -> Vec<Caption> {
    let mut model = engine_llm::testing::tiny_chat_model(seed).unwrap();
    let mut live = LiveTranslator::new(&mut model, config).unwrap();
    live.sentence(updates).unwrap()
}

fn policies() -> Vec<DisplayPolicy> {
    use DisplayPolicy as D;
    vec![
        D::full(),
        D::mask_k(3),
        D::local_agreement(2),
        D::stability(0.3),
        D::open_end(),
        D::all_of([D::open_end(), D::stability(0.3)]),
        D::hold(D::all_of([D::local_agreement(2), D::mask_k(1)])),
    ]
}

/// Every policy shows a word prefix of each partial output and the whole final output, and the
/// bench's replay of a policy shows what the translator showed with it.
#[test]
fn displays_are_whole_word_prefixes_and_replays_match() {
    let updates = lag_k(SENTENCE, 3).unwrap();
    for seed in [1, 2] {
        for policy in policies() {
            let config = LiveConfig {
                display: policy.clone(),
                ..config(Decoding::Ssbd { beta: 0.3 })
            };
            let shown = captions(seed, config, &updates);
            for caption in &shown {
                let words: Vec<&str> = caption.display.split_whitespace().collect();
                let output: Vec<&str> = caption.output.split_whitespace().collect();
                assert!(
                    output.starts_with(&words),
                    "{}: {:?} is not a word prefix of {:?}",
                    policy.label(),
                    caption.display,
                    caption.output
                );
                if caption.is_final {
                    assert_eq!(caption.display, caption.output, "{}", policy.label());
                }
            }
            let model = engine_llm::testing::tiny_chat_model(seed).unwrap();
            let replayed = replay_display(&model.tokenizer, &policy, &shown, false).unwrap();
            let displayed: Vec<String> = shown.iter().map(|c| c.display.clone()).collect();
            assert_eq!(replayed, displayed, "{}", policy.label());
        }
    }
    // Local agreement has nothing to agree with on the first update.
    let first = captions(
        5,
        LiveConfig {
            display: DisplayPolicy::local_agreement(2),
            ..config(Decoding::Autoregressive)
        },
        &updates,
    );
    assert!(!first[0].output.is_empty());
    assert_eq!(first[0].display, "");
}

/// Hiding never makes a caption stable sooner: on the same captions, a policy's time to a
/// stable caption is at least the full display's, and the final caption comes at the same time.
/// (Counted in characters: the tiny models repeat one token, so their outputs have few words.)
#[test]
fn hiding_trades_flicker_for_time_to_a_stable_caption() {
    let seed = 1;
    let updates = lag_k(SENTENCE, 3).unwrap();
    let model = engine_llm::testing::tiny_chat_model(seed).unwrap();
    let decoded = captions(seed, config(Decoding::Ssbd { beta: 0.2 }), &updates);
    let summary = |policy: &DisplayPolicy| {
        let texts = replay_display(&model.tokenizer, policy, &decoded, true).unwrap();
        let shown: Vec<Caption> = decoded
            .iter()
            .zip(texts)
            .map(|(c, display)| Caption {
                display,
                ..c.clone()
            })
            .collect();
        let mut summary = StreamSummary::default();
        summary.add_timed_sentence(&updates, &shown, true);
        summary
    };
    let full = summary(&DisplayPolicy::full());
    assert!(full.final_units > 0);
    assert!(full.time_to_stable() > std::time::Duration::ZERO);
    for policy in policies() {
        let s = summary(&policy);
        assert_eq!(s.final_units, full.final_units, "{}", policy.label());
        assert!(
            s.time_to_stable() >= full.time_to_stable(),
            "{}: {:?} against {:?}",
            policy.label(),
            s.time_to_stable(),
            full.time_to_stable()
        );
        assert_eq!(s.final_caption_delay(), full.final_caption_delay());
    }
}

/// The adaptive rule sets each biased update's β from the source so far and the sentence's
/// earlier acceptances; the final update stays unbiased, and the first has no draft.
#[test]
fn adaptive_bias_is_chosen_per_update() {
    let updates = lag_k(SENTENCE, 3).unwrap();
    let adaptive = AdaptiveBias {
        min_words: 0,
        full_words: 6,
    };
    let shown = captions(
        5,
        LiveConfig {
            adaptive_bias: Some(adaptive),
            ..config(Decoding::Ssbd { beta: 0.5 })
        },
        &updates,
    );
    let (mut accepted, mut forced) = (0, 0);
    for (i, caption) in shown.iter().enumerate() {
        let words = updates[i].text.split_whitespace().count();
        let before = if i == 0 {
            0
        } else {
            updates[i - 1].text.split_whitespace().count()
        };
        let expected = if i == 0 || caption.is_final {
            0.0
        } else {
            adaptive.beta(
                0.5,
                &BiasInputs {
                    source_words: words,
                    changed_words: words - before,
                    accepted_so_far: accepted,
                    forced_so_far: forced,
                },
            )
        };
        assert!(
            (caption.beta - expected).abs() < 1e-6,
            "update {i}: β {} against {expected}",
            caption.beta
        );
        accepted += caption.decode.accepted;
        forced += caption.decode.forced;
        assert!(caption.decode.forced <= caption.decode.accepted);
    }
    assert!(shown.iter().any(|c| c.beta > 0.0));
}

/// At β = 0, with or without the previous output drafting after the divergence, every update's
/// output is autoregressive re-translation's.
#[test]
fn beta_zero_with_lookup_is_autoregressive_retranslation() {
    let updates = lag_k(SENTENCE, 2).unwrap();
    for seed in [6, 7] {
        let ar = captions(seed, config(Decoding::Autoregressive), &updates);
        // The default's lookup continuation leaves autoregressive re-translation plain.
        assert!(config(Decoding::Autoregressive).lookup_draft > 0);
        assert!(ar
            .iter()
            .all(|c| c.decode.continuation_drafted == 0 && c.decode.drafted == 0));
        for lookup_draft in [0, 4] {
            let ssbd = captions(
                seed,
                LiveConfig {
                    lookup_draft,
                    ..config(Decoding::Ssbd { beta: 0.0 })
                },
                &updates,
            );
            let outputs = |c: &[Caption]| c.iter().map(|c| c.output.clone()).collect::<Vec<_>>();
            assert_eq!(outputs(&ssbd), outputs(&ar), "lookup {lookup_draft}");
            assert!(ssbd[1..].iter().all(|c| c.decode.drafted > 0));
        }
    }
}
