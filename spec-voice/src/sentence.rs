//! Sentence boundaries, for handing an answer to speech synthesis one sentence at a time.
//!
//! A sentence ends at `.`, `?`, `!` or `…` (a run of them, as in `?!` or `...`), optionally
//! followed by closing quotes or brackets, and then whitespace or the end of the text. The CJK
//! terminators `。`, `？` and `！` end a sentence even without whitespace after them. A blank line
//! after text without a terminator (a Markdown heading or list item) ends a sentence too.
//!
//! A `.` does not end a sentence after a common abbreviation (`Mr.`, `e.g.`, `etc.` in the middle
//! of the text), after initials in a run (`J. K. Rowling`) or a dotted initialism
//! (`U.S.`), in a numbered-list marker (`1. ` at the start of a line), or between digits. While
//! more text may follow, a `.` right after a digit at the end of the text is held back (it may be
//! a decimal point), as is one after an abbreviation or a single letter; after an ordinary word it
//! ends the sentence at once, so that speech can start without waiting for the next token.
//! A candidate sentence with no letter or digit (`...`, `!`) merges into the next one.

/// Terminators that end a sentence only when whitespace or the end of the text follows.
fn is_western_terminator(c: char) -> bool {
    matches!(c, '.' | '?' | '!' | '…')
}

/// Terminators that end a sentence whatever follows.
fn is_cjk_terminator(c: char) -> bool {
    matches!(c, '。' | '？' | '！')
}

fn is_terminator(c: char) -> bool {
    is_western_terminator(c) || is_cjk_terminator(c)
}

/// Closing quotes and brackets that belong to the sentence they follow.
fn is_closer(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | '”' | '’' | ')' | ']' | '»' | '」' | '』' | '）'
    )
}

/// Opening quotes and brackets that may precede a word.
fn is_opener(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | '“' | '‘' | '(' | '[' | '«' | '「' | '『' | '（'
    )
}

/// Abbreviations written in lower case (also accepted capitalised or in capitals).
const LOWER_ABBREVIATIONS: [&str; 6] = ["vs", "etc", "e.g", "i.e", "approx", "cf"];

/// Abbreviations of titles and names, matched exactly (`fig.` in lower case is a fruit).
const TITLE_ABBREVIATIONS: [&str; 9] = ["Mr", "Mrs", "Ms", "Dr", "Prof", "Sr", "Jr", "St", "Fig"];

/// Byte offset just past the first complete sentence of `text` (terminator and any closing
/// quotes/brackets included; leading whitespace of the text belongs to the sentence), or None.
/// `complete` = true when no more text will follow (end of answer).
///
/// The offset is always on a character boundary. A sentence ended by a blank line stops just
/// before the line break.
pub fn first_sentence_end(text: &str, complete: bool) -> Option<usize> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let byte_at = |i: usize| chars.get(i).map_or(text.len(), |&(pos, _)| pos);
    let mut has_content = false;
    let mut i = 0;
    while let Some(&(pos, c)) = chars.get(i) {
        if is_terminator(c) {
            let run_end = (i..chars.len())
                .find(|&j| !is_terminator(chars[j].1))
                .unwrap_or(chars.len());
            let close_end = (run_end..chars.len())
                .find(|&j| !is_closer(chars[j].1))
                .unwrap_or(chars.len());
            let at_end = close_end == chars.len();
            let cjk = chars[i..run_end].iter().any(|&(_, t)| is_cjk_terminator(t));
            let separated = cjk || at_end || chars[close_end].1.is_whitespace();
            let single_period = c == '.' && run_end == i + 1;
            let ends = separated
                && has_content
                && (!single_period
                    || period_ends(text, pos, run_end == chars.len(), at_end, complete));
            if ends {
                return Some(byte_at(close_end));
            }
            i = run_end;
            continue;
        }
        if c == '\n' && has_content && blank_line_follows(&chars[i + 1..]) {
            return Some(pos);
        }
        has_content |= c.is_alphanumeric();
        i += 1;
    }
    None
}

