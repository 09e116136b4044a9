//! Language detection and translation on the multilingual Whisper base, with German, French and
//! Spanish sentences spoken by espeak-ng (CI installs it) and the real weights of
//! `../shared/models/fetch`. Ignored by plain `cargo test`; CI runs them with `--ignored`.

use std::path::Path;
use std::process::Command;

use engine_asr::normalize::basic_normalize;
use engine_asr::{Audio, Error, LoadOptions, Task, TranscribeOptions, Transcriber};
use spec_models::{Registry, Store};

/// espeak-ng's voice and speed (words a minute), Whisper's language code, the sentence, and
/// English words its translation must mostly hold (stems, `|` between alternatives: "sleep"
/// matches "sleeping"). Whisper base hears espeak-ng's robotic voices imperfectly (faster-whisper
/// with the same weights hears "Hund" as "gun" at espeak-ng's default speed), so the sentences
/// are everyday ones it translates well: the checks are of the task, not of the model.
const CLIPS: [(&str, u32, &str, &str, &[&str]); 3] = [
    (
        "de",
        130,
        "de",
        "Das Wetter ist heute sehr schön. Ich gehe mit meinem Hund in den Park.",
        &["dog", "go", "today|park|weather"],
    ),
    (
        "fr-fr",
        175,
        "fr",
        "Bonjour. Je voudrais un café et un croissant, s'il vous plaît.",
        &["good morning|hello", "coffee", "please|like|croissant"],
    ),
    (
        "es",
        130,
        "es",
        "Buenos días. Quiero un café con leche, por favor.",
        &["good morning|good day|hello", "coffee", "milk", "please"],
    ),
];

fn transcriber(name: &str) -> Transcriber {
    let store = Store::new(
        spec_models::models_dir().expect("models folder"),
        Registry::builtin(),
    );
    let model = store
        .resolve(name)
        .unwrap_or_else(|e| panic!("{name}: {e} (run ../shared/models/fetch)"));
    Transcriber::load(&model.dir, &LoadOptions::default()).unwrap()
}

/// `text` spoken by espeak-ng's `voice` at `speed` words a minute, at 16 kHz.
fn speak(dir: &Path, voice: &str, speed: u32, text: &str) -> Vec<f32> {
    let path = dir.join(format!("{voice}.wav"));
    let status = Command::new("espeak-ng")
        .args(["-v", voice, "-s", &speed.to_string(), "-w"])
        .arg(&path)
        .arg(text)
        .status()
        .expect("espeak-ng (apt-get install espeak-ng)");
    assert!(status.success(), "espeak-ng -v {voice}");
    Audio::read(&path).unwrap().to_16k().unwrap()
}

/// The words of `text` (lower case, no punctuation).
fn words(text: &str) -> Vec<String> {
    basic_normalize(text)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "needs real models (../shared/models/fetch) and espeak-ng"]
fn base_detects_the_language_and_translates_to_english() {
    let dir = tempfile::tempdir().unwrap();
    let mut base = transcriber("whisper-base-ct2");
    for (voice, speed, language, sentence, english) in CLIPS {
        let samples = speak(dir.path(), voice, speed, sentence);
        eprintln!("{language}: {sentence}");
        // Detected: the language, and a transcript in it.
        let heard = base
            .transcribe(&samples, &TranscribeOptions::default())
            .unwrap();
        eprintln!("  transcribed: {}", heard.text);
        assert_eq!(heard.language.as_deref(), Some(language), "{}", heard.text);
        let source_words = words(sentence);
        let transcribed = words(&heard.text);
        let kept = source_words
            .iter()
            .filter(|w| transcribed.contains(w))
            .count();
        assert!(
            kept * 2 >= source_words.len(),
            "{language}: transcript {:?} has {kept} of the {} words of {sentence:?}",
            heard.text,
            source_words.len()
        );
        // Translated, with the language detected and given.
        for given in [None, Some(language.to_string())] {
            let options = TranscribeOptions {
                task: Task::Translate,
                language: given.clone(),
                ..TranscribeOptions::default()
            };
            let translation = base.transcribe(&samples, &options).unwrap();
            eprintln!("  translated ({given:?}): {}", translation.text);
            assert_eq!(translation.language.as_deref(), Some(language));
            let text = basic_normalize(&translation.text);
            let found = english
                .iter()
                .filter(|stems| stems.split('|').any(|stem| text.contains(stem)))
                .count();
            assert!(
                found * 3 >= english.len() * 2,
                "{language} ({given:?}): translation {:?} has {found} of {english:?}",
                translation.text
            );
            // English, not the sentence again: few of the source's longer words remain.
            let long: Vec<&String> = source_words.iter().filter(|w| w.len() >= 4).collect();
            let translated = words(&translation.text);
            let left = long.iter().filter(|w| translated.contains(w)).count();
            assert!(
                left * 3 <= long.len(),
                "{language}: translation {:?} keeps {left} of {long:?}",
                translation.text
            );
        }
    }
}

/// English speech is detected as English, and translating it keeps it English.
#[test]
#[ignore = "needs real models (../shared/models/fetch) and espeak-ng"]
fn base_detects_english_and_its_translation_stays_english() {
    let dir = tempfile::tempdir().unwrap();
    let mut base = transcriber("whisper-base-ct2");
    let sentence = "The library opens at nine in the morning on weekdays.";
    let samples = speak(dir.path(), "en", 175, sentence);
    let heard = base
        .transcribe(&samples, &TranscribeOptions::default())
        .unwrap();
    assert_eq!(heard.language.as_deref(), Some("en"));
    let translated = base
        .transcribe(
            &samples,
            &TranscribeOptions {
                task: Task::Translate,
                ..TranscribeOptions::default()
            },
        )
        .unwrap();
    let text = basic_normalize(&translated.text);
    for word in ["library", "morning"] {
        assert!(text.contains(word), "{text}");
    }
}

/// An English-only model cannot translate or transcribe another language: a typed error that
/// says so, not an English transcript.
#[test]
#[ignore = "needs real models (../shared/models/fetch) and espeak-ng"]
fn an_english_only_model_refuses_translation_and_other_languages() {
    let dir = tempfile::tempdir().unwrap();
    let mut tiny = transcriber("whisper-tiny.en-ct2");
    let samples = speak(dir.path(), "de", 175, CLIPS[0].3);
    for options in [
        TranscribeOptions {
            task: Task::Translate,
            ..TranscribeOptions::default()
        },
        TranscribeOptions {
            language: Some("de".into()),
            ..TranscribeOptions::default()
        },
    ] {
        let error = tiny.transcribe(&samples, &options).unwrap_err();
        assert!(matches!(error, Error::Language(_)), "{error}");
        assert!(error.to_string().contains("English-only"), "{error}");
    }
    // English on it is fine.
    let english = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    assert!(tiny.transcribe(&samples, &english).is_ok());
}
