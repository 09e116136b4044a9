//! The soak (`--soak-minutes M`): `--sessions` clients that never stop for M minutes, as a
//! server in production would see them. Every client streams audio in real time (20 ms frames,
//! silence between questions, as a microphone does); three in four hold chat sessions of one
//! to three spoken questions, the others caption sessions. At random (seeded) a client speaks
//! over the answer (a barge-in: its next question starts at the answer's first audio) or drops
//! the connection at the first audio without a word. Sessions beyond the engines wait in the
//! server's queue, which has room for them all: a refusal is an error.
//!
//! Per slice of the run: turns, errors, barge-ins and disconnects, the p50/p95 latency from the
//! end of speech to the first answer audio (chat) and to the final caption (captions), the
//! process's resident memory and open files. A sampler records memory and open files every few
//! seconds for the plot. Fails on any error, on memory growing more than `--max-rss-growth`
//! after the first slice (the warm-up), and on a last slice whose chat p95 exceeds the first's
//! by more than `--max-p95-drift`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spec_core::report::Table;
use specvoice::serve::protocol::{encode_pcm, ClientMessage, ServerMessage, SessionMode};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::{percentile, rss_kib, Question, FRAME};

/// The soak's settings (of `load_test`'s command line).
#[derive(clap::Args, Clone, Debug)]
pub struct SoakArgs {
    /// Run the soak for this many minutes instead of the rounds
    #[arg(long)]
    pub soak_minutes: Option<f64>,

    /// Slices the soak is reported in
    #[arg(long, default_value_t = 6)]
    pub slices: usize,

    /// Chance that a chat client speaks over an answer (a barge-in)
    #[arg(long, default_value_t = 0.15)]
    pub barge_in_chance: f64,

    /// Chance that a client drops the connection at an answer's first audio
    #[arg(long, default_value_t = 0.08)]
    pub disconnect_chance: f64,

    /// Seed of the clients' random choices
    #[arg(long, default_value_t = 7)]
    pub seed: u64,

    /// Most growth of resident memory over the first slice's end, in percent
    #[arg(long, default_value_t = 5.0)]
    pub max_rss_growth: f64,

    /// Most growth of the chat p95 latency from the first slice to the last, in percent
    #[arg(long, default_value_t = 10.0)]
    pub max_p95_drift: f64,

    /// Where the plot of memory, open files and latency over time goes
    #[arg(long, default_value = "results/soak.svg")]
    pub plot: PathBuf,
}

/// How long a client waits for the answer it expects before it counts an error.
const ANSWER_PATIENCE: Duration = Duration::from_secs(90);

/// How long a client waits in the server's queue before it counts an error.
const QUEUE_PATIENCE: Duration = Duration::from_secs(600);

/// How long a client waits after an error before its next session.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How often the sampler reads memory and open files.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// The caption sessions' target language.
const CAPTION_LANGUAGE: &str = "German";

/// What happened, when (from the soak's start).
#[derive(Clone, Debug)]
enum Happening {
    /// End of speech → first answer audio.
    ChatTurn(Duration),
    /// End of speech → the utterance's final caption.
    Caption(Duration),
    BargeIn,
    Disconnect,
    SessionDone,
    Error(String),
}

type Log = Arc<Mutex<Vec<(Duration, Happening)>>>;

/// One reading of the sampler.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Duration,
    rss_kib: u64,
    open_files: usize,
}

/// What the soak reports: its tables, notes, and the failures against its bounds.
pub struct Soaked {
    pub tables: Vec<Table>,
    pub notes: Vec<String>,
    pub failures: Vec<String>,
}

