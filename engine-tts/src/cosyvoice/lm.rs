//! CosyVoice 2's speech-token language model (the reference's `Qwen2LM`): a Qwen2 backbone
//! (Qwen2.5-0.5B in the release; `engine-llm`'s [`Transformer`]) fed embeddings —
//! `[sos, text token embeddings, task id, prompt speech token embeddings]` — that predicts
//! speech tokens (6561 + end, an unused id and the fill token of bistreaming) through its own
//! output layer `llm_decoder`, drawn by repetition-aware sampling, at least 2 and at most 20
//! speech tokens per text token.
//!
//! What differs from the reference: the backbone's output layer (`lm_head`, tied to the text
//! embeddings) is never computed — only `llm_decoder` reads the final hidden state; the
//! sampler's uniform numbers come from a [`Uniforms`] source (replayable in tests).
//!
//! As a [`Decoder`] for `spec-core`'s loops, the model's inputs are ids of one space (see
//! [`SpeechLm::prompt_ids`]): the speech tokens it predicts (`0..speech_token_size + 3`), then
//! the text tokens, then `sos` and the task id.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::{Device, Tensor, D};
use engine_llm::ssd::{top_labels, Backbone, DistilledSequence, SsdDraftWeights};
use engine_llm::{LoadOptions, Transformer, TransformerConfig};
use rand::RngCore;
use spec_core::decoder::causal_positions;
use spec_core::sampling::repetition_aware::{ras_distribution, ras_sample, RasConfig, Uniforms};
use spec_core::sampling::Sampler;
use spec_core::{
    speculate, AcceptanceRule, DecodeStats, Decoder, DecoderInput, DraftLength, DraftModelDrafter,
    DraftTokens, Forward, HiddenStates, LogitRows, Logits, Speculation, StopConditions,
};

use crate::cosyvoice::{read_weights, CosyVoiceError, Result, Weights};

/// Prefix of the backbone's tensors in `llm.pt`.
const BACKBONE_PREFIX: &str = "llm.model.";

/// Bistreaming's interleaving: text tokens, then speech tokens (CosyVoice 2's `mix_ratio`).
const MIX_RATIO: (usize, usize) = (5, 15);

/// Settings of a [`SpeechLm`]; the defaults are CosyVoice 2's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpeechLmConfig {
    /// Speech tokens (6561); the end token, an unused id and the fill token follow them.
    pub speech_token_size: usize,
    /// Least speech tokens per text token before the end token may be drawn.
    pub min_token_text_ratio: usize,
    /// Most speech tokens per text token.
    pub max_token_text_ratio: usize,
    pub sampling: RasConfig,
}

impl Default for SpeechLmConfig {
    fn default() -> Self {
        Self {
            speech_token_size: 6561,
            min_token_text_ratio: 2,
            max_token_text_ratio: 20,
            sampling: RasConfig::default(),
        }
    }
}

/// The speech-token language model. See the module docs.
#[derive(Debug)]
pub struct SpeechLm {
    backbone: Transformer,
    /// `[speech_token_size + 3, hidden]`.
    speech_embedding: Tensor,
    /// `[1, 1, hidden]` each.
    start: Tensor,
    task: Tensor,
    /// `llm_decoder`: `[speech_token_size + 3, hidden]` and its bias.
    decoder_weight: Tensor,
    decoder_bias: Tensor,
    config: SpeechLmConfig,
}

