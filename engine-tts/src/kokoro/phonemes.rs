//! Text to the phonemes Kokoro was trained on: misaki's American English set (its lexicons,
//! `lexicon/us_gold.json` then `us_silver.json`, shipped with the model), with espeak-ng's IPA
//! for the words they lack, mapped onto the same set (diphthongs as one letter — `A` for /eɪ/,
//! `I` /aɪ/, `O` /oʊ/, `W` /aʊ/, `Y` /ɔɪ/ — affricates as `ʤ` `ʧ`, r-coloured vowels spelled
//! out, no length marks). [`PhonemeSource::Espeak`] takes every word from espeak-ng instead,
//! clause by clause, through the same mapping (to measure what the lexicons bring).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::espeak::{run_program, EspeakError};
use crate::onnx::{Result, VoiceError};

/// Punctuation Kokoro's vocabulary has, spoken as pauses and intonation.
const PUNCTUATION: &str = ";:,.!?—…\"()“”";

/// Where Kokoro's phonemes come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PhonemeSource {
    /// misaki's lexicons, espeak-ng for the words they lack (the default).
    #[default]
    Lexicon,
    /// espeak-ng alone: each clause read by espeak-ng (its words in context), mapped onto
    /// misaki's set as the lexicons' fallback is.
    Espeak,
}

/// Words to misaki phonemes, and espeak-ng for the rest.
#[derive(Debug)]
pub struct Phonemizer {
    source: PhonemeSource,
    words: HashMap<String, String>,
    espeak: PathBuf,
}

/// Phonemes to join into a sentence: a word's or a clause's, or a punctuation mark.
enum Spoken {
    Words(String),
    Punctuation(char),
}

impl Phonemizer {
    /// The lexicons of `lexicon_dir` (`us_gold.json`, then `us_silver.json` for words the first
    /// lacks), espeak-ng (`program`) for the rest.
    pub fn load(lexicon_dir: &Path, program: &Path) -> Result<Self> {
        let mut words = HashMap::new();
        for name in ["us_silver.json", "us_gold.json"] {
            words.extend(read_lexicon(&lexicon_dir.join(name))?);
        }
        Ok(Self {
            source: PhonemeSource::Lexicon,
            words,
            espeak: program.to_path_buf(),
        })
    }

    /// Every word from espeak-ng (`program`), no lexicon ([`PhonemeSource::Espeak`]).
    pub fn espeak_only(program: &Path) -> Self {
        Self {
            source: PhonemeSource::Espeak,
            words: HashMap::new(),
            espeak: program.to_path_buf(),
        }
    }

    /// The phonemes of `text` as spoken ([`text::normalize`](crate::text::normalize): numbers,
    /// times, money and units in words): words separated by spaces, punctuation kept;
    /// characters that are neither are dropped.
    pub fn phonemes(&self, text: &str) -> Result<String> {
        let text = crate::text::normalize(text);
        let pieces = split_words(&text);
        let spoken = match self.source {
            PhonemeSource::Lexicon => self.lexicon_words(&pieces)?,
            PhonemeSource::Espeak => self.espeak_clauses(&pieces)?,
        };
        let mut out = String::new();
        for piece in spoken {
            match piece {
                Spoken::Words(phonemes) => {
                    if !out.is_empty() && !out.ends_with(['(', '“']) {
                        out.push(' ');
                    }
                    out.push_str(&phonemes);
                }
                Spoken::Punctuation(mark) => {
                    if matches!(mark, '(' | '“') && !out.is_empty() {
                        out.push(' ');
                    }
                    out.push(mark);
                }
            }
        }
        Ok(out)
    }

