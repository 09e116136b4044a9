//! Transcribing a recording: 30-second windows with seek, the prompt (previous text, start of
//! transcript, language, task, timestamps), the temperature fallback, no-speech detection and
//! timestamped segments, following Whisper's `transcribe` (Radford et al., 2022, §4.5).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::Tensor;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::Deserialize;
use spec_core::decoder::forward_tokens;
use spec_core::heads::{HeadsDrafter, HiddenStates};
use spec_core::{AcceptanceRule, DecodeStats, Decoder, LogitRows, SpecAsrConfig};
use spec_core::{TreeDrafter, Verification};
use spec_nn::heads::MultiTokenHeads;

use crate::audio::{SampleSource, Samples};
use crate::mel::{LogMel, MelFilters, WhisperInput, N_FFT};
use crate::vad::{speech_spans, SileroVad, SpeechOnly, SpeechOptions, SpeechTimeline};
use crate::whisper::alignment::Word;
use crate::whisper::decode::{
    beam_window, compression_ratio, heads_window, run_prompt, sample_window, speculative_window,
    Candidate,
};
use crate::whisper::load::LoadOptions;
use crate::whisper::model::Whisper;
use crate::whisper::rules::LogitRules;
use crate::whisper::tokenizer::WhisperTokenizer;
use crate::{Error, Result};

mod drafts;
mod words;

use drafts::{TextDrafter, WhisperDraft};

/// Mel frames per second.
const FRAMES_PER_SECOND: f32 = 100.0;

/// Transcribe speech in its language, or translate it to English.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Task {
    #[default]
    Transcribe,
    Translate,
}

/// How much of a window the encoder reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderLength {
    /// All 30 s, padding included (Whisper's training condition; what faster-whisper does).
    Full,
    /// The audio in the window plus `margin_frames` of padding (whisper.cpp's `audio_ctx`): a
    /// 3 s clip costs under half the encoder work. With too little padding the decoder does
    /// not see the speech end and loops (tiny.en with 5 s: 248 % WER on the real clips); a
    /// window still looping after the temperature fallback is decoded again from all 30 s.
    Audio { margin_frames: usize },
}

impl Default for EncoderLength {
    /// The audio and 10 s of padding: measured (`cargo xtask bench asr`) at the WER of the
    /// 30-second encoder on 609 words of real and synthetic speech (word errors: tiny.en 124
    /// against 120 with the full window and 122 / 126 for faster-whisper int8 / float32; base
    /// 113 against 139 and 129 / 123), for 40–60 % of its time on short clips.
    fn default() -> Self {
        Self::Audio {
            margin_frames: 1000,
        }
    }
}

/// Decoding settings; the defaults are Whisper's, with greedy search (the setting the
/// speculative methods accelerate losslessly) and the audio-length encoder
/// ([`EncoderLength::default`]).
#[derive(Clone, Debug)]
pub struct TranscribeOptions {
    /// Language code (`en`, `de`, …); `None` detects it on multilingual models.
    pub language: Option<String>,
    pub task: Task,
    /// Predict timestamps and split the text into timed segments. Recordings longer than one
    /// window are always decoded with timestamps (the seek follows them).
    pub timestamps: bool,
    /// Beams at temperature 0; 1 is greedy.
    pub beam_size: usize,
    /// Samples drawn at each temperature above 0.
    pub best_of: usize,
    /// Temperatures tried in turn until a decoding passes the thresholds: finite and at least
    /// 0, where 0 decodes greedily (or by beam search).
    pub temperatures: Vec<f32>,
    /// A window whose text compresses better than this is a repetition loop: retry.
    pub compression_ratio_threshold: Option<f32>,
    /// A window whose average log-probability is below this is unreliable: retry.
    pub log_prob_threshold: Option<f32>,
    /// With a low average log-probability, a window this likely to be silence is skipped.
    pub no_speech_threshold: Option<f32>,
    /// Latest first timestamp of a window, in seconds.
    pub max_initial_timestamp: Option<f32>,
    /// Put the previous window's text in the prompt.
    pub condition_on_previous_text: bool,
    /// Text put in the first window's prompt as if it had been said before (Whisper's
    /// `initial_prompt`: names, spellings, a style to follow).
    pub initial_prompt: Option<String>,
    pub encoder_length: EncoderLength,
    /// Seed of the sampler used by the temperature fallback.
    pub seed: u64,
    /// Decode greedy windows (temperature 0, one beam) with the prediction heads given to
    /// [`Transcriber::set_heads`], keeping what this rule accepts: greedy acceptance gives
    /// exactly the greedy transcript in fewer decoder forwards; top-k and threshold accept more.
    pub heads: Option<AcceptanceRule>,
    /// Decode greedy windows (temperature 0, one beam) by SpecASR with the draft model given
    /// to [`Transcriber::set_draft`], drafting as this says; verification is greedy, so the
    /// transcript is exactly the greedy one.
    pub draft: Option<SpecAsrConfig>,
    /// Time every word of the segments ([`Segment::words`]) from the cross-attention of the
    /// model's alignment heads, as Whisper and faster-whisper do; the segments' spans move to
    /// their words, and past a window the seek follows the last word.
    pub word_timestamps: bool,
}

