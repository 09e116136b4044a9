//! Portable kernels for the 32-weight formats: one weight row against every token, in the
//! exact arithmetic of the SIMD kernels, so that all paths give bit-identical results.
//!
//! The shared arithmetic: a group of 32 weights meets 32 activation quants in eight integer
//! lanes (lane i sums the products of elements 4i..4i+4, as `vpdpbusd` and
//! `vpmaddubsw`+`vpmaddwd` both group them); offsets and sub-block scales are applied to the
//! lanes in integers, exactly; each block then adds `lane · (weight scale · activation scale)`
//! to eight f32 accumulators with a fused multiply-add; the row's result is the accumulators
//! reduced in the order a 256-bit register is ([`reduce_lanes`]), plus Q4_1's minimums as a
//! scalar. Each token's arithmetic does not depend on how many tokens share the call, which
//! makes the kernels batch-invariant.

use crate::activations::QuantizedTokens;
use crate::formats::{f16_at, nibble, Format};

/// Eight f32 lanes added up as a 256-bit register is reduced: halves, then pairs, then the two.
pub(crate) fn reduce_lanes(a: [f32; 8]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let u = [s[0] + s[2], s[1] + s[3]];
    u[0] + u[1]
}

/// Lane products of 32 unsigned weight quants and 32 activation quants.
fn lanes(u: &[u8; 32], a: &[i8]) -> [i32; 8] {
    std::array::from_fn(|i| {
        (0..4)
            .map(|k| u[4 * i + k] as i32 * a[4 * i + k] as i32)
            .sum()
    })
}

fn accumulate(acc: &mut [f32; 8], lanes: [i32; 8], scale: f32) {
    for (a, l) in acc.iter_mut().zip(lanes) {
        *a = (l as f32).mul_add(scale, *a);
    }
}

/// `out[t]` = row · token t, for every token in `acts`, for the 32-weight formats (the
/// K-quants' reference is [`crate::panels::panel_dot`]).
pub(crate) fn row_dot(format: Format, row: &[u8], acts: &QuantizedTokens, out: &mut [f32]) {
    let bytes = format.block_bytes();
    for (t, o) in out.iter_mut().enumerate() {
        let (a, sums) = (acts.quants_of(t), acts.lane_sums_of(t));
        let (scales, groups) = (acts.scales_of(t), acts.group_sums_of(t));
        let mut acc = [0f32; 8];
        let mut extra = 0f32;
        for (b, block) in row.chunks_exact(bytes).enumerate() {
            let da = scales[b];
            let a = &a[32 * b..32 * b + 32];
            let s = &sums[8 * b..8 * b + 8];
            let d = f16_at(block, 0);
            let (u, offset): ([u8; 32], i32) = match format {
                Format::Q4_0 => (std::array::from_fn(|l| nibble(&block[2..], l)), 8),
                Format::Q4_1 => (std::array::from_fn(|l| nibble(&block[4..], l)), 0),
                Format::Q5_0 => {
                    let high = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                    let u = std::array::from_fn(|l| {
                        nibble(&block[6..], l) | ((((high >> l) & 1) as u8) << 4)
                    });
                    (u, 16)
                }
                Format::Q8_0 => (std::array::from_fn(|l| block[2 + l] ^ 0x80), 128),
                Format::Q4K | Format::Q6K => unreachable!("K-quants are kept in panels"),
            };
            let mut l = lanes(&u, a);
            for (l, s) in l.iter_mut().zip(s) {
                *l -= offset * s;
            }
            accumulate(&mut acc, l, d * da);
            if format == Format::Q4_1 {
                extra = (f16_at(block, 2) * da).mul_add(groups[b] as f32, extra);
            }
        }
        *o = match format {
            Format::Q4_1 => reduce_lanes(acc) + extra,
            _ => reduce_lanes(acc),
        };
    }
}
