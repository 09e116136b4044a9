//! Streaming partial transcripts: audio arrives in chunks, and after each one the growing
//! window is encoded again and decoded greedily. The previous partial is a free draft: the
//! prompt and the draft go through the decoder in one forward, the longest prefix of the draft
//! that greedy decoding would have produced is kept (Whisper's logit rules applied to every
//! row), and decoding continues from the first correction. Forwards of up to
//! [`spec_nn::ROW_ATTENTION_MAX_ROWS`] rows give every row exactly its single-token logits, so
//! each partial is the very transcript greedy decoding from scratch gives (tested) — at a
//! fraction of the decoder forwards, since consecutive partials mostly agree.
//!
//! A partial holds at most [`MAX_TOKENS_PER_SECOND`] tokens per second of audio (plus a few):
//! more than speech can carry, so the limit only stops a greedy repetition loop ("5 5 5 …"),
//! which on a partial window would otherwise run to the decoder's length limit at every
//! update (Whisper's remedy, the temperature fallback, is not used for partials).

use std::time::{Duration, Instant};

use spec_core::{AcceptanceRule, Decoder, PreviousOutput, Verification};
use spec_nn::ROW_ATTENTION_MAX_ROWS;

use crate::audio::check_finite;
use crate::mel::{WhisperInput, HOP};
use crate::whisper::alignment::{
    merge_punctuations, WordTiming, APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS,
};
use crate::whisper::decode::{speculative_window, Candidate};
use crate::whisper::{TranscribeOptions, Transcriber};
use crate::{Error, Result, SAMPLE_RATE};

/// Most tokens a partial holds per second of its window's audio: fast speech is about 5 words,
/// 7 tokens, per second. See [`StreamingTranscriber::with_token_limit`].
pub const MAX_TOKENS_PER_SECOND: f64 = 12.0;

/// Tokens a partial may hold beyond [`MAX_TOKENS_PER_SECOND`] (a short window's punctuation).
const TOKEN_ALLOWANCE: usize = 8;

/// What the recognizer reports after new audio: the stream's transcript so far with what it
/// cost. The voice pipeline stamps it on the session's clock as the one partial-transcript
/// type, `spec_voice::Partial`.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamUpdate {
    /// Text of the whole stream so far (committed windows and the current one).
    pub text: String,
    /// Tokens of the current window.
    pub tokens: Vec<u32>,
    /// Seconds of audio the update covers.
    pub audio_seconds: f64,
    /// Compute time of this update (encoding and decoding).
    pub latency: Duration,
    /// Tokens of the previous update the decoder confirmed.
    pub accepted_draft: usize,
    /// Decoder forwards spent on this update.
    pub forwards: usize,
}

/// Totals over a stream.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamStats {
    pub partials: usize,
    pub encoder_time: Duration,
    pub decoder_time: Duration,
    pub forwards: usize,
    /// Draft tokens offered and confirmed.
    pub drafted: usize,
    pub accepted: usize,
}

/// Partial transcripts of a stream of 16 kHz mono audio.
#[derive(Debug)]
pub struct StreamingTranscriber {
    transcriber: Transcriber,
    options: TranscribeOptions,
    /// Audio of the current window (since `window_start`).
    samples: Vec<f32>,
    /// Stream time of the current window's first sample, in samples.
    window_start: usize,
    /// Text of the windows already committed.
    committed: String,
    /// The last partial's tokens: the next partial's draft.
    draft: Vec<u32>,
    /// The last partial's text of the current window.
    window_text: String,
    language: Option<String>,
    stats: StreamStats,
    /// Tokens per second of audio a partial may hold (`None`: the decoder's own limit).
    tokens_per_second: Option<f64>,
    /// Audio frames of the window the model holds encoded, when the last partial encoded the
    /// current window.
    encoded_frames: Option<usize>,
}

impl StreamingTranscriber {
    /// A stream decoded with `options` (greedy: `beam_size` 1; the temperature fallback is
    /// not used for partials).
    pub fn new(transcriber: Transcriber, options: TranscribeOptions) -> Result<Self> {
        if options.beam_size > 1 {
            return Err(Error::Config(
                "streaming partials decode greedily (beam_size 1)".into(),
            ));
        }
        let language = options.language.clone();
        Ok(Self {
            transcriber,
            options,
            samples: Vec::new(),
            window_start: 0,
            committed: String::new(),
            draft: Vec::new(),
            window_text: String::new(),
            language,
            stats: StreamStats::default(),
            tokens_per_second: Some(MAX_TOKENS_PER_SECOND),
            encoded_frames: None,
        })
    }

    /// Sets the most tokens a partial holds per second of audio (default
    /// [`MAX_TOKENS_PER_SECOND`]); `None` decodes up to the decoder's own limit, so every
    /// partial is exactly the greedy transcript of the audio so far, repetition loops included.
    pub fn with_token_limit(mut self, tokens_per_second: Option<f64>) -> Result<Self> {
        if tokens_per_second.is_some_and(|rate| !(rate > 0.0 && rate.is_finite())) {
            return Err(Error::Config(format!(
                "a partial's token limit must be a positive rate, got {tokens_per_second:?}"
            )));
        }
        self.tokens_per_second = tokens_per_second;
        Ok(self)
    }

    pub fn stats(&self) -> &StreamStats {
        &self.stats
    }

    /// Gives the transcriber back.
    pub fn into_inner(self) -> Transcriber {
        self.transcriber
    }