impl Default for TranscribeOptions {
    fn default() -> Self {
        Self {
            language: None,
            task: Task::Transcribe,
            timestamps: false,
            beam_size: 1,
            best_of: 5,
            temperatures: vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
            compression_ratio_threshold: Some(2.4),
            log_prob_threshold: Some(-1.0),
            no_speech_threshold: Some(0.6),
            max_initial_timestamp: Some(1.0),
            condition_on_previous_text: true,
            initial_prompt: None,
            encoder_length: EncoderLength::default(),
            seed: 0,
            heads: None,
            draft: None,
            word_timestamps: false,
        }
    }
}

/// A piece of the transcript with its time span (whole windows without timestamps).
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub start: f32,
    pub end: f32,
    pub text: String,
    pub tokens: Vec<u32>,
    pub temperature: f32,
    pub avg_logprob: f32,
    pub compression_ratio: f32,
    pub no_speech_probability: f32,
    /// The words with their times ([`TranscribeOptions::word_timestamps`]; empty otherwise).
    pub words: Vec<Word>,
}

/// Where the time went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TranscriptStats {
    /// The log-mel spectrogram.
    pub front_end_time: Duration,
    /// Finding the speech ([`Transcriber::transcribe_speech`]).
    pub vad_time: Duration,
    pub encoder_time: Duration,
    /// The draft model's encoder (SpecASR).
    pub draft_encoder_time: Duration,
    /// Windows decoded with the draft (fewer than asked when the cost-aware policy found that
    /// drafting does not pay).
    pub drafted_windows: usize,
    pub decoder_time: Duration,
    /// Decoder forwards (prompt, each token, each beam step).
    pub forwards: usize,
    /// Tokens in the transcript.
    pub tokens: usize,
    pub windows: usize,
    /// Decodings retried at a higher temperature.
    pub fallbacks: usize,
    /// Windows decoded with prediction heads: their steps (tree nodes offered, accepted), the
    /// heads' time (`draft_time`) and the verifying forwards' time (`target_time`).
    pub heads: DecodeStats,
    /// Windows decoded by SpecASR: their steps, the draft's time and forwards (`draft_time`,
    /// `draft_forwards`) and the verifying forwards' (`target_time`).
    pub draft: DecodeStats,
}

impl TranscriptStats {
    /// VAD, front end, encoders and decoder together.
    pub fn total_time(&self) -> Duration {
        self.vad_time
            + self.front_end_time
            + self.encoder_time
            + self.draft_encoder_time
            + self.decoder_time
    }
}

/// A transcription.
#[derive(Clone, Debug, PartialEq)]
pub struct Transcript {
    pub text: String,
    pub segments: Vec<Segment>,
    pub language: Option<String>,
    pub stats: TranscriptStats,
}

/// The suppression lists of a model folder: CTranslate2's `config.json` (`suppress_ids`,
/// `suppress_ids_begin`) or Hugging Face's `generation_config.json` (`suppress_tokens`,
/// `begin_suppress_tokens`).
#[derive(Clone, Debug, Default, Deserialize)]
struct Suppression {
    #[serde(alias = "suppress_tokens", default)]
    suppress_ids: Vec<u32>,
    #[serde(alias = "begin_suppress_tokens", default)]
    suppress_ids_begin: Vec<u32>,
}

impl Suppression {
    fn read(folder: &Path) -> Result<Self> {
        for (path, config) in folder_configs(folder)? {
            let found: Suppression = serde_json::from_value(config)
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            if !found.suppress_ids.is_empty() || !found.suppress_ids_begin.is_empty() {
                return Ok(found);
            }
        }
        Ok(Self::default())
    }
}

/// The JSON of the configuration files of a model folder that has them, with their paths:
/// Hugging Face's `generation_config.json`, then `config.json` (Hugging Face's or
/// CTranslate2's).
fn folder_configs(folder: &Path) -> Result<Vec<(PathBuf, serde_json::Value)>> {
    let mut configs = Vec::new();
    for name in ["generation_config.json", "config.json"] {
        let path = folder.join(name);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let config = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        configs.push((path, config));
    }
    Ok(configs)
}

/// One decoding of a window at one temperature of the fallback.
struct Attempt {
    candidate: Candidate,
    temperature: f32,
    no_speech: f32,
    /// A compression-ratio threshold is set and the text compresses no better than it.
    below_compression_threshold: bool,
}

/// The attempt kept when every temperature failed the checks, as faster-whisper's
/// `generate_with_fallback` keeps it: the best average log-probability among the attempts
/// that passed the compression-ratio check, or among all of them if none did (the first of
/// equals).
fn best_failed_attempt(attempts: &[Attempt]) -> usize {
    let passed: Vec<usize> = (0..attempts.len())
        .filter(|&i| attempts[i].below_compression_threshold)
        .collect();
    let pool = if passed.is_empty() {
        (0..attempts.len()).collect()
    } else {
        passed
    };
    let mut best = pool[0];
    for &i in &pool[1..] {
        if attempts[i].candidate.avg_logprob() > attempts[best].candidate.avg_logprob() {
            best = i;
        }
    }
    best
}

