use proptest::prelude::*;
use rand::{rngs::StdRng, SeedableRng};

use super::*;
use crate::decoder::{forward_tokens, LogitRows};
use crate::draft::MergedDrafter;
use crate::generate::{generate, StopConditions};
use crate::lookup::{LookupConfig, LookupDrafter};
use crate::mock::{MockConfig, MockDecoder, MockHeads};
use crate::speculate::{speculate, Speculation};
use crate::verify::Verification;
use crate::AcceptanceRule;
use crate::SamplingConfig;

#[test]
fn tree_shapes_have_the_choices_they_promise() {
    let chain = HeadsTree::chain(3);
    assert_eq!(chain.nodes(), 3);
    assert_eq!(chain.widths(), [1, 1, 1]);
    let tree = HeadsTree::branching(3, 2);
    // Trunk 3, then runner-ups at depth 1 (followed twice), 2 (once) and 3.
    assert_eq!(tree.nodes(), 3 + 3 + 2 + 1);
    assert_eq!(tree.widths(), [2, 2, 2]);
    assert!(HeadsTree::choices(tree.choices.clone()).is_ok());
    assert!(HeadsTree::choices(vec![vec![0, 1]]).is_err(), "no parent");
}

#[test]
fn choices_at_the_largest_indices_neither_overflow_nor_truncate() {
    let deepest = vec![vec![MAX_CANDIDATE_INDEX], vec![MAX_CANDIDATE_INDEX, 0]];
    let tree = HeadsTree::choices(deepest).unwrap();
    assert_eq!(tree.widths(), [MAX_CANDIDATE_INDEX + 1, 1]);
    for impossible in [MAX_CANDIDATE_INDEX + 1, usize::MAX] {
        assert!(matches!(
            HeadsTree::choices(vec![vec![0], vec![0, impossible]]),
            Err(Error::InvalidTree(_))
        ));
    }
    // Sparse indices keep the shape checks: a missing parent, a repeated choice.
    assert!(HeadsTree::choices(vec![vec![5], vec![7, 0]]).is_err());
    assert!(HeadsTree::choices(vec![vec![5], vec![5]]).is_err());
    assert!(HeadsTree::choices(vec![vec![5], vec![9], vec![9, 3]]).is_ok());
}

#[test]
fn a_tree_deeper_than_the_heads_is_refused() {
    let heads = MockHeads::new(MockConfig::target(32, 1).draft(0.5, 2), 2);
    assert!(HeadsDrafter::new(&heads, HeadsTree::chain(3)).is_err());
    assert!(HeadsDrafter::new(&heads, HeadsTree::chain(2)).is_ok());
}

