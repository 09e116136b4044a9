//! Audio in: WAV, FLAC, MP3, OGG/Vorbis and M4A/AAC files (through symphonia; WAV also through
//! hound), mixed down to mono and resampled to the 16 kHz Whisper listens at, whole
//! ([`Audio`]) or piece by piece ([`AudioFile`], a [`SampleSource`]).

use std::ops::RangeInclusive;
use std::path::Path;

use rubato::{FftFixedInOut, Resampler};

use crate::{Error, Result};

mod decode;

pub use decode::{AudioDecoder, AudioFile};

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
    /// The samples, mono.
    pub samples: Vec<f32>,
    /// Samples per second.
    pub sample_rate: u32,
}

impl Audio {
    /// Reads an audio file: WAV, FLAC, MP3, OGG/Vorbis or M4A/AAC, found from its content (the
    /// extension is only a hint), its first audio track mixed down to mono (the mean of the
    /// channels) at its own sample rate. An unsupported container or codec is an
    /// [`Error::UnsupportedAudio`]; a corrupt, truncated or empty file an [`Error::BadAudio`].
    pub fn read(path: &Path) -> Result<Self> {
        Self::decode(AudioDecoder::open(path)?, None)
    }

    /// [`Audio::read`] of a file in memory (an upload); `name` names it in errors, and its
    /// extension is a hint to the format.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Self> {
        Self::decode(AudioDecoder::from_bytes(bytes, name)?, None)
    }

    /// [`Audio::from_bytes`] that stops with [`Error::AudioTooLong`] as soon as more than
    /// `max_seconds` are decoded: a compressed upload can hold hours of silence in a few
    /// kilobytes, and is refused before they are all in memory.
    pub fn from_bytes_at_most(bytes: &[u8], name: &str, max_seconds: f64) -> Result<Self> {
        Self::decode(AudioDecoder::from_bytes(bytes, name)?, Some(max_seconds))
    }

    /// Everything `decoder` decodes, at most `max_seconds` of it.
    fn decode(mut decoder: AudioDecoder<'_>, max_seconds: Option<f64>) -> Result<Self> {
        let mut samples = Vec::new();
        while decoder.next_packet(&mut samples)?.is_some() {
            if let Some(limit) = max_seconds.filter(|&l| decoder.decoded_seconds() > l) {
                return Err(Error::AudioTooLong {
                    path: decoder.name().to_path_buf(),
                    limit_seconds: limit,
                });
            }
        }
        if samples.is_empty() {
            return Err(Error::Audio(format!(
                "{} holds no samples",
                decoder.name().display()
            )));
        }
        Ok(Self {
            samples,
            sample_rate: decoder.sample_rate(),
        })
    }

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

    /// The length in seconds.
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
    /// A source of `samples` (16 kHz), from the first.
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
    let mut resampler = StreamResampler::new(from, to)?;
    let mut out = Vec::with_capacity(
        (samples.len() as u64 * u64::from(to)).div_ceil(u64::from(from)) as usize,
    );
    resampler.push(samples, &mut out)?;
    resampler.finish(&mut out)?;
    Ok(out)
}

/// [`resample`] of a signal given piece by piece: the output of all the pieces is that of
/// `resample` on the whole, to the bit, and the resampler holds at most one chunk of input
/// (about 1024 samples; a sample rate prime to the target's needs a chunk of one second).
pub(crate) struct StreamResampler {
    from: u32,
    to: u32,
    /// `None` when the rates are equal.
    inner: Option<FftFixedInOut<f32>>,
    /// Input short of a whole chunk.
    pending: Vec<f32>,
    /// Leading outputs still to drop (the resampler's delay).
    delay_left: usize,
    /// Samples pushed so far.
    consumed: u64,
    /// Samples given out so far.
    produced: u64,
}

impl std::fmt::Debug for StreamResampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamResampler")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("consumed", &self.consumed)
            .field("produced", &self.produced)
            .finish()
    }
}

