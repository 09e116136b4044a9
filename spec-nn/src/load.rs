//! Weight loading: named tensors from a container ([`WeightSource`]: GGUF, safetensors, or a
//! format an engine plugs in, such as CTranslate2's `model.bin`), checked against the shapes a
//! configuration implies and turned into the blocks' parameters by a [`WeightLoader`].
//!
//! On the CPU, matrices run on `spec-kernels` (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), whose
//! results do not depend on how many tokens a forward carries, so speculative verification
//! reproduces single-token decoding bit for bit. By default
//! ([`Requantize::FastAndBatchInvariant`]) the other formats are re-quantized to Q8_0 at load
//! so that they run there too; candle's own kernels pick different code for one row than for
//! several and would break that guarantee.

mod gguf_alignment;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::linear::{kernel_format, Linear, QLinear};
use crate::{Error, Result};

/// Which matrices are re-quantized at load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Requantize {
    /// Formats `spec-kernels` has no kernel for (Q5_1, Q2K, Q3K, Q5K, and dense f16/bf16/f32
    /// matrices) become Q8_0, so that every matrix runs on the fast, batch-invariant kernels.
    #[default]
    FastAndBatchInvariant,
    /// Keep every tensor as stored (dense weights stay f32).
    Keep,
    /// Dense (f32/f16/bf16) matrices become this kernel format (e.g. Q4_0 for a smaller,
    /// faster model); quantized ones are treated as by [`Self::FastAndBatchInvariant`].
    Dense(GgmlDType),
}

impl Requantize {
    /// The format a matrix stored as `dtype`, with rows of `row_len`, is loaded in.
    fn target(self, dtype: GgmlDType, row_len: usize) -> GgmlDType {
        let dense = matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        let fits = |format: GgmlDType| row_len.is_multiple_of(format.block_size());
        match self {
            Self::Keep => dtype,
            Self::Dense(format) if dense && fits(format) => format,
            _ if kernel_format(dtype).is_none() && fits(GgmlDType::Q8_0) => GgmlDType::Q8_0,
            _ => dtype,
        }
    }
}

/// A tensor as its container stores it.
#[derive(Debug)]
pub enum StoredTensor {
    /// GGML-quantized (or f16/f32 held as a GGML tensor).
    Quantized(QTensor),
    Dense(Tensor),
}

impl StoredTensor {
    pub fn dims(&self) -> &[usize] {
        match self {
            Self::Quantized(q) => q.shape().dims(),
            Self::Dense(t) => t.dims(),
        }
    }

    /// The values in f32 on `device`.
    pub fn into_f32(self, device: &Device) -> Result<Tensor> {
        Ok(match self {
            Self::Quantized(q) => q.dequantize(device)?,
            Self::Dense(t) => t.to_dtype(DType::F32)?.to_device(device)?,
        })
    }
}

/// A container of named tensors.
pub trait WeightSource {
    /// The file the tensors come from, for error messages.
    fn path(&self) -> &Path;
    /// Whether a tensor is stored under `name`.
    fn contains(&self, name: &str) -> bool;
    /// The stored shape of `name`, without reading its data.
    fn dims(&self, name: &str) -> Option<Vec<usize>>;
    /// Reads `name` ([`Error::MissingTensor`] when absent, [`Error::BadWeights`] when
    /// unreadable).
    fn tensor(&mut self, name: &str, device: &Device) -> Result<StoredTensor>;
}

/// An open GGUF file: its header (metadata, tensor index) and a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    file: File,
    content: gguf_file::Content,
}