#[test]
fn perfect_heads_accept_every_guess() {
    let config = MockConfig::target(48, 4);
    let heads = MockHeads::new(config.clone(), 3);
    let drafter = HeadsDrafter::new(&heads, HeadsTree::chain(3)).unwrap();
    let mut target = MockDecoder::new(config);
    let stop = StopConditions::new(40);
    let greedy = AcceptanceRule::greedy();
    let out = speculate(
        &mut target,
        &mut &drafter,
        &[1, 2, 3],
        Speculation::new(&greedy).verified(Verification::OnDemand),
        &stop,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(out.tokens.len(), 40);
    // The prefill, then 4 tokens per forward.
    assert_eq!(out.stats.target_forwards, 1 + 39usize.div_ceil(4));
    assert!(out.stats.steps.iter().all(|s| s.accepted == s.drafted));
}

#[test]
fn guesses_from_the_output_pass_are_the_heads_own() {
    let config = MockConfig::target(48, 9);
    let shortlist: Vec<u32> = (0..48).step_by(2).collect();
    // Heads that guess as the target decodes (the whole chain is accepted, so the guesses
    // come from the state of its last node), and unsure ones over a shortlist.
    let cases = [
        (
            MockHeads::sharing_output(config.clone(), config.clone(), 3),
            true,
        ),
        (
            MockHeads::sharing_output(config.clone(), config.draft(1.0, 3), 3)
                .with_shortlist(shortlist),
            false,
        ),
    ];
    for (heads, perfect) in &cases {
        let drafter = HeadsDrafter::new(heads, HeadsTree::branching(2, 2)).unwrap();
        let mut target = MockDecoder::new(config.clone());
        let prompt = forward_tokens(&mut target, &[1, 2, 3, 4], LogitRows::Last(1)).unwrap();
        let root = argmax(prompt.row(0));
        let state = target.last_hidden().unwrap().narrow(0, 3, 1).unwrap();
        let tree = drafter.draft(&state, root, 8, &mut |_, _| {}).unwrap();
        let verified = Verification::WithGuesses { heads, guesses: 3 }
            .verify(
                &mut target,
                &tree,
                &AcceptanceRule::greedy(),
                &mut |_, _| {},
                true,
            )
            .unwrap();
        let (verdict, hidden) = (verified.verdict, verified.hidden.unwrap());
        let guessed = verified.guessed.unwrap();
        assert_eq!(*perfect, verdict.path.len() == 3, "{:?}", verdict.path);
        let own = heads.predict(&hidden, 0..3).unwrap();
        assert_eq!(guessed.len(), 3);
        for k in 0..3 {
            let bits = |row: &[f32]| row.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(guessed.row(k)), bits(own.row(k)), "head {k}");
        }
        assert_eq!(
            !perfect,
            guessed.row(0)[1].is_infinite(),
            "odd tokens are off the shortlist"
        );
        // The next tree from the computed rows is the tree the heads would draft themselves.
        let next = verdict.next_token;
        assert_eq!(
            drafter
                .draft_predicted(guessed, next, 8, &mut |_, _| {})
                .unwrap(),
            drafter.draft(&hidden, next, 8, &mut |_, _| {}).unwrap()
        );
    }
    // Heads with output layers of their own cannot.
    let own_output = MockHeads::new(config.draft(1.0, 3), 3);
    let mut target = MockDecoder::new(config);
    forward_tokens(&mut target, &[1, 2, 3, 4], LogitRows::Last(1)).unwrap();
    let refused = Verification::WithGuesses {
        heads: &own_output,
        guesses: 1,
    }
    .verify(
        &mut target,
        &TokenTree::linear(5, &[6]),
        &AcceptanceRule::greedy(),
        &mut |_, _| {},
        true,
    );
    assert!(matches!(refused, Err(Error::Unsupported(_))));
    assert_eq!(target.cached_len(), 4, "nothing was forwarded");
}

/// A companion that drafts the next three tokens of a known answer.
struct Knows(Vec<u32>);

impl TreeDrafter for Knows {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        let committed = input.committed;
        let next = self.0.get(committed.len()..).unwrap_or_default();
        let draft = &next[..next.len().min(input.max_depth).min(3)];
        Ok(TreeDraft::new(
            TokenTree::linear(*committed.last().unwrap(), draft),
            0,
        ))
    }

    fn finish(&mut self, _: &[u32]) -> Result<()> {
        Ok(())
    }
}

#[test]
fn a_companion_drafts_beside_the_heads_in_the_same_forward() {
    let config = MockConfig::target(48, 4);
    let context = [1, 2, 3];
    let stop = StopConditions::new(40);
    let mut rng = StdRng::seed_from_u64(0);
    let mut plain = MockDecoder::new(config.clone());
    let greedy = generate(
        &mut plain,
        &context,
        &SamplingConfig::greedy(),
        &stop,
        &mut rng,
        &mut |_| {},
    )
    .unwrap();
    // Heads that are almost always wrong, and a companion that knows the answer.
    let heads = MockHeads::new(config.draft(50.0, 9), 1);
    let drafter = HeadsDrafter::new(&heads, HeadsTree::chain(1)).unwrap();
    let mut answer = context.to_vec();
    answer.extend(&greedy.tokens);
    let greedy_rule = AcceptanceRule::greedy();
    let decode = |drafter: &mut dyn TreeDrafter| {
        let mut target = MockDecoder::new(config.clone());
        speculate(
            &mut target,
            drafter,
            &context,
            Speculation::new(&greedy_rule),
            &stop,
            &mut |_| {},
        )
        .unwrap()
    };
    let alone = decode(&mut &drafter);
    let together = decode(&mut MergedDrafter {
        first: &drafter,
        second: Knows(answer),
    });
    assert_eq!(alone.tokens, greedy.tokens);
    assert_eq!(together.tokens, greedy.tokens);
    // The prefill, then the companion's three tokens and the target's own per forward.
    assert_eq!(together.stats.target_forwards, 1 + 39usize.div_ceil(4));
    assert!(
        alone.stats.target_forwards > 30,
        "{:?}",
        alone.stats.target_forwards
    );
}