pub async fn soak(
    addr: SocketAddr,
    questions: &[Arc<Question>],
    sessions: usize,
    args: &SoakArgs,
    minutes: f64,
) -> Result<Soaked> {
    let run = Duration::from_secs_f64(minutes * 60.0);
    let started = Instant::now();
    let log: Log = Arc::default();
    let clients: Vec<_> = (0..sessions)
        .map(|i| {
            let client = Client {
                addr,
                questions: questions.to_vec(),
                captions: i % 4 == 3,
                rng: StdRng::seed_from_u64(args.seed.wrapping_add(i as u64)),
                barge_in_chance: args.barge_in_chance,
                disconnect_chance: args.disconnect_chance,
                started,
                log: Arc::clone(&log),
            };
            tokio::spawn(client.run_until(started + run))
        })
        .collect();
    let sampler = tokio::spawn(sample(started, started + run));
    for client in clients {
        client.await.context("a soak client")?;
    }
    let samples = sampler.await.context("the sampler")??;
    let happenings = log
        .lock()
        .map_err(|_| anyhow::anyhow!("log poisoned"))?
        .clone();
    report(&happenings, &samples, run, args, sessions)
}

/// Memory and open files every [`SAMPLE_EVERY`] until `until`.
async fn sample(started: Instant, until: Instant) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    let mut clock = tokio::time::interval(SAMPLE_EVERY);
    loop {
        clock.tick().await;
        samples.push(Sample {
            at: started.elapsed(),
            rss_kib: rss_kib()?,
            open_files: std::fs::read_dir("/proc/self/fd")?.count(),
        });
        if Instant::now() >= until {
            return Ok(samples);
        }
    }
}

struct Client {
    addr: SocketAddr,
    questions: Vec<Arc<Question>>,
    captions: bool,
    rng: StdRng,
    barge_in_chance: f64,
    disconnect_chance: f64,
    started: Instant,
    log: Log,
}

type Sink = SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Message>;

/// A server message and when it arrived.
type Heard = (Instant, ServerMessage);

/// How a session ended.
enum Ending {
    /// `stop` sent and `done` received.
    Done,
    /// The client dropped the connection on purpose.
    Dropped,
}

impl Client {
    fn note(&self, happening: Happening) {
        if let Ok(mut log) = self.log.lock() {
            log.push((self.started.elapsed(), happening));
        }
    }

