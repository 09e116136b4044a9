//! Per-layer key/value cache with amortised appends, O(1) rollback and tree-path compaction.
//!
//! Keys and values are stored as `[batch, kv_heads, seq, head_dim]` tensors preallocated to a
//! capacity that doubles when exceeded (up to a configured maximum), so an append writes only the
//! new entries in place instead of concatenating the whole history. The valid length is a
//! counter: rolling back rejected draft tokens is [`LayerKvCache::truncate`], which moves the
//! counter and touches no memory.

use candle_core::Tensor;

use crate::decoder::{input_tokens, DecoderInput};
use crate::{Error, Result};

/// The sequence axis of `[batch, kv_heads, seq, head_dim]`.
const SEQ_DIM: usize = 2;

/// Keys and values of one attention layer.
#[derive(Clone, Debug)]
pub struct LayerKvCache {
    buffers: Option<(Tensor, Tensor)>,
    len: usize,
    initial_capacity: usize,
    max_len: usize,
}

impl LayerKvCache {
    /// An empty cache that allocates `initial_capacity` positions on first use and never holds
    /// more than `max_len`.
    pub fn new(initial_capacity: usize, max_len: usize) -> Self {
        Self {
            buffers: None,
            len: 0,
            initial_capacity: initial_capacity.clamp(1, max_len.max(1)),
            max_len,
        }
    }

    /// Number of valid cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions allocated (valid or not).
    pub fn capacity(&self) -> usize {
        self.buffers.as_ref().map_or(0, |(k, _)| k.dims()[SEQ_DIM])
    }

    /// The largest number of positions this cache accepts.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Appends `keys`/`values` (`[batch, kv_heads, n, head_dim]`) and returns views of all valid
    /// keys and values, `[batch, kv_heads, len, head_dim]`.
    pub fn append(&mut self, keys: &Tensor, values: &Tensor) -> Result<(Tensor, Tensor)> {
        check_rank4("keys", keys)?;
        check_rank4("values", values)?;
        let n = keys.dims()[SEQ_DIM];
        if values.dims()[..3] != keys.dims()[..3] {
            return Err(Error::KvShape(format!(
                "keys {:?} and values {:?} differ in batch, heads or length",
                keys.dims(),
                values.dims()
            )));
        }
        let needed = self.len + n;
        if needed > self.max_len {
            return Err(Error::ContextOverflow {
                requested: needed,
                max: self.max_len,
            });
        }
        self.reserve(keys, values, needed)?;
        let (k_buf, v_buf) = self.buffers.as_ref().expect("reserve allocates buffers");
        for (buf, new, name) in [(k_buf, keys, "keys"), (v_buf, values, "values")] {
            let (b, d) = (buf.dims(), new.dims());
            if b[0] != d[0] || b[1] != d[1] || b[3] != d[3] || buf.dtype() != new.dtype() {
                return Err(Error::KvShape(format!(
                    "new {name} {:?} {:?} do not match the cached {:?} {:?}",
                    d,
                    new.dtype(),
                    b,
                    buf.dtype()
                )));
            }
            buf.slice_set(&new.contiguous()?, SEQ_DIM, self.len)?;
        }
        self.len = needed;
        Ok((
            k_buf.narrow(SEQ_DIM, 0, self.len)?,
            v_buf.narrow(SEQ_DIM, 0, self.len)?,
        ))
    }

    /// Views of the valid keys and values, or `None` before the first append.
    pub fn current(&self) -> Result<Option<(Tensor, Tensor)>> {
        match &self.buffers {
            None => Ok(None),
            Some((k, v)) => Ok(Some((
                k.narrow(SEQ_DIM, 0, self.len)?,
                v.narrow(SEQ_DIM, 0, self.len)?,
            ))),
        }
    }

