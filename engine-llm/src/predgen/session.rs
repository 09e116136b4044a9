//! The PredGen session: turns of a conversation, each spoken as partial prompts.

use std::fmt;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::acceptance::Acceptance;
use spec_core::decoder::{common_prefix_len, forward_tokens, rewind_to_prefix};
use spec_core::sampling::{argmax, softmax};
use spec_core::{
    forward_continuation, generate, jacobi_generate, speculative_generate, AcceptanceRule, Decoder,
    DraftLength, FinishReason, Generation, LogitRows, SamplingConfig, SpeculativeConfig,
    StopConditions,
};

use super::input::{PartialInput, SimClock};
use super::sentence::{first_sentence_end, split_sentences};
use super::tts::{PreparedAudio, SentenceSynthesizer};
use super::{Continuation, PredGenConfig, Verifier, JUDGE_PROMPT};
use crate::chat::{LanguageModel, Message};
use crate::tokenizer::TextTokenizer;
use crate::transformer::CacheState;
use crate::{Error, Result};

/// Something that happened during a turn, at a time of the session clock (from the turn's
/// first input).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub at: Duration,
    pub kind: EventKind,
}

/// The kinds of [`Event`].
#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// A partial prompt was taken up (intermediate ones that arrived while the model was busy
    /// are skipped).
    Heard { text: String, is_final: bool },
    /// The guess was verified against the prompt: `kept` of `guessed` tokens (`judged_yes`
    /// when the reflection verifier asked).
    Verified {
        kept: usize,
        guessed: usize,
        judged_yes: Option<bool>,
    },
    /// Tokens generated onto the guess (or the answer).
    Generated { tokens: usize, text: String },
    /// A first sentence was handed to TTS ahead of time; its audio is ready at `ready_at`.
    Prepared {
        sentence: String,
        ready_at: Duration,
    },
    /// The first sentence of the final answer is complete.
    FirstSentence { text: String },
    /// A later sentence of the answer is complete and handed to TTS; its audio is ready at
    /// `ready_at`.
    Sentence { text: String, ready_at: Duration },
    /// Its audio starts playing (`prepared`: synthesized before the input ended).
    AudioStarts { prepared: bool },
    /// The answer is complete.
    AnswerDone { tokens: usize },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>8.3} s  ", self.at.as_secs_f64())?;
        match &self.kind {
            EventKind::Heard { text, is_final } => {
                let what = if *is_final { "heard (final)" } else { "heard" };
                write!(f, "{what:<14} \"{text}\"")
            }
            EventKind::Verified {
                kept,
                guessed,
                judged_yes,
            } => {
                write!(
                    f,
                    "{:<14} kept {kept} of {guessed} guessed tokens",
                    "verified"
                )?;
                match judged_yes {
                    Some(yes) => write!(f, " (judge: {})", if *yes { "yes" } else { "no" }),
                    None => Ok(()),
                }
            }
            EventKind::Generated { tokens, text } => {
                write!(f, "{:<14} +{tokens} tokens: \"{text}\"", "generated")
            }
            EventKind::Prepared { sentence, ready_at } => write!(
                f,
                "{:<14} \"{sentence}\" (audio ready at {:.3} s)",
                "to TTS",
                ready_at.as_secs_f64()
            ),
            EventKind::FirstSentence { text } => write!(f, "{:<14} \"{text}\"", "first sentence"),
            EventKind::Sentence { text, ready_at } => write!(
                f,
                "{:<14} \"{text}\" (audio ready at {:.3} s)",
                "next sentence",
                ready_at.as_secs_f64()
            ),
            EventKind::AudioStarts { prepared } => write!(
                f,
                "{:<14} {}",
                "audio starts",
                if *prepared {
                    "(synthesized ahead of time)"
                } else {
                    "(synthesized after the sentence)"
                }
            ),
            EventKind::AnswerDone { tokens } => write!(f, "{:<14} {tokens} tokens", "answer done"),
        }
    }
}

