//! Linear layers: `spec-kernels` on CPU for the GGUF formats it has kernels for
//! (batch-invariant, so verification matches decoding bit for bit), candle's `QMatMul`
//! otherwise (other devices, dense weights kept as stored), and an optional bias.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Storage, Tensor};
use spec_kernels::{Format, QMatrix};

use crate::elementwise::add_bias;
use crate::Result;

/// `y = x · Wᵀ` for a quantized `W` of shape `[out, in]`.
#[derive(Debug, Clone)]
pub enum QLinear {
    Kernel(Arc<QMatrix>),
    Candle(QMatMul),
}

/// The `spec-kernels` format of a candle quantized dtype, if it has a kernel.
pub fn kernel_format(dtype: GgmlDType) -> Option<Format> {
    match dtype {
        GgmlDType::Q4_0 => Some(Format::Q4_0),
        GgmlDType::Q4_1 => Some(Format::Q4_1),
        GgmlDType::Q5_0 => Some(Format::Q5_0),
        GgmlDType::Q8_0 => Some(Format::Q8_0),
        GgmlDType::Q4K => Some(Format::Q4K),
        GgmlDType::Q6K => Some(Format::Q6K),
        _ => None,
    }
}

impl QLinear {
    /// Uses the kernels when `device` is the CPU and the format has one.
    pub fn new(weights: Arc<QTensor>, device: &Device) -> Result<Self> {
        if let (true, Some(format), Ok((rows, cols))) = (
            device.is_cpu(),
            kernel_format(weights.dtype()),
            weights.shape().dims2(),
        ) {
            let data = weights.data()?.into_owned();
            if let Ok(matrix) = QMatrix::new(format, rows, cols, data) {
                return Ok(Self::Kernel(Arc::new(matrix)));
            }
        }
        Ok(Self::Candle(QMatMul::from_arc(weights)?))
    }

    /// Rows `ids` of the matrix, dequantized: an embedding lookup, `[len, in]` f32.
    pub fn embedding(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        match self {
            Self::Kernel(m) => {
                let cols = m.cols();
                let mut out = vec![0f32; ids.len() * cols];
                for (&id, row) in ids.iter().zip(out.chunks_exact_mut(cols)) {
                    m.dequantize_row(id as usize, row)
                        .map_err(candle_core::Error::wrap)?;
                }
                Ok(Tensor::from_vec(out, (ids.len(), cols), device)?)
            }
            Self::Candle(m) => Ok(m.embedding(&Tensor::new(ids, device)?)?),
        }
    }
}

impl QLinear {
    /// `(rows, cols)`: `[out, in]`.
    pub fn shape(&self) -> Result<(usize, usize)> {
        Ok(match self {
            Self::Kernel(m) => (m.rows(), m.cols()),
            Self::Candle(QMatMul::QTensor(q)) => q.shape().dims2()?,
            Self::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => t.dims2()?,
        })
    }

    /// The whole matrix dequantized, `[out, in]` f32 (for training on a copy of the weights).
    pub fn dequantize(&self, device: &Device) -> Result<Tensor> {
        match self {
            Self::Kernel(m) => {
                let ids: Vec<u32> = (0..m.rows() as u32).collect();
                self.embedding(&ids, device)
            }
            Self::Candle(QMatMul::QTensor(q)) => Ok(q.dequantize(device)?),
            Self::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => {
                Ok(t.to_dtype(DType::F32)?.to_device(device)?)
            }
        }
    }
}

impl QLinear {
    /// Several layers of one input `x` (`[.., in]`), e.g. a layer's query, key and value
    /// projections: when all have kernels, one pass on the kernels' pool that quantizes `x`
    /// once; otherwise one after the other.
    pub fn forward_many<const N: usize>(linears: [&QLinear; N], x: &Tensor) -> Result<[Tensor; N]> {
        let matrices: Option<Vec<&QMatrix>> = linears
            .iter()
            .map(|linear| match linear {
                Self::Kernel(m) => Some(m.as_ref()),
                Self::Candle(_) => None,
            })
            .collect();
        let outputs = match matrices {
            Some(matrices) => kernel_products(&matrices, x)?,
            None => linears
                .iter()
                .map(|linear| linear.forward(x))
                .collect::<candle_core::Result<_>>()?,
        };
        Ok(outputs
            .try_into()
            .unwrap_or_else(|_| unreachable!("one output per layer")))
    }
}

/// `x · Wᵢᵀ` on the last dimension of `x` for every matrix, in one [`QMatrix::matmul_many`]
/// that reads `x` where it lies.
fn kernel_products(matrices: &[&QMatrix], x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
    let dims = x.dims().to_vec();
    let cols = *dims.last().unwrap_or(&0);
    if let Some(m) = matrices.iter().find(|m| m.cols() != cols) {
        candle_core::bail!(
            "matmul of a [{}, {}] matrix with input {dims:?}",
            m.rows(),
            m.cols()
        );
    }
    let tokens = x.elem_count() / cols.max(1);
    let outs = with_cpu_values(&x.to_dtype(DType::F32)?, |values| {
        kernel_values(matrices, values, tokens)
    })??;
    matrices
        .iter()
        .zip(outs)
        .map(|(m, out)| {
            let mut shape = dims.clone();
            *shape.last_mut().expect("cols checked") = m.rows();
            Tensor::from_vec(out, shape, &Device::Cpu)
        })
        .collect()
}

