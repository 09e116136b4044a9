//! Self-distilled training data from a chat model: its own greedy answers, with the hidden
//! states that predicted them.

use engine_llm::{Error, LanguageModel, Message, Result};
use spec_core::decoder::common_prefix_len;
use spec_core::{greedy_in_lockstep, HiddenStates, StopConditions};

use super::TrainingSet;

/// Training data for prediction heads distilled from a chat model itself (implemented for
/// [`LanguageModel`]).
pub trait SelfDistill {
    /// Training data for prediction heads, distilled from this model itself: its greedy answer
    /// (at most `max_tokens` tokens, an end token included) to each of `prompts` as a user's
    /// message, with the final hidden state that predicted each token; answer i is group i, so
    /// a validation split never cuts an answer. `lockstep` prompts at a time are answered in
    /// lockstep ([`spec_core::greedy_in_lockstep`]: the answers and states of one at a time,
    /// in fewer forwards), and the chat template's opening, which every prompt shares, is
    /// forwarded once per batch. `on_batch(answered, positions)` follows each batch.
    fn self_distilled(
        &mut self,
        prompts: &[impl AsRef<str>],
        max_tokens: usize,
        lockstep: usize,
        on_batch: &mut dyn FnMut(usize, usize),
    ) -> Result<TrainingSet>;
}

impl SelfDistill for LanguageModel {
    fn self_distilled(
        &mut self,
        prompts: &[impl AsRef<str>],
        max_tokens: usize,
        lockstep: usize,
        on_batch: &mut dyn FnMut(usize, usize),
    ) -> Result<TrainingSet> {
        if lockstep == 0 {
            return Err(Error::Config(
                "answering in lockstep needs at least one prompt at a time".into(),
            ));
        }
        let contexts = prompts
            .iter()
            .map(|prompt| self.chat_prompt(&[Message::user(prompt.as_ref())]))
            .collect::<Result<Vec<_>>>()?;
        // Each context keeps at least its last token of its own.
        let shared = contexts
            .iter()
            .map(|c| common_prefix_len(&contexts[0], c).min(c.len().saturating_sub(1)))
            .min()
            .unwrap_or(0);
        let stop =
            StopConditions::new(max_tokens).with_eos(self.tokenizer.end_tokens().iter().copied());
        let mut data = TrainingSet::new(self.model.hidden_size());
        for (batch, contexts) in contexts.chunks(lockstep).enumerate() {
            let tails: Vec<Vec<u32>> = contexts.iter().map(|c| c[shared..].to_vec()).collect();
            let answers =
                greedy_in_lockstep(&mut self.model, &contexts[0][..shared], &tails, &stop)?;
            for (i, answer) in answers.into_iter().enumerate() {
                let group = (batch * lockstep + i) as u32;
                data.push(answer.hidden, answer.tokens, group)?;
            }
            on_batch(batch * lockstep + contexts.len(), data.positions());
        }
        Ok(data)
    }
}