/// One turn's answer, latencies and timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// The final prompt text.
    pub question: String,
    pub answer: String,
    pub first_sentence: String,
    /// When the last input arrived (from the first input).
    pub input_end: Duration,
    /// TTFS: from the end of input until the first sentence is complete.
    pub time_to_first_sentence: Duration,
    /// NFETFS: target forward passes after the end of input until the first sentence is
    /// complete (1: accepted at the final verification).
    pub forwards_to_first_sentence: usize,
    /// From the end of input until the first audio plays.
    pub audio_latency: Duration,
    /// From the end of input until the whole answer is generated.
    pub answer_latency: Duration,
    /// Tokens generated while input was still arriving.
    pub tokens_during_input: usize,
    /// Target forward passes while input was still arriving.
    pub forwards_during_input: usize,
    /// Guessed tokens offered to, and kept by, the final verification.
    pub guessed_at_end: usize,
    pub kept_at_end: usize,
    /// The first sentence's audio was synthesized ahead of time.
    pub prepared_audio_used: bool,
    pub timeline: Vec<Event>,
}

/// The guess or answer being built: tokens (never an end token) and whether it is complete.
#[derive(Clone, Debug, Default)]
struct Answer {
    tokens: Vec<u32>,
    done: bool,
}

/// What verifying a guess gave.
struct Check {
    guessed: usize,
    kept: usize,
    /// The guess after the first token not kept: Jacobi's starting guess.
    rejected_tail: Vec<u32>,
    forwards: usize,
    judged_yes: Option<bool>,
}

/// A voice-assistant conversation with input-time speculation.
pub struct PredGen<'m> {
    model: &'m mut LanguageModel,
    draft: Option<&'m mut LanguageModel>,
    judge_cache: CacheState,
    /// Built with the reflection verifier, or on the first [`PredGen::judge`].
    judge_tokens: Option<JudgeTokens>,
    config: PredGenConfig,
    history: Vec<Message>,
}

/// Token ids of the judge's two answers, in the spellings a model may start with.
#[derive(Clone, Debug)]
struct JudgeTokens {
    yes: Vec<u32>,
    no: Vec<u32>,
}

impl JudgeTokens {
    fn new(tokenizer: &TextTokenizer) -> Result<Self> {
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
    fn says_yes(&self, logits: &[f32]) -> bool {
        let probs = softmax(logits);
        let mass = |ids: &[u32]| ids.iter().map(|&i| probs[i as usize]).sum::<f32>();
        mass(&self.yes) > mass(&self.no)
    }
}

impl<'m> PredGen<'m> {
    /// A session on `model`; fails on settings out of range, and for the reflection verifier
    /// when the tokenizer has no single token for "yes" and "no".
    pub fn new(model: &'m mut LanguageModel, config: PredGenConfig) -> Result<Self> {
        config.validate()?;
        let judge_tokens = match config.verifier {
            Verifier::Reflection => Some(JudgeTokens::new(&model.tokenizer)?),
            _ => None,
        };
        Ok(Self {
            judge_cache: model.model.new_cache(),
            judge_tokens,
            model,
            draft: None,
            config,
            history: Vec::new(),
        })
    }

    /// Attaches the draft model of [`Continuation::DraftModel`]; it must share the vocabulary.
    pub fn with_draft(mut self, draft: &'m mut LanguageModel) -> Result<Self> {
        self.model.check_draft(draft)?;
        self.draft = Some(draft);
        Ok(self)
    }

    /// The settings.
    pub fn config(&self) -> &PredGenConfig {
        &self.config
    }

    /// The conversation so far (user and assistant turns).
    pub fn history(&self) -> &[Message] {
        &self.history
    }

    /// Starts a new conversation.
    pub fn clear_history(&mut self) {
        self.history.clear();
    }

