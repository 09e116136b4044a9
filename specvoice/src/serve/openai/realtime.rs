//! `GET /v1/realtime`: the Realtime API's WebSocket, for a voice session with the clients and
//! frameworks that speak it. Behind it runs the session SpecVoice's own protocol runs — the
//! listener, PredGen speculating the answer while the user speaks, the voice — and this module
//! translates both ways:
//!
//! - in: `session.update` (instructions, voice, `turn_detection` `server_vad` or
//!   `semantic_vad`, the PCM rates), `input_audio_buffer.append` (base64 16-bit PCM, resampled
//!   to the listener's 16 kHz), `.commit` (the utterance ends now, if the speaker has paused),
//!   `.clear`, `response.create` (answers come by themselves at each end of turn),
//!   `response.cancel`;
//! - out: `session.created|updated`, `input_audio_buffer.speech_started|speech_stopped|committed`,
//!   the input transcription's deltas and completion, `response.created`, the answer's audio
//!   (base64 16-bit PCM at the session's output rate) and transcript deltas, `response.done`
//!   (`completed`, or `cancelled` by a barge-in or `response.cancel`), and `error`.
//!
//! The session takes an engine before `session.created` (waiting in the server's queue like any
//! session); it starts hearing at the first audio, with the settings of that moment.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::{object_id, ApiError};
use crate::drive::Ended;
use crate::serve::access::{Budget, Client};
use crate::serve::connection::{close_gently, message_budget, send_within, shutting_down};
use crate::serve::metrics::Endpoint;
use crate::serve::pool::{Acquired, Refusal};
use crate::serve::protocol::{decode_frame, encode_pcm, Outgoing, ServerMessage, SessionMode};
use crate::serve::session::{self, Input, SessionContext};
use crate::serve::{accept, Engine, Shared};
use crate::turn_end::{SemanticTurnEnd, TurnEnd};
use crate::{ListenerConfig, Result};

/// The Realtime API's PCM rate, the default both ways.
const API_RATE: u32 = 24_000;

/// The PCM rates a session may set.
const RATES: [u32; 5] = [8_000, 16_000, 22_050, 24_000, 48_000];

/// Most client messages kept while the session waits for an engine.
const BACKLOG: usize = 256;

/// Audio frames waiting for the session's thread.
const INCOMING_FRAMES: usize = 64;

/// When the user's turn ends.
#[derive(Clone, Debug, PartialEq)]
enum TurnDetection {
    /// After this much silence.
    ServerVad { silence: Duration },
    /// When the chat model judges the words complete: `low` eagerness waits longer.
    SemanticVad { eagerness: String },
}

/// A session's settings, as `session.update` sets them.
#[derive(Clone, Debug)]
struct Settings {
    id: String,
    instructions: Option<String>,
    voice: String,
    input_rate: u32,
    output_rate: u32,
    turn: TurnDetection,
}

impl Settings {
    fn new(shared: &Shared) -> Self {
        let turn = match &shared.config.listener.turn_end {
            TurnEnd::Silence => TurnDetection::ServerVad {
                silence: shared.config.listener.endpoint.silence,
            },
            TurnEnd::Semantic(_) => TurnDetection::SemanticVad {
                eagerness: "auto".into(),
            },
        };
        Self {
            id: object_id("sess_"),
            instructions: None,
            voice: shared.voices.default_name().to_string(),
            input_rate: API_RATE,
            output_rate: API_RATE,
            turn,
        }
    }

