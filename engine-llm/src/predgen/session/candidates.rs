//! Several candidate questions answered ahead in lockstep (beyond the paper;
//! [`PredGenConfig::question_candidates`](super::PredGenConfig::question_candidates) above 1).
//!
//! While the user speaks, a beam search over the model's completions of the words heard looks
//! for the likeliest completed questions: each open completion grows by its likeliest next
//! tokens, an end token completes a question, and only the `question_candidates` likeliest
//! completed questions are kept, with as many open completions as could still beat them. As
//! soon as a question is complete, its branch goes on with the end of the user's turn and the
//! answer to it, greedily. Everything advances together, one forward per step
//! ([`spec_core::Branches`]: each branch attends to the shared conversation and its own tokens
//! only, so each answer is exactly the model's greedy answer to its question; a completion's
//! continuations fork its branch, computing nothing twice). Newer words drop the candidates
//! they contradict; when none is left the words heard start new ones. At the last word the
//! candidate the user asked, if any, becomes the guess with nothing left to verify; otherwise
//! the likeliest one's answer is verified against the question as usual.

use std::time::Instant;

use spec_core::decoder::{forward_tokens, rewind_to_prefix};
use spec_core::sampling::{argmax, log_probabilities, top_k_tokens};
use spec_core::{Branches, Decoder, LogitRows};
use spec_voice::{keeps_words, Partial};

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
    /// Open completions and completed questions, live and dropped.
    candidates: Vec<Candidate>,
    /// No completion ended: the words themselves are answered as the question.
    answering_words: bool,
}

