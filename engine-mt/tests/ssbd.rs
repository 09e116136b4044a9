//! SSBD against the mock decoder: β = 0 is exactly greedy re-translation whatever the draft,
//! continuation and cache state; β > 0 only ever keeps draft tokens the bias allows, then
//! continues greedily; with an unbiased final update (fixed or adaptive β) a sentence's committed
//! output is exactly greedy re-translation's.

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::mock::{MockConfig, MockDecoder};
use spec_core::sampling::{argmax, softmax};
use spec_core::{generate, Decoder, LookupConfig, LookupDrafter, SamplingConfig, StopConditions};

use engine_mt::{
    decode_update, AdaptiveBias, BiasInputs, Continuation, Decoding, Error, LiveConfig, Masking,
};

const END: u32 = 0;

fn greedy(config: &MockConfig, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut model = MockDecoder::new(config.clone());
    let out = generate(
        &mut model,
        prompt,
        &SamplingConfig::greedy(),
        &StopConditions::new(max_tokens).with_eos([END]),
        &mut StdRng::seed_from_u64(0),
        &mut |_| {},
    )
    .unwrap();
    out.tokens.into_iter().take_while(|&t| t != END).collect()
}

fn ssbd(
    model: &mut MockDecoder,
    prompt: &[u32],
    draft: &[u32],
    beta: f32,
    max_tokens: usize,
) -> engine_mt::UpdateDecode {
    ssbd_with(model, Continuation::Greedy, prompt, draft, beta, max_tokens)
}

fn ssbd_with(
    model: &mut MockDecoder,
    continuation: Continuation<'_>,
    prompt: &[u32],
    draft: &[u32],
    beta: f32,
    max_tokens: usize,
) -> engine_mt::UpdateDecode {
    decode_update(
        model,
        continuation,
        prompt,
        draft,
        &Decoding::Ssbd { beta },
        &[END],
        max_tokens,
    )
    .unwrap()
}

/// A β = 0 update of 24 tokens at most on a fresh `config` model, drafted by `previous` and
/// continued by `drafter`'s lookups.
fn lookup_update(
    config: &MockConfig,
    prompt: &[u32],
    previous: &[u32],
    drafter: &mut LookupDrafter,
) -> engine_mt::UpdateDecode {
    ssbd_with(
        &mut MockDecoder::new(config.clone()),
        Continuation::Lookup(drafter),
        prompt,
        previous,
        0.0,
        24,
    )
}

/// One sentence's outputs the way `LiveTranslator` produces them, on one decoder: update `i`
/// decodes `source[..ends[i]]` (the last update is final) with
/// `config.decoding_for(is_final, …)` (source tokens standing for words), drafted by the
/// previous output less the mask-k tail, continued as `config.lookup_draft` says.
fn sentence(
    config: &LiveConfig,
    model: &mut MockDecoder,
    source: &[u32],
    ends: &[usize],
) -> Vec<Vec<u32>> {
    let mut previous: Vec<u32> = Vec::new();
    let mut outputs = Vec::new();
    let mut inputs = BiasInputs::default();
    for (i, &end) in ends.iter().enumerate() {
        let is_final = i + 1 == ends.len();
        let keep = match config.masking {
            Masking::Draft(k) => previous.len().saturating_sub(k),
            Masking::None => previous.len(),
        };
        inputs.changed_words = end - inputs.source_words;
        inputs.source_words = end;
        let mut drafter = lookup_drafter(config.lookup_draft, &previous);
        let continuation = match drafter.as_mut() {
            Some(drafter) => Continuation::Lookup(drafter),
            None => Continuation::Greedy,
        };
        let out = decode_update(
            model,
            continuation,
            &source[..end],
            &previous[..keep],
            &config.decoding_for(is_final, &inputs),
            &[END],
            config.max_tokens,
        )
        .unwrap();
        inputs.accepted_so_far += out.accepted;
        inputs.forced_so_far += out.forced;
        previous = out.tokens.clone();
        outputs.push(out.tokens);
    }
    outputs
}

