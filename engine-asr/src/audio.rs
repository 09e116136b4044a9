//! Audio in: WAV files in any common PCM encoding, mixed down to mono and resampled to the
//! 16 kHz Whisper listens at.

use std::ops::RangeInclusive;
use std::path::Path;

use rubato::{FftFixedInOut, Resampler};

use crate::{Error, Result};

/// The sample rate of Whisper's front end.
pub const SAMPLE_RATE: u32 = 16_000;

/// The sample rates [`resample`] accepts. Below 1 kHz no speech is left; above 768 kHz (the
/// fastest audio hardware) a rate is a corrupt header, whose resampling would allocate
/// gigabytes or run for hours.
pub const SAMPLE_RATES: RangeInclusive<u32> = 1_000..=768_000;

/// The largest sample magnitude [`resample`] takes. Audio lies in [-1, 1] (a float WAV may
/// exceed it a little); this bound is far above any real audio and far enough below `f32::MAX`
/// that the resampler's FFT sums cannot overflow.
pub const MAX_SAMPLE_MAGNITUDE: f32 = 1e12;

/// Mono samples in [-1, 1] at a sample rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Audio {
    pub samples: Vec<f32>,
    pub sample_rate: u32,
}

impl Audio {
    /// Reads a WAV file (8-, 16-, 24- or 32-bit integer PCM, or 32-bit float), averaging its
    /// channels. A file without samples is an error.
    pub fn read_wav(path: &Path) -> Result<Self> {
        let reader = hound::WavReader::open(path).map_err(|e| wav_error(path, e))?;
        Self::from_wav_reader(reader, path)
    }

    /// [`Audio::read_wav`] of a WAV file in memory (an upload); `name` names it in errors.
    pub fn from_wav_bytes(bytes: &[u8], name: &str) -> Result<Self> {
        let path = Path::new(name);
        let reader =
            hound::WavReader::new(std::io::Cursor::new(bytes)).map_err(|e| wav_error(path, e))?;
        Self::from_wav_reader(reader, path)
    }

    fn from_wav_reader<R: std::io::Read>(
        mut reader: hound::WavReader<R>,
        path: &Path,
    ) -> Result<Self> {
        let bad = |e: hound::Error| wav_error(path, e);
        let spec = reader.spec();
        let interleaved: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
            (hound::SampleFormat::Float, 32) => reader
                .samples::<f32>()
                .collect::<Result<_, _>>()
                .map_err(bad)?,
            (hound::SampleFormat::Int, bits @ 8..=32) => {
                let scale = 1.0 / (1u64 << (bits - 1)) as f32;
                reader
                    .samples::<i32>()
                    .map(|s| s.map(|s| s as f32 * scale))
                    .collect::<Result<_, _>>()
                    .map_err(bad)?
            }
            (format, bits) => {
                return Err(Error::BadAudio {
                    path: path.to_path_buf(),
                    reason: format!("{bits}-bit {format:?} samples are not supported"),
                })
            }
        };
        let channels = usize::from(spec.channels.max(1));
        let samples: Vec<f32> = interleaved
            .chunks_exact(channels)
            .map(|frame| frame.iter().sum::<f32>() / channels as f32)
            .collect();
        if samples.is_empty() {
            return Err(Error::Audio(format!("{} holds no samples", path.display())));
        }
        Ok(Self {
            samples,
            sample_rate: spec.sample_rate,
        })
    }

    /// The audio at [`SAMPLE_RATE`], resampled with a band-limited FFT resampler when it is
    /// at another rate.
    pub fn to_16k(&self) -> Result<Vec<f32>> {
        resample(&self.samples, self.sample_rate, SAMPLE_RATE)
    }

    pub fn duration_seconds(&self) -> f64 {
        self.samples.len() as f64 / self.sample_rate.max(1) as f64
    }
}

/// Mono 16 kHz samples read piece by piece, so that a long recording is never held whole
/// (long-form transcription keeps only the window it decodes).
pub trait SampleSource {
    /// Appends up to `max` samples to `out` and returns how many; `Ok(0)` at the end.
    fn read(&mut self, out: &mut Vec<f32>, max: usize) -> Result<usize>;

