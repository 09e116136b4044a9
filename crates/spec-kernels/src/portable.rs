//! Portable kernels: one weight row against every token, in the exact arithmetic of the SIMD
//! kernels, so that all paths give bit-identical results.
//!
//! The shared arithmetic: a group of 32 weights meets 32 activation quants in eight integer
//! lanes (lane i sums the products of elements 4i..4i+4, as `vpdpbusd` and
//! `vpmaddubsw`+`vpmaddwd` both group them); offsets and sub-block scales are applied to the
//! lanes in integers, exactly; each block then adds `lane · (weight scale · activation scale)`
//! to eight f32 accumulators with a fused multiply-add; the row's result is the accumulators
//! reduced in the order a 256-bit register is ([`reduce_lanes`]), plus a term for minimums
//! (Q4_1: a scalar; Q4_K: four lanes of sub-block pairs, reduced by [`reduce_four`]). Each token's arithmetic does not depend on how many tokens share
//! the call, which makes the kernels batch-invariant.

use crate::activations::QuantizedTokens;
use crate::formats::{f16_at, kernel_block_bytes, nibble, q6k_quant, Format};

/// Eight f32 lanes added up as a 256-bit register is reduced: halves, then pairs, then the two.
pub(crate) fn reduce_lanes(a: [f32; 8]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let u = [s[0] + s[2], s[1] + s[3]];
    u[0] + u[1]
}

/// Four f32 lanes added up as a 128-bit register is reduced.
pub(crate) fn reduce_four(a: [f32; 4]) -> f32 {
    (a[0] + a[2]) + (a[1] + a[3])
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

/// `out[t]` = row · token t, for every token in `acts`.
pub(crate) fn row_dot(format: Format, row: &[u8], acts: &QuantizedTokens, out: &mut [f32]) {
    let bytes = kernel_block_bytes(format);
    for (t, o) in out.iter_mut().enumerate() {
        let (a, sums) = (acts.quants_of(t), acts.lane_sums_of(t));
        let (scales, groups) = (acts.scales_of(t), acts.group_sums_of(t));
        let mut acc = [0f32; 8];
        let mut extra = 0f32;
        let mut min_acc = [0f32; 4];
        for (b, block) in row.chunks_exact(bytes).enumerate() {
            let da = scales[b];
            match format {
                Format::Q4_0 | Format::Q5_0 | Format::Q8_0 | Format::Q4_1 => {
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
                        _ => (std::array::from_fn(|l| block[2 + l] ^ 0x80), 128),
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
                Format::Q4K => {
                    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
                    let mut total = [0i32; 8];
                    let mut min_pairs = [0i32; 4];
                    for j in 0..8 {
                        let (scale, min) = (block[4 + j], block[12 + j]);
                        let chunk = &block[20 + 32 * (j / 2)..20 + 32 * (j / 2) + 32];
                        let u = std::array::from_fn(|l| {
                            if j % 2 == 0 {
                                chunk[l] & 0x0F
                            } else {
                                chunk[l] >> 4
                            }
                        });
                        let g = 8 * b + j;
                        let l = lanes(&u, &a[32 * g..32 * g + 32]);
                        for (t, l) in total.iter_mut().zip(l) {
                            *t += scale as i32 * l;
                        }
                        min_pairs[j / 2] += min as i32 * groups[g] as i32;
                    }
                    accumulate(&mut acc, total, d * da);
                    for (m, p) in min_acc.iter_mut().zip(min_pairs) {
                        *m = (p as f32).mul_add(dmin * da, *m);
                    }
                }
                Format::Q6K => {
                    let d = f16_at(block, 208);
                    let mut total = [0i32; 8];
                    for j in 0..8 {
                        let u = std::array::from_fn(|l| q6k_quant(block, 32 * j + l));
                        let g = 8 * b + j;
                        let l = lanes(&u, &a[32 * g..32 * g + 32]);
                        for (i, (t, l)) in total.iter_mut().zip(l).enumerate() {
                            let scale = block[192 + 2 * j + i / 4] as i8 as i32;
                            *t += scale * (l - 32 * sums[8 * g + i]);
                        }
                    }
                    accumulate(&mut acc, total, d * da);
                }
            }
        }
        *o = match format {
            Format::Q4_1 => reduce_lanes(acc) + extra,
            Format::Q4K => reduce_lanes(acc) - reduce_four(min_acc),
            _ => reduce_lanes(acc),
        };
    }
}