/// Whether the characters after a line break complete a blank line (only spaces, tabs or
/// carriage returns before the next line break).
fn blank_line_follows(rest: &[(usize, char)]) -> bool {
    rest.iter()
        .find(|&&(_, c)| !matches!(c, ' ' | '\t' | '\r'))
        .is_some_and(|&(_, c)| c == '\n')
}

/// Whether a lone `.` at byte `dot`, already followed by whitespace or the end of the text,
/// ends a sentence. `dot_is_last`: nothing at all follows the `.`; `at_end`: only closing quotes
/// or brackets follow it.
fn period_ends(text: &str, dot: usize, dot_is_last: bool, at_end: bool, complete: bool) -> bool {
    if at_end && complete {
        return true;
    }
    let before = &text[..dot];
    let word_start = before
        .char_indices()
        .rev()
        .find(|&(_, c)| c.is_whitespace())
        .map_or(0, |(pos, c)| pos + c.len_utf8());
    let word = before[word_start..].trim_start_matches(is_opener);
    let next_word = text[dot + 1..]
        .trim_start()
        .split(char::is_whitespace)
        .next()
        .unwrap_or_default();
    let previous_word = text[..word_start]
        .trim_end()
        .rsplit(char::is_whitespace)
        .next()
        .unwrap_or_default();
    let next = next_word.chars().next();
    if is_abbreviation(word, next, at_end) || is_initial(word, previous_word, next_word, at_end) {
        return false;
    }
    let numeric = !word.is_empty() && word.chars().all(|c| c.is_ascii_digit());
    if numeric && starts_line(&text[..word_start]) {
        return false;
    }
    let after_digit = word.chars().next_back().is_some_and(|c| c.is_ascii_digit());
    !(dot_is_last && !complete && after_digit)
}

/// Whether `word` (the text before a `.`) is an abbreviation. `next` is the first character of
/// the following word; `at_end` means none has arrived yet.
fn is_abbreviation(word: &str, next: Option<char>, at_end: bool) -> bool {
    let lower = word.to_lowercase();
    if LOWER_ABBREVIATIONS.contains(&lower.as_str()) || TITLE_ABBREVIATIONS.contains(&word) {
        return true;
    }
    // "No. 5": only before a number, as "No." is also an answer.
    word == "No" && (at_end || next.is_some_and(|c| c.is_ascii_digit()))
}

/// Whether `word` is an initial in a run of initials (`J` in `J. K. Rowling`, with a `previous`
/// or `next` word that is one too), a dotted initialism (`U.S`, `e.g`), or, when nothing has
/// followed it yet (`at_end`), any single letter (the `i` of `i.e.`, or the first of a run). A
/// lone capital is a sentence's last word more often than a name's initial in an assistant's
/// answers ("A is the grandfather of C. Therefore …", "vitamin C. It …").
fn is_initial(word: &str, previous: &str, next: &str, at_end: bool) -> bool {
    let single_capital = |w: &str| {
        let mut chars = w.chars();
        matches!((chars.next(), chars.next()), (Some(c), None) if c.is_uppercase())
    };
    let mut chars = word.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        let in_run = |w: &str| w.strip_suffix('.').is_some_and(single_capital);
        return (c.is_uppercase() && (in_run(previous) || in_run(next)))
            || (at_end && c.is_alphabetic());
    }
    word.contains('.')
        && word.split('.').all(|part| {
            let mut letters = part.chars();
            matches!((letters.next(), letters.next()), (Some(c), None) if c.is_alphabetic())
        })
}

/// Whether a word preceded by `before` starts the text or a line (only spaces or tabs between).
fn starts_line(before: &str) -> bool {
    let line = before.trim_end_matches([' ', '\t']);
    line.is_empty() || line.ends_with('\n')
}

