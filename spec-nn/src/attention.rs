//! Self-attention over a rollback-able KV cache and cross-attention over an encoder's output,
//! both grouped-query capable, with a fixed-order row path for short forwards.
//!
//! Greedy speculative decoding is lossless only if verifying k tokens in one forward gives each
//! of them exactly the logits that decoding it alone gives. candle's batched matmul picks its
//! kernel by the number of rows, and the rounding of `Q·Kᵀ` then differs in the last bits,
//! enough to flip near-ties. Here every query row's scores, softmax and weighted sum of values
//! are computed by the same code in the same order whatever the number of rows, so decoding
//! (1 token) and verification (a few tokens, or a token tree) agree bit for bit. On the CPU
//! self-attention does this for forwards of any length: a prompt computed in one forward and
//! the same positions computed in pieces (PredGen feeds a prompt as it is spoken, then
//! verifies a guess of up to an answer's length in one forward) must give the same cache.
//! Batched matmuls for forwards over 64 rows once broke that, and PredGen's greedy answer to an
//! MT-Bench question parted from the cascade's at a near-tie; rows cost 3 % more at 128
//! tokens, 7 % at 512.

use candle_core::{DType, Device, Layout, Module, Storage, Tensor};
use spec_core::kv_cache::LayerKvCache;

use crate::linear::{with_cpu_values, Linear};
use crate::rotary::RotaryTables;
use crate::{Error, Result};
use spec_core::math::{self, exp, softmax_in_place};

/// Largest cross-attention forward whose attention runs row by row (decoder rows over an
/// encoder's output, bit-identical to one row at a time). Longer ones, an encoder's frames
/// attending over themselves, use blocked attention. Self-attention on the CPU runs row by
/// row at any length.
pub const ROW_ATTENTION_MAX_ROWS: usize = 64;

/// Which keys each new query row may see.
enum RowMask<'a> {
    /// Query i sees keys `0..=cached + i`.
    Causal { cached: usize },
    /// An additive bias per query row, `[n, keys]`, and where it hides at least half of the
    /// keys, the keys each row sees, in order.
    Bias {
        bias: &'a [f32],
        seen: Option<&'a [Vec<usize>]>,
    },
}

impl RowMask<'_> {
    /// Masks the scores of query `row` over every key: −∞ where it may not look, the bias added
    /// where one is given.
    fn apply(&self, row: usize, scores: &mut [f32]) {
        match self {
            Self::Causal { cached } => {
                let visible = (cached + row + 1).min(scores.len());
                scores[visible..].fill(f32::NEG_INFINITY);
            }
            Self::Bias { bias, .. } => {
                let keys = scores.len();
                for (score, bias) in scores.iter_mut().zip(&bias[row * keys..(row + 1) * keys]) {
                    *score += bias;
                }
            }
        }
    }
}

/// A `[1, heads, rows, dim]` f32 CPU tensor seen as slices, whatever its strides.
struct HeadRows<'a> {
    data: &'a [f32],
    offset: usize,
    head_stride: usize,
    row_stride: usize,
    /// Values per row.
    dim: usize,
}

impl<'a> HeadRows<'a> {
    fn new(data: &'a [f32], layout: &Layout, dim: usize) -> Result<Self> {
        let stride = layout.stride();
        if stride.len() != 4 || stride[3] != 1 || layout.dims()[3] != dim {
            return Err(Error::Config(format!(
                "attention expects [1, heads, rows, {dim}] with unit inner stride, got {:?} / {stride:?}",
                layout.dims()
            )));
        }
        Ok(Self {
            data,
            offset: layout.start_offset(),
            head_stride: stride[1],
            row_stride: stride[2],
            dim,
        })
    }

    fn row(&self, head: usize, row: usize) -> &'a [f32] {
        let start = self.offset + head * self.head_stride + row * self.row_stride;
        &self.data[start..start + self.dim]
    }
}

/// The dot products of `PAIRS` (query, key) pairs: per pair, eight accumulation lanes over
/// the dimensions in order ([`pair_lanes`]), then the lanes summed as a fixed tree (halves,
/// quarters, pair) and the tail added. A pair's sum does not depend on the pairs beside it;
/// taking several together only interleaves their chains, so the additions overlap instead of
/// waiting for each other.
#[inline(always)]
fn pair_dots<const PAIRS: usize>(pairs: [(&[f32], &[f32]); PAIRS]) -> [f32; PAIRS] {
    let dim = pairs[0].0.len();
    assert!(pairs.iter().all(|(q, k)| q.len() == dim && k.len() == dim));
    let whole = dim - dim % 8;
    let lanes = pair_lanes(&pairs, whole);
    let mut out = [0f32; PAIRS];
    for ((out, l), (query, key)) in out.iter_mut().zip(&lanes).zip(&pairs) {
        let tail: f32 = query[whole..]
            .iter()
            .zip(&key[whole..])
            .map(|(x, y)| x * y)
            .sum();
        let halves = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
        let quarters = [halves[0] + halves[2], halves[1] + halves[3]];
        *out = (quarters[0] + quarters[1]) + tail;
    }
    out
}

/// Per pair, `lanes[l] = Σ_c query[8c + l] · key[8c + l]` over the `whole / 8` chunks in order
/// (a product, then a sum: never fused). With AVX a pair's lanes are one register, so every
/// pair's chain stays in registers however many there are; without it the same arithmetic in
/// plain Rust.
#[inline(always)]
fn pair_lanes<const PAIRS: usize>(
    pairs: &[(&[f32], &[f32]); PAIRS],
    whole: usize,
) -> [[f32; 8]; PAIRS] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX was just detected; `pair_dots` checked that every slice holds `whole`.
        return unsafe { avx::pair_lanes(pairs, whole) };
    }
    portable_pair_lanes(pairs, whole)
}