/// `x · Wᵢᵀ` for `tokens` input rows given as values (`[tokens, in]` row-major), each product
/// written by one [`QMatrix::matmul_many`] into a buffer of its own (`[tokens, out]`).
pub(crate) fn kernel_values(
    matrices: &[&QMatrix],
    x: &[f32],
    tokens: usize,
) -> candle_core::Result<Vec<Vec<f32>>> {
    let mut outs: Vec<Vec<f32>> = matrices
        .iter()
        .map(|m| vec![0f32; tokens * m.rows()])
        .collect();
    let mut views: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    QMatrix::matmul_many(matrices, x, tokens, &mut views).map_err(candle_core::Error::wrap)?;
    Ok(outs)
}

/// `f` of the values of an f32 CPU tensor, read where they lie (copied first only when the
/// tensor is not contiguous).
pub fn with_cpu_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(cpu), Some((start, end))) => Ok(f(&cpu.as_slice::<f32>()?[start..end])),
        _ => candle_core::bail!(
            "expected a contiguous f32 tensor on the CPU, got {:?}",
            t.device()
        ),
    }
}

/// `y = x · Wᵀ + b`: a [`QLinear`] with an optional bias `[out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: QLinear,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: QLinear, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// Several layers of one input in one pass (see [`QLinear::forward_many`]), each output
    /// with its own bias.
    pub fn forward_many<const N: usize>(linears: [&Linear; N], x: &Tensor) -> Result<[Tensor; N]> {
        let mut outputs = QLinear::forward_many(linears.map(|linear| &linear.weight), x)?;
        for (y, linear) in outputs.iter_mut().zip(linears) {
            if let Some(bias) = &linear.bias {
                *y = add_bias(y, bias)?;
            }
        }
        Ok(outputs)
    }
}

impl Linear {
    /// Whether the product runs on `spec-kernels` (then [`Linear::forward_many_rows`] can run it).
    pub fn on_kernels(&self) -> bool {
        matches!(self.weight, QLinear::Kernel(_))
    }

    /// [`Linear::forward_many`] for `tokens` input rows given as values (`[tokens, in]`
    /// row-major), giving values (`[tokens, out]` each): one pass on the kernels' pool, each
    /// bias added as [`add_bias`] adds it. `Err` when a layer is not on the kernels.
    pub fn forward_many_rows<const N: usize>(
        linears: [&Linear; N],
        x: &[f32],
        tokens: usize,
    ) -> Result<[Vec<f32>; N]> {
        let matrices = linears
            .iter()
            .map(|linear| match &linear.weight {
                QLinear::Kernel(m) => Ok(m.as_ref()),
                QLinear::Candle(_) => Err(crate::Error::Config(
                    "a product on values needs a matrix on the kernels".into(),
                )),
            })
            .collect::<Result<Vec<&QMatrix>>>()?;
        let mut outs: [Vec<f32>; N] = kernel_values(&matrices, x, tokens)?
            .try_into()
            .unwrap_or_else(|_| unreachable!("one output per layer"));
        for (out, linear) in outs.iter_mut().zip(linears) {
            if let Some(bias) = &linear.bias {
                with_cpu_values(bias, |bias| {
                    if bias.len() * tokens != out.len() {
                        return Err(crate::Error::ShapeMismatch {
                            name: "a bias".into(),
                            got: vec![bias.len()],
                            expected: vec![out.len() / tokens.max(1)],
                        });
                    }
                    for row in out.chunks_exact_mut(bias.len().max(1)) {
                        row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
                    }
                    Ok(())
                })??;
            }
        }
        Ok(outs)
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = self.weight.forward(x)?;
        match &self.bias {
            Some(bias) => add_bias(&y, bias).map_err(candle_core::Error::wrap),
            None => Ok(y),
        }
    }
}

