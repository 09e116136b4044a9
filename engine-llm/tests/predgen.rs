//! PredGen on tiny random-weight chat models: greedy verification is lossless whatever the
//! partial prompts and the continuation, the guess carries over between prompts, and bad
//! input is a clear error.

#[allow(dead_code)] // each test binary uses part of the shared helpers
mod common;

use std::time::Duration;

use common::greedy_tokens;
use common::predgen::{config, corrected_inputs, run_turns, tiny_chat_model, word_chat_model};
use engine_llm::predgen::PARTIAL_INPUT_SYSTEM_PROMPT;
use engine_llm::predgen::{spoken_at_rate, Clock, FixedLatencySynthesizer, Partial};
use engine_llm::predgen::{EventKind, SpeechEvent, Status};
use engine_llm::{
    Continuation, Error, LanguageModel, Message, PredGen, PredGenConfig, SpokenTurn, Verifier,
};
use spec_core::decoder::forward_tokens;
use spec_core::math::softmax_in_place;
use spec_core::{Decoder, LogitRows};
use spec_voice::split_first_piece;

#[test]
fn greedy_predgen_with_the_same_budget_gives_the_cascade_answer_token_for_token() {
    let scratch = tempfile::tempdir().unwrap();
    let mut reference_model = tiny_chat_model(scratch.path(), 11);
    let mut model = tiny_chat_model(scratch.path(), 11);
    let cfg = config(Verifier::Greedy, Continuation::Autoregressive);
    let mut reference = PredGen::new(&mut reference_model, cfg.clone()).unwrap();
    let mut session = PredGen::new(&mut model, cfg).unwrap();
    let mut tts = FixedLatencySynthesizer::default();
    for question in [
        "tell me about the sea",
        "why is the sky blue",
        "what is 3.5 plus 2",
    ] {
        let inputs = spoken_at_rate(question, 900.0).unwrap();
        let expected = reference.baseline_turn(&inputs, &mut tts).unwrap();
        let got = session.turn(&inputs, &mut tts).unwrap();
        assert!(!expected.turn.answer.is_empty());
        assert_eq!(got.turn.answer, expected.turn.answer, "{question}");
        assert_eq!(got.turn.first_sentence, expected.turn.first_sentence);
        // The plain cascade synthesizes after the first sentence, at the fixed latency.
        assert_eq!(
            expected.audio_latency(),
            expected.turn.time_to_first_sentence + Duration::from_millis(200)
        );
        assert!(!expected.prepared_audio_used());
        assert_eq!(expected.turn.tokens_during_input, 0);
    }
    assert_eq!(session.history(), reference.history());
    assert_eq!(session.history().len(), 6);
}

#[test]
fn a_guess_for_the_final_prompt_is_kept_whole() {
    let scratch = tempfile::tempdir().unwrap();
    let mut model = tiny_chat_model(scratch.path(), 7);
    let mut session = PredGen::new(
        &mut model,
        config(Verifier::Greedy, Continuation::Autoregressive),
    )
    .unwrap();
    // The last partial already holds every word: the final prompt is the same.
    let text = "what is the tallest mountain";
    let inputs = vec![
        Partial::new(Duration::from_millis(0), text, false),
        Partial::new(Duration::from_secs(5), text, true),
    ];
    let turn = session
        .turn(&inputs, &mut FixedLatencySynthesizer::default())
        .unwrap();
    assert!(turn.turn.guessed_at_end > 0);
    assert_eq!(turn.turn.kept_at_end, turn.turn.guessed_at_end);
    assert!(turn
        .turn
        .timeline
        .iter()
        .any(|e| matches!(e.kind, EventKind::Generated { tokens, .. } if tokens > 0)));
}

