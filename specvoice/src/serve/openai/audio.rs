//! `POST /v1/audio/transcriptions` (Whisper: a multipart upload in, text, subtitles or
//! segments out) and `POST /v1/audio/speech` (text in, speech out in one of the server's
//! voices, streamed sentence by sentence as it is synthesized).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Multipart, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use engine_asr::audio::check_finite;
use engine_asr::subtitles::{to_srt, to_vtt};
use engine_asr::{Audio, TranscribeOptions, Transcript};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::{json_body, with_engine, ApiError, SPEECH_ALIASES, TRANSCRIPTION_ALIASES};
use crate::serve::access::Client;
use crate::serve::metrics::Endpoint;
use crate::serve::Shared;

/// Most characters of speech input (OpenAI's bound).
pub const MAX_SPEECH_CHARS: usize = 4096;

/// OpenAI's voice names: each speaks with the server's own voice.
const OPENAI_VOICES: [&str; 13] = [
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
    "marin", "cedar",
];

/// The sample rate of the `pcm` format (OpenAI's: 24 kHz, 16-bit, mono).
const PCM_SAMPLE_RATE: u32 = 24_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TextFormat {
    Json,
    Text,
    Srt,
    Vtt,
    VerboseJson,
}

impl TextFormat {
    fn parse(name: &str) -> Result<Self, ApiError> {
        Ok(match name {
            "json" => Self::Json,
            "text" => Self::Text,
            "srt" => Self::Srt,
            "vtt" => Self::Vtt,
            "verbose_json" => Self::VerboseJson,
            other => {
                return Err(ApiError::invalid(format!(
                    "`response_format` `{other}` is not one of json, text, srt, vtt, verbose_json"
                ))
                .param("response_format"))
            }
        })
    }

    /// Whether the segments need their times.
    fn timed(self) -> bool {
        matches!(self, Self::Srt | Self::Vtt | Self::VerboseJson)
    }
}

/// A transcription request's fields, read from the multipart form.
struct Upload {
    file: Option<(String, Bytes)>,
    model: Option<String>,
    options: TranscribeOptions,
    format: TextFormat,
}

async fn read_upload(mut form: Multipart) -> Result<Upload, ApiError> {
    let mut upload = Upload {
        file: None,
        model: None,
        options: TranscribeOptions::default(),
        format: TextFormat::Json,
    };
    let bad_form = |e: axum::extract::multipart::MultipartError| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(e.body_text()),
        _ => ApiError::invalid(format!("the form: {}", e.body_text())),
    };
    while let Some(field) = form.next_field().await.map_err(bad_form)? {
        let name = field.name().unwrap_or("").to_string();
        if name == "file" {
            let file_name = field.file_name().unwrap_or("upload").to_string();
            upload.file = Some((file_name, field.bytes().await.map_err(bad_form)?));
            continue;
        }
        let value = field.text().await.map_err(bad_form)?;
        let number = |value: &str| {
            value
                .parse::<f32>()
                .map_err(|_| ApiError::invalid(format!("`{name}` must be a number")).param(&name))
        };
        match name.as_str() {
            "model" => upload.model = Some(value),
            "language" => upload.options.language = Some(value.trim().to_ascii_lowercase()),
            "prompt" => upload.options.initial_prompt = Some(value),
            "temperature" => {
                let start = number(&value)?;
                if !(0.0..=1.0).contains(&start) {
                    return Err(ApiError::invalid("`temperature` must lie in 0..=1").param(&name));
                }
                // 0 (the default) is Whisper's fallback from greedy upwards; above, sampling
                // starts there.
                if start > 0.0 {
                    let higher = upload.options.temperatures.iter().filter(|t| **t > start);
                    upload.options.temperatures =
                        std::iter::once(start).chain(higher.copied()).collect();
                }
            }
            "response_format" => upload.format = TextFormat::parse(&value)?,
            "timestamp_granularities[]" | "timestamp_granularities" => {
                if value != "segment" {
                    return Err(ApiError::invalid(format!(
                        "timestamp granularity `{value}` is not supported (segment)"
                    ))
                    .param(&name));
                }
            }
            "stream" if value == "false" => {}
            "stream" => {
                return Err(
                    ApiError::invalid("streamed transcriptions are not supported").param(&name),
                )
            }
            other => return Err(ApiError::invalid(format!("unknown field `{other}`")).param(other)),
        }
    }
    Ok(upload)
}

