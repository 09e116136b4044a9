//! After the last word: the final verification, the first sentence completed and spoken, the
//! rest of the answer, and the prompts and texts a turn is made of.

use std::time::Instant;

use spec_core::decoder::common_prefix_len;
use spec_core::Decoder;

use spec_voice::{first_streamed_sentence, settled_first_piece, split_sentences, Partial};

use super::{
    heard_event, verified_event, Answer, Drafting, EventKind, PredGen, Status, Turn, TurnKind,
    TurnState, Until,
};
use crate::chat::Message;
use crate::predgen::Continuation;
use crate::{Error, Result};

impl PredGen<'_> {
    /// The final partial: one forward verifies the guess against the whole question (the
    /// cascade generates its answer's first sentence from scratch instead).
    pub(super) fn hear_final(&mut self, turn: &mut TurnState, final_input: &Partial) -> Result<()> {
        turn.input_end = final_input.at;
        turn.final_partial_wait = turn.clock.now().saturating_sub(final_input.at);
        turn.timeline.push(turn.event(heard_event(final_input)));
        let prompt = self.prompt_for(&final_input.text)?;
        if turn.kind == TurnKind::Speculative {
            let started = Instant::now();
            self.settle_candidates(turn, &prompt)?;
            turn.clock.charge(started.elapsed());
        }
        match turn.kind {
            TurnKind::Speculative if turn.heard_prompt.as_ref() == Some(&prompt) => {
                // The question is the one the guess was made for (completed rightly, or heard
                // whole before its end was signalled): what holds of the guess still holds.
                turn.guessed_at_end = turn.guess.tokens.len();
                turn.kept_at_end = turn.guess.settled;
                turn.timeline.push(turn.event(EventKind::Verified {
                    kept: turn.guess.settled,
                    guessed: turn.guess.tokens.len(),
                    judged_yes: None,
                }));
            }
            TurnKind::Speculative => {
                turn.guessed_at_end = turn.guess.tokens.len();
                turn.guess.settled = 0;
                let started = Instant::now();
                let check = self.verify(&prompt, &final_input.text, &mut turn.guess)?;
                turn.clock.charge(started.elapsed());
                turn.timeline.push(turn.event(verified_event(&check)));
                turn.kept_at_end = check.kept;
                turn.forwards_to_first_sentence = check.forwards;
                turn.recycle(check.discarded);
                turn.rejected_tail = check.rejected_tail;
            }
            TurnKind::Cascade => {
                turn.guess = Answer::default();
                let started = Instant::now();
                let budget = self.config.max_answer_tokens;
                let until = self.first_sentence_until(turn);
                let gen = self.extend_with(
                    Continuation::Autoregressive,
                    &prompt,
                    &mut turn.guess,
                    Drafting::default(),
                    budget,
                    until,
                )?;
                turn.clock.charge(started.elapsed());
                let generated = self.generated_event(&turn.guess.tokens)?;
                turn.timeline.push(turn.event(generated));
                turn.forwards_to_first_sentence = gen.stats.target_forwards;
            }
        }
        turn.question = final_input.text.clone();
        turn.prompt = prompt;
        Ok(())
    }

    /// Generates on until the answer's first sentence is complete, if verification did not
    /// leave one, stopping early once its first piece is settled when that is still to be
    /// reported ([`Self::report_first_piece`]). Whether the first sentence is complete.
    pub(super) fn complete_first_sentence(&mut self, turn: &mut TurnState) -> Result<bool> {
        if self.settled_first_sentence(&turn.guess)?.is_some()
            || (turn.guess.done && !turn.guess.unsettled())
        {
            return Ok(true);
        }
        if turn.guess.unsettled() {
            let (prompt, text) = (turn.prompt.clone(), turn.question.clone());
            let check = self.check_rest(turn, &prompt, &text)?;
            turn.forwards_to_first_sentence += check.forwards;
            turn.kept_at_end += check.kept;
            return Ok(false);
        }
        let budget = self.config.max_answer_tokens - turn.guess.tokens.len();
        let prompt = turn.prompt.clone();
        let continuation = turn.continuation(&self.config);
        let until = self.first_sentence_until(turn);
        turn.forwards_to_first_sentence +=
            self.extend_guess_to_first_sentence(turn, &prompt, continuation, false, until, budget)?;
        Ok(self.settled_first_sentence(&turn.guess)?.is_some() || turn.guess.done)
    }

    /// Where generating the answer's first sentence stops: at its first piece while that may
    /// still be reported early ([`first_piece_early`](crate::PredGenConfig::first_piece_early)),
    /// at its end otherwise.
    pub(super) fn first_sentence_until(&self, turn: &TurnState) -> Until {
        match self.config.first_piece_early && !turn.first_piece_reported {
            true => Until::FirstPiece,
            false => Until::Sentences(1),
        }
    }

    /// Reports the first piece of the answer's first sentence for speech as soon as it is
    /// settled and the sentence is not complete yet (a complete sentence is spoken whole, its
    /// pieces cut by the speaker). Whether it reported the piece now.
    pub(super) fn report_first_piece(&mut self, turn: &mut TurnState) -> Result<bool> {
        if !self.config.first_piece_early
            || turn.first_piece_reported
            || turn.guess.done
            || self.settled_first_sentence(&turn.guess)?.is_some()
        {
            return Ok(false);
        }
        let text = self
            .model
            .tokenizer
            .decode_text(turn.guess.settled_tokens())?;
        let Some(piece) = settled_first_piece(&text) else {
            return Ok(false);
        };
        let piece = piece.to_string();
        turn.first_piece_reported = true;
        turn.first_words_at = Some(turn.clock.now());
        turn.timeline
            .push(turn.event(EventKind::FirstPiece { text: piece }));
        Ok(true)
    }

    /// The first sentence is complete: it is reported for speech (whose audio the pipeline
    /// plays, prepared ahead of time if a guess got it right).
    pub(super) fn speak_first_sentence(&mut self, turn: &mut TurnState) -> Result<()> {
        turn.first_sentence_at = turn.clock.now();
        turn.first_words_at.get_or_insert(turn.first_sentence_at);
        // An answer cut off before its first sentence ends is spoken whole.
        let first_sentence = match self.settled_first_sentence(&turn.guess)? {
            Some(sentence) => sentence,
            None => self.answer_text(&turn.guess)?,
        };
        turn.timeline.push(turn.event(EventKind::FirstSentence {
            text: first_sentence.clone(),
        }));
        turn.first_sentence = first_sentence;
        turn.spoken = 1;
        Ok(())
    }

    /// The rest of the answer, sentence by sentence, each reported for speech as soon as it is
    /// complete.
    pub(super) fn answer_on(&mut self, turn: &mut TurnState) -> Result<Status> {
        let max = self.config.max_answer_tokens;
        if turn.guess.unsettled() {
            let (prompt, text) = (turn.prompt.clone(), turn.question.clone());
            self.check_rest(turn, &prompt, &text)?;
        } else if turn.guess.done || turn.guess.tokens.len() >= max {
            return self.finish_turn(turn).map(|t| Status::Done(Box::new(t)));
        } else {
            let started = Instant::now();
            let budget = max - turn.guess.tokens.len();
            let prompt = turn.prompt.clone();
            let continuation = turn.continuation(&self.config);
            let drafting = Drafting {
                tail: &[],
                guesses: &turn.recycled,
                listening: false,
            };
            self.extend_with(
                continuation,
                &prompt,
                &mut turn.guess,
                drafting,
                budget,
                Until::Sentences(turn.spoken + 1),
            )?;
            turn.clock.charge(started.elapsed());
        }
        let text = self
            .model
            .tokenizer
            .decode_text(turn.guess.settled_tokens())?;
        let complete =
            !turn.guess.unsettled() && (turn.guess.done || turn.guess.tokens.len() >= max);
        let (sentences, _) = split_sentences(&text, complete);
        for sentence in sentences.iter().skip(turn.spoken) {
            turn.timeline.push(turn.event(EventKind::NextSentence {
                text: sentence.clone(),
            }));
        }
        turn.spoken = turn.spoken.max(sentences.len());
        Ok(Status::Working)
    }

    /// The answer is complete: it joins the history, and the turn's figures are gathered.
    pub(super) fn finish_turn(&mut self, turn: &mut TurnState) -> Result<Turn> {
        turn.timeline.push(turn.event(EventKind::AnswerDone {
            tokens: turn.guess.tokens.len(),
        }));
        let answer = self.answer_text(&turn.guess)?;
        self.history.push(Message::user(turn.question.clone()));
        self.history.push(Message::assistant(answer.clone()));
        let mut timeline = turn.timeline.clone();
        timeline.sort_by_key(|e| e.at);
        Ok(Turn {
            question: turn.question.clone(),
            answer,
            first_sentence: turn.first_sentence.clone(),
            input_end: turn.input_end,
            final_partial_wait: turn.final_partial_wait,
            time_to_first_sentence: turn.first_sentence_at - turn.input_end,
            time_to_first_words: turn.first_words_at.unwrap_or(turn.first_sentence_at)
                - turn.input_end,
            forwards_to_first_sentence: turn.forwards_to_first_sentence,
            answer_latency: turn.clock.now() - turn.input_end,
            tokens_during_input: turn.tokens_during_input,
            forwards_during_input: turn.forwards_during_input,
            guessed_question: turn.completed.clone(),
            guessed_at_end: turn.guessed_at_end,
            kept_at_end: turn.kept_at_end,
            timeline,
        })
    }

    /// Keeps only the cached conversation so far, as a real assistant's cache would hold it
    /// when the user starts speaking (another session may have used the model since).
    pub(super) fn start_turn(&mut self) -> Result<()> {
        let conversation = self.conversation(None);
        let tokens = self.model.chat_prompt(&conversation)?;
        let keep = common_prefix_len(self.model.model.cached_tokens(), &tokens);
        self.model.model.truncate(keep)?;
        Ok(())
    }

    pub(super) fn conversation(&self, question: Option<&str>) -> Vec<Message> {
        let mut messages = vec![Message::system(self.config.system_prompt.clone())];
        messages.extend(self.history.iter().cloned());
        messages.extend(question.map(Message::user));
        messages
    }

    pub(super) fn prompt_for(&self, text: &str) -> Result<Vec<u32>> {
        let prompt = self.model.chat_prompt(&self.conversation(Some(text)))?;
        let needed = prompt.len() + 1;
        if needed > self.model.model.max_len() {
            return Err(Error::Core(spec_core::Error::ContextOverflow {
                requested: needed,
                max: self.model.model.max_len(),
            }));
        }
        Ok(prompt)
    }

    /// The text of `answer`, trimmed.
    pub(super) fn answer_text(&self, answer: &Answer) -> Result<String> {
        Ok(self
            .model
            .tokenizer
            .decode_text(&answer.tokens)?
            .trim()
            .to_string())
    }

    /// The first complete sentence of the part of `answer` that holds for the prompt.
    pub(super) fn settled_first_sentence(&self, answer: &Answer) -> Result<Option<String>> {
        let complete = answer.done && !answer.unsettled();
        let found = self.first_sentence_in(answer.settled_tokens(), complete)?;
        Ok(found.map(|(_, sentence)| sentence))
    }

    /// The first complete sentence of `answer`, if it has one.
    pub(super) fn first_sentence(&self, answer: &Answer) -> Result<Option<String>> {
        let found = self.first_sentence_in(&answer.tokens, answer.done)?;
        Ok(found.map(|(_, sentence)| sentence))
    }

    /// The first sentence of `tokens` as the cascade finds it, streaming them to TTS
    /// ([`first_streamed_sentence`]), with how many tokens it takes; `complete`: the tokens
    /// are the whole answer.
    pub(super) fn first_sentence_in(
        &self,
        tokens: &[u32],
        complete: bool,
    ) -> Result<Option<(usize, String)>> {
        let mut text = self.model.tokenizer.stream();
        let pieces = tokens
            .iter()
            .map(|&t| Ok(text.push(t)?.unwrap_or_default()))
            .collect::<Result<Vec<String>>>()?;
        Ok(first_streamed_sentence(&pieces, complete))
    }
}
