//! The neural voices on ONNX Runtime (Kokoro-82M, Piper), from the models folder
//! (`../shared/models/fetch`): speech that Whisper base transcribes back to the sentence, and
//! bad input as typed errors. Ignored by plain `cargo test`; CI runs them with the real-model
//! tests.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::{audio::resample, wer::word_errors, LoadOptions, TranscribeOptions, Transcriber};
use engine_tts::kokoro::{KokoroSettings, KokoroSynthesizer};
use engine_tts::onnx::VoiceError;
use engine_tts::piper::{PiperSettings, PiperSynthesizer};
use spec_models::{Registry, Store};
use spec_voice::silence::{silence_after, silence_before, speech_span};
use spec_voice::{SentenceSynthesizer, SilenceMargins};

fn store() -> Store<'static> {
    Store::new(
        spec_models::models_dir().expect("models folder"),
        Registry::builtin(),
    )
}

fn models() -> PathBuf {
    spec_models::models_dir().expect("models folder")
}

fn kokoro(voice: &str) -> KokoroSynthesizer {
    let settings = KokoroSettings {
        voice: voice.into(),
        ..KokoroSettings::default()
    };
    KokoroSynthesizer::load(&models(), &settings)
        .unwrap_or_else(|e| panic!("{e} (run ../shared/models/fetch)"))
}

/// Everyday sentences of a spoken answer.
const SENTENCES: [&str; 4] = [
    "Hello there, how are you doing today?",
    "The weather should be sunny this afternoon, with a light breeze from the west.",
    "I can set a reminder for your dentist appointment on Thursday morning.",
    "Quantum computers use qubits, which can hold more than one state at once.",
];

/// Whisper base's word error rate over `tts`'s speech of [`SENTENCES`], after Whisper's
/// normalizer; prints each sentence's real-time factor and transcript.
fn round_trip_wer(label: &str, tts: &mut dyn SentenceSynthesizer) -> f64 {
    let whisper = store().resolve("whisper-base-ct2").unwrap();
    let mut transcriber = Transcriber::load(&whisper.dir, &LoadOptions::default()).unwrap();
    let normalizer =
        EnglishTextNormalizer::from_file(&store().data_file("whisper/english.json").unwrap())
            .unwrap();
    let options = TranscribeOptions {
        language: Some("en".into()),
        ..TranscribeOptions::default()
    };
    let (mut errors, mut words) = (0, 0);
    for sentence in SENTENCES {
        let started = Instant::now();
        let synthesis = tts.synthesize(sentence).unwrap();
        let compute = started.elapsed().as_secs_f64();
        let audio = synthesis.joined().unwrap();
        let seconds = audio.duration().as_secs_f64();
        assert!(
            (0.5..15.0).contains(&seconds),
            "{label}: {seconds} s for {sentence:?}"
        );
        let heard = transcriber
            .transcribe(
                &resample(&audio.samples, audio.sample_rate, 16_000).unwrap(),
                &options,
            )
            .unwrap();
        let reference = normalizer.normalize(sentence);
        let wer = word_errors(&reference, &normalizer.normalize(&heard.text));
        println!(
            "{label}: RTF {:.2}, WER {:.2}: {sentence:?} → {:?}",
            compute / seconds,
            wer.rate(),
            heard.text,
        );
        errors += wer.errors();
        words += reference.split_whitespace().count();
    }
    errors as f64 / words as f64
}

#[test]
#[ignore = "needs real models (../shared/models/fetch) and espeak-ng"]
fn whisper_hears_what_kokoro_says() {
    for voice in ["af_heart", "bm_george"] {
        let rate = round_trip_wer(&format!("kokoro:{voice}"), &mut kokoro(voice));
        assert!(rate <= 0.10, "{voice}: round-trip WER {rate:.3}");
    }
}

#[test]
#[ignore = "needs real models (../shared/models/fetch) and espeak-ng"]
fn whisper_hears_what_piper_says() {
    let mut piper = PiperSynthesizer::load(&models(), &PiperSettings::default())
        .unwrap_or_else(|e| panic!("{e} (run ../shared/models/fetch)"));
    let phonemes = piper.phonemes("Hello there, how are you?").unwrap();
    assert!(
        phonemes.contains(',') && phonemes.ends_with('?'),
        "{phonemes}"
    );
    let rate = round_trip_wer("piper:joe", &mut piper);
    assert!(rate <= 0.10, "round-trip WER {rate:.3}");
    assert!(matches!(
        piper.synthesize(" "),
        Err(spec_voice::Error::Input(_))
    ));
    assert!(piper.synthesize("🙂").unwrap().chunks.is_empty());
    let missing = PiperSynthesizer::load(
        &models(),
        &PiperSettings {
            voice: "piper-nobody".into(),
            ..PiperSettings::default()
        },
    )
    .unwrap_err();
    assert!(matches!(missing, VoiceError::File { .. }), "{missing}");
}