/// [`pair_lanes`] in plain Rust.
#[inline(always)]
fn portable_pair_lanes<const PAIRS: usize>(
    pairs: &[(&[f32], &[f32]); PAIRS],
    whole: usize,
) -> [[f32; 8]; PAIRS] {
    let mut lanes = [[0f32; 8]; PAIRS];
    for start in (0..whole).step_by(8) {
        for (lanes, (query, key)) in lanes.iter_mut().zip(pairs) {
            let q = &query[start..start + 8];
            let k = &key[start..start + 8];
            for l in 0..8 {
                lanes[l] += q[l] * k[l];
            }
        }
    }
    lanes
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// [`super::pair_lanes`] on 256-bit registers.
    ///
    /// # Safety
    /// The CPU must have AVX, and every slice must hold at least `whole` values.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn pair_lanes<const PAIRS: usize>(
        pairs: &[(&[f32], &[f32]); PAIRS],
        whole: usize,
    ) -> [[f32; 8]; PAIRS] {
        let mut sums = [_mm256_setzero_ps(); PAIRS];
        for start in (0..whole).step_by(8) {
            for (sum, (query, key)) in sums.iter_mut().zip(pairs) {
                let q = _mm256_loadu_ps(query.as_ptr().add(start));
                let k = _mm256_loadu_ps(key.as_ptr().add(start));
                *sum = _mm256_add_ps(*sum, _mm256_mul_ps(q, k));
            }
        }
        let mut lanes = [[0f32; 8]; PAIRS];
        for (lanes, sum) in lanes.iter_mut().zip(sums) {
            _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
        }
        lanes
    }
}

/// Bytes of keys or values ahead of the one being read that the attention loops ask the
/// caches for. A decoding step reads its layer's cached keys and values once, from memory
/// (the layers' weights read between two steps have evicted them), at a few bytes of
/// arithmetic per byte: without these requests a thread waited for each row in turn. The
/// portable weighted-value loop (machines without AVX-512) asks too: forced in place of the
/// AVX-512 loop on a Xeon, it made SmolLM2's one-token forward after 320 cached tokens 8–13 %
/// shorter (3.77–4.09 → 3.50–3.56 ms, as fast as the AVX-512 loop; alternated three times).
const PREFETCH_AHEAD_BYTES: usize = 4096;

/// Rows that [`PREFETCH_AHEAD_BYTES`] holds for rows of `len` values (at least one).
fn rows_ahead(len: usize) -> usize {
    (PREFETCH_AHEAD_BYTES / (4 * len).max(1)).max(1)
}

/// Asks the caches for the lines of `values` (a hint: it changes no result).
#[inline(always)]
fn prefetch(values: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..values.len()).step_by(16) {
        // SAFETY: a prefetch of an address inside the slice; it never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                values.as_ptr().add(line).cast(),
            )
        };
    }
}

/// `scores[r·keys + j]` = query `r` · key `j` for every key `0..keys`, by [`pair_dots`] over
/// groups of `KEYS` keys (`PAIRS` = rows · `KEYS` ≤ 8 chains in registers), then key by key.
fn block_scores<'k, const KEYS: usize, const PAIRS: usize>(
    queries: &[&[f32]],
    key: impl Fn(usize) -> &'k [f32],
    keys: usize,
    scores: &mut [f32],
) {
    let rows = queries.len();
    assert_eq!(rows * KEYS, PAIRS, "{rows} rows of {KEYS} keys");
    let ahead = rows_ahead(queries[0].len());
    let mut first = 0;
    while first + KEYS <= keys {
        for j in first + ahead..(first + ahead + KEYS).min(keys) {
            prefetch(key(j));
        }
        let pairs: [(&[f32], &[f32]); PAIRS] =
            std::array::from_fn(|p| (queries[p / KEYS], key(first + p % KEYS)));
        for (p, dot) in pair_dots(pairs).into_iter().enumerate() {
            scores[(p / KEYS) * keys + first + p % KEYS] = dot;
        }
        first += KEYS;
    }
    for j in first..keys {
        for (r, query) in queries.iter().enumerate() {
            scores[r * keys + j] = pair_dots([(*query, key(j))])[0];
        }
    }
}

/// Runs `f` on the CPU tensors `queries`, `keys` and `values` seen as rows (`key_row`: the
/// length of a row of `keys`).
fn with_head_rows<T>(
    queries: &Tensor,
    keys: &Tensor,
    key_row: usize,
    values: &Tensor,
    f: impl FnOnce(&HeadRows, &HeadRows, &HeadRows) -> T,
) -> Result<T> {
    let dim = queries.dim(3)?;
    let queries = queries.contiguous()?;
    let (q_storage, q_layout) = queries.storage_and_layout();
    let (k_storage, k_layout) = keys.storage_and_layout();
    let (v_storage, v_layout) = values.storage_and_layout();
    let (Storage::Cpu(q), Storage::Cpu(k), Storage::Cpu(v)) =
        (&*q_storage, &*k_storage, &*v_storage)
    else {
        return Err(Error::Config("row attention runs on the CPU only".into()));
    };
    let q = HeadRows::new(q.as_slice::<f32>()?, q_layout, dim)?;
    let k = HeadRows::new(k.as_slice::<f32>()?, k_layout, key_row)?;
    let v = HeadRows::new(v.as_slice::<f32>()?, v_layout, dim)?;
    Ok(f(&q, &k, &v))
}

/// A block of query rows' attention: `(q, k, v, head, first_row, out)` writes the rows' output.
type BlockFn<'a> = dyn Fn(&HeadRows, &HeadRows, &HeadRows, usize, usize, &mut [f32]) + Sync + 'a;

/// Runs `attend_block` for every block of up to `block_rows` consecutive stacked query rows of
/// each key/value head (`(q, k, v, head, first_row, out)`, `out` holding the block's rows) on the
/// kernels' threads (awake between the matmuls around it), with the CPU tensors seen as rows
/// (`key_row`: the length of a row of `keys`); returns `[1, kv_heads, stacked, dim]`.
fn attend_row_blocks(
    queries: &Tensor,
    keys: &Tensor,
    key_row: usize,
    values: &Tensor,
    block_rows: usize,
    attend_block: &BlockFn<'_>,
) -> Result<Tensor> {
    let (_, kv_heads, stacked, dim) = queries.dims4()?;
    let block_rows = block_rows.clamp(1, stacked.max(1));
    let blocks = stacked.div_ceil(block_rows);
    // Each head's rows padded to whole blocks, so that every task owns one equal chunk.
    let padded = blocks * block_rows;
    let mut out = vec![0f32; kv_heads * padded * dim];
    with_head_rows(queries, keys, key_row, values, |q, k, v| {
        spec_kernels::parallel_chunks_mut(&mut out, block_rows * dim, &|index, out_block| {
            let (head, first) = (index / blocks, (index % blocks) * block_rows);
            let rows = block_rows.min(stacked - first);
            attend_block(q, k, v, head, first, &mut out_block[..rows * dim])
        })
    })?;
    let out = Tensor::from_vec(out, (1, kv_heads, padded, dim), &Device::Cpu)?;
    Ok(if padded == stacked {
        out
    } else {
        out.narrow(2, 0, stacked)?.contiguous()?
    })
}