impl SpeechLm {
    /// The model from the tensors of `llm.pt` (names as its state dict has them) and the
    /// backbone's configuration.
    pub fn from_tensors(
        tensors: HashMap<String, Tensor>,
        backbone: TransformerConfig,
        config: SpeechLmConfig,
        options: &LoadOptions,
    ) -> Result<Self> {
        config.sampling.validate()?;
        let hidden = backbone.hidden_size;
        let rows = config.speech_token_size + 3;
        let (backbone_tensors, own): (HashMap<String, Tensor>, HashMap<String, Tensor>) = tensors
            .into_iter()
            .partition(|(name, _)| name.starts_with(BACKBONE_PREFIX));
        let mut w = Weights::new(own, &options.device);
        let embedding = w.take("llm_embedding.weight", &[2, hidden])?;
        let speech_embedding = w.take("speech_embedding.weight", &[rows, hidden])?;
        let decoder_weight = w.take("llm_decoder.weight", &[rows, hidden])?;
        let decoder_bias = w.take("llm_decoder.bias", &[rows])?;
        let backbone_tensors = backbone_tensors
            .into_iter()
            .map(|(name, t)| (name[BACKBONE_PREFIX.len()..].to_string(), t))
            .collect();
        let backbone = Transformer::from_tensors(backbone, backbone_tensors, options)?;
        let row = |i: usize| -> Result<Tensor> { Ok(embedding.narrow(0, i, 1)?.unsqueeze(0)?) };
        Ok(Self {
            backbone,
            start: row(0)?,
            task: row(1)?,
            speech_embedding,
            decoder_weight,
            decoder_bias,
            config,
        })
    }

    /// Loads `llm.pt` (a PyTorch state dict) or its safetensors conversion, with the
    /// backbone's Hugging Face `config.json` (`CosyVoice-BlankEN/config.json`).
    pub fn load(
        weights: &Path,
        backbone_config: &Path,
        config: SpeechLmConfig,
        options: &LoadOptions,
    ) -> Result<Self> {
        let tensors = read_weights(weights)?;
        let text = std::fs::read_to_string(backbone_config).map_err(|e| CosyVoiceError::File {
            path: backbone_config.to_path_buf(),
            reason: e.to_string(),
        })?;
        let backbone = TransformerConfig::from_hf_json(&text)?;
        Self::from_tensors(tensors, backbone, config, options)
    }

    pub fn config(&self) -> &SpeechLmConfig {
        &self.config
    }

    /// A draft for [`SpeechLm::generate_speculative`] built from this model's own backbone
    /// layers (SSD's draft starts from the lower 2 and upper 6 of 24), sharing every weight,
    /// with caches of its own. Untrained, it agrees with the model less than SSD's trained
    /// draft does.
    pub fn draft_from_layers(&self, layers: &[usize]) -> Result<SpeechLm> {
        Ok(self.with_backbone(
            self.backbone.with_layers(layers)?,
            self.decoder_weight.clone(),
            self.decoder_bias.clone(),
        ))
    }

    /// A model on `backbone` and the decoder `decoder_weight`/`decoder_bias`, sharing this
    /// one's embeddings and settings.
    fn with_backbone(
        &self,
        backbone: Transformer,
        decoder_weight: Tensor,
        decoder_bias: Tensor,
    ) -> SpeechLm {
        SpeechLm {
            backbone,
            speech_embedding: self.speech_embedding.clone(),
            start: self.start.clone(),
            task: self.task.clone(),
            decoder_weight,
            decoder_bias,
            config: self.config,
        }
    }

    /// The end-of-speech token.
    pub fn end_token(&self) -> u32 {
        self.config.speech_token_size as u32
    }

    /// The fill token of bistreaming: the model asks for more text.
    pub fn fill_token(&self) -> u32 {
        self.config.speech_token_size as u32 + 2
    }

    /// Ids of the speech tokens and their specials: the decoder's outputs.
    fn speech_rows(&self) -> u32 {
        self.config.speech_token_size as u32 + 3
    }

    fn text_vocab(&self) -> u32 {
        self.backbone.config().vocab_size as u32
    }

    /// The input id of `sos`.
    fn start_id(&self) -> u32 {
        self.speech_rows() + self.text_vocab()
    }

    /// The input id of the task id.
    fn task_id(&self) -> u32 {
        self.start_id() + 1
    }

