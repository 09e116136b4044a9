//! AVX2 and AVX-512 VNNI kernels: the arithmetic of [`crate::portable`] with 256-bit integer
//! lanes (Q4_K and Q6_K on VNNI machines compute two groups per 512-bit register and add the
//! halves, the same integers). VNNI's `vpdpbusd` and AVX2's `vpmaddubsw` + `vpmaddwd` both
//! sum the products of four neighbouring bytes into one 32-bit lane, exactly: no quant pair
//! here saturates the 16-bit intermediate (unsigned quants are below 64; Q8_0 goes through
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
        Format::Q4K if VNNI => q4k_512::<TILE>(row, tokens),
        Format::Q6K if VNNI => q6k_512::<TILE>(row, tokens),
        Format::Q4K => q4k_256::<TILE>(row, tokens),
        Format::Q6K => q6k_256::<TILE>(row, tokens),
    }
}

/// Pointers to the activations of a tile of tokens.
struct Tokens<const TILE: usize> {
    quants: [*const u8; TILE],
    scales: [*const f32; TILE],
    lane_sums: [*const i32; TILE],
    q6k_offsets: [*const i16; TILE],
    group_sums: [*const i16; TILE],
}

impl<const TILE: usize> Tokens<TILE> {
    fn new(acts: &QuantizedTokens, first: usize) -> Self {
        Self {
            quants: std::array::from_fn(|t| acts.quants_of(first + t).as_ptr() as *const u8),
            scales: std::array::from_fn(|t| acts.scales_of(first + t).as_ptr()),
            lane_sums: std::array::from_fn(|t| acts.lane_sums_of(first + t).as_ptr()),
            q6k_offsets: std::array::from_fn(|t| {
                acts.q6k_offsets[(first + t) * acts.cols / 2..].as_ptr()
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

/// `total` + pairwise sums of the 16-bit `products` times 16-bit `scales` (AVX2).
#[inline(always)]
unsafe fn add_scaled(total: __m256i, products: __m256i, scales: __m256i) -> __m256i {
    _mm256_add_epi32(total, _mm256_madd_epi16(products, scales))
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

/// Four f32 lanes added up in [`crate::portable::reduce_four`]'s order.
#[inline(always)]
unsafe fn reduce_four(m: __m128) -> f32 {
    let s = _mm_add_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
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

/// Adds block `b`'s integer lanes `total` (scaled by d) and its minimums (8 of them as 16-bit
/// in `mins`, met by token `t`'s group sums in pairs, scaled by dmin) to token t's sums.
#[inline(always)]
unsafe fn q4k_accumulate<const TILE: usize>(
    tokens: &Tokens<TILE>,
    t: usize,
    b: usize,
    total: __m256i,
    (d, dmin, mins): (f32, f32, __m128i),
    acc: &mut __m256,
    min_acc: &mut __m128,
) {
    let groups = _mm_loadu_si128(tokens.group_sums[t].add(8 * b) as *const __m128i);
    let min_pairs = _mm_cvtepi32_ps(_mm_madd_epi16(mins, groups));
    let da = *tokens.scales[t].add(b);
    *min_acc = _mm_fmadd_ps(min_pairs, _mm_set1_ps(dmin * da), *min_acc);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * da), *acc);
}

/// Q4_K with 256-bit registers (the AVX2 path; VNNI machines take [`q4k_512`]).
#[inline(always)]
unsafe fn q4k_256<const TILE: usize>(row: &[u8], tokens: &Tokens<TILE>) -> [f32; TILE] {
    let mut acc = [_mm256_setzero_ps(); TILE];
    let mut min_acc = [_mm_setzero_ps(); TILE];
    let nibble = _mm256_set1_epi8(0x0F);
    for (b, block) in row.chunks_exact(148).enumerate() {
        let p = block.as_ptr();
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let scales = &block[4..12];
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(p.add(12) as *const __m128i));
        let mut u = [_mm256_setzero_si256(); 8];
        for i in 0..4 {
            let chunk = load(p.add(20 + 32 * i));
            u[2 * i] = _mm256_and_si256(chunk, nibble);
            u[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(chunk, 4), nibble);
        }
        for t in 0..TILE {
            let a = tokens.quants[t].add(256 * b);
            let mut total = _mm256_setzero_si256();
            for j in 0..8 {
                let products = _mm256_maddubs_epi16(u[j], load(a.add(32 * j)));
                total = add_scaled(total, products, _mm256_set1_epi16(scales[j] as i16));
            }
            q4k_accumulate(
                tokens,
                t,
                b,
                total,
                (d, dmin, mins),
                &mut acc[t],
                &mut min_acc[t],
            );
        }
    }
    std::array::from_fn(|t| reduce(acc[t]) - reduce_four(min_acc[t]))
}

/// Q6_K with 256-bit registers (the AVX2 path; VNNI machines take [`q6k_512`]).
#[inline(always)]
unsafe fn q6k_256<const TILE: usize>(row: &[u8], tokens: &Tokens<TILE>) -> [f32; TILE] {
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
        for (t, acc) in acc.iter_mut().enumerate() {
            let a = tokens.quants[t].add(256 * b);
            let offsets = tokens.q6k_offsets[t].add(128 * b) as *const u8;
            let mut total = _mm256_setzero_si256();
            for j in 0..8 {
                // (q − 32)·a summed over pairs: the quants are stored 32 above their value.
                let products = _mm256_maddubs_epi16(u[j], load(a.add(32 * j)));
                let offset = load(offsets.add(32 * j));
                total = add_scaled(total, _mm256_sub_epi16(products, offset), scales[j]);
            }
            let da = *tokens.scales[t].add(b);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * da), *acc);
        }
    }
    std::array::from_fn(|t| reduce(acc[t]))
}

/// The 512-bit halves of `x` added: lane i of the result sums lanes i and i + 8.
#[inline(always)]
unsafe fn fold_halves(x: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1))
}

