//! Live-translation metrics: normalized erasure (flicker), time to a stable caption (latency)
//! and chrF (quality).

use std::collections::HashMap;
use std::time::Duration;

use spec_voice::{keeps_words, Partial};

/// The display units of a text: characters (without spaces) for scripts written without
/// spaces between words (Chinese, Japanese), else whitespace-separated words.
pub fn display_units(text: &str, by_characters: bool) -> Vec<String> {
    if by_characters {
        text.chars()
            .filter(|c| !c.is_whitespace())
            .map(String::from)
            .collect()
    } else {
        text.split_whitespace().map(String::from).collect()
    }
}

/// Normalized erasure, NE = Σ_i (|Y^(i−1)| − |LCP(Y^(i−1), Y^i)|) / |Y^N|: the display units
/// each update erases from the one before, over the length of the final display. The first
/// display erases nothing; an empty final display gives 0.
pub fn normalized_erasure(displays: &[Vec<String>]) -> f64 {
    let Some(last) = displays.last() else {
        return 0.0;
    };
    if last.is_empty() {
        return 0.0;
    }
    let erased: usize = displays
        .windows(2)
        .map(|pair| {
            let common = pair[0]
                .iter()
                .zip(&pair[1])
                .take_while(|(a, b)| a == b)
                .count();
            pair[0].len() - common
        })
        .sum();
    erased as f64 / last.len() as f64
}

/// When each update's caption appears on a simulated clock: update `i` arrives at
/// `arrivals[i]`, waits for the previous one to finish, and takes `compute[i]`; its caption is
/// shown when it finishes.
pub fn caption_times(arrivals: &[Duration], compute: &[Duration]) -> Vec<Duration> {
    let mut done = Duration::ZERO;
    arrivals
        .iter()
        .zip(compute)
        .map(|(&arrival, &took)| {
            done = done.max(arrival) + took;
            done
        })
        .collect()
}

/// When each word of the final source arrives: with the first partial from which on every
/// partial starts with the words up to it (a word a recogniser revises arrives again).
pub fn word_arrivals(partials: &[Partial]) -> Vec<Duration> {
    let Some(last) = partials.last() else {
        return Vec::new();
    };
    let words: Vec<&str> = last.text.split_whitespace().collect();
    (1..=words.len())
        .map(|n| {
            let prefix = words[..n].join(" ");
            let settled = partials
                .iter()
                .rposition(|p| !keeps_words(&prefix, &p.text))
                .map_or(0, |i| i + 1);
            partials[settled].at
        })
        .collect()
}

/// Time to a stable caption, per unit of the final display: how long after its source word
/// arrived the caption first showed the final display up to that unit and never changed it
/// again. `displays` are `(shown at, display units)` for every update of a sentence, the last
/// one final; `arrivals` are the source words' arrival times ([`word_arrivals`]). Without a
/// word alignment, unit j of T is taken to translate source word ⌈(j + 1)·S / T⌉ of S, the
/// proportional alignment of Average Lagging (Ma et al. 2019) as re-translation uses it
/// (Arivazhagan et al. 2020); a unit stable before its aligned word arrived counts as 0.
pub fn stable_caption_delays(
    displays: &[(Duration, Vec<String>)],
    arrivals: &[Duration],
) -> Vec<Duration> {
    let (Some((_, last)), false) = (displays.last(), arrivals.is_empty()) else {
        return Vec::new();
    };
    let agreed: Vec<usize> = displays
        .iter()
        .map(|(_, units)| common_prefix(units, last))
        .collect();
    (0..last.len())
        .map(|j| {
            // The first update from which on every display shows the final one up to unit j.
            let stable_from = agreed.iter().rposition(|&n| n <= j).map_or(0, |i| i + 1);
            let source_word = ((j + 1) * arrivals.len()).div_ceil(last.len()) - 1;
            displays[stable_from]
                .0
                .saturating_sub(arrivals[source_word])
        })
        .collect()
}