    /// Input ids of text tokens; `Err` for a token outside the backbone's vocabulary.
    fn text_ids(&self, text: &[u32]) -> Result<Vec<u32>> {
        let vocab = self.text_vocab();
        text.iter()
            .map(|&t| match t < vocab {
                true => Ok(self.speech_rows() + t),
                false => Err(CosyVoiceError::Input(format!(
                    "text token {t} is outside the backbone's {vocab} tokens"
                ))),
            })
            .collect()
    }

    /// The input ids of `[sos, text, task id, speech]`: the prompt of a decoding (`speech` the
    /// prompt's speech tokens), as [`Decoder`] inputs.
    pub fn prompt_ids(&self, text: &[u32], speech: &[u32]) -> Result<Vec<u32>> {
        if let Some(&bad) = speech.iter().find(|&&t| t >= self.speech_rows()) {
            return Err(CosyVoiceError::Input(format!(
                "speech token {bad} is outside the model's {} speech tokens",
                self.speech_rows()
            )));
        }
        let mut ids = vec![self.start_id()];
        ids.extend(self.text_ids(text)?);
        ids.push(self.task_id());
        ids.extend_from_slice(speech);
        Ok(ids)
    }

    /// The input embeddings of `ids`, `[1, n, hidden]`: each run of speech or text ids
    /// embedded by its own table.
    fn embed_ids(&self, ids: &[u32]) -> Result<Tensor> {
        let (rows, start) = (self.speech_rows(), self.start_id());
        let kind = |id: u32| match id {
            id if id < rows => 0,
            id if id < start => 1,
            _ => 2 + (id - start),
        };
        let mut parts = Vec::new();
        for run in ids.chunk_by(|&a, &b| kind(a) == kind(b) && kind(a) < 2) {
            parts.push(match kind(run[0]) {
                0 => self.speech_embeddings(run)?,
                1 => {
                    let text: Vec<u32> = run.iter().map(|&id| id - rows).collect();
                    self.backbone.embed_tokens(&text)?.unsqueeze(0)?
                }
                2 => self.start.clone(),
                3 => self.task.clone(),
                _ => {
                    return Err(CosyVoiceError::Input(format!(
                        "input id {} is none of the LM's inputs",
                        run[0]
                    )))
                }
            });
        }
        Ok(Tensor::cat(&parts, 1)?)
    }

