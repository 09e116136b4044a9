//! Whisper's text normalizers, used to compare transcripts word by word (see [`crate::wer`]).
//!
//! [`EnglishTextNormalizer`] reproduces OpenAI Whisper's `EnglishTextNormalizer`
//! (`whisper/normalizers/english.py`) step by step: it lowercases, drops text in `[…]`, `<…>` and
//! `(…)`, drops fillers (`hmm`, `mm`, `mhm`, `mmm`, `uh`, `um`), expands contractions and
//! abbreviations (`won't` → `will not`, `mr` → `mister`, `'s been` → `has been`, …), removes
//! commas inside numbers and periods that end sentences, replaces marks, symbols and punctuation
//! by spaces (keeping `. % $ ¢ € £`) and drops diacritics, writes spelled-out numbers as digits
//! (the `EnglishNumberNormalizer`: `one hundred and twenty three` → `123`, `twenty first` →
//! `21st`, `twenty dollars` → `$20`, `fifty percent` → `50%`, `three point one four` → `3.14`,
//! `double five` → `55`, `one oh one` → `101`, `two and a half` → `2.5`, a lone `1` written back as
//! `one`), maps British spellings to American ones (the `EnglishSpellingNormalizer`, from
//! Whisper's `english.json`), then removes currency and percent signs left without a number and
//! collapses whitespace. [`basic_normalize`] is Whisper's `BasicTextNormalizer` with its defaults,
//! for languages other than English.
//!
//! The quirks of the reference are kept on purpose, since a word error rate is only comparable to
//! published ones when both sides are normalized the same way: `o'clock` becomes `0 clock`,
//! `ninth` is not a number word (`twenty ninth` → `20 ninth`), `$1` → `one`, `0 point 5` → `.5`,
//! `1,2,3` → `12 3`, a lone `and a half` vanishes, and the result is not trimmed (`$$5` → ` $5`).
//!
//! Differences from the reference, all outside ordinary text:
//! - Unicode tables: the character categories come from the `regex` crate and the NFKD/NFKC
//!   decompositions from `unicode-normalization`, which follow a newer Unicode version than
//!   CPython 3.11's `unicodedata` (14.0); only characters assigned since then can differ.
//! - Lowercasing is Rust's `str::to_lowercase`, which like Python's `str.lower` uses the full
//!   Unicode mappings and the final-sigma rule.
//! - Python's `\b` is emulated with "a word character is a letter, a number (any `N` category) or
//!   `_`", which is `str.isalnum()` except for the few letters-with-numeric-values outside `L`/`N`.
//!
//! The unit tests' expected outputs were produced by openai-whisper 20240930 (tag v20240930)
//! under CPython 3.11.7.
//!
//! Whitespace is Python's (`str.split`, `\s`): Unicode `White_Space` plus U+001C–U+001F. Numbers
//! of any size are exact (Python's integers and `Fraction`s are emulated on decimal strings), and
//! digits of other scripts are read as Python reads them (`٣٤` → `34`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::LazyLock;

use regex::{Captures, Regex};
use unicode_normalization::UnicodeNormalization;

use crate::{Error, Result};

/// Whisper's English text normalizer.
///
/// ```
/// use std::collections::HashMap;
/// use engine_asr::normalize::EnglishTextNormalizer;
///
/// // usually `EnglishTextNormalizer::from_file` on Whisper's `english.json`
/// let spelling = HashMap::from([("colour".to_string(), "color".to_string())]);
/// let normalizer = EnglishTextNormalizer::new(spelling);
/// assert_eq!(
///     normalizer.normalize("Mr. Smith paid twenty-five dollars for the colour [laughs]"),
///     "mister smith paid $25 for the color"
/// );
/// ```
#[derive(Debug, Clone, Default)]
pub struct EnglishTextNormalizer {
    /// British spelling → American spelling, applied to whole words.
    spelling: HashMap<String, String>,
}

impl EnglishTextNormalizer {
    /// A normalizer with this British → American spelling map (the content of Whisper's
    /// `english.json`; an empty map skips that step).
    pub fn new(spelling: HashMap<String, String>) -> Self {
        Self { spelling }
    }

