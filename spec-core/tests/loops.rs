//! The generic loops against the mock decoder: speculative decoding with greedy acceptance must
//! reproduce greedy autoregressive decoding token for token, whatever the draft, draft length,
//! tree shape, stop condition or cache state.

use std::time::Duration;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::decoder::common_prefix_len;
use spec_core::mock::{MockConfig, MockDecoder};
use spec_core::sampling::{in_top_k, softmax};
use spec_core::{
    generate, speculate, speculative_generate, AcceptanceRule, Decoder, DraftLength,
    DraftModelDrafter, DraftTokens, Error, FinishReason, Generation, JacobiDrafter, LookupConfig,
    LookupDrafter, PreviousOutput, SamplingConfig, SparseTreeConfig, SparseTreeDrafter,
    SpecAsrConfig, SpecAsrDrafter, Speculation, SpeculativeConfig, StopConditions, TreeDrafter,
};

/// Greedy decoding by Jacobi iteration: [`speculate`] with a [`JacobiDrafter`].
fn jacobi_generate(
    model: &mut MockDecoder,
    context: &[u32],
    initial_guess: &[u32],
    window: usize,
    stop: &StopConditions,
    on_token: &mut dyn FnMut(u32),
) -> spec_core::Result<Generation> {
    let mut drafter = JacobiDrafter::new(initial_guess, window)?;
    let greedy = AcceptanceRule::greedy();
    speculate(
        model,
        &mut drafter,
        context,
        Speculation::new(&greedy),
        stop,
        on_token,
    )
}

/// Greedy speculation with `drafter` on a fresh target.
fn greedy_with(
    target: &MockConfig,
    drafter: &mut dyn TreeDrafter,
    context: &[u32],
    stop: &StopConditions,
) -> Generation {
    let mut model = MockDecoder::new(target.clone());
    let greedy = AcceptanceRule::greedy();
    let speculation = Speculation::new(&greedy);
    speculate(&mut model, drafter, context, speculation, stop, &mut |_| {}).unwrap()
}

#[test]
fn the_previous_answer_is_verified_in_the_prefill() {
    let (target, _) = models(5, 32, 0.0);
    let prompt = [3, 1, 4, 1];
    let stop = StopConditions::new(20);
    let reference = greedy_reference(&target, &prompt, &stop);
    let mut drafter = PreviousOutput::new(reference.tokens.clone());
    let spec = greedy_with(&target, &mut drafter, &prompt, &stop);
    assert_eq!(spec.tokens, reference.tokens);
    // The prompt and the whole answer in one forward.
    assert_eq!(spec.stats.target_forwards, 1);
    assert_eq!(spec.stats.prompt_tokens, prompt.len());
    // Capped at 8 rows a forward: the prompt and 4 tokens, then the root and 7 at a time.
    let mut capped = PreviousOutput::new(reference.tokens.clone())
        .with_max_rows(8)
        .unwrap();
    let spec = greedy_with(&target, &mut capped, &prompt, &stop);
    assert_eq!(spec.tokens, reference.tokens);
    assert_eq!(spec.stats.target_forwards, 3);
    assert!(PreviousOutput::new(vec![1]).with_max_rows(1).is_err());
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(0)
}