    /// Bistreaming (the reference's `inference_bistream`): text arrives in pieces
    /// ([`Bistream::push_text`]) and speech tokens are drawn as soon as 5 text tokens are in,
    /// 15 speech tokens per 5 text tokens, the model asking for more text with the fill token;
    /// [`Bistream::finish`] decodes the rest to the end token. The prompt's text and speech
    /// tokens are interleaved the same way first.
    pub fn bistream(&mut self, prompt_text: &[u32], prompt_speech: &[u32]) -> Result<Bistream<'_>> {
        if let Some(&bad) = prompt_speech
            .iter()
            .find(|&&t| t as usize >= self.config.speech_token_size)
        {
            return Err(CosyVoiceError::Input(format!(
                "prompt speech token {bad} is not a speech token"
            )));
        }
        self.backbone.reset();
        let ratio = MIX_RATIO;
        let next_fill = (prompt_speech.len() / ratio.1 + 1) * ratio.1 - prompt_speech.len();
        Ok(Bistream {
            pending: vec![self.start_id()],
            text: self.text_ids(prompt_text)?,
            prompt_speech: prompt_speech.to_vec(),
            out: Vec::new(),
            text_pushed: 0,
            next_fill,
            lm: self,
        })
    }

    /// Embeddings of speech tokens, `[1, n, hidden]`.
    pub fn speech_embeddings(&self, tokens: &[u32]) -> Result<Tensor> {
        let rows = self.config.speech_token_size + 3;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= rows) {
            return Err(CosyVoiceError::Input(format!(
                "speech token {bad} is outside the model's {rows} speech tokens"
            )));
        }
        let ids = Tensor::new(tokens, self.speech_embedding.device())?;
        Ok(self.speech_embedding.index_select(&ids, 0)?.unsqueeze(0)?)
    }

    /// A forward of input ids ([`Decoder::forward`]): the log-probabilities of the next speech
    /// token after the requested positions, `[rows, speech tokens]`.
    fn forward_ids(&mut self, step: &Forward<'_>) -> Result<Tensor> {
        let DecoderInput::Tokens(ids) = step.input else {
            return Err(CosyVoiceError::Input(
                "the speech LM is fed input ids (SpeechLm::prompt_ids)".into(),
            ));
        };
        let rows = step.validate(self.backbone.cached_len())?;
        let input = self.embed_ids(ids)?;
        let embedded = Forward {
            input: DecoderInput::Embeddings(&input),
            logits: LogitRows::None,
            ..*step
        };
        self.backbone.forward_embedded(&embedded, ids)?;
        let hidden = self.backbone.last_hidden()?;
        self.decode(&hidden.narrow(0, ids.len() - rows, rows)?)
    }

    /// `llm_decoder` over final hidden states `[n, hidden]`: log-probabilities `[n, tokens]`.
    fn decode(&self, hidden: &Tensor) -> Result<Tensor> {
        let logits = hidden
            .matmul(&self.decoder_weight.t()?)?
            .broadcast_add(&self.decoder_bias)?;
        Ok(candle_nn::ops::log_softmax(&logits, D::Minus1)?)
    }

    /// Forwards `ids` after the cache and returns the log-probabilities of the next speech
    /// token after each of its last `rows` positions, `[rows, tokens]`.
    fn forward(&mut self, ids: &[u32], rows: usize) -> Result<Tensor> {
        let positions = causal_positions(self.backbone.cached_len(), ids.len());
        self.forward_ids(&Forward::tokens(ids, &positions).last(rows))
    }

    /// Teacher forcing: the log-probabilities of the next speech token at every position of
    /// `[sos, text, task id, prompt speech, speech]`, `[positions, tokens]`, from one forward.
    pub fn log_probabilities(
        &mut self,
        text: &[u32],
        prompt_speech: &[u32],
        speech: &[u32],
    ) -> Result<Tensor> {
        let ids = self.prompt_ids(text, &[prompt_speech, speech].concat())?;
        self.backbone.reset();
        self.forward(&ids, ids.len())
    }

    /// Speech tokens for `text` (token ids of the backbone's tokenizer) in the voice of the
    /// prompt (`prompt_text` and the speech tokens `prompt_speech` of its recording; both may
    /// be empty), drawn with the uniform numbers of `uniforms`. Stops at the end token (not
    /// returned; allowed after `min_token_text_ratio` tokens per text token) or after
    /// `max_token_text_ratio` tokens per text token.
    pub fn generate(
        &mut self,
        text: &[u32],
        prompt_text: &[u32],
        prompt_speech: &[u32],
        uniforms: &mut dyn Uniforms,
    ) -> Result<Vec<u32>> {
        self.generate_each(text, prompt_text, prompt_speech, uniforms, &mut |_| Ok(()))
    }

    /// [`SpeechLm::generate`], handing each speech token to `on_token` as soon as it is drawn
    /// (before the next is); an error from `on_token` stops the decoding and is returned.
    pub fn generate_each(
        &mut self,
        text: &[u32],
        prompt_text: &[u32],
        prompt_speech: &[u32],
        uniforms: &mut dyn Uniforms,
        on_token: &mut dyn FnMut(u32) -> Result<()>,
    ) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Err(CosyVoiceError::Input("no text to speak".into()));
        }
        let all_text: Vec<u32> = prompt_text.iter().chain(text).copied().collect();
        let mut input = self.prompt_ids(&all_text, prompt_speech)?;
        let min_len = text.len() * self.config.min_token_text_ratio;
        let max_len = text.len() * self.config.max_token_text_ratio;
        let end = self.end_token();
        self.backbone.reset();
        let mut out: Vec<u32> = Vec::new();
        for i in 0..max_len {
            let mut scores: Vec<f32> = self.forward(&input, 1)?.squeeze(0)?.to_vec1()?;
            if i < min_len {
                scores[end as usize] = f32::NEG_INFINITY;
            }
            let token = ras_sample(&mut scores, &out, &self.config.sampling, uniforms)?;
            if token >= end {
                break;
            }
            out.push(token);
            on_token(token)?;
            input = vec![token];
        }
        Ok(out)
    }
}

