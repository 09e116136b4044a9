//! Whisper (Radford et al., 2022): a convolution front and pre-LayerNorm transformer encoder
//! over log-mel frames, and a pre-LayerNorm decoder with learned positions, self-attention,
//! cross-attention to the encoder and an output projection tied to the token embeddings.
//!
//! What differs from the reference: the decoder is a `spec_core::Decoder` — its self-attention
//! runs on a KV cache with O(1) rollback, tree masks and explicit position ids, every requested
//! logits row is returned (verification), and forwards of up to
//! [`spec_nn::ROW_ATTENTION_MAX_ROWS`] tokens give each token exactly the logits of decoding it
//! alone (the matrices run on `spec-kernels`). The cross-attention keys and values are computed
//! once per encoded window ([`Whisper::encode`]) and survive [`Decoder::reset`]. The encoder
//! may run on fewer than 1500 positions (the audio's real length), as whisper.cpp's
//! `audio_ctx` does. Every block is `spec-nn`'s.

use candle_core::{Device, Tensor};
use spec_core::decoder::check_token_range;
use spec_core::{Decoder, DecoderCache, DecoderInput, Forward, HiddenStates, LogitRows, Logits};
use spec_nn::elementwise::add;
use spec_nn::SelfAttention;
use spec_nn::{
    decoder_output, unembed_logits, AttentionMask, CrossAttention, CrossKv, GeluMlp,
    LearnedPositions, Norm, QLinear,
};

use crate::mel::LogMel;
use crate::whisper::config::WhisperConfig;
use crate::{Error, Result};

/// Initial KV capacity per decoder layer; it doubles as needed.
const INITIAL_CACHE_CAPACITY: usize = 64;

/// The cache holds this many times the decoder's positions: token trees (beam search, SpecASR
/// drafts) keep several branches at the same positions.
const TREE_ROOM: usize = 8;

/// One encoder layer: pre-norm self-attention over every frame, pre-norm GELU MLP.
#[derive(Debug)]
pub(crate) struct EncoderLayer {
    pub attention_norm: Norm,
    /// Attention of the frames over themselves: the cross-attention block with the layer's own
    /// input as "encoder output" (no mask, no cache).
    pub attention: CrossAttention,
    pub mlp_norm: Norm,
    pub mlp: GeluMlp,
}

/// The audio encoder.
#[derive(Debug)]
pub(crate) struct Encoder {
    /// `[hidden, n_mels, 3]` and `[hidden]`, stride 1.
    pub conv1: (Tensor, Tensor),
    /// `[hidden, hidden, 3]` and `[hidden]`, stride 2.
    pub conv2: (Tensor, Tensor),
    /// Sinusoids `[max_source_positions, hidden]`.
    pub positions: Tensor,
    pub layers: Vec<EncoderLayer>,
    pub final_norm: Norm,
}

impl Encoder {
    /// `mel` `[n_mels, frames]` → `[1, frames / 2, hidden]`.
    fn forward(&self, mel: &Tensor) -> Result<Tensor> {
        let conv = |x: &Tensor, (w, b): &(Tensor, Tensor), stride| -> Result<Tensor> {
            let y =
                x.conv1d(w, 1, stride, 1, 1)?
                    .broadcast_add(&b.reshape((1, b.dim(0)?, 1))?)?;
            Ok(spec_nn::mlp::gelu(&y)?)
        };
        let x = conv(&mel.unsqueeze(0)?, &self.conv1, 1)?;
        let x = conv(&x, &self.conv2, 2)?;
        let frames = x.dim(2)?;
        let mut x = x
            .transpose(1, 2)?
            .broadcast_add(&self.positions.narrow(0, 0, frames)?)?
            .contiguous()?;
        for layer in &self.layers {
            let normed = layer.attention_norm.forward(&x)?;
            let own = layer.attention.keys_values(&normed)?;
            x = add(&x, &layer.attention.forward(&normed, &own)?)?;
            let normed = layer.mlp_norm.forward(&x)?;
            x = add(&x, &layer.mlp.forward(&normed)?)?;
        }
        Ok(self.final_norm.forward(&x)?)
    }
}

/// One decoder layer: pre-norm self-attention (cached), cross-attention, GELU MLP.
#[derive(Debug)]
pub(crate) struct DecoderLayer {
    pub self_attention_norm: Norm,
    pub self_attention: SelfAttention,
    pub cross_attention_norm: Norm,
    pub cross_attention: CrossAttention,
    pub mlp_norm: Norm,
    pub mlp: GeluMlp,
}

