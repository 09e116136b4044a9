//! End of speech from the audio itself: an energy detector on 20 ms frames with an adaptive
//! noise floor. An utterance starts after a run of voiced frames and ends after a configurable
//! silence; the end of speech is the end of its last voiced frame, so the silence the detector
//! waits for is visible in every latency measured from it.
//!
//! The noise floor is the quietest frame of the last [`NOISE_WINDOW`] (minimum statistics):
//! speech pauses between words often enough to show it, and a steady noise becomes the floor
//! within the window. A stream that starts in the middle of speech is heard from its first
//! pause on (the listener's pre-roll recovers the audio before it).

use std::collections::VecDeque;
use std::time::Duration;

use crate::{Error, Result};

/// Samples per second of the audio the detector (and Whisper) takes.
pub const SAMPLE_RATE: u32 = 16_000;

/// Level of digital silence, in dBFS: frames quieter than this count as this.
const SILENCE_DB: f32 = -100.0;

/// The noise floor is the quietest frame of this much recent audio.
pub const NOISE_WINDOW: Duration = Duration::from_secs(2);

/// Settings of the [`EndpointDetector`].
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointConfig {
    /// Length of the frames whose energy is measured: a whole number of samples at
    /// [`SAMPLE_RATE`] (a multiple of 62.5 µs), so that stream times counted in frames fall on
    /// samples. Default 20 ms.
    pub frame: Duration,
    /// Silence that ends an utterance. Default 500 ms; shorter answers sooner but cuts
    /// speakers who pause mid-sentence.
    pub silence: Duration,
    /// Voiced audio in a row that starts an utterance (clicks and breaths are shorter).
    /// Default 100 ms.
    pub min_speech: Duration,
    /// How far above the noise floor a frame must be to count as voiced, in dB. Default 12.
    pub above_noise_db: f32,
    /// The quietest level that can count as voiced, in dBFS, however quiet the noise. Default
    /// −50.
    pub min_level_dbfs: f32,
    /// Longest utterance: one this long ends even without a pause (Whisper hears at most
    /// 30 seconds at once). Default 30 s.
    pub max_utterance: Duration,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            frame: Duration::from_millis(20),
            silence: Duration::from_millis(500),
            min_speech: Duration::from_millis(100),
            above_noise_db: 12.0,
            min_level_dbfs: -50.0,
            max_utterance: Duration::from_secs(30),
        }
    }
}

impl EndpointConfig {
    /// Samples per frame, or an error for settings that cannot work.
    fn frame_samples(&self) -> Result<usize> {
        let samples = samples_in(self.frame);
        if samples == 0 {
            return Err(Error::Config(format!(
                "an endpoint frame of {:?} holds no sample at {SAMPLE_RATE} Hz",
                self.frame
            )));
        }
        if !(self.frame.as_nanos() * u128::from(SAMPLE_RATE)).is_multiple_of(1_000_000_000) {
            return Err(Error::Config(format!(
                "an endpoint frame of {:?} is not a whole number of samples at {SAMPLE_RATE} Hz \
                 (make it a multiple of 62.5 µs)",
                self.frame
            )));
        }
        if self.silence < self.frame {
            return Err(Error::Config(format!(
                "the end-of-speech silence ({:?}) is shorter than a frame ({:?})",
                self.silence, self.frame
            )));
        }
        if self.max_utterance <= self.min_speech {
            return Err(Error::Config(format!(
                "the longest utterance ({:?}) is not longer than the shortest speech ({:?})",
                self.max_utterance, self.min_speech
            )));
        }
        if !self.above_noise_db.is_finite() || !self.min_level_dbfs.is_finite() {
            return Err(Error::Config("endpoint levels must be finite".into()));
        }
        Ok(samples)
    }
}

/// Where an utterance starts or ends, in stream time (from the first sample pushed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    /// Speech started at `at` (the start of its first voiced frame); detected `min_speech`
    /// later.
    Started { at: Duration },
    /// Speech ended at `speech_end` (the end of its last voiced frame); detected at
    /// `detected_at`, after the configured silence (or at the longest utterance, or the end
    /// of the stream).
    Ended {
        speech_end: Duration,
        detected_at: Duration,
    },
}

