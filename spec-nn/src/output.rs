//! The tail every decoder shares: the final norm over every new position (the hidden states
//! prediction heads read) and the output layer over the requested rows only.

use candle_core::{DType, Module, Tensor};

use crate::linear::QLinear;
use crate::norm::Norm;
use crate::Result;

/// What a decoder forward ends with.
#[derive(Debug, Clone)]
pub struct DecoderOutput {
    /// `[n, hidden]`: the final norm's output at every new position.
    pub hidden: Tensor,
    /// `[rows, vocab]` f32 logits of the last `rows` positions.
    pub logits: Tensor,
}

/// Normalizes `x` `[1, n, hidden]` and projects its last `rows` positions (none when `rows` is
/// 0) through `output` (`[vocab_size, hidden]`).
pub fn decoder_output(
    x: &Tensor,
    rows: usize,
    final_norm: &Norm,
    output: &QLinear,
    vocab_size: usize,
) -> Result<DecoderOutput> {
    let n = x.dim(1)?;
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
