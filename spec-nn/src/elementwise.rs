//! Sums of activations on the calling thread, and the largest difference between two tensors.
//!
//! candle's CPU element-wise operations hand tensors of 64 Ki values or more to a thread pool
//! of their own, whose worker spins for a while before it sleeps. On a machine with as many
//! cores as the kernels' threads, that worker then competes with them for the cores: in a
//! 64-token forward of Qwen2.5-1.5B on 2 cores it took 9 % of the samples, and the forward ran
//! 12 % faster without it. A residual or bias sum is a few microseconds of memory traffic, so
//! on the CPU it runs here instead; other devices and dtypes keep candle's operations. The
//! results are the same bits either way (one IEEE addition per value).

use candle_core::{DType, Tensor};

use crate::linear::with_cpu_values;
use crate::Result;

/// `a + b` for two tensors of one shape (a residual connection).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !on_cpu_in_f32(&[a, b]) || a.shape() != b.shape() {
        return Ok((a + b)?);
    }
    let sum = with_cpu_values(a, |a| {
        with_cpu_values(b, |b| {
            a.iter().zip(b).map(|(x, y)| x + y).collect::<Vec<f32>>()
        })
    })??;
    Ok(Tensor::from_vec(sum, a.shape(), a.device())?)
}

/// `x + bias` with `bias` (`[d]`) added to every row of `x` (`[.., d]`).
pub fn add_bias(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let width = bias.dims1().ok();
    if !on_cpu_in_f32(&[x, bias]) || width.is_none() || x.dims().last().copied() != width {
        return Ok(x.broadcast_add(bias)?);
    }
    let sum = with_cpu_values(x, |x| {
        with_cpu_values(bias, |bias| {
            x.chunks_exact(bias.len())
                .flat_map(|row| row.iter().zip(bias).map(|(v, b)| v + b))
                .collect::<Vec<f32>>()
        })
    })??;
    Ok(Tensor::from_vec(sum, x.shape(), x.device())?)
}

/// The largest `|a − b|` over the values of two f32 tensors of one shape: how far a block's
/// output is from a reference computation's.
pub fn max_abs_difference(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
}

fn on_cpu_in_f32(tensors: &[&Tensor]) -> bool {
    tensors
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == DType::F32)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn sums_are_candles_bit_for_bit_whatever_the_size_and_layout() {
        let device = Device::Cpu;
        // Below and above candle's parallel threshold (64 Ki values).
        for rows in [1, 3, 130] {
            let a = Tensor::randn(0f32, 1.0, (1, rows, 576), &device).unwrap();
            let b = Tensor::randn(0f32, 1.0, (1, rows, 576), &device).unwrap();
            assert_eq!(values(&add(&a, &b).unwrap()), values(&(&a + &b).unwrap()));
            // A transposed (non-contiguous) operand.
            let t = Tensor::randn(0f32, 1.0, (576, rows), &device)
                .unwrap()
                .t()
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            assert_eq!(values(&add(&a, &t).unwrap()), values(&(&a + &t).unwrap()));
            let bias = Tensor::randn(0f32, 1.0, 576, &device).unwrap();
            let got = add_bias(&a, &bias).unwrap();
            assert_eq!(got.dims(), a.dims());
            assert_eq!(values(&got), values(&a.broadcast_add(&bias).unwrap()));
        }
    }

    #[test]
    fn other_shapes_and_dtypes_are_left_to_candle() {
        let device = Device::Cpu;
        let a = Tensor::ones((2, 3), DType::F32, &device).unwrap();
        // Shapes that differ are candle's error, as with `a + b`.
        let row = Tensor::ones((1, 3), DType::F32, &device).unwrap();
        assert!(add(&a, &row).is_err());
        let half = a.to_dtype(DType::F16).unwrap();
        let sum = add(&half, &half).unwrap();
        assert_eq!(sum.dtype(), DType::F16);
        assert!(add_bias(&a, &Tensor::ones(4, DType::F32, &device).unwrap()).is_err());
    }
}
