//! `specvoice`: the voice pipeline from the command line.
//!
//! ```sh
//! specvoice chat --audio question.wav --out answer.wav     # Whisper → PredGen → espeak-ng
//! specvoice caption --audio talk.wav --to German           # Whisper → SSBD live captions
//! specvoice serve --addr 127.0.0.1:8080                     # both over WebSockets (PROTOCOL.md)
//! ```

#[cfg(feature = "server")]
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
#[cfg(feature = "server")]
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use engine_asr::{Audio, LoadOptions as AsrLoadOptions, Transcriber};
use engine_llm::{Continuation, LoadOptions, PredGen, PredGenConfig, Verifier};
use engine_mt::{Decoding, LiveConfig, LiveTranslator, StreamSummary};
use engine_tts::voices;
use spec_cli::{init_logging, open_model, HeadsArgs, ModelArgs};
use spec_core::report::latency_speedup;
use spec_models::{Registry, Store};
use spec_voice::write_wav;
#[cfg(feature = "server")]
use specvoice::serve::{
    copies_of, load_engines_from, ServeConfig, ServedModels, Server, VoiceLoader, Voices,
};
use specvoice::{
    play_recording, ChatMode, ClockKind, EndpointConfig, Listener, ListenerConfig, LiveCaptions,
    SileroSettings, TurnEnd, Vad, VoiceChat, VoiceTurn,
};

/// The SpecVoice voice pipeline: speech in, streaming Whisper, then an answer spoken back
/// (PredGen) or live captions in another language (SSBD).
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer spoken questions: Whisper → PredGen → speech. Runs the plain cascade on the same
    /// audio too and prints both latencies.
    Chat(ChatArgs),
    /// Caption speech in another language: Whisper → live re-translation with SSBD.
    Caption(CaptionArgs),
    /// Serve voice chat and live captions over WebSockets (`/ws`, the protocol in
    /// PROTOCOL.md), the models loaded once.
    #[cfg(feature = "server")]
    Serve(ServeArgs),
}

/// The recognizer and the endpoint detector.
#[derive(Args)]
struct RecognizerArgs {
    /// Whisper model: a name in the models folder or a model folder
    #[arg(long, default_value = "whisper-tiny.en-ct2")]
    asr: String,

    /// When the user's turn is over: semantic (the chat model reads each pause's transcript;
    /// the turn ends after 150 ms of silence when it judges the question complete, up to 1.2 s
    /// when it expects more words, and speech resuming within 1.2 s continues it) or silence
    /// (after --silence-ms). Captions always end utterances after --silence-ms.
    #[arg(long, default_value = "semantic")]
    turn_end: TurnEnd,

    /// Silence that ends an utterance with `--turn-end silence`, and a caption's, in
    /// milliseconds
    #[arg(long, default_value_t = 500)]
    silence_ms: u64,

    /// Audio between partial transcripts, in milliseconds
    #[arg(long, default_value_t = 500)]
    partial_ms: u64,

    /// What tells speech from silence: `auto` (Silero VAD when its weights are in the models
    /// folder, the energy detector otherwise), `energy` (level above the noise floor) or
    /// `silero` (Silero VAD's network, from the models folder's silero-vad/)
    #[arg(long, default_value = "auto", value_name = "auto|energy|silero", value_parser = parse_vad)]
    vad: Vad,
}