fn common_prefix(a: &[String], b: &[String]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Corpus-level chrF (Popović 2015) as sacreBLEU computes it by default: character n-grams of
/// orders 1–6 with whitespace removed, match counts summed over the corpus, precision and recall
/// averaged over the orders, then F_β with β = 2; 0–100.
pub fn chrf(hypotheses: &[&str], references: &[&str]) -> f64 {
    const ORDERS: usize = 6;
    const BETA: f64 = 2.0;
    // Per order: matched, hypothesis n-grams, reference n-grams.
    let mut totals = [(0usize, 0usize, 0usize); ORDERS];
    for (hypothesis, reference) in hypotheses.iter().zip(references) {
        let hyp: Vec<char> = hypothesis.chars().filter(|c| !c.is_whitespace()).collect();
        let refs: Vec<char> = reference.chars().filter(|c| !c.is_whitespace()).collect();
        for (order, total) in totals.iter_mut().enumerate() {
            let hyp_counts = ngram_counts(&hyp, order + 1);
            let ref_counts = ngram_counts(&refs, order + 1);
            let matched: usize = hyp_counts
                .iter()
                .map(|(gram, &n)| n.min(ref_counts.get(gram).copied().unwrap_or(0)))
                .sum();
            total.0 += matched;
            total.1 += hyp_counts.values().sum::<usize>();
            total.2 += ref_counts.values().sum::<usize>();
        }
    }
    let (mut precision, mut recall, mut orders) = (0.0, 0.0, 0.0);
    for &(matched, hyp, refs) in &totals {
        if hyp > 0 && refs > 0 {
            precision += matched as f64 / hyp as f64;
            recall += matched as f64 / refs as f64;
            orders += 1.0;
        }
    }
    if orders == 0.0 {
        return 0.0;
    }
    let (precision, recall) = (precision / orders, recall / orders);
    let beta2 = BETA * BETA;
    let denominator = beta2 * precision + recall;
    if denominator == 0.0 {
        return 0.0;
    }
    100.0 * (1.0 + beta2) * precision * recall / denominator
}

fn ngram_counts(chars: &[char], n: usize) -> HashMap<&[char], usize> {
    let mut counts = HashMap::new();
    if chars.len() >= n {
        for gram in chars.windows(n) {
            *counts.entry(gram).or_insert(0) += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        display_units(text, false)
    }

    #[test]
    fn erasure_counts_what_each_update_takes_back() {
        // "a b" → "a c d" erases 1 ("b"); → "a c d e" erases 0; final length 4.
        let displays = [words("a b"), words("a c d"), words("a c d e")];
        assert_eq!(normalized_erasure(&displays), 0.25);
        // Only growing: no erasure.
        let growing = [words("x"), words("x y"), words("x y z")];
        assert_eq!(normalized_erasure(&growing), 0.0);
        // Everything replaced twice.
        let flicker = [words("p q"), words("r s"), words("t u")];
        assert_eq!(normalized_erasure(&flicker), 2.0);
        assert_eq!(normalized_erasure(&[]), 0.0);
        assert_eq!(display_units("今天 好", true), ["今", "天", "好"]);
    }

    #[test]
    fn chrf_matches_sacrebleu() {
        // Reference values from sacrebleu 2.6.0 (`CHRF().corpus_score(hyps, [refs])`).
        assert!((chrf(&["the cat"], &["the cat"]) - 100.0).abs() < 1e-9);
        assert_eq!(chrf(&["xyz"], &["abc"]), 0.0);
        let hyps = [
            "Der Hund läuft schnell nach Hause.",
            "Ich habe heute keine Zeit.",
        ];
        let refs = [
            "Der Hund rennt schnell nach Hause.",
            "Heute habe ich keine Zeit.",
        ];
        let score = chrf(&hyps, &refs);
        assert!((score - SACREBLEU_EXAMPLE).abs() < 1e-6, "{score}");
    }

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn captions_queue_behind_slow_updates() {
        // The second update arrives before the first is done and waits for it.
        let times = caption_times(&ms(&[100, 200, 900]), &ms(&[300, 50, 10]));
        assert_eq!(times, ms(&[400, 450, 910]));
        assert!(caption_times(&[], &[]).is_empty());
    }

    #[test]
    fn words_arrive_with_the_partial_that_settles_them() {
        let partials = [
            Partial::new(Duration::from_millis(500), "what is", false),
            Partial::new(Duration::from_millis(900), "what is one plus", false),
            Partial::new(Duration::from_millis(1300), "what is 1 + 2", true),
        ];
        // "what is" from the first partial; "1 + 2" were heard as "one plus" until the last.
        assert_eq!(word_arrivals(&partials), ms(&[500, 500, 1300, 1300, 1300]));
        let lag = spec_voice::lag_k("a b c d e", 2).unwrap();
        let arrivals = word_arrivals(&lag);
        assert_eq!(arrivals[0], lag[0].at);
        assert_eq!(arrivals[2], lag[1].at);
        assert_eq!(arrivals[4], lag[2].at);
        assert!(word_arrivals(&[]).is_empty());
    }

    #[test]
    fn a_unit_is_stable_once_no_later_display_changes_it() {
        let displays = vec![
            (Duration::from_millis(1000), words("a x")),
            (Duration::from_millis(2000), words("a b c")),
            (Duration::from_millis(3000), words("a b")),
            (Duration::from_millis(4000), words("a b c d")),
        ];
        // Two source words, at 0.5 s and 2.5 s: units a, b align with the first, c, d with
        // the second. "a" is stable from the first display, "b" from the second (the third
        // keeps it), "c" and "d" only from the last ("c" was taken back by the third).
        let delays = stable_caption_delays(&displays, &ms(&[500, 2500]));
        assert_eq!(delays, ms(&[500, 1500, 1500, 1500]));
        // A unit stable before its word arrived counts as 0.
        let early = stable_caption_delays(&displays[..1], &ms(&[1500, 2500]));
        assert_eq!(early, ms(&[0, 0]));
        assert!(stable_caption_delays(&[], &ms(&[1])).is_empty());
        assert!(stable_caption_delays(&displays, &[]).is_empty());
    }

    const SACREBLEU_EXAMPLE: f64 = 67.42863254274032;
}