    fn json(&self, shared: &Shared) -> Value {
        let turn_detection = match &self.turn {
            TurnDetection::ServerVad { silence } => json!({
                "type": "server_vad",
                "silence_duration_ms": silence.as_millis(),
                "create_response": true,
                "interrupt_response": true,
            }),
            TurnDetection::SemanticVad { eagerness } => json!({
                "type": "semantic_vad",
                "eagerness": eagerness,
                "create_response": true,
                "interrupt_response": true,
            }),
        };
        json!({
            "type": "realtime",
            "object": "realtime.session",
            "id": self.id,
            "model": shared.config.models.chat,
            "output_modalities": ["audio"],
            "instructions": self.instructions.as_deref().unwrap_or(&shared.config.predgen.system_prompt),
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.input_rate},
                    "transcription": {"model": shared.config.models.transcription},
                    "turn_detection": turn_detection,
                },
                "output": {
                    "format": {"type": "audio/pcm", "rate": self.output_rate},
                    "voice": self.voice,
                },
            },
        })
    }

    /// Applies a `session.update`'s session; `running`: the session hears already, so only
    /// what does not change how it hears and answers may change.
    fn update(&mut self, session: &Value, shared: &Shared, running: bool) -> Result<(), ApiError> {
        let mut next = self.clone();
        if let Some(instructions) = session.get("instructions") {
            next.instructions = Some(
                instructions
                    .as_str()
                    .ok_or_else(|| ApiError::invalid("`instructions` must be a string"))?
                    .to_string(),
            );
        }
        if let Some(modalities) = session.get("output_modalities") {
            if modalities != &json!(["audio"]) {
                return Err(
                    ApiError::invalid("only `output_modalities` [\"audio\"] is served")
                        .param("session.output_modalities"),
                );
            }
        }
        let audio = session.get("audio");
        let input = audio.and_then(|a| a.get("input"));
        let output = audio.and_then(|a| a.get("output"));
        if let Some(format) = input.and_then(|i| i.get("format")) {
            next.input_rate = pcm_rate(format, "session.audio.input.format")?;
        }
        if let Some(format) = output.and_then(|o| o.get("format")) {
            next.output_rate = pcm_rate(format, "session.audio.output.format")?;
        }
        if let Some(voice) = output.and_then(|o| o.get("voice")) {
            let name = voice
                .as_str()
                .ok_or_else(|| ApiError::invalid("`voice` must be a string"))?;
            next.voice = super::audio::voice_for(&shared.voices, name)?;
        }
        if let Some(turn) = input.and_then(|i| i.get("turn_detection")) {
            next.turn = turn_detection(turn, shared)?;
        }
        let changes_hearing = next.instructions != self.instructions
            || next.voice != self.voice
            || next.input_rate != self.input_rate
            || next.turn != self.turn;
        if running && changes_hearing {
            return Err(ApiError::invalid(
                "instructions, voice, input format and turn detection are set before the first \
                 audio",
            )
            .code("session_active"));
        }
        *self = next;
        Ok(())
    }

    /// The listener's settings for this session.
    fn listener(&self, base: &ListenerConfig) -> ListenerConfig {
        let mut listener = base.clone();
        match &self.turn {
            TurnDetection::ServerVad { silence } => {
                listener.turn_end = TurnEnd::Silence;
                listener.endpoint.silence = *silence;
            }
            TurnDetection::SemanticVad { eagerness } => {
                let defaults = SemanticTurnEnd::default();
                let longest = match eagerness.as_str() {
                    "low" => defaults.longest * 2,
                    "high" => defaults.longest / 2,
                    _ => defaults.longest,
                };
                listener.turn_end = TurnEnd::Semantic(SemanticTurnEnd {
                    longest,
                    ..defaults
                });
            }
        }
        listener
    }
}

fn pcm_rate(format: &Value, param: &str) -> Result<u32, ApiError> {
    if format.get("type").and_then(Value::as_str) != Some("audio/pcm") {
        return Err(ApiError::invalid("only the `audio/pcm` format is served").param(param));
    }
    match format.get("rate").map(Value::as_u64) {
        None => Ok(API_RATE),
        Some(Some(rate)) if RATES.iter().any(|r| u64::from(*r) == rate) => Ok(rate as u32),
        Some(_) => {
            Err(ApiError::invalid(format!("the PCM rate must be one of {RATES:?}")).param(param))
        }
    }
}

fn turn_detection(turn: &Value, shared: &Shared) -> Result<TurnDetection, ApiError> {
    let param = "session.audio.input.turn_detection";
    match turn.get("type").and_then(Value::as_str) {
        Some("server_vad") => {
            let silence = match turn.get("silence_duration_ms") {
                None => shared.config.listener.endpoint.silence,
                Some(ms) => {
                    let ms = ms
                        .as_u64()
                        .filter(|ms| (100..=10_000).contains(ms))
                        .ok_or_else(|| {
                            ApiError::invalid("`silence_duration_ms` must be 100 to 10000")
                                .param(param)
                        })?;
                    Duration::from_millis(ms)
                }
            };
            Ok(TurnDetection::ServerVad { silence })
        }
        Some("semantic_vad") => {
            let eagerness = turn
                .get("eagerness")
                .and_then(Value::as_str)
                .unwrap_or("auto");
            if !["low", "medium", "high", "auto"].contains(&eagerness) {
                return Err(
                    ApiError::invalid("`eagerness` is low, medium, high or auto").param(param),
                );
            }
            Ok(TurnDetection::SemanticVad {
                eagerness: eagerness.to_string(),
            })
        }
        _ => Err(ApiError::invalid(
            "`turn_detection` must be server_vad or semantic_vad: SpecVoice detects the end of \
             each turn itself",
        )
        .param(param)),
    }
}

