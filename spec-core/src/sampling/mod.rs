//! Turning logits into tokens: argmax, softmax, top-k/top-p filtering, temperature,
//! repetition penalty and seeded sampling, pure functions over `f32` slices; the [`Sampler`]
//! trait speculative sampling judges draws by; [`repetition_aware`] sampling for speech tokens.

pub mod repetition_aware;

use std::borrow::Cow;

use rand::Rng;

use crate::{Error, Result};

/// Index of the largest logit (the first one on ties). NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    // One pass of lane-wise (max, index) pairs, which vectorises; lanes are merged at the end.
    const LANES: usize = 16;
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut index = [0u32; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail_start = logits.len() - chunks.remainder().len();
    for (c, chunk) in chunks.enumerate() {
        let base = (c * LANES) as u32;
        for lane in 0..LANES {
            let v = chunk[lane];
            let better = v > best[lane];
            best[lane] = if better { v } else { best[lane] };
            index[lane] = if better {
                base + lane as u32
            } else {
                index[lane]
            };
        }
    }
    let (mut max, mut arg) = (f32::NEG_INFINITY, 0u32);
    for lane in 0..LANES {
        if best[lane] > max || (best[lane] == max && index[lane] < arg) {
            (max, arg) = (best[lane], index[lane]);
        }
    }
    for (i, &v) in logits.iter().enumerate().skip(tail_start) {
        if v > max {
            (max, arg) = (v, i as u32);
        }
    }
    arg
}

/// Numerically stable softmax.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<f32> = logits.iter().map(|&v| (v - max).exp()).collect();
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    probs
}

/// The log-probabilities of `tokens` under `softmax(logits)`, in order: one vectorised pass
/// for the normaliser (its exponentials within 2 ulp of `f32::exp`), cheap enough to rank
/// continuations over a large vocabulary step after step.
pub fn log_probabilities(logits: &[f32], tokens: &[u32]) -> Vec<f32> {
    let max = crate::math::max(logits);
    let ln_sum = crate::math::exp_sum(logits, max).ln();
    tokens
        .iter()
        .map(|&t| logits[t as usize] - max - ln_sum)
        .collect()
}

/// `log_softmax(logits)[token]`, in two vectorised passes (its exponentials within 2 ulp of
/// `f32::exp`): decoders ask it of every token they emit, and with `f32::exp` and a sequential
/// sum it took a quarter of a Whisper-tiny decoding step over 51 864 logits.
pub fn log_probability(logits: &[f32], token: u32) -> f32 {
    let max = crate::math::max(logits);
    logits[token as usize] - max - crate::math::exp_sum(logits, max).ln()
}

/// Largest value of `softmax(logits)`, without allocating, in two vectorised passes (its
/// exponentials within 2 ulp of `f32::exp`): drafters ask it of every row they judge.
pub fn max_probability(logits: &[f32]) -> f32 {
    1.0 / crate::math::exp_sum(logits, crate::math::max(logits))
}

/// The top token, the runner-up (if the row has two tokens) and the top token's probability,
/// in one pass for the tokens and two vectorised passes for the probability (its exponentials
/// within 2 ulp of `f32::exp`): the per-token judgement of a drafter over a large vocabulary.
pub fn top_two_confidence(logits: &[f32]) -> (u32, Option<u32>, f32) {
    let mut best = (0u32, f32::NEG_INFINITY);
    let mut second: Option<(u32, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v > best.1 {
            second = Some(best).filter(|_| i > 0);
            best = (i as u32, v);
        } else if i > 0 && second.is_none_or(|(_, s)| v > s) {
            second = Some((i as u32, v));
        }
    }
    (
        best.0,
        second.map(|(t, _)| t),
        1.0 / crate::math::exp_sum(logits, best.1),
    )
}

/// Whether `token` is among the `k` largest logits (ties counted in its favour).
pub fn in_top_k(logits: &[f32], token: u32, k: usize) -> bool {
    let Some(&value) = logits.get(token as usize) else {
        return false;
    };
    logits.iter().filter(|&&v| v > value).count() < k
}

/// The `k` most likely tokens, most likely first (of equal logits, the lower token first).
pub fn top_k_tokens(logits: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(logits.len());
    let beats = |a: f32, b: f32| a.total_cmp(&b).is_gt();
    if k > 32 {
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit_desc = |a: &u32, b: &u32| {
            let (a, b) = (*a, *b);
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        };
        order.select_nth_unstable_by(k - 1, by_logit_desc);
        order.truncate(k);
        order.sort_by(by_logit_desc);
        return order;
    }
    // One pass keeping the best `k` in order: for the few tokens callers ask for, a
    // comparison per logit instead of ordering an index of the whole vocabulary.
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (token, &value) in logits.iter().enumerate() {
        if best.len() == k && best.last().is_none_or(|&(last, _)| !beats(value, last)) {
            continue;
        }
        let at = best.partition_point(|&(kept, _)| !beats(value, kept));
        best.insert(at, (value, token as u32));
        best.truncate(k);
    }
    best.into_iter().map(|(_, token)| token).collect()
}

