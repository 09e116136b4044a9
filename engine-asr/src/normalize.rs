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
//! Whitespace is Python's (`str.split`, `\s`): Unicode `White_Space` plus U+001C–U+001F. Numbers
//! of any size are exact (Python's integers and `Fraction`s are emulated on decimal strings), and
//! digits of other scripts are read as Python reads them (`٣٤` → `34`).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::LazyLock;

use regex::{Captures, Regex};
use unicode_normalization::UnicodeNormalization;

use crate::{Error, Result};

/// Whisper's English text normalizer.
///
/// ```ignore
/// let normalizer = EnglishTextNormalizer::from_file(&models.join("data/whisper/english.json"))?;
/// assert_eq!(normalizer.normalize("Mr. Smith paid twenty dollars"), "mister smith paid $20");
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
    replacement: impl Fn(&Captures) -> String,
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

// --- Numbers -----------------------------------------------------------------------------------

/// A non-negative integer of any size as its canonical decimal digits (a Python `int`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Nat(String);

impl Nat {
    fn small(n: u32) -> Self {
        Nat(n.to_string())
    }

    fn zero() -> Self {
        Nat("0".into())
    }

    /// From ASCII digits, leading zeros allowed.
    fn from_digits(digits: &str) -> Self {
        let trimmed = digits.trim_start_matches('0');
        if trimmed.is_empty() {
            Self::zero()
        } else {
            Nat(trimmed.to_string())
        }
    }

    fn is_zero(&self) -> bool {
        self.0 == "0"
    }

    /// Whether 10^k divides this number.
    fn divisible_by_pow10(&self, k: usize) -> bool {
        self.is_zero() || (self.0.len() > k && self.0.bytes().rev().take(k).all(|b| b == b'0'))
    }

    /// This number times 10^k.
    fn shifted_up(&self, k: usize) -> Self {
        if self.is_zero() {
            return Self::zero();
        }
        Nat(format!("{}{}", self.0, "0".repeat(k)))
    }

    /// This number divided by 10^k, which must divide it.
    fn shifted_down(&self, k: usize) -> Self {
        if self.is_zero() {
            return Self::zero();
        }
        Nat(self.0[..self.0.len() - k].to_string())
    }

    fn plus(&self, other: &Nat) -> Self {
        let (a, b) = (self.0.as_bytes(), other.0.as_bytes());
        let mut digits = Vec::with_capacity(a.len().max(b.len()) + 1);
        let mut carry = 0;
        for i in 0..a.len().max(b.len()) {
            let da = a.len().checked_sub(i + 1).map_or(0, |j| a[j] - b'0');
            let db = b.len().checked_sub(i + 1).map_or(0, |j| b[j] - b'0');
            let sum = da + db + carry;
            digits.push(b'0' + sum % 10);
            carry = sum / 10;
        }
        if carry > 0 {
            digits.push(b'0' + carry);
        }
        digits.reverse();
        Nat(String::from_utf8(digits).expect("ASCII digits"))
    }

    /// Whisper's `value // 1000 * 1000 + value % 1000 * 10^k`: the last three digits are scaled.
    fn scale_last_thousand(&self, k: usize) -> Self {
        let split = self.0.len().saturating_sub(3);
        let (high, low) = self.0.split_at(split);
        let before = if high.is_empty() {
            Self::zero()
        } else {
            Nat(format!("{high}000"))
        };
        before.plus(&Nat::from_digits(low).shifted_up(k))
    }
}

impl fmt::Display for Nat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A number `digits / 10^scale` read as Python's `Fraction(str)` reads the strings that the
/// number normalizer builds (digits of any script with at most one `.`).
struct Decimal {
    digits: Nat,
    scale: usize,
}

impl Decimal {
    fn parse(s: &str) -> Option<Self> {
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        // Fraction wants a digit first, or a point and a digit
        let first_digit = if int.is_empty() { frac } else { int };
        if !first_digit.chars().next().is_some_and(|c| decimal_digit(c).is_some()) {
            return None;
        }
        let mut ascii = String::with_capacity(int.len() + frac.len());
        for c in int.chars().chain(frac.chars()) {
            ascii.push(char::from_digit(decimal_digit(c)?, 10).expect("a digit"));
        }
        Some(Decimal {
            digits: Nat::from_digits(&ascii),
            scale: frac.chars().count(),
        })
    }