#[test]
fn lossy_verifiers_run_and_reflection_needs_yes_and_no_tokens() {
    let scratch = tempfile::tempdir().unwrap();
    let mut model = tiny_chat_model(scratch.path(), 0);
    let turns = vec![corrected_inputs("what is 1 + 23?")];
    let mut session = PredGen::new(
        &mut model,
        config(Verifier::TopK(3), Continuation::Autoregressive),
    )
    .unwrap();
    let got = run_turns(&mut session, &turns, false);
    assert!(!got[0].turn.answer.is_empty());
    drop(session);
    // The tiny tokenizer spells "yes" with three tokens.
    let err = PredGen::new(
        &mut model,
        config(Verifier::Reflection, Continuation::Autoregressive),
    )
    .err()
    .unwrap();
    assert!(matches!(err, Error::Tokenizer(_)), "{err}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let scratch = tempfile::tempdir().unwrap();
    let mut model = tiny_chat_model(scratch.path(), 3);
    let mut tts = FixedLatencySynthesizer::default();
    let partial =
        |ms, text: &str, is_final| Partial::new(Duration::from_millis(ms), text, is_final);
    let mut session = PredGen::new(
        &mut model,
        config(Verifier::Greedy, Continuation::DraftModel { gamma: 2 }),
    )
    .unwrap();
    let ok = [partial(0, "hi", true)];
    assert!(matches!(session.turn(&ok, &mut tts), Err(Error::Config(_))));
    drop(session);
    let mut session =
        PredGen::new(&mut model, config(Verifier::Greedy, Continuation::Heads)).unwrap();
    let err = session.turn(&ok, &mut tts).unwrap_err();
    assert!(err.to_string().contains("with_heads"), "{err}");
    drop(session);
    let mut session = PredGen::new(&mut model, PredGenConfig::default()).unwrap();
    for inputs in [
        vec![],
        vec![partial(0, "hi", false)],
        vec![partial(0, "hi", true), partial(10, "hi there", true)],
        vec![partial(50, "hi", false), partial(10, "hi there", true)],
        vec![partial(0, "  ", true)],
    ] {
        assert!(
            matches!(session.turn(&inputs, &mut tts), Err(Error::Input(_))),
            "{inputs:?}"
        );
        assert!(matches!(
            session.baseline_turn(&inputs, &mut tts),
            Err(Error::Input(_))
        ));
    }
    let bad = PredGenConfig {
        max_answer_tokens: 0,
        ..PredGenConfig::default()
    };
    assert!(matches!(
        PredGen::new(&mut model, bad),
        Err(Error::Config(_))
    ));
    // A prompt longer than the context.
    let long = "word ".repeat(5000);
    let mut session = PredGen::new(&mut model, PredGenConfig::default()).unwrap();
    let err = session
        .turn(&[partial(0, &long, true)], &mut tts)
        .unwrap_err();
    assert!(err.to_string().contains("context overflow"), "{err}");
}

/// Speaks `inputs` into a channel at their times, from a thread. At their own pace: sped up
/// fourfold, the partials came 25–100 ms apart, and a debug build on a slow 2-core machine,
/// with the other tests of this file running beside it, did not speculate before the final
/// partial.
fn speak_live(inputs: Vec<Partial>) -> engine_llm::predgen::PartialReceiver {
    let (sender, receiver) = engine_llm::predgen::partial_channel();
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        for partial in inputs {
            std::thread::sleep(partial.at.saturating_sub(start.elapsed()));
            if sender.send(partial).is_err() {
                return;
            }
        }
    });
    receiver
}

#[test]
fn live_turns_on_the_wall_clock_answer_as_the_simulated_ones() {
    let scratch = tempfile::tempdir().unwrap();
    let turns = vec![
        corrected_inputs("what is 1 + 23?"),
        spoken_at_rate("and what is it times four, roughly?", 600.0).unwrap(),
    ];
    let cfg = config(Verifier::Greedy, Continuation::Autoregressive);
    let mut simulated_model = tiny_chat_model(scratch.path(), 9);
    let mut simulated = PredGen::new(&mut simulated_model, cfg.clone()).unwrap();
    let expected = run_turns(&mut simulated, &turns, false);

    let mut model = tiny_chat_model(scratch.path(), 9);
    let mut live = PredGen::new(&mut model, cfg).unwrap();
    let mut tts = FixedLatencySynthesizer::default();
    for (inputs, expected) in turns.iter().zip(&expected) {
        let mut seen = Vec::new();
        let turn = live
            .live_turn(&speak_live(inputs.clone()), &mut tts, &mut |e| {
                seen.push(e.clone());
            })
            .unwrap();
        assert_eq!(turn.turn.answer, expected.turn.answer);
        assert_eq!(turn.turn.first_sentence, expected.turn.first_sentence);
        assert!(
            turn.turn.tokens_during_input > 0,
            "no speculation while listening"
        );
        // Every event reached the caller as it happened, the final partial heard last.
        assert_eq!(seen.len(), turn.turn.timeline.len());
        let finals = seen.iter().filter(
            |e| matches!(&e.kind, EventKind::Heard { is_final: true, text } if *text == turn.turn.question),
        );
        assert_eq!(finals.count(), 1);
        // The answer's audio is handed over, not discarded: the first sentence's first piece
        // with the audio-start event (and its rest after it), then one synthesis per later
        // sentence.
        let first_audio: Vec<_> = seen
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Speech(SpeechEvent::AudioStarts { audio, .. })
                | EventKind::Speech(SpeechEvent::FirstSentenceRest { audio, .. }) => Some(audio),
                _ => None,
            })
            .collect();
        let (first_piece, rest) = split_first_piece(&turn.turn.first_sentence);
        assert_eq!(first_audio.len(), 1 + usize::from(rest.is_some()));
        assert_eq!(first_audio[0].sentence, first_piece);
        assert_eq!(turn.speech.audio[0].sentence, turn.turn.first_sentence);
        let joined: Vec<_> = first_audio
            .iter()
            .flat_map(|a| a.chunks.iter().cloned())
            .collect();
        assert_eq!(turn.speech.audio[0].chunks, joined);
        let later = seen
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Speech(SpeechEvent::Sentence { .. })))
            .count();
        assert_eq!(turn.speech.audio.len(), 1 + later);
        assert!(turn.speech.audio.iter().all(|a| !a.chunks.is_empty()));
    }
    assert_eq!(live.history(), simulated.history());
}