/// Two neighbouring 256-bit vectors as one 512-bit vector.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// Q4_K with 512-bit registers, two groups of 32 per instruction (AVX-512 BW + VNNI).
#[inline(always)]
unsafe fn q4k_512<const TILE: usize>(row: &[u8], tokens: &Tokens<TILE>) -> [f32; TILE] {
    let mut acc = [_mm256_setzero_ps(); TILE];
    let mut min_acc = [_mm_setzero_ps(); TILE];
    let nibble = _mm512_set1_epi8(0x0F);
    // Pair i of groups takes the 16-bit scale 2i in its low half and 2i + 1 in its high half.
    let pick: [__m512i; 4] = std::array::from_fn(|i| {
        let (a, b) = (4 * i as i8, 4 * i as i8 + 2);
        let lane = |x: i8| {
            _mm_setr_epi8(
                x,
                x + 1,
                x,
                x + 1,
                x,
                x + 1,
                x,
                x + 1,
                x,
                x + 1,
                x,
                x + 1,
                x,
                x + 1,
                x,
                x + 1,
            )
        };
        join(
            _mm256_set_m128i(lane(a), lane(a)),
            _mm256_set_m128i(lane(b), lane(b)),
        )
    });
    for (b, block) in row.chunks_exact(148).enumerate() {
        let p = block.as_ptr();
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(p.add(12) as *const __m128i));
        let scales = _mm_cvtepu8_epi16(_mm_loadl_epi64(p.add(4) as *const __m128i));
        let scales = _mm512_broadcast_i32x4(scales);
        let mut u = [_mm512_setzero_si512(); 4];
        let mut scale = [_mm512_setzero_si512(); 4];
        for i in 0..4 {
            let chunk = load(p.add(20 + 32 * i));
            u[i] = _mm512_and_si512(join(chunk, _mm256_srli_epi16(chunk, 4)), nibble);
            scale[i] = _mm512_shuffle_epi8(scales, pick[i]);
        }
        for t in 0..TILE {
            let a = tokens.quants[t].add(256 * b);
            let mut total = _mm512_setzero_si512();
            for i in 0..4 {
                let a = _mm512_loadu_si512(a.add(64 * i) as *const _);
                total = _mm512_dpwssd_epi32(total, _mm512_maddubs_epi16(u[i], a), scale[i]);
            }
            let total = fold_halves(total);
            q4k_accumulate(
                tokens,
                t,
                b,
                total,
                (d, dmin, mins),
                &mut acc[t],
                &mut min_acc[t],
            );
        }
    }
    std::array::from_fn(|t| reduce(acc[t]) - reduce_four(min_acc[t]))
}

