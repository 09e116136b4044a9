//! A session on its engine, on a thread of its own: a [`VoiceChat`] or [`LiveCaptions`] on the
//! wall clock, fed by the audio the connection receives, its events sent back as they happen.
//!
//! The loop: hear every audio frame that has arrived (Whisper and the endpoint detector run on
//! it), step the pipeline (one piece of the language model's work), send the events; when the
//! pipeline is idle, sleep until the next frame. The session ends when the client's audio ends
//! and the turn in progress is complete, or at once when the client is gone.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use engine_llm::{PredGen, PredGenConfig};
use engine_mt::{LiveConfig, LiveTranslator};
use tokio::sync::{mpsc, oneshot};

use super::metrics::Metrics;
use super::pool::Pool;
use super::protocol::{caption_messages, chat_messages, Outgoing, ServerMessage, SessionMode};
use super::{Engine, ServeConfig, Voices};
use crate::drive::{drive, Arrival, AudioSource, Ended, Pipeline};
use crate::listener::{Listener, ListenerConfig};
use crate::turn_end::TurnEnd;
use crate::{ClockKind, Error, LiveCaptions, Result, VoiceChat};
use spec_voice::Clock;

/// What the connection hands the session.
#[derive(Debug)]
pub(crate) enum Input {
    /// 16 kHz mono samples.
    Audio(Vec<f32>),
    /// The audio stream ended.
    End,
    /// The client declares the utterance complete.
    EndUtterance,
    /// The client drops the answer being made.
    CancelAnswer,
}

/// Everything a session thread needs besides its engine.
pub(crate) struct SessionContext {
    pub mode: SessionMode,
    pub config: Arc<ServeConfig>,
    /// How this session hears and answers (the server's settings, or a Realtime client's).
    pub listener: ListenerConfig,
    pub predgen: PredGenConfig,
    pub voices: Voices,
    /// The voice a chat session speaks with (loaded here, on the session's thread).
    pub voice: Option<String>,
    pub pool: Arc<Pool>,
    pub inputs: mpsc::Receiver<Input>,
    pub outputs: mpsc::Sender<Outgoing>,
    pub metrics: Arc<Metrics>,
}

/// A session thread's stack: the main thread's 8 MiB. Whisper, the model and the voice run
/// deep on it, and a debug build's frames overflow the 2 MiB a spawned thread gets by default.
const SESSION_STACK_BYTES: usize = 8 << 20;

/// Starts a session on a thread of its own ([`run`]); the receiver gets how it ended. When the
/// thread cannot start, the engine it was given is rebuilt and the error returned.
pub(crate) async fn spawn(
    engine: Engine,
    context: SessionContext,
) -> std::io::Result<oneshot::Receiver<Result<Ended>>> {
    let pool = Arc::clone(&context.pool);
    let (finished, done) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("specvoice-session".into())
        .stack_size(SESSION_STACK_BYTES)
        .spawn(move || {
            let _ = finished.send(run(engine, context));
        });
    match spawned {
        Ok(_) => Ok(done),
        Err(e) => {
            // The thread and the engine it was given are gone.
            let _ = tokio::task::spawn_blocking(move || pool.rebuild()).await;
            Err(e)
        }
    }
}

