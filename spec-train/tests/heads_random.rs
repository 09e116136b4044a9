//! Trained prediction heads on tiny random-weight models (`spec_train::heads`): heads trained
//! on a model's own outputs decode exactly as greedy decoding does through every way the engines
//! use them — the chat model's own loop and chat API, PredGen, Whisper's windows — and the
//! chat model's self-distilled data holds its greedy answers. The modules are named after the
//! engine tests these came from.

#[path = "../../engine-llm/tests/common/mod.rs"]
#[allow(dead_code)] // each test binary uses part of the shared helpers
mod common;

/// Heads on the transformer of both families, loaded through the GGUF loader.
mod random_models {
    use candle_core::quantized::GgmlDType;
    use candle_core::Device;
    use engine_llm::{LoadOptions, Transformer};
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use spec_core::{
        generate, speculate, AcceptanceRule, Decoder, HeadsDrafter, HeadsTree, HiddenStates,
        LogitRows, LookupConfig, LookupDrafter, MergedDrafter, SamplingConfig, Speculation,
        StopConditions, TokenHeads, Verification,
    };
    use spec_nn::heads::{weights_fingerprint, HeadKind, MultiTokenHeads};
    use spec_train::heads::{train, TrainConfig, TrainingSet};

    use super::common::{Tiny, FAMILIES};

    #[test]
    fn decoding_with_trained_heads_equals_greedy_decoding() {
        let prompts: Vec<Vec<u32>> = (0..12u32)
            .map(|p| (0..4).map(|i| (p * 13 + i * 7 + 1) % 96).collect())
            .collect();
        for family in FAMILIES {
            let scratch = tempfile::tempdir().unwrap();
            let path = Tiny::new(family).write_gguf(scratch.path(), 41, GgmlDType::Q8_0, &[]);
            let mut model = Transformer::from_gguf(&path, &LoadOptions::default()).unwrap();
            let stop = StopConditions::new(24);
            let mut rng = StdRng::seed_from_u64(0);
            // Self-distillation: the model's greedy continuations, teacher-forced once.
            let mut data = TrainingSet::new(64);
            let mut greedy = Vec::new();
            for (group, prompt) in prompts.iter().enumerate() {
                let out = generate(
                    &mut model,
                    prompt,
                    &SamplingConfig::greedy(),
                    &stop,
                    &mut rng,
                    &mut |_| {},
                )
                .unwrap();
                model.reset();
                let sequence: Vec<u32> = prompt.iter().chain(&out.tokens).copied().collect();
                model.forward_tokens(&sequence, LogitRows::None).unwrap();
                let last = prompt.len() - 1;
                let hidden = model
                    .last_hidden()
                    .unwrap()
                    .narrow(0, last, out.tokens.len())
                    .unwrap();
                data.push(hidden, out.tokens.clone(), group as u32).unwrap();
                greedy.push(out.tokens);
            }
            for kind in [HeadKind::latent(), HeadKind::Chained] {
                let mut config = TrainConfig::new(kind, 3);
                config.epochs = 30;
                config.learning_rate = 0.01;
                config.batch_size = 64;
                let vocab: Vec<u32> = (0..96).collect();
                let trained = train(
                    &data,
                    &model.unembedding_rows(&vocab).unwrap(),
                    &config,
                    &mut |_| {},
                )
                .unwrap();
                let heads_dir = tempfile::tempdir().unwrap();
                let fingerprint = weights_fingerprint(&path).unwrap();
                trained
                    .save(heads_dir.path(), "tiny", &fingerprint, "test")
                    .unwrap();
                let heads =
                    MultiTokenHeads::load(heads_dir.path(), &model, &fingerprint, &Device::Cpu)
                        .unwrap();
                let state = model.last_hidden().unwrap().narrow(0, 0, 1).unwrap();
                if heads.reads_guesses() {
                    // Chained heads are asked one at a time, after a token.
                    assert!(heads.predict(&state, 0..1).is_err());
                    let (first, next) = heads.predict_after(&state, 0, 5).unwrap();
                    assert_eq!((first.len(), first.vocab_size()), (1, 96));
                    assert_eq!(next.dims(), [1, 64]);
                    assert!(heads.predict_after(&next, 3, 5).is_err());
                } else {
                    // One head at a time (as a gated drafter asks) gives the rows of all at once.
                    let together = heads.predict(&state, 0..3).unwrap();
                    for k in 0..3 {
                        let alone = heads.predict(&state, k..k + 1).unwrap();
                        assert_eq!(alone.row(0), together.row(k), "{family:?} head {k}");
                    }
                    assert!(heads.predict(&state, 2..4).is_err());
                }
                let mut accepted = 0;
                let drafters = [
                    HeadsDrafter::new(&heads, HeadsTree::chain(3)).unwrap(),
                    HeadsDrafter::new(&heads, HeadsTree::branching(3, 2)).unwrap(),
                    HeadsDrafter::new(&heads, HeadsTree::chain(3))
                        .unwrap()
                        .with_min_probability(0.3)
                        .unwrap(),
                ];
                for drafter in drafters {
                    // The last run also merges lookup chains copied from the prompt and answer.
                    for (rows, lookup) in [
                        (Verification::Batched, false),
                        (Verification::OnDemand, false),
                        (Verification::Batched, true),
                    ] {
                        for (prompt, expected) in prompts.iter().zip(&greedy) {
                            model.reset();
                            let copies = LookupDrafter::new(LookupConfig::default()).unwrap();
                            let mut drafting = MergedDrafter {
                                first: &drafter,
                                second: lookup.then_some(copies),
                            };
                            let rule = AcceptanceRule::greedy();
                            let out = speculate(
                                &mut model,
                                &mut drafting,
                                prompt,
                                Speculation::new(&rule).verified(rows),
                                &stop,
                                &mut |_| {},
                            )
                            .unwrap();
                            assert_eq!(
                                &out.tokens, expected,
                                "{family:?} {kind:?} {rows:?} lookup {lookup}"
                            );
                            accepted += out.stats.accepted_tokens();
                        }
                    }
                }
                assert!(
                    accepted > 0,
                    "{family:?} {kind:?}: the heads never guessed right"
                );
            }
        }
    }
}

