//! Cost-aware speculation: choose the draft length, or not to speculate, from what forwards
//! actually cost on this machine and how often the target accepts the draft.
//!
//! With per-token acceptance probability α and draft length γ, one step yields on average
//! (1 − α^(γ+1)) / (1 − α) tokens (Leviathan et al. 2023, eq. 1) and costs the draft's forwards
//! plus one target forward over γ + 1 tokens. The policy picks the γ (0 = plain decoding) that
//! maximises tokens per second for an α drawn from its Beta posterior (Thompson sampling): it
//! keeps exploring while unsure of α and settles once the evidence is clear.

use std::time::Instant;

use rand::RngCore;
use rand_distr::{Beta, Distribution};

use crate::decoder::{forward_tokens, Decoder, LogitRows};
use crate::{Error, Result};

/// Measured wall time of one forward over k new tokens, k = 1..=max.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardCosts {
    /// Seconds; index k − 1.
    seconds: Vec<f64>,
}

/// Forward lengths measured; the others are interpolated.
const MEASURED_LENGTHS: [usize; 9] = [1, 2, 3, 4, 6, 8, 12, 16, 32];

impl ForwardCosts {
    /// Costs from measured `(tokens, seconds)` points, linearly interpolated up to the largest.
    /// A point above a longer forward's is lowered to it: a forward over more tokens does at
    /// least the same work, so such a point was slowed by something else (on a shared machine,
    /// a neighbour), and a cost that falls with length would make every draft look free.
    pub fn from_points(points: &[(usize, f64)]) -> Result<Self> {
        let mut points = points.to_vec();
        points.sort_by_key(|p| p.0);
        let valid = !points.is_empty()
            && points[0].0 == 1
            && points.windows(2).all(|w| w[0].0 < w[1].0)
            && points.iter().all(|p| p.1.is_finite() && p.1 > 0.0);
        if !valid {
            return Err(Error::InvalidConfig(format!(
                "forward costs need distinct lengths starting at 1 with positive times, got {points:?}"
            )));
        }
        for i in (1..points.len()).rev() {
            points[i - 1].1 = points[i - 1].1.min(points[i].1);
        }
        let max = points.last().expect("checked non-empty").0;
        let seconds = (1..=max)
            .map(|k| {
                let i = points.partition_point(|p| p.0 < k);
                let (hi_k, hi_s) = points[i];
                if hi_k == k || i == 0 {
                    hi_s
                } else {
                    let (lo_k, lo_s) = points[i - 1];
                    lo_s + (hi_s - lo_s) * (k - lo_k) as f64 / (hi_k - lo_k) as f64
                }
            })
            .collect();
        Ok(Self { seconds })
    }

    /// The tokens [`ForwardCosts::measure`] times: a 64-token context and a batch of
    /// `max_tokens` new tokens, spread over a vocabulary of `vocab`. Other implementations'
    /// costs measured on these tokens compare with ours.
    pub fn probe_tokens(vocab: u32, max_tokens: usize) -> (Vec<u32>, Vec<u32>) {
        let context = Self::probe_context(vocab, 64);
        let batch = (0..max_tokens as u64)
            .map(|i| ((i * 104_729 + 5) % u64::from(vocab.max(1))) as u32)
            .collect();
        (context, batch)
    }

    /// The first `len` tokens of the probe's context (the context of [`Self::probe_tokens`] is
    /// the first 64), for timing forwards after a longer or shorter one.
    pub fn probe_context(vocab: u32, len: usize) -> Vec<u32> {
        (0..len as u64)
            .map(|i| ((i * 7919 + 13) % u64::from(vocab.max(1))) as u32)
            .collect()
    }

