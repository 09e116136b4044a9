//! Whisper's log-mel spectrogram: a 400-point STFT every 160 samples (25 ms windows, 10 ms
//! hop at 16 kHz) with a periodic Hann window and reflect padding, the power spectrum of every
//! frame but the last, Slaney-normalised mel filters (80 or 128), then `log10` clamped below at
//! 1e-10 and at 8 below the spectrogram's maximum, and `(x + 4) / 4`.

use realfft::RealFftPlanner;

use crate::audio::check_finite;
use crate::{Error, Result};

/// Frames of Whisper's 30-second input window.
pub const WINDOW_FRAMES: usize = 3000;
/// Samples of Whisper's 30-second input window at 16 kHz.
pub const WINDOW_SAMPLES: usize = WINDOW_FRAMES * HOP;

/// STFT length.
pub const N_FFT: usize = 400;
/// Samples between frames.
pub const HOP: usize = 160;
/// Frequency bins of one frame's power spectrum.
const BINS: usize = N_FFT / 2 + 1;

/// The mel filter bank `[n_mels, 201]` at 16 kHz, as librosa's `filters.mel(sr=16000,
/// n_fft=400, n_mels)` (Slaney's mel scale and area normalisation) builds it.
#[derive(Clone, Debug)]
pub struct MelFilters {
    n_mels: usize,
    weights: Vec<f32>,
}

impl MelFilters {
    pub fn new(n_mels: usize) -> Result<Self> {
        if n_mels == 0 {
            return Err(Error::Audio(
                "a mel filter bank needs at least one filter".into(),
            ));
        }
        // Slaney's scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above.
        let (linear_step, log_start_hz) = (200.0 / 3.0, 1000.0);
        let log_start_mel = log_start_hz / linear_step;
        let log_step = 6.4f64.ln() / 27.0;
        let hz = |mel: f64| {
            if mel >= log_start_mel {
                log_start_hz * (log_step * (mel - log_start_mel)).exp()
            } else {
                linear_step * mel
            }
        };
        let max_mel = 45.245_640_471_924_965; // the mel of 8 kHz
        let edges: Vec<f64> = (0..n_mels + 2)
            .map(|i| hz(max_mel * i as f64 / (n_mels + 1) as f64))
            .collect();
        let bin_hz = |k: usize| k as f64 * 16_000.0 / N_FFT as f64;
        let mut weights = vec![0f32; n_mels * BINS];
        for m in 0..n_mels {
            let (low, centre, high) = (edges[m], edges[m + 1], edges[m + 2]);
            let area = 2.0 / (high - low);
            for k in 0..BINS {
                let f = bin_hz(k);
                let rising = (f - low) / (centre - low);
                let falling = (high - f) / (high - centre);
                weights[m * BINS + k] = (rising.min(falling).max(0.0) * area) as f32;
            }
        }
        Ok(Self { n_mels, weights })
    }

    pub fn n_mels(&self) -> usize {
        self.n_mels
    }
}

/// A log-mel spectrogram, `[n_mels, frames]` row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct LogMel {
    pub n_mels: usize,
    pub frames: usize,
    pub data: Vec<f32>,
}

impl LogMel {
    /// Row `mel`, one value per frame.
    pub fn row(&self, mel: usize) -> &[f32] {
        &self.data[mel * self.frames..(mel + 1) * self.frames]
    }
}

/// The log-mel spectrogram of 16 kHz `samples`: `samples.len() / 160` frames. Needs more than
/// 200 samples (the reflect padding of the first window), all finite.
pub fn log_mel_spectrogram(samples: &[f32], filters: &MelFilters) -> Result<LogMel> {
    spectrogram(samples, 0, filters)
}