pub(super) async fn transcriptions(
    State(shared): State<Arc<Shared>>,
    Extension(client): Extension<Client>,
    form: Result<Multipart, MultipartRejection>,
) -> Response {
    let _active = shared.metrics.request(Endpoint::Transcriptions);
    let result = transcribe(&shared, &client, form).await;
    result.unwrap_or_else(|error| {
        shared.metrics.failed(Endpoint::Transcriptions);
        error.into_response()
    })
}

async fn transcribe(
    shared: &Arc<Shared>,
    client: &Client,
    form: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let form = form.map_err(|e| {
        ApiError::invalid(format!(
            "expected a multipart/form-data body: {}",
            e.body_text()
        ))
    })?;
    let upload = read_upload(form).await?;
    let models = &shared.config.models;
    let model = upload
        .model
        .ok_or_else(|| ApiError::invalid("`model` is missing").param("model"))?;
    models.check(&model, &models.transcription, &TRANSCRIPTION_ALIASES)?;
    let (file_name, bytes) = upload
        .file
        .ok_or_else(|| ApiError::invalid("`file` is missing").param("file"))?;
    // Decoded up to the longest audio transcribed: a compressed upload can hold hours of
    // silence in a few kilobytes.
    let longest = shared.config.max_audio.as_secs_f64();
    let audio = Audio::from_bytes_at_most(&bytes, &file_name, longest).map_err(|e| match e {
        engine_asr::Error::AudioTooLong { .. } => ApiError::invalid(format!(
            "the audio lasts more than {longest:.0} s, the most transcribed"
        ))
        .param("file"),
        other => ApiError::invalid(other.to_string()).param("file"),
    })?;
    let seconds = audio.duration_seconds();
    let samples: Vec<f32> = check_finite(&audio.samples)
        .and_then(|()| audio.to_16k())
        .map_err(|e| ApiError::invalid(e.to_string()).param("file"))?;
    let format = upload.format;
    let options = TranscribeOptions {
        timestamps: format.timed(),
        ..upload.options
    };
    let _held = shared.access.hold(client)?;
    let transcript = with_engine(shared, move |engine| {
        engine
            .whisper
            .transcribe(&samples, &options)
            .map_err(|e| match e {
                engine_asr::Error::Language(_) => {
                    ApiError::invalid(e.to_string()).param("language")
                }
                other => ApiError::server(other),
            })
    })
    .await?;
    Ok(render(&transcript, format, seconds))
}

fn render(transcript: &Transcript, format: TextFormat, seconds: f64) -> Response {
    let text = |content_type: &'static str, body: String| {
        ([(header::CONTENT_TYPE, content_type)], body).into_response()
    };
    // Whisper is billed by the audio's duration in OpenAI's API, and reports so.
    let usage = serde_json::json!({"type": "duration", "seconds": seconds.ceil()});
    match format {
        TextFormat::Json => {
            Json(serde_json::json!({ "text": transcript.text, "usage": usage })).into_response()
        }
        TextFormat::Text => text(
            "text/plain; charset=utf-8",
            format!("{}\n", transcript.text),
        ),
        TextFormat::Srt => text("application/x-subrip", to_srt(&transcript.segments)),
        TextFormat::Vtt => text("text/vtt", to_vtt(&transcript.segments)),
        TextFormat::VerboseJson => {
            let segments: Vec<serde_json::Value> = transcript
                .segments
                .iter()
                .enumerate()
                .map(|(id, s)| {
                    serde_json::json!({
                        "id": id,
                        "seek": (s.start * 100.0).round() as u64,
                        "start": s.start,
                        "end": s.end,
                        "text": s.text,
                        "tokens": s.tokens,
                        "temperature": s.temperature,
                        "avg_logprob": s.avg_logprob,
                        "compression_ratio": s.compression_ratio,
                        "no_speech_prob": s.no_speech_probability,
                    })
                })
                .collect();
            Json(serde_json::json!({
                "task": "transcribe",
                "language": transcript.language.as_deref().map_or("unknown", language_name),
                "duration": seconds,
                "text": transcript.text,
                "segments": segments,
                "usage": usage,
            }))
            .into_response()
        }
    }
}

