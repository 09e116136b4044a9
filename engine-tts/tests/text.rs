//! The text front end (`engine_tts::text::normalize`): each kind of written form, what passes
//! through unchanged, and (by proptest) that it never panics and leaves no digit to read.

use engine_tts::text::normalize;
use proptest::prelude::*;

/// Asserts that each written text reads as the spoken one.
fn reads(cases: &[(&str, &str)]) {
    for (written, spoken) in cases {
        assert_eq!(normalize(written), *spoken, "reading {written:?}");
    }
}

#[test]
fn cardinals() {
    reads(&[
        ("0", "zero"),
        ("7", "seven"),
        ("13", "thirteen"),
        ("42", "forty-two"),
        ("100", "one hundred"),
        ("101", "one hundred one"),
        ("1,234", "one thousand two hundred thirty-four"),
        (
            "1234567",
            "one million two hundred thirty-four thousand five hundred sixty-seven",
        ),
        ("1,000,000,000,000,000", "one quadrillion"),
        (
            "999,000,000,000,001",
            "nine hundred ninety-nine trillion one",
        ),
        ("I have 3 cats.", "I have three cats."),
    ]);
    let max = normalize("18446744073709551615");
    assert!(
        max.starts_with("eighteen quintillion four hundred forty-six quadrillion"),
        "{max}"
    );
}

#[test]
fn negatives_and_decimals() {
    reads(&[
        ("-5", "minus five"),
        ("It was -12 outside", "It was minus twelve outside"),
        ("(-3)", "(minus three)"),
        ("3.14", "three point one four"),
        ("0.5", "zero point five"),
        ("-2.75", "minus two point seven five"),
        ("a .5 chance", "a point five chance"),
        ("1,234.5", "one thousand two hundred thirty-four point five"),
        ("Version 2.0.", "Version two point zero."),
    ]);
}

#[test]
fn digit_by_digit_when_too_long_or_zero_led() {
    reads(&[
        ("007", "zero zero seven"),
        ("02139", "zero two one three nine"),
        ("123456789012345678901", "one two three four five six seven eight nine zero one two three four five six seven eight nine zero one"),
    ]);
    let huge = "9".repeat(5_000);
    assert_eq!(normalize(&huge).split(' ').count(), 5_000);
}

#[test]
fn years() {
    reads(&[
        ("1999", "nineteen ninety-nine"),
        ("2005", "two thousand five"),
        ("2000", "two thousand"),
        ("2024", "twenty twenty-four"),
        ("2010", "twenty ten"),
        ("1900", "nineteen hundred"),
        ("1905", "nineteen oh five"),
        ("1100", "eleven hundred"),
        ("In 1969, we", "In nineteen sixty-nine, we"),
        ("1099", "one thousand ninety-nine"),
        ("2100", "two thousand one hundred"),
        ("2,024", "two thousand twenty-four"),
        ("$2024", "two thousand twenty-four dollars"),
        ("2024 km", "two thousand twenty-four kilometers"),
        ("1500%", "one thousand five hundred percent"),
        ("1990-1995", "nineteen ninety to nineteen ninety-five"),
        ("500-1500", "five hundred to one thousand five hundred"),
    ]);
}

#[test]
fn ordinals_and_plurals() {
    reads(&[
        ("1st", "first"),
        ("2nd", "second"),
        ("3rd", "third"),
        ("4th", "fourth"),
        ("11th", "eleventh"),
        ("12th", "twelfth"),
        ("20th", "twentieth"),
        ("21st", "twenty-first"),
        ("100th", "one hundredth"),
        ("the 1,000,000th visitor", "the one millionth visitor"),
        ("the 1990s", "the nineteen nineties"),
        ("in her 80s", "in her eighties"),
        ("two 6s", "two sixes"),
    ]);
}

#[test]
fn times() {
    reads(&[
        ("3:30 pm", "three thirty p m"),
        ("10:05", "ten oh five"),
        ("12:00", "twelve o'clock"),
        ("14:00", "fourteen hundred"),
        ("16:45", "sixteen forty-five"),
        ("9:00 AM", "nine a m"),
        ("7 am", "seven a m"),
        ("7am", "seven a m"),
        ("at 7 a.m. today", "at seven a m today"),
        (
            "We left at 7 p.m. The end.",
            "We left at seven p m. The end.",
        ),
        ("John 3:16", "John three sixteen"),
        ("25:99", "twenty-five:ninety-nine"),
    ]);
}

#[test]
fn money() {
    reads(&[
        ("$12.50", "twelve dollars and fifty cents"),
        ("$1", "one dollar"),
        ("$0.99", "ninety-nine cents"),
        ("$0.01", "one cent"),
        ("$1.00", "one dollar"),
        ("$1,000", "one thousand dollars"),
        ("€5", "five euros"),
        ("£3.20", "three pounds and twenty pence"),
        ("¥500", "five hundred yen"),
        ("$2.5 million", "two point five million dollars"),
        ("$3bn", "three billion dollars"),
        ("-$5", "minus five dollars"),
        ("It costs $5.", "It costs five dollars."),
        ("$ alone", "$ alone"),
    ]);
}

