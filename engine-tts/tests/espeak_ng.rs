//! The espeak-ng synthesizer on the real program.

use std::time::Duration;

use engine_tts::espeak::{EspeakError, EspeakSettings, EspeakSynthesizer, MAX_CHUNK_SECONDS};
use spec_voice::{AudioChunk, SentenceSynthesizer, Synthesis};

fn synthesizer() -> EspeakSynthesizer {
    EspeakSynthesizer::new(EspeakSettings::default()).expect("espeak-ng runs")
}

fn samples(synthesis: &Synthesis) -> Vec<f32> {
    synthesis
        .chunks
        .iter()
        .flat_map(|c| c.samples.iter().copied())
        .collect()
}

fn duration(synthesis: &Synthesis) -> Duration {
    synthesis.chunks.iter().map(AudioChunk::duration).sum()
}

fn rms(samples: &[f32]) -> f32 {
    (samples.iter().map(|s| s * s).sum::<f32>() / samples.len().max(1) as f32).sqrt()
}

#[test]
#[ignore = "needs espeak-ng (apt-get install espeak-ng)"]
fn speaks_a_sentence_in_half_second_chunks_at_22050_hz() {
    let mut tts = synthesizer();
    assert!(tts.version().contains("eSpeak NG"), "{}", tts.version());
    let synthesis = tts
        .synthesize("  Hello there, how are you today?\n")
        .unwrap();
    assert_eq!(synthesis.sentence, "Hello there, how are you today?");
    assert!(synthesis.first_audio_after > Duration::ZERO);
    assert!(synthesis.chunks.len() > 1);
    let max_len = (MAX_CHUNK_SECONDS * 22_050.0) as usize;
    for chunk in &synthesis.chunks {
        assert_eq!(chunk.sample_rate, 22_050);
        assert!(!chunk.samples.is_empty() && chunk.samples.len() <= max_len);
        assert!(chunk.samples.iter().all(|s| (-1.0..=1.0).contains(s)));
    }
    let all = samples(&synthesis);
    assert!(rms(&all) > 0.02, "RMS {}", rms(&all));
    let seconds = duration(&synthesis).as_secs_f64();
    assert!((0.8..6.0).contains(&seconds), "{seconds} s");
}

#[test]
#[ignore = "needs espeak-ng (apt-get install espeak-ng)"]
fn longer_text_takes_longer_to_say() {
    let mut tts = synthesizer();
    let short = duration(&tts.synthesize("Hello.").unwrap());
    let long = duration(
        &tts.synthesize("Hello, and welcome to a much longer sentence with many more words in it.")
            .unwrap(),
    );
    assert!(long > short * 3, "{long:?} vs {short:?}");

    let mut slow = EspeakSynthesizer::new(EspeakSettings {
        words_per_minute: 100,
        ..EspeakSettings::default()
    })
    .unwrap();
    let slower = duration(&slow.synthesize("Hello, and welcome.").unwrap());
    let normal = duration(&tts.synthesize("Hello, and welcome.").unwrap());
    assert!(slower > normal, "{slower:?} vs {normal:?}");
}

#[test]
#[ignore = "needs espeak-ng (apt-get install espeak-ng)"]
fn text_starting_with_a_dash_is_spoken_not_taken_as_an_option() {
    let mut tts = synthesizer();
    // As arguments these would print the version or the help, or pick a voice.
    for text in ["--version", "--help me", "-v de hello"] {
        let synthesis = tts.synthesize(text).unwrap();
        assert_eq!(synthesis.sentence, text);
        let all = samples(&synthesis);
        assert!(rms(&all) > 0.02, "{text:?}: RMS {}", rms(&all));
        assert!(
            duration(&synthesis) > Duration::from_millis(400),
            "{text:?}"
        );
    }
}

#[test]
#[ignore = "needs espeak-ng (apt-get install espeak-ng)"]
fn an_unknown_voice_fails_with_the_programs_message() {
    let mut tts = EspeakSynthesizer::new(EspeakSettings {
        voice: "nonexistent".to_string(),
        ..EspeakSettings::default()
    })
    .unwrap();
    let Err(spec_voice::Error::Synthesis(inner)) = tts.synthesize("Hello.") else {
        panic!("expected a synthesis error");
    };
    match inner.downcast_ref::<EspeakError>() {
        Some(EspeakError::Failed { status, stderr, .. }) => {
            assert!(!status.success());
            assert!(stderr.contains("voice"), "{stderr}");
        }
        other => panic!("expected a failed run, got {other:?}"),
    }
}
