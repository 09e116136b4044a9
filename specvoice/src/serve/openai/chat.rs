//! `POST /v1/chat/completions`: the chat model's answer, whole or streamed as server-sent
//! events (`chat.completion.chunk` deltas, then `data: [DONE]`).
//!
//! Greedy requests (`temperature: 0`) decode with the server's speculation
//! ([`ServeConfig::chat_speculation`](crate::serve::ServeConfig::chat_speculation), prompt
//! lookup by default): the same tokens as plain greedy decoding, in fewer forwards when drafts
//! are right. Sampled requests (OpenAI's default temperature is 1) decode plainly.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use engine_llm::{FinishReason, Flow, GenerateOptions, Message, Role};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::{json_body, now, object_id, with_engine, ApiError};
use crate::serve::access::Client;
use crate::serve::metrics::Endpoint;
use crate::serve::Shared;

/// Most stop strings a request may give (OpenAI's bound).
const MAX_STOPS: usize = 4;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatRequest {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    stop: Option<Stop>,
    seed: Option<i64>,
    n: Option<u32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    /// An end user's id, for the client's records; not used.
    #[serde(rename = "user")]
    _user: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
    /// Padding against side channels on OpenAI's network; nothing to pad on a local server.
    #[serde(rename = "include_obfuscation")]
    _include_obfuscation: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatMessage {
    role: String,
    content: Option<Content>,
    #[serde(rename = "name")]
    _name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// What the request asks for, checked.
struct Request {
    messages: Vec<Message>,
    options: GenerateOptions,
    stream: bool,
    include_usage: bool,
}

fn check(request: ChatRequest, shared: &Shared) -> Result<Request, ApiError> {
    let models = &shared.config.models;
    models.check(&request.model, &models.chat, &[])?;
    if request.messages.is_empty() {
        return Err(ApiError::invalid("`messages` is empty").param("messages"));
    }
    let messages = request
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(m).map_err(|e| e.param(&format!("messages[{i}]"))))
        .collect::<Result<Vec<_>, _>>()?;
    if request.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("only one choice (`n`: 1) is made").param("n"));
    }
    for (name, penalty) in [
        ("frequency_penalty", request.frequency_penalty),
        ("presence_penalty", request.presence_penalty),
    ] {
        if penalty.is_some_and(|p| p != 0.0) {
            return Err(ApiError::invalid(format!("`{name}` is not supported here")).param(name));
        }
    }
    let max_tokens = request
        .max_completion_tokens
        .or(request.max_tokens)
        .unwrap_or(shared.config.default_max_tokens);
    if max_tokens == 0 {
        return Err(ApiError::invalid("`max_tokens` must be at least 1").param("max_tokens"));
    }
    let temperature = request.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid("`temperature` must lie in 0..=2").param("temperature"));
    }
    let mut options = GenerateOptions::default()
        .max_tokens(max_tokens)
        .temperature(temperature)
        .seed(request.seed.map_or(0, |s| s as u64));
    if let Some(top_p) = request.top_p {
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid("`top_p` must lie in (0, 1]").param("top_p"));
        }
        if top_p < 1.0 {
            options = options.top_p(top_p);
        }
    }
    let stops = match request.stop {
        None => Vec::new(),
        Some(Stop::One(stop)) => vec![stop],
        Some(Stop::Many(stops)) => stops,
    };
    if stops.len() > MAX_STOPS || stops.iter().any(String::is_empty) {
        return Err(
            ApiError::invalid(format!("`stop`: at most {MAX_STOPS} non-empty strings"))
                .param("stop"),
        );
    }
    for stop in stops {
        options = options.stop_string(stop);
    }
    if options.sampling.is_greedy() {
        options = options.speculation(shared.config.chat_speculation.clone());
    }
    Ok(Request {
        messages,
        options,
        stream: request.stream,
        include_usage: request.stream_options.unwrap_or_default().include_usage,
    })
}

fn message(message: ChatMessage) -> Result<Message, ApiError> {
    let role = match message.role.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => {
            return Err(ApiError::invalid(format!(
                "messages of the role `{other}` are not supported (system, developer, user, \
                 assistant)"
            )))
        }
    };
    let content = match message.content {
        None => String::new(),
        Some(Content::Text(text)) => text,
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(piece)) => text.push_str(&piece),
                    (kind, _) => {
                        return Err(ApiError::invalid(format!(
                            "content parts of the type `{kind}` are not supported (text)"
                        )))
                    }
                }
            }
            text
        }
    };
    Ok(Message { role, content })
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

impl Usage {
    fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

fn finish_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::MaxTokens | FinishReason::ContextFull => "length",
        _ => "stop",
    }
}

/// What the engine's thread tells a streaming response.
enum Piece {
    Delta(String),
    Done { finish: FinishReason, usage: Usage },
}