/// Accepts the Realtime connection (after the access check) if its `model` is served.
pub(super) async fn upgrade(
    socket: WebSocketUpgrade,
    State(shared): State<Arc<Shared>>,
    Extension(client): Extension<Client>,
    uri: Uri,
) -> Response {
    let model = uri.query().and_then(|query| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix("model="))
            .map(str::to_string)
    });
    if let Some(model) = model {
        let realtime_name = model.starts_with("gpt-realtime")
            || model.starts_with("gpt-4o-realtime")
            || model.starts_with("gpt-4o-mini-realtime");
        let models = &shared.config.models;
        if !realtime_name {
            if let Err(error) = models.check(&model, &models.chat, &[]) {
                return error.into_response();
            }
        }
    }
    accept(
        socket,
        shared,
        &client,
        ("realtime", Endpoint::Realtime),
        |socket, shared| async move {
            let (sink, stream) = socket.split();
            let (out, outgoing) = mpsc::channel(256);
            let writer = tokio::spawn(write(sink, outgoing, shared.config.write_timeout));
            let mut connection = Connection {
                budget: message_budget(&shared.config),
                settings: Settings::new(&shared),
                shared,
                stream,
                out,
                next_event: 0,
            };
            let served = connection.run().await;
            let Connection { stream, out, .. } = connection;
            drop(out);
            let _ = writer.await;
            close_gently(stream).await;
            served
        },
    )
}

async fn write(
    mut sink: SplitSink<WebSocket, Message>,
    mut outgoing: mpsc::Receiver<Value>,
    deadline: Duration,
) {
    while let Some(event) = outgoing.recv().await {
        let message = Message::Text(event.to_string().into());
        if !send_within(&mut sink, message, deadline).await {
            return;
        }
    }
    let _ = sink.close().await;
}

/// What the client sent.
enum Incoming {
    Event(Value),
    Closed,
    Idle,
    /// The client sent more messages than its budget.
    Flooding,
}

struct Connection {
    shared: Arc<Shared>,
    stream: SplitStream<WebSocket>,
    budget: Budget,
    out: mpsc::Sender<Value>,
    settings: Settings,
    next_event: u64,
}

/// The session's thread, once audio has come.
struct Running {
    inputs: mpsc::Sender<Input>,
    outputs: mpsc::Receiver<Outgoing>,
    done: oneshot::Receiver<Result<Ended>>,
}

impl Connection {
    async fn send(&mut self, mut event: Value) {
        self.next_event += 1;
        event["event_id"] = json!(format!("event_{}", self.next_event));
        let _ = self.out.send(event).await;
    }

    async fn error(&mut self, error: &ApiError, client_event: Option<&Value>) {
        let mut body = error.body()["error"].clone();
        body["event_id"] = client_event
            .and_then(|e| e.get("event_id"))
            .cloned()
            .unwrap_or(Value::Null);
        self.send(json!({"type": "error", "error": body})).await;
    }

    async fn flooded(&mut self) {
        let rate = self.shared.config.messages_per_second;
        let error = ApiError::rate_limited(format!(
            "more than {rate} events a second: the connection closes"
        ));
        self.error(&error, None).await;
    }

