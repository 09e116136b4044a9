//! The user's words as they arrive, and a simulated clock to replay them on.
//!
//! A turn is a sequence of [`PartialInput`]s, each everything heard so far, as a streaming
//! speech recogniser reports it: generated from a text at a speaking rate
//! ([`spoken_at_rate`]), or read from a file of recorded partial transcripts
//! ([`parse_partials`], [`read_partials`]). [`SimClock`] replays turns in compute time.

use std::path::Path;
use std::time::Duration;

use crate::{Error, Result};

/// One state of the user's words: everything heard so far, available at `at` (from the start of
/// the turn).
#[derive(Clone, Debug, PartialEq)]
pub struct PartialInput {
    /// When this state is available, from the start of the turn.
    pub at: Duration,
    /// Everything heard so far.
    pub text: String,
    /// Whether the user has finished speaking (the last state of the turn).
    pub is_final: bool,
}

/// Default speaking rate: 600 characters per minute (≈120 words per minute).
pub const DEFAULT_CHARS_PER_MINUTE: f64 = 600.0;

/// Reveals `text` at `chars_per_minute`: one PartialInput each time a word is complete (a word is
/// complete when the character after it, a space, has been spoken; the last word at the end of
/// the text). The trailing partial word is held back. The last one has is_final = true and the
/// whole (trimmed) text, at time chars/rate. Errors on empty text or a rate <= 0 or not finite.
pub fn spoken_at_rate(text: &str, chars_per_minute: f64) -> Result<Vec<PartialInput>> {
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
            inputs.push(PartialInput {
                at: at(spoken + 1)?,
                text: text[..end].to_string(),
                is_final: false,
            });
        }
    }
    inputs.push(PartialInput {
        at: at(text.chars().count())?,
        text: text.to_string(),
        is_final: true,
    });
    Ok(inputs)
}

/// Parses a file of ASR-style partial transcripts: turns separated by blank lines; each line
/// `SECONDS<TAB>text` (seconds since the turn started, non-decreasing within a turn); lines
/// starting with '#' are comments; the last line of a turn is final. Errors (with line numbers)
/// on bad times, decreasing times, empty text, missing tab.
pub fn parse_partials(source: &str) -> Result<Vec<Vec<PartialInput>>> {
    let mut turns = Vec::new();
    let mut turn: Vec<PartialInput> = Vec::new();
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
        turn.push(PartialInput {
            at,
            text: text.to_string(),
            is_final: false,
        });
    }
    finish_turn(&mut turns, &mut turn);
    Ok(turns)
}

/// Marks the last input of `turn` final and moves the turn, if not empty, to `turns`.
fn finish_turn(turns: &mut Vec<Vec<PartialInput>>, turn: &mut Vec<PartialInput>) {
    if let Some(last) = turn.last_mut() {
        last.is_final = true;
        turns.push(std::mem::take(turn));
    }
}

/// Reads and parses such a file (I/O errors name the path).
pub fn read_partials(path: &Path) -> Result<Vec<Vec<PartialInput>>> {
    let source = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_partials(&source).map_err(|e| match e {
        Error::Input(message) => Error::Input(format!("{}: {message}", path.display())),
        other => other,
    })
}

/// A simulated clock: time advances by measured compute, and jumps forward when idle, so a
/// benchmark costs compute time, not speaking time.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimClock {
    now: Duration,
}

impl SimClock {
    /// A clock at zero, the start of a turn.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current simulated time.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Moves time forward by `by` (compute spent).
    pub fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
    }

    /// Jumps to `t` if it is later than now.
    pub fn wait_until(&mut self, t: Duration) {
        self.now = self.now.max(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn input(at: Duration, text: &str, is_final: bool) -> PartialInput {
        PartialInput {
            at,
            text: text.to_string(),
            is_final,
        }
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
        assert_eq!(parse_partials("").unwrap(), Vec::<Vec<PartialInput>>::new());
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
    fn reads_the_shipped_partials() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/partials.txt");
        let turns = read_partials(&path).unwrap();
        assert!((4..=6).contains(&turns.len()));
        for turn in &turns {
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

    #[test]
    fn sim_clock_advances_and_waits() {
        let mut clock = SimClock::new();
        assert_eq!(clock.now(), Duration::ZERO);
        clock.advance(ms(300));
        clock.wait_until(ms(200));
        assert_eq!(clock.now(), ms(300));
        clock.wait_until(ms(1000));
        assert_eq!(clock.now(), ms(1000));
        clock.advance(ms(50));
        assert_eq!(clock.now(), ms(1050));
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), Duration::MAX);
    }
}