pub(super) async fn completions(
    State(shared): State<Arc<Shared>>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let _active = shared.metrics.request(Endpoint::ChatCompletions);
    let result = answer(&shared, &client, &headers, body).await;
    result.unwrap_or_else(|error| {
        shared.metrics.failed(Endpoint::ChatCompletions);
        error.into_response()
    })
}

async fn answer(
    shared: &Arc<Shared>,
    client: &Client,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let request = check(json_body(headers, body)?, shared)?;
    let held = shared.access.hold(client)?;
    let (pieces, mut receiver) = mpsc::channel(64);
    let Request {
        messages,
        options,
        stream,
        include_usage,
    } = request;
    let worker = Arc::clone(shared);
    let task = tokio::spawn(async move {
        let metrics = Arc::clone(&worker);
        let outcome = with_engine(&worker, move |engine| {
            let model = &mut engine.model;
            let prompt_tokens = model
                .chat_prompt(&messages)
                .map_err(|e| ApiError::invalid(e.to_string()).param("messages"))?
                .len();
            let mut first = true;
            let answer = model.chat_stream(&messages, &options, |delta| {
                if first {
                    metrics.metrics.first_token(received.elapsed());
                    first = false;
                }
                match pieces.blocking_send(Piece::Delta(delta.to_string())) {
                    Ok(()) => Flow::Continue,
                    // The client is gone.
                    Err(_) => Flow::Stop,
                }
            });
            let answer = answer.map_err(|e| match e {
                engine_llm::Error::PromptTooLong { .. } | engine_llm::Error::Input(_) => {
                    ApiError::invalid(e.to_string()).param("messages")
                }
                other => ApiError::server(other),
            })?;
            metrics.metrics.decoded(&answer.stats);
            let usage = Usage::new(prompt_tokens, answer.tokens.len());
            let _ = pieces.blocking_send(Piece::Done {
                finish: answer.finish,
                usage,
            });
            Ok(())
        })
        .await;
        drop(held);
        outcome
    });
    let id = object_id("chatcmpl-");
    let model = shared.config.models.chat.clone();
    let created = now();
    if !stream {
        let mut content = String::new();
        while let Some(piece) = receiver.recv().await {
            match piece {
                Piece::Delta(delta) => content.push_str(&delta),
                Piece::Done { finish, usage } => {
                    return Ok(Json(serde_json::json!({
                        "id": id,
                        "object": "chat.completion",
                        "created": created,
                        "model": model,
                        "choices": [{
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "logprobs": null,
                            "finish_reason": finish_reason(finish),
                        }],
                        "usage": usage,
                    }))
                    .into_response())
                }
            }
        }
        return Err(outcome_error(task).await);
    }
    // The first piece decides between an error response and the stream.
    let first = match receiver.recv().await {
        Some(piece) => piece,
        None => return Err(outcome_error(task).await),
    };
    let chunk = move |delta: serde_json::Value, finish: Option<&str>| {
        serde_json::json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    };
    let (events, streamed) = mpsc::channel::<Event>(64);
    let metrics = Arc::clone(shared);
    tokio::spawn(async move {
        let event = |json: serde_json::Value| Event::default().data(json.to_string());
        let mut next = Some(first);
        let role = chunk(
            serde_json::json!({"role": "assistant", "content": ""}),
            None,
        );
        if events.send(event(role)).await.is_err() {
            return;
        }
        loop {
            let piece = match next.take() {
                Some(piece) => piece,
                None => match receiver.recv().await {
                    Some(piece) => piece,
                    None => break,
                },
            };
            let jsons = match piece {
                Piece::Delta(delta) => vec![chunk(serde_json::json!({"content": delta}), None)],
                Piece::Done { finish, usage } => {
                    let mut last = vec![chunk(serde_json::json!({}), Some(finish_reason(finish)))];
                    if include_usage {
                        let mut usage_chunk = chunk(serde_json::json!({}), None);
                        usage_chunk["choices"] = serde_json::json!([]);
                        usage_chunk["usage"] = serde_json::json!(usage);
                        last.push(usage_chunk);
                    }
                    last
                }
            };
            for json in jsons {
                if events.send(event(json)).await.is_err() {
                    // The client is gone; the engine's thread stops at its next token.
                    return;
                }
            }
        }
        if let Ok(Err(error)) | Err(error) = task.await.map_err(ApiError::server) {
            metrics.metrics.failed(Endpoint::ChatCompletions);
            let _ = events.send(event(error.body())).await;
        }
        let _ = events.send(Event::default().data("[DONE]")).await;
    });
    let stream = futures_util::stream::unfold(streamed, |mut streamed| async move {
        let event = streamed.recv().await?;
        Some((Ok::<_, Infallible>(event), streamed))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Why the engine's task ended without a result.
async fn outcome_error(task: tokio::task::JoinHandle<Result<(), ApiError>>) -> ApiError {
    match task.await {
        Ok(Err(error)) => error,
        Ok(Ok(())) => ApiError::server("the answer ended without a result"),
        Err(e) => ApiError::server(e),
    }
}