#[test]
fn a_barge_in_rolls_the_turn_back() {
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(Verifier::Greedy, Continuation::Autoregressive);
    let mut reference_model = tiny_chat_model(scratch.path(), 5);
    let mut reference = PredGen::new(&mut reference_model, cfg.clone()).unwrap();
    let question = spoken_at_rate("how far away is the moon", 600.0).unwrap();
    let expected = run_turns(&mut reference, std::slice::from_ref(&question), false);

    let mut model = tiny_chat_model(scratch.path(), 5);
    let mut session = PredGen::new(&mut model, cfg).unwrap();
    // The user says something, the assistant starts answering, the user speaks again.
    let clock = Clock::simulated();
    session.begin_turn(&clock).unwrap();
    for partial in spoken_at_rate("tell me a long story about dragons", 600.0).unwrap() {
        session.hear(partial).unwrap();
        for _ in 0..3 {
            session.step().unwrap();
        }
    }
    session.cancel_turn().unwrap();
    assert!(session.history().is_empty());
    let got = run_turns(&mut session, &[question], false);
    assert_eq!(got[0].turn.answer, expected[0].turn.answer);
    assert_eq!(session.history(), reference.history());
}

#[test]
fn live_api_misuse_is_a_clear_error() {
    let scratch = tempfile::tempdir().unwrap();
    let mut model = tiny_chat_model(scratch.path(), 4);
    let mut session = PredGen::new(&mut model, PredGenConfig::default()).unwrap();
    let mut tts = FixedLatencySynthesizer::default();
    let partial =
        |ms, text: &str, is_final| Partial::new(Duration::from_millis(ms), text, is_final);
    assert!(matches!(
        session.hear(partial(0, "hi", false)),
        Err(Error::Input(_))
    ));
    assert!(matches!(session.step(), Err(Error::Input(_))));
    let clock = Clock::simulated();
    session.begin_turn(&clock).unwrap();
    // Nothing heard yet: nothing to do.
    let idle = session.step().unwrap();
    assert_eq!(idle.status, Status::Idle);
    assert!(idle.events.is_empty());
    session.hear(partial(100, "hi", false)).unwrap();
    assert!(matches!(
        session.hear(partial(50, "hi there", false)),
        Err(Error::Input(_))
    ));
    assert!(matches!(
        session.hear(partial(200, "  ", true)),
        Err(Error::Input(_))
    ));
    session.hear(partial(200, "hi there", true)).unwrap();
    assert!(matches!(
        session.hear(partial(300, "hi there again", true)),
        Err(Error::Input(_))
    ));
    // A live turn whose speaker hangs up before finishing.
    let (sender, receiver) = engine_llm::predgen::partial_channel();
    sender.send(partial(0, "what is", false)).unwrap();
    drop(sender);
    let err = session
        .live_turn(&receiver, &mut tts, &mut |_| {})
        .unwrap_err();
    assert!(err.to_string().contains("without a final"), "{err}");
    assert!(session.history().is_empty());
}

/// Partials stamped ahead of the turn's clock: a simulated clock moves on to them, so the
/// turn's latencies count from the final partial's time (they used to underflow and panic
/// when the answer's first sentence was ready before that time); the wall clock refuses them.
#[test]
fn partials_stamped_ahead_of_the_clock_move_a_simulated_clock_and_are_refused_on_the_wall() {
    let scratch = tempfile::tempdir().unwrap();
    let mut model = tiny_chat_model(scratch.path(), 4);
    let mut session = PredGen::new(&mut model, PredGenConfig::default()).unwrap();
    let input_end = Duration::from_secs(5);
    let clock = Clock::simulated();
    session.begin_turn(&clock).unwrap();
    session
        .hear(Partial::new(Duration::from_secs(2), "what is", false))
        .unwrap();
    assert_eq!(clock.now(), Duration::from_secs(2));
    session
        .hear(Partial::new(input_end, "what is two plus two", true))
        .unwrap();
    assert_eq!(clock.now(), input_end);
    let turn = loop {
        if let Status::Done(turn) = session.step().unwrap().status {
            break turn;
        }
    };
    assert_eq!(turn.input_end, input_end);
    assert!(turn.time_to_first_sentence <= turn.answer_latency);
    assert!(turn.answer_latency < Duration::from_secs(60), "{turn:?}");

    session.begin_turn(&Clock::wall()).unwrap();
    let err = session
        .hear(Partial::new(Duration::from_secs(3600), "what is", false))
        .unwrap_err();
    assert!(matches!(err, Error::Input(_)), "{err}");
    assert!(err.to_string().contains("wall clock"), "{err}");
    session
        .hear(Partial::new(Duration::ZERO, "what is", false))
        .unwrap();
}

