//! Long recordings: read piece by piece from a `SampleSource`, decoded window by window with
//! timestamp seeking, and with faster-whisper's VAD filter (Silero finds the speech, only it is
//! transcribed, times map back). Random-model tests run always; real-weight ones are ignored
//! (CI runs them after `../shared/models/fetch`).

use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::testing::{self, JoinedSpeech};
use engine_asr::vad::{SpeechOptions, MODEL_FILE};
use engine_asr::wer::word_errors;
use engine_asr::{Audio, LoadOptions, SileroVad, TranscribeOptions, Transcriber};
use spec_models::{Registry, Store};

fn random_transcriber() -> (tempfile::TempDir, Transcriber) {
    let dir = tempfile::tempdir().unwrap();
    testing::write_hf(dir.path(), 7).unwrap();
    let transcriber = Transcriber::load(dir.path(), &LoadOptions::default()).unwrap();
    (dir, transcriber)
}

/// A recording read piece by piece is transcribed exactly as the same samples in memory,
/// across many (2-second) windows of the random model.
#[test]
fn a_source_read_in_pieces_gives_the_transcript_of_the_samples() {
    let (_dir, mut transcriber) = random_transcriber();
    let clips = vec![
        testing::tones(1.3, 220.0),
        testing::white_noise(9_000, 0.2, 3),
        testing::tones(0.7, 410.0),
    ];
    let joined = JoinedSpeech::new(clips, &[0.4, 1.1], 12.0).unwrap();
    let options = testing::greedy_options();
    let in_memory = transcriber.transcribe(&joined.samples(), &options).unwrap();
    let streamed = transcriber.transcribe_source(joined, &options).unwrap();
    assert!(in_memory.stats.windows > 3, "{:?}", in_memory.stats);
    assert_eq!(streamed.segments, in_memory.segments);
    assert_eq!(streamed.text, in_memory.text);
}

fn store() -> Store<'static> {
    Store::new(
        spec_models::models_dir().expect("models folder"),
        Registry::builtin(),
    )
}

fn real_transcriber(name: &str) -> Transcriber {
    let model = store()
        .resolve(name)
        .unwrap_or_else(|e| panic!("{name}: {e} (run ../shared/models/fetch)"));
    Transcriber::load(&model.dir, &LoadOptions::default()).unwrap()
}

/// The real clips at 16 kHz with their transcripts.
fn real_clips() -> Vec<(Vec<f32>, String)> {
    spec_models::speech::clips(&store())
        .unwrap()
        .into_iter()
        .map(|clip| {
            let audio = Audio::read_wav(&clip.wav).unwrap();
            (audio.to_16k().unwrap(), clip.transcript)
        })
        .collect()
}

fn word_error_rate(reference: &str, hypothesis: &str) -> f64 {
    let normalizer =
        EnglishTextNormalizer::from_file(&store().data_file("whisper/english.json").unwrap())
            .unwrap();
    let errors = word_errors(
        &normalizer.normalize(reference),
        &normalizer.normalize(hypothesis),
    );
    errors.rate()
}

/// Two minutes of the real clips joined by short and long silences: decoded window by window
/// with timestamp seeking, the transcript is as good as the clips transcribed one by one, and
/// with the VAD filter the silences are skipped, the text stays as good, and every segment's
/// time maps back onto speech of the recording.
#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn two_minutes_of_joined_clips_with_and_without_the_vad_filter() {
    let mut transcriber = real_transcriber("whisper-tiny.en-ct2");
    let clips = real_clips();
    let options = TranscribeOptions::default();
    let one_by_one: Vec<String> = clips
        .iter()
        .map(|(samples, _)| transcriber.transcribe(samples, &options).unwrap().text)
        .collect();
    let gaps = [0.5, 3.5, 1.0, 6.0];
    let joined =
        JoinedSpeech::new(clips.iter().map(|c| c.0.clone()).collect(), &gaps, 120.0).unwrap();
    let order = joined.order();
    let reference: String = order
        .iter()
        .map(|&c| clips[c].1.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let separate: String = order
        .iter()
        .map(|&c| one_by_one[c].as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let separate_wer = word_error_rate(&reference, &separate);
    let seconds = joined.len() as f32 / 16_000.0;

    // Where each clip lies in the recording.
    let mut spans = Vec::new();
    let mut at = 0.0f32;
    for (turn, &clip) in order.iter().enumerate() {
        let length = clips[clip].0.len() as f32 / 16_000.0;
        spans.push((at, at + length));
        at += length + gaps[turn % gaps.len()];
    }

    let plain = transcriber
        .transcribe_source(joined.clone(), &options)
        .unwrap();
    assert!(plain.stats.windows >= 4, "{:?}", plain.stats);
    let plain_wer = word_error_rate(&reference, &plain.text);
    assert!(
        plain_wer <= separate_wer + 0.05,
        "long-form WER {plain_wer:.3} vs clip by clip {separate_wer:.3}:\n{}",
        plain.text
    );

    let silero = store().resolve("silero-vad").unwrap().dir.join(MODEL_FILE);
    let mut vad = SileroVad::load(&silero, &candle_core::Device::Cpu).unwrap();
    let filtered = transcriber
        .transcribe_speech(joined, &mut vad, &SpeechOptions::default(), &options)
        .unwrap();
    let filtered_wer = word_error_rate(&reference, &filtered.text);
    assert!(
        filtered_wer <= separate_wer + 0.05,
        "VAD-filtered WER {filtered_wer:.3} vs clip by clip {separate_wer:.3}:\n{}",
        filtered.text
    );
    eprintln!(
        "{seconds:.0} s: WER clip by clip {separate_wer:.3}, long-form {plain_wer:.3} ({} windows), \
         VAD-filtered {filtered_wer:.3} ({} windows)",
        plain.stats.windows, filtered.stats.windows
    );
    // The long silences (3.5 s and 6 s, over the 2 s a span needs to end) are not decoded.
    assert!(
        filtered.stats.windows < plain.stats.windows,
        "{:?}",
        filtered.stats
    );
    let mut last_end = 0.0;
    for segment in &filtered.segments {
        assert!(
            segment.start <= segment.end && segment.start + 1e-3 >= last_end - 0.5,
            "{segment:?}"
        );
        assert!(
            segment.end <= seconds + 0.01,
            "{segment:?} past {seconds} s"
        );
        // Each segment overlaps the speech of some clip (padding of 0.4 s allowed).
        assert!(
            spans
                .iter()
                .any(|&(start, end)| segment.start < end + 0.5 && segment.end > start - 0.5),
            "{segment:?} lies in a silence"
        );
        last_end = segment.end;
    }
}

/// Silence only, and noise only: no speech found, an empty transcript, no error.
#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn the_vad_filter_on_recordings_without_speech() {
    let mut transcriber = real_transcriber("whisper-tiny.en-ct2");
    let silero = store().resolve("silero-vad").unwrap().dir.join(MODEL_FILE);
    let mut vad = SileroVad::load(&silero, &candle_core::Device::Cpu).unwrap();
    let silence = vec![0.0f32; 16_000 * 40];
    let transcript = transcriber
        .transcribe_speech(
            engine_asr::Samples::new(&silence),
            &mut vad,
            &SpeechOptions::default(),
            &TranscribeOptions::default(),
        )
        .unwrap();
    assert!(transcript.segments.is_empty() && transcript.text.is_empty());
    assert_eq!(transcript.stats.windows, 0);
}