impl Module for QLinear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Kernel(m) => {
                let [y] = <[Tensor; 1]>::try_from(kernel_products(&[m], x)?)
                    .unwrap_or_else(|_| unreachable!("one output per matrix"));
                Ok(y)
            }
            Self::Candle(m) => m.forward(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMATS: [GgmlDType; 6] = [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q8_0,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ];

    /// Random weights quantized by candle (ggml's own quantizers), read by the kernels.
    fn quantized(dtype: GgmlDType) -> (Tensor, Arc<QTensor>) {
        let device = Device::Cpu;
        let w = Tensor::randn(0f32, 0.1, (24, 512), &device).unwrap();
        let q = Arc::new(QTensor::quantize(&w, dtype).unwrap());
        (w, q)
    }

    #[test]
    fn kernel_rows_are_candles_dequantized_rows() {
        for dtype in FORMATS {
            let (_, q) = quantized(dtype);
            let expected: Vec<Vec<f32>> = q.dequantize(&Device::Cpu).unwrap().to_vec2().unwrap();
            let linear = QLinear::new(q, &Device::Cpu).unwrap();
            assert!(matches!(linear, QLinear::Kernel(_)), "{dtype:?}");
            let ids: Vec<u32> = (0..24).collect();
            let rows: Vec<Vec<f32>> = linear
                .embedding(&ids, &Device::Cpu)
                .unwrap()
                .to_vec2()
                .unwrap();
            assert_eq!(rows, expected, "{dtype:?}");
        }
    }

    #[test]
    fn dequantized_matrices_are_candles_for_both_paths() {
        for dtype in FORMATS {
            let (_, q) = quantized(dtype);
            let expected: Vec<Vec<f32>> = q.dequantize(&Device::Cpu).unwrap().to_vec2().unwrap();
            let kernel = QLinear::new(q.clone(), &Device::Cpu).unwrap();
            let candle = QLinear::Candle(QMatMul::from_arc(q).unwrap());
            for linear in [kernel, candle] {
                let got: Vec<Vec<f32>> =
                    linear.dequantize(&Device::Cpu).unwrap().to_vec2().unwrap();
                assert_eq!(got, expected, "{dtype:?}");
            }
        }
    }

    #[test]
    fn kernel_products_match_candles_quantized_matmul() {
        let device = Device::Cpu;
        for dtype in FORMATS {
            let (w, q) = quantized(dtype);
            let x = Tensor::randn(0f32, 1.0, (1, 3, 512), &device).unwrap();
            let ours = QLinear::new(q.clone(), &device)
                .unwrap()
                .forward(&x)
                .unwrap();
            let theirs = QMatMul::from_arc(q).unwrap().forward(&x).unwrap();
            let exact = x.broadcast_matmul(&w.t().unwrap()).unwrap();
            let err = |y: &Tensor| -> f32 {
                (y - &exact)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_keepdim(2)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .max(0)
                    .unwrap()
                    .to_scalar()
                    .unwrap()
            };
            let (ours, theirs) = (err(&ours), err(&theirs));
            // Both quantize the activations to 8 bits; neither may be much further off.
            assert!(
                ours <= 1.5 * theirs + 1e-3,
                "{dtype:?}: error {ours} against candle's {theirs}"
            );
        }
    }

    #[test]
    fn layers_of_one_input_give_their_separate_products() {
        let device = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (1, 5, 512), &device).unwrap();
        let kernels: Vec<QLinear> = [GgmlDType::Q4K, GgmlDType::Q8_0, GgmlDType::Q6K]
            .into_iter()
            .map(|dtype| QLinear::new(quantized(dtype).1, &device).unwrap())
            .collect();
        let candle = QLinear::Candle(QMatMul::from_arc(quantized(GgmlDType::Q4K).1).unwrap());
        for layers in [
            [&kernels[0], &kernels[1], &kernels[2]],
            [&kernels[0], &candle, &kernels[2]],
        ] {
            let together = QLinear::forward_many(layers, &x).unwrap();
            for (layer, y) in layers.iter().zip(&together) {
                let alone = layer.forward(&x).unwrap();
                assert_eq!(y.dims(), [1, 5, 24]);
                let (y, alone): (Vec<f32>, Vec<f32>) = (
                    y.flatten_all().unwrap().to_vec1().unwrap(),
                    alone.flatten_all().unwrap().to_vec1().unwrap(),
                );
                assert_eq!(y, alone);
            }
        }
        let narrow = QLinear::new(
            Arc::new(
                QTensor::quantize(
                    &Tensor::zeros((16, 256), DType::F32, &device).unwrap(),
                    GgmlDType::Q8_0,
                )
                .unwrap(),
            ),
            &device,
        )
        .unwrap();
        assert!(QLinear::forward_many([&kernels[0], &narrow], &x).is_err());
    }

    #[test]
    fn products_on_values_add_their_biases_and_refuse_one_of_another_width() {
        let device = Device::Cpu;
        let (_, q) = quantized(GgmlDType::Q8_0);
        let bias = Tensor::randn(0f32, 1.0, 24, &device).unwrap();
        let linear = Linear::new(QLinear::new(q.clone(), &device).unwrap(), Some(bias));
        let x = Tensor::randn(0f32, 1.0, (1, 3, 512), &device).unwrap();
        let values: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        let [got] = Linear::forward_many_rows([&linear], &values, 3).unwrap();
        let expected: Vec<f32> = linear
            .forward(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(got, expected);
        let wrong = Tensor::randn(0f32, 1.0, 23, &device).unwrap();
        let linear = Linear::new(QLinear::new(q, &device).unwrap(), Some(wrong));
        assert!(Linear::forward_many_rows([&linear], &values, 3).is_err());
    }
}
