#![doc = include_str!("../README.md")]
//!
//! ## Contents
//!
//! - [`linear`]: `y = x·Wᵀ (+ b)` on `spec-kernels` for the GGUF formats it has kernels for
//!   (batch-invariant), candle's `QMatMul` otherwise; several layers of one input in one pass.
//! - [`attention`]: [`SelfAttention`] over a `spec_core` KV cache (grouped-query heads, explicit
//!   positions, tree masks, rollback) and [`CrossAttention`] whose keys and values are computed
//!   once per encoder output; on the CPU every self-attention forward (and cross-attention
//!   forwards of up to [`ROW_ATTENTION_MAX_ROWS`] rows) is computed row by row in a fixed
//!   order, so verifying k tokens gives each exactly its decoding logits, and a prompt in one
//!   forward gives the cache of the same prompt in pieces.
//! - On the CPU with every matrix on the kernels, the blocks also run on plain f32 rows
//!   (`forward_rows` of [`Norm`], [`SelfAttention`], [`SwiGlu`], [`Linear`]), with the same
//!   arithmetic as their tensor forwards, so the same bits, without a candle tensor (an
//!   allocation and a dispatch) per operation.
//! - [`sequence_attention`]: attention over a whole sequence without a cache (plain and
//!   Transformer-XL relative-position), for non-autoregressive blocks.
//! - [`norm`]: RMSNorm and LayerNorm (with bias).
//! - [`elementwise`]: residual and bias sums on the calling thread (candle's own pool for
//!   large element-wise operations competes with the kernels' threads), and the largest
//!   difference between two tensors, for comparing a block with a reference.
//! - [`rotary`] and [`positions`]: rotary embeddings, learned and sinusoidal absolute positions.
//! - [`mlp`]: SwiGLU (gating fused on the kernels' threads) and GELU feed-forwards.
//! - [`load`]: named tensors from GGUF, safetensors, CTranslate2's `model.bin`
//!   ([`ctranslate2`]) or any container implementing
//!   [`WeightSource`], checked against the shapes a configuration implies, with the
//!   re-quantization policy that keeps every matrix on the batch-invariant kernels.
//! - [`output`]: a decoder's final norm and output layer, keeping every position's hidden state.
//! - [`heads`]: multi-token prediction heads (projection, latent and chained) and their files
//!   (their training is the `spec-train` crate's).
//! - [`costs`]: forward costs measured once per model file and machine.

pub mod attention;
pub mod costs;
pub mod ctranslate2;
pub mod elementwise;
mod error;
pub mod heads;
pub mod linear;
pub mod load;
pub mod mlp;
pub mod norm;
pub mod output;
pub mod positions;
pub mod rotary;
pub mod sequence_attention;

pub use attention::{
    AttentionMask, CrossAttention, CrossKv, Heads, SelfAttention, ROW_ATTENTION_MAX_ROWS,
};
pub use costs::forward_costs;
pub use ctranslate2::Ct2File;
pub use error::{Error, Result};
pub use linear::{Linear, QLinear};
pub use load::{
    GgufFile, InMemoryWeights, Requantize, SafetensorsFiles, StoredTensor, WeightLoader,
    WeightSource,
};
pub use mlp::{GeluMlp, SwiGlu};
pub use norm::Norm;
pub use output::{decoder_output, unembed, unembed_logits, DecoderOutput, ShortlistOutput};
pub use positions::{sinusoidal_positions, LearnedPositions};
pub use rotary::{RopeLayout, Rotary, RotaryTables};
pub use sequence_attention::{RelPositionAttention, RelativePositions, SequenceAttention};

/// The index just past the first occurrence of `name` in a weight file's bytes: where the
/// header fields of that tensor begin, for tests that patch them.
#[cfg(test)]
pub(crate) fn after_name(bytes: &[u8], name: &[u8]) -> usize {
    bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("the tensor's name")
        + name.len()
}