#[test]
fn verifying_guesses_in_chunks_keeps_greedy_predgen_lossless() {
    use spec_core::ForwardCosts;
    let scratch = tempfile::tempdir().unwrap();
    let turns = vec![
        corrected_inputs("what is 1 + 23?"),
        spoken_at_rate("and what is it times four, roughly?", 600.0).unwrap(),
    ];
    let plain = |continuation| PredGenConfig {
        cost_aware: false,
        ..config(Verifier::Greedy, continuation)
    };
    let mut reference_model = tiny_chat_model(scratch.path(), 9);
    let mut reference =
        PredGen::new(&mut reference_model, plain(Continuation::Autoregressive)).unwrap();
    let expected = run_turns(&mut reference, &turns, true);

    // Every token costs as much as a forward: no guessed token is worth carrying, so each check
    // judges a single guessed token with the forward's last row. Flat costs: the whole guess.
    let linear = ForwardCosts::from_points(&[(1, 0.01), (64, 0.64)]).unwrap();
    let flat = ForwardCosts::from_points(&[(1, 0.01), (64, 0.01)]).unwrap();
    let mut checks = Vec::new();
    for costs in [linear, flat] {
        for continuation in [
            Continuation::Autoregressive,
            Continuation::Jacobi { window: 4 },
            Continuation::Lookup { max_draft: 4 },
        ] {
            let mut model = tiny_chat_model(scratch.path(), 9);
            let cfg = PredGenConfig {
                cost_aware: true,
                ..plain(continuation)
            };
            let mut session = PredGen::new(&mut model, cfg)
                .unwrap()
                .with_costs(costs.clone());
            let got = run_turns(&mut session, &turns, false);
            let mut verifications = 0;
            for (got, expected) in got.iter().zip(&expected) {
                assert_eq!(got.turn.answer, expected.turn.answer, "{continuation:?}");
                verifications += got
                    .turn
                    .timeline
                    .iter()
                    .filter(|e| matches!(e.kind, EventKind::Verified { .. }))
                    .count();
            }
            checks.push(verifications);
        }
    }
    // Checking one token at a time takes more checks than checking whole guesses, whatever
    // the continuation.
    let (linear, flat) = checks.split_at(checks.len() / 2);
    assert!(linear.iter().zip(flat).all(|(l, f)| l > f), "{checks:?}");
}

#[test]
fn no_step_while_listening_runs_more_than_one_forward() {
    // Completing the question included: it takes a token a step, so a step still running at
    // the last word delays the answer by one forward at most; so do candidate questions, all
    // advancing in one forward.
    let scratch = tempfile::tempdir().unwrap();
    for candidates in [1, 4] {
        let mut model = tiny_chat_model(scratch.path(), 9);
        let cfg = PredGenConfig {
            tokens_per_step: 1,
            cost_aware: false,
            question_candidates: candidates,
            ..config(Verifier::Greedy, Continuation::Autoregressive)
        };
        assert!(cfg.complete_questions);
        let mut session = PredGen::new(&mut model, cfg).unwrap();
        let clock = Clock::simulated();
        session.begin_turn(&clock).unwrap();
        let inputs = corrected_inputs("what is 1 + 23?");
        let (last, partials) = inputs.split_last().unwrap();
        let mut working_steps = 0;
        for partial in partials {
            clock.wait_until(partial.at);
            session.hear(partial.clone()).unwrap();
            for _ in 0..6 {
                match session.step().unwrap().status {
                    Status::Working => working_steps += 1,
                    Status::Idle => break,
                    Status::Done(_) => panic!("done before the final partial"),
                }
            }
        }
        clock.wait_until(last.at);
        session.hear(last.clone()).unwrap();
        let turn = loop {
            if let Status::Done(turn) = session.step().unwrap().status {
                break turn;
            }
        };
        assert!(
            turn.forwards_during_input > 0,
            "{candidates}: no work while listening"
        );
        assert!(
            turn.forwards_during_input <= working_steps,
            "{candidates}: {} forwards in {working_steps} steps while listening",
            turn.forwards_during_input
        );
    }
}

/// An answer limit below the guess limit: the guess (and every candidate question's guessed
/// answer) stops at the answer limit, so the answers are the cascade's, cut at that limit
/// (a candidate's guess used to run to the guess limit and underflow the answer's budget).
#[test]
fn answers_shorter_than_the_guess_limit_are_the_cascades() {
    let scratch = tempfile::tempdir().unwrap();
    // The whole question is heard a while before its final partial says so: its candidate
    // is the final question, and its guess has time to grow.
    let heard_early = |text: &str| {
        vec![
            Partial::new(Duration::from_millis(100), text, false),
            Partial::new(Duration::from_secs(30), text, true),
        ]
    };
    let turns = vec![
        heard_early("what is 1 + 23?"),
        corrected_inputs("and what is it times four, roughly?"),
    ];
    let short = |candidates| PredGenConfig {
        max_guess_tokens: 12,
        max_answer_tokens: 3,
        ..with_candidates(Continuation::Autoregressive, candidates)
    };
    let mut reference_model = tiny_chat_model(scratch.path(), 9);
    let mut reference = PredGen::new(&mut reference_model, short(1)).unwrap();
    let expected = run_turns(&mut reference, &turns, true);
    let mut longer_model = tiny_chat_model(scratch.path(), 9);
    let uncut_config = PredGenConfig {
        max_answer_tokens: 24,
        ..short(1)
    };
    let mut longer = PredGen::new(&mut longer_model, uncut_config).unwrap();
    let uncut = run_turns(&mut longer, &turns, true);
    for (cut, whole) in expected.iter().zip(&uncut) {
        assert!(
            cut.turn.answer.len() < whole.turn.answer.len(),
            "{cut:?} / {whole:?}"
        );
    }
    for candidates in [1, 2, 4] {
        let mut model = tiny_chat_model(scratch.path(), 9);
        let mut session = PredGen::new(&mut model, short(candidates)).unwrap();
        let got = run_turns(&mut session, &turns, false);
        for (g, e) in got.iter().zip(&expected) {
            assert_eq!(g.turn.answer, e.turn.answer, "{candidates} candidates");
        }
    }
}

