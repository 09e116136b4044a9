//! Word timestamps from the decoder's cross-attention, as openai-whisper's `timing.py` and
//! faster-whisper (with CTranslate2's `Whisper.align`) compute them:
//!
//! 1. a teacher-forced forward of `[start of transcript …, <|notimestamps|>, text, end of
//!    text]` over the window's encoder output keeps the cross-attention scores of the model's
//!    *alignment heads* (heads whose attention follows the speech in time);
//! 2. a softmax of each head's scores over the window's audio frames ([`alignment_matrix`]),
//!    a z-score normalisation of each head and frame along the tokens, a median filter of
//!    width 7 along the frames, and the mean over the heads give a tokens × frames matrix;
//! 3. dynamic time warping on the negative matrix ([`dtw`]) finds the monotone path of most
//!    attention; a token starts where the path first reaches its row ([`word_timings`]);
//! 4. the tokens are grouped into words ([`split_on_spaces`], [`split_on_unicode`] for
//!    languages written without spaces), punctuation is merged into the neighbouring words
//!    ([`merge_punctuations`]) and faster-whisper's heuristics clamp implausibly long words
//!    at sentence and segment boundaries ([`truncate_long_words_at_sentence_ends`],
//!    [`place_words`]).

use std::ops::Range;

use crate::Result;

/// Encoder positions per second: 100 mel frames a second, halved by the encoder's stride-2
/// convolution.
pub const TOKENS_PER_SECOND: f64 = 50.0;

/// Width of the median filter along the frames (openai-whisper's `medfilt_width`).
pub const MEDIAN_FILTER_WIDTH: usize = 7;

/// Punctuation merged into the word after it (faster-whisper's `prepend_punctuations`).
pub const PREPEND_PUNCTUATIONS: &str = "\"'“¿([{-";

/// Punctuation merged into the word before it (faster-whisper's `append_punctuations`).
pub const APPEND_PUNCTUATIONS: &str = "\"'.。,，!！?？:：”)]}、";

/// Words that end a sentence (faster-whisper's `sentence_end_marks`).
const SENTENCE_END_MARKS: &str = ".。!！?？";

/// Python's `string.punctuation`: a sub-word made of these starts a word of its own.
const ASCII_PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/// Languages written without spaces between words: split wherever the tokens decode to whole
/// characters (openai-whisper's list).
const LANGUAGES_WITHOUT_SPACES: [&str; 6] = ["zh", "ja", "th", "lo", "my", "yue"];

/// The replacement character a decoder writes for an incomplete UTF-8 sequence.
const REPLACEMENT: char = '\u{fffd}';

/// A word of a segment with its time span in seconds of the recording and the mean
/// probability of its tokens (faster-whisper's `Word`). The word keeps its leading space.
#[derive(Clone, Debug, PartialEq)]
pub struct Word {
    pub start: f32,
    pub end: f32,
    pub word: String,
    pub probability: f32,
}

/// A word of a window's alignment: its text, its tokens, its span in seconds from the window's
/// start and the mean probability of its tokens. Punctuation merged into a neighbour leaves an
/// empty word with no tokens behind.
#[derive(Clone, Debug, PartialEq)]
pub struct WordTiming {
    pub word: String,
    pub tokens: Vec<u32>,
    pub start: f64,
    pub end: f64,
    pub probability: f64,
}

/// A row-major matrix of `f32`.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Matrix {
    /// Element `(row, col)`.
    pub fn at(&self, row: usize, col: usize) -> f32 {
        self.data[row * self.cols + col]
    }
}

/// Median filter of odd `width` along `row`, the edges reflected (`…, x2, x1 | x0, x1, x2, …`,
/// scipy's and CTranslate2's `reflect`); a row no longer than half the width is returned as it
/// is, as both do.
pub fn median_filter(row: &[f32], width: usize) -> Vec<f32> {
    let rank = width / 2;
    let n = row.len();
    if n <= rank || width < 2 {
        return row.to_vec();
    }
    let mut window = vec![0f32; 2 * rank + 1];
    (0..n)
        .map(|j| {
            for (slot, k) in window.iter_mut().zip(-(rank as isize)..=rank as isize) {
                let mut read = (j as isize + k).unsigned_abs();
                if read >= n {
                    read = 2 * n - read - 2;
                }
                *slot = row[read];
            }
            window.sort_unstable_by(f32::total_cmp);
            window[rank]
        })
        .collect()
}