    async fn run_until(mut self, until: Instant) {
        while Instant::now() < until {
            match self.session(until).await {
                Ok(Ending::Done) => self.note(Happening::SessionDone),
                Ok(Ending::Dropped) => self.note(Happening::Disconnect),
                Err(e) => {
                    self.note(Happening::Error(format!("{e:#}")));
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
        }
    }

    /// One session: connect, `start`, wait for `ready`, one to three questions, `stop`, `done`.
    async fn session(&mut self, until: Instant) -> Result<Ending> {
        let (socket, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", self.addr))
            .await
            .context("connecting")?;
        let (mut sink, mut stream) = socket.split();
        let (heard_tx, mut heard) = mpsc::unbounded_channel::<Heard>();
        let reader = tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                match message {
                    Ok(Message::Text(text)) => {
                        let parsed = serde_json::from_str::<ServerMessage>(&text)
                            .with_context(|| text.to_string())?;
                        if heard_tx.send((Instant::now(), parsed)).is_err() {
                            break;
                        }
                    }
                    Ok(Message::Close(_)) => break,
                    Ok(_) => {}
                    Err(e) => return Err(anyhow::Error::from(e).context("reading")),
                }
            }
            anyhow::Ok(())
        });
        let mode = match self.captions {
            true => SessionMode::Caption {
                to: CAPTION_LANGUAGE.to_string(),
            },
            false => SessionMode::Chat,
        };
        let start = ClientMessage::Start { mode, voice: None };
        sink.send(Message::Text(serde_json::to_string(&start)?.into()))
            .await?;
        let admitted_by = Instant::now() + QUEUE_PATIENCE;
        loop {
            let next = tokio::time::timeout_at(admitted_by.into(), heard.recv())
                .await
                .context("no `ready` in time")?;
            match next.map(|(_, m)| m) {
                Some(ServerMessage::Ready { .. }) => break,
                Some(ServerMessage::Queued { .. }) => {}
                Some(ServerMessage::Error { code, message }) => bail!("{code:?}: {message}"),
                Some(other) => bail!("unexpected before `ready`: {other:?}"),
                None => bail!("closed before `ready`: {:?}", reader.await),
            }
        }
        let mut stream = Stream {
            sink,
            heard,
            clock: tokio::time::interval(Duration::from_millis(20)),
            sent: 0,
        };
        let turns = self.rng.random_range(1..=3);
        let mut turn = 0;
        while turn < turns && Instant::now() < until {
            let question =
                Arc::clone(&self.questions[self.rng.random_range(0..self.questions.len())]);
            let outcome = match self.captions {
                true => self.caption_turn(&mut stream, &question).await?,
                false => {
                    self.chat_turn(&mut stream, &question, turn + 1 < turns)
                        .await?
                }
            };
            match outcome {
                TurnEnd::Answered => {}
                TurnEnd::BargedIn => self.note(Happening::BargeIn),
                TurnEnd::Drop => {
                    reader.abort();
                    return Ok(Ending::Dropped);
                }
            }
            turn += 1;
        }
        let stop = serde_json::to_string(&ClientMessage::Stop)?;
        stream.sink.send(Message::Text(stop.into())).await?;
        let deadline = Instant::now() + ANSWER_PATIENCE;
        loop {
            let next = tokio::time::timeout_at(deadline.into(), stream.heard.recv())
                .await
                .context("no `done` in time after `stop`")?;
            match next.map(|(_, m)| m) {
                Some(ServerMessage::Done) => break,
                Some(ServerMessage::Error { code, message }) => bail!("{code:?}: {message}"),
                Some(_) => {}
                None => bail!("closed before `done`: {:?}", reader.await),
            }
        }
        drop(stream);
        reader.await.context("the reader")??;
        Ok(Ending::Done)
    }

    /// Speaks `question`, then waits (streaming silence) for the answer's first audio and the
    /// turn's end. At the first audio the client may drop the connection, or, if `more` turns
    /// follow, speak over the answer: the next question then starts at once.
    async fn chat_turn(
        &mut self,
        stream: &mut Stream,
        question: &Question,
        more: bool,
    ) -> Result<TurnEnd> {
        let (speech_end, speech_end_ms) = stream.speak(question).await?;
        let deadline = Instant::now() + ANSWER_PATIENCE;
        let mut first_audio = false;
        loop {
            let heard = stream.silence_until_heard(deadline).await?;
            match heard {
                (_, ServerMessage::Error { code, message }) => bail!("{code:?}: {message}"),
                (at, ServerMessage::Audio { .. }) if !first_audio && at >= speech_end => {
                    first_audio = true;
                    self.note(Happening::ChatTurn(at - speech_end));
                    if self.rng.random_bool(self.disconnect_chance) {
                        return Ok(TurnEnd::Drop);
                    }
                    if more && self.rng.random_bool(self.barge_in_chance) {
                        return Ok(TurnEnd::BargedIn);
                    }
                }
                (
                    _,
                    ServerMessage::TurnDone {
                        speech_end_ms: end, ..
                    },
                ) if end + 300 >= speech_end_ms => {
                    if !first_audio {
                        bail!("a turn ended without audio after the end of speech");
                    }
                    return Ok(TurnEnd::Answered);
                }
                _ => {}
            }
        }
    }