/// Whether a decoded window is skipped as silence: likely no speech, unless the text is
/// probable enough (faster-whisper's `generate_segments`: a no-speech probability above its
/// threshold, and no average log-probability above the log-probability threshold).
fn is_silence(options: &TranscribeOptions, no_speech: f32, avg_logprob: f32) -> bool {
    options.no_speech_threshold.is_some_and(|t| no_speech > t)
        && !options.log_prob_threshold.is_some_and(|t| avg_logprob > t)
}

/// A Whisper model with its tokenizer and mel filters: audio in, text out.
#[derive(Debug)]
pub struct Transcriber {
    model: Whisper,
    tokenizer: WhisperTokenizer,
    filters: MelFilters,
    suppression: Suppression,
    heads: Option<HeadsDrafter<MultiTokenHeads>>,
    draft: Option<WhisperDraft>,
}

impl Transcriber {
    /// Loads `folder` (`model.bin` or `model.safetensors` + `config.json`, with
    /// `tokenizer.json`). A tokenizer that does not number the special tokens the folder's
    /// configuration names as it does is refused
    /// ([`WhisperTokenizer::check_configured_tokens`]).
    pub fn load(folder: &Path, options: &LoadOptions) -> Result<Self> {
        let model = Whisper::load(folder, options)?;
        let tokenizer = WhisperTokenizer::from_file(&folder.join("tokenizer.json"))?;
        let suppression = Suppression::read(folder)?;
        let transcriber = Self::new(
            model,
            tokenizer,
            suppression.suppress_ids,
            suppression.suppress_ids_begin,
        )?;
        for (path, config) in folder_configs(folder)? {
            transcriber
                .tokenizer
                .check_configured_tokens(&path, &config)?;
        }
        Ok(transcriber)
    }

    /// From parts: `suppress` are the always-suppressed ids, `suppress_at_start` those blocked
    /// at a window's first step. A tokenizer of another Whisper vocabulary is refused
    /// ([`WhisperTokenizer::check_fits_vocabulary`]).
    pub fn new(
        model: Whisper,
        tokenizer: WhisperTokenizer,
        suppress: Vec<u32>,
        suppress_at_start: Vec<u32>,
    ) -> Result<Self> {
        if tokenizer.timestamp_begin as usize >= model.config().vocab_size {
            return Err(Error::Config(format!(
                "the tokenizer's timestamps start at {}, past the model's vocabulary of {}",
                tokenizer.timestamp_begin,
                model.config().vocab_size
            )));
        }
        // Whisper suppresses a blank and the end of text at a window's start, so a model's
        // list without this tokenizer's end of text was made for another tokenizer (the
        // multilingual one numbers every special token one above the English-only one's).
        if !suppress_at_start.is_empty() && !suppress_at_start.contains(&tokenizer.end_of_text) {
            return Err(Error::Config(format!(
                "the model suppresses {suppress_at_start:?} at a window's start, Whisper's blank \
                 and end of text, but the tokenizer's end of text is {}: a tokenizer of another \
                 Whisper model?",
                tokenizer.end_of_text
            )));
        }
        tokenizer.check_fits_vocabulary(model.config().vocab_size)?;
        let filters = MelFilters::new(model.config().n_mels)?;
        Ok(Self {
            model,
            tokenizer,
            filters,
            suppression: Suppression {
                suppress_ids: suppress,
                suppress_ids_begin: suppress_at_start,
            },
            heads: None,
            draft: None,
        })
    }

    pub fn model(&mut self) -> &mut Whisper {
        &mut self.model
    }

    pub fn tokenizer(&self) -> &WhisperTokenizer {
        &self.tokenizer
    }

    pub fn filters(&self) -> &MelFilters {
        &self.filters
    }

    /// The logit rules of `options`.
    pub fn rules(&self, options: &TranscribeOptions) -> LogitRules {
        LogitRules::new(
            &self.tokenizer,
            &self.suppression.suppress_ids,
            &self.suppression.suppress_ids_begin,
            options.timestamps,
            options.max_initial_timestamp,
        )
    }

    /// The first `frames` frames of `window` (an even number, at most the window), for the
    /// encoder's real-length mode.
    pub fn encoder_input(
        &self,
        window: LogMel,
        audio_frames: usize,
        length: EncoderLength,
    ) -> LogMel {
        let full = window.frames.min(self.model.config().window_frames());
        let frames = match length {
            EncoderLength::Full => full,
            EncoderLength::Audio { margin_frames } => {
                // Saturating: a huge margin means the whole window.
                let wanted = audio_frames.saturating_add(margin_frames);
                wanted.saturating_add(wanted % 2).min(full)
            }
        };
        if frames == window.frames {
            return window;
        }
        let data = (0..window.n_mels)
            .flat_map(|m| &window.row(m)[..frames])
            .copied()
            .collect();
        LogMel {
            n_mels: window.n_mels,
            frames,
            data,
        }
    }

