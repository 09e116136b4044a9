//! Acceptance rules: how a target model judges a draft.
//!
//! Every rule implements [`Acceptance`]; [`AcceptanceRule`] is the enum of all of them, the type
//! the loops take. Deterministic rules judge one token at a time from the target's logits
//! ([`Acceptance::judge`]) and so also verify token trees; speculative sampling needs the draft's
//! probabilities and randomness and verifies linear drafts only.

use rand::{Rng, RngCore};

use crate::logits::Logits;
use crate::sampling::{argmax, in_top_k, sample, softmax, SamplingConfig};
use crate::{Error, Result};

/// Outcome of verifying a linear draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// How many draft tokens were kept (a prefix of the draft).
    pub accepted: usize,
    /// The target's own token after the kept prefix: the correction at the first rejection, or
    /// the bonus token after a full accept.
    pub next_token: u32,
}

/// What a rule judges: a linear draft and the target's logits after each of its prefixes.
#[derive(Clone, Copy, Debug)]
pub struct DraftCheck<'a> {
    /// The drafted tokens.
    pub draft: &'a [u32],
    /// `draft.len() + 1` rows of target logits; row `i` predicts the token after `draft[..i]`.
    /// Any repetition penalty is already applied.
    pub target_logits: &'a Logits,
    /// For rules that need it: the distribution each draft token was drawn from (one row per
    /// draft token), computed with the same `sampling` configuration.
    pub draft_probs: &'a [Vec<f32>],
    /// How tokens are drawn (speculative sampling only).
    pub sampling: &'a SamplingConfig,
}

/// Fails unless there is one row of target logits per draft token and one after the last.
fn check_target_rows(draft: &[u32], target_logits: &Logits) -> Result<()> {
    if target_logits.len() != draft.len() + 1 {
        return Err(Error::LogitsShape {
            got: vec![target_logits.len()],
            expected: format!("{} target rows (draft length + 1)", draft.len() + 1),
        });
    }
    Ok(())
}

/// A way of deciding which draft tokens the target keeps.
pub trait Acceptance {
    /// Whether the target keeps `token` given its logits at that position, for rules that decide
    /// token by token without randomness; `None` for rules that cannot (speculative sampling).
    fn judge(&self, token: u32, target_logits: &[f32]) -> Option<bool>;

    /// Checks the rule's parameters ([`Error::InvalidConfig`] when out of range); the tree
    /// verifications and speculative sampling's check call it before judging anything.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// The target's own token where the draft stops: argmax for deterministic rules.
    fn correction(&self, target_logits: &[f32]) -> u32 {
        argmax(target_logits)
    }

    /// Verifies a linear draft: the longest accepted prefix, then the target's next token.
    fn verify(&self, check: &DraftCheck<'_>, _rng: &mut dyn RngCore) -> Result<Verdict> {
        self.verify_by_judging(check.draft, check.target_logits)
    }

    /// Verifies a linear draft token by token with [`Acceptance::judge`], without randomness or
    /// draft probabilities (`target_logits`: `draft.len() + 1` rows, as in [`DraftCheck`]);
    /// [`Error::Unsupported`] for rules that cannot judge token by token.
    fn verify_by_judging(&self, draft: &[u32], target_logits: &Logits) -> Result<Verdict> {
        check_target_rows(draft, target_logits)?;
        let mut accepted = 0;
        for (&token, logits) in draft.iter().zip(target_logits.rows()) {
            match self.judge(token, logits) {
                Some(true) => accepted += 1,
                Some(false) => break,
                None => return Err(Error::Unsupported("token-by-token judging with this rule")),
            }
        }
        Ok(Verdict {
            accepted,
            next_token: self.correction(target_logits.row(accepted)),
        })
    }

    /// True when the rule needs randomness and draft probabilities.
    fn is_stochastic(&self) -> bool {
        false
    }
}

/// Accept while the draft token is the target's argmax. Lossless: the output is exactly the
/// target's greedy output.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Greedy;

impl Acceptance for Greedy {
    fn judge(&self, token: u32, target_logits: &[f32]) -> Option<bool> {
        Some(argmax(target_logits) == token)
    }
}

/// Accept while the draft token is among the target's `k` most likely (lossy).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopK {
    pub k: usize,
}

