//! The messages of the WebSocket protocol (`PROTOCOL.md` describes it for client authors):
//! JSON text messages both ways, binary messages of 16-bit PCM (little-endian) both ways.
//! Both sides are typed here, so a Rust client (the tests, the load test) speaks the protocol
//! with the server's own types.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::caption::{CaptionEvent, CaptionEventKind};
use crate::chat::{ChatEvent, ChatEventKind, VoiceTurn};
use engine_llm::predgen::EventKind;
use spec_voice::SpeechEvent;

/// Longest accepted target language name of a caption session, in characters.
pub const MAX_LANGUAGE_CHARS: usize = 40;

/// Longest accepted voice name, in characters.
pub const MAX_VOICE_CHARS: usize = 64;

/// What a session does with the audio.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum SessionMode {
    /// Voice chat: transcripts, the answer's text and audio.
    Chat,
    /// Live captions of the speech in the language `to`.
    Caption {
        #[serde(default = "default_language")]
        to: String,
    },
}

fn default_language() -> String {
    "German".to_string()
}

/// A client's text message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMessage {
    /// Opens the session; audio may be sent once the server answers `ready`. A chat session
    /// may name its `voice` (one of the server's `/voices`; by default the server's own).
    Start {
        #[serde(flatten)]
        mode: SessionMode,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        voice: Option<String>,
    },
    /// The audio ended: the server finishes the turn in progress, then sends `done`.
    Stop,
    /// Drops the answer being made (chat): the server sends `answer_cancelled`, and no more of
    /// its audio. An utterance in progress goes on.
    Cancel,
}

/// What went wrong, for the client's code to act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// A text message that is not a JSON object with a string `type`.
    BadJson,
    /// A `type` the protocol does not have.
    UnknownType,
    /// A known `type` with missing or wrong fields.
    BadMessage,
    /// A `start` naming a voice the server does not offer.
    UnknownVoice,
    /// An audio frame that is empty or has an odd number of bytes.
    BadFrame,
    /// An audio frame longer than the server's `max_frame_samples`.
    FrameTooLarge,
    /// Audio or `stop` before `start`.
    NotStarted,
    /// Audio while the session waits in the queue (before `ready`).
    NotReady,
    /// A second `start`.
    AlreadyStarted,
    /// Audio after `stop`.
    StreamEnded,
    /// Every engine is busy and the queue is full: the connection closes.
    Busy,
    /// The server is shutting down: no new session starts.
    ShuttingDown,
    /// Nothing arrived for the server's idle timeout, or no `start` within its handshake
    /// deadline.
    Timeout,
    /// More messages a second than the server takes: the connection closes.
    RateLimited,
    /// The session's pipeline failed; the connection closes.
    SessionFailed,
}

/// A time of the session's stream, in milliseconds from its `ready`.
pub type Millis = u64;

fn ms(duration: Duration) -> Millis {
    duration.as_millis().try_into().unwrap_or(Millis::MAX)
}

/// Where the time from the end of speech to the first audio went, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breakdown {
    pub endpointing_ms: Millis,
    pub asr_ms: Millis,
    pub llm_ms: Millis,
    pub tts_ms: Millis,
}

