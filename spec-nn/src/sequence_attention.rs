//! Attention over a whole sequence in one pass, without a KV cache: the non-autoregressive
//! blocks of a flow-matching TTS decoder (CosyVoice 2's conformer encoder and its estimator's
//! transformers). Batched `[B, T, D]` inputs, an optional additive mask (`0` visible, `−∞` not)
//! broadcast over batch and heads, candle-nn `Linear` projections with their biases.

use candle_core::{Device, Module, Tensor};
use candle_nn::Linear;

use crate::{Error, Result};

/// Multi-head scaled dot-product attention, every position attending to the positions the mask
/// allows (all of them without one).
#[derive(Debug, Clone)]
pub struct SequenceAttention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub out: Linear,
    pub heads: usize,
    pub head_dim: usize,
}

impl SequenceAttention {
    /// `x` `[B, T, D]` → `[B, T, D]`; `bias` broadcasts to `[B, heads, T, T]`.
    pub fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let [q, k, v] = self.project(x)?;
        let scores = q.matmul(&k.transpose(2, 3)?.contiguous()?)?;
        self.attend(scores, &v, bias)
    }

    /// Queries, keys and values `[B, heads, T, head_dim]`.
    fn project(&self, x: &Tensor) -> Result<[Tensor; 3]> {
        let (b, t, _) = x.dims3()?;
        let split = |y: Tensor| -> Result<Tensor> {
            Ok(y.reshape((b, t, self.heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        Ok([
            split(self.q.forward(x)?)?,
            split(self.k.forward(x)?)?,
            split(self.v.forward(x)?)?,
        ])
    }

    /// Softmax of the unscaled `scores` `[B, heads, T, T]` (scaled by `1/√head_dim` here, then
    /// masked) over `v`, heads merged, through the output projection.
    fn attend(&self, scores: Tensor, v: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let (b, _, t, _) = v.dims4()?;
        let mut scores = (scores / (self.head_dim as f64).sqrt())?;
        if let Some(bias) = bias {
            scores = scores.broadcast_add(bias)?;
        }
        let weights = candle_nn::ops::softmax_last_dim(&scores.contiguous()?)?;
        let merged =
            weights
                .matmul(v)?
                .transpose(1, 2)?
                .reshape((b, t, self.heads * self.head_dim))?;
        Ok(self.out.forward(&merged)?)
    }
}

/// Transformer-XL relative-position attention as ESPnet's `RelPositionMultiHeadedAttention`
/// computes it: `score(i, j) = (q_i + u)·k_j + (q_i + v)·p(i − j)`, with `p(r)` a linear map
/// (no bias) of the sinusoid of the relative position `r` and `u`, `v` learned per head.
#[derive(Debug, Clone)]
pub struct RelPositionAttention {
    pub attention: SequenceAttention,
    /// The projection of the relative-position sinusoids.
    pub pos: Linear,
    /// `u` and `v`, `[heads, head_dim]` each.
    pub bias_u: Tensor,
    pub bias_v: Tensor,
}

impl RelPositionAttention {
    /// `x` `[B, T, D]` → `[B, T, D]`; `positions` made for `T` frames and this layer's heads.
    pub fn forward(
        &self,
        x: &Tensor,
        positions: &RelativePositions,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let a = &self.attention;
        let (b, t, _) = x.dims3()?;
        if positions.frames != t || positions.heads != a.heads {
            return Err(Error::Config(format!(
                "relative positions for {} frames and {} heads, attention over {t} frames and {} heads",
                positions.frames, positions.heads, a.heads
            )));
        }
        let [q, k, v] = a.project(x)?;
        let per_head = |bias: &Tensor| bias.reshape((1, a.heads, 1, a.head_dim));
        let p = self
            .pos
            .forward(&positions.table)?
            .reshape((2 * t - 1, a.heads, a.head_dim))?
            .transpose(0, 1)?
            .contiguous()?
            .unsqueeze(0)?;
        let content = q
            .broadcast_add(&per_head(&self.bias_u)?)?
            .matmul(&k.transpose(2, 3)?.contiguous()?)?;
        // Scores against every relative position, then for each (i, j) the one of i − j.
        let shift = positions
            .shift
            .broadcast_as((b, a.heads, t, t))?
            .contiguous()?;
        let position = q
            .broadcast_add(&per_head(&self.bias_v)?)?
            .broadcast_matmul(&p.transpose(2, 3)?.contiguous()?)?
            .contiguous()?
            .gather(&shift, 3)?;
        a.attend((content + position)?, &v, bias)
    }
}

/// ESPnet's relative positional encoding of `T` frames, shared by the layers of a stack: the
/// sinusoids of positions `T − 1 … −(T − 1)` and where each `(i, j)` finds `i − j` among them.
#[derive(Debug, Clone)]
pub struct RelativePositions {
    /// `[2T − 1, D]`: row `k` is the sinusoid of position `T − 1 − k` (`sin` on even, `cos` on
    /// odd channels), in f32 as the reference computes it.
    table: Tensor,
    /// `[1, 1, T, T]`: `T − 1 − i + j`, the row of `i − j`.
    shift: Tensor,
    frames: usize,
    heads: usize,
}

impl RelativePositions {
    pub fn new(frames: usize, dim: usize, heads: usize, device: &Device) -> Result<Self> {
        if frames == 0 || !dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "relative positions of {frames} frames in {dim} channels"
            )));
        }
        let step = -(10000f64.ln() / dim as f64) as f32;
        let frequencies: Vec<f32> = (0..dim / 2)
            .map(|i| ((2 * i) as f32 * step).exp())
            .collect();
        let mut table = Vec::with_capacity((2 * frames - 1) * dim);
        for k in 0..2 * frames - 1 {
            let p = (frames as f32 - 1.0) - k as f32;
            for &f in &frequencies {
                let angle = p * f;
                table.push(angle.sin());
                table.push(angle.cos());
            }
        }
        let shift: Vec<u32> = (0..frames)
            .flat_map(|i| (0..frames).map(move |j| (frames - 1 - i + j) as u32))
            .collect();
        Ok(Self {
            table: Tensor::from_vec(table, (2 * frames - 1, dim), device)?,
            shift: Tensor::from_vec(shift, (1, 1, frames, frames), device)?,
            frames,
            heads,
        })
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QMatMul;
    use spec_core::LayerKvCache;

    use super::*;
    use crate::{AttentionMask, Heads, QLinear, SelfAttention};

    const DIM: usize = 16;

    fn linear(out: usize, inp: usize, bias: bool) -> Linear {
        let device = Device::Cpu;
        let weight =
            (Tensor::randn(0f32, 1.0, (out, inp), &device).unwrap() / (inp as f64).sqrt()).unwrap();
        Linear::new(
            weight,
            bias.then(|| Tensor::randn(0f32, 0.1, out, &device).unwrap()),
        )
    }

    fn attention(heads: usize, head_dim: usize) -> SequenceAttention {
        let inner = heads * head_dim;
        SequenceAttention {
            q: linear(inner, DIM, true),
            k: linear(inner, DIM, true),
            v: linear(inner, DIM, true),
            out: linear(DIM, inner, true),
            heads,
            head_dim,
        }
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    fn assert_close(a: &Tensor, b: &Tensor, tolerance: f32) {
        for (x, y) in values(a).iter().zip(values(b)) {
            assert!((x - y).abs() < tolerance, "{x} vs {y}");
        }
    }

    #[test]
    fn causal_sequence_attention_is_the_decoder_attention() {
        let device = Device::Cpu;
        let (heads, head_dim, t) = (2, 6, 5);
        let sequence = attention(heads, head_dim);
        let spec = |l: &Linear| {
            crate::Linear::new(
                QLinear::Candle(QMatMul::Tensor(l.weight().clone())),
                l.bias().cloned(),
            )
        };
        let decoder = SelfAttention {
            q: spec(&sequence.q),
            k: spec(&sequence.k),
            v: spec(&sequence.v),
            o: spec(&sequence.out),
            heads: Heads::new(heads, heads, head_dim).unwrap(),
        };
        let x = Tensor::randn(0f32, 1.0, (1, t, DIM), &device).unwrap();
        let causal: Vec<f32> = (0..t)
            .flat_map(|i| (0..t).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        let causal = Tensor::from_vec(causal, (1, 1, t, t), &device).unwrap();
        let ours = sequence.forward(&x, Some(&causal)).unwrap();
        let mask = AttentionMask::new(None, t, 0, &device).unwrap();
        let theirs = decoder
            .forward(&x, None, &mask, &mut LayerKvCache::new(heads, 16))
            .unwrap();
        assert_close(&ours, &theirs, 1e-5);
        // Without a mask every position sees the last one: the first row changes.
        let open = sequence.forward(&x, None).unwrap();
        let first = |t: &Tensor| values(&t.narrow(1, 0, 1).unwrap());
        assert_ne!(first(&open), first(&ours));
    }

    #[test]
    fn relative_scores_follow_the_transformer_xl_formula() {
        let device = Device::Cpu;
        let (heads, head_dim, t, b) = (2, 8, 4, 2);
        let rel = RelPositionAttention {
            attention: attention(heads, head_dim),
            pos: linear(DIM, DIM, false),
            bias_u: Tensor::randn(0f32, 0.5, (heads, head_dim), &device).unwrap(),
            bias_v: Tensor::randn(0f32, 0.5, (heads, head_dim), &device).unwrap(),
        };
        let x = Tensor::randn(0f32, 1.0, (b, t, DIM), &device).unwrap();
        let positions = RelativePositions::new(t, DIM, heads, &device).unwrap();
        let ours = rel.forward(&x, &positions, None).unwrap();

        // The same, score by score: p(r) = W_pos · sinusoid(r), sinusoid(r) = table row T−1−r.
        let a = &rel.attention;
        let [q, k, v] = a.project(&x).unwrap();
        let p = rel.pos.forward(&positions.table).unwrap();
        let mut scores = vec![0f32; b * heads * t * t];
        for batch in 0..b {
            for h in 0..heads {
                let u = rel.bias_u.get(h).unwrap();
                let w = rel.bias_v.get(h).unwrap();
                for i in 0..t {
                    let qi = q.get(batch).unwrap().get(h).unwrap().get(i).unwrap();
                    for j in 0..t {
                        let kj = k.get(batch).unwrap().get(h).unwrap().get(j).unwrap();
                        let row = t - 1 - i + j;
                        let pr = p
                            .get(row)
                            .unwrap()
                            .narrow(0, h * head_dim, head_dim)
                            .unwrap();
                        let dot = |a: &Tensor, b: &Tensor| {
                            (a * b)
                                .unwrap()
                                .sum_all()
                                .unwrap()
                                .to_scalar::<f32>()
                                .unwrap()
                        };
                        scores[((batch * heads + h) * t + i) * t + j] =
                            dot(&(&qi + &u).unwrap(), &kj) + dot(&(&qi + &w).unwrap(), &pr);
                    }
                }
            }
        }
        let scores = Tensor::from_vec(scores, (b, heads, t, t), &device).unwrap();
        let reference = a.attend(scores, &v, None).unwrap();
        assert_close(&ours, &reference, 1e-4);
        // Row k of the table is position T − 1 − k: the middle row is position 0.
        let middle = values(&positions.table.get(t - 1).unwrap());
        assert!(middle.chunks(2).all(|pair| pair == [0.0, 1.0]));
    }

    #[test]
    fn mismatched_positions_are_refused() {
        let device = Device::Cpu;
        let rel = RelPositionAttention {
            attention: attention(2, 8),
            pos: linear(DIM, DIM, false),
            bias_u: Tensor::zeros((2, 8), candle_core::DType::F32, &device).unwrap(),
            bias_v: Tensor::zeros((2, 8), candle_core::DType::F32, &device).unwrap(),
        };
        let x = Tensor::randn(0f32, 1.0, (1, 3, DIM), &device).unwrap();
        let positions = RelativePositions::new(4, DIM, 2, &device).unwrap();
        assert!(rel.forward(&x, &positions, None).is_err());
        assert!(RelativePositions::new(0, DIM, 2, &device).is_err());
    }
}