/// Complete sentences of `text` in order (trimmed), and the unfinished remainder (trimmed, may
/// be empty). With complete=true a non-empty remainder becomes the last sentence.
///
/// With complete=true, a remainder with no letter or digit (a trailing `...`) joins the last
/// sentence instead, when there is one.
pub fn split_sentences(text: &str, complete: bool) -> (Vec<String>, String) {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut start = 0;
    while let Some(len) = first_sentence_end(&text[start..], complete) {
        ranges.push((start, start + len));
        start += len;
    }
    let rest = text[start..].trim();
    if complete && !rest.is_empty() {
        match ranges.last_mut() {
            Some(last) if !rest.chars().any(char::is_alphanumeric) => last.1 = text.len(),
            _ => ranges.push((start, text.len())),
        }
        start = text.len();
    }
    let sentences = ranges
        .iter()
        .map(|&(from, to)| text[from..to].trim().to_string())
        .collect();
    (sentences, text[start..].trim().to_string())
}

/// The sentences of a text that grows (an answer being generated), each reported once, as soon
/// as a prefix of the text shows it complete. Only the text after the last reported sentence is
/// scanned again, so a long answer costs linear time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SentenceStream {
    text: String,
    /// Byte offset just past the last reported sentence.
    reported_end: usize,
    sentences: usize,
}

/// The first sentence of a text arriving in pieces (a token's text each), as a stream to
/// speech synthesis finds it: the first one complete after some piece (so `Yes!` ends one
/// even when the next piece begins with a letter), with how many pieces it takes. With
/// `complete` (the pieces are the whole text) the end of the text ends one too. The same
/// pieces give the same sentence however many of them are known.
pub fn first_streamed_sentence<S: AsRef<str>>(
    pieces: &[S],
    complete: bool,
) -> Option<(usize, String)> {
    let mut stream = SentenceStream::new();
    for (n, piece) in pieces.iter().enumerate() {
        if let Some(sentence) = stream.push(piece.as_ref()).into_iter().next() {
            return Some((n + 1, sentence));
        }
    }
    let whole = stream.text();
    complete
        .then(|| first_sentence_end(whole, true))
        .flatten()
        .map(|end| (pieces.len(), whole[..end].trim().to_string()))
}

impl SentenceStream {
    /// An empty text.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `delta` and returns the sentences it completes, trimmed.
    pub fn push(&mut self, delta: &str) -> Vec<String> {
        self.text.push_str(delta);
        self.take_sentences(false)
    }

    /// The text is complete: returns its last sentences, the unfinished rest included (a rest
    /// with no letter or digit, such as a trailing `...`, belongs to the sentence before it
    /// and is dropped when that one was already reported).
    pub fn finish(&mut self) -> Vec<String> {
        let mut sentences = self.take_sentences(true);
        let rest = self.text[self.reported_end..].trim();
        if !rest.is_empty() && (rest.chars().any(char::is_alphanumeric) || self.sentences == 0) {
            sentences.push(rest.to_string());
            self.sentences += 1;
        }
        self.reported_end = self.text.len();
        sentences
    }

    /// Everything pushed so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// How many sentences have been reported.
    pub fn reported(&self) -> usize {
        self.sentences
    }

    fn take_sentences(&mut self, complete: bool) -> Vec<String> {
        let mut sentences = Vec::new();
        while let Some(len) = first_sentence_end(&self.text[self.reported_end..], complete) {
            let end = self.reported_end + len;
            sentences.push(self.text[self.reported_end..end].trim().to_string());
            self.reported_end = end;
        }
        self.sentences += sentences.len();
        sentences
    }
}

/// Fewest words on each side of the cut [`first_piece_end`] makes.
pub const MIN_PIECE_WORDS: usize = 4;

/// Words that open a clause or a phrase, before which a speaker can pause: conjunctions and
/// common prepositions.
const PHRASE_OPENERS: [&str; 24] = [
    "and", "but", "or", "so", "because", "which", "when", "if", "while", "where", "although",
    "though", "unless", "until", "since", "for", "with", "in", "on", "at", "from", "about",
    "after", "before",
];

