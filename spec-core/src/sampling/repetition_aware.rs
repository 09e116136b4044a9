//! Repetition-aware sampling (VALL-E 2's RAS; CosyVoice 2's `ras_sampling`, whose settings are
//! the defaults): nucleus sampling (top-p 0.8 within the top 25), and when the drawn token
//! already appears in the last 10 tokens (a share ≥ τ_r = 0.1 of the window), a draw from the
//! whole distribution with that token excluded.
//!
//! Draws take their uniform numbers from a [`Uniforms`] source, so a test can replay the
//! numbers the reference drew: a categorical draw over weights `P` with uniform `u` is the
//! first `i` with `u < Σ_{j ≤ i} P_j / ΣP` (cumulated in f64), the last index if none.

use rand::Rng;

use crate::sampling::softmax;
use crate::{Error, Result};

/// Uniform numbers in [0, 1) for the sampler's draws.
pub trait Uniforms {
    fn next_uniform(&mut self) -> f64;
}

impl<R: Rng> Uniforms for R {
    fn next_uniform(&mut self) -> f64 {
        self.random::<f64>()
    }
}

/// Settings of [`ras_sample`]; the defaults are CosyVoice 2's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RasConfig {
    pub top_p: f32,
    pub top_k: usize,
    /// Tokens looked back at for repetitions.
    pub window: usize,
    /// Share of the window a token may fill before it is drawn again from the whole
    /// distribution.
    pub tau_r: f32,
}

impl Default for RasConfig {
    fn default() -> Self {
        Self {
            top_p: 0.8,
            top_k: 25,
            window: 10,
            tau_r: 0.1,
        }
    }
}

impl RasConfig {
    pub fn validate(&self) -> Result<()> {
        if !nucleus_can_hold_a_token(self.top_p, self.top_k) || self.window == 0 {
            return Err(Error::InvalidConfig(format!(
                "repetition-aware sampling needs 0 < top_p ≤ 1, top_k ≥ 1 and a window ≥ 1, got {self:?}"
            )));
        }
        Ok(())
    }
}

/// The categorical draw over unnormalized `weights` with uniform `u` (see the module docs).
pub fn draw(weights: &[f32], u: f64) -> usize {
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    let mut cumulative = 0.0;
    for (i, &w) in weights.iter().enumerate() {
        cumulative += f64::from(w) / total;
        if u < cumulative {
            return i;
        }
    }
    weights.len().saturating_sub(1)
}

/// The nucleus of `probabilities`: tokens by decreasing probability (ties in index order),
/// taken while their cumulated probability is below `top_p` and fewer than `top_k` are taken
/// (so the token crossing `top_p` is included).
fn nucleus(probabilities: &[f32], top_p: f32, top_k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..probabilities.len()).collect();
    order.sort_by(|&a, &b| probabilities[b].total_cmp(&probabilities[a]));
    let mut cumulative = 0f32;
    let mut kept = Vec::new();
    for &index in &order {
        if cumulative >= top_p || kept.len() >= top_k {
            break;
        }
        cumulative += probabilities[index];
        kept.push(index);
    }
    kept
}

/// Whether a nucleus of these settings keeps at least one token: 0 < `top_p` ≤ 1, `top_k` ≥ 1.
fn nucleus_can_hold_a_token(top_p: f32, top_k: usize) -> bool {
    top_p > 0.0 && top_p <= 1.0 && top_k > 0
}

/// `Err` for no scores to sample from.
fn check_scores(scores: &[f32]) -> Result<()> {
    if scores.is_empty() {
        return Err(Error::EmptyInput("no scores to sample from"));
    }
    Ok(())
}

/// [`nucleus_sample`] of checked scores and settings.
fn draw_from_nucleus(scores: &[f32], top_p: f32, top_k: usize, uniforms: &mut dyn Uniforms) -> u32 {
    let probabilities = softmax(scores);
    let kept = nucleus(&probabilities, top_p, top_k);
    let weights: Vec<f32> = kept.iter().map(|&i| probabilities[i]).collect();
    kept[draw(&weights, uniforms.next_uniform())] as u32
}