fn with_candidates(continuation: Continuation, candidates: usize) -> PredGenConfig {
    PredGenConfig {
        question_candidates: candidates,
        ..config(Verifier::Greedy, continuation)
    }
}

#[test]
fn candidate_questions_answer_exactly_as_the_plain_cascade() {
    let scratch = tempfile::tempdir().unwrap();
    let turns = vec![
        corrected_inputs("what is 1 + 23?"),
        spoken_at_rate("and what is it times four, roughly?", 600.0).unwrap(),
        spoken_at_rate("why", 600.0).unwrap(),
    ];
    let mut reference_model = tiny_chat_model(scratch.path(), 9);
    let mut reference = PredGen::new(
        &mut reference_model,
        config(Verifier::Greedy, Continuation::Autoregressive),
    )
    .unwrap();
    let expected = run_turns(&mut reference, &turns, true);
    for continuation in [
        Continuation::Autoregressive,
        Continuation::Lookup { max_draft: 4 },
    ] {
        for candidates in [2, 4] {
            let mut model = tiny_chat_model(scratch.path(), 9);
            let cfg = with_candidates(continuation, candidates);
            let mut session = PredGen::new(&mut model, cfg).unwrap();
            let got = run_turns(&mut session, &turns, false);
            for (turn, (got, expected)) in got.iter().zip(&expected).enumerate() {
                let case = format!("{continuation:?}, {candidates} candidates, turn {turn}");
                assert_eq!(got.turn.answer, expected.turn.answer, "{case}");
                assert_eq!(
                    got.turn.first_sentence, expected.turn.first_sentence,
                    "{case}"
                );
                // The one-word question has nothing before its final partial.
                let spoken_before_the_end = turn < 2;
                assert_eq!(
                    got.turn.forwards_during_input > 0,
                    spoken_before_the_end,
                    "{case}"
                );
                assert!(got.turn.timeline.windows(2).all(|w| w[0].at <= w[1].at));
            }
            assert_eq!(session.history(), reference.history());
        }
    }
}

/// The candidate questions the model completed `heard` into (the turn's `Completed` events
/// after hearing it), likeliest first.
fn completed_questions(turn: &SpokenTurn) -> Vec<String> {
    let mut questions = Vec::new();
    for event in &turn.turn.timeline {
        if let EventKind::Completed { question } = &event.kind {
            if !questions.contains(question) {
                questions.push(question.clone());
            }
        }
    }
    questions
}

#[test]
fn the_candidate_the_user_asks_is_the_answer_with_nothing_to_verify() {
    let scratch = tempfile::tempdir().unwrap();
    let heard = "what is the";
    let partial = Partial::new(Duration::ZERO, heard, false);
    let mut tts = FixedLatencySynthesizer::default();
    // Some seed's model completes the words into at least two questions; the user then asks
    // one that is not the likeliest.
    let found = (0..8).find_map(|seed| {
        let mut model = tiny_chat_model(scratch.path(), seed);
        let cfg = with_candidates(Continuation::Autoregressive, 4);
        let mut session = PredGen::new(&mut model, cfg).unwrap();
        let probe = vec![
            partial.clone(),
            Partial::new(Duration::from_secs(30), "what is the answer", true),
        ];
        let questions = completed_questions(&session.turn(&probe, &mut tts).unwrap());
        (questions.len() >= 2).then(|| (seed, questions[questions.len() - 1].clone()))
    });
    let (seed, asked) = found.expect("no seed completes the words into two questions");
    let inputs = vec![
        partial,
        Partial::new(Duration::from_secs(30), asked.clone(), true),
    ];
    let mut reference_model = tiny_chat_model(scratch.path(), seed);
    let mut reference = PredGen::new(
        &mut reference_model,
        config(Verifier::Greedy, Continuation::Autoregressive),
    )
    .unwrap();
    let expected = reference.baseline_turn(&inputs, &mut tts).unwrap();
    let mut model = tiny_chat_model(scratch.path(), seed);
    let mut session =
        PredGen::new(&mut model, with_candidates(Continuation::Autoregressive, 4)).unwrap();
    let got = session.turn(&inputs, &mut tts).unwrap();
    assert_eq!(got.turn.guessed_question.as_deref(), Some(asked.as_str()));
    assert_eq!(got.turn.answer, expected.turn.answer);
    // Thirty seconds were time enough to answer every candidate: the asked one's guess is
    // kept whole without a verifying forward.
    assert!(got.turn.guessed_at_end > 0);
    assert_eq!(got.turn.kept_at_end, got.turn.guessed_at_end);
    assert!(
        !got.turn
            .timeline
            .iter()
            .any(|e| matches!(e.kind, EventKind::Verified { kept, guessed, .. } if kept < guessed)),
        "{:?}",
        got.turn.timeline
    );
}

