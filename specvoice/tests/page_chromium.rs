//! The page of `specvoice serve` in headless Chromium (Debian's `chromium`), driven through
//! the DevTools protocol: Chromium's fake microphone plays a question spoken by espeak-ng, the
//! page streams it to a server on real weights (Whisper tiny.en, Qwen2.5-Coder 0.5B) in the
//! voice picked from the server's list, and the question and the answer must appear on the
//! page; a barge-in, then Stop, must silence the answer's audio at once, and audio arriving
//! after Stop must not play. Ignored by plain `cargo test`; CI runs it with the other
//! real-model tests after installing `chromium` and `espeak-ng`.
//! `SPECVOICE_SCREENSHOT=path.png` keeps a screenshot of the page (the README's).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_llm::PredGenConfig;
use engine_tts::espeak::{EspeakSettings, EspeakSynthesizer};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use spec_models::{Registry, Store};
use spec_voice::FixedLatencySynthesizer;
use specvoice::serve::{copies_of, load_engines_from, ServeConfig, Server, VoiceLoader, Voices};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

mod common;

/// A DevTools protocol connection to the browser, with commands sent to attached pages by
/// session (flat mode).
struct DevTools {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl DevTools {
    async fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            command["sessionId"] = json!(session);
        }
        self.socket
            .send(Message::Text(command.to_string().into()))
            .await
            .unwrap();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(30), self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("{method}: no answer from Chromium"))
                .expect("the DevTools connection closed")
                .unwrap();
            let Message::Text(text) = message else {
                continue;
            };
            let reply: Value = serde_json::from_str(&text).unwrap();
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// Evaluates `expression` in the page and returns its value.
    async fn evaluate(&mut self, session: &str, expression: &str) -> Value {
        let result = self
            .call(
                Some(session),
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }
}

/// Headless Chromium whose microphone plays `wav` once; killed when dropped.
struct Chromium {
    process: Child,
    _profile: tempfile::TempDir,
    devtools_url: String,
}

impl Chromium {
    fn launch(wav: &Path) -> Self {
        let profile = tempfile::tempdir().unwrap();
        let process = Command::new("chromium")
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                "--autoplay-policy=no-user-gesture-required",
                "--window-size=900,760",
            ])
            .arg(format!(
                "--use-file-for-fake-audio-capture={}%noloop",
                wav.display()
            ))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium (apt-get install chromium)");
        // Chromium writes its DevTools port and browser path once it listens.
        let active = profile.path().join("DevToolsActivePort");
        let started = Instant::now();
        let devtools_url = loop {
            if let Ok(text) = std::fs::read_to_string(&active) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    break format!("ws://127.0.0.1:{port}{path}");
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "Chromium did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        Self {
            process,
            _profile: profile,
            devtools_url,
        }
    }

    async fn connect(&self) -> DevTools {
        let (socket, _) = tokio_tungstenite::connect_async(&self.devtools_url)
            .await
            .unwrap();
        DevTools { socket, next_id: 0 }
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A WAV file of `text` spoken by espeak-ng at 16 kHz, with a second of silence either side.
fn spoken_wav(text: &str, path: &Path) {
    let (speech, _) = common::spoken(text, Duration::from_secs(1));
    let chunk = spec_voice::AudioChunk {
        samples: [speech, common::silence(1.0)].concat(),
        sample_rate: 16_000,
    };
    spec_voice::write_wav(path, [&chunk]).unwrap();
}

/// Decodes standard base64 (the screenshot Chromium returns).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            other => panic!("not base64: {other}"),
        }
    };
    let bytes: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for group in bytes.chunks(4) {
        let mut bits = 0u32;
        for (i, &c) in group.iter().enumerate() {
            bits |= value(c) << (18 - 6 * i);
        }
        out.extend(&bits.to_be_bytes()[1..group.len()]);
    }
    out
}

