//! Out-of-range rules, distributions and sizes given to the public entry points are typed
//! errors, not panics or verdicts of a rule that cannot hold.

use rand::SeedableRng;

use spec_core::acceptance::SpeculativeSampling;
use spec_core::mock::{MockConfig, MockDecoder};
use spec_core::{
    Acceptance, AcceptanceRule, Decoder, Error, ForwardCosts, Logits, TokenTree, Verification,
};

#[test]
fn speculative_sampling_refuses_tokens_and_rows_outside_one_vocabulary() {
    let rule = SpeculativeSampling { tolerance: 0.0 };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let row = || vec![0.5f32, 0.5];
    let err = rule
        .verify_distributions(&[5], &[row()], &[row(), row()], &mut rng)
        .unwrap_err();
    assert!(
        matches!(err, Error::TokenOutOfRange { token: 5, vocab: 2 }),
        "{err}"
    );
    let err = rule
        .verify_distributions(&[1], &[vec![1.0]], &[row(), row()], &mut rng)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    let wild = SpeculativeSampling {
        tolerance: f32::NAN,
    };
    assert!(wild
        .verify_distributions(&[1], &[row()], &[row(), row()], &mut rng)
        .is_err());
    assert!(rule
        .verify_distributions(&[1], &[row()], &[row(), row()], &mut rng)
        .is_ok());
}

#[test]
fn tree_verification_refuses_rules_out_of_range() {
    let mut model = MockDecoder::new(MockConfig::target(16, 3));
    let tree = TokenTree::linear(1, &[2, 3]);
    for rule in [
        AcceptanceRule::biased(2.0),
        AcceptanceRule::biased(f32::NAN),
        AcceptanceRule::threshold(-1.0),
        AcceptanceRule::top_k(0),
    ] {
        let err = Verification::Batched
            .verify(&mut model, &tree, &rule, &mut |_, _| {}, false)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{rule:?}: {err}");
        assert_eq!(model.cached_len(), 0, "{rule:?} left the cache untouched");
        assert!(rule.validate().is_err() && Acceptance::validate(&rule).is_err());
    }
    assert!(Verification::Batched
        .verify(
            &mut model,
            &tree,
            &AcceptanceRule::biased(0.5),
            &mut |_, _| {},
            false
        )
        .is_ok());
}

#[test]
fn an_empty_vocabulary_and_empty_measurements_are_errors() {
    let logits =
        candle_core::Tensor::zeros((2, 0), candle_core::DType::F32, &candle_core::Device::Cpu)
            .unwrap();
    assert!(matches!(
        Logits::from_tensor(&logits, 2, 0),
        Err(Error::LogitsShape { .. })
    ));
    let mut model = MockDecoder::new(MockConfig::target(16, 3));
    for (tokens, repeats) in [(0, 1), (4, 0)] {
        assert!(matches!(
            ForwardCosts::measure(&mut model, tokens, repeats),
            Err(Error::InvalidConfig(_))
        ));
    }
    assert_eq!(ForwardCosts::probe_context(0, 3).len(), 3);
}