/// Attention of `queries` `[1, kv_heads, group·n, dim]` (already scaled by 1/√dim, the `group`
/// query heads of each key/value head stacked, n rows each) over `keys`/`values`
/// `[1, kv_heads, L, dim]`; returns `[1, kv_heads, group·n, dim]`. Each head's rows go in
/// equal blocks of at most [`SELF_ROW_BLOCK`] that share each read of a key and a value, but
/// every row's scores, softmax and weighted sum are accumulated in key order on their own: a
/// row's result is bit-identical whatever rows are beside it. Under a bias that hides at
/// least half of the keys from the rows, [`sparse_row_attention`] reads only what each sees.
fn row_attention(
    queries: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    n: usize,
    mask: &RowMask<'_>,
) -> Result<Tensor> {
    let (dim, stacked) = (queries.dim(3)?, queries.dim(2)?);
    let total = keys.dim(2)?;
    if let RowMask::Bias {
        bias,
        seen: Some(seen),
    } = mask
    {
        return sparse_row_attention(queries, keys, values, bias, seen);
    }
    let block_rows = stacked.div_ceil(stacked.div_ceil(SELF_ROW_BLOCK).max(1));
    attend_row_blocks(
        queries,
        keys,
        dim,
        values,
        block_rows,
        &|q, k, v, head, first, out| {
            self_attention_block(q, k, v, head, first, total, n, mask, out)
        },
    )
}

/// One block of [`row_attention`]: stacked query rows `first..` of key/value head `head` over
/// its `total` keys, written to `out`.
#[allow(clippy::too_many_arguments)]
fn self_attention_block(
    q: &HeadRows,
    k: &HeadRows,
    v: &HeadRows,
    head: usize,
    first: usize,
    total: usize,
    n: usize,
    mask: &RowMask<'_>,
    out: &mut [f32],
) {
    let rows = out.len() / q.dim;
    let queries: Vec<&[f32]> = (first..first + rows).map(|r| q.row(head, r)).collect();
    attend_keys(
        &queries,
        |j| k.row(head, j),
        |j| v.row(head, j),
        total,
        |r, scores| mask.apply((first + r) % n, scores),
        out,
    );
}

/// The attention of up to [`SELF_ROW_BLOCK`] query rows over `keys` keys (`key(j)`,
/// `value(j)`), written to `out`: scores, `mask(r, scores)` on each row's, softmax whose masked
/// keys weigh exactly 0, and each row's weighted sum of values, all in key order.
fn attend_keys<'k>(
    queries: &[&[f32]],
    key: impl Fn(usize) -> &'k [f32],
    value: impl Fn(usize) -> &'k [f32] + Copy,
    keys: usize,
    mask: impl Fn(usize, &mut [f32]),
    out: &mut [f32],
) {
    let rows = queries.len();
    let mut weights = vec![0f32; rows * keys];
    all_scores(queries, key, keys, &mut weights);
    for (r, row) in weights.chunks_exact_mut(keys).enumerate() {
        mask(r, row);
        let max = math::max(row);
        // Masked keys weigh exactly 0 (`exp` clamps, so e^(−∞) would not).
        for w in row.iter_mut() {
            *w = if *w > f32::NEG_INFINITY {
                exp(*w - max)
            } else {
                0.0
            };
        }
    }
    let mut sums = [0f32; SELF_ROW_BLOCK];
    weight_sums(&weights, keys, &mut sums[..rows]);
    let weights: Vec<&[f32]> = weights.chunks_exact(keys).collect();
    rows_times_matrix(&weights, value, out.len() / rows, out);
    for (out_row, sum) in out.chunks_exact_mut(out.len() / rows).zip(&sums) {
        out_row.iter_mut().for_each(|o| *o /= sum);
    }
}

/// [`row_attention`] under a bias that hides most keys from each row, as when several answers
/// are decoded in lockstep (each branch sees the shared context and its own tokens, not the
/// other branches'). Each task takes one token's query rows of a key/value head and reads only
/// the keys that token sees, in key order: a hidden key weighs exactly 0 in the softmax, its
/// sum and the weighted values, so leaving it out changes no bit, and a row's cost follows
/// what it sees instead of the whole cache. `seen`: the keys each of the `n` rows sees.
fn sparse_row_attention(
    queries: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    bias: &[f32],
    seen: &[Vec<usize>],
) -> Result<Tensor> {
    let (_, kv_heads, stacked, dim) = queries.dims4()?;
    let (total, n) = (keys.dim(2)?, seen.len());
    let group = stacked / n;
    // `[kv_heads, n, group, dim]`: one chunk per task.
    let mut by_token = vec![0f32; kv_heads * n * group * dim];
    with_head_rows(queries, keys, dim, values, |q, k, v| {
        spec_kernels::parallel_chunks_mut(&mut by_token, group * dim, &|index, out| {
            let (head, token) = (index / n, index % n);
            let row_bias = &bias[token * total..(token + 1) * total];
            let seen = &seen[token];
            for (block, out) in out.chunks_mut(SELF_ROW_BLOCK * dim).enumerate() {
                let first = block * SELF_ROW_BLOCK;
                let queries: Vec<&[f32]> = (first..first + out.len() / dim)
                    .map(|g| q.row(head, g * n + token))
                    .collect();
                attend_keys(
                    &queries,
                    |j| k.row(head, seen[j]),
                    |j| v.row(head, seen[j]),
                    seen.len(),
                    |_, scores| {
                        for (score, &j) in scores.iter_mut().zip(seen) {
                            *score += row_bias[j];
                        }
                    },
                    out,
                );
            }
        })
    })?;
    let mut out = vec![0f32; by_token.len()];
    for head in 0..kv_heads {
        for token in 0..n {
            for g in 0..group {
                let from = ((head * n + token) * group + g) * dim;
                let to = ((head * group + g) * n + token) * dim;
                out[to..to + dim].copy_from_slice(&by_token[from..from + dim]);
            }
        }
    }
    Ok(Tensor::from_vec(
        out,
        (1, kv_heads, stacked, dim),
        &Device::Cpu,
    )?)
}