/// The words of `question` a few hundred microseconds apart, the final partial `final_after`
/// the last of them: on a tiny model a step of work ahead is then in flight at many a final.
fn hurried_inputs(question: &str, gap: Duration, final_after: Duration) -> Vec<Partial> {
    let words: Vec<&str> = question.split_whitespace().collect();
    let mut inputs: Vec<Partial> = (1..words.len())
        .map(|n| Partial::new(gap * n as u32, words[..n].join(" "), false))
        .collect();
    let last = inputs.last().map_or(Duration::ZERO, |p| p.at);
    inputs.push(Partial::new(last + final_after, question, true));
    inputs
}

#[test]
fn a_step_in_flight_at_the_final_partial_is_abandoned_and_the_answer_stays_the_cascades() {
    let scratch = tempfile::tempdir().unwrap();
    let question = "what is one plus twenty three and why";
    let mut reference_model = tiny_chat_model(scratch.path(), 9);
    let mut reference = PredGen::new(
        &mut reference_model,
        config(Verifier::Greedy, Continuation::Autoregressive),
    )
    .unwrap();
    let mut tts = FixedLatencySynthesizer::default();
    let quiet = spoken_at_rate(question, 600.0).unwrap();
    let expected = reference.baseline_turn(&quiet, &mut tts).unwrap();
    assert!(expected.turn.answer.len() > 10, "{expected:?}");
    // The question asked again after it.
    let expected_again = reference.turn(&quiet, &mut tts).unwrap();

    let mut draft = tiny_chat_model(scratch.path(), 2);
    let no_completion = PredGenConfig {
        complete_questions: false,
        ..config(Verifier::Greedy, Continuation::Autoregressive)
    };
    let configs = [
        config(Verifier::Greedy, Continuation::Autoregressive),
        no_completion,
        config(Verifier::Greedy, Continuation::Jacobi { window: 4 }),
        config(Verifier::Greedy, Continuation::DraftModel { gamma: 3 }),
        config(Verifier::Greedy, Continuation::Lookup { max_draft: 4 }),
        with_candidates(Continuation::Lookup { max_draft: 4 }, 3),
    ];
    for cfg in configs {
        let mut interrupted = 0;
        for final_after_us in [0, 40, 90, 150, 230, 350, 500, 800, 1300, 2100] {
            let final_after = Duration::from_micros(final_after_us);
            let inputs = hurried_inputs(question, Duration::from_micros(700), final_after);
            let final_at = inputs.last().unwrap().at;
            let mut model = tiny_chat_model(scratch.path(), 9);
            let mut session = PredGen::new(&mut model, cfg.clone())
                .unwrap()
                .with_draft(&mut draft)
                .unwrap();
            let got = session.turn(&inputs, &mut tts).unwrap();
            let case = format!("{cfg:?}, final {final_after_us} µs after the last word");
            assert_eq!(got.turn.answer, expected.turn.answer, "{case}");
            assert_eq!(
                got.turn.first_sentence, expected.turn.first_sentence,
                "{case}"
            );
            let abandoned: Vec<_> = got
                .turn
                .timeline
                .iter()
                .filter(|e| e.kind == EventKind::Interrupted)
                .collect();
            // Only the step in flight at the final partial, and never before it arrived.
            assert!(abandoned.len() <= 1, "{case}: {abandoned:?}");
            if let Some(event) = abandoned.first() {
                assert!(event.at >= final_at, "{case}: abandoned early");
                interrupted += 1;
            }
            // A forward run to its end or abandoned, the cache holds the same conversation.
            let again = session.turn(&quiet, &mut tts).unwrap();
            assert_eq!(
                again.turn.answer, expected_again.turn.answer,
                "{case}: the next turn"
            );
        }
        assert!(
            interrupted > 0,
            "{cfg:?}: no step was in flight at a final partial"
        );
    }
}

#[test]
fn a_live_step_in_flight_is_abandoned_when_the_final_partial_is_sent() {
    let scratch = tempfile::tempdir().unwrap();
    let question = "what is one plus twenty three and why";
    let cfg = config(Verifier::Greedy, Continuation::Lookup { max_draft: 4 });
    let mut reference_model = tiny_chat_model(scratch.path(), 9);
    let mut reference = PredGen::new(&mut reference_model, cfg.clone()).unwrap();
    let mut tts = FixedLatencySynthesizer::default();
    let quiet = spoken_at_rate(question, 600.0).unwrap();
    let expected = reference.baseline_turn(&quiet, &mut tts).unwrap();

    let mut model = tiny_chat_model(scratch.path(), 9);
    let mut session = PredGen::new(&mut model, cfg).unwrap();
    let mut interrupted = 0;
    for final_after_us in (0..20).map(|i| 60 * i) {
        let inputs = hurried_inputs(
            question,
            Duration::from_micros(500),
            Duration::from_micros(final_after_us),
        );
        let mut abandoned = false;
        let turn = session
            .live_turn(&speak_live(inputs), &mut tts, &mut |e| {
                abandoned |= e.kind == EventKind::Interrupted;
            })
            .unwrap();
        assert_eq!(
            turn.turn.answer, expected.turn.answer,
            "final {final_after_us} µs late"
        );
        interrupted += usize::from(abandoned);
        session.clear_history().unwrap();
    }
    assert!(
        interrupted > 0,
        "no step was in flight when a final partial was sent"
    );
}

