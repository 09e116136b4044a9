//! Verification of a previous output as the continuation of a new prompt, in one forward.
//!
//! Live re-translation (SSBD) and input-time speculation (PredGen) share one step: the prompt
//! has changed (a longer source, a longer question), a previous output exists, and the model
//! should keep as much of that output as it still agrees with. One forward over the part of the
//! prompt not yet cached, followed by the whole previous output, is at once the prefill of the
//! new prompt and the verification of every output token: [`speculate`](crate::speculate())'s
//! first step with a drafter that drafts with the prefill ([`PreviousOutput`](crate::PreviousOutput)),
//! and PredGen's check of a guess.

use crate::decoder::{forward_tokens, rewind_to_prefix, Decoder, LogitRows};
use crate::logits::Logits;
use crate::{Error, Result};

/// Forwards `prompt` (reusing the longest cached prefix, but always recomputing its last token)
/// followed by `previous`, in one pass. Returns `previous.len() + 1` logit rows: row `i`
/// predicts the token after `prompt + previous[..i]`. Afterwards the cache holds `prompt` and
/// all of `previous`; the caller truncates it to `prompt.len() + kept`.
pub fn forward_continuation<D: Decoder + ?Sized>(
    model: &mut D,
    prompt: &[u32],
    previous: &[u32],
) -> Result<Logits> {
    Ok(forward_after_cached(model, prompt, previous)?.0)
}

/// [`forward_continuation`], with the number of prompt tokens the forward reused from the
/// cache.
pub(crate) fn forward_after_cached<D: Decoder + ?Sized>(
    model: &mut D,
    prompt: &[u32],
    previous: &[u32],
) -> Result<(Logits, usize)> {
    if prompt.is_empty() {
        return Err(Error::EmptyInput("the prompt must hold at least one token"));
    }
    let total = prompt.len() + previous.len();
    if total > model.max_len() {
        return Err(Error::ContextOverflow {
            requested: total,
            max: model.max_len(),
        });
    }
    // The last prompt token's logits judge the first output token, so it is forwarded again.
    let kept = rewind_to_prefix(model, prompt)?;
    let input: Vec<u32> = prompt[kept..].iter().chain(previous).copied().collect();
    let rows = forward_tokens(model, &input, LogitRows::Last(previous.len() + 1))?;
    Ok((rows, kept))
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::acceptance::{Acceptance, AcceptanceRule, Verdict};
    use crate::mock::{MockConfig, MockDecoder};
    use crate::{generate, SamplingConfig, StopConditions};

    /// Keeps the longest prefix of `previous` greedy decoding agrees with, as a caller does.
    fn verify_greedily(
        model: &mut MockDecoder,
        prompt: &[u32],
        previous: &[u32],
    ) -> Result<Verdict> {
        let logits = forward_continuation(model, prompt, previous)?;
        let verdict = AcceptanceRule::greedy().verify_by_judging(previous, &logits)?;
        model.truncate(prompt.len() + verdict.accepted)?;
        Ok(verdict)
    }

    fn greedy_output(config: &MockConfig, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut model = MockDecoder::new(config.clone());
        let stop = StopConditions::new(n);
        let mut rng = StdRng::seed_from_u64(0);
        let sampling = SamplingConfig::greedy();
        generate(&mut model, prompt, &sampling, &stop, &mut rng, &mut |_| {})
            .unwrap()
            .tokens
    }

    #[test]
    fn greedy_keeps_exactly_the_prefix_the_model_agrees_with() {
        let config = MockConfig::target(40, 3);
        let prompt = [1, 2, 3, 4];
        let greedy = greedy_output(&config, &prompt, 10);
        for diverge_at in 0..=greedy.len() {
            let mut previous = greedy.clone();
            if diverge_at < previous.len() {
                previous[diverge_at] = (previous[diverge_at] + 1) % 40;
            }
            let mut model = MockDecoder::new(config.clone());
            // A stale cache from an older, shorter prompt.
            forward_tokens(&mut model, &[1, 2, 9], LogitRows::Last(1)).unwrap();
            let verdict = verify_greedily(&mut model, &prompt, &previous).unwrap();
            assert_eq!(verdict.accepted, diverge_at.min(greedy.len()));
            if diverge_at < greedy.len() {
                assert_eq!(verdict.next_token, greedy[diverge_at]);
            }
            let mut cached = prompt.to_vec();
            cached.extend_from_slice(&previous[..verdict.accepted]);
            assert_eq!(model.cached_tokens(), cached);
        }
    }

    #[test]
    fn an_empty_previous_output_is_a_prefill() {
        let config = MockConfig::target(40, 5);
        let mut model = MockDecoder::new(config.clone());
        let verdict = verify_greedily(&mut model, &[7, 8], &[]).unwrap();
        assert_eq!(verdict.accepted, 0);
        assert_eq!(verdict.next_token, greedy_output(&config, &[7, 8], 1)[0]);
        assert_eq!(model.cached_tokens(), [7, 8]);
    }

    #[test]
    fn bad_requests_are_errors() {
        let mut config = MockConfig::target(40, 5);
        config.max_len = 6;
        let mut model = MockDecoder::new(config);
        assert!(matches!(
            forward_continuation(&mut model, &[], &[1]),
            Err(Error::EmptyInput(_))
        ));
        assert!(matches!(
            forward_continuation(&mut model, &[1, 2, 3], &[4, 5, 6, 7]),
            Err(Error::ContextOverflow {
                requested: 7,
                max: 6
            })
        ));
    }
}
