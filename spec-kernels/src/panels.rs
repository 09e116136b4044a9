//! Weights as the kernels keep them: **panels** of 16 rows whose blocks are interleaved so that
//! one 512-bit register holds the same four columns of all 16 rows (llama.cpp and candle repack
//! their K-quants for the same reason).
//!
//! With rows in lanes, one `vpdpbusd` against four activation bytes broadcast to every lane adds
//! four products to each of 16 rows, and a block's (K-quants: sub-block's) scale is applied once
//! per block instead of once per four columns: about half the multiplications of a
//! row-at-a-time kernel, and no horizontal sums. Rows past the matrix's last are zero padding.
//!
//! The arithmetic (every instruction set gives the same bits): for row r, token t and each
//! block, an exact integer total and, block after block, one f32 accumulator per (row, token):
//! - Q4_0, Q5_0, Q8_0: total = Σ w·a over the block's 32 columns with the signed integer
//!   weights (q − 8, q − 16, q); `acc = fma(total, d·da, acc)`.
//! - Q4_1: total = Σ q·a; `acc = fma(total, d·da, acc)`, then `acc = fma(m, da·Σa, acc)`.
//! - Q4_K: total = Σ_j scale_j · (Σ q·a over sub-block j) and mins = Σ_j min_j · (Σ a over
//!   sub-block j); `acc = fma(total, d·da, acc)`, then `acc = fma(−mins, dmin·da, acc)`.
//! - Q6_K: total = Σ_j scale_j · (Σ q·a − 32 Σ a over sub-block j); `acc = fma(total, d·da, acc)`.
//!
//! A token's arithmetic does not depend on the other tokens of the batch.
//!
//! Layout of one panel block (16 rows × one ggml block of columns). A nibble chunk covers 8
//! columns of the 16 rows in 64 bytes, byte 4r + k holding column k in its low nibble and
//! column 4 + k in its high one, so a nibble mask gives columns 0–3 and a shift columns 4–7,
//! row r in lane r:
//! - Q4_0 (288 bytes): d ×16 (f16), 4 chunks.
//! - Q4_1 (320 bytes): d ×16, m ×16 (f16), 4 chunks.
//! - Q5_0 (352 bytes): d ×16; per chunk two 64-bit masks of the fifth bits (bit 4r + k of the
//!   first for the low nibble of chunk byte 4r + k, of the second for its high nibble); 4
//!   chunks of the low four bits.
//! - Q8_0 (544 bytes): d ×16; 8 chunks of 4 columns, byte 4r + k holding column k of row r
//!   as an unsigned byte, w + 128.
//! - Q4_K (2368 bytes): d ×16 (f16), dmin ×16 (f16), scales [sub-block j][row] (u8, 8 × 16),
//!   minimums [pair p][row][2] (u8, 4 × 16 × 2: sub-blocks 2p and 2p + 1), 32 chunks.
//! - Q6_K (3360 bytes): scales [sub-block j][row] (i8, 16 × 16); per sub-block its two chunks
//!   of low nibbles and their 2 × 32 bytes of high bit pairs (byte m of a chunk's 32 holds in
//!   bits 0–1, 2–3, 4–5, 6–7 the high bits of nibble byte m's low nibble, byte m + 32's low
//!   nibble, byte m's high nibble and byte m + 32's high nibble); d ×16 (f16) last.
//!
//! Each block is read front to back, as the hardware prefetcher expects, and every field is a
//! multiple of 32 bytes, so no 32-byte half of a chunk's load straddles two cache lines.

use crate::activations::QuantizedTokens;
use crate::aligned::CacheAligned;
use crate::formats::{f16_at, nibble, q4k_scale_min, q6k_quant, Format};
use crate::TaskOut;

/// Rows per panel.
pub(crate) const PANEL_ROWS: usize = 16;

pub(crate) mod q4k {
    pub const D: usize = 0;
    pub const DMIN: usize = 32;
    pub const SCALES: usize = 64;
    pub const MINS: usize = 192;
    pub const QUANTS: usize = 320;
    pub const BYTES: usize = 2368;
}

pub(crate) mod q6k {
    pub const SCALES: usize = 0;
    /// Sub-block j's chunks start at `SUB_BLOCKS + SUB_BLOCK_BYTES · j`.
    pub const SUB_BLOCKS: usize = 256;
    pub const SUB_BLOCK_BYTES: usize = 192;
    pub const D: usize = 3328;
    pub const BYTES: usize = 3360;
}