/// The tokens × frames matrix DTW runs on, from the alignment heads' cross-attention scores
/// `scores` (`[heads, tokens, frames]` row-major, scaled query·key before the softmax):
/// openai-whisper's `find_alignment` and CTranslate2's `align`, in order:
/// 1. the first `audio_frames` frames only (the window's audio, not its padding), and a
///    softmax of each head's scores over them;
/// 2. each head's column (one frame) normalised to zero mean and unit variance along the
///    tokens (`(x − mean) / std`, the standard deviation without Bessel's correction);
/// 3. a median filter of width [`MEDIAN_FILTER_WIDTH`] along the frames;
/// 4. the mean over the heads, keeping the token rows `rows` (the position of
///    `<|notimestamps|>`, which predicts the first text token, through the last text token).
///
/// Returns `rows.len() × audio_frames` (no columns when `audio_frames` is 0).
pub fn alignment_matrix(
    scores: &[f32],
    heads: usize,
    tokens: usize,
    frames: usize,
    audio_frames: usize,
    rows: Range<usize>,
) -> Result<Matrix> {
    if scores.len() != heads * tokens * frames || heads == 0 {
        return Err(crate::Error::Config(format!(
            "alignment scores of {} values for {heads} heads × {tokens} tokens × {frames} frames",
            scores.len()
        )));
    }
    if rows.end > tokens || rows.start > rows.end {
        return Err(crate::Error::Config(format!(
            "alignment rows {rows:?} of {tokens} tokens"
        )));
    }
    let cols = audio_frames.min(frames);
    let mut mean = vec![0f32; rows.len() * cols];
    let mut head = vec![0f32; tokens * cols];
    for h in 0..heads {
        // 1. Softmax over the audio frames.
        for t in 0..tokens {
            let from = (h * tokens + t) * frames;
            let out = &mut head[t * cols..(t + 1) * cols];
            out.copy_from_slice(&scores[from..from + cols]);
            let max = out.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for x in out.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            for x in out.iter_mut() {
                *x /= sum;
            }
        }
        // 2. Zero mean and unit variance along the tokens, frame by frame (a frame every
        // token attends to equally is all zeros, not 0 / 0).
        for f in 0..cols {
            let column = || (0..tokens).map(|t| head[t * cols + f]);
            let m = column().sum::<f32>() / tokens as f32;
            let var = column().map(|x| (x - m) * (x - m)).sum::<f32>() / tokens as f32;
            let std = var.sqrt();
            for t in 0..tokens {
                let x = &mut head[t * cols + f];
                *x = if std > 0.0 { (*x - m) / std } else { 0.0 };
            }
        }
        // 3. Median filter along the frames; 4. summed for the mean over the heads.
        for (r, t) in rows.clone().enumerate() {
            let filtered = median_filter(&head[t * cols..(t + 1) * cols], MEDIAN_FILTER_WIDTH);
            for (acc, x) in mean[r * cols..(r + 1) * cols].iter_mut().zip(filtered) {
                *acc += x;
            }
        }
    }
    for x in &mut mean {
        *x /= heads as f32;
    }
    Ok(Matrix {
        rows: rows.len(),
        cols,
        data: mean,
    })
}

/// Dynamic time warping of `-x` (the path of most attention): the monotone path of `(row,
/// column)` pairs from `(0, 0)` to the last row and column, moving diagonally, down or right
/// at each step, with the least summed cost. Ties go as in openai-whisper's `dtw_cpu` and
/// CTranslate2's `negative_dtw`: the diagonal only when strictly cheapest, then down, then
/// right. A matrix without rows or columns has no path.
pub fn dtw(x: &Matrix) -> Vec<(usize, usize)> {
    let (n, m) = (x.rows, x.cols);
    if n == 0 || m == 0 {
        return Vec::new();
    }
    let width = m + 1;
    let mut cost = vec![f32::INFINITY; (n + 1) * width];
    // 0: diagonal, 1: down (next token, same frame), 2: right (same token, next frame).
    let mut trace = vec![0u8; (n + 1) * width];
    cost[0] = 0.0;
    for j in 1..=m {
        for i in 1..=n {
            let c0 = cost[(i - 1) * width + j - 1];
            let c1 = cost[(i - 1) * width + j];
            let c2 = cost[i * width + j - 1];
            let (c, t) = if c0 < c1 && c0 < c2 {
                (c0, 0)
            } else if c1 < c0 && c1 < c2 {
                (c1, 1)
            } else {
                (c2, 2)
            };
            // A non-finite attention value (none arises from finite scores) counts as none.
            let v = x.at(i - 1, j - 1);
            cost[i * width + j] = c - if v.is_finite() { v } else { 0.0 };
            trace[i * width + j] = t;
        }
    }
    trace[..=m].fill(2);
    for i in 0..=n {
        trace[i * width] = 1;
    }
    let (mut i, mut j) = (n, m);
    let mut path = Vec::with_capacity(n + m);
    while i > 0 && j > 0 {
        path.push((i - 1, j - 1));
        match trace[i * width + j] {
            0 => {
                i -= 1;
                j -= 1;
            }
            1 => i -= 1,
            _ => j -= 1,
        }
    }
    path.reverse();
    path
}

