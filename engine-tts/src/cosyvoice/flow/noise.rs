//! The reference's fixed flow noise, recomputed.

use candle_core::{Device, Tensor};

use crate::cosyvoice::Result;

/// Frames of the reference's fixed noise (`CausalConditionalCFM.rand_noise`, 300 s of mel).
pub const REFERENCE_NOISE_FRAMES: usize = 15000;

/// The reference's fixed flow noise `[1, 80, 15000]`: `torch.randn(1, 80, 15000)` on the CPU
/// after `torch.manual_seed(0)`. Torch fills it from MT19937 (seeded by `init_genrand`) with
/// 24-bit uniforms `d`, turned into normals by Box–Muller over blocks of 16 (`u1 = 1 − d[j]`,
/// `u2 = d[j + 8]` give `d[j]`, `d[j + 8]`); recomputed here in f32, within an ulp or so of
/// torch's vectorised `log`/`sin`/`cos`.
pub fn reference_noise(mel_channels: usize, device: &Device) -> Result<Tensor> {
    let n = mel_channels * REFERENCE_NOISE_FRAMES;
    let mut rng = Mt19937::new(0);
    let mut values: Vec<f32> = (0..n)
        .map(|_| (rng.next_u32() & 0xFF_FFFF) as f32 / (1u32 << 24) as f32)
        .collect();
    let box_muller = |block: &mut [f32]| {
        for j in 0..8 {
            let radius = (-2.0 * (1.0 - block[j]).ln()).sqrt();
            let angle = 2.0 * std::f32::consts::PI * block[j + 8];
            block[j] = radius * angle.cos();
            block[j + 8] = radius * angle.sin();
        }
    };
    for block in values.chunks_exact_mut(16) {
        box_muller(block);
    }
    if !n.is_multiple_of(16) {
        // Torch redraws the last 16 numbers from fresh uniforms.
        let mut tail: Vec<f32> = (0..16)
            .map(|_| (rng.next_u32() & 0xFF_FFFF) as f32 / (1u32 << 24) as f32)
            .collect();
        box_muller(&mut tail);
        values[n - 16..].copy_from_slice(&tail);
    }
    Ok(Tensor::from_vec(
        values,
        (1, mel_channels, REFERENCE_NOISE_FRAMES),
        device,
    )?)
}

/// The Mersenne twister MT19937 (32-bit), as torch's CPU generator runs it.
struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    fn new(seed: u32) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Self { state, index: 624 }
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            for i in 0..624 {
                let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7FFF_FFFF);
                let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    next ^= 0x9908_B0DF;
                }
                self.state[i] = next;
            }
            self.index = 0;
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9D2C_5680;
        y ^= (y << 15) & 0xEFC6_0000;
        y ^ (y >> 18)
    }
}
