use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::heads::TokenHeads;
use spec_core::mock::{MockConfig, MockDecoder};
use spec_nn::heads::{HeadKind, MultiTokenHeads, HEADS_WEIGHTS};
use spec_nn::{Error, Result};

use super::*;

/// A tiny synthetic task: hidden states are one-hot codes of a token, and the "model" says
/// the tokens of a fixed cycle, so the token k + 1 ahead is a function of the state.
fn cycle_task(vocab: usize, sequences: usize, len: usize) -> (TrainingSet, Tensor) {
    let hidden_size = vocab;
    let unembedding = (Tensor::eye(vocab, DType::F32, &Device::Cpu).unwrap() * 4.0).unwrap();
    let mut set = TrainingSet::new(hidden_size);
    for s in 0..sequences {
        let tokens: Vec<u32> = (0..len).map(|i| ((s + 3 * i) % vocab) as u32).collect();
        // The state at position i "is" token tokens[i]; the model's next token follows it.
        let hidden = one_hot(&tokens, vocab);
        let next: Vec<u32> = tokens.iter().map(|&t| (t + 3) % vocab as u32).collect();
        set.push(hidden, next, s as u32).unwrap();
    }
    (set, unembedding)
}

/// Two heads trained briskly on a tiny task.
fn small_task_config(kind: HeadKind) -> TrainConfig {
    let mut config = TrainConfig::new(kind, 2);
    config.epochs = 30;
    config.batch_size = 32;
    config.learning_rate = 0.05;
    config
}

/// The epoch reports of a training run, checked to be the same when trained again.
fn trained_twice(
    data: &TrainingSet,
    unembedding: &Tensor,
    config: &TrainConfig,
) -> Vec<EpochReport> {
    let first = train(data, unembedding, config, &mut |_| {}).unwrap();
    let again = train(data, unembedding, config, &mut |_| {}).unwrap();
    assert_eq!(first.reports, again.reports, "same seed, same run");
    first.reports
}

#[test]
fn training_lowers_the_loss_and_is_reproducible() {
    let (data, unembedding) = cycle_task(16, 12, 20);
    for kind in [HeadKind::latent(), HeadKind::Projection, HeadKind::Chained] {
        let reports = trained_twice(&data, &unembedding, &small_task_config(kind));
        let (start, end) = (&reports[0], reports.last().unwrap());
        assert!(
            end.validation_loss < 0.5 * start.validation_loss,
            "{kind:?}: {start:?} → {end:?}"
        );
        assert!(end.validation_accuracy.iter().all(|&a| a > 0.95), "{end:?}");
    }
}

/// `[tokens, vocab]`: each token's one-hot code.
fn one_hot(tokens: &[u32], vocab: usize) -> Tensor {
    let rows: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| (0..vocab).map(move |j| if j == t as usize { 1.0 } else { 0.0 }))
        .collect();
    Tensor::from_vec(rows, (tokens.len(), vocab), &Device::Cpu).unwrap()
}

/// A cycle task whose states are the model's own: the state at position i is the one-hot
/// code of the token it predicts, so the unembedding of a target's state gives the target.
fn self_consistent_cycle_task(vocab: usize, sequences: usize, len: usize) -> TrainingSet {
    let mut set = TrainingSet::new(vocab);
    for s in 0..sequences {
        let next: Vec<u32> = (0..len).map(|i| ((s + 3 * i) % vocab) as u32).collect();
        set.push(one_hot(&next, vocab), next, s as u32).unwrap();
    }
    set
}

#[test]
fn feature_and_soft_target_losses_train_and_are_reproducible() {
    let data = self_consistent_cycle_task(16, 12, 20);
    let unembedding = (Tensor::eye(16, DType::F32, &Device::Cpu).unwrap() * 4.0).unwrap();
    for kind in [HeadKind::latent(), HeadKind::Chained] {
        for (feature_weight, soft_targets) in [(1.0, false), (0.0, true), (1.0, true)] {
            let mut config = small_task_config(kind);
            config.feature_weight = feature_weight;
            config.soft_targets = soft_targets;
            let reports = trained_twice(&data, &unembedding, &config);
            // Soft targets keep the model's own uncertainty (its peak token at 78 % here), so
            // the training loss, not the validation's cross-entropy to the token, must fall.
            let (start, end) = (&reports[0], reports.last().unwrap());
            assert!(
                end.train_loss < 0.75 * start.train_loss,
                "{kind:?} {feature_weight} {soft_targets}: {start:?} → {end:?}"
            );
            assert!(end.validation_accuracy.iter().all(|&a| a > 0.95), "{end:?}");
        }
    }
}

#[test]
fn appended_sets_keep_their_groups_apart() {
    let mut first = self_consistent_cycle_task(8, 3, 5);
    first.append(self_consistent_cycle_task(8, 2, 4)).unwrap();
    assert_eq!(first.len(), 5);
    assert_eq!(first.positions(), 3 * 5 + 2 * 4);
    let groups: Vec<u32> = first.sequences.iter().map(|s| s.group).collect();
    assert_eq!(groups, [0, 1, 2, 3, 4]);
    let error = first
        .append(self_consistent_cycle_task(6, 1, 4))
        .unwrap_err()
        .to_string();
    assert!(error.contains("8 and 6 wide"), "{error}");
}