/// Splits `tokens` where they decode to whole characters: each piece ends at the first token
/// after which the decoded text has no replacement character that the whole text lacks
/// (openai-whisper's `split_tokens_on_unicode`). `decode` turns tokens into text.
pub fn split_on_unicode(
    tokens: &[u32],
    decode: &dyn Fn(&[u32]) -> Result<String>,
) -> Result<Vec<(String, Vec<u32>)>> {
    let full: Vec<char> = decode(tokens)?.chars().collect();
    let mut pieces = Vec::new();
    let mut current = Vec::new();
    let mut offset = 0;
    for &token in tokens {
        current.push(token);
        let decoded = decode(&current)?;
        let complete = match decoded.chars().position(|c| c == REPLACEMENT) {
            None => true,
            Some(index) => full.get(index + offset) == Some(&REPLACEMENT),
        };
        if complete {
            offset += decoded.chars().count();
            pieces.push((decoded, std::mem::take(&mut current)));
        }
    }
    if !current.is_empty() {
        pieces.push((decode(&current)?, current));
    }
    Ok(pieces)
}

/// Splits `tokens` into words: the pieces of [`split_on_unicode`], joined to the word before
/// unless they start with a space or are ASCII punctuation (openai-whisper's
/// `split_tokens_on_spaces`). `end_of_text` and above are special tokens: words of their own.
pub fn split_on_spaces(
    tokens: &[u32],
    end_of_text: u32,
    decode: &dyn Fn(&[u32]) -> Result<String>,
) -> Result<Vec<(String, Vec<u32>)>> {
    let mut words: Vec<(String, Vec<u32>)> = Vec::new();
    for (piece, piece_tokens) in split_on_unicode(tokens, decode)? {
        let special = piece_tokens.first().is_some_and(|&t| t >= end_of_text);
        let with_space = piece.starts_with(' ');
        // Python's `subword.strip() in string.punctuation`: a substring test.
        let punctuation = ASCII_PUNCTUATION.contains(piece.trim());
        match words.last_mut() {
            Some((word, word_tokens)) if !(special || with_space || punctuation) => {
                word.push_str(&piece);
                word_tokens.extend(piece_tokens);
            }
            _ => words.push((piece, piece_tokens)),
        }
    }
    Ok(words)
}

/// Words of `tokens` in `language`: at spaces, or at character boundaries for languages
/// written without spaces (faster-whisper's `split_to_word_tokens`).
pub fn split_words(
    tokens: &[u32],
    language: Option<&str>,
    end_of_text: u32,
    decode: &dyn Fn(&[u32]) -> Result<String>,
) -> Result<Vec<(String, Vec<u32>)>> {
    if language.is_some_and(|l| LANGUAGES_WITHOUT_SPACES.contains(&l)) {
        split_on_unicode(tokens, decode)
    } else {
        split_on_spaces(tokens, end_of_text, decode)
    }
}

/// The words' spans from the DTW `path` over the text tokens (row `i` predicts text token `i`;
/// the last row, the end of text): a token starts at the frame where the path first enters its
/// row, a word spans from its first token's start to the next word's, and its probability is
/// the mean of its tokens' (`token_probabilities`, one per text token). Empty when the path
/// does not cover one row per text token and the end of text.
pub fn word_timings(
    words: Vec<(String, Vec<u32>)>,
    path: &[(usize, usize)],
    token_probabilities: &[f32],
) -> Vec<WordTiming> {
    let text_tokens: usize = words.iter().map(|w| w.1.len()).sum();
    // The path's jumps: the first step into each row.
    let mut jump_times = Vec::with_capacity(text_tokens + 1);
    for (k, &(row, frame)) in path.iter().enumerate() {
        if k == 0 || row != path[k - 1].0 {
            jump_times.push(frame as f64 / TOKENS_PER_SECOND);
        }
    }
    if words.is_empty()
        || jump_times.len() != text_tokens + 1
        || token_probabilities.len() != text_tokens
    {
        return Vec::new();
    }
    let mut first = 0;
    words
        .into_iter()
        .map(|(word, tokens)| {
            let last = first + tokens.len();
            let probabilities = &token_probabilities[first..last];
            let probability = if probabilities.is_empty() {
                0.0
            } else {
                probabilities.iter().map(|&p| f64::from(p)).sum::<f64>()
                    / probabilities.len() as f64
            };
            let timing = WordTiming {
                word,
                tokens,
                start: jump_times[first],
                end: jump_times[last],
                probability,
            };
            first = last;
            timing
        })
        .collect()
}

