//! The downloader against a local HTTP server started by each test: resuming after a cut
//! connection, rejecting a wrong checksum, timing out on a server that never answers.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spec_models::download::{DownloadOptions, Downloader, Progress, Silent};
use spec_models::{sha256_file, Error, Registry, Store};

/// How the server treats requests.
#[derive(Clone, Copy)]
enum Behaviour {
    Serve,
    /// The first response announces the whole file but the connection closes after this many
    /// bytes of it.
    CutFirstAfter(usize),
    /// Accepts connections and never answers.
    Silent,
    Status(u16),
}

#[derive(Clone)]
struct Request {
    path: String,
    headers: HashMap<String, String>,
}

struct Server {
    endpoint: String,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Server {
    fn start(files: HashMap<String, Vec<u8>>, behaviour: Behaviour) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        std::thread::spawn(move || {
            let mut served = 0;
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if let Behaviour::Silent = behaviour {
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_secs(60));
                        drop(stream);
                    });
                    continue;
                }
                let Some(request) = read_request(&stream) else {
                    continue;
                };
                let cut = match behaviour {
                    Behaviour::CutFirstAfter(n) if served == 0 => Some(n),
                    _ => None,
                };
                served += 1;
                // Logged before the answer, so a client that has its answer sees its request.
                log.lock().unwrap().push(request.clone());
                respond(stream, &request, &files, behaviour, cut);
            }
        });
        Server { endpoint, requests }
    }

    fn ranges(&self) -> Vec<Option<String>> {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .map(|r| r.headers.get("range").cloned())
            .collect()
    }
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    Some(Request { path, headers })
}

fn respond(
    mut stream: TcpStream,
    request: &Request,
    files: &HashMap<String, Vec<u8>>,
    behaviour: Behaviour,
    cut: Option<usize>,
) {
    if let Behaviour::Status(code) = behaviour {
        let _ = write!(
            stream,
            "HTTP/1.1 {code} Nope\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return;
    }
    let Some(body) = files.get(&request.path) else {
        let _ = write!(
            stream,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return;
    };
    let start: usize = request
        .headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
        .unwrap_or(0);
    let rest = &body[start.min(body.len())..];
    let head = if start > 0 {
        format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{}\r\nConnection: close\r\n\r\n",
            rest.len(),
            body.len() - 1,
            body.len()
        )
    } else {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            rest.len()
        )
    };
    let _ = stream.write_all(head.as_bytes());
    let sent = cut.map_or(rest.len(), |n| n.min(rest.len()));
    let _ = stream.write_all(&rest[..sent]);
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn content(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn sha(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, bytes).unwrap();
    sha256_file(&path).unwrap()
}

/// A registry with one model of two files, pinned to `pinned_sha` for the weights.
fn registry(weights: &[u8], pinned_sha: &str) -> Registry {
    Registry::parse(&format!(
        r#"
[[model]]
name = "tiny"
kind = "chat-llm"
format = "gguf"
description = "test"
repo = "owner/tiny"
revision = "abc123"
files = [
  {{ remote = "tiny-q4.gguf", local = "model.gguf", size = {}, sha256 = "{pinned_sha}" }},
  {{ remote = "README.md" }},
]
"#,
        weights.len()
    ))
    .unwrap()
}

fn files(weights: &[u8]) -> HashMap<String, Vec<u8>> {
    HashMap::from([
        (
            "/owner/tiny/resolve/abc123/tiny-q4.gguf".to_string(),
            weights.to_vec(),
        ),
        (
            "/owner/tiny/resolve/abc123/README.md".to_string(),
            b"# tiny".to_vec(),
        ),
    ])
}

fn options(endpoint: &str) -> DownloadOptions {
    DownloadOptions {
        endpoint: endpoint.to_string(),
        token: None,
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(2),
        attempts: 3,
        retry_pause: Duration::from_millis(10),
    }
}

/// Records what the downloader reports.
#[derive(Default)]
struct Recorder {
    starts: Vec<(String, Option<u64>, u64)>,
    bytes: u64,
    retries: usize,
}

impl Progress for Recorder {
    fn start(&mut self, file: &str, total: Option<u64>, done: u64) {
        self.starts.push((file.to_string(), total, done));
    }
    fn advance(&mut self, bytes: u64) {
        self.bytes += bytes;
    }
    fn retry(&mut self, _file: &str, _reason: &str) {
        self.retries += 1;
    }
}

#[test]
fn a_model_is_downloaded_verified_and_then_skipped() {
    let weights = content(300_000);
    let registry = registry(&weights, &sha(&weights));
    let server = Server::start(files(&weights), Behaviour::Serve);
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let downloader = Downloader::new(options(&server.endpoint));
    let entry = registry.get("tiny").unwrap();
    let mut progress = Recorder::default();
    let model = downloader.download(&store, entry, &mut progress).unwrap();
    assert_eq!(
        std::fs::read(model.file("model.gguf").unwrap()).unwrap(),
        weights
    );
    assert_eq!(
        std::fs::read(model.file("README.md").unwrap()).unwrap(),
        b"# tiny"
    );
    assert_eq!(progress.bytes, weights.len() as u64 + 6);
    assert_eq!(
        progress.starts[0],
        ("model.gguf".into(), Some(weights.len() as u64), 0)
    );
    assert!(!root.path().join("tiny/model.gguf.partial").exists());

    // Present and verified: nothing is requested again; the resolver finds it offline.
    let requests_before = server.ranges().len();
    downloader.download(&store, entry, &mut Silent).unwrap();
    assert_eq!(server.ranges().len(), requests_before);
    assert_eq!(store.resolve("tiny").unwrap(), model);
}

#[test]
fn a_cut_download_resumes_where_it_stopped() {
    let weights = content(500_000);
    let registry = registry(&weights, &sha(&weights));
    let server = Server::start(files(&weights), Behaviour::CutFirstAfter(123_457));
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let entry = registry.get("tiny").unwrap();

    // One try only: the cut leaves the partial file, never a file under the final name.
    let single = Downloader::new(DownloadOptions {
        attempts: 1,
        ..options(&server.endpoint)
    });
    let err = single.download(&store, entry, &mut Silent).unwrap_err();
    assert!(matches!(err, Error::Download { .. }), "{err:?}");
    assert!(!root.path().join("tiny/model.gguf").exists());
    let partial = root.path().join("tiny/model.gguf.partial");
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), 123_457);
    let text = store.resolve("tiny").unwrap_err().to_string();
    assert!(text.contains("interrupted download"), "{text}");

    // The next run asks only for the rest.
    let mut progress = Recorder::default();
    let downloader = Downloader::new(options(&server.endpoint));
    let model = downloader.download(&store, entry, &mut progress).unwrap();
    assert_eq!(
        std::fs::read(model.file("model.gguf").unwrap()).unwrap(),
        weights
    );
    assert_eq!(server.ranges()[1].as_deref(), Some("bytes=123457-"));
    assert_eq!(
        progress.starts[0],
        ("model.gguf".into(), Some(500_000), 123_457)
    );
    assert_eq!(progress.bytes, 500_000 - 123_457 + 6);
}