impl GgufFile {
    /// Opens and parses the header; a truncated or foreign file is a [`Error::BadWeights`], a
    /// `general.alignment` that cannot lay out tensor data an [`Error::GgufAlignment`].
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let alignment = gguf_alignment::read_alignment(&mut BufReader::new(&file));
        file.rewind().map_err(io)?;
        // A header the scan cannot read is left to candle's reader, which refuses it as well
        // and says why.
        if let Some(found) = alignment.ok().flatten().and_then(|a| a.problem()) {
            return Err(Error::GgufAlignment {
                path: path.to_path_buf(),
                found,
            });
        }
        let content = gguf_file::Content::read(&mut file).map_err(|e| Error::BadWeights {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let data_end = content
            .tensor_infos
            .values()
            .map(|info| {
                let elems = info.shape.elem_count();
                let bytes = elems / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
                // A header's offsets are the file's word: one past u64 means a file it is not.
                content
                    .tensor_data_offset
                    .saturating_add(info.offset)
                    .saturating_add(bytes as u64)
            })
            .max()
            .unwrap_or(0);
        let size = file.metadata().map_err(io)?.len();
        if size < data_end {
            return Err(Error::BadWeights {
                path: path.to_path_buf(),
                reason: format!("file is truncated: {size} bytes, the tensors need {data_end}"),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            content,
        })
    }

    /// The header's key/value metadata.
    pub fn metadata(&self) -> &HashMap<String, gguf_file::Value> {
        &self.content.metadata
    }

    /// The names of the tensors the header lists, in no particular order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.content.tensor_infos.keys().map(String::as_str)
    }

    /// A metadata value that must be present.
    pub fn value(&self, key: &str) -> Result<&gguf_file::Value> {
        self.content.metadata.get(key).ok_or_else(|| {
            Error::Config(format!(
                "{}: missing GGUF metadata `{key}`",
                self.path.display()
            ))
        })
    }

    /// An integer metadata value.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.value(key)?;
        v.to_u64()
            .map(|x| x as usize)
            .or_else(|_| v.to_u32().map(|x| x as usize))
            .or_else(|_| v.to_i32().map(|x| x.max(0) as usize))
            .map_err(|_| Error::Config(format!("GGUF `{key}` is not an integer: {v:?}")))
    }

    /// A numeric metadata value.
    pub fn f32(&self, key: &str) -> Result<f32> {
        let v = self.value(key)?;
        v.to_f32()
            .or_else(|_| v.to_f64().map(|x| x as f32))
            .map_err(|_| Error::Config(format!("GGUF `{key}` is not a number: {v:?}")))
    }
}

impl WeightSource for GgufFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn contains(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.content
            .tensor_infos
            .get(name)
            .map(|i| i.shape.dims().to_vec())
    }

    fn tensor(&mut self, name: &str, device: &Device) -> Result<StoredTensor> {
        if !self.contains(name) {
            return Err(Error::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            });
        }
        self.content
            .tensor(&mut self.file, name, device)
            .map(StoredTensor::Quantized)
            .map_err(|e| Error::BadWeights {
                path: self.path.clone(),
                reason: format!("tensor `{name}`: {e}"),
            })
    }
}

/// The tensors of one or more safetensors shards, read into memory (f32, f16 or bf16).
pub struct SafetensorsFiles {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
}

impl SafetensorsFiles {
    pub fn open(shards: &[PathBuf], device: &Device) -> Result<Self> {
        let Some(first) = shards.first() else {
            return Err(Error::Config("no safetensors shard given".into()));
        };
        let mut tensors = HashMap::new();
        for shard in shards {
            let loaded =
                candle_core::safetensors::load(shard, device).map_err(|e| Error::BadWeights {
                    path: shard.clone(),
                    reason: e.to_string(),
                })?;
            tensors.extend(loaded);
        }
        Ok(Self {
            path: first.clone(),
            tensors,
        })
    }

    /// The names of the tensors, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
}

impl WeightSource for SafetensorsFiles {
    fn path(&self) -> &Path {
        &self.path
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.dims().to_vec())
    }

    /// Hands the tensor over (each is read once; the memory goes with it).
    fn tensor(&mut self, name: &str, _device: &Device) -> Result<StoredTensor> {
        self.tensors
            .remove(name)
            .map(StoredTensor::Dense)
            .ok_or_else(|| Error::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })
    }
}

/// Tensors held in memory by name, as weights made or converted in memory come (any other
/// container plugs in the same way, by implementing [`WeightSource`]). Each is handed over once.
pub struct InMemoryWeights(pub HashMap<String, StoredTensor>);

