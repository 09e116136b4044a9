//! Q4_K and Q6_K as the kernels keep them: **panels** of 16 rows whose blocks are interleaved
//! so that one 512-bit register holds the same four columns of all 16 rows (llama.cpp and
//! candle repack their K-quants for the same reason).
//!
//! With rows in lanes, one `vpdpbusd` against four activation bytes broadcast to every lane adds
//! four products to each of 16 rows, and a sub-block's scale is applied once per 32 (Q6_K: 16)
//! columns instead of once per four: about half the multiplications of a row-at-a-time kernel,
//! and no horizontal sums. Rows past the matrix's last are zero padding.
//!
//! The arithmetic (every instruction set gives the same bits): for row r, token t and each
//! block, the integer total Σ_j scale_j · (Σ q·a over sub-block j [− 32 Σ a for Q6_K]) and, for
//! Q4_K, the minimums' Σ_j min_j · (Σ a over sub-block j) are exact; one f32 accumulator per
//! (row, token) then takes `acc = fma(total, d·da, acc)` and, for Q4_K,
//! `acc = fma(−mins, dmin·da, acc)`, block after block. A token's arithmetic does not depend on
//! the other tokens of the batch.
//!
//! Layout of one panel block (16 rows × 256 columns); a chunk covers 8 columns of the 16 rows
//! in 64 bytes of nibbles, byte 4r + k holding column k in its low nibble and column 4 + k in
//! its high one, so a nibble mask gives columns 0–3 and a shift columns 4–7, row r in lane r:
//! - Q4_K (2368 bytes): d ×16 (f16), dmin ×16 (f16), scales [sub-block j][row] (u8, 8 × 16),
//!   minimums [pair p][row][2] (u8, 4 × 16 × 2: sub-blocks 2p and 2p + 1), 32 chunks.
//! - Q6_K (3360 bytes): scales [sub-block j][row] (i8, 16 × 16); per sub-block its two chunks
//!   of low nibbles and their 2 × 32 bytes of high bit pairs (byte m of a chunk's 32 holds in
//!   bits 0–1, 2–3, 4–5, 6–7 the high bits of nibble byte m's low nibble, byte m + 32's low
//!   nibble, byte m's high nibble and byte m + 32's high nibble); d ×16 (f16) last.
//!
//! Each block is read front to back, as the hardware prefetcher expects.

use crate::activations::QuantizedTokens;
use crate::aligned::CacheAligned;
use crate::formats::{f16_at, q4k_scale_min, q6k_quant, Format};

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

/// Whether the kernels keep `format` in panels.
pub(crate) const fn is_paneled(format: Format) -> bool {
    matches!(format, Format::Q4K | Format::Q6K)
}

/// Bytes of one panel block (16 rows × 256 columns).
pub(crate) const fn panel_block_bytes(format: Format) -> usize {
    match format {
        Format::Q4K => q4k::BYTES,
        _ => q6k::BYTES,
    }
}

/// Where chunk `h` (columns 8h..8h + 8) of a panel block starts.
pub(crate) const fn chunk_at(format: Format, h: usize) -> usize {
    match format {
        Format::Q4K => q4k::QUANTS + 64 * h,
        _ => q6k::SUB_BLOCKS + q6k::SUB_BLOCK_BYTES * (h / 2) + 64 * (h % 2),
    }
}

/// Where Q6_K chunk `h`'s 32 bytes of high bit pairs start.
pub(crate) const fn q6k_highs_at(h: usize) -> usize {
    q6k::SUB_BLOCKS + q6k::SUB_BLOCK_BYTES * (h / 2) + 128 + 32 * (h % 2)
}

/// Where the quant of row `r`, column `c` (0..256) of a panel block sits: its nibble byte,
/// whether it is the high nibble, and (Q6_K) its high-bit byte and shift.
fn quant_position(format: Format, c: usize, r: usize) -> (usize, bool, usize, u32) {
    let (h, within) = (c / 8, c % 8);
    let (high_nibble, k) = (within >= 4, within % 4);
    let byte = 4 * r + k;
    let shift = 2 * (2 * high_nibble as u32 + (byte / 32) as u32);
    (
        chunk_at(format, h) + byte,
        high_nibble,
        q6k_highs_at(h) + byte % 32,
        shift,
    )
}

/// The unsigned quant of row `r`, column `c` of a panel block.
pub(crate) fn quant(format: Format, block: &[u8], r: usize, c: usize) -> u8 {
    let (at, high_nibble, high_at, shift) = quant_position(format, c, r);
    let nibble = if high_nibble {
        block[at] >> 4
    } else {
        block[at] & 0x0F
    };
    match format {
        Format::Q4K => nibble,
        _ => nibble | (((block[high_at] >> shift) & 3) << 4),
    }
}

/// ggml rows → panels (rows padded with zeros to a multiple of 16).
pub(crate) fn to_panels(format: Format, rows: usize, cols: usize, data: &[u8]) -> CacheAligned {
    let blocks = cols / 256;
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
                _ => write_q6k_row(source, r, target),
            }
        }
    }
    out
}

fn put_quant(format: Format, block: &mut [u8], r: usize, c: usize, q: u8) {
    let (at, high_nibble, high_at, shift) = quant_position(format, c, r);
    block[at] |= if high_nibble {
        (q & 0x0F) << 4
    } else {
        q & 0x0F
    };
    if format == Format::Q6K {
        block[high_at] |= (q >> 4) << shift;
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

/// Row `r` (0..16) of one panel block dequantized (256 values).
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
        _ => {
            let d = f16_at(block, q6k::D + 2 * r);
            for (c, o) in out.iter_mut().enumerate() {
                let scale = block[q6k::SCALES + 16 * (c / 16) + r] as i8 as f32;
                *o = d * scale * (quant(format, block, r, c) as f32 - 32.0);
            }
        }
    }
}

/// `out[r · n + t]` = row r · token t for the first `rows` rows of one panel (all its blocks in
/// `panel`) and the n tokens of `acts`, in plain Rust: the reference arithmetic.
pub(crate) fn panel_dot(
    format: Format,
    panel: &[u8],
    rows: usize,
    acts: &QuantizedTokens,
    out: &mut [f32],
) {
    let n = out.len() / rows;
    let bytes = panel_block_bytes(format);
    for (r, out) in out.chunks_exact_mut(n).enumerate() {
        for (t, o) in out.iter_mut().enumerate() {
            let (a, scales) = (acts.quants_of(t), acts.scales_of(t));
            let mut acc = 0f32;
            for (b, block) in panel.chunks_exact(bytes).enumerate() {
                let a = &a[256 * b..256 * b + 256];
                let da = scales[b];
                let dot = |cols: std::ops::Range<usize>| -> i32 {
                    cols.map(|c| quant(format, block, r, c) as i32 * a[c] as i32)
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
                    _ => {
                        let offsets = &acts.q6k_offsets_of(t)[16 * b..16 * b + 16];
                        let mut total = 0i32;
                        for (j, offset) in offsets.iter().enumerate() {
                            let scale = block[q6k::SCALES + 16 * j + r] as i8 as i32;
                            total += scale * (dot(16 * j..16 * j + 16) + offset);
                        }
                        acc = (total as f32).mul_add(f16_at(block, q6k::D + 2 * r) * da, acc);
                    }
                }
            }
            *o = acc;
        }
    }
}
