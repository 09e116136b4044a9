//! Adaptive bias: SSBD's β chosen per update from what is known when the update arrives.
//!
//! A fixed β trades stability for tracking the model the same way on every update. Early in a
//! sentence, and when the new words are a large share of the source, the previous translation
//! is least trustworthy (a short sentence's three new words may turn its meaning), and a bias
//! there freezes phrasings that the grown source makes wrong (the paper's Table 3: past β ≈ 0.3
//! quality falls as the draft fails to recover). Later, when an update only adds a little to a
//! long source and the model has kept agreeing with its drafts on its own, the bias mostly
//! suppresses needless rephrasing and can be stronger.

/// What is known about an update before decoding it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BiasInputs {
    /// Words of the source so far.
    pub source_words: usize,
    /// Words of the source this update added or changed (all of them for the first update).
    pub changed_words: usize,
    /// Over the sentence's earlier updates: draft tokens kept, and how many of those only the
    /// bias kept (the model's own argmax was another token).
    pub accepted_so_far: usize,
    pub forced_so_far: usize,
}

/// β = β_max · coverage · steadiness · agreement, β_max the bias of [`Decoding::Ssbd`]
/// (so β_max = 0 stays exactly autoregressive re-translation) and each factor in [0, 1]:
/// - coverage rises linearly from 0 at `min_words` source words to 1 at `full_words`: a
///   short source gets no bias (on short sentences the bias only kept phrasings that the
///   unbiased final update then took back, so captions settled later; `bench_mt`'s short
///   set), a long one the full bias;
/// - steadiness = 1 − changed words / source words: an update that changes much of the source
///   gets less bias;
/// - agreement = 1 − forced / accepted over the earlier updates: a sentence whose drafts were
///   kept against the model's own choice gets less bias, so a wrong early phrasing is let go.
///
/// [`Decoding::Ssbd`]: crate::Decoding::Ssbd
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveBias {
    /// Source words up to which there is no bias.
    pub min_words: usize,
    /// Source words from which on the source's length no longer lowers the bias.
    pub full_words: usize,
}

impl Default for AdaptiveBias {
    fn default() -> Self {
        AdaptiveBias {
            min_words: 8,
            full_words: 16,
        }
    }
}

impl AdaptiveBias {
    /// β for an update with `inputs`, at most `max`.
    pub fn beta(&self, max: f32, inputs: &BiasInputs) -> f32 {
        if inputs.source_words == 0 {
            return 0.0;
        }
        let source = inputs.source_words as f32;
        let ramp = self.full_words.saturating_sub(self.min_words).max(1) as f32;
        let coverage = ((source - self.min_words as f32) / ramp).clamp(0.0, 1.0);
        let steadiness = 1.0 - (inputs.changed_words as f32 / source).min(1.0);
        let agreement = if inputs.accepted_so_far == 0 {
            1.0
        } else {
            1.0 - inputs.forced_so_far.min(inputs.accepted_so_far) as f32
                / inputs.accepted_so_far as f32
        };
        max * coverage * steadiness * agreement
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.full_words <= self.min_words {
            return Err(format!(
                "adaptive β's full_words ({}) must be above min_words ({})",
                self.full_words, self.min_words
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(source_words: usize, changed_words: usize) -> BiasInputs {
        BiasInputs {
            source_words,
            changed_words,
            ..BiasInputs::default()
        }
    }

    #[test]
    fn bias_grows_with_the_source_and_shrinks_with_change_and_forcing() {
        let adaptive = AdaptiveBias {
            min_words: 4,
            full_words: 12,
        };
        let beta = |inputs: &BiasInputs| adaptive.beta(0.4, inputs);
        // A first update changes everything: no bias.
        assert_eq!(beta(&inputs(3, 3)), 0.0);
        // Up to 4 words, no bias at all.
        assert_eq!(beta(&inputs(4, 1)), 0.0);
        // 8 words, 4 new: 0.4 · 0.5 · 0.5.
        assert!((beta(&inputs(8, 4)) - 0.1).abs() < 1e-6);
        // 12 words, 3 new: 0.4 · 1 · 0.75.
        assert!((beta(&inputs(12, 3)) - 0.3).abs() < 1e-6);
        // Nothing changed on a long source: the full bias.
        assert_eq!(beta(&inputs(20, 0)), 0.4);
        // Half the kept tokens were forced: half the bias.
        let forced = BiasInputs {
            accepted_so_far: 10,
            forced_so_far: 5,
            ..inputs(20, 0)
        };
        assert!((beta(&forced) - 0.2).abs() < 1e-6);
        assert_eq!(beta(&inputs(0, 0)), 0.0);
        // Revisions may report more changed words than the source has.
        assert_eq!(beta(&inputs(4, 9)), 0.0);
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(AdaptiveBias::default().validate().is_ok());
        let empty_ramp = AdaptiveBias {
            min_words: 10,
            full_words: 10,
        };
        assert!(empty_ramp.validate().is_err());
    }
}