/// SSD's trained draft (§3.2): the LM's lower layers and `llm_decoder` retrained on its own
/// outputs, with `spec-train`'s SSD training (`spec_train::ssd`), on what this model supplies
/// ([`SpeechLm::distill`], [`SpeechLm::ssd_backbone`]). A training sequence's ids are the
/// model's input ids ([`SpeechLm::prompt_ids`]).
impl SpeechLm {
    /// One self-distilled training sequence: speech drawn for `text` as [`SpeechLm::generate`]
    /// draws it (the prompt's text first, its speech tokens before the drawn ones), labelled
    /// with this model's `top_k` most likely next speech tokens at every position from the task
    /// id on.
    pub fn distill(
        &mut self,
        text: &[u32],
        prompt_text: &[u32],
        prompt_speech: &[u32],
        top_k: usize,
        uniforms: &mut dyn Uniforms,
    ) -> Result<DistilledSequence> {
        let speech = self.generate(text, prompt_text, prompt_speech, uniforms)?;
        let all_text: Vec<u32> = prompt_text.iter().chain(text).copied().collect();
        let all_speech: Vec<u32> = prompt_speech.iter().chain(&speech).copied().collect();
        let log_probs = self.log_probabilities(&all_text, &[], &all_speech)?;
        self.backbone.reset();
        let first = all_text.len() + 1;
        let rows = log_probs.dim(0)? - first;
        let labels = log_probs
            .narrow(0, first, rows)?
            .exp()?
            .to_vec2::<f32>()?
            .iter()
            .map(|probs| top_labels(probs, top_k))
            .collect();
        Ok(DistilledSequence {
            tokens: self.prompt_ids(&all_text, &all_speech)?,
            first,
            labels,
        })
    }

    /// What an SSD draft of this model trains on (`spec_train::ssd::train`): its
    /// backbone, the inputs of [`SpeechLm::distill`]'s sequences, and `llm_decoder`.
    pub fn ssd_backbone(&self) -> Backbone<'_> {
        let rows = self.speech_rows();
        Backbone {
            model: &self.backbone,
            embed: Box::new(move |ids: &[u32]| {
                let embedded = self
                    .embed_ids(ids)
                    .map_err(|e| engine_llm::Error::Input(e.to_string()))?;
                Ok(embedded.squeeze(0)?)
            }),
            classes: rows as usize,
            output_rows: Box::new(move |ids: &[u32]| {
                let index = Tensor::new(ids, self.decoder_weight.device())?;
                Ok(self.decoder_weight.index_select(&index, 0)?)
            }),
            output_bias: Some(self.decoder_bias.clone()),
        }
    }

    /// The trained SSD draft: `weights`' lower layers and decoder (trained on
    /// [`SpeechLm::ssd_backbone`] over every speech token), this model's upper layers and
    /// embeddings.
    pub fn ssd_draft(&self, weights: &SsdDraftWeights) -> Result<SpeechLm> {
        let rows = self.config.speech_token_size + 3;
        let every_token = weights.shortlist.len() == rows
            && weights
                .shortlist
                .iter()
                .enumerate()
                .all(|(i, &t)| t as usize == i);
        let (true, Some(bias)) = (every_token, &weights.head_bias) else {
            return Err(CosyVoiceError::Config(format!(
                "an SSD draft of a speech LM scores all its {rows} speech tokens with a biased \
                 decoder; this one scores {} tokens{}",
                weights.shortlist.len(),
                if weights.head_bias.is_none() {
                    " without a bias"
                } else {
                    ""
                }
            )));
        };
        let device = self.decoder_weight.device();
        Ok(self.with_backbone(
            self.backbone.ssd_draft_backbone(weights)?,
            weights.head.to_device(device)?,
            bias.to_device(device)?,
        ))
    }
}

