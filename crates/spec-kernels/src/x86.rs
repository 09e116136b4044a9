//! AVX2 and AVX-512 VNNI kernels: the arithmetic of [`crate::portable`] with 256-bit integer
//! lanes. VNNI's `vpdpbusd` and AVX2's `vpmaddubsw` + `vpmaddwd` both sum the products of
//! four neighbouring bytes into one 32-bit lane, exactly (no quant pair here can saturate the
//! 16-bit intermediate: unsigned quants are below 64, and Q8_0 goes through |w|·sign(a, w)).

use std::arch::x86_64::*;

use crate::activations::QuantizedTokens;
use crate::formats::{f16_at, q4k_scale_min, Format};
use crate::Isa;

pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

pub(crate) fn has_avx512_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
}

/// `out[t]` = row · token t. The caller has checked that `isa` is available.
pub(crate) fn row_dot(
    isa: Isa,
    format: Format,
    row: &[u8],
    acts: &QuantizedTokens,
    out: &mut [f32],
) {
    debug_assert!(isa.available());
    debug_assert!(out.len() <= MAX_TOKENS);
    // SAFETY: the instruction set was checked by `QMatrix::matmul_with`; every load below
    // stays inside `row` (whole blocks) and the token's activations (whole groups of 32).
    unsafe {
        match isa {
            Isa::Avx512Vnni => row_dot_vnni(format, row, acts, out),
            _ => row_dot_avx2(format, row, acts, out),
        }
    }
}

const MAX_TOKENS: usize = crate::MAX_TOKENS_PER_PASS;

#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn row_dot_vnni(format: Format, row: &[u8], acts: &QuantizedTokens, out: &mut [f32]) {
    row_dot_impl::<true>(format, row, acts, out)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn row_dot_avx2(format: Format, row: &[u8], acts: &QuantizedTokens, out: &mut [f32]) {
    row_dot_impl::<false>(format, row, acts, out)
}

/// Eight lanes of four-byte products of unsigned `u` and signed `a`.
#[inline(always)]
unsafe fn lanes<const VNNI: bool>(u: __m256i, a: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1))
    }
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// 16 bytes of nibbles → 32 quants: low nibbles first, then high.
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let mask = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(q, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    _mm256_set_m128i(hi, lo)
}

/// Bit l of `bits` → 0x10 in byte l, else 0.
#[inline(always)]
unsafe fn high_bits32(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The eight f32 lanes added up in [`crate::portable::reduce_lanes`]' order.
#[inline(always)]
unsafe fn reduce(acc: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let u = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)))
}

