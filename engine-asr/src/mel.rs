//! Whisper's log-mel spectrogram: a 400-point STFT every 160 samples (25 ms windows, 10 ms
//! hop at 16 kHz) with a periodic Hann window and reflect padding, the power spectrum of every
//! frame but the last, Slaney-normalised mel filters (80 or 128), then `log10` clamped below at
//! 1e-10 and at 8 below the spectrogram's maximum, and `(x + 4) / 4`.

use realfft::RealFftPlanner;

use crate::audio::{check_finite, SampleSource, Samples};
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
    let mut analyzer = FrameAnalyzer::new();
    let mut energies = vec![0f32; filters.n_mels];
    // log10 of the power floor, the value of a silent frame.
    let mut data = vec![SILENT_FRAME; filters.n_mels * frames];
    for frame in 0..computed {
        let start = frame * HOP;
        analyzer.analyze(&padded[start..start + N_FFT], filters, &mut energies)?;
        for (mel, &energy) in energies.iter().enumerate() {
            data[mel * frames + frame] = energy;
        }
    }
    let max = data.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in &mut data {
        *v = clamp_and_scale(*v, max);
    }
    Ok(LogMel {
        n_mels: filters.n_mels,
        frames,
        data,
    })
}

/// `log10` of the power floor: the value of a frame that hears nothing.
const SILENT_FRAME: f32 = -10.0;

/// Whisper's last step: clamped at 8 decades below the spectrogram's maximum, then
/// `(x + 4) / 4`.
fn clamp_and_scale(log_energy: f32, max: f32) -> f32 {
    (log_energy.max(max - 8.0) + 4.0) / 4.0
}

/// One STFT frame at a time: periodic Hann window, FFT, power spectrum, mel filters, `log10`.
struct FrameAnalyzer {
    fft: std::sync::Arc<dyn realfft::RealToComplex<f32>>,
    window: Vec<f32>,
    input: Vec<f32>,
    spectrum: Vec<realfft::num_complex::Complex<f32>>,
    scratch: Vec<realfft::num_complex::Complex<f32>>,
    power: Vec<f32>,
}

impl FrameAnalyzer {
    fn new() -> Self {
        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT);
        let window = (0..N_FFT)
            .map(|i| {
                (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64).cos()) as f32
            })
            .collect();
        Self {
            input: fft.make_input_vec(),
            spectrum: fft.make_output_vec(),
            scratch: fft.make_scratch_vec(),
            power: vec![0f32; BINS],
            window,
            fft,
        }
    }

    /// The `log10` mel energies (floored at 1e-10) of the [`N_FFT`] samples `frame` into
    /// `energies` (one per filter).
    fn analyze(&mut self, frame: &[f32], filters: &MelFilters, energies: &mut [f32]) -> Result<()> {
        for ((x, s), w) in self.input.iter_mut().zip(frame).zip(&self.window) {
            *x = s * w;
        }
        self.fft
            .process_with_scratch(&mut self.input, &mut self.spectrum, &mut self.scratch)
            .map_err(|e| Error::Audio(format!("FFT: {e}")))?;
        for (p, c) in self.power.iter_mut().zip(&self.spectrum) {
            *p = c.norm_sqr();
        }
        for (mel, energy) in energies.iter_mut().enumerate() {
            let row = &filters.weights[mel * BINS..(mel + 1) * BINS];
            let sum: f32 = row.iter().zip(&self.power).map(|(w, p)| w * p).sum();
            *energy = sum.max(1e-10).log10();
        }
        Ok(())
    }
}

/// A whole recording as Whisper reads it — the log-mel spectrogram of the audio followed by
/// 30 s of silence (so the frames near the end and the clamp at 8 below the maximum are
/// Whisper's), cut into 30-second windows at any frame ("seek") while decoding moves through
/// the audio, each padded with zeros past the audio's last frame as Whisper pads it — without
/// holding the recording: the audio is read twice from its [`SampleSource`], once for the
/// spectrogram's maximum and once window by window, keeping only the samples and frames of the
/// current window. Memory is bounded by the window, not the recording.
///
/// Seeks must not go back: each window starts at or after the previous one.
pub struct WhisperInput<S> {
    source: S,
    banks: Vec<Bank>,
    analyzer: FrameAnalyzer,
    samples: usize,
    /// The samples read so far in the second reading, from `buffer_start` on.
    buffer: Vec<f32>,
    buffer_start: usize,
    /// The latest window's first frame.
    seek: usize,
}

