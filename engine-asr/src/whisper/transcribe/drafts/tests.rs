use spec_core::StepRecord;

use super::*;

/// A drafted window: `rounds` verifications of `accepted` tokens each, in `millis`.
fn window(rounds: usize, accepted: usize, millis: u64) -> DecodeStats {
    DecodeStats {
        steps: vec![
            StepRecord {
                drafted: accepted + 1,
                accepted
            };
            rounds
        ],
        draft_time: Duration::from_millis(millis / 2),
        target_time: Duration::from_millis(millis - millis / 2),
        ..DecodeStats::default()
    }
}

#[test]
fn drafting_stops_where_it_costs_more_per_token_than_a_greedy_step() {
    let mut economics = DraftEconomics::default();
    assert!(economics.pays(), "nothing measured: try drafting");
    economics.greedy_step = Some(0.0015);
    assert!(economics.pays(), "no drafted window seen yet");
    // 10 rounds of 4 tokens in 40 ms: 1 ms per token, cheaper than a 1.5 ms step.
    economics.observe(&window(10, 3, 40), Duration::ZERO, Duration::ZERO);
    assert!(economics.pays());
    // The draft's encoder counts: 40 more ms make it 2 ms per token.
    let mut with_encoder = DraftEconomics {
        greedy_step: Some(0.0015),
        ..DraftEconomics::default()
    };
    with_encoder.observe(
        &window(10, 3, 40),
        Duration::from_millis(40),
        Duration::ZERO,
    );
    assert!(!with_encoder.pays());
    // Slow windows outweigh an old fast one as they keep coming.
    for _ in 0..5 {
        economics.observe(&window(10, 1, 60), Duration::ZERO, Duration::ZERO);
    }
    assert!(!economics.pays());
}

#[test]
fn a_window_is_not_drafted_when_the_drafts_encoder_alone_outweighs_every_step_it_could_save() {
    let mut economics = DraftEconomics::default();
    let target_encoder = Duration::from_millis(200);
    assert!(
        !economics.could_pay(224, target_encoder, 0.1),
        "the first window is decoded greedily: it measures the step"
    );
    economics.observe_greedy(Duration::from_millis(40), 20);
    assert_eq!(economics.greedy_step, Some(0.002));
    // A 3-second window: at most 23 tokens, 46 ms of steps to save; a draft encoder of
    // 0.4 × 200 ms costs more, one of 0.1 × 200 ms less.
    assert!(!economics.could_pay(23, target_encoder, 0.4));
    assert!(economics.could_pay(23, target_encoder, 0.1));
    // A full window (224 tokens, 448 ms) could pay for the larger draft.
    assert!(economics.could_pay(224, target_encoder, 0.4));
    // Once drafted windows measured the encoders' real ratio (0.5), it replaces the estimate.
    economics.observe(
        &window(5, 3, 20),
        Duration::from_millis(100),
        Duration::from_millis(200),
    );
    assert_eq!(economics.encoder_ratio, Some(0.5));
    assert!(!economics.could_pay(23, target_encoder, 0.1));
    // The step measured once stays: a later greedy window does not replace it.
    economics.observe_greedy(Duration::from_millis(90), 10);
    assert_eq!(economics.greedy_step, Some(0.002));
}