/// Runs a session on `engine` and gives the engine back to the pool (or, if the session
/// panicked and took the engine with it, has the pool rebuild one). Blocking: call on a thread
/// of its own.
pub(crate) fn run(engine: Engine, mut context: SessionContext) -> Result<Ended> {
    let pool = Arc::clone(&context.pool);
    let mut slot = Some(engine);
    let outcome = catch_unwind(AssertUnwindSafe(|| session(&mut slot, &mut context)));
    match (slot, outcome) {
        (Some(engine), Ok(result)) => {
            pool.release(engine);
            result
        }
        (lost, outcome) => {
            // A panic may leave the models' caches half updated: they are rebuilt either way.
            drop(lost);
            pool.rebuild();
            match outcome {
                Ok(result) => result,
                Err(panic) => Err(Error::Serve(format!(
                    "the session panicked: {}",
                    panic_message(panic.as_ref())
                ))),
            }
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_string()
    }
}

/// The session proper. The engine is taken out of `slot` while the pipeline owns its parts and
/// put back when the pipeline gives them back; an error that consumes a part leaves the slot
/// empty, and the pool rebuilds the engine.
fn session(slot: &mut Option<Engine>, context: &mut SessionContext) -> Result<Ended> {
    let Engine { whisper, mut model } = slot
        .take()
        .ok_or_else(|| Error::Serve("a session started without an engine".into()))?;
    let config = Arc::clone(&context.config);
    let (listener, result) = match context.mode.clone() {
        SessionMode::Chat => {
            let parts = PredGen::new(&mut model, context.predgen.clone())
                .map_err(Error::from)
                .and_then(|predgen| {
                    let voice = context.voices.get(context.voice.as_deref())?;
                    Ok((predgen, voice()?))
                });
            let (predgen, tts) = match parts {
                Ok(parts) => parts,
                Err(e) => {
                    *slot = Some(Engine { whisper, model });
                    return Err(e);
                }
            };
            let mut chat = VoiceChat::new(
                Listener::new(whisper, context.listener.clone())?,
                predgen,
                tts,
                config.chat_mode,
                ClockKind::Wall,
            );
            let result = run_pipeline(&mut chat, context, chat_messages);
            (chat.into_parts().0, result)
        }
        SessionMode::Caption { to } => {
            let live = LiveConfig {
                max_tokens: config.caption_max_tokens,
                ..LiveConfig::new(to)
            };
            let translator = match LiveTranslator::new(&mut model, live) {
                Ok(translator) => translator,
                Err(e) => {
                    *slot = Some(Engine { whisper, model });
                    return Err(e.into());
                }
            };
            // Captions end an utterance after the endpoint detector's silence.
            let listener = ListenerConfig {
                turn_end: TurnEnd::Silence,
                ..context.listener.clone()
            };
            let mut captions = LiveCaptions::new(
                Listener::new(whisper, listener)?,
                translator,
                ClockKind::Wall,
            );
            let result = run_pipeline(&mut captions, context, caption_messages);
            (captions.into_listener(), result)
        }
    };
    *slot = Some(Engine {
        whisper: listener.into_transcriber(),
        model,
    });
    result
}

/// A connection's audio: what the client has sent, as it arrives.
struct Connection<'c> {
    inputs: &'c mut mpsc::Receiver<Input>,
}

impl Connection<'_> {
    fn arrival(input: Option<Input>) -> Arrival {
        match input {
            Some(Input::Audio(samples)) => Arrival::Audio(samples),
            Some(Input::End) => Arrival::End,
            Some(Input::EndUtterance) => Arrival::EndUtterance,
            Some(Input::CancelAnswer) => Arrival::CancelAnswer,
            None => Arrival::Gone,
        }
    }
}

impl AudioSource for Connection<'_> {
    fn poll(&mut self, _clock: &Clock) -> Arrival {
        match self.inputs.try_recv() {
            Ok(input) => Self::arrival(Some(input)),
            Err(mpsc::error::TryRecvError::Empty) => Arrival::Nothing,
            Err(mpsc::error::TryRecvError::Disconnected) => Arrival::Gone,
        }
    }

    fn wait(&mut self, _clock: &Clock) -> Arrival {
        Self::arrival(self.inputs.blocking_recv())
    }
}

/// The session's loop ([`drive`]): the connection's audio in, the pipeline's events out.
fn run_pipeline<P: Pipeline>(
    pipeline: &mut P,
    context: &mut SessionContext,
    messages: fn(P::Event) -> Vec<Outgoing>,
) -> Result<Ended> {
    let outputs = context.outputs.clone();
    let metrics = Arc::clone(&context.metrics);
    let mut connection = Connection {
        inputs: &mut context.inputs,
    };
    drive(pipeline, &mut connection, &mut |event| {
        messages(event).into_iter().all(|out| {
            if let Outgoing::Message(ServerMessage::TurnDone { latency_ms, .. }) = &out {
                metrics.turn_latency(std::time::Duration::from_millis(*latency_ms));
            }
            outputs.blocking_send(out).is_ok()
        })
    })
}