/// The median of the words' non-zero durations, at most 0.7 s, and twice it: faster-whisper's
/// `median_duration` and `max_duration` (both 0 without a word of some duration).
pub fn median_and_max_duration(alignment: &[WordTiming]) -> (f64, f64) {
    let mut durations: Vec<f64> = alignment
        .iter()
        .map(|w| w.end - w.start)
        .filter(|&d| d != 0.0)
        .collect();
    if durations.is_empty() {
        return (0.0, 0.0);
    }
    durations.sort_by(f64::total_cmp);
    let n = durations.len();
    let median = if n % 2 == 1 {
        durations[n / 2]
    } else {
        (durations[n / 2 - 1] + durations[n / 2]) / 2.0
    };
    let median = median.min(0.7);
    (median, 2.0 * median)
}

/// faster-whisper's sentence-boundary hack: a word longer than `max_duration` that is a
/// sentence end mark ends `max_duration` after its start; one right after a sentence end
/// starts `max_duration` before its end (the first word is left as it is). Nothing changes
/// when no word has a duration.
pub fn truncate_long_words_at_sentence_ends(alignment: &mut [WordTiming], max_duration: f64) {
    if alignment.iter().all(|w| w.end - w.start == 0.0) {
        return;
    }
    for i in 1..alignment.len() {
        if alignment[i].end - alignment[i].start > max_duration {
            // Python's `word in sentence_end_marks`: a substring test.
            if SENTENCE_END_MARKS.contains(alignment[i].word.as_str()) {
                alignment[i].end = alignment[i].start + max_duration;
            } else if SENTENCE_END_MARKS.contains(alignment[i - 1].word.as_str()) {
                alignment[i].start = alignment[i].end - max_duration;
            }
        }
    }
}

/// Merges punctuation into the neighbouring words (openai-whisper's `merge_punctuations`): a
/// word that starts with a space and is one of `prepended` (`" (`, `" “`) joins the word
/// after it, and one of `appended` (`.`, `,`, `)`) joins the word before it unless that one
/// ends with a space. The merged word keeps its own times; the punctuation's entry is left
/// empty (no text, no tokens).
pub fn merge_punctuations(alignment: &mut [WordTiming], prepended: &str, appended: &str) {
    let n = alignment.len();
    // Prepended punctuation, from the end.
    if n >= 2 {
        let mut j = n - 1;
        for i in (0..n - 1).rev() {
            let previous = &alignment[i];
            // Python's `previous.strip() in prepended`: a substring test.
            if previous.word.starts_with(' ') && prepended.contains(previous.word.trim()) {
                let (head, tail) = alignment.split_at_mut(j);
                let (previous, following) = (&mut head[i], &mut tail[0]);
                following.word = std::mem::take(&mut previous.word) + &following.word;
                let mut tokens = std::mem::take(&mut previous.tokens);
                tokens.append(&mut following.tokens);
                following.tokens = tokens;
            } else {
                j = i;
            }
        }
    }
    // Appended punctuation, from the start.
    let mut i = 0;
    for j in 1..n {
        let (head, tail) = alignment.split_at_mut(j);
        let (previous, following) = (&mut head[i], &mut tail[0]);
        if !previous.word.ends_with(' ') && appended.contains(following.word.as_str()) {
            previous.word.push_str(&std::mem::take(&mut following.word));
            previous.tokens.append(&mut following.tokens);
        } else {
            i = j;
        }
    }
}

/// A segment's time span (seconds of the recording) and how many text tokens it holds, for
/// [`place_words`], which may move the span to its words.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SegmentSpan {
    pub start: f64,
    pub end: f64,
    pub text_tokens: usize,
}

/// Rounds to hundredths of a second, as faster-whisper stores word times.
fn hundredths(seconds: f64) -> f64 {
    (seconds * 100.0).round() / 100.0
}

