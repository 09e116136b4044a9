//! The voice server (`specvoice serve`): voice chat and live captions over WebSockets.
//!
//! A client connects to `/ws`, sends `{"type":"start","mode":"chat"}` (or `"caption"` with a
//! target language), then 16 kHz mono PCM as binary frames of 16-bit little-endian samples,
//! and `{"type":"stop"}` when its audio ends; the server sends back JSON events (speech
//! started, partial and final transcripts, the answer's sentences, captions, each turn's
//! latency) and the answer's audio. `PROTOCOL.md` in this crate is the protocol for client
//! authors; [`protocol`] has its messages as types. `/` serves a page that is such a client
//! in a browser: the microphone through an AudioWorklet, downsampled to 16 kHz, the events
//! shown and the answer's audio played, in a voice picked from `/voices` ([`Voices`]: a chat
//! session may name one in its `start`).
//!
//! The models are loaded once, into a pool of [`Engine`]s (Whisper and the language model;
//! they hold KV caches, so each serves one session at a time). A session takes a free engine
//! or waits in a bounded queue (told its position as it moves); beyond the bound it is
//! refused. It then runs on a thread of its own ([`VoiceChat`](crate::VoiceChat) or
//! [`LiveCaptions`](crate::LiveCaptions) on the wall clock) and gives the engine back when it
//! ends; an engine lost to a panic is rebuilt. [`Server::shutdown`] stops accepting
//! connections, tells every client, lets the turns in progress complete and waits for every
//! session to end.

mod access;
mod connection;
mod listen;
mod metrics;
mod openai;
mod pool;
pub mod protocol;
mod session;
mod voices;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use engine_asr::{LoadOptions as AsrLoadOptions, Transcriber};
use engine_llm::{LanguageModel, LoadOptions, PredGen, PredGenConfig, Speculation};
use spec_voice::SentenceSynthesizer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::chat::ChatMode;
use crate::listener::{Listener, ListenerConfig};
use crate::{Error, Result};

use access::{Access, Client};
use metrics::{Endpoint, Metrics};
pub use openai::ServedModels;
use pool::Pool;
pub use voices::{VoiceLoader, Voices, KEPT_VOICES};

/// Most bytes of one WebSocket message the transport reads; longer messages close the
/// connection (the protocol's own bound, [`ServeConfig::max_frame_samples`], is far lower and
/// answered with an error message).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// The models one session runs on.
pub struct Engine {
    pub whisper: Transcriber,
    pub model: LanguageModel,
}

/// Loads an engine: at start, once per engine, and again if a session loses one.
pub type EngineFactory = Arc<dyn Fn() -> Result<Engine> + Send + Sync>;

/// Makes a speech synthesizer for each chat session.
pub type SynthesizerFactory = Arc<dyn Fn() -> Result<Box<dyn SentenceSynthesizer>> + Send + Sync>;

/// An [`EngineFactory`] from a loader of each model.
pub fn engines_from<W, M>(whisper: W, model: M) -> EngineFactory
where
    W: Fn() -> engine_asr::Result<Transcriber> + Send + Sync + 'static,
    M: Fn() -> engine_llm::Result<LanguageModel> + Send + Sync + 'static,
{
    Arc::new(move || {
        Ok(Engine {
            whisper: whisper()?,
            model: model()?,
        })
    })
}

/// An [`EngineFactory`] loading Whisper from the model folder `whisper` and the chat model
/// `model` (a name in the models folder or a path, as [`LanguageModel::open`] takes).
pub fn load_engines_from(whisper: PathBuf, model: String) -> EngineFactory {
    engines_from(
        move || Transcriber::load(&whisper, &AsrLoadOptions::default()),
        move || LanguageModel::open(&model, &LoadOptions::default()),
    )
}

/// A [`SynthesizerFactory`] giving each session a copy of `synthesizer`.
pub fn copies_of<S>(synthesizer: S) -> SynthesizerFactory
where
    S: SentenceSynthesizer + Clone + Send + Sync + 'static,
{
    Arc::new(move || Ok(Box::new(synthesizer.clone())))
}