/// Finds utterances in a stream of 16 kHz mono audio pushed in pieces of any size.
#[derive(Clone, Debug)]
pub struct EndpointDetector {
    config: EndpointConfig,
    frame_samples: usize,
    /// Samples of the frame being filled.
    partial_frame: Vec<f32>,
    /// Whole frames measured so far.
    frames: u64,
    /// Levels of the last [`NOISE_WINDOW`] of frames, in dBFS: the noise floor is their minimum.
    recent_levels: VecDeque<f32>,
    noise_window_frames: usize,
    /// Voiced frames in a row (before an utterance is confirmed).
    voiced_run: u64,
    /// The current utterance's first frame, once confirmed.
    utterance_start: Option<u64>,
    /// One past the last voiced frame of the current utterance.
    last_voiced_end: u64,
}

impl EndpointDetector {
    pub fn new(config: EndpointConfig) -> Result<Self> {
        let frame_samples = config.frame_samples()?;
        let noise_window_frames =
            (NOISE_WINDOW.as_secs_f64() / config.frame.as_secs_f64()).ceil() as usize;
        Ok(Self {
            config,
            frame_samples,
            partial_frame: Vec::with_capacity(frame_samples),
            frames: 0,
            recent_levels: VecDeque::new(),
            noise_window_frames,
            voiced_run: 0,
            utterance_start: None,
            last_voiced_end: 0,
        })
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    /// Whether an utterance is in progress.
    pub fn in_speech(&self) -> bool {
        self.utterance_start.is_some()
    }

    /// In an utterance, the end of its last voiced frame.
    pub fn last_voiced_end(&self) -> Option<Duration> {
        self.utterance_start
            .map(|_| self.frame_time(self.last_voiced_end))
    }

    /// Stream time of the samples measured so far (whole frames).
    pub fn now(&self) -> Duration {
        self.frame_time(self.frames)
    }

    /// Measures `samples` and returns the boundaries they complete, in order.
    pub fn push(&mut self, samples: &[f32]) -> Vec<Boundary> {
        let mut boundaries = Vec::new();
        let mut rest = samples;
        while !rest.is_empty() {
            let room = self.frame_samples - self.partial_frame.len();
            let (now, later) = rest.split_at(rest.len().min(room));
            self.partial_frame.extend_from_slice(now);
            rest = later;
            if self.partial_frame.len() == self.frame_samples {
                let level = level_dbfs(&self.partial_frame);
                self.partial_frame.clear();
                boundaries.extend(self.measure(level));
            }
        }
        boundaries
    }

    /// In an utterance, how long it has been silent: from the end of its last voiced frame to
    /// the audio measured so far.
    pub fn silence(&self) -> Option<Duration> {
        self.utterance_start
            .map(|_| self.frame_time(self.frames - self.last_voiced_end))
    }

    /// Ends the utterance in progress now, before the configured silence has passed (the
    /// caller judged the turn over): it ended at its last voiced frame.
    pub fn end_now(&mut self) -> Option<Boundary> {
        let boundary = self.finish();
        self.voiced_run = 0;
        boundary
    }

    /// The utterance in progress is the continuation of one that started at `at` (its
    /// speaker paused, and a shorter silence ended it): the longest utterance counts from
    /// there. Ignored outside an utterance or for a time after its start.
    pub fn continue_from(&mut self, at: Duration) {
        if let Some(start) = self.utterance_start {
            let frame = (at.as_nanos() / self.config.frame.as_nanos().max(1)) as u64;
            self.utterance_start = Some(start.min(frame));
        }
    }

    /// The stream ends: an utterance in progress ends at its last voiced frame.
    pub fn finish(&mut self) -> Option<Boundary> {
        self.utterance_start.take().map(|_| Boundary::Ended {
            speech_end: self.frame_time(self.last_voiced_end),
            detected_at: self.now(),
        })
    }

    /// One frame at `level` dBFS.
    fn measure(&mut self, level: f32) -> Option<Boundary> {
        let frame = self.frames;
        self.frames += 1;
        if self.recent_levels.len() == self.noise_window_frames {
            self.recent_levels.pop_front();
        }
        self.recent_levels.push_back(level);
        let noise_db = self
            .recent_levels
            .iter()
            .copied()
            .fold(f32::INFINITY, f32::min);
        let threshold = (noise_db + self.config.above_noise_db).max(self.config.min_level_dbfs);
        let voiced = level > threshold;
        if voiced {
            self.voiced_run += 1;
            self.last_voiced_end = self.frames;
        } else {
            self.voiced_run = 0;
        }
        match self.utterance_start {
            None => {
                if voiced && self.frame_time(self.voiced_run) >= self.config.min_speech {
                    let start = self.frames - self.voiced_run;
                    self.utterance_start = Some(start);
                    return Some(Boundary::Started {
                        at: self.frame_time(start),
                    });
                }
                None
            }
            Some(start) => {
                let silent_for = self.frame_time(self.frames - self.last_voiced_end);
                let long_for = self.frame_time(self.frames - start);
                if silent_for >= self.config.silence || long_for >= self.config.max_utterance {
                    self.utterance_start = None;
                    self.voiced_run = 0;
                    return Some(Boundary::Ended {
                        speech_end: self.frame_time(self.last_voiced_end),
                        detected_at: self.frame_time(frame + 1),
                    });
                }
                None
            }
        }
    }

    fn frame_time(&self, frames: u64) -> Duration {
        self.config.frame * u32::try_from(frames).unwrap_or(u32::MAX)
    }
}

/// Samples in `duration` at [`SAMPLE_RATE`].
pub fn samples_in(duration: Duration) -> usize {
    (duration.as_secs_f64() * f64::from(SAMPLE_RATE)).round() as usize
}

/// Stream time of `samples` samples at [`SAMPLE_RATE`].
pub fn duration_of(samples: usize) -> Duration {
    Duration::from_secs_f64(samples as f64 / f64::from(SAMPLE_RATE))
}

/// Root-mean-square level of `samples` in dBFS (a full-scale sine is −3 dBFS).
fn level_dbfs(samples: &[f32]) -> f32 {
    let power = samples.iter().map(|s| s * s).sum::<f32>() / samples.len().max(1) as f32;
    if power <= 0.0 || !power.is_finite() {
        return SILENCE_DB;
    }
    (10.0 * power.log10()).max(SILENCE_DB)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// A 220 Hz tone at `amplitude` for `millis`.
    fn tone(millis: u64, amplitude: f32) -> Vec<f32> {
        (0..samples_in(ms(millis)))
            .map(|i| {
                let t = i as f32 / SAMPLE_RATE as f32;
                amplitude * (2.0 * std::f32::consts::PI * 220.0 * t).sin()
            })
            .collect()
    }

    /// Deterministic noise of roughly `amplitude` RMS.
    fn noise(millis: u64, amplitude: f32) -> Vec<f32> {
        let mut state = 0x2545_f491_u32;
        (0..samples_in(ms(millis)))
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                amplitude * 1.7 * (state as f32 / u32::MAX as f32 - 0.5)
            })
            .collect()
    }

    fn detect(audio: &[f32], config: EndpointConfig, piece: usize) -> Vec<Boundary> {
        let mut detector = EndpointDetector::new(config).unwrap();
        let mut found: Vec<Boundary> = audio.chunks(piece).flat_map(|p| detector.push(p)).collect();
        found.extend(detector.finish());
        found
    }

    #[test]
    fn finds_an_utterance_and_its_end_after_the_silence() {
        let audio = [
            vec![0.0; samples_in(ms(400))],
            tone(1000, 0.3),
            vec![0.0; samples_in(ms(1000))],
        ]
        .concat();
        let found = detect(&audio, EndpointConfig::default(), 333);
        assert_eq!(
            found,
            vec![
                Boundary::Started { at: ms(400) },
                Boundary::Ended {
                    speech_end: ms(1400),
                    detected_at: ms(1900)
                }
            ]
        );
    }

    #[test]
    fn the_same_boundaries_whatever_the_piece_size() {
        let audio = [
            noise(300, 0.002),
            tone(700, 0.2),
            noise(200, 0.002),
            tone(500, 0.2),
            noise(900, 0.002),
        ]
        .concat();
        let whole = detect(&audio, EndpointConfig::default(), audio.len());
        for piece in [1, 160, 320, 1000, 4801] {
            assert_eq!(
                detect(&audio, EndpointConfig::default(), piece),
                whole,
                "piece {piece}"
            );
        }
        // The 200 ms pause is shorter than the silence: one utterance.
        assert_eq!(whole.len(), 2);
    }

    #[test]
    fn pauses_longer_than_the_silence_split_utterances() {
        let audio = [
            vec![0.0; samples_in(ms(200))],
            tone(500, 0.2),
            vec![0.0; samples_in(ms(300))],
            tone(500, 0.2),
            vec![0.0; samples_in(ms(600))],
        ]
        .concat();
        let short = EndpointConfig {
            silence: ms(250),
            ..EndpointConfig::default()
        };
        let found = detect(&audio, short, 320);
        assert_eq!(
            found,
            vec![
                Boundary::Started { at: ms(200) },
                Boundary::Ended {
                    speech_end: ms(700),
                    detected_at: ms(960)
                },
                Boundary::Started { at: ms(1000) },
                Boundary::Ended {
                    speech_end: ms(1500),
                    detected_at: ms(1760)
                },
            ]
        );
    }

    #[test]
    fn clicks_and_steady_noise_are_not_speech() {
        let click = tone(40, 0.5);
        let audio = [
            noise(500, 0.01),
            click.clone(),
            noise(800, 0.01),
            click,
            noise(2000, 0.01),
        ]
        .concat();
        assert_eq!(detect(&audio, EndpointConfig::default(), 320), vec![]);
        // Speech above the same noise is found.
        let audio = [noise(500, 0.01), tone(600, 0.3), noise(800, 0.01)].concat();
        let found = detect(&audio, EndpointConfig::default(), 320);
        assert_eq!(found[0], Boundary::Started { at: ms(500) });
        assert!(matches!(found[1], Boundary::Ended { speech_end, .. } if speech_end == ms(1100)));
    }

    #[test]
    fn speech_at_the_end_of_the_stream_ends_there() {
        let audio = [vec![0.0; samples_in(ms(200))], tone(600, 0.3)].concat();
        let found = detect(&audio, EndpointConfig::default(), 320);
        assert_eq!(
            found,
            vec![
                Boundary::Started { at: ms(200) },
                Boundary::Ended {
                    speech_end: ms(800),
                    detected_at: ms(800)
                }
            ]
        );
    }

    #[test]
    fn speech_without_a_pause_is_cut_at_the_longest_utterance() {
        let config = EndpointConfig {
            max_utterance: ms(1000),
            ..EndpointConfig::default()
        };
        let audio = [vec![0.0; samples_in(ms(200))], tone(1500, 0.3)].concat();
        let found = detect(&audio, config, 320);
        assert_eq!(
            found,
            vec![
                Boundary::Started { at: ms(200) },
                Boundary::Ended {
                    speech_end: ms(1200),
                    detected_at: ms(1200)
                },
                Boundary::Started { at: ms(1200) },
                Boundary::Ended {
                    speech_end: ms(1700),
                    detected_at: ms(1700)
                },
            ]
        );
    }

    #[test]
    fn a_steady_sound_becomes_the_noise_floor() {
        // A tone that never stops is speech until the floor window holds nothing else.
        let audio = [vec![0.0; samples_in(ms(200))], tone(4000, 0.3)].concat();
        let found = detect(&audio, EndpointConfig::default(), 320);
        assert_eq!(found[0], Boundary::Started { at: ms(200) });
        assert!(
            matches!(found[1], Boundary::Ended { speech_end, detected_at }
                if speech_end == ms(2180) && detected_at == ms(2680)),
            "{found:?}"
        );
        assert_eq!(found.len(), 2);
    }

    #[test]
    fn impossible_settings_are_refused() {
        let bad = [
            EndpointConfig {
                frame: Duration::ZERO,
                ..EndpointConfig::default()
            },
            // 320.48 and 533.33 samples: a clock counted in frames would run ahead of the audio.
            EndpointConfig {
                frame: Duration::from_micros(20_030),
                ..EndpointConfig::default()
            },
            EndpointConfig {
                frame: Duration::from_secs_f64(1.0 / 30.0),
                ..EndpointConfig::default()
            },
            EndpointConfig {
                silence: ms(10),
                ..EndpointConfig::default()
            },
            EndpointConfig {
                max_utterance: ms(50),
                ..EndpointConfig::default()
            },
            EndpointConfig {
                above_noise_db: f32::NAN,
                ..EndpointConfig::default()
            },
        ];
        for config in bad {
            assert!(matches!(
                EndpointDetector::new(config),
                Err(Error::Config(_))
            ));
        }
        // Any whole number of samples is a frame: 62.5 µs, 30.0625 ms.
        for nanos in [62_500, 30_062_500] {
            let config = EndpointConfig {
                frame: Duration::from_nanos(nanos),
                ..EndpointConfig::default()
            };
            assert!(EndpointDetector::new(config).is_ok(), "{nanos} ns");
        }
    }
}