/// `--vad`: the energy detector, or Silero VAD with its weights from the models folder.
fn parse_vad(name: &str) -> std::result::Result<Vad, String> {
    let silero = || -> std::result::Result<PathBuf, String> {
        Ok(spec_models::models_dir()
            .map_err(|e| e.to_string())?
            .join("silero-vad")
            .join(engine_asr::vad::MODEL_FILE))
    };
    match name {
        "energy" => Ok(Vad::Energy),
        // Silero finds the end of speech in white and pink noise at 10 dB SNR where the energy
        // detector mostly does not (docs/turns.md), for 0.2 % of a core.
        "auto" => {
            let model = silero()?;
            if model.is_file() {
                Ok(Vad::Silero(SileroSettings::new(model)))
            } else {
                tracing::info!(
                    "no Silero VAD in the models folder (`cargo xtask download silero-vad`): \
                     the energy detector tells speech from silence"
                );
                Ok(Vad::Energy)
            }
        }
        "silero" => {
            let model = silero()?;
            if !model.is_file() {
                return Err(format!(
                    "Silero VAD needs {} (`cargo xtask download silero-vad`)",
                    model.display()
                ));
            }
            Ok(Vad::Silero(SileroSettings::new(model)))
        }
        other => Err(format!("`{other}` is not `auto`, `energy` or `silero`")),
    }
}

impl RecognizerArgs {
    fn listener_config(&self) -> ListenerConfig {
        ListenerConfig {
            endpoint: EndpointConfig {
                silence: Duration::from_millis(self.silence_ms),
                vad: self.vad.clone(),
                ..EndpointConfig::default()
            },
            partial_every: Duration::from_millis(self.partial_ms),
            turn_end: self.turn_end.clone(),
            ..ListenerConfig::default()
        }
    }

    /// The settings of a caption listener: the end of an utterance after the silence.
    fn caption_listener_config(&self) -> ListenerConfig {
        ListenerConfig {
            turn_end: TurnEnd::Silence,
            ..self.listener_config()
        }
    }

    /// The Whisper model's folder.
    fn whisper_dir(&self) -> Result<PathBuf> {
        let store = Store::new(spec_models::models_dir()?, Registry::builtin());
        Ok(store.resolve(&self.asr)?.dir)
    }

    fn open_whisper(&self) -> Result<Transcriber> {
        let dir = self.whisper_dir()?;
        Transcriber::load(&dir, &AsrLoadOptions::default())
            .with_context(|| format!("loading {}", dir.display()))
    }
}

/// What hears the audio.
#[derive(Args)]
struct HearingArgs {
    /// The recording (WAV, any rate; mixed down to mono and resampled to 16 kHz)
    #[arg(long, value_name = "WAV")]
    audio: PathBuf,

    #[command(flatten)]
    recognizer: RecognizerArgs,

    /// Play the recording in real time (default: a simulated clock, as fast as the machine
    /// allows, with every latency measured compute)
    #[arg(long)]
    realtime: bool,

    #[command(flatten)]
    model: ModelArgs,
}

impl HearingArgs {
    fn clock(&self) -> ClockKind {
        if self.realtime {
            ClockKind::Wall
        } else {
            ClockKind::Simulated
        }
    }

    fn listener_config(&self) -> ListenerConfig {
        self.recognizer.listener_config()
    }

    /// The recording at 16 kHz.
    fn read_audio(&self) -> Result<Vec<f32>> {
        let audio = Audio::read_wav(&self.audio)?;
        Ok(audio.to_16k()?)
    }

    fn open_whisper(&self) -> Result<Transcriber> {
        self.recognizer.open_whisper()
    }

