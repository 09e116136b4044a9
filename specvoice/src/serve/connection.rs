//! One WebSocket connection: the `start` message, the queue, then the session's audio in and
//! events out. Whatever a client sends, the answer is at worst an `error` message: a message
//! the client can recover from (bad JSON, an unknown type, a bad frame) is refused and the
//! connection goes on; the connection closes only when the session cannot go on (the server
//! is busy or shutting down, the pipeline failed) or the client abuses it: no `start` within
//! the handshake deadline, more messages than its budget, or not reading what it is sent.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch};

use super::access::Budget;
use super::pool::{Acquired, Refusal};
use super::protocol::{
    decode_frame, parse_client, ClientMessage, ErrorCode, Outgoing, ProtocolError, ServerMessage,
    SessionMode,
};
use super::session::{self, Input, SessionContext};
use super::{Engine, Shared};
use crate::drive::Ended;
use crate::endpoint::SAMPLE_RATE;
use crate::{Error, Result};

/// Messages waiting for the socket, per connection.
const OUTGOING_MESSAGES: usize = 256;

/// Audio frames waiting for the session's thread, per connection.
const INCOMING_FRAMES: usize = 64;

/// WebSocket close code of a normal closure.
const CLOSE_NORMAL: u16 = 1000;

/// What the client sent, read.
enum Incoming {
    Client(Result<ClientMessage, ProtocolError>),
    Audio(axum::body::Bytes),
    /// The client closed the connection, or it broke.
    Closed,
    /// Nothing arrived for the idle timeout.
    Idle,
    /// The client sent more messages than its budget.
    Flooding,
}

/// Seconds of a WebSocket client's message rate it may send at once.
const MESSAGE_BURST_SECONDS: u32 = 5;

/// A WebSocket client's message budget under `config`.
pub(crate) fn message_budget(config: &super::ServeConfig) -> Budget {
    let rate = f64::from(config.messages_per_second);
    Budget::new(rate, rate * f64::from(MESSAGE_BURST_SECONDS))
}

/// The next message of the client, waiting at most `idle` (ping and pong are the transport's,
/// but spend the budget as any message does).
async fn receive(
    stream: &mut SplitStream<WebSocket>,
    idle: Option<Duration>,
    budget: &mut Budget,
) -> Incoming {
    loop {
        let next = match idle {
            Some(idle) => match tokio::time::timeout(idle, stream.next()).await {
                Ok(next) => next,
                Err(_) => return Incoming::Idle,
            },
            None => stream.next().await,
        };
        if next.is_some() && !budget.take() {
            return Incoming::Flooding;
        }
        match next {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Incoming::Closed,
            Some(Ok(Message::Text(text))) => return Incoming::Client(parse_client(&text)),
            Some(Ok(Message::Binary(bytes))) => return Incoming::Audio(bytes),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
        }
    }
}

/// Waits until the server shuts down.
pub(crate) async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|down| *down).await.is_err() {
        // The server is gone without a shutdown: it never comes.
        std::future::pending::<()>().await;
    }
}

/// Sends what the session says until every sender is gone, then closes the connection; gives
/// up (dropping what is left) when the client has not taken a message within `deadline`.
async fn write(
    mut sink: SplitSink<WebSocket, Message>,
    mut outgoing: mpsc::Receiver<Outgoing>,
    deadline: Duration,
) {
    while let Some(out) = outgoing.recv().await {
        let message = match out {
            Outgoing::Message(message) => match serde_json::to_string(&message) {
                Ok(text) => Message::Text(text.into()),
                Err(e) => {
                    tracing::error!("cannot write {message:?} as JSON: {e}");
                    continue;
                }
            },
            Outgoing::Binary(bytes) => Message::Binary(bytes.into()),
        };
        if !send_within(&mut sink, message, deadline).await {
            return;
        }
    }
    let close = CloseFrame {
        code: CLOSE_NORMAL,
        reason: Utf8Bytes::from_static(""),
    };
    let _ = sink.send(Message::Close(Some(close))).await;
    let _ = sink.close().await;
}

/// Sends `message` unless the client is gone or has not taken it within `deadline` (a client
/// that stops reading); `false` then, and the caller drops the connection.
pub(crate) async fn send_within(
    sink: &mut SplitSink<WebSocket, Message>,
    message: Message,
    deadline: Duration,
) -> bool {
    match tokio::time::timeout(deadline, sink.send(message)).await {
        Ok(sent) => sent.is_ok(),
        Err(_) => {
            tracing::info!(
                "a client read nothing for {} s: dropped",
                deadline.as_secs_f64()
            );
            false
        }
    }
}

/// Serves one WebSocket connection to its end.
pub(crate) async fn serve(socket: WebSocket, shared: Arc<Shared>) {
    let (sink, stream) = socket.split();
    let (out, outgoing) = mpsc::channel(OUTGOING_MESSAGES);
    let writer = tokio::spawn(write(sink, outgoing, shared.config.write_timeout));
    let mut connection = Connection {
        stream,
        budget: message_budget(&shared.config),
        out,
        shutdown: shared.shutdown.clone(),
        shared: Arc::clone(&shared),
    };
    connection.run().await;
    let Connection { stream, out, .. } = connection;
    drop(out);
    let _ = writer.await;
    close_gently(stream).await;
}