impl Acceptance for TopK {
    fn judge(&self, token: u32, target_logits: &[f32]) -> Option<bool> {
        Some(in_top_k(target_logits, token, self.k))
    }

    fn validate(&self) -> Result<()> {
        if self.k == 0 {
            return Err(Error::InvalidConfig("top-k acceptance needs k >= 1".into()));
        }
        Ok(())
    }
}

/// Accept while the target's probability (softmax at temperature 1) of the draft token is at
/// least `min_prob` (lossy).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    pub min_prob: f32,
}

impl Acceptance for Threshold {
    fn judge(&self, token: u32, target_logits: &[f32]) -> Option<bool> {
        let probs = softmax(target_logits);
        Some(
            probs
                .get(token as usize)
                .is_some_and(|&p| p >= self.min_prob),
        )
    }

    fn validate(&self) -> Result<()> {
        in_unit_interval("threshold", self.min_prob)
    }
}

/// [`Error::InvalidConfig`] unless `value` lies in [0, 1] (NaN does not).
fn in_unit_interval(what: &str, value: f32) -> Result<()> {
    if !(0.0..=1.0).contains(&value) {
        return Err(Error::InvalidConfig(format!(
            "{what} must be in [0, 1], got {value}"
        )));
    }
    Ok(())
}

/// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) with the tolerance factor β
/// of Speech Speculative Decoding. With target distribution q and draft distribution p, draft
/// token x is kept when r < min(1, q(x)/p(x)) + β for r ~ U[0, 1); on rejection the next token
/// is drawn from normalize(max(0, q − p)); after a full accept a bonus token is drawn from q.
/// At β = 0 the output follows the target's distribution exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpeculativeSampling {
    pub tolerance: f32,
}

impl SpeculativeSampling {
    /// The verdict on `draft` given the distribution each draft token was drawn from
    /// (`draft_probs`, one row per token) and the target's distribution at every draft
    /// position and after the last (`target_probs`, `draft.len() + 1` rows) — the
    /// distributions the samplers really draw from, whatever they are (temperature and top-p,
    /// or a TTS model's repetition-aware sampling).
    pub fn verify_distributions(
        &self,
        draft: &[u32],
        draft_probs: &[Vec<f32>],
        target_probs: &[Vec<f32>],
        rng: &mut dyn RngCore,
    ) -> Result<Verdict> {
        Acceptance::validate(self)?;
        if draft_probs.len() != draft.len() || target_probs.len() != draft.len() + 1 {
            return Err(Error::InvalidConfig(format!(
                "speculative sampling needs the draft's distribution for each of the {} draft \
                 tokens and the target's after each and after the last, got {} and {}",
                draft.len(),
                draft_probs.len(),
                target_probs.len()
            )));
        }
        let vocab = target_probs[0].len();
        if let Some(width) = draft_probs
            .iter()
            .chain(target_probs)
            .map(Vec::len)
            .find(|&w| w != vocab || w == 0)
        {
            return Err(Error::InvalidConfig(format!(
                "speculative sampling needs distributions over one vocabulary, got rows of {vocab} \
                 and {width} tokens"
            )));
        }
        if let Some(&token) = draft.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        for (i, (&x, p)) in draft.iter().zip(draft_probs).enumerate() {
            let q = &target_probs[i];
            let (qx, px) = (q[x as usize], p[x as usize]);
            let ratio = if px > 0.0 { (qx / px).min(1.0) } else { 1.0 };
            if rng.random::<f32>() < ratio + self.tolerance {
                continue;
            }
            let residual: Vec<f32> = q.iter().zip(p).map(|(q, p)| (q - p).max(0.0)).collect();
            let next_token = if residual.iter().sum::<f32>() > 0.0 {
                sample(&residual, rng)
            } else {
                sample(q, rng)
            };
            return Ok(Verdict {
                accepted: i,
                next_token,
            });
        }
        Ok(Verdict {
            accepted: draft.len(),
            next_token: sample(&target_probs[draft.len()], rng),
        })
    }
}

impl Acceptance for SpeculativeSampling {
    fn judge(&self, _token: u32, _target_logits: &[f32]) -> Option<bool> {
        None
    }

    fn validate(&self) -> Result<()> {
        in_unit_interval("tolerance β", self.tolerance)
    }