    /// Times forwards of 1 to `max_tokens` tokens after a 64-token context (best of `repeats`),
    /// rolling each back. Leaves the model's cache empty. Each round times every length once,
    /// so a slow spell of the machine (they last seconds here) slows one round of all lengths
    /// rather than every repeat of a few, which the best of the repeats then ignores.
    pub fn measure<D: Decoder + ?Sized>(
        model: &mut D,
        max_tokens: usize,
        repeats: usize,
    ) -> Result<Self> {
        if max_tokens == 0 || repeats == 0 || model.vocab_size() == 0 {
            return Err(Error::InvalidConfig(format!(
                "measuring forward costs needs at least one token, one repeat and a vocabulary, \
                 got {max_tokens} tokens, {repeats} repeats, a vocabulary of {}",
                model.vocab_size()
            )));
        }
        let (context, batch) = Self::probe_tokens(model.vocab_size() as u32, max_tokens);
        model.reset();
        forward_tokens(model, &context, LogitRows::Last(1))?;
        // One untimed forward lets lazily prepared weights (repacking) settle.
        forward_tokens(model, &batch[..1], LogitRows::All)?;
        model.truncate(context.len())?;
        let mut points: Vec<(usize, f64)> = MEASURED_LENGTHS
            .iter()
            .filter(|&&k| k <= max_tokens)
            .map(|&k| (k, f64::INFINITY))
            .collect();
        for _ in 0..repeats.max(1) {
            for (k, best) in points.iter_mut() {
                let started = Instant::now();
                forward_tokens(model, &batch[..*k], LogitRows::All)?;
                *best = best.min(started.elapsed().as_secs_f64());
                model.truncate(context.len())?;
            }
        }
        model.reset();
        Self::from_points(&points)
    }

    /// Seconds for a forward over `tokens` (the largest measured length's cost scaled linearly
    /// beyond it).
    pub fn cost(&self, tokens: usize) -> f64 {
        let max = self.seconds.len();
        match tokens {
            0 => 0.0,
            k if k <= max => self.seconds[k - 1],
            k => self.seconds[max - 1] * k as f64 / max as f64,
        }
    }

    /// The measured lengths and their costs, for reports.
    pub fn table(&self) -> Vec<(usize, f64)> {
        self.seconds
            .iter()
            .enumerate()
            .map(|(i, &s)| (i + 1, s))
            .collect()
    }
}

/// A running estimate of α, the probability that a guessed token is accepted given that the
/// ones before it were: decayed counts of accepted tokens and of rejections (at most one per
/// check, where the accepted run breaks), from a prior.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AcceptanceRate {
    accepted: f64,
    rejected: f64,
    /// Weight of the counts so far at each new check.
    decay: f64,
}

impl AcceptanceRate {
    /// The prior `accepted / (accepted + rejected)` with the weight of that many tokens.
    pub fn new(accepted: f64, rejected: f64, decay: f64) -> Self {
        Self {
            accepted,
            rejected,
            decay,
        }
    }

    /// The current estimate, below 1.
    pub fn rate(&self) -> f64 {
        (self.accepted / (self.accepted + self.rejected)).clamp(0.0, 0.999)
    }

    /// An α drawn from the Beta posterior of the counts (the estimate where they cannot form
    /// one).
    pub fn sample(&self, rng: &mut dyn RngCore) -> f64 {
        Beta::new(self.accepted, self.rejected)
            .map_or_else(|_| self.rate(), |beta| beta.sample(rng))
            .clamp(0.0, 0.999)
    }

    /// `offered` tokens were checked and the first `accepted` of them accepted.
    pub fn observe(&mut self, offered: usize, accepted: usize) {
        if offered == 0 {
            return;
        }
        let rejected = usize::from(accepted < offered);
        self.accepted = self.decay * self.accepted + accepted as f64;
        self.rejected = self.decay * self.rejected + rejected as f64;
    }
}

/// Tokens one verification of a `gamma`-token draft yields on average when each drafted token
/// holds with probability `alpha` given the ones before it: (1 − α^(γ+1)) / (1 − α)
/// (Leviathan et al. 2023, eq. 1; the target's own token included).
pub fn expected_tokens(gamma: usize, alpha: f64) -> f64 {
    (1.0 - alpha.powi(gamma as i32 + 1)) / (1.0 - alpha)
}

/// Chooses draft lengths that maximise expected tokens per second.
#[derive(Clone, Debug, PartialEq)]
pub struct CostAwarePolicy {
    target: ForwardCosts,
    draft: ForwardCosts,
    max_draft: usize,
    acceptance: AcceptanceRate,
    /// Whether [`CostAwarePolicy::choose`] samples α from its posterior (Thompson sampling,
    /// which now and then tries a draft the mean says is not worth it) or uses the mean.
    explore: bool,
}