/// A server's text message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// The session is waiting for an engine, at `position` (1: next).
    Queued { position: usize },
    /// The session has an engine: send audio now, frames of at most `max_frame_samples`. A
    /// chat session's `voice` is the one it speaks with.
    Ready {
        #[serde(flatten)]
        mode: SessionMode,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        voice: Option<String>,
        sample_rate: u32,
        max_frame_samples: usize,
    },
    /// Speech started (detected at `at_ms`, begun at `started_at_ms`).
    SpeechStarted {
        at_ms: Millis,
        started_at_ms: Millis,
    },
    /// A partial transcript of the utterance so far (chat).
    Partial { at_ms: Millis, text: String },
    /// The chat model read the transcript of a pause: `probability` that the user's turn ends
    /// there, so the turn ends after `wait_ms` of silence (chat, semantic end of turn).
    EndOfTurn {
        at_ms: Millis,
        probability: f32,
        wait_ms: Millis,
    },
    /// The end of the turn was declared; speech ended at `speech_end_ms` (chat).
    SpeechEnded {
        at_ms: Millis,
        speech_end_ms: Millis,
    },
    /// The user spoke again soon after a turn ended early: its answer was dropped (no more of
    /// its audio follows; stop playing what came), and the turn goes on with the utterance
    /// that started at `utterance_start_ms` (chat).
    SpeechResumed {
        at_ms: Millis,
        utterance_start_ms: Millis,
    },
    /// The final transcript: the question (chat).
    Transcript { at_ms: Millis, text: String },
    /// An utterance without words (noise): ignored.
    NoWords { at_ms: Millis },
    /// The user spoke while an answer was being made: that answer was dropped, and no more of
    /// its audio follows (chat).
    BargeIn { at_ms: Millis },
    /// The client cancelled the answer being made: no more of its audio follows (chat; the
    /// Realtime API's `response.cancel`).
    AnswerCancelled { at_ms: Millis },
    /// The answer's first sentence is complete (chat).
    FirstSentence { at_ms: Millis, text: String },
    /// A later sentence of the answer is complete (chat).
    Sentence { at_ms: Millis, text: String },
    /// Audio of the answer follows as the next (binary) message: `samples` 16-bit samples at
    /// `sample_rate`, speaking `sentence` (chat).
    Audio {
        sentence: String,
        sample_rate: u32,
        samples: usize,
    },
    /// The answer is complete (chat).
    AnswerDone { at_ms: Millis, tokens: usize },
    /// A turn is complete: the question, the answer, and the latency from the end of speech
    /// to the first audio with its breakdown (chat).
    TurnDone {
        question: String,
        answer: String,
        speech_end_ms: Millis,
        first_audio_at_ms: Millis,
        latency_ms: Millis,
        breakdown: Breakdown,
        prepared_audio_used: bool,
    },
    /// A caption of the transcript `source`: `display` to show now, `output` the whole
    /// translation, `final` once the utterance is complete (caption).
    Caption {
        at_ms: Millis,
        source: String,
        display: String,
        output: String,
        #[serde(rename = "final")]
        is_final: bool,
    },
    /// The server is shutting down: the turn in progress completes, then `done`.
    ShuttingDown,
    /// Something the client sent, or the session, went wrong.
    Error { code: ErrorCode, message: String },
    /// The session is over (everything it made was sent); the server closes the connection.
    Done,
}

impl ServerMessage {
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Error {
            code,
            message: message.into(),
        }
    }
}

/// What a session sends its client: messages, and the audio that follows an `audio` message.
#[derive(Clone, Debug, PartialEq)]
pub enum Outgoing {
    Message(ServerMessage),
    Binary(Vec<u8>),
}

impl From<ServerMessage> for Outgoing {
    fn from(message: ServerMessage) -> Self {
        Self::Message(message)
    }
}

/// A malformed client message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProtocolError {
    pub code: ErrorCode,
    pub message: String,
}

impl ProtocolError {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<ProtocolError> for ServerMessage {
    fn from(error: ProtocolError) -> Self {
        Self::error(error.code, error.message)
    }
}

/// Reads a client's text message.
pub fn parse_client(text: &str) -> Result<ClientMessage, ProtocolError> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| ProtocolError::new(ErrorCode::BadJson, format!("not JSON: {e}")))?;
    let kind = value
        .get("type")
        .and_then(|t| t.as_str())
        .map(str::to_string)
        .ok_or_else(|| {
            ProtocolError::new(
                ErrorCode::BadJson,
                "expected an object with a string `type`",
            )
        })?;
    if !matches!(kind.as_str(), "start" | "stop" | "cancel") {
        let shown: String = kind.chars().take(40).collect();
        return Err(ProtocolError::new(
            ErrorCode::UnknownType,
            format!("unknown message type `{shown}` (start, stop, cancel)"),
        ));
    }
    let message: ClientMessage = serde_json::from_value(value)
        .map_err(|e| ProtocolError::new(ErrorCode::BadMessage, format!("`{kind}`: {e}")))?;
    match &message {
        ClientMessage::Start {
            mode: SessionMode::Caption { .. },
            voice: Some(_),
        } => {
            return Err(ProtocolError::new(
                ErrorCode::BadMessage,
                "`voice` is for chat sessions: captions are not spoken",
            ))
        }
        ClientMessage::Start {
            mode: SessionMode::Caption { to },
            ..
        } => check_language(to)?,
        ClientMessage::Start {
            voice: Some(voice), ..
        } => check_voice(voice)?,
        _ => {}
    }
    Ok(message)
}