    fn verify(&self, check: &DraftCheck<'_>, rng: &mut dyn RngCore) -> Result<Verdict> {
        check_target_rows(check.draft, check.target_logits)?;
        check.sampling.validate()?;
        let target: Vec<Vec<f32>> = check
            .target_logits
            .rows()
            .map(|row| check.sampling.probabilities(row))
            .collect::<Result<_>>()?;
        self.verify_distributions(check.draft, check.draft_probs, &target, rng)
    }

    fn is_stochastic(&self) -> bool {
        true
    }
}

/// Biased verification of Self-Speculative Biased Decoding: P' = (1 − β)·P + β·onehot(draft
/// token), accept while argmax P' is the draft token. β = 0 is greedy verification.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Biased {
    pub beta: f32,
}

impl Acceptance for Biased {
    fn validate(&self) -> Result<()> {
        in_unit_interval("bias β", self.beta)
    }

    fn judge(&self, token: u32, target_logits: &[f32]) -> Option<bool> {
        if token as usize >= target_logits.len() {
            return Some(false);
        }
        if self.beta == 0.0 {
            // Exactly greedy: compare logits, not rounded probabilities, where ties could differ.
            return Some(argmax(target_logits) == token);
        }
        let mut biased = softmax(target_logits);
        biased.iter_mut().for_each(|p| *p *= 1.0 - self.beta);
        biased[token as usize] += self.beta;
        Some(argmax(&biased) == token)
    }
}

/// Every acceptance rule, selectable at run time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AcceptanceRule {
    Greedy(Greedy),
    TopK(TopK),
    Threshold(Threshold),
    SpeculativeSampling(SpeculativeSampling),
    Biased(Biased),
}

impl Default for AcceptanceRule {
    fn default() -> Self {
        Self::Greedy(Greedy)
    }
}

impl AcceptanceRule {
    /// Greedy verification (lossless).
    pub fn greedy() -> Self {
        Self::Greedy(Greedy)
    }

    /// Top-k verification.
    pub fn top_k(k: usize) -> Self {
        Self::TopK(TopK { k })
    }

    /// Probability-threshold verification.
    pub fn threshold(min_prob: f32) -> Self {
        Self::Threshold(Threshold { min_prob })
    }

    /// Speculative sampling with tolerance β (0 = exact).
    pub fn speculative_sampling(tolerance: f32) -> Self {
        Self::SpeculativeSampling(SpeculativeSampling { tolerance })
    }

    /// Biased verification with bias β.
    pub fn biased(beta: f32) -> Self {
        Self::Biased(Biased { beta })
    }

    /// Checks the rule's parameter range.
    pub fn validate(&self) -> Result<()> {
        self.inner().validate()
    }

    fn inner(&self) -> &dyn Acceptance {
        match self {
            Self::Greedy(r) => r,
            Self::TopK(r) => r,
            Self::Threshold(r) => r,
            Self::SpeculativeSampling(r) => r,
            Self::Biased(r) => r,
        }
    }
}

impl Acceptance for AcceptanceRule {
    fn judge(&self, token: u32, target_logits: &[f32]) -> Option<bool> {
        self.inner().judge(token, target_logits)
    }

    fn validate(&self) -> Result<()> {
        self.inner().validate()
    }

    fn correction(&self, target_logits: &[f32]) -> u32 {
        self.inner().correction(target_logits)
    }

    fn verify(&self, check: &DraftCheck<'_>, rng: &mut dyn RngCore) -> Result<Verdict> {
        self.inner().verify(check, rng)
    }

