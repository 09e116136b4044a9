//! End of speech from the audio itself: each frame is voiced or not, by its energy above an
//! adaptive noise floor (20 ms frames, the default) or by Silero VAD's network (32 ms frames,
//! [`Vad::Silero`]). An utterance starts after a run of voiced frames and ends after a
//! configurable silence; the end of speech is the end of its last voiced frame, so the silence
//! the detector waits for is visible in every latency measured from it.
//!
//! The energy detector's noise floor is the quietest frame of the last [`NOISE_WINDOW`]
//! (minimum statistics): speech pauses between words often enough to show it, and a steady
//! noise becomes the floor within the window. A stream that starts in the middle of speech is
//! heard from its first pause on (the listener's pre-roll recovers the audio before it).
//!
//! Silero VAD ([`engine_asr::SileroVad`]) tells speech from noise by its spectrum rather than
//! its level: a frame becomes voiced when the speech probability reaches the threshold and
//! stays voiced until it falls below the threshold less the hysteresis (Silero's own rule, 0.5
//! and 0.35 by default), which holds an utterance together through the softer syllables.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use engine_asr::vad::{self as silero, SileroVad};

use crate::{Error, Result};

/// Samples per second of the audio the detector (and Whisper) takes.
pub const SAMPLE_RATE: u32 = 16_000;

/// Level of digital silence, in dBFS: frames quieter than this count as this.
const SILENCE_DB: f32 = -100.0;

/// The noise floor is the quietest frame of this much recent audio.
pub const NOISE_WINDOW: Duration = Duration::from_secs(2);

/// How the [`EndpointDetector`] decides that a frame holds speech.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Vad {
    /// The frame's energy above the adaptive noise floor ([`EndpointConfig::above_noise_db`],
    /// [`EndpointConfig::min_level_dbfs`]), on frames of [`EndpointConfig::frame`]. The default.
    #[default]
    Energy,
    /// Silero VAD's speech probability, on its 32 ms windows.
    Silero(SileroSettings),
}

/// Settings of [`Vad::Silero`].
#[derive(Clone, Debug, PartialEq)]
pub struct SileroSettings {
    /// The weights [`EndpointDetector::new`] loads (see [`SileroVad::load`]): normally
    /// [`silero::MODEL_FILE`] in the models folder's `silero-vad/`.
    pub model: PathBuf,
    /// Speech probability at which an unvoiced frame becomes voiced. Default 0.5.
    pub threshold: f32,
    /// A voiced stream stays voiced until the probability falls below `threshold − hysteresis`.
    /// Default 0.15.
    pub hysteresis: f32,
}

impl SileroSettings {
    /// The default threshold and hysteresis with the weights at `model`.
    pub fn new(model: PathBuf) -> Self {
        Self {
            model,
            threshold: 0.5,
            hysteresis: 0.15,
        }
    }
}