/// The text decoder's weights.
#[derive(Debug)]
pub(crate) struct TextDecoder {
    /// Token embeddings `[vocab, hidden]`, also the output projection (tied).
    pub embeddings: QLinear,
    pub positions: LearnedPositions,
    pub layers: Vec<DecoderLayer>,
    pub final_norm: Norm,
}

/// A loaded Whisper model: the encoder, and the decoder with its KV cache and the keys and
/// values of the encoded window. Batch size 1.
#[derive(Debug)]
pub struct Whisper {
    config: WhisperConfig,
    encoder: Encoder,
    decoder: TextDecoder,
    cache: DecoderCache,
    /// Cross-attention keys/values of the last encoded window, one per decoder layer.
    cross: Option<Vec<CrossKv>>,
    /// The last forward's final hidden states, one per new position (for prediction heads).
    hidden: Option<Tensor>,
    /// The cross-attention heads `(layer, head)` whose attention follows the speech in time
    /// (word timestamps read them, [`Whisper::alignment_forward`]).
    alignment_heads: Vec<(usize, usize)>,
    device: Device,
}

/// Whisper's alignment heads when a model does not name its own: every head of the second
/// half of the decoder layers (openai-whisper's `set_alignment_heads` default).
pub fn default_alignment_heads(config: &WhisperConfig) -> Vec<(usize, usize)> {
    (config.decoder_layers / 2..config.decoder_layers)
        .flat_map(|layer| (0..config.decoder_attention_heads).map(move |head| (layer, head)))
        .collect()
}

impl Whisper {
    pub(crate) fn new(
        config: WhisperConfig,
        encoder: Encoder,
        decoder: TextDecoder,
        device: &Device,
    ) -> Self {
        let cache = DecoderCache::new(
            config.decoder_layers,
            INITIAL_CACHE_CAPACITY,
            TREE_ROOM * config.max_target_positions,
        );
        Self {
            alignment_heads: default_alignment_heads(&config),
            config,
            encoder,
            decoder,
            cache,
            cross: None,
            hidden: None,
            device: device.clone(),
        }
    }

    /// The cross-attention heads `(layer, head)` word timestamps are read from.
    pub fn alignment_heads(&self) -> &[(usize, usize)] {
        &self.alignment_heads
    }

    /// Sets the alignment heads (a model's `alignment_heads`, as its configuration lists
    /// them); fails on an empty list or a head the decoder does not have.
    pub fn set_alignment_heads(&mut self, heads: Vec<(usize, usize)>) -> Result<()> {
        let (layers, per_layer) = (
            self.config.decoder_layers,
            self.config.decoder_attention_heads,
        );
        if heads.is_empty() {
            return Err(Error::Config("an empty list of alignment heads".into()));
        }
        if let Some((layer, head)) = heads
            .iter()
            .find(|&&(layer, head)| layer >= layers || head >= per_layer)
        {
            return Err(Error::Config(format!(
                "alignment head ({layer}, {head}) is not among the decoder's {layers} layers of \
                 {per_layer} heads"
            )));
        }
        self.alignment_heads = heads;
        Ok(())
    }

    /// Teacher-forced forward of `tokens` from an empty cache over the encoded window, for
    /// word alignment: the logits of every position `[n, vocab]` and the cross-attention
    /// scores (scaled query·key, before the softmax) of the alignment heads,
    /// `[heads, n, encoded frames]` in the order of [`Whisper::alignment_heads`]. Leaves the
    /// tokens in the cache, as any forward does.
    pub fn alignment_forward(&mut self, tokens: &[u32]) -> Result<(Logits, Tensor)> {
        if tokens.is_empty() {
            return Err(Error::Config("word alignment of no tokens".into()));
        }
        self.reset();
        let positions: Vec<usize> = (0..tokens.len()).collect();
        let step = Forward {
            logits: LogitRows::All,
            ..Forward::tokens(tokens, &positions)
        };
        let mut scores = Vec::new();
        let logits = DecoderCache::forward(
            self,
            |model| &mut model.cache,
            &step.input,
            |model| model.forward_inner(&step, Some(&mut scores)),
        )?;
        // Captured layer by layer; put back in the configured order of the heads.
        let captured: Vec<(usize, usize)> = (0..self.config.decoder_layers)
            .flat_map(|layer| {
                self.alignment_heads
                    .iter()
                    .filter(move |h| h.0 == layer)
                    .copied()
            })
            .collect();
        let rows = self
            .alignment_heads
            .iter()
            .map(|head| {
                let index = captured.iter().position(|c| c == head).unwrap_or(0);
                scores[index].clone()
            })
            .collect::<Vec<_>>();
        let scores = Tensor::stack(&rows, 0)?;
        let logits = Logits::from_tensor(&logits, tokens.len(), self.config.vocab_size)?;
        Ok((logits, scores))
    }

