//! The chat API tests' conversation and streaming helper.

use engine_llm::{Answer, Flow, GenerateOptions, LanguageModel, Message};

pub fn question() -> Vec<Message> {
    vec![
        Message::system("Be brief."),
        Message::user("Tell me a story about a cat."),
    ]
}

/// The answer and the deltas it was streamed in.
pub fn streamed(
    model: &mut LanguageModel,
    messages: &[Message],
    options: &GenerateOptions,
) -> (Answer, Vec<String>) {
    let mut deltas = Vec::new();
    let answer = model
        .chat_stream(messages, options, |d| {
            deltas.push(d.to_string());
            Flow::Continue
        })
        .unwrap();
    (answer, deltas)
}