#[test]
fn sets_are_cached_per_file_and_joined() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = [
        ("a.txt", "one\n\n two \nthree\n"),
        ("b.txt", "four\nfive\n"),
    ]
    .iter()
    .map(|(name, text)| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    })
    .collect();
    let cache_path = |fingerprint: &str, used: &str| {
        dir.path()
            .join(format!("set-{fingerprint}-{used}.safetensors"))
    };
    // Each line becomes a sequence of as many positions as it has characters.
    let built = std::cell::RefCell::new(Vec::new());
    let build = |lines: &[String], _: &Path| -> Result<TrainingSet> {
        built.borrow_mut().push(lines.to_vec());
        let mut set = TrainingSet::new(4);
        for (i, line) in lines.iter().enumerate() {
            set.push(
                Tensor::zeros((line.len(), 4), DType::F32, &Device::Cpu)?,
                vec![0; line.len()],
                i as u32,
            )?;
        }
        Ok(set)
    };
    let joined = TrainingSet::cached_per_file(&files, None, false, cache_path, build).unwrap();
    assert_eq!(joined.len(), 5);
    assert_eq!(joined.positions(), 3 + 3 + 5 + 4 + 4);
    let groups: Vec<u32> = joined.sequences.iter().map(|s| s.group).collect();
    assert_eq!(groups, [0, 1, 2, 3, 4]);
    assert_eq!(
        built.take(),
        [vec!["one", "two", "three"], vec!["four", "five"]]
    );

    // Cached: nothing is built again; a limit cuts the second file and caches that apart.
    let limited = TrainingSet::cached_per_file(&files, Some(4), false, cache_path, build).unwrap();
    assert_eq!(limited.len(), 4);
    assert_eq!(built.take(), [vec!["four"]]);

    std::fs::write(&files[1], "\n  \n").unwrap();
    let error = TrainingSet::cached_per_file(&files, None, false, cache_path, build)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("b.txt holds no lines"), "{error}");
}

#[test]
fn a_feature_loss_is_refused_for_projection_heads_and_bad_weights() {
    let data = self_consistent_cycle_task(16, 4, 8);
    let unembedding = Tensor::eye(16, DType::F32, &Device::Cpu).unwrap();
    let mut config = TrainConfig::new(HeadKind::Projection, 1);
    config.feature_weight = 1.0;
    let error = train(&data, &unembedding, &config, &mut |_| {})
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("projection heads have no state"), "{error}");
    for weight in [-1.0, f32::NAN] {
        let mut config = TrainConfig::new(HeadKind::Chained, 1);
        config.feature_weight = weight;
        let error = train(&data, &unembedding, &config, &mut |_| {})
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("finite and not negative"), "{error}");
    }
}

#[test]
fn loss_weights_must_be_finite_and_positive() {
    let data = self_consistent_cycle_task(16, 4, 8);
    let unembedding = Tensor::eye(16, DType::F32, &Device::Cpu).unwrap();
    for weights in [vec![0.2, 0.0], vec![0.2, -0.1], vec![f32::NAN, 0.2]] {
        let mut config = TrainConfig::new(HeadKind::Chained, 2);
        config.loss_weights = weights;
        let error = train(&data, &unembedding, &config, &mut |_| {})
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("finite and positive"), "{error}");
    }
    let mut config = TrainConfig::new(HeadKind::Chained, 2);
    config.epochs = 1;
    config.loss_weights = vec![0.2, 0.05];
    assert!(train(&data, &unembedding, &config, &mut |_| {}).is_ok());
}

/// The model's next token is a coin toss its state does not tell, and the token after it
/// follows from that one: only heads that read the next token can guess the one after.
#[test]
fn chained_heads_learn_what_follows_the_token_they_read() {
    let vocab = 16;
    let mut rng = StdRng::seed_from_u64(7);
    let mut set = TrainingSet::new(vocab);
    for s in 0..24u32 {
        // Tokens alternate: a random one, then (it + 5) mod 16.
        let tokens: Vec<u32> = (0..21)
            .scan(0u32, |last, i| {
                *last = match i % 2 {
                    0 => rand::Rng::random_range(&mut rng, 0..vocab as u32),
                    _ => (*last + 5) % vocab as u32,
                };
                Some(*last)
            })
            .collect();
        let rows: Vec<f32> = tokens[..20]
            .iter()
            .flat_map(|&t| (0..vocab).map(move |j| if j == t as usize { 1.0 } else { 0.0 }))
            .collect();
        let hidden = Tensor::from_vec(rows, (20, vocab), &Device::Cpu).unwrap();
        set.push(hidden, tokens[1..].to_vec(), s).unwrap();
    }
    let unembedding = (Tensor::eye(vocab, DType::F32, &Device::Cpu).unwrap() * 4.0).unwrap();
    let first_head = |kind: HeadKind| {
        let mut config = TrainConfig::new(kind, 1);
        config.epochs = 40;
        config.batch_size = 32;
        config.learning_rate = 0.05;
        config.validation_fraction = 0.25;
        let trained = train(&set, &unembedding, &config, &mut |_| {}).unwrap();
        trained.reports.last().unwrap().validation_accuracy[0]
    };
    // 9 of every 19 positions are followed by a random token and then its follower: a head
    // that reads the random token can be right there; one that does not, one time in 16.
    let chained = first_head(HeadKind::Chained);
    let latent = first_head(HeadKind::latent());
    assert!(chained > 0.3, "chained {chained}, latent {latent}");
    assert!(latent < 0.15, "chained {chained}, latent {latent}");
}