/// The log-mel spectrogram of `samples` followed by `trailing_silence` zeros. The frames whose
/// window lies wholly in a long silence have zero power: their value is written, not computed
/// (30 s of padding after a 2 s clip are most of Whisper's front-end work otherwise).
fn spectrogram(samples: &[f32], trailing_silence: usize, filters: &MelFilters) -> Result<LogMel> {
    let pad = N_FFT / 2;
    if samples.len() <= pad {
        return Err(Error::Audio(format!(
            "{} samples are too short for a spectrogram (more than {pad} needed)",
            samples.len()
        )));
    }
    check_finite(samples)?;
    let frames = (samples.len() + trailing_silence) / HOP;
    // Past `computed`, every window reads zeros only (the reflection at the far end of a long
    // silence is of zeros too).
    let long_silence = trailing_silence > 2 * pad + HOP;
    let computed = if long_silence {
        frames.min((samples.len() + pad) / HOP + 1)
    } else {
        frames
    };
    let mut signal = samples.to_vec();
    signal.resize(samples.len() + trailing_silence.min(2 * pad + HOP), 0.0);
    // Reflect padding: x[pad], …, x[1], x[0], …, x[n-1], x[n-2], …, x[n-1-pad].
    let n = signal.len();
    let padded: Vec<f32> = (0..n + 2 * pad)
        .map(|i| {
            let j = i as isize - pad as isize;
            let j = if j < 0 {
                -j
            } else if j >= n as isize {
                2 * (n as isize - 1) - j
            } else {
                j
            };
            signal[j as usize]
        })
        .collect();
    let window: Vec<f32> = (0..N_FFT)
        .map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64).cos()) as f32)
        .collect();
    let fft = RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT);
    let (mut input, mut spectrum) = (fft.make_input_vec(), fft.make_output_vec());
    let mut scratch = fft.make_scratch_vec();
    let mut power = vec![0f32; BINS];
    // log10 of the power floor, the value of a silent frame.
    let mut data = vec![-10f32; filters.n_mels * frames];
    for frame in 0..computed {
        let start = frame * HOP;
        for ((x, s), w) in input
            .iter_mut()
            .zip(&padded[start..start + N_FFT])
            .zip(&window)
        {
            *x = s * w;
        }
        fft.process_with_scratch(&mut input, &mut spectrum, &mut scratch)
            .map_err(|e| Error::Audio(format!("FFT: {e}")))?;
        for (p, c) in power.iter_mut().zip(&spectrum) {
            *p = c.norm_sqr();
        }
        for mel in 0..filters.n_mels {
            let row = &filters.weights[mel * BINS..(mel + 1) * BINS];
            let energy: f32 = row.iter().zip(&power).map(|(w, p)| w * p).sum();
            data[mel * frames + frame] = energy.max(1e-10).log10();
        }
    }
    let max = data.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in &mut data {
        *v = (v.max(max - 8.0) + 4.0) / 4.0;
    }
    Ok(LogMel {
        n_mels: filters.n_mels,
        frames,
        data,
    })
}

/// A whole recording as Whisper reads it: the log-mel spectrogram of the audio followed by 30 s
/// of silence (so the frames near the end and the clamp at 8 below the maximum are Whisper's),
/// cut into 30-second windows at any frame ("seek") while decoding moves through the audio,
/// each padded with zeros past the audio's last frame as Whisper pads it.
#[derive(Clone, Debug, PartialEq)]
pub struct WhisperInput {
    mel: LogMel,
    content_frames: usize,
}

impl WhisperInput {
    /// The input for 16 kHz `samples` (at least 201 of them, all finite).
    pub fn new(samples: &[f32], filters: &MelFilters) -> Result<Self> {
        if samples.len() <= N_FFT / 2 {
            return Err(Error::Audio(format!(
                "{} samples ({:.1} ms) are too short to transcribe",
                samples.len(),
                samples.len() as f64 / 16.0
            )));
        }
        Ok(Self {
            mel: spectrogram(samples, WINDOW_SAMPLES, filters)?,
            content_frames: samples.len() / HOP,
        })
    }

    /// Frames that hold audio (10 ms each); decoding ends when the seek reaches them.
    pub fn content_frames(&self) -> usize {
        self.content_frames
    }

