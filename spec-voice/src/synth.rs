//! Speech synthesis behind one interface: sentences in, audio out.
//!
//! The pipeline's [`Speaker`](crate::Speaker) synthesizes the first sentence of PredGen's guessed
//! answer while the user is still speaking and keeps it as [`PreparedAudio`]; when the final
//! answer starts with that sentence, its audio plays at once instead of after the synthesizer's
//! latency.

use std::path::Path;
use std::time::Duration;

use crate::{Error, Result};

/// Audio samples (mono f32) at a sample rate.
#[derive(Clone, Debug, PartialEq)]
pub struct AudioChunk {
    /// Mono samples in [-1, 1].
    pub samples: Vec<f32>,
    /// Samples per second.
    pub sample_rate: u32,
}

impl AudioChunk {
    /// How long the chunk plays (zero at a zero sample rate).
    pub fn duration(&self) -> Duration {
        crate::timing::duration_of(self.samples.len(), self.sample_rate)
    }
}

/// A synthesized sentence: its audio, the compute time until its first chunk is ready (what a
/// listener waits for) and the compute time of all of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Synthesis {
    /// The sentence spoken, trimmed.
    pub sentence: String,
    /// Its audio, in playing order.
    pub chunks: Vec<AudioChunk>,
    /// Compute time from the request until the first chunk is ready.
    pub first_audio_after: Duration,
    /// Compute time of the whole sentence.
    pub compute: Duration,
}

impl Synthesis {
    /// All of the sentence's audio as one chunk; an error when there is none or the chunks'
    /// sample rates differ.
    pub fn joined(&self) -> Result<AudioChunk> {
        let sample_rate = shared_sample_rate(&self.chunks)
            .map_err(|why| Error::Input(format!("the audio of {:?}: {why}", self.sentence)))?;
        Ok(AudioChunk {
            samples: self
                .chunks
                .iter()
                .flat_map(|c| c.samples.iter().copied())
                .collect(),
            sample_rate,
        })
    }
}

/// Synthesizes speech sentence by sentence. The pipeline's [`Speaker`](crate::Speaker) calls it
/// ahead of time with the first sentence of PredGen's guessed answer and keeps the Synthesis, so
/// that if the final answer starts with the same sentence its audio plays at once.
pub trait SentenceSynthesizer {
    /// Speech for `sentence`; an error for an empty or whitespace-only sentence.
    fn synthesize(&mut self, sentence: &str) -> Result<Synthesis>;

    /// Speech for `sentence` at `speed` times the voice's pace (2: twice as fast). A voice that
    /// cannot change its pace refuses any speed but 1.
    fn synthesize_at(&mut self, sentence: &str, speed: f32) -> Result<Synthesis> {
        if speed == 1.0 {
            return self.synthesize(sentence);
        }
        Err(Error::Input(format!(
            "this voice speaks at its own pace only, not at speed {speed}"
        )))
    }
}

/// The text a synthesizer speaks for `sentence`: trimmed; an error when nothing is left.
pub fn sentence_to_speak(sentence: &str) -> Result<&str> {
    let sentence = sentence.trim();
    if sentence.is_empty() {
        return Err(Error::Input(
            "cannot synthesize an empty sentence".to_string(),
        ));
    }
    Ok(sentence)
}

/// Speaking rate of [`FixedLatencySynthesizer`]'s audio: characters per second of speech.
pub const SPOKEN_CHARS_PER_SECOND: f64 = 15.0;

/// Longest audio chunk [`FixedLatencySynthesizer`] produces, in seconds.
pub const MAX_CHUNK_SECONDS: f64 = 0.5;

