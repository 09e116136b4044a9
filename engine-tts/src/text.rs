//! Text as it is spoken, for the voices that read text as written (Kokoro, Piper).
//!
//! [`normalize`] rewrites American English so that a voice reads it as a person would:
//!
//! - numbers: cardinals with or without thousands separators (up to 18,446,744,073,709,551,615;
//!   longer ones, and ones with a leading zero, digit by digit), negatives, decimals, years
//!   (a lone 1100–2099), ordinals ("21st"), plurals ("1990s"), ranges ("3-5"), ISO dates
//!   ("2024-01-15") and other groups of digits joined by dashes, such as telephone numbers;
//! - times ("3:30 pm", "10:05", "7 a.m."), money ("$12.50", "€5", "£3.20", "$2.5 million"),
//!   percent, and units after a number ("21 °C", "5 km", "100 km/h", "16GB");
//! - abbreviations ("Dr.", "St.", "e.g.", "No. 5", "#5"), "&", URLs and e-mail addresses.
//!
//! Everything else passes through as it is, punctuation included, so the voices still pause
//! at commas and sentence ends; an abbreviation's period stays where it also ends a sentence.
//! No ASCII digit is left for a voice to read: one that is part of none of the above is read
//! as a number.
//!
//! Not covered: other languages and locales (decimal commas, day-month order), fractions
//! ("1/2"), dates other than ISO ones ("1/2/2024"), seconds in times ("10:05:30"), Roman
//! numerals, telephone numbers with a single dash (read as a range), IP addresses, acronyms,
//! and symbols other than those above ("+", "=").

/// Words for 0 to 19.
#[rustfmt::skip]
const ONES: [&str; 20] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
];

/// Words for the tens, indexed by the tens digit (0 and 1 are unused).
const TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];

/// Names of the powers of a thousand, as far as a `u64` goes.
#[rustfmt::skip]
const SCALES: [&str; 7] =
    ["", "thousand", "million", "billion", "trillion", "quadrillion", "quintillion"];

#[rustfmt::skip]
const MONTHS: [&str; 12] = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
];

/// Units read after a number, attached ("5km") or after one space: symbol, one, many.
/// Where one symbol begins another ("km/h", "km"), the longer comes first.
#[rustfmt::skip]
const UNITS: &[(&str, &str, &str)] = &[
    ("km/h", "kilometer per hour", "kilometers per hour"),
    ("m/s", "meter per second", "meters per second"),
    ("°C", "degree Celsius", "degrees Celsius"),
    ("°F", "degree Fahrenheit", "degrees Fahrenheit"),
    ("°", "degree", "degrees"),
    ("mph", "mile per hour", "miles per hour"),
    ("km", "kilometer", "kilometers"), ("m", "meter", "meters"),
    ("cm", "centimeter", "centimeters"), ("mm", "millimeter", "millimeters"),
    ("mi", "mile", "miles"), ("ft", "foot", "feet"),
    ("kg", "kilogram", "kilograms"), ("g", "gram", "grams"), ("mg", "milligram", "milligrams"),
    ("lb", "pound", "pounds"), ("lbs", "pound", "pounds"), ("oz", "ounce", "ounces"),
    ("l", "liter", "liters"), ("L", "liter", "liters"),
    ("ml", "milliliter", "milliliters"), ("mL", "milliliter", "milliliters"),
    ("TB", "terabyte", "terabytes"), ("GB", "gigabyte", "gigabytes"),
    ("MB", "megabyte", "megabytes"),
    ("kB", "kilobyte", "kilobytes"), ("KB", "kilobyte", "kilobytes"),
    ("GHz", "gigahertz", "gigahertz"), ("MHz", "megahertz", "megahertz"),
    ("kHz", "kilohertz", "kilohertz"), ("Hz", "hertz", "hertz"),
    ("ms", "millisecond", "milliseconds"), ("min", "minute", "minutes"),
    ("hr", "hour", "hours"), ("hrs", "hour", "hours"),
];

/// Units read only after a space: attached, "5s" is the plural of five.
const SPACED_UNITS: &[(&str, &str, &str)] = &[("s", "second", "seconds")];

