//! A Llama/Qwen2 decoder layer in float weights and differentiable candle operations, for
//! training through frozen layers (an SSD draft's lower layers learn through the target's upper
//! ones). The inference blocks cannot be differentiated: the quantized kernels, candle's fused
//! RMSNorm, rotary and last-dimension softmax have no backward pass. This layer uses candle-nn's
//! `Linear`, `rms_norm_slow`, `rope_slow`/`rope_i_slow` and `softmax`, which do, and computes
//! what `spec-nn`'s [`SelfAttention`](spec_nn::SelfAttention) with [`SwiGlu`](spec_nn::SwiGlu)
//! computes over a causal prompt (tested against them).

use candle_core::{Device, Module, Tensor, D};
use candle_nn::Linear;
use spec_nn::{Heads, Result, RopeLayout, RotaryTables};

/// One pre-norm decoder layer: `x + attention(norm(x))`, then `x + swiglu(norm(x))`.
#[derive(Debug, Clone)]
pub struct TrainableDecoderLayer {
    pub attention_norm: Tensor,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub ffn_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    pub heads: Heads,
    /// The RMSNorms' ε.
    pub eps: f32,
}

impl TrainableDecoderLayer {
    /// `x` `[n, hidden]` at positions `0..n` (`rotary`: their tables), each position attending
    /// to itself and the ones before it.
    pub fn forward(&self, x: &Tensor, rotary: &RotaryTables) -> Result<Tensor> {
        let n = x.dim(0)?;
        let Heads {
            heads,
            kv_heads,
            head_dim: d,
        } = self.heads;
        let h = candle_nn::ops::rms_norm_slow(x, &self.attention_norm, self.eps)?;
        let split = |y: Tensor, count: usize| -> Result<Tensor> {
            Ok(y.reshape((1, n, count, d))?.transpose(1, 2)?.contiguous()?)
        };
        let q = rotate(&split(self.q.forward(&h)?, heads)?, rotary)?;
        let k = rotate(&split(self.k.forward(&h)?, kv_heads)?, rotary)?;
        let v = split(self.v.forward(&h)?, kv_heads)?;
        // Query heads j·g … j·g + g − 1 share key/value head j.
        let group = heads / kv_heads;
        let widen = |t: Tensor| -> Result<Tensor> {
            Ok(t.unsqueeze(2)?
                .expand((1, kv_heads, group, n, d))?
                .reshape((1, heads, n, d))?)
        };
        let (k, v) = (widen(k)?, widen(v)?);
        let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?
            .broadcast_add(&causal_mask(n, x.device())?)?;
        let attended = candle_nn::ops::softmax(&scores, D::Minus1)?
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((n, heads * d))?;
        let x = (x + self.o.forward(&attended)?)?;
        let h = candle_nn::ops::rms_norm_slow(&x, &self.ffn_norm, self.eps)?;
        let gated = (self.gate.forward(&h)?.silu()? * self.up.forward(&h)?)?;
        Ok((&x + self.down.forward(&gated)?)?)
    }
}

/// Rotates `x` `[1, heads, n, head_dim]` with the tables' pairing, differentiably.
fn rotate(x: &Tensor, rotary: &RotaryTables) -> Result<Tensor> {
    let (cos, sin) = rotary.cos_sin();
    Ok(match rotary.layout() {
        RopeLayout::Halves => candle_nn::rotary_emb::rope_slow(x, cos, sin)?,
        RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i_slow(x, cos, sin)?,
    })
}