    /// Encodes `mel` and returns the time it took.
    pub fn encode(&mut self, mel: &LogMel) -> Result<Duration> {
        let start = Instant::now();
        self.model.encode(mel)?;
        Ok(start.elapsed())
    }

    /// The most likely language of the encoded window.
    pub fn detect_language(&mut self) -> Result<String> {
        if !self.model.config().is_multilingual() {
            return Ok("en".into());
        }
        self.model.reset();
        let sot = self.tokenizer.start_of_transcript;
        let logits = forward_tokens(&mut self.model, &[sot], LogitRows::Last(1))?;
        let row = logits.row(0);
        self.tokenizer
            .languages()
            .iter()
            .filter(|(_, t)| (*t as usize) < row.len())
            .max_by(|a, b| row[a.1 as usize].total_cmp(&row[b.1 as usize]))
            .map(|(code, _)| code.to_string())
            .ok_or_else(|| Error::Config("the tokenizer has no language tokens".into()))
    }

    /// The decoder prompt and the index of its start-of-transcript token.
    pub fn prompt(
        &self,
        options: &TranscribeOptions,
        language: Option<&str>,
        previous: &[u32],
    ) -> Result<(Vec<u32>, usize)> {
        let t = &self.tokenizer;
        let mut prompt = Vec::new();
        if !previous.is_empty() {
            let keep = self.model.config().max_target_positions / 2 - 1;
            prompt.push(t.start_of_previous);
            prompt.extend_from_slice(&previous[previous.len().saturating_sub(keep)..]);
        }
        let start_of_transcript_index = prompt.len();
        prompt.push(t.start_of_transcript);
        if self.model.config().is_multilingual() {
            prompt.push(t.language(language.unwrap_or("en"))?);
            prompt.push(match options.task {
                Task::Transcribe => t.transcribe,
                Task::Translate => t.translate,
            });
        } else if options.task == Task::Translate {
            return Err(Error::Language(
                "this model is English-only: it transcribes English and cannot translate \
                 (use a multilingual model such as whisper-base)"
                    .into(),
            ));
        } else if let Some(other) = language.filter(|&l| l != "en") {
            return Err(Error::Language(format!(
                "this model is English-only: it cannot transcribe `{other}` \
                 (use a multilingual model such as whisper-base)"
            )));
        }
        if !options.timestamps {
            prompt.push(t.no_timestamps);
        }
        Ok((prompt, start_of_transcript_index))
    }