    /// One turn with input-time speculation: `inputs` are the user's partial prompts in order
    /// of arrival, the last one final. Returns the answer with its latencies; the turn joins the
    /// history.
    pub fn turn(
        &mut self,
        inputs: &[PartialInput],
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Turn> {
        let final_input = check_inputs(inputs)?;
        if matches!(self.config.continuation, Continuation::DraftModel { .. })
            && self.draft.is_none()
        {
            return Err(Error::Config(
                "the draft-model continuation needs a draft model (PredGen::with_draft)".into(),
            ));
        }
        self.start_turn()?;
        let mut clock = SimClock::new();
        let mut timeline = Vec::new();
        let mut guess = Answer::default();
        let mut rejected_tail = Vec::new();
        let mut prepared: Option<PreparedAudio> = None;
        let mut heard: Option<(usize, Vec<u32>)> = None;
        let (mut tokens_during_input, mut forwards_during_input) = (0, 0);

        loop {
            let Some(latest) = inputs.iter().rposition(|p| p.at <= clock.now()) else {
                clock.wait_until(inputs[0].at);
                continue;
            };
            if latest == inputs.len() - 1 {
                break;
            }
            // Each step verifies the guess if a new partial prompt has arrived, then generates
            // on for up to `tokens_per_step` tokens, then looks for new input again: verifying
            // alone would starve generation whenever a verification outlasts a spoken word.
            let mut worked = false;
            if heard.as_ref().is_none_or(|(i, _)| *i != latest) {
                let started = Instant::now();
                let text = &inputs[latest].text;
                timeline.push(event(&clock, heard_event(&inputs[latest])));
                let prompt = self.prompt_for(text)?;
                let check = self.verify(&prompt, text, &mut guess)?;
                clock.advance(started.elapsed());
                forwards_during_input += check.forwards;
                tokens_during_input += guess.tokens.len().saturating_sub(check.kept);
                timeline.push(event(&clock, verified_event(&check)));
                rejected_tail = check.rejected_tail;
                heard = Some((latest, prompt));
                worked = true;
            }
            let input_over = final_input.at <= clock.now();
            if !input_over
                && !guess.done
                && guess.tokens.len() < self.config.max_guess_tokens
                && self.first_sentence(&guess)?.is_none()
            {
                let started = Instant::now();
                let prompt = heard.as_ref().map(|(_, p)| p.clone()).unwrap_or_default();
                let budget = self
                    .config
                    .tokens_per_step
                    .min(self.config.max_guess_tokens - guess.tokens.len());
                let before = guess.tokens.len();
                let gen = self.extend(&prompt, &mut guess, &rejected_tail, budget, Some(1))?;
                clock.advance(started.elapsed());
                forwards_during_input += gen.stats.target_forwards;
                tokens_during_input += guess.tokens.len() - before;
                rejected_tail.clear();
                timeline.push(event(
                    &clock,
                    self.generated_event(&guess.tokens[before..])?,
                ));
                worked = true;
            }
            if !worked {
                clock.wait_until(inputs[latest + 1].at);
                continue;
            }
            // Hand the guessed first sentence to TTS as soon as it is complete.
            if let Some(sentence) = self.first_sentence(&guess)? {
                if !prepared.as_ref().is_some_and(|p| p.matches(&sentence)) {
                    let synthesis = tts.synthesize(&sentence)?;
                    let ready_at = clock.now() + synthesis.first_audio_after;
                    timeline.push(event(&clock, EventKind::Prepared { sentence, ready_at }));
                    prepared = Some(PreparedAudio {
                        synthesis,
                        ready_at,
                    });
                }
            }
        }

        // The input is complete: one forward verifies the guess against the full prompt.
        let input_end = final_input.at;
        clock.wait_until(input_end);
        timeline.push(event(&clock, heard_event(final_input)));
        let prompt = self.prompt_for(&final_input.text)?;
        let guessed_at_end = guess.tokens.len();
        let started = Instant::now();
        let check = self.verify(&prompt, &final_input.text, &mut guess)?;
        clock.advance(started.elapsed());
        timeline.push(event(&clock, verified_event(&check)));
        let mut answer = guess;
        let mut forwards_to_first_sentence = check.forwards;
        if self.first_sentence(&answer)?.is_none() && !answer.done {
            let started = Instant::now();
            let before = answer.tokens.len();
            let budget = self.config.max_answer_tokens - answer.tokens.len();
            let gen = self.extend(&prompt, &mut answer, &check.rejected_tail, budget, Some(1))?;
            clock.advance(started.elapsed());
            forwards_to_first_sentence += gen.stats.target_forwards;
            timeline.push(event(
                &clock,
                self.generated_event(&answer.tokens[before..])?,
            ));
        }
        let finish = Finish {
            continuation: self.config.continuation,
            question: final_input.text.clone(),
            prompt,
            clock,
            timeline,
            input_end,
            forwards_to_first_sentence,
            prepared,
            tokens_during_input,
            forwards_during_input,
            guessed_at_end,
            kept_at_end: check.kept,
        };
        self.finish_turn(answer, finish, tts)
    }

    /// The plain cascade for comparison: wait for the final input, generate greedily, then
    /// synthesize the first sentence. The turn joins the history.
    pub fn baseline_turn(
        &mut self,
        inputs: &[PartialInput],
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Turn> {
        let final_input = check_inputs(inputs)?;
        self.start_turn()?;
        let mut clock = SimClock::new();
        clock.wait_until(final_input.at);
        let mut timeline = vec![event(&clock, heard_event(final_input))];
        let prompt = self.prompt_for(&final_input.text)?;
        let mut answer = Answer::default();
        let started = Instant::now();
        let budget = self.config.max_answer_tokens;
        let gen = self.extend_with(
            Continuation::Autoregressive,
            &prompt,
            &mut answer,
            &[],
            budget,
            Some(1),
        )?;
        clock.advance(started.elapsed());
        timeline.push(event(&clock, self.generated_event(&answer.tokens)?));
        let finish = Finish {
            continuation: Continuation::Autoregressive,
            question: final_input.text.clone(),
            prompt,
            clock,
            timeline,
            input_end: final_input.at,
            forwards_to_first_sentence: gen.stats.target_forwards,
            prepared: None,
            tokens_during_input: 0,
            forwards_during_input: 0,
            guessed_at_end: 0,
            kept_at_end: 0,
        };
        self.finish_turn(answer, finish, tts)
    }

    /// After the first sentence: its audio, the rest of the answer, the history.
    fn finish_turn(
        &mut self,
        mut answer: Answer,
        finish: Finish,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Turn> {
        let Finish {
            continuation,
            question,
            prompt,
            mut clock,
            mut timeline,
            ..
        } = finish;
        let first_at = clock.now();
        // An answer cut off before its first sentence ends is spoken whole.
        let first_sentence = match self.first_sentence(&answer)? {
            Some(sentence) => sentence,
            None => self.answer_text(&answer)?,
        };
        timeline.push(event(
            &clock,
            EventKind::FirstSentence {
                text: first_sentence.clone(),
            },
        ));
        let prepared = finish
            .prepared
            .filter(|p| !first_sentence.is_empty() && p.matches(&first_sentence));
        let prepared_audio_used = prepared.is_some();
        let audio_at = match prepared {
            Some(p) => p.ready_at.max(first_at),
            None if first_sentence.is_empty() => first_at,
            None => first_at + tts.synthesize(&first_sentence)?.first_audio_after,
        };
        timeline.push(Event {
            at: audio_at,
            kind: EventKind::AudioStarts {
                prepared: prepared_audio_used,
            },
        });
        // The rest of the answer, sentence by sentence, each to TTS as soon as it is complete.
        let mut spoken = 1;
        while !answer.done && answer.tokens.len() < self.config.max_answer_tokens {
            let started = Instant::now();
            let budget = self.config.max_answer_tokens - answer.tokens.len();
            self.extend_with(
                continuation,
                &prompt,
                &mut answer,
                &[],
                budget,
                Some(spoken + 1),
            )?;
            clock.advance(started.elapsed());
            let text = self.model.tokenizer.decode_text(&answer.tokens)?;
            let complete = answer.done || answer.tokens.len() >= self.config.max_answer_tokens;
            let (sentences, _) = split_sentences(&text, complete);
            for sentence in sentences.iter().skip(spoken) {
                let ready_at = clock.now() + tts.synthesize(sentence)?.first_audio_after;
                timeline.push(event(
                    &clock,
                    EventKind::Sentence {
                        text: sentence.clone(),
                        ready_at,
                    },
                ));
            }
            spoken = spoken.max(sentences.len());
        }
        timeline.push(event(
            &clock,
            EventKind::AnswerDone {
                tokens: answer.tokens.len(),
            },
        ));
        let answer_text = self.answer_text(&answer)?;
        self.history.push(Message::user(question.clone()));
        self.history.push(Message::assistant(answer_text.clone()));
        timeline.sort_by_key(|e| e.at);
        Ok(Turn {
            question,
            answer: answer_text,
            first_sentence,
            input_end: finish.input_end,
            time_to_first_sentence: first_at - finish.input_end,
            forwards_to_first_sentence: finish.forwards_to_first_sentence,
            audio_latency: audio_at - finish.input_end,
            answer_latency: clock.now() - finish.input_end,
            tokens_during_input: finish.tokens_during_input,
            forwards_during_input: finish.forwards_during_input,
            guessed_at_end: finish.guessed_at_end,
            kept_at_end: finish.kept_at_end,
            prepared_audio_used,
            timeline,
        })
    }

    /// Keeps only the cached conversation so far, as a real assistant's cache would hold it
    /// when the user starts speaking (another session may have used the model since).
    fn start_turn(&mut self) -> Result<()> {
        let conversation = self.conversation(None);
        let tokens = self.model.chat_prompt(&conversation)?;
        let keep = common_prefix_len(self.model.model.cached_tokens(), &tokens);
        self.model.model.truncate(keep)?;
        Ok(())
    }

    fn conversation(&self, question: Option<&str>) -> Vec<Message> {
        let mut messages = vec![Message::system(self.config.system_prompt.clone())];
        messages.extend(self.history.iter().cloned());
        messages.extend(question.map(Message::user));
        messages
    }

    fn prompt_for(&self, text: &str) -> Result<Vec<u32>> {
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
    fn answer_text(&self, answer: &Answer) -> Result<String> {
        Ok(self
            .model
            .tokenizer
            .decode_text(&answer.tokens)?
            .trim()
            .to_string())
    }

    /// The first complete sentence of `answer`, if it has one.
    fn first_sentence(&self, answer: &Answer) -> Result<Option<String>> {
        let text = self.model.tokenizer.decode_text(&answer.tokens)?;
        Ok(first_sentence_end(&text, answer.done).map(|end| text[..end].trim().to_string()))
    }

    /// Verifies `guess` against `prompt` with the configured verifier and keeps what holds,
    /// plus the model's own next token; the cache then holds `prompt` and the kept tokens.
    fn verify(&mut self, prompt: &[u32], prompt_text: &str, guess: &mut Answer) -> Result<Check> {
        let room = self.model.model.max_len() - prompt.len() - 1;
        let limit = room.min(self.config.max_answer_tokens - 1);
        if guess.tokens.len() > limit {
            guess.tokens.truncate(limit);
            guess.done = false;
        }
        let logits = forward_continuation(&mut self.model.model, prompt, &guess.tokens)?;
        let rule = match self.config.verifier {
            Verifier::TopK(k) => AcceptanceRule::top_k(k),
            Verifier::Greedy | Verifier::Reflection => AcceptanceRule::greedy(),
        };
        let verdict = rule.verify_by_judging(&guess.tokens, &logits)?;
        let mut kept = verdict.accepted;
        let mut forwards = 1;
        let mut judged_yes = None;
        if self.config.verifier == Verifier::Reflection {
            // The judge is asked only when greedy verification loses part of the first
            // sentence: where greedy keeps it all, the judge could keep nothing more.
            if let Some(sentence_len) = self.first_sentence_tokens(&guess.tokens)? {
                if kept < sentence_len {
                    let sentence = self
                        .model
                        .tokenizer
                        .decode_text(&guess.tokens[..sentence_len])?;
                    let yes = self.judge(prompt_text, sentence.trim())?;
                    forwards += 1;
                    judged_yes = Some(yes);
                    if yes {
                        kept = sentence_len;
                    }
                }
            }
        }
        // Jacobi continues after the kept tokens and the model's next one: the rest of the
        // guess from the position after that is its starting guess.
        let guessed = guess.tokens.len();
        let rejected_tail = guess.tokens.get(kept + 2..).unwrap_or_default().to_vec();
        let full = kept == guess.tokens.len();
        guess.tokens.truncate(kept);
        self.model.model.truncate(prompt.len() + kept)?;
        if full && guess.done {
            // A finished guess, every token kept: the model's next token decides whether the
            // answer still ends there.
            guess.done = false;
        }
        let next = argmax(logits.row(kept));
        if self.model.tokenizer.end_tokens().contains(&next) {
            guess.done = true;
        } else {
            guess.tokens.push(next);
            guess.done = false;
        }
        Ok(Check {
            guessed,
            kept,
            rejected_tail,
            forwards,
            judged_yes,
        })
    }

    /// How many tokens of `tokens` make up its first complete sentence.
    fn first_sentence_tokens(&self, tokens: &[u32]) -> Result<Option<usize>> {
        for n in 1..=tokens.len() {
            let prefix = self.model.tokenizer.decode_text(&tokens[..n])?;
            if first_sentence_end(&prefix, false).is_some() {
                return Ok(Some(n));
            }
        }
        Ok(None)
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

    /// Generates onto `answer` with the configured continuation.
    fn extend(
        &mut self,
        prompt: &[u32],
        answer: &mut Answer,
        guess: &[u32],
        budget: usize,
        until_sentences: Option<usize>,
    ) -> Result<Generation> {
        self.extend_with(
            self.config.continuation,
            prompt,
            answer,
            guess,
            budget,
            until_sentences,
        )
    }

    /// Generates up to `budget` tokens onto `answer` (greedy, by `continuation`), stopping at
    /// an end token, a full context, or, with `until_sentences: Some(n)`, once the answer holds
    /// `n` complete sentences.
    fn extend_with(
        &mut self,
        continuation: Continuation,
        prompt: &[u32],
        answer: &mut Answer,
        guess: &[u32],
        budget: usize,
        until_sentences: Option<usize>,
    ) -> Result<Generation> {
        let context: Vec<u32> = prompt.iter().chain(&answer.tokens).copied().collect();
        let end_tokens = self.model.tokenizer.end_tokens().to_vec();
        let mut stop = StopConditions::new(budget).with_eos(end_tokens.iter().copied());
        if let Some(wanted) = until_sentences {
            let tokenizer = self.model.tokenizer.clone();
            let before = answer.tokens.clone();
            stop = stop.with_predicate(move |generated| {
                let tokens: Vec<u32> = before.iter().chain(generated).copied().collect();
                tokenizer
                    .decode_text(&tokens)
                    .is_ok_and(|text| split_sentences(&text, false).0.len() >= wanted)
            });
        }
        let target = &mut self.model.model;
        let mut rng = StdRng::seed_from_u64(0);
        let gen = match continuation {
            Continuation::Autoregressive => generate(
                target,
                &context,
                &SamplingConfig::greedy(),
                &stop,
                &mut rng,
                &mut |_| {},
            )?,
            Continuation::Jacobi { window } => {
                jacobi_generate(target, &context, guess, window, &stop, &mut |_| {})?
            }
            Continuation::DraftModel { gamma } => {
                let draft = self.draft.as_deref_mut().ok_or_else(|| {
                    Error::Config("the draft-model continuation needs a draft model".into())
                })?;
                speculative_generate(
                    target,
                    &mut draft.model,
                    &context,
                    &SpeculativeConfig {
                        draft_length: DraftLength::Fixed(gamma),
                        ..Default::default()
                    },
                    &stop,
                    &mut rng,
                    &mut |_| {},
                )?
            }
        };
        let ended = gen.finish == FinishReason::Eos;
        answer.tokens.extend(
            gen.tokens
                .iter()
                .copied()
                .take_while(|t| !end_tokens.contains(t)),
        );
        answer.done = ended
            || gen.finish == FinishReason::ContextFull
            || answer.tokens.len() >= self.config.max_answer_tokens;
        Ok(gen)
    }

    fn generated_event(&self, tokens: &[u32]) -> Result<EventKind> {
        Ok(EventKind::Generated {
            tokens: tokens.len(),
            text: self.model.tokenizer.decode_text(tokens)?,
        })
    }
}

/// What the end of a turn needs from its beginning.
struct Finish {
    /// How the rest of the answer is generated.
    continuation: Continuation,
    question: String,
    prompt: Vec<u32>,
    clock: SimClock,
    timeline: Vec<Event>,
    input_end: Duration,
    forwards_to_first_sentence: usize,
    prepared: Option<PreparedAudio>,
    tokens_during_input: usize,
    forwards_during_input: usize,
    guessed_at_end: usize,
    kept_at_end: usize,
}

fn check_inputs(inputs: &[PartialInput]) -> Result<&PartialInput> {
    let Some(last) = inputs.last() else {
        return Err(Error::Input("a turn needs at least one input".into()));
    };
    if !last.is_final || inputs[..inputs.len() - 1].iter().any(|p| p.is_final) {
        return Err(Error::Input(
            "the last input of a turn, and only the last, must be final".into(),
        ));
    }
    if inputs.windows(2).any(|w| w[1].at < w[0].at) {
        return Err(Error::Input("inputs must arrive in order of time".into()));
    }
    if last.text.trim().is_empty() {
        return Err(Error::Input("the final input is empty".into()));
    }
    Ok(last)
}

fn event(clock: &SimClock, kind: EventKind) -> Event {
    Event {
        at: clock.now(),
        kind,
    }
}

fn heard_event(input: &PartialInput) -> EventKind {
    EventKind::Heard {
        text: input.text.clone(),
        is_final: input.is_final,
    }
}

fn verified_event(check: &Check) -> EventKind {
    EventKind::Verified {
        kept: check.kept,
        guessed: check.guessed,
        judged_yes: check.judged_yes,
    }
}