/// Gives each of a window's segments its words (faster-whisper's `add_word_timestamps` after
/// the alignment): the words in order, each to the segment holding its first tokens, at
/// `time_offset` (the window's start) plus the alignment's times, rounded to 0.01 s; merged
/// punctuation's empty entries are dropped. Then faster-whisper's segment-boundary hacks, per
/// segment:
/// - after a pause (the first word ends more than 4 median durations after
///   `last_speech_timestamp`), a first word longer than `max_duration`, or a first two words
///   longer than twice that, is cut to `max_duration` (and a long second word shares the
///   boundary `max(end₂ / 2, end₂ − max_duration)` with it);
/// - a first word starting more than 0.5 s before the segment's own start (which lies within
///   the word) starts at the segment's start, or one median duration before its end if that
///   is later; otherwise the segment starts at its first word;
/// - likewise a last word ending more than 0.5 s after the segment's end ends there, or one
///   median duration after its start; otherwise the segment ends at its last word.
///
/// Returns the words of each segment and the updated `last_speech_timestamp` (the end of the
/// last segment with words).
pub fn place_words(
    alignment: &[WordTiming],
    segments: &mut [SegmentSpan],
    time_offset: f64,
    (median_duration, max_duration): (f64, f64),
    mut last_speech_timestamp: f64,
) -> (Vec<Vec<Word>>, f64) {
    let mut placed = Vec::with_capacity(segments.len());
    let mut next = 0;
    for segment in segments.iter_mut() {
        let mut saved_tokens = 0;
        // (word, start, end, probability) in f64 until the end.
        let mut words: Vec<(String, f64, f64, f64)> = Vec::new();
        while next < alignment.len() && saved_tokens < segment.text_tokens {
            let timing = &alignment[next];
            if !timing.word.is_empty() {
                words.push((
                    timing.word.clone(),
                    hundredths(time_offset + timing.start),
                    hundredths(time_offset + timing.end),
                    timing.probability,
                ));
            }
            saved_tokens += timing.tokens.len();
            next += 1;
        }
        if !words.is_empty() {
            let last = words.len() - 1;
            let (first_end, first_start) = (words[0].2, words[0].1);
            let long_first = first_end - first_start > max_duration;
            let long_pair = words.len() > 1 && words[1].2 - first_start > max_duration * 2.0;
            if first_end - last_speech_timestamp > median_duration * 4.0
                && (long_first || long_pair)
            {
                if words.len() > 1 && words[1].2 - words[1].1 > max_duration {
                    let boundary = (words[1].2 / 2.0).max(words[1].2 - max_duration);
                    words[0].2 = boundary;
                    words[1].1 = boundary;
                }
                words[0].1 = (words[0].2 - max_duration).max(0.0);
            }
            if segment.start < words[0].2 && segment.start - 0.5 > words[0].1 {
                words[0].1 = (words[0].2 - median_duration).min(segment.start).max(0.0);
            } else {
                segment.start = words[0].1;
            }
            if segment.end > words[last].1 && segment.end + 0.5 < words[last].2 {
                words[last].2 = (words[last].1 + median_duration).max(segment.end);
            } else {
                segment.end = words[last].2;
            }
            last_speech_timestamp = segment.end;
        }
        placed.push(
            words
                .into_iter()
                .map(|(word, start, end, probability)| Word {
                    start: start as f32,
                    end: end as f32,
                    word,
                    probability: probability as f32,
                })
                .collect(),
        );
    }
    (placed, last_speech_timestamp)
}