#[test]
#[ignore = "needs the real models (../shared/models/fetch), espeak-ng and chromium"]
fn the_page_answers_a_question_heard_through_the_microphone() {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("question.wav");
    spoken_wav("What should I pack for a weekend camping trip?", &wav);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = Store::new(spec_models::models_dir().unwrap(), Registry::builtin());
        let whisper = store
            .resolve("whisper-tiny.en-ct2")
            .expect("run ../shared/models/fetch")
            .dir;
        let engines = load_engines_from(whisper, "qwen2.5-coder-0.5b-instruct".to_string());
        // The server's own voice is `fixed` (silence); the page picks espeak-ng, which the
        // server loads when it is picked.
        let loads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&loads);
        let loader: VoiceLoader = Arc::new(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(copies_of(EspeakSynthesizer::new(EspeakSettings::default())?))
        });
        let tts = Voices::new("fixed", copies_of(FixedLatencySynthesizer::default()))
            .with_choices(vec!["espeak".into(), "fixed".into()], loader);
        let config = ServeConfig {
            predgen: PredGenConfig {
                max_answer_tokens: 32,
                ..PredGenConfig::default()
            },
            ..ServeConfig::default()
        };
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = Server::start(loopback, config, engines, tts).await.unwrap();
        let page = format!("http://{}/", server.local_addr());

        let chromium = Chromium::launch(&wav);
        let mut devtools = chromium.connect().await;
        let target = devtools
            .call(None, "Target.createTarget", json!({"url": page}))
            .await;
        let attached = devtools
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await;
        let session = attached["sessionId"].as_str().unwrap().to_string();
        let started = Instant::now();
        // The page has loaded, and filled its voice picker from the server's list.
        let voices = "JSON.stringify([...document.querySelectorAll('#voice option')].map(o => [o.value, o.selected]))";
        loop {
            let ready = devtools
                .evaluate(&session, "document.readyState === 'complete' && !!document.getElementById('start')")
                .await;
            if ready == json!(true) && devtools.evaluate(&session, voices).await.as_str() != Some("[[\"\",true]]") {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "the page did not load");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            devtools.evaluate(&session, voices).await,
            json!(r#"[["espeak",false],["fixed",true]]"#)
        );
        devtools
            .evaluate(
                &session,
                "document.getElementById('voice').value = 'espeak'; \
                 document.getElementById('start').click(); true",
            )
            .await;
        // The question is one you-item, the answer another with the turn's latency under it.
        let shown = loop {
            let state = devtools
                .evaluate(
                    &session,
                    "JSON.stringify({question: [...document.querySelectorAll('#log li.you')].map(e => e.textContent), \
                     done: document.querySelectorAll('#log .meta').length, \
                     errors: [...document.querySelectorAll('#log li.error')].map(e => e.textContent), \
                     status: document.getElementById('status').textContent, \
                     log: document.getElementById('log').innerText})",
                )
                .await;
            let state: Value = serde_json::from_str(state.as_str().unwrap()).unwrap();
            assert_eq!(state["errors"], json!([]), "{state}");
            if state["done"].as_u64().unwrap() >= 1 {
                break state;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no answer on the page: {state}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let question = shown["question"][0].as_str().unwrap().to_lowercase();
        assert!(question.contains("camping"), "{shown}");
        let log = shown["log"].as_str().unwrap();
        assert!(log.contains("first audio") && log.contains("ms after you stopped"), "{log}");
        // The page asked for espeak-ng, which the server loaded for it.
        assert_eq!(loads.load(Ordering::SeqCst), 1);

        let screenshot = devtools
            .call(
                Some(&session),
                "Page.captureScreenshot",
                json!({"format": "png"}),
            )
            .await;
        let png = base64_decode(screenshot["data"].as_str().unwrap());
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        if let Some(path) = std::env::var_os("SPECVOICE_SCREENSHOT").map(PathBuf::from) {
            std::fs::write(&path, &png).unwrap();
        }

        // The answer's audio is scheduled (a few seconds of it): a barge-in stops all of it at
        // once and the next audio starts from now.
        let playing = "window.specvoicePage.playingSources()";
        assert!(devtools.evaluate(&session, playing).await.as_u64().unwrap() > 0);
        let after = devtools
            .evaluate(
                &session,
                "onMessage({type: 'barge_in', at_ms: 0}); \
                 JSON.stringify([window.specvoicePage.playingSources(), playhead <= context.currentTime])",
            )
            .await;
        assert_eq!(after, json!("[0,true]"));
        // Audio of the next answer plays; Stop silences it, and audio arriving after Stop (the
        // server completes the turn in progress) does not play.
        let header = "{type: 'audio', sentence: 'x', sample_rate: 16000, samples: 16000}";
        let after = devtools
            .evaluate(
                &session,
                &format!(
                    "(() => {{ \
                       onMessage({header}); onAudio(new Int16Array(16000).buffer); \
                       const before = window.specvoicePage.playingSources(); \
                       document.getElementById('stop').click(); \
                       onMessage({header}); onAudio(new Int16Array(16000).buffer); \
                       return JSON.stringify([before, window.specvoicePage.playingSources()]); \
                     }})()"
                ),
            )
            .await;
        assert_eq!(after, json!("[1,0]"));

        drop(devtools);
        drop(chromium);
        server.shutdown().await.unwrap();
    });
}
