//! The voice server over loopback, driven by a real WebSocket client (`tokio-tungstenite`), on
//! tiny random-weight models: a random Whisper hears tone bursts as random words, a random chat
//! model answers. What is tested is the server: the protocol's order of events, refusals of bad
//! input that leave the connection (and the server) working, the bounded queue, a session that
//! panics, graceful shutdown, the voices a client picks, no audio of an answer dropped by a
//! barge-in after the `barge_in`, and what bounds abusive clients: the handshake deadline (slow
//! request heads), connections per address, requests a minute, messages a second, the body
//! deadline, and the write deadline for a client that stops reading.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine_asr::testing::write_hf;
use engine_asr::{LoadOptions, Transcriber};
use engine_llm::testing::tiny_chat_model;
use futures_util::{SinkExt, StreamExt};
use spec_voice::{AudioChunk, FixedLatencySynthesizer, SentenceSynthesizer, Synthesis};
use specvoice::serve::protocol::{encode_pcm, ErrorCode, ServerMessage, SessionMode};
use specvoice::serve::{
    copies_of, engines_from, EngineFactory, ServeConfig, Server, SynthesizerFactory, VoiceLoader,
    Voices,
};
use specvoice::{ListenerConfig, SemanticTurnEnd, TurnEnd};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

mod common;

use common::{random_listener_config, random_predgen_config, silence, voice};

/// Longest wait for any one message.
const PATIENCE: Duration = Duration::from_secs(60);

/// A question: silence, a tone burst, and the end-of-speech silence.
fn question() -> Vec<f32> {
    [silence(0.4), voice(1.0), silence(0.8)].concat()
}

fn config(engines: usize, queue: usize) -> ServeConfig {
    ServeConfig {
        engines,
        queue,
        listener: random_listener_config(),
        predgen: random_predgen_config(),
        caption_max_tokens: 16,
        ..ServeConfig::default()
    }
}

/// Engines of a random Whisper (written once into `dir`) and a random chat model.
fn engines(dir: &tempfile::TempDir) -> EngineFactory {
    let path = dir.path().to_path_buf();
    engines_from(
        move || Transcriber::load(&path, &LoadOptions::default()),
        || tiny_chat_model(11),
    )
}

fn fixed_tts() -> SynthesizerFactory {
    copies_of(FixedLatencySynthesizer::default())
}

async fn start_with(config: ServeConfig, tts: SynthesizerFactory) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 31).unwrap();
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start(addr, config, engines(&dir), tts)
        .await
        .unwrap();
    (server, dir)
}

