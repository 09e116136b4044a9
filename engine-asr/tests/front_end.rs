//! The audio front end against Whisper's Python implementation, and on the real speech clips.

use engine_asr::{log_mel_spectrogram, Audio, MelFilters, WhisperInput, SAMPLE_RATE};

/// Reference values made by `tests/data/make_mel_reference.py` (faster-whisper's numpy
/// implementation of Whisper's log-mel spectrogram) on a fixed 0.25 s signal.
#[test]
fn log_mel_matches_the_python_implementation() {
    let text = include_str!("data/mel_reference.json");
    let reference: serde_json::Value = serde_json::from_str(text).unwrap();
    let signal: Vec<f32> = reference["signal"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(reference["sample_rate"], SAMPLE_RATE);
    for n_mels in [80, 128] {
        let expected: Vec<Vec<f64>> =
            serde_json::from_value(reference[format!("mel{n_mels}")].clone()).unwrap();
        let ours = log_mel_spectrogram(&signal, &MelFilters::new(n_mels).unwrap()).unwrap();
        assert_eq!((ours.n_mels, ours.frames), (n_mels, expected[0].len()));
        let mut worst = 0f64;
        for (mel, row) in expected.iter().enumerate() {
            for (frame, &want) in row.iter().enumerate() {
                let got = f64::from(ours.row(mel)[frame]);
                worst = worst.max((got - want).abs());
            }
        }
        // The values span about 2 units; both sides compute in f32 (numpy's FFT in complex64)
        // and the reference is rounded to 6 decimals: 1.2e-5 apart at most when written.
        assert!(worst < 5e-5, "{n_mels} mels: off by {worst}");
    }
}

/// The encoder's window for a 0.25 s signal against faster-whisper's (`transcribe`: the
/// spectrogram cut at the audio's last frame, padded to 3000 frames by `pad_or_trim`), made by
/// `tests/data/make_mel_reference.py`: the audio frames agree and the padding is zeros, not the
/// log-mel of silence (which sat 2 below the loudest value, and made Whisper base transcribe
/// worse with the whole window encoded).
#[test]
fn the_window_past_the_audio_is_padded_as_faster_whisper_pads_it() {
    let signal: Vec<f32> = {
        let reference: serde_json::Value =
            serde_json::from_str(include_str!("data/mel_reference.json")).unwrap();
        serde_json::from_value(reference["signal"].clone()).unwrap()
    };
    let reference: serde_json::Value =
        serde_json::from_str(include_str!("data/window_reference.json")).unwrap();
    let audio: Vec<Vec<f32>> = serde_json::from_value(reference["audio"].clone()).unwrap();
    let audio_frames = reference["audio_frames"].as_u64().unwrap() as usize;
    assert_eq!(reference["padding_values"], serde_json::json!([0.0]));
    let mut input = WhisperInput::from_samples(&signal, &MelFilters::new(80).unwrap()).unwrap();
    assert_eq!(input.content_frames(), audio_frames);
    let window = input.window(0).unwrap();
    assert_eq!(
        window.frames,
        reference["frames"].as_u64().unwrap() as usize
    );
    for (mel, expected) in audio.iter().enumerate() {
        let row = window.row(mel);
        for (frame, &want) in expected.iter().enumerate() {
            assert!((row[frame] - want).abs() < 5e-5, "mel {mel}, frame {frame}");
        }
        assert!(row[audio_frames..].iter().all(|&v| v == 0.0), "mel {mel}");
    }
}

/// The real clips read, resample and turn into spectrograms of the expected length.
#[test]
#[ignore = "needs the speech clips: run ../shared/models/fetch"]
fn real_clips_become_spectrograms() {
    let store = spec_models::Store::from_env().unwrap();
    let speech = store.root().join("data/speech");
    let mut clips: Vec<_> = walk(&speech);
    clips.sort();
    assert!(
        clips.len() >= 10,
        "{} clips in {}",
        clips.len(),
        speech.display()
    );
    let filters = MelFilters::new(80).unwrap();
    for clip in clips {
        let audio = Audio::read_wav(&clip).unwrap();
        let samples = audio.to_16k().unwrap();
        let seconds = audio.duration_seconds();
        assert!(
            (samples.len() as f64 / 16_000.0 - seconds).abs() < 1e-3,
            "{}",
            clip.display()
        );
        let mel = log_mel_spectrogram(&samples, &filters).unwrap();
        assert_eq!(mel.frames, samples.len() / 160);
        let max = mel.data.iter().copied().fold(f32::MIN, f32::max);
        let min = mel.data.iter().copied().fold(f32::MAX, f32::min);
        // Speech fills the 8-decade dynamic range the clamp allows, never more.
        assert!(
            max - min <= 2.0 + 1e-6 && max - min > 1.0,
            "{}: {min}..{max}",
            clip.display()
        );
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "wav") {
            found.push(path);
        }
    }
    found
}
