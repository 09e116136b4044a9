//! The drafts a [`Transcriber`] speculates with: multi-token prediction heads, a smaller Whisper
//! of the same vocabulary (SpecASR), or one of another vocabulary drafting text, and whether
//! drafting pays on this machine.

use std::time::{Duration, Instant};

use spec_core::heads::HeadsDrafter;
use spec_core::{
    DecodeStats, DraftInput, ForwardCosts, SpecAsrConfig, SpecAsrCounts, SpecAsrDrafter, TokenTree,
    TreeDraft, TreeDrafter,
};
use spec_nn::heads::MultiTokenHeads;

use super::{EncoderLength, Suppression, Transcriber};
use crate::mel::{LogMel, MelFilters};
use crate::whisper::model::Whisper;
use crate::whisper::rules::LogitRules;
use crate::whisper::tokenizer::WhisperTokenizer;
use crate::{Error, Result};

/// A draft with another vocabulary drafting text for one window (see
/// [`Transcriber::set_text_draft`]).
pub(super) struct TextDrafter<'a> {
    drafter: &'a mut SpecAsrDrafter<Whisper>,
    tokenizer: &'a WhisperTokenizer,
    target_tokenizer: &'a WhisperTokenizer,
    /// The draft's own prompt: start of transcript, language and task if multilingual, no
    /// timestamps.
    prompt: Vec<u32>,
}

impl<'a> TextDrafter<'a> {
    /// Prepares `drafter` (its prompt's rules) for text drafts in `language`.
    pub(super) fn new(
        drafter: &'a mut SpecAsrDrafter<Whisper>,
        tokenizer: &'a WhisperTokenizer,
        suppression: &Suppression,
        target_tokenizer: &'a WhisperTokenizer,
        language: Option<&str>,
    ) -> Result<Self> {
        let mut prompt = vec![tokenizer.start_of_transcript];
        if drafter.model().config().is_multilingual() {
            prompt.push(tokenizer.language(language.unwrap_or("en"))?);
            prompt.push(tokenizer.transcribe);
        }
        prompt.push(tokenizer.no_timestamps);
        let rules = LogitRules::new(
            tokenizer,
            &suppression.suppress_ids,
            &suppression.suppress_ids_begin,
            false,
            None,
        );
        let prompt_len = prompt.len();
        drafter.set_adjust(Some(Box::new(move |sequence, row| {
            rules.apply(row, &sequence[prompt_len..]);
        })));
        Ok(Self {
            drafter,
            tokenizer,
            target_tokenizer,
            prompt,
        })
    }

    /// The committed text tokenized for the draft, continued by the draft, and the new words
    /// tokenized for the target as a chain after the last committed token.
    fn draft_text(&mut self, input: DraftInput<'_>) -> Result<TreeDraft> {
        let root = input.root()?;
        let target = self.target_tokenizer;
        let sampled = input.produced();
        let text = target.decode(sampled)?;
        let mut sequence = self.prompt.clone();
        sequence.extend(self.tokenizer.encode(&text)?);
        let draft = self
            .drafter
            .draft_tree(DraftInput::new(&sequence, input.max_depth))?;
        let mut drafted: Vec<u32> = draft.tree.tokens()[1..].to_vec();
        let ended = drafted.last() == Some(&self.tokenizer.end_of_text);
        if ended {
            drafted.pop();
        }
        let mut own: Vec<u32> = sequence[self.prompt.len()..].to_vec();
        own.extend_from_slice(&drafted);
        let whole = self.tokenizer.decode(&own)?;
        let Some(new_text) = whole.strip_prefix(text.as_str()) else {
            return Ok(TreeDraft::new(TokenTree::new(root), draft.forwards));
        };
        let committed_text: Vec<u32> = sampled
            .iter()
            .copied()
            .filter(|&t| t < target.end_of_text)
            .collect();
        let mut proposal = target.encode(&format!("{text}{new_text}"))?;
        proposal = if proposal.starts_with(&committed_text) {
            proposal.split_off(committed_text.len())
        } else {
            target.encode(new_text)?
        };
        if ended {
            proposal.push(target.end_of_text);
        }
        proposal.truncate(input.max_depth);
        Ok(TreeDraft::new(
            TokenTree::linear(root, &proposal),
            draft.forwards,
        ))
    }
}

