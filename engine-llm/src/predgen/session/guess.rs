//! Guessing while the user speaks: each partial verifies the guess, the guess grows, and its
//! first sentence is reported for speech synthesis as soon as it is complete.

use std::time::Instant;

use spec_voice::Partial;

use super::{heard_event, verified_event, Answer, PredGen, TurnState, Until};
use crate::Result;

impl PredGen<'_> {
    /// Whether guessing on is worth a step: a partial has been verified, and the guess is
    /// neither finished, nor at its length limit, nor holding a complete first sentence.
    pub(super) fn guess_wanted(&self, turn: &TurnState) -> Result<bool> {
        Ok(turn.heard_prompt.is_some() && !self.guess_complete(&turn.guess)?)
    }

    /// Whether a guess needs no more tokens: it is finished, at its length limit, or holds a
    /// complete first sentence.
    pub(super) fn guess_complete(&self, guess: &Answer) -> Result<bool> {
        Ok(guess.done
            || guess.tokens.len() >= self.guess_limit()
            || self.first_sentence(guess)?.is_some())
    }

    /// Most tokens a guess holds: `max_guess_tokens`, and never more than an answer may
    /// (a kept guess becomes the answer's beginning).
    pub(super) fn guess_limit(&self) -> usize {
        self.config
            .max_guess_tokens
            .min(self.config.max_answer_tokens)
    }

    pub(super) fn verify_partial(&mut self, turn: &mut TurnState, partial: &Partial) -> Result<()> {
        turn.timeline.push(turn.event(heard_event(partial)));
        let started = Instant::now();
        // Without question completion there is no completed question: the words themselves.
        let question = turn
            .question_for(&partial.text)
            .unwrap_or_else(|| partial.text.clone());
        let prompt = self.prompt_for(&question)?;
        if turn.heard_prompt.as_ref() == Some(&prompt) {
            // The same prompt as before (the words heard so far fit the completed question):
            // the guess was made for it, nothing to check.
            turn.clock.charge(started.elapsed());
            return Ok(());
        }
        // A new prompt: the whole guess is to be checked again.
        turn.guess.settled = 0;
        let check = self.verify(&prompt, &question, &mut turn.guess)?;
        turn.clock.charge(started.elapsed());
        turn.forwards_during_input += check.forwards;
        turn.tokens_during_input += check.produced;
        turn.timeline.push(turn.event(verified_event(&check)));
        turn.recycle(check.discarded);
        turn.rejected_tail = check.rejected_tail;
        turn.heard_prompt = Some(prompt);
        turn.heard_text = question;
        Ok(())
    }

    pub(super) fn guess_on(&mut self, turn: &mut TurnState) -> Result<()> {
        let prompt = turn.heard_prompt.clone().unwrap_or_default();
        let budget = self
            .config
            .tokens_per_step
            .min(self.guess_limit() - turn.guess.tokens.len());
        let before = turn.guess.tokens.len();
        let continuation = self.config.continuation;
        turn.forwards_during_input += self.extend_guess_to_first_sentence(
            turn,
            &prompt,
            continuation,
            true,
            Until::Sentences(1),
            budget,
        )?;
        turn.tokens_during_input += turn.guess.tokens.len() - before;
        Ok(())
    }

    /// Reports the guessed first sentence for synthesis ahead of time as soon as it is
    /// complete.
    pub(super) fn prepare_first_sentence(&mut self, turn: &mut TurnState) -> Result<()> {
        if let Some(sentence) = self.first_sentence(&turn.guess)? {
            turn.speak_ahead(sentence);
        }
        Ok(())
    }
}
