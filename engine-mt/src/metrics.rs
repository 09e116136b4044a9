//! Live-translation metrics: normalized erasure (flicker) and chrF (quality).

use std::collections::HashMap;

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

    const SACREBLEU_EXAMPLE: f64 = 67.42863254274032;
}