    /// Decodes the encoded window after `prompt`, falling back to higher temperatures while
    /// the result looks like a repetition loop or is improbable. Returns the accepted
    /// candidate, its temperature, the no-speech probability and the fallbacks taken.
    /// Heads-decoded windows add their steps to `heads`, draft-decoded ones to `draft_stats`.
    pub fn decode_window(
        &mut self,
        options: &TranscribeOptions,
        prompt: &[u32],
        start_of_transcript_index: usize,
        rng: &mut StdRng,
        heads: &mut DecodeStats,
        draft_stats: &mut DecodeStats,
    ) -> Result<(Candidate, f32, f32, usize)> {
        if options.heads.is_some() && options.draft.is_some() {
            return Err(Error::Config(
                "decode with heads or with a draft model, not both".into(),
            ));
        }
        if let Some(bad) = options
            .temperatures
            .iter()
            .find(|t| !(t.is_finite() && **t >= 0.0))
        {
            return Err(Error::Config(format!(
                "temperatures must be finite and at least 0 (0 decodes greedily), got {bad} in {:?}",
                options.temperatures
            )));
        }
        let rules = self.rules(options);
        let end = self.tokenizer.end_of_text;
        let max_tokens = self.model.config().max_target_positions / 2;
        let temperatures = if options.temperatures.is_empty() {
            vec![0.0]
        } else {
            options.temperatures.clone()
        };
        let mut attempts: Vec<Attempt> = Vec::with_capacity(temperatures.len());
        for (attempt, &temperature) in temperatures.iter().enumerate() {
            let (no_speech, next) = run_prompt(
                &mut self.model,
                prompt,
                start_of_transcript_index,
                self.tokenizer.no_speech,
            )?;
            let candidate = if temperature > 0.0 {
                let mut best: Option<Candidate> = None;
                for _ in 0..options.best_of.max(1) {
                    self.model.truncate(prompt.len())?;
                    let c = sample_window(
                        &mut self.model,
                        &rules,
                        next.clone(),
                        end,
                        max_tokens,
                        temperature,
                        rng,
                    )?;
                    let score = |c: &Candidate| c.sum_logprob / c.tokens.len().max(1) as f32;
                    if best.as_ref().is_none_or(|b| score(&c) > score(b)) {
                        best = Some(c);
                    }
                }
                best.expect("at least one sample")
            } else if options.beam_size > 1 {
                beam_window(
                    &mut self.model,
                    &rules,
                    next,
                    end,
                    max_tokens,
                    options.beam_size,
                )?
            } else if let Some(config) = options.draft {
                let draft = self.draft.as_mut().ok_or_else(|| {
                    Error::Config(
                        "decoding with a draft model was asked for, but none was set \
                         (Transcriber::set_draft)"
                            .into(),
                    )
                })?;
                let drafter = &mut draft.drafter;
                let config = if draft.text.is_some() {
                    SpecAsrConfig {
                        branches: 0,
                        ..config
                    }
                } else {
                    config
                };
                if *drafter.config() != config {
                    drafter.set_config(config)?;
                }
                drafter.forget();
                let mut text;
                let drafting: &mut dyn TreeDrafter = match &draft.text {
                    Some((draft_tokenizer, suppression)) => {
                        text = TextDrafter::new(
                            drafter,
                            draft_tokenizer,
                            suppression,
                            &self.tokenizer,
                            options.language.as_deref(),
                        )?;
                        &mut text
                    }
                    None => {
                        let prompt_len = prompt.len();
                        let draft_rules = rules.clone();
                        drafter.set_adjust(Some(Box::new(move |sequence, row| {
                            draft_rules.apply(row, &sequence[prompt_len..]);
                        })));
                        drafter
                    }
                };
                let (candidate, steps) = speculative_window(
                    &mut self.model,
                    &rules,
                    drafting,
                    &AcceptanceRule::greedy(),
                    Verification::OnDemand,
                    prompt,
                    Some(next),
                    end,
                    max_tokens,
                )?;
                draft.drafter.set_adjust(None);
                draft_stats.merge(&steps);
                candidate
            } else if let Some(rule) = &options.heads {
                let drafter = self.heads.as_ref().ok_or_else(|| {
                    Error::Config(
                        "decoding with heads was asked for, but no heads were set \
                         (Transcriber::set_heads)"
                            .into(),
                    )
                })?;
                let (candidate, steps) = heads_window(
                    &mut self.model,
                    &rules,
                    drafter,
                    rule,
                    next,
                    end,
                    max_tokens,
                )?;
                heads.merge(&steps);
                candidate
            } else {
                sample_window(&mut self.model, &rules, next, end, max_tokens, 0.0, rng)?
            };
            let text = self.tokenizer.decode(&candidate.tokens)?;
            let ratio = compression_ratio(text.trim());
            let too_repetitive = options
                .compression_ratio_threshold
                .is_some_and(|t| ratio > t);
            let improbable = options
                .log_prob_threshold
                .is_some_and(|t| candidate.avg_logprob() < t);
            let silent = options
                .no_speech_threshold
                .is_some_and(|t| no_speech > t && improbable);
            let done = silent || !(too_repetitive || improbable);
            attempts.push(Attempt {
                candidate,
                temperature,
                no_speech,
                below_compression_threshold: options
                    .compression_ratio_threshold
                    .is_some_and(|_| !too_repetitive),
            });
            if done {
                let last = attempts.pop().expect("just pushed");
                return Ok((last.candidate, last.temperature, last.no_speech, attempt));
            }
        }
        let fallbacks = attempts.len() - 1;
        let best = attempts.swap_remove(best_failed_attempt(&attempts));
        Ok((best.candidate, best.temperature, best.no_speech, fallbacks))
    }

    /// Whether the decoded text compresses better than the compression-ratio threshold allows.
    fn is_repetition_loop(
        &self,
        options: &TranscribeOptions,
        candidate: &Candidate,
    ) -> Result<bool> {
        let Some(threshold) = options.compression_ratio_threshold else {
            return Ok(false);
        };
        let text = self.tokenizer.decode(&candidate.tokens)?;
        Ok(compression_ratio(text.trim()) > threshold)
    }

    /// Transcribes 16 kHz mono `samples`.
    pub fn transcribe(
        &mut self,
        samples: &[f32],
        options: &TranscribeOptions,
    ) -> Result<Transcript> {
        self.transcribe_source(Samples::new(samples), options)
    }

    /// Transcribes only the speech of a recording (faster-whisper's `vad_filter`): Silero VAD
    /// finds the speech spans ([`speech_spans`], one reading of `source`), the spans are
    /// joined and transcribed as one recording ([`Transcriber::transcribe_source`]), and the
    /// times of segments and words are mapped back to the recording's. A recording without
    /// speech gives an empty transcript.
    pub fn transcribe_speech<S: SampleSource>(
        &mut self,
        mut source: S,
        vad: &mut SileroVad,
        speech: &SpeechOptions,
        options: &TranscribeOptions,
    ) -> Result<Transcript> {
        let vad_start = Instant::now();
        let (spans, _) = speech_spans(vad, &mut source, speech)?;
        let vad_time = vad_start.elapsed();
        source.rewind()?;
        let joined = SpeechOnly::new(source, spans.clone());
        if joined.len() <= N_FFT / 2 {
            return Ok(Transcript {
                text: String::new(),
                segments: Vec::new(),
                language: options.language.clone(),
                stats: TranscriptStats {
                    vad_time,
                    ..TranscriptStats::default()
                },
            });
        }
        let mut transcript = self.transcribe_source(joined, options)?;
        transcript.stats.vad_time = vad_time;
        let timeline = SpeechTimeline::new(&spans);
        for segment in &mut transcript.segments {
            if !segment.words.is_empty() {
                for word in &mut segment.words {
                    // A word's start and end are mapped through the span of its middle.
                    let span = timeline.span_of((word.start + word.end) / 2.0, false);
                    word.start = timeline.original_time(word.start, span);
                    word.end = timeline.original_time(word.end, span);
                }
                segment.start = segment.words[0].start;
                segment.end = segment.words[segment.words.len() - 1].end;
            } else {
                segment.start =
                    timeline.original_time(segment.start, timeline.span_of(segment.start, false));
                segment.end =
                    timeline.original_time(segment.end, timeline.span_of(segment.end, true));
            }
        }
        Ok(transcript)
    }

