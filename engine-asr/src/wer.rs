//! Word error rate: the word-level Levenshtein alignment of a hypothesis against a reference.
//!
//! [`word_errors`] counts the substitutions, deletions and insertions of one minimum-cost
//! alignment of the whitespace-separated words; [`WordErrors`] adds up over a corpus (`+=`) and
//! [`WordErrors::rate`] gives the corpus WER, `(S + D + I) / N` with `N` the reference words, as
//! jiwer and Whisper's evaluation compute it. Nothing is normalized here: pass both sides through
//! the same normalizer first (for English, [`crate::normalize::EnglishTextNormalizer`]).
//!
//! When several alignments have the minimum cost, the one counted prefers a substitution to a
//! deletion and a deletion to an insertion at each step; the total `S + D + I` (the edit
//! distance) does not depend on that choice, only its split does.

use std::iter::Sum;
use std::ops::{Add, AddAssign};

/// The errors of a hypothesis against a reference, or their sum over a corpus.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct WordErrors {
    /// Reference words replaced by another word.
    pub substitutions: usize,
    /// Reference words missing from the hypothesis.
    pub deletions: usize,
    /// Hypothesis words with no reference word.
    pub insertions: usize,
    /// Words in the reference (`N`).
    pub reference_words: usize,
}

impl WordErrors {
    /// `S + D + I`, the word-level edit distance.
    pub fn errors(&self) -> usize {
        self.substitutions + self.deletions + self.insertions
    }

    /// The word error rate `(S + D + I) / N`: 0 when there is nothing to recognise and nothing
    /// was inserted, infinite when words were inserted against an empty reference.
    pub fn rate(&self) -> f64 {
        match (self.errors(), self.reference_words) {
            (0, _) => 0.0,
            (_, 0) => f64::INFINITY,
            (errors, words) => errors as f64 / words as f64,
        }
    }
}

impl AddAssign for WordErrors {
    fn add_assign(&mut self, other: Self) {
        self.substitutions += other.substitutions;
        self.deletions += other.deletions;
        self.insertions += other.insertions;
        self.reference_words += other.reference_words;
    }
}

impl Add for WordErrors {
    type Output = Self;

    fn add(mut self, other: Self) -> Self {
        self += other;
        self
    }
}

impl Sum for WordErrors {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), Add::add)
    }
}

/// Cost and error counts of the best alignment of two prefixes.
#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    substitutions: usize,
    deletions: usize,
    insertions: usize,
}

impl Cell {
    fn cost(&self) -> usize {
        self.substitutions + self.deletions + self.insertions
    }
}

