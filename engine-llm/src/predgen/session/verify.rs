//! Verification of a guess against a new prompt: greedy, top-k or the reflection judge (the
//! paper's §3.1), in one forward that also prefills the prompt.

use std::time::Instant;

use spec_core::acceptance::Acceptance;
use spec_core::decoder::{common_prefix_len, forward_tokens, rewind_to_prefix};
use spec_core::sampling::{argmax, softmax};
use spec_core::{forward_continuation, AcceptanceRule, Decoder, LogitRows};

use super::{Answer, EventKind, PredGen, TurnState};
use crate::chat::Message;
use crate::predgen::{Verifier, JUDGE_PROMPT};
use crate::tokenizer::TextTokenizer;
use crate::{Error, Result};

/// What verifying a guess gave.
pub(super) struct Check {
    /// Guessed tokens waiting for verification before this check.
    pub(super) guessed: usize,
    /// Guessed tokens that held.
    pub(super) kept: usize,
    /// The model's own tokens added after the kept ones (its correction, or none when the
    /// check covered only part of the guess and all of it held).
    pub(super) produced: usize,
    /// The guess after the first token not kept: Jacobi's starting guess.
    pub(super) rejected_tail: Vec<u32>,
    /// The whole guess as it was, when part of it was not kept (recycled by lookup).
    pub(super) discarded: Option<Vec<u32>>,
    pub(super) forwards: usize,
    pub(super) judged_yes: Option<bool>,
}

/// Token ids of the judge's two answers, in the spellings a model may start with.
#[derive(Clone, Debug)]
pub(super) struct JudgeTokens {
    pub(super) yes: Vec<u32>,
    pub(super) no: Vec<u32>,
}

impl JudgeTokens {
    pub(super) fn new(tokenizer: &TextTokenizer) -> Result<Self> {
        let ids = |words: [&str; 4]| -> Result<Vec<u32>> {
            let mut ids = Vec::new();
            for word in words {
                if let [id] = tokenizer.encode(word)?.as_slice() {
                    if !ids.contains(id) {
                        ids.push(*id);
                    }
                }
            }
            Ok(ids)
        };
        let yes = ids(["yes", "Yes", " yes", " Yes"])?;
        let no = ids(["no", "No", " no", " No"])?;
        if yes.is_empty() || no.is_empty() {
            return Err(Error::Tokenizer(
                "the reflection verifier needs single tokens for \"yes\" and \"no\"".into(),
            ));
        }
        Ok(Self { yes, no })
    }

    /// P(yes) > P(no) after the judge prompt.
    pub(super) fn says_yes(&self, logits: &[f32]) -> bool {
        let probs = softmax(logits);
        let mass = |ids: &[u32]| ids.iter().map(|&i| probs[i as usize]).sum::<f32>();
        mass(&self.yes) > mass(&self.no)
    }
}

pub(super) fn verified_event(check: &Check) -> EventKind {
    EventKind::Verified {
        kept: check.kept,
        guessed: check.guessed,
        judged_yes: check.judged_yes,
    }
}