/// One filter bank's view of the recording (a draft model may have other mel bins).
struct Bank {
    filters: MelFilters,
    max: f32,
    /// `log10` energies of frames `first_frame..`, frame-major (`n_mels` values a frame).
    frames: Vec<f32>,
    first_frame: usize,
}

/// Samples read from a source at a time.
const READ_SAMPLES: usize = 10 * 16_000;

impl<'a> WhisperInput<Samples<'a>> {
    /// The input for 16 kHz `samples` in memory (at least 201 of them, all finite).
    pub fn from_samples(samples: &'a [f32], filters: &MelFilters) -> Result<Self> {
        Self::new(Samples::new(samples), std::slice::from_ref(filters))
    }
}

impl<S: SampleSource> WhisperInput<S> {
    /// Reads `source` once to find each filter bank's maximum (every sample must be finite,
    /// and there must be more than 200), then rewinds it for the windows.
    pub fn new(mut source: S, filters: &[MelFilters]) -> Result<Self> {
        if filters.is_empty() {
            return Err(Error::Audio(
                "a Whisper input needs a mel filter bank".into(),
            ));
        }
        let mut banks: Vec<Bank> = filters
            .iter()
            .map(|filters| Bank {
                filters: filters.clone(),
                // Frames wholly in the 30 s of padding after the audio are silent.
                max: SILENT_FRAME,
                frames: Vec::new(),
                first_frame: 0,
            })
            .collect();
        let mut analyzer = FrameAnalyzer::new();
        let (mut buffer, mut buffer_start) = (Vec::new(), 0);
        let mut next_frame = 0;
        let mut frame = vec![0f32; N_FFT];
        let mut energies = Vec::new();
        loop {
            let before = buffer.len();
            let read = source.read(&mut buffer, READ_SAMPLES)?;
            if let Some(index) = buffer[before..].iter().position(|s| !s.is_finite()) {
                return Err(Error::NonFiniteSample {
                    index: buffer_start + before + index,
                    value: buffer[before + index],
                });
            }
            let end = buffer_start + buffer.len();
            // Until the end is known, a frame is computed once all its samples are read; at
            // the end, every frame that reaches into the audio.
            let last = if read == 0 {
                if end <= N_FFT / 2 {
                    return Err(Error::Audio(format!(
                        "{end} samples ({:.1} ms) are too short to transcribe",
                        end as f64 / 16.0
                    )));
                }
                (end + N_FFT / 2) / HOP + 1
            } else if end > N_FFT / 2 {
                (end - N_FFT / 2 - 1) / HOP + 1
            } else {
                0
            };
            while next_frame < last {
                frame_samples(&buffer, buffer_start, end, next_frame, &mut frame);
                for bank in &mut banks {
                    energies.resize(bank.filters.n_mels, 0.0);
                    analyzer.analyze(&frame, &bank.filters, &mut energies)?;
                    bank.max = energies.iter().copied().fold(bank.max, f32::max);
                }
                next_frame += 1;
            }
            if read == 0 {
                source.rewind()?;
                return Ok(Self {
                    source,
                    banks,
                    analyzer,
                    samples: end,
                    buffer: Vec::new(),
                    buffer_start: 0,
                    seek: 0,
                });
            }
            // Keep what the next frames still read (frames 0 and 1 reflect the first samples).
            let keep_from = if next_frame < 2 {
                0
            } else {
                next_frame * HOP - N_FFT / 2
            };
            if keep_from > buffer_start {
                buffer.drain(..keep_from - buffer_start);
                buffer_start = keep_from;
            }
        }
    }

    /// Frames that hold audio (10 ms each); decoding ends when the seek reaches them.
    pub fn content_frames(&self) -> usize {
        self.samples / HOP
    }

