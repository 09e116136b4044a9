//! The user's words as they arrive: timed partial transcripts.
//!
//! An utterance (a chat turn, a sentence to caption) is a sequence of [`Partial`]s, each
//! everything heard so far as a streaming speech recogniser reports it: a later partial may
//! revise earlier words ([`Partial::revises`]), and the last one is final. They are generated
//! from a text at a speaking rate ([`spoken_at_rate`]) or `k` words at a time ([`lag_k`]), or
//! read from a file of recorded partial transcripts ([`parse_partials`], [`read_partials`]), the
//! one file format of every engine. A simulated [`Clock`](crate::Clock) replays them in compute time.

use std::path::Path;
use std::time::Duration;

use crate::{Error, Result};

/// One state of the user's words: everything heard so far, available at `at` (from the start of
/// the turn).
#[derive(Clone, Debug, PartialEq)]
pub struct Partial {
    /// When this state is available, from the start of the turn.
    pub at: Duration,
    /// Everything heard so far.
    pub text: String,
    /// Whether the user has finished speaking (the last state of the turn).
    pub is_final: bool,
    /// The recognizer's probability of the last word, when it measured it (the listener does
    /// for the transcript of a pause): a word Whisper "hears" in the silence after the speech
    /// is far less probable than the words spoken, and the end of turn is judged with and
    /// without it.
    pub last_word_probability: Option<f32>,
}

impl Partial {
    /// A partial transcript heard at `at`.
    pub fn new(at: Duration, text: impl Into<String>, is_final: bool) -> Self {
        Self {
            at,
            text: text.into(),
            is_final,
            last_word_probability: None,
        }
    }

    /// With the recognizer's probability of the last word (clamped to 0–1; `None` when it is
    /// not a number).
    pub fn with_last_word_probability(self, probability: f32) -> Self {
        Self {
            last_word_probability: (!probability.is_nan()).then(|| probability.clamp(0.0, 1.0)),
            ..self
        }
    }

    /// Whether this partial changes words of `previous` rather than only adding to them (a
    /// recogniser correcting itself).
    pub fn revises(&self, previous: &Partial) -> bool {
        !keeps_words(&previous.text, &self.text)
    }
}

/// Whether `later` starts with every word of `earlier`, in order (whitespace aside).
pub fn keeps_words(earlier: &str, later: &str) -> bool {
    let mut later = later.split_whitespace();
    earlier.split_whitespace().all(|w| later.next() == Some(w))
}

/// Default speaking rate: 600 characters per minute (≈120 words per minute).
pub const DEFAULT_CHARS_PER_MINUTE: f64 = 600.0;

/// Reveals `text` at `chars_per_minute`: one Partial each time a word is complete (a word is
/// complete when the character after it, a space, has been spoken; the last word at the end of
/// the text). The trailing partial word is held back. The last one has is_final = true and the
/// whole (trimmed) text, at time chars/rate. Errors on empty text or a rate <= 0 or not finite.
pub fn spoken_at_rate(text: &str, chars_per_minute: f64) -> Result<Vec<Partial>> {
    if !chars_per_minute.is_finite() || chars_per_minute <= 0.0 {
        return Err(Error::Input(format!(
            "speaking rate must be a positive number of characters per minute, got {chars_per_minute}"
        )));
    }
    let text = text.trim();
    if text.is_empty() {
        return Err(Error::Input("cannot speak an empty text".to_string()));
    }
    let seconds_per_char = 60.0 / chars_per_minute;
    let at = |spoken: usize| {
        Duration::try_from_secs_f64(spoken as f64 * seconds_per_char).map_err(|e| {
            Error::Input(format!(
                "{spoken} characters at {chars_per_minute} per minute: {e}"
            ))
        })
    };
    let mut inputs = Vec::new();
    let mut word_end = None;
    for (spoken, (pos, c)) in text.char_indices().enumerate() {
        if !c.is_whitespace() {
            word_end = Some(pos + c.len_utf8());
        } else if let Some(end) = word_end.take() {
            inputs.push(Partial::new(
                at(spoken + 1)?,
                text[..end].to_string(),
                false,
            ));
        }
    }
    inputs.push(Partial::new(
        at(text.chars().count())?,
        text.to_string(),
        true,
    ));
    Ok(inputs)
}

