//! [`Rows`] on AVX2: a panel's rows eight at a time in 256-bit registers, or all 16 in two.

use std::arch::x86_64::*;

use super::Rows;

/// Rows 8·HALF..8·HALF + 8 of a panel in a 256-bit register (AVX2).
pub(super) struct Ymm<const HALF: usize>;

impl<const HALF: usize> Rows for Ymm<HALF> {
    type I = __m256i;
    type F = __m256;
    const LANES: usize = 8;
    const FIRST_ROW: usize = 8 * HALF;
    const Q8_0_BIAS: i32 = 0;
    const WIDE_NARROW: bool = false;

    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: i32) -> __m256i {
        _mm256_set1_epi32(x)
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        _mm256_or_si256(a, b)
    }
    #[inline(always)]
    unsafe fn add(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn nibbles(chunk: *const u8) -> (__m256i, __m256i) {
        let bytes = _mm256_loadu_si256(chunk.add(32 * HALF) as *const __m256i);
        let mask = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(bytes, mask),
            _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask),
        )
    }
    #[inline(always)]
    unsafe fn bytes(chunk: *const u8) -> __m256i {
        _mm256_loadu_si256(chunk.add(32 * HALF) as *const __m256i)
    }
    #[inline(always)]
    unsafe fn q8_0_dot4(acc: __m256i, w: __m256i, a: *const i8) -> __m256i {
        // w · a = |w| · (a with w's sign): unsigned |w| ≤ 128 times |a| ≤ 127 cannot saturate.
        let w = _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN));
        let a = _mm256_set1_epi32((a as *const i32).read_unaligned());
        let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn q5_0_high_bits(masks: *const u8) -> (__m256i, __m256i) {
        let masks = masks as *const u64;
        let expand = |mask: u64| {
            // Byte i of this half takes bit 32·HALF + i of the mask: spread the mask's bytes
            // eight apiece, keep each byte's own bit and turn it into 16.
            let bits = _mm256_set1_epi32((mask >> (32 * HALF)) as u32 as i32);
            let spread = _mm256_shuffle_epi8(
                bits,
                _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                    3, 3, 3, 3, 3, 3,
                ),
            );
            let select = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
            _mm256_and_si256(set, _mm256_set1_epi8(16))
        };
        (
            expand(masks.read_unaligned()),
            expand(masks.add(1).read_unaligned()),
        )
    }
    #[inline(always)]
    unsafe fn q6k_high_bits(highs: *const u8) -> (__m256i, __m256i) {
        let bits = _mm256_loadu_si256(highs as *const __m256i);
        let bits = if HALF == 0 {
            bits
        } else {
            _mm256_srli_epi16(bits, 2)
        };
        let three = _mm256_set1_epi8(3);
        (
            _mm256_slli_epi16(_mm256_and_si256(bits, three), 4),
            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 4), three), 4),
        )
    }
    #[inline(always)]
    unsafe fn narrow_dot4(acc: __m256i, u: __m256i, a: *const i8) -> __m256i {
        let a = _mm256_set1_epi32((a as *const i32).read_unaligned());
        _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, a))
    }
    #[inline(always)]
    unsafe fn narrow_add(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi16(a, b)
    }
    #[inline(always)]
    unsafe fn widen(total: __m256i, narrow: __m256i) -> __m256i {
        _mm256_add_epi32(total, _mm256_madd_epi16(narrow, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn widen_scaled(total: __m256i, narrow: __m256i, scale: __m256i) -> __m256i {
        _mm256_add_epi32(total, _mm256_madd_epi16(narrow, scale))
    }
    #[inline(always)]
    unsafe fn q6k_widen_scaled(
        total: __m256i,
        low: __m256i,
        high: __m256i,
        offset: i32,
        scale: __m256i,
    ) -> __m256i {
        let total = Self::widen_scaled(Self::widen_scaled(total, low, scale), high, scale);
        // offset · s = (offset / 2) · s + (offset / 2) · s, each half within 16 bits.
        Self::widen_scaled(total, _mm256_set1_epi16((offset / 2) as i16), scale)
    }
    /// Each scale in both 16-bit halves of its lane, the factor `vpmaddwd` applies to both
    /// sums of a narrow lane.
    #[inline(always)]
    unsafe fn u8_scales(p: *const u8) -> __m256i {
        let scales = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8 * HALF) as *const __m128i));
        _mm256_or_si256(scales, _mm256_slli_epi32(scales, 16))
    }
    /// As [`Rows::u8_scales`], the high half a copy of the sign-extended low half.
    #[inline(always)]
    unsafe fn i8_scales(p: *const u8) -> __m256i {
        let scales = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8 * HALF) as *const __m128i));
        _mm256_blend_epi16::<0b1010_1010>(scales, _mm256_slli_epi32(scales, 16))
    }
    #[inline(always)]
    unsafe fn u8_pairs(p: *const u8) -> __m256i {
        _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16 * HALF) as *const __m128i))
    }
    #[inline(always)]
    unsafe fn pair_dot(acc: __m256i, pairs: __m256i, g: *const i16) -> __m256i {
        let g = _mm256_set1_epi32((g as *const i32).read_unaligned());
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, g))
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * HALF) as *const __m128i))
    }
    #[inline(always)]
    unsafe fn fma_scaled(acc: __m256, total: __m256i, d: __m256, da: f32) -> __m256 {
        _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(total),
            _mm256_mul_ps(d, _mm256_set1_ps(da)),
            acc,
        )
    }
    #[inline(always)]
    unsafe fn fma_splat(acc: __m256, m: __m256, x: f32) -> __m256 {
        _mm256_fmadd_ps(m, _mm256_set1_ps(x), acc)
    }
    #[inline(always)]
    unsafe fn fnma_scaled(acc: __m256, x: __m256i, d: __m256, da: f32) -> __m256 {
        _mm256_fnmadd_ps(
            _mm256_cvtepi32_ps(x),
            _mm256_mul_ps(d, _mm256_set1_ps(da)),
            acc,
        )
    }
    #[inline(always)]
    unsafe fn store(x: __m256, out: &mut [f32]) {
        assert_eq!(out.len(), Self::LANES);
        _mm256_storeu_ps(out.as_mut_ptr(), x);
    }
}