/// A currency sign before an amount, its unit, and its hundredth if it has one.
struct Currency {
    sign: char,
    one: &'static str,
    many: &'static str,
    minor: Option<(&'static str, &'static str)>,
}

#[rustfmt::skip]
const CURRENCIES: &[Currency] = &[
    Currency { sign: '$', one: "dollar", many: "dollars", minor: Some(("cent", "cents")) },
    Currency { sign: '€', one: "euro", many: "euros", minor: Some(("cent", "cents")) },
    Currency { sign: '£', one: "pound", many: "pounds", minor: Some(("penny", "pence")) },
    Currency { sign: '¥', one: "yen", many: "yen", minor: None },
];

/// Multipliers after an amount of money ("$2.5 million", "$3bn"): as written, as read.
#[rustfmt::skip]
const MONEY_SCALES: &[(&str, &str)] = &[
    (" thousand", "thousand"), (" million", "million"), (" billion", "billion"),
    (" trillion", "trillion"), ("k", "thousand"), ("K", "thousand"), ("m", "million"),
    ("M", "million"), ("mn", "million"), ("bn", "billion"),
];

/// Abbreviations read before what they name, so their period never ends a sentence.
#[rustfmt::skip]
const LEADING_ABBREVIATIONS: &[(&str, &str)] = &[
    ("Mr.", "Mister"), ("Mrs.", "Missus"), ("Ms.", "Miz"), ("Dr.", "Doctor"),
    ("Prof.", "Professor"), ("Gen.", "General"), ("Gov.", "Governor"), ("Sen.", "Senator"),
    ("Rep.", "Representative"), ("Capt.", "Captain"), ("Lt.", "Lieutenant"),
    ("Sgt.", "Sergeant"), ("Rev.", "Reverend"), ("Mt.", "Mount"),
    ("e.g.", "for example"), ("i.e.", "that is"), ("vs.", "versus"), ("approx.", "approximately"),
    ("Jan.", "January"), ("Feb.", "February"), ("Mar.", "March"), ("Apr.", "April"),
    ("Aug.", "August"), ("Sep.", "September"), ("Sept.", "September"), ("Oct.", "October"),
    ("Nov.", "November"), ("Dec.", "December"),
];

/// Abbreviations that may close a sentence: their period is kept when a new one follows.
#[rustfmt::skip]
const TRAILING_ABBREVIATIONS: &[(&str, &str)] = &[
    ("etc.", "et cetera"), ("Jr.", "Junior"), ("Sr.", "Senior"), ("Inc.", "Incorporated"),
    ("Ltd.", "Limited"), ("Corp.", "Corporation"), ("Ave.", "Avenue"), ("Blvd.", "Boulevard"),
    ("Rd.", "Road"),
];

/// "am" and "pm" as written after a time, as read.
#[rustfmt::skip]
const MERIDIEMS: &[(&str, &str)] = &[
    ("a.m.", "a m"), ("p.m.", "p m"), ("a.m", "a m"), ("p.m", "p m"), ("am", "a m"), ("pm", "p m"),
];

/// Symbols in URLs and e-mail addresses, as read; others are left out.
#[rustfmt::skip]
const ADDRESS_SYMBOLS: &[(char, &str)] = &[
    ('.', "dot"), ('/', "slash"), ('@', "at"), ('-', "dash"), ('_', "underscore"),
    (':', "colon"), ('?', "question mark"), ('=', "equals"), ('&', "and"), ('#', "hash"),
    ('%', "percent"), ('~', "tilde"), ('+', "plus"),
];

/// Top-level domains that make a bare "name.tld" an address.
const DOMAINS: &[&str] = &["com", "org", "net", "edu", "gov", "io"];

/// Punctuation after an address that belongs to the sentence, not to the address.
const CLOSING_PUNCTUATION: &[char] = &['.', ',', ';', ':', '!', '?', ')', ']', '}', '"', '\'', '>'];

/// The longest run without a space that may be an address; longer ones are not looked at.
const MAX_ADDRESS_LEN: usize = 256;

/// What a reader makes of the text at a position: the words, and where the written form ends.
type Reading = Option<(String, usize)>;

