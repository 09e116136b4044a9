//! Silence at the ends of synthesized speech.
//!
//! A neural voice opens and closes every run of its model with silence of its own (Kokoro:
//! about 0.3 s before the first word and 0.45 s after the last). Before the first word it is
//! time the listener waits; between two sentences, or between a first piece and the rest of
//! its sentence, the two add up to a pause longer than a speaker makes. [`SilenceMargins`]
//! keeps a natural margin and drops the rest.

use std::ops::Range;
use std::time::Duration;

use crate::timing::{duration_of, samples_in};
use crate::AudioChunk;

/// Loudness is measured over frames this long.
const FRAME: Duration = Duration::from_millis(10);

/// A frame is speech when its RMS is within this many decibels of the loudest frame's: deep
/// enough for the soft onset of a fricative ("f", "h", "s"), far above a voice's silence.
const SPEECH_RANGE_DB: f32 = 45.0;

/// A frame this quiet (RMS, about −80 dBFS) is silence whatever the loudest frame.
const SILENCE_FLOOR: f32 = 1e-4;

/// The samples from the first frame of speech to the end of the last one; `None` when no frame
/// is speech (silence, or no samples).
pub fn speech_span(samples: &[f32], sample_rate: u32) -> Option<Range<usize>> {
    let frame = (sample_rate as usize * FRAME.as_millis() as usize / 1000).max(1);
    let rms: Vec<f32> = samples
        .chunks(frame)
        .map(|f| (f.iter().map(|s| s * s).sum::<f32>() / f.len() as f32).sqrt())
        .collect();
    let loudest = rms.iter().copied().fold(0.0, f32::max);
    let threshold = (loudest * 10f32.powf(-SPEECH_RANGE_DB / 20.0)).max(SILENCE_FLOOR);
    let first = rms.iter().position(|&r| r >= threshold)?;
    let last = rms.iter().rposition(|&r| r >= threshold)?;
    Some(first * frame..((last + 1) * frame).min(samples.len()))
}

/// How much silence to keep before the first word and after the last when a voice's own is
/// longer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SilenceMargins {
    /// Kept before the first frame of speech (the onset's fade-in).
    pub before: Duration,
    /// Kept after the last frame of speech: with the next run's margin before, the pause
    /// between two sentences.
    pub after: Duration,
}

impl Default for SilenceMargins {
    /// 50 ms before and 250 ms after: 300 ms between sentences, a speaker's pause.
    fn default() -> Self {
        Self {
            before: Duration::from_millis(50),
            after: Duration::from_millis(250),
        }
    }
}

impl SilenceMargins {
    /// Trims the silence before the speech of the first chunk and after the speech of the
    /// last down to the margins; chunks in between, and a chunk without speech, are kept
    /// whole. Silence shorter than a margin is left as it is.
    pub fn trim(&self, chunks: &mut [AudioChunk]) {
        if let Some(first) = chunks.first_mut() {
            if let Some(span) = speech_span(&first.samples, first.sample_rate) {
                let keep = samples_in(self.before, first.sample_rate);
                first.samples.drain(..span.start.saturating_sub(keep));
            }
        }
        if let Some(last) = chunks.last_mut() {
            if let Some(span) = speech_span(&last.samples, last.sample_rate) {
                let keep = samples_in(self.after, last.sample_rate);
                last.samples.truncate(span.end.saturating_add(keep));
            }
        }
    }
}

/// How long the silence before the first frame of speech of `chunk` lasts (all of it when
/// there is no speech).
pub fn silence_before(chunk: &AudioChunk) -> Duration {
    let start =
        speech_span(&chunk.samples, chunk.sample_rate).map_or(chunk.samples.len(), |s| s.start);
    duration_of(start, chunk.sample_rate)
}

/// How long the silence after the last frame of speech of `chunk` lasts (all of it when there
/// is no speech).
pub fn silence_after(chunk: &AudioChunk) -> Duration {
    let end = speech_span(&chunk.samples, chunk.sample_rate).map_or(0, |s| s.end);
    duration_of(chunk.samples.len() - end, chunk.sample_rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u32 = 24_000;

    /// `before` s of silence, `speech` s of a 200 Hz tone, `after` s of silence.
    fn tone_in_silence(before: f64, speech: f64, after: f64) -> AudioChunk {
        let n = |s: f64| (s * f64::from(RATE)) as usize;
        let tone = (0..n(speech))
            .map(|i| 0.5 * (2.0 * std::f32::consts::PI * 200.0 * i as f32 / RATE as f32).sin());
        AudioChunk {
            samples: std::iter::repeat_n(0.0, n(before))
                .chain(tone)
                .chain(std::iter::repeat_n(0.0, n(after)))
                .collect(),
            sample_rate: RATE,
        }
    }

    fn ms(d: Duration) -> u128 {
        (d.as_secs_f64() * 1000.0).round() as u128
    }

    #[test]
    fn the_span_of_speech_is_found_between_silences() {
        let chunk = tone_in_silence(0.3, 1.0, 0.45);
        assert_eq!(speech_span(&chunk.samples, RATE), Some(7_200..31_200));
        assert_eq!(ms(silence_before(&chunk)), 300);
        assert_eq!(ms(silence_after(&chunk)), 450);
        assert_eq!(speech_span(&[0.0; 1000], RATE), None);
        assert_eq!(speech_span(&[], RATE), None);
        // Quiet speech is speech: the threshold follows the loudest frame.
        let mut quiet = tone_in_silence(0.1, 0.5, 0.1);
        quiet.samples.iter_mut().for_each(|s| *s *= 0.01);
        assert_eq!(ms(silence_before(&quiet)), 100);
    }

    #[test]
    fn a_soft_onset_stays_speech() {
        // Ten frames 40 dB below the loudest (an "h" before a vowel) are kept as speech.
        let mut chunk = tone_in_silence(0.2, 0.1, 0.0);
        chunk.samples.iter_mut().for_each(|s| *s *= 0.01);
        chunk.samples.extend(tone_in_silence(0.0, 0.5, 0.2).samples);
        assert_eq!(ms(silence_before(&chunk)), 200);
    }

    #[test]
    fn trimming_keeps_the_margins_and_the_speech() {
        let margins = SilenceMargins::default();
        let mut chunks = vec![
            tone_in_silence(0.3, 1.0, 0.45),
            tone_in_silence(0.3, 0.5, 0.45),
        ];
        let untouched_first_end = chunks[0].samples[7_200..].to_vec();
        margins.trim(&mut chunks);
        assert_eq!(ms(silence_before(&chunks[0])), 50);
        assert_eq!(
            ms(silence_after(&chunks[0])),
            450,
            "only the last chunk's end is trimmed"
        );
        assert_eq!(chunks[0].samples[1_200..], untouched_first_end[..]);
        assert_eq!(
            ms(silence_before(&chunks[1])),
            300,
            "only the first chunk's start"
        );
        assert_eq!(ms(silence_after(&chunks[1])), 250);
    }

    #[test]
    fn short_silence_and_silent_chunks_are_left_alone() {
        let margins = SilenceMargins::default();
        let mut short = vec![tone_in_silence(0.02, 0.5, 0.1)];
        let before = short.clone();
        margins.trim(&mut short);
        assert_eq!(short, before);
        let mut silent = vec![AudioChunk {
            samples: vec![0.0; 4_800],
            sample_rate: RATE,
        }];
        margins.trim(&mut silent);
        assert_eq!(silent[0].samples.len(), 4_800);
        margins.trim(&mut []);
    }
}