/// Stands in for a real TTS model (until engine-tts exists): fixed latency to first audio
/// (default 200 ms, the PredGen paper's measurement for Zonos), and silence of a plausible
/// duration ([`SPOKEN_CHARS_PER_SECOND`] characters per second of speech) at 24 kHz, in chunks
/// of at most [`MAX_CHUNK_SECONDS`].
///
/// It does not sleep: the latency is reported in [`Synthesis::first_audio_after`] (and as the
/// whole [`Synthesis::compute`]), for the caller to charge to its clock.
#[derive(Clone, Debug, PartialEq)]
pub struct FixedLatencySynthesizer {
    /// Compute time until the first audio chunk.
    pub latency: Duration,
    /// Sample rate of the audio (must not be zero).
    pub sample_rate: u32,
}

impl Default for FixedLatencySynthesizer {
    fn default() -> Self {
        Self::new(Duration::from_millis(200))
    }
}

impl FixedLatencySynthesizer {
    /// A synthesizer with `latency` to first audio, at 24 kHz.
    pub fn new(latency: Duration) -> Self {
        Self {
            latency,
            sample_rate: 24_000,
        }
    }
}

impl SentenceSynthesizer for FixedLatencySynthesizer {
    fn synthesize(&mut self, sentence: &str) -> Result<Synthesis> {
        let sentence = sentence_to_speak(sentence)?;
        if self.sample_rate == 0 {
            return Err(Error::Input(
                "cannot synthesize at a sample rate of 0 Hz".to_string(),
            ));
        }
        let rate = f64::from(self.sample_rate);
        let seconds = sentence.chars().count() as f64 / SPOKEN_CHARS_PER_SECOND;
        let total = (seconds * rate).round() as usize;
        let chunk_len = ((MAX_CHUNK_SECONDS * rate) as usize).max(1);
        let chunks = (0..total)
            .step_by(chunk_len)
            .map(|start| AudioChunk {
                samples: vec![0.0; chunk_len.min(total - start)],
                sample_rate: self.sample_rate,
            })
            .collect();
        Ok(Synthesis {
            sentence: sentence.to_string(),
            chunks,
            first_audio_after: self.latency,
            compute: self.latency,
        })
    }
}

/// The one sample rate of `chunks`, or why there is none: no chunk, a 0 Hz rate, or two rates.
fn shared_sample_rate<'a>(chunks: impl IntoIterator<Item = &'a AudioChunk>) -> Result<u32, String> {
    let mut chunks = chunks.into_iter();
    let sample_rate = chunks.next().map_or(0, |c| c.sample_rate);
    if sample_rate == 0 {
        return Err("no audio (or a 0 Hz sample rate)".into());
    }
    match chunks.find(|c| c.sample_rate != sample_rate) {
        Some(other) => Err(format!(
            "chunks at {sample_rate} Hz and {} Hz",
            other.sample_rate
        )),
        None => Ok(sample_rate),
    }
}

/// Writes `chunks` (all at one sample rate) to `path` as a 16-bit mono WAV file.
pub fn write_wav<'a>(path: &Path, chunks: impl IntoIterator<Item = &'a AudioChunk>) -> Result<()> {
    let chunks: Vec<&AudioChunk> = chunks.into_iter().collect();
    let sample_rate = shared_sample_rate(chunks.iter().copied())
        .map_err(|why| Error::Input(format!("cannot write one WAV file: {why}")))?;
    let io_error = |e: hound::Error| Error::Io {
        path: path.to_path_buf(),
        source: match e {
            hound::Error::IoError(e) => e,
            other => std::io::Error::other(other.to_string()),
        },
    };
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(path, spec).map_err(io_error)?;
    for sample in chunks.iter().flat_map(|c| &c.samples) {
        let value = (sample.clamp(-1.0, 1.0) * f32::from(i16::MAX)).round() as i16;
        writer.write_sample(value).map_err(io_error)?;
    }
    writer.finalize().map_err(io_error)
}

