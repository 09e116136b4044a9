//! Conversation scripts: what users say to a voice assistant, written down for benchmarks and
//! demos. One question per line, conversations separated by blank lines, `#` comment lines.

use std::path::Path;

use crate::{Error, Result};

/// The conversations of a script, each the user's questions in order.
pub fn parse_conversations(source: &str) -> Vec<Vec<String>> {
    let mut conversations = vec![Vec::new()];
    for line in source.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            conversations.push(Vec::new());
        } else if let Some(current) = conversations.last_mut() {
            current.push(line.to_string());
        }
    }
    conversations.retain(|c| !c.is_empty());
    conversations
}

/// Reads and parses a script; a script without any question is an error naming the path.
pub fn read_conversations(path: &Path) -> Result<Vec<Vec<String>>> {
    let source = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let conversations = parse_conversations(&source);
    if conversations.is_empty() {
        return Err(Error::Input(format!("{}: no questions", path.display())));
    }
    Ok(conversations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversations_are_blocks_of_questions() {
        let script = "# a comment\n\nWhy is the sky blue?\nAnd at sunset?\n\n\n  How far is the moon?  \n# end\n";
        assert_eq!(
            parse_conversations(script),
            vec![
                vec![
                    "Why is the sky blue?".to_string(),
                    "And at sunset?".to_string()
                ],
                vec!["How far is the moon?".to_string()],
            ]
        );
        assert!(parse_conversations("# only comments\n\n").is_empty());
    }

    #[test]
    fn an_empty_or_missing_script_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "# nothing\n").unwrap();
        assert!(
            matches!(read_conversations(&empty), Err(Error::Input(m)) if m.contains("empty.txt"))
        );
        assert!(matches!(
            read_conversations(&dir.path().join("missing.txt")),
            Err(Error::Io { .. })
        ));
    }
}
