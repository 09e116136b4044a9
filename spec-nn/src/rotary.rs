//! Rotary position embeddings (RoPE) at explicit positions: siblings of a token tree share a
//! position, so the angles come from position ids, not from the order of the inputs.

use candle_core::{Device, Tensor};

use crate::linear::with_cpu_values;
use crate::Result;

/// How rotary embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Dimension i pairs with i + d/2 (Hugging Face `rotate_half`, GGUF qwen2).
    Halves,
    /// Dimensions 2i and 2i + 1 pair (GGUF llama, whose converter permutes Q and K).
    Interleaved,
}

/// A model's rotary frequencies and pairing.
#[derive(Debug, Clone)]
pub struct Rotary {
    inverse_frequencies: Tensor,
    layout: RopeLayout,
}

/// cos/sin of `position · inverse_frequency` for the inputs of one forward, computed once and
/// applied in every layer.
#[derive(Debug, Clone)]
pub struct RotaryTables {
    cos: Tensor,
    sin: Tensor,
    layout: RopeLayout,
}

impl Rotary {
    /// `inverse_frequencies`: `head_dim / 2` values (`θ^(−2i/d)`, after any scaling).
    pub fn new(inverse_frequencies: Vec<f32>, layout: RopeLayout, device: &Device) -> Result<Self> {
        Ok(Self {
            inverse_frequencies: Tensor::new(inverse_frequencies, device)?,
            layout,
        })
    }

    /// The tables for inputs at `positions`, `[n, head_dim / 2]` each.
    pub fn tables(&self, positions: &[usize]) -> Result<RotaryTables> {
        let positions: Vec<f32> = positions.iter().map(|&p| p as f32).collect();
        let n = positions.len();
        let angles = Tensor::from_vec(positions, (n, 1), self.inverse_frequencies.device())?
            .broadcast_mul(&self.inverse_frequencies.unsqueeze(0)?)?;
        Ok(RotaryTables {
            cos: angles.cos()?,
            sin: angles.sin()?,
            layout: self.layout,
        })
    }
}

impl RotaryTables {
    /// The cosines and sines, `[n, head_dim / 2]` each.
    pub fn cos_sin(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    pub fn layout(&self) -> RopeLayout {
        self.layout
    }

    /// Rotates `x` `[1, heads, n, head_dim]`.
    pub fn rotate(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self.layout {
            RopeLayout::Halves => candle_nn::rotary_emb::rope(x, &self.cos, &self.sin)?,
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(x, &self.cos, &self.sin)?,
        })
    }

    /// Rotates `x` given as values, `[n, heads, head_dim]` row-major, in place, with the
    /// arithmetic of [`RotaryTables::rotate`] (candle's `rope` / `rope_i`), so the same bits.
    pub fn rotate_rows(
        &self,
        x: &mut [f32],
        n: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let half = head_dim / 2;
        with_cpu_values(&self.cos, |cos| {
            with_cpu_values(&self.sin, |sin| {
                if x.len() != n * heads * head_dim
                    || cos.len() != n * half
                    || !head_dim.is_multiple_of(2)
                {
                    return Err(crate::Error::Config(format!(
                        "rotary tables of {} angles for {n} rows of {heads} heads of {head_dim}",
                        cos.len()
                    )));
                }
                for (t, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
                    let cos = &cos[t * half..(t + 1) * half];
                    let sin = &sin[t * half..(t + 1) * half];
                    for head in row.chunks_exact_mut(head_dim) {
                        for i in 0..half {
                            let (a, b) = match self.layout {
                                RopeLayout::Halves => (i, i + half),
                                RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                            };
                            let (x0, x1) = (head[a], head[b]);
                            head[a] = x0 * cos[i] - x1 * sin[i];
                            head[b] = x0 * sin[i] + x1 * cos[i];
                        }
                    }
                }
                Ok(())
            })
        })??
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_depends_on_the_position_not_the_order() {
        let device = Device::Cpu;
        for layout in [RopeLayout::Halves, RopeLayout::Interleaved] {
            let rotary = Rotary::new(vec![1.0, 0.1], layout, &device).unwrap();
            let x = Tensor::randn(0f32, 1.0, (1, 2, 3, 4), &device).unwrap();
            let together = rotary.tables(&[5, 7, 5]).unwrap().rotate(&x).unwrap();
            for (row, position) in [5usize, 7, 5].into_iter().enumerate() {
                let alone = rotary
                    .tables(&[position])
                    .unwrap()
                    .rotate(&x.narrow(2, row, 1).unwrap().contiguous().unwrap())
                    .unwrap();
                let a: Vec<f32> = together
                    .narrow(2, row, 1)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let b: Vec<f32> = alone.flatten_all().unwrap().to_vec1().unwrap();
                assert_eq!(a, b, "{layout:?} row {row}");
            }
            // Position 0 is the identity; rotation keeps each pair's norm.
            let zero = rotary.tables(&[0, 0, 0]).unwrap().rotate(&x).unwrap();
            let (x0, z0): (Vec<f32>, Vec<f32>) = (
                x.flatten_all().unwrap().to_vec1().unwrap(),
                zero.flatten_all().unwrap().to_vec1().unwrap(),
            );
            assert_eq!(x0, z0);
            let norm =
                |t: &Tensor| -> f32 { t.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap() };
            assert!((norm(&together) - norm(&x)).abs() < 1e-4);
        }
    }
}
