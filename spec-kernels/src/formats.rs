//! The GGUF block formats these kernels read, as ggml lays them out, and a plain scalar
//! dequantizer that serves as the reference the kernels are tested against.

use half::f16;

/// A GGUF quantization format with a kernel here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// 32 weights: f16 scale d, 16 bytes of nibbles; w = d·(q − 8).
    Q4_0,
    /// 32 weights: f16 scale d, f16 minimum m, 16 bytes of nibbles; w = d·q + m.
    Q4_1,
    /// 32 weights: f16 scale d, 32 high bits, 16 bytes of nibbles; w = d·(q − 16), q of 5 bits.
    Q5_0,
    /// 32 weights: f16 scale d, 32 signed bytes; w = d·q.
    Q8_0,
    /// 256 weights in 8 sub-blocks of 32: f16 d and dmin, 12 bytes of packed 6-bit sub-block
    /// scales and minimums, 128 bytes of nibbles; w = d·scale·q − dmin·min.
    Q4K,
    /// 256 weights in 16 sub-blocks of 16: 128 bytes of low nibbles, 64 bytes of high 2-bit
    /// pairs, 16 signed 8-bit scales, f16 d; w = d·scale·(q − 32), q of 6 bits.
    Q6K,
}

impl Format {
    /// Every format with a kernel.
    pub const ALL: [Format; 6] = [
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q8_0,
        Format::Q4K,
        Format::Q6K,
    ];

    /// Weights per block.
    pub const fn block_len(self) -> usize {
        match self {
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q8_0 => 32,
            Format::Q4K | Format::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q5_0 => 22,
            Format::Q8_0 => 34,
            Format::Q4K => 144,
            Format::Q6K => 210,
        }
    }

    /// Bytes of one row of `cols` weights (`cols` a multiple of [`Format::block_len`]).
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_len() * self.block_bytes()
    }

    /// The ggml type id, as GGUF files store it.
    pub const fn ggml_type_id(self) -> u32 {
        match self {
            Format::Q4_0 => 2,
            Format::Q4_1 => 3,
            Format::Q5_0 => 6,
            Format::Q8_0 => 8,
            Format::Q4K => 12,
            Format::Q6K => 14,
        }
    }

    /// The format with this ggml type id, if it has a kernel here.
    pub fn from_ggml_type_id(id: u32) -> Option<Format> {
        Self::ALL.into_iter().find(|f| f.ggml_type_id() == id)
    }
}

#[inline(always)]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Sub-block `j` (0..8) scale and minimum of a Q4_K block: six bits each, the first four
/// pairs in the low six bits of bytes 0–7, the last four split over bytes 8–11 (low/high
/// nibble) and the top two bits of bytes 0–7.
pub(crate) fn q4k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The unsigned quant of element `e` (0..256) of a Q6_K block (before subtracting 32).
pub(crate) fn q6k_quant(block: &[u8], e: usize) -> u8 {
    let (ql, qh) = (&block[..128], &block[128..192]);
    let (half, r) = (e / 128, e % 128);
    let (group, l) = (r / 32, r % 32);
    let low = ql[64 * half + 32 * (group & 1) + l];
    let nibble = if group < 2 { low & 0x0F } else { low >> 4 };
    nibble | (((qh[32 * half + l] >> (2 * group)) & 3) << 4)
}

/// The unsigned nibble-packed quant of element `l` (0..32) of a 32-weight block whose 16
/// bytes of nibbles start at `qs`: low nibbles are elements 0–15, high nibbles 16–31.
pub(crate) fn nibble(qs: &[u8], l: usize) -> u8 {
    if l < 16 {
        qs[l] & 0x0F
    } else {
        qs[l - 16] >> 4
    }
}

/// Dequantizes one block into `out` (`format.block_len()` values), in plain scalar code.
pub fn dequantize_block(format: Format, block: &[u8], out: &mut [f32]) {
    match format {
        Format::Q4_0 => {
            let d = f16_at(block, 0);
            for (l, o) in out.iter_mut().enumerate() {
                *o = d * (nibble(&block[2..], l) as f32 - 8.0);
            }
        }
        Format::Q4_1 => {
            let (d, m) = (f16_at(block, 0), f16_at(block, 2));
            for (l, o) in out.iter_mut().enumerate() {
                *o = d * nibble(&block[4..], l) as f32 + m;
            }
        }
        Format::Q5_0 => {
            let d = f16_at(block, 0);
            let high = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            for (l, o) in out.iter_mut().enumerate() {
                let q = nibble(&block[6..], l) | ((((high >> l) & 1) as u8) << 4);
                *o = d * (q as f32 - 16.0);
            }
        }
        Format::Q8_0 => {
            let d = f16_at(block, 0);
            for (l, o) in out.iter_mut().enumerate() {
                *o = d * block[2 + l] as i8 as f32;
            }
        }
        Format::Q4K => {
            let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
            let (scales, qs) = (&block[4..16], &block[16..144]);
            for (e, o) in out.iter_mut().enumerate() {
                let j = e / 32;
                let (scale, min) = q4k_scale_min(scales, j);
                let byte = qs[32 * (j / 2) + e % 32];
                let q = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                *o = d * scale as f32 * q as f32 - dmin * min as f32;
            }
        }
        Format::Q6K => {
            let d = f16_at(block, 208);
            for (e, o) in out.iter_mut().enumerate() {
                let scale = block[192 + e / 16] as i8;
                *o = d * scale as f32 * (q6k_quant(block, e) as f32 - 32.0);
            }
        }
    }
}
