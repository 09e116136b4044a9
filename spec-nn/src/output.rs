//! The tail every decoder shares: the final norm over every new position (the hidden states
//! prediction heads read) and the output layer over the requested rows only.

use candle_core::{DType, Module, Tensor};
use spec_core::Logits;

use crate::linear::{kernel_values, with_cpu_values, QLinear};
use crate::norm::Norm;
use crate::{Error, Result};

/// What a decoder forward ends with.
#[derive(Debug, Clone)]
pub struct DecoderOutput {
    /// `[n, hidden]`: the final norm's output at every new position.
    pub hidden: Tensor,
    /// `[rows, vocab]` f32 logits of the last `rows` positions.
    pub logits: Tensor,
}

/// Normalizes `x` `[1, n, hidden]` and projects its last `rows` positions (none when `rows` is
/// 0) through `output` (`[vocab_size, hidden]`); more `rows` than `n` are
/// [`Error::RowsBeyondPositions`].
pub fn decoder_output(
    x: &Tensor,
    rows: usize,
    final_norm: &Norm,
    output: &QLinear,
    vocab_size: usize,
) -> Result<DecoderOutput> {
    let n = x.dim(1)?;
    if rows > n {
        return Err(Error::RowsBeyondPositions { rows, positions: n });
    }
    let hidden = final_norm.forward(x)?.squeeze(0)?;
    let logits = if rows == 0 {
        Tensor::zeros((0, vocab_size), DType::F32, x.device())?
    } else {
        unembed(output, &hidden.narrow(0, n - rows, rows)?)?
    };
    Ok(DecoderOutput { hidden, logits })
}

/// The output layer on hidden states `[m, hidden]` → `[m, vocab]` f32. The kernels are
/// batch-invariant, so a row gives the same logits here as inside a forward.
pub fn unembed(output: &QLinear, hidden: &Tensor) -> Result<Tensor> {
    Ok(output
        .forward(&hidden.unsqueeze(0)?)?
        .squeeze(0)?
        .to_dtype(DType::F32)?)
}

/// [`unembed`] into a table of logits: on the kernels the products are written straight into
/// the table's buffer (the same bits as [`unembed`]'s tensor, without copying it out).
pub fn unembed_logits(output: &QLinear, hidden: &Tensor) -> Result<Logits> {
    let QLinear::Kernel(matrix) = output else {
        let logits = unembed(output, hidden)?;
        let (rows, vocab_size) = logits.dims2()?;
        return Ok(Logits::from_tensor(&logits, rows, vocab_size)?);
    };
    let (rows, width) = hidden.dims2()?;
    if width != matrix.cols() {
        return Err(Error::ShapeMismatch {
            name: "hidden states for the output layer".into(),
            got: vec![rows, width],
            expected: vec![rows, matrix.cols()],
        });
    }
    let [data] = with_cpu_values(&hidden.to_dtype(DType::F32)?, |values| {
        kernel_values(&[matrix.as_ref()], values, rows)
    })??
    .try_into()
    .unwrap_or_else(|_| unreachable!("one output for one matrix"));
    Ok(Logits::from_flat(data, matrix.rows())?)
}

/// An output layer that scores some tokens only, `[tokens, hidden]`; every other token's
/// logit is −∞ (a draft model that can only propose these tokens: speculative sampling stays
/// exact, since the target's residual distribution covers the rest).
#[derive(Debug, Clone)]
pub struct ShortlistOutput {
    layer: QLinear,
    /// `[tokens]`, when the layer has a bias.
    bias: Option<Tensor>,
    tokens: Vec<u32>,
    vocab_size: usize,
}

