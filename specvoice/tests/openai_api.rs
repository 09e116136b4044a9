//! The OpenAI-compatible API over loopback, on tiny random-weight models: the official `openai`
//! Python package (pinned, installed by the test into a virtual environment under the target
//! directory; Python is only the client) drives every endpoint — `tests/openai_client.py` holds
//! its checks — and the chat answers must be what plain greedy decoding of the same model gives.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use engine_asr::testing::write_hf;
use engine_asr::{LoadOptions, Transcriber};
use engine_llm::testing::tiny_chat_model;
use engine_llm::{GenerateOptions, Message};
use spec_voice::FixedLatencySynthesizer;
use specvoice::serve::{copies_of, engines_from, ServeConfig, Server};

mod common;

use common::{random_listener_config, random_predgen_config, silence, voice};

/// The official client's version the test pins.
const OPENAI_PACKAGE: &str = "openai[realtime]==3.63.0";

const KEY: &str = "sk-specvoice-test";

const QUESTION: &str = "What is the capital of France?";

const MAX_TOKENS: usize = 24;

/// A virtual environment with the pinned `openai` package, made once per target directory.
fn python_with_openai() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("openai-venv");
    let python = venv.join("bin").join("python");
    let installed = Command::new(&python)
        .args([
            "-c",
            "import openai, sys; sys.exit(openai.__version__ != '3.63.0')",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 runs");
        assert!(made.success(), "python3 -m venv failed");
        let pip = Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", OPENAI_PACKAGE])
            .status()
            .expect("pip runs");
        assert!(pip.success(), "pip install {OPENAI_PACKAGE} failed");
    }
    python
}

/// The answer plain greedy decoding of the server's chat model gives to the client's question.
fn plain_greedy_answer() -> String {
    let mut model = tiny_chat_model(11).unwrap();
    let messages = [Message::system("Answer briefly."), Message::user(QUESTION)];
    let options = GenerateOptions::default().max_tokens(MAX_TOKENS);
    model.chat(&messages, &options).unwrap().text
}

fn write_question_wav(path: &Path) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(path, spec).unwrap();
    for sample in [silence(0.3), voice(1.2), silence(0.3)].concat() {
        writer
            .write_sample((sample * f32::from(i16::MAX)) as i16)
            .unwrap();
    }
    writer.finalize().unwrap();
}