    /// Each word from the lexicons, in context (the articles' weak forms), or from espeak-ng.
    fn lexicon_words(&self, pieces: &[Piece<'_>]) -> Result<Vec<Spoken>> {
        let unknown: Vec<&str> = pieces
            .iter()
            .filter_map(|piece| match piece {
                Piece::Word(word) if self.lookup(word).is_none() => Some(*word),
                _ => None,
            })
            .collect();
        let mut spoken = self
            .espeak_lines(&unknown)?
            .into_iter()
            .map(|line| from_espeak(&line));
        Ok(pieces
            .iter()
            .enumerate()
            .map(|(i, piece)| match piece {
                Piece::Word(word) => {
                    let next_word = pieces[i + 1..].iter().find_map(|p| match p {
                        Piece::Word(w) => Some(*w),
                        Piece::Punctuation(_) => None,
                    });
                    Spoken::Words(match self.lookup(word) {
                        Some(phonemes) => in_context(word, phonemes, next_word),
                        None => spoken.next().unwrap_or_default(),
                    })
                }
                Piece::Punctuation(mark) => Spoken::Punctuation(*mark),
            })
            .collect())
    }

    /// Each clause (the words between two punctuation marks) from espeak-ng, in one run for
    /// all.
    fn espeak_clauses(&self, pieces: &[Piece<'_>]) -> Result<Vec<Spoken>> {
        // The clauses' text first, then their phonemes in its place.
        let mut groups: Vec<Spoken> = Vec::new();
        for piece in pieces {
            match (piece, groups.last_mut()) {
                (Piece::Word(word), Some(Spoken::Words(clause))) => {
                    clause.push(' ');
                    clause.push_str(word);
                }
                (Piece::Word(word), _) => groups.push(Spoken::Words((*word).to_string())),
                (Piece::Punctuation(mark), _) => groups.push(Spoken::Punctuation(*mark)),
            }
        }
        let clauses: Vec<&str> = groups
            .iter()
            .filter_map(|group| match group {
                Spoken::Words(clause) => Some(clause.as_str()),
                Spoken::Punctuation(_) => None,
            })
            .collect();
        let mut spoken = self.espeak_lines(&clauses)?.into_iter().map(|line| {
            line.split_whitespace()
                .map(from_espeak)
                .collect::<Vec<_>>()
                .join(" ")
        });
        Ok(groups
            .into_iter()
            .map(|group| match group {
                Spoken::Words(_) => Spoken::Words(spoken.next().unwrap_or_default()),
                mark => mark,
            })
            .collect())
    }

    /// A word's phonemes from the lexicons: as written, in lower case, or capitalized.
    fn lookup(&self, word: &str) -> Option<&str> {
        let lower = word.to_lowercase();
        let mut capitalized = lower.clone();
        if let Some(first) = capitalized.get_mut(0..1) {
            first.make_ascii_uppercase();
        }
        let found = [word, lower.as_str(), capitalized.as_str()]
            .into_iter()
            .find_map(|w| self.words.get(w));
        found.map(String::as_str)
    }

    /// espeak-ng's phonemes of `lines` (words or clauses; one call for all), a line of
    /// `--ipa --sep=_` output for each.
    fn espeak_lines(&self, lines: &[&str]) -> Result<Vec<String>> {
        if lines.is_empty() {
            return Ok(Vec::new());
        }
        let args = ["-q", "--ipa", "--sep=_", "-v", "en-us"].map(String::from);
        let output = run_program(&self.espeak, &args, &(lines.join("\n") + "\n"))?;
        let text = String::from_utf8(output).map_err(|_| {
            VoiceError::Phonemes(EspeakError::Output(
                "espeak-ng wrote phonemes that are not UTF-8".into(),
            ))
        })?;
        let spoken: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if spoken.len() != lines.len() {
            return Err(VoiceError::Phonemes(EspeakError::Output(format!(
                "espeak-ng gave {} lines of phonemes for {} lines of text",
                spoken.len(),
                lines.len()
            ))));
        }
        Ok(spoken.into_iter().map(String::from).collect())
    }
}

/// A piece of text: a word (letters, digits, inner apostrophes and hyphens) or a punctuation
/// mark the vocabulary has.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Piece<'a> {
    Word(&'a str),
    Punctuation(char),
}

fn split_words(text: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut start = None;
    let in_word = |c: char| c.is_alphanumeric() || matches!(c, '\'' | '’' | '-');
    for (i, c) in text.char_indices() {
        if in_word(c) {
            start.get_or_insert(i);
            continue;
        }
        if let Some(s) = start.take() {
            push_word(&mut pieces, &text[s..i]);
        }
        if PUNCTUATION.contains(c) {
            pieces.push(Piece::Punctuation(c));
        }
    }
    if let Some(s) = start {
        push_word(&mut pieces, &text[s..]);
    }
    pieces
}

/// Adds `word` without the apostrophes and hyphens around it (quotes, dashes).
fn push_word<'a>(pieces: &mut Vec<Piece<'a>>, word: &'a str) {
    let word = word.trim_matches(|c| matches!(c, '\'' | '’' | '-'));
    if !word.is_empty() {
        pieces.push(Piece::Word(word));
    }
}

/// The lexicon's phonemes of `word` as spoken before `next`: the articles' weak forms.
fn in_context(word: &str, phonemes: &str, next: Option<&str>) -> String {
    let before_vowel = next
        .and_then(|w| w.chars().next())
        .is_some_and(|c| "aeiouAEIOU".contains(c));
    match word.to_lowercase().as_str() {
        "the" if before_vowel => "ði".into(),
        "the" => "ðə".into(),
        "a" => "ə".into(),
        _ => phonemes.into(),
    }
}

/// One lexicon: a word's phonemes, or phonemes by part of speech (the `DEFAULT` one taken).
fn read_lexicon(path: &Path) -> Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).map_err(|e| VoiceError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let bad = |reason: &str| VoiceError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let Value::Object(entries) = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?
    else {
        return Err(bad("not a lexicon (a JSON object of words)"));
    };
    Ok(entries
        .into_iter()
        .filter_map(|(word, value)| {
            let phonemes = match value {
                Value::String(p) => p,
                Value::Object(by_tag) => by_tag.get("DEFAULT")?.as_str()?.to_string(),
                _ => return None,
            };
            Some((word, phonemes))
        })
        .collect())
}

