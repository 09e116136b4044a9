use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};

use super::*;
use crate::linear::QLinear;
use crate::rotary::{RopeLayout, Rotary};

/// One query's dot product with one key, lane by lane as row attention sums it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let l = lanes;
    (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) + tail
}

#[test]
fn interleaved_rows_and_keys_give_each_pair_its_own_dot_product() {
    for dim in [8, 61, 64, 128] {
        let vector = |seed: usize| -> Vec<f32> {
            (0..dim)
                .map(|i| (((i + 3) * (seed + 7) * 7919) % 211) as f32 / 37.0 - 2.8)
                .collect()
        };
        let keys: Vec<Vec<f32>> = (100..111).map(vector).collect();
        let queries: Vec<Vec<f32>> = (1..=SELF_ROW_BLOCK).map(vector).collect();
        let rows: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
        let expected: Vec<Vec<u32>> = rows
            .iter()
            .map(|q| keys.iter().map(|k| dot(q, k).to_bits()).collect())
            .collect();
        for rows_in_block in 1..=SELF_ROW_BLOCK {
            let mut scores = vec![0f32; rows_in_block * keys.len()];
            let key = |j: usize| keys[j].as_slice();
            all_scores(&rows[..rows_in_block], key, keys.len(), &mut scores);
            for (r, row) in scores.chunks(keys.len()).enumerate() {
                let bits: Vec<u32> = row.iter().map(|s| s.to_bits()).collect();
                assert_eq!(
                    bits, expected[r],
                    "dim {dim}, {rows_in_block} rows, row {r}"
                );
            }
        }
    }
}

const HIDDEN: usize = 64;

fn linear(rows: usize, cols: usize, bias: bool) -> Linear {
    linear_in(GgmlDType::Q8_0, rows, cols, bias)
}

fn linear_in(dtype: GgmlDType, rows: usize, cols: usize, bias: bool) -> Linear {
    let device = Device::Cpu;
    let w = Tensor::randn(0f32, 1.0 / (cols as f32).sqrt(), (rows, cols), &device).unwrap();
    let q = QTensor::quantize(&w, dtype).unwrap();
    let b = bias.then(|| Tensor::randn(0f32, 0.1, rows, &device).unwrap());
    Linear::new(QLinear::new(Arc::new(q), &device).unwrap(), b)
}

fn self_attention(heads: Heads) -> SelfAttention {
    let (q, kv) = (
        heads.heads * heads.head_dim,
        heads.kv_heads * heads.head_dim,
    );
    SelfAttention {
        q: linear(q, HIDDEN, true),
        k: linear(kv, HIDDEN, false),
        v: linear(kv, HIDDEN, true),
        o: linear(HIDDEN, q, true),
        heads,
    }
}