    /// Appends `chunk` and returns the partial transcript of everything received (`None`
    /// while the window holds too little audio for one spectrogram frame). A chunk with a NaN
    /// or infinite sample is refused whole ([`Error::NonFiniteSample`], indexed in the chunk).
    pub fn push(&mut self, chunk: &[f32]) -> Result<Option<StreamUpdate>> {
        check_finite(chunk)?;
        let window_samples = self.transcriber.model().config().window_frames() * HOP;
        let mut rest = chunk;
        let mut last = None;
        while !rest.is_empty() {
            let room = window_samples - self.samples.len();
            let (now, later) = rest.split_at(rest.len().min(room));
            self.samples.extend_from_slice(now);
            rest = later;
            if self.samples.len() == window_samples || rest.is_empty() {
                last = self.partial()?;
            }
            if self.samples.len() == window_samples {
                self.commit();
            }
        }
        Ok(last)
    }

    /// Ends the stream: the full text.
    pub fn finish(mut self) -> Result<(String, StreamStats)> {
        if !self.samples.is_empty() {
            self.partial()?;
            self.commit();
        }
        Ok((self.committed.trim().to_string(), self.stats))
    }

    /// The current window's text becomes final; the next window starts empty.
    fn commit(&mut self) {
        self.committed
            .push_str(&std::mem::take(&mut self.window_text));
        self.window_start += self.samples.len();
        self.samples.clear();
        self.draft.clear();
        self.encoded_frames = None;
    }

    /// The last word of the newest partial, with Whisper's probability of it and its times in
    /// seconds of the stream: one teacher-forced decoder forward over the window that partial
    /// encoded ([`Transcriber::align_words`]). `None` when the current window has no partial
    /// yet or no words. Whisper often "hears" a short word in the silence after speech ("I'd
    /// like to book a table for us.", where the speaker paused after "for"); such a word is far
    /// less probable than the words spoken (0.22 there against 0.92–1.0).
    pub fn last_word(&mut self) -> Result<Option<WordTiming>> {
        let Some(frames) = self.encoded_frames else {
            return Ok(None);
        };
        let mut words = self.transcriber.align_words(
            &self.draft,
            frames,
            &self.options,
            self.language.as_deref(),
        )?;
        merge_punctuations(&mut words, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS);
        let offset = self.window_start as f64 / f64::from(SAMPLE_RATE);
        let last = words.into_iter().rev().find(|word| !word.tokens.is_empty());
        Ok(last.map(|word| WordTiming {
            start: word.start + offset,
            end: word.end + offset,
            ..word
        }))
    }

    fn partial(&mut self) -> Result<Option<StreamUpdate>> {
        if self.samples.len() <= crate::mel::N_FFT / 2 {
            return Ok(None);
        }
        let start = Instant::now();
        let mut input = WhisperInput::from_samples(&self.samples, self.transcriber.filters())?;
        let audio_frames = input
            .content_frames()
            .min(self.transcriber.model().config().window_frames());
        let window = input.window(0)?;
        self.encoded_frames = None;
        let mel = self
            .transcriber
            .encoder_input(window, audio_frames, self.options.encoder_length);
        self.stats.encoder_time += self.transcriber.encode(&mel)?;
        self.encoded_frames = Some(audio_frames);
        let decode_start = Instant::now();
        if self.language.is_none() {
            self.language = Some(self.transcriber.detect_language()?);
        }
        let (prompt, _) = self
            .transcriber
            .prompt(&self.options, self.language.as_deref(), &[])?;
        let draft = std::mem::take(&mut self.draft);
        let (candidate, accepted) = self.decode_with_draft(&prompt, &draft)?;
        self.stats.decoder_time += decode_start.elapsed();
        self.stats.partials += 1;
        self.stats.forwards += candidate.forwards;
        self.stats.drafted += draft.len();
        self.stats.accepted += accepted;
        self.window_text = self.transcriber.tokenizer().decode(&candidate.tokens)?;
        self.draft = candidate.tokens.clone();
        Ok(Some(StreamUpdate {
            text: format!("{}{}", self.committed, self.window_text)
                .trim()
                .to_string(),
            tokens: candidate.tokens,
            audio_seconds: (self.window_start + self.samples.len()) as f64 / SAMPLE_RATE as f64,
            latency: start.elapsed(),
            accepted_draft: accepted,
            forwards: candidate.forwards,
        }))
    }

    /// Greedy decoding of the encoded window after `prompt`, verifying `draft` first: the
    /// previous partial is verified in the prompt's forward, and in forwards of at most
    /// [`ROW_ATTENTION_MAX_ROWS`] rows, so each row is bit-identical to decoding its token
    /// alone. Returns the decoded candidate and how many draft tokens it kept.
    fn decode_with_draft(&mut self, prompt: &[u32], draft: &[u32]) -> Result<(Candidate, usize)> {
        let rules = self.transcriber.rules(&self.options);
        let end = self.transcriber.tokenizer().end_of_text;
        let model = self.transcriber.model();
        let mut max_tokens = model.config().max_target_positions / 2;
        if let Some(rate) = self.tokens_per_second {
            let seconds = self.samples.len() as f64 / f64::from(SAMPLE_RATE);
            // The cast saturates: a huge rate leaves the decoder's own limit.
            let rate_limit = TOKEN_ALLOWANCE.saturating_add((rate * seconds).ceil() as usize);
            max_tokens = max_tokens.min(rate_limit);
        }
        let draft = &draft[..draft.len().min(max_tokens)];
        let mut previous =
            PreviousOutput::new(draft.to_vec()).with_max_rows(ROW_ATTENTION_MAX_ROWS)?;
        model.reset();
        let (candidate, _) = speculative_window(
            model,
            &rules,
            &mut previous,
            &AcceptanceRule::greedy(),
            Verification::OnDemand,
            prompt,
            None,
            end,
            max_tokens,
        )?;
        let accepted = previous.kept(&candidate.tokens);
        Ok((candidate, accepted))
    }
}