/// P(end of the user's turn) straight from the model: its probability of a sentence-ending
/// token right after `sentence` (the words read as one sentence, without marks), in a fresh
/// conversation's chat prompt.
fn end_probability(model: &mut LanguageModel, sentence: &str) -> f32 {
    let prompt = |text: &str| {
        model
            .chat_prompt(&[
                Message::system(PARTIAL_INPUT_SYSTEM_PROMPT),
                Message::user(text),
            ])
            .unwrap()
    };
    let (a, b) = (prompt("a"), prompt("b"));
    let opening = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let context = prompt(sentence);
    let context = &context[..context.len() - opening];
    model.model.truncate(0).unwrap();
    let mut row = forward_tokens(&mut model.model, context, LogitRows::Last(1))
        .unwrap()
        .into_last_row();
    softmax_in_place(&mut row);
    let ends = model.tokenizer.sentence_end_tokens().to_vec();
    assert!(ends.len() > model.tokenizer.end_tokens().len(), "{ends:?}");
    ends.iter().map(|&t| row[t as usize]).sum()
}

#[test]
fn end_of_turn_estimates_are_the_models_probability_and_leave_answers_unchanged() {
    let scratch = tempfile::tempdir().unwrap();
    let mut reference_model = tiny_chat_model(scratch.path(), 13);
    let mut model = tiny_chat_model(scratch.path(), 13);
    let mut plain = config(Verifier::Greedy, Continuation::Lookup { max_draft: 4 });
    plain.cost_aware = false;
    let estimating = PredGenConfig {
        estimate_end_of_turn: true,
        ..plain.clone()
    };
    let mut inputs = corrected_inputs("what is 1 + 23?");
    // Whisper ends a pause's transcript with a mark, and writes pauses inside a question as
    // sentence ends: the estimate reads the words as one sentence.
    inputs[1].text = "what is. One plus twenty.".into();
    let mut tts = FixedLatencySynthesizer::default();
    for cascade in [false, true] {
        let mut reference = PredGen::new(&mut reference_model, plain.clone()).unwrap();
        let mut session = PredGen::new(&mut model, estimating.clone()).unwrap();
        let (expected, got) = if cascade {
            (
                reference.baseline_turn(&inputs, &mut tts).unwrap(),
                session.baseline_turn(&inputs, &mut tts).unwrap(),
            )
        } else {
            (
                reference.turn(&inputs, &mut tts).unwrap(),
                session.turn(&inputs, &mut tts).unwrap(),
            )
        };
        assert_eq!(got.turn.answer, expected.turn.answer, "cascade {cascade}");
        let estimates: Vec<(String, f32)> = got
            .turn
            .timeline
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::EndOfTurn { words, probability } => Some((words.clone(), *probability)),
                _ => None,
            })
            .collect();
        assert!(
            estimates.iter().any(|(words, _)| words.ends_with('.')),
            "cascade {cascade}: {estimates:?}"
        );
        assert!(expected
            .turn
            .timeline
            .iter()
            .all(|e| !matches!(e.kind, EventKind::EndOfTurn { .. })));
        for (words, probability) in estimates {
            let sentence = match words.as_str() {
                "what is. One plus twenty." => "what is one plus twenty",
                words => words.trim_end_matches([' ', '.', '?', '!']),
            };
            let direct = end_probability(&mut reference_model, sentence);
            assert!(
                (probability - direct).abs() < 1e-4,
                "\"{words}\": {probability} against {direct}"
            );
        }
    }
    // Step by step, the newest estimate is the newest partial's.
    let mut session = PredGen::new(&mut model, estimating).unwrap();
    let clock = Clock::simulated();
    session.begin_cascade_turn(&clock).unwrap();
    assert_eq!(session.end_of_turn(), None);
    for partial in &inputs[..inputs.len() - 1] {
        clock.wait_until(partial.at);
        session.hear(partial.clone()).unwrap();
        while session.step().unwrap().status == Status::Working {}
        let estimate = session.end_of_turn().unwrap();
        assert_eq!(estimate.words, partial.text);
        assert!((0.0..=1.0).contains(&estimate.probability));
    }
}

#[test]
fn an_unsure_last_word_weighs_the_end_of_turn_with_and_without_it() {
    let scratch = tempfile::tempdir().unwrap();
    let mut reference_model = tiny_chat_model(scratch.path(), 13);
    let mut model = tiny_chat_model(scratch.path(), 13);
    let estimating = PredGenConfig {
        estimate_end_of_turn: true,
        ..config(Verifier::Greedy, Continuation::Autoregressive)
    };
    // Whisper's transcript of a pause, its last word heard in the silence, and one where the
    // marks inside are dropped too (the estimate then takes two forwards).
    for (words, sentence, shorter) in [
        (
            "what is one plus twenty.",
            "what is one plus twenty",
            "what is one plus",
        ),
        (
            "what is. One plus twenty?",
            "what is one plus twenty",
            "what is one plus",
        ),
    ] {
        let with_last = end_probability(&mut reference_model, sentence);
        let without_last = end_probability(&mut reference_model, shorter);
        assert!(
            (with_last - without_last).abs() > 1e-3,
            "{with_last} {without_last}"
        );
        for p in [1.0, 0.9, 0.22, 0.0] {
            // A new conversation each time: the estimates read no history.
            let mut session = PredGen::new(&mut model, estimating.clone()).unwrap();
            let clock = Clock::simulated();
            session.begin_cascade_turn(&clock).unwrap();
            session
                .hear(Partial::new(clock.now(), words, false).with_last_word_probability(p))
                .unwrap();
            while session.step().unwrap().status == Status::Working {}
            let estimate = session.end_of_turn().unwrap().probability;
            let expected = p * with_last + (1.0 - p) * without_last;
            assert!(
                (estimate - expected).abs() < 1e-4,
                "{words:?}, p {p}: {estimate} against {expected}"
            );
        }
    }
}