#[test]
#[ignore = "installs the openai Python package from PyPI into the target directory"]
fn the_official_openai_client_speaks_to_every_endpoint() {
    let python = python_with_openai();
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 31).unwrap();
    let wav = dir.path().join("question.wav");
    write_question_wav(&wav);
    let config = ServeConfig {
        listener: random_listener_config(),
        predgen: random_predgen_config(),
        api_keys: vec![KEY.to_string()],
        max_body_bytes: 4 << 20,
        ..ServeConfig::default()
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let whisper = dir.path().to_path_buf();
    let engines = engines_from(
        move || Transcriber::load(&whisper, &LoadOptions::default()),
        || tiny_chat_model(11),
    );
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let chat_model = config.models.chat.clone();
    let server = runtime
        .block_on(Server::start(
            addr,
            config,
            engines,
            copies_of(FixedLatencySynthesizer::default()),
        ))
        .unwrap();
    let setup = serde_json::json!({
        "base_url": format!("http://{}", server.local_addr()),
        "key": KEY,
        "chat_model": chat_model,
        "question": QUESTION,
        "expected": plain_greedy_answer(),
        "max_tokens": MAX_TOKENS,
        "wav": wav,
        "voice": "default",
        "answer_tokens": random_predgen_config().max_answer_tokens,
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg(setup.to_string())
        .output()
        .expect("the client runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.lines().last().is_some_and(|l| l.starts_with("ok ")),
        "the client failed:\n{stdout}\n{stderr}"
    );
    eprintln!("{stdout}");
    runtime.block_on(server.shutdown()).unwrap();
}

/// Connects to the server's own WebSocket with `headers`; the HTTP status of a refusal.
async fn connect_ws(
    server: &Server,
    headers: &[(&str, &str)],
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    u16,
> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
    use tokio_tungstenite::tungstenite::Error;
    let url = format!("ws://{}/ws", server.local_addr());
    let mut request = url.into_client_request().unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        Err(Error::Http(response)) => Err(response.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn the_native_protocol_takes_the_same_keys_and_checks_origins_and_limits() {
    let (server, _dir) = keyed_server(1, 200).await;
    assert_eq!(connect_ws(&server, &[]).await.err(), Some(401));
    let wrong = [("authorization", "Bearer sk-wrong")];
    assert_eq!(connect_ws(&server, &wrong).await.err(), Some(401));
    let bearer = format!("Bearer {KEY}");
    let foreign = [
        ("authorization", bearer.as_str()),
        ("origin", "http://evil.example"),
    ];
    assert_eq!(connect_ws(&server, &foreign).await.err(), Some(403));
    // A browser names the key as a subprotocol; the server picks its own protocol's name.
    let protocols = format!("specvoice, openai-insecure-api-key.{KEY}");
    let page = [("sec-websocket-protocol", protocols.as_str())];
    let first = connect_ws(&server, &page)
        .await
        .expect("the key as a subprotocol");
    // One place per key: a second connection waits for the first to close.
    let by_header = [("authorization", bearer.as_str())];
    assert_eq!(connect_ws(&server, &by_header).await.err(), Some(429));
    drop(first);
    let mut admitted = None;
    for _ in 0..50 {
        if let Ok(socket) = connect_ws(&server, &by_header).await {
            admitted = Some(socket);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(admitted.is_some(), "the key's place came back");
    drop(admitted);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_realtime_api_disconnects_a_client_flooding_events() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message as Frame;
    // Bursts of five seconds' worth: 100 events.
    let (server, _dir) = keyed_server(4, 20).await;
    let url = format!("ws://{}/v1/realtime", server.local_addr());
    let mut request = url.into_client_request().unwrap();
    let bearer = format!("Bearer {KEY}").parse().unwrap();
    request.headers_mut().insert("authorization", bearer);
    let (socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let (mut sink, mut stream) = socket.split();
    let flood = async move {
        for _ in 0..1000 {
            let clear = r#"{"type":"input_audio_buffer.clear"}"#;
            if sink.send(Frame::Text(clear.into())).await.is_err() {
                break;
            }
        }
    };
    let read = async {
        let mut codes = Vec::new();
        while let Some(Ok(frame)) = stream.next().await {
            if let Frame::Text(text) = frame {
                let event: serde_json::Value = serde_json::from_str(&text).unwrap();
                if event["type"] == "error" {
                    codes.push(event["error"]["code"].as_str().unwrap_or("").to_string());
                }
            }
        }
        codes
    };
    let ((), codes) = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        tokio::join!(flood, read)
    })
    .await
    .expect("the server closes the flooding connection");
    assert!(
        codes.iter().any(|c| c == "rate_limit_exceeded"),
        "{codes:?}"
    );
    server.shutdown().await.unwrap();
}

/// A server on the random models with the test's key, each client holding at most
/// `sessions_per_client` places and sending at most `messages_per_second` WebSocket messages,
/// and the folder of its random Whisper.
async fn keyed_server(
    sessions_per_client: usize,
    messages_per_second: u32,
) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 31).unwrap();
    let whisper = dir.path().to_path_buf();
    let engines = engines_from(
        move || Transcriber::load(&whisper, &LoadOptions::default()),
        || tiny_chat_model(11),
    );
    let config = ServeConfig {
        listener: random_listener_config(),
        predgen: random_predgen_config(),
        api_keys: vec![KEY.to_string()],
        sessions_per_client,
        messages_per_second,
        ..ServeConfig::default()
    };
    let server = Server::start(
        "127.0.0.1:0".parse().unwrap(),
        config,
        engines,
        copies_of(FixedLatencySynthesizer::default()),
    )
    .await
    .unwrap();
    (server, dir)
}

#[tokio::test]
async fn async_openai_chats_streams_and_transcribes() {
    use async_openai::config::OpenAIConfig;
    use async_openai::types::audio::{AudioInput, CreateTranscriptionRequestArgs};
    use async_openai::types::chat::{
        ChatCompletionRequestSystemMessageArgs, ChatCompletionRequestUserMessageArgs,
        CreateChatCompletionRequestArgs,
    };
    use futures_util::StreamExt;

    let (server, dir) = keyed_server(4, 200).await;
    let config = OpenAIConfig::new()
        .with_api_base(format!("http://{}/v1", server.local_addr()))
        .with_api_key(KEY);
    let client = async_openai::Client::with_config(config);
    let request = CreateChatCompletionRequestArgs::default()
        .model(ServeConfig::default().models.chat)
        .temperature(0.0)
        .max_completion_tokens(MAX_TOKENS as u32)
        .messages([
            ChatCompletionRequestSystemMessageArgs::default()
                .content("Answer briefly.")
                .build()
                .unwrap()
                .into(),
            ChatCompletionRequestUserMessageArgs::default()
                .content(QUESTION)
                .build()
                .unwrap()
                .into(),
        ])
        .build()
        .unwrap();
    let expected = tokio::task::spawn_blocking(plain_greedy_answer)
        .await
        .unwrap();
    let whole = client.chat().create(request.clone()).await.unwrap();
    assert_eq!(
        whole.choices[0].message.content.as_deref(),
        Some(expected.as_str())
    );
    let mut stream = client.chat().create_stream(request).await.unwrap();
    let mut streamed = String::new();
    while let Some(chunk) = stream.next().await {
        for choice in chunk.unwrap().choices {
            streamed.push_str(choice.delta.content.as_deref().unwrap_or(""));
        }
    }
    assert_eq!(streamed, expected);

    let wav = dir.path().join("question.wav");
    write_question_wav(&wav);
    let transcription = CreateTranscriptionRequestArgs::default()
        .file(AudioInput::from_vec_u8(
            "question.wav".into(),
            std::fs::read(&wav).unwrap(),
        ))
        .model("whisper-1")
        .build()
        .unwrap();
    let heard = client
        .audio()
        .transcription()
        .create(transcription)
        .await
        .unwrap();
    // The random Whisper hears the tones as some words: the endpoint gives what the engine does.
    let mut whisper = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let samples = engine_asr::Audio::read_wav(&wav).unwrap().to_16k().unwrap();
    let direct = whisper
        .transcribe(&samples, &engine_asr::TranscribeOptions::default())
        .unwrap();
    assert_eq!(heard.text, direct.text);
    server.shutdown().await.unwrap();
}

/// Transcription uploads in the formats engine-asr decodes (its FLAC and 44.1 kHz stereo
/// M4A/AAC fixtures of one real clip; `engine-asr/tests/formats.rs` checks every format): each
/// gives what the engine gives on the decoded file; an Opus file is refused as a bad request
/// that names the codec.
#[tokio::test]
async fn transcriptions_take_compressed_uploads() {
    use async_openai::config::OpenAIConfig;
    use async_openai::types::audio::{AudioInput, CreateTranscriptionRequestArgs};

    let (server, dir) = keyed_server(4, 200).await;
    let config = OpenAIConfig::new()
        .with_api_base(format!("http://{}/v1", server.local_addr()))
        .with_api_key(KEY);
    let client = async_openai::Client::with_config(config);
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine-asr/tests/data/audio");
    let mut whisper = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    let upload = |name: &str| {
        CreateTranscriptionRequestArgs::default()
            .file(AudioInput::from_vec_u8(
                name.into(),
                std::fs::read(fixtures.join(name)).unwrap(),
            ))
            .model("whisper-1")
            .build()
            .unwrap()
    };
    for name in ["cards-003.flac", "cards-003-44k-stereo.m4a"] {
        let heard = client
            .audio()
            .transcription()
            .create(upload(name))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let samples = engine_asr::Audio::read(&fixtures.join(name))
            .unwrap()
            .to_16k()
            .unwrap();
        let direct = whisper
            .transcribe(&samples, &engine_asr::TranscribeOptions::default())
            .unwrap();
        assert_eq!(heard.text, direct.text, "{name}");
    }
    let refused = client
        .audio()
        .transcription()
        .create(upload("unsupported-opus.ogg"))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("Opus"), "{refused}");
    server.shutdown().await.unwrap();
}
