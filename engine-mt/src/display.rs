//! What a live caption shows of each update's output.
//!
//! A re-translation's newest words are its least settled: they translate a source that is still
//! growing. A display policy decides, update by update, how many leading tokens of the output
//! to show; the final update of a sentence always shows everything. Policies are stages
//! ([`DisplayStage`]) gathered in one enum ([`DisplayPolicy`]), and combine: [`Sequence`] shows
//! what every stage allows, [`Hold`] never takes back a shown prefix the output still starts
//! with.

/// What a display stage sees of one update.
#[derive(Clone, Copy, Debug)]
pub struct UpdateView<'a> {
    /// The update's whole output.
    pub tokens: &'a [u32],
    /// Each token's biased probability ([`UpdateDecode::confidence`](crate::UpdateDecode)).
    pub confidence: &'a [f32],
    /// Each token's text.
    pub pieces: &'a [String],
    pub is_final: bool,
}

/// One display rule.
pub trait DisplayStage {
    /// How many leading tokens of `update`'s output to show (at most its length); called once
    /// per update, in order, so a stage may remember earlier updates of the sentence.
    fn shown(&mut self, update: &UpdateView<'_>) -> usize;

    /// Forgets earlier updates: a new sentence starts.
    fn reset(&mut self);
}

/// Shows every token (plain re-translation's display).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Full;

impl DisplayStage for Full {
    fn shown(&mut self, update: &UpdateView<'_>) -> usize {
        update.tokens.len()
    }

    fn reset(&mut self) {}
}

/// Display-only mask-k (the paper's recommendation): hides the last `k` tokens of a non-final
/// output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MaskK {
    pub k: usize,
}

impl DisplayStage for MaskK {
    fn shown(&mut self, update: &UpdateView<'_>) -> usize {
        if update.is_final {
            update.tokens.len()
        } else {
            update.tokens.len().saturating_sub(self.k)
        }
    }

    fn reset(&mut self) {}
}

/// Local agreement (as streaming speech recognisers commit words): shows the longest prefix
/// that the outputs of the last `n` updates share. With n = 1 everything is shown; the first
/// n − 1 updates of a sentence show nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalAgreement {
    pub n: usize,
    recent: Vec<Vec<u32>>,
}

impl LocalAgreement {
    pub fn new(n: usize) -> Self {
        LocalAgreement {
            n: n.max(1),
            recent: Vec::new(),
        }
    }
}

impl DisplayStage for LocalAgreement {
    fn shown(&mut self, update: &UpdateView<'_>) -> usize {
        let tokens = update.tokens;
        let agreed = if update.is_final {
            tokens.len()
        } else if self.recent.len() + 1 < self.n {
            0
        } else {
            self.recent
                .iter()
                .map(|earlier| spec_core::decoder::common_prefix_len(earlier, tokens))
                .min()
                .unwrap_or(tokens.len())
        };
        self.recent.push(tokens.to_vec());
        if self.recent.len() >= self.n {
            self.recent.remove(0);
        }
        agreed
    }

    fn reset(&mut self) {
        self.recent.clear();
    }
}

/// Shows the longest prefix whose every token has a biased probability of at least
/// `threshold`: tokens the model chose without conviction, or that a draft kept only by a slim
/// margin, wait for a later update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StabilityThreshold {
    pub threshold: f32,
}

impl DisplayStage for StabilityThreshold {
    fn shown(&mut self, update: &UpdateView<'_>) -> usize {
        if update.is_final {
            return update.tokens.len();
        }
        update
            .confidence
            .iter()
            .take(update.tokens.len())
            .take_while(|&&p| p >= self.threshold)
            .count()
    }

    fn reset(&mut self) {}
}

/// Hides the ending a partial output gives its sentence: trailing sentence punctuation and the
/// word it closes. A translation of an unfinished source is still a finished sentence (the
/// model closes it, in German often with the verb the sentence bracket sends to the end:
/// "Können wir uns treffen?" for "Can we meet"), and the next update inserts the new words
/// before that ending, erasing it; the rest of the output is kept as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpenEnd;

/// Sentence-ending punctuation, Latin and CJK.
const CLOSING: [char; 7] = ['.', '!', '?', '…', '。', '！', '？'];

