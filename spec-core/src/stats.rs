//! Statistics of a decoding run: forward passes, acceptance and where the time went.

use std::fmt;
use std::time::Duration;

/// One draft/verify step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRecord {
    /// Draft tokens (or tree nodes besides the root) offered for verification.
    pub drafted: usize,
    /// Draft tokens the target kept.
    pub accepted: usize,
}

/// Counters and timings of one generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodeStats {
    /// Context tokens forwarded through the target before generating.
    pub prompt_tokens: usize,
    /// Tokens produced.
    pub generated_tokens: usize,
    /// Target forward passes (NFE), the prefill included.
    pub target_forwards: usize,
    /// Draft forward passes.
    pub draft_forwards: usize,
    /// Every draft/verify step, in order (empty for plain decoding).
    pub steps: Vec<StepRecord>,
    /// Time spent drafting.
    pub draft_time: Duration,
    /// Time spent in target forwards and acceptance.
    pub target_time: Duration,
    /// Wall time of the whole run.
    pub total_time: Duration,
    /// Wall time until the first token was produced (the prefill, mostly); the whole run when
    /// none was. Summed over runs by [`DecodeStats::merge`].
    pub first_token_time: Duration,
    /// Generation runs these figures cover (1, or more after [`DecodeStats::merge`]).
    pub runs: usize,
}

impl DecodeStats {
    /// Draft tokens offered over all steps.
    pub fn drafted_tokens(&self) -> usize {
        self.steps.iter().map(|s| s.drafted).sum()
    }

    /// Draft tokens kept over all steps.
    pub fn accepted_tokens(&self) -> usize {
        self.steps.iter().map(|s| s.accepted).sum()
    }

    /// Accepted / drafted tokens (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        ratio(self.accepted_tokens(), self.drafted_tokens())
    }

    /// Generated tokens per target forward pass.
    pub fn tokens_per_target_pass(&self) -> f64 {
        ratio(self.generated_tokens, self.target_forwards)
    }

    /// Mean number of draft tokens offered per step.
    pub fn mean_draft_length(&self) -> f64 {
        ratio(self.drafted_tokens(), self.steps.len())
    }

    /// Generated tokens per second of wall time.
    pub fn tokens_per_second(&self) -> f64 {
        let secs = self.total_time.as_secs_f64();
        if secs > 0.0 {
            self.generated_tokens as f64 / secs
        } else {
            0.0
        }
    }

    /// Tokens after each run's first per second of wall time after it: the steady decoding rate,
    /// without the prompt's prefill (what llama.cpp's `llama-bench` reports as `tg`).
    pub fn decode_tokens_per_second(&self) -> f64 {
        let secs = self
            .total_time
            .saturating_sub(self.first_token_time)
            .as_secs_f64();
        if secs > 0.0 {
            self.generated_tokens.saturating_sub(self.runs) as f64 / secs
        } else {
            0.0
        }
    }

    /// Wall time neither drafting nor in the target: bookkeeping, callbacks, stop checks.
    pub fn other_time(&self) -> Duration {
        self.total_time
            .saturating_sub(self.draft_time)
            .saturating_sub(self.target_time)
    }

    /// Adds another run's counters and times to these.
    pub fn merge(&mut self, other: &DecodeStats) {
        self.prompt_tokens += other.prompt_tokens;
        self.generated_tokens += other.generated_tokens;
        self.target_forwards += other.target_forwards;
        self.draft_forwards += other.draft_forwards;
        self.steps.extend_from_slice(&other.steps);
        self.draft_time += other.draft_time;
        self.target_time += other.target_time;
        self.total_time += other.total_time;
        self.first_token_time += other.first_token_time;
        self.runs += other.runs;
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl fmt::Display for DecodeStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tokens in {:.2?} ({:.1} tok/s); target passes {} ({:.2} tok/pass), draft passes {}",
            self.generated_tokens,
            self.total_time,
            self.tokens_per_second(),
            self.target_forwards,
            self.tokens_per_target_pass(),
            self.draft_forwards,
        )?;
        if !self.steps.is_empty() {
            write!(
                f,
                "; acceptance {:.1} % ({}/{}), mean draft {:.2}",
                100.0 * self.acceptance_rate(),
                self.accepted_tokens(),
                self.drafted_tokens(),
                self.mean_draft_length(),
            )?;
        }
        write!(
            f,
            "; time draft {:.2?} / target {:.2?} / other {:.2?}",
            self.draft_time,
            self.target_time,
            self.other_time()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_figures() {
        let mut s = DecodeStats {
            generated_tokens: 12,
            target_forwards: 4,
            steps: vec![
                StepRecord {
                    drafted: 4,
                    accepted: 4,
                },
                StepRecord {
                    drafted: 4,
                    accepted: 1,
                },
            ],
            draft_time: Duration::from_millis(30),
            target_time: Duration::from_millis(60),
            total_time: Duration::from_millis(100),
            first_token_time: Duration::from_millis(45),
            runs: 1,
            ..Default::default()
        };
        assert_eq!(s.acceptance_rate(), 5.0 / 8.0);
        assert_eq!(s.tokens_per_target_pass(), 3.0);
        assert_eq!(s.mean_draft_length(), 4.0);
        assert_eq!(s.other_time(), Duration::from_millis(10));
        assert!((s.tokens_per_second() - 120.0).abs() < 1e-9);
        assert!((s.decode_tokens_per_second() - 200.0).abs() < 1e-9);
        let copy = s.clone();
        s.merge(&copy);
        assert_eq!(s.generated_tokens, 24);
        assert!((s.decode_tokens_per_second() - 200.0).abs() < 1e-9);
        assert_eq!(s.steps.len(), 4);
        assert_eq!(s.acceptance_rate(), 5.0 / 8.0);
        assert!(s.to_string().contains("acceptance 62.5 %"));
        assert_eq!(DecodeStats::default().acceptance_rate(), 0.0);
    }
}
