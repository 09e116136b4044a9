//! SSBD on the real Qwen pair from `../shared/models/fetch` (ignored by plain `cargo test`; CI
//! runs them in release mode after fetching the models).

use engine_llm::{LanguageModel, LoadOptions};
use engine_mt::{lag_k, parse_partials, Decoding, LiveConfig, LiveTranslator, Masking};

const TARGET: &str = "qwen2.5-coder-1.5b-instruct";
const ASSISTANT: &str = "qwen2.5-coder-0.5b-instruct";

fn load(name: &str) -> LanguageModel {
    LanguageModel::open(name, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e} (run ../shared/models/fetch)"))
}

fn outputs(
    model: &mut LanguageModel,
    assistant: Option<&mut LanguageModel>,
    decoding: Decoding,
    masking: Masking,
    updates: &[engine_mt::SourceUpdate],
) -> Vec<engine_mt::Caption> {
    let config = LiveConfig {
        decoding,
        masking,
        ..LiveConfig::new("German")
    };
    let mut live = LiveTranslator::new(model, config).unwrap();
    if let Some(assistant) = assistant {
        live = live.with_assistant(assistant).unwrap();
    }
    live.sentence(updates).unwrap()
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn ssbd_at_beta_zero_is_autoregressive_retranslation_and_faster() {
    let mut model = load(TARGET);
    let mut assistant = load(ASSISTANT);
    let mut updates = lag_k(
        "The meeting has been moved to Thursday afternoon because the manager is travelling this week.",
        3,
    )
    .unwrap();
    // ASR-style revisions too.
    updates.extend(
        parse_partials("what is\nwhat is one plus twenty\nwhat is 1 + 23\n")
            .unwrap()
            .remove(0),
    );
    let ar = outputs(
        &mut model,
        None,
        Decoding::Autoregressive,
        Masking::None,
        &updates,
    );
    let text = |c: &[engine_mt::Caption]| c.iter().map(|c| c.output.clone()).collect::<Vec<_>>();
    let ssbd = outputs(
        &mut model,
        None,
        Decoding::Ssbd { beta: 0.0 },
        Masking::None,
        &updates,
    );
    assert_eq!(text(&ssbd), text(&ar));
    let assisted = outputs(
        &mut model,
        Some(&mut assistant),
        Decoding::Ssbd { beta: 0.0 },
        Masking::None,
        &updates,
    );
    assert_eq!(text(&assisted), text(&ar));
    assert!(assisted.iter().any(|c| c.decode.draft_forwards > 0));

    let forwards =
        |c: &[engine_mt::Caption]| c.iter().map(|c| c.decode.target_forwards).sum::<usize>();
    // Even unbiased, verifying the previous translation saves a third of the forwards or more.
    assert!(
        forwards(&ssbd) * 3 < forwards(&ar) * 2,
        "SSBD {} forwards, AR {}",
        forwards(&ssbd),
        forwards(&ar)
    );
    let last = ar.iter().find(|c| c.is_final).unwrap();
    assert!(last.output.contains("Donnerstag"), "{}", last.output);
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn display_masking_hides_the_unstable_tail_until_the_final_update() {
    let mut model = load(TARGET);
    let updates = lag_k(
        "I would like to book a table for four people at seven o'clock.",
        3,
    )
    .unwrap();
    let captions = outputs(
        &mut model,
        None,
        Decoding::Ssbd { beta: 0.2 },
        Masking::Display(3),
        &updates,
    );
    for caption in &captions {
        if caption.is_final {
            assert_eq!(caption.display, caption.output);
        } else {
            assert!(caption.output.starts_with(&caption.display));
            assert!(caption.display.len() < caption.output.len());
        }
    }
}
