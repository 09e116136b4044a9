//! Whisper's tokenizer: GPT-2 byte-level BPE from the model's `tokenizer.json`, the special
//! tokens that steer decoding (start of transcript, language, task, timestamps), and the
//! timestamp tokens that follow the vocabulary (`<|0.00|>` … `<|30.00|>`, 20 ms apart).

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::{Error, Result};

/// Seconds per timestamp token step.
pub const TIMESTAMP_STEP: f32 = 0.02;

/// Whisper's 100 language codes in token order (large-v3 adds `yue` as the 100th).
pub const LANGUAGES: [&str; 100] = [
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it",
    "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur",
    "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn",
    "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si",
    "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo",
    "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln",
    "ha", "ba", "jw", "su", "yue",
];

/// Whisper's tokenizer and special token ids.
#[derive(Clone)]
pub struct WhisperTokenizer {
    inner: Tokenizer,
    pub(crate) path: PathBuf,
    pub end_of_text: u32,
    pub start_of_transcript: u32,
    pub translate: u32,
    pub transcribe: u32,
    pub start_of_lm: u32,
    pub start_of_previous: u32,
    pub no_speech: u32,
    pub no_timestamps: u32,
    /// `<|0.00|>`; timestamp `i` is `timestamp_begin + i`.
    pub timestamp_begin: u32,
    /// Language tokens present in the vocabulary, with their codes.
    languages: Vec<(&'static str, u32)>,
}

impl std::fmt::Debug for WhisperTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhisperTokenizer")
            .field("path", &self.path)
            .field("start_of_transcript", &self.start_of_transcript)
            .field("timestamp_begin", &self.timestamp_begin)
            .finish()
    }
}

impl WhisperTokenizer {
    /// Reads `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::Tokenizer {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_file() {
            return Err(Error::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no tokenizer.json"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        // Checked to be JSON first: `tokenizers` panics on a syntax error inside the `decoder`
        // entry where it returns an error for one elsewhere.
        serde_json::from_str::<serde_json::Value>(&text).map_err(|e| bad(e.to_string()))?;
        let inner: Tokenizer = text
            .parse()
            .map_err(|e: tokenizers::Error| bad(e.to_string()))?;
        let id = |token: &str| {
            inner
                .token_to_id(token)
                .ok_or_else(|| bad(format!("lacks Whisper's special token {token}")))
        };
        let no_speech = inner
            .token_to_id("<|nospeech|>")
            .or_else(|| inner.token_to_id("<|nocaptions|>"))
            .ok_or_else(|| bad("lacks <|nospeech|> / <|nocaptions|>".into()))?;
        let no_timestamps = id("<|notimestamps|>")?;
        let languages = LANGUAGES
            .iter()
            .filter_map(|&code| inner.token_to_id(&format!("<|{code}|>")).map(|t| (code, t)))
            .collect();
        Ok(Self {
            end_of_text: id("<|endoftext|>")?,
            start_of_transcript: id("<|startoftranscript|>")?,
            translate: id("<|translate|>")?,
            transcribe: id("<|transcribe|>")?,
            start_of_lm: id("<|startoflm|>")?,
            start_of_previous: id("<|startofprev|>")?,
            no_speech,
            no_timestamps,
            timestamp_begin: no_timestamps + 1,
            languages,
            inner,
            path: path.to_path_buf(),
        })
    }

    /// The language token of `code` (`en`, `de`, …).
    pub fn language(&self, code: &str) -> Result<u32> {
        self.languages
            .iter()
            .find(|(c, _)| *c == code)
            .map(|&(_, t)| t)
            .ok_or_else(|| {
                Error::Language(format!("language `{code}` is not available for this model"))
            })
    }

