//! AVX2 and AVX-512 VNNI kernels for the 32-weight formats, a row at a time (the K-quants'
//! panels are in [`crate::x86_panels`]): the arithmetic of [`crate::portable`] with 256-bit
//! integer lanes. VNNI's `vpdpbusd` and AVX2's `vpmaddubsw` + `vpmaddwd` both
//! sum the products of four neighbouring bytes into one 32-bit lane, exactly: no quant pair
//! here saturates the 16-bit intermediate (unsigned quants are below 32; Q8_0 goes through
//! |w|·sign(a, w)).
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
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// `out[r · n + t]` = row r · token t for the rows whose bytes `rows` holds, `row_bytes`
/// each, and the `n` tokens of `acts`. The caller has checked that `isa` is available.
pub(crate) fn rows_dot(
    isa: Isa,
    format: Format,
    rows: &[u8],
    row_bytes: usize,
    acts: &QuantizedTokens,
    out: &mut [f32],
) {
    debug_assert!(isa.available());
    // SAFETY: the instruction set was checked by `QMatrix::matmul_with`; every load below
    // stays inside a row (whole blocks) and the tokens' activations (whole groups of 32).
    unsafe {
        match isa {
            Isa::Avx512Vnni => rows_dot_vnni(format, rows, row_bytes, acts, out),
            _ => rows_dot_avx2(format, rows, row_bytes, acts, out),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_dot_vnni(
    format: Format,
    rows: &[u8],
    row_bytes: usize,
    acts: &QuantizedTokens,
    out: &mut [f32],
) {
    tiles::<true>(format, rows, row_bytes, acts, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_dot_avx2(
    format: Format,
    rows: &[u8],
    row_bytes: usize,
    acts: &QuantizedTokens,
    out: &mut [f32],
) {
    tiles::<false>(format, rows, row_bytes, acts, out)
}

/// Tokens are taken four at a time, then the last one to three; every row meets all tiles
/// while its blocks are in L1.
#[inline(always)]
unsafe fn tiles<const VNNI: bool>(
    format: Format,
    rows: &[u8],
    row_bytes: usize,
    acts: &QuantizedTokens,
    out: &mut [f32],
) {
    let n = out.len() / (rows.len() / row_bytes);
    let full: Vec<Tokens<4>> = (0..n / 4).map(|i| Tokens::new(acts, 4 * i)).collect();
    let last = 4 * full.len();
    macro_rules! with_rest {
        ($($r:literal)|+) => {
            match n - last {
                $($r => {
                    let rest = Tokens::<$r>::new(acts, last);
                    rows_loop::<VNNI, $r>(format, rows, row_bytes, &full, &rest, out)
                })+
                _ => unreachable!("fewer than four tokens remain"),
            }
        };
    }
    with_rest!(0 | 1 | 2 | 3);
}

#[inline(always)]
unsafe fn rows_loop<const VNNI: bool, const REST: usize>(
    format: Format,
    rows: &[u8],
    row_bytes: usize,
    full: &[Tokens<4>],
    rest: &Tokens<REST>,
    out: &mut [f32],
) {
    let n = 4 * full.len() + REST;
    for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
        for (tokens, out) in full.iter().zip(out.chunks_exact_mut(4)) {
            out.copy_from_slice(&kernel::<VNNI, 4>(format, row, tokens));
        }
        if REST > 0 {
            out[n - REST..].copy_from_slice(&kernel::<VNNI, REST>(format, row, rest));
        }
    }
}

/// One row against a tile of tokens.
#[inline(always)]
unsafe fn kernel<const VNNI: bool, const TILE: usize>(
    format: Format,
    row: &[u8],
    tokens: &Tokens<TILE>,
) -> [f32; TILE] {
    match format {
        Format::Q4_0 => small_blocks::<VNNI, TILE, 0>(row, tokens),
        Format::Q4_1 => small_blocks::<VNNI, TILE, 1>(row, tokens),
        Format::Q5_0 => small_blocks::<VNNI, TILE, 2>(row, tokens),
        Format::Q8_0 => small_blocks::<VNNI, TILE, 3>(row, tokens),
        Format::Q4K | Format::Q6K => unreachable!("K-quants are kept in panels"),
    }
}

/// Pointers to the activations of a tile of tokens.
struct Tokens<const TILE: usize> {
    quants: [*const u8; TILE],
    scales: [*const f32; TILE],
    lane_sums: [*const i32; TILE],
    group_sums: [*const i16; TILE],
}

impl<const TILE: usize> Tokens<TILE> {
    fn new(acts: &QuantizedTokens, first: usize) -> Self {
        Self {
            quants: std::array::from_fn(|t| acts.quants_of(first + t).as_ptr() as *const u8),
            scales: std::array::from_fn(|t| acts.scales_of(first + t).as_ptr()),
            lane_sums: std::array::from_fn(|t| acts.lane_sums_of(first + t).as_ptr()),
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
    let format = [Format::Q4_0, Format::Q4_1, Format::Q5_0, Format::Q8_0][KIND as usize];
    let bytes = format.block_bytes();
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
