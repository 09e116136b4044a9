//! Where a long recording holds speech, for transcribing only that: faster-whisper's
//! `vad_filter` (its `get_speech_timestamps` on Silero VAD, `collect_chunks` and
//! `restore_speech_timestamps`), read from a [`SampleSource`] window by window so a recording
//! of any length takes memory for its speech spans only.
//!
//! Speech starts at the first window whose probability reaches `threshold`; it ends where the
//! probability fell below `neg_threshold` (default `threshold − 0.15`) and stayed below
//! `threshold` for `min_silence` (default 2 s). Each span is then widened by `speech_pad`
//! (400 ms) each side, or by half the gap when two spans are closer than twice that.

use std::ops::Range;

use crate::audio::SampleSource;
use crate::vad::{SileroVad, WINDOW};
use crate::Result;

const SAMPLES_PER_MS: usize = 16;

/// When speech starts and ends: faster-whisper's `VadOptions`, with its defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpeechOptions {
    /// Windows at or above this probability are speech.
    pub threshold: f32,
    /// Windows below this end speech (after `min_silence`); `None`: `threshold − 0.15`.
    pub neg_threshold: Option<f32>,
    /// Spans not longer than this are dropped (ms).
    pub min_speech_ms: u32,
    /// Spans longer than this are split at their last silence of 98 ms or more, else cut.
    pub max_speech_seconds: f32,
    /// Silence that ends a span (ms).
    pub min_silence_ms: u32,
    /// Padding each side of a span (ms).
    pub speech_pad_ms: u32,
}

impl Default for SpeechOptions {
    fn default() -> Self {
        Self {
            threshold: 0.5,
            neg_threshold: None,
            min_speech_ms: 0,
            max_speech_seconds: f32::INFINITY,
            min_silence_ms: 2_000,
            speech_pad_ms: 400,
        }
    }
}

/// The spans of `source` (16 kHz samples) that hold speech, in samples, sorted and disjoint,
/// and the recording's length. Reads the source once, from where it is; `vad` starts afresh.
pub fn speech_spans<S: SampleSource>(
    vad: &mut SileroVad,
    source: &mut S,
    options: &SpeechOptions,
) -> Result<(Vec<Range<usize>>, usize)> {
    vad.reset();
    let mut tracker = SpanTracker::new(options);
    let mut buffer = Vec::with_capacity(WINDOW);
    let mut length = 0;
    loop {
        let wanted = WINDOW - buffer.len();
        let read = source.read(&mut buffer, wanted)?;
        length += read;
        if read > 0 && buffer.len() < WINDOW {
            continue;
        }
        // The last window is padded with zeros; a recording of whole windows gets one more
        // window of zeros, as faster-whisper pads it.
        let end = read == 0;
        buffer.resize(WINDOW, 0.0);
        tracker.push(vad.push_window(&buffer)?);
        buffer.clear();
        if end {
            return Ok((tracker.finish(length), length));
        }
    }
}

/// `get_speech_timestamps`' loop over window probabilities, one window at a time.
struct SpanTracker {
    threshold: f32,
    neg_threshold: f32,
    min_speech: usize,
    max_speech: f64,
    min_silence: usize,
    pad: usize,
    window: usize,
    speaking: bool,
    start: usize,
    /// Where a silence began that may end the span (0: none).
    silence_start: usize,
    /// The last silence of 98 ms or more, and the speech after it, for splitting long spans.
    previous_end: usize,
    next_start: usize,
    spans: Vec<Range<usize>>,
}

impl SpanTracker {
    fn new(options: &SpeechOptions) -> Self {
        let pad = options.speech_pad_ms as usize * SAMPLES_PER_MS;
        Self {
            threshold: options.threshold,
            neg_threshold: options
                .neg_threshold
                .unwrap_or((options.threshold - 0.15).max(0.01)),
            min_speech: options.min_speech_ms as usize * SAMPLES_PER_MS,
            max_speech: f64::from(options.max_speech_seconds) * 16_000.0
                - WINDOW as f64
                - 2.0 * pad as f64,
            min_silence: options.min_silence_ms as usize * SAMPLES_PER_MS,
            pad,
            window: 0,
            speaking: false,
            start: 0,
            silence_start: 0,
            previous_end: 0,
            next_start: 0,
            spans: Vec::new(),
        }
    }