/// A voice is named as `--voice` takes it (`kokoro:af_heart`): letters, digits, `:`, `_`, `-`
/// and `.`.
fn check_voice(voice: &str) -> Result<(), ProtocolError> {
    let fits = !voice.is_empty()
        && voice.chars().count() <= MAX_VOICE_CHARS
        && voice
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ":_-.".contains(c));
    match fits {
        true => Ok(()),
        false => Err(ProtocolError::new(
            ErrorCode::BadMessage,
            format!(
                "`voice` must be a voice name (letters, digits, `:`, `_`, `-`, `.`), at most \
                 {MAX_VOICE_CHARS} characters"
            ),
        )),
    }
}

/// A target language is a name (letters, spaces, hyphens), as it goes into the model's prompt.
fn check_language(to: &str) -> Result<(), ProtocolError> {
    let name = to.trim();
    let fits = !name.is_empty()
        && name.chars().count() <= MAX_LANGUAGE_CHARS
        && name
            .chars()
            .all(|c| c.is_alphabetic() || c == ' ' || c == '-');
    match fits {
        true => Ok(()),
        false => Err(ProtocolError::new(
            ErrorCode::BadMessage,
            format!(
                "`to` must be a language name of letters, spaces and hyphens, at most \
                 {MAX_LANGUAGE_CHARS} characters"
            ),
        )),
    }
}

/// Reads a binary audio frame: 16-bit little-endian mono PCM at 16 kHz, 1 to `max_samples`
/// samples.
pub fn decode_frame(bytes: &[u8], max_samples: usize) -> Result<Vec<f32>, ProtocolError> {
    if bytes.is_empty() {
        return Err(ProtocolError::new(ErrorCode::BadFrame, "empty audio frame"));
    }
    if !bytes.len().is_multiple_of(2) {
        return Err(ProtocolError::new(
            ErrorCode::BadFrame,
            format!(
                "an audio frame of {} bytes: 16-bit samples take 2 bytes each",
                bytes.len()
            ),
        ));
    }
    if bytes.len() / 2 > max_samples {
        return Err(ProtocolError::new(
            ErrorCode::FrameTooLarge,
            format!(
                "an audio frame of {} samples: at most {max_samples} per frame",
                bytes.len() / 2
            ),
        ));
    }
    Ok(bytes
        .chunks_exact(2)
        .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0)
        .collect())
}

/// Writes samples in [-1, 1] as 16-bit little-endian PCM (clamped; NaN becomes 0).
pub fn encode_pcm(samples: &[f32]) -> Vec<u8> {
    samples
        .iter()
        .flat_map(|&s| {
            let s = if s.is_nan() { 0.0 } else { s.clamp(-1.0, 1.0) };
            ((s * 32767.0).round() as i16).to_le_bytes()
        })
        .collect()
}

/// What a voice chat event tells the client.
pub(crate) fn chat_messages(event: ChatEvent) -> Vec<Outgoing> {
    let at_ms = ms(event.at);
    let message = match event.kind {
        ChatEventKind::SpeechStarted { started_at } => ServerMessage::SpeechStarted {
            at_ms,
            started_at_ms: ms(started_at),
        },
        ChatEventKind::Partial { text } => ServerMessage::Partial { at_ms, text },
        ChatEventKind::SpeechEnded { speech_end } => ServerMessage::SpeechEnded {
            at_ms,
            speech_end_ms: ms(speech_end),
        },
        ChatEventKind::EndOfTurn { probability, wait } => ServerMessage::EndOfTurn {
            at_ms,
            probability,
            wait_ms: ms(wait),
        },
        ChatEventKind::SpeechResumed {
            utterance_start, ..
        } => ServerMessage::SpeechResumed {
            at_ms,
            utterance_start_ms: ms(utterance_start),
        },
        ChatEventKind::Transcript { text } => ServerMessage::Transcript { at_ms, text },
        ChatEventKind::NoWords => ServerMessage::NoWords { at_ms },
        ChatEventKind::BargeIn => ServerMessage::BargeIn { at_ms },
        ChatEventKind::AnswerCancelled => ServerMessage::AnswerCancelled { at_ms },
        ChatEventKind::TurnDone(turn) => turn_done(&turn),
        ChatEventKind::Answer(kind) => return answer_messages(at_ms, kind),
    };
    vec![message.into()]
}

