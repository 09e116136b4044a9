//! Source streams: what a live captioner receives from speech recognition.

use std::path::Path;

use crate::error::{Error, Result};

/// One state of the source text. `is_final` marks the sentence complete; the next update
/// starts a new sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceUpdate {
    pub text: String,
    pub is_final: bool,
}

/// lag-k: the sentence revealed `k` words at a time; the last update (the whole sentence) is
/// final.
pub fn lag_k(sentence: &str, k: usize) -> Result<Vec<SourceUpdate>> {
    if k == 0 {
        return Err(Error::Config("lag-k needs k ≥ 1".into()));
    }
    let words: Vec<&str> = sentence.split_whitespace().collect();
    if words.is_empty() {
        return Err(Error::Input("an empty sentence".into()));
    }
    let mut updates: Vec<SourceUpdate> = (1..=words.len().div_ceil(k))
        .map(|i| SourceUpdate {
            text: words[..(i * k).min(words.len())].join(" "),
            is_final: false,
        })
        .collect();
    if let Some(last) = updates.last_mut() {
        last.is_final = true;
    }
    Ok(updates)
}

/// Sentences of ASR-style partial transcripts: one partial per line, later lines may revise
/// earlier words; a blank line ends a sentence (its last partial is final); `#` starts a
/// comment line.
pub fn parse_partials(text: &str) -> Result<Vec<Vec<SourceUpdate>>> {
    let mut sentences = Vec::new();
    let mut current: Vec<SourceUpdate> = Vec::new();
    let mut close = |current: &mut Vec<SourceUpdate>| {
        if let Some(last) = current.last_mut() {
            last.is_final = true;
            sentences.push(std::mem::take(current));
        }
    };
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            close(&mut current);
        } else {
            current.push(SourceUpdate {
                text: line.to_string(),
                is_final: false,
            });
        }
    }
    close(&mut current);
    if sentences.is_empty() {
        return Err(Error::Input("no partial transcripts".into()));
    }
    Ok(sentences)
}

/// [`parse_partials`] of a file.
pub fn read_partials(path: &Path) -> Result<Vec<Vec<SourceUpdate>>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_partials(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(updates: &[SourceUpdate]) -> Vec<(&str, bool)> {
        updates
            .iter()
            .map(|u| (u.text.as_str(), u.is_final))
            .collect()
    }

    #[test]
    fn lag_k_reveals_k_words_at_a_time() {
        let updates = lag_k("one two  three four five", 2).unwrap();
        assert_eq!(
            texts(&updates),
            [
                ("one two", false),
                ("one two three four", false),
                ("one two three four five", true)
            ]
        );
        assert_eq!(texts(&lag_k("a b", 3).unwrap()), [("a b", true)]);
        assert!(lag_k("", 3).is_err());
        assert!(lag_k("a", 0).is_err());
    }

    #[test]
    fn partials_are_split_into_sentences() {
        let text = "# revised digits\nwhat is\nwhat is one plus twenty\nwhat is 1 + 23.\n\n\nhello\nhello there\n";
        let sentences = parse_partials(text).unwrap();
        assert_eq!(sentences.len(), 2);
        assert_eq!(
            texts(&sentences[0]),
            [
                ("what is", false),
                ("what is one plus twenty", false),
                ("what is 1 + 23.", true)
            ]
        );
        assert_eq!(
            texts(&sentences[1]),
            [("hello", false), ("hello there", true)]
        );
        assert!(parse_partials("# nothing\n\n").is_err());
    }
}
