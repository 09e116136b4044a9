//! The OpenAI-compatible API under measurement, on the same server and models as the voice
//! rounds: chat completions streamed by `async-openai` against the plain engine in this process
//! (time to first token, tokens/s; the same text), concurrent streams, transcriptions per minute,
//! and Realtime sessions against SpecVoice's own protocol on the same audio (end of speech → first
//! audio), one session at a time, alternating.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use async_openai::config::OpenAIConfig;
use async_openai::types::audio::{AudioInput, CreateTranscriptionRequestArgs};
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, ChatCompletionStreamOptions, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use engine_llm::{Flow, GenerateOptions, LanguageModel, LoadOptions, Message};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use spec_core::report::Table;
use specvoice::serve::protocol::encode_pcm;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::{converse, percentile, Outcome, Question, FRAME, PATIENCE};

/// What the API part measures.
pub struct ApiArgs {
    pub model: String,
    pub max_tokens: usize,
    /// Questions asked (chat, transcriptions, Realtime against native).
    pub questions: usize,
    /// Concurrent chat streams.
    pub streams: usize,
}

/// One streamed answer: time to the first token, the whole time, the text, and its tokens.
struct Streamed {
    first_token: Duration,
    total: Duration,
    text: String,
    tokens: usize,
}

impl Streamed {
    fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.total.as_secs_f64().max(1e-9)
    }
}

/// Silence streamed after a question in the Realtime comparison: 3 s at 16 kHz.
const OPEN_MICROPHONE: usize = 48_000;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(values: &[f64]) -> f64 {
    percentile(values, 0.5).unwrap_or(f64::NAN)
}

/// The tables of the API's measurements.
pub async fn measure(
    addr: SocketAddr,
    chat_model: &str,
    questions: &[Arc<Question>],
    args: &ApiArgs,
) -> Result<Vec<Table>> {
    ensure!(!questions.is_empty(), "no questions");
    let asked: Vec<Arc<Question>> = questions.iter().take(args.questions).cloned().collect();
    let client = async_openai::Client::with_config(
        OpenAIConfig::new()
            .with_api_base(format!("http://{addr}/v1"))
            .with_api_key("unused"),
    );
    let chat = chat_table(&client, chat_model, &asked, args).await?;
    let concurrent = concurrent_table(&client, chat_model, questions, args).await?;
    let transcriptions = transcription_table(&client, &asked).await?;
    let realtime = realtime_table(addr, &asked).await?;
    Ok(vec![chat, concurrent, transcriptions, realtime])
}

fn request(model: &str, question: &str, max_tokens: usize) -> Result<CreateChatCompletionRequest> {
    Ok(CreateChatCompletionRequestArgs::default()
        .model(model)
        .temperature(0.0)
        .max_completion_tokens(u32::try_from(max_tokens)?)
        .stream_options(ChatCompletionStreamOptions {
            include_usage: Some(true),
            include_obfuscation: None,
        })
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content(question)
            .build()?
            .into()])
        .build()?)
}

/// A greedy answer streamed from the server.
async fn stream_answer(
    client: &async_openai::Client<OpenAIConfig>,
    request: CreateChatCompletionRequest,
) -> Result<Streamed> {
    let started = Instant::now();
    let mut stream = client.chat().create_stream(request).await?;
    let (mut first_token, mut text, mut tokens) = (None, String::new(), 0);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if let Some(usage) = chunk.usage {
            tokens = usize::try_from(usage.completion_tokens)?;
        }
        for choice in chunk.choices {
            if let Some(delta) = choice.delta.content.filter(|d| !d.is_empty()) {
                first_token.get_or_insert_with(|| started.elapsed());
                text.push_str(&delta);
            }
        }
    }
    Ok(Streamed {
        first_token: first_token.context("the stream had no token")?,
        total: started.elapsed(),
        text,
        tokens,
    })
}

/// The same greedy answer from the plain engine in this process (no speculation).
fn plain_answer(model: &mut LanguageModel, question: &str, max_tokens: usize) -> Result<Streamed> {
    let options = GenerateOptions::default().max_tokens(max_tokens);
    let started = Instant::now();
    let mut first_token = None;
    let answer = model.chat_stream(&[Message::user(question)], &options, |_| {
        first_token.get_or_insert_with(|| started.elapsed());
        Flow::Continue
    })?;
    Ok(Streamed {
        first_token: first_token.context("the answer had no token")?,
        total: started.elapsed(),
        tokens: answer.tokens.len(),
        text: answer.text,
    })
}

