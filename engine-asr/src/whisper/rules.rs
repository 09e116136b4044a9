//! Whisper's logit rules, applied to every row before a token is chosen: suppressed tokens,
//! the blank/end suppression of the first step, and the timestamp grammar (Radford et al.,
//! 2022, §4.3 and OpenAI's `ApplyTimestampRules`). They depend only on the tokens sampled so far
//! in the window, so a verifier applies them to each row of a multi-token forward exactly as
//! decoding applies them step by step.

use crate::whisper::tokenizer::{WhisperTokenizer, TIMESTAMP_STEP};

/// The rules of one decoding configuration.
#[derive(Clone, Debug)]
pub struct LogitRules {
    /// Always −∞ (non-speech symbols, task and start tokens).
    suppress: Vec<u32>,
    /// −∞ at the first sampled position (a leading blank, an immediate end).
    suppress_at_start: Vec<u32>,
    /// Timestamp tokens allowed (the timestamp grammar applies) or all suppressed.
    timestamps: bool,
    /// Latest first timestamp, in timestamp steps (1 s by default).
    max_initial_timestamp: Option<u32>,
    end_of_text: u32,
    no_timestamps: u32,
    timestamp_begin: u32,
}

impl LogitRules {
    /// `suppress`: the model's suppressed ids (its `config.json`), to which the task, start and
    /// no-timestamps tokens are added; `suppress_at_start`: the ids blocked at the first step.
    pub fn new(
        tokenizer: &WhisperTokenizer,
        suppress: &[u32],
        suppress_at_start: &[u32],
        timestamps: bool,
        max_initial_timestamp: Option<f32>,
    ) -> Self {
        let mut all: Vec<u32> = suppress.to_vec();
        all.extend([
            tokenizer.transcribe,
            tokenizer.translate,
            tokenizer.start_of_transcript,
            tokenizer.start_of_previous,
            tokenizer.start_of_lm,
            tokenizer.no_speech,
            tokenizer.no_timestamps,
        ]);
        all.sort_unstable();
        all.dedup();
        Self {
            suppress: all,
            suppress_at_start: suppress_at_start.to_vec(),
            timestamps,
            max_initial_timestamp: max_initial_timestamp
                .map(|s| (s / TIMESTAMP_STEP).round() as u32),
            end_of_text: tokenizer.end_of_text,
            no_timestamps: tokenizer.no_timestamps,
            timestamp_begin: tokenizer.timestamp_begin,
        }
    }

    /// Whether timestamps are predicted.
    pub fn timestamps(&self) -> bool {
        self.timestamps
    }

    /// Applies the rules to `logits` for the position after `sampled` (the tokens chosen so far
    /// in this window, without the prompt).
    pub fn apply(&self, logits: &mut [f32], sampled: &[u32]) {
        let vocab = logits.len();
        let mut block = |token: u32| {
            if let Some(l) = logits.get_mut(token as usize) {
                *l = f32::NEG_INFINITY;
            }
        };
        for &t in &self.suppress {
            block(t);
        }
        if sampled.is_empty() {
            for &t in &self.suppress_at_start {
                block(t);
            }
        }
        let first_timestamp = self.timestamp_begin as usize;
        if first_timestamp >= vocab {
            return;
        }
        if !self.timestamps {
            logits[first_timestamp..].fill(f32::NEG_INFINITY);
            return;
        }
        logits[self.no_timestamps as usize] = f32::NEG_INFINITY;
        let is_timestamp = |t: u32| t >= self.timestamp_begin;
        let last_was_timestamp = sampled.last().is_some_and(|&t| is_timestamp(t));
        // True at the start too: a lone first timestamp opens a segment.
        let penultimate_was_timestamp =
            sampled.len() < 2 || is_timestamp(sampled[sampled.len() - 2]);
        if last_was_timestamp {
            if penultimate_was_timestamp {
                // A pair (or the opening timestamp) is followed by text.
                logits[first_timestamp..].fill(f32::NEG_INFINITY);
            } else {
                // A timestamp after text closes the segment: another timestamp or the end.
                logits[..self.end_of_text as usize].fill(f32::NEG_INFINITY);
            }
        }
        // Timestamps never go backwards; a closing one may equal the one before it.
        if let Some(&latest) = sampled.iter().rev().find(|&&t| is_timestamp(t)) {
            let floor = if last_was_timestamp && !penultimate_was_timestamp {
                latest
            } else {
                latest + 1
            };
            let end = (floor as usize).min(vocab);
            logits[first_timestamp..end].fill(f32::NEG_INFINITY);
        }
        if sampled.is_empty() {
            // The first token is a timestamp, not later than the initial maximum.
            logits[..first_timestamp].fill(f32::NEG_INFINITY);
            if let Some(max) = self.max_initial_timestamp {
                let end = first_timestamp + max as usize + 1;
                if end < vocab {
                    logits[end..].fill(f32::NEG_INFINITY);
                }
            }
        }
        // If the timestamps are together more probable than any text token, take a timestamp.
        let log_sum_exp = |values: &[f32]| {
            let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if max == f32::NEG_INFINITY {
                return max;
            }
            max + values.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
        };
        let total = log_sum_exp(logits);
        if total.is_finite() {
            let timestamp_mass = log_sum_exp(&logits[first_timestamp..]) - total;
            let best_text = logits[..first_timestamp]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max)
                - total;
            if timestamp_mass > best_text {
                logits[..first_timestamp].fill(f32::NEG_INFINITY);
            }
        }
    }
}
