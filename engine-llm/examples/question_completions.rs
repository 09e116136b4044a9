//! How often the model, hearing a question word by word, completes it into the question the
//! user asks: its first candidate against any of several — how much answering several
//! candidate questions ahead can gain. Two searches for the candidates: PredGen's beam
//! search over whole completions (`--search beam`, the likeliest completed questions by their
//! probability) and the model's likeliest first tokens, each completed greedily
//! (`--search first-tokens`; its first candidate is the greedy completion). Over the opening
//! question of every conversation of the voice set, after each word but the last.
//!
//! ```sh
//! cargo run --release -p engine-llm --example question_completions -- [--candidates 4] [--search first-tokens]
//! ```

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use engine_llm::predgen::{MAX_COMPLETION_TOKENS, PARTIAL_INPUT_SYSTEM_PROMPT};
use engine_llm::{LanguageModel, Message};
use spec_cli::{init_logging, ModelArgs};
use spec_core::decoder::common_suffix_len;
use spec_core::sampling::{argmax, log_probabilities, top_k_tokens};
use spec_core::{Decoder, LogitRows};

#[derive(Clone, Copy, ValueEnum)]
enum Search {
    /// The likeliest completed questions, by a beam search over completions (PredGen's)
    Beam,
    /// Each of the likeliest first tokens, completed greedily
    FirstTokens,
}

/// How often the model completes a question being spoken into the one the user asks.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// Candidate completions
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=16))]
    candidates: u64,

    /// How the candidates are found
    #[arg(long, value_enum, default_value_t = Search::Beam)]
    search: Search,

    /// The voice set's file: one conversation per block, one question per line
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/data/voice_questions.txt"))]
    voice_questions: PathBuf,
}

/// The chat prompt of a user message without the end of the user's turn (what the model
/// continues to complete the question), given how many tokens that end and the assistant's
/// opening take.
fn open_question(model: &LanguageModel, words: &str, closing: usize) -> Result<Vec<u32>> {
    let prompt = model.chat_prompt(&[
        Message::system(PARTIAL_INPUT_SYSTEM_PROMPT),
        Message::user(words),
    ])?;
    Ok(prompt[..prompt.len() - closing].to_vec())
}

/// The logits after `context` and then `tokens`, the cache holding `context` but its last
/// token beforehand.
fn logits_after(model: &mut LanguageModel, context: &[u32], tokens: &[u32]) -> Result<Vec<f32>> {
    model.model.truncate(context.len() - 1)?;
    let input: Vec<u32> = context[context.len() - 1..]
        .iter()
        .chain(tokens)
        .copied()
        .collect();
    Ok(model
        .model
        .forward_tokens(&input, LogitRows::Last(1))?
        .into_last_row())
}

/// The completions of the words `context` opens, starting with each of the `candidates`
/// likeliest first tokens, likeliest first; `None` where the model would not end the question
/// within [`MAX_COMPLETION_TOKENS`].
fn first_token_completions(
    model: &mut LanguageModel,
    context: &[u32],
    candidates: usize,
) -> Result<Vec<Option<Vec<u32>>>> {
    let end = model.tokenizer.end_tokens().to_vec();
    let mut out = Vec::new();
    for first in top_k_tokens(&logits_after(model, context, &[])?, candidates) {
        let mut tokens = vec![first];
        let mut ended = end.contains(&first);
        while !ended && tokens.len() < MAX_COMPLETION_TOKENS {
            let next = argmax(&logits_after(model, context, &tokens)?);
            ended = end.contains(&next);
            if !ended {
                tokens.push(next);
            }
        }
        tokens.retain(|t| !end.contains(t));
        out.push(ended.then_some(tokens));
    }
    Ok(out)
}

