//! Question completion: the model finishes the user's unfinished question, and the guess
//! answers the completed question.

use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::decoder::common_suffix_len;
use spec_core::{generate, SamplingConfig, StopConditions};

use spec_voice::keeps_words;

use super::{EventKind, PredGen, TurnState, MAX_COMPLETION_TOKENS};
use crate::Result;

/// The model's completion of the user's words, being generated a token a step.
pub(super) struct Completing {
    /// The words it completes.
    pub(super) words: String,
    /// The chat prompt up to the end of those words.
    pub(super) context: Vec<u32>,
    /// What the model said after them so far (no end token).
    pub(super) tokens: Vec<u32>,
}

impl PredGen<'_> {
    /// One token of the model's completion of the words `heard`: its own continuation of the
    /// user's words up to its end of turn, kept as the turn's completed question once it ends,
    /// none when the model does not end the question within [`MAX_COMPLETION_TOKENS`]. A
    /// completion begun for earlier words goes on while what it says so far holds every word
    /// heard since; otherwise (newer words it did not foresee) it is dropped for one of `heard`.
    pub(super) fn complete_question_step(
        &mut self,
        turn: &mut TurnState,
        heard: &str,
    ) -> Result<()> {
        let mut completing = match turn.completing.take() {
            Some(c) if c.words == heard || keeps_words(heard, &self.completing_text(&c)?) => c,
            _ => Completing {
                words: heard.to_string(),
                context: self.words_context(heard)?,
                tokens: Vec::new(),
            },
        };
        let end_tokens = self.model.tokenizer.end_tokens().to_vec();
        let estimated = turn
            .end_of_turn
            .as_ref()
            .filter(|e| completing.tokens.is_empty() && e.end_of_turn.words == completing.words)
            .map(|e| e.next_token);
        let token = match estimated {
            // The end-of-turn estimate ran this very forward.
            Some(token) => Some(token),
            None => {
                let context: Vec<u32> = completing
                    .context
                    .iter()
                    .chain(&completing.tokens)
                    .copied()
                    .collect();
                let gen = generate(
                    &mut self.model.model,
                    &context,
                    &SamplingConfig::greedy(),
                    &StopConditions::new(1),
                    &mut StdRng::seed_from_u64(0),
                    &mut |_| {},
                )?;
                turn.forwards_during_input += gen.stats.target_forwards;
                gen.tokens.first().copied()
            }
        };
        let completed = match token.as_ref() {
            Some(token) if end_tokens.contains(token) => {
                self.completed_question(&completing.words, &completing.tokens)?
            }
            Some(&token) if completing.tokens.len() + 1 < MAX_COMPLETION_TOKENS => {
                completing.tokens.push(token);
                turn.completing = Some(completing);
                return Ok(());
            }
            // Too long, or a full context: no completion.
            _ => None,
        };
        turn.completion_tried = Some(heard.to_string());
        if let Some(question) = &completed {
            turn.timeline.push(turn.event(EventKind::Completed {
                question: question.clone(),
            }));
        }
        turn.completed = completed;
        Ok(())
    }

    /// The question that `words` and the model's ended `completion` of them ask, trimmed;
    /// none when the completion starts a new line (something else than the question's end).
    pub(super) fn completed_question(
        &self,
        words: &str,
        completion: &[u32],
    ) -> Result<Option<String>> {
        let rest = self.model.tokenizer.decode_text(completion)?;
        Ok((!rest.contains('\n')).then(|| format!("{words}{rest}").trim().to_string()))
    }

    /// The words a completion continues and what it says after them so far.
    pub(super) fn completing_text(&self, completing: &Completing) -> Result<String> {
        let rest = self.model.tokenizer.decode_text(&completing.tokens)?;
        Ok(format!("{}{rest}", completing.words))
    }

    /// The chat prompt of a question of `words` up to their end (the end of the user's turn
    /// and the assistant's opening left out): what the model continues to complete the
    /// question, or reads to judge it. Never empty.
    pub(super) fn words_context(&mut self, words: &str) -> Result<Vec<u32>> {
        let mut prompt = self.prompt_for(words)?;
        let words_end = prompt.len().saturating_sub(self.assistant_opening_len()?);
        prompt.truncate(words_end.max(1));
        Ok(prompt)
    }

    /// How many tokens a chat prompt has after the user's words: the end of the user's turn and
    /// the opening of the assistant's (the same for every question).
    pub(super) fn assistant_opening_len(&mut self) -> Result<usize> {
        if let Some(len) = self.assistant_opening {
            return Ok(len);
        }
        let len = common_suffix_len(&self.prompt_for("a")?, &self.prompt_for("b")?);
        self.assistant_opening = Some(len);
        Ok(len)
    }
}