    /// Silence after the recording: the endpoint detector's longest silence and a margin.
    fn trailing_silence(&self) -> Duration {
        self.listener_config().detector().silence + Duration::from_millis(300)
    }
}

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    hearing: HearingArgs,

    /// How guesses are verified: greedy (lossless), topK, reflection
    #[arg(long, default_value = "greedy")]
    verifier: Verifier,

    /// How the answer is continued: lookup[:MAX_DRAFT] (copies from the turn's discarded
    /// guesses; costs no forward), ar, jacobi[:WINDOW], draft[:GAMMA] (needs --draft), heads
    /// (needs heads trained for the model)
    #[arg(long, default_value = "lookup")]
    continuation: Continuation,

    #[command(flatten)]
    heads: HeadsArgs,

    /// Draft model for `--continuation draft`
    #[arg(long)]
    draft: Option<String>,

    /// Candidate completions of the question answered ahead, each first sentence synthesized
    /// ahead (1: the greedy completion alone)
    #[arg(long, default_value_t = PredGenConfig::default().question_candidates)]
    question_candidates: usize,

    /// Most tokens of an answer
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,

    /// The voice: auto (Kokoro's af_heart when its files are in the models folder, espeak-ng
    /// otherwise), kokoro:NAME, piper:NAME, espeak, or fixed (silence after a fixed 200 ms);
    /// `list` lists the voices here
    #[arg(long, default_value = "auto")]
    voice: String,

    /// Write the answers' audio (PredGen's) to this WAV file
    #[arg(long, value_name = "WAV")]
    out: Option<PathBuf>,

    /// Skip the cascade run
    #[arg(long)]
    no_cascade: bool,
}

#[derive(Args)]
struct CaptionArgs {
    #[command(flatten)]
    hearing: HearingArgs,

    /// The captions' language
    #[arg(long, default_value = "German")]
    to: String,

    /// SSBD's largest bias β (0: exactly autoregressive re-translation on every update)
    /// [default: the library's, which grows β with the sentence up to 0.5]
    #[arg(long)]
    beta: Option<f32>,

    /// Also caption the same audio with autoregressive re-translation, and compare
    #[arg(long)]
    compare: bool,
}

#[cfg(feature = "server")]
#[derive(Args)]
struct ServeArgs {
    /// Address to listen on (the page at /, the WebSocket at /ws)
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,

    /// Engines: copies of the models in memory, each serving one session at a time
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    engines: u64,

    /// Sessions that may wait for an engine; more are refused
    #[arg(long, default_value_t = 8)]
    queue: usize,

    #[command(flatten)]
    recognizer: RecognizerArgs,

    #[command(flatten)]
    model: ModelArgs,

    /// How guesses are verified: greedy (lossless), topK, reflection
    #[arg(long, default_value = "greedy")]
    verifier: Verifier,

    /// Candidate completions of the question answered ahead, each first sentence synthesized
    /// ahead (1: the greedy completion alone)
    #[arg(long, default_value_t = PredGenConfig::default().question_candidates)]
    question_candidates: usize,

    /// Most tokens of an answer
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,

    /// Most tokens of a caption
    #[arg(long, default_value_t = 64)]
    caption_tokens: usize,

    /// Answer with the plain cascade instead of PredGen
    #[arg(long)]
    cascade: bool,

    /// The sessions' voice unless a client picks another of the models folder's: auto
    /// (Kokoro's af_heart when its files are in the models folder, espeak-ng otherwise),
    /// kokoro:NAME, piper:NAME, espeak, or fixed (silence after a fixed 200 ms); `list` lists
    /// the voices here
    #[arg(long, default_value = "auto")]
    voice: String,

    /// Seconds the server waits for audio in a session
    #[arg(long, default_value_t = 30)]
    idle_secs: u64,

    /// Seconds a client may take to send a request's head, or a WebSocket session's `start`
    #[arg(long, default_value_t = ServeConfig::default().handshake_timeout.as_secs())]
    handshake_secs: u64,

    /// Seconds the sessions get to finish on shutdown (Ctrl-C, SIGTERM)
    #[arg(long, default_value_t = 30)]
    grace_secs: u64,

    /// API keys clients must present (`Authorization: Bearer KEY`; the page asks for one):
    /// repeat the flag, or list them comma-separated in $SPECVOICE_API_KEYS. Without any, the
    /// server is open to whoever reaches its address
    #[arg(
        long = "api-key",
        env = "SPECVOICE_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    api_keys: Vec<String>,

    /// Origins (`https://host:port`) whose pages may use the server besides its own page
    #[arg(long = "allowed-origin")]
    allowed_origins: Vec<String>,