/// Where to cut a sentence so that its start is synthesized, and heard, sooner: the byte offset
/// just past its first clause (a comma, semicolon, colon or dash after a word), or else just
/// before its first conjunction or preposition, whichever comes first with at least
/// [`MIN_PIECE_WORDS`] words on each side; `None` when the sentence is too short for that.
/// A voice speaks the two pieces in runs of its own: the first is ready after a fraction of the
/// whole sentence's compute, and the second is made while the first plays.
pub fn first_piece_end(sentence: &str) -> Option<usize> {
    let words: Vec<(usize, &str)> = sentence
        .split_whitespace()
        .map(|word| (word.as_ptr() as usize - sentence.as_ptr() as usize, word))
        .collect();
    (MIN_PIECE_WORDS..=words.len().checked_sub(MIN_PIECE_WORDS)?).find_map(|i| {
        let (start, before) = words[i - 1];
        let clause_end = before.ends_with([',', ';', ':', '—', '–']);
        let word = words[i].1.trim_start_matches(is_opener).to_lowercase();
        if clause_end {
            Some(start + before.len())
        } else if PHRASE_OPENERS.contains(&word.as_str()) {
            Some(words[i].0)
        } else {
            None
        }
    })
}

/// A sentence's first piece and the rest (both trimmed) when it is spoken in two
/// ([`first_piece_end`]); the whole sentence alone otherwise.
pub fn split_first_piece(sentence: &str) -> (&str, Option<&str>) {
    match first_piece_end(sentence) {
        Some(end) => (sentence[..end].trim(), Some(sentence[end..].trim())),
        None => (sentence, None),
    }
}

