//! Normalisations over the last dimension: RMSNorm (Llama, Qwen) and LayerNorm with bias
//! (Whisper). Each row is normalised on its own, so results do not depend on the batch.

use candle_core::Tensor;

use crate::Result;

/// A norm with its learned parameters.
#[derive(Debug, Clone)]
pub enum Norm {
    /// `x / √(mean(x²) + ε) · w`.
    Rms { weight: Tensor, eps: f32 },
    /// `(x − mean) / √(var + ε) · w + b`.
    Layer {
        weight: Tensor,
        bias: Tensor,
        eps: f32,
    },
}

impl Norm {
    pub fn rms(weight: Tensor, eps: f32) -> Self {
        Self::Rms { weight, eps }
    }

    pub fn layer(weight: Tensor, bias: Tensor, eps: f32) -> Self {
        Self::Layer { weight, bias, eps }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Rms { weight, eps } => candle_nn::ops::rms_norm(x, weight, *eps)?,
            Self::Layer { weight, bias, eps } => candle_nn::ops::layer_norm(x, weight, bias, *eps)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, D};

    #[test]
    fn layer_norm_centres_scales_and_shifts_each_row() {
        let device = Device::Cpu;
        let x = Tensor::new(&[[1f32, 2.0, 3.0, 6.0], [-4.0, 0.0, 4.0, 8.0]], &device).unwrap();
        let weight = Tensor::new(&[1f32, 2.0, 1.0, 0.5], &device).unwrap();
        let bias = Tensor::new(&[0f32, 1.0, -1.0, 0.0], &device).unwrap();
        let y: Vec<Vec<f32>> = Norm::layer(weight.clone(), bias.clone(), 1e-5)
            .forward(&x)
            .unwrap()
            .to_vec2()
            .unwrap();
        for (row, out) in x.to_vec2::<f32>().unwrap().iter().zip(&y) {
            let mean = row.iter().sum::<f32>() / 4.0;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
            let w = weight.to_vec1::<f32>().unwrap();
            let b = bias.to_vec1::<f32>().unwrap();
            for i in 0..4 {
                let expected = (row[i] - mean) / (var + 1e-5).sqrt() * w[i] + b[i];
                assert!((out[i] - expected).abs() < 1e-5, "{} vs {expected}", out[i]);
            }
        }
    }

    #[test]
    fn rms_norm_gives_unit_root_mean_square() {
        let device = Device::Cpu;
        let x = Tensor::randn(0f32, 3.0, (3, 64), &device).unwrap();
        let ones = Tensor::ones(64, candle_core::DType::F32, &device).unwrap();
        let y = Norm::rms(ones, 1e-6).forward(&x).unwrap();
        let ms: Vec<f32> = y.sqr().unwrap().mean(D::Minus1).unwrap().to_vec1().unwrap();
        assert!(ms.iter().all(|m| (m - 1.0).abs() < 1e-4), "{ms:?}");
    }
}