    /// Keeps the first `len` positions. O(1): only the length changes.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Error::TruncateBeyondLength {
                requested: len,
                len: self.len,
            });
        }
        self.len = len;
        Ok(())
    }

    /// Compacts an accepted tree path. `positions` are absolute, strictly increasing and below
    /// `len()`; every entry before `positions[0]` stays, the listed entries move to
    /// `positions[0]..positions[0] + positions.len()`, and the rest is dropped.
    pub fn keep_positions(&mut self, positions: &[usize]) -> Result<()> {
        let new_len = validate_positions(positions, self.len)?;
        let start = positions[0];
        let already_consecutive = positions.iter().enumerate().all(|(i, &p)| p == start + i);
        if !already_consecutive {
            let (k_buf, v_buf) = self
                .buffers
                .as_ref()
                .expect("a non-empty cache has buffers");
            let moved: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
            let index = Tensor::new(moved.as_slice(), k_buf.device())?;
            for buf in [k_buf, v_buf] {
                let gathered = buf.index_select(&index, SEQ_DIM)?.contiguous()?;
                buf.slice_set(&gathered, SEQ_DIM, start)?;
            }
        }
        self.len = new_len;
        Ok(())
    }

    /// Forgets every position but keeps the allocation.
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Makes room for `needed` positions, doubling the capacity as often as necessary.
    fn reserve(&mut self, keys: &Tensor, values: &Tensor, needed: usize) -> Result<()> {
        let capacity = self.capacity();
        if self.buffers.is_some() && needed <= capacity {
            return Ok(());
        }
        let mut new_capacity = capacity.max(self.initial_capacity);
        while new_capacity < needed {
            new_capacity *= 2;
        }
        let new_capacity = new_capacity.min(self.max_len);
        let alloc = |like: &Tensor| -> Result<Tensor> {
            let mut dims = like.dims().to_vec();
            dims[SEQ_DIM] = new_capacity;
            Ok(Tensor::zeros(dims, like.dtype(), like.device())?)
        };
        let (new_k, new_v) = (alloc(keys)?, alloc(values)?);
        if let Some((old_k, old_v)) = &self.buffers {
            if self.len > 0 {
                for (new, old) in [(&new_k, old_k), (&new_v, old_v)] {
                    let valid = old.narrow(SEQ_DIM, 0, self.len)?.contiguous()?;
                    new.slice_set(&valid, SEQ_DIM, 0)?;
                }
            }
        }
        self.buffers = Some((new_k, new_v));
        Ok(())
    }
}

/// The caches of every layer of a model, kept at one length.
#[derive(Clone, Debug)]
pub struct KvCache {
    layers: Vec<LayerKvCache>,
}

impl KvCache {
    /// `num_layers` empty layer caches; see [`LayerKvCache::new`].
    pub fn new(num_layers: usize, initial_capacity: usize, max_len: usize) -> Self {
        Self {
            layers: vec![LayerKvCache::new(initial_capacity, max_len); num_layers],
        }
    }

    /// The cache of layer `i`.
    pub fn layer_mut(&mut self, i: usize) -> &mut LayerKvCache {
        &mut self.layers[i]
    }

    /// All layer caches.
    pub fn layers(&self) -> &[LayerKvCache] {
        &self.layers
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Cached positions (of the first layer; all layers agree between forwards).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerKvCache::len)
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The largest number of positions the cache accepts.
    pub fn max_len(&self) -> usize {
        self.layers.first().map_or(0, LayerKvCache::max_len)
    }

    /// Fails with [`Error::ContextOverflow`] unless `extra` more positions fit.
    pub fn check_room(&self, extra: usize) -> Result<()> {
        let requested = self.len() + extra;
        if requested > self.max_len() {
            return Err(Error::ContextOverflow {
                requested,
                max: self.max_len(),
            });
        }
        Ok(())
    }

    /// [`LayerKvCache::truncate`] on every layer.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.layers.iter_mut().try_for_each(|l| l.truncate(len))
    }

    /// [`LayerKvCache::keep_positions`] on every layer.
    pub fn keep_positions(&mut self, positions: &[usize]) -> Result<()> {
        validate_positions(positions, self.len())?;
        self.layers
            .iter_mut()
            .try_for_each(|l| l.keep_positions(positions))
    }

    /// Forgets every position of every layer.
    pub fn reset(&mut self) {
        self.layers.iter_mut().for_each(LayerKvCache::reset);
    }
}