/// Draws an index from a probability vector (inverse CDF with one uniform number).
pub fn sample(probs: &[f32], rng: &mut dyn rand::RngCore) -> u32 {
    let total: f32 = probs.iter().sum();
    let mut r = rng.random::<f32>() * total;
    let mut last_nonzero = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            if r < p {
                return i as u32;
            }
            r -= p;
            last_nonzero = i;
        }
    }
    // Rounding can leave `r` just above the last bucket.
    last_nonzero as u32
}

/// What a sampler draws each token from, given the tokens before it: speculative sampling
/// judges a drafted token by the distributions the draft's and the target's samplers really
/// draw from (Leviathan et al. 2023; SSD eq. 5), whatever they are.
pub trait Sampler: Send + Sync + std::fmt::Debug {
    /// Fails unless these settings can draw a token.
    fn validate(&self) -> Result<()>;

    /// The distribution of the token after `before` (the context and every token since), from
    /// the logits `row` after them.
    fn distribution(&self, before: &[u32], row: &[f32]) -> Result<Vec<f32>>;
}

/// [`SamplingConfig::probabilities`] of the row after the repetition penalty for the tokens
/// before it.
impl Sampler for SamplingConfig {
    fn validate(&self) -> Result<()> {
        SamplingConfig::validate(self)
    }

    fn distribution(&self, before: &[u32], row: &[f32]) -> Result<Vec<f32>> {
        self.probabilities(&self.penalize(row, before))
    }
}