fn answer_messages(at_ms: Millis, kind: EventKind) -> Vec<Outgoing> {
    match kind {
        EventKind::FirstSentence { text } => {
            vec![ServerMessage::FirstSentence { at_ms, text }.into()]
        }
        EventKind::Speech(SpeechEvent::Sentence { text, audio, .. }) => {
            let mut out = vec![ServerMessage::Sentence { at_ms, text }.into()];
            out.extend(audio_messages(&audio));
            out
        }
        // The first sentence's audio: its first piece, then (when it is cut) the rest.
        EventKind::Speech(
            SpeechEvent::AudioStarts { audio, .. } | SpeechEvent::FirstSentenceRest { audio, .. },
        ) => audio_messages(&audio),
        EventKind::AnswerDone { tokens } => {
            vec![ServerMessage::AnswerDone { at_ms, tokens }.into()]
        }
        // PredGen's own work (guesses, verifications, audio prepared ahead) stays inside the
        // server; a first piece goes out as its audio, a later sentence with its audio.
        EventKind::Completed { .. }
        | EventKind::EndOfTurn { .. }
        | EventKind::Heard { .. }
        | EventKind::Verified { .. }
        | EventKind::Generated { .. }
        | EventKind::SpeakAhead { .. }
        | EventKind::FirstPiece { .. }
        | EventKind::NextSentence { .. }
        | EventKind::Speech(SpeechEvent::Prepared { .. })
        | EventKind::Interrupted => Vec::new(),
    }
}

/// An `audio` header and its samples for each chunk of a sentence's audio.
fn audio_messages(audio: &spec_voice::Synthesis) -> Vec<Outgoing> {
    audio
        .chunks
        .iter()
        .filter(|chunk| !chunk.samples.is_empty())
        .flat_map(|chunk| {
            [
                ServerMessage::Audio {
                    sentence: audio.sentence.clone(),
                    sample_rate: chunk.sample_rate,
                    samples: chunk.samples.len(),
                }
                .into(),
                Outgoing::Binary(encode_pcm(&chunk.samples)),
            ]
        })
        .collect()
}

fn turn_done(turn: &VoiceTurn) -> ServerMessage {
    let parts = turn.breakdown();
    ServerMessage::TurnDone {
        question: turn.turn.question.clone(),
        answer: turn.turn.answer.clone(),
        speech_end_ms: ms(turn.speech_end),
        first_audio_at_ms: ms(turn.first_audio_at),
        latency_ms: ms(turn.latency()),
        breakdown: Breakdown {
            endpointing_ms: ms(parts.endpointing),
            asr_ms: ms(parts.asr),
            llm_ms: ms(parts.llm),
            tts_ms: ms(parts.tts),
        },
        prepared_audio_used: turn.speech.prepared_audio_used,
    }
}