/// Fields of the 32-weight formats' panel blocks.
pub(crate) mod small {
    /// The 16 rows' scales d (f16).
    pub const D: usize = 0;
    /// Q4_1's 16 minimums m (f16).
    pub const Q4_1_MINS: usize = 32;
    /// Q5_0's fifth-bit masks, 16 bytes per chunk.
    pub const Q5_0_HIGHS: usize = 32;
}

/// Bytes of one panel block (16 rows × one ggml block of columns).
pub(crate) const fn panel_block_bytes(format: Format) -> usize {
    match format {
        Format::Q4_0 => 288,
        Format::Q4_1 => 320,
        Format::Q5_0 => 352,
        Format::Q8_0 => 544,
        Format::Q4K => q4k::BYTES,
        Format::Q6K => q6k::BYTES,
    }
}

/// Where chunk `h` (columns 8h..8h + 8; Q8_0: 4h..4h + 4) of a panel block starts.
pub(crate) const fn chunk_at(format: Format, h: usize) -> usize {
    match format {
        Format::Q4_0 | Format::Q8_0 => 32 + 64 * h,
        Format::Q4_1 => 64 + 64 * h,
        Format::Q5_0 => 96 + 64 * h,
        Format::Q4K => q4k::QUANTS + 64 * h,
        Format::Q6K => q6k::SUB_BLOCKS + q6k::SUB_BLOCK_BYTES * (h / 2) + 64 * (h % 2),
    }
}

/// Where Q5_0 chunk `h`'s two 8-byte masks of fifth bits start.
pub(crate) const fn q5_0_highs_at(h: usize) -> usize {
    small::Q5_0_HIGHS + 16 * h
}

/// Where Q6_K chunk `h`'s 32 bytes of high bit pairs start.
pub(crate) const fn q6k_highs_at(h: usize) -> usize {
    q6k::SUB_BLOCKS + q6k::SUB_BLOCK_BYTES * (h / 2) + 128 + 32 * (h % 2)
}

/// Where the quant of row `r`, column `c` of a panel block sits: its byte and, for the nibble
/// formats, whether it is the high nibble (Q8_0: false).
fn quant_position(format: Format, c: usize, r: usize) -> (usize, bool) {
    if format == Format::Q8_0 {
        return (chunk_at(format, c / 4) + 4 * r + c % 4, false);
    }
    let (h, within) = (c / 8, c % 8);
    (chunk_at(format, h) + 4 * r + within % 4, within >= 4)
}

/// Where the bits above a nibble live: (byte, shift, bits) for Q5_0 and Q6_K.
fn high_bits_position(format: Format, c: usize, r: usize) -> Option<(usize, u32, u8)> {
    let (h, within) = (c / 8, c % 8);
    let (high_nibble, byte) = (within >= 4, 4 * r + within % 4);
    match format {
        Format::Q5_0 => {
            let mask = q5_0_highs_at(h) + 8 * high_nibble as usize;
            Some((mask + byte / 8, (byte % 8) as u32, 1))
        }
        Format::Q6K => {
            let shift = 2 * (2 * high_nibble as u32 + (byte / 32) as u32);
            Some((q6k_highs_at(h) + byte % 32, shift, 3))
        }
        _ => None,
    }
}

/// The unsigned quant of row `r`, column `c` of a panel block, as stored (Q8_0: w + 128).
pub(crate) fn quant(format: Format, block: &[u8], r: usize, c: usize) -> u8 {
    let (at, high_nibble) = quant_position(format, c, r);
    if format == Format::Q8_0 {
        return block[at];
    }
    let nibble = if high_nibble {
        block[at] >> 4
    } else {
        block[at] & 0x0F
    };
    match high_bits_position(format, c, r) {
        Some((at, shift, bits)) => nibble | (((block[at] >> shift) & bits) << 4),
        None => nibble,
    }
}