    async fn receive(&mut self, idle: Option<Duration>) -> Incoming {
        loop {
            let next = match idle {
                Some(idle) => match tokio::time::timeout(idle, self.stream.next()).await {
                    Ok(next) => next,
                    Err(_) => return Incoming::Idle,
                },
                None => self.stream.next().await,
            };
            if next.is_some() && !self.budget.take() {
                return Incoming::Flooding;
            }
            match next {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Incoming::Closed,
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<Value>(&text) {
                    Ok(event) if event.get("type").is_some_and(Value::is_string) => {
                        return Incoming::Event(event)
                    }
                    _ => {
                        let error =
                            ApiError::invalid("expected a JSON object with a string `type`")
                                .code("invalid_json");
                        self.error(&error, None).await;
                    }
                },
                Some(Ok(Message::Binary(_))) => {
                    let error =
                        ApiError::invalid("audio comes as `input_audio_buffer.append` events")
                            .code("binary_not_supported");
                    self.error(&error, None).await;
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            }
        }
    }

    /// Serves the connection to its end; `false` if the session failed.
    async fn run(&mut self) -> bool {
        let Some((engine, backlog)) = self.queue().await else {
            return true;
        };
        let session = self.settings.json(&self.shared);
        self.send(json!({"type": "session.created", "session": session}))
            .await;
        let mut engine = Some(engine);
        let mut running: Option<Running> = None;
        let mut translator = Translator::default();
        for event in backlog {
            if !self.handle(event, &mut engine, &mut running).await {
                return self.finish(engine, running, &mut translator).await;
            }
        }
        let idle = self.shared.config.idle_timeout;
        let mut shutdown = self.shared.shutdown.clone();
        let mut draining = false;
        let writer_gone = self.out.clone();
        loop {
            let outputs = running.as_mut().map(|r| &mut r.outputs);
            tokio::select! {
                incoming = self.receive((!draining).then_some(idle)) => match incoming {
                    Incoming::Event(event) => {
                        if !self.handle(event, &mut engine, &mut running).await {
                            break;
                        }
                    }
                    Incoming::Closed => {
                        // The client is gone: the session sees its input end, and stops.
                        drop(running.take());
                        break;
                    }
                    Incoming::Idle => {
                        let seconds = idle.as_secs_f64();
                        let error = ApiError::invalid(format!("nothing arrived for {seconds} s"))
                            .code("idle_timeout");
                        self.error(&error, None).await;
                        break;
                    }
                    Incoming::Flooding => {
                        self.flooded().await;
                        drop(running.take());
                        break;
                    }
                },
                // The writer gave up on a client that does not read.
                _ = writer_gone.closed() => {
                    drop(running.take());
                    break;
                }
                Some(out) = next_output(outputs) => {
                    for event in translator.translate(out, self.settings.output_rate) {
                        self.send(event).await;
                    }
                }
                _ = shutting_down(&mut shutdown), if !draining => {
                    draining = true;
                    let error = ApiError::unavailable("the server is shutting down: the turn in progress completes");
                    self.error(&error, None).await;
                    match &running {
                        Some(run) => drop(run.inputs.send(Input::End).await),
                        None => break,
                    }
                }
            }
        }
        self.finish(engine, running, &mut translator).await
    }

    /// Waits for the end of the session (its events sent) or gives the engine back.
    async fn finish(
        &mut self,
        engine: Option<Engine>,
        running: Option<Running>,
        translator: &mut Translator,
    ) -> bool {
        if let Some(engine) = engine {
            self.shared.pool.release(engine);
        }
        let Some(mut run) = running else {
            return true;
        };
        drop(run.inputs);
        while let Some(out) = run.outputs.recv().await {
            for event in translator.translate(out, self.settings.output_rate) {
                self.send(event).await;
            }
        }
        match run.done.await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                self.error(&ApiError::server(e), None).await;
                false
            }
            Err(_) => false,
        }
    }

    /// Takes an engine, waiting in the queue if need be (keeping what the client sends
    /// meanwhile); `None` when refused or the connection ends first.
    async fn queue(&mut self) -> Option<(Engine, Vec<Value>)> {
        let mut waiter = match self.shared.pool.acquire() {
            Ok(Acquired::Now(engine)) => return Some((*engine, Vec::new())),
            Ok(Acquired::Queued(waiter)) => waiter,
            Err(refusal) => {
                self.error(&super::refused(refusal), None).await;
                return None;
            }
        };
        let mut backlog = Vec::new();
        loop {
            tokio::select! {
                waited = waiter.wait() => match waited {
                    Some(Ok(engine)) => return Some((engine, backlog)),
                    Some(Err(refusal)) => {
                        self.error(&super::refused(refusal), None).await;
                        return None;
                    }
                    None => {}
                },
                incoming = self.receive(None) => match incoming {
                    Incoming::Event(event) if backlog.len() < BACKLOG => backlog.push(event),
                    Incoming::Event(_) => {
                        let error = super::refused(Refusal::Full);
                        self.error(&error, None).await;
                        return None;
                    }
                    Incoming::Closed | Incoming::Idle => return None,
                    Incoming::Flooding => {
                        self.flooded().await;
                        return None;
                    }
                },
            }
        }
    }

    /// Acts on a client event; `false` when the connection should end.
    async fn handle(
        &mut self,
        event: Value,
        engine: &mut Option<Engine>,
        running: &mut Option<Running>,
    ) -> bool {
        let kind = event["type"].as_str().unwrap_or("").to_string();
        let outcome = match kind.as_str() {
            "session.update" => {
                let session = event.get("session").cloned().unwrap_or(Value::Null);
                let shared = Arc::clone(&self.shared);
                match self.settings.update(&session, &shared, running.is_some()) {
                    Ok(()) => {
                        let session = self.settings.json(&shared);
                        self.send(json!({"type": "session.updated", "session": session}))
                            .await;
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            "input_audio_buffer.append" => {
                let samples = event
                    .get("audio")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid("`audio` must be a base64 string").param("audio")
                    })
                    .and_then(|audio| decode_audio(audio, self.settings.input_rate));
                match samples {
                    Ok(samples) if samples.is_empty() => Ok(()),
                    Ok(samples) => match self.start(engine, running).await {
                        Ok(run) => {
                            // A session thread that is gone reports why through `done`.
                            drop(run.inputs.send(Input::Audio(samples)).await);
                            Ok(())
                        }
                        Err(e) => {
                            self.error(&e, Some(&event)).await;
                            return false;
                        }
                    },
                    Err(e) => Err(e),
                }
            }
            "input_audio_buffer.commit" => match running {
                Some(run) => {
                    drop(run.inputs.send(Input::EndUtterance).await);
                    Ok(())
                }
                None => Err(ApiError::invalid("the input audio buffer is empty")
                    .code("input_audio_buffer_commit_empty")),
            },
            "input_audio_buffer.clear" => {
                self.send(json!({"type": "input_audio_buffer.cleared"}))
                    .await;
                Ok(())
            }
            "response.create" => Ok(()),
            "response.cancel" => {
                if let Some(run) = running {
                    drop(run.inputs.send(Input::CancelAnswer).await);
                }
                Ok(())
            }
            other => Err(ApiError::invalid(format!(
                "the event type `{other}` is not served here (session.update, \
                 input_audio_buffer.append|commit|clear, response.create|cancel)"
            ))
            .code("unknown_event")),
        };
        if let Err(error) = outcome {
            self.error(&error, Some(&event)).await;
        }
        true
    }

    /// The running session, started on `engine` with the settings of now if it has not yet.
    async fn start<'r>(
        &mut self,
        engine: &mut Option<Engine>,
        running: &'r mut Option<Running>,
    ) -> Result<&'r mut Running, ApiError> {
        if running.is_none() {
            let engine = engine
                .take()
                .ok_or_else(|| ApiError::server("the session has ended"))?;
            let config = Arc::clone(&self.shared.config);
            let mut predgen = config.predgen.clone();
            if let Some(instructions) = &self.settings.instructions {
                predgen.system_prompt = instructions.clone();
            }
            let (inputs, received) = mpsc::channel(INCOMING_FRAMES);
            let (outputs, outgoing) = mpsc::channel(256);
            let context = SessionContext {
                mode: SessionMode::Chat,
                listener: self.settings.listener(&config.listener),
                predgen,
                config,
                voices: self.shared.voices.clone(),
                voice: Some(self.settings.voice.clone()),
                pool: Arc::clone(&self.shared.pool),
                inputs: received,
                outputs,
                metrics: Arc::clone(&self.shared.metrics),
            };
            let done = session::spawn(engine, context)
                .await
                .map_err(|e| ApiError::server(format!("cannot start the session: {e}")))?;
            *running = Some(Running {
                inputs,
                outputs: outgoing,
                done,
            });
        }
        running
            .as_mut()
            .ok_or_else(|| ApiError::server("the session did not start"))
    }
}