    /// Speaks `question`, then waits (streaming silence) for its final caption.
    async fn caption_turn(&mut self, stream: &mut Stream, question: &Question) -> Result<TurnEnd> {
        let (speech_end, speech_end_ms) = stream.speak(question).await?;
        let deadline = Instant::now() + ANSWER_PATIENCE;
        loop {
            match stream.silence_until_heard(deadline).await? {
                (_, ServerMessage::Error { code, message }) => bail!("{code:?}: {message}"),
                (
                    at,
                    ServerMessage::Caption {
                        is_final: true,
                        at_ms,
                        ..
                    },
                ) if at_ms + 300 >= speech_end_ms => {
                    self.note(Happening::Caption(at.saturating_duration_since(speech_end)));
                    return Ok(match self.rng.random_bool(self.disconnect_chance) {
                        true => TurnEnd::Drop,
                        false => TurnEnd::Answered,
                    });
                }
                _ => {}
            }
        }
    }
}

/// How a turn ended.
enum TurnEnd {
    Answered,
    BargedIn,
    Drop,
}

/// A session's audio going out in real time, and its messages coming in.
struct Stream {
    sink: Sink,
    heard: mpsc::UnboundedReceiver<Heard>,
    clock: tokio::time::Interval,
    /// Samples sent since `ready`.
    sent: usize,
}

impl Stream {
    async fn frame(&mut self, samples: &[f32]) -> Result<()> {
        self.clock.tick().await;
        self.sink
            .send(Message::Binary(encode_pcm(samples).into()))
            .await
            .context("sending audio")?;
        self.sent += samples.len();
        Ok(())
    }

    /// Streams `question` in real time; returns when its last voiced frame went out, in wall
    /// time and in the stream's milliseconds. Messages heard meanwhile stay queued.
    async fn speak(&mut self, question: &Question) -> Result<(Instant, u64)> {
        let mut speech_end = None;
        for (i, frame) in question.samples.chunks(FRAME).enumerate() {
            self.frame(frame).await?;
            if speech_end.is_none() && (i + 1) * FRAME > question.speech_end {
                let ms = (self.sent as u64 * 1000) / u64::from(specvoice::SAMPLE_RATE);
                speech_end = Some((Instant::now(), ms));
            }
        }
        speech_end.context("a question without speech")
    }

    /// Streams silence until a message arrives (or fails at `deadline`).
    async fn silence_until_heard(&mut self, deadline: Instant) -> Result<Heard> {
        let silence = [0.0f32; FRAME];
        loop {
            if let Ok(heard) = self.heard.try_recv() {
                return Ok(heard);
            }
            if Instant::now() >= deadline {
                bail!("no answer within {} s", ANSWER_PATIENCE.as_secs());
            }
            self.frame(&silence).await?;
            if self.heard.is_closed() && self.heard.is_empty() {
                bail!("the server closed the connection in a turn");
            }
        }
    }
}