impl TreeDrafter for TextDrafter<'_> {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> spec_core::Result<TreeDraft> {
        Ok(self.draft_text(input)?)
    }
    /// The draft's cache holds its own tokens: the next window starts it over.
    fn finish(&mut self, _committed: &[u32]) -> spec_core::Result<()> {
        Ok(())
    }
}

/// Whether SpecASR pays on this machine, for [`SpecAsrConfig::cost_aware`]. A window is
/// drafted only if drafting could pay for it at all, and only while drafted windows have paid:
///
/// - **Could pay**: even a perfect draft saves less than one target step per token, and a
///   window has at most `max_tokens` (224 for 30 s, in proportion for less audio). So when the
///   draft's encoder alone costs more than `max_tokens` target steps, the window is decoded
///   greedily without touching the draft. The draft's encoder is estimated from the target's
///   (just measured on the same window) by the two encoders' multiply-adds, then by the ratio
///   drafted windows measured. The target's step is the time per token of the first window,
///   decoded greedily (free), or measured on the first drafted window.
/// - **Has paid**: the drafted windows' time per token (drafting, verifying and the draft's
///   encoder), decayed over windows, against the target's one-token step.
#[derive(Debug, Default)]
pub(super) struct DraftEconomics {
    pub(super) greedy_step: Option<f64>,
    pub(super) seconds: f64,
    pub(super) tokens: f64,
    /// The draft's encoder time ÷ the target's, measured on drafted windows.
    pub(super) encoder_ratio: Option<f64>,
}

impl DraftEconomics {
    /// Weight of the previous windows against the newest.
    const DECAY: f64 = 0.8;

    /// Whether drafting a window of at most `max_tokens` tokens, whose target encoder took
    /// `target_encoder`, could save more than the draft's encoder costs; `estimated_ratio` is
    /// the draft encoder's cost ÷ the target's by their multiply-adds. False until the
    /// target's step is known (the first window is decoded greedily and measures it).
    pub(super) fn could_pay(
        &self,
        max_tokens: usize,
        target_encoder: Duration,
        estimated_ratio: f64,
    ) -> bool {
        let Some(step) = self.greedy_step else {
            return false;
        };
        let draft_encoder =
            target_encoder.as_secs_f64() * self.encoder_ratio.unwrap_or(estimated_ratio);
        draft_encoder < max_tokens as f64 * step
    }

    /// True until a drafted window has been seen, then while drafting costs less per token
    /// than greedy decoding's one forward per token.
    pub(super) fn pays(&self) -> bool {
        match self.greedy_step {
            Some(step) if self.tokens > 0.0 => self.seconds / self.tokens < step,
            _ => true,
        }
    }

    pub(super) fn observe(
        &mut self,
        window: &DecodeStats,
        draft_encoder_time: Duration,
        target_encoder_time: Duration,
    ) {
        let tokens: usize = window.steps.iter().map(|s| s.accepted + 1).sum();
        let seconds = (window.draft_time + window.target_time + draft_encoder_time).as_secs_f64();
        self.seconds = self.seconds * Self::DECAY + seconds;
        self.tokens = self.tokens * Self::DECAY + tokens as f64;
        if !target_encoder_time.is_zero() {
            self.encoder_ratio =
                Some(draft_encoder_time.as_secs_f64() / target_encoder_time.as_secs_f64());
        }
    }

    /// A window decoded greedily in `decoder_time` with `forwards` forwards gives the
    /// target's step, if none is known yet.
    pub(super) fn observe_greedy(&mut self, decoder_time: Duration, forwards: usize) {
        if self.greedy_step.is_none() && forwards > 0 {
            self.greedy_step = Some(decoder_time.as_secs_f64() / forwards as f64);
        }
    }
}

/// A smaller Whisper drafting for SpecASR, with its own mel filters.
#[derive(Debug)]
pub(super) struct WhisperDraft {
    pub(super) drafter: SpecAsrDrafter<Whisper>,
    pub(super) filters: MelFilters,
    /// `Some` when the draft has another vocabulary: its tokenizer and suppression lists.
    pub(super) text: Option<(WhisperTokenizer, Suppression)>,
    pub(super) economics: DraftEconomics,
}

impl Transcriber {
    /// Multi-token prediction heads for [`TranscribeOptions::heads`](super::TranscribeOptions::heads), drafting as `drafter`
    /// says (its tree shape, and how sure a head must be to draft); fails when they read hidden
    /// states or vocabularies of another size.
    pub fn set_heads(&mut self, drafter: HeadsDrafter<MultiTokenHeads>) -> Result<()> {
        drafter.heads().info().check_fits(&self.model)?;
        self.heads = Some(drafter);
        Ok(())
    }