/// Settings of the [`EndpointDetector`].
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointConfig {
    /// Length of the frames whose energy is measured: a whole number of samples at
    /// [`SAMPLE_RATE`] (a multiple of 62.5 µs), so that stream times counted in frames fall on
    /// samples. Default 20 ms. With [`Vad::Silero`] the frames are its 32 ms windows whatever
    /// this says (the detector's [`EndpointDetector::config`] shows 32 ms).
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
    /// What decides that a frame is voiced. Default [`Vad::Energy`].
    pub vad: Vad,
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
            vad: Vad::Energy,
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
        if let Vad::Silero(settings) = &self.vad {
            let release = settings.threshold - settings.hysteresis;
            let usable = settings.threshold > 0.0
                && settings.threshold <= 1.0
                && settings.hysteresis >= 0.0
                && release.is_finite();
            if !usable {
                return Err(Error::Config(format!(
                    "a Silero VAD threshold of {} with a hysteresis of {} (a threshold in \
                     (0, 1] and a hysteresis ≥ 0 are needed)",
                    settings.threshold, settings.hysteresis
                )));
            }
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
    /// Silero VAD with its state, in [`Vad::Silero`] mode.
    silero: Option<SileroVoicing>,
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

/// Silero VAD in the detector: the model and whether the last frame was voiced.
#[derive(Clone, Debug)]
struct SileroVoicing {
    model: SileroVad,
    threshold: f32,
    /// The probability below which a voiced stream becomes unvoiced.
    release: f32,
    voiced: bool,
}

impl SileroVoicing {
    /// Whether `window` (of [`silero::WINDOW`] samples) is voiced.
    fn voiced(&mut self, window: &mut [f32]) -> bool {
        // The network refuses NaN and infinite samples: they count as silence, as in the
        // energy detector.
        for sample in window.iter_mut().filter(|s| !s.is_finite()) {
            *sample = 0.0;
        }
        // The window is whole and finite, so the network cannot fail; were it to, the frame
        // would count as unvoiced.
        let probability = self.model.push_window(window).unwrap_or(0.0);
        self.voiced = with_hysteresis(self.voiced, probability, self.threshold, self.release);
        self.voiced
    }
}

/// Whether a frame of speech `probability` is voiced, after a frame that was (`was_voiced`) or
/// was not: voicing starts at `threshold` and lasts down to `release`.
fn with_hysteresis(was_voiced: bool, probability: f32, threshold: f32, release: f32) -> bool {
    probability >= if was_voiced { release } else { threshold }
}

impl EndpointDetector {
    /// A detector with `config`; with [`Vad::Silero`] it loads the model its settings name
    /// (an [`Error::Asr`] when the file is missing or is not the model).
    pub fn new(config: EndpointConfig) -> Result<Self> {
        config.frame_samples()?;
        let model = match &config.vad {
            Vad::Energy => None,
            Vad::Silero(settings) => {
                Some(SileroVad::load(&settings.model, &candle_core::Device::Cpu)?)
            }
        };
        Self::build(config, model)
    }

    /// A detector deciding with `model` (Silero VAD, its state reset), with the threshold and
    /// hysteresis of `config.vad`, which must be [`Vad::Silero`] (its `model` path is not
    /// read): for a caller that has loaded the model already.
    pub fn with_silero(config: EndpointConfig, mut model: SileroVad) -> Result<Self> {
        if config.vad == Vad::Energy {
            return Err(Error::Config(
                "a detector with a Silero VAD model needs `vad: Vad::Silero` settings".into(),
            ));
        }
        model.reset();
        Self::build(config, Some(model))
    }

    fn build(mut config: EndpointConfig, model: Option<SileroVad>) -> Result<Self> {
        let silero = match (&config.vad, model) {
            (Vad::Silero(settings), Some(model)) => {
                config.frame = silero_frame();
                Some(SileroVoicing {
                    model,
                    threshold: settings.threshold,
                    release: settings.threshold - settings.hysteresis,
                    voiced: false,
                })
            }
            _ => None,
        };
        let frame_samples = config.frame_samples()?;
        let noise_window_frames =
            (NOISE_WINDOW.as_secs_f64() / config.frame.as_secs_f64()).ceil() as usize;
        Ok(Self {
            config,
            silero,
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
                let voiced = match &mut self.silero {
                    Some(silero) => silero.voiced(&mut self.partial_frame),
                    None => self.above_noise(level_dbfs(&self.partial_frame)),
                };
                self.partial_frame.clear();
                boundaries.extend(self.measure(voiced));
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

    /// Whether a frame at `level` dBFS is voiced, the energy detector's decision (which
    /// updates the noise floor).
    fn above_noise(&mut self, level: f32) -> bool {
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
        level > threshold
    }

    /// One frame, `voiced` or not.
    fn measure(&mut self, voiced: bool) -> Option<Boundary> {
        let frame = self.frames;
        self.frames += 1;
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

/// Silero VAD's frame: one window at [`SAMPLE_RATE`] (32 ms).
fn silero_frame() -> Duration {
    duration_of(silero::WINDOW)
}

/// Samples in `duration` at [`SAMPLE_RATE`].
pub fn samples_in(duration: Duration) -> usize {
    spec_voice::samples_in(duration, SAMPLE_RATE)
}

/// Stream time of `samples` samples at [`SAMPLE_RATE`].
pub fn duration_of(samples: usize) -> Duration {
    spec_voice::duration_of(samples, SAMPLE_RATE)
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
    use engine_asr::testing::white_noise;

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

    /// Silero VAD's network with hand-set weights that hear the loudness of a 250 Hz tone:
    /// the transform keeps one bin (250 Hz, cosine and sine), the encoder passes it through on
    /// one channel, the LSTM cell squashes it, and the head turns it into a probability —
    /// 0.02 for silence, 0.98 for a tone of amplitude 0.3, 0.4 for one of 0.003.
    fn loudness_model() -> SileroVad {
        use candle_core::{Device, Tensor};
        use std::collections::HashMap;

        let mut weights = HashMap::new();
        let mut put = |name: &str, shape: &[usize], set: &[(usize, f32)]| {
            let mut values = vec![0.0f32; shape.iter().product()];
            for &(at, value) in set {
                values[at] = value;
            }
            let tensor = Tensor::from_vec(values, shape, &Device::Cpu).unwrap();
            weights.insert(name.to_string(), tensor);
        };
        // Bin 4 of 256 samples at 16 kHz is 250 Hz: a cosine filter (real) and a sine one
        // (imaginary, 129 filters later).
        let basis: Vec<(usize, f32)> = (0..256)
            .flat_map(|n| {
                let phase = 2.0 * std::f32::consts::PI * 4.0 * n as f32 / 256.0;
                [
                    (4 * 256 + n, phase.cos()),
                    ((129 + 4) * 256 + n, phase.sin()),
                ]
            })
            .collect();
        put("stft_conv.weight", &[258, 1, 256], &basis);
        // Each convolution's centre tap copies one channel: bin 4, then channel 0.
        put("conv1.weight", &[128, 129, 3], &[(4 * 3 + 1, 1.0)]);
        put("conv2.weight", &[64, 128, 3], &[(1, 1.0)]);
        put("conv3.weight", &[64, 64, 3], &[(1, 1.0)]);
        put("conv4.weight", &[128, 64, 3], &[(1, 1.0)]);
        for (name, channels) in [("conv1", 128), ("conv2", 64), ("conv3", 64), ("conv4", 128)] {
            put(&format!("{name}.bias"), &[channels], &[]);
        }
        // Unit 0: input and output gates open, forget gate shut, candidate tanh(channel 0).
        put("lstm_cell.weight_ih", &[512, 128], &[(256 * 128, 1.0)]);
        put("lstm_cell.weight_hh", &[512, 128], &[]);
        put(
            "lstm_cell.bias_ih",
            &[512],
            &[(0, 10.0), (128, -10.0), (384, 10.0)],
        );
        put("lstm_cell.bias_hh", &[512], &[]);
        put("final_conv.weight", &[1, 128, 1], &[(0, 10.0)]);
        put("final_conv.bias", &[1], &[(0, -3.8)]);
        let source = spec_nn::InMemoryWeights::dense(weights);
        let loader = spec_nn::WeightLoader::new(source, &Device::Cpu, spec_nn::Requantize::Keep);
        SileroVad::from_weights(loader).unwrap()
    }

    fn silero_config() -> EndpointConfig {
        EndpointConfig {
            vad: Vad::Silero(SileroSettings::new("unused.onnx".into())),
            ..EndpointConfig::default()
        }
    }

    fn tone_at(millis: u64, amplitude: f32, hertz: f32) -> Vec<f32> {
        (0..samples_in(ms(millis)))
            .map(|i| amplitude * (2.0 * std::f32::consts::PI * hertz * i as f32 / 16_000.0).sin())
            .collect()
    }

    fn detect_silero(audio: &[f32], config: EndpointConfig, piece: usize) -> Vec<Boundary> {
        let mut detector = EndpointDetector::with_silero(config, loudness_model()).unwrap();
        let mut found: Vec<Boundary> = audio.chunks(piece).flat_map(|p| detector.push(p)).collect();
        found.extend(detector.finish());
        found
    }

    #[test]
    fn silero_frames_are_its_32_ms_windows() {
        let mut detector =
            EndpointDetector::with_silero(silero_config(), loudness_model()).unwrap();
        assert_eq!(detector.config().frame, ms(32));
        assert!(detector.push(&[0.0; 1000]).is_empty());
        assert_eq!(detector.now(), ms(32));
        detector.push(&[0.0; 24]);
        assert_eq!(detector.now(), ms(64));

        // A tone between silences: its first voiced window is the one whose first transform
        // frame (the 64 samples before the window and its first 192) lies in the tone.
        let audio = [
            vec![0.0; samples_in(ms(400))],
            tone_at(1000, 0.3, 250.0),
            vec![0.0; samples_in(ms(1000))],
        ]
        .concat();
        let whole = detect_silero(&audio, silero_config(), audio.len());
        assert_eq!(
            whole,
            vec![
                Boundary::Started { at: ms(416) },
                Boundary::Ended {
                    speech_end: ms(1408),
                    detected_at: ms(1920)
                }
            ]
        );
        for piece in [1, 160, 512, 1000, 4801] {
            assert_eq!(
                detect_silero(&audio, silero_config(), piece),
                whole,
                "piece {piece}"
            );
        }
    }

    #[test]
    fn silero_voicing_holds_down_to_the_threshold_less_the_hysteresis() {
        assert!(!with_hysteresis(false, 0.49, 0.5, 0.35));
        assert!(with_hysteresis(false, 0.5, 0.5, 0.35));
        assert!(with_hysteresis(true, 0.36, 0.5, 0.35));
        assert!(!with_hysteresis(true, 0.34, 0.5, 0.35));

        // The quiet tone (probability about 0.4) alone is not speech; after the loud one it
        // holds the utterance until the silence.
        let quiet = [
            vec![0.0; samples_in(ms(320))],
            tone_at(800, 0.003, 250.0),
            vec![0.0; samples_in(ms(800))],
        ]
        .concat();
        assert_eq!(detect_silero(&quiet, silero_config(), 512), vec![]);
        let audio = [
            vec![0.0; samples_in(ms(320))],
            tone_at(320, 0.3, 250.0),
            tone_at(800, 0.003, 250.0),
            vec![0.0; samples_in(ms(800))],
        ]
        .concat();
        let found = detect_silero(&audio, silero_config(), 512);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            matches!(found[1], Boundary::Ended { speech_end, .. } if speech_end > ms(1400)),
            "{found:?}"
        );
        // Without the hysteresis the quiet tone ends the utterance.
        let strict = EndpointConfig {
            vad: Vad::Silero(SileroSettings {
                hysteresis: 0.0,
                ..SileroSettings::new("unused.onnx".into())
            }),
            ..EndpointConfig::default()
        };
        let found = detect_silero(&audio, strict, 512);
        assert!(
            matches!(found[1], Boundary::Ended { speech_end, .. } if speech_end < ms(700)),
            "{found:?}"
        );
    }

    #[test]
    fn silero_settings_that_cannot_work_are_refused() {
        let with = |threshold: f32, hysteresis: f32| EndpointConfig {
            vad: Vad::Silero(SileroSettings {
                threshold,
                hysteresis,
                ..SileroSettings::new("unused.onnx".into())
            }),
            ..EndpointConfig::default()
        };
        for config in [
            with(0.0, 0.15),
            with(1.5, 0.15),
            with(f32::NAN, 0.15),
            with(0.5, -0.1),
            with(0.5, f32::INFINITY),
            // Longer than the energy detector's frame, shorter than Silero's.
            EndpointConfig {
                silence: ms(25),
                ..silero_config()
            },
        ] {
            assert!(
                matches!(
                    EndpointDetector::with_silero(config.clone(), loudness_model()),
                    Err(Error::Config(_))
                ),
                "{config:?}"
            );
        }
        assert!(matches!(
            EndpointDetector::with_silero(EndpointConfig::default(), loudness_model()),
            Err(Error::Config(_))
        ));
        // `new` loads the model its settings name.
        let missing = EndpointConfig {
            vad: Vad::Silero(SileroSettings::new("/nonexistent/silero.onnx".into())),
            ..EndpointConfig::default()
        };
        assert!(matches!(
            EndpointDetector::new(missing),
            Err(Error::Asr(engine_asr::Error::Io { .. }))
        ));
        // NaN samples count as silence, as in the energy detector.
        let mut detector =
            EndpointDetector::with_silero(silero_config(), loudness_model()).unwrap();
        assert!(detector.push(&[f32::NAN; 2048]).is_empty());
        assert_eq!(detector.now(), ms(128));
    }

    /// The first start and the last end of speech among `found`, and how many utterances.
    fn span(found: &[Boundary]) -> (Option<Duration>, Option<Duration>, usize) {
        let starts = found
            .iter()
            .filter_map(|b| match b {
                Boundary::Started { at } => Some(*at),
                Boundary::Ended { .. } => None,
            })
            .collect::<Vec<_>>();
        let end = found.iter().rev().find_map(|b| match b {
            Boundary::Ended { speech_end, .. } => Some(*speech_end),
            Boundary::Started { .. } => None,
        });
        (starts.first().copied(), end, starts.len())
    }

    #[test]
    #[ignore = "needs the models folder's silero-vad/ and speech clips"]
    fn silero_finds_the_clean_clips_utterance_in_noise() {
        let models = spec_models::models_dir().unwrap();
        let model = models.join("silero-vad").join(silero::MODEL_FILE);
        let clips = models.join("data/speech/librivox");
        let wavs = engine_asr::testing::wav_files(&clips);
        if !model.is_file() || wavs.is_empty() {
            eprintln!(
                "skipped: needs {} and clips in {}",
                model.display(),
                clips.display()
            );
            return;
        }
        let silero = EndpointConfig {
            vad: Vad::Silero(SileroSettings::new(model)),
            ..EndpointConfig::default()
        };
        let run = |config: &EndpointConfig, audio: &[f32]| {
            let mut detector = EndpointDetector::new(config.clone()).unwrap();
            let mut found: Vec<Boundary> =
                audio.chunks(320).flat_map(|p| detector.push(p)).collect();
            found.extend(detector.finish());
            found
        };
        let near = |a: Option<Duration>, b: Option<Duration>| {
            a.zip(b).is_some_and(|(a, b)| a.abs_diff(b) <= ms(100))
        };
        let mut checked = 0;
        for wav in &wavs {
            let speech = engine_asr::Audio::read_wav(wav).unwrap().to_16k().unwrap();
            // A second before and after at the recording's own noise floor (its quietest
            // 100 ms), so that the energy detector's floor is the room's, not digital silence.
            let floor = speech
                .chunks(1600)
                .map(|c| (c.iter().map(|s| s * s).sum::<f32>() / c.len() as f32).sqrt())
                .fold(f32::INFINITY, f32::min);
            let second = white_noise(SAMPLE_RATE as usize, floor, 0x9e37_79b9);
            let clean = [second.clone(), speech.clone(), second].concat();
            // White noise 10 dB below the speech's power, over the whole stream.
            let power = speech.iter().map(|s| s * s).sum::<f32>() / speech.len() as f32;
            let noise = white_noise(clean.len(), (power / 10.0).sqrt(), 0x9e37_79b9);
            let noisy: Vec<f32> = clean.iter().zip(&noise).map(|(s, n)| s + n).collect();

            let energy_clean = run(&EndpointConfig::default(), &clean);
            let energy_noisy = run(&EndpointConfig::default(), &noisy);
            let silero_clean = run(&silero, &clean);
            let silero_noisy = run(&silero, &noisy);
            let name = wav.file_name().unwrap().to_string_lossy();
            eprintln!(
                "{name} ({:.2} s of speech):",
                speech.len() as f32 / 16_000.0
            );
            for (what, found) in [
                ("energy, clean", &energy_clean),
                ("energy, noisy (10 dB SNR)", &energy_noisy),
                ("silero, clean", &silero_clean),
                ("silero, noisy (10 dB SNR)", &silero_noisy),
            ] {
                let (start, end, utterances) = span(found);
                eprintln!("  {what}: {utterances} utterance(s), speech {start:?} .. {end:?}");
            }
            let (start, end, utterances) = span(&energy_clean);
            if utterances != 1 {
                eprintln!("  (the energy detector splits the clean clip: not compared)");
                continue;
            }
            for found in [&silero_clean, &silero_noisy] {
                let (silero_start, silero_end, silero_utterances) = span(found);
                assert_eq!(silero_utterances, 1, "{name}: {found:?}");
                assert!(
                    near(silero_start, start),
                    "{name}: start {silero_start:?} vs {start:?}"
                );
                // Silero's end is held by its hysteresis and lags the energy detector's by up
                // to half a second in noise (reported above); it never cuts the speech short.
                assert!(
                    silero_end.zip(end).is_some_and(|(s, e)| s + ms(100) >= e),
                    "{name}: end {silero_end:?} vs {end:?}"
                );
            }
            checked += 1;
        }
        assert!(
            checked > 0,
            "no clip was one utterance for the energy detector"
        );
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