impl CostAwarePolicy {
    /// A policy for a target/draft pair with these costs, drafting at most `max_draft` tokens.
    pub fn new(target: ForwardCosts, draft: ForwardCosts, max_draft: usize) -> Self {
        Self {
            target,
            draft,
            max_draft,
            // α = 0.6 with the weight of a few tokens; past steps weigh 0.9 per step.
            acceptance: AcceptanceRate::new(3.0, 2.0, 0.9),
            explore: true,
        }
    }

    /// The same policy choosing by the mean acceptance, never trying a draft to learn more:
    /// for steps whose every millisecond is latency (a spoken answer after the last word).
    pub fn without_exploration(mut self) -> Self {
        self.explore = false;
        self
    }

    /// The longest draft it may choose.
    pub fn max_draft(&self) -> usize {
        self.max_draft
    }

    /// The current estimate of α, the probability that a draft token is accepted.
    pub fn acceptance(&self) -> f64 {
        self.acceptance.rate()
    }

    /// Expected tokens per second of one step with draft length `gamma` at acceptance `alpha`,
    /// when the draft has not yet seen the last `draft_lag` committed tokens (its first forward
    /// catches up on them: 1 or 2 while speculating, more after plain steps).
    pub fn throughput(&self, gamma: usize, alpha: f64, draft_lag: usize) -> f64 {
        if gamma == 0 {
            return 1.0 / self.target.cost(1);
        }
        let tokens = expected_tokens(gamma, alpha);
        let draft = self.draft.cost(draft_lag.max(1)) + (gamma - 1) as f64 * self.draft.cost(1);
        tokens / (draft + self.target.cost(gamma + 1))
    }

    /// The draft length for the next step, at most `budget` (0 = decode without a draft), for
    /// a draft that lags `draft_lag` tokens behind.
    pub fn choose(&self, budget: usize, draft_lag: usize, rng: &mut dyn RngCore) -> usize {
        let alpha = match self.explore {
            true => self.acceptance.sample(rng),
            false => self.acceptance.rate(),
        };
        self.best_length(budget, alpha, draft_lag)
    }

    /// The draft length with the highest expected throughput at acceptance `alpha`.
    pub fn best_length(&self, budget: usize, alpha: f64, draft_lag: usize) -> usize {
        let rate = |gamma| self.throughput(gamma, alpha, draft_lag);
        (0..=self.max_draft.min(budget))
            .max_by(|&a, &b| rate(a).total_cmp(&rate(b)))
            .unwrap_or(0)
    }