async fn next_output(outputs: Option<&mut mpsc::Receiver<Outgoing>>) -> Option<Outgoing> {
    match outputs {
        Some(outputs) => outputs.recv().await,
        None => std::future::pending().await,
    }
}

/// Base64 16-bit little-endian PCM at `rate`, as the listener's 16 kHz samples.
fn decode_audio(audio: &str, rate: u32) -> Result<Vec<f32>, ApiError> {
    let bytes = BASE64.decode(audio).map_err(|e| {
        ApiError::invalid(format!("`audio` is not base64: {e}")).code("invalid_base64")
    })?;
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let samples = decode_frame(&bytes, usize::MAX)
        .map_err(|e| ApiError::invalid(e.message).param("audio"))?;
    match rate {
        16_000 => Ok(samples),
        _ => engine_asr::resample(&samples, rate, 16_000).map_err(ApiError::server),
    }
}

/// An answer being sent as a Realtime response.
struct OpenResponse {
    id: String,
    item_id: String,
    transcript: String,
}

/// Turns the session's messages into Realtime events.
#[derive(Default)]
struct Translator {
    /// The user's item of the utterance in progress or last heard.
    user_item: Option<String>,
    /// The last item added to the conversation.
    previous_item: Option<String>,
    /// The input transcript sent as deltas so far.
    heard: String,
    response: Option<OpenResponse>,
    /// The rate of the audio that follows an `audio` message.
    audio_rate: u32,
}