#[test]
fn a_cut_is_retried_within_one_download() {
    let weights = content(200_000);
    let registry = registry(&weights, &sha(&weights));
    let server = Server::start(files(&weights), Behaviour::CutFirstAfter(50_000));
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let mut progress = Recorder::default();
    let model = Downloader::new(options(&server.endpoint))
        .download(&store, registry.get("tiny").unwrap(), &mut progress)
        .unwrap();
    assert_eq!(
        std::fs::read(model.file("model.gguf").unwrap()).unwrap(),
        weights
    );
    assert_eq!(progress.retries, 1);
    assert_eq!(server.ranges()[1].as_deref(), Some("bytes=50000-"));
}

#[test]
fn a_checksum_mismatch_is_rejected_and_nothing_is_kept() {
    let weights = content(100_000);
    let registry = registry(&weights, &sha(b"something else"));
    let server = Server::start(files(&weights), Behaviour::Serve);
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let err = Downloader::new(options(&server.endpoint))
        .download(&store, registry.get("tiny").unwrap(), &mut Silent)
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("checksum mismatch"), "{text}");
    assert!(text.contains("cannot download `tiny`"), "{text}");
    assert!(!root.path().join("tiny/model.gguf").exists());
    assert!(!root.path().join("tiny/model.gguf.partial").exists());
}

#[test]
fn a_server_that_never_answers_times_out() {
    let weights = content(1000);
    let registry = registry(&weights, &sha(&weights));
    let server = Server::start(files(&weights), Behaviour::Silent);
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let downloader = Downloader::new(DownloadOptions {
        read_timeout: Duration::from_millis(500),
        attempts: 2,
        ..options(&server.endpoint)
    });
    let started = Instant::now();
    let err = downloader
        .download(&store, registry.get("tiny").unwrap(), &mut Silent)
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(text.contains("timed out"), "{text}");
    assert!(text.contains("after 2 tries"), "{text}");
    assert!(text.contains("Place these files"), "{text}");
    assert!(!root.path().join("tiny/model.gguf").exists());
}

#[test]
fn nothing_listening_is_a_clear_error() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let weights = content(10);
    let registry = registry(&weights, &sha(&weights));
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let err = Downloader::new(options(&format!("http://127.0.0.1:{port}")))
        .download(&store, registry.get("tiny").unwrap(), &mut Silent)
        .unwrap_err();
    assert!(matches!(err, Error::Download { .. }), "{err:?}");
    assert!(err
        .to_string()
        .contains(&root.path().join("tiny").display().to_string()));
}

