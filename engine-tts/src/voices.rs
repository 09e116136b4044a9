//! Voices by name, as the command line and the server take them: `kokoro:af_heart` (any of
//! Kokoro's 54), `piper:joe` (a Piper voice folder `piper-*-joe-*` in the models folder),
//! `espeak` (espeak-ng's formant voice), `fixed` (silence after a fixed latency, for
//! measurements), or `auto`: Kokoro's `af_heart` when its files and ONNX Runtime are in the
//! models folder, espeak-ng otherwise.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use spec_voice::{FixedLatencySynthesizer, SentenceSynthesizer, Synthesis};
use tracing::info;

use crate::espeak::{EspeakSettings, EspeakSynthesizer};
use crate::kokoro::{Kokoro, KokoroSettings, KokoroSynthesizer};
use crate::onnx::{self, Result, VoiceError};
use crate::piper::{PiperSettings, PiperSynthesizer};

/// Kokoro's folder in the models folder.
const KOKORO_DIR: &str = "kokoro-82m";
/// The voice `auto` and a bare `kokoro` pick.
pub const DEFAULT_KOKORO_VOICE: &str = "af_heart";
/// Piper voices' folders start so.
const PIPER_PREFIX: &str = "piper-";

/// A voice, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VoiceChoice {
    /// Kokoro's best voice when it is present, espeak-ng otherwise.
    Auto,
    /// A Kokoro voice (`af_heart`, `bm_george`, …).
    Kokoro(String),
    /// A Piper voice: its short name (`joe`) or its folder without `piper-` (`en_US-joe-medium`).
    Piper(String),
    Espeak,
    Fixed,
}

impl FromStr for VoiceChoice {
    type Err = VoiceError;

    fn from_str(name: &str) -> Result<Self> {
        let (family, voice) = match name.split_once(':') {
            Some((family, voice)) => (family, Some(voice)),
            None => (name, None),
        };
        Ok(match (family, voice) {
            ("auto", None) => Self::Auto,
            ("kokoro", None) => Self::Kokoro(DEFAULT_KOKORO_VOICE.into()),
            ("kokoro", Some(voice)) if !voice.is_empty() => Self::Kokoro(voice.into()),
            ("piper", Some(voice)) if !voice.is_empty() => Self::Piper(voice.into()),
            ("espeak", None) => Self::Espeak,
            ("fixed", None) => Self::Fixed,
            _ => {
                return Err(VoiceError::Input(format!(
                    "unknown voice `{name}`: auto, kokoro:NAME, piper:NAME, espeak or fixed \
                     (`--voice list` lists the voices here)"
                )))
            }
        })
    }
}

impl fmt::Display for VoiceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Kokoro(voice) => write!(f, "kokoro:{voice}"),
            Self::Piper(voice) => write!(f, "piper:{voice}"),
            Self::Espeak => f.write_str("espeak"),
            Self::Fixed => f.write_str("fixed"),
        }
    }
}

/// Whether Kokoro can speak from `models`: its model and ONNX Runtime are there.
fn kokoro_present(models: &Path) -> bool {
    models.join(KOKORO_DIR).join("model.onnx").is_file() && onnx::library_path(models).is_file()
}

/// The Piper voice folders in `models`.
fn piper_folders(models: &Path) -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = std::fs::read_dir(models)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?;
            (name.starts_with(PIPER_PREFIX) && path.join("model.onnx").is_file()).then_some(path)
        })
        .collect();
    folders.sort();
    folders
}

/// The voices that can speak from `models`, by the names [`VoiceChoice`] takes.
pub fn available(models: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    if kokoro_present(models) {
        let dir = models.join(KOKORO_DIR).join("voices");
        names.extend(
            Kokoro::voice_names(&dir)?
                .into_iter()
                .map(|voice| format!("kokoro:{voice}")),
        );
    }
    for folder in piper_folders(models) {
        let name = folder.file_name().expect("a folder").to_string_lossy();
        names.push(format!("piper:{}", &name[PIPER_PREFIX.len()..]));
    }
    names.extend(["espeak".to_string(), "fixed".to_string()]);
    Ok(names)
}