/// Nucleus sampling over log-probabilities `scores`: one token of the nucleus (the most likely
/// tokens until their probabilities reach `top_p`, at most `top_k`) drawn in proportion to its
/// probability. `Err` for empty `scores` or a nucleus that could hold no token.
pub fn nucleus_sample(
    scores: &[f32],
    top_p: f32,
    top_k: usize,
    uniforms: &mut dyn Uniforms,
) -> Result<u32> {
    check_scores(scores)?;
    if !nucleus_can_hold_a_token(top_p, top_k) {
        return Err(Error::InvalidConfig(format!(
            "nucleus sampling needs 0 < top_p ≤ 1 and top_k ≥ 1, got top_p {top_p}, top_k {top_k}"
        )));
    }
    Ok(draw_from_nucleus(scores, top_p, top_k, uniforms))
}

/// The distribution [`ras_sample`] draws from, exactly: each nucleus token keeps its share of
/// the nucleus, except that the share of a token repeated within the window is spread over
/// the whole distribution without it. Speculative decoding needs it to judge a drafted token
/// by the distribution the sampler really used (Speech Speculative Decoding, §3). `Err` for
/// empty `scores` or a configuration [`RasConfig::validate`] refuses.
pub fn ras_distribution(scores: &[f32], decoded: &[u32], config: &RasConfig) -> Result<Vec<f32>> {
    config.validate()?;
    check_scores(scores)?;
    let probabilities = softmax(scores);
    let kept = nucleus(&probabilities, config.top_p, config.top_k);
    let nucleus: f64 = kept.iter().map(|&i| f64::from(probabilities[i])).sum();
    let recent = &decoded[decoded.len().saturating_sub(config.window)..];
    let mut distribution = vec![0f64; scores.len()];
    for &i in &kept {
        let share = f64::from(probabilities[i]) / nucleus;
        let repeats = recent.iter().filter(|&&t| t as usize == i).count();
        if repeats as f32 >= config.window as f32 * config.tau_r {
            let rest = 1.0 - f64::from(probabilities[i]);
            for (t, d) in distribution.iter_mut().enumerate() {
                if t != i && rest > 0.0 {
                    *d += share * f64::from(probabilities[t]) / rest;
                }
            }
        } else {
            distribution[i] += share;
        }
    }
    Ok(distribution.into_iter().map(|d| d as f32).collect())
}

