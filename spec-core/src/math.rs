//! Element-wise math in straight-line arithmetic that the compiler vectorises.

/// `eˣ` in straight-line arithmetic the compiler vectorises (Cephes' `expf`): x = n·ln 2 + r
/// with |r| ≤ ln 2 / 2, eʳ by a degree-6 polynomial, 2ⁿ built in the exponent bits. Within
/// 2 ulp of `f32::exp` on [-87, 88]; inputs beyond are clamped to that range (e⁻⁸⁷ ≈ 1.6·10⁻³⁸),
/// so finite x never give 0, infinity or NaN.
#[inline]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_MIN, EXP_MAX);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = EXP_POLYNOMIAL[0];
    let p = p * r + EXP_POLYNOMIAL[1];
    let p = p * r + EXP_POLYNOMIAL[2];
    let p = p * r + EXP_POLYNOMIAL[3];
    let p = p * r + EXP_POLYNOMIAL[4];
    let p = p * r + EXP_POLYNOMIAL[5];
    let e_r = p * r * r + r + 1.0;
    e_r * two_to_the(n)
}

/// The range [`exp`] clamps its input to.
const EXP_MIN: f32 = -87.0;
const EXP_MAX: f32 = 88.0;
/// ln 2 in two parts, so that `x − n·ln 2` loses no bits.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// The polynomial of eʳ's terms past `1 + r`, highest degree first (Horner's order).
const EXP_POLYNOMIAL: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];
/// 1.5·2²³: added to an integral float, it leaves the integer in the low mantissa bits.
const SHIFTER: f32 = 12_582_912.0;

/// 2ⁿ for an integral `n` in [-126, 127], built in the exponent bits. Adding 1.5·2²³ leaves n
/// in the low mantissa bits as a two's complement (exact for |n| < 2²²), so the whole of
/// [`exp`] stays in vector registers; `n as i32`, which saturates, went lane by lane and made
/// `exp` several times slower.
#[inline(always)]
fn two_to_the(n: f32) -> f32 {
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
/// normaliser after subtracting the largest value, without storing the exponentials. On
/// 512-bit registers where the CPU has them (the compiler keeps [`exp`] to 256 bits here), with
/// the same bits.
#[inline]
pub fn exp_sum(values: &[f32], shift: f32) -> f32 {
    let term = |v| exp(v - shift);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was just detected.
        let lanes = unsafe { avx512::exp_lanes(values, shift) };
        return finish_lane_sum(lanes, values, term);
    }
    lane_sum(values, term)
}

/// The sum of `term` over `values`, accumulated over `LANES` lanes in a fixed order.
#[inline]
fn lane_sum(values: &[f32], term: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0f32; LANES];
    for chunk in values.chunks_exact(LANES) {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l += term(v);
        }
    }
    finish_lane_sum(lanes, values, term)
}

/// The end of a [`lane_sum`] whose `lanes` hold the sums over the whole chunks of `values`:
/// the lanes in order, then the terms of the values past them.
#[inline]
fn finish_lane_sum(lanes: [f32; LANES], values: &[f32], term: impl Fn(f32) -> f32) -> f32 {
    let tail: f32 = values
        .chunks_exact(LANES)
        .remainder()
        .iter()
        .map(|&v| term(v))
        .sum();
    lanes.iter().sum::<f32>() + tail
}

/// Softmax of a row in place, in three vectorised passes (max, exponentials, scaling).
pub fn softmax_in_place(row: &mut [f32]) {
    let top = max(row);
    exp_shifted_in_place(row, top);
    let scale = 1.0 / sum(row);
    for v in row.iter_mut() {
        *v *= scale;
    }
}

