//! [`Rows`] on AVX-512 BW + VNNI: a panel's 16 rows in one 512-bit register.

use std::arch::x86_64::*;

use super::Rows;

/// All 16 rows in a 512-bit register (AVX-512 BW + VNNI).
pub(super) struct Zmm;

impl Rows for Zmm {
    type I = __m512i;
    type F = __m512;
    const LANES: usize = 16;
    const FIRST_ROW: usize = 0;
    const Q8_0_BIAS: i32 = 128;
    const WIDE_NARROW: bool = true;

    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: i32) -> __m512i {
        _mm512_set1_epi32(x)
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        _mm512_or_si512(a, b)
    }
    #[inline(always)]
    unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn nibbles(chunk: *const u8) -> (__m512i, __m512i) {
        let bytes = _mm512_loadu_si512(chunk as *const _);
        let mask = _mm512_set1_epi8(0x0F);
        (
            _mm512_and_si512(bytes, mask),
            _mm512_and_si512(_mm512_srli_epi16(bytes, 4), mask),
        )
    }
    #[inline(always)]
    unsafe fn bytes(chunk: *const u8) -> __m512i {
        _mm512_loadu_si512(chunk as *const _)
    }
    #[inline(always)]
    unsafe fn q8_0_dot4(acc: __m512i, w: __m512i, a: *const i8) -> __m512i {
        Self::narrow_dot4(acc, w, a)
    }
    #[inline(always)]
    unsafe fn q5_0_high_bits(masks: *const u8) -> (__m512i, __m512i) {
        let masks = masks as *const u64;
        let sixteen = _mm512_set1_epi8(16);
        (
            _mm512_maskz_mov_epi8(masks.read_unaligned(), sixteen),
            _mm512_maskz_mov_epi8(masks.add(1).read_unaligned(), sixteen),
        )
    }
    #[inline(always)]
    unsafe fn q6k_high_bits(highs: *const u8) -> (__m512i, __m512i) {
        let bits = _mm256_loadu_si256(highs as *const __m256i);
        // Nibble bytes 0–31 take bits 0–1 (low) and 4–5 (high), bytes 32–63 bits 2–3 and 6–7.
        let bits = _mm512_inserti64x4(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 2), 1);
        let three = _mm512_set1_epi8(3);
        (
            _mm512_slli_epi16(_mm512_and_si512(bits, three), 4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(bits, 4), three), 4),
        )
    }
    #[inline(always)]
    unsafe fn narrow_dot4(acc: __m512i, u: __m512i, a: *const i8) -> __m512i {
        _mm512_dpbusd_epi32(
            acc,
            u,
            _mm512_set1_epi32((a as *const i32).read_unaligned()),
        )
    }
    #[inline(always)]
    unsafe fn narrow_add(a: __m512i, b: __m512i) -> __m512i {
        Self::add(a, b)
    }
    #[inline(always)]
    unsafe fn widen(total: __m512i, narrow: __m512i) -> __m512i {
        // A narrow sum is already 32-bit here.
        Self::add(total, narrow)
    }
    #[inline(always)]
    unsafe fn widen_scaled(total: __m512i, narrow: __m512i, scale: __m512i) -> __m512i {
        _mm512_add_epi32(total, _mm512_mullo_epi32(narrow, scale))
    }
    #[inline(always)]
    unsafe fn q6k_widen_scaled(
        total: __m512i,
        low: __m512i,
        high: __m512i,
        offset: i32,
        scale: __m512i,
    ) -> __m512i {
        // 32-bit sums: one product by the scale for all three.
        let sum = Self::add(Self::add(low, high), _mm512_set1_epi32(offset));
        Self::widen_scaled(total, sum, scale)
    }
    #[inline(always)]
    unsafe fn u8_scales(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn i8_scales(p: *const u8) -> __m512i {
        _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn u8_pairs(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi16(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn pair_dot(acc: __m512i, pairs: __m512i, g: *const i16) -> __m512i {
        let g = _mm512_set1_epi32((g as *const i32).read_unaligned());
        _mm512_dpwssd_epi32(acc, pairs, g)
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn fma_scaled(acc: __m512, total: __m512i, d: __m512, da: f32) -> __m512 {
        _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(total),
            _mm512_mul_ps(d, _mm512_set1_ps(da)),
            acc,
        )
    }
    #[inline(always)]
    unsafe fn fma_splat(acc: __m512, m: __m512, x: f32) -> __m512 {
        _mm512_fmadd_ps(m, _mm512_set1_ps(x), acc)
    }
    #[inline(always)]
    unsafe fn fnma_scaled(acc: __m512, x: __m512i, d: __m512, da: f32) -> __m512 {
        _mm512_fnmadd_ps(
            _mm512_cvtepi32_ps(x),
            _mm512_mul_ps(d, _mm512_set1_ps(da)),
            acc,
        )
    }
    #[inline(always)]
    unsafe fn store(x: __m512, out: &mut [f32]) {
        assert_eq!(out.len(), Self::LANES);
        _mm512_storeu_ps(out.as_mut_ptr(), x);
    }
}