/// Text as it is spoken: numbers, times, money, units, abbreviations, URLs and e-mail addresses in words.
///
/// American English; the [module documentation](self) lists what is read and what is not.
/// Everything else is kept as it is. Never panics.
pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 2);
    let mut i = 0;
    while let Some(c) = text[i..].chars().next() {
        match read_at(text, i) {
            Some((spoken, end)) if end > i => {
                push_spoken(&mut out, &spoken, &text[end..]);
                i = end;
            }
            _ => {
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

/// Appends words, with a space on each side where they would touch a letter or digit.
fn push_spoken(out: &mut String, spoken: &str, after: &str) {
    if out.ends_with(char::is_alphanumeric) {
        out.push(' ');
    }
    out.push_str(spoken);
    if after.starts_with(char::is_alphanumeric) {
        out.push(' ');
    }
}

/// Whatever is written at byte `i` that is read otherwise than as written.
fn read_at(text: &str, i: usize) -> Reading {
    let rest = &text[i..];
    if !text[..i].ends_with(char::is_alphanumeric) {
        if let Some(reading) = read_address(text, i).or_else(|| read_abbreviation(text, i)) {
            return Some(reading);
        }
    }
    if rest.starts_with('&') {
        return Some(("and".to_string(), i + 1));
    }
    if rest.starts_with('#') && rest[1..].starts_with(is_digit) {
        return Some(("number".to_string(), i + 1));
    }
    read_money(text, i).or_else(|| read_numeric(text, i))
}

fn is_digit(c: char) -> bool {
    c.is_ascii_digit()
}

/// The length in bytes of the start of `s` whose characters all satisfy `keep`.
fn prefix_len(s: &str, keep: impl Fn(char) -> bool) -> usize {
    s.find(|c| !keep(c)).unwrap_or(s.len())
}

/// `s` without `prefix`, compared without regard to ASCII case.
fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// `s` without `word`, where `word` is not followed by a letter or digit.
fn strip_word<'a>(s: &'a str, word: &str) -> Option<&'a str> {
    s.strip_prefix(word)
        .filter(|rest| !rest.starts_with(char::is_alphanumeric))
}

/// Whether a period before `after` also ends a sentence: nothing follows, or a capital does.
fn ends_sentence(after: &str) -> bool {
    let next = after.trim_start();
    next.is_empty() || (next.len() < after.len() && next.starts_with(char::is_uppercase))
}

/// `words`, with a period where the one read with them also ended a sentence.
fn keep_period(words: &str, after: &str) -> String {
    if ends_sentence(after) {
        format!("{words}.")
    } else {
        words.to_string()
    }
}

/// `count` and the unit after it, singular or plural: "one dollar", "fifty cents".
fn counted(count: u64, one: &str, many: &str) -> String {
    format!(
        "{} {}",
        cardinal(count),
        if count == 1 { one } else { many }
    )
}

// ---------------------------------------------------------------------------------------------
// Number words

/// 0 to 99 in words.
fn below_hundred(n: u64) -> String {
    let (tens, ones) = ((n / 10) as usize, (n % 10) as usize);
    match (tens, ones) {
        (0 | 1, _) => ONES[n as usize].to_string(),
        (_, 0) => TENS[tens].to_string(),
        _ => format!("{}-{}", TENS[tens], ONES[ones]),
    }
}

/// 1 to 999 in words.
fn below_thousand(n: u64) -> String {
    let (hundreds, rest) = (n / 100, n % 100);
    match (hundreds, rest) {
        (0, _) => below_hundred(rest),
        (_, 0) => format!("{} hundred", ONES[hundreds as usize]),
        _ => format!(
            "{} hundred {}",
            ONES[hundreds as usize],
            below_hundred(rest)
        ),
    }
}

/// A whole number in words: 1234 is "one thousand two hundred thirty-four".
fn cardinal(n: u64) -> String {
    if n == 0 {
        return ONES[0].to_string();
    }
    let mut groups = Vec::new();
    let (mut rest, mut scale) = (n, 0);
    while rest > 0 {
        let group = rest % 1000;
        if group > 0 {
            let words = below_thousand(group);
            groups.push(if scale == 0 {
                words
            } else {
                format!("{words} {}", SCALES[scale])
            });
        }
        rest /= 1000;
        scale += 1;
    }
    groups.reverse();
    groups.join(" ")
}

/// Each digit in words: "07" is "zero seven".
fn digit_words(digits: &str) -> String {
    let words: Vec<&str> = digits
        .bytes()
        .filter(u8::is_ascii_digit)
        .map(|b| ONES[usize::from(b - b'0')])
        .collect();
    words.join(" ")
}

/// A string of digits in words: as a number, or digit by digit if it has a leading zero
/// or is too long to name.
fn integer_words(digits: &str) -> String {
    if digits.len() > 1 && digits.starts_with('0') {
        return digit_words(digits);
    }
    digits
        .parse()
        .map_or_else(|_| digit_words(digits), cardinal)
}

/// A year in words: 1999 is "nineteen ninety-nine", 2005 "two thousand five",
/// 1905 "nineteen oh five".
fn year(n: u64) -> String {
    let (century, rest) = (n / 100, n % 100);
    match rest {
        _ if (2000..2010).contains(&n) => cardinal(n),
        0 => format!("{} hundred", below_hundred(century)),
        1..=9 => format!("{} oh {}", below_hundred(century), ONES[rest as usize]),
        _ => format!("{} {}", below_hundred(century), below_hundred(rest)),
    }
}

/// `words` with its last word (after a space or hyphen) changed by `change`.
fn change_last_word(words: &str, change: impl Fn(&str) -> String) -> String {
    let split = words.rfind([' ', '-']).map_or(0, |k| k + 1);
    format!("{}{}", &words[..split], change(&words[split..]))
}

/// An ordinal in words: 21 is "twenty-first".
fn ordinal(n: u64) -> String {
    change_last_word(&cardinal(n), |word| match word {
        "one" => "first".to_string(),
        "two" => "second".to_string(),
        "three" => "third".to_string(),
        "five" => "fifth".to_string(),
        "eight" => "eighth".to_string(),
        "nine" => "ninth".to_string(),
        "twelve" => "twelfth".to_string(),
        _ => match word.strip_suffix('y') {
            Some(stem) => format!("{stem}ieth"),
            None => format!("{word}th"),
        },
    })
}

/// Number words in the plural: "nineteen ninety" becomes "nineteen nineties".
fn plural(words: &str) -> String {
    change_last_word(words, |word| match word.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None if word.ends_with(['s', 'x']) => format!("{word}es"),
        None => format!("{word}s"),
    })
}

