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
    economics.observe(&window(10, 3, 40), Duration::ZERO);
    assert!(economics.pays());
    // The draft's encoder counts: 40 more ms make it 2 ms per token.
    let mut with_encoder = DraftEconomics {
        greedy_step: Some(0.0015),
        ..DraftEconomics::default()
    };
    with_encoder.observe(&window(10, 3, 40), Duration::from_millis(40));
    assert!(!with_encoder.pays());
    // Slow windows outweigh an old fast one as they keep coming.
    for _ in 0..5 {
        economics.observe(&window(10, 1, 60), Duration::ZERO);
    }
    assert!(!economics.pays());
}
