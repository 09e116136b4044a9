//! Several candidate questions answered ahead in lockstep (beyond the paper;
//! [`PredGenConfig::question_candidates`](super::PredGenConfig::question_candidates) above 1).
//!
//! While the user speaks, the model's likeliest next tokens after the words heard each start a
//! candidate completion of the question, completed greedily; as soon as a completion ends, the
//! same branch goes on with the end of the user's turn and the answer to its question, greedily.
//! All candidates advance together, one forward per step ([`spec_core::Branches`]: each attends
//! to the shared conversation and its own tokens only, so each answer is exactly the model's
//! greedy answer to its question). Newer words drop the candidates they contradict; when none
//! is left the words heard start new ones. At the last word the candidate the user asked, if
//! any, becomes the guess with nothing left to verify; otherwise the likeliest one's answer is
//! verified against the question as usual.

use std::time::Instant;

use spec_core::decoder::{forward_tokens, rewind_to_prefix};
use spec_core::sampling::{argmax, top_k_tokens};
use spec_core::{Branches, Decoder, LogitRows};
use spec_voice::{keeps_words, Partial, SentenceSynthesizer};

use super::{Answer, EventKind, PredGen, TurnState, MAX_COMPLETION_TOKENS};
use crate::Result;

/// Most tokens one step forwards: a completed question's branch forwards the end of the
/// user's turn and the assistant's opening, several tokens, which a step still running at the
/// last word must not make long (a forward of 16 tokens of the 1.5B costs about two of one).
const MAX_STEP_INPUTS: usize = 16;

/// The candidate questions of a turn and their answers.
pub(super) struct Candidates {
    /// The words the candidates complete.
    words: String,
    /// The chat prompt up to the end of the words (the branches' shared context) and the
    /// branches, once the first step has read the likeliest next tokens.
    branches: Option<(Vec<u32>, Branches)>,
    /// Likeliest first.
    candidates: Vec<Candidate>,
    /// No completion ended: the words themselves are answered as the question.
    answering_words: bool,
}

struct Candidate {
    /// Its branch: the completion (no end token), then, once the question is complete, the
    /// rest of its prompt and the answer.
    branch: usize,
    /// The completed question and its chat prompt, once the completion ended.
    question: Option<(String, Vec<u32>)>,
    answer: Answer,
    /// Consistent with every word heard, and not dropped (a completion that did not end,
    /// or ended in a question another candidate asks).
    alive: bool,
}

impl Candidates {
    pub(super) fn new(words: &str) -> Self {
        Self {
            words: words.to_string(),
            branches: None,
            candidates: Vec::new(),
            answering_words: false,
        }
    }
}