async fn chat_table(
    client: &async_openai::Client<OpenAIConfig>,
    chat_model: &str,
    questions: &[Arc<Question>],
    args: &ApiArgs,
) -> Result<Table> {
    let model_name = args.model.clone();
    let mut plain = tokio::task::spawn_blocking(move || {
        LanguageModel::open(&model_name, &LoadOptions::default())
    })
    .await??;
    let mut table = Table::new(
        format!(
            "Chat completions, streamed over HTTP (async-openai, greedy, lookup speculation) \
             against the plain engine in this process ({}, {} tokens at most)",
            args.model, args.max_tokens
        ),
        &[
            "question",
            "plain: first token (ms)",
            "API: first token (ms)",
            "plain tokens/s",
            "API tokens/s",
            "same text",
        ],
    );
    let (mut plain_first, mut api_first, mut plain_rate, mut api_rate) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut same = 0;
    for question in questions {
        let (text, max_tokens) = (question.text.clone(), args.max_tokens);
        let (local, back) = tokio::task::spawn_blocking(move || {
            let answer = plain_answer(&mut plain, &text, max_tokens);
            (answer, plain)
        })
        .await?;
        plain = back;
        let local = local?;
        let served = stream_answer(
            client,
            request(chat_model, &question.text, args.max_tokens)?,
        )
        .await?;
        let identical = served.text == local.text;
        same += usize::from(identical);
        plain_first.push(ms(local.first_token));
        api_first.push(ms(served.first_token));
        plain_rate.push(local.tokens_per_second());
        api_rate.push(served.tokens_per_second());
        table.push(vec![
            question.text.clone(),
            format!("{:.1}", ms(local.first_token)),
            format!("{:.1}", ms(served.first_token)),
            format!("{:.1}", local.tokens_per_second()),
            format!("{:.1}", served.tokens_per_second()),
            identical.to_string(),
        ]);
    }
    table.push(vec![
        "median".into(),
        format!("{:.1}", median(&plain_first)),
        format!("{:.1}", median(&api_first)),
        format!("{:.1}", median(&plain_rate)),
        format!("{:.1}", median(&api_rate)),
        format!("{same}/{}", questions.len()),
    ]);
    if same != questions.len() {
        bail!(
            "the API's greedy answers differ from plain decoding's on {} question(s)",
            questions.len() - same
        );
    }
    Ok(table)
}

async fn concurrent_table(
    client: &async_openai::Client<OpenAIConfig>,
    chat_model: &str,
    questions: &[Arc<Question>],
    args: &ApiArgs,
) -> Result<Table> {
    let started = Instant::now();
    let streams: Vec<_> = (0..args.streams)
        .map(|i| {
            let client = client.clone();
            let request = request(
                chat_model,
                &questions[i % questions.len()].text,
                args.max_tokens,
            );
            tokio::spawn(async move { stream_answer(&client, request?).await })
        })
        .collect();
    let mut answers = Vec::new();
    for stream in streams {
        answers.push(stream.await??);
    }
    let wall = started.elapsed();
    let firsts: Vec<f64> = answers.iter().map(|a| ms(a.first_token)).collect();
    let rates: Vec<f64> = answers.iter().map(Streamed::tokens_per_second).collect();
    let tokens: usize = answers.iter().map(|a| a.tokens).sum();
    let mut table = Table::new(
        format!(
            "{} concurrent chat streams (one engine: they queue)",
            args.streams
        ),
        &[
            "streams",
            "first token p50 / p95 (ms)",
            "tokens/s per stream (median)",
            "tokens/s in all",
        ],
    );
    table.push(vec![
        args.streams.to_string(),
        format!(
            "{:.0} / {:.0}",
            median(&firsts),
            percentile(&firsts, 0.95).unwrap_or(f64::NAN)
        ),
        format!("{:.1}", median(&rates)),
        format!("{:.1}", tokens as f64 / wall.as_secs_f64()),
    ]);
    Ok(table)
}

/// A question's audio as a 16 kHz 16-bit WAV file in memory.
fn wav_bytes(samples: &[f32]) -> Result<Vec<u8>> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut bytes = std::io::Cursor::new(Vec::new());
    let mut writer = hound::WavWriter::new(&mut bytes, spec)?;
    for sample in samples {
        writer.write_sample((sample.clamp(-1.0, 1.0) * f32::from(i16::MAX)) as i16)?;
    }
    writer.finalize()?;
    Ok(bytes.into_inner())
}

async fn transcription_table(
    client: &async_openai::Client<OpenAIConfig>,
    questions: &[Arc<Question>],
) -> Result<Table> {
    let started = Instant::now();
    let mut audio_seconds = 0.0;
    for question in questions {
        audio_seconds += question.samples.len() as f64 / 16_000.0;
        let request = CreateTranscriptionRequestArgs::default()
            .file(AudioInput::from_vec_u8(
                "question.wav".into(),
                wav_bytes(&question.samples)?,
            ))
            .model("whisper-1")
            .build()?;
        let heard = client.audio().transcription().create(request).await?;
        ensure!(
            !heard.text.trim().is_empty(),
            "no words heard in \"{}\"",
            question.text
        );
    }
    let wall = started.elapsed().as_secs_f64();
    let mut table = Table::new(
        "Transcriptions (POST /v1/audio/transcriptions, one at a time)",
        &[
            "files",
            "audio (s)",
            "wall (s)",
            "transcriptions per minute",
            "real-time factor",
        ],
    );
    table.push(vec![
        questions.len().to_string(),
        format!("{audio_seconds:.1}"),
        format!("{wall:.1}"),
        format!("{:.0}", questions.len() as f64 / wall * 60.0),
        format!("{:.3}", wall / audio_seconds),
    ]);
    Ok(table)
}