/// One word of espeak-ng's `--ipa --sep=_` output (phonemes separated by `_`, a stress mark
/// before its vowel) in misaki's set.
fn from_espeak(word: &str) -> String {
    word.split(['_', ' '])
        .map(|phoneme| {
            let vowel = phoneme.trim_start_matches(['ˈ', 'ˌ']);
            let stress = &phoneme[..phoneme.len() - vowel.len()];
            format!("{stress}{}", misaki_phoneme(vowel))
        })
        .collect()
}

/// An espeak-ng (American) phoneme in misaki's set.
fn misaki_phoneme(phoneme: &str) -> String {
    let mapped = match phoneme {
        "eɪ" => "A",
        "aɪ" => "I",
        "oʊ" | "əʊ" => "O",
        "aʊ" => "W",
        "ɔɪ" => "Y",
        "aɪɚ" | "aɪə" => "Iəɹ",
        "aʊɚ" | "aʊə" => "Wəɹ",
        "dʒ" => "ʤ",
        "tʃ" => "ʧ",
        "ɜː" | "ɜːɹ" | "ɝ" => "ɜɹ",
        "ɚ" => "əɹ",
        "ɔːɹ" | "oːɹ" | "oɹ" => "ɔɹ",
        // "story": espeak-ng writes the vowel apart from its ɹ.
        "oː" => "ɔ",
        "ɐ" => "ə",
        "əl" | "l̩" => "ᵊl",
        "n̩" => "ᵊn",
        "r" => "ɹ",
        "x" | "ç" => "k",
        "ɬ" => "l",
        other => {
            return other
                .chars()
                .filter(|&c| c != 'ː' && c != 'ʲ')
                .map(|c| match c {
                    'A' | 'I' | 'O' | 'Q' | 'S' | 'T' | 'W' | 'Y' => c,
                    c => c.to_ascii_lowercase(),
                })
                .collect()
        }
    };
    mapped.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn espeak_phonemes_map_onto_misakis_set() {
        assert_eq!(from_espeak("h_ə_l_ˈoʊ"), "həlˈO");
        assert_eq!(from_espeak("dʒ_ˈʌ_dʒ"), "ʤˈʌʤ");
        assert_eq!(from_espeak("w_ˈɜː_l_d"), "wˈɜɹld");
        assert_eq!(from_espeak("f_ˈɔːɹ_ɾ_i"), "fˈɔɹɾi");
        assert_eq!(from_espeak("s_t_ˈoː_ɹ_i"), "stˈɔɹi");
        assert_eq!(from_espeak("b_ˈʌ_ɾ_ɚ"), "bˈʌɾəɹ");
        assert_eq!(from_espeak("f_ˈaɪɚ"), "fˈIəɹ");
        assert_eq!(from_espeak("l_ˈɑː_x"), "lˈɑk");
        assert_eq!(from_espeak("Z_ˈɪ_k"), "zˈɪk");
    }

    #[test]
    #[ignore = "needs espeak-ng (apt-get install espeak-ng) and the models folder's kokoro-82m/vocab.json"]
    fn espeak_alone_gives_phonemes_in_kokoros_vocabulary() {
        let models = spec_models::models_dir().expect("models folder");
        let vocabulary =
            super::super::read_vocabulary(&models.join("kokoro-82m").join("vocab.json"))
                .expect("Kokoro's vocabulary (run ../shared/models/fetch)");
        let phonemizer = Phonemizer::espeak_only(Path::new("espeak-ng"));
        for text in [
            "Hello there, how are you?",
            "Boil the pasta for nine minutes; then drain it.",
            "Canberra, Thursday — my dentist's appointment!",
            "The judge's church bought a quarter of our fire-wood.",
        ] {
            let phonemes = phonemizer.phonemes(text).unwrap();
            assert!(!phonemes.is_empty(), "{text}");
            let outside: String = phonemes
                .chars()
                .filter(|c| !vocabulary.contains_key(c))
                .collect();
            assert!(outside.is_empty(), "{text} → {phonemes}: {outside:?}");
        }
        // Each clause in its place, the punctuation kept.
        let phonemes = phonemizer.phonemes("Hello there, how are you?").unwrap();
        assert!(phonemes.starts_with("həlˈO ðˈɛɹ,"), "{phonemes}");
        assert!(phonemes.ends_with('?'), "{phonemes}");
    }

    #[test]
    fn text_splits_into_words_and_the_vocabularys_punctuation() {
        assert_eq!(
            split_words("Well, it's 3 o'clock — isn't it? 🙂"),
            [
                Piece::Word("Well"),
                Piece::Punctuation(','),
                Piece::Word("it's"),
                Piece::Word("3"),
                Piece::Word("o'clock"),
                Piece::Punctuation('—'),
                Piece::Word("isn't"),
                Piece::Word("it"),
                Piece::Punctuation('?'),
            ]
        );
        assert_eq!(split_words(" 'quoted' -- "), [Piece::Word("quoted")]);
    }

    #[test]
    fn articles_take_their_weak_forms() {
        assert_eq!(in_context("the", "ði", Some("cat")), "ðə");
        assert_eq!(in_context("The", "ði", Some("apple")), "ði");
        assert_eq!(in_context("a", "A", Some("cat")), "ə");
        assert_eq!(in_context("cat", "kˈæt", None), "kˈæt");
    }

    #[test]
    fn lexicon_entries_by_part_of_speech_take_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("us_gold.json");
        std::fs::write(
            &path,
            r#"{"read": {"DEFAULT": "ɹˈid", "VBD": "ɹˈɛd"}, "cat": "kˈæt", "odd": 3}"#,
        )
        .unwrap();
        let words = read_lexicon(&path).unwrap();
        assert_eq!(words["read"], "ɹˈid");
        assert_eq!(words["cat"], "kˈæt");
        assert!(!words.contains_key("odd"));
        std::fs::write(&path, "[1, 2]").unwrap();
        assert!(read_lexicon(&path).is_err());
        assert!(read_lexicon(&dir.path().join("missing.json")).is_err());
    }
}