// ---------------------------------------------------------------------------------------------
// Numbers as written

/// A number as written: sign, whole part (digits only), fraction, and where it ends.
struct Number {
    negative: bool,
    whole: String,
    fraction: Option<String>,
    /// Written with thousands separators ("1,234").
    grouped: bool,
    end: usize,
}

impl Number {
    /// A whole number without sign.
    fn is_plain(&self) -> bool {
        !self.negative && self.fraction.is_none()
    }

    fn value(&self) -> Option<u64> {
        self.whole.parse().ok()
    }

    /// Exactly one, so a unit after it is singular.
    fn is_one(&self) -> bool {
        self.whole == "1" && self.fraction.is_none()
    }

    /// A lone four-digit number from 1100 to 2099, read as a year.
    fn is_year(&self) -> bool {
        let year_like = self.is_plain() && !self.grouped && self.whole.len() == 4;
        year_like && self.value().is_some_and(|n| (1100..=2099).contains(&n))
    }

    /// A number that can be an hour before "am" or "pm".
    fn is_hour(&self) -> bool {
        self.is_plain()
            && self.whole.len() <= 2
            && self.value().is_some_and(|n| (1..=12).contains(&n))
    }
}

/// Whether a minus sign or a bare decimal point at byte `i` may begin a number: it stands
/// at the start, after a space or after an opening bracket.
fn may_begin_number(text: &str, i: usize) -> bool {
    text[..i]
        .chars()
        .next_back()
        .is_none_or(|c| c.is_whitespace() || "([{".contains(c))
}

/// `s` without a leading minus sign (hyphen or U+2212).
fn strip_minus(s: &str) -> Option<&str> {
    s.strip_prefix(['-', '−'])
}

/// The three digits of a thousands group (",234") at the start of `s`.
fn thousands_group(s: &str) -> Option<&str> {
    let digits = s.strip_prefix(',')?.get(..3)?;
    let whole_group = digits.bytes().all(|b| b.is_ascii_digit()) && !s[4..].starts_with(is_digit);
    whole_group.then_some(digits)
}