/// A decoder's cache: every layer's keys and values and the token at each cached position, kept
/// in step. The bookkeeping of a [`Decoder`](crate::Decoder) with a KV cache, written once: a
/// model runs its layers on [`DecoderCache::layer_mut`] inside [`DecoderCache::forward`], and
/// its `truncate`, `keep_positions`, `reset` and `cached_tokens` are this cache's.
#[derive(Clone, Debug)]
pub struct DecoderCache {
    kv: KvCache,
    tokens: Vec<u32>,
}

impl DecoderCache {
    /// An empty cache of `num_layers` layers; see [`LayerKvCache::new`].
    pub fn new(num_layers: usize, initial_capacity: usize, max_len: usize) -> Self {
        Self {
            kv: KvCache::new(num_layers, initial_capacity, max_len),
            tokens: Vec::new(),
        }
    }

    /// The cache of layer `i`.
    pub fn layer_mut(&mut self, i: usize) -> &mut LayerKvCache {
        self.kv.layer_mut(i)
    }

    /// The layers' keys and values.
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// The token at every cached position ([`EMBEDDING_INPUT`](crate::decoder::EMBEDDING_INPUT)
    /// where an embedding was fed).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.kv.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.kv.is_empty()
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.kv.num_layers()
    }

    /// The largest number of positions the cache accepts.
    pub fn max_len(&self) -> usize {
        self.kv.max_len()
    }

    /// Fails with [`Error::ContextOverflow`] unless `extra` more positions fit.
    pub fn check_room(&self, extra: usize) -> Result<()> {
        self.kv.check_room(extra)
    }

    /// Runs `run`, a forward of `input` through `model`'s layers (appending to the cache that
    /// `cache` finds in it): on success the input's tokens are recorded beside their positions,
    /// on failure (an interrupt included) the layers are rolled back, so the cache is as it was.
    pub fn forward<M, T, E: From<Error>>(
        model: &mut M,
        cache: impl Fn(&mut M) -> &mut DecoderCache,
        input: &DecoderInput<'_>,
        run: impl FnOnce(&mut M) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let start = cache(model).len();
        match run(model) {
            Ok(out) => {
                cache(model).tokens.extend(input_tokens(input)?);
                Ok(out)
            }
            Err(e) => {
                cache(model).kv.truncate(start)?;
                Err(e)
            }
        }
    }

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.kv.truncate(len)?;
        self.tokens.truncate(len);
        Ok(())
    }

    /// Compacts the cache to `positions` (see [`LayerKvCache::keep_positions`]).
    pub fn keep_positions(&mut self, positions: &[usize]) -> Result<()> {
        self.kv.keep_positions(positions)?;
        keep_positions_of(&mut self.tokens, positions)
    }

    /// Forgets every position.
    pub fn reset(&mut self) {
        self.kv.reset();
        self.tokens.clear();
    }
}

/// Checks a `keep_positions` list against `len` and returns the length after compaction.
pub fn validate_positions(positions: &[usize], len: usize) -> Result<usize> {
    let (&first, &last) = match (positions.first(), positions.last()) {
        (Some(f), Some(l)) => (f, l),
        _ => return Err(Error::InvalidPositions("the list is empty".into())),
    };
    if positions.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Error::InvalidPositions(format!(
            "{positions:?} is not strictly increasing"
        )));
    }
    if last >= len {
        return Err(Error::InvalidPositions(format!(
            "position {last} is beyond the {len} cached positions"
        )));
    }
    Ok(first + positions.len())
}

/// Applies [`LayerKvCache::keep_positions`] to any per-position record (e.g. the token ids a
/// decoder keeps beside its cache).
pub fn keep_positions_of<T: Copy>(items: &mut Vec<T>, positions: &[usize]) -> Result<()> {
    validate_positions(positions, items.len())?;
    let kept: Vec<T> = positions.iter().map(|&p| items[p]).collect();
    items.truncate(positions[0]);
    items.extend(kept);
    Ok(())
}