#[test]
fn saved_heads_load_only_for_their_model() {
    let (data, unembedding) = cycle_task(8, 4, 10);
    let mut config = TrainConfig::new(HeadKind::Projection, 2);
    config.epochs = 1;
    let trained = train(&data, &unembedding, &config, &mut |_| {}).unwrap();
    let dir = tempfile::tempdir().unwrap();
    trained.save(dir.path(), "tiny", "abc123", "test").unwrap();
    // A stand-in model with 8-wide hidden states over 8 tokens.
    let model = MockDecoder::new(MockConfig {
        window: 7,
        ..MockConfig::target(8, 1)
    });
    let heads = MultiTokenHeads::load(dir.path(), &model, "abc123", &Device::Cpu).unwrap();
    assert_eq!(heads.count(), 2);
    assert_eq!(heads.info().trained_for.base_model, "tiny");
    let guesses = heads
        .predict(
            &Tensor::zeros((1, 8), DType::F32, &Device::Cpu).unwrap(),
            0..2,
        )
        .unwrap();
    assert_eq!((guesses.len(), guesses.vocab_size()), (2, 8));
    let err = MultiTokenHeads::load(dir.path(), &model, "fff", &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("trained for `tiny`"), "{err}");
    let wider = MockDecoder::new(MockConfig::target(8, 1));
    assert!(MultiTokenHeads::load(dir.path(), &wider, "abc123", &Device::Cpu).is_err());
    // A shortlist out of order (chained heads find a token's row by binary search).
    let weights = dir.path().join(HEADS_WEIGHTS);
    let mut tensors = candle_core::safetensors::load(&weights, &Device::Cpu).unwrap();
    let mut shortlist: Vec<u32> = tensors["shortlist"].to_vec1().unwrap();
    shortlist.swap(0, 1);
    let n = shortlist.len();
    tensors.insert(
        "shortlist".into(),
        Tensor::from_vec(shortlist, n, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, &weights).unwrap();
    let err = MultiTokenHeads::load(dir.path(), &model, "abc123", &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("increasing order"), "{err}");
    std::fs::write(dir.path().join(HEADS_WEIGHTS), b"cut").unwrap();
    assert!(matches!(
        MultiTokenHeads::load(dir.path(), &model, "abc123", &Device::Cpu),
        Err(Error::BadWeights { .. })
    ));
}

#[test]
fn training_sets_round_trip_and_check_shapes() {
    let (data, _) = cycle_task(8, 3, 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("set.safetensors");
    data.save(&path).unwrap();
    let back = TrainingSet::load(&path).unwrap();
    assert_eq!((back.len(), back.positions()), (3, 15));
    let mut set = TrainingSet::new(8);
    let hidden = Tensor::zeros((4, 8), DType::F32, &Device::Cpu).unwrap();
    assert!(set.push(hidden, vec![1, 2], 0).is_err());
}

#[test]
fn a_named_variant_is_written_where_the_benchmarks_look() {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        training: crate::cli::TrainArgs,
    }
    let parse = |args: &[&str]| Cli::try_parse_from(["train"].iter().chain(args));
    assert!(parse(&["--variant", "quick", "--out", "/tmp/heads"]).is_err());
    let cli = parse(&["--kind", "chained", "--heads", "1", "--epochs", "1"]).unwrap();
    assert_eq!(cli.training.config().loss_weights, vec![0.2]);
    let weighted = parse(&["--heads", "3", "--loss-weights", "0.2,0.1,0.05"]).unwrap();
    assert_eq!(
        weighted.training.config().loss_weights,
        vec![0.2, 0.1, 0.05]
    );
    let named = parse(&[
        "--kind",
        "chained",
        "--heads",
        "1",
        "--epochs",
        "1",
        "--variant",
        "chained-1-quick",
    ])
    .unwrap();
    let (data, unembedding) = cycle_task(16, 4, 8);
    let root = tempfile::tempdir().unwrap();
    let save = |cli: &Cli| {
        cli.training
            .train_and_save(&data, &unembedding, root.path(), "m", "f")
            .unwrap()
    };
    assert_eq!(save(&cli), root.path().join("m-chained-1"));
    assert_eq!(save(&named), root.path().join("m-chained-1-quick"));
    assert!(root.path().join("m-chained-1-quick/heads.json").is_file());
}