/// OpenAI's verbose transcription names the language in English words.
fn language_name(code: &str) -> &str {
    match code {
        "en" => "english",
        "de" => "german",
        "fr" => "french",
        "es" => "spanish",
        "it" => "italian",
        "pt" => "portuguese",
        "nl" => "dutch",
        "zh" => "chinese",
        "ja" => "japanese",
        "ru" => "russian",
        other => other,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeechRequest {
    model: String,
    input: String,
    voice: String,
    response_format: Option<String>,
    speed: Option<f32>,
    instructions: Option<String>,
    stream_format: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AudioFormat {
    /// A WAV header (lengths unknown while streaming: the largest), then 16-bit samples at the
    /// voice's rate.
    Wav,
    /// Raw 16-bit little-endian samples at 24 kHz.
    Pcm,
}

pub(super) async fn speech(
    State(shared): State<Arc<Shared>>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let _active = shared.metrics.request(Endpoint::Speech);
    let result = speak(&shared, &client, &headers, body).await;
    result.unwrap_or_else(|error| {
        shared.metrics.failed(Endpoint::Speech);
        error.into_response()
    })
}

async fn speak(
    shared: &Arc<Shared>,
    client: &Client,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: SpeechRequest = json_body(headers, body)?;
    let models = &shared.config.models;
    models.check(&request.model, &models.speech, &SPEECH_ALIASES)?;
    let input = request.input.trim().to_string();
    if input.is_empty() || input.chars().count() > MAX_SPEECH_CHARS {
        return Err(ApiError::invalid(format!(
            "`input` must hold 1 to {MAX_SPEECH_CHARS} characters"
        ))
        .param("input"));
    }
    let voice = voice_for(&shared.voices, &request.voice)?;
    let format = match request.response_format.as_deref() {
        None | Some("wav") => AudioFormat::Wav,
        Some("pcm") => AudioFormat::Pcm,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`response_format` `{other}` is not supported here (wav, pcm)"
            ))
            .param("response_format"))
        }
    };
    let speed = request.speed.unwrap_or(1.0);
    if !(0.25..=4.0).contains(&speed) {
        return Err(ApiError::invalid("`speed` must lie in 0.25..=4").param("speed"));
    }
    if request.instructions.is_some_and(|i| !i.trim().is_empty()) {
        return Err(
            ApiError::invalid("`instructions` are not supported by these voices")
                .param("instructions"),
        );
    }
    if request.stream_format.is_some_and(|f| f != "audio") {
        return Err(
            ApiError::invalid("only `stream_format` `audio` is supported").param("stream_format"),
        );
    }
    let held = shared.access.hold(client)?;
    let (chunks, mut receiver) = mpsc::channel::<Result<Bytes, ApiError>>(16);
    let voices = shared.voices.clone();
    tokio::task::spawn_blocking(move || {
        let _held = held;
        if let Err(error) = synthesize(&voices, &voice, &input, speed, format, &chunks) {
            let _ = chunks.blocking_send(Err(error));
        }
    });
    // The first chunk decides between an error response and the stream.
    let first = match receiver.recv().await {
        Some(Ok(first)) => first,
        Some(Err(error)) => return Err(error),
        None => return Err(ApiError::server("the synthesis ended without audio")),
    };
    let metrics = Arc::clone(shared);
    let rest = futures_util::stream::unfold(receiver, move |mut receiver| {
        let metrics = Arc::clone(&metrics);
        async move {
            match receiver.recv().await? {
                Ok(bytes) => Some((Ok(bytes), receiver)),
                Err(error) => {
                    metrics.metrics.failed(Endpoint::Speech);
                    Some((
                        Err(std::io::Error::other(error.body().to_string())),
                        receiver,
                    ))
                }
            }
        }
    });
    let stream = futures_util::StreamExt::chain(
        futures_util::stream::iter([Ok::<_, std::io::Error>(first)]),
        rest,
    );
    let content_type = match format {
        AudioFormat::Wav => "audio/wav",
        AudioFormat::Pcm => "audio/pcm",
    };
    Ok((
        [(header::CONTENT_TYPE, content_type)],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The server's voice a request names: one of its own, or OpenAI's name for its default.
pub(super) fn voice_for(voices: &crate::serve::Voices, name: &str) -> Result<String, ApiError> {
    if voices.offers(name) {
        Ok(name.to_string())
    } else if OPENAI_VOICES.contains(&name) {
        Ok(voices.default_name().to_string())
    } else {
        Err(ApiError::invalid(format!(
            "no voice `{name}` here (the voices: {}, or OpenAI's names for the first)",
            voices.names().join(", ")
        ))
        .param("voice"))
    }
}

/// Synthesizes `input` sentence by sentence in `voice` at `speed`, sending each sentence's audio as it is
/// ready (after a WAV header for [`AudioFormat::Wav`]); stops when the client is gone.
fn synthesize(
    voices: &crate::serve::Voices,
    voice: &str,
    input: &str,
    speed: f32,
    format: AudioFormat,
    chunks: &mpsc::Sender<Result<Bytes, ApiError>>,
) -> Result<(), ApiError> {
    let factory = voices.get(Some(voice))?;
    let mut synthesizer = factory()?;
    let (mut sentences, rest) = spec_voice::split_sentences(input, true);
    if !rest.trim().is_empty() {
        sentences.push(rest);
    }
    let mut header_sent = false;
    for sentence in sentences.iter().filter(|s| !s.trim().is_empty()) {
        let synthesis = synthesizer
            .synthesize_at(sentence, speed)
            .map_err(|e| match e {
                spec_voice::Error::Input(_) => ApiError::invalid(e.to_string()).param("speed"),
                other => ApiError::server(other),
            })?;
        for chunk in &synthesis.chunks {
            let mut bytes = Vec::new();
            let samples = match format {
                AudioFormat::Pcm if chunk.sample_rate != PCM_SAMPLE_RATE => {
                    engine_asr::resample(&chunk.samples, chunk.sample_rate, PCM_SAMPLE_RATE)
                        .map_err(ApiError::server)?
                }
                _ => chunk.samples.clone(),
            };
            if format == AudioFormat::Wav && !header_sent {
                bytes.extend_from_slice(&streaming_wav_header(chunk.sample_rate));
                header_sent = true;
            }
            for sample in samples {
                let value = (sample.clamp(-1.0, 1.0) * f32::from(i16::MAX)).round() as i16;
                bytes.extend_from_slice(&value.to_le_bytes());
            }
            if chunks.blocking_send(Ok(Bytes::from(bytes))).is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// The header of a 16-bit mono WAV stream whose length is not known yet: its sizes are the
/// largest (the data's, the largest whole number of samples), as streaming servers write them;
/// readers take the data up to the end.
fn streaming_wav_header(sample_rate: u32) -> [u8; 44] {
    let mut header = [0u8; 44];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        header[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(b"RIFF");
    put(&u32::MAX.to_le_bytes());
    put(b"WAVEfmt ");
    put(&16u32.to_le_bytes());
    put(&1u16.to_le_bytes());
    put(&1u16.to_le_bytes());
    put(&sample_rate.to_le_bytes());
    put(&(sample_rate * 2).to_le_bytes());
    put(&2u16.to_le_bytes());
    put(&16u16.to_le_bytes());
    put(b"data");
    put(&(u32::MAX - 1).to_le_bytes());
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_streaming_wav_header_reads_as_16_bit_mono() {
        let mut bytes = streaming_wav_header(22_050).to_vec();
        for v in [0i16, 1000, -1000] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let reader = hound::WavReader::new(std::io::Cursor::new(&bytes)).unwrap();
        let spec = reader.spec();
        assert_eq!(
            (spec.channels, spec.sample_rate, spec.bits_per_sample),
            (1, 22_050, 16)
        );
    }
}
