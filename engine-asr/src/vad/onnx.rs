//! The f32 initializers of an ONNX model file as named tensors: enough of the ONNX protobuf
//! format (`ModelProto.graph.initializer`, each a `TensorProto` with its data inline) to read a
//! small model's weights without ONNX Runtime.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use spec_nn::{StoredTensor, WeightSource};

/// `TensorProto.data_type` of 32-bit floats.
const FLOAT: u64 = 1;
/// `TensorProto.data_location` of data kept in another file.
const EXTERNAL: u64 = 1;

/// The f32 initializers of the main graph of an ONNX file, by name (tensors of other types, and
/// constants inside nodes or subgraphs, are not read).
pub(crate) struct OnnxInitializers {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
}

impl OnnxInitializers {
    /// Reads the file at `path`.
    pub(crate) fn open(path: &Path) -> spec_nn::Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| spec_nn::Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = |reason: String| spec_nn::Error::BadWeights {
            path: path.to_path_buf(),
            reason,
        };
        let mut tensors = HashMap::new();
        for graph in fields(&bytes, 7) {
            for tensor in fields(graph.map_err(&bad)?, 5) {
                if let Some((name, tensor)) = read_tensor(tensor.map_err(&bad)?).map_err(&bad)? {
                    tensors.insert(name, tensor);
                }
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            tensors,
        })
    }

    /// The same tensors under other names: each `(stored, wanted)` pair renames one (the others
    /// are dropped).
    pub(crate) fn renamed(mut self, names: &[(&str, &str)]) -> Self {
        self.tensors = names
            .iter()
            .filter_map(|(stored, wanted)| {
                Some((wanted.to_string(), self.tensors.remove(*stored)?))
            })
            .collect();
        self
    }
}

impl WeightSource for OnnxInitializers {
    fn path(&self) -> &Path {
        &self.path
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.dims().to_vec())
    }

    fn tensor(&mut self, name: &str, _device: &Device) -> spec_nn::Result<StoredTensor> {
        self.tensors
            .remove(name)
            .map(StoredTensor::Dense)
            .ok_or_else(|| spec_nn::Error::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })
    }
}

/// A `TensorProto`: its name and values if it holds 32-bit floats inline, `None` for another
/// type.
fn read_tensor(bytes: &[u8]) -> Result<Option<(String, Tensor)>, String> {
    let mut name = String::new();
    let mut dims = Vec::new();
    let mut data_type = 0;
    let mut values = Vec::new();
    let mut reader = Reader { bytes, at: 0 };
    while let Some((field, value)) = reader.field()? {
        match (field, value) {
            (1, Value::Varint(d)) => dims.push(d),
            (1, Value::Bytes(packed)) => {
                let mut packed = Reader {
                    bytes: packed,
                    at: 0,
                };
                while !packed.done() {
                    dims.push(packed.varint()?);
                }
            }
            (2, Value::Varint(t)) => data_type = t,
            (4, Value::Fixed32(bits)) => values.push(f32::from_bits(bits)),
            (4 | 9, Value::Bytes(data)) => values.extend(little_endian_f32s(data)?),
            (8, Value::Bytes(text)) => {
                name =
                    String::from_utf8(text.to_vec()).map_err(|_| "a tensor name is not UTF-8")?;
            }
            (14, Value::Varint(EXTERNAL)) => {
                return Err(format!("tensor `{name}` is kept in an external file"))
            }
            _ => {}
        }
    }
    if data_type != FLOAT {
        return Ok(None);
    }
    let shape = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("tensor `{name}`: dimension {d}")))
        .collect::<Result<Vec<_>, _>>()?;
    let count = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if count != Some(values.len()) {
        return Err(format!(
            "tensor `{name}` of shape {shape:?} holds {} values",
            values.len()
        ));
    }
    let tensor = Tensor::from_vec(values, shape, &Device::Cpu).map_err(|e| e.to_string())?;
    Ok(Some((name, tensor)))
}

fn little_endian_f32s(data: &[u8]) -> Result<impl Iterator<Item = f32> + '_, String> {
    if !data.len().is_multiple_of(4) {
        return Err(format!("{} bytes of f32 data", data.len()));
    }
    Ok(data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
}