    /// The 30-second window `[n_mels, 3000]` starting at frame `seek` (< [`content_frames`]).
    /// Past the audio it holds zeros, not the spectrogram of silence: Whisper's `transcribe`
    /// (and faster-whisper's) cuts the spectrogram at the audio's last frame and pads that
    /// segment with `pad_or_trim`, so the model reads 0.0 after the speech.
    ///
    /// [`content_frames`]: WhisperInput::content_frames
    pub fn window(&self, seek: usize) -> Result<LogMel> {
        if seek >= self.content_frames {
            return Err(Error::Audio(format!(
                "seek to frame {seek}: the audio has {} frames",
                self.content_frames
            )));
        }
        let mel = &self.mel;
        let audio_end = self.content_frames.min(seek + WINDOW_FRAMES);
        let padding = seek + WINDOW_FRAMES - audio_end;
        let data = (0..mel.n_mels)
            .flat_map(|m| {
                mel.row(m)[seek..audio_end]
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(0.0, padding))
            })
            .collect();
        Ok(LogMel {
            n_mels: mel.n_mels,
            frames: WINDOW_FRAMES,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_cover_the_band_with_unit_area_triangles() {
        for n_mels in [80, 128] {
            let filters = MelFilters::new(n_mels).unwrap();
            for m in 0..n_mels {
                let row = &filters.weights[m * BINS..(m + 1) * BINS];
                assert!(row.iter().all(|&w| w >= 0.0));
                assert!(
                    row.iter().any(|&w| w > 0.0),
                    "filter {m} of {n_mels} is empty"
                );
            }
        }
        assert!(MelFilters::new(0).is_err());
    }

    #[test]
    fn the_silent_padding_is_written_as_computing_it_would_give() {
        let filters = MelFilters::new(80).unwrap();
        for len in [201, 1_000, 16_000, 35_123] {
            let samples: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * 0.3)
                .collect();
            let mut padded = samples.clone();
            padded.resize(len + WINDOW_SAMPLES, 0.0);
            let computed = log_mel_spectrogram(&padded, &filters).unwrap();
            let written = spectrogram(&samples, WINDOW_SAMPLES, &filters).unwrap();
            assert_eq!(written, computed, "{len} samples");
        }
    }

    #[test]
    fn short_and_silent_audio() {
        let filters = MelFilters::new(80).unwrap();
        assert!(log_mel_spectrogram(&[0.0; 200], &filters).is_err());
        // Silence: every value clamps to log10(1e-10), then (−10 + 4) / 4.
        let silent = log_mel_spectrogram(&[0.0; 1600], &filters).unwrap();
        assert_eq!((silent.n_mels, silent.frames), (80, 10));
        assert!(silent.data.iter().all(|&v| v == -1.5));
    }

    #[test]
    fn non_finite_samples_are_errors_not_silence() {
        let filters = MelFilters::new(80).unwrap();
        let tone: Vec<f32> = (0..1_600).map(|i| (i as f32 * 0.1).sin() * 0.3).collect();
        for (index, bad) in [
            (0, f32::NAN),
            (250, f32::INFINITY),
            (1_599, f32::NEG_INFINITY),
        ] {
            let mut samples = tone.clone();
            samples[index] = bad;
            for result in [
                log_mel_spectrogram(&samples, &filters).map(drop),
                WhisperInput::new(&samples, &filters).map(drop),
            ] {
                assert!(
                    matches!(result, Err(Error::NonFiniteSample { index: i, .. }) if i == index),
                    "{bad} at {index}"
                );
            }
        }
    }

    #[test]
    fn windows_cut_the_padded_recording_at_any_seek() {
        let filters = MelFilters::new(80).unwrap();
        // 75 s of a tone whose pitch rises, so every window differs.
        let samples: Vec<f32> = (0..75 * 16_000)
            .map(|n| {
                let t = n as f32 / 16_000.0;
                0.3 * (2.0 * std::f32::consts::PI * (200.0 + 20.0 * t) * t).sin()
            })
            .collect();
        let input = WhisperInput::new(&samples, &filters).unwrap();
        assert_eq!(input.content_frames(), 7500);
        let whole = log_mel_spectrogram(
            &[samples.as_slice(), &[0.0; WINDOW_SAMPLES]].concat(),
            &filters,
        )
        .unwrap();
        for seek in [0, 3000, 4321, 7499] {
            let window = input.window(seek).unwrap();
            assert_eq!((window.n_mels, window.frames), (80, WINDOW_FRAMES));
            let audio = (7500 - seek).min(WINDOW_FRAMES);
            for mel in [0, 40, 79] {
                assert_eq!(
                    &window.row(mel)[..audio],
                    &whole.row(mel)[seek..seek + audio]
                );
                assert!(window.row(mel)[audio..].iter().all(|&v| v == 0.0));
            }
        }
        // The spectrogram's own silence after the audio sits at the clamp, 8 decades below
        // the loudest value; the window holds zeros there (Whisper's padding of the log-mel).
        let max = whole.data.iter().copied().fold(f32::MIN, f32::max);
        assert!((whole.row(10)[7600] - (max - 2.0)).abs() < 1e-6);
        assert_eq!(input.window(7499).unwrap().row(10)[1], 0.0);
        assert!(input.window(7500).is_err());
        assert!(WhisperInput::new(&[0.1; 200], &filters).is_err());
    }
}
