//! The OpenAI-compatible API, for the clients people already have: `GET /v1/models`,
//! `POST /v1/chat/completions` (streamed as server-sent events or whole),
//! `POST /v1/audio/transcriptions`, `POST /v1/audio/speech` (streamed as it is synthesized)
//! and the Realtime API's WebSocket at `/v1/realtime`. They run on the same engines, queue,
//! keys and limits as SpecVoice's own protocol; errors have OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`).

mod audio;
mod chat;
mod realtime;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;

use super::pool::{Acquired, Refusal};
use super::{Engine, Shared};
use crate::Error;

/// The names the served models answer to in the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedModels {
    /// The chat model (`/v1/chat/completions`). Default `specvoice-chat`.
    pub chat: String,
    /// Whisper (`/v1/audio/transcriptions`); `whisper-1` and OpenAI's transcription models'
    /// names are taken for it too. Default `specvoice-whisper`.
    pub transcription: String,
    /// The voices (`/v1/audio/speech`); `tts-1`, `tts-1-hd` and `gpt-4o-mini-tts` are taken
    /// for it too. Default `specvoice-tts`.
    pub speech: String,
}

impl Default for ServedModels {
    fn default() -> Self {
        Self {
            chat: "specvoice-chat".into(),
            transcription: "specvoice-whisper".into(),
            speech: "specvoice-tts".into(),
        }
    }
}

/// OpenAI's transcription model names, served by Whisper.
const TRANSCRIPTION_ALIASES: [&str; 3] =
    ["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"];

/// OpenAI's speech model names, served by SpecVoice's voices.
const SPEECH_ALIASES: [&str; 3] = ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"];

impl ServedModels {
    fn ids(&self) -> [&str; 3] {
        [&self.chat, &self.transcription, &self.speech]
    }

    fn check(&self, model: &str, served: &str, aliases: &[&str]) -> Result<(), ApiError> {
        if model == served || aliases.contains(&model) {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{model}` does not exist here; this endpoint serves `{served}`"),
        )
        .param("model")
        .code("model_not_found"))
    }
}

/// An error in OpenAI's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    param: Option<String>,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            code: None,
            param: None,
            message: message.into(),
        }
    }

    /// A request the server cannot take as it is (400).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
            .code("invalid_api_key")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "invalid_request_error", message)
            .code("origin_not_allowed")
    }

    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            .code("rate_limit_exceeded")
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            message,
        )
        .code("request_too_large")
    }

    /// A request whose body did not arrive in time (408).
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            message,
        )
        .code("request_timeout")
    }

    /// The server failed (500).
    pub fn server(error: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            error.to_string(),
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).code("server_busy")
    }

    pub fn param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The error's JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body().to_string();
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

/// A pipeline error: the client's input (400) or the server's failure (500).
impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        match error {
            Error::Input(_) | Error::Asr(engine_asr::Error::Audio(_)) => {
                Self::invalid(error.to_string())
            }
            other => Self::server(other),
        }
    }
}

/// The API's routes (behind the access check).
pub(super) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/audio/transcriptions", post(audio::transcriptions))
        .route("/v1/audio/speech", post(audio::speech))
        .route("/v1/realtime", get(realtime::upgrade))
}

/// Seconds since the Unix epoch, for the `created` fields.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh object id: `prefix` and 24 hexadecimal digits.
fn object_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let count = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}{:016x}{:08x}",
        count ^ (u64::from(nanos) << 20),
        nanos
    )
}

#[derive(Serialize)]
struct ModelObject<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let created = now();
    let data: Vec<ModelObject<'_>> = shared
        .config
        .models
        .ids()
        .into_iter()
        .map(|id| ModelObject {
            id,
            object: "model",
            created,
            owned_by: "specvoice",
        })
        .collect();
    axum::Json(serde_json::json!({ "object": "list", "data": data })).into_response()
}

/// A JSON request body: its size and content type checked, then parsed into `T`.
fn json_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(e.body_text()),
        _ => ApiError::invalid(format!("the request body: {}", e.body_text())),
    })?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/json") {
        return Err(ApiError::invalid(format!(
            "expected a JSON body (Content-Type: application/json), got `{content_type}`"
        )));
    }
    serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("the request body: {e}")))
}

/// Runs `work` on an engine of the pool, on a blocking thread: waits in the queue for one (429
/// when the queue is full), gives it back after, or has it rebuilt if `work` panicked.
async fn with_engine<T, F>(shared: &Arc<Shared>, work: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&mut Engine) -> Result<T, ApiError> + Send + 'static,
{
    let mut engine = match shared.pool.acquire() {
        Ok(Acquired::Now(engine)) => *engine,
        Ok(Acquired::Queued(mut waiter)) => loop {
            match waiter.wait().await {
                Some(Ok(engine)) => break engine,
                Some(Err(refusal)) => return Err(refused(refusal)),
                None => {}
            }
        },
        Err(refusal) => return Err(refused(refusal)),
    };
    let pool = Arc::clone(&shared.pool);
    tokio::task::spawn_blocking(move || {
        match catch_unwind(AssertUnwindSafe(|| work(&mut engine))) {
            Ok(result) => {
                pool.release(engine);
                result
            }
            Err(_) => {
                drop(engine);
                pool.rebuild();
                Err(ApiError::server(
                    "the engine failed while serving the request",
                ))
            }
        }
    })
    .await
    .map_err(ApiError::server)?
}

fn refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::Full => ApiError::rate_limited(
            "the server is busy: every engine is in use and the queue is full",
        ),
        Refusal::NoEngines => ApiError::unavailable("the server has no engine left"),
    }
}
