//! The end of the user's turn, as the model sees it: the probability that the chat template's
//! end-of-user-turn token comes right after the words heard so far. A question that reads as
//! complete ("What's the weather in Paris tomorrow?") makes it likely, words that stop
//! mid-sentence ("I'd like to book a table for") make it unlikely. The voice pipeline waits a
//! long silence only when the model expects more words (issue 75's semantic end of turn).
//!
//! The forward that measures it is the first forward of the model's completion of the same
//! words ([`PredGen::complete_question_step`]): its most likely token is kept, so that a
//! completion starting from these words does not run it again.

use std::time::Instant;

use spec_core::decoder::{forward_tokens, rewind_to_prefix};
use spec_core::math::softmax_in_place;
use spec_core::sampling::argmax;
use spec_core::LogitRows;

use super::{EventKind, PredGen, TurnState};
use crate::Result;

/// The model's estimate that the user's turn ends after `words`.
#[derive(Clone, Debug, PartialEq)]
pub struct EndOfTurn {
    /// The words heard (a partial transcript).
    pub words: String,
    /// P(the user's turn ends here | the conversation and `words`): the model's probability of
    /// an end token right after the user's words in the chat prompt.
    pub probability: f32,
    /// Whether an end token is the model's most likely next token there: its greedy
    /// completion of the words ends the question at once.
    pub complete: bool,
}

/// An estimate with the model's most likely next token after the words.
#[derive(Clone, Debug)]
pub(super) struct Estimate {
    pub(super) end_of_turn: EndOfTurn,
    pub(super) next_token: u32,
}

impl PredGen<'_> {
    /// The newest estimate of the end of the user's turn, for the newest partial heard that
    /// was estimated (with [`PredGenConfig::estimate_end_of_turn`](crate::predgen::PredGenConfig::estimate_end_of_turn)); `None`
    /// outside a turn or before the first.
    pub fn end_of_turn(&self) -> Option<&EndOfTurn> {
        self.turn
            .as_ref()
            .and_then(|turn| turn.end_of_turn.as_ref())
            .map(|estimate| &estimate.end_of_turn)
    }

    /// The words of the newest partial heard, when they are still to be estimated.
    pub(super) fn end_of_turn_wanted(&self, turn: &TurnState) -> Option<String> {
        if !self.config.estimate_end_of_turn {
            return None;
        }
        let words = turn.pending.as_ref()?.text.clone();
        let known = turn
            .end_of_turn
            .as_ref()
            .is_some_and(|estimate| estimate.end_of_turn.words == words);
        (!known && !words.trim().is_empty()).then_some(words)
    }

    /// Measures the end of the user's turn after `words` (one forward over the chat prompt up to
    /// the end of the words, reusing the cached prefix) and reports it.
    pub(super) fn estimate_end_of_turn(&mut self, turn: &mut TurnState, words: &str) -> Result<()> {
        let started = Instant::now();
        let prompt = self.prompt_for(words)?;
        let words_end = prompt.len().saturating_sub(self.assistant_opening_len()?);
        let context = &prompt[..words_end];
        let keep = rewind_to_prefix(&mut self.model.model, context)?;
        let mut row = forward_tokens(&mut self.model.model, &context[keep..], LogitRows::Last(1))?
            .into_last_row();
        turn.forwards_during_input += 1;
        let next_token = argmax(&row);
        softmax_in_place(&mut row);
        let end_tokens = self.model.tokenizer.end_tokens();
        let probability = end_tokens
            .iter()
            .filter_map(|&token| row.get(token as usize))
            .sum::<f32>()
            .min(1.0);
        let end_of_turn = EndOfTurn {
            words: words.to_string(),
            probability,
            complete: end_tokens.contains(&next_token),
        };
        turn.clock.charge(started.elapsed());
        turn.timeline.push(turn.event(EventKind::EndOfTurn {
            words: end_of_turn.words.clone(),
            probability,
        }));
        turn.end_of_turn = Some(Estimate {
            end_of_turn,
            next_token,
        });
        Ok(())
    }
}
