//! Normalisations over the last dimension: RMSNorm (Llama, Qwen) and LayerNorm with bias
//! (Whisper). Each row is normalised on its own, so results do not depend on the batch, nor on
//! whether a few rows are normalised on the calling thread or many on candle's.

use candle_core::{DType, Tensor};

use crate::linear::with_cpu_values;
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

    /// The learned scale.
    pub fn weight(&self) -> &Tensor {
        match self {
            Self::Rms { weight, .. } | Self::Layer { weight, .. } => weight,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Rms { weight, eps } => candle_nn::ops::rms_norm(x, weight, *eps)?,
            Self::Layer { weight, bias, eps } => {
                match few_rows_layer_norm(x, weight, bias, *eps)? {
                    Some(y) => y,
                    None => candle_nn::ops::layer_norm(x, weight, bias, *eps)?,
                }
            }
        })
    }
}

impl Norm {
    /// [`Norm::forward`] of rows given as values (`x`: rows of the weight's width, row-major,
    /// f32 weights on the CPU), on the calling thread: the same bits as candle's norms.
    pub fn forward_rows(&self, x: &[f32]) -> Result<Vec<f32>> {
        let width = self.weight().dims1()?;
        if width == 0 || !x.len().is_multiple_of(width) {
            return Err(crate::Error::Config(format!(
                "a norm of width {width} over {} values",
                x.len()
            )));
        }
        Ok(match self {
            Self::Rms { weight, eps } => {
                with_cpu_values(weight, |weight| rms_norm_rows(x, weight, *eps))?
            }
            Self::Layer { weight, bias, eps } => with_cpu_values(weight, |weight| {
                with_cpu_values(bias, |bias| layer_norm_rows(x, weight, bias, *eps))
            })??,
        })
    }
}

/// Rows up to which LayerNorm runs on the calling thread.
const SEQUENTIAL_ROWS: usize = 64;

/// LayerNorm of a few f32 CPU rows on the calling thread, with candle's arithmetic operation
/// for operation (so the result is bit-identical): candle hands every row to rayon, whose
/// threads wake for a decoding step's few rows and then spin beside the kernels' worker for
/// the two cores. `None` for anything else (many rows, other devices or dtypes).
fn few_rows_layer_norm(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f32,
) -> Result<Option<Tensor>> {
    let width = x.dim(candle_core::D::Minus1)?;
    let rows = x.elem_count() / width.max(1);
    let dense = |t: &Tensor| t.dtype() == DType::F32 && t.device().is_cpu();
    if rows > SEQUENTIAL_ROWS || !(dense(x) && dense(weight) && dense(bias)) {
        return Ok(None);
    }
    let (x, weight, bias) = (
        x.contiguous()?,
        weight.to_vec1::<f32>()?,
        bias.to_vec1::<f32>()?,
    );
    if weight.len() != width || bias.len() != width {
        return Ok(None);
    }
    let values: Vec<f32> = x.flatten_all()?.to_vec1()?;
    let out = layer_norm_rows(&values, &weight, &bias, eps);
    Ok(Some(Tensor::from_vec(out, x.shape(), x.device())?))
}

/// LayerNorm of rows of `weight.len()` values, candle's arithmetic operation for operation.
fn layer_norm_rows(values: &[f32], weight: &[f32], bias: &[f32], eps: f32) -> Vec<f32> {
    let width = weight.len();
    let mut out = vec![0f32; values.len()];
    for (src, dst) in values.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let (mut sum, mut sum2) = (0f32, 0f32);
        for &v in src {
            sum += v;
            sum2 += v * v;
        }
        let mean = sum / width as f32;
        let var = sum2 / width as f32 - mean * mean;
        let inv_std = (var + eps).sqrt().recip();
        for ((d, &s), (&w, &b)) in dst.iter_mut().zip(src).zip(weight.iter().zip(bias)) {
            *d = (s - mean) * inv_std * w + b;
        }
    }
    out
}

/// RMSNorm of rows of `weight.len()` values, candle's arithmetic operation for operation: the
/// squares summed in order, `x / √(mean + ε) · w`.
fn rms_norm_rows(values: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let width = weight.len();
    let mut out = vec![0f32; values.len()];
    for (src, dst) in values.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let sum2 = src.iter().map(|&v| v * v).sum::<f32>();
        let m = (sum2 / width as f32 + eps).sqrt();
        for ((d, &s), &w) in dst.iter_mut().zip(src).zip(weight) {
            *d = s / m * w;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, D};

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn few_rows_give_candles_layer_norm_bit_for_bit() {
        let device = Device::Cpu;
        let weight = Tensor::randn(1f32, 0.3, 96, &device).unwrap();
        let bias = Tensor::randn(0f32, 0.3, 96, &device).unwrap();
        let norm = Norm::layer(weight.clone(), bias.clone(), 1e-5);
        for rows in [1, 5, 64, 65] {
            let x = (Tensor::randn(0f32, 2.0, (1, rows, 96), &device).unwrap() + 0.5).unwrap();
            let ours = values(&norm.forward(&x).unwrap());
            let candle = values(&candle_nn::ops::layer_norm(&x, &weight, &bias, 1e-5).unwrap());
            assert_eq!(ours, candle, "{rows} rows");
        }
    }

    #[test]
    fn norms_on_values_give_the_bits_of_norms_on_tensors() {
        let device = Device::Cpu;
        let weight = Tensor::randn(1f32, 0.3, 96, &device).unwrap();
        let bias = Tensor::randn(0f32, 0.3, 96, &device).unwrap();
        for norm in [
            Norm::rms(weight.clone(), 1e-6),
            Norm::layer(weight.clone(), bias.clone(), 1e-5),
        ] {
            for rows in [1, 3, 40] {
                let x = (Tensor::randn(0f32, 2.0, (1, rows, 96), &device).unwrap() + 0.5).unwrap();
                let expected = values(&norm.forward(&x).unwrap());
                let got = norm.forward_rows(&values(&x)).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&expected), "{rows} rows");
            }
            assert!(norm.forward_rows(&[1.0; 95]).is_err());
        }
    }

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
        let ones = Tensor::ones(64, DType::F32, &device).unwrap();
        let y = Norm::rms(ones, 1e-6).forward(&x).unwrap();
        let ms: Vec<f32> = y.sqr().unwrap().mean(D::Minus1).unwrap().to_vec1().unwrap();
        assert!(ms.iter().all(|m| (m - 1.0).abs() < 1e-4), "{ms:?}");
    }
}
