//! A table of logits rows, one per forwarded position, stored flat.

use candle_core::{DType, Tensor};

use crate::{Error, Result};

/// Logits `[rows, vocab_size]` as one flat `f32` buffer: a forward's output copied out of its
/// tensor in one piece, with each row borrowed as a slice.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    data: Vec<f32>,
    vocab_size: usize,
}

impl Logits {
    /// Copies a `[rows, vocab_size]` tensor (any float dtype), checking its shape.
    pub fn from_tensor(logits: &Tensor, rows: usize, vocab_size: usize) -> Result<Self> {
        if vocab_size == 0 || logits.dims() != [rows, vocab_size] {
            return Err(Error::LogitsShape {
                got: logits.dims().to_vec(),
                expected: format!("[{rows}, {vocab_size}]"),
            });
        }
        let data = logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        Ok(Self { data, vocab_size })
    }

    /// Takes `data`, rows of `vocab_size` one after the other, without a copy (an output
    /// layer that wrote its products straight into a buffer).
    pub fn from_flat(data: Vec<f32>, vocab_size: usize) -> Result<Self> {
        if vocab_size == 0 || !data.len().is_multiple_of(vocab_size) {
            return Err(Error::LogitsShape {
                got: vec![data.len()],
                expected: format!("rows of {vocab_size} (more than none)"),
            });
        }
        Ok(Self { data, vocab_size })
    }

    /// Builds a table from rows of equal, non-zero length.
    pub fn from_rows(rows: &[Vec<f32>]) -> Result<Self> {
        let vocab_size = rows.first().map_or(0, Vec::len);
        if vocab_size == 0 || rows.iter().any(|r| r.len() != vocab_size) {
            return Err(Error::LogitsShape {
                got: rows.iter().map(Vec::len).collect(),
                expected: "rows of one non-zero length".into(),
            });
        }
        Ok(Self {
            data: rows.concat(),
            vocab_size,
        })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.data.len() / self.vocab_size
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Columns per row.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab_size..(i + 1) * self.vocab_size]
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        self.data.truncate(rows * self.vocab_size);
    }

    /// Row `i`, mutably.
    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.data[i * self.vocab_size..(i + 1) * self.vocab_size]
    }

    /// Every row in order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = &[f32]> + '_ {
        self.data.chunks_exact(self.vocab_size)
    }

    /// The last row, taking the buffer without a copy when there is only one row.
    pub fn into_last_row(mut self) -> Vec<f32> {
        let start = self.data.len() - self.vocab_size;
        self.data.split_off(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn rows_from_a_tensor() {
        let t = Tensor::new(&[[1f32, 2., 3.], [4., 5., 6.]], &Device::Cpu).unwrap();
        let l = Logits::from_tensor(&t.to_dtype(DType::F16).unwrap(), 2, 3).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l.row(1), &[4., 5., 6.]);
        assert_eq!(
            l.rows().collect::<Vec<_>>(),
            vec![&[1., 2., 3.][..], &[4., 5., 6.][..]]
        );
        assert_eq!(l.clone().into_last_row(), vec![4., 5., 6.]);
        assert!(matches!(
            Logits::from_tensor(&t, 3, 2),
            Err(Error::LogitsShape { .. })
        ));
        assert!(Logits::from_rows(&[vec![1.0], vec![1.0, 2.0]]).is_err());
        let flat = Logits::from_flat(vec![1., 2., 3., 4., 5., 6.], 3).unwrap();
        assert_eq!(flat, l);
        assert!(Logits::from_flat(vec![1., 2., 3.], 2).is_err());
        assert!(Logits::from_flat(Vec::new(), 0).is_err());
        assert_eq!(
            Logits::from_rows(&[vec![1.0, 2.0]]).unwrap().row(0),
            &[1.0, 2.0]
        );
    }
}