/// Settings of a [`Server`].
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Engines, each serving one session at a time. Default 1.
    pub engines: usize,
    /// Sessions that may wait for an engine; more are refused. Default 8.
    pub queue: usize,
    /// Hearing: the endpoint detector, streaming Whisper and the end of a chat turn (the
    /// semantic one by default: [`ListenerConfig::conversation`]); captions end an utterance
    /// after the detector's silence.
    pub listener: ListenerConfig,
    /// How chat sessions answer.
    pub predgen: PredGenConfig,
    /// PredGen, or the plain cascade.
    pub chat_mode: ChatMode,
    /// Most tokens of a caption.
    pub caption_max_tokens: usize,
    /// Most samples in one audio frame. Default 16 000 (1 s).
    pub max_frame_samples: usize,
    /// How long the server waits for audio during a session before it gives up on the client.
    /// Default 30 s.
    pub idle_timeout: Duration,
    /// How long a client may take to send a request's head (and, on SpecVoice's WebSocket, its
    /// `start`) before the server closes the connection: slow clients (slow-loris) hold
    /// nothing for longer. Default 10 s.
    pub handshake_timeout: Duration,
    /// How long a request's body may take to arrive (408 after). Default 60 s.
    pub body_timeout: Duration,
    /// How long one message to a client may wait for the client to read it before the
    /// server drops the connection (a client that stops reading holds no engine). Default 20 s.
    pub write_timeout: Duration,
    /// Connections one address may have open at once; more are refused (429) before any
    /// request is read. Behind a reverse proxy every client has the proxy's address: raise it
    /// there. Default 64.
    pub connections_per_address: usize,
    /// API keys; when there are any, every endpoint but the page and `/health` needs one
    /// (`Authorization: Bearer KEY`, or from a browser the WebSocket subprotocol
    /// `openai-insecure-api-key.KEY`) and answers 401 without. Default none.
    pub api_keys: Vec<String>,
    /// Origins (`https://host:port`) whose pages may use the server besides its own; a request
    /// from any other page gets 403. Default none.
    pub allowed_origins: Vec<String>,
    /// Sessions and requests one key (or, without keys, one address) may hold at once;
    /// more get 429. Default 4.
    pub sessions_per_client: usize,
    /// Requests (WebSocket connections included) one key, or one address without keys, may
    /// make a minute, in bursts of up to a tenth of it; more get 429. Default 600.
    pub requests_per_minute: u32,
    /// Messages a second a WebSocket client may send on average (bursts of up to five
    /// seconds' worth); a client sending more is told `rate_limited` and disconnected.
    /// Default 200 (audio in 20 ms frames is 50).
    pub messages_per_second: u32,
    /// Most bytes of a request body (an upload). Default 25 MiB, OpenAI's bound.
    pub max_body_bytes: usize,
    /// Longest recording a transcription takes. Default 10 minutes.
    pub max_audio: Duration,
    /// The names of the served models in the OpenAI-compatible API.
    pub models: ServedModels,
    /// Most tokens of a chat completion that names no `max_tokens`. Default 512.
    pub default_max_tokens: usize,
    /// How greedy chat completions decode: prompt-lookup speculation by default (the greedy
    /// tokens, drafts cost no forward).
    pub chat_speculation: Speculation,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            engines: 1,
            queue: 8,
            listener: ListenerConfig::conversation(),
            predgen: PredGenConfig::default(),
            chat_mode: ChatMode::PredGen,
            caption_max_tokens: 64,
            max_frame_samples: 16_000,
            idle_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(20),
            connections_per_address: 64,
            api_keys: Vec::new(),
            allowed_origins: Vec::new(),
            sessions_per_client: 4,
            requests_per_minute: 600,
            messages_per_second: 200,
            max_body_bytes: 25 << 20,
            max_audio: Duration::from_secs(600),
            models: ServedModels::default(),
            default_max_tokens: 512,
            chat_speculation: Speculation::Lookup { max_draft: 8 },
        }
    }
}

impl ServeConfig {
    fn validate(&self) -> Result<()> {
        if self.engines == 0 {
            return Err(Error::Config("the server needs at least one engine".into()));
        }
        if self.max_frame_samples == 0 || self.max_frame_samples * 2 > MAX_MESSAGE_BYTES {
            return Err(Error::Config(format!(
                "max_frame_samples must be 1 to {}",
                MAX_MESSAGE_BYTES / 2
            )));
        }
        let timeouts = [
            self.idle_timeout,
            self.handshake_timeout,
            self.body_timeout,
            self.write_timeout,
        ];
        if timeouts.iter().any(Duration::is_zero) {
            return Err(Error::Config(
                "the idle, handshake, body and write timeouts must be longer than zero".into(),
            ));
        }
        if self.connections_per_address == 0
            || self.requests_per_minute == 0
            || self.messages_per_second == 0
        {
            return Err(Error::Config(
                "connections per address, requests per minute and messages per second must be \
                 at least 1"
                    .into(),
            ));
        }
        if self.caption_max_tokens == 0 {
            return Err(Error::Config("captions need at least one token".into()));
        }
        if self.sessions_per_client == 0 || self.default_max_tokens == 0 {
            return Err(Error::Config(
                "sessions per client and default max tokens must be at least 1".into(),
            ));
        }
        if self
            .api_keys
            .iter()
            .any(|k| k.trim().is_empty() || k.contains(char::is_whitespace))
        {
            return Err(Error::Config(
                "an API key is empty or holds white space".into(),
            ));
        }
        Ok(())
    }
}

