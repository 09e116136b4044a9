//! SSBD on the real Qwen pair from `../shared/models/fetch` (ignored by plain `cargo test`; CI
//! runs them in release mode after fetching the models).

use engine_llm::{LanguageModel, LoadOptions};
use engine_mt::{lag_k, parse_partials, Decoding, DisplayPolicy, LiveConfig, LiveTranslator};

const TARGET: &str = "qwen2.5-coder-1.5b-instruct";
const ASSISTANT: &str = "qwen2.5-coder-0.5b-instruct";

fn load(name: &str) -> LanguageModel {
    LanguageModel::open(name, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e} (run ../shared/models/fetch)"))
}

/// The captions of one sentence into German; `unbiased_final` as in [`LiveConfig`].
fn outputs(
    model: &mut LanguageModel,
    assistant: Option<&mut LanguageModel>,
    decoding: Decoding,
    display: DisplayPolicy,
    unbiased_final: bool,
    updates: &[engine_mt::Partial],
) -> Vec<engine_mt::Caption> {
    let config = LiveConfig {
        decoding,
        display,
        unbiased_final,
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
        parse_partials("0.5\twhat is\n1.0\twhat is one plus twenty\n1.5\twhat is 1 + 23\n")
            .unwrap()
            .remove(0),
    );
    let ar = outputs(
        &mut model,
        None,
        Decoding::Autoregressive,
        DisplayPolicy::full(),
        false,
        &updates,
    );
    let text = |c: &[engine_mt::Caption]| c.iter().map(|c| c.output.clone()).collect::<Vec<_>>();
    let ssbd = outputs(
        &mut model,
        None,
        Decoding::Ssbd { beta: 0.0 },
        DisplayPolicy::full(),
        false,
        &updates,
    );
    assert_eq!(text(&ssbd), text(&ar));
    let assisted = outputs(
        &mut model,
        Some(&mut assistant),
        Decoding::Ssbd { beta: 0.0 },
        DisplayPolicy::full(),
        false,
        &updates,
    );
    assert_eq!(text(&assisted), text(&ar));
    assert!(assisted.iter().any(|c| c.decode.draft_forwards > 0));

    let forwards =
        |c: &[engine_mt::Caption]| c.iter().map(|c| c.decode.target_forwards).sum::<usize>();
    // Even unbiased, verifying the previous translation saves forwards. How many depends on
    // the translations, which move with the kernels' arithmetic: 94 against 110 on the Q4_K/Q6_K
    // panels, 83 against 112 on the row kernels, 35 % on candle's; 74 against 82 now (the
    // default's lookup continuation included), where the translations of the long sentence's
    // partials share less.
    assert!(
        forwards(&ssbd) < forwards(&ar),
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
        DisplayPolicy::mask_k(3),
        false,
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

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn an_unbiased_final_update_commits_autoregressive_retranslation() {
    let mut model = load(TARGET);
    // Sentences of `data/sentences.tsv` on which `cargo xtask bench mt` saw biased finals
    // (plain β = 0.2) differ from AR's, so that the unbiased final update has work to do.
    let sentences = [
        "Could you please tell me how to get to the train station from here?",
        "The meeting has been moved to Thursday afternoon because the manager is travelling this week.",
        "Please remember to switch off the lights and lock the door when you leave the office.",
        "The new library in the city centre opens at nine in the morning and closes at eight in the evening.",
        "We should leave early tomorrow because the roads will be very busy during the holidays.",
    ];
    let mut biased_finals_differ = 0;
    for sentence in sentences {
        let updates = lag_k(sentence, 3).unwrap();
        let ar = outputs(
            &mut model,
            None,
            Decoding::Autoregressive,
            DisplayPolicy::full(),
            false,
            &updates,
        );
        let default = LiveConfig::new("German");
        assert!(default.unbiased_final);
        let unbiased = outputs(
            &mut model,
            None,
            default.decoding.clone(),
            default.display.clone(),
            true,
            &updates,
        );
        let biased = outputs(
            &mut model,
            None,
            default.decoding,
            default.display.clone(),
            false,
            &updates,
        );
        let (last_ar, last) = (ar.last().unwrap(), unbiased.last().unwrap());
        assert!(last.is_final);
        assert_eq!(last.output, last_ar.output, "{sentence}");
        assert_eq!(last.display, last.output);
        // The final update still verifies the previous output as its draft.
        assert!(last.decode.drafted > 0);
        // The partial captions are the biased ones.
        let text = |c: &[engine_mt::Caption]| {
            c.iter()
                .map(|c| (c.output.clone(), c.display.clone()))
                .collect::<Vec<_>>()
        };
        let partials = updates.len() - 1;
        assert_eq!(text(&unbiased[..partials]), text(&biased[..partials]));
        if biased.last().unwrap().output != last_ar.output {
            biased_finals_differ += 1;
        }
    }
    assert!(
        biased_finals_differ > 0,
        "biased final updates gave AR's output on all {} sentences",
        sentences.len()
    );
}
