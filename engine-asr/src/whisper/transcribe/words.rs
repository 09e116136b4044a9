//! Word timestamps of a window's segments ([`TranscribeOptions::word_timestamps`]): the
//! alignment of [`crate::whisper::alignment`] on the encoded window, placed in the segments as
//! faster-whisper's `add_word_timestamps` places them.

use spec_core::Decoder;

use super::{Segment, TranscribeOptions, Transcriber, FRAMES_PER_SECOND};
use crate::whisper::alignment::{
    alignment_matrix, dtw, median_and_max_duration, merge_punctuations, place_words, split_words,
    truncate_long_words_at_sentence_ends, word_timings, SegmentSpan, WordTiming,
    APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS,
};
use crate::whisper::decode::Candidate;
use crate::Result;

impl Transcriber {
    /// Aligns `text` (text tokens only) with the encoded window: a teacher-forced forward of
    /// `[start of transcript, language, task, <|notimestamps|>, text, end of text]` keeping the
    /// alignment heads' cross-attention, the matrix over the window's first `audio_frames / 2`
    /// encoder positions, DTW, and the words with their times from the window's start.
    /// `language` picks the word splitting (spaces, or characters for languages without).
    pub fn align_words(
        &mut self,
        text: &[u32],
        audio_frames: usize,
        options: &TranscribeOptions,
        language: Option<&str>,
    ) -> Result<Vec<WordTiming>> {
        let t = &self.tokenizer;
        let end = t.end_of_text;
        let text: Vec<u32> = text.iter().copied().filter(|&x| x < end).collect();
        let frames = (audio_frames / 2).min(self.model.encoded_frames());
        if text.is_empty() || frames == 0 {
            return Ok(Vec::new());
        }
        // The start-of-transcript sequence as the window was decoded with, then
        // <|notimestamps|>: CTranslate2's `align` input.
        let without_timestamps = TranscribeOptions {
            timestamps: false,
            ..options.clone()
        };
        let (mut sequence, _) = self.prompt(&without_timestamps, language, &[])?;
        let first_text_row = sequence.len() - 1;
        sequence.extend_from_slice(&text);
        sequence.push(end);
        let (logits, scores) = self.model.alignment_forward(&sequence)?;
        self.model.reset();
        // Each text token's probability among the text tokens (a softmax over the ids below
        // the end of text), as `text_token_probs`.
        let probabilities: Vec<f32> = text
            .iter()
            .enumerate()
            .map(|(i, &token)| {
                let row = &logits.row(first_text_row + i)[..end as usize];
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
                (row[token as usize] - max).exp() / sum
            })
            .collect();
        let (heads, tokens, encoded) = scores.dims3()?;
        let scores = scores.flatten_all()?.to_vec1::<f32>()?;
        // Rows: <|notimestamps|> (which predicts the first text token) to the last text token
        // (which predicts the end of text).
        let rows = first_text_row..first_text_row + text.len() + 1;
        let matrix = alignment_matrix(&scores, heads, tokens, encoded, frames, rows)?;
        let path = dtw(&matrix);
        let decode = |tokens: &[u32]| self.tokenizer.decode(tokens);
        let words = split_words(&text, language, end, &decode)?;
        Ok(word_timings(words, &path, &probabilities))
    }