/// [`block_scores`] for 1 to [`SELF_ROW_BLOCK`] rows.
fn all_scores<'k>(
    queries: &[&[f32]],
    key: impl Fn(usize) -> &'k [f32],
    keys: usize,
    scores: &mut [f32],
) {
    match queries.len() {
        1 => block_scores::<8, 8>(queries, key, keys, scores),
        2 => block_scores::<4, 8>(queries, key, keys, scores),
        3 => block_scores::<2, 6>(queries, key, keys, scores),
        4 => block_scores::<2, 8>(queries, key, keys, scores),
        5 => block_scores::<1, 5>(queries, key, keys, scores),
        6 => block_scores::<1, 6>(queries, key, keys, scores),
        7 => block_scores::<1, 7>(queries, key, keys, scores),
        _ => block_scores::<1, SELF_ROW_BLOCK>(queries, key, keys, scores),
    }
}

/// Each row's sum of its softmax weights (`weights` holds the rows, `keys` each), in key order:
/// a masked key's weight of 0 adds exactly nothing wherever it lies, so a token tree's branch
/// (whose siblings are masked keys in the middle of its row) sums as decoding it alone does.
/// The rows' chains are interleaved, so their additions overlap.
fn weight_sums(weights: &[f32], keys: usize, sums: &mut [f32]) {
    sums.fill(0.0);
    for key in 0..keys {
        for (r, sum) in sums.iter_mut().enumerate() {
            *sum += weights[r * keys + key];
        }
    }
}

/// Most query rows of a self-attention handled together: each cached key and value is read
/// once for all of them, the values' weighted sum accumulating in registers. Eight, so that a
/// decoding step's query heads of one key/value group (six for the Qwen 1.5B, seven for the
/// 0.5B) are one block and each head's keys and values are read once per step.
const SELF_ROW_BLOCK: usize = 8;

/// Query rows of a cross-attention handled together: each key and value is read once for all
/// of them (a verification's rows would otherwise stream the encoder's keys and values, about
/// 3.5 MB per layer for base over 855 frames, once per row). Eight: a chain of four heads'
/// guesses and its root, or five beams, in one pass.
const CROSS_ROW_BLOCK: usize = MAX_PRODUCT_ROWS;

/// The narrow column group of [`rows_times_matrix`] (one vector), for the columns past its wide
/// groups.
const LANES: usize = 16;

/// Attention of a few query rows over every key of a cross-attention (no mask), with the keys
/// transposed (`keys_t` `[1, kv_heads, dim, L]`, as [`CrossKv`] keeps them). Blocks of up to
/// [`CROSS_ROW_BLOCK`] rows share each read of the keys and values, but every row's scores are
/// accumulated dimension by dimension from zero, then softmax, then the weighted sum of values
/// key by key, all in a fixed order: a row's result is bit-identical whatever rows are beside
/// it. Shapes otherwise as in [`row_attention`].
fn cross_row_attention(queries: &Tensor, keys_t: &Tensor, values: &Tensor) -> Result<Tensor> {
    let dim = queries.dim(3)?;
    let total = keys_t.dim(3)?;
    attend_row_blocks(
        queries,
        keys_t,
        total,
        values,
        CROSS_ROW_BLOCK,
        &|q, k, v, head, first, out| {
            let rows = out.len() / dim;
            let queries: Vec<&[f32]> = (first..first + rows).map(|r| q.row(head, r)).collect();
            // Scores: the queries times the transposed keys, summed over dimensions in order.
            let mut flat = vec![0f32; rows * total];
            let key_dim = |d: usize| k.row(head, d);
            rows_times_matrix(&queries, key_dim, total, &mut flat);
            for row in flat.chunks_exact_mut(total) {
                softmax_in_place(row);
            }
            let scores: Vec<&[f32]> = flat.chunks_exact(total).collect();
            weighted_values(&scores, v, head, dim, out);
        },
    )
}

/// `out` (one row of `dim` per row of `weights`) = each row of `weights` times the values of
/// `head`, every output column summed over the keys in key order ([`rows_times_matrix`]).
fn weighted_values(weights: &[&[f32]], v: &HeadRows, head: usize, dim: usize, out: &mut [f32]) {
    rows_times_matrix(weights, |key| v.row(head, key), dim, out);
}

/// `out[r·width + c] = Σ_i coefficients[r][i] · matrix_row(i)[c]` for up to
/// [`MAX_PRODUCT_ROWS`] rows, each sum accumulated from zero in the order of i, so a row's
/// result is bit-identical whatever rows are beside it and however the columns are grouped.
/// The rows go together through groups of columns whose sums stay in registers (with AVX-512
/// all rows at once, 64 columns for up to 4 rows and 32 for more; else 4 rows at a time, 64
/// columns), then groups of [`LANES`], then single columns: each row of the matrix is read
/// once for the rows of a pass, and a group's columns are independent chains, so the
/// additions of consecutive terms overlap instead of waiting for each other (one chain of 16
/// lanes per row was bound by the latency of an addition).
fn rows_times_matrix<'m>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    width: usize,
    out: &mut [f32],
) {
    match coefficients.len() {
        0 => {}
        1 => rows_product::<1>(coefficients, matrix_row, width, out),
        2 => rows_product::<2>(coefficients, matrix_row, width, out),
        3 => rows_product::<3>(coefficients, matrix_row, width, out),
        4 => rows_product::<4>(coefficients, matrix_row, width, out),
        5 => rows_product::<5>(coefficients, matrix_row, width, out),
        6 => rows_product::<6>(coefficients, matrix_row, width, out),
        7 => rows_product::<7>(coefficients, matrix_row, width, out),
        MAX_PRODUCT_ROWS => rows_product::<MAX_PRODUCT_ROWS>(coefficients, matrix_row, width, out),
        rows => panic!("{rows} rows in one product, at most {MAX_PRODUCT_ROWS}"),
    }
}

/// Rows of one [`rows_times_matrix`]; the attention blocks hand it at most this many.
const MAX_PRODUCT_ROWS: usize = 8;
const _: () = assert!(SELF_ROW_BLOCK <= MAX_PRODUCT_ROWS && CROSS_ROW_BLOCK <= MAX_PRODUCT_ROWS);