struct Candidate {
    /// Its branch: the completion (no end token), then, once the question is complete, the
    /// rest of its prompt and the answer.
    branch: usize,
    /// The completion's log-probability given the words (its end token included once the
    /// question is complete): the beam search's ranking.
    score: f32,
    /// The completed question and its chat prompt, once the completion ended.
    question: Option<(String, Vec<u32>)>,
    answer: Answer,
    /// Consistent with every word heard, and not dropped (grown into its continuations, out
    /// of the beam, not ended within [`MAX_COMPLETION_TOKENS`], or ended in a question another
    /// candidate asks).
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
    pub(super) fn listen_with_candidates(&mut self, turn: &mut TurnState) -> Result<bool> {
        let started = Instant::now();
        if let Some(partial) = turn.pending.take() {
            turn.timeline.push(turn.event(super::heard_event(&partial)));
            self.hear_candidates(turn, &partial)?;
        }
        let worked = self.advance_candidates(turn)?;
        turn.clock.charge(started.elapsed());
        if worked {
            self.prepare_candidate_sentences(turn)?;
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
        recycle_answers(turn, set.candidates);
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

    /// The beam search's first step: the words' own continuations.
    fn start_candidates(&mut self, turn: &mut TurnState, set: &mut Candidates) -> Result<()> {
        let context = self.words_context(&set.words)?;
        let keep = rewind_to_prefix(&mut self.model.model, &context)?;
        let logits = forward_tokens(&mut self.model.model, &context[keep..], LogitRows::Last(1))?;
        turn.forwards_during_input += 1;
        let mut branches = Branches::new(context.len())?;
        set.candidates.clear();
        self.grow(
            turn,
            set,
            &context,
            &mut branches,
            None,
            &logits.into_last_row(),
        )?;
        set.branches = Some((context, branches));
        Ok(())
    }

    /// One forward of every live branch: each open completion grows into its continuations
    /// ([`PredGen::grow`]), each answer by a token (it stops at its end, a complete first
    /// sentence or the guess's length limit). With no candidate left, the words themselves are
    /// answered.
    fn candidates_step(&mut self, turn: &mut TurnState, set: &mut Candidates) -> Result<bool> {
        let Some((context, mut branches)) = set.branches.take() else {
            return Ok(false);
        };
        let worked = branches.has_pending();
        if worked {
            let outputs = match branches.step(&mut self.model.model, MAX_STEP_INPUTS) {
                Ok(outputs) => outputs,
                Err(e) => {
                    // An interrupted step leaves the branches and the cache as they were.
                    set.branches = Some((context, branches));
                    return Err(e.into());
                }
            };
            turn.forwards_during_input += 1;
            for out in outputs {
                let Some(i) = set
                    .candidates
                    .iter()
                    .position(|c| c.alive && c.branch == out.branch)
                else {
                    continue;
                };
                match set.candidates[i].question.is_some() {
                    true => {
                        let token = argmax(&out.logits);
                        self.answer_token(turn, &mut set.candidates[i], &mut branches, token)?;
                    }
                    false => self.grow(turn, set, &context, &mut branches, Some(i), &out.logits)?,
                }
            }
        }
        let mut opened = false;
        if !set.answering_words && !set.candidates.iter().any(|c| c.alive) {
            set.answering_words = true;
            let question = set.words.trim().to_string();
            let prompt = self.prompt_for(&question)?;
            let candidate = answering(&mut branches, &context, None, &[], question, prompt, 0.0)?;
            opened = candidate.is_some();
            set.candidates.extend(candidate);
        }
        set.branches = Some((context, branches));
        Ok(worked || opened)
    }

    /// A step of the beam search: the open completion `parent` (or, with none, the words
    /// themselves) grows into its `question_candidates` likeliest continuations, each on a fork
    /// of its branch. An end token completes a question, which goes on with the rest of its
    /// prompt and its answer; it is dropped if it starts a new line, another candidate asks it,
    /// its re-tokenized prompt does not continue the branch, or enough likelier questions are
    /// complete. Then the beam keeps the likeliest completed questions and the open completions
    /// that could still beat them ([`PredGen::prune`]).
    fn grow(
        &mut self,
        turn: &mut TurnState,
        set: &mut Candidates,
        context: &[u32],
        branches: &mut Branches,
        parent: Option<usize>,
        logits: &[f32],
    ) -> Result<()> {
        let (parent_branch, parent_score) = match parent {
            Some(i) => {
                let c = &mut set.candidates[i];
                c.alive = false;
                branches.close(c.branch)?;
                (Some(c.branch), c.score)
            }
            None => (None, 0.0),
        };
        let completion = parent_branch
            .map_or(&[][..], |b| branches.tokens(b))
            .to_vec();
        let tokens = top_k_tokens(logits, self.config.question_candidates);
        let scores = log_probabilities(logits, &tokens);
        for (token, score) in tokens
            .into_iter()
            .zip(scores.into_iter().map(|s| parent_score + s))
        {
            if !self.model.tokenizer.end_tokens().contains(&token) {
                if completion.len() + 1 < MAX_COMPLETION_TOKENS {
                    let branch = continuation_branch(branches, parent_branch, completion.len())?;
                    branches.push(branch, token)?;
                    set.candidates.push(Candidate {
                        branch,
                        score,
                        question: None,
                        answer: Answer::default(),
                        alive: true,
                    });
                }
                continue;
            }
            let completed = set.completed().map(|i| &set.candidates[i]);
            let outranked = completed.clone().filter(|c| c.score >= score).count()
                >= self.config.question_candidates;
            let Some(question) = self.completed_question(&set.words, &completion)? else {
                continue;
            };
            if outranked || completed.clone().any(|c| c.question_is(&question)) {
                continue;
            }
            let prompt = self.prompt_for(&question)?;
            let event = EventKind::Completed {
                question: question.clone(),
            };
            let candidate = answering(
                branches,
                context,
                parent_branch,
                &completion,
                question,
                prompt,
                score,
            )?;
            if let Some(candidate) = candidate {
                turn.timeline.push(turn.event(event));
                set.candidates.push(candidate);
            }
        }
        self.prune(turn, set, branches)
    }

    /// Keeps the `question_candidates` likeliest completed questions and, of the open
    /// completions, as many likeliest as could still beat the least likely of those (a
    /// completion only grows less likely); drops the others.
    fn prune(
        &mut self,
        turn: &mut TurnState,
        set: &mut Candidates,
        branches: &mut Branches,
    ) -> Result<()> {
        let width = self.config.question_candidates;
        let completed = set.completed().collect::<Vec<_>>();
        let bar = match completed.len() >= width {
            true => set.candidates[completed[width - 1]].score,
            false => f32::NEG_INFINITY,
        };
        let open = set.by_score(|c| c.question.is_none());
        let dropped = completed.into_iter().skip(width).chain(
            open.into_iter()
                .enumerate()
                .filter(|&(rank, i)| rank >= width || set.candidates[i].score <= bar)
                .map(|(_, i)| i),
        );
        for i in dropped.collect::<Vec<_>>() {
            let c = &mut set.candidates[i];
            c.alive = false;
            branches.close(c.branch)?;
            turn.recycle(Some(std::mem::take(&mut c.answer.tokens)));
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

    /// Reports every live candidate's complete first sentence for synthesis, once each.
    fn prepare_candidate_sentences(&mut self, turn: &mut TurnState) -> Result<()> {
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
            turn.speak_ahead(sentence);
        }
        Ok(())
    }

    /// At the final partial: the candidate whose question's prompt is `prompt` (else the
    /// likeliest live one answering) becomes the guess, its branch the cache's one sequence.
    pub(super) fn settle_candidates(&mut self, turn: &mut TurnState, prompt: &[u32]) -> Result<()> {
        let Some(mut set) = turn.candidates.take() else {
            return Ok(());
        };
        let completed = set.completed().collect::<Vec<_>>();
        let asked = |&&i: &&usize| {
            let question = &set.candidates[i].question;
            question.as_ref().is_some_and(|(_, p)| p == prompt)
        };
        let chosen = completed.iter().find(asked).or(completed.first()).copied();
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
        // the lookup continuation may copy from them.
        recycle_answers(turn, set.candidates);
        let (question, question_prompt) = c.question.unwrap_or_default();
        turn.heard_text = question.clone();
        turn.completed = Some(question);
        turn.heard_prompt = Some(question_prompt);
        turn.guess = c.answer;
        Ok(())
    }
}

impl Candidates {
    /// The live candidates that `keep` keeps, likeliest first.
    fn by_score(&self, keep: impl Fn(&Candidate) -> bool) -> Vec<usize> {
        let mut chosen: Vec<usize> = (0..self.candidates.len())
            .filter(|&i| self.candidates[i].alive && keep(&self.candidates[i]))
            .collect();
        chosen.sort_by(|&a, &b| {
            self.candidates[b]
                .score
                .total_cmp(&self.candidates[a].score)
        });
        chosen
    }

    /// The live completed questions, likeliest first.
    fn completed(&self) -> impl Iterator<Item = usize> + Clone {
        self.by_score(|c| c.question.is_some()).into_iter()
    }
}

impl Candidate {
    fn question_is(&self, question: &str) -> bool {
        self.question.as_ref().is_some_and(|(q, _)| q == question)
    }
}

/// The live candidates' answers, as lookup references with the likeliest last (looked up
/// first).
fn recycle_answers(turn: &mut TurnState, mut candidates: Vec<Candidate>) {
    candidates.retain(|c| c.alive);
    candidates.sort_by(|a, b| a.score.total_cmp(&b.score));
    for c in candidates {
        turn.recycle(Some(c.answer.tokens));
    }
}

/// A new branch for a continuation of the completion on `parent` (its first `len` tokens), or
/// of the words themselves.
fn continuation_branch(
    branches: &mut Branches,
    parent: Option<usize>,
    len: usize,
) -> Result<usize> {
    Ok(match parent {
        Some(b) => branches.fork(b, len)?,
        None => branches.open(Vec::new()),
    })
}

/// A candidate answering `question`, whose chat `prompt` continues the shared `context` and
/// the words' `completion` (forwarded on `parent`, if any): its branch goes on with the rest of
/// the prompt. None if the prompt does not continue them (tokenizing the words and the
/// completion together can merge tokens at their boundary).
fn answering(
    branches: &mut Branches,
    context: &[u32],
    parent: Option<usize>,
    completion: &[u32],
    question: String,
    prompt: Vec<u32>,
    score: f32,
) -> Result<Option<Candidate>> {
    let answer_start = context.len() + completion.len();
    let continues = prompt.len() > answer_start
        && prompt.starts_with(context)
        && prompt[context.len()..].starts_with(completion);
    if !continues {
        return Ok(None);
    }
    let branch = continuation_branch(branches, parent, completion.len())?;
    for &t in &prompt[answer_start..] {
        branches.push(branch, t)?;
    }
    Ok(Some(Candidate {
        branch,
        score,
        question: Some((question, prompt)),
        answer: Answer::default(),
        alive: true,
    }))
}