    /// The 30-second window `[n_mels, 3000]` of the first filter bank starting at frame `seek`
    /// (< [`content_frames`]). Past the audio it holds zeros, not the spectrogram of silence:
    /// Whisper's `transcribe` (and faster-whisper's) cuts the spectrogram at the audio's last
    /// frame and pads that segment with `pad_or_trim`, so the model reads 0.0 after the speech.
    ///
    /// [`content_frames`]: WhisperInput::content_frames
    pub fn window(&mut self, seek: usize) -> Result<LogMel> {
        self.window_of_bank(0, seek)
    }

    /// [`WhisperInput::window`] through filter bank `bank` (the order given to
    /// [`WhisperInput::new`]).
    pub fn window_of_bank(&mut self, bank: usize, seek: usize) -> Result<LogMel> {
        let content = self.content_frames();
        if seek >= content {
            return Err(Error::Audio(format!(
                "seek to frame {seek}: the audio has {content} frames"
            )));
        }
        if bank >= self.banks.len() {
            return Err(Error::Audio(format!(
                "filter bank {bank} of {}",
                self.banks.len()
            )));
        }
        if seek < self.seek {
            return Err(Error::Audio(format!(
                "seek to frame {seek} after frame {}: a recording is read forwards",
                self.seek
            )));
        }
        self.seek = seek;
        let audio_end = content.min(seek + WINDOW_FRAMES);
        // Read on until the window's last frame has its samples.
        let needed = self.samples.min((audio_end - 1) * HOP + N_FFT / 2);
        while self.buffer_start + self.buffer.len() < needed {
            let want = READ_SAMPLES.max(needed - self.buffer_start - self.buffer.len());
            if self.source.read(&mut self.buffer, want)? == 0 {
                return Err(Error::Audio(format!(
                    "the audio ended after {} samples on its second reading, {} on its first",
                    self.buffer_start + self.buffer.len(),
                    self.samples
                )));
            }
        }
        let Self {
            banks,
            analyzer,
            buffer,
            buffer_start,
            samples,
            ..
        } = self;
        let bank = &mut banks[bank];
        let n_mels = bank.filters.n_mels;
        let stale = (seek - bank.first_frame).min(bank.frames.len() / n_mels);
        bank.frames.drain(..stale * n_mels);
        bank.first_frame = seek;
        let mut frame = vec![0f32; N_FFT];
        let mut energies = vec![0f32; n_mels];
        for f in bank.first_frame + bank.frames.len() / n_mels..audio_end {
            frame_samples(buffer, *buffer_start, *samples, f, &mut frame);
            analyzer.analyze(&frame, &bank.filters, &mut energies)?;
            bank.frames.extend_from_slice(&energies);
        }
        let mut data = vec![0f32; n_mels * WINDOW_FRAMES];
        for (f, energies) in bank
            .frames
            .chunks_exact(n_mels)
            .take(audio_end - seek)
            .enumerate()
        {
            for (mel, &energy) in energies.iter().enumerate() {
                data[mel * WINDOW_FRAMES + f] = clamp_and_scale(energy, bank.max);
            }
        }
        // Samples before this window's first frame are not read again.
        if seek >= 2 && seek * HOP - N_FFT / 2 > *buffer_start {
            let keep_from = seek * HOP - N_FFT / 2;
            buffer.drain(..keep_from - *buffer_start);
            *buffer_start = keep_from;
        }
        Ok(LogMel {
            n_mels,
            frames: WINDOW_FRAMES,
            data,
        })
    }
}