/// What a live captions event tells the client.
pub(crate) fn caption_messages(event: CaptionEvent) -> Vec<Outgoing> {
    let at_ms = ms(event.at);
    let message = match event.kind {
        CaptionEventKind::SpeechStarted { started_at } => ServerMessage::SpeechStarted {
            at_ms,
            started_at_ms: ms(started_at),
        },
        CaptionEventKind::Caption { source, caption } => ServerMessage::Caption {
            at_ms,
            source,
            display: caption.display,
            output: caption.output,
            is_final: caption.is_final,
        },
        CaptionEventKind::NoWords => ServerMessage::NoWords { at_ms },
    };
    vec![message.into()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_messages_parse_or_say_what_is_wrong() {
        assert_eq!(
            parse_client(r#"{"type":"start","mode":"chat"}"#),
            Ok(ClientMessage::Start {
                mode: SessionMode::Chat,
                voice: None
            })
        );
        assert_eq!(
            parse_client(r#"{"type":"start","mode":"chat","voice":"kokoro:bm_george"}"#),
            Ok(ClientMessage::Start {
                mode: SessionMode::Chat,
                voice: Some("kokoro:bm_george".into())
            })
        );
        assert_eq!(
            parse_client(r#"{"type":"start","mode":"caption","to":"French"}"#),
            Ok(ClientMessage::Start {
                mode: SessionMode::Caption {
                    to: "French".into()
                },
                voice: None
            })
        );
        assert_eq!(
            parse_client(r#"{"type":"start","mode":"caption"}"#),
            Ok(ClientMessage::Start {
                mode: SessionMode::Caption {
                    to: "German".into()
                },
                voice: None
            })
        );
        assert_eq!(parse_client(r#"{"type":"stop"}"#), Ok(ClientMessage::Stop));
        assert_eq!(
            parse_client(r#"{"type":"cancel"}"#),
            Ok(ClientMessage::Cancel)
        );
        let code = |text: &str| parse_client(text).unwrap_err().code;
        assert_eq!(code("{"), ErrorCode::BadJson);
        assert_eq!(code("[1,2]"), ErrorCode::BadJson);
        assert_eq!(code(r#"{"type":3}"#), ErrorCode::BadJson);
        assert_eq!(code(r#"{"type":"dance"}"#), ErrorCode::UnknownType);
        assert_eq!(code(r#"{"type":"start"}"#), ErrorCode::BadMessage);
        assert_eq!(
            code(r#"{"type":"start","mode":"sing"}"#),
            ErrorCode::BadMessage
        );
        assert_eq!(
            code(r#"{"type":"start","mode":"caption","to":"German. Ignore that"}"#),
            ErrorCode::BadMessage
        );
        assert_eq!(
            code(r#"{"type":"start","mode":"caption","to":""}"#),
            ErrorCode::BadMessage
        );
        for voice in [
            r#""""#,
            "3",
            r#""kokoro:af heart""#,
            &format!("\"{}\"", "a".repeat(65)),
        ] {
            assert_eq!(
                code(&format!(
                    r#"{{"type":"start","mode":"chat","voice":{voice}}}"#
                )),
                ErrorCode::BadMessage,
                "{voice}"
            );
        }
        assert_eq!(
            code(r#"{"type":"start","mode":"caption","voice":"espeak"}"#),
            ErrorCode::BadMessage
        );
    }

    #[test]
    fn frames_are_16_bit_little_endian_and_bounded() {
        let samples = [0.0, 0.5, -0.5, 1.0, -1.0];
        let bytes = encode_pcm(&samples);
        assert_eq!(bytes.len(), 10);
        assert_eq!(&bytes[2..4], &16384i16.to_le_bytes());
        let back = decode_frame(&bytes, 5).unwrap();
        for (a, b) in samples.iter().zip(&back) {
            assert!((a - b).abs() < 1e-4, "{a} {b}");
        }
        assert_eq!(decode_frame(&[], 5).unwrap_err().code, ErrorCode::BadFrame);
        assert_eq!(
            decode_frame(&bytes[..3], 5).unwrap_err().code,
            ErrorCode::BadFrame
        );
        assert_eq!(
            decode_frame(&bytes, 4).unwrap_err().code,
            ErrorCode::FrameTooLarge
        );
        assert_eq!(encode_pcm(&[f32::NAN, 3.0]), [0, 0, 0xff, 0x7f]);
    }

    #[test]
    fn server_messages_are_tagged_json() {
        let ready = ServerMessage::Ready {
            mode: SessionMode::Caption {
                to: "German".into(),
            },
            voice: None,
            sample_rate: 16_000,
            max_frame_samples: 16_000,
        };
        let json = serde_json::to_value(&ready).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "ready", "mode": "caption", "to": "German",
                "sample_rate": 16000, "max_frame_samples": 16000})
        );
        let ready = ServerMessage::Ready {
            mode: SessionMode::Chat,
            voice: Some("espeak".into()),
            sample_rate: 16_000,
            max_frame_samples: 320,
        };
        let json = serde_json::to_string(&ready).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&json).unwrap(),
            serde_json::json!({"type": "ready", "mode": "chat", "voice": "espeak",
                "sample_rate": 16000, "max_frame_samples": 320})
        );
        assert_eq!(serde_json::from_str::<ServerMessage>(&json).unwrap(), ready);
        let caption = ServerMessage::Caption {
            at_ms: 5,
            source: "hi".into(),
            display: "hallo".into(),
            output: "hallo".into(),
            is_final: true,
        };
        let json = serde_json::to_string(&caption).unwrap();
        assert!(json.contains(r#""final":true"#), "{json}");
        assert_eq!(
            serde_json::from_str::<ServerMessage>(&json).unwrap(),
            caption
        );
        let error = ServerMessage::error(ErrorCode::FrameTooLarge, "x");
        assert_eq!(
            serde_json::to_value(&error).unwrap(),
            serde_json::json!({"type": "error", "code": "frame_too_large", "message": "x"})
        );
    }
}