    /// Sessions and requests one key (or, without keys, one address) may hold at once
    #[arg(long, default_value_t = ServeConfig::default().sessions_per_client)]
    sessions_per_client: usize,

    /// Connections one address may have open at once (behind a reverse proxy, every client
    /// has the proxy's address: raise it there)
    #[arg(long, default_value_t = ServeConfig::default().connections_per_address)]
    connections_per_address: usize,

    /// Requests (WebSocket connections included) one key, or one address without keys, may
    /// make a minute
    #[arg(long, default_value_t = ServeConfig::default().requests_per_minute)]
    requests_per_minute: u32,

    /// Messages a second a WebSocket client may send on average (bursts of five seconds' worth)
    #[arg(long, default_value_t = ServeConfig::default().messages_per_second)]
    messages_per_second: u32,

    /// Most megabytes of a request body (an upload to /v1/audio/transcriptions)
    #[arg(long, default_value_t = 25)]
    max_body_mb: usize,

    /// Longest recording /v1/audio/transcriptions takes, in seconds
    #[arg(long, default_value_t = 600)]
    max_audio_secs: u64,
}

fn main() -> Result<()> {
    init_logging();
    match Cli::parse().command {
        Command::Chat(args) => chat(args),
        Command::Caption(args) => caption(args),
        #[cfg(feature = "server")]
        Command::Serve(args) => serve(args),
    }
}

/// The server's voice `name` (loaded now), and every voice of the models folder for the
/// clients to pick (loaded when first picked); each shared by the sessions speaking with it,
/// one sentence at a time.
#[cfg(feature = "server")]
fn server_voices(name: &str) -> Result<Voices> {
    let models = spec_models::models_dir()?;
    let choice: voices::VoiceChoice = name.parse()?;
    let own = choice.resolve(&models)?;
    let default = copies_of(voices::open_shared(&choice, &models)?);
    let available = voices::available(&models)?;
    let loader: VoiceLoader = Arc::new(move |name| {
        let open = |name: &str| voices::open_shared(&name.parse()?, &models);
        Ok(copies_of(open(name)?))
    });
    Ok(Voices::new(own.to_string(), default).with_choices(available, loader))
}

/// With `--voice list`: prints the voices of the models folder; whether it did.
fn listed_voices(name: &str) -> Result<bool> {
    if name != "list" {
        return Ok(false);
    }
    for voice in voices::available(&spec_models::models_dir()?)? {
        println!("{voice}");
    }
    Ok(true)
}

#[cfg(feature = "server")]
fn serve(args: ServeArgs) -> Result<()> {
    if listed_voices(&args.voice)? {
        return Ok(());
    }
    args.model.apply_threads()?;
    let engines = load_engines_from(args.recognizer.whisper_dir()?, args.model.model.clone());
    let config = ServeConfig {
        engines: args.engines as usize,
        queue: args.queue,
        listener: args.recognizer.listener_config(),
        predgen: PredGenConfig {
            verifier: args.verifier,
            max_answer_tokens: args.max_tokens,
            question_candidates: args.question_candidates,
            ..PredGenConfig::default()
        },
        chat_mode: match args.cascade {
            true => ChatMode::Cascade,
            false => ChatMode::PredGen,
        },
        caption_max_tokens: args.caption_tokens,
        idle_timeout: Duration::from_secs(args.idle_secs),
        handshake_timeout: Duration::from_secs(args.handshake_secs),
        connections_per_address: args.connections_per_address,
        requests_per_minute: args.requests_per_minute,
        messages_per_second: args.messages_per_second,
        api_keys: args.api_keys.clone(),
        allowed_origins: args.allowed_origins.clone(),
        sessions_per_client: args.sessions_per_client,
        max_body_bytes: args.max_body_mb << 20,
        max_audio: Duration::from_secs(args.max_audio_secs),
        models: ServedModels {
            chat: model_id(&args.model.model),
            transcription: model_id(&args.recognizer.asr),
            ..ServedModels::default()
        },
        ..ServeConfig::default()
    };
    if config.api_keys.is_empty() && !args.addr.ip().is_loopback() {
        eprintln!(
            "warning: serving on {} without an API key: anyone who reaches it can use it \
             (--api-key or $SPECVOICE_API_KEYS)",
            args.addr
        );
    }
    let tts = server_voices(&args.voice)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        eprintln!(
            "loading {} engine(s): {} and {}…",
            config.engines, args.recognizer.asr, args.model.model
        );
        let server = Server::start(args.addr, config, engines, tts).await?;
        let addr = server.local_addr();
        eprintln!(
            "listening: the page at http://{addr}/, the protocol at ws://{addr}/ws, the OpenAI \
             API at http://{addr}/v1 (Ctrl-C to stop)"
        );
        shutdown_signal().await?;
        eprintln!("shutting down: letting the sessions finish their turns…");
        let grace = Duration::from_secs(args.grace_secs);
        match tokio::time::timeout(grace, server.shutdown()).await {
            Ok(done) => done?,
            Err(_) => eprintln!("sessions still open after {grace:?}: stopping anyway"),
        }
        Ok(())
    })
}

