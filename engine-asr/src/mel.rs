//! Whisper's log-mel spectrogram: a 400-point STFT every 160 samples (25 ms windows, 10 ms
//! hop at 16 kHz) with a periodic Hann window and reflect padding, the power spectrum of every
//! frame but the last, Slaney-normalised mel filters (80 or 128), then `log10` clamped below at
//! 1e-10 and at 8 below the spectrogram's maximum, and `(x + 4) / 4`.

use realfft::RealFftPlanner;

use crate::{Error, Result};

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
/// 200 samples (the reflect padding of the first window).
pub fn log_mel_spectrogram(samples: &[f32], filters: &MelFilters) -> Result<LogMel> {
    let pad = N_FFT / 2;
    if samples.len() <= pad {
        return Err(Error::Audio(format!(
            "{} samples are too short for a spectrogram (more than {pad} needed)",
            samples.len()
        )));
    }
    // Reflect padding: x[pad], …, x[1], x[0], …, x[n-1], x[n-2], …, x[n-1-pad].
    let n = samples.len();
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
            samples[j as usize]
        })
        .collect();
    let window: Vec<f32> = (0..N_FFT)
        .map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64).cos()) as f32)
        .collect();
    let frames = n / HOP;
    let fft = RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT);
    let (mut input, mut spectrum) = (fft.make_input_vec(), fft.make_output_vec());
    let mut scratch = fft.make_scratch_vec();
    let mut power = vec![0f32; BINS];
    let mut data = vec![0f32; filters.n_mels * frames];
    for frame in 0..frames {
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
    fn short_and_silent_audio() {
        let filters = MelFilters::new(80).unwrap();
        assert!(log_mel_spectrogram(&[0.0; 200], &filters).is_err());
        // Silence: every value clamps to log10(1e-10), then (−10 + 4) / 4.
        let silent = log_mel_spectrogram(&[0.0; 1600], &filters).unwrap();
        assert_eq!((silent.n_mels, silent.frames), (80, 10));
        assert!(silent.data.iter().all(|&v| v == -1.5));
    }
}