impl StreamResampler {
    /// A resampler from rate `from` to rate `to`, both in [`SAMPLE_RATES`].
    pub(crate) fn new(from: u32, to: u32) -> Result<Self> {
        let failed = |reason: String| Error::Resample { from, to, reason };
        if !SAMPLE_RATES.contains(&from) || !SAMPLE_RATES.contains(&to) {
            return Err(failed(format!(
                "sample rates must lie in {}..={} Hz",
                SAMPLE_RATES.start(),
                SAMPLE_RATES.end()
            )));
        }
        let inner = if from == to {
            None
        } else {
            Some(
                FftFixedInOut::<f32>::new(from as usize, to as usize, 1024, 1)
                    .map_err(|e| failed(e.to_string()))?,
            )
        };
        Ok(Self {
            from,
            to,
            delay_left: inner.as_ref().map_or(0, |r| r.output_delay()),
            inner,
            pending: Vec::new(),
            consumed: 0,
            produced: 0,
        })
    }

    fn failed(&self, error: impl std::fmt::Display) -> Error {
        Error::Resample {
            from: self.from,
            to: self.to,
            reason: error.to_string(),
        }
    }

    /// Resamples the next `samples`, appending what is ready to `out`. A sample that is not
    /// finite or is too large fails with its index counted from the first sample pushed.
    pub(crate) fn push(&mut self, samples: &[f32], out: &mut Vec<f32>) -> Result<()> {
        let at = |index: usize| index + self.consumed as usize;
        if let Err(Error::NonFiniteSample { index, value }) = check_finite(samples) {
            return Err(Error::NonFiniteSample {
                index: at(index),
                value,
            });
        }
        if let Some(index) = samples.iter().position(|s| s.abs() > MAX_SAMPLE_MAGNITUDE) {
            return Err(Error::SampleTooLarge {
                index: at(index),
                value: samples[index],
            });
        }
        self.consumed += samples.len() as u64;
        let Some(inner) = self.inner.as_mut() else {
            out.extend_from_slice(samples);
            self.produced += samples.len() as u64;
            return Ok(());
        };
        let need = inner.input_frames_next();
        let mut rest = samples;
        // Whole chunks straight from the input once the pending ones are out.
        if !self.pending.is_empty() {
            let take = (need - self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.pending.len() < need {
                return Ok(());
            }
            let chunk = std::mem::take(&mut self.pending);
            self.process(Some(&chunk), false, out)?;
            self.pending = chunk;
            self.pending.clear();
        }
        while rest.len() >= need {
            let (chunk, tail) = rest.split_at(need);
            self.process(Some(chunk), false, out)?;
            rest = tail;
        }
        self.pending.extend_from_slice(rest);
        Ok(())
    }

    /// Ends the signal: appends the rest of the output, `⌈pushed · to / from⌉` samples in all.
    pub(crate) fn finish(&mut self, out: &mut Vec<f32>) -> Result<()> {
        let expected = (self.consumed * u64::from(self.to)).div_ceil(u64::from(self.from));
        if self.inner.is_none() {
            return Ok(());
        }
        if !self.pending.is_empty() {
            let chunk = std::mem::take(&mut self.pending);
            self.process(Some(&chunk), true, out)?;
        }
        // Zeros until the delayed output is out.
        while self.produced < expected {
            self.process(None, true, out)?;
        }
        let extra = (self.produced - expected) as usize;
        out.truncate(out.len() - extra);
        self.produced = expected;
        Ok(())
    }

    /// One chunk through the resampler (a partial one at the end), its output after the delay
    /// appended to `out`.
    fn process(&mut self, chunk: Option<&[f32]>, partial: bool, out: &mut Vec<f32>) -> Result<()> {
        let inner = self.inner.as_mut().expect("resampling");
        let produced = match (chunk, partial) {
            (Some(chunk), false) => inner.process(&[chunk], None),
            (Some(chunk), true) => inner.process_partial(Some(&[chunk]), None),
            (None, _) => inner.process_partial::<&[f32]>(None, None),
        }
        .map_err(|e| self.failed(e))?;
        let produced = &produced[0];
        let skip = self.delay_left.min(produced.len());
        self.delay_left -= skip;
        out.extend_from_slice(&produced[skip..]);
        self.produced += (produced.len() - skip) as u64;
        Ok(())
    }

    /// Samples its buffer can hold (its allocated capacity).
    pub(crate) fn buffer_capacity(&self) -> usize {
        self.pending.capacity()
    }
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
