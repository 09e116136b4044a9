//! Training on the real weights of `../shared/models/fetch` (found in `$SPECVOICE_MODELS`,
//! default `~/.cache/specvoice/models`): brief trainings of what the speculative methods load,
//! checked to fit the model and to decode losslessly. Ignored by plain `cargo test`; CI runs
//! them with `cargo test --release -- --ignored` after fetching the models.

#[path = "../../engine-llm/tests/common/mod.rs"]
#[allow(dead_code)] // each test binary uses part of the shared helpers
mod common;

use common::real::{load, SMOLLM};
use engine_llm::{GenerateOptions, Message};
use spec_core::Decoder;

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn a_head_trained_briefly_on_the_real_model_decodes_losslessly_through_the_chat_api() {
    use engine_llm::Speculation;
    use spec_core::{HeadsDrafter, HeadsTree, HiddenStates};
    use spec_nn::heads::{weights_fingerprint, HeadKind};
    use spec_train::heads::{train, SelfDistill, TrainConfig};

    let mut lm = load(SMOLLM);
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../engine-llm/data/heads_general_prompts.txt"),
    )
    .unwrap();
    // A quick variant of `cargo xtask train-heads` (the full one runs outside CI): one chained
    // head on the model's greedy answers to 24 prompts, 8 in lockstep.
    let prompts: Vec<&str> = text.lines().take(24).collect();
    let mut batches = Vec::new();
    let data = lm
        .self_distilled(&prompts, 48, 8, &mut |answered, _| batches.push(answered))
        .unwrap();
    assert_eq!(batches, [8, 16, 24]);
    assert!(data.positions() > 24 * 8, "{} positions", data.positions());
    let mut config = TrainConfig::new(HeadKind::Chained, 1);
    config.epochs = 3;
    let vocab: Vec<u32> = (0..lm.model.vocab_size() as u32).collect();
    let unembedding = lm.model.unembedding_rows(&vocab).unwrap();
    let trained = train(&data, &unembedding, &config, &mut |_| {}).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fingerprint = weights_fingerprint(&lm.weights).unwrap();
    trained
        .save(dir.path(), SMOLLM, &fingerprint, "test")
        .unwrap();
    let heads = lm.load_heads(dir.path()).unwrap();
    lm.set_heads(HeadsDrafter::new(heads, HeadsTree::chain(1)).unwrap())
        .unwrap();

    let plain = GenerateOptions::default().max_tokens(64);
    let mut accepted = 0;
    for question in [
        "Name three uses of a hash map.",
        "Why is the sky blue?",
        "Give me a tip for learning to cook.",
    ] {
        let messages = [Message::user(question)];
        lm.model.reset();
        let expected = lm.chat(&messages, &plain).unwrap();
        for lookup in [0, 3] {
            lm.model.reset();
            let options = plain.clone().speculation(Speculation::Heads { lookup });
            let answer = lm.chat(&messages, &options).unwrap();
            assert_eq!(answer.tokens, expected.tokens, "{question} lookup {lookup}");
            assert_eq!(answer.text, expected.text);
            assert!(answer.stats.target_forwards <= expected.stats.target_forwards);
            accepted += answer.stats.accepted_tokens();
        }
    }
    assert!(accepted > 0, "the head never guessed right");
}