/// The words two timings of the same speech share, paired in order (a longest common
/// subsequence of their texts, compared in lower case without spaces or punctuation), with
/// the differences of their times: `(ours.start − theirs.start, ours.end − theirs.end)` per
/// pair. For measuring word timestamps against another implementation's.
pub fn word_time_differences(ours: &[Word], theirs: &[Word]) -> Vec<(f32, f32)> {
    let key = |w: &Word| -> String {
        w.word
            .chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect()
    };
    let (a, b): (Vec<String>, Vec<String>) = (
        ours.iter().map(key).collect(),
        theirs.iter().map(key).collect(),
    );
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![0usize; (n + 1) * (m + 1)];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * (m + 1) + j] = if a[i] == b[j] {
                lcs[(i + 1) * (m + 1) + j + 1] + 1
            } else {
                lcs[(i + 1) * (m + 1) + j].max(lcs[i * (m + 1) + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut pairs = Vec::new();
    while i < n && j < m {
        if a[i] == b[j] {
            pairs.push((ours[i].start - theirs[j].start, ours[i].end - theirs[j].end));
            i += 1;
            j += 1;
        } else if lcs[(i + 1) * (m + 1) + j] >= lcs[i * (m + 1) + j + 1] {
            i += 1;
        } else {
            j += 1;
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: &[&[f32]]) -> Matrix {
        Matrix {
            rows: rows.len(),
            cols: rows[0].len(),
            data: rows.concat(),
        }
    }

    /// A small matrix worked out by hand, with a tie: the cumulative costs of `-x` are
    /// ```text
    /// -1 -1 -1  -1
    /// -1 -6 -6  -6
    /// -1 -6 -7 -11
    /// ```
    /// The path back from (2, 3) goes right twice (ties go right), down to row 1, right on to
    /// (1, 1) at the tie of all three ways, down to row 0 and diagonally home: it sums the same
    /// attention (11) as the diagonal (0, 0), (1, 1), (2, 2), (2, 3), but takes the ties as
    /// CTranslate2 and openai-whisper do.
    #[test]
    fn dtw_takes_ties_as_whisper_does() {
        let x = matrix(&[
            &[1.0, 0.0, 0.0, 0.0],
            &[0.0, 5.0, 0.0, 0.0],
            &[0.0, 0.0, 1.0, 4.0],
        ]);
        assert_eq!(
            dtw(&x),
            vec![(0, 0), (1, 0), (1, 1), (2, 1), (2, 2), (2, 3)]
        );
        assert!(dtw(&Matrix {
            rows: 0,
            cols: 3,
            data: vec![]
        })
        .is_empty());
    }

    /// The least cost of any monotone path from (0, 0) to the last cell, by enumeration.
    fn brute_force_least_cost(x: &Matrix, i: usize, j: usize) -> f32 {
        let here = -x.at(i, j);
        if i == 0 && j == 0 {
            return here;
        }
        let mut best = f32::INFINITY;
        if i > 0 && j > 0 {
            best = best.min(brute_force_least_cost(x, i - 1, j - 1));
        }
        if i > 0 {
            best = best.min(brute_force_least_cost(x, i - 1, j));
        }
        if j > 0 {
            best = best.min(brute_force_least_cost(x, i, j - 1));
        }
        here + best
    }

    /// On matrices of distinct values, the path is a valid monotone one and no path costs
    /// less (checked against every path).
    #[test]
    fn dtw_finds_the_least_cost_path() {
        let mut state = 12345u64;
        for (rows, cols) in [(1, 1), (1, 5), (4, 1), (3, 4), (4, 6), (5, 5)] {
            let data: Vec<f32> = (0..rows * cols)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 40) as f32 / (1u64 << 24) as f32
                })
                .collect();
            let x = Matrix { rows, cols, data };
            let path = dtw(&x);
            assert_eq!(path.first(), Some(&(0, 0)));
            assert_eq!(path.last(), Some(&(rows - 1, cols - 1)));
            for w in path.windows(2) {
                let step = (w[1].0 - w[0].0, w[1].1 - w[0].1);
                assert!([(1, 1), (1, 0), (0, 1)].contains(&step), "{path:?}");
            }
            let cost: f32 = path.iter().map(|&(i, j)| -x.at(i, j)).sum();
            let least = brute_force_least_cost(&x, rows - 1, cols - 1);
            assert!(
                (cost - least).abs() < 1e-5,
                "{rows}×{cols}: {cost} vs {least}"
            );
        }
    }

    #[test]
    fn median_filter_reflects_at_the_edges() {
        let row = [5.0, 1.0, 9.0, 2.0, 7.0, 3.0, 8.0, 4.0];
        // Width 3 by hand: reflected [1, 5, 1, 9, 2, 7, 3, 8, 4, 8].
        assert_eq!(
            median_filter(&row, 3),
            vec![1.0, 5.0, 2.0, 7.0, 3.0, 7.0, 4.0, 8.0]
        );
        // Width 7 at the first element: window [2, 9, 1, 5, 1, 9, 2] → 2.
        let filtered = median_filter(&row, 7);
        assert_eq!(filtered[0], 2.0);
        assert_eq!(filtered.len(), row.len());
        // A spike narrower than half the width is removed.
        let spike = [0.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0, 0.0, 0.0];
        assert!(median_filter(&spike, 7).iter().all(|&x| x == 0.0));
        // Rows no longer than half the width pass through.
        assert_eq!(median_filter(&[3.0, 1.0, 2.0], 7), vec![3.0, 1.0, 2.0]);
    }

    /// The matrix of one head whose attention moves along the frames: after the softmax,
    /// normalisation and filter, each text row peaks where its token's attention is.
    #[test]
    fn alignment_matrix_keeps_the_attention_diagonal() {
        let (tokens, frames) = (5, 40);
        let mut scores = vec![0f32; tokens * frames];
        for t in 0..tokens {
            for f in 0..frames {
                // Token t attends to frames 8t … 8t + 7 (and past 30 frames is padding
                // that the softmax must not see).
                let near = f / 8 == t;
                scores[t * frames + f] = if near { 6.0 } else { 0.0 };
            }
        }
        let m = alignment_matrix(&scores, 1, tokens, frames, 30, 1..4).unwrap();
        assert_eq!((m.rows, m.cols), (3, 30));
        for r in 0..3 {
            let t = r + 1;
            let best = (0..30).max_by(|&a, &b| m.at(r, a).total_cmp(&m.at(r, b)));
            assert_eq!(best.map(|f| f / 8), Some(t), "row {r}");
        }
        // Normalised along the tokens: each head's column has mean 0 before the filter, so a
        // uniform head gives all zeros.
        let flat = vec![1f32; 2 * tokens * frames];
        let m = alignment_matrix(&flat, 2, tokens, frames, frames, 0..tokens).unwrap();
        assert!(m.data.iter().all(|&x| x == 0.0));
        assert!(alignment_matrix(&flat, 2, tokens, frames + 1, frames, 0..tokens).is_err());
        assert!(alignment_matrix(&flat, 2, tokens, frames, frames, 0..tokens + 1).is_err());
    }

    /// A toy vocabulary: ids 0…9 are words and pieces, 10 and 11 the two bytes of "é".
    fn decode(tokens: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &t in tokens {
            bytes.extend_from_slice(match t {
                0 => b" Hello".as_slice(),
                1 => b",",
                2 => b" wor",
                3 => b"ld",
                4 => b"!",
                5 => b" (",
                6 => b"yes",
                7 => b")",
                8 => b" caf",
                9 => b" don",
                10 => &[0xc3],
                11 => &[0xa9],
                12 => b"'t",
                _ => b"<|special|>",
            });
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn words(split: &[(String, Vec<u32>)]) -> Vec<&str> {
        split.iter().map(|w| w.0.as_str()).collect()
    }

    #[test]
    fn words_split_at_spaces_and_punctuation_and_whole_characters() {
        let tokens = [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 9, 12];
        let split = split_on_spaces(&tokens, 20, &decode).unwrap();
        assert_eq!(
            words(&split),
            [" Hello", ",", " world", "!", " (yes", ")", " café", " don't"]
        );
        assert_eq!(split[2].1, vec![2, 3]);
        assert_eq!(split[6].1, vec![8, 10, 11]);
        // Joined, the words are the text.
        assert_eq!(
            words(&split).concat(),
            decode(&tokens).unwrap(),
            "words lose no text"
        );
        // Without spaces: pieces end where the text decodes to whole characters ("é" is two
        // tokens, one piece).
        let pieces = split_on_unicode(&[8, 10, 11, 3], &decode).unwrap();
        assert_eq!(words(&pieces), [" caf", "é", "ld"]);
        let by_language = split_words(&[8, 10, 11, 3], Some("ja"), 20, &decode).unwrap();
        assert_eq!(by_language, pieces);
        // A special token is a word of its own.
        let split = split_on_spaces(&[2, 3, 30], 20, &decode).unwrap();
        assert_eq!(split.len(), 2);
        assert_eq!(split[1].1, vec![30]);
        // A byte that never completes a character (the text ends with it) is a piece as it is.
        let split = split_on_unicode(&[2, 3, 10], &decode).unwrap();
        assert_eq!(split.last().map(|p| p.1.clone()), Some(vec![10]));
        assert_eq!(words(&split).concat(), decode(&[2, 3, 10]).unwrap());
    }

    fn timing(word: &str, tokens: &[u32], start: f64, end: f64) -> WordTiming {
        WordTiming {
            word: word.into(),
            tokens: tokens.to_vec(),
            start,
            end,
            probability: 0.5,
        }
    }

    #[test]
    fn punctuation_joins_its_neighbours() {
        let mut alignment = vec![
            timing(" Hello", &[0], 0.0, 0.5),
            timing(",", &[1], 0.5, 0.6),
            timing(" (", &[5], 0.6, 0.7),
            timing("yes", &[6], 0.7, 1.0),
            timing(")", &[7], 1.0, 1.1),
            timing(" world", &[2, 3], 1.1, 1.5),
            timing("!", &[4], 1.5, 1.6),
        ];
        merge_punctuations(&mut alignment, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS);
        let texts: Vec<&str> = alignment.iter().map(|w| w.word.as_str()).collect();
        assert_eq!(texts, [" Hello,", "", "", " (yes)", "", " world!", ""]);
        assert_eq!(alignment[0].tokens, vec![0, 1]);
        assert_eq!(alignment[3].tokens, vec![5, 6, 7]);
        assert!(alignment[1].tokens.is_empty());
        // The merged word keeps its own times.
        assert_eq!((alignment[3].start, alignment[3].end), (0.7, 1.0));
        // Punctuation after a word ending with a space stays apart.
        let mut spaced = vec![timing(" a ", &[0], 0.0, 0.1), timing(".", &[1], 0.1, 0.2)];
        merge_punctuations(&mut spaced, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS);
        assert_eq!(spaced[1].word, ".");
    }

    #[test]
    fn word_spans_come_from_the_paths_jumps() {
        // Rows: 3 text tokens and the end of text; the path enters them at frames 0, 10, 25, 40.
        let mut path = vec![];
        for (row, (from, to)) in [(0, 10), (10, 25), (25, 40), (40, 50)].iter().enumerate() {
            path.extend((*from..*to).map(|f| (row, f)));
        }
        let split = vec![
            (" Hi".to_string(), vec![7]),
            (" there".to_string(), vec![8, 9]),
        ];
        let timings = word_timings(split.clone(), &path, &[0.9, 0.5, 0.3]);
        assert_eq!(timings.len(), 2);
        assert_eq!((timings[0].start, timings[0].end), (0.0, 0.2));
        assert_eq!((timings[1].start, timings[1].end), (0.2, 0.8));
        assert!((timings[1].probability - 0.4).abs() < 1e-6);
        // A path that misses a row, or probabilities of another length: no words.
        assert!(word_timings(split.clone(), &path[..40], &[0.9, 0.5, 0.3]).is_empty());
        assert!(word_timings(split, &path, &[0.9]).is_empty());
    }

    #[test]
    fn word_differences_pair_the_same_words_in_order() {
        let word = |text: &str, start: f32, end: f32| Word {
            start,
            end,
            word: text.into(),
            probability: 1.0,
        };
        let ours = [
            word(" The", 0.0, 0.2),
            word(" cat", 0.2, 0.5),
            word(" sat.", 0.5, 0.9),
        ];
        let theirs = [
            word(" the", 0.1, 0.2),
            word(" black", 0.2, 0.3),
            word(" cat", 0.3, 0.5),
            word(" sat", 0.6, 1.0),
        ];
        let pairs = word_time_differences(&ours, &theirs);
        let rounded: Vec<(i32, i32)> = pairs
            .iter()
            .map(|&(s, e)| ((s * 100.0).round() as i32, (e * 100.0).round() as i32))
            .collect();
        assert_eq!(rounded, [(-10, 0), (-10, 0), (-10, -10)]);
        assert!(word_time_differences(&ours, &[]).is_empty());
    }

    #[test]
    fn median_duration_and_sentence_end_clamps() {
        let mut alignment = vec![
            timing(" One", &[0], 0.0, 0.2),
            timing(".", &[1], 0.2, 0.2),
            timing(" Two", &[2], 0.2, 2.0),
            timing(" three", &[3], 2.0, 2.4),
            timing(".", &[4], 2.4, 4.0),
        ];
        // Non-zero durations 0.2, 1.8, 0.4, 1.6: median 1.0, capped at 0.7.
        let (median, max) = median_and_max_duration(&alignment);
        assert!((median - 0.7).abs() < 1e-12 && (max - 1.4).abs() < 1e-12);
        truncate_long_words_at_sentence_ends(&mut alignment, max);
        // " Two" follows a sentence end: starts 1.4 s before its end.
        assert!((alignment[2].start - 0.6).abs() < 1e-9);
        // The final "." is a sentence end: ends 1.4 s after its start.
        assert!((alignment[4].end - 3.8).abs() < 1e-9);
        assert_eq!(alignment[3].end, 2.4);
        assert_eq!(
            median_and_max_duration(&[timing("a", &[0], 1.0, 1.0)]),
            (0.0, 0.0)
        );
    }

    #[test]
    fn words_go_to_their_segments_and_long_edge_words_are_clamped() {
        let alignment = vec![
            timing(" Hello,", &[0, 1], 0.0, 2.5),
            timing("", &[], 0.5, 0.6),
            timing(" world", &[2], 2.5, 2.9),
            timing(" again", &[3], 3.0, 3.3),
            timing(" bye", &[4], 3.3, 6.0),
        ];
        let mut segments = [
            SegmentSpan {
                start: 11.5,
                end: 13.0,
                text_tokens: 3,
            },
            SegmentSpan {
                start: 13.0,
                end: 14.0,
                text_tokens: 2,
            },
        ];
        let durations = (0.4, 0.8);
        let (words, last) = place_words(&alignment, &mut segments, 10.0, durations, 0.0);
        let texts: Vec<Vec<&str>> = words
            .iter()
            .map(|s| s.iter().map(|w| w.word.as_str()).collect())
            .collect();
        assert_eq!(texts, [vec![" Hello,", " world"], vec![" again", " bye"]]);
        // " Hello," after a pause and 2.5 s long: cut to 0.8 s before its end (12.5).
        assert!((words[0][0].start - 11.7).abs() < 1e-5, "{:?}", words[0][0]);
        // The first segment moves to its words: 11.7 … 12.9.
        assert!((segments[0].start - 11.7).abs() < 1e-9 && (segments[0].end - 12.9).abs() < 1e-9);
        // " bye" ends 2 s after the second segment's end (14.0): it ends at 14.0.
        assert!((words[1][1].end - 14.0).abs() < 1e-5);
        assert!((last - 14.0).abs() < 1e-9);
        for segment in &words {
            for w in segment {
                assert!(w.start <= w.end, "{w:?}");
            }
        }
    }
}