/// Settings of Speech Speculative Decoding ([`SpeechLm::generate_speculative`]); the defaults
/// are the paper's (γ = 3, β = 0.4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SsdConfig {
    /// Tokens the draft proposes per round.
    pub gamma: usize,
    /// β of eq. 5, in [0, 1]: 0 samples exactly from the model.
    pub tolerance: f32,
    /// A cap on the speech tokens, below the length rule's.
    pub max_tokens: Option<usize>,
}

impl Default for SsdConfig {
    fn default() -> Self {
        Self {
            gamma: 3,
            tolerance: 0.4,
            max_tokens: None,
        }
    }
}

impl SsdConfig {
    pub fn validate(&self) -> Result<()> {
        if self.gamma == 0 || !(0.0..=1.0).contains(&self.tolerance) {
            return Err(CosyVoiceError::Config(format!(
                "SSD needs γ ≥ 1 and a tolerance β in [0, 1], got γ = {}, β = {}",
                self.gamma, self.tolerance
            )));
        }
        Ok(())
    }
}

impl SpeechLm {
    /// Speech Speculative Decoding (SSD, Lin et al.): `draft` (a cheaper model with the
    /// same speech tokens, e.g. built from this one's layers) draws up to γ tokens by
    /// repetition-aware sampling, this model verifies them in one forward and keeps draft
    /// token x when r < min(1, q(x)/p(x)) + β (eq. 5; q, p: the distributions the two
    /// samplers really draw from, [`ras_distribution`], eos masked before the minimum
    /// length), resampling from normalize(max(0, q − p)) at the first rejection. β = 0 draws
    /// exactly from this model's distribution; larger β accepts more, drifting toward the
    /// draft. Stops as [`SpeechLm::generate`] does, or after `config.max_tokens`. This is
    /// `spec-core`'s [`speculate()`] with a sampled [`DraftModelDrafter`], whose first draft the
    /// prompt's forward verifies.
    ///
    /// `on_token`, when given, receives each kept speech token as soon as its round is
    /// verified; an error from it stops the decoding and is returned.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_speculative(
        &mut self,
        draft: &mut SpeechLm,
        text: &[u32],
        prompt_text: &[u32],
        prompt_speech: &[u32],
        config: &SsdConfig,
        rng: &mut dyn RngCore,
        on_token: Option<&mut dyn FnMut(u32) -> Result<()>>,
    ) -> Result<(Vec<u32>, DecodeStats)> {
        if text.is_empty() {
            return Err(CosyVoiceError::Input("no text to speak".into()));
        }
        if draft.config.speech_token_size != self.config.speech_token_size {
            return Err(CosyVoiceError::Config(format!(
                "the draft has {} speech tokens, the model {}",
                draft.config.speech_token_size, self.config.speech_token_size
            )));
        }
        config.validate()?;
        let all_text: Vec<u32> = prompt_text.iter().chain(text).copied().collect();
        let context = self.prompt_ids(&all_text, prompt_speech)?;
        let max_len = (text.len() * self.config.max_token_text_ratio)
            .min(config.max_tokens.unwrap_or(usize::MAX));
        let end = self.end_token();
        let sampling = |lm: &SpeechLm| SpeechSampling {
            ras: lm.config.sampling,
            prompt_len: context.len(),
            min_len: text.len() * self.config.min_token_text_ratio,
            end,
        };
        let target_sampling = sampling(self);
        let draft_tokens = DraftTokens::Sampled(Box::new(sampling(draft)));
        self.reset();
        draft.reset();
        let mut drafter =
            DraftModelDrafter::new(&mut *draft, DraftLength::Fixed(config.gamma), draft_tokens)?
                .drafting_with_prefill();
        // Every id from the end token on ends the speech; so does a failed `on_token`.
        let failed = Arc::new(AtomicBool::new(false));
        let stop_failed = Arc::clone(&failed);
        let stop = StopConditions::new(max_len)
            .with_eos(end..self.speech_rows())
            .with_predicate(move |_| stop_failed.load(Ordering::Relaxed));
        let mut failure = None;
        let mut ignore = |_| Ok(());
        let on_token = on_token.unwrap_or(&mut ignore);
        let mut emit = |token: u32| {
            if token < end && failure.is_none() {
                if let Err(e) = on_token(token) {
                    failure = Some(e);
                    failed.store(true, Ordering::Relaxed);
                }
            }
        };
        let rule = AcceptanceRule::speculative_sampling(config.tolerance);
        let speculation = Speculation {
            sampling: Some(&target_sampling),
            rng: Some(rng),
            ..Speculation::new(&rule)
        };
        let generation = speculate(self, &mut drafter, &context, speculation, &stop, &mut emit)?;
        if let Some(e) = failure {
            return Err(e);
        }
        let mut tokens = generation.tokens;
        if tokens.last().is_some_and(|&t| t >= end) {
            tokens.pop();
        }
        Ok((tokens, generation.stats))
    }
}