/// The integer weight of row `r`, column `c` before its scale: the quant less the format's
/// offset (Q4_1 and the K-quants keep their unsigned quant; their minimums and sub-block
/// scales are applied apart).
fn signed_weight(format: Format, block: &[u8], r: usize, c: usize) -> i32 {
    let q = quant(format, block, r, c) as i32;
    match format {
        Format::Q4_0 => q - 8,
        Format::Q5_0 => q - 16,
        Format::Q8_0 => q - 128,
        Format::Q6K => q - 32,
        Format::Q4_1 | Format::Q4K => q,
    }
}

/// ggml rows → panels (rows padded with zeros to a multiple of 16).
pub(crate) fn to_panels(format: Format, rows: usize, cols: usize, data: &[u8]) -> CacheAligned {
    let blocks = cols / format.block_len();
    let ggml_bytes = format.block_bytes();
    let panels = rows.div_ceil(PANEL_ROWS);
    let bytes = panel_block_bytes(format);
    let mut out = CacheAligned::zeroed(panels * blocks * bytes);
    for (i, target) in out.as_mut_slice().chunks_exact_mut(bytes).enumerate() {
        let (panel, b) = (i / blocks, i % blocks);
        for r in 0..PANEL_ROWS.min(rows - panel * PANEL_ROWS) {
            let at = ((panel * PANEL_ROWS + r) * blocks + b) * ggml_bytes;
            let source = &data[at..at + ggml_bytes];
            match format {
                Format::Q4K => write_q4k_row(source, r, target),
                Format::Q6K => write_q6k_row(source, r, target),
                _ => write_small_row(format, source, r, target),
            }
        }
    }
    out
}

fn put_quant(format: Format, block: &mut [u8], r: usize, c: usize, q: u8) {
    let (at, high_nibble) = quant_position(format, c, r);
    block[at] |= match (format, high_nibble) {
        (Format::Q8_0, _) => q,
        (_, true) => (q & 0x0F) << 4,
        (_, false) => q & 0x0F,
    };
    if let Some((at, shift, bits)) = high_bits_position(format, c, r) {
        block[at] |= ((q >> 4) & bits) << shift;
    }
}

/// One row of a 32-weight block into its panel block.
fn write_small_row(format: Format, source: &[u8], r: usize, target: &mut [u8]) {
    target[small::D + 2 * r..small::D + 2 * r + 2].copy_from_slice(&source[0..2]);
    let quants: Vec<u8> = match format {
        Format::Q4_0 => (0..32).map(|l| nibble(&source[2..], l)).collect(),
        Format::Q4_1 => {
            let mins = small::Q4_1_MINS + 2 * r;
            target[mins..mins + 2].copy_from_slice(&source[2..4]);
            (0..32).map(|l| nibble(&source[4..], l)).collect()
        }
        Format::Q5_0 => {
            let high = u32::from_le_bytes([source[2], source[3], source[4], source[5]]);
            (0..32)
                .map(|l| nibble(&source[6..], l) | ((((high >> l) & 1) as u8) << 4))
                .collect()
        }
        _ => source[2..34].iter().map(|&w| w ^ 0x80).collect(),
    };
    for (c, q) in quants.into_iter().enumerate() {
        put_quant(format, target, r, c, q);
    }
}

fn write_q4k_row(source: &[u8], r: usize, target: &mut [u8]) {
    target[q4k::D + 2 * r..q4k::D + 2 * r + 2].copy_from_slice(&source[0..2]);
    target[q4k::DMIN + 2 * r..q4k::DMIN + 2 * r + 2].copy_from_slice(&source[2..4]);
    for j in 0..8 {
        let (scale, min) = q4k_scale_min(&source[4..16], j);
        target[q4k::SCALES + 16 * j + r] = scale;
        target[q4k::MINS + 32 * (j / 2) + 2 * r + j % 2] = min;
    }
    let qs = &source[16..144];
    for c in 0..256 {
        let (j, l) = (c / 32, c % 32);
        let byte = qs[32 * (j / 2) + l];
        let q = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
        put_quant(Format::Q4K, target, r, c, q);
    }
}

fn write_q6k_row(source: &[u8], r: usize, target: &mut [u8]) {
    target[q6k::D + 2 * r..q6k::D + 2 * r + 2].copy_from_slice(&source[208..210]);
    for j in 0..16 {
        target[q6k::SCALES + 16 * j + r] = source[192 + j];
    }
    for c in 0..256 {
        put_quant(Format::Q6K, target, r, c, q6k_quant(source, c));
    }
}

