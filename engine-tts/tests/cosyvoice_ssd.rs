//! Speech Speculative Decoding on CosyVoice 2's speech-token LM (the tiny reference fixture as
//! the target; a perturbed copy, or the target's own first layer, as the draft): at β = 0 the tokens follow the target's own
//! sampling distribution exactly (χ² tests on the first and second token), larger β accepts
//! more of the draft, and a draft with other speech tokens is refused. A draft trained on the
//! LM's own speech is tested with the training, in `spec-train`'s `tests/ssd_random.rs`.

use candle_core::{Device, Tensor};
use engine_tts::cosyvoice::lm::{SpeechLm, SsdConfig};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::sampling::repetition_aware::ras_distribution;

mod common;
use common::ssd::{fixture, model, PROMPT_SPEECH, PROMPT_TEXT, SPEECH_TOKENS, TEXT};

/// The target and a draft whose output layer is perturbed: it agrees often, not always.
fn target_and_draft() -> (SpeechLm, SpeechLm) {
    let (weights, backbone) = fixture();
    let mut perturbed = weights.clone();
    let w = &perturbed["llm_decoder.weight"];
    let noise = Tensor::randn(0f32, 0.6, w.dims(), &Device::Cpu).unwrap();
    perturbed.insert("llm_decoder.weight".into(), (w + noise).unwrap());
    (
        model(weights, backbone.clone(), SPEECH_TOKENS),
        model(perturbed, backbone, SPEECH_TOKENS),
    )
}

/// Pearson's χ² of `counts` against probabilities `expected` (cells with an expected count
/// below 5 pooled), and its degrees of freedom.
fn chi_square(counts: &[usize], expected: &[f32]) -> (f64, usize) {
    let n: usize = counts.iter().sum();
    let (mut statistic, mut cells) = (0.0, 0);
    let (mut pooled_observed, mut pooled_expected) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(expected) {
        let e = f64::from(p) * n as f64;
        if e < 5.0 {
            pooled_observed += c as f64;
            pooled_expected += e;
            continue;
        }
        statistic += (c as f64 - e).powi(2) / e;
        cells += 1;
    }
    if pooled_expected > 0.0 {
        statistic += (pooled_observed - pooled_expected).powi(2) / pooled_expected.max(1e-9);
        cells += 1;
    }
    (statistic, cells - 1)
}

