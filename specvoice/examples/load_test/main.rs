//! Load test of the voice server, on loopback only: the server runs in this process with the
//! real models, and each round `--sessions` WebSocket clients at once ask it a spoken question
//! (a question of the voice set, spoken by espeak-ng), streamed in real time in 20 ms frames,
//! and wait for the answer. Sessions beyond the engines wait in the server's queue, as they
//! would in production; a session's total time includes that wait.
//!
//! Per round: p50/p95 of the latency from the end of speech to the first audio of the answer
//! (as the client sees it: from sending the last voiced frame to receiving the first `audio`
//! message, the end-of-turn wait included), of the server's own `latency_ms`, and of the
//! session's total time (connect to `done`); and the process's resident memory (VmRSS) after
//! the round. Fails if a session gets no answer (a `turn_done` with text and audio), or if
//! memory after any round exceeds memory after the first round by more than
//! `--max-rss-growth-mb`: repeated rounds compress a long soak into a shorter run.
//!
//! ```sh
//! cargo run --release -p specvoice --example load_test -- [--rounds 6] [--sessions 8]
//!     [--engines 1] [--model qwen2.5-coder-0.5b-instruct] [--json PATH]
//! ```
//!
//! Then the OpenAI-compatible API on the same server ([`openai`]): streamed chat completions
//! against the plain engine in this process (time to first token, tokens/s, the same text),
//! concurrent streams, transcriptions per minute, and Realtime sessions against this protocol on
//! the same audio (`--api-questions 0`: none of it).
//!
//! With `--soak-minutes M` it runs the soak instead ([`soak`]): `--sessions` clients that never
//! stop for M minutes, chat and caption sessions with random barge-ins and disconnects, reported
//! per slice with memory and open files over time (`cargo xtask soak`).
//!
//! `cargo xtask bench serve` runs it and files the results with the machine and date.

mod openai;
mod soak;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use engine_asr::resample;
use engine_llm::PredGenConfig;
use engine_tts::espeak::{EspeakSettings, EspeakSynthesizer};
use futures_util::{SinkExt, StreamExt};
use spec_cli::init_logging;
use spec_core::report::{Report, Table};
use spec_models::{Registry, Store};
use spec_voice::SentenceSynthesizer;
use specvoice::serve::protocol::{encode_pcm, ClientMessage, ServerMessage, SessionMode};
use specvoice::serve::{copies_of, load_engines_from, ServeConfig, Server};
use specvoice::SAMPLE_RATE;
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Rounds of concurrent sessions
    #[arg(long, default_value_t = 6)]
    rounds: usize,

    /// Concurrent chat sessions per round
    #[arg(long, default_value_t = 8)]
    sessions: usize,

    /// The server's engines (copies of the models, each serving one session at a time)
    #[arg(long, default_value_t = 1)]
    engines: usize,

    /// Whisper model
    #[arg(long, default_value = "whisper-tiny.en-ct2")]
    asr: String,

    /// Chat model
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    model: String,

    /// Most tokens per answer
    #[arg(long, default_value_t = 48)]
    max_tokens: usize,

    /// Most growth of resident memory after any round over the first round, in MiB
    #[arg(long, default_value_t = 200)]
    max_rss_growth_mb: u64,

    /// The voice set (the first question of each conversation is spoken)
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../engine-llm/data/voice_questions.txt"))]
    voice_questions: PathBuf,

    /// Questions asked of the OpenAI-compatible API after the rounds (0: none)
    #[arg(long, default_value_t = 12)]
    api_questions: usize,

    /// Concurrent chat completion streams
    #[arg(long, default_value_t = 4)]
    api_streams: usize,

    /// Also write the report as JSON here
    #[arg(long)]
    json: Option<PathBuf>,

    #[command(flatten)]
    soak: soak::SoakArgs,
}

/// Silence before each question, so the endpoint detector hears the room first.
const LEAD_IN: Duration = Duration::from_millis(300);

/// Silence after each question: the end-of-speech silence and a margin.
const TRAILING: Duration = Duration::from_millis(800);

/// One audio frame: 20 ms at 16 kHz.
const FRAME: usize = 320;

/// Longest wait for any one message from the server.
const PATIENCE: Duration = Duration::from_secs(300);

/// A spoken question: its text, 16 kHz samples, and the index of the last voiced sample.
struct Question {
    text: String,
    samples: Vec<f32>,
    speech_end: usize,
}

/// What one session saw.
#[derive(Debug, Default)]
struct Outcome {
    question: String,
    transcript: Option<String>,
    answer: Option<String>,
    audio_samples: usize,
    /// Client time from the last voiced frame sent to the first `audio` received.
    first_audio_after_speech: Option<Duration>,
    /// The server's end of speech → first audio.
    server_latency: Option<Duration>,
    /// Connect to `done`.
    total: Duration,
    /// Connect to `ready`.
    queued: Duration,
    errors: Vec<String>,
}