fn check_rank4(name: &str, t: &Tensor) -> Result<()> {
    if t.rank() != 4 {
        return Err(Error::KvShape(format!(
            "{name} must be [batch, kv_heads, seq, head_dim], got {:?}",
            t.dims()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// `[1, 2, n, 3]` keys whose every element encodes its position: value = 100·pos + offset.
    fn entries(positions: std::ops::Range<usize>, offset: f32) -> Tensor {
        let n = positions.len();
        let data: Vec<f32> = (0..2)
            .flat_map(|_| {
                positions
                    .clone()
                    .flat_map(|p| [p as f32 * 100.0 + offset; 3])
            })
            .collect();
        Tensor::from_vec(data, (1, 2, n, 3), &Device::Cpu).unwrap()
    }

    /// The position tags (first element of each row of head 0) of a `[1, 2, n, 3]` tensor.
    fn tags(t: &Tensor) -> Vec<f32> {
        let rows: Vec<Vec<f32>> = t.squeeze(0).unwrap().get(0).unwrap().to_vec2().unwrap();
        rows.iter().map(|r| r[0]).collect()
    }

    fn append_range(c: &mut LayerKvCache, r: std::ops::Range<usize>) -> (Tensor, Tensor) {
        c.append(&entries(r.clone(), 0.0), &entries(r, 0.5))
            .unwrap()
    }

    #[test]
    fn append_returns_all_entries_and_grows_by_doubling() {
        let mut c = LayerKvCache::new(4, 64);
        append_range(&mut c, 0..3);
        assert_eq!(c.capacity(), 4);
        append_range(&mut c, 3..5);
        assert_eq!(c.capacity(), 8);
        let (k, v) = append_range(&mut c, 5..17);
        assert_eq!(c.capacity(), 32);
        assert_eq!(c.len(), 17);
        let expected: Vec<f32> = (0..17).map(|p| p as f32 * 100.0).collect();
        assert_eq!(tags(&k), expected);
        let expected_v: Vec<f32> = expected.iter().map(|x| x + 0.5).collect();
        assert_eq!(tags(&v), expected_v);
    }

    #[test]
    fn capacity_stops_at_max_and_overflow_is_an_error() {
        let mut c = LayerKvCache::new(4, 10);
        append_range(&mut c, 0..9);
        assert_eq!(c.capacity(), 10);
        let err = c
            .append(&entries(9..11, 0.0), &entries(9..11, 0.0))
            .unwrap_err();
        assert!(matches!(
            err,
            Error::ContextOverflow {
                requested: 11,
                max: 10
            }
        ));
        assert_eq!(c.len(), 9, "a failed append changes nothing");
    }

    #[test]
    fn truncate_then_append_overwrites_the_rolled_back_entries() {
        let mut c = LayerKvCache::new(8, 64);
        append_range(&mut c, 0..6);
        let capacity = c.capacity();
        c.truncate(3).unwrap();
        assert_eq!(c.capacity(), capacity, "rollback does not reallocate");
        let (k, _) = c.append(&entries(3..5, 7.0), &entries(3..5, 7.0)).unwrap();
        assert_eq!(tags(&k), vec![0.0, 100.0, 200.0, 307.0, 407.0]);
        assert!(matches!(
            c.truncate(9),
            Err(Error::TruncateBeyondLength {
                requested: 9,
                len: 5
            })
        ));
    }

    #[test]
    fn keep_positions_compacts_a_tree_path() {
        let mut c = LayerKvCache::new(16, 64);
        append_range(&mut c, 0..10);
        // Prefix 0..4 stays; path nodes at 4, 6, 9 move to 4, 5, 6.
        c.keep_positions(&[4, 6, 9]).unwrap();
        assert_eq!(c.len(), 7);
        let (k, v) = c.current().unwrap().unwrap();
        assert_eq!(
            tags(&k),
            vec![0.0, 100.0, 200.0, 300.0, 400.0, 600.0, 900.0]
        );
        assert_eq!(
            tags(&v),
            vec![0.5, 100.5, 200.5, 300.5, 400.5, 600.5, 900.5]
        );
        // Consecutive positions are a plain truncation.
        c.keep_positions(&[2, 3]).unwrap();
        assert_eq!(
            tags(&c.current().unwrap().unwrap().0),
            vec![0.0, 100.0, 200.0, 300.0]
        );
    }

    #[test]
    fn keep_positions_rejects_bad_lists() {
        let mut c = LayerKvCache::new(16, 64);
        append_range(&mut c, 0..5);
        for bad in [&[][..], &[3, 2], &[1, 1], &[2, 5]] {
            assert!(matches!(
                c.keep_positions(bad),
                Err(Error::InvalidPositions(_))
            ));
        }
        assert_eq!(c.len(), 5);
    }

    #[test]
    fn mismatched_shapes_are_rejected() {
        let mut c = LayerKvCache::new(16, 64);
        append_range(&mut c, 0..2);
        let other_heads = Tensor::zeros((1, 3, 1, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(matches!(
            c.append(&other_heads, &other_heads),
            Err(Error::KvShape(_))
        ));
        let rank3 = Tensor::zeros((1, 2, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(matches!(c.append(&rank3, &rank3), Err(Error::KvShape(_))));
        let f16 = Tensor::zeros((1, 2, 1, 3), DType::F16, &Device::Cpu).unwrap();
        assert!(matches!(c.append(&f16, &f16), Err(Error::KvShape(_))));
    }

    #[test]
    fn model_cache_keeps_layers_in_step() {
        let mut cache = KvCache::new(3, 4, 32);
        for layer in 0..3 {
            append_range(cache.layer_mut(layer), 0..6);
        }
        assert_eq!(cache.len(), 6);
        cache.check_room(26).unwrap();
        assert!(matches!(
            cache.check_room(27),
            Err(Error::ContextOverflow { .. })
        ));
        cache.keep_positions(&[2, 5]).unwrap();
        for layer in cache.layers() {
            assert_eq!(
                tags(&layer.current().unwrap().unwrap().0),
                vec![0.0, 100.0, 200.0, 500.0]
            );
        }
        cache.truncate(1).unwrap();
        assert_eq!(cache.len(), 1);
        cache.reset();
        assert!(cache.is_empty());
    }

    /// A forward of `tokens` through a two-layer model that appends to every layer, then fails
    /// when told to.
    fn forward(cache: &mut DecoderCache, tokens: &[u32], fail: bool) -> Result<usize> {
        let start = cache.len();
        DecoderCache::forward(
            cache,
            |c| c,
            &DecoderInput::Tokens(tokens),
            |c: &mut DecoderCache| {
                for layer in 0..c.num_layers() {
                    append_range(c.layer_mut(layer), start..start + tokens.len());
                }
                match fail {
                    true => Err(Error::Interrupted),
                    false => Ok(c.len()),
                }
            },
        )
    }

    #[test]
    fn a_decoder_cache_keeps_its_tokens_in_step_with_its_layers() {
        let mut cache = DecoderCache::new(2, 4, 64);
        assert_eq!(forward(&mut cache, &[7, 8, 9], false).unwrap(), 3);
        assert_eq!(cache.tokens(), [7, 8, 9]);
        // A failed forward (an interrupt) leaves the cache as it was, in every layer.
        assert!(matches!(
            forward(&mut cache, &[1, 2], true),
            Err(Error::Interrupted)
        ));
        assert_eq!(cache.tokens(), [7, 8, 9]);
        assert!(cache.kv().layers().iter().all(|l| l.len() == 3));
        forward(&mut cache, &[10, 11, 12], false).unwrap();
        cache.keep_positions(&[1, 3, 5]).unwrap();
        assert_eq!(cache.tokens(), [7, 8, 10, 12]);
        assert!(cache.kv().layers().iter().all(|l| l.len() == 4));
        cache.truncate(2).unwrap();
        assert_eq!((cache.tokens(), cache.len()), (&[7, 8][..], 2));
        assert!(cache.keep_positions(&[5]).is_err());
        cache.reset();
        assert!(cache.is_empty() && cache.tokens().is_empty());
    }
}