/// The χ² quantile at 1 − 10⁻⁴ (Wilson–Hilferty with z = 3.719).
fn critical(df: usize) -> f64 {
    let k = df as f64;
    k * (1.0 - 2.0 / (9.0 * k) + 3.719 * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// The target's sampling distribution after the prompt and `history`.
fn target_distribution(target: &mut SpeechLm, history: &[u32]) -> Vec<f32> {
    let text: Vec<u32> = PROMPT_TEXT.iter().chain(&TEXT).copied().collect();
    let rows = target
        .log_probabilities(&text, &PROMPT_SPEECH, history)
        .unwrap();
    let mut scores: Vec<f32> = rows
        .get(rows.dim(0).unwrap() - 1)
        .unwrap()
        .to_vec1()
        .unwrap();
    // Before the minimum length (2 per text token) the end token is masked.
    scores[SPEECH_TOKENS] = f32::NEG_INFINITY;
    ras_distribution(&scores, history, &target.config().sampling).unwrap()
}

#[test]
#[ignore = "statistical: 4000 generations, release only (CI runs it with the real-model tests)"]
fn at_zero_tolerance_the_tokens_follow_the_targets_distribution() {
    let (mut target, mut draft) = target_and_draft();
    let runs = 4000;
    let mut first = vec![0usize; SPEECH_TOKENS + 3];
    let mut pairs: Vec<(u32, u32)> = Vec::with_capacity(runs);
    let mut accepted = 0;
    for seed in 0..runs as u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let (tokens, stats) = target
            .generate_speculative(
                &mut draft,
                &TEXT,
                &PROMPT_TEXT,
                &PROMPT_SPEECH,
                &SsdConfig {
                    gamma: 3,
                    tolerance: 0.0,
                    max_tokens: Some(2),
                },
                &mut rng,
                None,
            )
            .unwrap();
        assert_eq!(tokens.len(), 2, "the end token is masked before 6 tokens");
        first[tokens[0] as usize] += 1;
        pairs.push((tokens[0], tokens[1]));
        accepted += stats.accepted_tokens();
    }
    assert!(
        accepted > 0,
        "the draft never agreed: the test would not exercise acceptance"
    );
    let expected = target_distribution(&mut target, &[]);
    let (statistic, df) = chi_square(&first, &expected);
    assert!(
        statistic < critical(df),
        "first token: χ² = {statistic:.1} with {df} degrees of freedom"
    );
    // The second token after the most frequent first one.
    let common = (0..first.len()).max_by_key(|&t| first[t]).unwrap() as u32;
    let mut second = vec![0usize; SPEECH_TOKENS + 3];
    for &(a, b) in &pairs {
        if a == common {
            second[b as usize] += 1;
        }
    }
    let expected = target_distribution(&mut target, &[common]);
    let (statistic, df) = chi_square(&second, &expected);
    assert!(
        statistic < critical(df),
        "second token after {common}: χ² = {statistic:.1} with {df} degrees of freedom"
    );
}

#[test]
#[ignore = "statistical: 450 generations, release only (CI runs it with the real-model tests)"]
fn acceptance_rises_with_the_tolerance() {
    let (mut target, _) = target_and_draft();
    // SSD's construction: the draft is the target's own lower layer.
    let mut draft = target.draft_from_layers(&[0]).unwrap();
    let mut rates = Vec::new();
    for tolerance in [0.0, 0.2, 0.4] {
        let (mut drafted, mut accepted) = (0, 0);
        for seed in 0..150 {
            let mut rng = StdRng::seed_from_u64(seed);
            let (_, stats) = target
                .generate_speculative(
                    &mut draft,
                    &TEXT,
                    &PROMPT_TEXT,
                    &PROMPT_SPEECH,
                    &SsdConfig {
                        gamma: 3,
                        tolerance,
                        max_tokens: Some(12),
                    },
                    &mut rng,
                    None,
                )
                .unwrap();
            drafted += stats.drafted_tokens();
            accepted += stats.accepted_tokens();
        }
        rates.push(accepted as f64 / drafted as f64);
    }
    assert!(
        rates[0] < rates[1] && rates[1] < rates[2],
        "acceptance by β: {rates:?}"
    );
}

#[test]
fn a_draft_with_other_speech_tokens_and_bad_settings_are_refused() {
    let (weights, backbone) = fixture();
    let mut target = model(weights.clone(), backbone.clone(), SPEECH_TOKENS);
    let mut smaller = weights;
    for name in ["speech_embedding.weight", "llm_decoder.weight"] {
        let t = smaller[name].narrow(0, 0, 41).unwrap();
        smaller.insert(name.into(), t);
    }
    let b = smaller["llm_decoder.bias"].narrow(0, 0, 41).unwrap();
    smaller.insert("llm_decoder.bias".into(), b);
    let mut other = model(smaller, backbone, 38);
    let mut rng = StdRng::seed_from_u64(0);
    let run = |t: &mut SpeechLm, d: &mut SpeechLm, gamma, beta, rng: &mut StdRng| {
        let config = SsdConfig {
            gamma,
            tolerance: beta,
            max_tokens: None,
        };
        t.generate_speculative(d, &TEXT, &[], &[], &config, rng, None)
    };
    let err = run(&mut target, &mut other, 3, 0.0, &mut rng).unwrap_err();
    assert!(err.to_string().contains("speech tokens"), "{err}");
    let (mut t, mut d) = target_and_draft();
    assert!(run(&mut t, &mut d, 0, 0.0, &mut rng).is_err());
    assert!(run(&mut t, &mut d, 3, 1.5, &mut rng).is_err());
}