impl ShortlistOutput {
    /// `layer`'s row i (plus `bias[i]`) scores token `tokens[i]` of a vocabulary of
    /// `vocab_size`.
    pub fn new(
        layer: QLinear,
        bias: Option<Tensor>,
        tokens: Vec<u32>,
        vocab_size: usize,
    ) -> Result<Self> {
        let rows = layer.shape()?.0;
        let bias_rows = bias.as_ref().map(|b| b.dims().to_vec());
        if rows != tokens.len() || bias_rows.as_ref().is_some_and(|b| *b != [rows]) {
            return Err(Error::Config(format!(
                "a shortlist output layer with {rows} rows (bias {bias_rows:?}) for {} tokens",
                tokens.len()
            )));
        }
        let mut seen = vec![false; vocab_size];
        for &t in &tokens {
            match seen.get_mut(t as usize) {
                Some(s) if !*s => *s = true,
                Some(_) => return Err(Error::Config(format!("token {t} listed twice"))),
                None => {
                    return Err(Error::Config(format!(
                        "token {t} outside a vocabulary of {vocab_size}"
                    )))
                }
            }
        }
        Ok(Self {
            layer,
            bias,
            tokens,
            vocab_size,
        })
    }

    /// The scored tokens, in row order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Logits over the whole vocabulary for hidden states `[m, hidden]` → `[m, vocab]` f32.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let m = hidden.dim(0)?;
        let mut scores = unembed(&self.layer, hidden)?;
        if let Some(bias) = &self.bias {
            scores = scores.broadcast_add(bias)?;
        }
        let mut out = vec![f32::NEG_INFINITY; m * self.vocab_size];
        with_cpu_values(&scores.to_device(&candle_core::Device::Cpu)?, |values| {
            for (row, scored) in out
                .chunks_exact_mut(self.vocab_size)
                .zip(values.chunks_exact(self.tokens.len()))
            {
                for (&token, &score) in self.tokens.iter().zip(scored) {
                    row[token as usize] = score;
                }
            }
        })?;
        Ok(Tensor::from_vec(
            out,
            (m, self.vocab_size),
            hidden.device(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::Device;

    use super::*;

    #[test]
    fn logits_straight_from_the_kernels_are_the_bits_of_the_tensor_path() {
        let device = Device::Cpu;
        let w = Tensor::randn(0f32, 0.1, (40, 64), &device).unwrap();
        let q = Arc::new(QTensor::quantize(&w, GgmlDType::Q8_0).unwrap());
        let hidden = Tensor::randn(0f32, 1.0, (3, 64), &device).unwrap();
        for layer in [
            QLinear::new(q.clone(), &device).unwrap(),
            QLinear::Candle(QMatMul::from_arc(q.clone()).unwrap()),
        ] {
            let expected: Vec<Vec<f32>> = unembed(&layer, &hidden).unwrap().to_vec2().unwrap();
            let logits = unembed_logits(&layer, &hidden).unwrap();
            assert_eq!((logits.len(), logits.vocab_size()), (3, 40));
            for (got, want) in logits.rows().zip(&expected) {
                assert_eq!(got, want.as_slice());
            }
        }
        let kernel = QLinear::new(q, &device).unwrap();
        assert!(matches!(kernel, QLinear::Kernel(_)));
        let narrow = Tensor::zeros((2, 32), DType::F32, &device).unwrap();
        assert!(matches!(
            unembed_logits(&kernel, &narrow),
            Err(Error::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn more_logit_rows_than_positions_are_an_error() {
        let device = Device::Cpu;
        let w = Tensor::randn(0f32, 0.1, (40, 64), &device).unwrap();
        let q = Arc::new(QTensor::quantize(&w, GgmlDType::Q8_0).unwrap());
        let norm = Norm::rms(Tensor::ones(64, DType::F32, &device).unwrap(), 1e-6);
        let x = Tensor::randn(0f32, 1.0, (1, 2, 64), &device).unwrap();
        for layer in [
            QLinear::new(q.clone(), &device).unwrap(),
            QLinear::Candle(QMatMul::from_arc(q.clone()).unwrap()),
        ] {
            let out = decoder_output(&x, 2, &norm, &layer, 40).unwrap();
            assert_eq!(out.logits.dims(), [2, 40]);
            assert!(matches!(
                decoder_output(&x, 3, &norm, &layer, 40),
                Err(Error::RowsBeyondPositions {
                    rows: 3,
                    positions: 2
                })
            ));
        }
    }
}