impl Outcome {
    fn answered(&self) -> bool {
        self.answer.as_deref().is_some_and(|a| !a.trim().is_empty())
            && self.audio_samples > 0
            && self.first_audio_after_speech.is_some()
    }
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    ensure!(
        args.rounds > 0 && args.sessions > 0,
        "--rounds and --sessions must be positive"
    );
    let questions = spoken_questions(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args, questions))
}

async fn run(args: Args, questions: Vec<Arc<Question>>) -> Result<()> {
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let engines = load_engines_from(store.resolve(&args.asr)?.dir, args.model.clone());
    let tts = copies_of(EspeakSynthesizer::new(EspeakSettings::default())?);
    let config = ServeConfig {
        engines: args.engines,
        queue: args.sessions,
        // Every client comes from the loopback address, as many users behind one proxy: the
        // per-client bounds are the proxy's (twice the sessions: a client that reconnects at
        // once may find its last session still ending).
        sessions_per_client: 2 * args.sessions.max(args.api_streams),
        requests_per_minute: 60_000,
        predgen: PredGenConfig {
            max_answer_tokens: args.max_tokens,
            ..PredGenConfig::default()
        },
        ..ServeConfig::default()
    };
    let loopback: SocketAddr = "127.0.0.1:0".parse()?;
    let server = Server::start(loopback, config, engines, tts).await?;
    let addr = server.local_addr();
    let loaded_rss = rss_kib()?;
    eprintln!(
        "server on {addr}: {} engine(s), {} MiB resident",
        args.engines,
        loaded_rss / 1024
    );
    if let Some(minutes) = args.soak.soak_minutes {
        let soaked = soak::soak(addr, &questions, args.sessions, &args.soak, minutes).await?;
        server.shutdown().await?;
        let mut notes = soaked.notes;
        notes.push(format!(
            "{} engine(s) of {} + {} + espeak-ng, {} MiB resident with the models loaded.",
            args.engines,
            args.asr,
            args.model,
            loaded_rss / 1024
        ));
        return finish(
            &args,
            Report {
                command: std::env::args().collect::<Vec<_>>().join(" "),
                tables: soaked.tables,
                notes,
                details: Vec::new(),
            },
            soaked.failures,
        );
    }

    let mut rounds = Table::new(
        format!(
            "Voice server under load: {} concurrent chat sessions per round on {} engine(s), \
             {} + {} + espeak-ng, loopback",
            args.sessions, args.engines, args.asr, args.model
        ),
        &[
            "round",
            "answered",
            "end of speech → first audio p50 / p95 (ms)",
            "server latency p50 / p95 (ms)",
            "session time p50 / p95 (s)",
            "longest queue wait (s)",
            "RSS after (MiB)",
        ],
    );
    let mut details = Table::new(
        "Every session",
        &[
            "round",
            "question",
            "transcript",
            "answer",
            "first audio after speech (ms)",
            "server latency (ms)",
            "queued (s)",
            "total (s)",
            "errors",
        ],
    );
    let mut failures = Vec::new();
    let mut rss_after = Vec::new();
    for round in 1..=args.rounds {
        let started = Instant::now();
        let sessions: Vec<_> = (0..args.sessions)
            .map(|i| {
                let question = Arc::clone(&questions[i % questions.len()]);
                tokio::spawn(session(addr, question))
            })
            .collect();
        let mut outcomes = Vec::new();
        for handle in sessions {
            outcomes.push(handle.await.context("a session task")?);
        }
        let rss = rss_kib()?;
        rss_after.push(rss);
        let answered = outcomes.iter().filter(|o| o.answered()).count();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let client: Vec<f64> = outcomes
            .iter()
            .filter_map(|o| o.first_audio_after_speech.map(ms))
            .collect();
        let server_side: Vec<f64> = outcomes
            .iter()
            .filter_map(|o| o.server_latency.map(ms))
            .collect();
        let totals: Vec<f64> = outcomes.iter().map(|o| o.total.as_secs_f64()).collect();
        let longest_wait = outcomes
            .iter()
            .map(|o| o.queued.as_secs_f64())
            .fold(0.0, f64::max);
        let pair = |values: &[f64], digits: usize| match (
            percentile(values, 0.5),
            percentile(values, 0.95),
        ) {
            (Some(p50), Some(p95)) => format!("{p50:.digits$} / {p95:.digits$}"),
            _ => "–".to_string(),
        };
        rounds.push(vec![
            round.to_string(),
            format!("{answered}/{}", outcomes.len()),
            pair(&client, 0),
            pair(&server_side, 0),
            pair(&totals, 1),
            format!("{longest_wait:.1}"),
            format!("{}", rss / 1024),
        ]);
        eprintln!(
            "round {round}: {answered}/{} answered in {:.1} s; end of speech → first audio \
             p50/p95 {} ms; session p50/p95 {} s; RSS {} MiB",
            outcomes.len(),
            started.elapsed().as_secs_f64(),
            pair(&client, 0),
            pair(&totals, 1),
            rss / 1024
        );
        for outcome in &outcomes {
            let opt_ms = |d: Option<Duration>| d.map_or("–".into(), |d| format!("{:.0}", ms(d)));
            details.push(vec![
                round.to_string(),
                outcome.question.clone(),
                outcome.transcript.clone().unwrap_or_default(),
                outcome.answer.clone().unwrap_or_default(),
                opt_ms(outcome.first_audio_after_speech),
                opt_ms(outcome.server_latency),
                format!("{:.1}", outcome.queued.as_secs_f64()),
                format!("{:.1}", outcome.total.as_secs_f64()),
                outcome.errors.join("; "),
            ]);
            if !outcome.answered() {
                failures.push(format!(
                    "round {round}: no answer to \"{}\" ({})",
                    outcome.question,
                    match outcome.errors.is_empty() {
                        true => "no turn_done with text and audio".to_string(),
                        false => outcome.errors.join("; "),
                    }
                ));
            }
        }
    }
    let api_tables = match args.api_questions {
        0 => Vec::new(),
        asked => {
            let api = openai::ApiArgs {
                model: args.model.clone(),
                max_tokens: args.max_tokens,
                questions: asked,
                streams: args.api_streams,
            };
            let chat_model = ServeConfig::default().models.chat;
            openai::measure(addr, &chat_model, &questions, &api).await?
        }
    };
    server.shutdown().await?;

    let first = rss_after[0];
    let peak = rss_after.iter().copied().max().unwrap_or(first);
    let growth_mib = peak.saturating_sub(first) / 1024;
    if growth_mib > args.max_rss_growth_mb {
        failures.push(format!(
            "resident memory grew by {growth_mib} MiB after the first round (bound {} MiB)",
            args.max_rss_growth_mb
        ));
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        tables: std::iter::once(rounds).chain(api_tables).collect(),
        notes: vec![
            format!(
                "Each round, {} WebSocket clients connect at once and each streams a spoken \
                 question (espeak-ng, 16 kHz, in real time in 20 ms frames) to the server in \
                 this process, then `stop`. Sessions beyond the {} engine(s) wait in the \
                 server's queue: the session time includes that wait. End of speech → first \
                 audio is measured by the client, from sending the last voiced frame to \
                 receiving the first `audio` message, and includes the end-of-turn wait (the \
                 server's default: the semantic end of turn, 150 ms to 1.2 s of silence); the \
                 server latency is the server's own measure (`turn_done`).",
                args.sessions, args.engines
            ),
            format!(
                "Resident memory: {} MiB with the models loaded, {} MiB after the first round, \
                 {} MiB at the most after a later one ({growth_mib} MiB growth, bound {} MiB), \
                 over {} sessions in {} rounds.",
                loaded_rss / 1024,
                first / 1024,
                peak / 1024,
                args.max_rss_growth_mb,
                args.rounds * args.sessions,
                args.rounds
            ),
        ],
        details: vec![details],
    };
    finish(&args, report, failures)
}