    fn is_stochastic(&self) -> bool {
        self.inner().is_stochastic()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn logits_of(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    fn verify(rule: AcceptanceRule, draft: &[u32], rows: &[Vec<f32>]) -> Verdict {
        let check = DraftCheck {
            draft,
            target_logits: &Logits::from_rows(rows).unwrap(),
            draft_probs: &[],
            sampling: &SamplingConfig::greedy(),
        };
        rule.verify(&check, &mut StdRng::seed_from_u64(0)).unwrap()
    }

    #[test]
    fn greedy_accepts_while_argmax_matches() {
        let rows = vec![
            logits_of(&[0.1, 0.7, 0.2]),
            logits_of(&[0.5, 0.2, 0.3]),
            logits_of(&[0.2, 0.2, 0.6]),
        ];
        assert_eq!(
            verify(AcceptanceRule::greedy(), &[1, 0], &rows),
            Verdict {
                accepted: 2,
                next_token: 2
            }
        );
        assert_eq!(
            verify(AcceptanceRule::greedy(), &[1, 2], &rows),
            Verdict {
                accepted: 1,
                next_token: 0
            }
        );
        assert_eq!(
            verify(AcceptanceRule::greedy(), &[2, 0], &rows),
            Verdict {
                accepted: 0,
                next_token: 1
            }
        );
    }

    #[test]
    fn top_k_accepts_runners_up() {
        let rows = vec![
            logits_of(&[0.1, 0.5, 0.4]),
            logits_of(&[0.6, 0.3, 0.1]),
            logits_of(&[1.0, 0.0, 0.0]),
        ];
        let v = verify(AcceptanceRule::top_k(2), &[2, 2], &rows);
        assert_eq!(
            v,
            Verdict {
                accepted: 1,
                next_token: 0
            }
        );
        let v = verify(AcceptanceRule::top_k(3), &[2, 2], &rows);
        assert_eq!(v.accepted, 2);
    }

    #[test]
    fn threshold_compares_target_probability() {
        let rows = vec![logits_of(&[0.25, 0.35, 0.4]), logits_of(&[0.5, 0.5, 0.0])];
        assert_eq!(
            verify(AcceptanceRule::threshold(0.3), &[1], &rows).accepted,
            1
        );
        assert_eq!(
            verify(AcceptanceRule::threshold(0.3), &[0], &rows),
            Verdict {
                accepted: 0,
                next_token: 2
            }
        );
    }

    #[test]
    fn biased_verification_keeps_near_ties() {
        // The draft token has 0.4 against the argmax's 0.5.
        let rows = vec![logits_of(&[0.5, 0.4, 0.1]), logits_of(&[0.1, 0.1, 0.8])];
        // β = 0 is greedy: rejected, corrected to 0.
        assert_eq!(
            verify(AcceptanceRule::biased(0.0), &[1], &rows),
            Verdict {
                accepted: 0,
                next_token: 0
            }
        );
        // β = 0.2: P'(1) = 0.8·0.4 + 0.2 = 0.52 > P'(0) = 0.4, accepted.
        assert_eq!(
            verify(AcceptanceRule::biased(0.2), &[1], &rows),
            Verdict {
                accepted: 1,
                next_token: 2
            }
        );
        // β = 0.1: P'(1) = 0.46 > 0.45: accepted; far-off tokens are not.
        assert_eq!(verify(AcceptanceRule::biased(0.1), &[1], &rows).accepted, 1);
        assert_eq!(verify(AcceptanceRule::biased(0.2), &[2], &rows).accepted, 0);
    }

    #[test]
    fn speculative_sampling_accepts_identical_distributions() {
        let q = [0.2f32, 0.5, 0.3];
        let rows = vec![logits_of(&q), logits_of(&q), logits_of(&q)];
        let probs = vec![q.to_vec(), q.to_vec()];
        let sampling = SamplingConfig::with_temperature(1.0);
        let check = DraftCheck {
            draft: &[1, 2],
            target_logits: &Logits::from_rows(&rows).unwrap(),
            draft_probs: &probs,
            sampling: &sampling,
        };
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..100 {
            let v = AcceptanceRule::speculative_sampling(0.0)
                .verify(&check, &mut rng)
                .unwrap();
            assert_eq!(v.accepted, 2);
        }
    }

    #[test]
    fn speculative_sampling_needs_draft_probs() {
        let rows = vec![vec![0.0, 1.0], vec![0.0, 1.0]];
        let sampling = SamplingConfig::with_temperature(1.0);
        let check = DraftCheck {
            draft: &[1],
            target_logits: &Logits::from_rows(&rows).unwrap(),
            draft_probs: &[],
            sampling: &sampling,
        };
        let err =
            AcceptanceRule::speculative_sampling(0.0).verify(&check, &mut StdRng::seed_from_u64(0));
        assert!(matches!(err, Err(Error::InvalidConfig(_))));
        assert_eq!(
            AcceptanceRule::speculative_sampling(0.0).judge(1, &rows[0]),
            None
        );
    }

    #[test]
    fn wrong_number_of_rows_is_an_error() {
        let rows = vec![vec![0.0, 1.0]];
        let check = DraftCheck {
            draft: &[1],
            target_logits: &Logits::from_rows(&rows).unwrap(),
            draft_probs: &[],
            sampling: &SamplingConfig::greedy(),
        };
        assert!(matches!(
            AcceptanceRule::greedy().verify(&check, &mut StdRng::seed_from_u64(0)),
            Err(Error::LogitsShape { .. })
        ));
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        for rule in [
            AcceptanceRule::top_k(0),
            AcceptanceRule::threshold(1.5),
            AcceptanceRule::speculative_sampling(-0.1),
            AcceptanceRule::biased(2.0),
        ] {
            assert!(rule.validate().is_err(), "{rule:?}");
        }
        AcceptanceRule::biased(0.2).validate().unwrap();
    }

    /// Output distribution of one speculative-sampling step (draft of length 1).
    fn first_token_frequencies(
        q: &[f32],
        p: &[f32],
        tolerance: f32,
        trials: usize,
        seed: u64,
    ) -> Vec<f64> {
        let rows = vec![logits_of(q), logits_of(q)];
        let sampling = SamplingConfig::with_temperature(1.0);
        let draft_probs = vec![p.to_vec()];
        let rule = AcceptanceRule::speculative_sampling(tolerance);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut counts = vec![0usize; q.len()];
        for _ in 0..trials {
            let x = sample(p, &mut rng);
            let draft = [x];
            let check = DraftCheck {
                draft: &draft,
                target_logits: &Logits::from_rows(&rows).unwrap(),
                draft_probs: &draft_probs,
                sampling: &sampling,
            };
            let v = rule.verify(&check, &mut rng).unwrap();
            let first = if v.accepted == 1 { x } else { v.next_token };
            counts[first as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / trials as f64).collect()
    }

    fn chi_square(freqs: &[f64], expected: &[f32], trials: usize) -> f64 {
        freqs
            .iter()
            .zip(expected)
            .filter(|(_, &e)| e > 0.0)
            .map(|(&f, &e)| {
                let (o, e) = (f * trials as f64, e as f64 * trials as f64);
                (o - e).powi(2) / e
            })
            .sum()
    }

    #[test]
    fn speculative_sampling_at_zero_tolerance_preserves_the_target_distribution() {
        let trials = 200_000;
        let cases: [(&[f32], &[f32]); 3] = [
            (&[0.1, 0.2, 0.3, 0.4], &[0.4, 0.3, 0.2, 0.1]),
            (&[0.7, 0.1, 0.1, 0.1], &[0.05, 0.05, 0.1, 0.8]),
            (&[0.25, 0.0, 0.5, 0.25], &[0.3, 0.3, 0.1, 0.3]),
        ];
        for (seed, (q, p)) in cases.iter().enumerate() {
            let f = first_token_frequencies(q, p, 0.0, trials, seed as u64);
            let tv: f64 = f
                .iter()
                .zip(*q)
                .map(|(a, &b)| (a - b as f64).abs())
                .sum::<f64>()
                / 2.0;
            // 3 degrees of freedom: the 99.9 % quantile of χ² is 16.27.
            let chi2 = chi_square(&f, q, trials);
            assert!(
                tv < 0.005 && chi2 < 16.27,
                "q={q:?} p={p:?} freq={f:?} tv={tv} chi2={chi2}"
            );
            // A token with q = 0 is never produced.
            for (fi, qi) in f.iter().zip(*q) {
                if *qi == 0.0 {
                    assert_eq!(*fi, 0.0);
                }
            }
        }
    }

    #[test]
    fn tolerance_shifts_the_output_toward_the_draft() {
        let (q, p) = ([0.7f32, 0.1, 0.1, 0.1], [0.05f32, 0.05, 0.1, 0.8]);
        let exact = first_token_frequencies(&q, &p, 0.0, 50_000, 5);
        let tolerant = first_token_frequencies(&q, &p, 0.3, 50_000, 5);
        // Token 3 is the draft's favourite: β lets more of it through.
        assert!(
            tolerant[3] > exact[3] + 0.1,
            "exact={exact:?} tolerant={tolerant:?}"
        );
        let full = first_token_frequencies(&q, &p, 1.0, 50_000, 5);
        for (a, b) in full.iter().zip(p) {
            assert!(
                (a - b as f64).abs() < 0.01,
                "β = 1 accepts every draft token: {full:?}"
            );
        }
    }
}