/// Rows that go through the plain loop's column groups together: their sums fill the
/// registers.
const PLAIN_ROWS: usize = 4;

/// The wide column group of the plain loop: four vectors of 16 lanes per row.
const WIDE_COLUMNS: usize = 64;

/// [`rows_times_matrix`] for `ROWS` rows: on 512-bit registers where the CPU has them, else
/// in plain Rust.
fn rows_product<'m, const ROWS: usize>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    width: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was just detected.
        unsafe {
            if ROWS <= PLAIN_ROWS {
                avx512::columns_in_groups::<ROWS, 4>(coefficients, matrix_row, width, out)
            } else {
                avx512::columns_in_groups::<ROWS, 2>(coefficients, matrix_row, width, out)
            }
        }
        return;
    }
    plain_rows_product(coefficients, matrix_row, width, out);
}

/// [`rows_times_matrix`] in plain Rust, in passes of up to [`PLAIN_ROWS`] rows.
fn plain_rows_product<'m>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    width: usize,
    out: &mut [f32],
) {
    for (pass, rows) in coefficients.chunks(PLAIN_ROWS).enumerate() {
        let out = &mut out[pass * PLAIN_ROWS * width..];
        match rows.len() {
            1 => columns_in_groups::<1>(rows, matrix_row, width, out),
            2 => columns_in_groups::<2>(rows, matrix_row, width, out),
            3 => columns_in_groups::<3>(rows, matrix_row, width, out),
            _ => columns_in_groups::<PLAIN_ROWS>(rows, matrix_row, width, out),
        }
    }
}

/// The plain loop of [`rows_times_matrix`] for `ROWS` rows.
fn columns_in_groups<'m, const ROWS: usize>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    width: usize,
    out: &mut [f32],
) {
    let wide = width - width % WIDE_COLUMNS;
    for start in (0..wide).step_by(WIDE_COLUMNS) {
        column_group::<ROWS, WIDE_COLUMNS>(coefficients, matrix_row, start, width, out);
    }
    narrow_columns::<ROWS>(coefficients, matrix_row, wide, width, out);
}

/// Columns `from..width` of [`rows_times_matrix`] for `ROWS` rows: groups of [`LANES`], then
/// single columns.
#[inline(always)]
fn narrow_columns<'m, const ROWS: usize>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
    from: usize,
    width: usize,
    out: &mut [f32],
) {
    let lanes = from + (width - from) / LANES * LANES;
    for start in (from..lanes).step_by(LANES) {
        column_group::<ROWS, LANES>(coefficients, matrix_row, start, width, out);
    }
    for start in lanes..width {
        column_group::<ROWS, 1>(coefficients, matrix_row, start, width, out);
    }
}