/// All 16 rows of a panel in two 256-bit registers (AVX2): both halves of [`Ymm`] in one
/// pass, lane for lane the same arithmetic.
pub(super) struct YmmPair;

impl Rows for YmmPair {
    type I = (__m256i, __m256i);
    type F = (__m256, __m256);
    const LANES: usize = 16;
    const FIRST_ROW: usize = 0;
    const Q8_0_BIAS: i32 = <Ymm<0> as Rows>::Q8_0_BIAS;
    const WIDE_NARROW: bool = false;

    #[inline(always)]
    unsafe fn zero_i() -> Self::I {
        (Ymm::<0>::zero_i(), Ymm::<1>::zero_i())
    }
    #[inline(always)]
    unsafe fn zero_f() -> Self::F {
        (Ymm::<0>::zero_f(), Ymm::<1>::zero_f())
    }
    #[inline(always)]
    unsafe fn splat(x: i32) -> Self::I {
        (Ymm::<0>::splat(x), Ymm::<1>::splat(x))
    }
    #[inline(always)]
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I {
        (Ymm::<0>::or(a.0, b.0), Ymm::<1>::or(a.1, b.1))
    }
    #[inline(always)]
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I {
        (Ymm::<0>::add(a.0, b.0), Ymm::<1>::add(a.1, b.1))
    }
    #[inline(always)]
    unsafe fn nibbles(chunk: *const u8) -> (Self::I, Self::I) {
        let ((low0, high0), (low1, high1)) = (Ymm::<0>::nibbles(chunk), Ymm::<1>::nibbles(chunk));
        ((low0, low1), (high0, high1))
    }
    #[inline(always)]
    unsafe fn bytes(chunk: *const u8) -> Self::I {
        (Ymm::<0>::bytes(chunk), Ymm::<1>::bytes(chunk))
    }
    #[inline(always)]
    unsafe fn q8_0_dot4(acc: Self::I, w: Self::I, a: *const i8) -> Self::I {
        (
            Ymm::<0>::q8_0_dot4(acc.0, w.0, a),
            Ymm::<1>::q8_0_dot4(acc.1, w.1, a),
        )
    }
    #[inline(always)]
    unsafe fn q5_0_high_bits(masks: *const u8) -> (Self::I, Self::I) {
        let ((low0, high0), (low1, high1)) = (
            Ymm::<0>::q5_0_high_bits(masks),
            Ymm::<1>::q5_0_high_bits(masks),
        );
        ((low0, low1), (high0, high1))
    }
    #[inline(always)]
    unsafe fn q6k_high_bits(highs: *const u8) -> (Self::I, Self::I) {
        let ((low0, high0), (low1, high1)) = (
            Ymm::<0>::q6k_high_bits(highs),
            Ymm::<1>::q6k_high_bits(highs),
        );
        ((low0, low1), (high0, high1))
    }
    #[inline(always)]
    unsafe fn narrow_dot4(acc: Self::I, u: Self::I, a: *const i8) -> Self::I {
        (
            Ymm::<0>::narrow_dot4(acc.0, u.0, a),
            Ymm::<1>::narrow_dot4(acc.1, u.1, a),
        )
    }
    #[inline(always)]
    unsafe fn narrow_add(a: Self::I, b: Self::I) -> Self::I {
        (
            Ymm::<0>::narrow_add(a.0, b.0),
            Ymm::<1>::narrow_add(a.1, b.1),
        )
    }
    #[inline(always)]
    unsafe fn widen(total: Self::I, narrow: Self::I) -> Self::I {
        (
            Ymm::<0>::widen(total.0, narrow.0),
            Ymm::<1>::widen(total.1, narrow.1),
        )
    }
    #[inline(always)]
    unsafe fn widen_scaled(total: Self::I, narrow: Self::I, scale: Self::I) -> Self::I {
        (
            Ymm::<0>::widen_scaled(total.0, narrow.0, scale.0),
            Ymm::<1>::widen_scaled(total.1, narrow.1, scale.1),
        )
    }
    #[inline(always)]
    unsafe fn q6k_widen_scaled(
        total: Self::I,
        low: Self::I,
        high: Self::I,
        offset: i32,
        scale: Self::I,
    ) -> Self::I {
        (
            Ymm::<0>::q6k_widen_scaled(total.0, low.0, high.0, offset, scale.0),
            Ymm::<1>::q6k_widen_scaled(total.1, low.1, high.1, offset, scale.1),
        )
    }
    #[inline(always)]
    unsafe fn u8_scales(p: *const u8) -> Self::I {
        (Ymm::<0>::u8_scales(p), Ymm::<1>::u8_scales(p))
    }
    #[inline(always)]
    unsafe fn i8_scales(p: *const u8) -> Self::I {
        (Ymm::<0>::i8_scales(p), Ymm::<1>::i8_scales(p))
    }
    #[inline(always)]
    unsafe fn u8_pairs(p: *const u8) -> Self::I {
        (Ymm::<0>::u8_pairs(p), Ymm::<1>::u8_pairs(p))
    }
    #[inline(always)]
    unsafe fn pair_dot(acc: Self::I, pairs: Self::I, g: *const i16) -> Self::I {
        (
            Ymm::<0>::pair_dot(acc.0, pairs.0, g),
            Ymm::<1>::pair_dot(acc.1, pairs.1, g),
        )
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> Self::F {
        (Ymm::<0>::f16s(p), Ymm::<1>::f16s(p))
    }
    #[inline(always)]
    unsafe fn fma_scaled(acc: Self::F, total: Self::I, d: Self::F, da: f32) -> Self::F {
        (
            Ymm::<0>::fma_scaled(acc.0, total.0, d.0, da),
            Ymm::<1>::fma_scaled(acc.1, total.1, d.1, da),
        )
    }
    #[inline(always)]
    unsafe fn fma_splat(acc: Self::F, m: Self::F, x: f32) -> Self::F {
        (
            Ymm::<0>::fma_splat(acc.0, m.0, x),
            Ymm::<1>::fma_splat(acc.1, m.1, x),
        )
    }
    #[inline(always)]
    unsafe fn fnma_scaled(acc: Self::F, x: Self::I, d: Self::F, da: f32) -> Self::F {
        (
            Ymm::<0>::fnma_scaled(acc.0, x.0, d.0, da),
            Ymm::<1>::fnma_scaled(acc.1, x.1, d.1, da),
        )
    }
    #[inline(always)]
    unsafe fn store(x: Self::F, out: &mut [f32]) {
        assert_eq!(out.len(), Self::LANES);
        _mm256_storeu_ps(out.as_mut_ptr(), x.0);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), x.1);
    }
}