/// The number written at byte `i`: "-1,234.5", "3.14", ".5", "007".
fn parse_number(text: &str, i: usize) -> Option<Number> {
    let signed = strip_minus(&text[i..]).filter(|_| may_begin_number(text, i));
    let mut at = text.len() - signed.unwrap_or(&text[i..]).len();
    let lead = prefix_len(&text[at..], is_digit);
    let mut whole = text[at..at + lead].to_string();
    at += lead;
    let mut grouped = false;
    while let Some(group) = thousands_group(&text[at..]).filter(|_| (1..=3).contains(&lead)) {
        whole.push_str(group);
        at += 4;
        grouped = true;
    }
    let fraction = text[at..]
        .strip_prefix('.')
        .map(|after| &after[..prefix_len(after, is_digit)]);
    let fraction = fraction.filter(|f| !f.is_empty()).map(str::to_string);
    if let Some(f) = &fraction {
        at += 1 + f.len();
    }
    let bare_point = whole.is_empty() && (fraction.is_none() || !may_begin_number(text, i));
    (!bare_point).then_some(Number {
        negative: signed.is_some(),
        whole,
        fraction,
        grouped,
        end: at,
    })
}

/// A number read as a number: "minus three point one four".
fn say_number(n: &Number) -> String {
    let mut words = Vec::new();
    if n.negative {
        words.push("minus".to_string());
    }
    if !n.whole.is_empty() {
        words.push(integer_words(&n.whole));
    }
    if let Some(fraction) = &n.fraction {
        words.push(format!("point {}", digit_words(fraction)));
    }
    words.join(" ")
}

/// A number read as a year if it looks like one, else as a number.
fn say_number_or_year(n: &Number) -> String {
    match n.value().filter(|_| n.is_year()) {
        Some(y) => year(y),
        None => say_number(n),
    }
}

/// A number at byte `i`, with what is read with it: a time, an ordinal suffix, a dash and
/// more numbers, a unit and so on.
fn read_numeric(text: &str, i: usize) -> Reading {
    let first = parse_number(text, i)?;
    read_time(text, &first)
        .or_else(|| read_ordinal(text, &first))
        .or_else(|| read_dashed(text, &first))
        .or_else(|| Some(read_quantity(text, &first)))
}

/// A time after its hour: "3:30 pm" is "three thirty p m", "12:00" "twelve o'clock".
fn read_time(text: &str, hour: &Number) -> Reading {
    let h = hour
        .value()
        .filter(|&h| hour.is_plain() && hour.whole.len() <= 2 && h <= 23)?;
    let minutes = text[hour.end..].strip_prefix(':')?.get(..2)?;
    let m: u64 = minutes
        .parse()
        .ok()
        .filter(|&m| m < 60 && minutes.bytes().all(|b| b.is_ascii_digit()))?;
    let end = hour.end + 3;
    if text[end..].starts_with(is_digit) {
        return None;
    }
    let meridiem = read_meridiem(text, end);
    let clock = match (m, &meridiem) {
        (0, Some(_)) => cardinal(h),
        (0, None) if (1..=12).contains(&h) => format!("{} o'clock", cardinal(h)),
        (0, None) => format!("{} hundred", cardinal(h)),
        (1..=9, _) => format!("{} oh {}", cardinal(h), cardinal(m)),
        _ => format!("{} {}", cardinal(h), cardinal(m)),
    };
    Some(match meridiem {
        Some((words, end)) => (format!("{clock} {words}"), end),
        None => (clock, end),
    })
}

/// "am" or "pm" at byte `at`, after at most one space.
fn read_meridiem(text: &str, at: usize) -> Reading {
    let after = &text[at..];
    let spaced = after.strip_prefix(' ').unwrap_or(after);
    MERIDIEMS.iter().find_map(|(written, words)| {
        let rest =
            strip_prefix_ci(spaced, written).filter(|r| !r.starts_with(char::is_alphanumeric))?;
        let words = if written.ends_with('.') {
            keep_period(words, rest)
        } else {
            words.to_string()
        };
        Some((words, text.len() - rest.len()))
    })
}