/// A guessed first sentence's audio, prepared ahead of time and kept until the final answer is
/// known: the audio of its first piece ([`first_piece_end`](crate::first_piece_end); the whole
/// sentence when it is not cut). It plays for any answer whose first sentence opens with the
/// same piece; the rest is made then.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedAudio {
    /// The whole guessed sentence, trimmed.
    pub sentence: String,
    /// The synthesized first piece (its `sentence` is the piece's text).
    pub synthesis: Synthesis,
    /// When (on the session clock) the first audio chunk is ready.
    pub ready_at: Duration,
}

impl PreparedAudio {
    /// Whether this audio can open `sentence`: it is the audio of `sentence`'s first piece
    /// (after trimming whitespace), whatever follows that piece.
    pub fn matches(&self, sentence: &str) -> bool {
        let (first_piece, _) = crate::split_first_piece(sentence.trim());
        !first_piece.is_empty() && self.synthesis.sentence == first_piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synthesis_joins_its_chunks_at_one_rate() {
        let chunk = |samples: Vec<f32>, sample_rate| AudioChunk {
            samples,
            sample_rate,
        };
        let mut synthesis = Synthesis {
            sentence: "Hi.".to_string(),
            chunks: vec![chunk(vec![0.1, 0.2], 8000), chunk(vec![0.3], 8000)],
            first_audio_after: Duration::ZERO,
            compute: Duration::ZERO,
        };
        assert_eq!(
            synthesis.joined().unwrap(),
            chunk(vec![0.1, 0.2, 0.3], 8000)
        );
        synthesis.chunks.push(chunk(vec![0.4], 16000));
        assert!(matches!(synthesis.joined(), Err(Error::Input(_))));
        synthesis.chunks.clear();
        assert!(matches!(synthesis.joined(), Err(Error::Input(_))));
    }

    #[test]
    fn audio_is_written_as_a_wav_file_and_bad_audio_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.wav");
        let chunk = |samples: Vec<f32>, sample_rate| AudioChunk {
            samples,
            sample_rate,
        };
        let chunks = [chunk(vec![0.0, 0.5], 8000), chunk(vec![-1.0, 2.0], 8000)];
        write_wav(&path, &chunks).unwrap();
        let mut reader = hound::WavReader::open(&path).unwrap();
        assert_eq!(reader.spec().sample_rate, 8000);
        let samples: Vec<i16> = reader.samples::<i16>().map(|s| s.unwrap()).collect();
        assert_eq!(samples, vec![0, 16384, -32767, 32767]);
        let mixed = [chunk(vec![0.0], 8000), chunk(vec![0.0], 16000)];
        assert!(matches!(write_wav(&path, &mixed), Err(Error::Input(_))));
        assert!(matches!(write_wav(&path, &[]), Err(Error::Input(_))));
        let missing = dir.path().join("no/such/dir/a.wav");
        assert!(matches!(
            write_wav(&missing, &chunks),
            Err(Error::Io { .. })
        ));
    }

    fn total_samples(synthesis: &Synthesis) -> usize {
        synthesis.chunks.iter().map(|c| c.samples.len()).sum()
    }

    #[test]
    fn a_voice_without_a_pace_of_its_own_refuses_other_speeds() {
        let mut tts = FixedLatencySynthesizer::default();
        assert_eq!(
            tts.synthesize_at("Hello there.", 1.0).unwrap(),
            tts.synthesize("Hello there.").unwrap()
        );
        assert!(matches!(
            tts.synthesize_at("Hello there.", 1.5),
            Err(Error::Input(_))
        ));
    }

    #[test]
    fn default_is_200_ms_at_24_khz() {
        let tts = FixedLatencySynthesizer::default();
        assert_eq!(tts.latency, Duration::from_millis(200));
        assert_eq!(tts.sample_rate, 24_000);
        let tts = FixedLatencySynthesizer::new(Duration::from_millis(75));
        assert_eq!(tts.latency, Duration::from_millis(75));
        assert_eq!(tts.sample_rate, 24_000);
    }