    /// A smaller Whisper with the same vocabulary (tiny.en for small.en or medium.en) as the
    /// draft model of [`TranscribeOptions::draft`](super::TranscribeOptions::draft); refused when its vocabulary or special
    /// tokens differ from this model's.
    pub fn set_draft(&mut self, draft: Transcriber) -> Result<()> {
        if !self.tokenizer.same_vocabulary(&draft.tokenizer)
            || draft.model.config().vocab_size != self.model.config().vocab_size
        {
            return Err(Error::Config(format!(
                "the draft's vocabulary ({} tokens, {}) differs from the model's ({} tokens, {}): \
                 a draft with another tokenizer drafts text (Transcriber::set_text_draft)",
                draft.model.config().vocab_size,
                draft.tokenizer.path.display(),
                self.model.config().vocab_size,
                self.tokenizer.path.display(),
            )));
        }
        let drafter = SpecAsrDrafter::new(draft.model, SpecAsrConfig::default())?
            .with_end_token(self.tokenizer.end_of_text);
        self.draft = Some(WhisperDraft {
            drafter,
            filters: draft.filters,
            text: None,
            economics: DraftEconomics::default(),
        });
        Ok(())
    }

    /// A smaller Whisper with another vocabulary (tiny.en for base) as the draft model of
    /// [`TranscribeOptions::draft`](super::TranscribeOptions::draft), drafting text (beyond the paper): each step the committed
    /// text is tokenized for the draft, the draft continues it in its own vocabulary, and its
    /// words are tokenized for this model and verified, so the transcript is still exactly
    /// this model's greedy one. Drafts are single sequences (the sparse tree's branches are
    /// not translated) and carry no timestamps.
    pub fn set_text_draft(&mut self, draft: Transcriber) -> Result<()> {
        if draft.model.config().is_multilingual() && !self.model.config().is_multilingual() {
            return Err(Error::Config(
                "a multilingual draft for an English-only model: use an English-only draft".into(),
            ));
        }
        let drafter = SpecAsrDrafter::new(draft.model, SpecAsrConfig::default())?
            .with_end_token(draft.tokenizer.end_of_text);
        self.draft = Some(WhisperDraft {
            drafter,
            filters: draft.filters,
            text: Some((draft.tokenizer, draft.suppression)),
            economics: DraftEconomics::default(),
        });
        Ok(())
    }

    /// Forgets what the cost-aware policy has measured and seen (a new machine load, a new
    /// kind of audio).
    pub fn reset_draft_policy(&mut self) {
        if let Some(draft) = self.draft.as_mut() {
            draft.economics = DraftEconomics::default();
        }
    }

    /// What the SpecASR drafter has done so far (tokens drafted, recycled, branch nodes).
    pub fn draft_counts(&self) -> Option<SpecAsrCounts> {
        self.draft.as_ref().map(|d| d.drafter.counts())
    }

    /// Encodes a window with the draft model and returns the time it took: `mel` (the
    /// target's input) when the draft has as many mel bins, else `own_window` (the same span
    /// of the recording through the draft's filters).
    pub(super) fn encode_draft(
        &mut self,
        mel: &LogMel,
        own_window: Option<LogMel>,
        audio_frames: usize,
        length: EncoderLength,
    ) -> Result<Duration> {
        let start = Instant::now();
        let own_mel = own_window.map(|window| self.encoder_input(window, audio_frames, length));
        let draft = self.draft.as_mut().ok_or_else(|| {
            Error::Config(
                "a draft model was asked for, but none was set (Transcriber::set_draft)".into(),
            )
        })?;
        draft
            .drafter
            .model_mut()
            .encode(own_mel.as_ref().unwrap_or(mel))?;
        Ok(start.elapsed())
    }

    /// Measures the target's one-token step on the encoded window once per draft, for the
    /// cost-aware policy (a few forwards, leaving the cache empty).
    pub(super) fn measure_greedy_step(&mut self) -> Result<()> {
        let Some(draft) = self.draft.as_mut() else {
            return Ok(());
        };
        if draft.economics.greedy_step.is_none() {
            let costs = ForwardCosts::measure(&mut self.model, 1, 3)?;
            draft.economics.greedy_step = Some(costs.cost(1));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