/// The [`N_FFT`] samples of frame `frame` of the recording followed by silence: reflected at
/// the start (`x[200]`, …, `x[1]`, `x[0]`, …), zeros from sample `end` on. `buffer` holds the
/// samples from `buffer_start` on, including all the frame reads.
fn frame_samples(buffer: &[f32], buffer_start: usize, end: usize, frame: usize, out: &mut [f32]) {
    for (i, x) in out.iter_mut().enumerate() {
        let index = (frame * HOP + i) as isize - (N_FFT / 2) as isize;
        let index = index.unsigned_abs();
        *x = if index >= end {
            0.0
        } else {
            buffer[index - buffer_start]
        };
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
                WhisperInput::from_samples(&samples, &filters).map(drop),
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
        let mut input = WhisperInput::from_samples(&samples, &filters).unwrap();
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
        assert!(WhisperInput::from_samples(&[0.1; 200], &filters).is_err());
    }

    /// Samples handed out `piece` at a time; `lost` fewer of them from the second reading on.
    struct Pieces {
        samples: Vec<f32>,
        position: usize,
        piece: usize,
        lost: usize,
        readings: usize,
    }

    impl Pieces {
        fn new(samples: Vec<f32>, piece: usize) -> Self {
            Self {
                samples,
                position: 0,
                piece,
                lost: 0,
                readings: 1,
            }
        }
    }

    impl SampleSource for Pieces {
        fn read(&mut self, out: &mut Vec<f32>, max: usize) -> Result<usize> {
            let end = if self.readings > 1 {
                self.samples.len() - self.lost
            } else {
                self.samples.len()
            };
            let n = max.min(self.piece).min(end - self.position);
            out.extend_from_slice(&self.samples[self.position..self.position + n]);
            self.position += n;
            Ok(n)
        }

        fn rewind(&mut self) -> Result<()> {
            self.position = 0;
            self.readings += 1;
            Ok(())
        }
    }

    fn chirp(seconds: usize) -> Vec<f32> {
        (0..seconds * 16_000)
            .map(|n| {
                let t = n as f32 / 16_000.0;
                0.3 * (2.0 * std::f32::consts::PI * (200.0 + 20.0 * t) * t).sin()
                    * (1.0 + (t * 0.7).sin()) // loud and quiet stretches
            })
            .collect()
    }

    #[test]
    fn a_recording_read_in_pieces_gives_the_windows_of_the_whole() {
        let banks = [MelFilters::new(80).unwrap(), MelFilters::new(128).unwrap()];
        let samples = chirp(70);
        for piece in [777, 16_000, 1_000_000] {
            let mut streamed =
                WhisperInput::new(Pieces::new(samples.clone(), piece), &banks).unwrap();
            let mut wholes: Vec<_> = banks
                .iter()
                .map(|filters| WhisperInput::from_samples(&samples, filters).unwrap())
                .collect();
            for seek in [0, 1, 2, 2999, 3000, 4321, 6999] {
                // Both banks at each seek, as the target's and a draft model's inputs.
                for (bank, whole) in wholes.iter_mut().enumerate() {
                    assert_eq!(streamed.content_frames(), whole.content_frames());
                    assert_eq!(
                        streamed.window_of_bank(bank, seek).unwrap(),
                        whole.window(seek).unwrap(),
                        "piece {piece}, bank {bank}, seek {seek}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_the_current_window_is_kept() {
        let filters = MelFilters::new(80).unwrap();
        let samples = chirp(600);
        let mut input = WhisperInput::new(Pieces::new(samples, 4_000), &[filters]).unwrap();
        let mut most = 0;
        for seek in (0..input.content_frames()).step_by(2_500) {
            input.window(seek).unwrap();
            let held = input.buffer.len() + input.banks[0].frames.len();
            most = most.max(held);
        }
        // One window of samples plus a read, and one window of frames: never the 10 minutes.
        let bound = WINDOW_SAMPLES + N_FFT + READ_SAMPLES + WINDOW_FRAMES * 80;
        assert!(most <= bound, "{most} values held, bound {bound}");
    }

    #[test]
    fn seeking_back_or_audio_that_changes_between_readings_are_errors() {
        let filters = MelFilters::new(80).unwrap();
        let mut input = WhisperInput::new(
            Pieces::new(chirp(40), 5_000),
            std::slice::from_ref(&filters),
        )
        .unwrap();
        input.window(1_000).unwrap();
        input.window(1_000).unwrap();
        assert!(matches!(input.window(999), Err(Error::Audio(m)) if m.contains("forwards")));

        let mut shrinking = Pieces::new(chirp(40), 5_000);
        shrinking.lost = 16_000;
        let mut input = WhisperInput::new(shrinking, std::slice::from_ref(&filters)).unwrap();
        assert!(
            matches!(input.window(3_000), Err(Error::Audio(m)) if m.contains("second reading"))
        );

        let mut samples = chirp(40);
        samples[123_456] = f32::NAN;
        assert!(matches!(
            WhisperInput::new(Pieces::new(samples, 5_000), &[filters]),
            Err(Error::NonFiniteSample { index: 123_456, .. })
        ));
    }
}
