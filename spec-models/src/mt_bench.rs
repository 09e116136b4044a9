//! MT-Bench's 80 questions (`data/mt_bench/question.jsonl` in the models folder): the written
//! questions the LLM benchmarks and real-model tests ask.

use std::path::Path;

use serde::Deserialize;

use crate::{Error, Result, Store};

/// Where the questions are kept, relative to the models folder's `data/`.
pub const QUESTIONS_FILE: &str = "mt_bench/question.jsonl";

/// One question: two turns of a conversation.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Question {
    pub question_id: u32,
    pub category: String,
    pub turns: Vec<String>,
}

/// Every question of the store's copy, in file order.
pub fn questions(store: &Store<'_>) -> Result<Vec<Question>> {
    read_questions(&store.data_file(QUESTIONS_FILE)?)
}

/// The first turns of the store's first `count` questions.
pub fn first_turns(store: &Store<'_>, count: usize) -> Result<Vec<String>> {
    Ok(questions(store)?
        .into_iter()
        .take(count)
        .map(|mut q| q.turns.swap_remove(0))
        .collect())
}

/// Every question of a `question.jsonl` file; a malformed line is an error naming it.
pub fn read_questions(path: &Path) -> Result<Vec<Question>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            let question: Question = serde_json::from_str(line).map_err(|e| Error::Data {
                path: path.to_path_buf(),
                reason: format!("line {}: {e}", index + 1),
            })?;
            if question.turns.is_empty() {
                return Err(Error::Data {
                    path: path.to_path_buf(),
                    reason: format!("line {}: a question without turns", index + 1),
                });
            }
            Ok(question)
        })
        .collect()
}

/// `count` questions spread evenly over the list (so over its eight categories, which come in
/// blocks of ten), or all of them.
pub fn spread(questions: Vec<Question>, count: Option<usize>) -> Vec<Question> {
    match count {
        None => questions,
        Some(n) => {
            let n = n.min(questions.len());
            (0..n)
                .map(|i| questions[i * questions.len() / n].clone())
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_are_read_and_bad_lines_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("question.jsonl");
        let lines: Vec<String> = (0..8)
            .map(|i| {
                format!(
                    r#"{{"question_id": {i}, "category": "c{}", "turns": ["q{i}", "follow-up"]}}"#,
                    i / 2
                )
            })
            .collect();
        std::fs::write(&path, lines.join("\n")).unwrap();
        let all = read_questions(&path).unwrap();
        assert_eq!(all.len(), 8);
        assert_eq!(all[3].turns, ["q3", "follow-up"]);
        let ids: Vec<u32> = spread(all.clone(), Some(4))
            .iter()
            .map(|q| q.question_id)
            .collect();
        assert_eq!(ids, [0, 2, 4, 6]);
        assert_eq!(spread(all.clone(), Some(20)).len(), 8);
        assert_eq!(spread(all, None).len(), 8);

        std::fs::write(&path, format!("{}\n{{\"turns\": 3}}", lines[0])).unwrap();
        let err = read_questions(&path).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        std::fs::write(&path, r#"{"question_id": 1, "category": "x", "turns": []}"#).unwrap();
        assert!(read_questions(&path).is_err());
    }
}