/// The chat API's heads speculation, and its self-distilled data.
mod chat_api {
    use engine_llm::testing::tiny_chat_model;
    use engine_llm::{Error, GenerateOptions, Message, Speculation};
    use spec_core::{Decoder, HeadsDrafter, HeadsTree};
    use spec_train::heads::SelfDistill;
    use spec_train::testing::tiny_heads;

    use super::common::chat::{question, streamed};

    #[test]
    fn heads_speculation_gives_the_greedy_tokens() {
        let scratch = tempfile::tempdir().unwrap();
        let mut model = tiny_chat_model(4).unwrap();
        let plain = model
            .chat(&question(), &GenerateOptions::default().max_tokens(40))
            .unwrap();
        let heads_mode = |lookup| {
            GenerateOptions::default()
                .max_tokens(40)
                .speculation(Speculation::Heads { lookup })
        };
        assert!(matches!(
            model.chat(&question(), &heads_mode(0)),
            Err(Error::Config(_))
        ));
        let heads = tiny_heads(&mut model, scratch.path()).unwrap();
        model
            .set_heads(HeadsDrafter::new(heads, HeadsTree::chain(3)).unwrap())
            .unwrap();
        for lookup in [0, 2, 8] {
            let (fast, deltas) = streamed(&mut model, &question(), &heads_mode(lookup));
            assert_eq!(fast.tokens, plain.tokens, "lookup {lookup}");
            assert_eq!(fast.text, plain.text);
            assert_eq!(deltas.concat(), fast.text);
            assert!(fast.stats.draft_forwards > 0);
        }
        // Heads decode greedily only, without a repetition penalty.
        for refused in [
            heads_mode(2).temperature(0.8),
            heads_mode(2).repetition_penalty(1.3),
        ] {
            assert!(matches!(
                model.chat(&question(), &refused),
                Err(Error::Config(_))
            ));
        }
        assert!(model.take_heads().is_some());
        assert!(model.take_heads().is_none());
    }