#[test]
#[ignore = "needs real models (../shared/models/fetch) and espeak-ng"]
fn kokoro_keeps_a_short_margin_of_its_own_silence() {
    let untrimmed = KokoroSettings {
        silence: None,
        ..KokoroSettings::default()
    };
    let own = KokoroSynthesizer::load(&models(), &untrimmed)
        .unwrap()
        .synthesize(SENTENCES[0])
        .unwrap()
        .joined()
        .unwrap();
    let trimmed = kokoro("af_heart")
        .synthesize(SENTENCES[0])
        .unwrap()
        .joined()
        .unwrap();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (before, after) = (ms(silence_before(&own)), ms(silence_after(&own)));
    assert!(
        before > 150.0 && after > 300.0,
        "the model's own silence: {before:.0} ms before, {after:.0} ms after"
    );
    let margins = SilenceMargins::default();
    let (before, after) = (ms(silence_before(&trimmed)), ms(silence_after(&trimmed)));
    assert!(
        (before - ms(margins.before)).abs() < 1.0 && (after - ms(margins.after)).abs() < 1.0,
        "trimmed: {before:.0} ms before, {after:.0} ms after"
    );
    // The same speech, only the silence around it shorter.
    let span = speech_span(&own.samples, own.sample_rate).unwrap();
    let keep = |d: Duration| spec_voice::samples_in(d, own.sample_rate);
    assert_eq!(
        trimmed.samples,
        own.samples[span.start - keep(margins.before)..span.end + keep(margins.after)]
    );
}

#[test]
#[ignore = "needs real models (../shared/models/fetch) and espeak-ng"]
fn bad_input_is_a_typed_error_or_silence() {
    let mut tts = kokoro("af_heart");
    assert!(matches!(
        tts.synthesize("  "),
        Err(spec_voice::Error::Input(_))
    ));
    // Nothing to say: no audio, no error.
    let silent = tts.synthesize("🙂 🙂").unwrap();
    assert!(silent.chunks.iter().all(|c| c.samples.is_empty()));
    // Symbols the vocabulary lacks are left out; the rest is spoken.
    let spoken = tts.synthesize("Hello ☃ world").unwrap();
    assert!(!spoken.joined().unwrap().samples.is_empty());
    // Text longer than one run of the model is cut at pauses and spoken whole.
    let long = "This sentence goes on, and on, and on. ".repeat(20);
    let synthesis = tts.synthesize(&long).unwrap();
    assert!(
        synthesis.chunks.len() > 1,
        "{} chunks",
        synthesis.chunks.len()
    );

    let unknown = KokoroSynthesizer::load(
        &models(),
        &KokoroSettings {
            voice: "xx_nobody".into(),
            ..KokoroSettings::default()
        },
    )
    .unwrap_err();
    match unknown {
        VoiceError::UnknownVoice { available, .. } => assert!(available.contains("af_heart")),
        other => panic!("{other}"),
    }
    let empty = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        models().join("onnxruntime"),
        empty.path().join("onnxruntime"),
    )
    .unwrap();
    let missing = KokoroSynthesizer::load(empty.path(), &KokoroSettings::default()).unwrap_err();
    assert!(matches!(missing, VoiceError::File { .. }), "{missing}");
    let too_fast = KokoroSettings {
        speed: 5.0,
        ..KokoroSettings::default()
    };
    assert!(matches!(
        KokoroSynthesizer::load(&models(), &too_fast),
        Err(VoiceError::Input(_))
    ));
}

#[test]
#[ignore = "needs real models (../shared/models/fetch) and espeak-ng"]
fn both_voices_speak_faster_at_a_higher_speed_and_refuse_speeds_out_of_range() {
    let piper = PiperSynthesizer::load(&models(), &PiperSettings::default()).unwrap();
    let voices: [(&str, Box<dyn SentenceSynthesizer>); 2] = [
        ("kokoro", Box::new(kokoro("af_heart"))),
        ("piper", Box::new(piper)),
    ];
    for (name, mut voice) in voices {
        let seconds = |voice: &mut Box<dyn SentenceSynthesizer>, speed: f32| {
            let audio = voice
                .synthesize_at(SENTENCES[1], speed)
                .unwrap()
                .joined()
                .unwrap();
            audio.samples.len() as f64 / f64::from(audio.sample_rate)
        };
        let (normal, fast) = (seconds(&mut voice, 1.0), seconds(&mut voice, 1.5));
        let ratio = fast / normal;
        assert!(
            (0.55..0.8).contains(&ratio),
            "{name}: 1.5× speed took {ratio:.2} of the time ({fast:.2} s against {normal:.2} s)"
        );
        // Speed 1 is the voice's own pace (Piper draws its noise afresh each time: compare
        // lengths).
        let own = voice.synthesize(SENTENCES[1]).unwrap().joined().unwrap();
        let own = own.samples.len() as f64 / f64::from(own.sample_rate);
        assert!(
            (own / normal - 1.0).abs() < 0.1,
            "{name}: {own:.2} s against {normal:.2} s at speed 1"
        );
        for bad in [0.2, 3.0] {
            assert!(
                matches!(
                    voice.synthesize_at(SENTENCES[0], bad),
                    Err(spec_voice::Error::Input(_))
                ),
                "{name} at {bad}"
            );
        }
    }
}