/// The Piper folder (its name in `models`) that `voice` names.
fn piper_folder(models: &Path, voice: &str) -> Result<String> {
    let folders = piper_folders(models);
    let names: Vec<String> = folders
        .iter()
        .map(|f| {
            f.file_name()
                .expect("a folder")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let exact = format!("{PIPER_PREFIX}{voice}");
    let short = |name: &&String| name.split('-').any(|part| part == voice);
    names
        .iter()
        .find(|name| **name == exact)
        .or_else(|| names.iter().find(short))
        .cloned()
        .ok_or_else(|| VoiceError::UnknownVoice {
            name: format!("piper:{voice}"),
            available: names.join(", "),
        })
}

/// A synthesizer that several sessions share, one sentence at a time.
pub struct Shared(Arc<Mutex<Box<dyn SentenceSynthesizer + Send>>>);

impl Clone for Shared {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl SentenceSynthesizer for Shared {
    fn synthesize(&mut self, sentence: &str) -> spec_voice::Result<Synthesis> {
        // A panic while another session spoke leaves the synthesizer as usable as before.
        let mut voice = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        voice.synthesize(sentence)
    }

    fn synthesize_at(&mut self, sentence: &str, speed: f32) -> spec_voice::Result<Synthesis> {
        let mut voice = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        voice.synthesize_at(sentence, speed)
    }
}

impl VoiceChoice {
    /// The voice this choice speaks with in `models`, by the name [`available`] lists it
    /// under: `auto` becomes Kokoro's `af_heart` or `espeak`, a Piper short name its folder's
    /// name; the others are themselves.
    pub fn resolve(&self, models: &Path) -> Result<VoiceChoice> {
        Ok(match self {
            Self::Auto if kokoro_present(models) => Self::Kokoro(DEFAULT_KOKORO_VOICE.into()),
            Self::Auto => Self::Espeak,
            Self::Piper(voice) => {
                let folder = piper_folder(models, voice)?;
                Self::Piper(folder[PIPER_PREFIX.len()..].to_string())
            }
            other => other.clone(),
        })
    }
}

/// Opens `choice` from the models folder `models`; `auto` says which voice it took in the log.
pub fn open(choice: &VoiceChoice, models: &Path) -> Result<Box<dyn SentenceSynthesizer + Send>> {
    Ok(match choice {
        VoiceChoice::Auto => {
            let voice = choice.resolve(models)?;
            match voice {
                VoiceChoice::Espeak => info!(
                    "speaking with espeak-ng: Kokoro's files or ONNX Runtime are not in {}",
                    models.display()
                ),
                _ => info!("speaking with {voice}"),
            }
            open(&voice, models)?
        }
        VoiceChoice::Kokoro(voice) => Box::new(KokoroSynthesizer::load(
            models,
            &KokoroSettings {
                voice: voice.clone(),
                ..KokoroSettings::default()
            },
        )?),
        VoiceChoice::Piper(voice) => Box::new(PiperSynthesizer::load(
            models,
            &PiperSettings {
                voice: piper_folder(models, voice)?,
                ..PiperSettings::default()
            },
        )?),
        VoiceChoice::Espeak => Box::new(EspeakSynthesizer::new(EspeakSettings::default())?),
        VoiceChoice::Fixed => Box::new(FixedLatencySynthesizer::default()),
    })
}

/// [`open`], as one synthesizer every clone of which speaks with it (a server's sessions).
pub fn open_shared(choice: &VoiceChoice, models: &Path) -> Result<Shared> {
    Ok(Shared(Arc::new(Mutex::new(open(choice, models)?))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voice_names_parse_and_print_back() {
        for name in ["auto", "kokoro:bm_george", "piper:joe", "espeak", "fixed"] {
            assert_eq!(name.parse::<VoiceChoice>().unwrap().to_string(), name);
        }
        assert_eq!(
            "kokoro".parse::<VoiceChoice>().unwrap(),
            VoiceChoice::Kokoro(DEFAULT_KOKORO_VOICE.into())
        );
        for bad in ["", "kokoro:", "piper", "espeak:loud", "festival"] {
            assert!(matches!(
                bad.parse::<VoiceChoice>(),
                Err(VoiceError::Input(_))
            ));
        }
    }

    #[test]
    fn piper_voices_are_found_by_short_or_folder_name() {
        let models = tempfile::tempdir().unwrap();
        for folder in ["piper-en_US-joe-medium", "piper-en_GB-alba-medium", "other"] {
            let dir = models.path().join(folder);
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("model.onnx"), b"").unwrap();
        }
        assert_eq!(
            piper_folder(models.path(), "joe").unwrap(),
            "piper-en_US-joe-medium"
        );
        assert_eq!(
            piper_folder(models.path(), "en_GB-alba-medium").unwrap(),
            "piper-en_GB-alba-medium"
        );
        match piper_folder(models.path(), "amy") {
            Err(VoiceError::UnknownVoice { available, .. }) => {
                assert!(available.contains("piper-en_US-joe-medium"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            VoiceChoice::Piper("joe".into())
                .resolve(models.path())
                .unwrap(),
            VoiceChoice::Piper("en_US-joe-medium".into())
        );
        // No Kokoro, no runtime: `auto` is espeak-ng, and the available voices are the two
        // Piper ones and the rest.
        assert_eq!(
            VoiceChoice::Auto.resolve(models.path()).unwrap(),
            VoiceChoice::Espeak
        );
        assert_eq!(
            available(models.path()).unwrap(),
            [
                "piper:en_GB-alba-medium",
                "piper:en_US-joe-medium",
                "espeak",
                "fixed"
            ]
        );
    }
}