    /// Loads a model folder: CTranslate2 (`model.bin`) or Hugging Face (`model.safetensors` +
    /// `config.json`), see [`crate::whisper::load`].
    pub fn load(folder: &std::path::Path, options: &crate::whisper::LoadOptions) -> Result<Self> {
        crate::whisper::load::load(folder, options)
    }

    pub fn config(&self) -> &WhisperConfig {
        &self.config
    }

    /// Encodes a window of the log-mel spectrogram (`mel.frames` even, at most 3000: fewer
    /// frames encode only the audio's real length) and keeps each decoder layer's
    /// cross-attention keys and values for it. Clears the decoder's cache.
    pub fn encode(&mut self, mel: &LogMel) -> Result<()> {
        let max = self.config.window_frames();
        if mel.n_mels != self.config.n_mels {
            return Err(Error::Config(format!(
                "the model reads {} mel bins, the spectrogram has {}",
                self.config.n_mels, mel.n_mels
            )));
        }
        if mel.frames == 0 || mel.frames > max || !mel.frames.is_multiple_of(2) {
            return Err(Error::Audio(format!(
                "the encoder takes an even number of frames up to {max}, got {}",
                mel.frames
            )));
        }
        let input = Tensor::from_slice(&mel.data, (mel.n_mels, mel.frames), &self.device)?;
        let encoded = self.encoder.forward(&input)?;
        let cross = self
            .decoder
            .layers
            .iter()
            .map(|layer| layer.cross_attention.keys_values(&encoded))
            .collect::<spec_nn::Result<Vec<_>>>()?;
        self.cross = Some(cross);
        self.reset();
        Ok(())
    }

    /// Cache entries available to token trees (several per position).
    pub fn cache_capacity(&self) -> usize {
        TREE_ROOM * self.config.max_target_positions
    }

    /// Encoder positions the current window covers (0 before [`Whisper::encode`]).
    pub fn encoded_frames(&self) -> usize {
        self.cross
            .as_ref()
            .and_then(|c| c.first())
            .map_or(0, CrossKv::frames)
    }

    /// Runs the decoder; on failure the cache is left as it was.
    pub fn forward_step(&mut self, step: &Forward<'_>) -> Result<Tensor> {
        DecoderCache::forward(
            self,
            |model| &mut model.cache,
            &step.input,
            |model| model.forward_inner(step, None),
        )
    }

    /// A decoder forward; with `alignment`, the alignment heads' cross-attention scores are
    /// pushed there, `[n, frames]` per head, layer by layer.
    fn forward_inner(
        &mut self,
        step: &Forward<'_>,
        mut alignment: Option<&mut Vec<Tensor>>,
    ) -> Result<Tensor> {
        let cached = self.cache.len();
        let rows = step.validate(cached)?;
        let n = step.input.len()?;
        self.cache.check_room(n)?;
        let cross = self.cross.as_ref().ok_or(Error::NotEncoded)?;
        let DecoderInput::Tokens(tokens) = step.input else {
            return Err(spec_core::Error::Unsupported(
                "Whisper's decoder takes token ids, not embeddings",
            )
            .into());
        };
        check_token_range(tokens, self.config.vocab_size)?;
        let decoder = &self.decoder;
        let embedded = decoder.embeddings.embedding(tokens, &self.device)?;
        let mut x = (embedded + decoder.positions.embed(step.positions)?)?.unsqueeze(0)?;
        let mask = AttentionMask::new(step.mask, n, cached, &self.device)?;
        for (index, (layer, cross)) in decoder.layers.iter().zip(cross).enumerate() {
            let normed = layer.self_attention_norm.forward(&x)?;
            let cache = self.cache.layer_mut(index);
            x = add(
                &x,
                &layer.self_attention.forward(&normed, None, &mask, cache)?,
            )?;
            let normed = layer.cross_attention_norm.forward(&x)?;
            if let Some(scores) = alignment.as_deref_mut() {
                let heads: Vec<usize> = self
                    .alignment_heads
                    .iter()
                    .filter(|h| h.0 == index)
                    .map(|h| h.1)
                    .collect();
                if !heads.is_empty() {
                    let layer_scores = layer.cross_attention.scores(&normed, cross, &heads)?;
                    for row in 0..heads.len() {
                        scores.push(layer_scores.get(row)?);
                    }
                }
            }
            x = add(&x, &layer.cross_attention.forward(&normed, cross)?)?;
            let normed = layer.mlp_norm.forward(&x)?;
            x = add(&x, &layer.mlp.forward(&normed)?)?;
        }
        let out = decoder_output(
            &x,
            rows,
            &decoder.final_norm,
            &decoder.embeddings,
            self.config.vocab_size,
        )?;
        self.hidden = Some(out.hidden);
        Ok(out.logits)
    }
}

