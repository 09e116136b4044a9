//! When the user's turn is over: after a fixed silence, or after a silence that depends on how
//! complete the words heard read to the chat model (a semantic end of turn).
//!
//! A fixed silence is the wrong length both ways: too long after a complete question (most of
//! the latency once speculation has hidden the model) and too short for a speaker who pauses
//! mid-sentence ("I'd like to book a table for… four people"). With [`TurnEnd::Semantic`] the
//! chat model reads the transcript of each pause and gives P(the user's turn ends here) (its
//! probability that the sentence ends after the words, `engine_llm::EndOfTurn`); the silence waited
//! shrinks from [`SemanticTurnEnd::longest`] when the model expects more words to
//! [`SemanticTurnEnd::shortest`] when it is confident the question is complete (equation in
//! [`SemanticTurnEnd::wait`]). A wrong guess is recovered: speech that resumes within the
//! longest silence continues the same turn (the listener merges the utterances).

use std::time::Duration;

use crate::{Error, Result};

/// How the end of the user's turn is decided.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnEnd {
    /// The endpoint detector's silence ([`crate::EndpointConfig::silence`]) ends every turn.
    Silence,
    /// The silence waited depends on the chat model's end-of-turn probability; the endpoint
    /// detector's silence is the longest wait.
    Semantic(SemanticTurnEnd),
}

/// Settings of the semantic end of turn.
#[derive(Clone, Debug, PartialEq)]
pub struct SemanticTurnEnd {
    /// The silence waited when the model is confident the question is complete. Default
    /// 150 ms: the listener's final margin, so the turn ends as soon as the pause's transcript
    /// has been read.
    pub shortest: Duration,
    /// The silence waited when the model gives the end of the turn no chance, and for a pause
    /// whose transcript is not read yet; also how soon resumed speech continues the turn.
    /// Default 1.2 s.
    pub longest: Duration,
    /// The probability from which the model counts as confident. Default 0.5.
    pub confident: f32,
    /// Whether the estimate weighs Whisper's probability of the pause transcript's last word
    /// (`p · P(end | words) + (1 − p) · P(end | words but the last)`): Whisper often ends the
    /// transcript of a pause with a short word it "heard" in the silence ("I'd like to book a
    /// table for you."), which makes the words read as complete. It costs one Whisper decoder
    /// forward per pause. Default off: on the turn-taking set it cut one pause fewer in 18 but
    /// ended two complete questions of 24 a second late (docs/turns.md).
    pub weigh_last_word: bool,
}

impl Default for SemanticTurnEnd {
    fn default() -> Self {
        Self {
            shortest: Duration::from_millis(150),
            longest: Duration::from_millis(1200),
            confident: 0.5,
            weigh_last_word: false,
        }
    }
}

impl SemanticTurnEnd {
    /// The silence to wait after words whose end-of-turn probability is `probability`:
    /// `longest − (longest − shortest) · min(1, p / confident)`, linear between the longest
    /// wait at p = 0 and the shortest from p = `confident` on.
    pub fn wait(&self, probability: f32) -> Duration {
        let p = if probability.is_finite() {
            probability.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let sure = f64::from(p / self.confident);
        if sure >= 1.0 {
            return self.shortest;
        }
        let range = self.longest.saturating_sub(self.shortest);
        self.longest.saturating_sub(range.mul_f64(sure))
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.shortest > self.longest {
            return Err(Error::Config(format!(
                "the shortest end-of-turn silence ({:?}) is longer than the longest ({:?})",
                self.shortest, self.longest
            )));
        }
        if !(self.confident > 0.0 && self.confident <= 1.0) {
            return Err(Error::Config(format!(
                "the confident end-of-turn probability must be in (0, 1], not {}",
                self.confident
            )));
        }
        Ok(())
    }
}

impl std::str::FromStr for TurnEnd {
    type Err = Error;

    /// `silence` or `semantic`.
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "silence" => Ok(Self::Silence),
            "semantic" => Ok(Self::Semantic(SemanticTurnEnd::default())),
            _ => Err(Error::Config(format!(
                "unknown end of turn `{text}` (silence, semantic)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_shrinks_as_the_model_grows_confident() {
        let policy = SemanticTurnEnd::default();
        assert_eq!(policy.wait(0.0), policy.longest);
        assert_eq!(policy.wait(f32::NAN), policy.longest);
        assert_eq!(policy.wait(0.5), policy.shortest);
        assert_eq!(policy.wait(0.99), policy.shortest);
        assert_eq!(policy.wait(0.25), Duration::from_millis(675));
        let waits: Vec<Duration> = (0..=10).map(|i| policy.wait(i as f32 / 10.0)).collect();
        assert!(waits.windows(2).all(|w| w[1] <= w[0]), "{waits:?}");
    }

    #[test]
    fn settings_are_checked_and_modes_parse() {
        assert!(SemanticTurnEnd::default().validate().is_ok());
        for bad in [
            SemanticTurnEnd {
                shortest: Duration::from_secs(2),
                ..SemanticTurnEnd::default()
            },
            SemanticTurnEnd {
                confident: 0.0,
                ..SemanticTurnEnd::default()
            },
            SemanticTurnEnd {
                confident: f32::NAN,
                ..SemanticTurnEnd::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert_eq!("silence".parse::<TurnEnd>().unwrap(), TurnEnd::Silence);
        assert!(matches!(
            "semantic".parse::<TurnEnd>().unwrap(),
            TurnEnd::Semantic(_)
        ));
        assert!("vad".parse::<TurnEnd>().is_err());
    }
}