    /// Transcribes a recording of any length read from `source` (16 kHz mono), window by
    /// window: memory is bounded by the 30-second window, not by the recording.
    pub fn transcribe_source<S: SampleSource>(
        &mut self,
        source: S,
        options: &TranscribeOptions,
    ) -> Result<Transcript> {
        let front_end_start = Instant::now();
        // A draft with other mel bins (large-v3's 128) reads the recording through its
        // filters too (the input's second bank).
        let draft_bank = match &self.draft {
            Some(draft)
                if options.draft.is_some() && draft.filters.n_mels() != self.filters.n_mels() =>
            {
                Some(draft.filters.clone())
            }
            _ => None,
        };
        let banks: Vec<MelFilters> = std::iter::once(self.filters.clone())
            .chain(draft_bank.clone())
            .collect();
        let mut input = WhisperInput::new(source, &banks)?;
        let mut front_end_time = front_end_start.elapsed();
        let window_frames = self.model.config().window_frames();
        let content = input.content_frames();
        // Past one window the seek follows the last timestamp (a window's text can end before
        // its audio does): long recordings are decoded with timestamps whatever was asked.
        let long_form;
        let options = if content > window_frames && !options.timestamps {
            long_form = TranscribeOptions {
                timestamps: true,
                ..options.clone()
            };
            &long_form
        } else {
            options
        };
        let mut rng = StdRng::seed_from_u64(options.seed);
        let mut stats = TranscriptStats::default();
        let mut segments = Vec::new();
        let mut previous: Vec<u32> = match options.initial_prompt.as_deref().map(str::trim) {
            Some(text) if !text.is_empty() => self.tokenizer.encode(&format!(" {text}"))?,
            _ => Vec::new(),
        };
        let mut language = options.language.clone();
        let mut seek = 0;
        while seek < content {
            let audio_frames = (content - seek).min(window_frames);
            let window_start_time = Instant::now();
            let window = input.window(seek)?;
            let draft_window = match draft_bank {
                Some(_) => Some(input.window_of_bank(1, seek)?),
                None => None,
            };
            front_end_time += window_start_time.elapsed();
            let mel = self.encoder_input(window, audio_frames, options.encoder_length);
            let target_encoder_time = self.encode(&mel)?;
            stats.encoder_time += target_encoder_time;
            stats.windows += 1;
            // SpecASR only where it can pay and has paid (the draft's encoder included), if
            // so configured.
            let max_tokens = (self.model.config().max_target_positions / 2 * audio_frames)
                .div_ceil(window_frames);
            let drafting = match (options.draft, &self.draft) {
                (Some(config), Some(draft)) => {
                    !config.cost_aware
                        || (draft.economics.could_pay(
                            max_tokens,
                            target_encoder_time,
                            draft.drafter.model().config().encoder_cost(mel.frames)
                                / self.model.config().encoder_cost(mel.frames),
                        ) && draft.economics.pays())
                }
                (draft, _) => draft.is_some(),
            };
            let draft_encoder_time = if drafting {
                stats.drafted_windows += 1;
                self.encode_draft(&mel, draft_window, audio_frames, options.encoder_length)?
            } else {
                Duration::ZERO
            };
            stats.draft_encoder_time += draft_encoder_time;
            let decode_start = Instant::now();
            if drafting && options.draft.is_some_and(|c| c.cost_aware) {
                self.measure_greedy_step()?;
            }
            let greedy_window;
            let window_options = if drafting || options.draft.is_none() {
                options
            } else {
                greedy_window = TranscribeOptions {
                    draft: None,
                    ..options.clone()
                };
                &greedy_window
            };
            if language.is_none() {
                language = Some(self.detect_language()?);
                stats.forwards += 1;
            }
            let context = if options.condition_on_previous_text || seek == 0 {
                previous.as_slice()
            } else {
                &[]
            };
            let (prompt, sot) = self.prompt(window_options, language.as_deref(), context)?;
            let mut window_draft = DecodeStats::default();
            let (mut candidate, mut temperature, mut no_speech, mut fallbacks) = self
                .decode_window(
                    window_options,
                    &prompt,
                    sot,
                    &mut rng,
                    &mut stats.heads,
                    &mut window_draft,
                )?;
            if let Some(draft) = self.draft.as_mut().filter(|_| options.draft.is_some()) {
                if drafting {
                    draft
                        .economics
                        .observe(&window_draft, draft_encoder_time, target_encoder_time);
                } else {
                    draft
                        .economics
                        .observe_greedy(decode_start.elapsed(), candidate.forwards);
                }
            }
            stats.draft.merge(&window_draft);
            // An encoder cut short of the window can hide where the speech ends: the decoder
            // then repeats the last words at every temperature (tiny.en with 5 s of padding,
            // "10 of clubs" to the length limit). A window still looping after the fallback is
            // decoded again from the whole 30 s, faster-whisper's condition.
            if mel.frames < window_frames && self.is_repetition_loop(options, &candidate)? {
                let full = TranscribeOptions {
                    encoder_length: EncoderLength::Full,
                    draft: None,
                    ..window_options.clone()
                };
                let mel =
                    self.encoder_input(input.window(seek)?, audio_frames, full.encoder_length);
                stats.encoder_time += self.encode(&mel)?;
                stats.forwards += candidate.forwards;
                stats.fallbacks += fallbacks + 1;
                (candidate, temperature, no_speech, fallbacks) = self.decode_window(
                    &full,
                    &prompt,
                    sot,
                    &mut rng,
                    &mut stats.heads,
                    &mut DecodeStats::default(),
                )?;
            }
            stats.decoder_time += decode_start.elapsed();
            stats.forwards += candidate.forwards;
            stats.fallbacks += fallbacks;
            let window_start = seek as f32 / FRAMES_PER_SECOND;
            if is_silence(options, no_speech, candidate.avg_logprob()) {
                seek += audio_frames;
                continue;
            }
            let window_segments = segments.len();
            let mut advance = self.add_segments(
                &candidate,
                temperature,
                no_speech,
                window_start,
                audio_frames,
                &mut segments,
            )?;
            if options.word_timestamps {
                advance = self.add_word_timestamps(
                    &candidate,
                    &mut segments,
                    window_segments,
                    window_start,
                    audio_frames,
                    options,
                    language.as_deref(),
                    advance,
                )?;
            }
            stats.tokens += candidate.tokens.len();
            previous = if temperature < 0.5 {
                candidate
                    .tokens
                    .iter()
                    .copied()
                    .filter(|&t| t < self.tokenizer.end_of_text || self.tokenizer.is_timestamp(t))
                    .collect()
            } else {
                Vec::new()
            };
            seek += advance.max(1);
        }
        let text = segments
            .iter()
            .map(|s| s.text.as_str())
            .collect::<String>()
            .trim()
            .to_string();
        stats.front_end_time = front_end_time;
        Ok(Transcript {
            text,
            segments,
            language,
            stats,
        })
    }