/// Repetition-aware sampling of the next token after `decoded` from log-probabilities
/// `scores` (modified in place when the fallback excludes a token). `Err` for empty `scores`
/// or a configuration [`RasConfig::validate`] refuses.
pub fn ras_sample(
    scores: &mut [f32],
    decoded: &[u32],
    config: &RasConfig,
    uniforms: &mut dyn Uniforms,
) -> Result<u32> {
    config.validate()?;
    check_scores(scores)?;
    let token = draw_from_nucleus(scores, config.top_p, config.top_k, uniforms);
    let recent = &decoded[decoded.len().saturating_sub(config.window)..];
    let repeats = recent.iter().filter(|&&t| t == token).count();
    if repeats as f32 >= config.window as f32 * config.tau_r {
        scores[token as usize] = f32::NEG_INFINITY;
        return Ok(draw(&softmax(scores), uniforms.next_uniform()) as u32);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<f64>);

    impl Uniforms for Fixed {
        fn next_uniform(&mut self) -> f64 {
            self.0.remove(0)
        }
    }

    #[test]
    fn sampling_settings_that_leave_no_token_are_errors_not_panics() {
        let scores: Vec<f32> = [0.5f32, 0.3, 0.2].iter().map(|p| p.ln()).collect();
        let mut u = Fixed(vec![0.5; 8]);
        assert!(matches!(
            nucleus_sample(&scores, 0.8, 0, &mut u),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            nucleus_sample(&scores, 0.0, 5, &mut u),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            nucleus_sample(&[], 0.8, 5, &mut u),
            Err(Error::EmptyInput(_))
        ));
        let no_top_k = RasConfig {
            top_k: 0,
            ..RasConfig::default()
        };
        assert!(ras_distribution(&scores, &[], &no_top_k).is_err());
        assert!(ras_sample(&mut scores.clone(), &[], &no_top_k, &mut u).is_err());
        assert!(ras_distribution(&[], &[], &RasConfig::default()).is_err());
    }

    #[test]
    fn draws_follow_the_cumulative_weights() {
        assert_eq!(draw(&[1.0, 1.0, 2.0], 0.0), 0);
        assert_eq!(draw(&[1.0, 1.0, 2.0], 0.3), 1);
        assert_eq!(draw(&[1.0, 1.0, 2.0], 0.5), 2);
        assert_eq!(draw(&[1.0, 1.0, 2.0], 0.999_999_9), 2);
    }

    #[test]
    fn the_nucleus_includes_the_token_that_crosses_top_p() {
        // Probabilities 0.5, 0.3, 0.2 (in log space): 0.5 < 0.8 takes the second token,
        // 0.8 is not below 0.8, so the third is left out.
        let scores: Vec<f32> = [0.5f32, 0.3, 0.2].iter().map(|p| p.ln()).collect();
        for (u, token) in [(0.1, 0), (0.7, 1), (0.99, 1)] {
            assert_eq!(
                nucleus_sample(&scores, 0.8, 25, &mut Fixed(vec![u])).unwrap(),
                token
            );
        }
        // top_k = 1 is greedy.
        assert_eq!(
            nucleus_sample(&scores, 0.8, 1, &mut Fixed(vec![0.99])).unwrap(),
            0
        );
    }

    #[test]
    fn a_recent_repeat_is_drawn_again_without_it() {
        let mut scores: Vec<f32> = [0.5f32, 0.3, 0.2].iter().map(|p| p.ln()).collect();
        let config = RasConfig::default();
        // Token 0 (drawn by u = 0.1) was decoded 3 tokens ago: the second draw (u = 0.1 of
        // the distribution without it: 0.3 / 0.5 → token 1) replaces it.
        let token =
            ras_sample(&mut scores, &[0, 2, 1], &config, &mut Fixed(vec![0.1, 0.1])).unwrap();
        assert_eq!(token, 1);
        assert_eq!(scores[0], f32::NEG_INFINITY);
        // Outside the window it stays.
        let mut scores: Vec<f32> = [0.5f32, 0.3, 0.2].iter().map(|p| p.ln()).collect();
        let old = [vec![0], vec![2; 10]].concat();
        assert_eq!(
            ras_sample(&mut scores, &old, &config, &mut Fixed(vec![0.1])).unwrap(),
            0
        );
    }

    #[test]
    fn the_distribution_is_what_the_sampler_draws_from() {
        use rand::SeedableRng;
        let scores: Vec<f32> = [0.35f32, 0.25, 0.2, 0.1, 0.06, 0.04]
            .iter()
            .map(|p| p.ln())
            .collect();
        let config = RasConfig::default();
        // Token 1 was decoded recently: its share goes to the rest.
        let decoded = [5, 1, 4];
        let expected = ras_distribution(&scores, &decoded, &config).unwrap();
        assert!((expected.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert_eq!(expected[1], 0.0, "a repeated token is never drawn");
        assert!(
            expected[5] > 0.0,
            "outside the nucleus, reachable through the fallback"
        );
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let draws = 200_000;
        let mut counts = [0usize; 6];
        for _ in 0..draws {
            let mut s = scores.clone();
            counts[ras_sample(&mut s, &decoded, &config, &mut rng).unwrap() as usize] += 1;
        }
        for (count, p) in counts.iter().zip(&expected) {
            let frequency = *count as f32 / draws as f32;
            assert!((frequency - p).abs() < 0.005, "{frequency} vs {p}");
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        for bad in [
            RasConfig {
                top_p: 0.0,
                ..RasConfig::default()
            },
            RasConfig {
                top_k: 0,
                ..RasConfig::default()
            },
            RasConfig {
                window: 0,
                ..RasConfig::default()
            },
        ] {
            assert!(bad.validate().is_err());
        }
    }
}