/// What every connection shares.
struct Shared {
    config: Arc<ServeConfig>,
    pool: Arc<Pool>,
    voices: Voices,
    /// Becomes `true` when the server shuts down.
    shutdown: watch::Receiver<bool>,
    /// Open WebSocket connections.
    connections: watch::Sender<usize>,
    access: Arc<Access>,
    metrics: Arc<Metrics>,
}

impl Shared {
    fn new(
        config: ServeConfig,
        pool: Arc<Pool>,
        voices: Voices,
        (shutdown, connections): (watch::Receiver<bool>, watch::Sender<usize>),
    ) -> Arc<Self> {
        Arc::new(Self {
            pool,
            access: Access::new(
                &config.api_keys,
                &config.allowed_origins,
                config.sessions_per_client,
                config.requests_per_minute,
            ),
            config: Arc::new(config),
            voices,
            shutdown,
            connections,
            metrics: Arc::default(),
        })
    }
}

/// The server's endpoints: the page and `/health` open, the rest behind the access checks and
/// the body deadline.
fn router(shared: Arc<Shared>) -> Router {
    let guarded = Router::new()
        .route("/voices", get(voice_list))
        .route("/ws", get(upgrade))
        .route("/metrics", get(metrics))
        .merge(openai::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            listen::body_in_time,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            access::require_access,
        ));
    Router::new()
        .route("/", get(page))
        .route("/health", get(health))
        .merge(guarded)
        // `body_in_time` has bounded every body the handlers read already (to
        // `max_body_bytes`): the extractors' own default bound (2 MB) would only be a second,
        // smaller one.
        .layer(DefaultBodyLimit::disable())
        .with_state(shared)
}

/// The server's endpoints without engines, for `spec-fuzz`: every request is read and checked
/// by the real handlers (a request carries its peer as `ConnectInfo<SocketAddr>`), and one
/// that needs an engine is then refused. Not part of the API.
#[doc(hidden)]
pub fn router_without_engines(config: ServeConfig, voices: impl Into<Voices>) -> Result<Router> {
    config.validate()?;
    let no_engines: EngineFactory =
        Arc::new(|| Err(Error::Serve("a router without engines".into())));
    let shared = Shared::new(
        config,
        Pool::new(Vec::new(), 0, no_engines),
        voices.into(),
        (watch::channel(false).1, watch::Sender::new(0)),
    );
    Ok(router(shared))
}

/// A running server (see the [module documentation](self)).
pub struct Server {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    connections: watch::Sender<usize>,
    task: JoinHandle<()>,
}