impl PredGen<'_> {
    /// Checks the next part of a guess whose start held for `prompt`.
    pub(super) fn check_rest(
        &mut self,
        turn: &mut TurnState,
        prompt: &[u32],
        text: &str,
    ) -> Result<Check> {
        let started = Instant::now();
        let mut check = self.verify(prompt, text, &mut turn.guess)?;
        turn.clock.charge(started.elapsed());
        turn.timeline.push(turn.event(verified_event(&check)));
        turn.recycle(check.discarded.take());
        if !check.rejected_tail.is_empty() {
            turn.rejected_tail = check.rejected_tail.clone();
        }
        Ok(check)
    }

    /// Verifies the guess against `prompt` with the configured verifier and keeps what holds:
    /// `guess.tokens[..guess.settled]` already hold for this prompt, the rest is checked. With
    /// the cost model, one forward carries only as many guessed tokens as are expected to pay
    /// for their share of it; when all of them hold, the next guessed token is judged by the
    /// same forward and the rest waits for another check. Otherwise the model's own next token
    /// follows the kept ones. The cache then holds `prompt` and the settled tokens but the last.
    pub(super) fn verify(
        &mut self,
        prompt: &[u32],
        prompt_text: &str,
        guess: &mut Answer,
    ) -> Result<Check> {
        let room = self.model.model.max_len() - prompt.len() - 1;
        let limit = room.min(self.config.max_answer_tokens - 1);
        if guess.tokens.len() > limit {
            guess.tokens.truncate(limit);
            guess.done = false;
        }
        let settled = guess.settled.min(guess.tokens.len());
        let context: Vec<u32> = prompt
            .iter()
            .chain(&guess.tokens[..settled])
            .copied()
            .collect();
        let candidates = guess.tokens[settled..].to_vec();
        let offered = self.tokens_worth_verifying(&context, candidates.len());
        let logits = forward_continuation(&mut self.model.model, &context, &candidates[..offered])?;
        let rule = match self.config.verifier {
            Verifier::TopK(k) => AcceptanceRule::top_k(k),
            Verifier::Greedy | Verifier::Reflection => AcceptanceRule::greedy(),
        };
        let verdict = rule.verify_by_judging(&candidates[..offered], &logits)?;
        let mut kept = verdict.accepted;
        let mut forwards = 1;
        let mut judged_yes = None;
        if self.config.verifier == Verifier::Reflection {
            // The judge is asked only when greedy verification loses part of the first
            // sentence: where greedy keeps it all, the judge could keep nothing more.
            if let Some((sentence_len, _)) = self.first_sentence_in(&guess.tokens, false)? {
                if settled + kept < sentence_len {
                    let sentence = self
                        .model
                        .tokenizer
                        .decode_text(&guess.tokens[..sentence_len])?;
                    let yes = self.judge(prompt_text, sentence.trim())?;
                    forwards += 1;
                    judged_yes = Some(yes);
                    if yes {
                        kept = sentence_len - settled;
                    }
                }
            }
        }
        let guessed = candidates.len();
        if kept == offered
            && offered < guessed
            && rule.judge(candidates[offered], logits.row(offered)) == Some(true)
        {
            // Everything offered held, and so does the next guessed token: the rest of the
            // guess waits for the next check.
            self.survival.observe(offered + 1, offered + 1);
            self.model.model.truncate(context.len() + offered)?;
            guess.settled = settled + offered + 1;
            return Ok(Check {
                guessed,
                kept: offered + 1,
                produced: 0,
                rejected_tail: Vec::new(),
                discarded: None,
                forwards,
                judged_yes,
            });
        }
        self.survival
            .observe((kept + 1).min(guessed), kept.min(guessed));
        // Jacobi continues after the kept tokens and the model's next one: the rest of the
        // guess from the position after that is its starting guess.
        let rejected_tail = candidates.get(kept + 2..).unwrap_or_default().to_vec();
        let full = kept == guessed;
        let discarded = (!full).then(|| guess.tokens.clone());
        guess.tokens.truncate(settled + kept);
        self.model.model.truncate(context.len() + kept)?;
        if full && guess.done {
            // A finished guess, every token kept: the model's next token decides whether the
            // answer still ends there.
            guess.done = false;
        }
        let next = argmax(logits.row(kept));
        let produced = if self.model.tokenizer.end_tokens().contains(&next) {
            guess.done = true;
            0
        } else {
            guess.tokens.push(next);
            guess.done = false;
            1
        };
        guess.settled = guess.tokens.len();
        Ok(Check {
            guessed,
            kept,
            produced,
            rejected_tail,
            discarded,
            forwards,
            judged_yes,
        })
    }

    /// How many of `available` guessed tokens one forward after `context` should carry: the
    /// number that maximises the expected time saved, each token holding (given the ones
    /// before it held) at the session's survival rate α and then sparing one forward of its
    /// own, minus what carrying them adds to the forward: argmax over g of
    /// cost(1) · Σᵢ₌₁..g αⁱ − (cost(s + g) − cost(s)), s the forward's uncached tokens. All of
    /// them without the cost model, and for the reflection verifier (its judge reads the whole
    /// guessed first sentence).
    pub(super) fn tokens_worth_verifying(&self, context: &[u32], available: usize) -> usize {
        let Some(costs) = &self.costs else {
            return available;
        };
        if self.config.verifier == Verifier::Reflection || available == 0 {
            return available;
        }
        let cached = common_prefix_len(self.model.model.cached_tokens(), context)
            .min(context.len().saturating_sub(1));
        let uncached = context.len() - cached;
        let alpha = self.survival.rate().min(0.99);
        let (base, step) = (costs.cost(uncached), costs.cost(1));
        let (mut best, mut best_value, mut expected, mut chance) = (0, 0.0, 0.0, 1.0);
        for g in 1..=available {
            chance *= alpha;
            expected += chance;
            let value = step * expected - (costs.cost(uncached + g) - base);
            if value > best_value {
                (best, best_value) = (g, value);
            }
        }
        best
    }

    /// The reflection verifier's question: is `answer` consistent with the (possibly partial)
    /// `prompt`? P("yes") against P("no") after the paper's judge prompt, in one forward in a
    /// cache of its own, so that the conversation's stays as it is.
    pub fn judge(&mut self, prompt: &str, answer: &str) -> Result<bool> {
        let answers = match &self.judge_tokens {
            Some(answers) => answers.clone(),
            None => {
                let answers = JudgeTokens::new(&self.model.tokenizer)?;
                self.judge_tokens = Some(answers.clone());
                answers
            }
        };
        let question = format!(
            "{JUDGE_PROMPT}\nPartial Prompt: {prompt}\nPartial Answer: {answer}\n\
             Answer with yes or no."
        );
        let tokens = self.model.chat_prompt(&[Message::user(question)])?;
        self.model.model.swap_cache(&mut self.judge_cache)?;
        let logits = rewind_to_prefix(&mut self.model.model, &tokens).and_then(|keep| {
            forward_tokens(&mut self.model.model, &tokens[keep..], LogitRows::Last(1))
        });
        self.model.model.swap_cache(&mut self.judge_cache)?;
        Ok(answers.says_yes(&logits?.into_last_row()))
    }
}
