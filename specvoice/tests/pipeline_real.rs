//! The voice pipeline on real weights from `../shared/models/fetch` (Whisper tiny.en,
//! Qwen2.5-Coder 0.5B) with speech from espeak-ng and the real clips. Ignored by plain
//! `cargo test`; CI runs them with `cargo test --release -- --ignored` after fetching the models
//! and installing espeak-ng.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::wer::word_errors;
use engine_asr::{resample, Audio, LoadOptions as AsrLoadOptions, TranscribeOptions, Transcriber};
use engine_llm::predgen::EventKind;
use engine_llm::{LanguageModel, LoadOptions, PredGen, PredGenConfig};
use engine_mt::{LiveConfig, LiveTranslator};
use engine_tts::espeak::{EspeakSettings, EspeakSynthesizer};
use engine_tts::kokoro::{KokoroSettings, KokoroSynthesizer};
use spec_models::{Registry, Store};
use spec_voice::{SentenceSynthesizer, SpeechEvent};
use specvoice::{
    play_recording, CaptionEventKind, ChatEventKind, ChatMode, ClockKind, Listener, ListenerConfig,
    LiveCaptions, VoiceChat, VoiceTurn,
};

mod common;

const WHISPER: &str = "whisper-tiny.en-ct2";
const CHAT: &str = "qwen2.5-coder-0.5b-instruct";

fn store() -> Store<'static> {
    Store::new(
        spec_models::models_dir().expect("models folder"),
        Registry::builtin(),
    )
}

fn whisper() -> Transcriber {
    let files = store()
        .resolve(WHISPER)
        .unwrap_or_else(|e| panic!("{WHISPER}: {e} (run ../shared/models/fetch)"));
    Transcriber::load(&files.dir, &AsrLoadOptions::default()).unwrap()
}