#[test]
fn heads_draft_only_the_depths_they_are_sure_of() {
    let config = MockConfig::target(48, 4);
    let heads = MockHeads::new(config.draft(0.3, 9), 3);
    let drafter = |p: f32| {
        HeadsDrafter::new(&heads, HeadsTree::branching(3, 2))
            .unwrap()
            .with_min_probability(p)
    };
    assert!(drafter(1.5).is_err());
    assert!(drafter(-0.1).is_err());
    assert!(drafter(f32::NAN).is_err());
    let mut target = MockDecoder::new(config);
    forward_tokens(&mut target, &[1, 2, 3], LogitRows::Last(1)).unwrap();
    let state = target.last_hidden().unwrap().narrow(0, 2, 1).unwrap();
    let guesses = heads.predict(&state, 0..3).unwrap();
    let sure: Vec<f32> = (0..3).map(|d| max_probability(guesses.row(d))).collect();
    for d in 0..3 {
        let alone = heads.predict(&state, d..d + 1).unwrap();
        assert_eq!(alone.row(0), guesses.row(d));
    }
    assert!(heads.predict(&state, 1..4).is_err());
    assert!(heads.predict(&state, 1..1).is_err());
    let depth_at = |p: f32| {
        let tree = drafter(p)
            .unwrap()
            .draft(&state, 5, 3, &mut |_, _| {})
            .unwrap();
        (0..tree.len()).map(|i| tree.depth(i)).max().unwrap()
    };
    assert_eq!(depth_at(0.0), 3);
    assert_eq!(depth_at(1.0), 0);
    // Just above the first head's probability: nothing drafted; at it: at least one depth.
    assert_eq!(depth_at(sure[0] + 1e-6), 0);
    let expected = sure.iter().take_while(|&&p| p >= sure[0]).count();
    assert_eq!(depth_at(sure[0]), expected);
    // Ungated depths are drafted however unsure; the gate applies from the next one.
    let ungated_depth_at = |p: f32, ungated: usize| {
        let tree = drafter(p)
            .unwrap()
            .with_ungated_depths(ungated)
            .draft(&state, 5, 3, &mut |_, _| {})
            .unwrap();
        (0..tree.len()).map(|i| tree.depth(i)).max().unwrap()
    };
    assert_eq!(ungated_depth_at(1.0, 1), 1);
    assert_eq!(ungated_depth_at(1.0, 2), 2);
    assert_eq!(ungated_depth_at(1.0, 5), 3);
    assert_eq!(ungated_depth_at(0.0, 1), 3);
    assert_eq!(ungated_depth_at(sure[1] + 1e-6, 1), 1);
    // A first head without a finite logit (all −∞, or a NaN) drafts nothing.
    for unsure in [f32::NEG_INFINITY, f32::NAN] {
        let tree = drafter(0.1)
            .unwrap()
            .draft(&state, 5, 3, &mut |d, row| {
                if d == 0 {
                    row.fill(unsure);
                }
            })
            .unwrap();
        assert_eq!(tree.len(), 1, "{unsure}");
    }
}

#[test]
fn chained_heads_read_the_guess_before_theirs() {
    let config = MockConfig::target(48, 4);
    let (independent, chained) = (
        MockHeads::new(config.draft(0.8, 3), 3),
        MockHeads::chained(config.draft(0.8, 3), 3),
    );
    let mut target = MockDecoder::new(config.clone());
    forward_tokens(&mut target, &[1, 2, 3], LogitRows::Last(1)).unwrap();
    let state = target.last_hidden().unwrap().narrow(0, 2, 1).unwrap();
    let draft = |heads: &MockHeads, root: u32| {
        let drafter = HeadsDrafter::new(heads, HeadsTree::chain(3)).unwrap();
        let tree = drafter.draft(&state, root, 3, &mut |_, _| {}).unwrap();
        (1..tree.len()).map(|i| tree.token(i)).collect::<Vec<u32>>()
    };
    // Each chained guess is the noisy model's greedy token after the root and the guesses
    // before it.
    let noisy = MockDecoder::new(config.draft(0.8, 3));
    for root in [5, 17, 30] {
        let guesses = draft(&chained, root);
        let mut visible = vec![1, 2, 3, root];
        for (k, &guess) in guesses.iter().enumerate() {
            assert_eq!(
                guess,
                argmax(&noisy.logits_for(&visible, 3 + k)),
                "{root} {k}"
            );
            visible.push(guess);
        }
    }
    // Independent heads guess the root themselves: the same guesses after any root.
    assert_eq!(draft(&independent, 5), draft(&independent, 30));
    assert!(chained.reads_guesses() && !independent.reads_guesses());
    assert!(chained.predict_after(&state, 3, 5).is_err());
}