    #[test]
    fn self_distilled_data_holds_the_greedy_answers_in_any_lockstep() {
        let mut model = tiny_chat_model(3).unwrap();
        let prompts = [
            "Tell me a story about a cat.",
            "Why?",
            "Name a colour, please.",
        ];
        let options = GenerateOptions::default().max_tokens(12);
        let answered: usize = prompts
            .iter()
            .map(|prompt| {
                model.model.reset();
                let answer = model.chat(&[Message::user(*prompt)], &options).unwrap();
                answer.tokens.len()
            })
            .sum();
        for lockstep in [1, 2, 3] {
            let mut batches = Vec::new();
            let data = model
                .self_distilled(&prompts, 12, lockstep, &mut |done, positions| {
                    batches.push((done, positions));
                })
                .unwrap();
            assert_eq!(data.positions(), answered, "lockstep {lockstep}");
            assert_eq!(batches.len(), prompts.len().div_ceil(lockstep));
            assert_eq!(batches.last(), Some(&(prompts.len(), answered)));
        }
        assert!(matches!(
            model.self_distilled(&prompts, 12, 0, &mut |_, _| {}),
            Err(Error::Config(_))
        ));
    }
}

/// PredGen with every continuation, the heads attached.
mod predgen {
    use engine_llm::predgen::spoken_at_rate;
    use engine_llm::{Continuation, PredGen, Verifier};
    use spec_core::{HeadsDrafter, HeadsTree};
    use spec_train::testing::tiny_heads;

    use super::common::predgen::{config, corrected_inputs, run_turns, tiny_chat_model};

    #[test]
    fn greedy_predgen_answers_exactly_as_the_plain_cascade() {
        let scratch = tempfile::tempdir().unwrap();
        let turns = vec![
            corrected_inputs("what is 1 + 23?"),
            spoken_at_rate("and what is it times four, roughly?", 600.0).unwrap(),
        ];
        let mut reference_model = tiny_chat_model(scratch.path(), 9);
        let cfg = |continuation| config(Verifier::Greedy, continuation);
        let mut reference =
            PredGen::new(&mut reference_model, cfg(Continuation::Autoregressive)).unwrap();
        let expected = run_turns(&mut reference, &turns, true);
        assert!(
            expected.iter().all(|t| t.turn.answer.len() > 10),
            "{expected:?}"
        );

        let mut draft = tiny_chat_model(scratch.path(), 2);
        for continuation in [
            Continuation::Autoregressive,
            Continuation::Jacobi { window: 4 },
            Continuation::DraftModel { gamma: 3 },
            Continuation::Lookup { max_draft: 4 },
            Continuation::Heads,
        ] {
            let mut model = tiny_chat_model(scratch.path(), 9);
            let heads_dir = scratch.path().join("heads");
            let heads = tiny_heads(&mut model, &heads_dir).unwrap();
            let drafter = HeadsDrafter::new(heads, HeadsTree::chain(3)).unwrap();
            let mut session = PredGen::new(&mut model, cfg(continuation))
                .unwrap()
                .with_draft(&mut draft)
                .unwrap()
                .with_heads(drafter)
                .unwrap();
            let got = run_turns(&mut session, &turns, false);
            for (turn, (got, expected)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(
                    got.turn.answer, expected.turn.answer,
                    "{continuation:?}, turn {turn}"
                );
                assert_eq!(got.turn.first_sentence, expected.turn.first_sentence);
                assert!(
                    got.turn.tokens_during_input > 0,
                    "{continuation:?}: no speculation"
                );
                assert!(got.turn.forwards_to_first_sentence >= 1);
                assert!(got.audio_latency() >= got.turn.time_to_first_words);
                assert!(got.turn.answer_latency >= got.turn.time_to_first_sentence);
                assert!(got.turn.timeline.windows(2).all(|w| w[0].at <= w[1].at));
            }
        }
    }
}

/// Whisper's windows with heads, on the tiny random-weight Whisper of `engine_asr::testing`.
mod whisper_random {
    use candle_core::Device;
    use engine_asr::testing::*;
    use engine_asr::whisper::decode::{
        heads_window, run_prompt, sample_window, speculative_window,
    };
    use engine_asr::whisper::model_fingerprint;
    use engine_asr::{LoadOptions, TranscribeOptions, Transcriber};
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use spec_core::{
        AcceptanceRule, DraftInput, HeadsDrafter, HeadsTree, HiddenStates, Logits, TokenHeads,
        TreeDraft, TreeDrafter, Verification,
    };