/// The `candidates` likeliest completed questions, likeliest first: a beam of as many open
/// completions, each grown by its likeliest next tokens, until no open one can beat them.
fn beam_completions(
    model: &mut LanguageModel,
    context: &[u32],
    candidates: usize,
) -> Result<Vec<Option<Vec<u32>>>> {
    let end = model.tokenizer.end_tokens().to_vec();
    let mut open: Vec<(Vec<u32>, f32)> = vec![(Vec::new(), 0.0)];
    let mut completed: Vec<(Vec<u32>, f32)> = Vec::new();
    for _ in 0..MAX_COMPLETION_TOKENS {
        let mut grown = Vec::new();
        for (tokens, score) in &open {
            let logits = logits_after(model, context, tokens)?;
            let next = top_k_tokens(&logits, candidates);
            for (&t, log_p) in next.iter().zip(log_probabilities(&logits, &next)) {
                let mut longer = tokens.clone();
                match end.contains(&t) {
                    true => completed.push((longer, score + log_p)),
                    false => {
                        longer.push(t);
                        grown.push((longer, score + log_p));
                    }
                }
            }
        }
        grown.sort_by(|a, b| b.1.total_cmp(&a.1));
        grown.truncate(candidates);
        completed.sort_by(|a, b| b.1.total_cmp(&a.1));
        completed.truncate(candidates);
        let bar = match completed.len() == candidates {
            true => completed[candidates - 1].1,
            false => f32::NEG_INFINITY,
        };
        grown.retain(|(_, score)| *score > bar);
        open = grown;
        if open.is_empty() {
            break;
        }
    }
    Ok(completed
        .into_iter()
        .map(|(tokens, _)| Some(tokens))
        .collect())
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let mut model = args.model.open()?;
    let questions: Vec<String> = spec_voice::read_conversations(&args.voice_questions)?
        .into_iter()
        .filter_map(|conversation| conversation.into_iter().next())
        .collect();
    // The tokens after the user's words: the same for every message.
    let closing = common_suffix_len(
        &open_question(&model, "a", 0)?,
        &open_question(&model, "b", 0)?,
    );
    let candidates = args.candidates as usize;
    let (mut first_at_last, mut any_at_last, mut first_anywhere, mut any_anywhere) = (0, 0, 0, 0);
    for question in &questions {
        let words: Vec<&str> = question.split_whitespace().collect();
        let mut first = Vec::new();
        let mut any = Vec::new();
        for heard in 1..words.len() {
            let heard = words[..heard].join(" ");
            let context = open_question(&model, &heard, closing)?;
            model.model.truncate(0)?;
            model
                .model
                .forward_tokens(&context[..context.len() - 1], LogitRows::Last(1))?;
            let found = match args.search {
                Search::Beam => beam_completions(&mut model, &context, candidates)?,
                Search::FirstTokens => first_token_completions(&mut model, &context, candidates)?,
            };
            let found = found
                .into_iter()
                .map(|tokens| {
                    let Some(tokens) = tokens else {
                        return Ok(None);
                    };
                    let rest = model.tokenizer.decode_text(&tokens)?;
                    Ok(Some(format!("{heard}{rest}").trim().to_string()))
                })
                .collect::<Result<Vec<_>>>()?;
            let right = |c: &Option<String>| c.as_deref() == Some(question.as_str());
            first.push(found.first().is_some_and(right));
            any.push(found.iter().any(right));
        }
        let marks = |hits: &[bool]| {
            hits.iter()
                .map(|&h| if h { '+' } else { '.' })
                .collect::<String>()
        };
        println!(
            "{question:<64} first {:<16} one of {candidates} {}",
            marks(&first),
            marks(&any)
        );
        first_at_last += usize::from(first.last() == Some(&true));
        any_at_last += usize::from(any.last() == Some(&true));
        first_anywhere += usize::from(first.contains(&true));
        any_anywhere += usize::from(any.contains(&true));
    }
    println!(
        "{} questions; completed into the asked question after all words but the last: first candidate {first_at_last}, one of {candidates} {any_at_last}; after some word: first candidate {first_anywhere}, one of {candidates} {any_anywhere}",
        questions.len()
    );
    Ok(())
}