    /// Self-distilled training data for prediction heads from a recording of one window: the
    /// model's own greedy transcript (temperature 0, no fallback), teacher-forced after the
    /// prompt, as `([n + 1, hidden] hidden states, n + 1 next tokens)`: the prompt's last
    /// position and each transcript token, each with the token the model emitted after it
    /// (the transcript, then the end token). `None` when the model heard nothing.
    pub fn self_distill(
        &mut self,
        samples: &[f32],
        options: &TranscribeOptions,
    ) -> Result<Option<(Tensor, Vec<u32>)>> {
        let greedy = TranscribeOptions {
            temperatures: vec![0.0],
            beam_size: 1,
            heads: None,
            ..options.clone()
        };
        let transcript = self.transcribe(samples, &greedy)?;
        if transcript.stats.windows != 1 {
            return Err(Error::Audio(format!(
                "self-distillation takes recordings of one window (30 s), this one took {}",
                transcript.stats.windows
            )));
        }
        let [segment] = transcript.segments.as_slice() else {
            return Ok(None);
        };
        if segment.tokens.is_empty() {
            return Ok(None);
        }
        let (prompt, _) = self.prompt(&greedy, transcript.language.as_deref(), &[])?;
        self.model.reset();
        let input: Vec<u32> = prompt.iter().chain(&segment.tokens).copied().collect();
        let rows = segment.tokens.len() + 1;
        forward_tokens(&mut self.model, &input, LogitRows::None)?;
        let hidden = self
            .model
            .last_hidden()?
            .narrow(0, input.len() - rows, rows)?;
        let next: Vec<u32> = segment
            .tokens
            .iter()
            .copied()
            .chain([self.tokenizer.end_of_text])
            .collect();
        Ok(Some((hidden, next)))
    }