    /// A drafter that reads the hidden state, from a closure that looks at each request.
    struct Looking<F>(F);

    impl<F: FnMut(DraftInput<'_>) -> spec_core::Result<TreeDraft>> TreeDrafter for Looking<F> {
        fn draft_tree(&mut self, input: DraftInput<'_>) -> spec_core::Result<TreeDraft> {
            (self.0)(input)
        }
        fn reads_hidden(&self) -> bool {
            true
        }
        fn finish(&mut self, _: &[u32]) -> spec_core::Result<()> {
            Ok(())
        }
    }
    use spec_nn::heads::{HeadKind, MultiTokenHeads};
    use spec_train::heads::{train, TrainConfig, TrainingSet};

    #[test]
    fn decoding_with_heads_equals_greedy_decoding() {
        let dir = tempfile::tempdir().unwrap();
        write_hf(dir.path(), 31).unwrap();
        let mut transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
        let recordings: Vec<Vec<f32>> = [0.6, 0.9, 1.2, 1.5, 1.9]
            .iter()
            .map(|&s| tones(s, 220.0))
            .collect();
        // Heads trained on the model's own greedy outputs for these recordings.
        let mut data = TrainingSet::new(HIDDEN);
        for (i, samples) in recordings.iter().enumerate() {
            let (hidden, next) = transcriber
                .self_distill(samples, &greedy_options())
                .unwrap()
                .expect("the random model always says something");
            data.push(hidden, next, i as u32).unwrap();
        }
        for kind in [HeadKind::latent(), HeadKind::Chained] {
            let mut config = TrainConfig::new(kind, 3);
            config.epochs = 40;
            config.learning_rate = 0.01;
            config.batch_size = 64;
            let vocab: Vec<u32> = (0..VOCAB as u32).collect();
            let unembedding = transcriber.model().unembedding_rows(&vocab).unwrap();
            let trained = train(&data, &unembedding, &config, &mut |_| {}).unwrap();
            let heads_dir = tempfile::tempdir().unwrap();
            let fingerprint = model_fingerprint(dir.path()).unwrap();
            trained
                .save(heads_dir.path(), "random", &fingerprint, "test")
                .unwrap();
            let heads = MultiTokenHeads::load(
                heads_dir.path(),
                transcriber.model(),
                &fingerprint,
                &Device::Cpu,
            )
            .unwrap();

            let mut accepted = 0;
            for timestamps in [false, true] {
                let plain = TranscribeOptions {
                    timestamps,
                    ..greedy_options()
                };
                let with_heads = TranscribeOptions {
                    heads: Some(AcceptanceRule::greedy()),
                    ..plain.clone()
                };
                for (tree, min_probability) in [
                    (HeadsTree::chain(3), 0.0),
                    (HeadsTree::branching(3, 2), 0.0),
                    (HeadsTree::chain(3), 0.5),
                    // Latent heads' chain of one guesses in the verifying pass's output rows.
                    (HeadsTree::chain(1), 0.0),
                    (HeadsTree::chain(1), 0.5),
                ] {
                    let drafter = HeadsDrafter::new(heads.clone(), tree)
                        .unwrap()
                        .with_min_probability(min_probability)
                        .unwrap();
                    transcriber.set_heads(drafter).unwrap();
                    for (i, samples) in recordings.iter().enumerate() {
                        let greedy = transcriber.transcribe(samples, &plain).unwrap();
                        let fast = transcriber.transcribe(samples, &with_heads).unwrap();
                        assert_eq!(fast.segments, greedy.segments, "{kind:?} recording {i}");
                        assert!(fast.stats.forwards <= greedy.stats.forwards);
                        accepted += fast.stats.heads.accepted_tokens();
                    }
                }
            }
            assert!(accepted > 0, "{kind:?}: the heads never guessed right");
            if kind == HeadKind::latent() {
                guesses_in_the_output_pass_are_the_heads_own(dir.path(), &mut transcriber, &heads);
            }
        }
    }