/// The soak's tables and bounds from what the clients and the sampler saw.
fn report(
    happenings: &[(Duration, Happening)],
    samples: &[Sample],
    run: Duration,
    args: &SoakArgs,
    sessions: usize,
) -> Result<Soaked> {
    let slices = args.slices.max(1);
    let slice_len = run.as_secs_f64() / slices as f64;
    let slice_of = |at: Duration| ((at.as_secs_f64() / slice_len) as usize).min(slices - 1);
    let mut table = Table::new(
        format!(
            "Soak: {sessions} clients for {:.0} min, real-time audio, chat and caption sessions, \
             random barge-ins and disconnects",
            run.as_secs_f64() / 60.0
        ),
        &[
            "minutes",
            "chat turns",
            "chat end of speech → first audio p50 / p95 (ms)",
            "captions",
            "end of speech → final caption p50 / p95 (ms)",
            "barge-ins",
            "disconnects",
            "sessions done",
            "errors",
            "RSS at the end (MiB)",
            "open files at the end",
        ],
    );
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let pair = |values: &[f64]| match (percentile(values, 0.5), percentile(values, 0.95)) {
        (Some(p50), Some(p95)) => format!("{p50:.0} / {p95:.0}"),
        _ => "–".to_string(),
    };
    let mut chat_p95 = Vec::new();
    let mut slice_rss = Vec::new();
    for slice in 0..slices {
        let here: Vec<&Happening> = happenings
            .iter()
            .filter(|(at, _)| slice_of(*at) == slice)
            .map(|(_, h)| h)
            .collect();
        let chat: Vec<f64> = here
            .iter()
            .filter_map(|h| match h {
                Happening::ChatTurn(d) => Some(ms(d)),
                _ => None,
            })
            .collect();
        let captions: Vec<f64> = here
            .iter()
            .filter_map(|h| match h {
                Happening::Caption(d) => Some(ms(d)),
                _ => None,
            })
            .collect();
        let count = |f: fn(&Happening) -> bool| here.iter().filter(|h| f(h)).count();
        let end = Duration::from_secs_f64((slice + 1) as f64 * slice_len);
        let last_sample = samples
            .iter()
            .rev()
            .find(|s| s.at <= end)
            .or(samples.last())
            .context("no memory sample")?;
        chat_p95.push(percentile(&chat, 0.95));
        slice_rss.push(last_sample.rss_kib);
        table.push(vec![
            format!(
                "{:.0}–{:.0}",
                slice as f64 * slice_len / 60.0,
                end.as_secs_f64() / 60.0
            ),
            chat.len().to_string(),
            pair(&chat),
            captions.len().to_string(),
            pair(&captions),
            count(|h| matches!(h, Happening::BargeIn)).to_string(),
            count(|h| matches!(h, Happening::Disconnect)).to_string(),
            count(|h| matches!(h, Happening::SessionDone)).to_string(),
            count(|h| matches!(h, Happening::Error(_))).to_string(),
            (last_sample.rss_kib / 1024).to_string(),
            last_sample.open_files.to_string(),
        ]);
    }
    let mut failures: Vec<String> = happenings
        .iter()
        .filter_map(|(at, h)| match h {
            Happening::Error(e) => Some(format!("at {:.0} s: {e}", at.as_secs_f64())),
            _ => None,
        })
        .collect();
    let warm = slice_rss[0];
    let peak_after = samples
        .iter()
        .filter(|s| s.at.as_secs_f64() > slice_len)
        .map(|s| s.rss_kib)
        .max()
        .unwrap_or(warm);
    let growth = (peak_after as f64 / warm as f64 - 1.0) * 100.0;
    if growth > args.max_rss_growth {
        failures.push(format!(
            "resident memory grew {growth:.1} % after the first slice (bound {} %)",
            args.max_rss_growth
        ));
    }
    let drift = match (chat_p95.first(), chat_p95.last()) {
        (Some(Some(first)), Some(Some(last))) => Some((last / first - 1.0) * 100.0),
        _ => None,
    };
    match drift {
        Some(drift) if drift > args.max_p95_drift => failures.push(format!(
            "the last slice's chat p95 is {drift:.1} % above the first's (bound {} %)",
            args.max_p95_drift
        )),
        Some(_) => {}
        None => failures.push("a slice without chat turns: no p95 to compare".to_string()),
    }
    let files: Vec<usize> = samples.iter().map(|s| s.open_files).collect();
    let notes = vec![
        format!(
            "Resident memory at the end of the first slice (the warm-up) {} MiB, at the most \
             afterwards {} MiB ({growth:+.1} %, bound {} %). Open files between {} and {} over \
             {} samples. The last slice's chat p95 is {} the first's (bound +{} %).",
            warm / 1024,
            peak_after / 1024,
            args.max_rss_growth,
            files.iter().min().copied().unwrap_or(0),
            files.iter().max().copied().unwrap_or(0),
            samples.len(),
            drift.map_or("not comparable to".to_string(), |d| format!(
                "{d:+.1} % from"
            )),
            args.max_p95_drift
        ),
        format!(
            "Every client streams 20 ms frames in real time (silence between questions); one \
             in four holds caption sessions (to {CAPTION_LANGUAGE}), the others chat sessions \
             of one to three questions. A chat client speaks over an answer with chance {} \
             (its next question starts at the answer's first audio) and any client drops the \
             connection at the first audio or caption with chance {} (seed {}). Latency is the \
             client's, from sending the last voiced frame. The plot: `{}`.",
            args.barge_in_chance,
            args.disconnect_chance,
            args.seed,
            args.plot.display()
        ),
    ];
    if let Some(parent) = args.plot.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.plot, plot(samples, happenings, run))
        .with_context(|| args.plot.display().to_string())?;
    Ok(Soaked {
        tables: vec![table],
        notes,
        failures,
    })
}

