//! CTranslate2's `model.bin`: the weight container of faster-whisper's models.
//!
//! Layout (binary version 6, little-endian): `u32` version, the spec's name and `u32` revision,
//! `u32` variable count, then per variable its name, `u8` rank, `u32` dims, `u8` data type and
//! `u32` byte count followed by the data (row-major); finally `u32` alias count and
//! (alias, target) name pairs. Strings are a `u16` length followed by that many bytes, the last
//! one a NUL. Scalars (head counts, flags) are rank-0 variables.
//!
//! The file is indexed once at open (a cut or corrupt file is caught there) and each tensor is
//! read when asked for.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::load::{StoredTensor, WeightSource};
use crate::{Error, Result};

/// Binary versions this reader understands.
const SUPPORTED_VERSIONS: std::ops::RangeInclusive<u32> = 5..=6;
/// The version [`write_model_bin`] writes.
const WRITTEN_VERSION: u32 = 6;

/// CTranslate2's `DataType` numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ct2DType {
    F32,
    I8,
    I16,
    I32,
    F16,
    BF16,
}

impl Ct2DType {
    fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::I8,
            2 => Self::I16,
            3 => Self::I32,
            4 => Self::F16,
            5 => Self::BF16,
            _ => return None,
        })
    }

    fn id(self) -> u8 {
        match self {
            Self::F32 => 0,
            Self::I8 => 1,
            Self::I16 => 2,
            Self::I32 => 3,
            Self::F16 => 4,
            Self::BF16 => 5,
        }
    }

    fn size(self) -> usize {
        match self {
            Self::I8 => 1,
            Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::F32 | Self::I32 => 4,
        }
    }
}

/// Where one variable's data lies.
#[derive(Clone, Debug)]
struct Entry {
    dims: Vec<usize>,
    dtype: Ct2DType,
    offset: u64,
    bytes: usize,
}

/// An indexed CTranslate2 `model.bin`.
pub struct Ct2File {
    path: PathBuf,
    file: File,
    spec: String,
    entries: HashMap<String, Entry>,
}

/// Reads the header fields, turning a short read into a "truncated" error.
struct HeaderReader<'a, R> {
    inner: R,
    position: u64,
    path: &'a Path,
}

impl<R: Read> HeaderReader<'_, R> {
    fn bytes(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; n];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| Error::BadWeights {
                path: self.path.to_path_buf(),
                reason: format!(
                    "file is truncated or unreadable at byte {}: {e}",
                    self.position
                ),
            })?;
        self.position += n as u64;
        Ok(buf)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        let b = self.bytes(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u16()? as usize;
        let mut bytes = self.bytes(len)?;
        if bytes.last() == Some(&0) {
            bytes.pop();
        }
        String::from_utf8(bytes).map_err(|_| Error::BadWeights {
            path: self.path.to_path_buf(),
            reason: format!("a name before byte {} is not UTF-8", self.position),
        })
    }
}

impl<R: Read + Seek> HeaderReader<'_, R> {
    fn skip(&mut self, n: u64) -> Result<()> {
        self.inner
            .seek(SeekFrom::Current(n as i64))
            .map_err(|e| Error::Io {
                path: self.path.to_path_buf(),
                source: e,
            })?;
        self.position += n;
        Ok(())
    }
}