    #[test]
    fn silence_lasts_as_long_as_the_sentence_takes_to_say() {
        let mut tts = FixedLatencySynthesizer::default();
        let synthesis = tts.synthesize("  Hello there.\n").unwrap();
        assert_eq!(synthesis.sentence, "Hello there.");
        assert_eq!(synthesis.first_audio_after, Duration::from_millis(200));
        // 12 characters at 15 per second: 0.8 s.
        assert_eq!(total_samples(&synthesis), 19_200);
        let lengths: Vec<usize> = synthesis.chunks.iter().map(|c| c.samples.len()).collect();
        assert_eq!(lengths, [12_000, 7_200]);
        let played: Duration = synthesis.chunks.iter().map(AudioChunk::duration).sum();
        assert_eq!(played, Duration::from_millis(800));
        assert!(synthesis
            .chunks
            .iter()
            .all(|c| c.sample_rate == 24_000 && c.samples.iter().all(|&s| s == 0.0)));
    }

    #[test]
    fn chunks_are_at_most_half_a_second() {
        let mut tts = FixedLatencySynthesizer {
            latency: Duration::ZERO,
            sample_rate: 16_000,
        };
        // 45 characters (multi-byte ones count once): 3 s.
        let sentence = "é".repeat(45);
        let synthesis = tts.synthesize(&sentence).unwrap();
        assert_eq!(synthesis.chunks.len(), 6);
        assert!(synthesis.chunks.iter().all(|c| c.samples.len() == 8_000));
        assert_eq!(synthesis.first_audio_after, Duration::ZERO);
        let one = tts.synthesize("a").unwrap();
        assert_eq!(one.chunks.len(), 1);
        assert_eq!(total_samples(&one), 1_067);
    }

    #[test]
    fn tiny_sample_rates_still_chunk() {
        let mut tts = FixedLatencySynthesizer {
            latency: Duration::ZERO,
            sample_rate: 1,
        };
        let synthesis = tts.synthesize(&"x".repeat(60)).unwrap();
        assert_eq!(total_samples(&synthesis), 4);
        assert!(synthesis.chunks.iter().all(|c| c.samples.len() == 1));
    }

    #[test]
    fn empty_sentences_and_zero_sample_rate_are_errors() {
        let mut tts = FixedLatencySynthesizer::default();
        for sentence in ["", "  \n\t"] {
            assert!(matches!(tts.synthesize(sentence), Err(Error::Input(_))));
        }
        tts.sample_rate = 0;
        assert!(matches!(tts.synthesize("Hi."), Err(Error::Input(_))));
    }

    #[test]
    fn zero_rate_chunk_plays_for_no_time() {
        let chunk = AudioChunk {
            samples: vec![0.0; 10],
            sample_rate: 0,
        };
        assert_eq!(chunk.duration(), Duration::ZERO);
    }

    #[test]
    fn prepared_audio_matches_sentences_opening_with_its_first_piece() {
        let mut tts = FixedLatencySynthesizer::default();
        let prepared = PreparedAudio {
            sentence: "Boil it for six minutes.".into(),
            synthesis: tts.synthesize("Boil it for six minutes.").unwrap(),
            ready_at: Duration::from_millis(1_400),
        };
        assert!(prepared.matches("Boil it for six minutes."));
        assert!(prepared.matches("  Boil it for six minutes.\n"));
        assert!(!prepared.matches("Boil it for seven minutes."));
        assert!(!prepared.matches("Boil it for six minutes"));
        assert!(!prepared.matches(""));
        let guess = "If you water it too often, the roots will rot.";
        let prepared = PreparedAudio {
            sentence: guess.into(),
            synthesis: tts.synthesize("If you water it too often,").unwrap(),
            ready_at: Duration::from_millis(1_400),
        };
        assert!(prepared.matches(guess));
        assert!(prepared.matches("If you water it too often, the leaves turn yellow."));
        assert!(!prepared.matches("If you water it too often."));
        assert!(!prepared.matches("If you water it daily, the roots will rot."));
    }
}
