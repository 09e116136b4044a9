//! Attention for short forwards, computed one query row at a time in a fixed order.
//!
//! Greedy speculative decoding is lossless only if verifying k tokens in one forward gives each
//! of them exactly the logits that decoding it alone gives. candle's batched matmul picks its
//! kernel by the number of rows, and the rounding of `Q·Kᵀ` then differs in the last bits,
//! enough to flip near-ties. Here every query row's scores, softmax and weighted sum of values
//! are computed by the same code in the same order whatever the number of rows, so decoding
//! (1 token) and verification (a few tokens, or a token tree) agree bit for bit.

use candle_core::{Device, Layout, Storage, Tensor};

use crate::math::exp;
use crate::{Error, Result};

/// Which keys each new query row may see.
pub(crate) enum RowMask<'a> {
    /// Query i sees keys `0..=cached + i`.
    Causal { cached: usize },
    /// An additive bias per query row, `[n, keys]`.
    Bias(&'a [f32]),
}

impl RowMask<'_> {
    fn bias(&self, row: usize, key: usize, keys: usize) -> f32 {
        match self {
            Self::Causal { cached } => {
                if key <= cached + row {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            }
            Self::Bias(bias) => bias[row * keys + key],
        }
    }
}

/// A `[1, heads, rows, dim]` f32 CPU tensor seen as slices, whatever its strides.
struct HeadRows<'a> {
    data: &'a [f32],
    offset: usize,
    head_stride: usize,
    row_stride: usize,
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
        })
    }

    fn row(&self, head: usize, row: usize, dim: usize) -> &'a [f32] {
        let start = self.offset + head * self.head_stride + row * self.row_stride;
        &self.data[start..start + dim]
    }
}

/// Dot product with eight fixed accumulation lanes (vectorises, same order on every call).
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
    lanes.iter().sum::<f32>() + tail
}

/// Attention of `queries` `[1, kv_heads, group·n, dim]` (already scaled by 1/√dim, the `group`
/// query heads of each key/value head stacked, n rows each) over `keys`/`values`
/// `[1, kv_heads, L, dim]`; returns `[1, kv_heads, group·n, dim]`.
pub(crate) fn row_attention(
    queries: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    n: usize,
    mask: &RowMask<'_>,
) -> Result<Tensor> {
    let (_, kv_heads, stacked, dim) = queries.dims4()?;
    let total = keys.dim(2)?;
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
    let k = HeadRows::new(k.as_slice::<f32>()?, k_layout, dim)?;
    let v = HeadRows::new(v.as_slice::<f32>()?, v_layout, dim)?;
    let mut out = vec![0f32; kv_heads * stacked * dim];
    // On the kernels' threads, which are awake between the matmuls around it.
    spec_kernels::parallel_chunks_mut(&mut out, dim, &|index, out_row| {
        let (head, row) = (index / stacked, index % stacked);
        let query = q.row(head, row, dim);
        let position = row % n;
        let mut weights = vec![f32::NEG_INFINITY; total];
        let mut max = f32::NEG_INFINITY;
        for (key, w) in weights.iter_mut().enumerate() {
            let bias = mask.bias(position, key, total);
            if bias > f32::NEG_INFINITY {
                *w = dot(query, k.row(head, key, dim)) + bias;
                max = max.max(*w);
            }
        }
        let mut sum = 0f32;
        for w in weights.iter_mut() {
            *w = if *w > f32::NEG_INFINITY {
                exp(*w - max)
            } else {
                0.0
            };
            sum += *w;
        }
        for (key, &w) in weights.iter().enumerate() {
            if w > 0.0 {
                for (o, x) in out_row.iter_mut().zip(v.row(head, key, dim)) {
                    *o += w * x;
                }
            }
        }
        out_row.iter_mut().for_each(|o| *o /= sum);
    });
    drop((q_storage, k_storage, v_storage));
    Ok(Tensor::from_vec(
        out,
        (1, kv_heads, stacked, dim),
        &Device::Cpu,
    )?)
}