/// Every length-delimited field `number` of the message `bytes`.
fn fields(bytes: &[u8], number: u32) -> impl Iterator<Item = Result<&[u8], String>> {
    let mut reader = Reader { bytes, at: 0 };
    std::iter::from_fn(move || loop {
        match reader.field() {
            Err(e) => {
                reader.at = reader.bytes.len();
                return Some(Err(e));
            }
            Ok(None) => return None,
            Ok(Some((field, Value::Bytes(b)))) if field == number => return Some(Ok(b)),
            Ok(Some(_)) => {}
        }
    })
}

/// A field's value in the protobuf wire format.
enum Value<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Reads the fields of one protobuf message in order.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .bytes
                .get(self.at)
                .ok_or("the file ends inside a number")?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a number longer than 10 bytes".into())
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or("the file ends inside a field")?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    /// The next field's number and value, `None` at the end of the message.
    fn field(&mut self) -> Result<Option<(u32, Value<'a>)>, String> {
        if self.done() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| "a field number out of range")?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| "a field too long")?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            wire => return Err(format!("not an ONNX file (protobuf wire type {wire})")),
        };
        Ok(Some((number, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protobuf key.
    fn key(field: u64, wire: u64) -> u8 {
        (field << 3 | wire) as u8
    }

    fn bytes_field(field: u64, content: &[u8]) -> Vec<u8> {
        [vec![key(field, 2), content.len() as u8], content.to_vec()].concat()
    }

    /// A model holding one f32 initializer `w` of shape [2, 3] (raw data) and one int64 one.
    fn model() -> Vec<u8> {
        let values: Vec<u8> = (0..6)
            .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
            .collect();
        let float = [
            bytes_field(1, &[2, 3]),
            vec![key(2, 0), 1],
            bytes_field(8, b"w"),
            bytes_field(9, &values),
        ]
        .concat();
        let int = [
            vec![key(1, 0), 1],
            vec![key(2, 0), 7],
            bytes_field(8, b"n"),
            bytes_field(9, &[1, 0, 0, 0, 0, 0, 0, 0]),
        ]
        .concat();
        let graph = [bytes_field(5, &float), bytes_field(5, &int)].concat();
        // An opset import (field 8) and the producer name (field 2) around the graph.
        [
            bytes_field(2, b"test"),
            bytes_field(7, &graph),
            bytes_field(8, &[key(2, 0), 15]),
        ]
        .concat()
    }

    #[test]
    fn f32_initializers_are_read_by_name() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("m.onnx");
        std::fs::write(&path, model()).unwrap();
        let mut weights = OnnxInitializers::open(&path).unwrap();
        assert!(weights.contains("w") && !weights.contains("n"));
        assert_eq!(weights.dims("w"), Some(vec![2, 3]));
        let StoredTensor::Dense(w) = weights.tensor("w", &Device::Cpu).unwrap() else {
            panic!("dense")
        };
        assert_eq!(
            w.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
        );
        let mut renamed = OnnxInitializers::open(&path)
            .unwrap()
            .renamed(&[("w", "weight")]);
        assert!(renamed.contains("weight") && !renamed.contains("w"));
        assert!(matches!(
            renamed.tensor("w", &Device::Cpu),
            Err(spec_nn::Error::MissingTensor { .. })
        ));
    }

    #[test]
    fn truncated_and_foreign_files_are_errors() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("m.onnx");
        let whole = model();
        for cut in [1, 3, whole.len() / 2, whole.len() - 1] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            assert!(
                matches!(
                    OnnxInitializers::open(&path),
                    Err(spec_nn::Error::BadWeights { .. })
                ),
                "cut at {cut}"
            );
        }
        std::fs::write(&path, [key(1, 3), 0]).unwrap();
        assert!(OnnxInitializers::open(&path).is_err());
        assert!(matches!(
            OnnxInitializers::open(&folder.path().join("none.onnx")),
            Err(spec_nn::Error::Io { .. })
        ));
    }
}
