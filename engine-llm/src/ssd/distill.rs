//! What an SSD draft is trained on (the training itself is the `spec-train` crate's,
//! `spec_train::ssd::train`): a [`Backbone`] (the model, how ids become its input vectors, its
//! output layer) and [`DistilledSequence`]s, sequences labelled with the model's own most likely
//! next tokens. Models that mix embeddings (CosyVoice 2's speech-token LM in `engine-tts`) make
//! both themselves.

use candle_core::Tensor;
use spec_core::{Decoder, HiddenStates, LogitRows};

use crate::{Error, Result, Transformer};

/// A map from ids to rows of vectors, `[len, hidden]` f32.
pub type RowsOf<'a> = Box<dyn Fn(&[u32]) -> Result<Tensor> + 'a>;

/// What a draft is trained on: a Qwen2/Llama backbone, how a sequence's ids become its input
/// vectors, and the output layer the draft's head starts from. [`Backbone::text`] is a chat
/// model's; a model that mixes embeddings (CosyVoice 2's speech-token LM) supplies its own.
pub struct Backbone<'a> {
    pub model: &'a Transformer,
    /// A sequence's ids → `[n, hidden]` f32 input vectors.
    pub embed: RowsOf<'a>,
    /// Output classes (the labels' id space).
    pub classes: usize,
    /// The output layer's rows of the given classes, `[len, hidden]` f32.
    pub output_rows: RowsOf<'a>,
    /// The output layer's bias over every class, if it has one.
    pub output_bias: Option<Tensor>,
}

impl<'a> Backbone<'a> {
    /// A language model: token ids in, its unembedding out.
    pub fn text(model: &'a Transformer) -> Self {
        Self {
            model,
            embed: Box::new(|ids| model.embed_tokens(ids)),
            classes: model.config().vocab_size,
            output_rows: Box::new(|ids| Ok(model.unembedding_rows(ids)?)),
            output_bias: None,
        }
    }
}

/// A sequence and, from position `first` on, the target's most likely next tokens with their
/// probabilities (the target's output the draft learns).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DistilledSequence {
    pub tokens: Vec<u32>,
    pub first: usize,
    /// One list per position `first..tokens.len()`, most likely first.
    pub labels: Vec<Vec<(u32, f32)>>,
}

impl DistilledSequence {
    /// Runs `target` over `tokens` once (its cache is reset) and keeps its `top_k` most
    /// likely next tokens at every position from `first` (e.g. a prompt's last token, whose
    /// next token is the answer's first).
    pub fn label(
        target: &mut Transformer,
        tokens: Vec<u32>,
        first: usize,
        top_k: usize,
    ) -> Result<Self> {
        if first >= tokens.len() || top_k == 0 {
            return Err(Error::Input(format!(
                "labels from position {first} of {} tokens, top {top_k}",
                tokens.len()
            )));
        }
        target.reset();
        let logits = target.forward_tokens(&tokens, LogitRows::Last(tokens.len() - first))?;
        target.reset();
        let labels = (0..logits.len())
            .map(|i| top_labels(&spec_core::sampling::softmax(logits.row(i)), top_k))
            .collect();
        Ok(Self {
            tokens,
            first,
            labels,
        })
    }
}

/// The `top_k` most likely classes of `probs` with their probabilities, most likely first:
/// one position's label.
pub fn top_labels(probs: &[f32], top_k: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = (0..probs.len() as u32).zip(probs.iter().copied()).collect();
    let kept = top_k.min(best.len());
    if kept > 0 {
        best.select_nth_unstable_by(kept - 1, |a, b| b.1.total_cmp(&a.1));
    }
    // A copy, not the truncated vector: that would keep the whole vocabulary's capacity.
    let mut top = best[..kept].to_vec();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top
}