/// The name a model answers to in the OpenAI-compatible API: its name in the models folder,
/// or its file (without `.gguf`) or folder name.
#[cfg(feature = "server")]
fn model_id(name_or_path: &str) -> String {
    let name = Path::new(name_or_path)
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or(name_or_path);
    name.strip_suffix(".gguf").unwrap_or(name).to_string()
}

/// Waits for Ctrl-C or, on Unix, SIGTERM.
#[cfg(feature = "server")]
async fn shutdown_signal() -> Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            interrupted = tokio::signal::ctrl_c() => interrupted?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await?;
    Ok(())
}

fn chat(args: ChatArgs) -> Result<()> {
    if listed_voices(&args.voice)? {
        return Ok(());
    }
    let hearing = &args.hearing;
    let audio = hearing.read_audio()?;
    hearing.model.apply_threads()?;
    let mut whisper = Some(hearing.open_whisper()?);
    let mut model = open_model(&hearing.model.model, &LoadOptions::default())?;
    let mut draft = args
        .draft
        .as_deref()
        .map(|name| open_model(name, &LoadOptions::default()))
        .transpose()?;
    let heads = match args.continuation {
        Continuation::Heads => Some(args.heads.drafter(&model, &hearing.model.model)?),
        _ => None,
    };
    let config = PredGenConfig {
        verifier: args.verifier,
        continuation: args.continuation,
        max_answer_tokens: args.max_tokens,
        question_candidates: args.question_candidates,
        ..PredGenConfig::default()
    };
    // One voice for both runs, loaded once.
    let voice = voices::open_shared(&args.voice.parse()?, &spec_models::models_dir()?)?;
    let mut run = |mode: ChatMode, show: bool| -> Result<Vec<VoiceTurn>> {
        let listener = Listener::new(
            whisper.take().expect("Whisper is back"),
            hearing.listener_config(),
        )?;
        let mut session = PredGen::new(&mut model, config.clone())?;
        if let Some(draft) = draft.as_mut() {
            session = session.with_draft(draft)?;
        }
        if let Some(heads) = &heads {
            session = session.with_heads(heads.clone())?;
        }
        let mut chat = VoiceChat::new(
            listener,
            session,
            Box::new(voice.clone()),
            mode,
            hearing.clock(),
        );
        let turns = chat.play(&audio, hearing.trailing_silence(), &mut |event| {
            if show {
                println!("{event}");
            }
        });
        let (listener, _) = chat.into_parts();
        whisper = Some(listener.into_transcriber());
        Ok(turns?)
    };
    let cascade = if args.no_cascade {
        None
    } else {
        eprintln!("cascade: Whisper, then the answer, then speech…");
        Some(run(ChatMode::Cascade, false)?)
    };
    println!(
        "PredGen ({:?}, {:?}):",
        config.verifier, config.continuation
    );
    let predgen = run(ChatMode::PredGen, true)?;
    if predgen.is_empty() {
        bail!("no speech found in {}", hearing.audio.display());
    }
    println!();
    print_turns(&predgen, cascade.as_deref());
    if let Some(out) = &args.out {
        write_answer_audio(out, &predgen)?;
    }
    Ok(())
}

