//! A sentence synthesizer on the `espeak-ng` program: formant synthesis, robotic but
//! immediate, so the voice pipeline speaks before CosyVoice weights are present.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

use spec_voice::{AudioChunk, SentenceSynthesizer, Synthesis};
use tracing::debug;

/// Longest audio chunk [`EspeakSynthesizer`] returns, in seconds.
pub const MAX_CHUNK_SECONDS: f64 = 0.5;

/// The slowest speaking rate espeak-ng produces, in words per minute.
pub const MIN_WORDS_PER_MINUTE: u32 = 80;

/// The fastest speaking rate espeak-ng produces, in words per minute.
pub const MAX_WORDS_PER_MINUTE: u32 = 450;

/// How espeak-ng speaks, and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EspeakSettings {
    /// Voice name (`espeak-ng --voices` lists them). Default `en-us`.
    pub voice: String,
    /// Speaking rate, [`MIN_WORDS_PER_MINUTE`] to [`MAX_WORDS_PER_MINUTE`]. Default 175.
    pub words_per_minute: u32,
    /// Pitch, 0 to 99. Default 50.
    pub pitch: u32,
    /// The program: a path, or a name looked up on `PATH`. Default `espeak-ng`.
    pub program: PathBuf,
}

impl Default for EspeakSettings {
    fn default() -> Self {
        Self {
            voice: "en-us".to_string(),
            words_per_minute: 175,
            pitch: 50,
            program: PathBuf::from("espeak-ng"),
        }
    }
}

impl EspeakSettings {
    fn check(&self) -> Result<(), EspeakError> {
        if self.voice.trim().is_empty() {
            return Err(EspeakError::Setting("the voice name is empty".to_string()));
        }
        if !(MIN_WORDS_PER_MINUTE..=MAX_WORDS_PER_MINUTE).contains(&self.words_per_minute) {
            return Err(EspeakError::Setting(format!(
                "{} words per minute is outside {MIN_WORDS_PER_MINUTE}..={MAX_WORDS_PER_MINUTE}",
                self.words_per_minute
            )));
        }
        if self.pitch > 99 {
            return Err(EspeakError::Setting(format!(
                "pitch {} is outside 0..=99",
                self.pitch
            )));
        }
        Ok(())
    }
}