async fn start(config: ServeConfig) -> (Server, tempfile::TempDir) {
    start_with(config, fixed_tts()).await
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What the client received.
#[derive(Debug)]
enum Received {
    Json(ServerMessage),
    Audio(Vec<u8>),
    Closed,
}

struct Client {
    socket: Socket,
}

impl Client {
    async fn connect(server: &Server) -> Self {
        let url = format!("ws://{}/ws", server.local_addr());
        let (socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        Self { socket }
    }

    async fn text(&mut self, text: &str) {
        self.socket
            .send(Message::Text(text.to_string().into()))
            .await
            .unwrap();
    }

    async fn binary(&mut self, bytes: Vec<u8>) {
        self.socket
            .send(Message::Binary(bytes.into()))
            .await
            .unwrap();
    }

    async fn start_chat(&mut self) {
        self.text(r#"{"type":"start","mode":"chat"}"#).await;
    }

    /// Sends audio in 20 ms frames as a microphone does, one every 20 ms, then `stop`.
    async fn speak_in_real_time(&mut self, audio: &[f32]) {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        for frame in audio.chunks(320) {
            tick.tick().await;
            self.binary(encode_pcm(frame)).await;
        }
        self.text(r#"{"type":"stop"}"#).await;
    }

    /// Sends audio in 20 ms frames, then `stop`.
    async fn speak(&mut self, audio: &[f32]) {
        for frame in audio.chunks(320) {
            self.binary(encode_pcm(frame)).await;
        }
        self.text(r#"{"type":"stop"}"#).await;
    }

    async fn receive(&mut self) -> Received {
        loop {
            let next = tokio::time::timeout(PATIENCE, self.socket.next())
                .await
                .expect("the server answers in time");
            return match next {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => Received::Closed,
                Some(Ok(Message::Text(text))) => Received::Json(
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}")),
                ),
                Some(Ok(Message::Binary(bytes))) => Received::Audio(bytes.to_vec()),
                Some(Ok(_)) => continue,
            };
        }
    }

    async fn message(&mut self) -> ServerMessage {
        match self.receive().await {
            Received::Json(message) => message,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    async fn expect_error(&mut self, code: ErrorCode) {
        match self.message().await {
            ServerMessage::Error { code: got, .. } if got == code => {}
            other => panic!("expected a {code:?} error, got {other:?}"),
        }
    }

    async fn expect_ready(&mut self) {
        let message = self.message().await;
        assert!(
            matches!(message, ServerMessage::Ready { .. }),
            "{message:?}"
        );
    }

    /// Everything until the connection closes.
    async fn rest(&mut self) -> Vec<Received> {
        let mut all = Vec::new();
        loop {
            match self.receive().await {
                Received::Closed => return all,
                other => all.push(other),
            }
        }
    }

    async fn expect_closed(&mut self) {
        let rest = self.rest().await;
        assert!(rest.is_empty(), "{rest:?}");
    }
}

fn messages(received: &[Received]) -> Vec<&ServerMessage> {
    received
        .iter()
        .filter_map(|r| match r {
            Received::Json(m) => Some(m),
            _ => None,
        })
        .collect()
}

/// Checks a chat session's messages: the protocol's order, each audio header followed by its
/// samples, and one answered turn; the question and the answer.
fn check_chat(received: &[Received]) -> (String, String) {
    let position = |wanted: &dyn Fn(&ServerMessage) -> bool| {
        received
            .iter()
            .position(|r| matches!(r, Received::Json(m) if wanted(m)))
            .unwrap_or_else(|| panic!("missing a message: {:#?}", messages(received)))
    };
    let started = position(&|m| matches!(m, ServerMessage::SpeechStarted { .. }));
    let partial = position(&|m| matches!(m, ServerMessage::Partial { .. }));
    let ended = position(&|m| matches!(m, ServerMessage::SpeechEnded { .. }));
    let transcript = position(&|m| matches!(m, ServerMessage::Transcript { .. }));
    let audio = position(&|m| matches!(m, ServerMessage::Audio { .. }));
    let answered = position(&|m| matches!(m, ServerMessage::AnswerDone { .. }));
    let turn = position(&|m| matches!(m, ServerMessage::TurnDone { .. }));
    assert!(
        started < partial && partial < ended && ended < transcript,
        "{received:#?}"
    );
    assert!(
        transcript < audio && audio < turn && answered < turn,
        "{received:#?}"
    );
    assert!(matches!(
        received.last(),
        Some(Received::Json(ServerMessage::Done))
    ));
    for (i, r) in received.iter().enumerate() {
        if let Received::Json(ServerMessage::Audio {
            samples,
            sample_rate,
            ..
        }) = r
        {
            assert!(*sample_rate > 0);
            match &received[i + 1] {
                Received::Audio(bytes) => assert_eq!(bytes.len(), 2 * samples),
                other => panic!("an audio header followed by {other:?}"),
            }
        }
    }
    let Received::Json(ServerMessage::Transcript { text, .. }) = &received[transcript] else {
        unreachable!()
    };
    let Received::Json(ServerMessage::TurnDone {
        question, answer, ..
    }) = &received[turn]
    else {
        unreachable!()
    };
    assert_eq!(question, text);
    assert!(!question.is_empty());
    assert!(!answer.is_empty());
    let turns = messages(received)
        .iter()
        .filter(|m| matches!(m, ServerMessage::TurnDone { .. }))
        .count();
    assert_eq!(turns, 1);
    (question.clone(), answer.clone())
}

/// A whole chat session on a new connection: its question and answer.
async fn chat(server: &Server, audio: &[f32]) -> (String, String) {
    let mut client = Client::connect(server).await;
    client.start_chat().await;
    client.expect_ready().await;
    client.speak(audio).await;
    check_chat(&client.rest().await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_session_streams_transcripts_answer_and_audio() {
    let (server, _dir) = start(config(1, 8)).await;
    let mut client = Client::connect(&server).await;
    client.start_chat().await;
    match client.message().await {
        ServerMessage::Ready {
            mode,
            voice,
            sample_rate,
            max_frame_samples,
        } => {
            assert_eq!(mode, SessionMode::Chat);
            assert_eq!(voice.as_deref(), Some("default"));
            assert_eq!(sample_rate, 16_000);
            assert_eq!(max_frame_samples, 16_000);
        }
        other => panic!("{other:?}"),
    }
    client.speak(&question()).await;
    let first = check_chat(&client.rest().await);
    // The engine went back to the pool: the same question, the same answer, as the model
    // answers greedily and each session starts a new conversation.
    assert_eq!(chat(&server, &question()).await, first);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_at_the_root() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (server, _dir) = start(config(1, 8)).await;
    let mut http = TcpStream::connect(server.local_addr()).await.unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    http.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(response.contains("content-type: text/html"), "{response}");
    for needle in [
        "audioWorklet",
        "/ws",
        "/voices",
        r#"type: "stop""#,
        "\"turn_done\"",
        "\"caption\"",
        "\"barge_in\"",
    ] {
        assert!(response.contains(needle), "{needle}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caption_session_commits_a_final_caption() {
    let (server, _dir) = start(config(1, 8)).await;
    let mut client = Client::connect(&server).await;
    client
        .text(r#"{"type":"start","mode":"caption","to":"French"}"#)
        .await;
    match client.message().await {
        ServerMessage::Ready { mode, .. } => assert_eq!(
            mode,
            SessionMode::Caption {
                to: "French".into()
            }
        ),
        other => panic!("{other:?}"),
    }
    client.speak(&question()).await;
    let received = client.rest().await;
    let all = messages(&received);
    assert!(
        matches!(all[0], ServerMessage::SpeechStarted { .. }),
        "{all:#?}"
    );
    let captions: Vec<_> = all
        .iter()
        .filter_map(|m| match m {
            ServerMessage::Caption {
                source,
                output,
                is_final,
                ..
            } => Some((source, output, *is_final)),
            _ => None,
        })
        .collect();
    assert!(captions.len() >= 2, "{all:#?}");
    let (source, _, is_final) = captions.last().unwrap();
    assert!(*is_final && !source.is_empty());
    assert!(captions[..captions.len() - 1].iter().all(|c| !c.2));
    assert!(matches!(all.last(), Some(ServerMessage::Done)));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_get_errors_and_the_connection_goes_on() {
    let (server, _dir) = start(config(1, 8)).await;
    let mut client = Client::connect(&server).await;
    client.binary(encode_pcm(&silence(0.02))).await;
    client.expect_error(ErrorCode::NotStarted).await;
    client.text(r#"{"type":"stop"}"#).await;
    client.expect_error(ErrorCode::NotStarted).await;
    client.text("{not json").await;
    client.expect_error(ErrorCode::BadJson).await;
    client.text(r#"{"kind":"start"}"#).await;
    client.expect_error(ErrorCode::BadJson).await;
    client.text(r#"{"type":"dance"}"#).await;
    client.expect_error(ErrorCode::UnknownType).await;
    client.text(r#"{"type":"start","mode":"sing"}"#).await;
    client.expect_error(ErrorCode::BadMessage).await;
    client.start_chat().await;
    client.expect_ready().await;
    client.text(r#"{"type":"start","mode":"chat"}"#).await;
    client.expect_error(ErrorCode::AlreadyStarted).await;
    client.binary(vec![1, 2, 3]).await;
    client.expect_error(ErrorCode::BadFrame).await;
    client.binary(Vec::new()).await;
    client.expect_error(ErrorCode::BadFrame).await;
    client.binary(encode_pcm(&silence(1.01))).await;
    client.expect_error(ErrorCode::FrameTooLarge).await;
    client.text(r#"{"type":"hello"}"#).await;
    client.expect_error(ErrorCode::UnknownType).await;
    // After all that, the session still answers.
    client.speak(&question()).await;
    let received = client.rest().await;
    check_chat(&received);

    // A message beyond the transport's bound closes that connection only.
    let mut flood = Client::connect(&server).await;
    flood.start_chat().await;
    flood.expect_ready().await;
    let _ = flood
        .socket
        .send(Message::Binary(vec![0; 2 << 20].into()))
        .await;
    let rest = flood.rest().await;
    assert!(
        rest.iter().all(|r| !matches!(r, Received::Audio(_))),
        "{rest:?}"
    );
    chat(&server, &question()).await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_beyond_the_queue_are_refused_and_queued_ones_complete() {
    let (server, _dir) = start(config(1, 2)).await;
    let mut first = Client::connect(&server).await;
    first.start_chat().await;
    first.expect_ready().await;
    let mut second = Client::connect(&server).await;
    second.start_chat().await;
    assert_eq!(
        second.message().await,
        ServerMessage::Queued { position: 1 }
    );
    let mut third = Client::connect(&server).await;
    third.start_chat().await;
    assert_eq!(third.message().await, ServerMessage::Queued { position: 2 });
    // Audio while queued is refused; the place is kept.
    third.binary(encode_pcm(&silence(0.02))).await;
    third.expect_error(ErrorCode::NotReady).await;
    let mut fourth = Client::connect(&server).await;
    fourth.start_chat().await;
    fourth.expect_error(ErrorCode::Busy).await;
    fourth.expect_closed().await;

    // The first ends without speaking: the engine goes to the second, the third moves up.
    first.text(r#"{"type":"stop"}"#).await;
    assert_eq!(first.rest().await.len(), 1);
    second.expect_ready().await;
    assert_eq!(third.message().await, ServerMessage::Queued { position: 1 });
    let (second_done, third_done) = tokio::join!(
        async {
            second.speak(&question()).await;
            check_chat(&second.rest().await)
        },
        async {
            third.expect_ready().await;
            third.speak(&question()).await;
            check_chat(&third.rest().await)
        }
    );
    assert_eq!(second_done, third_done);
    server.shutdown().await.unwrap();
}

/// A synthesizer that panics once, while `armed`.
#[derive(Clone)]
struct Booby {
    armed: Arc<AtomicBool>,
    inner: FixedLatencySynthesizer,
}

impl SentenceSynthesizer for Booby {
    fn synthesize(&mut self, sentence: &str) -> spec_voice::Result<Synthesis> {
        if self.armed.swap(false, Ordering::SeqCst) {
            panic!("the synthesizer broke");
        }
        self.inner.synthesize(sentence)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_panics_reports_it_and_the_engine_is_rebuilt() {
    let armed = Arc::new(AtomicBool::new(true));
    let tts = copies_of(Booby {
        armed: Arc::clone(&armed),
        inner: FixedLatencySynthesizer::default(),
    });
    let (server, _dir) = start_with(config(1, 8), tts).await;
    let mut client = Client::connect(&server).await;
    client.start_chat().await;
    client.expect_ready().await;
    client.speak(&question()).await;
    let received = client.rest().await;
    match messages(&received).last() {
        Some(ServerMessage::Error {
            code: ErrorCode::SessionFailed,
            message,
        }) => assert!(message.contains("the synthesizer broke"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(!armed.load(Ordering::SeqCst));
    chat(&server, &question()).await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_send_nothing_are_timed_out() {
    let config = ServeConfig {
        idle_timeout: Duration::from_millis(300),
        handshake_timeout: Duration::from_millis(300),
        ..config(1, 8)
    };
    let (server, _dir) = start(config).await;
    let mut idle = Client::connect(&server).await;
    idle.expect_error(ErrorCode::Timeout).await;
    idle.expect_closed().await;
    // In a session, silence from the client ends the audio; the session ends as after `stop`.
    let mut quiet = Client::connect(&server).await;
    quiet.start_chat().await;
    quiet.expect_ready().await;
    quiet.expect_error(ErrorCode::Timeout).await;
    assert_eq!(quiet.message().await, ServerMessage::Done);
    quiet.expect_closed().await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_tells_every_client_and_lets_the_turn_in_progress_finish() {
    let (server, _dir) = start(config(1, 8)).await;
    let addr = server.local_addr();
    let mut speaking = Client::connect(&server).await;
    speaking.start_chat().await;
    speaking.expect_ready().await;
    // The question without its end: the server ends the audio itself.
    for frame in [silence(0.4), voice(1.0)].concat().chunks(320) {
        speaking.binary(encode_pcm(frame)).await;
    }
    // Shut down only once the session has transcribed some of the speech (under load it may
    // not have read the audio yet, and an utterance it never heard has no turn to finish).
    let mut received = Vec::new();
    loop {
        let next = speaking.receive().await;
        let heard = matches!(next, Received::Json(ServerMessage::Partial { .. }));
        received.push(next);
        if heard {
            break;
        }
    }
    let mut queued = Client::connect(&server).await;
    queued.start_chat().await;
    assert_eq!(
        queued.message().await,
        ServerMessage::Queued { position: 1 }
    );
    let mut idle = Client::connect(&server).await;
    // Every connection has been taken up.
    for _ in 0..100 {
        if server.connections() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.connections(), 3);
    let shutdown = tokio::spawn(server.shutdown());
    queued.expect_error(ErrorCode::ShuttingDown).await;
    queued.expect_closed().await;
    idle.expect_error(ErrorCode::ShuttingDown).await;
    idle.expect_closed().await;
    received.extend(speaking.rest().await);
    let all = messages(&received);
    let notice = all
        .iter()
        .position(|m| matches!(m, ServerMessage::ShuttingDown))
        .unwrap_or_else(|| panic!("{all:#?}"));
    assert!(
        all[notice..]
            .iter()
            .any(|m| matches!(m, ServerMessage::TurnDone { .. })),
        "no turn finished after the shutdown notice: {all:#?}"
    );
    assert!(matches!(all.last(), Some(ServerMessage::Done)));
    tokio::time::timeout(PATIENCE, shutdown)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .is_err());
}

/// Holds every sentence until `open`: the turn being answered stays in progress meanwhile.
#[derive(Clone)]
struct Gated {
    open: Arc<AtomicBool>,
    inner: FixedLatencySynthesizer,
}

impl SentenceSynthesizer for Gated {
    fn synthesize(&mut self, sentence: &str) -> spec_voice::Result<Synthesis> {
        while !self.open.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.inner.synthesize(sentence)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_barge_in_no_audio_of_the_dropped_answer_follows() {
    let open = Arc::new(AtomicBool::new(false));
    let tts = copies_of(Gated {
        open: Arc::clone(&open),
        inner: FixedLatencySynthesizer::default(),
    });
    let (server, _dir) = start_with(config(1, 8), tts).await;
    let mut client = Client::connect(&server).await;
    client.start_chat().await;
    client.expect_ready().await;
    for frame in question().chunks(320) {
        client.binary(encode_pcm(frame)).await;
    }
    let mut received = Vec::new();
    loop {
        let next = client.receive().await;
        let heard = matches!(next, Received::Json(ServerMessage::Transcript { .. }));
        received.push(next);
        if heard {
            break;
        }
    }
    // The user speaks again while the answer is held back; the answer goes on once that audio
    // is surely waiting for the session (which hears it before its next step).
    for frame in [voice(1.0), silence(0.8)].concat().chunks(320) {
        client.binary(encode_pcm(frame)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    open.store(true, Ordering::SeqCst);
    client.text(r#"{"type":"stop"}"#).await;
    received.extend(client.rest().await);
    let all = messages(&received);
    let at = |wanted: &dyn Fn(&ServerMessage) -> bool, from: usize| {
        from + all[from..]
            .iter()
            .position(|m| wanted(m))
            .unwrap_or_else(|| panic!("missing a message after {from}: {all:#?}"))
    };
    // The user spoke while the answer's voice was held (its first sentence, or a guess prepared
    // at the pause): the answer is dropped.
    let barge_in = at(&|m| matches!(m, ServerMessage::BargeIn { .. }), 0);
    // None of its audio comes after the barge-in: every later `audio` is the next answer's,
    // after the next question's transcript.
    let next_question = at(&|m| matches!(m, ServerMessage::Transcript { .. }), barge_in);
    assert!(
        all[barge_in..next_question]
            .iter()
            .all(|m| !matches!(m, ServerMessage::Audio { .. })),
        "{all:#?}"
    );
    let turns: Vec<usize> = (0..all.len())
        .filter(|&i| matches!(all[i], ServerMessage::TurnDone { .. }))
        .collect();
    assert_eq!(turns.len(), 1, "{all:#?}");
    assert!(turns[0] > next_question);
    assert!(all[next_question..turns[0]]
        .iter()
        .any(|m| matches!(m, ServerMessage::Audio { .. })));
    assert!(matches!(all.last(), Some(ServerMessage::Done)));
    server.shutdown().await.unwrap();
}

/// Voices for the clients to pick: the server's own (`fixed`, 24 kHz), `slow` (8 kHz) loaded
/// on first use; counts the loads.
fn picked_voices(loads: &Arc<AtomicUsize>) -> Voices {
    let counted = Arc::clone(loads);
    let loader: VoiceLoader = Arc::new(move |name| {
        assert_eq!(name, "slow");
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(copies_of(FixedLatencySynthesizer {
            sample_rate: 8_000,
            ..FixedLatencySynthesizer::default()
        }))
    });
    Voices::new("fixed", fixed_tts()).with_choices(vec!["slow".into()], loader)
}

/// The sample rates of a session's audio messages.
fn audio_rates(received: &[Received]) -> Vec<u32> {
    messages(received)
        .iter()
        .filter_map(|m| match m {
            ServerMessage::Audio { sample_rate, .. } => Some(*sample_rate),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_session_speaks_with_the_voice_it_picks() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let loads = Arc::new(AtomicUsize::new(0));
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 31).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start(loopback, config(1, 8), engines(&dir), picked_voices(&loads))
        .await
        .unwrap();

    let mut http = TcpStream::connect(server.local_addr()).await.unwrap();
    http.write_all(b"GET /voices HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    http.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(
        response.contains("content-type: application/json"),
        "{response}"
    );
    let body: serde_json::Value =
        serde_json::from_str(response.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"default": "fixed", "voices": ["fixed", "slow"]})
    );

    // An unknown voice is refused, and the connection goes on.
    let mut client = Client::connect(&server).await;
    client
        .text(r#"{"type":"start","mode":"chat","voice":"kokoro:nobody"}"#)
        .await;
    match client.message().await {
        ServerMessage::Error {
            code: ErrorCode::UnknownVoice,
            message,
        } => assert!(message.contains("fixed, slow"), "{message}"),
        other => panic!("{other:?}"),
    }
    client
        .text(r#"{"type":"start","mode":"chat","voice":"slow"}"#)
        .await;
    match client.message().await {
        ServerMessage::Ready { voice, .. } => assert_eq!(voice.as_deref(), Some("slow")),
        other => panic!("{other:?}"),
    }
    client.speak(&question()).await;
    let received = client.rest().await;
    check_chat(&received);
    let rates = audio_rates(&received);
    assert!(
        !rates.is_empty() && rates.iter().all(|&r| r == 8_000),
        "{rates:?}"
    );

    // A second session picking it shares the loaded voice; one naming none speaks with the
    // server's own.
    for (start, rate) in [
        (r#"{"type":"start","mode":"chat","voice":"slow"}"#, 8_000),
        (r#"{"type":"start","mode":"chat"}"#, 24_000),
    ] {
        let mut client = Client::connect(&server).await;
        client.text(start).await;
        client.expect_ready().await;
        client.speak(&question()).await;
        let received = client.rest().await;
        check_chat(&received);
        assert!(audio_rates(&received).iter().all(|&r| r == rate));
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semantic_end_of_turn_is_reported_before_the_end_of_speech_and_answers_the_same() {
    let mut long_silence = random_listener_config();
    long_silence.endpoint.silence = SemanticTurnEnd::default().longest;
    let semantic = ListenerConfig {
        turn_end: TurnEnd::Semantic(SemanticTurnEnd::default()),
        ..random_listener_config()
    };
    let audio = [silence(0.4), voice(1.0), silence(1.6)].concat();
    let (server, _dir) = start(ServeConfig {
        listener: long_silence,
        ..config(1, 8)
    })
    .await;
    let expected = chat(&server, &audio).await;
    server.shutdown().await.unwrap();
    let (server, _dir) = start(ServeConfig {
        listener: semantic,
        ..config(1, 8)
    })
    .await;
    let mut client = Client::connect(&server).await;
    client.start_chat().await;
    client.expect_ready().await;
    client.speak_in_real_time(&audio).await;
    let received = client.rest().await;
    assert_eq!(check_chat(&received), expected);
    let all = messages(&received);
    let estimate = all
        .iter()
        .position(|m| matches!(m, ServerMessage::EndOfTurn { .. }))
        .unwrap_or_else(|| panic!("no end_of_turn: {all:#?}"));
    let ended = all
        .iter()
        .position(|m| matches!(m, ServerMessage::SpeechEnded { .. }))
        .unwrap();
    assert!(estimate < ended, "{all:#?}");
    let ServerMessage::EndOfTurn {
        probability,
        wait_ms,
        ..
    } = all[estimate]
    else {
        unreachable!()
    };
    assert!((0.0..=1.0).contains(probability));
    assert_eq!(
        u128::from(*wait_ms),
        SemanticTurnEnd::default().wait(*probability).as_millis()
    );
    server.shutdown().await.unwrap();
}

/// Reads until the server closes the connection, which must happen within `within`: what the
/// server sent.
async fn read_to_close(stream: &mut TcpStream, within: Duration) -> String {
    let mut received = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server kept the connection open");
    String::from_utf8_lossy(&received).into_owned()
}

/// A request over a new connection: the status and the body.
async fn http(server: &Server, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let response = read_to_close(&mut stream, PATIENCE).await;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_at_the_handshake_deadline() {
    let config = ServeConfig {
        handshake_timeout: Duration::from_millis(300),
        ..config(1, 8)
    };
    let (server, _dir) = start(config).await;
    let began = std::time::Instant::now();
    let mut silent = TcpStream::connect(server.local_addr()).await.unwrap();
    read_to_close(&mut silent, Duration::from_secs(3)).await;
    // A request head trickled a byte every 100 ms would take 4 s to complete.
    let mut trickling = TcpStream::connect(server.local_addr()).await.unwrap();
    let head = get("/health");
    let (mut reader, mut writer) = trickling.split();
    let trickle = async {
        for byte in head.as_bytes() {
            if writer.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let cut = async {
        let mut buffer = [0u8; 256];
        while let Ok(n) = reader.read(&mut buffer).await {
            if n == 0 {
                break;
            }
        }
        began.elapsed()
    };
    let (_, cut_at) = tokio::join!(trickle, cut);
    assert!(
        cut_at < Duration::from_secs(3),
        "a trickled head held its connection for {cut_at:?}"
    );
    // Clients that keep to the deadline are served.
    assert_eq!(http(&server, &get("/health")).await.0, 200);
    chat(&server, &question()).await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_an_address_bound_are_refused_before_any_request() {
    let config = ServeConfig {
        connections_per_address: 3,
        ..config(1, 8)
    };
    let (server, _dir) = start(config).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(server.local_addr()).await.unwrap());
    }
    // Let the server accept all three before the fourth comes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fourth = TcpStream::connect(server.local_addr()).await.unwrap();
    let refused = read_to_close(&mut fourth, Duration::from_secs(5)).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused:?}");
    // A place comes free when a connection closes.
    held.pop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    chat(&server, &question()).await;
    drop(held);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_a_clients_rate_get_429_and_health_stays_open() {
    let config = ServeConfig {
        // Bursts of a tenth of the minute's: six requests at once.
        requests_per_minute: 60,
        ..config(1, 8)
    };
    let (server, _dir) = start(config).await;
    for _ in 0..6 {
        assert_eq!(http(&server, &get("/voices")).await.0, 200);
    }
    let (status, body) = http(&server, &get("/v1/models")).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("rate_limit_exceeded"), "{body}");
    // A WebSocket is a request too.
    let url = format!("ws://{}/ws", server.local_addr());
    assert!(tokio_tungstenite::connect_async(url).await.is_err());
    // The health check is outside the budget.
    assert_eq!(http(&server, &get("/health")).await.0, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_gets_408() {
    let config = ServeConfig {
        body_timeout: Duration::from_millis(300),
        ..config(1, 8)
    };
    let (server, _dir) = start(config).await;
    let (status, body) = http(
        &server,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\"",
    )
    .await;
    assert_eq!(status, 408, "{body}");
    assert!(body.contains("request_timeout"), "{body}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_flooding_messages_is_told_and_disconnected() {
    let config = ServeConfig {
        // Bursts of five seconds' worth: 300 messages, more than a question sent at once.
        messages_per_second: 60,
        ..config(1, 8)
    };
    let (server, _dir) = start(config).await;
    let mut flooding = Client::connect(&server).await;
    flooding.start_chat().await;
    flooding.expect_ready().await;
    for _ in 0..2000 {
        if flooding
            .socket
            .send(Message::Text(r#"{"type":"cancel"}"#.into()))
            .await
            .is_err()
        {
            break;
        }
    }
    let rest = flooding.rest().await;
    let limited = rest.iter().any(|r| {
        matches!(
            r,
            Received::Json(ServerMessage::Error {
                code: ErrorCode::RateLimited,
                ..
            })
        )
    });
    assert!(limited, "{rest:?}");
    // The engine is free again for the next client.
    chat(&server, &question()).await;
    server.shutdown().await.unwrap();
}

/// Three minutes of audio for every sentence: more than a client's socket buffers hold.
#[derive(Clone)]
struct Lengthy;

impl SentenceSynthesizer for Lengthy {
    fn synthesize(&mut self, sentence: &str) -> spec_voice::Result<Synthesis> {
        let mut synthesis = FixedLatencySynthesizer::default().synthesize(sentence)?;
        let second = AudioChunk {
            samples: vec![0.0; 24_000],
            sample_rate: 24_000,
        };
        synthesis.chunks = vec![second; 180];
        Ok(synthesis)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_and_its_engine_serves_the_next() {
    let config = ServeConfig {
        write_timeout: Duration::from_millis(500),
        // Only the write deadline can end the deaf client's session in this test's time.
        idle_timeout: Duration::from_secs(600),
        ..config(1, 8)
    };
    let (server, _dir) = start_with(config, copies_of(Lengthy)).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(server.local_addr()).await.unwrap();
    let url = format!("ws://{}/ws", server.local_addr());
    let (socket, _) = tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream))
        .await
        .unwrap();
    let mut deaf = Client { socket };
    deaf.start_chat().await;
    deaf.expect_ready().await;
    // It asks, and never reads again.
    for frame in question().chunks(320) {
        deaf.binary(encode_pcm(frame)).await;
    }
    // The next client waits in the queue until the deaf one is dropped.
    let next = async {
        let mut client = Client::connect(&server).await;
        client.start_chat().await;
        while let ServerMessage::Queued { .. } = client.message().await {}
        client.speak(&question()).await;
        check_chat(&client.rest().await)
    };
    let next = tokio::time::timeout(PATIENCE, next).await;
    assert!(
        next.is_ok(),
        "the client that stopped reading kept the engine"
    );
    drop(deaf);
    server.shutdown().await.unwrap();
}