    /// Turns a window's tokens into segments (split at timestamp pairs) and returns how many
    /// frames the seek advances.
    fn add_segments(
        &self,
        candidate: &Candidate,
        temperature: f32,
        no_speech: f32,
        window_start: f32,
        audio_frames: usize,
        segments: &mut Vec<Segment>,
    ) -> Result<usize> {
        let t = &self.tokenizer;
        let tokens = &candidate.tokens;
        let segment = |tokens: &[u32], start: f32, end: f32| -> Result<Segment> {
            let text = t.decode(tokens)?;
            Ok(Segment {
                start,
                end,
                compression_ratio: compression_ratio(&text),
                text,
                tokens: tokens.to_vec(),
                temperature,
                avg_logprob: candidate.avg_logprob(),
                no_speech_probability: no_speech,
                words: Vec::new(),
            })
        };
        let window_seconds = audio_frames as f32 / FRAMES_PER_SECOND;
        // The window past the audio is padding: a timestamp there marks no speech, so times
        // are clamped to the audio's end.
        let seconds = |token: u32| t.timestamp_seconds(token).clamp(0.0, window_seconds);
        let ends_with_single_timestamp = tokens.len() >= 2
            && t.is_timestamp(tokens[tokens.len() - 1])
            && !t.is_timestamp(tokens[tokens.len() - 2]);
        let boundaries: Vec<usize> = (1..tokens.len())
            .filter(|&i| t.is_timestamp(tokens[i]) && t.is_timestamp(tokens[i - 1]))
            .collect();
        if boundaries.is_empty() {
            let end = tokens
                .iter()
                .rev()
                .find(|&&x| t.is_timestamp(x))
                .map_or(window_seconds, |&x| seconds(x));
            let end = if candidate.tokens.iter().any(|&x| t.is_timestamp(x)) {
                end
            } else {
                window_seconds
            };
            let text: Vec<u32> = tokens
                .iter()
                .copied()
                .filter(|&x| !t.is_timestamp(x))
                .collect();
            if !text.is_empty() {
                segments.push(segment(&text, window_start, window_start + end)?);
            }
            return Ok(audio_frames);
        }
        let mut slices = boundaries.clone();
        if ends_with_single_timestamp {
            slices.push(tokens.len());
        }
        let mut last = 0;
        for &end in &slices {
            let piece = &tokens[last..end];
            if let (Some(&first), Some(&closing)) = (piece.first(), piece.last()) {
                let text: Vec<u32> = piece
                    .iter()
                    .copied()
                    .filter(|&x| !t.is_timestamp(x))
                    .collect();
                let start = if t.is_timestamp(first) {
                    seconds(first)
                } else {
                    0.0
                };
                let stop = if t.is_timestamp(closing) {
                    seconds(closing)
                } else {
                    start
                };
                if !text.is_empty() {
                    segments.push(segment(&text, window_start + start, window_start + stop)?);
                }
            }
            last = end;
        }
        if ends_with_single_timestamp {
            Ok(audio_frames)
        } else {
            let last_timestamp = tokens[last - 1];
            Ok((t.timestamp_seconds(last_timestamp) * FRAMES_PER_SECOND).round() as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(sum_logprob: f32, tokens: usize, below_compression_threshold: bool) -> Attempt {
        Attempt {
            candidate: Candidate {
                tokens: vec![1; tokens],
                sum_logprob,
                finished: true,
                forwards: tokens,
            },
            temperature: 0.0,
            no_speech: 0.0,
            below_compression_threshold,
        }
    }

    /// When every temperature fails, the most probable text that is not a repetition loop is
    /// kept, not the last attempt (this engine used to keep the last).
    #[test]
    fn all_failed_keeps_the_most_probable_attempt_below_the_compression_threshold() {
        // Average log-probabilities: -1.5, -2.0, -0.5 (a loop), -1.2, -3.0.
        let attempts = [
            attempt(-3.0, 1, true),
            attempt(-4.0, 1, true),
            attempt(-1.0, 1, false),
            attempt(-2.4, 1, true),
            attempt(-6.0, 1, true),
        ];
        assert_eq!(best_failed_attempt(&attempts), 3);
        // All loops (or no compression threshold): the most probable of all.
        let loops = [attempt(-3.0, 2, false), attempt(-1.0, 2, false)];
        assert_eq!(best_failed_attempt(&loops), 1);
        // Ties keep the first.
        let equal = [attempt(-2.0, 1, true), attempt(-2.0, 1, true)];
        assert_eq!(best_failed_attempt(&equal), 0);
    }

    /// A window is skipped when it is probably silence unless its text is probable enough; with
    /// no log-probability threshold the no-speech probability alone decides (faster-whisper).
    #[test]
    fn silence_needs_a_likely_no_speech_and_no_probable_text() {
        let options = TranscribeOptions::default();
        assert!(is_silence(&options, 0.7, -1.5));
        assert!(is_silence(&options, 0.7, -1.0));
        assert!(!is_silence(&options, 0.7, -0.5));
        assert!(!is_silence(&options, 0.5, -1.5));
        let no_log_prob = TranscribeOptions {
            log_prob_threshold: None,
            ..TranscribeOptions::default()
        };
        assert!(is_silence(&no_log_prob, 0.7, -0.1));
        let no_threshold = TranscribeOptions {
            no_speech_threshold: None,
            ..TranscribeOptions::default()
        };
        assert!(!is_silence(&no_threshold, 0.99, -5.0));
    }
}
