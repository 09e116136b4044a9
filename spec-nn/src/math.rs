//! Element-wise math in straight-line arithmetic that the compiler vectorises.

/// `eˣ` in straight-line arithmetic the compiler vectorises (Cephes' `expf`): x = n·ln 2 + r
/// with |r| ≤ ln 2 / 2, eʳ by a degree-6 polynomial, 2ⁿ built in the exponent bits. Within
/// 2 ulp of `f32::exp` on [-87, 88]; inputs beyond are clamped to that range (e⁻⁸⁷ ≈ 1.6·10⁻³⁸),
/// so finite x never give 0, infinity or NaN.
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
    e_r * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

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