fn print_turns(predgen: &[VoiceTurn], cascade: Option<&[VoiceTurn]>) {
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1e3);
    println!("| turn | system | end of speech → first audio (ms) | endpointing | ASR | LLM | TTS | same answer |");
    println!("|---|---|---|---|---|---|---|---|");
    for (i, turn) in predgen.iter().enumerate() {
        let other = cascade.and_then(|c| c.get(i));
        let rows = other
            .map(|c| ("cascade", c))
            .into_iter()
            .chain([("PredGen", turn)]);
        for (name, t) in rows {
            let parts = t.breakdown();
            let same = match other {
                Some(c) => (c.turn.answer == turn.turn.answer).to_string(),
                None => "–".to_string(),
            };
            println!(
                "| {} | {name} | {} | {} | {} | {} | {} | {same} |",
                i + 1,
                ms(t.latency()),
                ms(parts.endpointing),
                ms(parts.asr),
                ms(parts.llm),
                ms(parts.tts),
            );
        }
        println!();
        println!("  Q: {}", turn.turn.question);
        println!("  A: {}", turn.turn.answer);
        if let Some(c) = other {
            println!(
                "  PredGen's latency against the cascade's: {}",
                latency_speedup(c.latency().as_secs_f64(), turn.latency().as_secs_f64())
            );
        }
    }
}

fn write_answer_audio(out: &Path, turns: &[VoiceTurn]) -> Result<()> {
    let chunks: Vec<_> = turns.iter().flat_map(VoiceTurn::audio).collect();
    write_wav(out, chunks).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("answer audio written to {}", out.display());
    Ok(())
}

fn caption(args: CaptionArgs) -> Result<()> {
    let hearing = &args.hearing;
    let audio = hearing.read_audio()?;
    hearing.model.apply_threads()?;
    let mut whisper = Some(hearing.open_whisper()?);
    let mut model = open_model(&hearing.model.model, &LoadOptions::default())?;
    let mut ssbd = LiveConfig::new(&args.to);
    if let Some(beta) = args.beta {
        ssbd.decoding = Decoding::Ssbd { beta };
    }
    let mut run = |config: LiveConfig, show: bool| -> Result<StreamSummary> {
        let listener = Listener::new(
            whisper.take().expect("Whisper is back"),
            hearing.recognizer.caption_listener_config(),
        )?;
        let translator = LiveTranslator::new(&mut model, config)?;
        let mut captions = LiveCaptions::new(listener, translator, hearing.clock());
        let played = play_recording(
            &mut captions,
            &audio,
            hearing.trailing_silence(),
            &mut |e| {
                if show {
                    println!("{e}");
                }
            },
        );
        let summary = captions.summary().clone();
        whisper = Some(captions.into_listener().into_transcriber());
        played?;
        Ok(summary)
    };
    println!("SSBD ({:?}, adaptive bias):", ssbd.decoding);
    let mut rows = vec![("SSBD", run(ssbd.clone(), true)?)];
    if args.compare {
        let ar = LiveConfig::autoregressive(&args.to);
        rows.insert(0, ("AR re-translation", run(ar, false)?));
    }
    println!();
    println!("| system | updates | output tokens/s | normalized erasure |");
    println!("|---|---|---|---|");
    for (name, summary) in rows {
        println!(
            "| {name} | {} | {:.1} | {:.3} |",
            summary.updates,
            summary.tokens_per_second(),
            summary.normalized_erasure()
        );
    }
    Ok(())
}