    fn push(&mut self, probability: f32) {
        let here = self.window * WINDOW;
        self.window += 1;
        let speech = probability >= self.threshold;
        if speech && self.silence_start != 0 {
            self.silence_start = 0;
            if self.next_start < self.previous_end {
                self.next_start = here;
            }
        }
        if speech && !self.speaking {
            self.speaking = true;
            self.start = here;
            return;
        }
        if self.speaking && (here - self.start) as f64 > self.max_speech {
            if self.previous_end != 0 {
                self.spans.push(self.start..self.previous_end);
                if self.next_start < self.previous_end {
                    self.speaking = false;
                } else {
                    self.start = self.next_start;
                }
                (self.previous_end, self.next_start, self.silence_start) = (0, 0, 0);
            } else {
                self.spans.push(self.start..here);
                (self.previous_end, self.next_start, self.silence_start) = (0, 0, 0);
                self.speaking = false;
                return;
            }
        }
        if self.speaking && probability < self.neg_threshold {
            if self.silence_start == 0 {
                self.silence_start = here;
            }
            // A silence of 98 ms or more is where a span too long may be split.
            if here - self.silence_start > 98 * SAMPLES_PER_MS {
                self.previous_end = self.silence_start;
            }
            if here - self.silence_start >= self.min_silence {
                if self.silence_start - self.start > self.min_speech {
                    self.spans.push(self.start..self.silence_start);
                }
                (self.previous_end, self.next_start, self.silence_start) = (0, 0, 0);
                self.speaking = false;
            }
        }
    }

    /// The spans of a recording of `length` samples, padded.
    fn finish(mut self, length: usize) -> Vec<Range<usize>> {
        if self.speaking && length.saturating_sub(self.start) > self.min_speech {
            self.spans.push(self.start..length);
        }
        let mut spans = self.spans;
        for i in 0..spans.len() {
            if i == 0 {
                spans[0].start = spans[0].start.saturating_sub(self.pad);
            }
            if i + 1 < spans.len() {
                let gap = spans[i + 1].start.saturating_sub(spans[i].end);
                if gap < 2 * self.pad {
                    spans[i].end += gap / 2;
                    spans[i + 1].start -= gap / 2;
                } else {
                    spans[i].end = (spans[i].end + self.pad).min(length);
                    spans[i + 1].start -= self.pad;
                }
            } else {
                spans[i].end = (spans[i].end + self.pad).min(length);
            }
        }
        spans.retain(|span| span.start < span.end);
        spans
    }
}

/// A [`SampleSource`] of only the speech spans of another, joined (faster-whisper's
/// `collect_chunks`).
pub struct SpeechOnly<S> {
    source: S,
    spans: Vec<Range<usize>>,
    /// Samples of `source` read so far.
    position: usize,
    /// The span `position` is in or before.
    span: usize,
    scratch: Vec<f32>,
}

impl<S: SampleSource> SpeechOnly<S> {
    /// `spans` sorted and disjoint, as [`speech_spans`] gives them; `source` at its start.
    pub fn new(source: S, spans: Vec<Range<usize>>) -> Self {
        Self {
            source,
            spans,
            position: 0,
            span: 0,
            scratch: Vec::new(),
        }
    }

