//! Feed-forward blocks: SwiGLU (Llama, Qwen) and a two-layer GELU MLP (Whisper).
//!
//! SwiGLU's gating, `silu(gate) · up`, runs in one pass on the kernels' threads for f32 CPU
//! tensors (candle's `silu` and `mul` are two single-threaded passes, two allocations and a
//! scalar `expf` per value: about 3 % of a one-token forward of Qwen 1.5B, while the other core
//! waits).

use candle_core::{DType, Device, Module, Tensor};

use crate::linear::{with_cpu_values, Linear};
use crate::{Error, Result};
use spec_core::math::exp;

/// `down(silu(gate(x)) · up(x))`.
#[derive(Debug, Clone)]
pub struct SwiGlu {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl SwiGlu {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [gate, up] = Linear::forward_many([&self.gate, &self.up], x)?;
        Ok(self.down.forward(&swiglu(&gate, &up)?)?)
    }

    /// [`SwiGlu::forward`] of `tokens` rows given as values (`[tokens, in]`), every layer on
    /// the kernels: the same bits, without tensors.
    pub fn forward_rows(&self, x: &[f32], tokens: usize) -> Result<Vec<f32>> {
        let (gate_rows, up_rows) = (self.gate.weight.shape()?.0, self.up.weight.shape()?.0);
        if gate_rows != up_rows {
            return Err(Error::Config(format!(
                "SwiGLU's gate has {gate_rows} outputs and its up projection {up_rows}"
            )));
        }
        let [mut gate, up] = Linear::forward_many_rows([&self.gate, &self.up], x, tokens)?;
        gate_in_place(&mut gate, &up);
        let [out] = Linear::forward_many_rows([&self.down], &gate, tokens)?;
        Ok(out)
    }
}

/// `fc2(gelu(fc1(x)))` with the exact (erf) GELU.
#[derive(Debug, Clone)]
pub struct GeluMlp {
    pub fc1: Linear,
    pub fc2: Linear,
}

impl GeluMlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.fc2.forward(&gelu(&self.fc1.forward(x)?)?)?)
    }
}

/// `erf(x)` within 1.5·10⁻⁷ (Abramowitz & Stegun 7.1.26), in straight-line arithmetic that
/// vectorises.
fn erf(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let y = 1.0 - poly * exp(-x * x);
    y.copysign(x)
}

/// The exact GELU, `x · Φ(x) = x/2 · (1 + erf(x/√2))`, on the kernels' threads for f32 CPU
/// tensors (candle's is one thread calling a scalar `erf`: 7 ms for one Whisper-tiny encoder
/// layer's 1500 × 1536 values).
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 {
        return Ok(x.gelu_erf()?);
    }
    let out = with_cpu_values(x, |values| {
        let mut out = vec![0f32; values.len()];
        spec_kernels::parallel_chunks_mut(&mut out, CHUNK, &|index, out| {
            let start = index * CHUNK;
            let values = &values[start..start + out.len()];
            for (o, &v) in out.iter_mut().zip(values) {
                *o = 0.5 * v * (1.0 + erf(v * std::f32::consts::FRAC_1_SQRT_2));
            }
        });
        out
    })?;
    Ok(Tensor::from_vec(out, x.shape(), &Device::Cpu)?)
}

/// Values per task: a few tasks per thread for a Qwen FFN row (8960), none too small to pay
/// for its hand-out.
const CHUNK: usize = 2048;

/// `silu(gate) · up` for tensors of one shape.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let fast = gate.device().is_cpu()
        && gate.dtype() == DType::F32
        && up.dtype() == DType::F32
        && gate.dims() == up.dims();
    if !fast {
        return Ok((candle_nn::ops::silu(gate)? * up)?);
    }
    let out = with_cpu_values(gate, |g| {
        with_cpu_values(up, |u| {
            let mut out = g.to_vec();
            gate_in_place(&mut out, u);
            out
        })
    })??;
    Ok(Tensor::from_vec(out, gate.shape(), &Device::Cpu)?)
}

/// Values per task of [`gate_in_place`]: SmolLM2's 1536 gates are two tasks, one per core (in
/// one task of [`CHUNK`] the other core waited out about 3 µs per layer), Qwen 1.5B's 8960
/// twelve; a hand-out costs a fraction of a microsecond.
const GATE_CHUNK: usize = 768;

/// `gate ← silu(gate) · up` on the kernels' threads.
fn gate_in_place(gate: &mut [f32], up: &[f32]) {
    spec_kernels::parallel_chunks_mut(gate, GATE_CHUNK, &|index, gate| {
        let start = index * GATE_CHUNK;
        let up = &up[start..start + gate.len()];
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + exp(-*g)) * u;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that `ours` has candle's values `theirs`, each within a relative 1e-6.
    fn assert_matches_candle(ours: &Tensor, theirs: &Tensor) {
        let values = |t: &Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
        for (a, b) in values(ours).iter().zip(&values(theirs)) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

    #[test]
    fn gelu_matches_candles_exact_gelu() {
        let x = Tensor::randn(0f32, 3.0, (3, CHUNK + 11), &Device::Cpu).unwrap();
        assert_matches_candle(&gelu(&x).unwrap(), &x.gelu_erf().unwrap());
    }

    #[test]
    fn swiglu_matches_candles_silu_times_up() {
        let device = Device::Cpu;
        for len in [1, 7, CHUNK, 3 * CHUNK + 5] {
            let gate = Tensor::randn(0f32, 4.0, (1, 1, len), &device).unwrap();
            let up = Tensor::randn(0f32, 1.0, (1, 1, len), &device).unwrap();
            let theirs = (candle_nn::ops::silu(&gate).unwrap() * &up).unwrap();
            assert_matches_candle(&swiglu(&gate, &up).unwrap(), &theirs);
        }
        let bf16 = Tensor::ones((2, 3), DType::BF16, &device).unwrap();
        let y = swiglu(&bf16, &bf16).unwrap();
        assert_eq!((y.dtype(), y.dims()), (DType::BF16, &[2usize, 3][..]));
    }

    #[test]
    fn swiglu_on_values_gives_the_bits_of_swiglu_on_tensors() {
        use std::sync::Arc;

        use candle_core::quantized::{GgmlDType, QTensor};

        use crate::linear::QLinear;

        let device = Device::Cpu;
        let linear = |rows: usize, cols: usize| {
            let w = Tensor::randn(0f32, 0.3, (rows, cols), &device).unwrap();
            let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
            Linear::new(QLinear::new(Arc::new(q), &device).unwrap(), None)
        };
        let ffn = SwiGlu {
            gate: linear(CHUNK + 64, 64),
            up: linear(CHUNK + 64, 64),
            down: linear(64, CHUNK + 64),
        };
        for tokens in [1, 5] {
            let x = Tensor::randn(0f32, 1.0, (1, tokens, 64), &device).unwrap();
            let values = |t: &Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
            let expected = values(&ffn.forward(&x).unwrap());
            let got = ffn.forward_rows(&values(&x), tokens).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&expected), "{tokens} tokens");
        }
        let uneven = SwiGlu {
            up: linear(CHUNK, 64),
            ..ffn
        };
        assert!(matches!(
            uneven.forward_rows(&[0.5; 64], 1),
            Err(Error::Config(_))
        ));
    }
}