fn chat_model() -> LanguageModel {
    LanguageModel::open(CHAT, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{CHAT}: {e} (run ../shared/models/fetch)"))
}

fn espeak() -> EspeakSynthesizer {
    EspeakSynthesizer::new(EspeakSettings::default())
        .expect("espeak-ng (apt-get install espeak-ng)")
}

/// `text` spoken by espeak-ng after 300 ms of silence, and where its speech ends.
fn spoken(text: &str) -> (Vec<f32>, Duration) {
    common::spoken(text, Duration::from_millis(300))
}

fn converse(
    whisper: Transcriber,
    model: &mut LanguageModel,
    mode: ChatMode,
    audio: &[f32],
) -> (Vec<VoiceTurn>, usize, Transcriber) {
    converse_with(whisper, model, mode, audio, Box::new(espeak()))
}

fn converse_with(
    whisper: Transcriber,
    model: &mut LanguageModel,
    mode: ChatMode,
    audio: &[f32],
    voice: Box<dyn SentenceSynthesizer>,
) -> (Vec<VoiceTurn>, usize, Transcriber) {
    let config = PredGenConfig {
        max_answer_tokens: 32,
        ..PredGenConfig::default()
    };
    let mut chat = VoiceChat::new(
        Listener::new(whisper, ListenerConfig::default()).unwrap(),
        PredGen::new(model, config).unwrap(),
        voice,
        mode,
        ClockKind::Simulated,
    );
    let mut partials_while_speaking = 0;
    let mut speech_end = None;
    let turns = chat
        .play(
            audio,
            Duration::from_millis(800),
            &mut |event| match &event.kind {
                ChatEventKind::Partial { .. } if speech_end.is_none() => {
                    partials_while_speaking += 1;
                }
                ChatEventKind::SpeechEnded { .. } => speech_end = Some(event.at),
                _ => {}
            },
        )
        .unwrap();
    (
        turns,
        partials_while_speaking,
        chat.into_parts().0.into_transcriber(),
    )
}

#[test]
#[ignore = "needs the real models (../shared/models/fetch) and espeak-ng"]
fn spoken_questions_are_answered_by_predgen_exactly_as_by_the_cascade() {
    let mut model = chat_model();
    let mut whisper = Some(whisper());
    for (question, key_word) in [
        (
            "How long does it take to walk five kilometers?",
            "kilometers",
        ),
        ("What should I pack for a weekend camping trip?", "camping"),
    ] {
        let (audio, speech_end) = spoken(question);
        let (cascade, _, w) = converse(
            whisper.take().unwrap(),
            &mut model,
            ChatMode::Cascade,
            &audio,
        );
        let (predgen, partials, w) = converse(w, &mut model, ChatMode::PredGen, &audio);
        whisper = Some(w);
        assert_eq!((cascade.len(), predgen.len()), (1, 1), "{question}");
        let (c, p) = (&cascade[0], &predgen[0]);
        assert!(
            p.turn.question.to_lowercase().contains(key_word),
            "{question} heard as {:?}",
            p.turn.question
        );
        assert_eq!(p.turn.question, c.turn.question);
        assert_eq!(p.turn.answer, c.turn.answer, "{question}");
        assert!(!p.turn.answer.is_empty() && p.audio().count() > 0);
        // The detector finds the end of the words within a frame or two of the audio's.
        let error = p.speech_end.as_secs_f64() - speech_end.as_secs_f64();
        assert!(
            error.abs() < 0.06,
            "{question}: speech end off by {error:.3} s"
        );
        assert!(
            partials >= 2,
            "{question}: {partials} partials while speaking"
        );
    }
}

#[test]
#[ignore = "needs the real models (../shared/models/fetch) and espeak-ng"]
fn a_spoken_question_is_answered_aloud_with_kokoro() {
    let models = spec_models::models_dir().unwrap();
    let kokoro = || -> Box<dyn SentenceSynthesizer> {
        Box::new(KokoroSynthesizer::load(&models, &KokoroSettings::default()).unwrap())
    };
    let mut model = chat_model();
    let question = "What should I pack for a weekend camping trip?";
    let (audio, _) = spoken(question);
    let (cascade, _, whisper) =
        converse_with(whisper(), &mut model, ChatMode::Cascade, &audio, kokoro());
    let (predgen, _, mut whisper) =
        converse_with(whisper, &mut model, ChatMode::PredGen, &audio, kokoro());
    let (c, p) = (&cascade[0], &predgen[0]);
    assert_eq!(p.turn.answer, c.turn.answer);
    // A guessed first sentence is prepared only while the user is silent.
    for event in &p.turn.timeline {
        if let EventKind::Speech(SpeechEvent::Prepared { .. }) = event.kind {
            assert!(event.at >= p.speech_end, "prepared at {:?}", event.at);
        }
    }
    // The first sentence is heard back from Kokoro's 24 kHz audio.
    let first = &p.speech.audio[0];
    let audio = first.joined().unwrap();
    assert_eq!(audio.sample_rate, 24_000);
    let heard = whisper
        .transcribe(
            &resample(&audio.samples, audio.sample_rate, 16_000).unwrap(),
            &TranscribeOptions::default(),
        )
        .unwrap();
    let normalizer =
        EnglishTextNormalizer::from_file(&store().data_file("whisper/english.json").unwrap())
            .unwrap();
    let reference = normalizer.normalize(&first.sentence);
    let errors = word_errors(&reference, &normalizer.normalize(&heard.text));
    assert!(
        errors.rate() <= 0.25,
        "{:?} heard as {:?}",
        first.sentence,
        heard.text
    );
}

#[test]
#[ignore = "needs the real models (../shared/models/fetch)"]
fn live_captions_of_a_real_clip_commit_the_translation_of_its_transcript() {
    let mut model = chat_model();
    let clip = store()
        .root()
        .join("data/speech/librivox/sense_and_sensibility_01_austen_64kb-0880.wav");
    let audio = Audio::read_wav(&clip).unwrap().to_16k().unwrap();
    let audio = [vec![0.0; 4_800], audio].concat();
    let config = LiveConfig {
        max_tokens: 48,
        ..LiveConfig::new("German")
    };
    let translator = LiveTranslator::new(&mut model, config.clone()).unwrap();
    let listener = Listener::new(whisper(), ListenerConfig::default()).unwrap();
    let mut captions = LiveCaptions::new(listener, translator, ClockKind::Simulated);
    let mut shown = Vec::new();
    play_recording(
        &mut captions,
        &audio,
        Duration::from_millis(800),
        &mut |e| {
            if let CaptionEventKind::Caption { source, caption } = e.kind {
                shown.push((source, caption));
            }
        },
    )
    .unwrap();
    assert!(shown.len() >= 3, "{shown:?}");
    let (source, last) = shown.last().unwrap();
    assert!(last.is_final);
    assert!(source.to_lowercase().contains("young man"), "{source}");
    drop(captions);
    let ar = LiveConfig {
        max_tokens: config.max_tokens,
        ..LiveConfig::autoregressive("German")
    };
    let expected = LiveTranslator::new(&mut model, ar)
        .unwrap()
        .update(&spec_voice::Partial::new(Duration::ZERO, source, true))
        .unwrap();
    assert_eq!(last.output, expected.output);
}

#[test]
#[ignore = "needs the real models (../shared/models/fetch) and espeak-ng"]
fn the_command_line_answers_a_recording_and_writes_the_audio() {
    let dir = tempfile::tempdir().unwrap();
    let question: PathBuf = dir.path().join("question.wav");
    let answer: PathBuf = dir.path().join("answer.wav");
    let (audio, _) = spoken("Why do cats purr?");
    let chunk = spec_voice::AudioChunk {
        samples: audio,
        sample_rate: 16_000,
    };
    spec_voice::write_wav(&question, [&chunk]).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_specvoice"))
        .args(["chat", "--model", CHAT, "--max-tokens", "24", "--audio"])
        .arg(&question)
        .arg("--out")
        .arg(&answer)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("| 1 | cascade |") && stdout.contains("| 1 | PredGen |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| true |"),
        "PredGen's answer differs: {stdout}"
    );
    let written = Audio::read_wav(&answer).unwrap();
    assert!(written.duration_seconds() > 0.5);
    // A missing recording is a clear error.
    let missing = Command::new(env!("CARGO_BIN_EXE_specvoice"))
        .args(["chat", "--audio", "/no/such.wav"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/no/such.wav"));
}