/// What running espeak-ng can fail with. [`SentenceSynthesizer::synthesize`] returns it inside
/// [`spec_voice::Error::Synthesis`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EspeakError {
    /// The program is not installed, or not at the configured path.
    #[error(
        "`{}` not found; install it with `apt-get install espeak-ng` or set the program path",
        program.display()
    )]
    ProgramMissing {
        program: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The program could not be started or fed its text.
    #[error("cannot run `{}`", program.display())]
    Run {
        program: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The program exited with a failure (an unknown voice, for one).
    #[error("`{}` failed ({status}): {stderr}", program.display())]
    Failed {
        program: PathBuf,
        status: ExitStatus,
        /// What it wrote to standard error, trimmed.
        stderr: String,
    },

    /// Its output is not a WAV of a supported sample format.
    #[error("unreadable WAV from espeak-ng: {0}")]
    Wav(String),

    /// Its phonemes are not what was asked for.
    #[error("unexpected phonemes from espeak-ng: {0}")]
    Output(String),

    /// A setting out of range.
    #[error("invalid espeak-ng setting: {0}")]
    Setting(String),
}

impl From<EspeakError> for spec_voice::Error {
    fn from(error: EspeakError) -> Self {
        spec_voice::Error::Synthesis(Box::new(error))
    }
}

/// Speaks sentences with espeak-ng, one run of the program per sentence. The text goes to its
/// standard input (never its arguments, so text starting with `-` is spoken) and the audio
/// comes back as a WAV on its standard output, at the WAV's own rate (22050 Hz).
#[derive(Clone, Debug)]
pub struct EspeakSynthesizer {
    settings: EspeakSettings,
    version: String,
}

impl EspeakSynthesizer {
    /// Checks the settings and that the program runs (`espeak-ng --version`).
    pub fn new(settings: EspeakSettings) -> Result<Self, EspeakError> {
        settings.check()?;
        let output = run_program(&settings.program, &["--version".to_string()], "")?;
        let version = String::from_utf8_lossy(&output).trim().to_string();
        debug!("using {version}");
        Ok(Self { settings, version })
    }

    /// The settings it speaks with.
    pub fn settings(&self) -> &EspeakSettings {
        &self.settings
    }

    /// The program's `--version` line.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The whole of standard input as UTF-8 text (`--stdin -b 1`), a WAV on standard output,
    /// then the voice, rate and pitch.
    fn arguments(&self) -> Vec<String> {
        let settings = &self.settings;
        vec![
            "--stdin".to_string(),
            "--stdout".to_string(),
            "-b".to_string(),
            "1".to_string(),
            "-v".to_string(),
            settings.voice.clone(),
            "-s".to_string(),
            settings.words_per_minute.to_string(),
            "-p".to_string(),
            settings.pitch.to_string(),
        ]
    }
}

impl SentenceSynthesizer for EspeakSynthesizer {
    fn synthesize(&mut self, sentence: &str) -> spec_voice::Result<Synthesis> {
        let sentence = spec_voice::sentence_to_speak(sentence)?;
        let start = Instant::now();
        let wav = run_program(&self.settings.program, &self.arguments(), sentence)?;
        let chunks = wav_chunks(&wav)?;
        let first_audio_after = start.elapsed();
        debug!(
            "espeak-ng: {} bytes of WAV in {first_audio_after:?}",
            wav.len()
        );
        Ok(Synthesis {
            sentence: sentence.to_string(),
            chunks,
            first_audio_after,
            compute: first_audio_after,
        })
    }
}

/// Runs `program` with `args` and `input` on its standard input; its standard output.
pub(crate) fn run_program(
    program: &Path,
    args: &[String],
    input: &str,
) -> Result<Vec<u8>, EspeakError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => EspeakError::ProgramMissing {
                program: program.to_path_buf(),
                source,
            },
            _ => EspeakError::Run {
                program: program.to_path_buf(),
                source,
            },
        })?;
    let mut stdin = child.stdin.take().expect("standard input is piped");
    // Written from another thread while the output is read, so that neither pipe fills up.
    let (written, output) = std::thread::scope(|scope| {
        let writer = scope.spawn(move || stdin.write_all(input.as_bytes()));
        let output = child.wait_with_output();
        let written = writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (written, output)
    });
    let run_error = |source| EspeakError::Run {
        program: program.to_path_buf(),
        source,
    };
    let output = output.map_err(run_error)?;
    if !output.status.success() {
        return Err(EspeakError::Failed {
            program: program.to_path_buf(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    written.map_err(run_error)?;
    Ok(output.stdout)
}

/// Mono chunks of at most [`MAX_CHUNK_SECONDS`] from a WAV (integer PCM of 8 to 32 bits, or
/// 32-bit float), its channels averaged.
///
/// espeak-ng writes to a pipe, where it cannot go back to fill in the sizes in the header: its
/// data chunk claims about 2 GiB. The samples therefore end where the bytes do (reading from
/// memory fails only there), and an incomplete last frame is dropped.
fn wav_chunks(bytes: &[u8]) -> Result<Vec<AudioChunk>, EspeakError> {
    let mut reader = hound::WavReader::new(bytes).map_err(|e| EspeakError::Wav(e.to_string()))?;
    let spec = reader.spec();
    let interleaved: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Float, 32) => reader.samples::<f32>().map_while(Result::ok).collect(),
        (hound::SampleFormat::Int, bits @ 8..=32) => {
            let scale = 1.0 / (1u64 << (bits - 1)) as f32;
            reader
                .samples::<i32>()
                .map_while(Result::ok)
                .map(|s| s as f32 * scale)
                .collect()
        }
        (format, bits) => {
            return Err(EspeakError::Wav(format!(
                "{bits}-bit {format:?} samples are not supported"
            )))
        }
    };
    let channels = usize::from(spec.channels.max(1));
    let samples: Vec<f32> = interleaved
        .chunks_exact(channels)
        .map(|frame| frame.iter().sum::<f32>() / channels as f32)
        .collect();
    let chunk_len = ((MAX_CHUNK_SECONDS * f64::from(spec.sample_rate)) as usize).max(1);
    Ok(samples
        .chunks(chunk_len)
        .map(|chunk| AudioChunk {
            samples: chunk.to_vec(),
            sample_rate: spec.sample_rate,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    /// A WAV in memory, written by hound.
    fn wav(spec: hound::WavSpec, frames: &[Vec<f32>]) -> Vec<u8> {
        let mut bytes = Cursor::new(Vec::new());
        let mut writer = hound::WavWriter::new(&mut bytes, spec).unwrap();
        for frame in frames {
            for &v in frame {
                match spec.sample_format {
                    hound::SampleFormat::Float => writer.write_sample(v).unwrap(),
                    hound::SampleFormat::Int => writer
                        .write_sample((v * f32::from(i16::MAX)).round() as i16)
                        .unwrap(),
                }
            }
        }
        writer.finalize().unwrap();
        bytes.into_inner()
    }

    fn mono16(sample_rate: u32) -> hound::WavSpec {
        hound::WavSpec {
            channels: 1,
            sample_rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        }
    }

    /// A ramp from -1 to 1 over `len` samples.
    fn ramp(len: usize) -> Vec<Vec<f32>> {
        (0..len)
            .map(|i| vec![2.0 * i as f32 / (len - 1) as f32 - 1.0])
            .collect()
    }

    fn flatten(chunks: &[AudioChunk]) -> Vec<f32> {
        chunks.iter().flat_map(|c| c.samples.clone()).collect()
    }

    fn missing_program() -> EspeakSettings {
        EspeakSettings {
            program: PathBuf::from("/nonexistent/espeak-ng"),
            ..EspeakSettings::default()
        }
    }

    #[test]
    fn defaults() {
        let settings = EspeakSettings::default();
        assert_eq!(settings.voice, "en-us");
        assert_eq!(settings.words_per_minute, 175);
        assert_eq!(settings.pitch, 50);
        assert_eq!(settings.program, Path::new("espeak-ng"));
        assert!(settings.check().is_ok());
    }

    #[test]
    fn wav_is_cut_into_half_seconds_at_its_own_rate() {
        // 1.2 s at 22050 Hz: two half seconds and 0.2 s.
        let frames = ramp(26_460);
        let chunks = wav_chunks(&wav(mono16(22_050), &frames)).unwrap();
        let lengths: Vec<usize> = chunks.iter().map(|c| c.samples.len()).collect();
        assert_eq!(lengths, [11_025, 11_025, 4_410]);
        assert!(chunks.iter().all(|c| c.sample_rate == 22_050));
        let samples = flatten(&chunks);
        for (got, frame) in samples.iter().zip(&frames) {
            assert!((got - frame[0]).abs() < 1e-4, "{got} vs {}", frame[0]);
        }
        assert!((samples[0] + 1.0).abs() < 1e-4);
        assert!((samples[26_459] - 1.0).abs() < 1e-4);
    }

    #[test]
    fn channels_are_averaged_and_float_is_read() {
        let spec = hound::WavSpec {
            channels: 2,
            sample_rate: 8_000,
            bits_per_sample: 32,
            sample_format: hound::SampleFormat::Float,
        };
        let frames = vec![vec![0.5, -0.5], vec![1.0, 0.0], vec![-0.25, -0.75]];
        let chunks = wav_chunks(&wav(spec, &frames)).unwrap();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].sample_rate, 8_000);
        assert_eq!(chunks[0].samples, [0.0, 0.5, -0.5]);
    }

    #[test]
    fn streamed_header_sizes_are_read_up_to_the_bytes_present() {
        // As espeak-ng writes to a pipe: RIFF and data sizes of about 2 GiB, and a last sample
        // cut in half.
        let frames = ramp(12_000);
        let mut bytes = wav(mono16(22_050), &frames);
        let complete = wav_chunks(&bytes).unwrap();
        assert_eq!(&bytes[36..40], b"data");
        bytes[4..8].copy_from_slice(&0x7fff_f024u32.to_le_bytes());
        bytes[40..44].copy_from_slice(&0x7fff_f000u32.to_le_bytes());
        bytes.push(0);
        let streamed = wav_chunks(&bytes).unwrap();
        assert_eq!(streamed, complete);
        assert_eq!(flatten(&streamed).len(), 12_000);
    }

    #[test]
    fn a_wav_without_samples_has_no_chunks() {
        assert!(wav_chunks(&wav(mono16(22_050), &[])).unwrap().is_empty());
    }

    #[test]
    fn bytes_that_are_not_a_wav_are_an_error() {
        for bytes in [&b""[..], b"espeak-ng 1.51", b"RIFF\0\0\0\0WAVE"] {
            assert!(matches!(wav_chunks(bytes), Err(EspeakError::Wav(_))));
        }
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 8_000,
            bits_per_sample: 32,
            sample_format: hound::SampleFormat::Float,
        };
        let mut bytes = wav(spec, &[vec![0.0]]);
        // A 64-bit float format chunk.
        bytes[34..36].copy_from_slice(&64u16.to_le_bytes());
        assert!(matches!(wav_chunks(&bytes), Err(EspeakError::Wav(_))));
    }

    #[test]
    fn a_missing_program_says_how_to_install_it() {
        let error = EspeakSynthesizer::new(missing_program()).unwrap_err();
        assert!(
            matches!(error, EspeakError::ProgramMissing { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("apt-get install espeak-ng"));

        let mut tts = EspeakSynthesizer {
            settings: missing_program(),
            version: String::new(),
        };
        let Err(spec_voice::Error::Synthesis(inner)) = tts.synthesize("Hello.") else {
            panic!("expected a synthesis error");
        };
        assert!(matches!(
            inner.downcast_ref::<EspeakError>(),
            Some(EspeakError::ProgramMissing { .. })
        ));
    }

    #[test]
    fn empty_sentences_are_input_errors() {
        let mut tts = EspeakSynthesizer {
            settings: missing_program(),
            version: String::new(),
        };
        for sentence in ["", "  \n\t"] {
            assert!(matches!(
                tts.synthesize(sentence),
                Err(spec_voice::Error::Input(_))
            ));
        }
    }

    #[test]
    fn settings_out_of_range_are_refused_before_running() {
        let bad = [
            EspeakSettings {
                voice: " ".to_string(),
                ..missing_program()
            },
            EspeakSettings {
                words_per_minute: 79,
                ..missing_program()
            },
            EspeakSettings {
                words_per_minute: 451,
                ..missing_program()
            },
            EspeakSettings {
                pitch: 100,
                ..missing_program()
            },
        ];
        for settings in bad {
            let error = EspeakSynthesizer::new(settings).unwrap_err();
            assert!(matches!(error, EspeakError::Setting(_)), "{error:?}");
        }
    }

    #[test]
    fn text_goes_to_standard_input_not_the_arguments() {
        let tts = EspeakSynthesizer {
            settings: EspeakSettings {
                voice: "de".to_string(),
                words_per_minute: 120,
                pitch: 30,
                ..EspeakSettings::default()
            },
            version: String::new(),
        };
        assert_eq!(
            tts.arguments(),
            ["--stdin", "--stdout", "-b", "1", "-v", "de", "-s", "120", "-p", "30"]
        );
    }
}