impl Translator {
    fn user_item(&mut self) -> String {
        self.user_item
            .get_or_insert_with(|| object_id("item_"))
            .clone()
    }

    /// The events of a session's message; audio goes out at `output_rate`.
    fn translate(&mut self, out: Outgoing, output_rate: u32) -> Vec<Value> {
        let message = match out {
            Outgoing::Binary(bytes) => return self.audio(&bytes, output_rate),
            Outgoing::Message(message) => message,
        };
        match message {
            ServerMessage::SpeechStarted { started_at_ms, .. } => {
                let mut events = self.close_response("cancelled", "turn_detected");
                self.user_item = Some(object_id("item_"));
                self.heard.clear();
                events.push(json!({
                    "type": "input_audio_buffer.speech_started",
                    "audio_start_ms": started_at_ms,
                    "item_id": self.user_item(),
                }));
                events
            }
            ServerMessage::Partial { text, .. } => {
                let Some(delta) = text.strip_prefix(self.heard.as_str()).map(str::to_string) else {
                    return Vec::new();
                };
                self.heard = text;
                if delta.is_empty() {
                    return Vec::new();
                }
                vec![json!({
                    "type": "conversation.item.input_audio_transcription.delta",
                    "item_id": self.user_item(),
                    "content_index": 0,
                    "delta": delta,
                })]
            }
            ServerMessage::SpeechEnded { speech_end_ms, .. } => {
                let item_id = self.user_item();
                let previous = self.previous_item.replace(item_id.clone());
                vec![
                    json!({
                        "type": "input_audio_buffer.speech_stopped",
                        "audio_end_ms": speech_end_ms,
                        "item_id": item_id,
                    }),
                    json!({
                        "type": "input_audio_buffer.committed",
                        "previous_item_id": previous,
                        "item_id": item_id,
                    }),
                    json!({
                        "type": "conversation.item.added",
                        "previous_item_id": previous,
                        "item": user_message(&item_id, None),
                    }),
                ]
            }
            ServerMessage::Transcript { text, .. } => self.transcribed(text),
            ServerMessage::NoWords { .. } => self.transcribed(String::new()),
            ServerMessage::SpeechResumed { .. } => {
                self.heard.clear();
                self.close_response("cancelled", "turn_detected")
            }
            ServerMessage::BargeIn { .. } => self.close_response("cancelled", "turn_detected"),
            ServerMessage::AnswerCancelled { .. } => {
                self.close_response("cancelled", "client_cancelled")
            }
            ServerMessage::FirstSentence { text, .. } | ServerMessage::Sentence { text, .. } => {
                let mut events = self.open_response();
                let response = self.response.as_mut().expect("opened above");
                let delta = match response.transcript.is_empty() {
                    true => text,
                    false => format!(" {text}"),
                };
                response.transcript.push_str(&delta);
                events.push(json!({
                    "type": "response.output_audio_transcript.delta",
                    "response_id": response.id,
                    "item_id": response.item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": delta,
                }));
                events
            }
            ServerMessage::Audio { sample_rate, .. } => {
                self.audio_rate = sample_rate;
                self.open_response()
            }
            ServerMessage::TurnDone { .. } => self.close_response("completed", ""),
            ServerMessage::Error { code, message } => {
                let code = serde_json::to_value(code).unwrap_or(Value::Null);
                vec![json!({
                    "type": "error",
                    "error": {"type": "server_error", "code": code, "message": message, "param": null},
                })]
            }
            _ => Vec::new(),
        }
    }

    fn transcribed(&mut self, transcript: String) -> Vec<Value> {
        let item_id = self.user_item();
        self.user_item = None;
        vec![
            json!({
                "type": "conversation.item.input_audio_transcription.completed",
                "item_id": item_id,
                "content_index": 0,
                "transcript": transcript,
            }),
            json!({
                "type": "conversation.item.done",
                "previous_item_id": null,
                "item": user_message(&item_id, Some(&transcript)),
            }),
        ]
    }