    /// Every language token with its code.
    pub fn languages(&self) -> &[(&'static str, u32)] {
        &self.languages
    }

    /// Whether `token` is a timestamp.
    pub fn is_timestamp(&self, token: u32) -> bool {
        token >= self.timestamp_begin
    }

    /// Seconds of a timestamp token (relative to its window).
    pub fn timestamp_seconds(&self, token: u32) -> f32 {
        (token - self.timestamp_begin) as f32 * TIMESTAMP_STEP
    }

    /// Text of ordinary tokens (special and timestamp tokens are skipped).
    pub fn decode(&self, tokens: &[u32]) -> Result<String> {
        let text: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| t < self.end_of_text)
            .collect();
        self.inner
            .decode(&text, true)
            .map_err(|e| Error::Tokenizer {
                path: self.path.clone(),
                reason: e.to_string(),
            })
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Tokenizer {
                path: self.path.clone(),
                reason: e.to_string(),
            })
    }

    /// Whether `other` has exactly this vocabulary and these special tokens (a draft model's
    /// tokens can then be verified as they are).
    pub fn same_vocabulary(&self, other: &WhisperTokenizer) -> bool {
        let specials = |t: &WhisperTokenizer| {
            [
                t.end_of_text,
                t.start_of_transcript,
                t.translate,
                t.transcribe,
                t.start_of_lm,
                t.start_of_previous,
                t.no_speech,
                t.no_timestamps,
                t.timestamp_begin,
            ]
        };
        specials(self) == specials(other)
            && self.languages == other.languages
            && self.inner.get_vocab(true) == other.inner.get_vocab(true)
    }

    /// A token's text as the vocabulary spells it (byte-level), if it has one.
    pub fn token_text(&self, token: u32) -> Option<String> {
        self.inner.id_to_token(token)
    }

    /// One past the highest token id the tokenizer knows, its added tokens included.
    pub fn ids_end(&self) -> usize {
        self.inner
            .get_vocab(true)
            .into_values()
            .max()
            .map_or(0, |last| last as usize + 1)
    }

    /// Whether the tokenizer lists the timestamp tokens (`<|0.00|>` …) itself, as newer
    /// `tokenizer.json` files do; older ones leave them implied after `<|notimestamps|>`.
    pub fn lists_timestamps(&self) -> bool {
        self.inner.token_to_id("<|0.00|>").is_some()
    }

    /// Fails unless the tokenizer fits a model of `vocab_size` logits: none of its ids lies past
    /// the model's vocabulary, and listed timestamp tokens end where the vocabulary does.
    pub fn check_fits_vocabulary(&self, vocab_size: usize) -> Result<()> {
        let ids_end = self.ids_end();
        let reason = if ids_end > vocab_size {
            format!(
                "it has token ids up to {}, past the model's vocabulary of {vocab_size}",
                ids_end - 1
            )
        } else if self.lists_timestamps() && ids_end != vocab_size {
            format!(
                "its timestamp tokens end at id {}, the model's vocabulary at {}",
                ids_end - 1,
                vocab_size - 1
            )
        } else {
            return Ok(());
        };
        Err(self.mismatch(reason))
    }

    /// Fails unless the special tokens a model's configuration `config` (the JSON of
    /// `config_path`) names are this tokenizer's: Hugging Face's `eos_token_id`,
    /// `decoder_start_token_id` and `no_timestamps_token_id`, and the language tokens of
    /// CTranslate2's `lang_ids` and Hugging Face's `lang_to_id`, which must lie between
    /// `<|startoftranscript|>` and `<|translate|>`. Entries that are absent or not numbers are
    /// not checked.
    pub fn check_configured_tokens(
        &self,
        config_path: &Path,
        config: &serde_json::Value,
    ) -> Result<()> {
        let named = [
            ("eos_token_id", "<|endoftext|>", self.end_of_text),
            (
                "decoder_start_token_id",
                "<|startoftranscript|>",
                self.start_of_transcript,
            ),
            (
                "no_timestamps_token_id",
                "<|notimestamps|>",
                self.no_timestamps,
            ),
        ];
        for (key, token, id) in named {
            let configured = config.get(key).and_then(serde_json::Value::as_u64);
            if let Some(configured) = configured.filter(|&c| c != u64::from(id)) {
                return Err(self.mismatch(format!(
                    "{} names {token} {configured} (`{key}`), the tokenizer has it at {id}",
                    config_path.display()
                )));
            }
        }
        let listed = config.get("lang_ids").and_then(serde_json::Value::as_array);
        let mapped = config
            .get("lang_to_id")
            .and_then(serde_json::Value::as_object);
        let languages = listed
            .into_iter()
            .flatten()
            .chain(mapped.into_iter().flat_map(|map| map.values()))
            .filter_map(serde_json::Value::as_u64);
        let block = u64::from(self.start_of_transcript) + 1..u64::from(self.translate);
        for language in languages {
            if !block.contains(&language) {
                return Err(self.mismatch(format!(
                    "{} names language token {language}, and the tokenizer's language tokens \
                     are {block:?}",
                    config_path.display()
                )));
            }
        }
        Ok(())
    }

    /// A [`Error::TokenizerMismatch`] of this tokenizer.
    fn mismatch(&self, reason: String) -> Error {
        Error::TokenizerMismatch {
            path: self.path.clone(),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `cargo xtask fuzz tokenizer-json`: `tokenizers` panicked on a syntax error
    /// inside the `decoder` entry instead of returning an error.
    #[test]
    fn a_tokenizer_json_broken_inside_its_decoder_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        for broken in [
            r#"{"decoder":{"type","ByteLevel"}}"#,
            r#"{"decoder":{"type":"ByteLevel","tr\ud800s":true}}"#,
        ] {
            std::fs::write(&path, broken).unwrap();
            let err = WhisperTokenizer::from_file(&path).unwrap_err();
            assert!(matches!(err, Error::Tokenizer { .. }), "{err}");
        }
    }
}