/// How the next token is chosen from the target's logits.
///
/// `temperature == 0` means greedy: [`SamplingConfig::probabilities`] is then the one-hot
/// vector of the argmax, so speculative sampling degenerates exactly to greedy verification.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingConfig {
    /// Softmax temperature; 0 for greedy decoding.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens before sampling.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose mass reaches `p` (nucleus sampling).
    pub top_p: Option<f32>,
    /// CTRL-style penalty (> 1 discourages repeats): positive logits of recently seen tokens are
    /// divided by it, negative ones multiplied.
    pub repetition_penalty: f32,
    /// How many of the most recent context tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingConfig {
    /// Plain greedy decoding with no penalty.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
        }
    }

    /// Sampling at `temperature` with no filtering.
    pub fn with_temperature(temperature: f32) -> Self {
        Self {
            temperature,
            ..Self::greedy()
        }
    }

    /// True when tokens are chosen by argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Checks every field's range.
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::InvalidConfig(format!(
                "temperature must be finite and >= 0, got {}",
                self.temperature
            )));
        }
        if self.top_k == Some(0) {
            return Err(Error::InvalidConfig("top_k must be at least 1".into()));
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(Error::InvalidConfig(format!(
                    "top_p must be in (0, 1], got {p}"
                )));
            }
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return Err(Error::InvalidConfig(format!(
                "repetition_penalty must be finite and > 0, got {}",
                self.repetition_penalty
            )));
        }
        Ok(())
    }

    /// Applies the repetition penalty for `context` (the tokens before the predicted one) in
    /// place.
    pub fn apply_penalty(&self, logits: &mut [f32], context: &[u32]) {
        if !self.has_penalty() {
            return;
        }
        let recent = &context[context.len().saturating_sub(self.repeat_last_n)..];
        let mut seen = std::collections::HashSet::with_capacity(recent.len());
        for &t in recent {
            let Some(logit) = logits.get_mut(t as usize) else {
                continue;
            };
            if seen.insert(t) {
                *logit = if *logit > 0.0 {
                    *logit / self.repetition_penalty
                } else {
                    *logit * self.repetition_penalty
                };
            }
        }
    }

    /// The logits after the repetition penalty for `context`; borrowed unchanged when there is
    /// no penalty.
    pub fn penalize<'a>(&self, logits: &'a [f32], context: &[u32]) -> Cow<'a, [f32]> {
        if !self.has_penalty() {
            return Cow::Borrowed(logits);
        }
        let mut out = logits.to_vec();
        self.apply_penalty(&mut out, context);
        Cow::Owned(out)
    }

    /// True when a repetition penalty changes logits (a factor other than 1 over a window).
    pub fn has_penalty(&self) -> bool {
        self.repetition_penalty != 1.0 && self.repeat_last_n > 0
    }

    /// The distribution tokens are drawn from: softmax of `logits / temperature` restricted to
    /// the top-k and top-p sets, or the one-hot argmax when greedy. Penalties are not applied
    /// here (see [`SamplingConfig::penalize`]). Settings [`SamplingConfig::validate`] refuses
    /// (a `top_k` of 0 keeps no token to draw) are refused here with its error.
    pub fn probabilities(&self, logits: &[f32]) -> Result<Vec<f32>> {
        self.validate()?;
        if logits.is_empty() {
            return Ok(Vec::new());
        }
        if self.is_greedy() {
            let mut one_hot = vec![0.0; logits.len()];
            one_hot[argmax(logits) as usize] = 1.0;
            return Ok(one_hot);
        }
        // Tokens outside the top-k get −∞ before the softmax.
        let cutoff = match self.top_k {
            Some(k) if k < logits.len() => {
                let mut sorted = logits.to_vec();
                let (_, kth, _) = sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
                *kth
            }
            _ => f32::NEG_INFINITY,
        };
        let scaled: Vec<f32> = logits
            .iter()
            .map(|&v| {
                if v >= cutoff {
                    v / self.temperature
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        let mut probs = softmax(&scaled);
        if let Some(p) = self.top_p.filter(|&p| p < 1.0) {
            let mut order: Vec<u32> = (0..probs.len() as u32)
                .filter(|&t| probs[t as usize] > 0.0)
                .collect();
            order.sort_unstable_by(|a, b| probs[*b as usize].total_cmp(&probs[*a as usize]));
            let mut mass = 0.0;
            let mut nucleus = order.len();
            for (i, &t) in order.iter().enumerate() {
                mass += probs[t as usize];
                if mass >= p {
                    nucleus = i + 1;
                    break;
                }
            }
            for &t in &order[nucleus..] {
                probs[t as usize] = 0.0;
            }
            let kept: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|q| *q /= kept);
        }
        Ok(probs)
    }

    /// Chooses the next token after `context` from raw `logits`; settings
    /// [`SamplingConfig::validate`] refuses are refused with its error.
    pub fn choose(
        &self,
        logits: &[f32],
        context: &[u32],
        rng: &mut dyn rand::RngCore,
    ) -> Result<u32> {
        let logits = self.penalize(logits, context);
        if self.is_greedy() {
            self.validate()?;
            Ok(argmax(&logits))
        } else {
            Ok(sample(&self.probabilities(&logits)?, rng))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn log_probabilities_are_the_logs_of_the_softmax() {
        let row: Vec<f32> = (0..40)
            .map(|i| ((i * 13) % 7) as f32 * 0.7 - 2.0)
            .chain([f32::NEG_INFINITY])
            .collect();
        let probs = softmax(&row);
        let logs = log_probabilities(&row, &[1, 0, 17, 40]);
        for (log, token) in logs.iter().zip([1, 0, 17]) {
            assert!((log - probs[token].ln()).abs() < 1e-5);
            assert!((log - log_probability(&row, token as u32)).abs() < 1e-5);
        }
        assert_eq!(logs[3], f32::NEG_INFINITY);
        assert_eq!(log_probability(&row, 40), f32::NEG_INFINITY);
    }

    #[test]
    fn top_two_confidence_agrees_with_the_separate_functions() {
        for row in [
            vec![0.5, 3.0, -1.0, 2.0, 2.5],
            vec![-2.0, f32::NEG_INFINITY, 7.0],
            vec![1.0],
            (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect(),
        ] {
            let (top, runner_up, p) = top_two_confidence(&row);
            assert_eq!(top, argmax(&row));
            let expected = top_k_tokens(&row, 2);
            assert_eq!(runner_up, expected.get(1).copied(), "{row:?}");
            assert!((p - max_probability(&row)).abs() < 1e-5);
        }
    }

    #[test]
    fn argmax_takes_first_maximum_and_ignores_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, f32::NAN]), 1);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        // Lengths around the 16-lane blocks, the maximum in the block part and in the tail.
        for len in [1, 15, 16, 17, 33, 100] {
            for at in [0, len / 2, len - 1] {
                let mut v: Vec<f32> = (0..len).map(|i| -(i as f32)).collect();
                v[at] = 5.0;
                assert_eq!(argmax(&v), at as u32, "len {len} max at {at}");
                v.push(5.0);
                assert_eq!(argmax(&v), at as u32, "first of two maxima");
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_orders() {
        let p = softmax(&[1000.0, 999.0, 0.0]);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[0] > p[1] && p[1] > p[2]);
        assert!((max_probability(&[1000.0, 999.0, 0.0]) - p[0]).abs() < 1e-6);
    }

    #[test]
    fn top_k_membership_and_order() {
        let logits = [0.1, 0.9, 0.5, 0.7, 0.2];
        assert_eq!(top_k_tokens(&logits, 3), vec![1, 3, 2]);
        assert_eq!(top_k_tokens(&logits, 9), vec![1, 3, 2, 4, 0]);
        assert!(top_k_tokens(&logits, 0).is_empty());
        // Ties: the lower token first, in both the one-pass and the sorting path.
        let tied = [1.0, 3.0, 1.0, 3.0, f32::NEG_INFINITY, 1.0];
        assert_eq!(top_k_tokens(&tied, 4), vec![1, 3, 0, 2]);
        let wide: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32).collect();
        let mut expected: Vec<u32> = (0..100).collect();
        expected.sort_by(|&a, &b| {
            wide[b as usize]
                .total_cmp(&wide[a as usize])
                .then(a.cmp(&b))
        });
        assert_eq!(top_k_tokens(&wide, 32), expected[..32]);
        assert_eq!(top_k_tokens(&wide, 40), expected[..40]);
        assert!(in_top_k(&logits, 2, 3));
        assert!(!in_top_k(&logits, 4, 3));
        assert!(!in_top_k(&logits, 99, 3));
    }

    #[test]
    fn greedy_probabilities_are_one_hot() {
        let p = SamplingConfig::greedy()
            .probabilities(&[0.0, 2.0, 1.0])
            .unwrap();
        assert_eq!(p, vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn top_k_and_top_p_filter_the_distribution() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let mut cfg = SamplingConfig::with_temperature(1.0);
        cfg.top_k = Some(2);
        let p = cfg.probabilities(&logits).unwrap();
        assert_eq!(p[2], 0.0);
        assert_eq!(p[3], 0.0);
        assert!((p[0] + p[1] - 1.0).abs() < 1e-6);
        let mut cfg = SamplingConfig::with_temperature(1.0);
        cfg.top_p = Some(0.5);
        let p = cfg.probabilities(&logits).unwrap();
        // The top token alone carries ~64 % of the mass.
        assert_eq!(p, vec![1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn a_top_k_of_zero_is_refused_not_a_panic() {
        let no_token = SamplingConfig {
            top_k: Some(0),
            ..SamplingConfig::with_temperature(1.0)
        };
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        assert!(matches!(
            no_token.probabilities(&logits),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            no_token.distribution(&[], &logits),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            no_token.choose(&logits, &[], &mut rand::rng()),
            Err(Error::InvalidConfig(_))
        ));
    }

    #[test]
    fn repetition_penalty_lowers_seen_tokens() {
        let mut cfg = SamplingConfig::greedy();
        cfg.repetition_penalty = 2.0;
        let out = cfg.penalize(&[4.0, -1.0, 3.0], &[0, 1, 0]);
        assert_eq!(&*out, &[2.0, -2.0, 3.0]);
        assert_eq!(
            cfg.choose(&[4.0, -1.0, 3.0], &[0], &mut rand::rng())
                .unwrap(),
            2
        );
    }

    #[test]
    fn sampling_is_seeded_and_follows_probabilities() {
        let probs = [0.1f32, 0.0, 0.6, 0.3];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut counts = [0usize; 4];
        for _ in 0..20_000 {
            counts[sample(&probs, &mut rng) as usize] += 1;
        }
        assert_eq!(counts[1], 0);
        for (c, p) in counts.iter().zip(probs) {
            assert!((*c as f32 / 20_000.0 - p).abs() < 0.015, "{counts:?}");
        }
        let mut a = rand::rngs::StdRng::seed_from_u64(3);
        let mut b = rand::rngs::StdRng::seed_from_u64(3);
        let xs: Vec<u32> = (0..50).map(|_| sample(&probs, &mut a)).collect();
        let ys: Vec<u32> = (0..50).map(|_| sample(&probs, &mut b)).collect();
        assert_eq!(xs, ys);
    }

    #[test]
    fn invalid_configs_are_rejected() {
        for cfg in [
            SamplingConfig::with_temperature(-1.0),
            SamplingConfig {
                top_k: Some(0),
                ..SamplingConfig::greedy()
            },
            SamplingConfig {
                top_p: Some(1.5),
                ..SamplingConfig::greedy()
            },
            SamplingConfig {
                repetition_penalty: 0.0,
                ..SamplingConfig::greedy()
            },
        ] {
            assert!(matches!(cfg.validate(), Err(Error::InvalidConfig(_))));
        }
        SamplingConfig::default().validate().unwrap();
    }
}