impl DisplayStage for OpenEnd {
    fn shown(&mut self, update: &UpdateView<'_>) -> usize {
        let n = update.tokens.len().min(update.pieces.len());
        if update.is_final {
            return update.tokens.len();
        }
        let pieces = &update.pieces[..n];
        let is_closing = |p: &String| {
            let p = p.trim();
            !p.is_empty() && p.chars().all(|c| CLOSING.contains(&c) || c == '"')
        };
        let body = n - pieces.iter().rev().take_while(|p| is_closing(p)).count();
        if body == n {
            return n;
        }
        // The closed word: back to the token that starts it (a piece opening with a space), or
        // one token for scripts without spaces.
        let word_start = pieces[..body]
            .iter()
            .rposition(|p| p.starts_with(char::is_whitespace))
            .unwrap_or(0);
        let unspaced = pieces[..body]
            .iter()
            .all(|p| !p.starts_with(char::is_whitespace));
        if unspaced {
            body.saturating_sub(1)
        } else {
            word_start
        }
    }

    fn reset(&mut self) {}
}

/// Shows what every stage allows (the shortest of their prefixes); every stage sees every
/// update.
#[derive(Clone, Debug, PartialEq)]
pub struct Sequence {
    pub stages: Vec<DisplayPolicy>,
}

impl DisplayStage for Sequence {
    fn shown(&mut self, update: &UpdateView<'_>) -> usize {
        self.stages
            .iter_mut()
            .map(|stage| stage.shown(update))
            .min()
            .unwrap_or(update.tokens.len())
    }

    fn reset(&mut self) {
        self.stages.iter_mut().for_each(DisplayStage::reset);
    }
}

/// `inner`'s display, but a prefix shown by the previous update stays shown while the new
/// output still starts with it: a caption only shrinks when the translation changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    pub inner: Box<DisplayPolicy>,
    shown: Vec<u32>,
}

impl DisplayStage for Hold {
    fn shown(&mut self, update: &UpdateView<'_>) -> usize {
        let mut shown = self.inner.shown(update).min(update.tokens.len());
        if update.tokens.starts_with(&self.shown) {
            shown = shown.max(self.shown.len());
        }
        self.shown = update.tokens[..shown].to_vec();
        shown
    }

    fn reset(&mut self) {
        self.inner.reset();
        self.shown.clear();
    }
}

/// A display policy: one of the stages above, or a combination of them.
#[derive(Clone, Debug, PartialEq)]
pub enum DisplayPolicy {
    Full(Full),
    MaskK(MaskK),
    LocalAgreement(LocalAgreement),
    StabilityThreshold(StabilityThreshold),
    OpenEnd(OpenEnd),
    Sequence(Sequence),
    Hold(Hold),
}

impl Default for DisplayPolicy {
    fn default() -> Self {
        DisplayPolicy::Full(Full)
    }
}

impl DisplayPolicy {
    /// Everything, at once.
    pub fn full() -> Self {
        DisplayPolicy::Full(Full)
    }

    /// Display-only mask-k.
    pub fn mask_k(k: usize) -> Self {
        DisplayPolicy::MaskK(MaskK { k })
    }

    /// What the last `n` outputs agree on.
    pub fn local_agreement(n: usize) -> Self {
        DisplayPolicy::LocalAgreement(LocalAgreement::new(n))
    }

    /// The prefix of tokens with a biased probability of at least `threshold`.
    pub fn stability(threshold: f32) -> Self {
        DisplayPolicy::StabilityThreshold(StabilityThreshold { threshold })
    }

    /// The output less the ending the model gave its unfinished sentence.
    pub fn open_end() -> Self {
        DisplayPolicy::OpenEnd(OpenEnd)
    }

    /// What every one of `stages` allows.
    pub fn all_of(stages: impl IntoIterator<Item = DisplayPolicy>) -> Self {
        DisplayPolicy::Sequence(Sequence {
            stages: stages.into_iter().collect(),
        })
    }

    /// `inner`, never taking back a shown prefix the output still starts with.
    pub fn hold(inner: DisplayPolicy) -> Self {
        DisplayPolicy::Hold(Hold {
            inner: Box::new(inner),
            shown: Vec::new(),
        })
    }