impl Server {
    /// Loads `config.engines` engines with `engines` (on blocking threads), checks that the
    /// settings work with them, binds `addr` (port 0: any free port) and serves on the current
    /// Tokio runtime until [`Server::shutdown`]. Chat sessions speak with `voices` (a
    /// [`SynthesizerFactory`] alone: one voice for all).
    pub async fn start(
        addr: SocketAddr,
        config: ServeConfig,
        engines: EngineFactory,
        voices: impl Into<Voices>,
    ) -> Result<Self> {
        let voices = voices.into();
        config.validate()?;
        let loaded = {
            let (factory, config) = (Arc::clone(&engines), config.clone());
            tokio::task::spawn_blocking(move || load_engines(&factory, &config))
                .await
                .map_err(|e| Error::Serve(format!("loading the engines: {e}")))??
        };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::Listen { addr, source })?;
        let (shutdown, shutdown_seen) = watch::channel(false);
        let connections = watch::Sender::new(0);
        let limits = listen::Limits {
            handshake: config.handshake_timeout,
            per_address: config.connections_per_address,
        };
        let pool = Pool::new(loaded, config.queue, engines);
        let shared = Shared::new(
            config,
            pool,
            voices,
            (shutdown_seen.clone(), connections.clone()),
        );
        let router = router(shared);
        let task = tokio::spawn(listen::serve(listener, router, limits, shutdown_seen));
        tracing::info!("serving on ws://{addr}/ws");
        Ok(Self {
            addr,
            shutdown,
            connections,
            task,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Open WebSocket connections.
    pub fn connections(&self) -> usize {
        *self.connections.borrow()
    }

    /// Shuts down gracefully: no new connection is accepted, every client is told
    /// (`shutting_down`, or an error for those not yet in a session), each session's audio
    /// ends and its turn in progress completes; returns once every connection has closed.
    pub async fn shutdown(self) -> Result<()> {
        self.shutdown.send_replace(true);
        self.task
            .await
            .map_err(|e| Error::Serve(format!("the server task: {e}")))?;
        let mut open = self.connections.subscribe();
        let _ = open.wait_for(|n| *n == 0).await;
        Ok(())
    }
}

/// Loads the engines, checking on the first one that the listener and PredGen settings work
/// (which also measures the model's forward costs once, if PredGen is cost-aware).
fn load_engines(factory: &EngineFactory, config: &ServeConfig) -> Result<Vec<Engine>> {
    let mut engines = Vec::with_capacity(config.engines);
    for i in 0..config.engines {
        let mut engine = factory()?;
        if i == 0 {
            PredGen::new(&mut engine.model, config.predgen.clone())?;
            let listener = Listener::new(engine.whisper, config.listener.clone())?;
            engine.whisper = listener.into_transcriber();
        }
        engines.push(engine);
    }
    tracing::info!("{} engine(s) loaded", engines.len());
    Ok(engines)
}

/// The browser client: microphone in, transcripts, answers (spoken) and captions out.
async fn page() -> Html<&'static str> {
    Html(include_str!("page.html"))
}

/// The voices a chat session may name: `{"default": NAME, "voices": [NAME, …]}`.
async fn voice_list(State(shared): State<Arc<Shared>>) -> Response {
    let body = serde_json::json!({
        "default": shared.voices.default_name(),
        "voices": shared.voices.names(),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `200 ok` while the server accepts sessions, `503 shutting down` once it drains.
async fn health(State(shared): State<Arc<Shared>>) -> Response {
    match *shared.shutdown.borrow() {
        false => "ok\n".into_response(),
        true => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "shutting down\n",
        )
            .into_response(),
    }
}

/// The server's metrics in Prometheus' text format.
async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let (free, waiting) = shared.pool.occupancy();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.metrics.render(free, waiting),
    )
        .into_response()
}

async fn upgrade(
    socket: WebSocketUpgrade,
    State(shared): State<Arc<Shared>>,
    Extension(client): Extension<Client>,
) -> Response {
    accept(
        socket,
        shared,
        &client,
        ("specvoice", Endpoint::Native),
        |socket, shared| async move {
            connection::serve(socket, shared).await;
            true
        },
    )
}

/// Upgrades to a WebSocket speaking `protocol` for `client` (429 when the client holds all its
/// places). While `serve` runs, one of the client's places is held and the connection counted
/// (from the upgrade, so that a shutdown also waits for connections being opened); `serve`
/// returning `false` counts a failure of `endpoint`.
fn accept<F, Served>(
    socket: WebSocketUpgrade,
    shared: Arc<Shared>,
    client: &Client,
    (protocol, endpoint): (&'static str, Endpoint),
    serve: F,
) -> Response
where
    F: FnOnce(axum::extract::ws::WebSocket, Arc<Shared>) -> Served + Send + 'static,
    Served: std::future::Future<Output = bool> + Send + 'static,
{
    let held = match shared.access.hold(client) {
        Ok(held) => held,
        Err(error) => return error.into_response(),
    };
    let open = Open::new(&shared.connections);
    socket
        .max_message_size(MAX_MESSAGE_BYTES)
        .max_frame_size(MAX_MESSAGE_BYTES)
        .protocols([protocol])
        .on_upgrade(move |socket| async move {
            let active = shared.metrics.request(endpoint);
            if !serve(socket, Arc::clone(&shared)).await {
                shared.metrics.failed(endpoint);
            }
            drop((active, held, open));
        })
}

/// An open connection, counted while it lives.
struct Open(watch::Sender<usize>);

impl Open {
    fn new(connections: &watch::Sender<usize>) -> Self {
        connections.send_modify(|n| *n += 1);
        Self(connections.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}
