//! Piper (rhasspy; VITS trained on one speaker), run by ONNX Runtime from a voice's ONNX export
//! and its `model.onnx.json`: espeak-ng's IPA phonemes in, audio at the voice's rate out
//! (22050 Hz for `en_US-joe-medium`).
//!
//! What differs from the reference (`piper-phonemize`): the phonemes come from the espeak-ng
//! program (`--ipa`) rather than the library, clause by clause with the clause's punctuation put
//! back after it, as piper-phonemize keeps it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ort::session::Session;
use ort::value::Tensor;
use serde_json::Value;
use spec_voice::{AudioChunk, SentenceSynthesizer, Synthesis};
use tracing::{debug, warn};

use crate::espeak::{run_program, EspeakError};
use crate::onnx::{self, Result, VoiceError};

/// The symbols around and between a sentence's phonemes (Piper's `^`, `$` and `_`).
const BEGIN: char = '^';
const END: char = '$';
const PAD: char = '_';

/// Clause punctuation, kept after the clause's phonemes.
const CLAUSE_ENDS: &str = ",.;:!?";

/// A Piper voice: its ONNX session and what its `model.onnx.json` says.
#[derive(Debug)]
pub struct Piper {
    session: Session,
    phoneme_ids: HashMap<char, Vec<i64>>,
    sample_rate: u32,
    espeak_voice: String,
    /// `[noise, length, noise_w]`: VITS's sampling noise, its pace (larger is slower) and the
    /// duration predictor's noise.
    scales: [f32; 3],
    espeak: PathBuf,
}

impl Piper {
    /// Loads `model.onnx` and `model.onnx.json` from `dir` on `threads` threads; `espeak` is
    /// the espeak-ng program.
    pub fn load(
        dir: &Path,
        environment: &ort::environment::Environment,
        threads: usize,
        espeak: &Path,
    ) -> Result<Self> {
        let config_path = dir.join("model.onnx.json");
        let bad = |reason: String| VoiceError::File {
            path: config_path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&config_path).map_err(|e| bad(e.to_string()))?;
        let config: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let sample_rate = config["audio"]["sample_rate"]
            .as_u64()
            .and_then(|r| u32::try_from(r).ok())
            .filter(|&r| r > 0)
            .ok_or_else(|| bad("no audio.sample_rate".into()))?;
        let espeak_voice = config["espeak"]["voice"]
            .as_str()
            .ok_or_else(|| bad("no espeak.voice".into()))?
            .to_string();
        let inference = &config["inference"];
        let scale = |name: &str, default: f64| inference[name].as_f64().unwrap_or(default) as f32;
        let scales = [
            scale("noise_scale", 0.667),
            scale("length_scale", 1.0),
            scale("noise_w", 0.8),
        ];
        let map = config["phoneme_id_map"]
            .as_object()
            .ok_or_else(|| bad("no phoneme_id_map".into()))?;
        let mut phoneme_ids = HashMap::new();
        for (symbol, ids) in map {
            let mut chars = symbol.chars();
            let ids: Option<Vec<i64>> = ids
                .as_array()
                .map(|ids| ids.iter().map(Value::as_i64).collect())
                .unwrap_or_default();
            match (chars.next(), chars.next(), ids) {
                (Some(c), None, Some(ids)) => phoneme_ids.insert(c, ids),
                _ => return Err(bad(format!("phoneme_id_map entry {symbol:?} is malformed"))),
            };
        }
        if let Some(missing) = [BEGIN, END, PAD]
            .iter()
            .find(|c| !phoneme_ids.contains_key(c))
        {
            return Err(bad(format!("phoneme_id_map lacks {missing:?}")));
        }
        let session = onnx::session(environment, &dir.join("model.onnx"), threads)?;
        Ok(Self {
            session,
            phoneme_ids,
            sample_rate,
            espeak_voice,
            scales,
            espeak: espeak.to_path_buf(),
        })
    }

    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// espeak-ng's phonemes of `text` as spoken ([`text::normalize`](crate::text::normalize)),
    /// clause by clause, each clause's punctuation after it.
    pub fn phonemes(&self, text: &str) -> Result<String> {
        let clauses = clauses(&crate::text::normalize(text));
        if clauses.is_empty() {
            return Ok(String::new());
        }
        let input: String = clauses
            .iter()
            .map(|(words, _)| format!("{words}\n"))
            .collect();
        let args = ["-q", "--ipa", "-v", &self.espeak_voice].map(String::from);
        let output = run_program(&self.espeak, &args, &input)?;
        let text = String::from_utf8(output)
            .map_err(|_| EspeakError::Output("phonemes that are not UTF-8".into()))?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.len() != clauses.len() {
            return Err(EspeakError::Output(format!(
                "{} lines of phonemes for {} clauses",
                lines.len(),
                clauses.len()
            ))
            .into());
        }
        let mut out = String::new();
        for (line, (_, end)) in lines.iter().zip(&clauses) {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(line.trim());
            out.extend(end);
        }
        Ok(out)
    }

    /// Piper's ids of `phonemes`: `^`, then each phoneme followed by `_`, then `$`; a symbol
    /// the voice lacks is dropped with a warning.
    pub fn phoneme_ids(&self, phonemes: &str) -> Vec<i64> {
        let mut ids = self.phoneme_ids[&BEGIN].clone();
        ids.extend(&self.phoneme_ids[&PAD]);
        for c in phonemes.chars() {
            match self.phoneme_ids.get(&c) {
                Some(symbol) => {
                    ids.extend(symbol);
                    ids.extend(&self.phoneme_ids[&PAD]);
                }
                None => warn!("Piper has no phoneme {c:?}; it is left out"),
            }
        }
        ids.extend(&self.phoneme_ids[&END]);
        ids
    }