    /// Whether every output is shown whole (nothing is ever held back).
    pub fn shows_everything(&self) -> bool {
        match self {
            DisplayPolicy::Full(_) => true,
            DisplayPolicy::MaskK(m) => m.k == 0,
            DisplayPolicy::LocalAgreement(l) => l.n <= 1,
            DisplayPolicy::StabilityThreshold(s) => s.threshold <= 0.0,
            DisplayPolicy::OpenEnd(_) => false,
            DisplayPolicy::Sequence(s) => s.stages.iter().all(Self::shows_everything),
            DisplayPolicy::Hold(h) => h.inner.shows_everything(),
        }
    }

    /// A short name for tables: `full`, `mask-3`, `LA-2`, `p≥0.6`, `open end`, `LA-2 + p≥0.6`,
    /// `hold(…)`.
    pub fn label(&self) -> String {
        match self {
            DisplayPolicy::Full(_) => "full".into(),
            DisplayPolicy::MaskK(m) => format!("mask-{}", m.k),
            DisplayPolicy::LocalAgreement(l) => format!("LA-{}", l.n),
            DisplayPolicy::StabilityThreshold(s) => format!("p≥{}", s.threshold),
            DisplayPolicy::OpenEnd(_) => "open end".into(),
            DisplayPolicy::Sequence(s) => s
                .stages
                .iter()
                .map(Self::label)
                .collect::<Vec<_>>()
                .join(" + "),
            DisplayPolicy::Hold(h) => format!("hold({})", h.inner.label()),
        }
    }

    fn stage(&mut self) -> &mut dyn DisplayStage {
        match self {
            DisplayPolicy::Full(s) => s,
            DisplayPolicy::MaskK(s) => s,
            DisplayPolicy::LocalAgreement(s) => s,
            DisplayPolicy::StabilityThreshold(s) => s,
            DisplayPolicy::OpenEnd(s) => s,
            DisplayPolicy::Sequence(s) => s,
            DisplayPolicy::Hold(s) => s,
        }
    }
}

impl DisplayStage for DisplayPolicy {
    fn shown(&mut self, update: &UpdateView<'_>) -> usize {
        self.stage().shown(update).min(update.tokens.len())
    }

