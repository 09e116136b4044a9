//! PredGen driven live on the wall clock with real weights. A test binary of its own: cargo
//! runs test binaries one after another, so no other real-model test shares the two cores with
//! it (beside them, on a 2-core machine reading 16–23 GB/s, the live turns fell behind the
//! words and guessed nothing before the last one). Ignored by plain `cargo test`; CI runs it
//! with `cargo test --release -- --ignored` after fetching the models.

use engine_llm::{LanguageModel, LoadOptions};

const QWEN_LARGE: &str = "qwen2.5-coder-1.5b-instruct";

fn load(name: &str) -> LanguageModel {
    LanguageModel::open(name, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e} (run ../shared/models/fetch)"))
}

#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn predgen_driven_live_on_the_wall_clock_answers_as_the_simulated_benchmark() {
    use engine_llm::predgen::{
        spoken_at_rate, EventKind, FixedLatencySynthesizer, Partial, SpeechEvent,
    };
    use engine_llm::{Continuation, PredGen, PredGenConfig, Verifier};

    let mut target = load(QWEN_LARGE);
    let mut tts = FixedLatencySynthesizer::default();
    // Without the cost model, so that it guesses while the words come on any machine (with
    // it, a machine with slow forwards may rightly decline: seen on a 2-core machine reading
    // 16–23 GB/s).
    let config = PredGenConfig {
        max_answer_tokens: 32,
        cost_aware: false,
        ..PredGenConfig::with_verifier(Verifier::Greedy)
    };
    // The default continuation, lookup over the turn's discarded guesses.
    assert!(matches!(config.continuation, Continuation::Lookup { .. }));
    let turns = [
        "How long should I boil an egg if I want the yolk to stay soft?",
        "And for a hard one?",
    ];
    let inputs: Vec<Vec<Partial>> = turns
        .iter()
        .map(|t| spoken_at_rate(t, 600.0).unwrap())
        .collect();
    let mut simulated = PredGen::new(&mut target, config.clone()).unwrap();
    let expected: Vec<_> = inputs
        .iter()
        .map(|i| simulated.turn(i, &mut tts).unwrap())
        .collect();
    drop(simulated);

    // The same words spoken in real time from another thread.
    let mut live = PredGen::new(&mut target, config).unwrap();
    let mut worked_during_input = 0;
    for (inputs, expected) in inputs.iter().zip(&expected) {
        let (sender, receiver) = engine_llm::predgen::partial_channel();
        let speaker = {
            let inputs = inputs.clone();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                for partial in inputs {
                    std::thread::sleep(partial.at.saturating_sub(start.elapsed()));
                    sender.send(partial).unwrap();
                }
            })
        };
        let mut audio_events = 0;
        let turn = live
            .live_turn(&receiver, &mut tts, &mut |e| {
                if matches!(
                    e.kind,
                    EventKind::Speech(
                        SpeechEvent::AudioStarts { .. } | SpeechEvent::Sentence { .. }
                    )
                ) {
                    audio_events += 1;
                }
            })
            .unwrap();
        speaker.join().unwrap();
        assert_eq!(turn.turn.answer, expected.turn.answer);
        worked_during_input += turn.turn.tokens_during_input;
        assert_eq!(audio_events, turn.speech.audio.len());
        assert!(!turn.speech.audio.is_empty());
    }
    // On the wall clock, how much fits into a turn depends on the machine's speed and load: the
    // 1.9 s second question once got none.
    assert!(
        worked_during_input > 0,
        "no work while the questions were spoken"
    );
}