    /// Samples of speech.
    pub fn len(&self) -> usize {
        self.spans.iter().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<S: SampleSource> SampleSource for SpeechOnly<S> {
    fn read(&mut self, out: &mut Vec<f32>, max: usize) -> Result<usize> {
        let mut given = 0;
        while given < max {
            let Some(span) = self.spans.get(self.span).cloned() else {
                break;
            };
            if self.position >= span.end {
                self.span += 1;
                continue;
            }
            // Up to the span's end: the silence before it is read and dropped.
            let want = if self.position < span.start {
                (span.start - self.position).min(1 << 16)
            } else {
                (span.end - self.position).min(max - given)
            };
            self.scratch.clear();
            let read = self.source.read(&mut self.scratch, want)?;
            if read == 0 {
                break;
            }
            let keep_from = span.start.saturating_sub(self.position).min(read);
            out.extend_from_slice(&self.scratch[keep_from..read]);
            given += read - keep_from;
            self.position += read;
        }
        Ok(given)
    }

    fn rewind(&mut self) -> Result<()> {
        self.source.rewind()?;
        self.position = 0;
        self.span = 0;
        Ok(())
    }
}

/// Times in the joined speech back to times in the recording (faster-whisper's
/// `SpeechTimestampsMap`, rounded to 10 ms as it rounds).
#[derive(Clone, Debug)]
pub struct SpeechTimeline {
    /// Where each span ends in the joined speech (samples).
    joined_ends: Vec<usize>,
    /// Silence before each span (seconds).
    silence_before: Vec<f64>,
}

impl SpeechTimeline {
    pub fn new(spans: &[Range<usize>]) -> Self {
        let (mut previous_end, mut silence) = (0, 0);
        let (mut joined_ends, mut silence_before) = (Vec::new(), Vec::new());
        for span in spans {
            silence += span.start - previous_end;
            previous_end = span.end;
            joined_ends.push(span.end - silence);
            silence_before.push(silence as f64 / 16_000.0);
        }
        Self {
            joined_ends,
            silence_before,
        }
    }

    /// The span a time of the joined speech falls in; an end exactly at a span's end stays
    /// in that span.
    pub fn span_of(&self, seconds: f32, is_end: bool) -> usize {
        let sample = (f64::from(seconds) * 16_000.0) as usize;
        if is_end {
            if let Some(i) = self.joined_ends.iter().position(|&end| end == sample) {
                return i;
            }
        }
        let after = self.joined_ends.partition_point(|&end| end <= sample);
        after.min(self.joined_ends.len().saturating_sub(1))
    }

    /// `seconds` of the joined speech, in span `span`, as seconds of the recording.
    pub fn original_time(&self, seconds: f32, span: usize) -> f32 {
        let silence = self.silence_before.get(span).copied().unwrap_or(0.0);
        ((silence + f64::from(seconds)) * 100.0).round() as f32 / 100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::Samples;

    fn spans_of(probabilities: &[f32], options: &SpeechOptions) -> Vec<Range<usize>> {
        let mut tracker = SpanTracker::new(options);
        for &p in probabilities {
            tracker.push(p);
        }
        tracker.finish(probabilities.len() * WINDOW)
    }

    /// Probabilities: `speech` windows of speech at each start, silence elsewhere.
    fn probabilities(windows: usize, speech: &[Range<usize>]) -> Vec<f32> {
        (0..windows)
            .map(|w| {
                if speech.iter().any(|s| s.contains(&w)) {
                    0.9
                } else {
                    0.05
                }
            })
            .collect()
    }

    #[test]
    fn speech_is_found_padded_and_short_pauses_do_not_split_it() {
        let options = SpeechOptions::default();
        // Speech in windows 100..200 and 210..300 (a 320 ms pause), then 600..700 (a pause of
        // 9.6 s), in 1000 windows (32 s).
        let p = probabilities(1000, &[100..200, 210..300, 600..700]);
        let spans = spans_of(&p, &options);
        let pad = 400 * 16;
        assert_eq!(
            spans,
            vec![
                100 * WINDOW - pad..300 * WINDOW + pad,
                600 * WINDOW - pad..700 * WINDOW + pad
            ]
        );
    }

    #[test]
    fn close_spans_share_the_gap_and_the_ends_stay_in_the_recording() {
        let options = SpeechOptions {
            min_silence_ms: 100,
            ..SpeechOptions::default()
        };
        // Speech to the very end; a gap of 20 windows (640 ms < 2 × 400 ms) is shared.
        let p = probabilities(300, &[5..100, 120..300]);
        let spans = spans_of(&p, &options);
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].start, 0);
        assert_eq!(spans[0].end, spans[1].start);
        assert_eq!(spans[0].end, 110 * WINDOW);
        assert_eq!(spans[1].end, 300 * WINDOW);
    }

    #[test]
    fn long_speech_is_split_at_its_last_pause_or_cut() {
        let options = SpeechOptions {
            max_speech_seconds: 10.0,
            speech_pad_ms: 0,
            ..SpeechOptions::default()
        };
        // 20 s of speech with one 200 ms pause at 6 s: split there.
        let p = probabilities(625, &[0..187, 194..625]);
        let spans = spans_of(&p, &options);
        assert!(spans.len() >= 2, "{spans:?}");
        assert_eq!(spans[0], 0..187 * WINDOW);
        assert!(spans.iter().all(|s| s.len() as f64 <= 10.0 * 16_000.0));
        // No pause at all: cut just before the limit.
        let spans = spans_of(
            &probabilities(625, std::slice::from_ref(&(0..625))),
            &options,
        );
        assert!(
            spans.len() >= 2 && spans.iter().all(|s| s.len() <= 160_000),
            "{spans:?}"
        );
    }

    #[test]
    fn only_speech_is_read_and_times_map_back() {
        let samples: Vec<f32> = (0..100_000).map(|i| i as f32).collect();
        let spans = vec![1_000..3_000, 50_000..50_500, 99_000..100_000];
        for piece in [7, 512, 100_000] {
            let mut speech = SpeechOnly::new(Samples::new(&samples), spans.clone());
            let mut joined = Vec::new();
            while speech.read(&mut joined, piece).unwrap() > 0 {}
            let expected: Vec<f32> = spans
                .iter()
                .flat_map(|s| samples[s.clone()].to_vec())
                .collect();
            assert_eq!(joined, expected, "pieces of {piece}");
            speech.rewind().unwrap();
            let mut again = Vec::new();
            while speech.read(&mut again, 1_000).unwrap() > 0 {}
            assert_eq!(again, expected);
        }
        let timeline = SpeechTimeline::new(&spans);
        // 0.1 s into the joined speech is 1 000 + 1 600 samples of the recording.
        let t = 0.1;
        assert_eq!(timeline.original_time(t, timeline.span_of(t, false)), 0.16);
        // The first span's end (2 000 joined samples) stays in it as an end.
        assert_eq!(timeline.span_of(0.125, true), 0);
        assert_eq!(timeline.span_of(0.125, false), 1);
        // Inside the second span: 2 000 + 100 joined samples → 50 100 of the recording.
        assert_eq!(timeline.original_time(2_100.0 / 16_000.0, 1), 3.13);
    }
}