    /// A normalizer whose spelling map is read from a JSON object of strings, Whisper's
    /// `whisper/normalizers/english.json` (found at `$SPECVOICE_MODELS/data/whisper/english.json`,
    /// the models folder defaulting to `~/.cache/specvoice/models`).
    ///
    /// A file that cannot be read is [`Error::Io`]; one that is not a JSON object of strings is
    /// [`Error::Config`].
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let spelling: HashMap<String, String> = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Config(format!(
                "spelling map {}: not a JSON object of strings: {e}",
                path.display()
            ))
        })?;
        Ok(Self::new(spelling))
    }

    /// The spelling map this normalizer applies.
    pub fn spelling(&self) -> &HashMap<String, String> {
        &self.spelling
    }

    /// `text` normalized as Whisper's `EnglishTextNormalizer()(text)` would.
    pub fn normalize(&self, text: &str) -> String {
        let s = text.to_lowercase();
        let s = BRACKETED.replace_all(&s, "");
        let s = PARENTHESIZED.replace_all(&s, "");
        let s = remove_fillers(&s);
        let s = SPACE_BEFORE_APOSTROPHE.replace_all(&s, "'");
        let mut s = s.into_owned();
        for &(pattern, replacement, word_start) in REPLACERS {
            s = replace_literal(&s, pattern, replacement, word_start);
        }
        let s = COMMA_IN_NUMBER.replace_all(&s, "${1}${2}");
        let s = PERIOD_NOT_BEFORE_DIGIT.replace_all(&s, " ${1}");
        let s = remove_symbols_and_diacritics(&s, ".%$¢€£");
        let s = normalize_numbers(&s);
        let s = self.standardize_spelling(&s);
        let s = SYMBOL_NOT_BEFORE_DIGIT.replace_all(&s, " ${1}");
        let s = PERCENT_NOT_AFTER_DIGIT.replace_all(&s, "${1} ");
        WHITESPACE.replace_all(&s, " ").into_owned()
    }

    fn standardize_spelling(&self, s: &str) -> String {
        py_split(s)
            .map(|word| self.spelling.get(word).map_or(word, String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Whisper's `BasicTextNormalizer()` (no diacritic removal, no letter splitting), for languages
/// other than English: lowercase, drop text in `[…]`, `<…>` and `(…)`, replace marks, symbols
/// and punctuation by spaces after NFKC, collapse whitespace.
pub fn basic_normalize(text: &str) -> String {
    let s = text.to_lowercase();
    let s = BRACKETED.replace_all(&s, "");
    let s = PARENTHESIZED.replace_all(&s, "");
    let s = remove_symbols(&s).to_lowercase();
    WHITESPACE.replace_all(&s, " ").into_owned()
}

/// Whisper's `remove_symbols_and_diacritics`: after NFKD, characters in `keep` stay, a few letters
/// that NFKD does not split are spelled in ASCII (`æ` → `ae`, `ß` → `ss`, `ø` → `o`, …),
/// non-spacing marks are dropped and other marks, symbols and punctuation become spaces.
pub fn remove_symbols_and_diacritics(s: &str, keep: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.nfkd() {
        if keep.contains(c) {
            out.push(c);
        } else if let Some(ascii) = spelled_in_ascii(c) {
            out.push_str(ascii);
        } else if is_nonspacing_mark(c) {
            // dropped: an accent split off by NFKD
        } else if is_mark_symbol_or_punctuation(c) {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// Whisper's `remove_symbols`: after NFKC, marks, symbols and punctuation become spaces;
/// diacritics stay.
pub fn remove_symbols(s: &str) -> String {
    s.nfkc()
        .map(|c| {
            if is_mark_symbol_or_punctuation(c) {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// Letters that NFKD leaves whole, with the ASCII Whisper writes for them.
fn spelled_in_ascii(c: char) -> Option<&'static str> {
    Some(match c {
        'œ' => "oe",
        'Œ' => "OE",
        'ø' => "o",
        'Ø' => "O",
        'æ' => "ae",
        'Æ' => "AE",
        'ß' => "ss",
        'ẞ' => "SS",
        'đ' | 'ð' => "d",
        'Đ' | 'Ð' => "D",
        'þ' | 'Þ' => "th",
        'ł' => "l",
        'Ł' => "L",
        _ => return None,
    })
}

// --- Character classes -------------------------------------------------------------------------

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("the normalizer's patterns are valid")
}

/// Whether the single character `c` matches `class`.
fn char_matches(class: &Regex, c: char) -> bool {
    class.is_match(c.encode_utf8(&mut [0; 4]))
}

fn is_nonspacing_mark(c: char) -> bool {
    static MN: LazyLock<Regex> = LazyLock::new(|| regex(r"\p{Mn}"));
    !c.is_ascii() && char_matches(&MN, c)
}

/// General category M*, S* or P* (`unicodedata.category(c)[0] in "MSP"`).
fn is_mark_symbol_or_punctuation(c: char) -> bool {
    static MSP: LazyLock<Regex> = LazyLock::new(|| regex(r"[\p{M}\p{S}\p{P}]"));
    if c.is_ascii() {
        c.is_ascii_punctuation()
    } else {
        char_matches(&MSP, c)
    }
}

/// A character of Python's `\w` (`str.isalnum()` or `_`), which decides where `\b` is.
fn is_word_char(c: char) -> bool {
    static WORD: LazyLock<Regex> = LazyLock::new(|| regex(r"[\p{L}\p{N}]"));
    if c.is_ascii() {
        c.is_ascii_alphanumeric() || c == '_'
    } else {
        char_matches(&WORD, c)
    }
}

/// Python's `str.isspace()`, used by `str.split()` and `\s`.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// Python's `s.split()`: words between runs of whitespace.
fn py_split(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_py_space).filter(|w| !w.is_empty())
}

/// The value of a decimal digit of any script (general category Nd), as Python's `int` reads it.
fn decimal_digit(c: char) -> Option<u32> {
    static ND: LazyLock<Regex> = LazyLock::new(|| regex(r"\p{Nd}"));
    if c.is_ascii() {
        return c.to_digit(10);
    }
    let is_nd = |c: char| char_matches(&ND, c);
    if !is_nd(c) {
        return None;
    }
    // Unicode assigns decimal digits only in contiguous runs 0..=9, so the distance to the start
    // of the contiguous stretch of digits, modulo 10, is the value.
    let mut first = c as u32;
    while let Some(before) = first.checked_sub(1).and_then(char::from_u32) {
        if !is_nd(before) {
            break;
        }
        first -= 1;
    }
    Some((c as u32 - first) % 10)
}

/// Python's `^\d+(\.\d+)?$` on one word: digits of any script, optionally with a fraction.
fn is_decimal_number(word: &str) -> bool {
    let digits = |part: &str| !part.is_empty() && part.chars().all(|c| decimal_digit(c).is_some());
    match word.split_once('.') {
        Some((int, frac)) => digits(int) && digits(frac),
        None => digits(word),
    }
}

// --- Regular expressions -----------------------------------------------------------------------

/// `\s` as Python's `re` has it for `str` patterns (inside a character class).
const PY_SPACE: &str = r"\s\x1c-\x1f";

static BRACKETED: LazyLock<Regex> = LazyLock::new(|| regex(r"[<\[][^>\]]*[>\]]"));
static PARENTHESIZED: LazyLock<Regex> = LazyLock::new(|| regex(r"\(([^)]+?)\)"));
static SPACE_BEFORE_APOSTROPHE: LazyLock<Regex> =
    LazyLock::new(|| regex(&format!("[{PY_SPACE}]+'")));
static COMMA_IN_NUMBER: LazyLock<Regex> = LazyLock::new(|| regex(r"(\d),(\d)"));
static PERIOD_NOT_BEFORE_DIGIT: LazyLock<Regex> = LazyLock::new(|| regex(r"\.([^0-9]|$)"));
static SYMBOL_NOT_BEFORE_DIGIT: LazyLock<Regex> = LazyLock::new(|| regex(r"[.$¢€£]([^0-9])"));
static PERCENT_NOT_AFTER_DIGIT: LazyLock<Regex> = LazyLock::new(|| regex(r"([^0-9])%"));
static WHITESPACE: LazyLock<Regex> = LazyLock::new(|| regex(&format!("[{PY_SPACE}]+")));

static AND_A_HALF: LazyLock<Regex> =
    LazyLock::new(|| regex(&format!("and[{PY_SPACE}]+a[{PY_SPACE}]+half")));
static LETTER_DIGIT: LazyLock<Regex> = LazyLock::new(|| regex(r"([a-z])([0-9])"));
static DIGIT_LETTER: LazyLock<Regex> = LazyLock::new(|| regex(r"([0-9])([a-z])"));
static DIGIT_SPACE_SUFFIX: LazyLock<Regex> =
    LazyLock::new(|| regex(&format!("([0-9])[{PY_SPACE}]+(st|nd|rd|th|s)")));
static CURRENCY_AND_CENTS: LazyLock<Regex> =
    LazyLock::new(|| regex(r"([€£$])([0-9]+) (?:and )?¢([0-9]{1,2})"));
static ZERO_CURRENCY: LazyLock<Regex> = LazyLock::new(|| regex(r"[€£$]0.([0-9]{1,2})"));
static ONE: LazyLock<Regex> = LazyLock::new(|| regex(r"1(s?)"));

/// Python's `\b` just before byte `at` of `s`, when the pattern goes on with a word character.
fn word_starts_at(s: &str, at: usize) -> bool {
    !s[..at].chars().next_back().is_some_and(is_word_char)
}

/// Python's `\b` just after byte `at` of `s`, when the pattern ended with a word character.
fn word_ends_at(s: &str, at: usize) -> bool {
    !s[at..].chars().next().is_some_and(is_word_char)
}

/// The matches of `re` in `s` from left to right, not overlapping, that have a word boundary
/// before them (`word_start`) and after them (`word_end`), as Python finds `\b…\b` patterns.
///
/// Every pattern given here has at most one way to match at a position that could pass the
/// boundary checks, so a rejected match means trying again one character further, as Python does.
fn bounded_matches<'s>(
    re: &Regex,
    s: &'s str,
    word_start: bool,
    word_end: bool,
) -> Vec<Captures<'s>> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(caps) = re.captures_at(s, from) {
        let m = caps.get(0).expect("group 0 is the match");
        if (!word_start || word_starts_at(s, m.start())) && (!word_end || word_ends_at(s, m.end()))
        {
            from = m.end().max(m.start() + 1);
            found.push(caps);
        } else {
            from = m.start() + s[m.start()..].chars().next().map_or(1, char::len_utf8);
        }
        if from > s.len() {
            break;
        }
    }
    found
}

/// `re.sub` for a pattern with optional `\b` at its ends.
fn replace_bounded(
    re: &Regex,
    s: &str,
    word_start: bool,
    word_end: bool,
    replacement: impl Fn(&Captures<'_>) -> String,
) -> String {
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for caps in bounded_matches(re, s, word_start, word_end) {
        let m = caps.get(0).expect("group 0 is the match");
        out.push_str(&s[last..m.start()]);
        out.push_str(&replacement(&caps));
        last = m.end();
    }
    out.push_str(&s[last..]);
    out
}

// --- Fillers, contractions and abbreviations ---------------------------------------------------

/// Removes the words `hmm`, `mm`, `mhm`, `mmm`, `uh` and `um` (Python: `\b(hmm|…|um)\b`, which
/// can only match a whole run of word characters).
fn remove_fillers(s: &str) -> String {
    const FILLERS: [&str; 6] = ["hmm", "mm", "mhm", "mmm", "uh", "um"];
    let mut out = String::with_capacity(s.len());
    let mut run = String::new();
    for c in s.chars() {
        if is_word_char(c) {
            run.push(c);
            continue;
        }
        if !FILLERS.contains(&run.as_str()) {
            out.push_str(&run);
        }
        run.clear();
        out.push(c);
    }
    if !FILLERS.contains(&run.as_str()) {
        out.push_str(&run);
    }
    out
}

/// Whisper's replacements, in its order: `(text, replacement, whether \b precedes the text)`;
/// a `\b` always follows it.
const REPLACERS: &[(&str, &str, bool)] = &[
    // contractions
    ("won't", "will not", true),
    ("can't", "can not", true),
    ("let's", "let us", true),
    ("ain't", "aint", true),
    ("y'all", "you all", true),
    ("wanna", "want to", true),
    ("gotta", "got to", true),
    ("gonna", "going to", true),
    ("i'ma", "i am going to", true),
    ("imma", "i am going to", true),
    ("woulda", "would have", true),
    ("coulda", "could have", true),
    ("shoulda", "should have", true),
    ("ma'am", "madam", true),
    // titles and other abbreviations; the trailing space is Whisper's
    ("mr", "mister ", true),
    ("mrs", "missus ", true),
    ("st", "saint ", true),
    ("dr", "doctor ", true),
    ("prof", "professor ", true),
    ("capt", "captain ", true),
    ("gov", "governor ", true),
    ("ald", "alderman ", true),
    ("gen", "general ", true),
    ("sen", "senator ", true),
    ("rep", "representative ", true),
    ("pres", "president ", true),
    ("rev", "reverend ", true),
    ("hon", "honorable ", true),
    ("asst", "assistant ", true),
    ("assoc", "associate ", true),
    ("lt", "lieutenant ", true),
    ("col", "colonel ", true),
    ("jr", "junior ", true),
    ("sr", "senior ", true),
    ("esq", "esquire ", true),
    // perfect tenses Whisper can tell apart ("'s done" is ambiguous, so left alone)
    ("'d been", " had been", false),
    ("'s been", " has been", false),
    ("'d gone", " had gone", false),
    ("'s gone", " has gone", false),
    ("'d done", " had done", false),
    ("'s got", " has got", false),
    // any other contraction
    ("n't", " not", false),
    ("'re", " are", false),
    ("'s", " is", false),
    ("'d", " would", false),
    ("'ll", " will", false),
    ("'t", " not", false),
    ("'ve", " have", false),
    ("'m", " am", false),
];

/// Replaces `text` where a word boundary follows it (and precedes it if `word_start`), scanning
/// left to right without overlaps as `re.sub` does. `text` ends with a word character, and starts
/// with one whenever `word_start`.
fn replace_literal(s: &str, text: &str, replacement: &str, word_start: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    let mut from = 0;
    while let Some(offset) = s[from..].find(text) {
        let start = from + offset;
        let end = start + text.len();
        if (!word_start || word_starts_at(s, start)) && word_ends_at(s, end) {
            out.push_str(&s[last..start]);
            out.push_str(replacement);
            last = end;
            from = end;
        } else {
            from = start + s[start..].chars().next().map_or(1, char::len_utf8);
        }
    }
    out.push_str(&s[last..]);
    out
}

mod numbers;

use numbers::normalize_numbers;

#[cfg(test)]
mod tests {
    //! The expected outputs come from running the reference: openai-whisper 20240930 (PyPI;
    //! `whisper/normalizers/english.py`, `basic.py` and `english.json` as in the GitHub tag
    //! v20240930) under CPython 3.11.7 (`unicodedata` 14.0.0), with `regex` 2026.11.15 and
    //! `more_itertools` 11.2.1. The implementation was also compared with the reference on about
    //! 160,000 generated strings (number words, digits, currency, contractions, brackets, mixed
    //! scripts, random code points): the only differences came from characters that Unicode 14
    //! had not yet assigned.

    use super::*;

    /// The British spellings that occur in [`ENGLISH_CASES`], as in Whisper's `english.json`.
    fn spelling() -> HashMap<String, String> {
        [
            ("catalogue", "catalog"),
            ("centre", "center"),
            ("colour", "color"),
            ("grey", "gray"),
            ("organised", "organized"),
            ("programme", "program"),
            ("theatre", "theater"),
        ]
        .into_iter()
        .map(|(gb, us)| (gb.to_string(), us.to_string()))
        .collect()
    }

    const ENGLISH_CASES: &[(&str, &str)] = &[
        ("Hello, World!", "hello world"),
        ("[laughter] hi", "hi"),
        ("<unk> hello (inaudible) world", "hello world"),
        ("uh hi um there hmm mhm mmm", "hi there"),
        (
            "I won't go, can't stop, let's see, y'all ain't gonna wanna",
            "i will not go can not stop let us see you all aint going to want to",
        ),
        (
            "Mr. Smith and Mrs. Jones met Dr. Who on St. Patrick's day",
            "mister smith and missus jones met doctor who on saint patrick is day",
        ),
        ("it's 5 o'clock", "it is 50 clock"),
        (
            "He's been there; she'd gone; they'd done it; we've got it",
            "he has been there she had gone they had done it we have got it",
        ),
        (
            "I'm sure you're right, they'll come and I'd say it's fine",
            "i am sure you are right they will come and i would say it is fine",
        ),
        ("twenty-five", "25"),
        ("one hundred and twenty three", "123"),
        ("one thousand two hundred thirty four", "1234"),
        (
            "twenty first of may and the thirty second",
            "21st of may and the 32nd",
        ),
        (
            "the ninth and the twenty ninth",
            "the ninth and the 20 ninth",
        ),
        ("1,000,000 people", "1000000 people"),
        ("$5.50", "$5.50"),
        ("$20 million", "$20000000"),
        ("twenty dollars and fifty cents", "$20.50"),
        ("five dollars and seven cents", "$5.07"),
        ("fifty percent and ten per cent", "50% and 10%"),
        ("three point one four", "3.14"),
        (
            "the 1990s and the nineteen nineties",
            "the 1990s and the 1990s",
        ),
        ("one of them", "one of them"),
        ("ones and twos", "ones and 2s"),
        ("double oh seven", "007"),
        ("double five triple nine", "55999"),
        ("one oh one", "101"),
        ("two and a half hours", "2.5 hours"),
        ("and a half", ""),
        ("minus five degrees", "-5 degrees"),
        (
            "café naïve résumé Æsop straße",
            "cafe naive resume aesop strasse",
        ),
        (
            "the colour of the centre is grey",
            "the color of the center is gray",
        ),
        (
            "well-known, state-of-the-art",
            "well known state of the art",
        ),
        (
            "rock 'n' roll and the dogs' bones",
            "rock n roll and the dogs bones",
        ),
        ("I have 1 apple and 1s", "i have one apple and ones"),
        ("$1 and £0.05 and $0.5", " one and ¢5 and ¢5"),
        ("it costs €10", "it costs €10"),
        ("nineteen eighty four", "1984"),
        ("two thousand and twenty", "2020"),
        ("a million and one", "a 1000001"),
        ("the 3rd and 22nd and 101st", "the 3rd and 22nd and 101st"),
        ("seven hundred thousand", "700000"),
        ("zero point five", "0.5"),
        ("0 point 5", ".5"),
        ("one point five million", "1500000"),
        ("hundreds of thousands", "100s of 1000s"),
        (
            "Gen. Lee, Sen. Warren, Capt. Hook, Jr. and Esq.",
            "general lee senator warren captain hook junior and esquire",
        ),
        ("U.S.A. and e.g. etc.", "u s a and e g etc"),
        ("it's 3:30 p.m.", "it is 3 30 p m"),
        ("pi is 3.14159.", "pi is 3.14159"),
        ("100%", "100%"),
        ("$$5 costs $", " $5 costs $"),
        ("sixes and sevens", "6s and 7s"),
        ("eleven twelve", "1112"),
        ("twenty twenty", "2020"),
        ("page 12, 13", "page 12 13"),
        ("1,2,3", "12 3"),
        ("I’m here", "i m here"),
        (
            "   multiple   spaces\tand\nnewlines  ",
            "multiple spaces and newlines",
        ),
        ("point", "point"),
        ("double trouble", "double trouble"),
        ("positive thinking plus one", "positive thinking +one"),
        (
            "the sixth sense and the fifth element",
            "the 6th sense and the 5th element",
        ),
        ("One Two Three Four", "1234"),
        ("mmm hmm okay", "okay"),
        ("٣٤ arabic", "34 arabic"),
        ("½ cup", "one 2 cup"),
        (
            "The organised theatre programme is in the colour catalogue",
            "the organized theater program is in the color catalog",
        ),
        (
            "I'd been there and he'd done it",
            "i had been there and he had done it",
        ),
        ("twenty-five dollars and fifty cents", "$25.50"),
        (
            "Mr Smith, Dr Jones and St Louis",
            "mister smith doctor jones and saint louis",
        ),
        ("one two three", "123"),
        ("two thousand and five hundred", "2500"),
        ("twenty twenty one", "2021"),
        ("nineteen oh five", "1905"),
        ("five hundred thousand million", "500000"),
        ("three and a half million", "3500000"),
        ("a hundred and one dalmatians", "a 101 dalmatians"),
        ("first second third fourth fifth", "1st 2nd 3rd 4th 5th"),
        ("$2.00 and 2.50", "$2 and 2.50"),
        ("ten per", "10 per"),
        ("$0 5", "¢5"),
        ("7 cents and 3 pounds", "¢7 and £3"),
        ("twenty thirds", "20 thirds"),
        ("one point double five", "155"),
        ("1.5 million and 0.0005 thousand", "1500000 0.0005 1000"),
        (
            "999,999,999,999,999,999,999,999,999,999 dollars",
            "$999999999999999999999999999999",
        ),
        ("call 555 0100", "call 555 100"),
        ("the 80s and the '90s", "the 80s and the 90s"),
        ("e-mail me at 5pm", "e mail me at 5 pm"),
        ("4th of july 1776", "4th of july 1776"),
        ("ten twelve eleven", "101211"),
        (
            "Um, it's, uh, kinda like, you know",
            "it is kinda like you know",
        ),
        (
            "ma'am y'all imma woulda",
            "madam you all i am going to would have",
        ),
        ("rock-n-roll", "rock n roll"),
        (
            "Jack's got it and she's gone",
            "jack has got it and she has gone",
        ),
        (
            "École élève œuvre øre þorn łódź",
            "ecole eleve oeuvre ore thorn lodz",
        ),
        ("ΣΟΦΟΣ", "σοφος"),
    ];
    const BASIC_CASES: &[(&str, &str)] = &[
        ("Hello, World!", "hello world "),
        ("[laughter] hi", " hi"),
        ("<unk> hello (inaudible) world", " hello world"),
        (
            "café naïve résumé Æsop straße",
            "café naïve résumé æsop straße",
        ),
        (
            "well-known, state-of-the-art",
            "well known state of the art",
        ),
        ("$1 and £0.05 and $0.5", " 1 and 0 05 and 0 5"),
        ("it's 3:30 p.m.", "it s 3 30 p m "),
        ("100%", "100 "),
        ("I’m here", "i m here"),
        (
            "   multiple   spaces\tand\nnewlines  ",
            " multiple spaces and newlines ",
        ),
        ("½ cup", "1 2 cup"),
        (
            "École élève œuvre øre þorn łódź",
            "école élève œuvre øre þorn łódź",
        ),
        ("ΣΟΦΟΣ", "σοφος"),
    ];

    #[test]
    fn english_matches_whisper() {
        let normalizer = EnglishTextNormalizer::new(spelling());
        let mut wrong = Vec::new();
        for &(input, expected) in ENGLISH_CASES {
            let got = normalizer.normalize(input);
            if got != expected {
                wrong.push(format!("{input:?}: expected {expected:?}, got {got:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn basic_matches_whisper() {
        for &(input, expected) in BASIC_CASES {
            assert_eq!(basic_normalize(input), expected, "input {input:?}");
        }
    }

    #[test]
    fn without_a_spelling_map_british_spellings_stay() {
        let normalizer = EnglishTextNormalizer::default();
        assert_eq!(
            normalizer.normalize("The colour of the centre"),
            "the colour of the centre"
        );
    }

    #[test]
    fn huge_numbers_are_exact() {
        // Python's integers have no size limit; Whisper keeps the last three digits scaled
        let normalizer = EnglishTextNormalizer::default();
        let sixty_ones = "1".repeat(60);
        assert_eq!(
            normalizer.normalize(&format!("{sixty_ones} thousand")),
            format!("{}222000", "1".repeat(54))
        );
        assert_eq!(
            normalizer.normalize("nine hundred ninety nine decillion"),
            format!("999{}", "0".repeat(33))
        );
    }

    #[test]
    fn decimal_digits_of_any_script() {
        assert_eq!(decimal_digit('7'), Some(7));
        assert_eq!(decimal_digit('\u{0663}'), Some(3)); // Arabic-Indic three
        assert_eq!(decimal_digit('\u{1D7D9}'), Some(1)); // mathematical double-struck one
        assert_eq!(decimal_digit('x'), None);
        assert_eq!(decimal_digit('½'), None);
    }

    /// Whisper's `english.json` where the models folder has it (`cargo xtask models` fetches it);
    /// `None` elsewhere.
    fn spelling_file() -> Option<std::path::PathBuf> {
        let models = match std::env::var_os("SPECVOICE_MODELS").filter(|d| !d.is_empty()) {
            Some(dir) => std::path::PathBuf::from(dir),
            None => {
                std::path::PathBuf::from(std::env::var_os("HOME")?).join(".cache/specvoice/models")
            }
        };
        let path = models.join("data/whisper/english.json");
        path.is_file().then_some(path)
    }

    #[test]
    fn whisper_spelling_file() {
        let Some(path) = spelling_file() else {
            eprintln!("skipped: no data/whisper/english.json in the models folder");
            return;
        };
        let normalizer = EnglishTextNormalizer::from_file(&path).unwrap();
        assert_eq!(normalizer.spelling().len(), 1739);
        for (input, expected) in [
            (
                "The travelled defence of aluminium colours",
                "the traveled defense of aluminum colors",
            ),
            (
                "We analysed the programme at the theatre centre",
                "we analyzed the program at the theater center",
            ),
            (
                "Mum apologised: labour, honour and favour!",
                "mum apologized labor honor and favor",
            ),
        ] {
            assert_eq!(normalizer.normalize(input), expected);
        }
        // the in-memory map of the other tests is a part of it
        for (gb, us) in spelling() {
            assert_eq!(normalizer.spelling().get(&gb), Some(&us));
        }
    }

    #[test]
    fn spelling_file_errors_are_typed() {
        let dir = std::env::temp_dir().join(format!("specvoice-normalize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();

        let missing = dir.join("missing.json");
        match EnglishTextNormalizer::from_file(&missing) {
            Err(Error::Io { path, .. }) => assert_eq!(path, missing),
            other => panic!("expected an IO error, got {other:?}"),
        }

        let corrupt = dir.join("corrupt.json");
        for content in ["{\"colour\": ", "[\"colour\"]", "{\"colour\": 1}"] {
            std::fs::write(&corrupt, content).unwrap();
            match EnglishTextNormalizer::from_file(&corrupt) {
                Err(Error::Config(message)) => assert!(message.contains("corrupt.json")),
                other => panic!("expected a Config error for {content:?}, got {other:?}"),
            }
        }

        let good = dir.join("good.json");
        std::fs::write(&good, r#"{"colour": "color"}"#).unwrap();
        let normalizer = EnglishTextNormalizer::from_file(&good).unwrap();
        assert_eq!(normalizer.normalize("Colour!"), "color");

        std::fs::remove_dir_all(&dir).unwrap();
    }
}