    /// Gives the window's segments (`segments[first..]`, just added from `candidate`) their
    /// words and moves their spans as faster-whisper does (and so that they cover their words);
    /// returns the frames the seek
    /// advances: `advance`, or — as Whisper seeks with word timestamps — to the end of the last
    /// word unless the window ended on a single timestamp (its speech ended there).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_word_timestamps(
        &mut self,
        candidate: &Candidate,
        segments: &mut [Segment],
        first: usize,
        window_start: f32,
        audio_frames: usize,
        options: &TranscribeOptions,
        language: Option<&str>,
        advance: usize,
    ) -> Result<usize> {
        let first = first.min(segments.len());
        let (earlier, window) = segments.split_at_mut(first);
        if window.is_empty() {
            return Ok(advance);
        }
        // faster-whisper's `last_speech_timestamp`: the end of the last word heard so far.
        let last_speech = earlier
            .iter()
            .rev()
            .find_map(|s| s.words.last().map(|w| w.end))
            .or_else(|| earlier.last().map(|s| s.end))
            .unwrap_or(0.0);
        let end = self.tokenizer.end_of_text;
        let text: Vec<u32> = window
            .iter()
            .flat_map(|s| s.tokens.iter().copied().filter(|&x| x < end))
            .collect();
        let mut alignment = self.align_words(&text, audio_frames, options, language)?;
        let durations = median_and_max_duration(&alignment);
        truncate_long_words_at_sentence_ends(&mut alignment, durations.1);
        merge_punctuations(&mut alignment, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS);
        let mut spans: Vec<SegmentSpan> = window
            .iter()
            .map(|s| SegmentSpan {
                start: f64::from(s.start),
                end: f64::from(s.end),
                text_tokens: s.tokens.iter().filter(|&&x| x < end).count(),
            })
            .collect();
        let (words, _) = place_words(
            &alignment,
            &mut spans,
            f64::from(window_start),
            durations,
            f64::from(last_speech),
        );
        for ((segment, span), words) in window.iter_mut().zip(&spans).zip(words) {
            // faster-whisper can leave a first word starting before its segment, or a last
            // word ending after it (the clamps of long edge words): the span covers its words
            // here, so that a subtitle shows every word it holds.
            segment.start = (span.start as f32).min(words.first().map_or(f32::MAX, |w| w.start));
            segment.end = (span.end as f32).max(words.last().map_or(f32::MIN, |w| w.end));
            segment.words = words;
        }
        let tokens = &candidate.tokens;
        let t = &self.tokenizer;
        let single_timestamp_ending = tokens.len() >= 2
            && t.is_timestamp(tokens[tokens.len() - 1])
            && !t.is_timestamp(tokens[tokens.len() - 2]);
        if single_timestamp_ending {
            return Ok(advance);
        }
        let last_word_end = window
            .iter()
            .rev()
            .find_map(|s| s.words.last().map(|w| w.end))
            .or_else(|| window.last().map(|s| s.end));
        let seek = (window_start * FRAMES_PER_SECOND).round() as usize;
        Ok(match last_word_end {
            Some(end) if end > window_start => {
                ((end * FRAMES_PER_SECOND).round() as usize).saturating_sub(seek)
            }
            _ => advance,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;
    use candle_core::DType;

    fn transcriber(dir: &std::path::Path) -> Transcriber {
        testing::write_ct2(dir, 7, DType::F32).unwrap();
        Transcriber::load(dir, &crate::whisper::LoadOptions::default()).unwrap()
    }

    /// On a random model: every segment's words are in order, inside the segment, and hold
    /// exactly its text; word timestamps change no token of the transcript.
    #[test]
    fn words_are_ordered_inside_their_segments_and_keep_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let mut transcriber = transcriber(dir.path());
        // The tiny model's window is 2 s: 5 s is three windows, decoded with timestamps.
        for (seconds, timestamps) in [(1.7, false), (1.7, true), (5.0, true)] {
            let samples = testing::tones(seconds, 440.0);
            let options = TranscribeOptions {
                timestamps,
                max_initial_timestamp: None,
                ..testing::greedy_options()
            };
            let plain = transcriber.transcribe(&samples, &options).unwrap();
            let with_words = TranscribeOptions {
                word_timestamps: true,
                ..options.clone()
            };
            let timed = transcriber.transcribe(&samples, &with_words).unwrap();
            let tokens = |t: &crate::Transcript| -> Vec<u32> {
                t.segments.iter().flat_map(|s| s.tokens.clone()).collect()
            };
            if seconds < 2.0 {
                // One window: the same decoding; the seek then follows the last word, so the
                // audio after it may be decoded again (as Whisper does).
                let (plain, timed) = (tokens(&plain), tokens(&timed));
                assert!(timed.starts_with(&plain), "{plain:?} then {timed:?}");
            }
            assert!(
                timed.segments.iter().any(|s| !s.words.is_empty()),
                "{seconds} s: no words in {:?}",
                timed.segments
            );
            // Joined, the words are the text (a word may begin in one segment and end in the
            // next: the whole transcript is compared).
            let joined: String = timed
                .segments
                .iter()
                .flat_map(|s| &s.words)
                .map(|w| w.word.as_str())
                .collect();
            let text: String = timed.segments.iter().map(|s| s.text.as_str()).collect();
            assert_eq!(joined, text, "{seconds} s");
            let (mut previous_start, mut previous_end) = (0f32, 0f32);
            for segment in &timed.segments {
                for word in &segment.words {
                    assert!(word.start <= word.end, "{word:?}");
                    assert!(
                        word.start >= previous_start && word.end >= previous_end,
                        "{word:?} after {previous_start}–{previous_end}"
                    );
                    assert!(
                        word.start >= segment.start - 1e-4 && word.end <= segment.end + 1e-4,
                        "{word:?} outside {}–{}",
                        segment.start,
                        segment.end
                    );
                    assert!((0.0..=1.0).contains(&word.probability));
                    assert!(word.end <= seconds + 0.01);
                    (previous_start, previous_end) = (word.start, word.end);
                }
            }
        }
    }

    /// SpecASR with word timestamps gives greedy decoding's segments and words: the alignment's
    /// forward between windows disturbs neither the target's decoding nor the draft's.
    #[test]
    fn word_timestamps_keep_draft_decoding_exact() {
        let (dir, draft_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut greedy = transcriber(dir.path());
        let mut drafted = transcriber(dir.path());
        testing::write_ct2(draft_dir.path(), 77, DType::F32).unwrap();
        let draft =
            Transcriber::load(draft_dir.path(), &crate::whisper::LoadOptions::default()).unwrap();
        drafted.set_draft(draft).unwrap();
        let options = TranscribeOptions {
            timestamps: true,
            word_timestamps: true,
            ..testing::greedy_options()
        };
        let with_draft = TranscribeOptions {
            draft: Some(spec_core::SpecAsrConfig::plain(4)),
            ..options.clone()
        };
        for seconds in [1.3, 4.5] {
            let samples = testing::tones(seconds, 330.0);
            let expected = greedy.transcribe(&samples, &options).unwrap();
            let got = drafted.transcribe(&samples, &with_draft).unwrap();
            assert!(got.stats.drafted_windows > 0);
            assert_eq!(got.segments, expected.segments, "{seconds} s");
        }
    }

    /// The alignment reads the configured heads; heads the decoder does not have are refused.
    #[test]
    fn alignment_heads_come_from_the_folder_and_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        testing::write_ct2(dir.path(), 7, DType::F32).unwrap();
        let config = dir.path().join("config.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
        json["alignment_heads"] = serde_json::json!([[1, 2], [0, 3]]);
        std::fs::write(&config, json.to_string()).unwrap();
        let mut configured =
            Transcriber::load(dir.path(), &crate::whisper::LoadOptions::default()).unwrap();
        assert_eq!(configured.model().alignment_heads(), &[(1, 2), (0, 3)]);
        json["alignment_heads"] = serde_json::json!([[testing::DECODER_LAYERS, 0]]);
        std::fs::write(&config, json.to_string()).unwrap();
        assert!(matches!(
            Transcriber::load(dir.path(), &crate::whisper::LoadOptions::default()),
            Err(crate::Error::Config(_))
        ));
        // Without a list, the second half of the decoder layers (here layer 1, all heads).
        let plain = tempfile::tempdir().unwrap();
        let mut default = transcriber(plain.path());
        let expected: Vec<(usize, usize)> = (0..testing::HEADS).map(|h| (1, h)).collect();
        assert_eq!(default.model().alignment_heads(), expected.as_slice());
    }
}
