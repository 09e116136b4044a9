//! The speech clips kept in the models folder's `data/speech/`: one sub-folder per set, each
//! with WAV files and `*transcription` lists of `<s> text </s> (id)` lines (the WAV is
//! `id.wav` beside the list).

use std::path::{Path, PathBuf};

use crate::{Error, Result, Store};

/// A recording and its reference transcript.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpeechClip {
    /// The set: the sub-folder's name (`librivox`, `cards`).
    pub set: String,
    /// The line's id (the WAV file's stem).
    pub id: String,
    pub wav: PathBuf,
    /// The reference transcript, its words separated by single spaces.
    pub transcript: String,
}

/// Every clip of the store's `data/speech`, by set and list in name order; an error when there
/// is none (run `../shared/models/fetch`) or a list line is malformed.
pub fn clips(store: &Store<'_>) -> Result<Vec<SpeechClip>> {
    let root = store.root().join("data/speech");
    let mut clips = Vec::new();
    for folder in sorted_entries(&root)?.into_iter().filter(|p| p.is_dir()) {
        let set = folder
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let lists = sorted_entries(&folder)?.into_iter().filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("transcription"))
        });
        for list in lists {
            let text = std::fs::read_to_string(&list).map_err(crate::error::io_error(&list))?;
            for (index, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let malformed = || Error::Data {
                    path: list.clone(),
                    reason: format!("line {}: expected `<s> text </s> (id)`", index + 1),
                };
                let (words, id) = line.rsplit_once('(').ok_or_else(malformed)?;
                let id = id.trim().strip_suffix(')').ok_or_else(malformed)?.trim();
                let words = words.replace("<s>", "").replace("</s>", "");
                clips.push(SpeechClip {
                    set: set.clone(),
                    id: id.to_string(),
                    wav: folder.join(format!("{id}.wav")),
                    transcript: words.split_whitespace().collect::<Vec<_>>().join(" "),
                });
            }
        }
    }
    if clips.is_empty() {
        return Err(Error::Data {
            path: root,
            reason: "no clips with transcripts (run ../shared/models/fetch)".into(),
        });
    }
    Ok(clips)
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(crate::error::io_error(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;

    #[test]
    fn clips_are_read_from_every_set_and_bad_lines_named() {
        let dir = tempfile::tempdir().unwrap();
        let speech = dir.path().join("data/speech");
        std::fs::create_dir_all(speech.join("cards")).unwrap();
        std::fs::create_dir_all(speech.join("books")).unwrap();
        std::fs::write(
            speech.join("cards/cards.transcription"),
            "<s> ten of  clubs </s> (001)\n\n<s> five </s> (002)\n",
        )
        .unwrap();
        std::fs::write(
            speech.join("books/transcription"),
            "<s> he was young </s> (b-1)\n",
        )
        .unwrap();
        let store = Store::new(dir.path().to_path_buf(), Registry::builtin());
        let found = clips(&store).unwrap();
        let summary: Vec<(&str, &str, &str)> = found
            .iter()
            .map(|c| (c.set.as_str(), c.id.as_str(), c.transcript.as_str()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("books", "b-1", "he was young"),
                ("cards", "001", "ten of clubs"),
                ("cards", "002", "five")
            ]
        );
        assert_eq!(found[1].wav, speech.join("cards/001.wav"));

        std::fs::write(speech.join("cards/cards.transcription"), "no id here\n").unwrap();
        assert!(
            matches!(clips(&store), Err(Error::Data { reason, .. }) if reason.contains("line 1"))
        );
        let empty = tempfile::tempdir().unwrap();
        let store = Store::new(empty.path().to_path_buf(), Registry::builtin());
        assert!(matches!(clips(&store), Err(Error::Io { .. })));
    }
}
