//! How often the model, hearing a question word by word, completes it into the question the
//! user asks: PredGen's completion (greedy, the one it answers ahead of time) against the best
//! of several candidates (each of the model's likeliest first tokens, completed greedily) — how
//! much answering several candidate questions ahead could gain. Over the opening question of
//! every conversation of the voice set, after each word but the last.
//!
//! ```sh
//! cargo run --release -p engine-llm --example question_completions -- [--candidates 4]
//! ```

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use engine_llm::cli::{init_logging, ModelArgs};
use engine_llm::predgen::{MAX_COMPLETION_TOKENS, PARTIAL_INPUT_SYSTEM_PROMPT};
use engine_llm::{LanguageModel, Message};
use spec_core::decoder::common_suffix_len;
use spec_core::sampling::argmax;
use spec_core::{Decoder, LogitRows};

/// How often the model completes a question being spoken into the one the user asks.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// Candidate completions: the model's likeliest first tokens, each completed greedily
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=16))]
    candidates: u64,

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

/// The completions of `heard` starting with each of the `candidates` likeliest first tokens,
/// likeliest first; `None` where the model would not end the question within
/// [`MAX_COMPLETION_TOKENS`].
fn completions(
    model: &mut LanguageModel,
    heard: &str,
    closing: usize,
    candidates: usize,
) -> Result<Vec<Option<String>>> {
    let end = model.tokenizer.end_tokens().to_vec();
    let context = open_question(model, heard, closing)?;
    model.model.truncate(0)?;
    let logits = model.model.forward_tokens(&context, LogitRows::Last(1))?;
    let row = logits.row(0);
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
    let mut out = Vec::new();
    for &first in order.iter().take(candidates) {
        model.model.truncate(context.len())?;
        let mut tokens = vec![first];
        let mut ended = end.contains(&first);
        while !ended && tokens.len() < MAX_COMPLETION_TOKENS {
            let logits = model
                .model
                .forward_tokens(&tokens[tokens.len() - 1..], LogitRows::Last(1))?;
            let next = argmax(logits.row(0));
            ended = end.contains(&next);
            if !ended {
                tokens.push(next);
            }
        }
        out.push(match ended {
            true => {
                let words = tokens.iter().copied().filter(|t| !end.contains(t));
                let rest = model.tokenizer.decode_text(&words.collect::<Vec<_>>())?;
                Some(format!("{heard}{rest}").trim().to_string())
            }
            false => None,
        });
    }
    Ok(out)
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let mut model = args.model.open()?;
    let questions: Vec<String> = engine_llm::spec_voice::read_conversations(&args.voice_questions)?
        .into_iter()
        .filter_map(|conversation| conversation.into_iter().next())
        .collect();
    // The tokens after the user's words: the same for every message.
    let closing = common_suffix_len(
        &open_question(&model, "a", 0)?,
        &open_question(&model, "b", 0)?,
    );
    let candidates = args.candidates as usize;
    let (mut greedy_at_last, mut any_at_last, mut greedy_anywhere, mut any_anywhere) = (0, 0, 0, 0);
    for question in &questions {
        let words: Vec<&str> = question.split_whitespace().collect();
        let mut greedy = Vec::new();
        let mut any = Vec::new();
        for heard in 1..words.len() {
            let found = completions(&mut model, &words[..heard].join(" "), closing, candidates)?;
            let right = |c: &Option<String>| c.as_deref() == Some(question.as_str());
            greedy.push(found.first().is_some_and(right));
            any.push(found.iter().any(right));
        }
        let marks = |hits: &[bool]| {
            hits.iter()
                .map(|&h| if h { '+' } else { '.' })
                .collect::<String>()
        };
        println!(
            "{question:<64} greedy {:<16} one of {candidates} {}",
            marks(&greedy),
            marks(&any)
        );
        greedy_at_last += usize::from(greedy.last() == Some(&true));
        any_at_last += usize::from(any.last() == Some(&true));
        greedy_anywhere += usize::from(greedy.contains(&true));
        any_anywhere += usize::from(any.contains(&true));
    }
    println!(
        "{} questions; completed into the asked question after all words but the last: greedy {greedy_at_last}, one of {candidates} candidates {any_at_last}; after some word: greedy {greedy_anywhere}, one of {candidates} {any_anywhere}",
        questions.len()
    );
    Ok(())
}