    /// Records a step's outcome.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        self.acceptance.observe(drafted, accepted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn costs(points: &[(usize, f64)]) -> ForwardCosts {
        ForwardCosts::from_points(points).unwrap()
    }

    #[test]
    fn interpolates_between_measured_lengths() {
        let c = costs(&[(1, 0.010), (4, 0.016), (8, 0.024)]);
        assert_eq!(c.cost(1), 0.010);
        assert!((c.cost(2) - 0.012).abs() < 1e-12);
        assert!((c.cost(6) - 0.020).abs() < 1e-12);
        assert!((c.cost(16) - 0.048).abs() < 1e-12);
        assert_eq!(c.cost(0), 0.0);
        assert!(ForwardCosts::from_points(&[(2, 0.1)]).is_err());
        // A point slower than a longer forward was slowed by something else: it is lowered.
        let noisy = costs(&[(1, 0.109), (2, 0.112), (4, 0.082), (8, 0.296)]);
        assert_eq!(
            noisy.table()[..4],
            [(1, 0.082), (2, 0.082), (3, 0.082), (4, 0.082)]
        );
        assert_eq!(noisy.cost(8), 0.296);
        assert!((1..8).all(|k| noisy.cost(k) <= noisy.cost(k + 1)));
        assert!(ForwardCosts::from_points(&[(1, 0.1), (1, 0.2)]).is_err());
    }

    #[test]
    fn speculates_only_when_it_pays() {
        // A cheap draft and a target whose batched forwards cost little more than one token.
        let cheap = CostAwarePolicy::new(
            costs(&[(1, 0.030), (8, 0.036)]),
            costs(&[(1, 0.003), (8, 0.004)]),
            8,
        );
        // At the prior α = 0.6 a step yields at most 2.5 tokens: γ = 3 is the best trade-off.
        assert_eq!(cheap.best_length(100, cheap.acceptance(), 2), 3);
        assert!(cheap.throughput(3, 0.6, 2) > 1.4 * cheap.throughput(0, 0.6, 2));
        // The peer figures of this CPU: verification of 4 tokens costs 2.4 target tokens and the
        // draft costs 60 % of a target token: speculation loses unless nearly every token is kept.
        let costly = costs(&[(1, 0.029), (2, 0.048), (4, 0.072), (8, 0.146)]);
        let slow_draft = costs(&[(1, 0.019), (2, 0.030), (4, 0.044), (8, 0.056)]);
        let mut policy = CostAwarePolicy::new(costly, slow_draft, 8);
        assert_eq!(policy.best_length(100, policy.acceptance(), 2), 0);
        for _ in 0..30 {
            policy.observe(2, 0);
        }
        let mut rng = StdRng::seed_from_u64(1);
        let drafting = (0..1000)
            .filter(|_| policy.choose(100, 2, &mut rng) > 0)
            .count();
        assert!(
            drafting < 50,
            "a rejected draft is rarely tried again: {drafting}/1000"
        );
    }

    #[test]
    fn acceptance_estimate_follows_observations() {
        let mut p = CostAwarePolicy::new(costs(&[(1, 0.03), (8, 0.04)]), costs(&[(1, 0.003)]), 8);
        let start = p.best_length(100, p.acceptance(), 2);
        for _ in 0..40 {
            p.observe(4, 0);
        }
        assert!(p.acceptance() < 0.1);
        assert!(
            p.best_length(100, p.acceptance(), 2) < start,
            "poor acceptance shortens the draft"
        );
        for _ in 0..40 {
            p.observe(4, 4);
        }
        assert!(p.acceptance() > 0.9);
        assert_eq!(
            p.choose(3, 2, &mut StdRng::seed_from_u64(0)),
            3,
            "never beyond the budget"
        );
    }

    #[test]
    fn uncertainty_makes_it_explore() {
        // At the prior, drafting is slightly worse than plain decoding on average, but α is
        // uncertain: some steps draft, and evidence of high acceptance makes drafting the rule.
        let mut p = CostAwarePolicy::new(
            costs(&[(1, 0.075), (2, 0.097), (4, 0.111), (8, 0.152)]),
            costs(&[(1, 0.024), (2, 0.044), (4, 0.085)]),
            8,
        );
        let mut rng = StdRng::seed_from_u64(2);
        let exploring = (0..1000).filter(|_| p.choose(100, 2, &mut rng) > 0).count();
        assert!((50..950).contains(&exploring), "{exploring}/1000");
        // A draft far behind must catch up first, which makes resuming unattractive.
        let resuming = (0..1000)
            .filter(|_| p.choose(100, 20, &mut rng) > 0)
            .count();
        assert!(resuming < exploring / 2, "{resuming} vs {exploring}");
        for _ in 0..30 {
            p.observe(4, 4);
        }
        let drafting = (0..1000).filter(|_| p.choose(100, 2, &mut rng) > 0).count();
        assert!(drafting > 950, "{drafting}/1000");
    }

    #[test]
    fn without_exploration_it_follows_the_mean() {
        // The same uncertain prior as above: the mean says plain decoding, so a policy that
        // does not explore never drafts, and drafts always once acceptance is shown high.
        let mut p = CostAwarePolicy::new(
            costs(&[(1, 0.075), (2, 0.097), (4, 0.111), (8, 0.152)]),
            costs(&[(1, 0.024), (2, 0.044), (4, 0.085)]),
            8,
        )
        .without_exploration();
        let mut rng = StdRng::seed_from_u64(2);
        let mean = p.best_length(100, p.acceptance(), 2);
        assert_eq!(mean, 0);
        assert!((0..1000).all(|_| p.choose(100, 2, &mut rng) == mean));
        for _ in 0..30 {
            p.observe(4, 4);
        }
        let mean = p.best_length(100, p.acceptance(), 2);
        assert!(mean > 0);
        assert!((0..1000).all(|_| p.choose(100, 2, &mut rng) == mean));
    }
}