#[test]
fn percent_and_units() {
    reads(&[
        ("45%", "forty-five percent"),
        ("2.5 %", "two point five percent"),
        ("21 °C", "twenty-one degrees Celsius"),
        ("21°C", "twenty-one degrees Celsius"),
        ("70 °F", "seventy degrees Fahrenheit"),
        ("90°", "ninety degrees"),
        ("5 km", "five kilometers"),
        ("1 km", "one kilometer"),
        ("3 kg", "three kilograms"),
        ("250 g", "two hundred fifty grams"),
        ("2 m", "two meters"),
        ("30 cm", "thirty centimeters"),
        ("5 mm", "five millimeters"),
        ("60 mph", "sixty miles per hour"),
        ("100 km/h", "one hundred kilometers per hour"),
        ("16GB", "sixteen gigabytes"),
        ("500 ms", "five hundred milliseconds"),
        ("10 s", "ten seconds"),
        ("1.5 l", "one point five liters"),
        ("5 miles", "five miles"),
        ("2 men", "two men"),
    ]);
}

#[test]
fn ranges_dashes_and_ampersands() {
    reads(&[
        ("3-5", "three to five"),
        ("pages 10–20", "pages ten to twenty"),
        ("3-5 km", "three to five kilometers"),
        ("10-20%", "ten to twenty percent"),
        ("2024-01-15", "January fifteenth, twenty twenty-four"),
        (
            "555-123-4567",
            "five five five, one two three, four five six seven",
        ),
        ("a 3-year-old", "a three-year-old"),
        ("COVID-19", "COVID-nineteen"),
        ("Tom & Jerry", "Tom and Jerry"),
        ("R&D", "R and D"),
        ("#1", "number one"),
        ("mp3", "mp three"),
    ]);
}

#[test]
fn abbreviations() {
    reads(&[
        ("Dr. Smith", "Doctor Smith"),
        ("Mr. and Mrs. Jones", "Mister and Missus Jones"),
        ("Ms. Lee", "Miz Lee"),
        ("Prof. Chen", "Professor Chen"),
        ("St. Louis", "Saint Louis"),
        ("We flew to St. Louis.", "We flew to Saint Louis."),
        ("on Elm St.", "on Elm Street."),
        (
            "123 Main St. Boston",
            "one hundred twenty-three Main Street. Boston",
        ),
        ("fruit, e.g. apples", "fruit, for example apples"),
        ("i.e. none", "that is none"),
        (
            "cats, dogs, etc. and more",
            "cats, dogs, et cetera and more",
        ),
        ("cats, dogs, etc. Then", "cats, dogs, et cetera. Then"),
        ("cats vs. dogs", "cats versus dogs"),
        ("approx. 5", "approximately five"),
        ("No. 5", "number five"),
        ("No. I won't.", "No. I won't."),
        ("Dr.Who", "Dr.Who"),
    ]);
}

#[test]
fn urls_and_email() {
    reads(&[
        ("https://www.example.com/docs", "example dot com slash docs"),
        (
            "See http://example.org/a-b_c?q=1.",
            "See example dot org slash a dash b underscore c question mark q equals one.",
        ),
        ("www.rust-lang.org/", "rust dash lang dot org"),
        ("(see example.com)", "(see example dot com)"),
        ("jane.doe@mail.org", "jane dot doe at mail dot org"),
        (
            "Write to bob42@work.co.uk, please",
            "Write to bob forty-two at work dot co dot uk, please",
        ),
        ("Node.js and e.g. this", "Node.js and for example this"),
    ]);
}

#[test]
fn passes_everything_else_through() {
    for text in [
        "",
        "Hello, world! How are you? Fine; thanks: really.",
        "naïve café — “quoted” text… 日本語 🙂",
        "tabs\tand\nnewlines\r\n",
        "\u{0}\u{7}\u{1b}[J",
        "a - b, c/d",
    ] {
        assert_eq!(normalize(text), text);
    }
}

#[test]
fn never_panics_on_long_or_odd_input() {
    let long = "Dr. Smith paid $12.50 at 3:30 pm on 2024-01-15, 🙂 e.g. ".repeat(200);
    assert!(!normalize(&long).bytes().any(|b| b.is_ascii_digit()));
    for text in [
        "$", "-", "-.", ".", "1,", "1,23", "12:", "12:3", "3-", "$-5", "€.5", "No.", "www.",
        "https://", "@", "a@", "°C", "5 °", "1e999", "−7",
    ] {
        assert!(
            !normalize(text).bytes().any(|b| b.is_ascii_digit()),
            "{text:?}"
        );
    }
    let odd: String = (0..10_000)
        .map(|k| char::from_u32(k * 7 % 0x3000).unwrap_or('?'))
        .collect();
    normalize(&odd);
}

/// A word or a number, as a proptest strategy.
fn word_or_number() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z]{1,10}",
        "-?[0-9]{1,30}",
        "[0-9]{1,3}(,[0-9]{3}){0,6}",
        "-?[0-9]{0,8}\\.[0-9]{1,6}",
        "[0-9]{1,4}(st|nd|rd|th|s|%| km| am|:[0-9]{2})",
        "[$€£¥][0-9]{1,9}(\\.[0-9]{1,3})?",
        "[0-9]{1,4}-[0-9]{1,4}(-[0-9]{1,4})?",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics(text in any::<String>()) {
        normalize(&text);
    }

    #[test]
    fn never_panics_on_likely_characters(text in "[0-9a-zA-Z $€£%:.,/@&#°'()\\-–−]{0,80}") {
        let spoken = normalize(&text);
        prop_assert!(!spoken.bytes().any(|b| b.is_ascii_digit()), "{:?} read as {:?}", text, spoken);
    }

    #[test]
    fn words_and_numbers_leave_no_digits(tokens in prop::collection::vec(word_or_number(), 0..12)) {
        let text = tokens.join(" ");
        let spoken = normalize(&text);
        prop_assert!(!spoken.bytes().any(|b| b.is_ascii_digit()), "{:?} read as {:?}", text, spoken);
    }
}