/// The errors of `hypothesis` against `reference`, both split at whitespace: a minimum-cost
/// word alignment (Levenshtein, every edit costing 1). Memory is linear in the hypothesis length.
pub fn word_errors(reference: &str, hypothesis: &str) -> WordErrors {
    let reference: Vec<&str> = reference.split_whitespace().collect();
    let hypothesis: Vec<&str> = hypothesis.split_whitespace().collect();

    // row[j]: the best alignment of the reference words so far with hypothesis[..j]
    let mut row: Vec<Cell> = (0..=hypothesis.len())
        .map(|j| Cell {
            insertions: j,
            ..Cell::default()
        })
        .collect();
    let mut next = row.clone();
    for ref_word in &reference {
        next[0] = Cell {
            deletions: row[0].deletions + 1,
            ..row[0]
        };
        for (j, hyp_word) in hypothesis.iter().enumerate() {
            let mut diagonal = row[j];
            if ref_word != hyp_word {
                diagonal.substitutions += 1;
            }
            let deletion = Cell {
                deletions: row[j + 1].deletions + 1,
                ..row[j + 1]
            };
            let insertion = Cell {
                insertions: next[j].insertions + 1,
                ..next[j]
            };
            // the first of equal costs wins: substitution (or match), deletion, insertion
            next[j + 1] = [deletion, insertion].into_iter().fold(diagonal, |best, c| {
                if c.cost() < best.cost() {
                    c
                } else {
                    best
                }
            });
        }
        std::mem::swap(&mut row, &mut next);
    }
    let last = row[hypothesis.len()];
    WordErrors {
        substitutions: last.substitutions,
        deletions: last.deletions,
        insertions: last.insertions,
        reference_words: reference.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(s: usize, d: usize, i: usize, n: usize) -> WordErrors {
        WordErrors {
            substitutions: s,
            deletions: d,
            insertions: i,
            reference_words: n,
        }
    }

    #[test]
    fn identical_texts_have_no_errors() {
        let e = word_errors("the cat sat on the mat", "the  cat sat\non the mat");
        assert_eq!(e, errors(0, 0, 0, 6));
        assert_eq!(e.rate(), 0.0);
    }

    #[test]
    fn counts_each_kind_of_error() {
        assert_eq!(word_errors("a b c", "a x c"), errors(1, 0, 0, 3));
        assert_eq!(word_errors("a b c", "a c"), errors(0, 1, 0, 3));
        assert_eq!(word_errors("a b c", "a b x c"), errors(0, 0, 1, 3));
        // x a c d e: "x a" for "a b" and an inserted "e" (or: x inserted, b deleted, e inserted)
        assert_eq!(word_errors("a b c d", "x a c d e"), errors(2, 0, 1, 4));
        // keeping "quick" and "fox" costs 5 too (2 S, 1 D, 2 I); substitutions win the tie
        assert_eq!(
            word_errors("the quick brown fox jumps", "a quick fox jumped over it"),
            errors(4, 0, 1, 5)
        );
    }

    /// The textbook edit distance, to check the counts against.
    fn edit_distance(a: &[&str], b: &[&str]) -> usize {
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, x) in a.iter().enumerate() {
            let mut next = vec![i + 1; b.len() + 1];
            for (j, y) in b.iter().enumerate() {
                next[j + 1] = (row[j] + usize::from(x != y))
                    .min(row[j + 1] + 1)
                    .min(next[j] + 1);
            }
            row = next;
        }
        row[b.len()]
    }

    #[test]
    fn counts_form_a_minimum_alignment() {
        let vocabulary = ["a", "b", "c"];
        let mut state = 0x2545_f491_u64;
        let mut words = |n: usize| -> Vec<&str> {
            (0..n)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    vocabulary[(state >> 33) as usize % vocabulary.len()]
                })
                .collect()
        };
        for n in 0..12 {
            for m in 0..12 {
                let (r, h) = (words(n), words(m));
                let e = word_errors(&r.join(" "), &h.join(" "));
                assert_eq!(e.errors(), edit_distance(&r, &h), "{r:?} / {h:?}");
                assert_eq!(e.reference_words, n);
                // the words left matched are the same count on both sides
                assert_eq!(
                    n - e.substitutions - e.deletions,
                    m - e.substitutions - e.insertions
                );
            }
        }
    }

    #[test]
    fn empty_sides() {
        assert_eq!(word_errors("", ""), errors(0, 0, 0, 0));
        assert_eq!(word_errors("", "").rate(), 0.0);
        assert_eq!(word_errors("a b", ""), errors(0, 2, 0, 2));
        assert_eq!(word_errors("a b", "").rate(), 1.0);
        assert_eq!(word_errors("  ", "x y"), errors(0, 0, 2, 0));
        assert_eq!(word_errors("", "x").rate(), f64::INFINITY);
    }

    #[test]
    fn prefers_substitutions_on_ties() {
        // "a b" → "b a": two substitutions, or a deletion and an insertion; both cost 2
        assert_eq!(word_errors("a b", "b a"), errors(2, 0, 0, 2));
        assert_eq!(word_errors("a b", "c d e"), errors(2, 0, 1, 2));
    }

    #[test]
    fn the_edit_distance_is_symmetric() {
        let pairs = [
            ("one two three four five", "one three three five six seven"),
            ("x y z", "z y x w"),
            ("a a a b", "a b b b b"),
        ];
        for (a, b) in pairs {
            assert_eq!(word_errors(a, b).errors(), word_errors(b, a).errors());
        }
    }

    #[test]
    fn corpus_rate_sums_before_dividing() {
        let mut total = WordErrors::default();
        total += word_errors("a b c d", "a b c d"); // 0 of 4
        total += word_errors("e f", "x"); // 2 of 2
        assert_eq!(total, errors(1, 1, 0, 6));
        assert!((total.rate() - 2.0 / 6.0).abs() < 1e-12);
        let summed: WordErrors = [word_errors("a", "b"), word_errors("c", "c d")]
            .into_iter()
            .sum();
        assert_eq!(summed, errors(1, 0, 1, 2));
        assert_eq!(summed.rate(), 1.0);
    }

    #[test]
    fn rate_can_exceed_one() {
        let e = word_errors("a", "b c d");
        assert_eq!(e, errors(1, 0, 2, 1));
        assert_eq!(e.rate(), 3.0);
    }
}