    fn from_int(n: &Nat) -> Self {
        Decimal {
            digits: n.clone(),
            scale: 0,
        }
    }

    /// This number times 10^k, if that is an integer.
    fn times_pow10(&self, k: usize) -> Option<Nat> {
        if k >= self.scale {
            Some(self.digits.shifted_up(k - self.scale))
        } else if self.digits.divisible_by_pow10(self.scale - k) {
            Some(self.digits.shifted_down(self.scale - k))
        } else {
            None
        }
    }
}

/// The number being built: an integer, or digits kept as written (`"007"`, `"3.14"`).
#[derive(Debug, Clone)]
enum Value {
    Int(Nat),
    Text(String),
}

impl Value {
    fn fraction(&self) -> Option<Decimal> {
        match self {
            Value::Int(n) => Some(Decimal::from_int(n)),
            Value::Text(t) => Decimal::parse(t),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(n) => n.fmt(f),
            Value::Text(t) => f.write_str(t),
        }
    }
}

/// What a word means to the number normalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumberWord {
    Zero,
    One(u32),
    OneSuffixed(u32, &'static str),
    Ten(u32),
    TenSuffixed(u32, &'static str),
    /// 10 to this power.
    Multiplier(usize),
    MultiplierSuffixed(usize, &'static str),
    /// `minus`, `plus`, …: a sign for the number that follows.
    Sign(char),
    /// `dollars`, `cents`, …: a currency for the number before.
    Currency(char),
    Per,
    Percent,
    And,
    Repeat(usize),
    Point,
}

const ONES: [&str; 19] = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];

const TENS: [&str; 8] = [
    "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];

const MULTIPLIERS: [(&str, usize); 12] = [
    ("hundred", 2),
    ("thousand", 3),
    ("million", 6),
    ("billion", 9),
    ("trillion", 12),
    ("quadrillion", 15),
    ("quintillion", 18),
    ("sextillion", 21),
    ("septillion", 24),
    ("octillion", 27),
    ("nonillion", 30),
    ("decillion", 33),
];

/// Every word the number normalizer acts on, built as Whisper builds its tables (which is why
/// `ninth` is missing: it makes `nineth`).
static NUMBER_WORDS: LazyLock<HashMap<String, NumberWord>> = LazyLock::new(|| {
    use NumberWord::*;
    let mut words = HashMap::new();
    let mut add = |word: String, meaning: NumberWord| {
        words.entry(word).or_insert(meaning);
    };
    for zero in ["o", "oh", "zero"] {
        add(zero.into(), Zero);
    }
    for (value, name) in (1..).zip(ONES) {
        add(name.into(), One(value));
    }
    for (value, name) in (1..).zip(ONES) {
        let plural = if name == "six" {
            "sixes".to_string()
        } else {
            format!("{name}s")
        };
        add(plural, OneSuffixed(value, "s"));
    }
    for (word, value, suffix) in [
        ("zeroth", 0, "th"),
        ("first", 1, "st"),
        ("second", 2, "nd"),
        ("third", 3, "rd"),
        ("fifth", 5, "th"),
        ("twelfth", 12, "th"),
    ] {
        add(word.into(), OneSuffixed(value, suffix));
    }
    for (value, name) in (1..).zip(ONES) {
        if value > 3 && value != 5 && value != 12 {
            let ordinal = if name.ends_with('t') {
                format!("{name}h")
            } else {
                format!("{name}th")
            };
            add(ordinal, OneSuffixed(value, "th"));
        }
    }
    for (value, name) in (20..).step_by(10).zip(TENS) {
        add(name.into(), Ten(value));
    }
    for (value, name) in (20..).step_by(10).zip(TENS) {
        add(name.replace('y', "ies"), TenSuffixed(value, "s"));
        add(name.replace('y', "ieth"), TenSuffixed(value, "th"));
    }
    for (name, power) in MULTIPLIERS {
        add(name.into(), Multiplier(power));
    }
    for (name, power) in MULTIPLIERS {
        add(format!("{name}s"), MultiplierSuffixed(power, "s"));
        add(format!("{name}th"), MultiplierSuffixed(power, "th"));
    }
    for (word, sign) in [
        ("minus", '-'),
        ("negative", '-'),
        ("plus", '+'),
        ("positive", '+'),
    ] {
        add(word.into(), Sign(sign));
    }
    for (word, symbol) in [
        ("pound", '£'),
        ("pounds", '£'),
        ("euro", '€'),
        ("euros", '€'),
        ("dollar", '$'),
        ("dollars", '$'),
        ("cent", '¢'),
        ("cents", '¢'),
    ] {
        add(word.into(), Currency(symbol));
    }
    add("per".into(), Per);
    add("percent".into(), Percent);
    add("and".into(), And);
    add("double".into(), Repeat(2));
    add("triple".into(), Repeat(3));
    add("point".into(), Point);
    words
});

/// Signs and currencies that may stand before a number.
const PREFIXES: [char; 6] = ['-', '+', '£', '€', '$', '¢'];

fn number_word(word: Option<&str>) -> Option<NumberWord> {
    word.and_then(|w| NUMBER_WORDS.get(w)).copied()
}

fn is_one(word: Option<&str>) -> bool {
    matches!(number_word(word), Some(NumberWord::One(_)))
}

fn is_ten(word: Option<&str>) -> bool {
    matches!(number_word(word), Some(NumberWord::Ten(_)))
}

fn is_zero(word: Option<&str>) -> bool {
    matches!(number_word(word), Some(NumberWord::Zero))
}

/// Whisper's `decimals`: words that may follow `point`.
fn is_decimal_word(word: Option<&str>) -> bool {
    matches!(
        number_word(word),
        Some(NumberWord::Zero | NumberWord::One(_) | NumberWord::Ten(_))
    )
}

fn is_multiplier(word: Option<&str>) -> bool {
    matches!(number_word(word), Some(NumberWord::Multiplier(_)))
}

/// Whisper's `EnglishNumberNormalizer()(s)`.
fn normalize_numbers(s: &str) -> String {
    let s = preprocess_numbers(s);
    let words: Vec<&str> = py_split(&s).collect();
    postprocess_numbers(&NumberWriter::default().process(&words).join(" "))
}

/// `… and a half` becomes `… point five` after a number word, and digits are split from letters
/// except for the suffixes `st`, `nd`, `rd`, `th` and `s`.
fn preprocess_numbers(s: &str) -> String {
    let halves = bounded_matches(&AND_A_HALF, s, true, true);
    let mut segments = Vec::with_capacity(halves.len() + 1);
    let mut last = 0;
    for caps in &halves {
        let m = caps.get(0).expect("group 0 is the match");
        segments.push(&s[last..m.start()]);
        last = m.end();
    }
    segments.push(&s[last..]);

    let mut parts = Vec::with_capacity(2 * segments.len());
    let final_segment = segments.len() - 1;
    for (i, segment) in segments.into_iter().enumerate() {
        // Whisper drops a blank segment and with it the "and a half" that followed it
        if segment.trim_matches(is_py_space).is_empty() {
            continue;
        }
        parts.push(segment);
        if i != final_segment {
            let last_word = py_split(segment).last();
            parts.push(if is_decimal_word(last_word) || is_multiplier(last_word) {
                "point five"
            } else {
                "and a half"
            });
        }
    }
    let s = parts.join(" ");

    let s = LETTER_DIGIT.replace_all(&s, "${1} ${2}");
    let s = DIGIT_LETTER.replace_all(&s, "${1} ${2}");
    replace_bounded(&DIGIT_SPACE_SUFFIX, &s, false, true, |caps| {
        format!("{}{}", &caps[1], &caps[2])
    })
}

/// Cents are joined to the amount (`$2 and ¢7` → `$2.07`, `$0.05` → `¢5`) and a lone `1`/`1s` is
/// written `one`/`ones`.
fn postprocess_numbers(s: &str) -> String {
    let s = replace_bounded(&CURRENCY_AND_CENTS, s, false, true, |caps| {
        let cents: u32 = caps[3].parse().expect("one or two ASCII digits");
        format!("{}{}.{cents:02}", &caps[1], &caps[2])
    });
    let s = replace_bounded(&ZERO_CURRENCY, &s, false, true, |caps| {
        let cents: u32 = caps[1].parse().expect("one or two ASCII digits");
        format!("¢{cents}")
    });
    replace_bounded(&ONE, &s, true, true, |caps| format!("one{}", &caps[1]))
}

/// The state of Whisper's `process_words` generator: the number being read and its sign or
/// currency.
#[derive(Default)]
struct NumberWriter {
    prefix: Option<char>,
    value: Option<Value>,
    out: Vec<String>,
}

impl NumberWriter {
    /// Writes a word, with the pending prefix, and forgets the number being read (`output`).
    fn emit(&mut self, word: impl Into<String>) {
        let mut word = word.into();
        if let Some(prefix) = self.prefix.take() {
            word.insert(0, prefix);
        }
        self.value = None;
        self.out.push(word);
    }

    /// Writes the number being read, if any.
    fn flush(&mut self) {
        if let Some(value) = self.value.take() {
            self.emit(value.to_string());
        }
    }

    /// `str(value or "")`: the number so far as text, empty when there is none or it is 0.
    fn value_text_or_empty(&self) -> String {
        match &self.value {
            None => String::new(),
            Some(Value::Int(n)) if n.is_zero() => String::new(),
            Some(v) => v.to_string(),
        }
    }

    fn process(mut self, words: &[&str]) -> Vec<String> {
        use NumberWord::*;
        let mut skip = false;
        for (i, &current) in words.iter().enumerate() {
            if skip {
                skip = false;
                continue;
            }
            let prev = i.checked_sub(1).map(|j| words[j]);
            let next = words.get(i + 1).copied();
            let next_is_numeric = next.is_some_and(is_decimal_number);
            let next_is_number_word = number_word(next).is_some();

            let first = current.chars().next().expect("split words are not empty");
            let has_prefix = PREFIXES.contains(&first);
            let unprefixed = if has_prefix {
                &current[first.len_utf8()..]
            } else {
                current
            };

            if is_decimal_number(unprefixed) {
                // digits, maybe after a sign or currency, maybe with a fraction
                if let Some(value) = &self.value {
                    if let Value::Text(t) = value {
                        if t.ends_with('.') {
                            // the digits after "point"
                            self.value = Some(Value::Text(format!("{t}{current}")));
                            continue;
                        }
                    }
                    self.flush();
                }
                if has_prefix {
                    self.prefix = Some(first);
                }
                let fraction = Decimal::parse(unprefixed).expect("checked to be a number");
                self.value = Some(match fraction.times_pow10(0) {
                    Some(integer) => Value::Int(integer),
                    None => Value::Text(unprefixed.to_string()),
                });
                continue;
            }

            let Some(meaning) = number_word(Some(current)) else {
                self.flush();
                self.emit(current);
                continue;
            };
            match meaning {
                Zero => {
                    self.value = Some(Value::Text(self.value_text_or_empty() + "0"));
                }
                One(ones) => {
                    self.value = Some(match self.value.take() {
                        None => Value::Int(Nat::small(ones)),
                        Some(Value::Int(n)) if !is_one(prev) => {
                            // 10 or 100 divides the number: the digit(s) go in its place
                            let zeros = if ones < 10 { 1 } else { 2 };
                            if n.divisible_by_pow10(zeros) {
                                Value::Int(n.plus(&Nat::small(ones)))
                            } else {
                                Value::Text(format!("{n}{ones}"))
                            }
                        }
                        Some(v) => {
                            // digits read one by one ("one two", "oh seven")
                            let mut text = v.to_string();
                            if is_ten(prev) && ones < 10 {
                                // "twenty" wrote a 0 that this digit replaces
                                debug_assert!(text.ends_with('0'));
                                text.pop();
                            }
                            Value::Text(format!("{text}{ones}"))
                        }
                    });
                }
                OneSuffixed(ones, suffix) => {
                    let written = match self.value.take() {
                        None => format!("{ones}{suffix}"),
                        Some(Value::Int(n)) if !is_one(prev) => {
                            let zeros = if ones < 10 { 1 } else { 2 };
                            if n.divisible_by_pow10(zeros) {
                                format!("{}{suffix}", n.plus(&Nat::small(ones)))
                            } else {
                                format!("{n}{ones}{suffix}")
                            }
                        }
                        Some(v) => {
                            let mut text = v.to_string();
                            if is_ten(prev) && ones < 10 {
                                debug_assert!(text.ends_with('0'));
                                text.pop();
                            }
                            format!("{text}{ones}{suffix}")
                        }
                    };
                    self.emit(written);
                }
                Ten(tens) => {
                    self.value = Some(match self.value.take() {
                        None => Value::Int(Nat::small(tens)),
                        Some(Value::Text(t)) => Value::Text(format!("{t}{tens}")),
                        Some(Value::Int(n)) if n.divisible_by_pow10(2) => {
                            Value::Int(n.plus(&Nat::small(tens)))
                        }
                        Some(Value::Int(n)) => Value::Text(format!("{n}{tens}")),
                    });
                }
                TenSuffixed(tens, suffix) => {
                    let written = match self.value.take() {
                        None => format!("{tens}{suffix}"),
                        Some(Value::Text(t)) => format!("{t}{tens}{suffix}"),
                        Some(Value::Int(n)) if n.divisible_by_pow10(2) => {
                            format!("{}{suffix}", n.plus(&Nat::small(tens)))
                        }
                        Some(Value::Int(n)) => format!("{n}{tens}{suffix}"),
                    };
                    self.emit(written);
                }
                Multiplier(power) => match self.value.take() {
                    None => self.value = Some(Value::Int(Nat::small(1).shifted_up(power))),
                    Some(v @ Value::Text(_)) => self.multiply_fraction(v, power),
                    Some(Value::Int(n)) if n.is_zero() => self.multiply_fraction(Value::Int(n), power),
                    Some(Value::Int(n)) => {
                        self.value = Some(Value::Int(n.scale_last_thousand(power)));
                    }
                },
                MultiplierSuffixed(power, suffix) => {
                    match self.value.take() {
                        None => self.emit(format!("{}{suffix}", Nat::small(1).shifted_up(power))),
                        Some(v @ Value::Text(_)) => {
                            match v.fraction().and_then(|f| f.times_pow10(power)) {
                                Some(product) => self.emit(format!("{product}{suffix}")),
                                None => {
                                    self.emit(v.to_string());
                                    let multiplier = Nat::small(1).shifted_up(power);
                                    self.emit(format!("{multiplier}{suffix}"));
                                }
                            }
                        }
                        Some(Value::Int(n)) => {
                            self.emit(format!("{}{suffix}", n.scale_last_thousand(power)));
                        }
                    }
                    self.value = None;
                }
                Sign(sign) => {
                    self.flush();
                    if next_is_number_word || next_is_numeric {
                        self.prefix = Some(sign);
                    } else {
                        self.emit(current);
                    }
                }
                Currency(symbol) => {
                    if self.value.is_some() {
                        self.prefix = Some(symbol);
                        self.flush();
                    } else {
                        self.emit(current);
                    }
                }
                Per | Percent => match self.value.take() {
                    None => self.emit(current),
                    Some(v) if meaning == Percent => self.emit(format!("{v}%")),
                    Some(v) if next == Some("cent") => {
                        self.emit(format!("{v}%"));
                        skip = true;
                    }
                    Some(v) => {
                        self.emit(v.to_string());
                        self.emit(current);
                    }
                },
                And | Repeat(_) | Point if !next_is_number_word && !next_is_numeric => {
                    // only a number may follow for these to mean something
                    self.flush();
                    self.emit(current);
                }
                And => {
                    // "and" after hundred, thousand, … is part of the number
                    if !is_multiplier(prev) {
                        self.flush();
                        self.emit(current);
                    }
                }
                Repeat(times) => {
                    if is_one(next) || is_zero(next) {
                        let digit = match number_word(next) {
                            Some(One(ones)) => ones,
                            _ => 0,
                        };
                        let repeated = digit.to_string().repeat(times);
                        self.value = Some(Value::Text(self.value_text_or_empty() + &repeated));
                        skip = true;
                    } else {
                        self.flush();
                        self.emit(current);
                    }
                }
                Point => {
                    if is_decimal_word(next) || next_is_numeric {
                        self.value = Some(Value::Text(self.value_text_or_empty() + "."));
                    }
                }
            }
        }
        self.flush();
        self.out
    }

    /// `hundred`, `million`, … after a number kept as text (or 0): the product if it is an
    /// integer, else the number as it was followed by a new number, the multiplier.
    fn multiply_fraction(&mut self, value: Value, power: usize) {
        match value.fraction().and_then(|f| f.times_pow10(power)) {
            Some(product) => self.value = Some(Value::Int(product)),
            None => {
                self.value = Some(value);
                self.flush();
                self.value = Some(Value::Int(Nat::small(1).shifted_up(power)));
            }
        }
    }
}