/// What the LM draws a speech token from after the prompt and the tokens since:
/// repetition-aware sampling over the speech tokens drawn so far, the end token masked before
/// the minimum length.
#[derive(Debug)]
struct SpeechSampling {
    ras: RasConfig,
    /// Input ids before the first drawn token.
    prompt_len: usize,
    min_len: usize,
    end: u32,
}

impl Sampler for SpeechSampling {
    fn validate(&self) -> spec_core::Result<()> {
        self.ras.validate()
    }

    fn distribution(&self, before: &[u32], row: &[f32]) -> spec_core::Result<Vec<f32>> {
        let drawn = before.get(self.prompt_len..).unwrap_or_default();
        let mut scores = row.to_vec();
        if drawn.len() < self.min_len {
            if let Some(end) = scores.get_mut(self.end as usize) {
                *end = f32::NEG_INFINITY;
            }
        }
        ras_distribution(&scores, drawn, &self.ras)
    }
}

/// The LM as `spec-core`'s loops drive it: input ids of [`SpeechLm::prompt_ids`]' space in,
/// log-probabilities of the speech tokens out.
impl Decoder for SpeechLm {
    fn vocab_size(&self) -> usize {
        self.speech_rows() as usize
    }

    fn max_len(&self) -> usize {
        self.backbone.max_len()
    }

    fn device(&self) -> &Device {
        self.backbone.device()
    }

    fn cached_tokens(&self) -> &[u32] {
        self.backbone.cached_tokens()
    }

    fn forward(&mut self, step: &Forward<'_>) -> spec_core::Result<Tensor> {
        Ok(self.forward_ids(step)?)
    }

    fn truncate(&mut self, len: usize) -> spec_core::Result<()> {
        self.backbone.truncate(len)
    }

    fn keep_positions(&mut self, positions: &[usize]) -> spec_core::Result<()> {
        self.backbone.keep_positions(positions)
    }

    fn reset(&mut self) {
        self.backbone.reset();
    }
}

impl HiddenStates for SpeechLm {
    fn hidden_size(&self) -> usize {
        self.backbone.hidden_size()
    }

    fn last_hidden(&self) -> spec_core::Result<Tensor> {
        self.backbone.last_hidden()
    }

    fn unembed(&self, hidden: &Tensor) -> spec_core::Result<Logits> {
        let rows = self.decode(hidden)?;
        Logits::from_tensor(&rows, rows.dim(0)?, self.vocab_size())
    }

    fn unembedding_rows(&self, ids: &[u32]) -> spec_core::Result<Tensor> {
        let index = Tensor::new(ids, self.decoder_weight.device())?;
        Ok(self.decoder_weight.index_select(&index, 0)?)
    }
}