async fn realtime_table(addr: SocketAddr, questions: &[Arc<Question>]) -> Result<Table> {
    let mut table = Table::new(
        "Realtime API against SpecVoice's own protocol on the same audio: end of speech → first \
         answer audio, as the client sees it (one session at a time, each first on every other \
         question; both stream 3 s of silence after the question, as an open microphone)",
        &["question", "native (ms)", "Realtime (ms)"],
    );
    let (mut native_all, mut realtime_all) = (Vec::new(), Vec::new());
    for question in questions {
        // A microphone stays open: both clients stream silence on after the question, until
        // well after the answer starts, so that the server's end of turn (not the client's
        // `stop` or `commit`) ends it on both sides.
        let open_microphone = Question {
            text: question.text.clone(),
            samples: [question.samples.as_slice(), &[0.0; OPEN_MICROPHONE]].concat(),
            speech_end: question.speech_end,
        };
        let question = &open_microphone;
        let native = async {
            let mut outcome = Outcome::default();
            converse(addr, question, Instant::now(), &mut outcome).await?;
            outcome
                .first_audio_after_speech
                .with_context(|| format!("no native answer audio for \"{}\"", question.text))
        };
        // Each goes first on every other question, so that neither gains from the order.
        let (native_latency, realtime_latency) = if native_all.len() % 2 == 0 {
            let native = native.await?;
            (native, realtime_session(addr, question).await?)
        } else {
            let realtime = realtime_session(addr, question).await?;
            (native.await?, realtime)
        };
        native_all.push(ms(native_latency));
        realtime_all.push(ms(realtime_latency));
        table.push(vec![
            question.text.clone(),
            format!("{:.0}", ms(native_latency)),
            format!("{:.0}", ms(realtime_latency)),
        ]);
    }
    let (native_median, realtime_median) = (median(&native_all), median(&realtime_all));
    table.push(vec![
        format!(
            "median (Realtime {:+.1} %)",
            (realtime_median / native_median - 1.0) * 100.0
        ),
        format!("{native_median:.0}"),
        format!("{realtime_median:.0}"),
    ]);
    Ok(table)
}

/// A Realtime session: the question streamed in real time (16 kHz PCM, base64), the time from
/// its last voiced frame to the first `response.output_audio.delta`; reads to `response.done`.
async fn realtime_session(addr: SocketAddr, question: &Question) -> Result<Duration> {
    let url = format!("ws://{addr}/v1/realtime?model=gpt-realtime");
    let (socket, _) = tokio_tungstenite::connect_async(url).await?;
    let (mut sink, mut stream) = socket.split();
    let mut next_event = async move || -> Result<Option<Value>> {
        loop {
            let next = tokio::time::timeout(PATIENCE, stream.next())
                .await
                .context("no Realtime event in time")?;
            match next {
                None | Some(Ok(WsMessage::Close(_))) => return Ok(None),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(WsMessage::Text(text))) => return Ok(Some(serde_json::from_str(&text)?)),
                Some(Ok(_)) => {}
            }
        }
    };
    let update = json!({
        "type": "session.update",
        "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
    });
    sink.send(WsMessage::Text(update.to_string().into()))
        .await?;
    let speak = async {
        let mut clock = tokio::time::interval(Duration::from_millis(20));
        let mut speech_ended = None;
        for (i, frame) in question.samples.chunks(FRAME).enumerate() {
            clock.tick().await;
            let append = json!({"type": "input_audio_buffer.append", "audio": BASE64.encode(encode_pcm(frame))});
            sink.send(WsMessage::Text(append.to_string().into()))
                .await?;
            if speech_ended.is_none() && (i + 1) * FRAME > question.speech_end {
                speech_ended = Some(Instant::now());
            }
        }
        // As the native client's `stop` ends its utterance after the trailing silence.
        let commit = json!({"type": "input_audio_buffer.commit"});
        sink.send(WsMessage::Text(commit.to_string().into()))
            .await?;
        anyhow::Ok((speech_ended, sink))
    };
    let listen = async {
        let mut first_audio = None;
        while let Some(event) = next_event().await? {
            match event["type"].as_str() {
                Some("response.output_audio.delta") => {
                    first_audio.get_or_insert_with(Instant::now);
                }
                Some("response.done") => break,
                Some("error") => bail!("Realtime error: {}", event["error"]),
                _ => {}
            }
        }
        anyhow::Ok(first_audio)
    };
    let (spoken, heard) = tokio::join!(speak, listen);
    let (speech_ended, mut sink) = spoken?;
    let _ = sink.close().await;
    match (speech_ended, heard?) {
        (Some(end), Some(audio)) => Ok(audio.saturating_duration_since(end)),
        _ => bail!("no Realtime answer audio for \"{}\"", question.text),
    }
}