/// Rotary tables for head_dim 16 (eight frequencies, rotating halves).
fn test_rotary(device: &Device) -> Rotary {
    Rotary::new(
        vec![1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001, 0.0003],
        RopeLayout::Halves,
        device,
    )
    .unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn attention_on_values_gives_the_bits_of_attention_on_tensors() {
    let device = Device::Cpu;
    for (heads, layout) in [
        (Heads::new(4, 2, 16).unwrap(), RopeLayout::Halves),
        (Heads::new(6, 3, 16).unwrap(), RopeLayout::Interleaved),
        (Heads::new(4, 4, 16).unwrap(), RopeLayout::Halves),
    ] {
        let attention = self_attention(heads);
        let frequencies = (0..heads.head_dim / 2)
            .map(|i| 0.7f32.powi(i as i32))
            .collect();
        let rotary = Rotary::new(frequencies, layout, &device).unwrap();
        let x = Tensor::randn(0f32, 1.0, (1, 9, HIDDEN), &device).unwrap();
        let mut on_tensors = LayerKvCache::new(4, 64);
        let mut on_values = LayerKvCache::new(4, 64);
        // A 3-row prompt (causal), one decoding row, then a tree of 5 rows whose bias lets
        // each see the cache and some of the others (siblings share positions).
        let tree_bias: Vec<f32> = (0..5)
            .flat_map(|r| {
                (0..9).map(move |k| {
                    let visible = k < 4 || k - 4 == r || (k == 4 && r > 0) || (r == 4 && k == 6);
                    if visible {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let tree_mask = Tensor::from_vec(tree_bias, (1, 1, 5, 9), &device).unwrap();
        let steps: [(usize, usize, Vec<usize>, Option<&Tensor>); 3] = [
            (0, 3, vec![0, 1, 2], None),
            (3, 1, vec![3], None),
            (4, 5, vec![4, 5, 5, 6, 6], Some(&tree_mask)),
        ];
        for (first, n, positions, bias) in steps {
            let cached = on_tensors.len();
            let mask = AttentionMask::new(bias, n, cached, &device).unwrap();
            let tables = rotary.tables(&positions).unwrap();
            let input = x.narrow(1, first, n).unwrap();
            let expected = attention
                .forward(&input, Some(&tables), &mask, &mut on_tensors)
                .unwrap();
            let got = attention
                .forward_rows(&values(&input), n, Some(&tables), &mask, &mut on_values)
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&values(&expected)),
                "{heads:?} {layout:?} {n} rows"
            );
        }
        let (k1, v1) = on_tensors.current().unwrap().unwrap();
        let (k2, v2) = on_values.current().unwrap().unwrap();
        assert_eq!(values(&k1), values(&k2));
        assert_eq!(values(&v1), values(&v2));
    }
}

#[test]
fn attention_on_values_needs_kernel_matrices_and_a_row_mask() {
    let device = Device::Cpu;
    let heads = Heads::new(2, 1, 32).unwrap();
    let mut attention = self_attention(heads);
    let x = vec![0.5f32; HIDDEN];
    let mut cache = LayerKvCache::new(4, 64);
    let batched =
        AttentionMask::Batched(Tensor::zeros((1, 1, 1, 1, 1), DType::F32, &device).unwrap());
    assert!(attention
        .forward_rows(&x, 1, None, &batched, &mut cache)
        .is_err());
    let w = Tensor::randn(0f32, 0.1, (HIDDEN, 2 * 32), &device).unwrap();
    attention.o = Linear::new(
        QLinear::Candle(candle_core::quantized::QMatMul::Tensor(w)),
        None,
    );
    let causal = AttentionMask::new(None, 1, 0, &device).unwrap();
    assert!(attention
        .forward_rows(&x, 1, None, &causal, &mut cache)
        .is_err());
}

/// A mask built for another cache length, or a bias of another size, would attend to the
/// wrong keys (or read past the bias): refused.
#[test]
fn a_mask_that_does_not_fit_the_cache_is_refused() {
    let device = Device::Cpu;
    let attention = self_attention(Heads::new(2, 1, 32).unwrap());
    let x = Tensor::randn(0f32, 1.0, (1, 2, HIDDEN), &device).unwrap();
    let mut cache = LayerKvCache::new(4, 64);
    let fresh = AttentionMask::new(None, 2, 0, &device).unwrap();
    attention.forward(&x, None, &fresh, &mut cache).unwrap();
    assert_eq!(cache.len(), 2);
    for stale in [0, 3] {
        let mask = AttentionMask::new(None, 2, stale, &device).unwrap();
        let err = attention.forward(&x, None, &mask, &mut cache).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{stale}: {err}");
        let rows: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        assert!(attention
            .forward_rows(&rows, 2, None, &mask, &mut cache)
            .is_err());
        assert_eq!(cache.len(), 2, "a refused forward appends nothing");
    }
    let short = Tensor::zeros((1, 1, 2, 3), DType::F32, &device).unwrap();
    assert!(matches!(
        AttentionMask::new(Some(&short), 2, 2, &device),
        Err(Error::Config(_))
    ));
    let fits = AttentionMask::new(None, 2, 2, &device).unwrap();
    attention.forward(&x, None, &fits, &mut cache).unwrap();
    assert_eq!(cache.len(), 4);
}

#[test]
fn verifying_a_block_gives_each_row_its_decoding_output() {
    let device = Device::Cpu;
    let heads = Heads::new(4, 2, 16).unwrap();
    let attention = self_attention(heads);
    let rotary = test_rotary(&device);
    let x = Tensor::randn(0f32, 1.0, (1, 7, HIDDEN), &device).unwrap();
    // A 2-token prompt, then 5 rows in one forward, against the same 5 one at a time.
    let prompt = x.narrow(1, 0, 2).unwrap();
    let mut together = LayerKvCache::new(4, 64);
    let mut alone = LayerKvCache::new(4, 64);
    for cache in [&mut together, &mut alone] {
        let mask = AttentionMask::new(None, 2, 0, &device).unwrap();
        attention
            .forward(
                &prompt,
                Some(&rotary.tables(&[0, 1]).unwrap()),
                &mask,
                cache,
            )
            .unwrap();
    }
    let block = x.narrow(1, 2, 5).unwrap();
    let mask = AttentionMask::new(None, 5, 2, &device).unwrap();
    let tables = rotary.tables(&[2, 3, 4, 5, 6]).unwrap();
    let out = attention
        .forward(&block, Some(&tables), &mask, &mut together)
        .unwrap();
    for row in 0..5 {
        let mask = AttentionMask::new(None, 1, 2 + row, &device).unwrap();
        let tables = rotary.tables(&[2 + row]).unwrap();
        let single = attention
            .forward(
                &x.narrow(1, 2 + row, 1).unwrap(),
                Some(&tables),
                &mask,
                &mut alone,
            )
            .unwrap();
        assert_eq!(
            values(&out.narrow(1, row, 1).unwrap()),
            values(&single),
            "row {row}"
        );
    }
    assert_eq!(together.len(), 7);
}

#[test]
fn a_token_tree_gives_each_branch_the_bits_of_decoding_it_alone() {
    let device = Device::Cpu;
    let attention = self_attention(Heads::new(4, 2, 16).unwrap());
    let rotary = test_rotary(&device);
    let prompt_len = 37;
    let x = Tensor::randn(0f32, 1.0, (1, prompt_len + 3, HIDDEN), &device).unwrap();
    let prompt = x.narrow(1, 0, prompt_len).unwrap();
    let positions: Vec<usize> = (0..prompt_len).collect();
    let mut tree_cache = LayerKvCache::new(4, 64);
    let mut alone = LayerKvCache::new(4, 64);
    for cache in [&mut tree_cache, &mut alone] {
        let mask = AttentionMask::new(None, prompt_len, 0, &device).unwrap();
        let tables = rotary.tables(&positions).unwrap();
        attention
            .forward(&prompt, Some(&tables), &mask, cache)
            .unwrap();
    }
    // Two siblings at the prompt's end, and a child of the second: the child does not see
    // the first sibling, a masked key between the prompt and its parent.
    let keys = prompt_len + 3;
    let mut bias = vec![0f32; 3 * keys];
    let hidden: [&[usize]; 3] = [&[1, 2], &[0, 2], &[0]];
    for (row, nodes) in hidden.iter().enumerate() {
        for node in nodes.iter() {
            bias[row * keys + prompt_len + node] = f32::NEG_INFINITY;
        }
    }
    let mask = Tensor::from_vec(bias, (1, 1, 3, keys), &device).unwrap();
    let mask = AttentionMask::new(Some(&mask), 3, prompt_len, &device).unwrap();
    let tables = rotary
        .tables(&[prompt_len, prompt_len, prompt_len + 1])
        .unwrap();
    let tree = attention
        .forward(
            &x.narrow(1, prompt_len, 3).unwrap(),
            Some(&tables),
            &mask,
            &mut tree_cache,
        )
        .unwrap();
    for (node, position) in [(1, prompt_len), (2, prompt_len + 1)] {
        let mask = AttentionMask::new(None, 1, position, &device).unwrap();
        let single = attention
            .forward(
                &x.narrow(1, prompt_len + node, 1).unwrap(),
                Some(&rotary.tables(&[position]).unwrap()),
                &mask,
                &mut alone,
            )
            .unwrap();
        assert_eq!(
            values(&tree.narrow(1, node, 1).unwrap()),
            values(&single),
            "node {node}"
        );
    }
}

#[test]
fn branches_in_lockstep_read_only_their_own_keys_and_get_the_bits_of_each_alone() {
    let device = Device::Cpu;
    let attention = self_attention(Heads::new(6, 2, 16).unwrap());
    let rotary = test_rotary(&device);
    let (prompt_len, branches, len) = (3, 4, 5);
    let x = Tensor::randn(0f32, 1.0, (1, prompt_len + branches * len, HIDDEN), &device).unwrap();
    let prompt = x.narrow(1, 0, prompt_len).unwrap();
    let prompt_positions: Vec<usize> = (0..prompt_len).collect();
    let causal = AttentionMask::new(None, prompt_len, 0, &device).unwrap();
    let mut lockstep = LayerKvCache::new(2, 64);
    attention
        .forward(
            &prompt,
            Some(&rotary.tables(&prompt_positions).unwrap()),
            &causal,
            &mut lockstep,
        )
        .unwrap();
    // Each branch's rows see the prompt and the branch's own rows up to themselves: at most
    // 8 of 23 keys, so the rows take the path that reads only those.
    let keys = prompt_len + branches * len;
    let mut bias = vec![f32::NEG_INFINITY; branches * len * keys];
    let mut positions = Vec::new();
    for b in 0..branches {
        for j in 0..len {
            let row = &mut bias[(b * len + j) * keys..(b * len + j + 1) * keys];
            row[..prompt_len].fill(0.0);
            row[prompt_len + b * len..=prompt_len + b * len + j].fill(0.0);
            positions.push(prompt_len + j);
        }
    }
    let mask = Tensor::from_vec(bias, (1, 1, branches * len, keys), &device).unwrap();
    let mask = AttentionMask::new(Some(&mask), branches * len, prompt_len, &device).unwrap();
    let together = attention
        .forward(
            &x.narrow(1, prompt_len, branches * len).unwrap(),
            Some(&rotary.tables(&positions).unwrap()),
            &mask,
            &mut lockstep,
        )
        .unwrap();
    for b in 0..branches {
        let mut alone = LayerKvCache::new(2, 64);
        let rows = x.narrow(1, prompt_len + b * len, len).unwrap();
        let whole = Tensor::cat(&[&prompt, &rows], 1).unwrap();
        let all: Vec<usize> = (0..prompt_len + len).collect();
        let causal = AttentionMask::new(None, prompt_len + len, 0, &device).unwrap();
        let single = attention
            .forward(
                &whole,
                Some(&rotary.tables(&all).unwrap()),
                &causal,
                &mut alone,
            )
            .unwrap();
        assert_eq!(
            values(&together.narrow(1, b * len, len).unwrap()),
            values(&single.narrow(1, prompt_len, len).unwrap()),
            "branch {b}"
        );
    }
}

#[test]
fn a_long_forward_gives_the_bits_of_its_pieces() {
    let device = Device::Cpu;
    let attention = self_attention(Heads::new(4, 2, 8).unwrap());
    let x = Tensor::randn(0f32, 1.0, (1, 150, HIDDEN), &device).unwrap();
    let mut whole = LayerKvCache::new(2, 160);
    let mask = AttentionMask::new(None, 150, 0, &device).unwrap();
    let out = attention.forward(&x, None, &mask, &mut whole).unwrap();
    let mut pieces = LayerKvCache::new(2, 160);
    let mut start = 0;
    for len in [70, 1, 79] {
        let mask = AttentionMask::new(None, len, start, &device).unwrap();
        let piece = attention
            .forward(&x.narrow(1, start, len).unwrap(), None, &mask, &mut pieces)
            .unwrap();
        assert_eq!(
            values(&piece),
            values(&out.narrow(1, start, len).unwrap()),
            "rows {start}..{}",
            start + len
        );
        start += len;
    }
}

#[test]
fn row_path_agrees_with_the_batched_path() {
    let device = Device::Cpu;
    let heads = Heads::new(4, 1, 16).unwrap();
    let attention = self_attention(heads);
    let x = Tensor::randn(0f32, 1.0, (1, 6, HIDDEN), &device).unwrap();
    // A tree-style mask: row 3 may not see rows 1 and 2.
    let mut bias = vec![0f32; 36];
    for (i, row) in bias.chunks_mut(6).enumerate() {
        for (j, b) in row.iter_mut().enumerate() {
            if j > i || (i == 3 && (j == 1 || j == 2)) {
                *b = f32::NEG_INFINITY;
            }
        }
    }
    let mask = Tensor::from_vec(bias, (1, 1, 6, 6), &device).unwrap();
    let rows = AttentionMask::new(Some(&mask), 6, 0, &device).unwrap();
    assert!(matches!(rows, AttentionMask::Rows { .. }));
    let batched = AttentionMask::Batched(mask.reshape((1, 1, 1, 6, 6)).unwrap());
    let a = attention
        .forward(&x, None, &rows, &mut LayerKvCache::new(8, 8))
        .unwrap();
    let b = attention
        .forward(&x, None, &batched, &mut LayerKvCache::new(8, 8))
        .unwrap();
    for (a, b) in values(&a).iter().zip(values(&b)) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn cross_attention_is_softmax_over_every_frame_and_row_invariant() {
    // Head size 32: whole lane groups; 24: a remainder of columns past them.
    for (n_heads, head_dim) in [(2, 32), (4, 24)] {
        check_cross_attention(n_heads, head_dim);
    }
}

fn check_cross_attention(n_heads: usize, head_dim: usize) {
    let device = Device::Cpu;
    let heads = Heads::new(n_heads, n_heads, head_dim).unwrap();
    let SelfAttention { q, k, v, .. } = self_attention(heads);
    // A dense output projection: Q8_0's activation quantization would turn the paths'
    // last-bit differences into a rounding step now and then.
    let o = linear_in(GgmlDType::F32, HIDDEN, n_heads * head_dim, true);
    let cross = CrossAttention { q, k, v, o, heads };
    let encoded = Tensor::randn(0f32, 1.0, (1, 83, HIDDEN), &device).unwrap();
    let kv = cross.keys_values(&encoded).unwrap();
    assert_eq!(kv.frames(), 83);
    let x = Tensor::randn(0f32, 1.0, (1, 70, HIDDEN), &device).unwrap();
    // A direct computation per head.
    let queries = cross
        .q
        .forward(&x)
        .unwrap()
        .reshape((70, n_heads, head_dim))
        .unwrap();
    let keys = cross
        .k
        .forward(&encoded)
        .unwrap()
        .reshape((83, n_heads, head_dim))
        .unwrap();
    let vals = cross
        .v
        .forward(&encoded)
        .unwrap()
        .reshape((83, n_heads, head_dim))
        .unwrap();
    let mut merged = Vec::new();
    let mut direct_scores = Vec::new();
    for head in 0..n_heads {
        let pick = |t: &Tensor| t.narrow(1, head, 1).unwrap().squeeze(1).unwrap();
        let scores = (pick(&queries).matmul(&pick(&keys).t().unwrap()).unwrap()
            / (head_dim as f64).sqrt())
        .unwrap();
        let weights = candle_nn::ops::softmax_last_dim(&scores).unwrap();
        merged.push(weights.matmul(&pick(&vals)).unwrap());
        direct_scores.push(scores);
    }
    // The scores of chosen heads (in the order asked) are the direct ones, before the softmax.
    let chosen: Vec<usize> = (0..n_heads).rev().collect();
    let scores = cross.scores(&x, &kv, &chosen).unwrap();
    assert_eq!(scores.dims(), [n_heads, 70, 83]);
    for (i, &head) in chosen.iter().enumerate() {
        let got = values(&scores.get(i).unwrap());
        for (a, b) in got.iter().zip(values(&direct_scores[head])) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
    assert!(cross.scores(&x, &kv, &[n_heads]).is_err());
    let expected = cross
        .o
        .forward(&Tensor::cat(&merged, 1).unwrap().unsqueeze(0).unwrap())
        .unwrap();
    // 70 rows take the blocked path (a full block and a partial one), 7 rows the row path
    // (a block of 4 rows and one of 3); both match the direct product.
    let long = cross.forward(&x, &kv).unwrap();
    let short = cross.forward(&x.narrow(1, 0, 7).unwrap(), &kv).unwrap();
    for (got, want) in [
        (&long, &expected),
        (&short, &expected.narrow(1, 0, 7).unwrap()),
    ] {
        for (a, b) in values(got).iter().zip(values(want)) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
    // Row path: a row's attention does not depend on the rows beside it (before the
    // output projection, whose dense product here is candle's).
    let queries = Tensor::randn(0f32, 1.0, (1, n_heads, 7, head_dim), &device).unwrap();
    let together = cross_row_attention(&queries, &kv.keys_t, &kv.values).unwrap();
    for row in 0..7 {
        let one = queries.narrow(2, row, 1).unwrap();
        let alone = cross_row_attention(&one, &kv.keys_t, &kv.values).unwrap();
        assert_eq!(values(&together.narrow(2, row, 1).unwrap()), values(&alone));
    }
}

#[test]
fn head_layouts_that_cannot_share_are_rejected() {
    assert!(Heads::new(6, 4, 16).is_err());
    assert!(Heads::new(4, 0, 16).is_err());
    assert!(Heads::new(4, 2, 16).is_ok());
}