/// Prints the report, writes it as JSON if asked, and fails on `failures`.
fn finish(args: &Args, report: Report, failures: Vec<String>) -> Result<()> {
    println!("{}", report.markdown());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    if !failures.is_empty() {
        bail!("{} failure(s):\n{}", failures.len(), failures.join("\n"));
    }
    Ok(())
}

/// One chat session: connect, wait for `ready`, stream the question in real time while
/// reading the server's messages, `stop`, read until `done`.
async fn session(addr: SocketAddr, question: Arc<Question>) -> Outcome {
    let started = Instant::now();
    let mut outcome = Outcome {
        question: question.text.clone(),
        ..Outcome::default()
    };
    if let Err(e) = converse(addr, &question, started, &mut outcome).await {
        outcome.errors.push(format!("{e:#}"));
    }
    outcome.total = started.elapsed();
    outcome
}

async fn converse(
    addr: SocketAddr,
    question: &Question,
    started: Instant,
    outcome: &mut Outcome,
) -> Result<()> {
    let (socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await?;
    let (mut sink, mut stream) = socket.split();
    let start = ClientMessage::Start {
        mode: SessionMode::Chat,
        voice: None,
    };
    sink.send(Message::Text(serde_json::to_string(&start)?.into()))
        .await?;
    loop {
        match next_message(&mut stream).await? {
            Some(ServerMessage::Ready { .. }) => break,
            Some(ServerMessage::Queued { .. }) => {}
            Some(ServerMessage::Error { code, message }) => bail!("{code:?}: {message}"),
            Some(other) => bail!("unexpected before `ready`: {other:?}"),
            None => bail!("the server closed the connection before `ready`"),
        }
    }
    outcome.queued = started.elapsed();
    let speak = async {
        let mut clock = tokio::time::interval(Duration::from_millis(20));
        let mut speech_ended = None;
        for (i, frame) in question.samples.chunks(FRAME).enumerate() {
            clock.tick().await;
            sink.send(Message::Binary(encode_pcm(frame).into())).await?;
            if speech_ended.is_none() && (i + 1) * FRAME > question.speech_end {
                speech_ended = Some(Instant::now());
            }
        }
        let stop = serde_json::to_string(&ClientMessage::Stop)?;
        sink.send(Message::Text(stop.into())).await?;
        anyhow::Ok(speech_ended)
    };
    let listen = async {
        let mut first_audio = None;
        let mut heard = Outcome::default();
        loop {
            let message = match next_message(&mut stream).await {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(e) => {
                    heard.errors.push(format!("{e:#}"));
                    break;
                }
            };
            match message {
                ServerMessage::Audio { samples, .. } => {
                    first_audio.get_or_insert_with(Instant::now);
                    heard.audio_samples += samples;
                }
                ServerMessage::Transcript { text, .. } => heard.transcript = Some(text),
                ServerMessage::TurnDone {
                    answer, latency_ms, ..
                } => {
                    heard.answer = Some(answer);
                    heard.server_latency = Some(Duration::from_millis(latency_ms));
                }
                ServerMessage::Error { code, message } => {
                    heard.errors.push(format!("{code:?}: {message}"));
                }
                ServerMessage::Done => break,
                _ => {}
            }
        }
        (first_audio, heard)
    };
    let (spoken, (first_audio, heard)) = tokio::join!(speak, listen);
    let speech_ended = spoken?;
    outcome.transcript = heard.transcript;
    outcome.answer = heard.answer;
    outcome.audio_samples = heard.audio_samples;
    outcome.server_latency = heard.server_latency;
    outcome.errors.extend(heard.errors);
    if let (Some(end), Some(audio)) = (speech_ended, first_audio) {
        outcome.first_audio_after_speech = Some(audio.saturating_duration_since(end));
    }
    Ok(())
}

/// The next text message (binary audio is skipped: its header counts the samples); `None`
/// once the connection is closed.
async fn next_message<S>(stream: &mut S) -> Result<Option<ServerMessage>>
where
    S: futures_util::Stream<Item = tokio_tungstenite::tungstenite::Result<Message>> + Unpin,
{
    loop {
        let next = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .context("no message from the server in time")?;
        match next {
            None | Some(Ok(Message::Close(_))) => return Ok(None),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(Message::Text(text))) => {
                return Ok(Some(
                    serde_json::from_str(&text).with_context(|| text.to_string())?,
                ))
            }
            Some(Ok(_)) => {}
        }
    }
}

