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
use spec_kernels::attention::{block_scores, rows_times_matrix, weight_sums, MAX_PRODUCT_ROWS};

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

/// Runs `f` on the CPU tensors `queries`, `keys` and `values` seen as rows (`key_row`: the
/// length of a row of `keys`).
fn with_head_rows<T>(
    queries: &Tensor,
    keys: &Tensor,
    key_row: usize,
    values: &Tensor,
    f: impl FnOnce(&HeadRows<'_>, &HeadRows<'_>, &HeadRows<'_>) -> T,
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
type BlockFn<'a> =
    dyn Fn(&HeadRows<'_>, &HeadRows<'_>, &HeadRows<'_>, usize, usize, &mut [f32]) + Sync + 'a;

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
            attend_block(q, k, v, head, first, &mut out_block[..rows * dim]);
        });
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
            self_attention_block(q, k, v, head, first, total, n, mask, out);
        },
    )
}

/// One block of [`row_attention`]: stacked query rows `first..` of key/value head `head` over
/// its `total` keys, written to `out`.
#[allow(clippy::too_many_arguments)]
fn self_attention_block(
    q: &HeadRows<'_>,
    k: &HeadRows<'_>,
    v: &HeadRows<'_>,
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
        });
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
fn weighted_values(weights: &[&[f32]], v: &HeadRows<'_>, head: usize, dim: usize, out: &mut [f32]) {
    rows_times_matrix(weights, |key| v.row(head, key), dim, out);
}

const _: () = assert!(SELF_ROW_BLOCK <= MAX_PRODUCT_ROWS && CROSS_ROW_BLOCK <= MAX_PRODUCT_ROWS);

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
            row_major_product(n, total, dim, q, k, RhsLayout::Transposed, &mut scores);
            for row in scores.chunks_exact_mut(total) {
                softmax_in_place(row);
            }
            row_major_product(n, dim, total, &scores, v, RhsLayout::AsStored, out);
        });
    }
    out
}

/// How [`row_major_product`] reads its right-hand matrix.
#[derive(Clone, Copy)]
enum RhsLayout {
    /// `rhs` is `inner × cols`, row-major.
    AsStored,
    /// `rhs` is `cols × inner`, row-major, and is read transposed.
    Transposed,
}

/// `out` (`rows × cols`, row-major) = `lhs` (`rows × inner`, row-major) times `rhs` read as
/// [`RhsLayout`] says, by the `gemm` crate on the calling thread; `out` is overwritten, not
/// added to.
///
/// # Panics
/// If a slice's length is not that of the matrix it stands for.
fn row_major_product(
    rows: usize,
    cols: usize,
    inner: usize,
    lhs: &[f32],
    rhs: &[f32],
    rhs_layout: RhsLayout,
    out: &mut [f32],
) {
    assert_eq!(lhs.len(), rows * inner, "lhs is not rows × inner");
    assert_eq!(rhs.len(), inner * cols, "rhs is not inner × cols");
    assert_eq!(out.len(), rows * cols, "out is not rows × cols");
    let (rhs_col_stride, rhs_row_stride) = match rhs_layout {
        RhsLayout::AsStored => (1, cols as isize),
        RhsLayout::Transposed => (inner as isize, 1),
    };
    // SAFETY: the lengths asserted above make every pointer cover the matrix its strides
    // describe: `out` rows × cols and `lhs` rows × inner row-major (column stride 1, row stride
    // the row's length), `rhs` inner × cols either row-major or as the transpose of a row-major
    // cols × inner. `out` is a unique borrow, so it aliases neither input.
    unsafe {
        gemm::gemm(
            rows,
            cols,
            inner,
            out.as_mut_ptr(),
            1,
            cols as isize,
            false,
            lhs.as_ptr(),
            1,
            inner as isize,
            rhs.as_ptr(),
            rhs_col_stride,
            rhs_row_stride,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
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

    /// The attention scores of `x` `[1, n, hidden]` over the encoded frames for the query
    /// heads `heads`, scaled by 1/√head_dim and before the softmax: `[heads.len(), n, frames]`
    /// (what Whisper's word alignment reads from its alignment heads).
    pub fn scores(&self, x: &Tensor, encoded: &CrossKv, heads: &[usize]) -> Result<Tensor> {
        let h = self.heads;
        if let Some(bad) = heads.iter().find(|&&head| head >= h.heads) {
            return Err(Error::Config(format!(
                "attention head {bad} asked of a layer with {} heads",
                h.heads
            )));
        }
        let q = h.split(&self.q.forward(x)?, h.heads)?;
        let scale = 1.0 / (h.head_dim as f64).sqrt();
        let group = h.heads / h.kv_heads;
        let rows = heads
            .iter()
            .map(|&head| {
                let q = (q.get(0)?.get(head)? * scale)?;
                let k = encoded.keys.get(0)?.get(head / group)?;
                q.matmul(&k.t()?)
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        if rows.is_empty() {
            let (n, frames) = (x.dim(1)?, encoded.frames());
            return Ok(Tensor::zeros((0, n, frames), DType::F32, x.device())?);
        }
        Ok(Tensor::stack(&rows, 0)?)
    }
}

#[cfg(test)]
mod tests;