impl PredGen<'_> {
    /// Before the final partial, with candidate questions: takes up the newest partial, then
    /// advances the candidates by one forward; whether there was work.
    pub(super) fn listen_with_candidates(
        &mut self,
        turn: &mut TurnState,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<bool> {
        let started = Instant::now();
        if let Some(partial) = turn.pending.take() {
            turn.timeline.push(turn.event(super::heard_event(&partial)));
            self.hear_candidates(turn, &partial)?;
        }
        let worked = self.advance_candidates(turn)?;
        turn.clock.charge(started.elapsed());
        if worked {
            self.prepare_candidate_sentences(turn, tts)?;
        }
        Ok(worked)
    }

    /// Newer words drop the candidates they contradict; with none left, or none made yet,
    /// the words start new candidates.
    fn hear_candidates(&mut self, turn: &mut TurnState, partial: &Partial) -> Result<()> {
        let heard = partial.text.as_str();
        if let Some(mut set) = turn.candidates.take() {
            let fits = set.words == heard || self.drop_contradicted(turn, &mut set, heard)?;
            turn.candidates = Some(set);
            if fits {
                return Ok(());
            }
        }
        self.drop_candidates(turn)?;
        turn.candidates = Some(Candidates::new(heard));
        Ok(())
    }

    /// Drops the candidates that the words `heard` contradict (their answers go to the lookup
    /// continuation's references); whether any is left.
    fn drop_contradicted(
        &mut self,
        turn: &mut TurnState,
        set: &mut Candidates,
        heard: &str,
    ) -> Result<bool> {
        let Some((_, branches)) = &mut set.branches else {
            return Ok(false);
        };
        for c in set.candidates.iter_mut().filter(|c| c.alive) {
            let said = match &c.question {
                Some((question, _)) => question.clone(),
                None => format!(
                    "{}{}",
                    set.words,
                    self.model
                        .tokenizer
                        .decode_text(branches.tokens(c.branch))?
                ),
            };
            if !keeps_words(heard, &said) {
                c.alive = false;
                branches.close(c.branch)?;
                turn.recycle(Some(std::mem::take(&mut c.answer.tokens)));
            }
        }
        Ok(set.candidates.iter().any(|c| c.alive))
    }

    /// Forgets the turn's candidates (their answers go to the lookup continuation's
    /// references) and rolls their branches out of the cache.
    pub(super) fn drop_candidates(&mut self, turn: &mut TurnState) -> Result<()> {
        let Some(set) = turn.candidates.take() else {
            return Ok(());
        };
        if let Some((_, branches)) = &set.branches {
            let keep = branches.shared().min(self.model.model.cached_len());
            self.model.model.truncate(keep)?;
        }
        for c in set.candidates.into_iter().rev().filter(|c| c.alive) {
            turn.recycle(Some(c.answer.tokens));
        }
        Ok(())
    }

    /// One forward for the candidates, if they have work left; whether they had.
    fn advance_candidates(&mut self, turn: &mut TurnState) -> Result<bool> {
        let Some(mut set) = turn.candidates.take() else {
            return Ok(false);
        };
        let worked = match set.branches.is_some() {
            false => self.start_candidates(turn, &mut set).map(|()| true),
            true => self.candidates_step(turn, &mut set),
        };
        turn.candidates = Some(set);
        worked
    }

    /// The model's likeliest next tokens after the words: one candidate each (an end token
    /// one that answers the words as the whole question).
    fn start_candidates(&mut self, turn: &mut TurnState, set: &mut Candidates) -> Result<()> {
        let prompt = self.prompt_for(&set.words)?;
        let words_end = prompt.len().saturating_sub(self.assistant_opening_len()?);
        let context = prompt[..words_end.max(1)].to_vec();
        let keep = rewind_to_prefix(&mut self.model.model, &context)?;
        let logits = forward_tokens(&mut self.model.model, &context[keep..], LogitRows::Last(1))?;
        turn.forwards_during_input += 1;
        let end_tokens = self.model.tokenizer.end_tokens();
        let mut branches = Branches::new(context.len())?;
        set.candidates.clear();
        for token in top_k_tokens(&logits.into_last_row(), self.config.question_candidates) {
            if end_tokens.contains(&token) {
                let question = set.words.trim().to_string();
                let prompt = self.prompt_for(&question)?;
                set.candidates
                    .extend(answering(&mut branches, &context, question, prompt));
            } else {
                set.candidates.push(Candidate {
                    branch: branches.open(vec![token]),
                    question: None,
                    answer: Answer::default(),
                    alive: true,
                });
            }
        }
        set.branches = Some((context, branches));
        Ok(())
    }

    /// One forward of every live branch: a token of each completion (an end token turns it
    /// to the answer of its question; a new line, a question another candidate asks, or
    /// [`MAX_COMPLETION_TOKENS`] without an end drop it) and of each answer (which stops at its
    /// end, a complete first sentence or the guess's length limit). With no completion left,
    /// the words themselves are answered.
    fn candidates_step(&mut self, turn: &mut TurnState, set: &mut Candidates) -> Result<bool> {
        let Some((context, mut branches)) = set.branches.take() else {
            return Ok(false);
        };
        let worked = branches.has_pending();
        if worked {
            let outputs = branches.step(&mut self.model.model, MAX_STEP_INPUTS)?;
            turn.forwards_during_input += 1;
            for out in outputs {
                let Some(i) = set.candidates.iter().position(|c| c.branch == out.branch) else {
                    continue;
                };
                let token = argmax(&out.logits);
                match set.candidates[i].question.is_some() {
                    true => {
                        self.answer_token(turn, &mut set.candidates[i], &mut branches, token)?
                    }
                    false => self.completion_token(turn, set, i, &context, &mut branches, token)?,
                }
            }
        }
        let mut opened = false;
        if !set.answering_words && !set.candidates.iter().any(|c| c.alive) {
            set.answering_words = true;
            let question = set.words.trim().to_string();
            let prompt = self.prompt_for(&question)?;
            let candidate = answering(&mut branches, &context, question, prompt);
            opened = candidate.is_some();
            set.candidates.extend(candidate);
        }
        set.branches = Some((context, branches));
        Ok(worked || opened)
    }

    /// The next token of candidate `i`'s completion.
    fn completion_token(
        &mut self,
        turn: &mut TurnState,
        set: &mut Candidates,
        i: usize,
        context: &[u32],
        branches: &mut Branches,
        token: u32,
    ) -> Result<()> {
        let c = &set.candidates[i];
        let completion = branches.tokens(c.branch).to_vec();
        if !self.model.tokenizer.end_tokens().contains(&token) {
            match completion.len() + 1 < MAX_COMPLETION_TOKENS {
                true => branches.push(c.branch, token)?,
                false => {
                    branches.close(c.branch)?;
                    set.candidates[i].alive = false;
                }
            }
            return Ok(());
        }
        let asked = |question: &str| {
            set.candidates
                .iter()
                .any(|o| o.alive && o.question.as_ref().is_some_and(|(q, _)| q == question))
        };
        let prompt = match self.completed_question(&set.words, &completion)? {
            Some(question) if !asked(&question) => {
                let prompt = self.prompt_for(&question)?;
                Some((question, prompt))
            }
            _ => None,
        };
        // The branch goes on only if the question's prompt continues it (it does unless
        // tokenizing the words and the completion together merges tokens at their boundary).
        let answer_start = context.len() + completion.len();
        let continues = |(_, p): &(String, Vec<u32>)| {
            p.len() > answer_start
                && p.starts_with(context)
                && p[context.len()..].starts_with(&completion)
        };
        match prompt.filter(continues) {
            Some((question, prompt)) => {
                for &t in &prompt[answer_start..] {
                    branches.push(c.branch, t)?;
                }
                turn.timeline.push(turn.event(EventKind::Completed {
                    question: question.clone(),
                }));
                set.candidates[i].question = Some((question, prompt));
            }
            None => {
                branches.close(c.branch)?;
                set.candidates[i].alive = false;
            }
        }
        Ok(())
    }

    /// The next token of a candidate's answer.
    fn answer_token(
        &mut self,
        turn: &mut TurnState,
        c: &mut Candidate,
        branches: &mut Branches,
        token: u32,
    ) -> Result<()> {
        if self.model.tokenizer.end_tokens().contains(&token) {
            c.answer.done = true;
        } else {
            c.answer.extend_settled([token]);
            branches.push(c.branch, token)?;
            turn.tokens_during_input += 1;
        }
        if self.guess_complete(&c.answer)? {
            branches.close(c.branch)?;
            let text = self.model.tokenizer.decode_text(&c.answer.tokens)?;
            turn.timeline.push(turn.event(EventKind::Generated {
                tokens: c.answer.tokens.len(),
                text,
            }));
        }
        Ok(())
    }

    /// Hands every live candidate's complete first sentence to TTS, once each.
    fn prepare_candidate_sentences(
        &mut self,
        turn: &mut TurnState,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<()> {
        let Some(set) = &turn.candidates else {
            return Ok(());
        };
        let mut sentences = Vec::new();
        for c in set.candidates.iter().filter(|c| c.alive) {
            if let Some(sentence) = self.first_sentence(&c.answer)? {
                sentences.push(sentence);
            }
        }
        for sentence in sentences {
            self.prepare_sentence(turn, sentence, tts)?;
        }
        Ok(())
    }

    /// At the final partial: the candidate whose question's prompt is `prompt` (else the
    /// likeliest live one answering) becomes the guess, its branch the cache's one sequence.
    pub(super) fn settle_candidates(&mut self, turn: &mut TurnState, prompt: &[u32]) -> Result<()> {
        let Some(mut set) = turn.candidates.take() else {
            return Ok(());
        };
        let answering = |c: &Candidate| c.alive && c.question.is_some();
        let chosen = set
            .candidates
            .iter()
            .position(|c| answering(c) && c.question.as_ref().is_some_and(|(_, p)| p == prompt))
            .or_else(|| set.candidates.iter().position(answering));
        let Some(chosen) = chosen else {
            turn.candidates = Some(set);
            return self.drop_candidates(turn);
        };
        let Some((_, branches)) = set.branches.take() else {
            return Ok(());
        };
        let c = set.candidates.remove(chosen);
        branches.select(&mut self.model.model, c.branch)?;
        // The other candidates' answers often say what the answer to the asked question says:
        // the lookup continuation may copy from them, the likeliest last (looked up first).
        for other in set.candidates.into_iter().rev().filter(|c| c.alive) {
            turn.recycle(Some(other.answer.tokens));
        }
        let (question, question_prompt) = c.question.unwrap_or_default();
        turn.heard_text = question.clone();
        turn.completed = Some(question);
        turn.heard_prompt = Some(question_prompt);
        turn.guess = c.answer;
        Ok(())
    }
}

/// A candidate answering `question`: its branch forwards the prompt after the shared
/// `context`; none if the prompt does not continue that context.
fn answering(
    branches: &mut Branches,
    context: &[u32],
    question: String,
    prompt: Vec<u32>,
) -> Option<Candidate> {
    (prompt.len() > context.len() && prompt.starts_with(context)).then(|| Candidate {
        branch: branches.open(prompt[context.len()..].to_vec()),
        question: Some((question, prompt)),
        answer: Answer::default(),
        alive: true,
    })
}