    /// Starts again from the first sample. Long-form transcription reads its audio twice: once
    /// for the spectrogram's maximum (Whisper clamps every frame to 8 below it), once to decode.
    fn rewind(&mut self) -> Result<()>;
}

/// A [`SampleSource`] over 16 kHz samples in memory.
#[derive(Clone, Debug)]
pub struct Samples<'a> {
    samples: &'a [f32],
    position: usize,
}

impl<'a> Samples<'a> {
    pub fn new(samples: &'a [f32]) -> Self {
        Self {
            samples,
            position: 0,
        }
    }
}

impl SampleSource for Samples<'_> {
    fn read(&mut self, out: &mut Vec<f32>, max: usize) -> Result<usize> {
        let piece = &self.samples[self.position..];
        let piece = &piece[..piece.len().min(max)];
        out.extend_from_slice(piece);
        self.position += piece.len();
        Ok(piece.len())
    }

    fn rewind(&mut self) -> Result<()> {
        self.position = 0;
        Ok(())
    }
}

fn wav_error(path: &Path, error: hound::Error) -> Error {
    match error {
        hound::Error::IoError(source) if source.kind() == std::io::ErrorKind::NotFound => {
            Error::Io {
                path: path.to_path_buf(),
                source,
            }
        }
        other => Error::BadAudio {
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    }
}

/// Fails with [`Error::NonFiniteSample`] at the first NaN or infinite sample.
pub fn check_finite(samples: &[f32]) -> Result<()> {
    match samples.iter().position(|s| !s.is_finite()) {
        Some(index) => Err(Error::NonFiniteSample {
            index,
            value: samples[index],
        }),
        None => Ok(()),
    }
}

/// `samples` at rate `from` resampled to rate `to`: `⌈len · to / from⌉` samples, aligned with
/// the input (the resampler's delay removed). Both rates must lie in [`SAMPLE_RATES`] and
/// every sample must be finite ([`Error::NonFiniteSample`]) and at most
/// [`MAX_SAMPLE_MAGNITUDE`] in magnitude ([`Error::SampleTooLarge`]).
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>> {
    let failed = |reason: String| Error::Resample { from, to, reason };
    if !SAMPLE_RATES.contains(&from) || !SAMPLE_RATES.contains(&to) {
        return Err(failed(format!(
            "sample rates must lie in {}..={} Hz",
            SAMPLE_RATES.start(),
            SAMPLE_RATES.end()
        )));
    }
    check_finite(samples)?;
    if let Some(index) = samples.iter().position(|s| s.abs() > MAX_SAMPLE_MAGNITUDE) {
        return Err(Error::SampleTooLarge {
            index,
            value: samples[index],
        });
    }
    if from == to {
        return Ok(samples.to_vec());
    }
    let mut resampler = FftFixedInOut::<f32>::new(from as usize, to as usize, 1024, 1)
        .map_err(|e| failed(e.to_string()))?;
    let expected = (samples.len() as u64 * u64::from(to)).div_ceil(u64::from(from)) as usize;
    let delay = resampler.output_delay();
    let mut out = Vec::with_capacity(expected + delay + resampler.output_frames_max());
    let mut rest = samples;
    // Whole chunks, then the partial last one, then zeros until the delayed output is out.
    while out.len() < expected + delay {
        let need = resampler.input_frames_next();
        let produced = if rest.len() >= need {
            let (chunk, tail) = rest.split_at(need);
            rest = tail;
            resampler.process(&[chunk], None)
        } else if !rest.is_empty() {
            let chunk = std::mem::take(&mut rest);
            resampler.process_partial(Some(&[chunk]), None)
        } else {
            resampler.process_partial::<&[f32]>(None, None)
        }
        .map_err(|e| failed(e.to_string()))?;
        out.extend_from_slice(&produced[0]);
    }
    Ok(out[delay..delay + expected].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `cargo xtask fuzz wav`: a float WAV of samples near `f32::MAX` overflowed the
    /// resampler's FFT, which panicked.
    #[test]
    fn samples_near_the_largest_float_are_refused_not_a_panic() {
        let samples = [0.0, 2.9e38, -2.9e38, 1.0].repeat(96);
        assert!(matches!(
            resample(&samples, 48_000, SAMPLE_RATE),
            Err(Error::SampleTooLarge { index: 1, .. })
        ));
        let loud = [0.0, 2.0, -2.0, 1.0].repeat(96);
        assert_eq!(resample(&loud, 48_000, SAMPLE_RATE).unwrap().len(), 128);
    }

    fn tone(freq: f32, rate: u32, seconds: f32) -> Vec<f32> {
        (0..(rate as f32 * seconds) as usize)
            .map(|n| 0.5 * (2.0 * std::f32::consts::PI * freq * n as f32 / rate as f32).sin())
            .collect()
    }

    fn write_wav(path: &Path, spec: hound::WavSpec, frames: &[Vec<f32>]) {
        let mut writer = hound::WavWriter::create(path, spec).unwrap();
        for frame in frames {
            for &v in frame {
                match (spec.sample_format, spec.bits_per_sample) {
                    (hound::SampleFormat::Float, _) => writer.write_sample(v).unwrap(),
                    (_, 8) => writer.write_sample((v * 127.0) as i8).unwrap(),
                    (_, 16) => writer.write_sample((v * 32767.0) as i16).unwrap(),
                    (_, bits) => writer
                        .write_sample((v * ((1i64 << (bits - 1)) - 1) as f32) as i32)
                        .unwrap(),
                }
            }
        }
        writer.finalize().unwrap();
    }

    #[test]
    fn every_common_encoding_reads_as_the_same_mono_signal() {
        let dir = tempfile::tempdir().unwrap();
        let left = tone(300.0, 8000, 0.1);
        let right: Vec<f32> = left.iter().map(|v| v * 0.5).collect();
        let frames: Vec<Vec<f32>> = left.iter().zip(&right).map(|(l, r)| vec![*l, *r]).collect();
        for (format, bits, tolerance) in [
            (hound::SampleFormat::Int, 8, 1.0 / 64.0),
            (hound::SampleFormat::Int, 16, 1e-4),
            (hound::SampleFormat::Int, 24, 1e-6),
            (hound::SampleFormat::Int, 32, 1e-6),
            (hound::SampleFormat::Float, 32, 0.0),
        ] {
            let spec = hound::WavSpec {
                channels: 2,
                sample_rate: 8000,
                bits_per_sample: bits,
                sample_format: format,
            };
            let path = dir.path().join(format!("{bits}{format:?}.wav"));
            write_wav(&path, spec, &frames);
            let audio = Audio::read_wav(&path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(Audio::from_wav_bytes(&bytes, "upload").unwrap(), audio);
            assert_eq!((audio.sample_rate, audio.samples.len()), (8000, left.len()));
            for ((got, l), r) in audio.samples.iter().zip(&left).zip(&right) {
                assert!(
                    (got - (l + r) / 2.0).abs() <= tolerance,
                    "{bits}-bit {format:?}"
                );
            }
        }
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Audio::read_wav(&dir.path().join("absent.wav")),
            Err(Error::Io { .. })
        ));
        let garbage = dir.path().join("garbage.wav");
        std::fs::write(&garbage, b"RIFF\x10\x00\x00\x00WAVEnot really").unwrap();
        assert!(matches!(
            Audio::read_wav(&garbage),
            Err(Error::BadAudio { .. })
        ));
        let empty = dir.path().join("empty.wav");
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 16000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        write_wav(&empty, spec, &[]);
        assert!(matches!(Audio::read_wav(&empty), Err(Error::Audio(_))));
        // A cut file: the header promises more samples than there are.
        let cut = dir.path().join("cut.wav");
        write_wav(&cut, spec, &[tone(440.0, 16000, 0.1)]);
        let bytes = std::fs::read(&cut).unwrap();
        std::fs::write(&cut, &bytes[..bytes.len() - 101]).unwrap();
        assert!(matches!(Audio::read_wav(&cut), Err(Error::BadAudio { .. })));
        assert!(matches!(
            Audio::from_wav_bytes(&bytes[..bytes.len() - 101], "upload"),
            Err(Error::BadAudio { .. })
        ));
        assert!(matches!(
            Audio::from_wav_bytes(b"ID3 an mp3", "upload"),
            Err(Error::BadAudio { .. })
        ));
        assert!(resample(&[0.0; 10], 0, 16000).is_err());
    }

    #[test]
    fn corrupt_sample_rates_are_refused_before_resampling() {
        let dir = tempfile::tempdir().unwrap();
        for rate in [1, 999, 768_001, i32::MAX as u32] {
            let path = dir.path().join(format!("{rate}.wav"));
            let spec = hound::WavSpec {
                channels: 1,
                sample_rate: rate,
                bits_per_sample: 8,
                sample_format: hound::SampleFormat::Int,
            };
            write_wav(&path, spec, &[vec![0.25; 100]]);
            let audio = Audio::read_wav(&path).unwrap();
            assert_eq!(audio.sample_rate, rate);
            assert!(
                matches!(audio.to_16k(), Err(Error::Resample { from, to: SAMPLE_RATE, .. }) if from == rate),
                "{rate} Hz"
            );
        }
        for (from, to) in [(0, 16_000), (16_000, 0), (16_000, 16_000_000), (1, 1)] {
            assert!(
                matches!(resample(&[0.0; 10], from, to), Err(Error::Resample { .. })),
                "{from} Hz to {to} Hz"
            );
        }
        for rate in [*SAMPLE_RATES.start(), *SAMPLE_RATES.end()] {
            let out = resample(&[0.0; 100], rate, SAMPLE_RATE).unwrap();
            assert_eq!(
                out.len(),
                (100 * 16_000u64).div_ceil(u64::from(rate)) as usize
            );
        }
    }

    #[test]
    fn non_finite_samples_are_refused_with_the_first_ones_index() {
        let mut samples = vec![0.1; 1_000];
        assert!(check_finite(&samples).is_ok());
        samples[700] = f32::NEG_INFINITY;
        samples[300] = f32::NAN;
        assert!(matches!(
            check_finite(&samples),
            Err(Error::NonFiniteSample { index: 300, value }) if value.is_nan()
        ));
        assert!(matches!(
            resample(&samples, 8_000, SAMPLE_RATE),
            Err(Error::NonFiniteSample { index: 300, .. })
        ));
        let error = check_finite(&samples[400..]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid audio: sample 300 is -inf, not a finite number"
        );
    }

    #[test]
    fn resampling_keeps_a_tone_and_the_length() {
        for from in [8000, 22050, 44100, 48000] {
            let input = tone(1000.0, from, 0.5);
            let out = resample(&input, from, SAMPLE_RATE).unwrap();
            assert_eq!(
                out.len(),
                (input.len() as u64 * 16000).div_ceil(from as u64) as usize
            );
            // Away from the edges the output is a 1 kHz tone of the same amplitude (fitted by
            // least squares against sin and cos; the FFT resampler may shift it by a fraction
            // of a sample) with almost nothing left over.
            let middle = &out[out.len() / 4..3 * out.len() / 4];
            let w = 2.0 * std::f64::consts::PI * 1000.0 / 16000.0;
            let (mut s, mut c) = (0f64, 0f64);
            for (n, &v) in middle.iter().enumerate() {
                s += f64::from(v) * (w * n as f64).sin();
                c += f64::from(v) * (w * n as f64).cos();
            }
            let (s, c) = (2.0 * s / middle.len() as f64, 2.0 * c / middle.len() as f64);
            assert!(
                ((s * s + c * c).sqrt() - 0.5).abs() < 0.005,
                "{from} Hz: amplitude"
            );
            let residual = middle
                .iter()
                .enumerate()
                .map(|(n, &v)| {
                    (f64::from(v) - s * (w * n as f64).sin() - c * (w * n as f64).cos()).abs()
                })
                .fold(0f64, f64::max);
            assert!(residual < 0.01, "{from} Hz: {residual} left after the tone");
        }
        let same = resample(&[0.25, -0.5], SAMPLE_RATE, SAMPLE_RATE).unwrap();
        assert_eq!(same, [0.25, -0.5]);
    }
}