    /// A chain of one of latent heads drafts from the rows the verification's output pass computed
    /// for the heads: the same trees, steps and candidates as the heads' own pass gives.
    fn guesses_in_the_output_pass_are_the_heads_own(
        dir: &std::path::Path,
        transcriber: &mut Transcriber,
        heads: &MultiTokenHeads,
    ) {
        assert!(heads.shares_output_layer());
        let (_, rules) = logit_rules(dir, false).unwrap();
        let drafter = HeadsDrafter::new(heads, HeadsTree::chain(1)).unwrap();
        let prompt = [START_OF_TRANSCRIPT, NO_TIMESTAMPS];
        let greedy = AcceptanceRule::greedy();
        let (mut accepted, mut checked, mut later_steps) = (0, 0, 0);
        for seed in 0..4 {
            let model = transcriber.model();
            model.encode(&mel(160, seed).unwrap()).unwrap();
            let (_, next) = run_prompt(model, &prompt, 0, NO_TIMESTAMPS - 1).unwrap();
            let plain = sample_window(
                model,
                &rules,
                next.clone(),
                END_OF_TEXT,
                24,
                0.0,
                &mut StdRng::seed_from_u64(0),
            )
            .unwrap();
            run_prompt(model, &prompt, 0, NO_TIMESTAMPS - 1).unwrap();
            let (guessing, guessing_steps) = heads_window(
                model,
                &rules,
                &drafter,
                &greedy,
                next.clone(),
                END_OF_TEXT,
                24,
            )
            .unwrap();
            // Each step's rows from the output pass are the heads' own for the state drafted from.
            run_prompt(model, &prompt, 0, NO_TIMESTAMPS - 1).unwrap();
            let mut checking = Looking(|request: DraftInput<'_>| {
                let sampled = request.produced();
                let root = request.root()?;
                let hidden = request.hidden.unwrap();
                let adjust = &mut |_, row: &mut [f32]| rules.apply(row, sampled);
                let tree = match request.guessed {
                    Some(rows) => {
                        let own = heads.predict(hidden, 0..1).unwrap();
                        let bits =
                            |l: &Logits| l.row(0).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&rows), bits(&own), "window {seed}");
                        checked += 1;
                        drafter.draft_predicted(rows, root, request.max_depth, adjust)?
                    }
                    None => drafter.draft(hidden, root, request.max_depth, adjust)?,
                };
                Ok(TreeDraft::new(tree, 1))
            });
            let guesses = Verification::WithGuesses { heads, guesses: 1 };
            let (checked_run, _) = speculative_window(
                model,
                &rules,
                &mut checking,
                &greedy,
                guesses,
                &prompt,
                Some(next.clone()),
                END_OF_TEXT,
                24,
            )
            .unwrap();
            assert_eq!(checked_run, guessing, "window {seed}");
            run_prompt(model, &prompt, 0, NO_TIMESTAMPS - 1).unwrap();
            let mut own_pass = Looking(|request: DraftInput<'_>| {
                assert!(request.guessed.is_none());
                let sampled = request.produced();
                let root = request.root()?;
                let hidden = request.hidden.unwrap();
                let tree = drafter.draft(hidden, root, request.max_depth, &mut |_, row| {
                    rules.apply(row, sampled);
                })?;
                Ok(TreeDraft::new(tree, 1))
            });
            let (own, own_steps) = speculative_window(
                model,
                &rules,
                &mut own_pass,
                &greedy,
                Verification::OnDemand,
                &prompt,
                Some(next),
                END_OF_TEXT,
                24,
            )
            .unwrap();
            assert_eq!(guessing.tokens, plain.tokens, "window {seed}");
            assert_eq!(guessing, own, "window {seed}");
            assert_eq!(guessing_steps.steps, own_steps.steps, "window {seed}");
            accepted += guessing_steps.accepted_tokens();
            later_steps += guessing_steps.steps.len().saturating_sub(1);
        }
        assert!(accepted > 0, "the heads never guessed right");
        assert_eq!(
            checked, later_steps,
            "every step after the first drafts from the output pass"
        );
    }
}