/// lag-k: `text` revealed `k` words at a time (the simultaneous-translation setting); the
/// last partial, the whole text, is final. Each is timed as if spoken at
/// [`DEFAULT_CHARS_PER_MINUTE`]: available once its last word has been said.
pub fn lag_k(text: &str, k: usize) -> Result<Vec<Partial>> {
    if k == 0 {
        return Err(Error::Input("lag-k needs k >= 1".into()));
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.is_empty() {
        return Err(Error::Input("cannot reveal an empty text".into()));
    }
    let seconds_per_char = 60.0 / DEFAULT_CHARS_PER_MINUTE;
    let partials = (1..=words.len().div_ceil(k))
        .map(|i| {
            let shown = words[..(i * k).min(words.len())].join(" ");
            let at = Duration::from_secs_f64(shown.chars().count() as f64 * seconds_per_char);
            Partial::new(at, shown, i * k >= words.len())
        })
        .collect();
    Ok(partials)
}

/// Parses a file of ASR-style partial transcripts: turns separated by blank lines; each line
/// `SECONDS<TAB>text` (seconds since the turn started, non-decreasing within a turn); lines
/// starting with '#' are comments; the last line of a turn is final. Errors (with line numbers)
/// on bad times, decreasing times, empty text, missing tab.
pub fn parse_partials(source: &str) -> Result<Vec<Vec<Partial>>> {
    let mut turns = Vec::new();
    let mut turn: Vec<Partial> = Vec::new();
    for (index, line) in source.lines().enumerate() {
        let number = index + 1;
        let bad = |what: String| Error::Input(format!("line {number}: {what}"));
        if line.trim().is_empty() {
            finish_turn(&mut turns, &mut turn);
            continue;
        }
        if line.trim_start().starts_with('#') {
            continue;
        }
        let (time, text) = line
            .split_once('\t')
            .ok_or_else(|| bad("expected `SECONDS<TAB>text`, found no tab".to_string()))?;
        let seconds: f64 = time
            .trim()
            .parse()
            .map_err(|_| bad(format!("bad time `{}`", time.trim())))?;
        let at = Duration::try_from_secs_f64(seconds)
            .map_err(|_| bad(format!("bad time `{}`", time.trim())))?;
        if let Some(previous) = turn.last() {
            if at < previous.at {
                return Err(bad(format!(
                    "time {seconds} s is before the previous line's {} s",
                    previous.at.as_secs_f64()
                )));
            }
        }
        let text = text.trim();
        if text.is_empty() {
            return Err(bad("empty text".to_string()));
        }
        turn.push(Partial::new(at, text.to_string(), false));
    }
    finish_turn(&mut turns, &mut turn);
    Ok(turns)
}

/// Marks the last input of `turn` final and moves the turn, if not empty, to `turns`.
fn finish_turn(turns: &mut Vec<Vec<Partial>>, turn: &mut Vec<Partial>) {
    if let Some(last) = turn.last_mut() {
        last.is_final = true;
        turns.push(std::mem::take(turn));
    }
}

/// Reads and parses such a file (I/O errors name the path).
pub fn read_partials(path: &Path) -> Result<Vec<Vec<Partial>>> {
    let source = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_partials(&source).map_err(|e| match e {
        Error::Input(message) => Error::Input(format!("{}: {message}", path.display())),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn input(at: Duration, text: &str, is_final: bool) -> Partial {
        Partial::new(at, text.to_string(), is_final)
    }

    fn input_error(result: Result<impl std::fmt::Debug>) -> String {
        match result {
            Err(Error::Input(message)) => message,
            other => panic!("expected an input error, got {other:?}"),
        }
    }

    #[test]
    fn words_arrive_after_the_following_space() {
        let inputs = spoken_at_rate("hello world", 600.0).unwrap();
        assert_eq!(
            inputs,
            [
                input(ms(600), "hello", false),
                input(ms(1100), "hello world", true)
            ]
        );
    }

    #[test]
    fn partial_words_are_held_back_and_text_trimmed() {
        let inputs = spoken_at_rate("  what is  the time ", 60.0).unwrap();
        let texts: Vec<_> = inputs.iter().map(|i| i.text.as_str()).collect();
        assert_eq!(
            texts,
            ["what", "what is", "what is  the", "what is  the time"]
        );
        let seconds: Vec<_> = inputs.iter().map(|i| i.at.as_secs_f64()).collect();
        assert_eq!(seconds, [5.0, 8.0, 13.0, 17.0]);
        assert!(inputs.iter().rev().skip(1).all(|i| !i.is_final));
        assert!(inputs[3].is_final);
    }

    #[test]
    fn one_word_is_one_final_input() {
        let inputs = spoken_at_rate("héllo", DEFAULT_CHARS_PER_MINUTE).unwrap();
        assert_eq!(inputs, [input(ms(500), "héllo", true)]);
    }

    #[test]
    fn spoken_at_rate_rejects_empty_text_and_bad_rates() {
        input_error(spoken_at_rate("", 600.0));
        input_error(spoken_at_rate(" \n ", 600.0));
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(input_error(spoken_at_rate("hi there", rate)).contains("rate"));
        }
        input_error(spoken_at_rate("hi there", 1e-300));
    }

    #[test]
    fn lag_k_reveals_k_words_at_a_time() {
        let partials = lag_k("one two  three four five", 2).unwrap();
        let shown: Vec<(&str, bool)> = partials
            .iter()
            .map(|p| (p.text.as_str(), p.is_final))
            .collect();
        assert_eq!(
            shown,
            [
                ("one two", false),
                ("one two three four", false),
                ("one two three four five", true)
            ]
        );
        // 7 characters at 10 per second.
        assert_eq!(partials[0].at, ms(700));
        assert!(partials.windows(2).all(|w| w[0].at < w[1].at));
        assert_eq!(lag_k("a b", 3).unwrap(), [input(ms(300), "a b", true)]);
        input_error(lag_k("", 3));
        input_error(lag_k("a", 0));
    }

    #[test]
    fn revisions_are_changed_words_not_added_ones() {
        let p = |text: &str| input(ms(0), text, false);
        assert!(!p("what is one").revises(&p("what is")));
        assert!(!p("what is").revises(&p("what is")));
        assert!(!p("what  is").revises(&p("what is")));
        assert!(p("what is 1 + 23").revises(&p("what is one plus twenty")));
        assert!(p("what").revises(&p("what is")));
        assert!(!p("anything").revises(&p("")));
    }

    #[test]
    fn parses_turns_comments_and_final_lines() {
        let source = "# a comment\n0.4\twhat is\n0.8\twhat is one\r\n0.8\twhat is 1?\n\n\n\
                      # another\n  \n1.5\t  hello  \n";
        let turns = parse_partials(source).unwrap();
        assert_eq!(
            turns,
            [
                vec![
                    input(ms(400), "what is", false),
                    input(ms(800), "what is one", false),
                    input(ms(800), "what is 1?", true)
                ],
                vec![input(ms(1500), "hello", true)]
            ]
        );
        assert_eq!(parse_partials("").unwrap(), Vec::<Vec<Partial>>::new());
        assert_eq!(parse_partials("# only\n\n").unwrap().len(), 0);
    }

    #[test]
    fn parse_errors_name_the_line() {
        let cases = [
            ("0.1\tok\n0.2 no tab\n", "line 2: expected"),
            ("abc\thello\n", "line 1: bad time `abc`"),
            ("-1\thello\n", "line 1: bad time"),
            ("NaN\thello\n", "line 1: bad time"),
            ("\n0.5\ta\n0.3\tb\n", "line 3: time 0.3 s is before"),
            ("0.5\t  \n", "line 1: empty text"),
        ];
        for (source, expected) in cases {
            let message = input_error(parse_partials(source));
            assert!(message.starts_with(expected), "{source:?}: {message}");
        }
        assert_eq!(parse_partials("0.5\ta\n\n0.3\tb\n").unwrap().len(), 2);
    }

    #[test]
    fn reads_the_shipped_partials_of_every_engine() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let chat = read_partials(&root.join("engine-llm/data/partials.txt")).unwrap();
        assert!((4..=6).contains(&chat.len()));
        let captions = read_partials(&root.join("engine-mt/data/partials.txt")).unwrap();
        assert_eq!(captions.len(), 3);
        for turn in chat.iter().chain(&captions) {
            assert!(turn.len() >= 2);
            assert!(turn.windows(2).all(|w| w[0].at <= w[1].at));
            let finals: Vec<bool> = turn.iter().map(|i| i.is_final).collect();
            assert_eq!(finals.iter().filter(|&&f| f).count(), 1);
            assert_eq!(finals.last(), Some(&true));
        }
    }

    #[test]
    fn read_errors_name_the_path() {
        let missing = Path::new("/nonexistent/partials.txt");
        match read_partials(missing) {
            Err(Error::Io { path, .. }) => assert_eq!(path, missing),
            other => panic!("expected an I/O error, got {other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.txt");
        std::fs::write(&bad, "x\ty\n").unwrap();
        let message = input_error(read_partials(&bad));
        assert!(message.starts_with(&format!("{}: line 1", bad.display())));
    }
}