    fn audio(&mut self, bytes: &[u8], output_rate: u32) -> Vec<Value> {
        let Some(response) = &self.response else {
            return Vec::new();
        };
        let Ok(samples) = decode_frame(bytes, usize::MAX) else {
            return Vec::new();
        };
        let samples = match self.audio_rate == output_rate {
            true => samples,
            false => match engine_asr::resample(&samples, self.audio_rate, output_rate) {
                Ok(samples) => samples,
                Err(_) => return Vec::new(),
            },
        };
        let pcm = encode_pcm(&samples);
        vec![json!({
            "type": "response.output_audio.delta",
            "response_id": response.id,
            "item_id": response.item_id,
            "output_index": 0,
            "content_index": 0,
            "delta": BASE64.encode(pcm),
        })]
    }

    fn open_response(&mut self) -> Vec<Value> {
        if self.response.is_some() {
            return Vec::new();
        }
        let response = OpenResponse {
            id: object_id("resp_"),
            item_id: object_id("item_"),
            transcript: String::new(),
        };
        let events = vec![
            json!({
                "type": "response.created",
                "response": {
                    "id": response.id,
                    "object": "realtime.response",
                    "status": "in_progress",
                    "output": [],
                },
            }),
            json!({
                "type": "response.output_item.added",
                "response_id": response.id,
                "output_index": 0,
                "item": assistant_message(&response.item_id, "in_progress", ""),
            }),
            json!({
                "type": "response.content_part.added",
                "response_id": response.id,
                "item_id": response.item_id,
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_audio", "transcript": ""},
            }),
        ];
        self.response = Some(response);
        events
    }

    /// Ends the open response, if any: `completed`, or `cancelled` for `reason`.
    fn close_response(&mut self, status: &str, reason: &str) -> Vec<Value> {
        let Some(response) = self.response.take() else {
            return Vec::new();
        };
        let (id, item_id, transcript) = (&response.id, &response.item_id, &response.transcript);
        let item_status = if status == "completed" {
            "completed"
        } else {
            "incomplete"
        };
        let item = assistant_message(item_id, item_status, transcript);
        let mut events = Vec::new();
        if status == "completed" {
            let at = json!({"response_id": id, "item_id": item_id, "output_index": 0, "content_index": 0});
            let with = |kind: &str, extra: Value| {
                let mut event = at.clone();
                event["type"] = json!(kind);
                if let (Some(event), Some(extra)) = (event.as_object_mut(), extra.as_object()) {
                    event.extend(extra.clone());
                }
                event
            };
            events.push(with("response.output_audio.done", json!({})));
            events.push(with(
                "response.output_audio_transcript.done",
                json!({"transcript": transcript}),
            ));
            events.push(with(
                "response.content_part.done",
                json!({"part": {"type": "output_audio", "transcript": transcript}}),
            ));
            events.push(json!({
                "type": "response.output_item.done",
                "response_id": id,
                "output_index": 0,
                "item": item,
            }));
        }
        let details = match status {
            "cancelled" => json!({"type": "cancelled", "reason": reason}),
            _ => Value::Null,
        };
        events.push(json!({
            "type": "response.done",
            "response": {
                "id": id,
                "object": "realtime.response",
                "status": status,
                "status_details": details,
                "output": [item],
            },
        }));
        self.previous_item = Some(item_id.clone());
        events
    }
}

fn user_message(id: &str, transcript: Option<&str>) -> Value {
    json!({
        "id": id,
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_audio", "transcript": transcript}],
    })
}