impl Ct2File {
    /// Opens and indexes `path`; a truncated, corrupt or foreign file is a
    /// [`Error::BadWeights`].
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        let bad = |reason: String| Error::BadWeights {
            path: path.to_path_buf(),
            reason,
        };
        let mut reader = HeaderReader {
            inner: BufReader::new(file.try_clone().map_err(io)?),
            position: 0,
            path,
        };
        let version = reader.u32()?;
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(bad(format!(
                "not a CTranslate2 model.bin of a supported binary version ({SUPPORTED_VERSIONS:?}): found {version}"
            )));
        }
        let spec = reader.string()?;
        let _revision = reader.u32()?;
        let count = reader.u32()?;
        let mut entries = HashMap::new();
        for _ in 0..count {
            let name = reader.string()?;
            let rank = reader.u8()? as usize;
            let dims = (0..rank)
                .map(|_| reader.u32().map(|d| d as usize))
                .collect::<Result<Vec<_>>>()?;
            let dtype_id = reader.u8()?;
            let dtype = Ct2DType::from_id(dtype_id)
                .ok_or_else(|| bad(format!("`{name}` has unknown data type {dtype_id}")))?;
            let bytes = reader.u32()? as usize;
            let expected = dims
                .iter()
                .try_fold(dtype.size(), |total, &d| total.checked_mul(d));
            if expected != Some(bytes) {
                let expected = expected.map_or("more than memory holds".into(), |e| e.to_string());
                return Err(bad(format!(
                    "`{name}` {dims:?} of {dtype:?} holds {bytes} bytes, expected {expected}"
                )));
            }
            let offset = reader.position;
            if offset + bytes as u64 > size {
                return Err(bad(format!(
                    "file is truncated: {size} bytes, `{name}` ends at {}",
                    offset + bytes as u64
                )));
            }
            reader.skip(bytes as u64)?;
            entries.insert(
                name,
                Entry {
                    dims,
                    dtype,
                    offset,
                    bytes,
                },
            );
        }
        let aliases = reader.u32()?;
        for _ in 0..aliases {
            let alias = reader.string()?;
            let target = reader.string()?;
            let entry = entries
                .get(&target)
                .cloned()
                .ok_or_else(|| bad(format!("alias `{alias}` names absent `{target}`")))?;
            entries.insert(alias, entry);
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            spec,
            entries,
        })
    }

    /// The model specification the file was written for (e.g. `WhisperSpec`).
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// The names of the variables and aliases the file holds, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// The stored data type of `name`.
    pub fn dtype(&self, name: &str) -> Option<Ct2DType> {
        self.entries.get(name).map(|e| e.dtype)
    }

    fn raw(&mut self, name: &str) -> Result<(Entry, Vec<u8>)> {
        let entry = self
            .entries
            .get(name)
            .cloned()
            .ok_or_else(|| Error::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })?;
        let io = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        let mut data = vec![0u8; entry.bytes];
        self.file.seek(SeekFrom::Start(entry.offset)).map_err(io)?;
        self.file.read_exact(&mut data).map_err(io)?;
        Ok((entry, data))
    }

    /// An integer scalar (head counts, flags).
    pub fn scalar(&mut self, name: &str) -> Result<i64> {
        let (entry, data) = self.raw(name)?;
        if !entry.dims.iter().all(|&d| d == 1) {
            return Err(Error::Config(format!(
                "{}: `{name}` is a tensor {:?}, not a scalar",
                self.path.display(),
                entry.dims
            )));
        }
        Ok(match entry.dtype {
            Ct2DType::I8 => data[0] as i8 as i64,
            Ct2DType::I16 => i16::from_le_bytes([data[0], data[1]]) as i64,
            Ct2DType::I32 => i32::from_le_bytes([data[0], data[1], data[2], data[3]]) as i64,
            dtype => {
                return Err(Error::Config(format!(
                    "{}: `{name}` is a {dtype:?} scalar, expected an integer",
                    self.path.display()
                )))
            }
        })
    }
}

impl WeightSource for Ct2File {
    fn path(&self) -> &Path {
        &self.path
    }

    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.entries.get(name).map(|e| e.dims.clone())
    }

    /// Floating-point tensors only: an int8-quantized model (`weight_scale` variables) is
    /// refused, as its scales would be silently ignored.
    fn tensor(&mut self, name: &str, device: &Device) -> Result<StoredTensor> {
        let (entry, data) = self.raw(name)?;
        let dtype = match entry.dtype {
            Ct2DType::F32 => DType::F32,
            Ct2DType::F16 => DType::F16,
            Ct2DType::BF16 => DType::BF16,
            other => {
                return Err(Error::BadWeights {
                    path: self.path.clone(),
                    reason: format!(
                        "`{name}` is stored as {other:?}; only float32/float16/bfloat16 CTranslate2 models are supported (convert with --quantization float16)"
                    ),
                })
            }
        };
        Ok(StoredTensor::Dense(Tensor::from_raw_buffer(
            &data,
            dtype,
            &entry.dims,
            device,
        )?))
    }
}

