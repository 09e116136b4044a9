//! Absolute position embeddings: a learned table (Whisper's decoder) and the fixed sinusoids
//! of Whisper's encoder.

use candle_core::{Device, Tensor};

use crate::{Error, Result};

/// Sinusoidal embeddings `[length, channels]` as Whisper's encoder uses them: the first half of
/// the channels `sin(t · e^(−i·ln(10000)/(channels/2 − 1)))`, the second half the cosines.
pub fn sinusoidal_positions(length: usize, channels: usize, device: &Device) -> Result<Tensor> {
    if channels < 4 || !channels.is_multiple_of(2) {
        return Err(Error::Config(format!(
            "sinusoidal positions need an even number of channels ≥ 4, got {channels}"
        )));
    }
    let half = channels / 2;
    let increment = (10_000f64).ln() / (half - 1) as f64;
    let mut data = Vec::with_capacity(length * channels);
    for t in 0..length {
        let angles = (0..half).map(|i| t as f64 * (-increment * i as f64).exp());
        data.extend(angles.clone().map(|a| a.sin() as f32));
        data.extend(angles.map(|a| a.cos() as f32));
    }
    Ok(Tensor::from_vec(data, (length, channels), device)?)
}

/// A learned table of position embeddings `[max_positions, channels]`.
#[derive(Debug, Clone)]
pub struct LearnedPositions {
    table: Tensor,
}

impl LearnedPositions {
    pub fn new(table: Tensor) -> Result<Self> {
        table.dims2()?;
        Ok(Self { table })
    }

    /// How many positions the table holds.
    pub fn len(&self) -> usize {
        self.table.dim(0).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The embeddings of `positions`, `[n, channels]`; a position past the table is a
    /// [`spec_core::Error::ContextOverflow`].
    pub fn embed(&self, positions: &[usize]) -> Result<Tensor> {
        let max = self.len();
        if let Some(&position) = positions.iter().find(|&&p| p >= max) {
            return Err(spec_core::Error::ContextOverflow {
                requested: position + 1,
                max,
            }
            .into());
        }
        let ids: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        let ids = Tensor::new(ids.as_slice(), self.table.device())?;
        Ok(self.table.index_select(&ids, 0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinusoids_follow_whispers_formula() {
        let table: Vec<Vec<f32>> = sinusoidal_positions(1500, 384, &Device::Cpu)
            .unwrap()
            .to_vec2()
            .unwrap();
        // t = 0: sin 0 = 0 in the first half, cos 0 = 1 in the second.
        assert!(table[0][..192].iter().all(|&v| v == 0.0));
        assert!(table[0][192..].iter().all(|&v| v == 1.0));
        // Channel 0 has timescale 1 (sin t), channel 191 timescale 10000.
        assert!((table[7][0] - 7f32.sin()).abs() < 1e-6);
        assert!((table[1499][191] - (1499.0f32 / 10_000.0).sin()).abs() < 1e-6);
        assert!((table[1499][192 + 191] - (1499.0f32 / 10_000.0).cos()).abs() < 1e-6);
        assert!(sinusoidal_positions(4, 3, &Device::Cpu).is_err());
    }

    #[test]
    fn learned_positions_are_rows_of_the_table_and_bounded() {
        let table = Tensor::arange(0f32, 12.0, &Device::Cpu)
            .unwrap()
            .reshape((4, 3))
            .unwrap();
        let positions = LearnedPositions::new(table).unwrap();
        let rows: Vec<Vec<f32>> = positions.embed(&[3, 0, 3]).unwrap().to_vec2().unwrap();
        assert_eq!(
            rows,
            [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0], [9.0, 10.0, 11.0]]
        );
        assert!(matches!(
            positions.embed(&[1, 4]),
            Err(Error::Core(spec_core::Error::ContextOverflow {
                requested: 5,
                max: 4
            }))
        ));
    }
}