    fn reset(&mut self) {
        self.stage().reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `policy` over a sentence's outputs (the last one final), with each token's
    /// confidence from `confidence`, and returns the shown token counts.
    fn run(policy: &mut DisplayPolicy, outputs: &[(&[u32], &[f32])]) -> Vec<usize> {
        outputs
            .iter()
            .enumerate()
            .map(|(i, (tokens, confidence))| {
                let pieces: Vec<String> = tokens.iter().map(|t| format!(" w{t}")).collect();
                policy.shown(&UpdateView {
                    tokens,
                    confidence,
                    pieces: &pieces,
                    is_final: i + 1 == outputs.len(),
                })
            })
            .collect()
    }

    fn pieces(text: &[&str]) -> Vec<String> {
        text.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn open_end_hides_the_ending_given_to_an_unfinished_sentence() {
        let shown = |pieces: &[String], is_final| {
            let tokens: Vec<u32> = (0..pieces.len() as u32).collect();
            let confidence = vec![1.0; pieces.len()];
            DisplayPolicy::open_end().shown(&UpdateView {
                tokens: &tokens,
                confidence: &confidence,
                pieces,
                is_final,
            })
        };
        // "Können wir uns treffen?": the closing verb (two tokens) and "?" are hidden.
        let closed = pieces(&["Können", " wir", " uns", " tre", "ffen", "?"]);
        assert_eq!(shown(&closed, false), 3);
        assert_eq!(shown(&closed, true), 6);
        // An output without an ending shows whole.
        let open = pieces(&["Die", " Bus", " zum"]);
        assert_eq!(shown(&open, false), 3);
        // Several closing pieces, and a closing word that is the first word.
        assert_eq!(shown(&pieces(&["Ja", "!", "\""]), false), 0);
        // Without spaces (Chinese), one token before the punctuation.
        assert_eq!(shown(&pieces(&["我们", "明天", "见", "。"]), false), 2);
        assert_eq!(shown(&pieces(&["?"]), false), 0);
    }

    const SURE: [f32; 8] = [1.0; 8];

    #[test]
    fn mask_k_hides_the_tail_of_partial_outputs_only() {
        let mut policy = DisplayPolicy::mask_k(2);
        let outputs: [(&[u32], &[f32]); 3] =
            [(&[1], &SURE), (&[1, 2, 3, 4], &SURE), (&[1, 2, 3], &SURE)];
        assert_eq!(run(&mut policy, &outputs), [0, 2, 3]);
        assert!(!policy.shows_everything());
        assert!(DisplayPolicy::mask_k(0).shows_everything());
    }

    #[test]
    fn local_agreement_shows_what_recent_outputs_share() {
        let mut policy = DisplayPolicy::local_agreement(2);
        let outputs: [(&[u32], &[f32]); 4] = [
            (&[1, 2, 3], &SURE),
            (&[1, 2, 4, 5], &SURE),
            (&[1, 2, 4, 6], &SURE),
            (&[1, 7], &SURE),
        ];
        assert_eq!(run(&mut policy, &outputs), [0, 2, 3, 2]);
        // Three outputs must agree: the first two updates show nothing.
        let mut three = DisplayPolicy::local_agreement(3);
        assert_eq!(run(&mut three, &outputs[..3]), [0, 0, 4]);
        let mut three = DisplayPolicy::local_agreement(3);
        assert_eq!(
            run(
                &mut three,
                &[outputs[0], outputs[1], outputs[2], (&[9], &SURE)]
            ),
            [0, 0, 2, 1]
        );
        // A new sentence forgets the old one.
        policy.reset();
        assert_eq!(run(&mut policy, &outputs[1..3]), [0, 4]);
        assert!(DisplayPolicy::local_agreement(1).shows_everything());
    }

    #[test]
    fn the_stability_threshold_stops_at_the_first_unsure_token() {
        let mut policy = DisplayPolicy::stability(0.5);
        let outputs: [(&[u32], &[f32]); 2] = [
            (&[1, 2, 3, 4], &[0.9, 0.6, 0.4, 0.99]),
            (&[1, 2, 3], &[0.1, 0.1, 0.1]),
        ];
        assert_eq!(run(&mut policy, &outputs), [2, 3]);
    }

    #[test]
    fn a_sequence_shows_what_every_stage_allows_and_hold_keeps_what_still_fits() {
        let outputs: [(&[u32], &[f32]); 4] = [
            (&[1, 2, 3, 4], &[0.9, 0.9, 0.9, 0.9]),
            (&[1, 2, 3, 5, 6], &[0.9, 0.9, 0.2, 0.9, 0.9]),
            (&[1, 8, 9], &[0.9, 0.9, 0.9]),
            (&[1, 8, 9, 10], &[0.9, 0.9, 0.9, 0.9]),
        ];
        let combined =
            || DisplayPolicy::all_of([DisplayPolicy::mask_k(1), DisplayPolicy::stability(0.5)]);
        let mut policy = combined();
        assert_eq!(run(&mut policy, &outputs), [3, 2, 2, 4]);
        assert_eq!(policy.label(), "mask-1 + p≥0.5");
        // Held: the second update still starts with the three tokens shown, so they stay; the
        // third does not, so the display shrinks to what the inner policy allows.
        let mut held = DisplayPolicy::hold(combined());
        assert_eq!(run(&mut held, &outputs), [3, 3, 2, 4]);
        assert_eq!(held.label(), "hold(mask-1 + p≥0.5)");
        held.reset();
        assert_eq!(run(&mut held, &outputs[2..]), [2, 4]);
    }

    #[test]
    fn everything_shows_the_final_output_whole() {
        let policies = [
            DisplayPolicy::full(),
            DisplayPolicy::mask_k(5),
            DisplayPolicy::local_agreement(4),
            DisplayPolicy::stability(0.99),
            DisplayPolicy::open_end(),
            DisplayPolicy::hold(DisplayPolicy::all_of([
                DisplayPolicy::local_agreement(2),
                DisplayPolicy::stability(0.7),
            ])),
        ];
        for mut policy in policies {
            let shown = policy.shown(&UpdateView {
                tokens: &[4, 5, 6],
                confidence: &[0.0, 0.0, 0.0],
                pieces: &pieces(&["a", " b", "."]),
                is_final: true,
            });
            assert_eq!(shown, 3, "{}", policy.label());
        }
    }
}