impl InMemoryWeights {
    /// Dense tensors by name.
    pub fn dense(tensors: HashMap<String, Tensor>) -> Self {
        Self(
            tensors
                .into_iter()
                .map(|(name, t)| (name, StoredTensor::Dense(t)))
                .collect(),
        )
    }
}

impl WeightSource for InMemoryWeights {
    fn path(&self) -> &Path {
        Path::new("(memory)")
    }

    fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.0.get(name).map(|t| t.dims().to_vec())
    }

    fn tensor(&mut self, name: &str, _device: &Device) -> Result<StoredTensor> {
        self.0.remove(name).ok_or_else(|| Error::MissingTensor {
            path: self.path().to_path_buf(),
            name: name.to_string(),
        })
    }
}

/// Reads a model's parameters from a [`WeightSource`], checking each against the shape the
/// configuration implies.
pub struct WeightLoader<S> {
    source: S,
    device: Device,
    requantize: Requantize,
}

impl<S: WeightSource> WeightLoader<S> {
    pub fn new(source: S, device: &Device, requantize: Requantize) -> Self {
        Self {
            source,
            device: device.clone(),
            requantize,
        }
    }

    /// Changes the policy for the matrices loaded from now on (e.g. an encoder kept dense for
    /// large matrix products, a decoder on the batch-invariant kernels).
    pub fn set_requantize(&mut self, requantize: Requantize) {
        self.requantize = requantize;
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether `name` is stored.
    pub fn contains(&self, name: &str) -> bool {
        self.source.contains(name)
    }

    fn checked(&mut self, name: &str, shape: &[usize]) -> Result<StoredTensor> {
        let stored = self.source.tensor(name, &self.device)?;
        check_shape(name, stored.dims(), shape)?;
        Ok(stored)
    }

    /// The matrix `[rows, cols]` of a linear layer, on the kernels where it can be (see
    /// [`Requantize`]).
    pub fn matrix(&mut self, name: &str, shape: [usize; 2]) -> Result<QLinear> {
        let stored = self.checked(name, &shape)?;
        self.quantized(stored, shape[1])
    }

    /// `stored` in the format [`Requantize`] picks for rows of `row_len`.
    fn quantized(&self, stored: StoredTensor, row_len: usize) -> Result<QLinear> {
        let quantized = match stored {
            StoredTensor::Quantized(q) => {
                let target = self.requantize.target(q.dtype(), row_len);
                if target == q.dtype() {
                    q
                } else {
                    QTensor::quantize(&q.dequantize(&self.device)?, target)?
                }
            }
            StoredTensor::Dense(t) => {
                let target = self.requantize.target(GgmlDType::F32, row_len);
                // A fresh buffer: `QTensor::quantize` reads the storage from its start, not the
                // view's (a part of a fused matrix starts inside its buffer).
                QTensor::quantize(&t.to_dtype(DType::F32)?.force_contiguous()?, target)?
            }
        };
        QLinear::new(Arc::new(quantized), &self.device)
    }

    /// A linear layer `[out, in]` with an optional bias `[out]`.
    pub fn linear(
        &mut self,
        weight: &str,
        bias: Option<&str>,
        shape: [usize; 2],
    ) -> Result<Linear> {
        let matrix = self.matrix(weight, shape)?;
        let bias = bias.map(|name| self.dense(name, &[shape[0]])).transpose()?;
        Ok(Linear::new(matrix, bias))
    }

    /// Linear layers stored fused in one matrix (e.g. CTranslate2's query/key/value
    /// projection): `weight` `[Σ rows, cols]` and its optional bias are cut into layers of
    /// `rows[i]` outputs each, every part quantized on its own as [`Self::matrix`] would.
    pub fn split_linear(
        &mut self,
        weight: &str,
        bias: Option<&str>,
        rows: &[usize],
        cols: usize,
    ) -> Result<Vec<Linear>> {
        let total: usize = rows.iter().sum();
        let fused = self.dense(weight, &[total, cols])?;
        let fused_bias = bias.map(|name| self.dense(name, &[total])).transpose()?;
        let mut start = 0;
        let mut parts = Vec::with_capacity(rows.len());
        for &n in rows {
            let part = fused.narrow(0, start, n)?;
            let matrix = self.quantized(StoredTensor::Dense(part), cols)?;
            let bias = fused_bias
                .as_ref()
                .map(|b| b.narrow(0, start, n))
                .transpose()?;
            parts.push(Linear::new(matrix, bias));
            start += n;
        }
        Ok(parts)
    }

    /// A tensor in f32 (norm weights, biases, position tables, convolutions).
    pub fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.checked(name, shape)?.into_f32(&self.device)
    }
}