/// An ordinal written with its suffix: "21st", "100th".
fn read_ordinal(text: &str, n: &Number) -> Reading {
    let value = n.value().filter(|_| n.is_plain())?;
    let after = &text[n.end..];
    let suffix = after.get(..2)?;
    let rest = &after[2..];
    let is_suffix = ["st", "nd", "rd", "th"]
        .iter()
        .any(|s| suffix.eq_ignore_ascii_case(s));
    (is_suffix && !rest.starts_with(char::is_alphanumeric))
        .then(|| (ordinal(value), text.len() - rest.len()))
}

/// Three or more groups of digits joined by dashes: an ISO date ("2024-01-15" is "January
/// fifteenth, twenty twenty-four"), or else group by group, digit by digit ("555-123-4567").
fn read_dashed(text: &str, first: &Number) -> Reading {
    if !first.is_plain() || first.grouped {
        return None;
    }
    let mut groups = vec![first.whole.as_str()];
    let mut end = first.end;
    while let Some(after) = text[end..].strip_prefix('-') {
        let len = prefix_len(after, is_digit);
        if len == 0 {
            break;
        }
        groups.push(&after[..len]);
        end += 1 + len;
    }
    if groups.len() < 3 {
        return None;
    }
    let by_digits = || {
        groups
            .iter()
            .map(|g| digit_words(g))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some((iso_date(&groups).unwrap_or_else(by_digits), end))
}

/// A date written year-month-day, in words.
fn iso_date(groups: &[&str]) -> Option<String> {
    let [y, m, d] = groups else { return None };
    if (y.len(), m.len(), d.len()) != (4, 2, 2) {
        return None;
    }
    let (y, m, d): (u64, usize, u64) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if (1100..=2099).contains(&y) {
        year(y)
    } else {
        cardinal(y)
    };
    Some(format!("{} {}, {y}", MONTHS[m - 1], ordinal(d)))
}

/// A number or a range of two ("3-5" is "three to five"), with "%", a unit, "am"/"pm" or a
/// plural "s" after it. A number before a unit or "%" is not read as a year, nor is one of a
/// range unless both are years ("1990-1995").
fn read_quantity(text: &str, first: &Number) -> (String, usize) {
    let second = range_end(text, first);
    let last = second.as_ref().unwrap_or(first);
    let suffix = read_percent(text, last)
        .or_else(|| read_unit(text, last))
        .or_else(|| {
            last.is_hour()
                .then(|| read_meridiem(text, last.end))
                .flatten()
        });
    let years = suffix.is_none()
        && second
            .as_ref()
            .is_none_or(|_| first.is_year() && last.is_year());
    let say = if years {
        say_number_or_year
    } else {
        say_number
    };
    let plural_s = last.is_plain() && strip_word(&text[last.end..], "s").is_some();
    let (words, end) = match suffix {
        Some((suffix, end)) => (format!("{} {suffix}", say(last)), end),
        None if plural_s => (plural(&say(last)), last.end + 1),
        None => (say(last), last.end),
    };
    match second {
        Some(_) => (format!("{} to {words}", say(first)), end),
        None => (words, end),
    }
}

/// The second number of a range: a dash and digits right after the first.
fn range_end(text: &str, first: &Number) -> Option<Number> {
    let after = text[first.end..].strip_prefix(['-', '–'])?;
    if !after.starts_with(is_digit) {
        return None;
    }
    parse_number(text, text.len() - after.len())
}

/// "%" after a number, with or without a space.
fn read_percent(text: &str, n: &Number) -> Reading {
    let after = &text[n.end..];
    let rest = after.strip_prefix(' ').unwrap_or(after).strip_prefix('%')?;
    Some(("percent".to_string(), text.len() - rest.len()))
}

/// A unit after a number, singular after exactly one.
fn read_unit(text: &str, n: &Number) -> Reading {
    let after = &text[n.end..];
    let spaced = after.strip_prefix([' ', '\u{a0}']);
    let spaced_units = if spaced.is_some() { SPACED_UNITS } else { &[] };
    let s = spaced.unwrap_or(after);
    UNITS
        .iter()
        .chain(spaced_units)
        .find_map(|&(symbol, one, many)| {
            let rest = strip_word(s, symbol)?;
            let words = if n.is_one() { one } else { many };
            Some((words.to_string(), text.len() - rest.len()))
        })
}

// ---------------------------------------------------------------------------------------------
// Money

/// An amount of money at byte `i`: "$12.50", "-€5", "$2.5 million".
fn read_money(text: &str, i: usize) -> Reading {
    let rest = &text[i..];
    let signed = strip_minus(rest).filter(|_| may_begin_number(text, i));
    let unsigned = signed.unwrap_or(rest);
    let sign = unsigned.chars().next()?;
    let currency = CURRENCIES.iter().find(|c| c.sign == sign)?;
    let start = text.len() - unsigned.len() + sign.len_utf8();
    if !text[start..].starts_with(is_digit) {
        return None;
    }
    let amount = parse_number(text, start)?;
    let scale = MONEY_SCALES.iter().find_map(|(written, read)| {
        strip_word(&text[amount.end..], written).map(|rest| (*read, text.len() - rest.len()))
    });
    let (words, end) = match scale {
        Some((scale, end)) => (
            format!("{} {scale} {}", say_number(&amount), currency.many),
            end,
        ),
        None => (say_amount(&amount, currency), amount.end),
    };
    let words = if signed.is_some() {
        format!("minus {words}")
    } else {
        words
    };
    Some((words, end))
}

/// An amount in a currency: "twelve dollars and fifty cents", "ninety-nine cents".
fn say_amount(amount: &Number, currency: &Currency) -> String {
    let minor = match (&amount.fraction, currency.minor) {
        (None, _) => Some(0),
        (Some(f), Some(_)) if f.len() <= 2 => format!("{f:0<2}").parse().ok(),
        _ => None,
    };
    let (Some(whole), Some(minor)) = (amount.value(), minor) else {
        return format!("{} {}", say_number(amount), currency.many);
    };
    let major = counted(whole, currency.one, currency.many);
    match currency.minor {
        Some((one, many)) if minor > 0 && whole == 0 => counted(minor, one, many),
        Some((one, many)) if minor > 0 => format!("{major} and {}", counted(minor, one, many)),
        _ => major,
    }
}

// ---------------------------------------------------------------------------------------------
// Abbreviations

/// An abbreviation at byte `i`, at the start of a word.
fn read_abbreviation(text: &str, i: usize) -> Reading {
    let rest = &text[i..];
    if let Some(after) = rest
        .strip_prefix("No.")
        .filter(|a| a.trim_start().starts_with(is_digit))
    {
        return Some(("number".to_string(), text.len() - after.len()));
    }
    if let Some(after) = strip_word(rest, "St.") {
        let words = if is_saint(&text[..i], after) {
            "Saint".to_string()
        } else {
            keep_period("Street", after)
        };
        return Some((words, text.len() - after.len()));
    }
    let find = |table: &[(&str, &'static str)]| {
        table
            .iter()
            .find_map(|&(written, read)| strip_word(rest, written).map(|after| (read, after)))
    };
    let (words, after) = match find(LEADING_ABBREVIATIONS) {
        Some((read, after)) => (read.to_string(), after),
        None => {
            find(TRAILING_ABBREVIATIONS).map(|(read, after)| (keep_period(read, after), after))?
        }
    };
    Some((words, text.len() - after.len()))
}

/// Whether "St." between `before` and `after` is "Saint": a capitalized name follows it, and it
/// does not itself follow a capitalized word within a sentence ("Main St. Boston").
fn is_saint(before: &str, after: &str) -> bool {
    let name_follows = after.starts_with(char::is_whitespace)
        && after.trim_start().starts_with(char::is_uppercase);
    let before = before.trim_end();
    let word = before.rsplit(char::is_whitespace).next().unwrap_or("");
    let earlier = before[..before.len() - word.len()].trim_end();
    let follows_name = word.starts_with(char::is_uppercase)
        && !earlier.is_empty()
        && !earlier.ends_with(['.', '!', '?']);
    name_follows && !follows_name
}

// ---------------------------------------------------------------------------------------------
// URLs and e-mail addresses

/// A URL ("https://…", "www.…", "example.com") or an e-mail address at byte `i`.
fn read_address(text: &str, i: usize) -> Reading {
    let rest = &text[i..];
    let token = rest
        .chars()
        .take_while(|c| !c.is_whitespace())
        .take(MAX_ADDRESS_LEN + 1);
    let (chars, token_len) = token.fold((0, 0), |(n, len), c| (n + 1, len + c.len_utf8()));
    if chars > MAX_ADDRESS_LEN {
        return None;
    }
    let token = rest[..token_len].trim_end_matches(CLOSING_PUNCTUATION);
    let after_scheme = ["https://", "http://"]
        .iter()
        .find_map(|s| strip_prefix_ci(token, s));
    let after_www = strip_prefix_ci(after_scheme.unwrap_or(token), "www.");
    let words = match after_www.or(after_scheme) {
        Some(address) => say_address(address.trim_end_matches('/')),
        None if is_email(token) => {
            let (user, host) = token.split_once('@')?;
            format!("{} at {}", say_address(user), say_address(host))
        }
        None if is_domain(token) => say_address(token),
        None => return None,
    };
    (!words.is_empty()).then(|| (words, i + token.len()))
}

/// Whether `host` is a host name: two or more dot-separated labels, the last of letters.
fn is_host(host: &str) -> bool {
    let labels: Vec<&str> = host.split('.').collect();
    let label_ok = |l: &&str| !l.is_empty() && l.chars().all(|c| c.is_alphanumeric() || c == '-');
    let tld_ok = labels
        .last()
        .is_some_and(|l| l.len() >= 2 && l.chars().all(char::is_alphabetic));
    labels.len() >= 2 && labels.iter().all(label_ok) && tld_ok
}

fn is_email(token: &str) -> bool {
    let Some((user, host)) = token.split_once('@') else {
        return false;
    };
    let user_ok = !user.is_empty()
        && user
            .chars()
            .all(|c| c.is_alphanumeric() || "._%+-".contains(c));
    user_ok && is_host(host)
}

/// Whether `token` is a host name in one of [`DOMAINS`], perhaps with a path: "example.com/docs".
fn is_domain(token: &str) -> bool {
    let host = token.split('/').next().unwrap_or("");
    is_host(host)
        && host
            .rsplit('.')
            .next()
            .is_some_and(|tld| DOMAINS.contains(&tld))
}

/// An address in words: "example.com/docs" is "example dot com slash docs".
fn say_address(address: &str) -> String {
    let mut words = Vec::new();
    let mut rest = address;
    while let Some(c) = rest.chars().next() {
        let len = if c.is_ascii_digit() {
            let len = prefix_len(rest, is_digit);
            words.push(integer_words(&rest[..len]));
            len
        } else if c.is_alphanumeric() {
            let len = prefix_len(rest, |c| c.is_alphanumeric() && !c.is_ascii_digit());
            words.push(rest[..len].to_string());
            len
        } else {
            if let Some((_, name)) = ADDRESS_SYMBOLS.iter().find(|(symbol, _)| *symbol == c) {
                words.push(name.to_string());
            }
            c.len_utf8()
        };
        rest = &rest[len..];
    }
    words.join(" ")
}

/// The word builders; `tests/text.rs` tests [`normalize`] on each kind of written form.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cardinals_to_u64_max() {
        assert_eq!(cardinal(0), "zero");
        assert_eq!(cardinal(1_234), "one thousand two hundred thirty-four");
        assert_eq!(cardinal(1_000_000_000_000_000), "one quadrillion");
        assert_eq!(cardinal(u64::MAX).split(' ').next(), Some("eighteen"));
        assert_eq!(integer_words("007"), "zero zero seven");
        assert_eq!(integer_words(&"1".repeat(21)).split(' ').count(), 21);
    }

    #[test]
    fn years_ordinals_and_plurals() {
        assert_eq!(year(1999), "nineteen ninety-nine");
        assert_eq!(year(2005), "two thousand five");
        assert_eq!(year(2024), "twenty twenty-four");
        assert_eq!(year(1900), "nineteen hundred");
        assert_eq!(ordinal(12), "twelfth");
        assert_eq!(ordinal(21), "twenty-first");
        assert_eq!(ordinal(40), "fortieth");
        assert_eq!(ordinal(100), "one hundredth");
        assert_eq!(plural("nineteen ninety"), "nineteen nineties");
        assert_eq!(plural("six"), "sixes");
    }
}
