//! Kokoro-82M v1.0 (StyleTTS 2's prosody predictor and decoder with an iSTFTNet vocoder, 82 M
//! parameters; hexgrad), run by ONNX Runtime from its int8 ONNX export: phonemes in misaki's set
//! ([`phonemes`]) and a voice's style vector in, 24 kHz audio out.
//!
//! What differs from the reference (`kokoro`'s `KPipeline`): the phonemes come from misaki's
//! lexicons with espeak-ng for unknown words, without misaki's part-of-speech tagging (a word
//! spelled alike is read one way) and its number and abbreviation rules (espeak-ng reads
//! numbers); a sentence longer than the model's 510 tokens is cut at the last pause before.

pub mod phonemes;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ort::session::Session;
use ort::value::Tensor;
use spec_voice::{AudioChunk, SentenceSynthesizer, SilenceMargins, Synthesis};
use tracing::{debug, warn};

use crate::onnx::{self, Result, VoiceError};
pub use phonemes::{PhonemeSource, Phonemizer};

/// Kokoro's sample rate.
pub const SAMPLE_RATE: u32 = 24_000;

/// Most phoneme tokens in one run (the model's 512 positions but the pads at both ends).
pub const MAX_TOKENS: usize = 510;

/// Width of a voice's style vector.
const STYLE_WIDTH: usize = 256;

/// A voice: one style vector per phoneme count (a sentence of `n` tokens takes row `n`).
#[derive(Clone, Debug)]
pub struct Voice {
    name: String,
    styles: Vec<f32>,
}

impl Voice {
    /// Reads a voice file (`voices/NAME.bin`: little-endian f32 rows of 256).
    pub fn load(path: &Path) -> Result<Self> {
        let bad = |reason: String| VoiceError::File {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let row_bytes = STYLE_WIDTH * 4;
        if bytes.is_empty() || bytes.len() % row_bytes != 0 {
            return Err(bad(format!(
                "{} bytes is not a whole number of {STYLE_WIDTH}-value style rows",
                bytes.len()
            )));
        }
        let styles: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if styles.iter().any(|v| !v.is_finite()) {
            return Err(bad("a style value is not a finite number".into()));
        }
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Self { name, styles })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The style for a sentence of `tokens` phoneme tokens.
    fn style(&self, tokens: usize) -> &[f32] {
        let rows = self.styles.len() / STYLE_WIDTH;
        let row = tokens.min(rows - 1);
        &self.styles[row * STYLE_WIDTH..(row + 1) * STYLE_WIDTH]
    }
}

/// The model: its ONNX session and its phoneme vocabulary.
#[derive(Debug)]
pub struct Kokoro {
    session: Session,
    vocabulary: HashMap<char, i64>,
    dir: PathBuf,
}

impl Kokoro {
    /// Loads `model.onnx` and `vocab.json` from `dir` (the models folder's `kokoro-82m/`) on
    /// `threads` threads.
    pub fn load(
        dir: &Path,
        environment: &ort::environment::Environment,
        threads: usize,
    ) -> Result<Self> {
        let vocabulary = read_vocabulary(&dir.join("vocab.json"))?;
        let session = onnx::session(environment, &dir.join("model.onnx"), threads)?;
        Ok(Self {
            session,
            vocabulary,
            dir: dir.to_path_buf(),
        })
    }

    /// The voices in the model folder, by name.
    pub fn voices(&self) -> Result<Vec<String>> {
        Self::voice_names(&self.dir.join("voices"))
    }

    /// The voices of a voices folder (`NAME.bin`), by name.
    pub fn voice_names(dir: &Path) -> Result<Vec<String>> {
        let entries = std::fs::read_dir(dir).map_err(|e| VoiceError::File {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
        let mut names: Vec<String> = entries
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                if path.extension()? != "bin" {
                    return None;
                }
                Some(path.file_stem()?.to_string_lossy().into_owned())
            })
            .collect();
        names.sort();
        Ok(names)
    }

    /// The voice `name` (`af_heart`, `bm_george`, …).
    pub fn voice(&self, name: &str) -> Result<Voice> {
        let known = self.voices()?;
        if !known.iter().any(|v| v == name) {
            return Err(VoiceError::UnknownVoice {
                name: name.to_string(),
                available: known.join(", "),
            });
        }
        Voice::load(&self.dir.join("voices").join(format!("{name}.bin")))
    }