fn greedy_reference(target: &MockConfig, context: &[u32], stop: &StopConditions) -> Generation {
    let mut model = MockDecoder::new(target.clone());
    let gen = generate(
        &mut model,
        context,
        &SamplingConfig::greedy(),
        stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap();
    assert_cache_holds_output(&model, context, &gen.tokens);
    gen
}

/// After a loop the target's cache holds the context and all output tokens but the last.
fn assert_cache_holds_output(model: &MockDecoder, context: &[u32], output: &[u32]) {
    let mut expected = context.to_vec();
    expected.extend_from_slice(&output[..output.len().saturating_sub(1)]);
    assert_eq!(model.cached_tokens(), expected);
}

fn speculative(
    target: &MockConfig,
    draft: &MockConfig,
    context: &[u32],
    config: &SpeculativeConfig,
    stop: &StopConditions,
) -> Generation {
    let mut t = MockDecoder::new(target.clone());
    let mut d = MockDecoder::new(draft.clone());
    let mut streamed = Vec::new();
    let gen = speculative_generate(
        &mut t,
        &mut d,
        context,
        config,
        stop,
        &mut rng(),
        &mut |tok| streamed.push(tok),
    )
    .unwrap();
    assert_eq!(
        streamed, gen.tokens,
        "every token is streamed once, in order"
    );
    assert_cache_holds_output(&t, context, &gen.tokens);
    let full: Vec<u32> = context.iter().chain(&gen.tokens).copied().collect();
    assert!(
        full.starts_with(d.cached_tokens()),
        "the draft cache holds only committed tokens"
    );
    gen
}

fn models(seed: u64, vocab: usize, noise: f32) -> (MockConfig, MockConfig) {
    let target = MockConfig::target(vocab, seed);
    let draft = target.draft(noise, seed ^ 0xd1);
    (target, draft)
}

fn stop_for(max_new: usize, eos: Option<u32>) -> StopConditions {
    StopConditions::new(max_new).with_eos(eos)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn fixed_gamma_greedy_is_lossless(
        seed in 0u64..1_000_000,
        vocab in 3usize..48,
        noise in 0.0f32..4.0,
        prompt in prop::collection::vec(0u32..1000, 1..10),
        max_new in 1usize..48,
        eos in prop::option::of(0u32..1000),
    ) {
        let (target, draft) = models(seed, vocab, noise);
        let prompt: Vec<u32> = prompt.iter().map(|t| t % vocab as u32).collect();
        let stop = stop_for(max_new, eos.map(|e| e % vocab as u32));
        let reference = greedy_reference(&target, &prompt, &stop);
        for gamma in 1..=8 {
            let config = SpeculativeConfig { draft_length: DraftLength::Fixed(gamma), ..Default::default() };
            let spec = speculative(&target, &draft, &prompt, &config, &stop);
            prop_assert_eq!(&spec.tokens, &reference.tokens, "γ = {}", gamma);
            prop_assert_eq!(spec.finish, reference.finish);
            prop_assert!(spec.stats.target_forwards <= reference.stats.target_forwards);
        }
    }

    #[test]
    fn adaptive_gamma_greedy_is_lossless(
        seed in 0u64..1_000_000,
        vocab in 3usize..48,
        noise in 0.0f32..4.0,
        prompt in prop::collection::vec(0u32..1000, 1..10),
        max_new in 1usize..48,
        min_confidence in 0.0f32..1.0,
        max in 1usize..10,
    ) {
        let (target, draft) = models(seed, vocab, noise);
        let prompt: Vec<u32> = prompt.iter().map(|t| t % vocab as u32).collect();
        let stop = stop_for(max_new, None);
        let reference = greedy_reference(&target, &prompt, &stop);
        let config = SpeculativeConfig {
            draft_length: DraftLength::Adaptive { min_confidence, max },
            ..Default::default()
        };
        let spec = speculative(&target, &draft, &prompt, &config, &stop);
        prop_assert_eq!(&spec.tokens, &reference.tokens);
        prop_assert!(spec.stats.steps.iter().all(|s| s.drafted <= max));
    }

    #[test]
    fn tree_greedy_is_lossless(
        seed in 0u64..1_000_000,
        vocab in 3usize..48,
        noise in 0.0f32..4.0,
        prompt in prop::collection::vec(0u32..1000, 1..10),
        max_new in 1usize..48,
        depth in 1usize..9,
        branch_below in 0.0f32..1.0,
        branch_width in 1usize..4,
        eos in prop::option::of(0u32..1000),
    ) {
        let (target, draft) = models(seed, vocab, noise);
        let prompt: Vec<u32> = prompt.iter().map(|t| t % vocab as u32).collect();
        let stop = stop_for(max_new, eos.map(|e| e % vocab as u32));
        let reference = greedy_reference(&target, &prompt, &stop);
        let config = SparseTreeConfig { depth, branch_below, branch_width };
        let mut drafter = SparseTreeDrafter::new(MockDecoder::new(draft), config).unwrap();
        let mut t = MockDecoder::new(target);
        let tree = speculate(&mut t, &mut drafter, &prompt, Speculation::new(&AcceptanceRule::greedy()), &stop, &mut |_| {}).unwrap();
        prop_assert_eq!(&tree.tokens, &reference.tokens);
        prop_assert_eq!(tree.finish, reference.finish);
        assert_cache_holds_output(&t, &prompt, &tree.tokens);
    }

    #[test]
    fn lookup_greedy_is_lossless(
        seed in 0u64..1_000_000,
        vocab in 3usize..48,
        noise in 0.0f32..4.0,
        prompt in prop::collection::vec(0u32..1000, 1..10),
        max_new in 1usize..48,
        max_draft in 1usize..9,
        corrupt_every in 2usize..7,
        eos in prop::option::of(0u32..1000),
    ) {
        let (target, _) = models(seed, vocab, noise);
        let prompt: Vec<u32> = prompt.iter().map(|t| t % vocab as u32).collect();
        let stop = stop_for(max_new, eos.map(|e| e % vocab as u32));
        let reference = greedy_reference(&target, &prompt, &stop);
        // A reference close to the answer (a guess for a similar question): every few tokens
        // one is wrong.
        let near: Vec<u32> = reference.tokens.iter().enumerate()
            .map(|(i, &t)| if i % corrupt_every == 1 { (t + 1) % vocab as u32 } else { t })
            .collect();
        let config = LookupConfig { max_draft, ..LookupConfig::default() };
        let mut drafter = LookupDrafter::new(config).unwrap();
        drafter.add_reference(prompt.iter().chain(&near).copied().collect());
        let mut t = MockDecoder::new(target);
        let spec = speculate(&mut t, &mut drafter, &prompt, Speculation::new(&AcceptanceRule::greedy()), &stop, &mut |_| {}).unwrap();
        prop_assert_eq!(&spec.tokens, &reference.tokens);
        prop_assert_eq!(spec.finish, reference.finish);
        prop_assert!(spec.stats.target_forwards <= reference.stats.target_forwards);
        let (drafted, accepted) = drafter.counts();
        prop_assert!(accepted <= drafted);
        assert_cache_holds_output(&t, &prompt, &spec.tokens);
    }

    #[test]
    fn specasr_greedy_is_lossless(
        seed in 0u64..1_000_000,
        vocab in 3usize..48,
        noise in 0.0f32..4.0,
        prompt in prop::collection::vec(0u32..1000, 1..10),
        max_new in 1usize..48,
        threshold in 0.0f32..1.0,
        max_len in 1usize..25,
        branches in 0usize..5,
        adaptive in any::<bool>(),
        recycle in any::<bool>(),
        eos in prop::option::of(0u32..1000),
    ) {
        let (target, draft) = models(seed, vocab, noise);
        let prompt: Vec<u32> = prompt.iter().map(|t| t % vocab as u32).collect();
        let eos = eos.map(|e| e % vocab as u32);
        let stop = stop_for(max_new, eos);
        let reference = greedy_reference(&target, &prompt, &stop);
        let config = SpecAsrConfig { threshold, max_len, adaptive, recycle, branches, cost_aware: false };
        let mut drafter = SpecAsrDrafter::new(MockDecoder::new(draft), config).unwrap();
        if let Some(eos) = eos {
            drafter = drafter.with_end_token(eos);
        }
        let mut t = MockDecoder::new(target);
        let spec = speculate(&mut t, &mut drafter, &prompt, Speculation::new(&AcceptanceRule::greedy()), &stop, &mut |_| {}).unwrap();
        prop_assert_eq!(&spec.tokens, &reference.tokens);
        prop_assert_eq!(spec.finish, reference.finish);
        prop_assert!(spec.stats.target_forwards <= reference.stats.target_forwards);
        assert_cache_holds_output(&t, &prompt, &spec.tokens);
    }

    /// A previous output verified from the prefill on reproduces greedy decoding whatever it
    /// holds (the answer, a part of it, a changed one, noise), with any cap on the rows of a
    /// forward and any cache left before.
    #[test]
    fn previous_output_decoding_is_lossless(
        seed in 0u64..1_000_000,
        vocab in 3usize..48,
        prompt in prop::collection::vec(0u32..1000, 1..10),
        kept in 0usize..20,
        noise in prop::collection::vec(0u32..1000, 0..8),
        max_rows in prop::option::of(2usize..12),
        max_new in 1usize..40,
        eos in prop::option::of(0u32..1000),
        stale in prop::collection::vec(0u32..1000, 0..6),
    ) {
        let (target, _) = models(seed, vocab, 0.0);
        let in_vocab = |v: &[u32]| v.iter().map(|t| t % vocab as u32).collect::<Vec<u32>>();
        let (prompt, noise, stale) = (in_vocab(&prompt), in_vocab(&noise), in_vocab(&stale));
        let stop = stop_for(max_new, eos.map(|e| e % vocab as u32));
        let reference = greedy_reference(&target, &prompt, &stop);
        let mut previous: Vec<u32> = reference.tokens.iter().copied().take(kept).collect();
        previous.extend(&noise);
        let mut drafter = PreviousOutput::new(previous.clone());
        if let Some(rows) = max_rows {
            drafter = drafter.with_max_rows(rows).unwrap();
        }
        let mut model = MockDecoder::new(target);
        if !stale.is_empty() {
            model.forward(&spec_core::Forward::tokens(&stale, &(0..stale.len()).collect::<Vec<_>>())).unwrap();
        }
        let spec = speculate(&mut model, &mut drafter, &prompt, Speculation::new(&AcceptanceRule::greedy()), &stop, &mut |_| {}).unwrap();
        prop_assert_eq!(&spec.tokens, &reference.tokens);
        prop_assert_eq!(spec.finish, reference.finish);
        prop_assert!(spec.stats.target_forwards <= reference.stats.target_forwards);
        prop_assert_eq!(drafter.kept(&spec.tokens), common_prefix_len(&previous, &reference.tokens));
        assert_cache_holds_output(&model, &prompt, &spec.tokens);
    }

    #[test]
    fn jacobi_decoding_is_lossless(
        seed in 0u64..1_000_000,
        vocab in 3usize..48,
        prompt in prop::collection::vec(0u32..1000, 1..10),
        guess in prop::collection::vec(0u32..1000, 0..12),
        window in 1usize..10,
        max_new in 1usize..48,
        eos in prop::option::of(0u32..1000),
        stale in prop::collection::vec(0u32..1000, 0..6),
    ) {
        let (target, _) = models(seed, vocab, 0.0);
        let in_vocab = |v: &[u32]| v.iter().map(|t| t % vocab as u32).collect::<Vec<u32>>();
        let (prompt, guess, stale) = (in_vocab(&prompt), in_vocab(&guess), in_vocab(&stale));
        let stop = stop_for(max_new, eos.map(|e| e % vocab as u32));
        let reference = greedy_reference(&target, &prompt, &stop);
        let mut model = MockDecoder::new(target);
        // A cache left by another context must not change the result.
        if !stale.is_empty() {
            model.forward(&spec_core::Forward::tokens(&stale, &(0..stale.len()).collect::<Vec<_>>())).unwrap();
        }
        let mut streamed = Vec::new();
        let jacobi = jacobi_generate(&mut model, &prompt, &guess, window, &stop, &mut |t| streamed.push(t)).unwrap();
        prop_assert_eq!(&jacobi.tokens, &reference.tokens);
        prop_assert_eq!(&streamed, &reference.tokens);
        prop_assert_eq!(jacobi.finish, reference.finish);
        prop_assert!(jacobi.stats.target_forwards <= reference.stats.target_forwards);
        assert_cache_holds_output(&model, &prompt, &jacobi.tokens);
    }

    #[test]
    fn top_k_acceptance_keeps_every_token_in_the_targets_top_k(
        seed in 0u64..1_000_000,
        vocab in 4usize..32,
        prompt in prop::collection::vec(0u32..1000, 1..6),
        k in 1usize..4,
    ) {
        let (target, draft) = models(seed, vocab, 3.0);
        let prompt: Vec<u32> = prompt.iter().map(|t| t % vocab as u32).collect();
        let config = SpeculativeConfig { rule: AcceptanceRule::top_k(k), ..Default::default() };
        let spec = speculative(&target, &draft, &prompt, &config, &stop_for(24, None));
        let oracle = MockDecoder::new(target);
        let mut context = prompt.clone();
        for &token in &spec.tokens {
            let logits = oracle.logits_for(&context, context.len() - 1);
            prop_assert!(in_top_k(&logits, token, k));
            context.push(token);
        }
    }
}

#[test]
fn a_perfect_draft_is_always_accepted() {
    let (target, _) = models(11, 32, 0.0);
    let stop = StopConditions::new(40);
    let config = SpeculativeConfig {
        draft_length: DraftLength::Fixed(4),
        ..Default::default()
    };
    let spec = speculative(&target, &target, &[1, 2, 3], &config, &stop);
    assert_eq!(spec.stats.acceptance_rate(), 1.0);
    // 1 prefill + 39 tokens at 5 per pass.
    assert_eq!(spec.stats.target_forwards, 1 + 8);
    assert!((spec.stats.tokens_per_target_pass() - 40.0 / 9.0).abs() < 1e-9);
    assert_eq!(spec.stats.runs, 1);
    assert!(spec.stats.first_token_time > Duration::ZERO);
    assert!(spec.stats.first_token_time < spec.stats.total_time);
}

#[test]
fn repetition_penalty_is_applied_identically() {
    let (target, draft) = models(5, 12, 1.0);
    let sampling = SamplingConfig {
        repetition_penalty: 1.8,
        repeat_last_n: 8,
        ..SamplingConfig::greedy()
    };
    let stop = StopConditions::new(40);
    let mut model = MockDecoder::new(target.clone());
    let reference = generate(
        &mut model,
        &[1, 2],
        &sampling,
        &stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap();
    let plain = greedy_reference(&target, &[1, 2], &stop);
    assert_ne!(
        reference.tokens, plain.tokens,
        "the penalty changes this output"
    );
    let config = SpeculativeConfig {
        sampling,
        draft_length: DraftLength::Fixed(3),
        ..Default::default()
    };
    assert_eq!(
        speculative(&target, &draft, &[1, 2], &config, &stop).tokens,
        reference.tokens
    );
}

#[test]
fn stop_predicate_ends_mid_step_and_rolls_the_cache_back() {
    let (target, draft) = models(21, 16, 0.0);
    let reference = greedy_reference(&target, &[4], &StopConditions::new(30));
    let marker = reference.tokens[6];
    let first = reference.tokens.iter().position(|&t| t == marker).unwrap();
    let stop = StopConditions::new(30).with_predicate(move |out| out.last() == Some(&marker));
    let config = SpeculativeConfig {
        draft_length: DraftLength::Fixed(8),
        ..Default::default()
    };
    let spec = speculative(&target, &draft, &[4], &config, &stop);
    assert_eq!(spec.finish, FinishReason::Stop);
    assert_eq!(spec.tokens, reference.tokens[..=first]);
}

#[test]
fn continuing_from_a_kept_cache_equals_a_fresh_run() {
    let (target, draft) = models(8, 24, 0.8);
    let stop = StopConditions::new(12);
    let config = SpeculativeConfig::default();
    let mut t = MockDecoder::new(target.clone());
    let mut d = MockDecoder::new(draft.clone());
    let turn1 = speculative_generate(
        &mut t,
        &mut d,
        &[1, 2, 3],
        &config,
        &stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap();
    let mut context: Vec<u32> = vec![1, 2, 3];
    context.extend(&turn1.tokens);
    context.extend([5, 6]);
    let forwards_before = t.forward_count();
    let turn2 = speculative_generate(
        &mut t,
        &mut d,
        &context,
        &config,
        &stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        turn2.stats.prompt_tokens, 3,
        "only the uncached tail is prefilled"
    );
    assert!(t.forward_count() > forwards_before);
    assert_eq!(
        turn2.tokens,
        greedy_reference(&target, &context, &stop).tokens
    );
}

#[test]
fn a_full_context_ends_generation_the_same_way() {
    let target = MockConfig {
        max_len: 20,
        ..MockConfig::target(16, 2)
    };
    let draft = target.draft(1.0, 3);
    let prompt: Vec<u32> = (0..10).collect();
    let stop = StopConditions::new(100);
    let reference = greedy_reference(&target, &prompt, &stop);
    assert_eq!(reference.finish, FinishReason::ContextFull);
    assert_eq!(reference.tokens.len(), 11);
    for gamma in [1, 3, 8] {
        let config = SpeculativeConfig {
            draft_length: DraftLength::Fixed(gamma),
            ..Default::default()
        };
        let spec = speculative(&target, &draft, &prompt, &config, &stop);
        assert_eq!(
            (spec.tokens, spec.finish),
            (reference.tokens.clone(), reference.finish)
        );
    }
}

#[test]
fn bad_inputs_are_clear_errors() {
    let (target, _) = models(1, 16, 0.0);
    let mut t = MockDecoder::new(target.clone());
    let mut other_vocab = MockDecoder::new(MockConfig::target(17, 1));
    let config = SpeculativeConfig::default();
    let stop = StopConditions::new(4);
    let err = speculative_generate(
        &mut t,
        &mut other_vocab,
        &[1],
        &config,
        &stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::VocabMismatch {
                draft: 17,
                target: 16
            }
        ),
        "{err}"
    );
    let mut d = MockDecoder::new(target.clone());
    let err = speculative_generate(&mut t, &mut d, &[], &config, &stop, &mut rng(), &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, Error::EmptyInput(_)));
    let long = vec![1u32; 5000];
    let err = generate(
        &mut t,
        &long,
        &SamplingConfig::greedy(),
        &stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(
        err,
        Error::ContextOverflow {
            requested: 5000,
            max: 4096
        }
    ));
    let bad = SpeculativeConfig {
        draft_length: DraftLength::Fixed(0),
        ..Default::default()
    };
    assert!(matches!(
        speculative_generate(&mut t, &mut d, &[1], &bad, &stop, &mut rng(), &mut |_| {}),
        Err(Error::InvalidConfig(_))
    ));
    let mut drafter = SparseTreeDrafter::new(d, SparseTreeConfig::default()).unwrap();
    let sampled = AcceptanceRule::speculative_sampling(0.0);
    assert!(matches!(
        speculate(
            &mut t,
            &mut drafter,
            &[1],
            Speculation::new(&sampled),
            &stop,
            &mut |_| {}
        ),
        Err(Error::Unsupported(_))
    ));
    let zero = generate(
        &mut t,
        &[1],
        &SamplingConfig::greedy(),
        &StopConditions::new(0),
        &mut rng(),
        &mut |_| {},
    )
    .unwrap();
    assert!(zero.tokens.is_empty());
    assert_eq!(zero.finish, FinishReason::MaxTokens);
}

/// Exact probability of a 3-token continuation under the target sampled at temperature 1.
fn sequence_probability(oracle: &MockDecoder, prompt: &[u32], seq: &[u32]) -> f64 {
    let mut context = prompt.to_vec();
    let mut p = 1.0;
    for &t in seq {
        p *= softmax(&oracle.logits_for(&context, context.len() - 1))[t as usize] as f64;
        context.push(t);
    }
    p
}

#[test]
fn speculative_sampling_loop_samples_the_targets_distribution() {
    // Joint distribution of the first three tokens over a 3-token vocabulary: 27 outcomes,
    // with the first chain drafted after the prefill (`speculative_generate`) and verified by
    // the prefill itself.
    let target = MockConfig {
        sharpness: 2.0,
        ..MockConfig::target(3, 4)
    };
    let draft = target.draft(2.5, 99);
    let prompt = [0u32, 1];
    let oracle = MockDecoder::new(target.clone());
    let config = SpeculativeConfig {
        draft_length: DraftLength::Fixed(3),
        rule: AcceptanceRule::speculative_sampling(0.0),
        sampling: SamplingConfig::with_temperature(1.0),
    };
    let stop = StopConditions::new(3);
    let trials = 30_000;
    for with_prefill in [false, true] {
        let mut counts = [0usize; 27];
        let mut r = StdRng::seed_from_u64(42);
        let (mut t, mut d) = (
            MockDecoder::new(target.clone()),
            MockDecoder::new(draft.clone()),
        );
        let (mut accepted, mut forwards) = (0, 0);
        for _ in 0..trials {
            t.reset();
            d.reset();
            let g = match with_prefill {
                false => speculative_generate(
                    &mut t,
                    &mut d,
                    &prompt,
                    &config,
                    &stop,
                    &mut r,
                    &mut |_| {},
                ),
                true => {
                    let tokens = DraftTokens::Sampled(Box::new(config.sampling.clone()));
                    let mut drafter = DraftModelDrafter::new(&mut d, DraftLength::Fixed(3), tokens)
                        .unwrap()
                        .drafting_with_prefill();
                    let speculation = Speculation {
                        sampling: Some(&config.sampling),
                        rng: Some(&mut r),
                        ..Speculation::new(&config.rule)
                    };
                    speculate(
                        &mut t,
                        &mut drafter,
                        &prompt,
                        speculation,
                        &stop,
                        &mut |_| {},
                    )
                }
            }
            .unwrap();
            accepted += g.stats.accepted_tokens();
            forwards += g.stats.target_forwards;
            counts[(g.tokens[0] * 9 + g.tokens[1] * 3 + g.tokens[2]) as usize] += 1;
        }
        assert!(
            accepted > 0 && accepted < 2 * trials,
            "the draft is neither always right nor always wrong"
        );
        if with_prefill {
            // The prefill verifies a whole chain: never more than two target forwards.
            assert!(forwards <= 2 * trials, "{forwards} target forwards");
        }
        let mut chi2 = 0.0;
        for (i, &c) in counts.iter().enumerate() {
            let seq = [i as u32 / 9, (i as u32 / 3) % 3, i as u32 % 3];
            let expected = sequence_probability(&oracle, &prompt, &seq) * trials as f64;
            chi2 += (c as f64 - expected).powi(2) / expected;
        }
        // 26 degrees of freedom: the 99.9 % quantile of χ² is 54.05.
        assert!(
            chi2 < 54.05,
            "with the prefill: {with_prefill}: χ² = {chi2}, counts {counts:?}"
        );
    }
}

#[test]
fn a_cache_holding_another_conversation_is_not_reused() {
    let (target, draft) = models(13, 24, 0.8);
    let stop = StopConditions::new(10);
    let mut t = MockDecoder::new(target.clone());
    let mut d = MockDecoder::new(draft);
    let config = SpeculativeConfig::default();
    speculative_generate(
        &mut t,
        &mut d,
        &[1, 2, 3, 4],
        &config,
        &stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap();
    let other = [9u32, 8, 7];
    let again = speculative_generate(
        &mut t,
        &mut d,
        &other,
        &config,
        &stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        again.stats.prompt_tokens, 3,
        "nothing of the first conversation is kept"
    );
    assert_eq!(
        again.tokens,
        greedy_reference(&target, &other, &stop).tokens
    );
    let shared = [1u32, 2, 5];
    let mut model = MockDecoder::new(target.clone());
    generate(
        &mut model,
        &[1, 2, 3, 4],
        &SamplingConfig::greedy(),
        &stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap();
    let reused = generate(
        &mut model,
        &shared,
        &SamplingConfig::greedy(),
        &stop,
        &mut rng(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        reused.stats.prompt_tokens, 1,
        "the common prefix [1, 2] is kept"
    );
    assert_eq!(
        reused.tokens,
        greedy_reference(&target, &shared, &stop).tokens
    );
}

#[test]
fn cost_aware_drafting_is_lossless_and_stops_drafting_when_it_does_not_pay() {
    use spec_core::{CostAwarePolicy, ForwardCosts};
    let (target, draft) = models(17, 32, 1.0);
    let stop = StopConditions::new(64);
    let reference = greedy_reference(&target, &[3, 1, 4], &stop);
    let cheap = CostAwarePolicy::new(
        ForwardCosts::from_points(&[(1, 0.030), (16, 0.040)]).unwrap(),
        ForwardCosts::from_points(&[(1, 0.002), (2, 0.002)]).unwrap(),
        8,
    );
    let config = SpeculativeConfig {
        draft_length: DraftLength::CostAware(cheap),
        ..Default::default()
    };
    let spec = speculative(&target, &draft, &[3, 1, 4], &config, &stop);
    assert_eq!(spec.tokens, reference.tokens);
    assert!(spec.stats.mean_draft_length() > 2.0, "{}", spec.stats);
    let costly = CostAwarePolicy::new(
        ForwardCosts::from_points(&[(1, 0.029), (2, 0.048), (4, 0.072), (8, 0.146)]).unwrap(),
        ForwardCosts::from_points(&[(1, 0.019), (2, 0.030), (8, 0.056)]).unwrap(),
        8,
    );
    let config = SpeculativeConfig {
        draft_length: DraftLength::CostAware(costly),
        ..Default::default()
    };
    let spec = speculative(&target, &draft, &[3, 1, 4], &config, &stop);
    assert_eq!(spec.tokens, reference.tokens);
    assert!(
        spec.stats.drafted_tokens() <= 4,
        "only probes: {}",
        spec.stats
    );
}

#[test]
fn jacobi_seeded_with_the_answer_needs_one_pass_per_window() {
    let (target, _) = models(11, 32, 0.0);
    let prompt = [3, 1, 4];
    let stop = StopConditions::new(17);
    let reference = greedy_reference(&target, &prompt, &stop);
    let mut model = MockDecoder::new(target);
    let gen = jacobi_generate(
        &mut model,
        &prompt,
        &reference.tokens[1..],
        8,
        &stop,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(gen.tokens, reference.tokens);
    // The prefill, then 16 tokens in two passes: 8 accepted + 1, then 6 accepted + 1.
    assert_eq!(gen.stats.target_forwards, 3);
    assert!(matches!(
        jacobi_generate(&mut model, &prompt, &[], 0, &stop, &mut |_| {}),
        Err(Error::InvalidConfig(_))
    ));
}
