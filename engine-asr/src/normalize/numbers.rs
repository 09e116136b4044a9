//! Whisper's `EnglishNumberNormalizer`: spelled-out numbers written as digits (see the parent
//! module for the rules and the reference's quirks kept on purpose).

use std::fmt;

use super::*;

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
        if first_digit
            .chars()
            .next()
            .is_none_or(|c| decimal_digit(c).is_none())
        {
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
pub(super) fn normalize_numbers(s: &str) -> String {
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
                    Some(Value::Int(n)) if n.is_zero() => {
                        self.multiply_fraction(Value::Int(n), power);
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_arithmetic() {
        assert_eq!(Nat::small(999).plus(&Nat::small(1)).to_string(), "1000");
        assert_eq!(Nat::from_digits("0007").to_string(), "7");
        assert_eq!(Nat::from_digits("000").to_string(), "0");
        assert_eq!(
            Nat::small(1500).scale_last_thousand(6).to_string(),
            "500001000"
        );
        assert_eq!(Nat::small(1100).scale_last_thousand(2).to_string(), "11000");
        assert!(Nat::small(1200).divisible_by_pow10(2));
        assert!(!Nat::small(1200).divisible_by_pow10(3));
        assert!(Nat::zero().divisible_by_pow10(5));
        let half = Decimal::parse(".5").unwrap();
        assert_eq!(half.times_pow10(1).unwrap().to_string(), "5");
        assert!(half.times_pow10(0).is_none());
        assert!(Decimal::parse("1.2.3").is_none());
        assert!(Decimal::parse(".").is_none());
    }
}