/// The first piece ([`split_first_piece`]) of the sentence `text` opens, as soon as no
/// continuation of `text` can change it: the cut is found among `text`'s whole words (a word
/// is whole once whitespace follows it), so [`MIN_PIECE_WORDS`] whole words follow it, and
/// those words hold no sentence-ending mark or line break, so the sentence cannot end before.
/// `None` until then. A long first sentence's first piece can go to speech while the model
/// still writes the rest of it.
pub fn settled_first_piece(text: &str) -> Option<&str> {
    let text = text.trim_start();
    let whole_words = text.trim_end_matches(|c: char| !c.is_whitespace());
    if whole_words.contains(|c: char| is_terminator(c) || c == '\n') {
        return None;
    }
    first_piece_end(whole_words).map(|end| whole_words[..end].trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn split(text: &str, complete: bool) -> (Vec<String>, String) {
        split_sentences(text, complete)
    }

    #[test]
    fn a_long_sentence_is_cut_after_its_first_clause_or_before_a_phrase() {
        let cut = |s: &'static str| first_piece_end(s).map(|end| (&s[..end], &s[end..]));
        assert_eq!(
            cut("If you water it too often, the roots will rot in the pot."),
            Some((
                "If you water it too often,",
                " the roots will rot in the pot."
            ))
        );
        assert_eq!(
            cut("The ideal watering frequency for a snake plant is once a week."),
            Some((
                "The ideal watering frequency ",
                "for a snake plant is once a week."
            ))
        );
        // The earlier boundary wins; a clause of fewer than four words is not cut off.
        assert_eq!(
            cut("Sure, here is a simple recipe (with eggs) for pancakes."),
            Some((
                "Sure, here is a simple recipe ",
                "(with eggs) for pancakes."
            ))
        );
        assert_eq!(
            cut("Pack light layers — the evenings get cold near the coast."),
            Some((
                "Pack light layers —",
                " the evenings get cold near the coast."
            ))
        );
        // A preposition three words in is too early; too short a sentence, or one without a
        // boundary, is not cut.
        assert_eq!(
            cut("Boil the eggs for six minutes and then cool them."),
            Some(("Boil the eggs for six minutes ", "and then cool them."))
        );
        assert_eq!(cut("Add the sugar slowly and stir."), None);
        assert_eq!(cut("Yes."), None);
        assert_eq!(cut(""), None);
        assert_eq!(
            cut("Photosynthesis turns sunlight carbon dioxide water into sugar."),
            None
        );
    }

    #[test]
    fn a_streamed_sentence_ends_where_the_stream_first_sees_it_end() {
        let pieces = ["Yes", "!", "Vs", " are", " fun."];
        assert_eq!(first_sentence_end("Yes!Vs are fun.", false), Some(15));
        for known in 2..=pieces.len() {
            assert_eq!(
                first_streamed_sentence(&pieces[..known], false),
                Some((2, "Yes!".to_string()))
            );
        }
        assert_eq!(first_streamed_sentence(&pieces[..1], false), None);
        // A period after a digit may be a decimal point until the text is known to end.
        let pieces = ["It", " costs", " 3", "."];
        assert_eq!(first_streamed_sentence(&pieces, false), None);
        assert_eq!(
            first_streamed_sentence(&pieces, true),
            Some((4, "It costs 3.".to_string()))
        );
        assert_eq!(first_streamed_sentence(&["no end"], true), None);
        assert_eq!(first_streamed_sentence::<&str>(&[], true), None);
    }

    #[test]
    fn a_first_piece_is_settled_once_enough_whole_words_follow_it() {
        let answer = "It is best to water it once a week, but this can vary with the season.";
        let settled = |end: usize| settled_first_piece(&answer[..end]);
        let comma = answer.find(',').unwrap() + 1;
        // " but this can vary" are the four words after the cut; "vary" is whole once the
        // space after it is written.
        let vary = answer.find(" with").unwrap();
        assert_eq!(settled(vary), None);
        assert_eq!(settled(vary + 1), Some(&answer[..comma]));
        assert_eq!(
            split_first_piece(answer).0,
            &answer[..comma],
            "the piece the whole sentence is cut into"
        );
        // A sentence end, or a mark that might be one, among the words: not settled.
        assert_eq!(
            settled_first_piece("Yes. It is best to water it, but this can vary "),
            None
        );
        assert_eq!(
            settled_first_piece("Dr. Smith says to water it, but this can vary "),
            None
        );
        assert_eq!(settled_first_piece("  "), None);
    }

    #[test]
    fn a_settled_first_piece_is_the_first_piece_of_every_continuation() {
        const WORDS: [&str; 14] = [
            "water", "the", "plant", "week,", "and", "for", "soil", "dry;", "but", "(with", "in",
            "Dr.", "it.", "now",
        ];
        let mut rng = StdRng::seed_from_u64(0x91ece);
        let mut settled_seen = 0;
        for _ in 0..3000 {
            let words: Vec<&str> = (0..rng.random_range(1..20))
                .map(|_| WORDS[rng.random_range(0..WORDS.len())])
                .collect();
            let answer = format!(" {}", words.join(" "));
            let sentence = split_sentences(&answer, true).0.into_iter().next();
            for (end, _) in answer.char_indices() {
                let Some(piece) = settled_first_piece(&answer[..end]) else {
                    continue;
                };
                settled_seen += 1;
                let sentence = sentence.as_deref().expect("a sentence holds the piece");
                assert_eq!(split_first_piece(sentence).0, piece, "{answer:?} at {end}");
            }
        }
        assert!(settled_seen > 1000, "{settled_seen}");
    }

    fn sentences(text: &str) -> Vec<String> {
        split(text, true).0
    }

    #[test]
    fn plain_sentences() {
        assert_eq!(
            sentences("Hello there. How are you? Fine!"),
            ["Hello there.", "How are you?", "Fine!"]
        );
        assert_eq!(first_sentence_end("  Hi. Next", false), Some(5));
    }

    #[test]
    fn commas_colons_and_semicolons_do_not_end() {
        assert_eq!(
            sentences("First, mix; then: bake. Done."),
            ["First, mix; then: bake.", "Done."]
        );
    }

    #[test]
    fn decimals_do_not_end() {
        assert_eq!(
            sentences("It costs 3.5 dollars. Pi is 3.14159. A million is 1.000.000 here."),
            [
                "It costs 3.5 dollars.",
                "Pi is 3.14159.",
                "A million is 1.000.000 here."
            ]
        );
    }

    #[test]
    fn trailing_period_after_digit_waits_unless_complete() {
        assert_eq!(first_sentence_end("It costs 3.", false), None);
        assert_eq!(first_sentence_end("It costs 3.", true), Some(11));
        assert_eq!(first_sentence_end("It costs 3.5", false), None);
        assert_eq!(first_sentence_end("It costs 3. Then", false), Some(11));
        assert_eq!(first_sentence_end("It costs three.", false), Some(15));
    }

    #[test]
    fn question_and_exclamation_at_the_end_count() {
        assert_eq!(first_sentence_end("Really?", false), Some(7));
        assert_eq!(first_sentence_end("Wow!", false), Some(4));
        assert_eq!(first_sentence_end("Wait, what?!", false), Some(12));
        assert_eq!(first_sentence_end("Well… maybe", false), Some(7));
    }

    #[test]
    fn abbreviations_do_not_end() {
        assert_eq!(
            sentences("Mr. Smith met Dr. Jones vs. Prof. Lee at St. Mary's. They spoke."),
            [
                "Mr. Smith met Dr. Jones vs. Prof. Lee at St. Mary's.",
                "They spoke."
            ]
        );
        assert_eq!(
            sentences("Use herbs, e.g. basil, i.e. fresh ones, approx. ten leaves. See Fig. 2."),
            [
                "Use herbs, e.g. basil, i.e. fresh ones, approx. ten leaves.",
                "See Fig. 2."
            ]
        );
        assert_eq!(first_sentence_end("Ask Mr.", false), None);
        assert_eq!(first_sentence_end("I ate a fig. Then", false), Some(12));
    }

    #[test]
    fn etc_ends_only_at_the_end_of_complete_text() {
        assert_eq!(
            sentences("Buy eggs, milk, etc. and bake. Then eat, etc."),
            ["Buy eggs, milk, etc. and bake.", "Then eat, etc."]
        );
        assert_eq!(first_sentence_end("Buy eggs, milk, etc.", false), None);
        assert_eq!(first_sentence_end("Buy eggs, milk, etc.", true), Some(20));
    }

    #[test]
    fn number_abbreviation_only_before_a_number() {
        assert_eq!(
            sentences("See No. 5 on the list. No. It is not."),
            ["See No. 5 on the list.", "No.", "It is not."]
        );
    }

    #[test]
    fn initials_and_initialisms_do_not_end() {
        assert_eq!(
            sentences("J. K. Rowling wrote it. The U.S. economy grew. Ok."),
            ["J. K. Rowling wrote it.", "The U.S. economy grew.", "Ok."]
        );
        assert_eq!(first_sentence_end("Written by J.", false), None);
        assert_eq!(first_sentence_end("Written by J.", true), Some(13));
        assert_eq!(first_sentence_end("Blue light, i.", false), None);
        assert_eq!(first_sentence_end("Blue light, i.e", false), None);
        assert_eq!(first_sentence_end("Blue light, i.e.", false), None);
        assert_eq!(first_sentence_end("Plan a. Then", false), Some(7));
        // A lone capital ends a sentence once the next word shows it is not a run of initials.
        assert_eq!(
            sentences("A is the father of C. Therefore, A is older. Take vitamin C. It helps."),
            [
                "A is the father of C.",
                "Therefore, A is older.",
                "Take vitamin C.",
                "It helps."
            ]
        );
        assert_eq!(first_sentence_end("The father of C.", false), None);
        assert_eq!(first_sentence_end("The father of C. The", false), Some(16));
    }

    #[test]
    fn numbered_list_markers_do_not_end() {
        let text = "1. Preheat the oven\n2. Mix the flour.\n3) Bake it.";
        assert_eq!(
            sentences(text),
            ["1. Preheat the oven\n2. Mix the flour.", "3) Bake it."]
        );
        assert_eq!(first_sentence_end("  10. Stir", false), None);
        assert_eq!(
            sentences("The answer is 2. Then stop."),
            ["The answer is 2.", "Then stop."]
        );
    }

    #[test]
    fn closing_quotes_and_brackets_belong_to_the_sentence() {
        assert_eq!(
            sentences("He said \"stop.\" She left (quickly!) Then 'ok.' ”Yes.” Done.]"),
            [
                "He said \"stop.\"",
                "She left (quickly!)",
                "Then 'ok.'",
                "”Yes.”",
                "Done.]"
            ]
        );
        assert_eq!(first_sentence_end("Hi.\"Next", true), None);
    }

    #[test]
    fn cjk_terminators_need_no_space() {
        assert_eq!(
            sentences("你好。今天天气怎么样？很好！"),
            ["你好。", "今天天气怎么样？", "很好！"]
        );
        assert_eq!(first_sentence_end("「好。」他说", false), Some(12));
    }

    #[test]
    fn blank_lines_end_sentences() {
        let text = "## Ingredients\n\n- two eggs\n- flour\n  \nMix well. Bake";
        assert_eq!(
            split(text, false),
            (
                vec![
                    "## Ingredients".to_string(),
                    "- two eggs\n- flour".to_string(),
                    "Mix well.".to_string()
                ],
                "Bake".to_string()
            )
        );
        assert_eq!(first_sentence_end("Heading\n", false), None);
        assert_eq!(first_sentence_end("Heading\n\n", false), Some(7));
        assert_eq!(first_sentence_end("---\n\nText", false), None);
    }

    #[test]
    fn punctuation_alone_merges_into_the_next_sentence() {
        assert_eq!(
            sentences("... Well, yes. ! Right."),
            ["... Well, yes.", "! Right."]
        );
        assert_eq!(first_sentence_end("!", true), None);
        assert_eq!(sentences("Really? ?!"), ["Really? ?!"]);
        assert_eq!(sentences("..."), ["..."]);
    }

    #[test]
    fn remainder_is_kept_until_complete() {
        assert_eq!(
            split("One. Two is unfini", false),
            (vec!["One.".to_string()], "Two is unfini".to_string())
        );
        assert_eq!(
            split("One. Two is unfini", true),
            (
                vec!["One.".to_string(), "Two is unfini".to_string()],
                String::new()
            )
        );
    }

    #[test]
    fn empty_and_whitespace_only_input() {
        for complete in [false, true] {
            assert_eq!(first_sentence_end("", complete), None);
            assert_eq!(first_sentence_end(" \n\n\t ", complete), None);
            assert_eq!(split("", complete), (Vec::new(), String::new()));
            assert_eq!(split("  \n\n ", complete), (Vec::new(), String::new()));
        }
    }

    #[test]
    fn multi_byte_text_is_never_sliced_inside_a_char() {
        let text = "Crème brûlée… ça va? Ünïcödé «ok.» 🎉 Fin. 日本語。";
        assert_eq!(
            sentences(text),
            [
                "Crème brûlée…",
                "ça va?",
                "Ünïcödé «ok.»",
                "🎉 Fin.",
                "日本語。"
            ]
        );
        for (end, _) in text.char_indices().skip(1) {
            if let Some(at) = first_sentence_end(&text[..end], false) {
                assert!(text.is_char_boundary(at));
            }
        }
    }

    const PIECES: [&str; 32] = [
        "word", "Hello", "Mr.", "Dr.", "etc.", "e.g.", "U.S.", "J.", "No.", "3.5", "3.", "12",
        "1.", "2)", ".", "...", "…", "?", "!", "?!", ",", ";", "\"", "”", ")", "。", "！", "日本",
        "é", "🎉", "\n", "\n\n",
    ];
    const SEPARATORS: [&str; 5] = [" ", " ", "", "\n", "  "];

    fn random_text(rng: &mut StdRng) -> String {
        let mut text = String::new();
        for _ in 0..rng.random_range(0..24) {
            text.push_str(SEPARATORS[rng.random_range(0..SEPARATORS.len())]);
            text.push_str(PIECES[rng.random_range(0..PIECES.len())]);
        }
        text
    }

    fn without_whitespace(text: &str) -> String {
        text.chars().filter(|c| !c.is_whitespace()).collect()
    }

    #[test]
    fn random_texts_lose_nothing_and_cut_on_char_boundaries() {
        let mut rng = StdRng::seed_from_u64(0x5e7e);
        for _ in 0..2000 {
            let text = random_text(&mut rng);
            for complete in [false, true] {
                for (end, _) in text.char_indices().chain([(text.len(), ' ')]) {
                    let prefix = &text[..end];
                    if let Some(at) = first_sentence_end(prefix, complete) {
                        assert!(at > 0 && at <= prefix.len(), "{prefix:?} -> {at}");
                        assert!(prefix.is_char_boundary(at), "{prefix:?} -> {at}");
                    }
                }
                let (found, rest) = split_sentences(&text, complete);
                assert!(found.iter().all(|s| !s.is_empty() && s.trim() == s));
                let joined = format!("{} {rest}", found.join(" "));
                assert_eq!(without_whitespace(&joined), without_whitespace(&text));
                if complete {
                    assert!(rest.is_empty(), "{text:?}");
                }
            }
            if !text.contains(is_cjk_terminator) {
                let (found, _) = split_sentences(&text, true);
                let joined = found.join(" ");
                assert!(
                    joined.split_whitespace().eq(text.split_whitespace()),
                    "{text:?} -> {found:?}"
                );
            }
        }
    }

    #[test]
    fn a_stream_reports_each_sentence_once_as_it_completes() {
        let mut stream = SentenceStream::new();
        assert!(stream.push("Boil the egg").is_empty());
        assert_eq!(stream.push(" for 6 min. Then"), ["Boil the egg for 6 min."]);
        assert!(
            stream.push(" cool it at 3.").is_empty(),
            "3. may be a decimal"
        );
        assert!(stream.push("5 degrees").is_empty());
        assert_eq!(stream.push("! Enjoy"), ["Then cool it at 3.5 degrees!"]);
        assert_eq!(stream.reported(), 2);
        assert_eq!(stream.finish(), ["Enjoy"]);
        assert!(stream.finish().is_empty());
        assert_eq!(
            stream.text(),
            "Boil the egg for 6 min. Then cool it at 3.5 degrees! Enjoy"
        );

        let mut trailing = SentenceStream::new();
        assert_eq!(trailing.push("Done. ..."), ["Done."]);
        assert!(trailing.finish().is_empty());
        let mut dots = SentenceStream::new();
        assert!(dots.push("...").is_empty());
        assert_eq!(dots.finish(), ["..."]);
    }

    #[test]
    fn a_stream_pushed_whole_splits_as_split_sentences_does() {
        let mut rng = StdRng::seed_from_u64(0x57e4);
        for _ in 0..2000 {
            let text = random_text(&mut rng);
            let mut whole = SentenceStream::new();
            let mut sentences = whole.push(&text);
            sentences.extend(whole.finish());
            // split_sentences joins a trailing rest without letters or digits (a closing
            // quote, `...`) to the last sentence; the stream has reported that one already.
            let expected = split(&text, true).0;
            assert_eq!(sentences.len(), expected.len(), "{text:?}");
            for (got, want) in sentences.iter().zip(&expected) {
                let extra = want.strip_prefix(got.as_str());
                assert!(
                    extra.is_some_and(|e| got == want || !e.chars().any(char::is_alphanumeric)),
                    "{text:?}: {sentences:?} vs {expected:?}"
                );
            }

            // In pieces: nothing lost, nothing empty, nothing reported twice.
            let mut pieces = SentenceStream::new();
            let mut reported = Vec::new();
            let mut rest = text.as_str();
            while !rest.is_empty() {
                let mut cut = rng.random_range(1..=rest.len());
                while !rest.is_char_boundary(cut) {
                    cut += 1;
                }
                reported.extend(pieces.push(&rest[..cut]));
                rest = &rest[cut..];
            }
            reported.extend(pieces.finish());
            assert!(reported.iter().all(|s| !s.is_empty()), "{text:?}");
            let (all, kept) = (
                without_whitespace(&text),
                without_whitespace(&reported.concat()),
            );
            let dropped = all.strip_prefix(kept.as_str());
            assert!(
                dropped.is_some_and(|d| !d.chars().any(char::is_alphanumeric)),
                "{text:?}: {reported:?}"
            );
        }
    }
}