    /// Audio for phoneme ids (of [`Piper::phoneme_ids`]) at `length_scale` times the voice's
    /// pace (1 is its own).
    pub fn speak(&mut self, ids: &[i64], length_scale: f32) -> Result<Vec<f32>> {
        let failed = onnx::run_failed("Piper");
        let [noise, length, noise_w] = self.scales;
        let input = Tensor::from_array(([1, ids.len()], ids.to_vec())).map_err(failed)?;
        let lengths = Tensor::from_array(([1], vec![ids.len() as i64])).map_err(failed)?;
        let scales = Tensor::from_array(([3], vec![noise, length * length_scale, noise_w]))
            .map_err(failed)?;
        let outputs = self
            .session
            .run(ort::inputs!["input" => input, "input_lengths" => lengths, "scales" => scales])
            .map_err(failed)?;
        onnx::f32_output(&outputs, "Piper", "output")
    }
}

/// `text` as clauses: each clause's words (letters, digits, apostrophes and hyphens: what
/// espeak-ng reads) and the punctuation that ends it, if any.
fn clauses(text: &str) -> Vec<(String, Option<char>)> {
    let mut clauses = Vec::new();
    let mut words = String::new();
    for c in text.chars() {
        if CLAUSE_ENDS.contains(c) {
            if !words.trim().is_empty() {
                clauses.push((words.trim().to_string(), Some(c)));
            }
            words.clear();
        } else if c.is_alphanumeric() || matches!(c, '\'' | '’' | '-') {
            words.push(c);
        } else {
            // Symbols and emoji are not read out (espeak-ng would name them).
            words.push(' ');
        }
    }
    if !words.trim().is_empty() {
        clauses.push((words.trim().to_string(), None));
    }
    clauses
}

/// How a [`PiperSynthesizer`] speaks.
#[derive(Clone, Debug, PartialEq)]
pub struct PiperSettings {
    /// The voice's folder name in the models folder (`piper-en_US-joe-medium` by default).
    pub voice: String,
    /// Pace, 0.5 to 2 (1 by default; 2 speaks twice as fast).
    pub speed: f32,
    /// ONNX Runtime's threads.
    pub threads: usize,
    /// The espeak-ng program.
    pub espeak: PathBuf,
}

impl Default for PiperSettings {
    fn default() -> Self {
        Self {
            voice: "piper-en_US-joe-medium".into(),
            speed: 1.0,
            threads: 2,
            espeak: PathBuf::from("espeak-ng"),
        }
    }
}

/// Piper as the pipeline's sentence synthesizer.
#[derive(Debug)]
pub struct PiperSynthesizer {
    model: Piper,
    speed: f32,
}

impl PiperSynthesizer {
    /// The voice from the models folder `models` (ONNX Runtime from
    /// [`onnx::library_path`]).
    pub fn load(models: &Path, settings: &PiperSettings) -> Result<Self> {
        onnx::check_speed(settings.speed)?;
        let environment = onnx::environment(&onnx::library_path(models))?;
        let dir = models.join(&settings.voice);
        let model = Piper::load(&dir, environment, settings.threads, &settings.espeak)?;
        Ok(Self {
            model,
            speed: settings.speed,
        })
    }

    /// The phonemes it would speak for `text`.
    pub fn phonemes(&self, text: &str) -> Result<String> {
        self.model.phonemes(text)
    }
}

impl SentenceSynthesizer for PiperSynthesizer {
    fn synthesize(&mut self, sentence: &str) -> spec_voice::Result<Synthesis> {
        self.synthesize_at(sentence, 1.0)
    }

    /// At `speed` (0.5 to 2) times the settings' pace.
    fn synthesize_at(&mut self, sentence: &str, speed: f32) -> spec_voice::Result<Synthesis> {
        onnx::check_speed(speed)?;
        let speed = self.speed * speed;
        let sentence = spec_voice::sentence_to_speak(sentence)?;
        let started = Instant::now();
        let phonemes = self.model.phonemes(sentence)?;
        let chunks = match phonemes.is_empty() {
            true => Vec::new(),
            false => {
                let ids = self.model.phoneme_ids(&phonemes);
                vec![AudioChunk {
                    samples: self.model.speak(&ids, 1.0 / speed)?,
                    sample_rate: self.model.sample_rate(),
                }]
            }
        };
        let first_audio_after = started.elapsed();
        debug!("Piper: {sentence:?} as {phonemes:?} in {first_audio_after:?}");
        Ok(Synthesis {
            sentence: sentence.to_string(),
            chunks,
            first_audio_after,
            compute: first_audio_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_splits_into_clauses_with_their_punctuation() {
        assert_eq!(
            clauses("Hello there, how are you?\nFine"),
            [
                ("Hello there".to_string(), Some(',')),
                ("how are you".to_string(), Some('?')),
                ("Fine".to_string(), None),
            ]
        );
        assert!(clauses(" ,.. ").is_empty());
        assert!(clauses("🙂 ☃").is_empty());
        assert_eq!(clauses("It's 5°C!"), [("It's 5 C".to_string(), Some('!'))]);
    }
}