#[test]
fn a_retracted_turn_leaves_the_conversation_as_before_it() {
    let scratch = tempfile::tempdir().unwrap();
    let mut reference_model = tiny_chat_model(scratch.path(), 17);
    let mut model = tiny_chat_model(scratch.path(), 17);
    let cfg = config(Verifier::Greedy, Continuation::Autoregressive);
    let mut reference = PredGen::new(&mut reference_model, cfg.clone()).unwrap();
    let mut session = PredGen::new(&mut model, cfg).unwrap();
    let mut tts = FixedLatencySynthesizer::default();
    let first = spoken_at_rate("tell me about the sea", 900.0).unwrap();
    let cut = spoken_at_rate("why is the", 900.0).unwrap();
    let whole = spoken_at_rate("why is the sky blue", 900.0).unwrap();
    assert_eq!(session.retract_last_turn().unwrap(), None);
    for (name, inputs) in [("first", &first), ("whole", &whole)] {
        let expected = reference.turn(inputs, &mut tts).unwrap();
        if name == "whole" {
            // A question cut short by a false end of turn, answered, then taken back.
            session.turn(&cut, &mut tts).unwrap();
            assert_eq!(
                session.retract_last_turn().unwrap().as_deref(),
                Some("why is the")
            );
            assert_eq!(session.history(), &reference.history()[..2]);
        }
        let got = session.turn(inputs, &mut tts).unwrap();
        assert_eq!(got.turn.answer, expected.turn.answer, "{name}");
    }
    assert_eq!(session.history(), reference.history());
}

/// The chat model's own greedy answer to `question`, of at most `max_tokens` tokens.
fn plain_greedy_answer(model: &mut LanguageModel, question: &str, max_tokens: usize) -> String {
    let prompt = model
        .chat_prompt(&[
            Message::system(PARTIAL_INPUT_SYSTEM_PROMPT),
            Message::user(question),
        ])
        .unwrap();
    let ends = model.tokenizer.end_tokens().to_vec();
    let tokens: Vec<u32> = greedy_tokens(model, &prompt, max_tokens)
        .into_iter()
        .take_while(|t| !ends.contains(t))
        .collect();
    model
        .tokenizer
        .decode_text(&tokens)
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn a_long_first_sentence_is_spoken_from_its_first_piece_before_it_is_complete() {
    let scratch = tempfile::tempdir().unwrap();
    let cfg = PredGenConfig {
        max_guess_tokens: 48,
        max_answer_tokens: 64,
        ..config(Verifier::Greedy, Continuation::Autoregressive)
    };
    let questions = [
        "how often should i water it",
        "why do the leaves turn yellow",
        "what is a good pot for it",
    ];
    let mut streamed = 0;
    for seed in [3, 5, 8] {
        let mut reference_model = word_chat_model(scratch.path(), seed);
        let expected: Vec<String> = questions
            .iter()
            .map(|q| plain_greedy_answer(&mut reference_model, q, cfg.max_answer_tokens))
            .collect();
        let mut model = word_chat_model(scratch.path(), seed);
        for baseline in [true, false] {
            for (question, expected) in questions.iter().zip(&expected) {
                let mut session = PredGen::new(&mut model, cfg.clone()).unwrap();
                let inputs = spoken_at_rate(question, 600.0).unwrap();
                let mut tts = FixedLatencySynthesizer::default();
                let spoken = match baseline {
                    true => session.baseline_turn(&inputs, &mut tts).unwrap(),
                    false => session.turn(&inputs, &mut tts).unwrap(),
                };
                let turn = &spoken.turn;
                assert_eq!(&turn.answer, expected, "seed {seed}: {question}");
                let Some((piece, piece_at)) = turn.first_piece() else {
                    continue;
                };
                streamed += 1;
                assert_eq!(piece, split_first_piece(&turn.first_sentence).0);
                let sentence_at = turn
                    .first_event_at(|k| matches!(k, EventKind::FirstSentence { .. }))
                    .unwrap();
                // The piece's audio (200 ms of synthesis) is ready before the model has
                // written the rest of the sentence.
                let first_audio = spoken.speech.first_audio_at.unwrap();
                assert_eq!(first_audio, piece_at + Duration::from_millis(200));
                assert!(
                    first_audio <= sentence_at,
                    "{first_audio:?} > {sentence_at:?}"
                );
                assert_eq!(spoken.speech.audio[0].sentence, turn.first_sentence);
            }
        }
    }
    assert!(streamed >= 3, "{streamed} turns spoke a first piece early");
}
