//! Element-wise math in straight-line arithmetic that the compiler vectorises.

/// `eˣ` in straight-line arithmetic the compiler vectorises (Cephes' `expf`): x = n·ln 2 + r
/// with |r| ≤ ln 2 / 2, eʳ by a degree-6 polynomial, 2ⁿ built in the exponent bits. Within
/// 2 ulp of `f32::exp` on [-87, 88]; inputs beyond are clamped to that range (e⁻⁸⁷ ≈ 1.6·10⁻³⁸),
/// so finite x never give 0, infinity or NaN.
#[inline]
pub fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    e_r * two_to_the(n)
}

/// 2ⁿ for an integral `n` in [-126, 127], built in the exponent bits. Adding 1.5·2²³ leaves n
/// in the low mantissa bits as a two's complement (exact for |n| < 2²²), so the whole of
/// [`exp`] stays in vector registers; `n as i32`, which saturates, went lane by lane and made
/// `exp` several times slower.
#[inline(always)]
fn two_to_the(n: f32) -> f32 {
    const SHIFTER: f32 = 12_582_912.0;
    let n_bits = (n + SHIFTER).to_bits().wrapping_sub(SHIFTER.to_bits());
    f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// Lanes of the vectorised reductions below (their order of accumulation is fixed).
const LANES: usize = 16;

/// The largest value (−∞ for an empty slice), reduced over `LANES` lanes.
#[inline]
pub fn max(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for chunk in chunks {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l = l.max(v);
        }
    }
    lanes.iter().copied().fold(tail, f32::max)
}

/// The sum, accumulated over `LANES` lanes.
#[inline]
pub fn sum(values: &[f32]) -> f32 {
    lane_sum(values, |v| v)
}

/// `sum(exp(values - shift))` with [`exp`], accumulated over `LANES` lanes: a softmax's
/// normaliser after subtracting the largest value, without storing the exponentials.
#[inline]
pub fn exp_sum(values: &[f32], shift: f32) -> f32 {
    lane_sum(values, |v| exp(v - shift))
}

/// The sum of `term` over `values`, accumulated over `LANES` lanes in a fixed order.
#[inline]
fn lane_sum(values: &[f32], term: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&v| term(v)).sum();
    for chunk in chunks {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l += term(v);
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Softmax of a row in place, in three vectorised passes (max, exponentials, scaling).
pub fn softmax_in_place(row: &mut [f32]) {
    let top = max(row);
    for v in row.iter_mut() {
        *v = exp(*v - top);
    }
    let scale = 1.0 / sum(row);
    for v in row.iter_mut() {
        *v *= scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_matches_the_direct_formula() {
        let row: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 23) as f32 * 0.7 - 5.0)
            .collect();
        let mut ours = row.clone();
        softmax_in_place(&mut ours);
        let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f32 = row.iter().map(|v| (v - top).exp()).sum();
        for (o, v) in ours.iter().zip(&row) {
            assert!((o - (v - top).exp() / total).abs() < 1e-6);
        }
        assert!((sum(&ours) - 1.0).abs() < 1e-5);
        let shifted: Vec<f32> = row.iter().map(|v| exp(v - top)).collect();
        assert_eq!(exp_sum(&row, top), sum(&shifted));
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        assert_eq!(max(&row), top);
    }

    #[test]
    fn powers_of_two_from_the_exponent_bits_are_exact() {
        for n in -126..=127 {
            assert_eq!(two_to_the(n as f32), 2f32.powi(n), "2^{n}");
        }
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_standard_library() {
        let mut x = -87.0f32;
        while x <= 88.0 {
            let (ours, std) = (exp(x), x.exp());
            let ulp = (std.to_bits() as i64 - ours.to_bits() as i64).abs();
            assert!(ulp <= 2, "exp({x}) = {ours}, std {std}: {ulp} ulp apart");
            x += 0.001_37;
        }
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert!(exp(1000.0).is_finite() && exp(f32::NEG_INFINITY) >= 0.0);
    }
}