/// Row `r` (0..16) of one panel block dequantized (one ggml block of values).
pub(crate) fn dequantize_row(format: Format, block: &[u8], r: usize, out: &mut [f32]) {
    match format {
        Format::Q4K => {
            let (d, dmin) = (
                f16_at(block, q4k::D + 2 * r),
                f16_at(block, q4k::DMIN + 2 * r),
            );
            for (c, o) in out.iter_mut().enumerate() {
                let j = c / 32;
                let scale = block[q4k::SCALES + 16 * j + r] as f32;
                let min = block[q4k::MINS + 32 * (j / 2) + 2 * r + j % 2] as f32;
                *o = d * scale * quant(format, block, r, c) as f32 - dmin * min;
            }
        }
        Format::Q6K => {
            let d = f16_at(block, q6k::D + 2 * r);
            for (c, o) in out.iter_mut().enumerate() {
                let scale = block[q6k::SCALES + 16 * (c / 16) + r] as i8 as f32;
                *o = d * scale * (quant(format, block, r, c) as f32 - 32.0);
            }
        }
        Format::Q4_1 => {
            let (d, m) = (
                f16_at(block, small::D + 2 * r),
                f16_at(block, small::Q4_1_MINS + 2 * r),
            );
            for (c, o) in out.iter_mut().enumerate() {
                *o = d * quant(format, block, r, c) as f32 + m;
            }
        }
        _ => {
            let d = f16_at(block, small::D + 2 * r);
            for (c, o) in out.iter_mut().enumerate() {
                *o = d * signed_weight(format, block, r, c) as f32;
            }
        }
    }
}

/// Row r · token t for the first `rows` rows of one panel (all its blocks in `panel`) and the
/// tokens of `acts`, into `out`'s row `first_row + r` of token t, in plain Rust: the reference
/// arithmetic.
pub(crate) fn panel_dot(
    format: Format,
    panel: &[u8],
    rows: usize,
    acts: &QuantizedTokens,
    out: &TaskOut<'_>,
    first_row: usize,
) {
    let (bytes, len) = (panel_block_bytes(format), format.block_len());
    for r in 0..rows {
        for t in 0..out.tokens() {
            let (a, scales) = (acts.quants_of(t), acts.scales_of(t));
            let mut acc = 0f32;
            for (b, block) in panel.chunks_exact(bytes).enumerate() {
                let a = &a[len * b..len * b + len];
                let da = scales[b];
                let dot = |cols: std::ops::Range<usize>| -> i32 {
                    cols.map(|c| signed_weight(format, block, r, c) * a[c] as i32)
                        .sum()
                };
                match format {
                    Format::Q4K => {
                        let groups = &acts.group_sums_of(t)[8 * b..8 * b + 8];
                        let (mut total, mut mins) = (0i32, 0i32);
                        for j in 0..8 {
                            let scale = block[q4k::SCALES + 16 * j + r] as i32;
                            let min = block[q4k::MINS + 32 * (j / 2) + 2 * r + j % 2] as i32;
                            total += scale * dot(32 * j..32 * j + 32);
                            mins += min * groups[j] as i32;
                        }
                        let (d, dmin) = (
                            f16_at(block, q4k::D + 2 * r),
                            f16_at(block, q4k::DMIN + 2 * r),
                        );
                        acc = (total as f32).mul_add(d * da, acc);
                        acc = (-(mins as f32)).mul_add(dmin * da, acc);
                    }
                    Format::Q6K => {
                        let mut total = 0i32;
                        for j in 0..16 {
                            let scale = block[q6k::SCALES + 16 * j + r] as i8 as i32;
                            total += scale * dot(16 * j..16 * j + 16);
                        }
                        acc = (total as f32).mul_add(f16_at(block, q6k::D + 2 * r) * da, acc);
                    }
                    _ => {
                        let d = f16_at(block, small::D + 2 * r);
                        acc = (dot(0..32) as f32).mul_add(d * da, acc);
                        if format == Format::Q4_1 {
                            let m = f16_at(block, small::Q4_1_MINS + 2 * r);
                            acc = m.mul_add(da * acts.group_sums_of(t)[b] as f32, acc);
                        }
                    }
                }
            }
            // SAFETY: one value at a time, in the task's own rows.
            unsafe { out.rows_of(t, first_row + r, 1)[0] = acc };
        }
    }
}