/// [`Error::ShapeMismatch`] unless `got == expected`.
pub fn check_shape(name: &str, got: &[usize], expected: &[usize]) -> Result<()> {
    if got != expected {
        return Err(Error::ShapeMismatch {
            name: name.to_string(),
            got: got.to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use candle_core::Module;

    use super::*;

    fn random(shape: (usize, usize)) -> Tensor {
        Tensor::randn(0f32, 0.1, shape, &Device::Cpu).unwrap()
    }

    fn safetensors(dir: &Path) -> (PathBuf, Tensor) {
        let w = random((16, 64));
        let tensors = HashMap::from([
            ("w".to_string(), w.to_dtype(DType::F16).unwrap()),
            (
                "b".to_string(),
                Tensor::ones(16, DType::BF16, &Device::Cpu).unwrap(),
            ),
            ("odd".to_string(), random((16, 40))),
        ]);
        let path = dir.join("model.safetensors");
        candle_core::safetensors::save(&tensors, &path).unwrap();
        (path, w)
    }

    #[test]
    fn dense_matrices_go_to_the_kernels_unless_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (path, w) = safetensors(dir.path());
        let open = || SafetensorsFiles::open(std::slice::from_ref(&path), &Device::Cpu).unwrap();
        let mut fast = WeightLoader::new(open(), &Device::Cpu, Requantize::default());
        let linear = fast.linear("w", Some("b"), [16, 64]).unwrap();
        assert!(matches!(linear.weight, QLinear::Kernel(_)));
        // A row length no Q8_0 block divides stays dense, on candle.
        assert!(matches!(
            fast.matrix("odd", [16, 40]).unwrap(),
            QLinear::Candle(_)
        ));
        let mut kept = WeightLoader::new(open(), &Device::Cpu, Requantize::Keep);
        assert!(matches!(
            kept.matrix("w", [16, 64]).unwrap(),
            QLinear::Candle(_)
        ));
        // y = x·Wᵀ + b, W as stored in f16.
        let x = Tensor::randn(0f32, 1.0, (1, 3, 64), &Device::Cpu).unwrap();
        let stored = w
            .to_dtype(DType::F16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let exact: Vec<Vec<f32>> = (x.broadcast_matmul(&stored.t().unwrap()).unwrap() + 1.0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2()
            .unwrap();
        let got: Vec<Vec<f32>> = linear
            .forward(&x)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2()
            .unwrap();
        // Q8_0 rounds weights and activations to the nearest of 255 steps of their block's
        // largest magnitude: each is off by at most max/254.
        let (x, w): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (
            x.squeeze(0).unwrap().to_vec2().unwrap(),
            stored.to_vec2().unwrap(),
        );
        let max = |v: &[f32]| v.iter().fold(0f32, |m, a| m.max(a.abs()));
        for (token, (got, exact)) in x.iter().zip(got.iter().zip(&exact)) {
            let dx = max(token) / 254.0;
            for (row, (g, e)) in w.iter().zip(got.iter().zip(exact)) {
                let dw = max(row) / 254.0;
                let bound: f32 = row
                    .iter()
                    .zip(token)
                    .map(|(w, x)| w.abs() * dx + x.abs() * dw + dw * dx)
                    .sum();
                assert!((g - e).abs() <= bound + 1e-4, "{g} vs {e}, bound {bound}");
            }
        }
    }

    #[test]
    fn missing_and_misshapen_tensors_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = safetensors(dir.path());
        let files = SafetensorsFiles::open(&[path], &Device::Cpu).unwrap();
        let mut loader = WeightLoader::new(files, &Device::Cpu, Requantize::default());
        match loader.matrix("w", [64, 16]) {
            Err(Error::ShapeMismatch {
                name,
                got,
                expected,
            }) => {
                assert_eq!(
                    (name.as_str(), got, expected),
                    ("w", vec![16, 64], vec![64, 16])
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(loader.dense("nope", &[1]), Err(Error::MissingTensor { name, .. }) if name == "nope")
        );
        assert!(matches!(
            SafetensorsFiles::open(&[], &Device::Cpu),
            Err(Error::Config(_))
        ));
        let garbage = dir.path().join("garbage.safetensors");
        std::fs::write(&garbage, b"not a safetensors file").unwrap();
        assert!(matches!(
            SafetensorsFiles::open(&[garbage], &Device::Cpu),
            Err(Error::BadWeights { .. })
        ));
    }

    #[test]
    fn gguf_matrices_keep_kernel_formats_and_truncation_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        let q4 = QTensor::quantize(&random((16, 64)), GgmlDType::Q4_0).unwrap();
        let f16 = QTensor::quantize(&random((16, 64)), GgmlDType::F16).unwrap();
        let norm = QTensor::quantize(
            &Tensor::ones(64, DType::F32, &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap();
        let answer = gguf_file::Value::U32(42);
        let mut file = File::create(&path).unwrap();
        gguf_file::write(
            &mut file,
            &[("answer", &answer)],
            &[("q4", &q4), ("f16", &f16), ("norm", &norm)],
        )
        .unwrap();
        drop(file);
        let gguf = GgufFile::open(&path).unwrap();
        assert_eq!(gguf.usize("answer").unwrap(), 42);
        assert!(gguf.f32("missing").is_err());
        assert_eq!(gguf.dims("q4"), Some(vec![16, 64]));
        let mut loader = WeightLoader::new(gguf, &Device::Cpu, Requantize::default());
        let QLinear::Kernel(q4) = loader.matrix("q4", [16, 64]).unwrap() else {
            panic!("Q4_0 has a kernel");
        };
        assert_eq!(q4.format(), spec_kernels::Format::Q4_0);
        let QLinear::Kernel(f16) = loader.matrix("f16", [16, 64]).unwrap() else {
            panic!("f16 is re-quantized for the kernels");
        };
        assert_eq!(f16.format(), spec_kernels::Format::Q8_0);
        assert_eq!(
            loader
                .dense("norm", &[64])
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            vec![1.0; 64]
        );

        let bytes = std::fs::read(&path).unwrap();
        let cut = dir.path().join("cut.gguf");
        std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
        assert!(matches!(
            GgufFile::open(&cut),
            Err(Error::BadWeights { .. })
        ));
        // A header placing a tensor past any file (its offset near 2⁶⁴).
        let at = crate::after_name(&bytes, b"norm");
        // Then: 1 dimension (u32), its length (u64), the type (u32), the offset (u64).
        let mut far = bytes.clone();
        far[at + 16..at + 24].copy_from_slice(&(u64::MAX - 16).to_le_bytes());
        std::fs::write(&cut, &far).unwrap();
        assert!(matches!(
            GgufFile::open(&cut),
            Err(Error::BadWeights { .. })
        ));
        assert!(matches!(
            GgufFile::open(&dir.path().join("absent.gguf")),
            Err(Error::Io { .. })
        ));
    }

    /// A version-3 GGUF header without tensors, with these metadata entries (key, value type,
    /// value bytes).
    fn gguf_header(entries: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
        bytes.extend((entries.len() as u64).to_le_bytes());
        for (key, value_type, value) in entries {
            bytes.extend((key.len() as u64).to_le_bytes());
            bytes.extend(key.as_bytes());
            bytes.extend(value_type.to_le_bytes());
            bytes.extend(value);
        }
        bytes
    }

    #[test]
    fn a_gguf_alignment_that_cannot_lay_out_tensors_is_refused_before_candle_reads_it() {
        let (u32_type, i32_type, string_type, array_type, u64_type) =
            (4u32, 5u32, 8u32, 9u32, 10u32);
        let string = |text: &str| {
            let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
            bytes.extend(text.as_bytes());
            bytes
        };
        // Entries before the alignment that the scan must read past: a string, an array of
        // strings and an array of arrays of u32.
        let mut tokens = string_type.to_le_bytes().to_vec();
        tokens.extend(2u64.to_le_bytes());
        tokens.extend(string("<s>"));
        tokens.extend(string("</s>"));
        let mut nested = array_type.to_le_bytes().to_vec();
        nested.extend(1u64.to_le_bytes());
        nested.extend(u32_type.to_le_bytes());
        nested.extend(2u64.to_le_bytes());
        nested.extend([7u8; 8]);
        let before = [
            ("general.name", string_type, string("tiny")),
            ("tokenizer.ggml.tokens", array_type, tokens),
            ("nested", array_type, nested),
        ];
        let dir = tempfile::tempdir().unwrap();
        let open = |entries: &[(&str, u32, Vec<u8>)]| {
            let path = dir.path().join("header.gguf");
            let all: Vec<_> = before.iter().cloned().chain(entries.to_vec()).collect();
            std::fs::write(&path, gguf_header(&all)).unwrap();
            GgufFile::open(&path).map(|_| ())
        };
        let u32_value = |v: u32| v.to_le_bytes().to_vec();
        for (key, value_type, value, found) in [
            ("general.alignment", u32_type, u32_value(0), "0"),
            ("general.alignment", u32_type, u32_value(48), "48"),
            (
                "general.alignment",
                i32_type,
                (-32i32).to_le_bytes().to_vec(),
                "-32",
            ),
            (
                "general.alignment",
                u64_type,
                64u64.to_le_bytes().to_vec(),
                "stored as a uint64",
            ),
            // Candle's reader drops a key's trailing NULs.
            ("general.alignment\0", u32_type, u32_value(0), "0"),
        ] {
            match open(&[(key, value_type, value)]) {
                Err(Error::GgufAlignment { path, found: got }) => {
                    assert_eq!(path, dir.path().join("header.gguf"));
                    assert_eq!(got, found);
                }
                other => panic!("{key:?} = {found}: {other:?}"),
            }
        }
        open(&[]).unwrap();
        open(&[("general.alignment", u32_type, u32_value(64))]).unwrap();
        // The last of repeated keys is the one candle's reader keeps.
        open(&[
            ("general.alignment", u32_type, u32_value(0)),
            ("general.alignment", u32_type, u32_value(32)),
        ])
        .unwrap();
    }

    #[test]
    fn any_container_loads_through_the_weight_source_trait() {
        let cols = 256;
        let q = QTensor::quantize(&random((32, cols)), GgmlDType::Q6K).unwrap();
        let source = InMemoryWeights(HashMap::from([
            ("proj".to_string(), StoredTensor::Quantized(q)),
            (
                "bias".to_string(),
                StoredTensor::Dense(Tensor::zeros(32, DType::F16, &Device::Cpu).unwrap()),
            ),
        ]));
        let mut loader = WeightLoader::new(source, &Device::Cpu, Requantize::default());
        assert!(loader.contains("proj") && !loader.contains("nope"));
        let linear = loader.linear("proj", Some("bias"), [32, cols]).unwrap();
        assert!(
            matches!(&linear.weight, QLinear::Kernel(m) if m.format() == spec_kernels::Format::Q6K)
        );
        assert_eq!(linear.bias.unwrap().dtype(), DType::F32);
        assert!(matches!(
            loader.matrix("proj", [32, cols]),
            Err(Error::MissingTensor { .. })
        ));
    }
}