/// How long a closed connection still reads what its client sends.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Reads (and drops) what the client still sends until it answers the close, for at most
/// [`CLOSE_GRACE`]: a socket closed with unread data is reset, and the client would lose the
/// last messages on their way to it (the error that says why, say).
pub(crate) async fn close_gently(stream: SplitStream<WebSocket>) {
    let _ = tokio::time::timeout(CLOSE_GRACE, stream.for_each(|_| async {})).await;
}

struct Connection {
    stream: SplitStream<WebSocket>,
    budget: Budget,
    out: mpsc::Sender<Outgoing>,
    shutdown: watch::Receiver<bool>,
    shared: Arc<Shared>,
}

impl Connection {
    async fn send(&self, message: ServerMessage) {
        // The writer only stops when the client is gone; the reader will see that next.
        let _ = self.out.send(message.into()).await;
    }

    async fn error(&self, code: ErrorCode, message: impl Into<String>) {
        self.send(ServerMessage::error(code, message)).await;
    }

    async fn flooded(&self) {
        let rate = self.shared.config.messages_per_second;
        self.error(
            ErrorCode::RateLimited,
            format!("more than {rate} messages a second: the connection closes"),
        )
        .await;
    }

    async fn run(&mut self) {
        if *self.shutdown.borrow() {
            self.error(ErrorCode::ShuttingDown, "the server is shutting down")
                .await;
            return;
        }
        let Some((mode, voice)) = self.await_start().await else {
            return;
        };
        let Some(engine) = self.queue().await else {
            return;
        };
        self.session(mode, voice, engine).await;
    }

    /// Waits for a `start` (naming a voice the server offers, if any); `None` when the
    /// connection ends first.
    async fn await_start(&mut self) -> Option<(SessionMode, Option<String>)> {
        let deadline = tokio::time::Instant::now() + self.shared.config.handshake_timeout;
        loop {
            let idle = deadline.saturating_duration_since(tokio::time::Instant::now());
            let incoming = tokio::select! {
                incoming = receive(&mut self.stream, Some(idle), &mut self.budget) => incoming,
                _ = shutting_down(&mut self.shutdown) => {
                    self.error(ErrorCode::ShuttingDown, "the server is shutting down").await;
                    return None;
                }
                _ = self.out.closed() => return None,
            };
            match incoming {
                Incoming::Client(Ok(ClientMessage::Start {
                    voice: Some(voice), ..
                })) if !self.shared.voices.offers(&voice) => {
                    let offered = self.shared.voices.names().join(", ");
                    self.error(
                        ErrorCode::UnknownVoice,
                        format!("no voice `{voice}` here (the voices: {offered})"),
                    )
                    .await;
                }
                Incoming::Client(Ok(ClientMessage::Start { mode, voice })) => {
                    return Some((mode, voice))
                }
                Incoming::Client(Ok(ClientMessage::Stop | ClientMessage::Cancel)) => {
                    self.error(ErrorCode::NotStarted, "`stop` or `cancel` before `start`")
                        .await;
                }
                Incoming::Client(Err(e)) => self.send(e.into()).await,
                Incoming::Audio(_) => {
                    self.error(ErrorCode::NotStarted, "audio before `start`")
                        .await;
                }
                Incoming::Closed => return None,
                Incoming::Flooding => {
                    self.flooded().await;
                    return None;
                }
                Incoming::Idle => {
                    let seconds = self.shared.config.handshake_timeout.as_secs_f64();
                    self.error(ErrorCode::Timeout, format!("no `start` within {seconds} s"))
                        .await;
                    return None;
                }
            }
        }
    }

    /// Takes an engine, waiting in the queue if need be (reporting the position as it
    /// moves); `None` when refused or the connection ends first.
    async fn queue(&mut self) -> Option<Engine> {
        let mut waiter = match self.shared.pool.acquire() {
            Ok(Acquired::Now(engine)) => return Some(*engine),
            Ok(Acquired::Queued(waiter)) => waiter,
            Err(refusal) => {
                self.refused(refusal).await;
                return None;
            }
        };
        let mut shown = 0;
        loop {
            let position = waiter.position();
            if position != shown && position > 0 {
                self.send(ServerMessage::Queued { position }).await;
                shown = position;
            }
            tokio::select! {
                waited = waiter.wait() => match waited {
                    Some(Ok(engine)) => return Some(engine),
                    Some(Err(refusal)) => {
                        self.refused(refusal).await;
                        return None;
                    }
                    None => {}
                },
                incoming = receive(&mut self.stream, None, &mut self.budget) => match incoming {
                    Incoming::Client(Ok(ClientMessage::Stop)) => {
                        self.send(ServerMessage::Done).await;
                        return None;
                    }
                    Incoming::Client(Ok(ClientMessage::Start { .. })) => {
                        self.error(ErrorCode::AlreadyStarted, "the session has started").await;
                    }
                    // No answer is being made yet.
                    Incoming::Client(Ok(ClientMessage::Cancel)) => {}
                    Incoming::Client(Err(e)) => self.send(e.into()).await,
                    Incoming::Audio(_) => {
                        self.error(ErrorCode::NotReady, "audio before `ready`: the session is queued")
                            .await;
                    }
                    Incoming::Closed | Incoming::Idle => return None,
                    Incoming::Flooding => {
                        self.flooded().await;
                        return None;
                    }
                },
                _ = shutting_down(&mut self.shutdown) => {
                    self.error(ErrorCode::ShuttingDown, "the server is shutting down").await;
                    return None;
                }
                _ = self.out.closed() => return None,
            }
        }
    }