/// `[n, n]`: 0 where a position may attend, −∞ after it.
fn causal_mask(n: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| (0..n).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Ok(Tensor::from_vec(mask, (n, n), device)?)
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QMatMul;
    use candle_core::Var;
    use spec_core::LayerKvCache;
    use spec_nn::elementwise::max_abs_difference;
    use spec_nn::{AttentionMask, Norm, QLinear, Rotary, SelfAttention, SwiGlu};

    use super::*;

    const HIDDEN: usize = 32;
    const FFN: usize = 48;

    fn random(shape: (usize, usize)) -> Tensor {
        (Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap() / (shape.1 as f64).sqrt()).unwrap()
    }

    fn layer(heads: Heads, bias: bool) -> TrainableDecoderLayer {
        let linear = |out: usize, inp: usize, with_bias: bool| {
            let bias = with_bias.then(|| Tensor::randn(0f32, 0.1, out, &Device::Cpu).unwrap());
            Linear::new(random((out, inp)), bias)
        };
        let (q, kv) = (
            heads.heads * heads.head_dim,
            heads.kv_heads * heads.head_dim,
        );
        let norm = || (Tensor::randn(0f32, 0.1, HIDDEN, &Device::Cpu).unwrap() + 1.0).unwrap();
        TrainableDecoderLayer {
            attention_norm: norm(),
            q: linear(q, HIDDEN, bias),
            k: linear(kv, HIDDEN, bias),
            v: linear(kv, HIDDEN, bias),
            o: linear(HIDDEN, q, false),
            ffn_norm: norm(),
            gate: linear(FFN, HIDDEN, false),
            up: linear(FFN, HIDDEN, false),
            down: linear(HIDDEN, FFN, false),
            heads,
            eps: 1e-6,
        }
    }

    /// The inference blocks with the same (unquantized) weights.
    fn inference_forward(layer: &TrainableDecoderLayer, x: &Tensor, rotary: &Rotary) -> Tensor {
        let device = Device::Cpu;
        let linear = |l: &Linear| {
            spec_nn::Linear::new(
                QLinear::Candle(QMatMul::Tensor(l.weight().clone())),
                l.bias().cloned(),
            )
        };
        let attention = SelfAttention {
            q: linear(&layer.q),
            k: linear(&layer.k),
            v: linear(&layer.v),
            o: linear(&layer.o),
            heads: layer.heads,
        };
        let ffn = SwiGlu {
            gate: linear(&layer.gate),
            up: linear(&layer.up),
            down: linear(&layer.down),
        };
        let n = x.dim(0).unwrap();
        let x = x.unsqueeze(0).unwrap();
        let positions: Vec<usize> = (0..n).collect();
        let tables = rotary.tables(&positions).unwrap();
        let mask = AttentionMask::new(None, n, 0, &device).unwrap();
        let mut cache = LayerKvCache::new(layer.heads.kv_heads, 64);
        let normed = Norm::rms(layer.attention_norm.clone(), layer.eps)
            .forward(&x)
            .unwrap();
        let attended = attention
            .forward(&normed, Some(&tables), &mask, &mut cache)
            .unwrap();
        let x = (x + attended).unwrap();
        let normed = Norm::rms(layer.ffn_norm.clone(), layer.eps)
            .forward(&x)
            .unwrap();
        (&x + ffn.forward(&normed).unwrap())
            .unwrap()
            .squeeze(0)
            .unwrap()
    }

    #[test]
    fn computes_what_the_inference_blocks_compute() {
        let device = Device::Cpu;
        for (layout, heads, bias) in [
            (RopeLayout::Halves, Heads::new(4, 2, 8).unwrap(), true),
            (RopeLayout::Interleaved, Heads::new(4, 4, 8).unwrap(), false),
            (RopeLayout::Halves, Heads::new(2, 1, 16).unwrap(), false),
        ] {
            let layer = layer(heads, bias);
            let rotary = Rotary::new(
                (0..heads.head_dim / 2)
                    .map(|i| 10000f32.powf(-2.0 * i as f32 / heads.head_dim as f32))
                    .collect(),
                layout,
                &device,
            )
            .unwrap();
            let n = 7;
            let x = Tensor::randn(0f32, 1.0, (n, HIDDEN), &device).unwrap();
            let positions: Vec<usize> = (0..n).collect();
            let trained = layer
                .forward(&x, &rotary.tables(&positions).unwrap())
                .unwrap();
            let reference = inference_forward(&layer, &x, &rotary);
            let worst = max_abs_difference(&trained, &reference).unwrap();
            assert!(worst < 1e-4, "{layout:?} {heads:?}: differs by {worst}");
        }
    }

    #[test]
    fn gradients_reach_every_weight_and_the_input() {
        let device = Device::Cpu;
        let heads = Heads::new(4, 2, 8).unwrap();
        let mut layer = layer(heads, true);
        let q = Var::from_tensor(layer.q.weight()).unwrap();
        layer.q = Linear::new(q.as_tensor().clone(), layer.q.bias().cloned());
        let norm = Var::from_tensor(&layer.ffn_norm).unwrap();
        layer.ffn_norm = norm.as_tensor().clone();
        let x = Var::randn(0f32, 1.0, (5, HIDDEN), &device).unwrap();
        let rotary = Rotary::new(vec![1.0, 0.1, 0.01, 0.001], RopeLayout::Halves, &device)
            .unwrap()
            .tables(&[0, 1, 2, 3, 4])
            .unwrap();
        let loss = layer
            .forward(&x, &rotary)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = loss.backward().unwrap();
        for (name, var) in [("q", &q), ("ffn_norm", &norm), ("x", &x)] {
            let grad = grads
                .get(var)
                .unwrap_or_else(|| panic!("no gradient for {name}"));
            let size = grad
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(size > 0.0, "{name}'s gradient is zero");
        }
        // A later position cannot change an earlier one: the mask is causal.
        let grads = layer
            .forward(&x, &rotary)
            .unwrap()
            .narrow(0, 0, 2)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let later = grads.get(&x).unwrap().narrow(0, 2, 3).unwrap();
        assert_eq!(
            later
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            0.0
        );
    }
}
