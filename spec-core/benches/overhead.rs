//! Cost of spec-core's per-step bookkeeping at real model sizes, to compare with one forward
//! pass of a model (SmolLM2-135M: ~7 ms per token on the 2-core reference machine).
//!
//! Run with `cargo bench -p spec-core --bench overhead`.

use std::hint::black_box;

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spec_core::mock::{MockConfig, MockDecoder};
use spec_core::{
    speculative_generate, Acceptance, AcceptanceRule, DraftCheck, DraftLength, KvCache, Logits,
    SamplingConfig, SpeculativeConfig, StopConditions, TokenTree,
};

/// Qwen2.5's vocabulary, the largest the engines use.
const VOCAB: usize = 151_936;

fn random_rows(rows: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..rows)
        .map(|_| (0..VOCAB).map(|_| rng.random::<f32>() * 10.0).collect())
        .collect()
}

/// A 32-node sparse tree: an 8-deep trunk with three alternatives at every position.
fn sparse_tree() -> TokenTree {
    let candidates: Vec<Vec<u32>> = (0..8).map(|d| vec![d, 100 + d, 200 + d, 300 + d]).collect();
    TokenTree::from_candidates(7, &candidates).unwrap()
}

fn acceptance(c: &mut Criterion) {
    let rows = Logits::from_rows(&random_rows(9, 1)).unwrap();
    let first_five = Logits::from_rows(&random_rows(5, 1)).unwrap();
    let draft: Vec<u32> = rows
        .rows()
        .take(8)
        .map(spec_core::sampling::argmax)
        .collect();
    let greedy = AcceptanceRule::greedy();
    let sampling = SamplingConfig::greedy();
    c.bench_function("greedy verify, γ=8, Qwen vocab", |b| {
        b.iter(|| {
            let check = DraftCheck {
                draft: &draft,
                target_logits: &rows,
                draft_probs: &[],
                sampling: &sampling,
            };
            black_box(
                greedy
                    .verify(black_box(&check), &mut StdRng::seed_from_u64(0))
                    .unwrap(),
            )
        });
    });
    let sampled = SamplingConfig::with_temperature(0.8);
    let draft_rows = random_rows(4, 2);
    let draft_probs: Vec<Vec<f32>> = draft_rows
        .iter()
        .map(|r| sampled.probabilities(r).unwrap())
        .collect();
    let spec = AcceptanceRule::speculative_sampling(0.0);
    c.bench_function("speculative sampling verify, γ=4, Qwen vocab", |b| {
        let mut rng = StdRng::seed_from_u64(3);
        b.iter(|| {
            let check = DraftCheck {
                draft: &draft[..4],
                target_logits: &first_five,
                draft_probs: &draft_probs,
                sampling: &sampled,
            };
            black_box(spec.verify(&check, &mut rng).unwrap())
        });
    });
    let flat: Vec<f32> = random_rows(9, 1).concat();
    let logits = Tensor::from_vec(flat, (9, VOCAB), &Device::Cpu).unwrap();
    c.bench_function("logits tensor to rows, 9 × Qwen vocab", |b| {
        b.iter(|| black_box(Logits::from_tensor(&logits, 9, VOCAB).unwrap()));
    });
}

fn trees(c: &mut Criterion) {
    let tree = sparse_tree();
    c.bench_function("tree attention bias, 33 nodes after 1024 cached", |b| {
        b.iter(|| black_box(tree.attention_bias(1024, DType::F32, &Device::Cpu).unwrap()));
    });
    let predictions: Vec<u32> = (0..tree.len() as u32).map(|i| i % 8).collect();
    c.bench_function("longest accepted path, 33 nodes", |b| {
        b.iter(|| black_box(tree.longest_accepted_path(black_box(&predictions)).unwrap()));
    });
}

/// SmolLM2-135M's cache: 30 layers, 3 KV heads of 64, f32.
fn kv_cache(c: &mut Criterion) {
    let keys = Tensor::zeros((1, 3, 1024, 64), DType::F32, &Device::Cpu).unwrap();
    let step = Tensor::ones((1, 3, 5, 64), DType::F32, &Device::Cpu).unwrap();
    let filled = || {
        let mut cache = KvCache::new(30, 2048, 4096);
        for layer in 0..30 {
            cache.layer_mut(layer).append(&keys, &keys).unwrap();
        }
        cache
    };
    c.bench_function("KV append 5 tokens + rollback 4, 30 layers", |b| {
        b.iter_batched_ref(
            filled,
            |cache| {
                for layer in 0..30 {
                    cache.layer_mut(layer).append(&step, &step).unwrap();
                }
                cache.truncate(1025).unwrap();
            },
            BatchSize::LargeInput,
        );
    });
    c.bench_function("KV keep_positions of a 4-node path, 30 layers", |b| {
        b.iter_batched_ref(
            filled,
            |cache| cache.keep_positions(&[1000, 1003, 1009, 1020]).unwrap(),
            BatchSize::LargeInput,
        );
    });
}

/// The whole loop on a mock with a tiny vocabulary, where the "model" costs almost nothing:
/// what remains is the loop's own cost per generated token.
fn whole_loop(c: &mut Criterion) {
    let target = MockConfig::target(64, 1);
    let draft = target.draft(1.0, 2);
    let config = SpeculativeConfig {
        draft_length: DraftLength::Fixed(4),
        ..Default::default()
    };
    let stop = StopConditions::new(64);
    c.bench_function("speculative loop, 64 tokens, 64-token mock vocab", |b| {
        b.iter(|| {
            let mut t = MockDecoder::new(target.clone());
            let mut d = MockDecoder::new(draft.clone());
            let mut rng = StdRng::seed_from_u64(0);
            black_box(
                speculative_generate(
                    &mut t,
                    &mut d,
                    &[1, 2, 3],
                    &config,
                    &stop,
                    &mut rng,
                    &mut |_| {},
                )
                .unwrap(),
            )
        });
    });
}

criterion_group!(benches, acceptance, trees, kv_cache, whole_loop);
criterion_main!(benches);
