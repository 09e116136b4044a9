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

mod connection;
mod pool;
pub mod protocol;
mod session;
mod voices;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use engine_asr::{LoadOptions as AsrLoadOptions, Transcriber};
use engine_llm::{LanguageModel, LoadOptions, PredGen, PredGenConfig};
use spec_voice::SentenceSynthesizer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::chat::ChatMode;
use crate::listener::{Listener, ListenerConfig};
use crate::{Error, Result};

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
    /// How long the server waits for `start`, or for audio during a session, before it gives
    /// up on the client. Default 30 s.
    pub idle_timeout: Duration,
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
        if self.idle_timeout.is_zero() {
            return Err(Error::Config(
                "the idle timeout must be longer than zero".into(),
            ));
        }
        if self.caption_max_tokens == 0 {
            return Err(Error::Config("captions need at least one token".into()));
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
}

/// A running server (see the [module documentation](self)).
pub struct Server {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    connections: watch::Sender<usize>,
    task: JoinHandle<std::io::Result<()>>,
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
        let shared = Arc::new(Shared {
            pool: Pool::new(loaded, config.queue, engines),
            config: Arc::new(config),
            voices,
            shutdown: shutdown_seen.clone(),
            connections: connections.clone(),
        });
        let router = Router::new()
            .route("/", get(page))
            .route("/voices", get(voice_list))
            .route("/ws", get(upgrade))
            .with_state(shared);
        let mut stop = shutdown_seen;
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|down| *down).await;
                })
                .await
        });
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
        let served = self
            .task
            .await
            .map_err(|e| Error::Serve(format!("the server task: {e}")))?;
        served.map_err(|e| Error::Serve(format!("accepting connections: {e}")))?;
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

async fn upgrade(socket: WebSocketUpgrade, State(shared): State<Arc<Shared>>) -> Response {
    // Counted from the upgrade, so that a shutdown also waits for connections being opened.
    let open = Open::new(&shared.connections);
    socket
        .max_message_size(MAX_MESSAGE_BYTES)
        .max_frame_size(MAX_MESSAGE_BYTES)
        .on_upgrade(move |socket| async move {
            connection::serve(socket, shared).await;
            drop(open);
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