/// Columns `start..start + COLS` of [`rows_times_matrix`] for the `ROWS` rows of
/// `coefficients`.
#[inline(always)]
fn column_group<'m, const ROWS: usize, const COLS: usize>(
    coefficients: &[&[f32]],
    matrix_row: impl Fn(usize) -> &'m [f32],
    start: usize,
    width: usize,
    out: &mut [f32],
) {
    let terms = coefficients[0].len();
    // A fixed number of rows keeps every sum in a register.
    let rows: &[&[f32]; ROWS] = coefficients.try_into().expect("ROWS rows");
    let mut acc = [[0f32; COLS]; ROWS];
    let ahead = rows_ahead(COLS);
    for i in 0..terms {
        if i + ahead < terms {
            prefetch(&matrix_row(i + ahead)[start..start + COLS]);
        }
        let row: &[f32; COLS] = matrix_row(i)[start..start + COLS]
            .try_into()
            .expect("a group of COLS columns");
        for (acc, coefficients) in acc.iter_mut().zip(rows) {
            let c = coefficients[i];
            for l in 0..COLS {
                acc[l] += c * row[l];
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        out[r * width + start..r * width + start + COLS].copy_from_slice(acc);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::rows_times_matrix`] for `ROWS` rows on 512-bit registers, in groups of
    /// `VECTORS` vectors of 16 columns (the rows' sums, `ROWS · VECTORS` vectors, stay in
    /// registers), then the plain loop's narrow groups: the same product and then sum per
    /// column and term, in the same order (never fused), so the same bits as the plain loop,
    /// which the compiler keeps to 256-bit registers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn columns_in_groups<'m, const ROWS: usize, const VECTORS: usize>(
        coefficients: &[&[f32]],
        matrix_row: impl Fn(usize) -> &'m [f32] + Copy,
        width: usize,
        out: &mut [f32],
    ) {
        let group = 16 * VECTORS;
        let terms = coefficients[0].len();
        let rows: &[&[f32]; ROWS] = coefficients.try_into().expect("ROWS rows");
        assert!(rows.iter().all(|r| r.len() == terms) && out.len() >= ROWS * width);
        let wide = width - width % group;
        let ahead = super::rows_ahead(group);
        for start in (0..wide).step_by(group) {
            let mut acc = [[_mm512_setzero_ps(); VECTORS]; ROWS];
            for i in 0..terms {
                if i + ahead < terms {
                    super::prefetch(&matrix_row(i + ahead)[start..start + group]);
                }
                let columns = &matrix_row(i)[start..start + group];
                // SAFETY: `columns` holds VECTORS loads of 16.
                let values: [__m512; VECTORS] = std::array::from_fn(|v| unsafe {
                    _mm512_loadu_ps(columns.as_ptr().add(16 * v))
                });
                for (acc, coefficients) in acc.iter_mut().zip(rows) {
                    let c = _mm512_set1_ps(coefficients[i]);
                    for (acc, values) in acc.iter_mut().zip(&values) {
                        *acc = _mm512_add_ps(*acc, _mm512_mul_ps(c, *values));
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let row = &mut out[r * width + start..r * width + start + group];
                for (v, acc) in acc.iter().enumerate() {
                    // SAFETY: `row` holds VECTORS stores of 16.
                    unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(16 * v), *acc) };
                }
            }
        }
        super::narrow_columns::<ROWS>(coefficients, matrix_row, wide, width, out);
    }
}

/// Query rows per block of [`blocked_attention`]: their scores over 1500 keys (384 KB) stay
/// in the core's cache between the two products.
const QUERY_BLOCK: usize = 64;

/// Attention of many query rows over every key (an encoder's self-attention): per head and
/// block of [`QUERY_BLOCK`] rows on the kernels' threads, `S = Q·Kᵀ` and `S·V` by the `gemm`
/// crate with the softmax in between, so the `rows × keys` score matrix (1500 × 1500 per
/// head for a Whisper window) is never written to memory whole. `queries` are already scaled;
/// shapes as in [`row_attention`].
fn blocked_attention(queries: &Tensor, keys: &Tensor, values: &Tensor) -> Result<Tensor> {
    let (_, heads, rows, dim) = queries.dims4()?;
    let total = keys.dim(2)?;
    let out = with_cpu_values(queries, |q| {
        with_cpu_values(keys, |k| {
            with_cpu_values(values, |v| {
                blocked_products(q, k, v, heads, rows, total, dim)
            })
        })
    })???;
    Ok(Tensor::from_vec(out, (1, heads, rows, dim), &Device::Cpu)?)
}

/// [`blocked_attention`] on the values of `q` `[heads, rows, dim]` and `k`, `v`
/// `[heads, total, dim]`, row-major.
fn blocked_products(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    rows: usize,
    total: usize,
    dim: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; heads * rows * dim];
    for (head, out) in out.chunks_exact_mut(rows * dim).enumerate() {
        let q = &q[head * rows * dim..(head + 1) * rows * dim];
        let k = &k[head * total * dim..(head + 1) * total * dim];
        let v = &v[head * total * dim..(head + 1) * total * dim];
        spec_kernels::parallel_chunks_mut(out, QUERY_BLOCK * dim, &|block, out| {
            let first = block * QUERY_BLOCK;
            let n = out.len() / dim;
            let q = &q[first * dim..(first + n) * dim];
            let mut scores = vec![0f32; n * total];
            // SAFETY: every pointer covers the matrix its strides describe: `q` n × dim and
            // `k` total × dim row-major (read transposed), `scores` n × total, `v` total × dim,
            // `out` n × dim.
            unsafe {
                gemm::gemm(
                    n,
                    total,
                    dim,
                    scores.as_mut_ptr(),
                    1,
                    total as isize,
                    false,
                    q.as_ptr(),
                    1,
                    dim as isize,
                    k.as_ptr(),
                    dim as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            for row in scores.chunks_exact_mut(total) {
                softmax_in_place(row);
            }
            // SAFETY: as above.
            unsafe {
                gemm::gemm(
                    n,
                    dim,
                    total,
                    out.as_mut_ptr(),
                    1,
                    dim as isize,
                    false,
                    scores.as_ptr(),
                    1,
                    total as isize,
                    v.as_ptr(),
                    1,
                    dim as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        });
    }
    out
}

/// The self-attention mask of one forward of `n` new inputs after `cached` ones, prepared once
/// for all layers in the form the attention path for `n` rows needs.
#[derive(Debug)]
pub enum AttentionMask {
    /// Row-by-row attention (every self-attention forward on the CPU, whatever its length):
    /// causal after `cached` positions, or an additive bias `[n, L]`.
    /// `seen`: where the bias hides at least half of its entries (answers decoded in
    /// lockstep, each seeing its own tokens), the keys each row sees, found once for all layers.
    Rows {
        bias: Option<Vec<f32>>,
        seen: Option<Vec<Vec<usize>>>,
        cached: usize,
    },
    /// Batched attention (other devices): an additive bias `[1, 1, 1, n, L]`.
    Batched(Tensor),
}

impl AttentionMask {
    /// `mask`: an additive bias `[1, 1, n, cached + n]` (a token tree's), or `None` for causal
    /// attention over the new inputs.
    pub fn new(mask: Option<&Tensor>, n: usize, cached: usize, device: &Device) -> Result<Self> {
        let width = cached + n;
        Ok(match (mask, device.is_cpu()) {
            (None, true) => Self::Rows {
                bias: None,
                seen: None,
                cached,
            },
            (Some(mask), true) => {
                let bias: Vec<f32> = mask.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
                if bias.len() != n * width {
                    return Err(Error::Config(format!(
                        "an attention bias of {} values for {n} rows over {width} keys",
                        bias.len()
                    )));
                }
                let visible = bias.iter().filter(|&&b| b > f32::NEG_INFINITY).count();
                let seen = (n > 0 && 2 * visible <= bias.len()).then(|| {
                    bias.chunks_exact(width)
                        .map(|row| {
                            (0..row.len())
                                .filter(|&j| row[j] > f32::NEG_INFINITY)
                                .collect()
                        })
                        .collect()
                });
                Self::Rows {
                    bias: Some(bias),
                    seen,
                    cached,
                }
            }
            (None, false) => {
                Self::Batched(causal_mask(n, cached, device)?.reshape((1, 1, 1, n, width))?)
            }
            (Some(mask), false) => {
                Self::Batched(mask.to_dtype(DType::F32)?.reshape((1, 1, 1, n, width))?)
            }
        })
    }

    /// `Err` unless a row mask was built for the `cached` positions a layer's cache holds (its
    /// bias rows and causal offsets count them).
    fn check_cached(&self, cached: usize) -> Result<()> {
        match self {
            Self::Rows { cached: built, .. } if *built != cached => Err(Error::Config(format!(
                "an attention mask built after {built} cached positions, for a cache of {cached}"
            ))),
            _ => Ok(()),
        }
    }

    /// Which keys each query row sees, for row attention; `None` for a batched mask.
    fn row_mask(&self) -> Option<RowMask<'_>> {
        match self {
            Self::Rows {
                bias: Some(bias),
                seen,
                ..
            } => Some(RowMask::Bias {
                bias,
                seen: seen.as_deref(),
            }),
            Self::Rows {
                bias: None, cached, ..
            } => Some(RowMask::Causal { cached: *cached }),
            Self::Batched(_) => None,
        }
    }
}

/// Additive causal mask `[1, 1, n, cached + n]` for n new tokens after `cached` ones.
fn causal_mask(n: usize, cached: usize, device: &Device) -> Result<Tensor> {
    let width = cached + n;
    let data: Vec<f32> = (0..n)
        .flat_map(|i| {
            (0..width).map(move |j| {
                if j <= cached + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Ok(Tensor::from_vec(data, (1, 1, n, width), device)?)
}

/// Head layout of an attention block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; `heads` is a multiple of it (grouped-query attention).
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Heads {
    pub fn new(heads: usize, kv_heads: usize, head_dim: usize) -> Result<Self> {
        if heads == 0 || kv_heads == 0 || head_dim == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::Config(format!(
                "{heads} attention heads of {head_dim} dimensions cannot share {kv_heads} key/value heads"
            )));
        }
        Ok(Self {
            heads,
            kv_heads,
            head_dim,
        })
    }

    /// `[1, n, h·d]` → `[1, h, n, d]`, contiguous.
    fn split(&self, t: &Tensor, h: usize) -> Result<Tensor> {
        let n = t.dim(1)?;
        Ok(t.reshape((1, n, h, self.head_dim))?
            .transpose(1, 2)?
            .contiguous()?)
    }

    /// Attention of `q` `[1, heads, n, d]` over `keys`/`values` `[1, kv_heads, L, d]`, merged
    /// back to `[1, n, heads·d]`. `mask` `None`: every key is visible (cross-attention).
    fn attend(
        &self,
        q: &Tensor,
        keys: Keys<'_>,
        values: &Tensor,
        mask: Option<&AttentionMask>,
    ) -> Result<Tensor> {
        let (keys, transposed) = match keys {
            Keys::Rows(keys) => (keys, None),
            Keys::Both { keys, transposed } => (keys, Some(transposed)),
        };
        let Self {
            heads,
            kv_heads,
            head_dim: d,
        } = *self;
        let (group, n, total) = (heads / kv_heads, q.dim(2)?, keys.dim(2)?);
        // The `group` query heads sharing a key/value head become rows of one matmul.
        let q = (q.reshape((1, kv_heads, group * n, d))? * (1.0 / (d as f64).sqrt()))?;
        let out = match (mask.and_then(AttentionMask::row_mask), mask) {
            (Some(rows), _) => row_attention(&q, keys, values, n, &rows)?,
            (None, None) if q.device().is_cpu() => match transposed {
                Some(keys_t) if n <= ROW_ATTENTION_MAX_ROWS => {
                    cross_row_attention(&q, keys_t, values)?
                }
                _ => blocked_attention(&q, keys, values)?,
            },
            (None, mask) => {
                let scores = q.matmul(&keys.t()?)?;
                let scores = match mask {
                    Some(AttentionMask::Batched(mask)) => scores
                        .reshape((1, kv_heads, group, n, total))?
                        .broadcast_add(mask)?
                        .reshape((1, kv_heads, group * n, total))?,
                    _ => scores,
                };
                candle_nn::ops::softmax_last_dim(&scores)?.matmul(values)?
            }
        };
        Ok(out
            .reshape((1, heads, n, d))?
            .transpose(1, 2)?
            .reshape((1, n, heads * d))?)
    }
}

/// The keys an attention reads: `[1, kv_heads, L, dim]`, and for cross-attention also their
/// transpose `[1, kv_heads, dim, L]` (decoding rows read that).
#[derive(Clone, Copy)]
enum Keys<'a> {
    Rows(&'a Tensor),
    Both {
        keys: &'a Tensor,
        transposed: &'a Tensor,
    },
}

/// Self-attention whose keys and values go to a `spec_core` KV cache layer: rollback and
/// tree-path compaction are the cache's; positions (rotary) and masks come with each forward.
#[derive(Debug, Clone)]
pub struct SelfAttention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub heads: Heads,
}

impl SelfAttention {
    /// `x` `[1, n, hidden]` → `[1, n, hidden]`; `rotary` rotates queries and keys (None for
    /// models with absolute positions); the new keys and values are appended to `cache`.
    pub fn forward(
        &self,
        x: &Tensor,
        rotary: Option<&RotaryTables>,
        mask: &AttentionMask,
        cache: &mut LayerKvCache,
    ) -> Result<Tensor> {
        mask.check_cached(cache.len())?;
        let h = self.heads;
        let [q, k, v] = Linear::forward_many([&self.q, &self.k, &self.v], x)?;
        let (mut q, mut k) = (h.split(&q, h.heads)?, h.split(&k, h.kv_heads)?);
        if let Some(tables) = rotary {
            q = tables.rotate(&q)?;
            k = tables.rotate(&k)?;
        }
        let v = h.split(&v, h.kv_heads)?;
        let (keys, values) = cache.append(&k, &v)?;
        let out = h.attend(&q, Keys::Rows(&keys), &values, Some(mask))?;
        Ok(self.o.forward(&out)?)
    }

    /// [`SelfAttention::forward`] on the CPU with every projection on the kernels, for `n`
    /// input rows given as values (`x`: `[n, hidden]` row-major) and giving values back: the
    /// same arithmetic in the same order, so the same bits, without a tensor (an allocation
    /// and a dispatch on the calling thread, while the kernels' worker waits) per step.
    /// `Err` when a projection is not on the kernels or `mask` is not a CPU row mask.
    pub fn forward_rows(
        &self,
        x: &[f32],
        n: usize,
        rotary: Option<&RotaryTables>,
        mask: &AttentionMask,
        cache: &mut LayerKvCache,
    ) -> Result<Vec<f32>> {
        let Heads {
            heads,
            kv_heads,
            head_dim: d,
        } = self.heads;
        let Some(row_mask) = mask.row_mask() else {
            return Err(Error::Config("row attention needs a CPU row mask".into()));
        };
        mask.check_cached(cache.len())?;
        let [mut q, mut k, v] = Linear::forward_many_rows([&self.q, &self.k, &self.v], x, n)?;
        if let Some(tables) = rotary {
            tables.rotate_rows(&mut q, n, heads, d)?;
            tables.rotate_rows(&mut k, n, kv_heads, d)?;
        }
        // `[n, heads, d]` → `[heads, n, d]`, as the cache and the stacked queries lie.
        let by_head = |values: &[f32], h: usize| -> Vec<f32> {
            let mut out = vec![0f32; values.len()];
            for (t, row) in values.chunks_exact(h * d).enumerate() {
                for (head, part) in row.chunks_exact(d).enumerate() {
                    out[(head * n + t) * d..(head * n + t + 1) * d].copy_from_slice(part);
                }
            }
            out
        };
        let as_cache = |values: &[f32]| -> Result<Tensor> {
            Ok(Tensor::from_vec(
                by_head(values, kv_heads),
                (1, kv_heads, n, d),
                &Device::Cpu,
            )?)
        };
        let (keys, values) = cache.append(&as_cache(&k)?, &as_cache(&v)?)?;
        // The `group` query heads of a key/value head are its stacked rows, scaled as
        // `Heads::attend` scales them (candle's affine: `q · s + 0`).
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        let stacked_queries: Vec<f32> = by_head(&q, heads)
            .iter()
            .map(|&q| q * scale + 0.0)
            .collect();
        let group = heads / kv_heads;
        let stacked = Tensor::from_vec(stacked_queries, (1, kv_heads, group * n, d), &Device::Cpu)?;
        let attended = row_attention(&stacked, &keys, &values, n, &row_mask)?;
        // Stacked rows `[kv_heads, group · n, d]` (row g·n + t of key/value head h is query
        // head h·group + g of token t) → `[n, heads · d]`.
        let mut merged = vec![0f32; n * heads * d];
        with_cpu_values(&attended, |attended| {
            for head in 0..heads {
                let (kv, g) = (head / group, head % group);
                for t in 0..n {
                    let from = ((kv * group + g) * n + t) * d;
                    merged[(t * heads + head) * d..(t * heads + head + 1) * d]
                        .copy_from_slice(&attended[from..from + d]);
                }
            }
        })?;
        let [out] = Linear::forward_many_rows([&self.o], &merged, n)?;
        Ok(out)
    }
}

/// Keys and values of one encoder output for one cross-attention layer, `[1, heads, frames,
/// head_dim]`: computed once per audio window and reused by every decoder step.
#[derive(Debug, Clone)]
pub struct CrossKv {
    keys: Tensor,
    /// The keys transposed, `[1, heads, head_dim, frames]`, for decoding rows.
    keys_t: Tensor,
    values: Tensor,
}

impl CrossKv {
    /// Encoder frames the keys cover.
    pub fn frames(&self) -> usize {
        self.keys.dim(2).unwrap_or(0)
    }
}

/// Attention of decoder states over an encoder's output (every frame visible).
#[derive(Debug, Clone)]
pub struct CrossAttention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub heads: Heads,
}

impl CrossAttention {
    /// The keys and values of `encoder_output` `[1, frames, hidden]`.
    pub fn keys_values(&self, encoder_output: &Tensor) -> Result<CrossKv> {
        let h = self.heads;
        let [k, v] = Linear::forward_many([&self.k, &self.v], encoder_output)?;
        let keys = h.split(&k, h.kv_heads)?;
        Ok(CrossKv {
            keys_t: keys.transpose(2, 3)?.contiguous()?,
            keys,
            values: h.split(&v, h.kv_heads)?,
        })
    }

    /// `x` `[1, n, hidden]` → `[1, n, hidden]`.
    pub fn forward(&self, x: &Tensor, encoded: &CrossKv) -> Result<Tensor> {
        let h = self.heads;
        let q = h.split(&self.q.forward(x)?, h.heads)?;
        let keys = Keys::Both {
            keys: &encoded.keys,
            transposed: &encoded.keys_t,
        };
        let out = h.attend(&q, keys, &encoded.values, None)?;
        Ok(self.o.forward(&out)?)
    }
}

#[cfg(test)]
mod tests {
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
    fn lanes_on_registers_are_the_lanes_in_plain_rust() {
        let vector = |seed: usize| -> Vec<f32> {
            (0..136)
                .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 97.0 - 5.1)
                .collect()
        };
        let vectors: Vec<Vec<f32>> = (0..16).map(vector).collect();
        let pairs: [(&[f32], &[f32]); 8] =
            std::array::from_fn(|p| (vectors[p].as_slice(), vectors[15 - p].as_slice()));
        let expected = portable_pair_lanes(&pairs, 136);
        assert_eq!(
            pair_lanes(&pairs, 136).map(|l| l.map(f32::to_bits)),
            expected.map(|l| l.map(f32::to_bits))
        );
        assert_ne!(expected[0], [0.0; 8]);
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
                        let visible =
                            k < 4 || k - 4 == r || (k == 4 && r > 0) || (r == 4 && k == 6);
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
        let x =
            Tensor::randn(0f32, 1.0, (1, prompt_len + branches * len, HIDDEN), &device).unwrap();
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
    fn row_products_sum_every_column_in_term_order() {
        let value = |i: usize, j: usize| (((i + 5) * (j + 11) * 7919) % 307) as f32 / 53.0 - 2.9;
        for width in [1, 15, 16, 17, 48, 64, 80, 100, 128, 150] {
            let terms = 37;
            let matrix: Vec<Vec<f32>> = (0..terms)
                .map(|i| (0..width).map(|c| value(i, c)).collect())
                .collect();
            for rows in 1..=MAX_PRODUCT_ROWS {
                let coefficients: Vec<Vec<f32>> = (0..rows)
                    .map(|r| (0..terms).map(|i| value(100 + r, i)).collect())
                    .collect();
                let slices: Vec<&[f32]> = coefficients.iter().map(Vec::as_slice).collect();
                let mut fastest = vec![f32::NAN; rows * width];
                rows_times_matrix(&slices, |i| matrix[i].as_slice(), width, &mut fastest);
                let mut plain = vec![f32::NAN; rows * width];
                plain_rows_product(&slices, |i| matrix[i].as_slice(), width, &mut plain);
                for (r, coefficients) in coefficients.iter().enumerate() {
                    for c in 0..width {
                        let mut sum = 0f32;
                        for (i, &a) in coefficients.iter().enumerate() {
                            sum += a * matrix[i][c];
                        }
                        for out in [&fastest, &plain] {
                            assert_eq!(
                                out[r * width + c].to_bits(),
                                sum.to_bits(),
                                "{width} {r} {c}"
                            );
                        }
                    }
                }
            }
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
        for head in 0..n_heads {
            let pick = |t: &Tensor| t.narrow(1, head, 1).unwrap().squeeze(1).unwrap();
            let scores = (pick(&queries).matmul(&pick(&keys).t().unwrap()).unwrap()
                / (head_dim as f64).sqrt())
            .unwrap();
            let weights = candle_nn::ops::softmax_last_dim(&scores).unwrap();
            merged.push(weights.matmul(&pick(&vals)).unwrap());
        }
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
}