#[inline(always)]
unsafe fn row_dot_impl<const VNNI: bool>(
    format: Format,
    row: &[u8],
    acts: &QuantizedTokens,
    out: &mut [f32],
) {
    let tokens = out.len();
    let mut acc = [_mm256_setzero_ps(); MAX_TOKENS];
    let mut extra = [0f32; MAX_TOKENS];
    let bytes = format.block_bytes();
    let ones = _mm256_set1_epi8(0x0F);
    for (b, block) in row.chunks_exact(bytes).enumerate() {
        let p = block.as_ptr();
        match format {
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q8_0 => {
                let d = f16_at(block, 0);
                let weights = match format {
                    Format::Q4_0 => nibbles16(p.add(2)),
                    Format::Q4_1 => nibbles16(p.add(4)),
                    Format::Q5_0 => {
                        let high = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                        _mm256_or_si256(nibbles16(p.add(6)), high_bits32(high))
                    }
                    _ => load(p.add(2)),
                };
                let abs = _mm256_abs_epi8(weights);
                for t in 0..tokens {
                    let a = load(acts.quants_of(t).as_ptr().add(32 * b) as *const u8);
                    let da = acts.scales_of(t)[b];
                    let sums = || load(acts.lane_sums_of(t).as_ptr().add(8 * b) as *const u8);
                    let l = match format {
                        Format::Q4_0 => _mm256_sub_epi32(
                            lanes::<VNNI>(weights, a),
                            _mm256_slli_epi32(sums(), 3),
                        ),
                        Format::Q5_0 => _mm256_sub_epi32(
                            lanes::<VNNI>(weights, a),
                            _mm256_slli_epi32(sums(), 4),
                        ),
                        Format::Q4_1 => lanes::<VNNI>(weights, a),
                        _ => lanes::<VNNI>(abs, _mm256_sign_epi8(a, weights)),
                    };
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_set1_ps(d * da), acc[t]);
                    if format == Format::Q4_1 {
                        let m = f16_at(block, 2);
                        extra[t] = (m * da).mul_add(acts.group_sums_of(t)[b] as f32, extra[t]);
                    }
                }
            }
            Format::Q4K => {
                let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
                let mut u = [_mm256_setzero_si256(); 8];
                let mut scale = [_mm256_setzero_si256(); 8];
                let mut min = [0i32; 8];
                for j in 0..8 {
                    let chunk = load(p.add(16 + 32 * (j / 2)));
                    u[j] = if j % 2 == 0 {
                        _mm256_and_si256(chunk, ones)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16(chunk, 4), ones)
                    };
                    let (s, m) = q4k_scale_min(&block[4..16], j);
                    scale[j] = _mm256_set1_epi32(s as i32);
                    min[j] = m as i32;
                }
                for t in 0..tokens {
                    let a = acts.quants_of(t).as_ptr().add(256 * b) as *const u8;
                    let groups = &acts.group_sums_of(t)[8 * b..8 * b + 8];
                    let mut total = _mm256_setzero_si256();
                    let mut min_sum = 0i32;
                    for j in 0..8 {
                        let l = lanes::<VNNI>(u[j], load(a.add(32 * j)));
                        total = _mm256_add_epi32(total, _mm256_mullo_epi32(l, scale[j]));
                        min_sum += min[j] * groups[j];
                    }
                    let da = acts.scales_of(t)[b];
                    acc[t] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * da), acc[t]);
                    extra[t] = (dmin * da).mul_add(min_sum as f32, extra[t]);
                }
            }
            Format::Q6K => {
                let d = f16_at(block, 208);
                let mut u = [_mm256_setzero_si256(); 8];
                let mut scale = [_mm256_setzero_si256(); 8];
                let three = _mm256_set1_epi8(3);
                for j in 0..8 {
                    let (half, group) = (j / 4, j % 4);
                    let low = load(p.add(64 * half + 32 * (group & 1)));
                    let low = if group < 2 {
                        _mm256_and_si256(low, ones)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16(low, 4), ones)
                    };
                    let high = load(p.add(128 + 32 * half));
                    let high = match group {
                        0 => _mm256_and_si256(high, three),
                        1 => _mm256_and_si256(_mm256_srli_epi16(high, 2), three),
                        2 => _mm256_and_si256(_mm256_srli_epi16(high, 4), three),
                        _ => _mm256_and_si256(_mm256_srli_epi16(high, 6), three),
                    };
                    u[j] = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
                    let (s0, s1) = (
                        block[192 + 2 * j] as i8 as i32,
                        block[193 + 2 * j] as i8 as i32,
                    );
                    scale[j] = _mm256_setr_epi32(s0, s0, s0, s0, s1, s1, s1, s1);
                }
                for t in 0..tokens {
                    let a = acts.quants_of(t).as_ptr().add(256 * b) as *const u8;
                    let sums = acts.lane_sums_of(t).as_ptr().add(64 * b) as *const u8;
                    let mut total = _mm256_setzero_si256();
                    for j in 0..8 {
                        let l = lanes::<VNNI>(u[j], load(a.add(32 * j)));
                        let l = _mm256_sub_epi32(l, _mm256_slli_epi32(load(sums.add(32 * j)), 5));
                        total = _mm256_add_epi32(total, _mm256_mullo_epi32(l, scale[j]));
                    }
                    let da = acts.scales_of(t)[b];
                    acc[t] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * da), acc[t]);
                }
            }
        }
    }
    for (t, o) in out.iter_mut().enumerate() {
        let sum = reduce(acc[t]);
        *o = match format {
            Format::Q4_1 => sum + extra[t],
            Format::Q4K => sum - extra[t],
            _ => sum,
        };
    }
}