fn assistant_message(id: &str, status: &str, transcript: &str) -> Value {
    json!({
        "id": id,
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_audio", "transcript": transcript}],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::protocol::Breakdown;

    fn message(message: ServerMessage) -> Outgoing {
        Outgoing::Message(message)
    }

    fn types(events: &[Value]) -> Vec<&str> {
        events.iter().filter_map(|e| e["type"].as_str()).collect()
    }

    fn turn_done() -> ServerMessage {
        ServerMessage::TurnDone {
            question: "Hello there?".into(),
            answer: "Hi.".into(),
            speech_end_ms: 900,
            first_audio_at_ms: 1300,
            latency_ms: 400,
            breakdown: Breakdown {
                endpointing_ms: 150,
                asr_ms: 50,
                llm_ms: 100,
                tts_ms: 100,
            },
            prepared_audio_used: false,
        }
    }

    #[test]
    fn a_turn_becomes_the_realtime_events_in_order_with_audio_at_the_output_rate() {
        let mut translator = Translator::default();
        let mut events = Vec::new();
        let samples = vec![0.25f32; 2_205];
        for out in [
            message(ServerMessage::SpeechStarted {
                at_ms: 100,
                started_at_ms: 80,
            }),
            message(ServerMessage::Partial {
                at_ms: 500,
                text: "Hel".into(),
            }),
            message(ServerMessage::Partial {
                at_ms: 700,
                text: "Hello".into(),
            }),
            // A partial that rewrites what was heard sends no delta.
            message(ServerMessage::Partial {
                at_ms: 800,
                text: "Yellow".into(),
            }),
            message(ServerMessage::SpeechEnded {
                at_ms: 1000,
                speech_end_ms: 900,
            }),
            message(ServerMessage::Transcript {
                at_ms: 1050,
                text: "Hello there?".into(),
            }),
            message(ServerMessage::FirstSentence {
                at_ms: 1200,
                text: "Hi.".into(),
            }),
            message(ServerMessage::Audio {
                sentence: "Hi.".into(),
                sample_rate: 22_050,
                samples: samples.len(),
            }),
            Outgoing::Binary(encode_pcm(&samples)),
            message(turn_done()),
        ] {
            events.extend(translator.translate(out, 24_000));
        }
        assert_eq!(
            types(&events),
            [
                "input_audio_buffer.speech_started",
                "conversation.item.input_audio_transcription.delta",
                "conversation.item.input_audio_transcription.delta",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "conversation.item.added",
                "conversation.item.input_audio_transcription.completed",
                "conversation.item.done",
                "response.created",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_audio_transcript.delta",
                "response.output_audio.delta",
                "response.output_audio.done",
                "response.output_audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.done",
            ]
        );
        let deltas: Vec<&str> = events[1..3]
            .iter()
            .filter_map(|e| e["delta"].as_str())
            .collect();
        assert_eq!(deltas, ["Hel", "lo"]);
        let user_item = &events[0]["item_id"];
        assert!(events[..8]
            .iter()
            .all(|e| e.get("item_id").is_none_or(|i| i == user_item)));
        // 0.1 s at 22.05 kHz, resampled to 24 kHz.
        let audio = BASE64
            .decode(events[12]["delta"].as_str().unwrap())
            .unwrap();
        assert_eq!(audio.len() / 2, 2_400);
        let done = events.last().unwrap();
        assert_eq!(done["response"]["status"], "completed");
        assert_eq!(
            done["response"]["output"][0]["content"][0]["transcript"],
            "Hi."
        );
    }

    #[test]
    fn a_barge_in_or_a_cancel_ends_the_response_as_cancelled() {
        for (stop, reason) in [
            (ServerMessage::BargeIn { at_ms: 10 }, "turn_detected"),
            (
                ServerMessage::AnswerCancelled { at_ms: 10 },
                "client_cancelled",
            ),
        ] {
            let mut translator = Translator::default();
            translator.translate(
                message(ServerMessage::FirstSentence {
                    at_ms: 1,
                    text: "Sure.".into(),
                }),
                24_000,
            );
            let events = translator.translate(message(stop), 24_000);
            assert_eq!(types(&events), ["response.done"]);
            assert_eq!(events[0]["response"]["status"], "cancelled");
            assert_eq!(events[0]["response"]["status_details"]["reason"], reason);
            // Audio after the end has no response to go to.
            let late = translator.translate(Outgoing::Binary(encode_pcm(&[0.1; 10])), 24_000);
            assert!(late.is_empty());
        }
    }

    #[test]
    fn pcm_formats_and_base64_audio_are_checked() {
        let format = json!({"type": "audio/pcm", "rate": 16000});
        assert_eq!(pcm_rate(&format, "f").unwrap(), 16_000);
        assert!(pcm_rate(&json!({"type": "audio/pcmu"}), "f").is_err());
        assert!(pcm_rate(&json!({"type": "audio/pcm", "rate": 44100}), "f").is_err());
        assert!(decode_audio("not base64!", 24_000).is_err());
        assert!(decode_audio(&BASE64.encode([1u8, 2, 3]), 24_000).is_err());
        let half_second = BASE64.encode(encode_pcm(&[0.1; 12_000]));
        assert_eq!(decode_audio(&half_second, 24_000).unwrap().len(), 8_000);
    }
}