#[test]
fn gated_models_send_the_token_and_explain_refusals() {
    let weights = content(1000);
    let registry = registry(&weights, &sha(&weights));
    let server = Server::start(files(&weights), Behaviour::Serve);
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let with_token = DownloadOptions {
        token: Some("hf_secret".into()),
        ..options(&server.endpoint)
    };
    Downloader::new(with_token)
        .download(&store, registry.get("tiny").unwrap(), &mut Silent)
        .unwrap();
    let requests = server.requests.lock().unwrap();
    assert_eq!(
        requests[0].headers.get("authorization").map(String::as_str),
        Some("Bearer hf_secret")
    );
    assert_eq!(requests[0].path, "/owner/tiny/resolve/abc123/tiny-q4.gguf");
    drop(requests);

    let refusing = Server::start(files(&weights), Behaviour::Status(401));
    let other = tempfile::tempdir().unwrap();
    let store = Store::new(other.path(), &registry);
    let err = Downloader::new(options(&refusing.endpoint))
        .download(&store, registry.get("tiny").unwrap(), &mut Silent)
        .unwrap_err();
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");
    // Refusals are not retried.
    assert_eq!(refusing.requests.lock().unwrap().len(), 1);
}

#[test]
fn a_missing_remote_file_is_not_retried() {
    let weights = content(1000);
    let registry = registry(&weights, &sha(&weights));
    let mut served = files(&weights);
    served.remove("/owner/tiny/resolve/abc123/README.md");
    let server = Server::start(served, Behaviour::Serve);
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let err = Downloader::new(options(&server.endpoint))
        .download(&store, registry.get("tiny").unwrap(), &mut Silent)
        .unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
    // The weights that did arrive are kept, verified.
    assert!(root.path().join("tiny/model.gguf").is_file());
    let mut buf = Vec::new();
    std::fs::File::open(root.path().join("tiny/model.gguf"))
        .unwrap()
        .read_to_end(&mut buf)
        .unwrap();
    assert_eq!(buf, weights);
    assert_eq!(server.requests.lock().unwrap().len(), 2);
}

#[test]
fn a_file_kept_elsewhere_is_fetched_from_its_own_address_without_the_token() {
    let weights = content(2000);
    let hub = Server::start(files(&weights), Behaviour::Serve);
    let elsewhere = Server::start(
        HashMap::from([("/releases/v1/voice.bin".to_string(), b"voice".to_vec())]),
        Behaviour::Serve,
    );
    let registry = Registry::parse(&format!(
        r#"
[[model]]
name = "tiny"
kind = "tts"
format = "onnx"
description = "test"
repo = "owner/tiny"
revision = "abc123"
files = [
  {{ remote = "tiny-q4.gguf", local = "model.gguf", size = {}, sha256 = "{}" }},
  {{ url = "{}/releases/v1/voice.bin", local = "voices/a.bin", size = 5 }},
]
"#,
        weights.len(),
        sha(&weights),
        elsewhere.endpoint
    ))
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let with_token = DownloadOptions {
        token: Some("hf_secret".into()),
        ..options(&hub.endpoint)
    };
    let model = Downloader::new(with_token)
        .download(&store, registry.get("tiny").unwrap(), &mut Silent)
        .unwrap();
    assert_eq!(
        std::fs::read(model.file("a.bin").unwrap()).unwrap(),
        b"voice"
    );
    let to_hub = hub.requests.lock().unwrap();
    assert_eq!(to_hub.len(), 1);
    assert!(to_hub[0].headers.contains_key("authorization"));
    let to_elsewhere = elsewhere.requests.lock().unwrap();
    assert_eq!(to_elsewhere.len(), 1);
    assert_eq!(to_elsewhere[0].path, "/releases/v1/voice.bin");
    assert!(!to_elsewhere[0].headers.contains_key("authorization"));
}

#[test]
fn an_entry_placed_by_hand_is_never_downloaded() {
    let registry = Registry::parse(
        r#"
[[model]]
name = "runtime"
kind = "runtime"
format = "shared-library"
description = "test"
repo = "owner/runtime"
revision = "v1"
manual = "Unpack lib/libx.so from https://example.org/x-v1.tgz."
files = [{ remote = "x-v1/lib/libx.so.1", local = "libx.so", size = 3 }]
"#,
    )
    .unwrap();
    let server = Server::start(HashMap::new(), Behaviour::Serve);
    let root = tempfile::tempdir().unwrap();
    let store = Store::new(root.path(), &registry);
    let entry = registry.get("runtime").unwrap();
    let downloader = Downloader::new(options(&server.endpoint));
    let err = downloader.download(&store, entry, &mut Silent).unwrap_err();
    assert!(matches!(err, Error::ManualOnly { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("https://example.org/x-v1.tgz"), "{text}");
    assert!(text.contains("libx.so"), "{text}");
    assert!(server.requests.lock().unwrap().is_empty());

    // Placed by hand, it resolves; a wrong copy is still told apart.
    std::fs::create_dir_all(root.path().join("runtime")).unwrap();
    std::fs::write(root.path().join("runtime/libx.so"), b"elf").unwrap();
    let files = downloader.download(&store, entry, &mut Silent).unwrap();
    assert!(files.file("libx.so").is_some());
    std::fs::write(root.path().join("runtime/libx.so"), b"elf64").unwrap();
    assert!(matches!(
        downloader.download(&store, entry, &mut Silent),
        Err(Error::WrongSize { .. })
    ));
    assert!(server.requests.lock().unwrap().is_empty());
}