    /// The token ids of `phonemes`; a symbol the vocabulary lacks is dropped with a warning.
    pub fn token_ids(&self, phonemes: &str) -> Vec<i64> {
        phonemes
            .chars()
            .filter_map(|c| {
                let id = self.vocabulary.get(&c).copied();
                if id.is_none() {
                    warn!("Kokoro has no phoneme {c:?}; it is left out");
                }
                id
            })
            .collect()
    }

    /// Audio for at most [`MAX_TOKENS`] phoneme tokens in `voice` at `speed` (1 is the voice's
    /// own pace).
    pub fn speak(&mut self, ids: &[i64], voice: &Voice, speed: f32) -> Result<Vec<f32>> {
        if ids.is_empty() || ids.len() > MAX_TOKENS {
            return Err(VoiceError::Input(format!(
                "Kokoro speaks 1 to {MAX_TOKENS} phoneme tokens at a time, got {}",
                ids.len()
            )));
        }
        let failed = onnx::run_failed("Kokoro");
        let padded: Vec<i64> = [0]
            .into_iter()
            .chain(ids.iter().copied())
            .chain([0])
            .collect();
        let tokens = Tensor::from_array(([1, padded.len()], padded)).map_err(failed)?;
        let style = voice.style(ids.len()).to_vec();
        let style = Tensor::from_array(([1, STYLE_WIDTH], style)).map_err(failed)?;
        let speed = Tensor::from_array(([1], vec![speed])).map_err(failed)?;
        let outputs = self
            .session
            .run(ort::inputs!["tokens" => tokens, "style" => style, "speed" => speed])
            .map_err(failed)?;
        onnx::f32_output(&outputs, "Kokoro", "audio")
    }
}

/// The ids of the `symbols` that `vocabulary` has.
fn ids_of(vocabulary: &HashMap<char, i64>, symbols: &str) -> Vec<i64> {
    symbols
        .chars()
        .filter_map(|c| vocabulary.get(&c).copied())
        .collect()
}

/// `ids` cut into runs of at most [`MAX_TOKENS`], each ending at the last pause (punctuation
/// or a space) that fits. (A first sentence's first clause is spoken sooner by the pipeline,
/// which hands it over alone: `spec_voice::first_piece_end`.)
fn runs(vocabulary: &HashMap<char, i64>, ids: &[i64]) -> Vec<std::ops::Range<usize>> {
    let pauses = ids_of(vocabulary, ";:,.!?—… ");
    let mut runs = Vec::new();
    let mut start = 0;
    while ids.len() - start > MAX_TOKENS {
        let window = &ids[start..start + MAX_TOKENS];
        let cut = window
            .iter()
            .rposition(|id| pauses.contains(id))
            .map_or(MAX_TOKENS, |i| i + 1);
        runs.push(start..start + cut);
        start += cut;
    }
    if start < ids.len() {
        runs.push(start..ids.len());
    }
    runs
}

/// `vocab.json`: `{"vocab": {"symbol": id, …}}`, each symbol one character.
fn read_vocabulary(path: &Path) -> Result<HashMap<char, i64>> {
    let bad = |reason: String| VoiceError::File {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let entries = json
        .get("vocab")
        .and_then(|v| v.as_object())
        .ok_or_else(|| bad("no \"vocab\" object".into()))?;
    entries
        .iter()
        .map(|(symbol, id)| {
            let mut chars = symbol.chars();
            match (chars.next(), chars.next(), id.as_i64()) {
                (Some(c), None, Some(id)) => Ok((c, id)),
                _ => Err(bad(format!(
                    "entry {symbol:?}: {id} is not one symbol's id"
                ))),
            }
        })
        .collect()
}

/// How a [`KokoroSynthesizer`] speaks.
#[derive(Clone, Debug, PartialEq)]
pub struct KokoroSettings {
    /// The voice (`af_heart` by default; [`Kokoro::voices`] lists them).
    pub voice: String,
    /// Pace, 0.5 to 2 (1 by default).
    pub speed: f32,
    /// ONNX Runtime's threads.
    pub threads: usize,
    /// espeak-ng, for the words the lexicons lack.
    pub espeak: PathBuf,
    /// Where the phonemes come from: misaki's lexicons with espeak-ng for the words they lack
    /// (the default), or espeak-ng alone (to measure what the lexicons bring).
    pub phonemes: PhonemeSource,
    /// The silence kept before the first word and after the last ([`SilenceMargins::default`]:
    /// 50 and 250 ms); `None` keeps the model's own (about 0.3 s before, 0.45 s after).
    pub silence: Option<SilenceMargins>,
}

impl Default for KokoroSettings {
    fn default() -> Self {
        Self {
            voice: "af_heart".into(),
            speed: 1.0,
            threads: 2,
            espeak: PathBuf::from("espeak-ng"),
            phonemes: PhonemeSource::default(),
            silence: Some(SilenceMargins::default()),
        }
    }
}

/// Kokoro as the pipeline's sentence synthesizer.
#[derive(Debug)]
pub struct KokoroSynthesizer {
    model: Kokoro,
    voice: Voice,
    phonemizer: Phonemizer,
    speed: f32,
    silence: Option<SilenceMargins>,
}

impl KokoroSynthesizer {
    /// Kokoro from the models folder `models` (`kokoro-82m/`, ONNX Runtime from
    /// [`onnx::library_path`]).
    pub fn load(models: &Path, settings: &KokoroSettings) -> Result<Self> {
        onnx::check_speed(settings.speed)?;
        let environment = onnx::environment(&onnx::library_path(models))?;
        let dir = models.join("kokoro-82m");
        let model = Kokoro::load(&dir, environment, settings.threads)?;
        let voice = model.voice(&settings.voice)?;
        let phonemizer = match settings.phonemes {
            PhonemeSource::Lexicon => Phonemizer::load(&dir.join("lexicon"), &settings.espeak)?,
            PhonemeSource::Espeak => Phonemizer::espeak_only(&settings.espeak),
        };
        Ok(Self {
            model,
            voice,
            phonemizer,
            speed: settings.speed,
            silence: settings.silence,
        })
    }

    /// The phonemes it would speak for `text`.
    pub fn phonemes(&self, text: &str) -> Result<String> {
        self.phonemizer.phonemes(text)
    }
}

impl SentenceSynthesizer for KokoroSynthesizer {
    fn synthesize(&mut self, sentence: &str) -> spec_voice::Result<Synthesis> {
        self.synthesize_at(sentence, 1.0)
    }

    /// At `speed` (0.5 to 2) times the settings' pace.
    fn synthesize_at(&mut self, sentence: &str, speed: f32) -> spec_voice::Result<Synthesis> {
        onnx::check_speed(speed)?;
        let speed = self.speed * speed;
        let sentence = spec_voice::sentence_to_speak(sentence)?;
        let started = Instant::now();
        let phonemes = self.phonemizer.phonemes(sentence)?;
        let ids = self.model.token_ids(phonemes.trim());
        let mut chunks = Vec::new();
        let mut first_audio_after = None;
        for run in runs(&self.model.vocabulary, &ids) {
            let samples = self.model.speak(&ids[run], &self.voice, speed)?;
            first_audio_after.get_or_insert_with(|| started.elapsed());
            chunks.push(AudioChunk {
                samples,
                sample_rate: SAMPLE_RATE,
            });
        }
        if let Some(margins) = self.silence {
            margins.trim(&mut chunks);
        }
        debug!(
            "Kokoro: {sentence:?} as {phonemes:?} in {:?}",
            started.elapsed()
        );
        Ok(Synthesis {
            sentence: sentence.to_string(),
            chunks,
            first_audio_after: first_audio_after.unwrap_or_else(|| started.elapsed()),
            compute: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_sentences_are_cut_at_pauses() {
        let vocabulary: HashMap<char, i64> = [('a', 1), (' ', 2), (',', 3), ('.', 4)].into();
        let a = |n: usize| vec![1; n];
        // Within the model's 510 tokens: one run, commas and all.
        let ids = [a(20), vec![3], a(30)].concat();
        assert_eq!(
            runs(&vocabulary, &ids),
            vec![std::ops::Range { start: 0, end: 51 }]
        );
        // Past them: cut after the last pause that fits.
        let long = [a(400), vec![2], a(300)].concat();
        assert_eq!(runs(&vocabulary, &long), [0..401, 401..701]);
        let no_pause = a(1100);
        assert_eq!(
            runs(&vocabulary, &no_pause),
            [
                0..MAX_TOKENS,
                MAX_TOKENS..2 * MAX_TOKENS,
                2 * MAX_TOKENS..1100
            ]
        );
        assert!(runs(&vocabulary, &[]).is_empty());
    }
}