/// A variable to write with [`write_model_bin`].
pub enum Ct2Variable {
    /// A floating-point tensor, written in its dtype (f32, f16 or bf16).
    Tensor(Tensor),
    /// An `i16` scalar (CTranslate2 stores head counts this way).
    I16(i16),
    /// An `i8` scalar (flags).
    I8(i8),
}

/// Writes a CTranslate2 `model.bin` of `variables` (sorted by name, as the converter does) and
/// `aliases` (alias → target). Useful to build small models in this format for tests.
pub fn write_model_bin(
    path: &Path,
    spec: &str,
    variables: &[(String, Ct2Variable)],
    aliases: &[(String, String)],
) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&((s.len() + 1) as u16).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    };
    out.extend_from_slice(&WRITTEN_VERSION.to_le_bytes());
    string(&mut out, spec);
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&(variables.len() as u32).to_le_bytes());
    let mut sorted: Vec<&(String, Ct2Variable)> = variables.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, variable) in sorted {
        string(&mut out, name);
        let (dims, dtype, data): (Vec<usize>, Ct2DType, Vec<u8>) = match variable {
            Ct2Variable::I16(v) => (vec![], Ct2DType::I16, v.to_le_bytes().to_vec()),
            Ct2Variable::I8(v) => (vec![], Ct2DType::I8, v.to_le_bytes().to_vec()),
            Ct2Variable::Tensor(t) => {
                let dims = t.dims().to_vec();
                let t = t.flatten_all()?;
                let (dtype, data) = match t.dtype() {
                    DType::F16 => (
                        Ct2DType::F16,
                        t.to_vec1::<half::f16>()?
                            .iter()
                            .flat_map(|x| x.to_le_bytes())
                            .collect(),
                    ),
                    DType::BF16 => (
                        Ct2DType::BF16,
                        t.to_vec1::<half::bf16>()?
                            .iter()
                            .flat_map(|x| x.to_le_bytes())
                            .collect(),
                    ),
                    _ => (
                        Ct2DType::F32,
                        t.to_dtype(DType::F32)?
                            .to_vec1::<f32>()?
                            .iter()
                            .flat_map(|x| x.to_le_bytes())
                            .collect(),
                    ),
                };
                (dims, dtype, data)
            }
        };
        out.push(dims.len() as u8);
        for d in &dims {
            out.extend_from_slice(&(*d as u32).to_le_bytes());
        }
        out.push(dtype.id());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&data);
    }
    out.extend_from_slice(&(aliases.len() as u32).to_le_bytes());
    for (alias, target) in aliases {
        string(&mut out, alias);
        string(&mut out, target);
    }
    File::create(path)
        .and_then(|mut f| f.write_all(&out))
        .map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elementwise::max_abs_difference;
    use crate::load::{Requantize, WeightLoader};

    fn sample(dir: &Path) -> (PathBuf, Tensor) {
        let weight = Tensor::randn(0f32, 1.0, (64, 32), &Device::Cpu).unwrap();
        let path = dir.join("model.bin");
        write_model_bin(
            &path,
            "TestSpec",
            &[
                (
                    "dense/weight".into(),
                    Ct2Variable::Tensor(weight.to_dtype(DType::F16).unwrap()),
                ),
                ("dense/num_heads".into(), Ct2Variable::I16(6)),
                ("flag".into(), Ct2Variable::I8(-1)),
            ],
            &[("tied/weight".into(), "dense/weight".into())],
        )
        .unwrap();
        (path, weight)
    }

    #[test]
    fn tensors_scalars_and_aliases_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (path, weight) = sample(dir.path());
        let mut file = Ct2File::open(&path).unwrap();
        assert_eq!(file.spec(), "TestSpec");
        assert_eq!(file.scalar("dense/num_heads").unwrap(), 6);
        assert_eq!(file.scalar("flag").unwrap(), -1);
        assert_eq!(file.dtype("dense/weight"), Some(Ct2DType::F16));
        assert_eq!(file.dims("tied/weight"), Some(vec![64, 32]));
        let read = file
            .tensor("tied/weight", &Device::Cpu)
            .unwrap()
            .into_f32(&Device::Cpu)
            .unwrap();
        let expected = weight
            .to_dtype(DType::F16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let diff = max_abs_difference(&read, &expected).unwrap();
        assert_eq!(diff, 0.0);
        let mut loader = WeightLoader::new(file, &Device::Cpu, Requantize::default());
        assert!(matches!(
            loader.dense("dense/weight", &[32, 64]),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            loader.dense("absent", &[1]),
            Err(Error::MissingTensor { .. })
        ));
    }

    #[test]
    fn fused_projections_split_into_layers_in_the_chosen_format() {
        use candle_core::quantized::GgmlDType;
        use candle_core::Module;

        let dir = tempfile::tempdir().unwrap();
        let fused = Tensor::randn(0f32, 1.0, (96, 64), &Device::Cpu).unwrap();
        let bias = Tensor::randn(0f32, 1.0, 96, &Device::Cpu).unwrap();
        let path = dir.path().join("model.bin");
        write_model_bin(
            &path,
            "TestSpec",
            &[
                ("qkv/weight".into(), Ct2Variable::Tensor(fused.clone())),
                ("qkv/bias".into(), Ct2Variable::Tensor(bias.clone())),
            ],
            &[],
        )
        .unwrap();
        let x = Tensor::randn(0f32, 1.0, (3, 64), &Device::Cpu).unwrap();
        // The error relative to the product's size (root mean squares): a quantized format's
        // error is a fraction of its weights' scale.
        let rms = |t: &Tensor| {
            t.sqr()
                .unwrap()
                .mean_all()
                .unwrap()
                .sqrt()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        };
        for (requantize, tolerance) in [
            (Requantize::Keep, 1e-6),
            (Requantize::FastAndBatchInvariant, 0.025),
            (Requantize::Dense(GgmlDType::Q4_0), 0.15),
        ] {
            let mut loader =
                WeightLoader::new(Ct2File::open(&path).unwrap(), &Device::Cpu, requantize);
            let parts = loader
                .split_linear("qkv/weight", Some("qkv/bias"), &[32, 64], 64)
                .unwrap();
            assert_eq!(parts.len(), 2);
            let mut start = 0;
            for (part, rows) in parts.iter().zip([32, 64]) {
                let expected = x
                    .matmul(&fused.narrow(0, start, rows).unwrap().t().unwrap())
                    .unwrap()
                    .broadcast_add(&bias.narrow(0, start, rows).unwrap())
                    .unwrap();
                let err = rms(&(part.forward(&x).unwrap() - &expected).unwrap()) / rms(&expected);
                assert!(err < tolerance, "{requantize:?}: {err}");
                start += rows;
            }
            let mut loader =
                WeightLoader::new(Ct2File::open(&path).unwrap(), &Device::Cpu, requantize);
            assert!(matches!(
                loader.split_linear("qkv/weight", None, &[32, 32], 64),
                Err(Error::ShapeMismatch { .. })
            ));
        }
    }

    #[test]
    fn truncated_and_foreign_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = sample(dir.path());
        let bytes = std::fs::read(&path).unwrap();
        for cut in [3, 20, bytes.len() / 2, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let err = Ct2File::open(&path).err().expect("cut file opened");
            assert!(matches!(err, Error::BadWeights { .. }), "{cut}: {err}");
        }
        // A header whose dimensions multiply past any size (4 294 967 295² halves).
        let at = crate::after_name(&bytes, b"dense/weight");
        let at = at + usize::from(bytes[at] == 0);
        assert_eq!(bytes[at], 2, "rank 2");
        let mut huge = bytes.clone();
        huge[at + 1..at + 9].fill(0xff);
        std::fs::write(&path, &huge).unwrap();
        let err = Ct2File::open(&path).err().expect("impossible shape opened");
        assert!(err.to_string().contains("more than memory holds"), "{err}");
        std::fs::write(&path, b"GGUF\x03\x00\x00\x00 not a ctranslate2 file").unwrap();
        assert!(matches!(
            Ct2File::open(&path),
            Err(Error::BadWeights { .. })
        ));
        assert!(matches!(
            Ct2File::open(&dir.path().join("absent.bin")),
            Err(Error::Io { .. })
        ));
    }
}