    async fn refused(&self, refusal: Refusal) {
        let config = &self.shared.config;
        let message = match refusal {
            Refusal::Full => format!(
                "the server is busy: {} engine(s) in use and {} session(s) waiting",
                config.engines, config.queue
            ),
            Refusal::NoEngines => "the server has no engine left".to_string(),
        };
        self.error(ErrorCode::Busy, message).await;
    }

    /// Runs the session on `engine`: audio to its thread, until the thread is done.
    async fn session(&mut self, mode: SessionMode, voice: Option<String>, engine: Engine) {
        let config = Arc::clone(&self.shared.config);
        let voices = &self.shared.voices;
        let voice = match mode {
            SessionMode::Chat => Some(voice.unwrap_or_else(|| voices.default_name().to_string())),
            SessionMode::Caption { .. } => None,
        };
        self.send(ServerMessage::Ready {
            mode: mode.clone(),
            voice: voice.clone(),
            sample_rate: SAMPLE_RATE,
            max_frame_samples: config.max_frame_samples,
        })
        .await;
        let (inputs, received) = mpsc::channel(INCOMING_FRAMES);
        let context = SessionContext {
            mode,
            config: Arc::clone(&config),
            listener: config.listener.clone(),
            predgen: config.predgen.clone(),
            voices: self.shared.voices.clone(),
            voice,
            pool: Arc::clone(&self.shared.pool),
            inputs: received,
            outputs: self.out.clone(),
            metrics: Arc::clone(&self.shared.metrics),
        };
        let mut done = match session::spawn(engine, context).await {
            Ok(done) => done,
            Err(e) => {
                self.error(
                    ErrorCode::SessionFailed,
                    format!("cannot start the session: {e}"),
                )
                .await;
                return;
            }
        };
        let mut ended = false;
        let mut notified = false;
        let outcome = loop {
            let idle = (!ended).then_some(config.idle_timeout);
            tokio::select! {
                outcome = &mut done => break Some(outcome),
                incoming = receive(&mut self.stream, idle, &mut self.budget) => match incoming {
                    Incoming::Audio(_) if ended => {
                        self.error(ErrorCode::StreamEnded, "audio after `stop`").await;
                    }
                    Incoming::Audio(bytes) => match decode_frame(&bytes, config.max_frame_samples) {
                        // A session thread that is gone reports why through `done`.
                        Ok(samples) => drop(inputs.send(Input::Audio(samples)).await),
                        Err(e) => self.send(e.into()).await,
                    },
                    Incoming::Client(Ok(ClientMessage::Stop)) => {
                        if !ended {
                            ended = true;
                            drop(inputs.send(Input::End).await);
                        }
                    }
                    Incoming::Client(Ok(ClientMessage::Cancel)) => {
                        drop(inputs.send(Input::CancelAnswer).await);
                    }
                    Incoming::Client(Ok(ClientMessage::Start { .. })) => {
                        self.error(ErrorCode::AlreadyStarted, "the session has started").await;
                    }
                    Incoming::Client(Err(e)) => self.send(e.into()).await,
                    Incoming::Idle => {
                        let seconds = config.idle_timeout.as_secs_f64();
                        self.error(ErrorCode::Timeout, format!("no audio for {seconds} s: the stream ends"))
                            .await;
                        ended = true;
                        drop(inputs.send(Input::End).await);
                    }
                    Incoming::Closed => break None,
                    Incoming::Flooding => {
                        self.flooded().await;
                        break None;
                    }
                },
                // The writer gave up on a client that does not read.
                _ = self.out.closed() => break None,
                _ = shutting_down(&mut self.shutdown), if !notified => {
                    notified = true;
                    self.send(ServerMessage::ShuttingDown).await;
                    if !ended {
                        ended = true;
                        drop(inputs.send(Input::End).await);
                    }
                }
            }
        };
        let outcome = match outcome {
            Some(outcome) => outcome,
            None => {
                // The client is gone: the session thread sees its input end, and stops.
                drop(inputs);
                done.await
            }
        };
        let outcome =
            outcome.unwrap_or_else(|_| Err(Error::Serve("the session thread is gone".into())));
        self.finish(outcome).await;
    }

    async fn finish(&self, outcome: Result<Ended>) {
        match outcome {
            Ok(Ended::Finished) => self.send(ServerMessage::Done).await,
            Ok(Ended::Disconnected) => {}
            Err(e) => {
                tracing::warn!("session failed: {e}");
                self.error(ErrorCode::SessionFailed, e.to_string()).await;
            }
        }
    }
}