impl HiddenStates for Whisper {
    fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    fn last_hidden(&self) -> spec_core::Result<Tensor> {
        self.hidden.clone().ok_or(spec_core::Error::EmptyInput(
            "no decoder forward has run yet",
        ))
    }

    fn unembed(&self, hidden: &Tensor) -> spec_core::Result<Logits> {
        Ok(unembed_logits(&self.decoder.embeddings, hidden).map_err(Error::from)?)
    }

    fn unembedding_rows(&self, ids: &[u32]) -> spec_core::Result<Tensor> {
        Ok(self
            .decoder
            .embeddings
            .embedding(ids, &self.device)
            .map_err(Error::from)?)
    }
}

impl Decoder for Whisper {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    /// The decoder's positions (448); the cache itself holds more, for token trees.
    fn max_len(&self) -> usize {
        self.config.max_target_positions
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn cached_tokens(&self) -> &[u32] {
        self.cache.tokens()
    }

    fn forward(&mut self, step: &Forward<'_>) -> spec_core::Result<Tensor> {
        Ok(self.forward_step(step)?)
    }

    fn truncate(&mut self, len: usize) -> spec_core::Result<()> {
        self.cache.truncate(len)
    }

    fn keep_positions(&mut self, positions: &[usize]) -> spec_core::Result<()> {
        self.cache.keep_positions(positions)
    }

    /// Forgets the decoded tokens; the encoded window stays.
    fn reset(&mut self) {
        self.cache.reset();
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;
    use spec_core::decoder::forward_tokens;

    use super::*;
    use crate::testing;

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// The alignment forward is a plain forward of the same tokens (the same logits) that also
    /// returns one row of scores per alignment head, token and encoded frame, in the order the
    /// heads are listed.
    #[test]
    fn alignment_forward_is_a_plain_forward_with_the_heads_scores() {
        let dir = tempfile::tempdir().unwrap();
        testing::write_ct2(dir.path(), 5, DType::F32).unwrap();
        let mut model = Whisper::load(dir.path(), &crate::whisper::LoadOptions::default()).unwrap();
        assert!(matches!(
            model.alignment_forward(&[testing::START_OF_TRANSCRIPT]),
            Err(Error::NotEncoded)
        ));
        model.encode(&testing::mel(160, 3).unwrap()).unwrap();
        let tokens = [
            testing::START_OF_TRANSCRIPT,
            testing::NO_TIMESTAMPS,
            3,
            7,
            9,
            testing::END_OF_TEXT,
        ];
        let (logits, scores) = model.alignment_forward(&tokens).unwrap();
        let heads = model.alignment_heads().to_vec();
        assert_eq!(scores.dims(), [heads.len(), tokens.len(), 80]);
        model.reset();
        let plain = forward_tokens(&mut model, &tokens, LogitRows::All).unwrap();
        for i in 0..tokens.len() {
            assert_eq!(logits.row(i), plain.row(i), "row {i}");
        }
        // Two of the default heads, listed the other way round: their rows, swapped.
        model.set_alignment_heads(vec![heads[2], heads[0]]).unwrap();
        let (_, chosen) = model.alignment_forward(&tokens).unwrap();
        assert_eq!(
            values(&chosen.get(0).unwrap()),
            values(&scores.get(2).unwrap())
        );
        assert_eq!(
            values(&chosen.get(1).unwrap()),
            values(&scores.get(0).unwrap())
        );
        // A head of the first layer differs from them.
        model.set_alignment_heads(vec![(0, 2)]).unwrap();
        let (_, first_layer) = model.alignment_forward(&tokens).unwrap();
        assert_ne!(values(&first_layer), values(&chosen.get(0).unwrap()));
        assert!(model.set_alignment_heads(Vec::new()).is_err());
        assert!(model
            .set_alignment_heads(vec![(testing::DECODER_LAYERS, 0)])
            .is_err());
        assert!(model
            .set_alignment_heads(vec![(0, testing::HEADS)])
            .is_err());
        assert!(model.alignment_forward(&[]).is_err());
    }
}