/// `v = exp(v - shift)` for every value, on 512-bit registers where the CPU has them (same
/// bits as [`exp`]).
fn exp_shifted_in_place(values: &mut [f32], shift: f32) {
    #[cfg(target_arch = "x86_64")]
    let done = if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was just detected.
        unsafe { avx512::exp_shifted_chunks(values, shift) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for v in &mut values[done..] {
        *v = exp(*v - shift);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{EXP_MAX, EXP_MIN, EXP_POLYNOMIAL, LANES, LN2_HI, LN2_LO, SHIFTER};

    /// [`super::exp`] of 16 values: the same operations in the same order, so the same bits (the
    /// clamp's maximum and minimum take the value second, so that NaN passes through as in
    /// `f32::clamp`).
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn exp16(x: __m512) -> __m512 {
        let splat = _mm512_set1_ps;
        let x = _mm512_min_ps(splat(EXP_MAX), _mm512_max_ps(splat(EXP_MIN), x));
        let n = _mm512_add_ps(
            _mm512_mul_ps(x, splat(std::f32::consts::LOG2_E)),
            splat(0.5),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(n);
        let r = _mm512_sub_ps(x, _mm512_mul_ps(n, splat(LN2_HI)));
        let r = _mm512_sub_ps(r, _mm512_mul_ps(n, splat(LN2_LO)));
        let mut p = splat(EXP_POLYNOMIAL[0]);
        for c in &EXP_POLYNOMIAL[1..] {
            p = _mm512_add_ps(_mm512_mul_ps(p, r), splat(*c));
        }
        let e_r = _mm512_add_ps(
            _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r),
            splat(1.0),
        );
        // 2ⁿ from the exponent bits, as `two_to_the` builds it.
        let n_bits = _mm512_sub_epi32(
            _mm512_castps_si512(_mm512_add_ps(n, splat(SHIFTER))),
            _mm512_set1_epi32(SHIFTER.to_bits() as i32),
        );
        let power = _mm512_slli_epi32::<23>(_mm512_add_epi32(n_bits, _mm512_set1_epi32(127)));
        _mm512_mul_ps(e_r, _mm512_castsi512_ps(power))
    }

    /// The `LANES` lane sums of `exp(v - shift)` over the whole chunks of `values`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_lanes(values: &[f32], shift: f32) -> [f32; LANES] {
        let shift = _mm512_set1_ps(shift);
        let mut lanes = _mm512_setzero_ps();
        for chunk in values.chunks_exact(LANES) {
            // SAFETY: a chunk holds 16 values.
            let v = unsafe { _mm512_loadu_ps(chunk.as_ptr()) };
            lanes = _mm512_add_ps(lanes, exp16(_mm512_sub_ps(v, shift)));
        }
        let mut out = [0f32; LANES];
        // SAFETY: `out` holds 16 values.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), lanes) };
        out
    }

    /// `v = exp(v - shift)` for the values of the whole chunks of 16; returns how many values
    /// that is.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_shifted_chunks(values: &mut [f32], shift: f32) -> usize {
        let shift = _mm512_set1_ps(shift);
        for chunk in values.chunks_exact_mut(LANES) {
            // SAFETY: a chunk holds 16 values.
            unsafe {
                let v = _mm512_loadu_ps(chunk.as_ptr());
                _mm512_storeu_ps(chunk.as_mut_ptr(), exp16(_mm512_sub_ps(v, shift)));
            }
        }
        values.len() - values.len() % LANES
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

    /// The infinities, NaN, zeros and the edges of `exp`'s range first (inside the first
    /// whole chunks of 16), then values across and beyond that range.
    fn awkward_values() -> Vec<f32> {
        let mut values = vec![
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            f32::MIN,
            f32::MAX,
            f32::MIN_POSITIVE,
            -87.0,
            88.0,
            88.7,
            -87.3,
            1e-30,
        ];
        values.extend((0..4000).map(|i| -120.0 + i as f32 * 0.0531));
        values
    }

    #[test]
    fn exponentials_on_wide_registers_are_the_bits_of_the_plain_loop() {
        let values = awkward_values();
        for shift in [0.0, 3.5, -2.25] {
            for len in [0, 1, 15, 16, 17, 33, 100, values.len()] {
                let values = &values[..len];
                let mut wide = values.to_vec();
                exp_shifted_in_place(&mut wide, shift);
                for (w, &v) in wide.iter().zip(values) {
                    assert_eq!(w.to_bits(), exp(v - shift).to_bits(), "exp({v} - {shift})");
                }
                let finite: Vec<f32> = values.iter().copied().filter(|v| !v.is_nan()).collect();
                let plain = lane_sum(&finite, |v| exp(v - shift));
                assert_eq!(exp_sum(&finite, shift).to_bits(), plain.to_bits(), "{len}");
            }
        }
        assert!(exp_sum(&[1.0, f32::NAN], 0.0).is_nan());
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