/// Q6_K with 512-bit registers, two groups of 32 per instruction (AVX-512 BW + VNNI).
#[inline(always)]
unsafe fn q6k_512<const TILE: usize>(row: &[u8], tokens: &Tokens<TILE>) -> [f32; TILE] {
    let mut acc = [_mm256_setzero_ps(); TILE];
    let nibble = _mm512_set1_epi8(0x0F);
    let three = _mm512_set1_epi8(3);
    // Pair i of groups covers sub-blocks 4i..4i + 4 of 16 weights, one per 128-bit lane.
    let pick: [__m512i; 4] = std::array::from_fn(|i| {
        let s = 4 * i as i16;
        _mm512_set_epi16(
            s + 3,
            s + 3,
            s + 3,
            s + 3,
            s + 3,
            s + 3,
            s + 3,
            s + 3,
            s + 2,
            s + 2,
            s + 2,
            s + 2,
            s + 2,
            s + 2,
            s + 2,
            s + 2,
            s + 1,
            s + 1,
            s + 1,
            s + 1,
            s + 1,
            s + 1,
            s + 1,
            s + 1,
            s,
            s,
            s,
            s,
            s,
            s,
            s,
            s,
        )
    });
    for (b, block) in row.chunks_exact(210).enumerate() {
        let p = block.as_ptr();
        let d = f16_at(block, 208);
        let scales = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(
            p.add(192) as *const __m128i
        )));
        let mut u = [_mm512_setzero_si512(); 4];
        for half in 0..2 {
            // Groups 4h, 4h + 1 are the low nibbles of ql[64h..64h + 64] under bits 0–1 and
            // 2–3 of qh[32h..32h + 32]; groups 4h + 2, 4h + 3 the high nibbles under bits 4–7.
            let low = _mm512_loadu_si512(p.add(64 * half) as *const _);
            let high = load(p.add(128 + 32 * half));
            let high = join(high, _mm256_srli_epi16(high, 2));
            let high01 = _mm512_slli_epi16(_mm512_and_si512(high, three), 4);
            let high23 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(high, 4), three), 4);
            u[2 * half] = _mm512_or_si512(_mm512_and_si512(low, nibble), high01);
            u[2 * half + 1] =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), nibble), high23);
        }
        let scale: [__m512i; 4] =
            std::array::from_fn(|i| _mm512_permutexvar_epi16(pick[i], scales));
        for (t, acc) in acc.iter_mut().enumerate() {
            let a = tokens.quants[t].add(256 * b);
            let offsets = tokens.q6k_offsets[t].add(128 * b) as *const u8;
            let mut total = _mm512_setzero_si512();
            for i in 0..4 {
                let products =
                    _mm512_maddubs_epi16(u[i], _mm512_loadu_si512(a.add(64 * i) as *const _));
                let offset = _mm512_loadu_si512(offsets.add(64 * i) as *const _);
                total = _mm512_dpwssd_epi32(total, _mm512_sub_epi16(products, offset), scale[i]);
            }
            let da = *tokens.scales[t].add(b);
            *acc = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(fold_halves(total)),
                _mm256_set1_ps(d * da),
                *acc,
            );
        }
    }
    std::array::from_fn(|t| reduce(acc[t]))
}