#[test]
fn heads_of_another_width_are_refused() {
    let heads = MockHeads::new(
        MockConfig {
            window: 5,
            ..MockConfig::target(32, 1)
        },
        2,
    );
    let drafter = HeadsDrafter::new(&heads, HeadsTree::chain(2)).unwrap();
    let mut target = MockDecoder::new(MockConfig::target(32, 1));
    let greedy = AcceptanceRule::greedy();
    let err = speculate(
        &mut target,
        &mut &drafter,
        &[1],
        Speculation::new(&greedy),
        &StopConditions::new(4),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("width"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Greedy acceptance reproduces greedy decoding for any head count, tree shape, head
    /// quality, least drafting probability (from any depth) and context, with or without a
    /// lookup companion.
    #[test]
    fn greedy_heads_decoding_is_lossless(
        seed in 0u64..1000,
        heads in 1usize..5,
        width in 1usize..4,
        noise in 0.0f32..3.0,
        context in proptest::collection::vec(0u32..40, 1..6),
        max_new in 1usize..40,
        output in 0usize..3,
        chained: bool,
        min_probability in prop_oneof![Just(0.0f32), 0.0f32..1.0],
        ungated_depths in 0usize..3,
        lookup: bool,
    ) {
        let config = MockConfig::target(40, seed);
        let guesses = match (output, chained) {
            (2, _) => {
                MockHeads::sharing_output(config.clone(), config.draft(noise, seed + 1), heads)
                    .with_shortlist((0..40).filter(|t| t % 3 != seed as u32 % 3).collect())
            }
            (_, true) => MockHeads::chained(config.draft(noise, seed + 1), heads),
            (_, false) => MockHeads::new(config.draft(noise, seed + 1), heads),
        };
        let depth = 1 + seed as usize % heads;
        let drafter = HeadsDrafter::new(&guesses, HeadsTree::branching(depth, width))
            .unwrap()
            .with_min_probability(min_probability)
            .unwrap()
            .with_ungated_depths(ungated_depths);
        let stop = StopConditions::new(max_new).with_eos([7]);
        let mut target = MockDecoder::new(config.clone());
        // A lookup companion that copies from the context (and, with n-grams of one token,
        // often drafts a chain the heads disagree with).
        let mut copies = LookupDrafter::new(LookupConfig { max_ngram: 2, min_ngram: 1, max_draft: 3 }).unwrap();
        let verification = match output {
            0 => Verification::OnDemand,
            1 => Verification::Batched,
            _ => Verification::WithGuesses { heads: &guesses, guesses: depth },
        };
        let mut heads_only = &drafter;
        let mut with_copies = MergedDrafter { first: &drafter, second: &mut copies };
        let drafting: &mut dyn TreeDrafter = match lookup {
            true => &mut with_copies,
            false => &mut heads_only,
        };
        let greedy = AcceptanceRule::greedy();
        let fast = speculate(&mut target, drafting, &context, Speculation::new(&greedy).verified(verification), &stop, &mut |_| {}).unwrap();
        let mut plain = MockDecoder::new(config);
        let mut rng = StdRng::seed_from_u64(0);
        let slow = generate(&mut plain, &context, &SamplingConfig::greedy(), &stop, &mut rng, &mut |_| {}).unwrap();
        prop_assert_eq!(&fast.tokens, &slow.tokens);
        prop_assert_eq!(fast.finish, slow.finish);
        // The cache holds the context and every token but the last, as after `generate`.
        prop_assert_eq!(target.cached_tokens(), plain.cached_tokens());
    }
}