/// A bistreaming session (see [`SpeechLm::bistream`]).
pub struct Bistream<'a> {
    lm: &'a mut SpeechLm,
    /// The input ids of the next forward. As in the reference, after the fill token it still
    /// holds the input already forwarded, which is fed again if the text ends before 5 more
    /// tokens.
    pending: Vec<u32>,
    /// Input ids of the text tokens not yet in the input.
    text: Vec<u32>,
    /// Prompt speech tokens not yet in the input.
    prompt_speech: Vec<u32>,
    /// Every token drawn, fill tokens included.
    out: Vec<u32>,
    /// Text tokens pushed (the prompt's not counted), for the length limit.
    text_pushed: usize,
    /// Where in `out` the next fill token is forced.
    next_fill: usize,
}

impl Bistream<'_> {
    /// Adds text tokens; returns the speech tokens drawn before the model asked for more text.
    pub fn push_text(&mut self, text: &[u32], uniforms: &mut dyn Uniforms) -> Result<Vec<u32>> {
        let (text_ratio, speech_ratio) = MIX_RATIO;
        self.text.extend(self.lm.text_ids(text)?);
        self.text_pushed += text.len();
        while !self.prompt_speech.is_empty() && self.text.len() >= text_ratio {
            let text: Vec<u32> = self.text.drain(..text_ratio).collect();
            let take = speech_ratio.min(self.prompt_speech.len());
            let speech: Vec<u32> = self.prompt_speech.drain(..take).collect();
            self.pending.extend(text.into_iter().chain(speech));
        }
        if !self.prompt_speech.is_empty() {
            return Ok(Vec::new());
        }
        let fill = self.lm.fill_token();
        let after_fill = self.out.last() == Some(&fill);
        let at_start = self.out.is_empty() && self.pending == [self.lm.start_id()];
        if after_fill || at_start {
            if self.text.len() < text_ratio {
                return Ok(Vec::new());
            }
            let text = self.text.drain(..text_ratio);
            if after_fill {
                self.pending = text.collect();
            } else {
                self.pending.extend(text);
            }
        }
        let end = self.lm.end_token();
        let mut spoken = Vec::new();
        loop {
            let mut scores: Vec<f32> = self.lm.forward(&self.pending, 1)?.squeeze(0)?.to_vec1()?;
            let token = if self.out.len() == self.next_fill {
                self.next_fill += speech_ratio + 1;
                fill
            } else {
                scores[end as usize] = f32::NEG_INFINITY;
                ras_sample(&mut scores, &self.out, &self.lm.config.sampling, uniforms)?
            };
            if token == fill {
                self.next_fill = self.out.len() + speech_ratio + 1;
            }
            self.out.push(token);
            if token == fill {
                return Ok(spoken);
            }
            if token >= end {
                return Err(CosyVoiceError::Generation(format!(
                    "the model drew token {token} (not a speech token) while text was streaming"
                )));
            }
            spoken.push(token);
            self.pending = vec![token];
        }
    }

    /// No more text: decodes to the end token and returns the speech tokens drawn.
    pub fn finish(mut self, uniforms: &mut dyn Uniforms) -> Result<Vec<u32>> {
        self.pending.append(&mut self.text);
        self.pending.push(self.lm.task_id());
        let end = self.lm.end_token();
        // The reference has no limit here; a model that never ends stops at the unistream one.
        let limit = self.text_pushed.max(1) * self.lm.config.max_token_text_ratio;
        let mut spoken = Vec::new();
        loop {
            if self.out.len() >= limit {
                return Err(CosyVoiceError::Generation(format!(
                    "no end token after {limit} speech tokens"
                )));
            }
            let mut scores: Vec<f32> = self.lm.forward(&self.pending, 1)?.squeeze(0)?.to_vec1()?;
            let token = ras_sample(&mut scores, &self.out, &self.lm.config.sampling, uniforms)?;
            self.out.push(token);
            if token == end {
                return Ok(spoken);
            }
            if token > end {
                return Err(CosyVoiceError::Generation(format!(
                    "the model drew token {token} (not a speech token) after the text"
                )));
            }
            spoken.push(token);
            self.pending = vec![token];
        }
    }
}
