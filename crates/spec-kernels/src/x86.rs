//! AVX2 and AVX-512 VNNI kernels: the arithmetic of [`crate::portable`] with 256-bit integer
//! lanes. VNNI's `vpdpbusd` and AVX2's `vpmaddubsw` + `vpmaddwd` both sum the products of
//! four neighbouring bytes into one 32-bit lane, exactly: no quant pair here saturates the
//! 16-bit intermediate (unsigned quants are below 64; Q8_0 goes through |w|·sign(a, w)).
//! Tokens are taken in tiles of up to four whose accumulators stay in registers; each block's
//! weights are unpacked once per tile.

use std::arch::x86_64::*;

use crate::activations::QuantizedTokens;
use crate::formats::{f16_at, Format};
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
    // SAFETY: the instruction set was checked by `QMatrix::matmul_with`; every load below
    // stays inside `row` (whole blocks) and the tokens' activations (whole groups of 32).
    unsafe {
        match isa {
            Isa::Avx512Vnni => row_dot_vnni(format, row, acts, out),
            _ => row_dot_avx2(format, row, acts, out),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn row_dot_vnni(format: Format, row: &[u8], acts: &QuantizedTokens, out: &mut [f32]) {
    tiles::<true>(format, row, acts, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dot_avx2(format: Format, row: &[u8], acts: &QuantizedTokens, out: &mut [f32]) {
    tiles::<false>(format, row, acts, out)
}

#[inline(always)]
unsafe fn tiles<const VNNI: bool>(
    format: Format,
    row: &[u8],
    acts: &QuantizedTokens,
    out: &mut [f32],
) {
    let mut first = 0;
    for tile in out.chunks_mut(4) {
        match tile.len() {
            4 => format_tile::<VNNI, 4>(format, row, acts, first, tile),
            3 => format_tile::<VNNI, 3>(format, row, acts, first, tile),
            2 => format_tile::<VNNI, 2>(format, row, acts, first, tile),
            _ => format_tile::<VNNI, 1>(format, row, acts, first, tile),
        }
        first += tile.len();
    }
}

#[inline(always)]
unsafe fn format_tile<const VNNI: bool, const TILE: usize>(
    format: Format,
    row: &[u8],
    acts: &QuantizedTokens,
    first: usize,
    out: &mut [f32],
) {
    let tokens = Tokens::<TILE>::new(acts, first);
    let results = match format {
        Format::Q4_0 => small_blocks::<VNNI, TILE, 0>(row, &tokens),
        Format::Q4_1 => small_blocks::<VNNI, TILE, 1>(row, &tokens),
        Format::Q5_0 => small_blocks::<VNNI, TILE, 2>(row, &tokens),
        Format::Q8_0 => small_blocks::<VNNI, TILE, 3>(row, &tokens),
        Format::Q4K => q4k::<VNNI, TILE>(row, &tokens),
        Format::Q6K => q6k::<VNNI, TILE>(row, &tokens),
    };
    out.copy_from_slice(&results);
}

/// Pointers to the activations of a tile of tokens.
struct Tokens<const TILE: usize> {
    quants: [*const u8; TILE],
    scales: [*const f32; TILE],
    lane_sums: [*const i32; TILE],
    pair_sums: [*const i16; TILE],
    group_sums: [*const i16; TILE],
}

impl<const TILE: usize> Tokens<TILE> {
    fn new(acts: &QuantizedTokens, first: usize) -> Self {
        Self {
            quants: std::array::from_fn(|t| acts.quants_of(first + t).as_ptr() as *const u8),
            scales: std::array::from_fn(|t| acts.scales_of(first + t).as_ptr()),
            lane_sums: std::array::from_fn(|t| acts.lane_sums_of(first + t).as_ptr()),
            pair_sums: std::array::from_fn(|t| {
                acts.pair_sums[(first + t) * acts.cols / 2..].as_ptr()
            }),
            group_sums: std::array::from_fn(|t| acts.group_sums_of(first + t).as_ptr()),
        }
    }
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

/// `total` + pairwise sums of the 16-bit `products` times 16-bit `scales`.
#[inline(always)]
unsafe fn add_scaled<const VNNI: bool>(
    total: __m256i,
    products: __m256i,
    scales: __m256i,
) -> __m256i {
    if VNNI {
        _mm256_dpwssd_epi32(total, products, scales)
    } else {
        _mm256_add_epi32(total, _mm256_madd_epi16(products, scales))
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

/// Q4_0 (KIND 0), Q4_1 (1), Q5_0 (2), Q8_0 (3): one group of 32 per block.
#[inline(always)]
unsafe fn small_blocks<const VNNI: bool, const TILE: usize, const KIND: u8>(
    row: &[u8],
    tokens: &Tokens<TILE>,
) -> [f32; TILE] {
    let bytes = [18, 20, 22, 34][KIND as usize];
    let mut acc = [_mm256_setzero_ps(); TILE];
    let mut extra = [0f32; TILE];
    for (b, block) in row.chunks_exact(bytes).enumerate() {
        let p = block.as_ptr();
        let d = f16_at(block, 0);
        let weights = match KIND {
            0 => nibbles16(p.add(2)),
            1 => nibbles16(p.add(4)),
            2 => {
                let high = (p.add(2) as *const u32).read_unaligned();
                _mm256_or_si256(nibbles16(p.add(6)), high_bits32(u32::from_le(high)))
            }
            _ => load(p.add(2)),
        };
        for t in 0..TILE {
            let a = load(tokens.quants[t].add(32 * b));
            let da = *tokens.scales[t].add(b);
            let sums = || load(tokens.lane_sums[t].add(8 * b) as *const u8);
            let l = match KIND {
                0 => _mm256_sub_epi32(lanes::<VNNI>(weights, a), _mm256_slli_epi32(sums(), 3)),
                1 => lanes::<VNNI>(weights, a),
                2 => _mm256_sub_epi32(lanes::<VNNI>(weights, a), _mm256_slli_epi32(sums(), 4)),
                _ => lanes::<VNNI>(_mm256_abs_epi8(weights), _mm256_sign_epi8(a, weights)),
            };
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_set1_ps(d * da), acc[t]);
            if KIND == 1 {
                let m = f16_at(block, 2);
                extra[t] = (m * da).mul_add(*tokens.group_sums[t].add(b) as f32, extra[t]);
            }
        }
    }
    std::array::from_fn(|t| {
        if KIND == 1 {
            reduce(acc[t]) + extra[t]
        } else {
            reduce(acc[t])
        }
    })
}

/// The 8 six-bit scales and 8 minimums of a Q4_K block's 12 scale bytes, as bytes.
#[inline(always)]
fn q4k_scales_mins(bytes: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| {
        u32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ])
    };
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let (six, low4, top2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    // Sub-blocks 0–3: low six bits of bytes 0–3 (scales) and 4–7 (mins). Sub-blocks 4–7:
    // a nibble of bytes 8–11 below the top two bits of bytes 0–3 (scales) or 4–7 (mins).
    let scales_high = (w2 & low4) | (((w0 >> 6) & top2) << 4);
    let mins_high = ((w2 >> 4) & low4) | (((w1 >> 6) & top2) << 4);
    let join = |lo: u32, hi: u32| (u64::from(lo) | (u64::from(hi) << 32)).to_le_bytes();
    (join(w0 & six, scales_high), join(w1 & six, mins_high))
}

#[inline(always)]
unsafe fn q4k<const VNNI: bool, const TILE: usize>(
    row: &[u8],
    tokens: &Tokens<TILE>,
) -> [f32; TILE] {
    let mut acc = [_mm256_setzero_ps(); TILE];
    let mut extra = [0f32; TILE];
    let nibble = _mm256_set1_epi8(0x0F);
    for (b, block) in row.chunks_exact(144).enumerate() {
        let p = block.as_ptr();
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (scales, mins) = q4k_scales_mins(&block[4..16]);
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr() as *const __m128i));
        let mut u = [_mm256_setzero_si256(); 8];
        for i in 0..4 {
            let chunk = load(p.add(16 + 32 * i));
            u[2 * i] = _mm256_and_si256(chunk, nibble);
            u[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(chunk, 4), nibble);
        }
        for t in 0..TILE {
            let a = tokens.quants[t].add(256 * b);
            let mut total = _mm256_setzero_si256();
            for j in 0..8 {
                let products = _mm256_maddubs_epi16(u[j], load(a.add(32 * j)));
                total = add_scaled::<VNNI>(total, products, _mm256_set1_epi16(scales[j] as i16));
            }
            let groups = _mm_loadu_si128(tokens.group_sums[t].add(8 * b) as *const __m128i);
            let m = _mm_madd_epi16(mins, groups);
            let m = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
            let min_sum = _mm_cvtsi128_si32(_mm_add_epi32(m, _mm_shuffle_epi32(m, 1)));
            let da = *tokens.scales[t].add(b);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * da), acc[t]);
            extra[t] = (dmin * da).mul_add(min_sum as f32, extra[t]);
        }
    }
    std::array::from_fn(|t| reduce(acc[t]) - extra[t])
}

#[inline(always)]
unsafe fn q6k<const VNNI: bool, const TILE: usize>(
    row: &[u8],
    tokens: &Tokens<TILE>,
) -> [f32; TILE] {
    let mut acc = [_mm256_setzero_ps(); TILE];
    let nibble = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    for (b, block) in row.chunks_exact(210).enumerate() {
        let p = block.as_ptr();
        let d = f16_at(block, 208);
        let mut u = [_mm256_setzero_si256(); 8];
        let mut scales = [_mm256_setzero_si256(); 8];
        for half in 0..2 {
            let high = load(p.add(128 + 32 * half));
            let low01 = load(p.add(64 * half));
            let low23 = load(p.add(64 * half + 32));
            let lows = [
                _mm256_and_si256(low01, nibble),
                _mm256_and_si256(low23, nibble),
                _mm256_and_si256(_mm256_srli_epi16(low01, 4), nibble),
                _mm256_and_si256(_mm256_srli_epi16(low23, 4), nibble),
            ];
            let highs = [
                high,
                _mm256_srli_epi16(high, 2),
                _mm256_srli_epi16(high, 4),
                _mm256_srli_epi16(high, 6),
            ];
            for g in 0..4 {
                let h = _mm256_slli_epi16(_mm256_and_si256(highs[g], three), 4);
                u[4 * half + g] = _mm256_or_si256(lows[g], h);
            }
        }
        for (j, s) in scales.iter_mut().enumerate() {
            let (s0, s1) = (
                block[192 + 2 * j] as i8 as i16,
                block[193 + 2 * j] as i8 as i16,
            );
            *s = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
        }
        for t in 0..TILE {
            let a = tokens.quants[t].add(256 * b);
            let pairs = tokens.pair_sums[t].add(128 * b) as *const u8;
            let mut total = _mm256_setzero_si256();
            for j in 0..8 {
                // (q − 32)·a summed over pairs: the quants are stored 32 above their value.
                let products = _mm256_maddubs_epi16(u[j], load(a.add(32 * j)));
                let offset = _mm256_slli_epi16(load(pairs.add(32 * j)), 5);
                total = add_scaled::<VNNI>(total, _mm256_sub_epi16(products, offset), scales[j]);
            }
            let da = *tokens.scales[t].add(b);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * da), acc[t]);
        }
    }
    std::array::from_fn(|t| reduce(acc[t]))
}