/// The lookup continuation's drafter over `reference` (the previous output), none for 0.
fn lookup_drafter(max_draft: usize, reference: &[u32]) -> Option<LookupDrafter> {
    (max_draft > 0).then(|| {
        let mut drafter = LookupDrafter::new(LookupConfig {
            max_draft,
            ..LookupConfig::default()
        })
        .unwrap();
        drafter.add_reference(reference.to_vec());
        drafter
    })
}

/// Update ends of a lag-3 reveal of `len` source tokens.
fn lag_3_ends(len: usize) -> Vec<usize> {
    (1..=len.div_ceil(3)).map(|i| (3 * i).min(len)).collect()
}

fn tokens(vocab: u32) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(1..vocab, 1..12)
}

/// A draft the model keeps whole that already fills the token budget is the whole output: the
/// model's next token is not added past the budget (a case proptest found).
#[test]
fn a_kept_draft_that_fills_the_budget_is_the_whole_output() {
    let prompt = [1, 1, 1, 1, 1, 1, 1, 1, 32, 37, 15];
    let config = MockConfig::target(40, 46);
    for max_tokens in 1..4 {
        let expected = greedy(&config, &prompt, max_tokens);
        let mut model = MockDecoder::new(config.clone());
        let out = ssbd(&mut model, &prompt, &expected, 0.0, max_tokens);
        assert_eq!(out.tokens, expected);
        assert_eq!(
            expected.len(),
            max_tokens,
            "the greedy output fills the budget"
        );
        assert_eq!(out.accepted, max_tokens);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// β = 0 gives the greedy output for any draft (related or not), any stale cache and any
    /// continuation.
    #[test]
    fn beta_zero_is_greedy_retranslation(
        seed in 0u64..1000,
        prompt in tokens(40),
        draft in prop::collection::vec(0u32..40, 0..16),
        stale in prop::collection::vec(1u32..40, 0..20),
        max_tokens in 1usize..24,
        lookup in 0usize..6,
    ) {
        let config = MockConfig::target(40, seed);
        let mut model = MockDecoder::new(config.clone());
        // Leave something else in the cache first.
        if !stale.is_empty() {
            generate(&mut model, &stale, &SamplingConfig::greedy(), &StopConditions::new(2),
                     &mut StdRng::seed_from_u64(0), &mut |_| {}).unwrap();
        }
        let mut drafter = lookup_drafter(lookup, &draft);
        let continuation = match drafter.as_mut() {
            Some(drafter) => Continuation::Lookup(drafter),
            None => Continuation::Greedy,
        };
        let out = ssbd_with(&mut model, continuation, &prompt, &draft, 0.0, max_tokens);
        prop_assert_eq!(&out.tokens, &greedy(&config, &prompt, max_tokens));
        prop_assert!(out.accepted <= out.drafted);
        prop_assert!(out.continuation_accepted <= out.continuation_drafted);
        prop_assert_eq!(out.confidence.len(), out.tokens.len());
        prop_assert!(out.confidence.iter().all(|p| (0.0..=1.0 + 1e-6).contains(p)));
        prop_assert_eq!(out.forced, 0);
    }

    /// With a bias, the output is a prefix of the draft whose every token passed the biased
    /// check, followed by the greedy continuation of that prefix.
    #[test]
    fn biased_output_is_an_allowed_draft_prefix_then_greedy(
        seed in 0u64..1000,
        prompt in tokens(30),
        draft in prop::collection::vec(1u32..30, 1..12),
        beta in 0.05f32..0.95,
        lookup in 0usize..6,
    ) {
        let config = MockConfig { sharpness: 1.0, ..MockConfig::target(30, seed) };
        let mut model = MockDecoder::new(config.clone());
        let max_tokens = 20;
        let mut drafter = lookup_drafter(lookup, &draft);
        let continuation = match drafter.as_mut() {
            Some(drafter) => Continuation::Lookup(drafter),
            None => Continuation::Greedy,
        };
        let out = ssbd_with(&mut model, continuation, &prompt, &draft, beta, max_tokens);
        let kept = out.accepted;
        prop_assert_eq!(&out.tokens[..kept], &draft[..kept]);
        let reference = MockDecoder::new(config.clone());
        for i in 0..kept {
            let visible: Vec<u32> = prompt.iter().chain(&draft[..i]).copied().collect();
            let probs = softmax(&reference.logits_for(&visible, visible.len() - 1));
            let best = probs[argmax(&probs) as usize];
            let p = probs[draft[i] as usize];
            prop_assert!((1.0 - beta) * p + beta >= (1.0 - beta) * best - 1e-6);
            // The confidence is that biased probability.
            prop_assert!((out.confidence[i] - ((1.0 - beta) * p + beta)).abs() < 1e-5);
        }
        let forced = (0..kept)
            .filter(|&i| {
                let visible: Vec<u32> = prompt.iter().chain(&draft[..i]).copied().collect();
                argmax(&reference.logits_for(&visible, visible.len() - 1)) != draft[i]
            })
            .count();
        prop_assert_eq!(out.forced, forced);
        let prefix: Vec<u32> = prompt.iter().chain(&draft[..kept]).copied().collect();
        let rest = greedy(&config, &prefix, max_tokens - kept);
        prop_assert_eq!(&out.tokens[kept..], &rest[..]);
    }

    /// A chain of updates through one decoder (cache reused between updates, each drafted by the
    /// previous output) gives what fresh decoders give.
    #[test]
    fn cache_reuse_across_updates_changes_nothing(
        seed in 0u64..1000,
        source in prop::collection::vec(1u32..50, 4..16),
        beta in prop::sample::select(vec![0.0f32, 0.2, 0.5]),
    ) {
        let config = MockConfig::target(50, seed);
        let mut shared = MockDecoder::new(config.clone());
        let mut previous = Vec::new();
        for end in (2..=source.len()).step_by(3) {
            let prompt = &source[..end];
            let out = ssbd(&mut shared, prompt, &previous, beta, 16);
            let mut fresh = MockDecoder::new(config.clone());
            prop_assert_eq!(&out.tokens, &ssbd(&mut fresh, prompt, &previous, beta, 16).tokens);
            previous = out.tokens;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// With an unbiased final update, whatever β (fixed or adaptive), masking, continuation and
    /// source, a sentence's final output is greedy re-translation's, and every partial output is
    /// what the biased setting gives.
    #[test]
    fn an_unbiased_final_update_commits_autoregressive_retranslation(
        seed in 0u64..1000,
        source in prop::collection::vec(1u32..40, 1..20),
        beta in 0.0f32..=1.0,
        adaptive in any::<bool>(),
        masking in prop::sample::select(vec![Masking::None, Masking::Draft(3)]),
        lookup_draft in prop::sample::select(vec![0usize, 4]),
    ) {
        let mock = MockConfig { sharpness: 1.0, ..MockConfig::target(40, seed) };
        let ends = lag_3_ends(source.len());
        let config = LiveConfig {
            decoding: Decoding::Ssbd { beta },
            adaptive_bias: adaptive.then_some(AdaptiveBias { min_words: 0, full_words: 6 }),
            masking,
            lookup_draft,
            max_tokens: 12,
            ..LiveConfig::new("German")
        };
        prop_assert!(config.unbiased_final);
        let unbiased = sentence(&config, &mut MockDecoder::new(mock.clone()), &source, &ends);
        let biased = sentence(
            &LiveConfig { unbiased_final: false, ..config.clone() },
            &mut MockDecoder::new(mock.clone()),
            &source,
            &ends,
        );
        let ar = sentence(
            &LiveConfig { decoding: Decoding::Autoregressive, ..config.clone() },
            &mut MockDecoder::new(mock.clone()),
            &source,
            &ends,
        );
        prop_assert_eq!(unbiased.last(), ar.last());
        prop_assert_eq!(unbiased.last().unwrap(), &greedy(&mock, &source, 12));
        prop_assert_eq!(&unbiased[..ends.len() - 1], &biased[..ends.len() - 1]);
    }
}

#[test]
fn only_the_final_update_of_ssbd_loses_its_bias() {
    let config = LiveConfig {
        decoding: Decoding::Ssbd { beta: 0.2 },
        adaptive_bias: None,
        ..LiveConfig::new("German")
    };
    let inputs = BiasInputs {
        source_words: 12,
        changed_words: 3,
        ..BiasInputs::default()
    };
    assert!(config.unbiased_final);
    assert_eq!(
        config.decoding_for(false, &inputs),
        Decoding::Ssbd { beta: 0.2 }
    );
    assert_eq!(
        config.decoding_for(true, &inputs),
        Decoding::Ssbd { beta: 0.0 }
    );
    let paper = LiveConfig {
        unbiased_final: false,
        ..config.clone()
    };
    assert_eq!(
        paper.decoding_for(true, &inputs),
        Decoding::Ssbd { beta: 0.2 }
    );
    // The adaptive rule scales the β of every biased update.
    let adaptive = AdaptiveBias {
        min_words: 0,
        full_words: 8,
    };
    let config = LiveConfig {
        adaptive_bias: Some(adaptive),
        ..config
    };
    let beta = adaptive.beta(0.2, &inputs);
    assert!((beta - 0.15).abs() < 1e-6);
    assert_eq!(config.decoding_for(false, &inputs), Decoding::Ssbd { beta });
    assert_eq!(
        config.decoding_for(true, &inputs),
        Decoding::Ssbd { beta: 0.0 }
    );
    let ar = LiveConfig {
        decoding: Decoding::Autoregressive,
        ..config
    };
    assert_eq!(ar.decoding_for(true, &inputs), Decoding::Autoregressive);
    assert_eq!(ar.decoding_for(false, &inputs), Decoding::Autoregressive);
}

/// A strong bias keeps the draft in the final update unless that update is unbiased, and the
/// unbiased final update still verifies the previous output as its draft.
#[test]
fn a_biased_final_update_keeps_what_re_translation_would_revise() {
    let mock = MockConfig::target(40, 5);
    let source: Vec<u32> = (0..12).map(|i| 1 + (i * 7) % 39).collect();
    let ends = lag_3_ends(source.len());
    let config = LiveConfig {
        decoding: Decoding::Ssbd { beta: 0.9 },
        masking: Masking::None,
        max_tokens: 12,
        ..LiveConfig::new("German")
    };
    let ar = greedy(&mock, &source, 12);
    let unbiased = sentence(&config, &mut MockDecoder::new(mock.clone()), &source, &ends);
    assert_eq!(unbiased.last().unwrap(), &ar);
    let biased = sentence(
        &LiveConfig {
            unbiased_final: false,
            ..config.clone()
        },
        &mut MockDecoder::new(mock.clone()),
        &source,
        &ends,
    );
    assert_ne!(biased.last().unwrap(), &ar);
    assert_eq!(biased[..ends.len() - 1], unbiased[..ends.len() - 1]);

    let before_final = &unbiased[ends.len() - 2];
    let out = ssbd(
        &mut MockDecoder::new(mock.clone()),
        &source,
        before_final,
        0.0,
        12,
    );
    assert_eq!(out.tokens, ar);
    assert_eq!(out.drafted, before_final.len().min(12));
}

#[test]
fn an_unchanged_draft_costs_one_forward_and_full_bias_keeps_everything() {
    let config = MockConfig::target(64, 7);
    let prompt = [5, 9, 13, 2];
    let answer = greedy(&config, &prompt, 10);
    assert_eq!(answer.len(), 10);
    let mut model = MockDecoder::new(config.clone());
    let out = ssbd(&mut model, &prompt, &answer[..9], 0.0, 10);
    assert_eq!(out.tokens, answer);
    assert_eq!((out.accepted, out.drafted, out.target_forwards), (9, 9, 1));

    let junk = [63, 62, 61];
    let mut model = MockDecoder::new(config.clone());
    let out = ssbd(&mut model, &prompt, &junk, 1.0, 10);
    assert_eq!(&out.tokens[..3], &junk);
    assert_eq!(out.accepted, 3);
}

#[test]
fn an_assistant_model_continues_losslessly() {
    let config = MockConfig::target(48, 3);
    let prompt = [4, 8, 15, 16, 23];
    let expected = greedy(&config, &prompt, 20);
    let mut target = MockDecoder::new(config.clone());
    let mut assistant = MockDecoder::new(config.draft(0.3, 11));
    let out = decode_update(
        &mut target,
        Continuation::Assistant {
            model: &mut assistant as &mut dyn Decoder,
            gamma: 4,
        },
        &prompt,
        &expected[..5],
        &Decoding::Ssbd { beta: 0.0 },
        &[END],
        20,
    )
    .unwrap();
    assert_eq!(out.tokens, expected);
    assert!(out.draft_forwards > 0);
    assert!(out.target_forwards < 15, "{}", out.target_forwards);
}

/// After an insertion, the rest of the previous output drafts what follows it: fewer forwards
/// than one per token, the same output.
#[test]
fn the_previous_output_drafts_again_after_the_divergence() {
    let config = MockConfig::target(48, 9);
    let prompt = [3, 1, 4, 1, 5];
    let expected = greedy(&config, &prompt, 24);
    assert!(expected.len() >= 16, "{}", expected.len());
    // The previous output: the greedy one with two tokens inserted after the fourth.
    let mut previous = expected[..4].to_vec();
    previous.extend([47, 46]);
    previous.extend(&expected[4..]);
    let plain = ssbd(
        &mut MockDecoder::new(config.clone()),
        &prompt,
        &previous,
        0.0,
        24,
    );
    let lookup = lookup_update(
        &config,
        &prompt,
        &previous,
        &mut lookup_drafter(8, &previous).unwrap(),
    );
    assert_eq!(plain.tokens, expected);
    assert_eq!(lookup.tokens, expected);
    assert_eq!(lookup.accepted, 4);
    assert!(lookup.continuation_accepted >= 8, "{lookup:?}");
    assert!(
        lookup.target_forwards + 8 <= plain.target_forwards,
        "{} against {}",
        lookup.target_forwards,
        plain.target_forwards
    );
}

/// With nothing to copy, the lookup continuation drafts the target's own guess of the token
/// after the next one (Jacobi iteration), judges it, and the output stays greedy.
#[test]
fn with_nothing_to_copy_the_target_guesses_ahead() {
    let config = MockConfig::target(48, 9);
    let prompt = [3, 1, 4, 1, 5];
    let expected = greedy(&config, &prompt, 24);
    let previous = vec![47; 6];
    assert!(!expected.contains(&47));
    let mut drafter = lookup_drafter(8, &previous).unwrap();
    let prior = drafter.guess_acceptance();
    let out = lookup_update(&config, &prompt, &previous, &mut drafter);
    assert_eq!(out.tokens, expected);
    assert!(out.continuation_drafted > 0, "{out:?}");
    assert_ne!(drafter.guess_acceptance(), prior);
}

#[test]
fn bad_input_is_a_clear_error() {
    let mut model = MockDecoder::new(MockConfig::target(16, 1));
    let err = decode_update(
        &mut model,
        Continuation::Greedy,
        &[],
        &[],
        &Decoding::Autoregressive,
        &[END],
        4,
    );
    assert!(matches!(err, Err(Error::Input(_))));
    let err = decode_update(
        &mut model,
        Continuation::Greedy,
        &[1, 2],
        &[3],
        &Decoding::Ssbd { beta: 1.5 },
        &[END],
        4,
    );
    assert!(
        matches!(err, Err(Error::Core(spec_core::Error::InvalidConfig(_)))),
        "{err:?}"
    );
    let long: Vec<u32> = (0..model.max_len() as u32 + 5)
        .map(|t| 1 + t % 15)
        .collect();
    let err = decode_update(
        &mut model,
        Continuation::Greedy,
        &long,
        &[3],
        &Decoding::Ssbd { beta: 0.2 },
        &[END],
        4,
    );
    assert!(
        matches!(
            err,
            Err(Error::Core(spec_core::Error::ContextOverflow { .. }))
        ),
        "{err:?}"
    );
}