/// Three panels over the run's minutes: resident memory, open files, and each chat turn's
/// end of speech → first audio.
fn plot(samples: &[Sample], happenings: &[(Duration, Happening)], run: Duration) -> String {
    use std::fmt::Write as _;
    let (left, width, panel, gap, top) = (70.0, 640.0, 150.0, 50.0, 40.0);
    let minutes = run.as_secs_f64() / 60.0;
    let x = |at: Duration| left + at.as_secs_f64() / 60.0 / minutes * width;
    let rss: Vec<(Duration, f64)> = samples
        .iter()
        .map(|s| (s.at, s.rss_kib as f64 / 1024.0))
        .collect();
    let files: Vec<(Duration, f64)> = samples
        .iter()
        .map(|s| (s.at, s.open_files as f64))
        .collect();
    let turns: Vec<(Duration, f64)> = happenings
        .iter()
        .filter_map(|(at, h)| match h {
            Happening::ChatTurn(d) => Some((*at, d.as_secs_f64() * 1e3)),
            _ => None,
        })
        .collect();
    let panels = [
        ("resident memory (MiB)", &rss, true),
        ("open files", &files, true),
        ("chat: end of speech → first audio (ms)", &turns, false),
    ];
    let height = top + 3.0 * (panel + gap) + 10.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/><text x=\"10\" y=\"22\" font-weight=\"bold\">Soak: {minutes:.0} \
         minutes</text>\n",
        left + width + 20.0
    );
    for (i, (title, points, line)) in panels.iter().enumerate() {
        let y0 = top + i as f64 * (panel + gap) + 20.0;
        let max = points.iter().map(|p| p.1).fold(1.0f64, f64::max) * 1.1;
        let y = |v: f64| y0 + panel - v / max * panel;
        let _ = writeln!(
            svg,
            r##"<text x="{left}" y="{}">{title}</text><rect x="{left}" y="{y0}" width="{width}" height="{panel}" fill="none" stroke="#999"/><text x="{}" y="{}" text-anchor="end">{max:.0}</text><text x="{}" y="{}" text-anchor="end">0</text>"##,
            y0 - 6.0,
            left - 6.0,
            y0 + 10.0,
            left - 6.0,
            y0 + panel
        );
        for tick in 0..=6 {
            let at = Duration::from_secs_f64(run.as_secs_f64() * tick as f64 / 6.0);
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="middle">{:.0}</text>"#,
                x(at),
                y0 + panel + 14.0,
                at.as_secs_f64() / 60.0
            );
        }
        if *line {
            let path: Vec<String> = points
                .iter()
                .map(|(at, v)| format!("{:.1},{:.1}", x(*at), y(*v)))
                .collect();
            let _ = writeln!(
                svg,
                r##"<polyline fill="none" stroke="#2471a3" stroke-width="1.5" points="{}"/>"##,
                path.join(" ")
            );
        } else {
            for (at, v) in points.iter() {
                let _ = writeln!(
                    svg,
                    r##"<circle cx="{:.1}" cy="{:.1}" r="1.8" fill="#c0392b" fill-opacity="0.5"/>"##,
                    x(*at),
                    y(*v)
                );
            }
        }
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">minutes</text></svg>"#,
        left + width / 2.0,
        height - 4.0
    );
    svg
}