/// The nearest-rank percentile `p` (0 to 1) of `values`.
fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// The process's resident memory, in KiB.
fn rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS in /proc/self/status")?;
    let kib = line
        .split_whitespace()
        .nth(1)
        .context("VmRSS without a value")?;
    Ok(kib.parse()?)
}

/// The first `--sessions` (or `--api-questions`, if more) questions of the voice set, spoken by espeak-ng at 16 kHz with
/// silence before and after.
fn spoken_questions(args: &Args) -> Result<Vec<Arc<Question>>> {
    let mut espeak = EspeakSynthesizer::new(EspeakSettings::default())?;
    let texts = spec_voice::read_conversations(&args.voice_questions)?
        .into_iter()
        .map(|conversation| conversation[0].clone())
        .collect::<Vec<_>>();
    let rate = f64::from(SAMPLE_RATE);
    let lead = (LEAD_IN.as_secs_f64() * rate) as usize;
    let trailing = (TRAILING.as_secs_f64() * rate) as usize;
    texts
        .into_iter()
        .take(args.sessions.max(args.api_questions))
        .map(|text| {
            let audio = espeak.synthesize(&text)?.joined()?;
            let speech = resample(&audio.samples, audio.sample_rate, SAMPLE_RATE)?;
            let voiced_end = speech
                .iter()
                .rposition(|s| s.abs() > 0.01)
                .context("espeak-ng gave silence")?;
            let samples = [vec![0.0; lead], speech, vec![0.0; trailing]].concat();
            Ok(Arc::new(Question {
                text,
                samples,
                speech_end: lead + voiced_end,
            }))
        })
        .collect()
}
