//! Activations quantized to signed bytes, once per matmul, for integer dot products.
//!
//! Each token's row is cut into blocks of 32 (for the 32-weight formats) or 256 (K-quants)
//! values with one f32 scale each: d = max|x| / 127, q = x / d rounded half to even. Every
//! group of 32 values also keeps its sum and, for the K-quants, every group of 16 its sum times
//! −32. The kernels need them for the formats whose quants carry an offset or a minimum.

/// A batch of quantized token rows.
#[derive(Default)]
pub(crate) struct QuantizedTokens {
    pub cols: usize,
    /// Values per scale (32 or 256).
    pub block: usize,
    /// `tokens × cols / block` scales.
    pub scales: Vec<f32>,
    /// `tokens × cols` quants.
    pub quants: Vec<i8>,
    /// `tokens × cols / 32` sums of each group of 32 quants.
    pub group_sums: Vec<i16>,
    /// `tokens × cols / 16` sums of each group of 16 quants times −32: Q6_K's offset (its
    /// quants are stored 32 above their value; block 256, empty for 32).
    pub q6k_offsets: Vec<i32>,
}

/// Lanes of [`max_abs`].
const MAX_LANES: usize = 16;

/// The largest |v| (0 for an empty slice), over [`MAX_LANES`] lanes so that it vectorises: a
/// maximum does not depend on the order it is taken in, so this is bit for bit the sequential
/// fold's result.
fn max_abs(values: &[f32]) -> f32 {
    let mut lanes = [0f32; MAX_LANES];
    let chunks = values.chunks_exact(MAX_LANES);
    let tail = chunks.remainder().iter().fold(0f32, |m, v| m.max(v.abs()));
    for chunk in chunks {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *l = l.max(v.abs());
        }
    }
    lanes.iter().fold(tail, |m, &l| m.max(l))
}

impl QuantizedTokens {
    /// [`QuantizedTokens::quantize`] into new buffers (the tests' way; matmuls reuse theirs).
    #[cfg(test)]
    pub fn new(x: &[f32], tokens: usize, cols: usize, block: usize) -> Self {
        let mut quantized = Self::default();
        quantized.quantize(x, tokens, cols, block);
        quantized
    }

    /// Quantizes `tokens` rows of `cols` values (`cols` a multiple of `block`) into these
    /// buffers, replacing the earlier batch: a calling thread keeps one per block length, so a
    /// matmul allocates and frees nothing (the heap's bookkeeping is cold after a matmul has
    /// streamed its weights through the caches).
    pub fn quantize(&mut self, x: &[f32], tokens: usize, cols: usize, block: usize) {
        debug_assert_eq!(x.len(), tokens * cols);
        debug_assert_eq!(cols % block, 0);
        self.cols = cols;
        self.block = block;
        self.scales.clear();
        self.quants.clear();
        self.quants.resize(x.len(), 0);
        for (values, out) in x
            .chunks_exact(block)
            .zip(self.quants.chunks_exact_mut(block))
        {
            let max = max_abs(values);
            let scale = max / 127.0;
            let inverse = if max > 0.0 { 127.0 / max } else { 0.0 };
            for (q, &v) in out.iter_mut().zip(values) {
                let r = (v * inverse).round_ties_even().clamp(-127.0, 127.0);
                // A whole number in i8's range after the clamp (NaN, which `as` turns into 0,
                // is replaced by 0 first), so the unchecked conversion gives the byte of the
                // checked `r as i32 as i8`, and it vectorises (the checked one does not: it
                // was a scalar conversion per value, 3 % of a SmolLM2 forward).
                let r = if r.is_nan() { 0.0 } else { r };
                // SAFETY: `r` is finite and within -127..=127.
                *q = unsafe { r.to_int_unchecked::<i32>() } as i8;
            }
            self.scales.push(scale);
        }
        let sum = |q: &[i8]| q.iter().map(|&q| q as i32).sum::<i32>();
        self.q6k_offsets.clear();
        if block == 256 {
            let offsets = self.quants.chunks_exact(16).map(|g| -32 * sum(g));
            self.q6k_offsets.extend(offsets);
        }
        self.group_sums.clear();
        let group_sums = self.quants.chunks_exact(32).map(|g| sum(g) as i16);
        self.group_sums.extend(group_sums);
    }

    /// Token `t`'s quants.
    pub fn quants_of(&self, t: usize) -> &[i8] {
        &self.quants[t * self.cols..(t + 1) * self.cols]
    }

    /// Token `t`'s scales, one per block.
    pub fn scales_of(&self, t: usize) -> &[f32] {
        let per = self.cols / self.block;
        &self.scales[t * per..(t + 1) * per]
    }

    /// Token `t`'s group sums, one per group of 32.
    pub fn group_sums_of(&self, t: usize) -> &[i16] {
        let per = self.cols / 32;
        &self.group_sums[t * per..(t + 1) * per]
    }

    /// Token `t`'s Q6_K offsets, one per group of 16.
    pub fn q6k_offsets_of(&self, t: usize) -> &[i32] {
        let per = self.cols / 16;
        &self.q6k_offsets[t * per..(t + 1) * per]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quants_are_the_checked_conversion_of_the_rounded_values() {
        let mut values: Vec<f32> = (0..512)
            .map(|i| ((i * 7919) % 255) as f32 * 0.5 - 63.5)
            .collect();
        // Ties at every half, a NaN and infinities in their own blocks.
        values[40] = f32::NAN;
        values[300] = f32::INFINITY;
        values[301] = f32::NEG_INFINITY;
        for block in [32, 256] {
            let q = QuantizedTokens::new(&values, 2, 256, block);
            for (chunk, (quants, &scale)) in values
                .chunks_exact(block)
                .zip(q.quants.chunks_exact(block).zip(&q.scales))
            {
                let max = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert_eq!(scale.to_bits(), (max / 127.0).to_bits());
                let inverse = if max > 0.0 { 127.0 / max } else { 0.0 };
                let expected: Vec<i8> = chunk
                    .iter()
                    .map(|&v| (v * inverse).round_ties_even().clamp(-127.0, 127.0) as i32 as i8)
                    .collect();
                assert_eq!(quants, expected.as_slice(), "block of {block}");
            }
        }
    }

    #[test]
    fn the_lane_maximum_is_the_sequential_one() {
        for len in [0, 1, 15, 16, 17, 32, 256, 300] {
            let values: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 101) as f32 * if i % 3 == 0 { -0.37 } else { 0.21 })
                .collect();
            let sequential = values.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(max_abs(&values).to_bits(), sequential.to_bits(), "{len}");
        }
    }
}
