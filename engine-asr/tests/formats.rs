//! Audio formats through symphonia: the fixtures of `data/audio` (one real clip as WAV, FLAC,
//! MP3, OGG/Vorbis and M4A/AAC, mono and stereo, 16 and 44.1 kHz; made by `make_fixtures.sh`)
//! decode to the clip, stream at 16 kHz exactly as they decode whole, and bad input is a typed
//! error. Whisper on them is in the real-weights test at the end.

use std::path::{Path, PathBuf};

use engine_asr::{
    resample, Audio, AudioDecoder, AudioFile, Error, SampleSource, TranscribeOptions, SAMPLE_RATE,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/audio")
        .join(name)
}

/// The clip as recorded: 16 kHz mono 16-bit, read by hound.
fn reference() -> Audio {
    Audio::read_wav(&fixture("cards-003.wav")).unwrap()
}

/// Every fixture of the clip with the largest delay (in 16 kHz samples) its codec may add at
/// the start: none for the gapless formats; AAC in MP4 keeps its encoder's priming (1024 frames
/// at the file's rate), as symphonia does not apply MP4 edit lists.
const FIXTURES: [(&str, usize); 10] = [
    ("cards-003.wav", 0),
    ("cards-003.flac", 0),
    ("cards-003-stereo.flac", 0),
    ("cards-003.mp3", 0),
    ("cards-003.ogg", 0),
    ("cards-003.m4a", 1024),
    ("cards-003-44k-stereo.flac", 0),
    ("cards-003-44k-stereo.mp3", 0),
    ("cards-003-44k-stereo.ogg", 0),
    ("cards-003-44k-stereo.m4a", 372),
];

/// The lag (of `got` behind `want`, in `lags`) with the highest correlation, and that
/// correlation, normalised.
fn best_alignment(
    want: &[f32],
    got: &[f32],
    lags: std::ops::RangeInclusive<isize>,
) -> (isize, f64) {
    let mut best = (0, f64::MIN);
    for lag in lags {
        let pairs = want.iter().enumerate().filter_map(|(i, &w)| {
            let j = i as isize + lag;
            (j >= 0 && (j as usize) < got.len()).then(|| (f64::from(w), f64::from(got[j as usize])))
        });
        let (mut wg, mut ww, mut gg) = (0.0, 0.0, 0.0);
        for (w, g) in pairs {
            wg += w * g;
            ww += w * w;
            gg += g * g;
        }
        let correlation = wg / (ww * gg).sqrt().max(1e-12);
        if correlation > best.1 {
            best = (lag, correlation);
        }
    }
    best
}

/// Signal-to-noise ratio in dB of `got` (shifted by `lag`) against `want`, after the best gain.
fn snr_db(want: &[f32], got: &[f32], lag: isize) -> f64 {
    let pairs: Vec<(f64, f64)> = want
        .iter()
        .enumerate()
        .filter_map(|(i, &w)| {
            let j = i as isize + lag;
            (j >= 0 && (j as usize) < got.len()).then(|| (f64::from(w), f64::from(got[j as usize])))
        })
        .collect();
    let wg: f64 = pairs.iter().map(|(w, g)| w * g).sum();
    let gg: f64 = pairs.iter().map(|(_, g)| g * g).sum();
    let gain = wg / gg.max(1e-12);
    let signal: f64 = pairs.iter().map(|(w, _)| w * w).sum();
    let noise: f64 = pairs.iter().map(|(w, g)| (w - gain * g).powi(2)).sum();
    10.0 * (signal / noise.max(1e-12)).log10()
}

/// `samples` through a [1, 2, 1] / 4 low-pass: the speech band kept (−3 dB at 4 kHz), the top
/// octave, where resamplers' and codecs' filters differ most, faded out.
fn speech_band(samples: &[f32]) -> Vec<f32> {
    (0..samples.len())
        .map(|i| {
            let at = |j: usize| samples.get(j).copied().unwrap_or(0.0);
            0.25 * at(i.wrapping_sub(1)) + 0.5 * at(i) + 0.25 * at(i + 1)
        })
        .collect()
}

#[test]
fn every_format_decodes_to_the_clip() {
    let clip = reference();
    let clip_16k = speech_band(&clip.to_16k().unwrap());
    for (name, delay) in FIXTURES {
        let path = fixture(name);
        let audio = Audio::read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let rate = if name.contains("44k") { 44_100 } else { 16_000 };
        assert_eq!(audio.sample_rate, rate, "{name}");
        // The clip's length to the sample (gapless formats), or with the AAC priming and the
        // padding to whole 1024-frame packets.
        let frames = audio.samples.len() as f64;
        let exact = clip.duration_seconds() * f64::from(rate);
        if name.ends_with(".m4a") {
            assert!(
                frames >= exact.floor() && frames <= exact + 2048.0,
                "{name}: {frames}"
            );
        } else if name.contains("44k") {
            assert!(
                (frames - exact).abs() <= 1.0,
                "{name}: {frames} frames, {exact}"
            );
        } else {
            assert_eq!(audio.samples.len(), clip.samples.len(), "{name}");
        }
        let samples = speech_band(&audio.to_16k().unwrap());
        // Lags a little either side of the codec's delay: a decoder that shifted the audio
        // would show here.
        let (lag, correlation) = best_alignment(&clip_16k, &samples, -32..=delay as isize + 32);
        let snr = snr_db(&clip_16k, &samples, lag);
        eprintln!("{name}: lag {lag}, correlation {correlation:.5}, SNR {snr:.1} dB");
        assert!(lag.abs_diff(delay as isize) <= 1, "{name}: lag {lag}");
        if delay == 0 {
            assert_eq!(lag, 0, "{name}");
        }
        // Lossy codecs keep the speech, not the waveform; the 44.1 kHz files went through two
        // resamplers (ffmpeg's up, this crate's down), which differ by a fraction of a sample.
        let (min_correlation, min_snr) = match name {
            "cards-003.wav" | "cards-003.flac" => (1.0, f64::INFINITY),
            "cards-003-stereo.flac" => (0.99999, 60.0),
            "cards-003-44k-stereo.flac" => (0.99, 18.0),
            _ => (0.975, 12.0),
        };
        assert!(
            correlation >= min_correlation - 1e-12,
            "{name}: {correlation}"
        );
        assert!(snr >= min_snr.min(120.0), "{name}: {snr} dB");
    }
}

/// Lossless 16 kHz files hold the recording's very samples.
#[test]
fn flac_is_bit_exact_and_stereo_is_the_mean_of_its_channels() {
    let clip = reference();
    assert_eq!(Audio::read(&fixture("cards-003.wav")).unwrap(), clip);
    assert_eq!(Audio::read(&fixture("cards-003.flac")).unwrap(), clip);
    // The right channel is the left at half amplitude (rounded to 16 bits).
    let stereo = Audio::read(&fixture("cards-003-stereo.flac")).unwrap();
    for (got, want) in stereo.samples.iter().zip(&clip.samples) {
        assert!((got - 0.75 * want).abs() <= 1.0 / 32768.0, "{got} {want}");
    }
}

/// The format comes from the content; a wrong extension does not matter.
#[test]
fn content_not_the_extension_decides_the_format() {
    let bytes = std::fs::read(fixture("cards-003.flac")).unwrap();
    let mislabelled = Audio::from_bytes(&bytes, "upload.mp3").unwrap();
    assert_eq!(mislabelled, reference());
    let unnamed = Audio::from_bytes(&bytes, "upload").unwrap();
    assert_eq!(unnamed, reference());
    let ogg = std::fs::read(fixture("cards-003.ogg")).unwrap();
    assert_eq!(
        Audio::from_bytes(&ogg, "clip.wav").unwrap(),
        Audio::read(&fixture("cards-003.ogg")).unwrap()
    );
}

/// Everything read from an `AudioFile`, `piece` samples at a time, with the largest buffer it
/// held after any read.
fn stream_all(file: &mut AudioFile<'_>, piece: usize) -> (Vec<f32>, usize) {
    let mut out = Vec::new();
    let mut largest = 0;
    loop {
        let n = file.read(&mut out, piece).unwrap();
        largest = largest.max(file.buffered_capacity());
        if n == 0 {
            return (out, largest);
        }
        assert!(n <= piece);
    }
}

#[test]
fn streamed_16k_samples_equal_the_whole_file_resampled() {
    for (name, _) in FIXTURES {
        let path = fixture(name);
        let whole = Audio::read(&path).unwrap().to_16k().unwrap();
        let mut file = AudioFile::open(&path).unwrap();
        for piece in [1, 1000, 4096, 16_000, 1 << 20] {
            let (streamed, _) = stream_all(&mut file, piece);
            assert!(streamed == whole, "{name}, pieces of {piece}");
            file.rewind().unwrap();
        }
        let bytes = std::fs::read(&path).unwrap();
        let mut upload = AudioFile::from_bytes(&bytes, name).unwrap();
        assert!(
            stream_all(&mut upload, 3000).0 == whole,
            "{name} from bytes"
        );
        // A rewind halfway starts over.
        let mut out = Vec::new();
        upload.rewind().unwrap();
        upload.read(&mut out, 5000).unwrap();
        upload.rewind().unwrap();
        out.clear();
        assert!(
            stream_all(&mut upload, 7000).0 == whole,
            "{name} after a rewind"
        );
    }
}

/// A WAV header for `frames` frames of 16-bit PCM; the samples follow.
fn wav_header(channels: u16, rate: u32, frames: u32) -> Vec<u8> {
    let data = frames * u32::from(channels) * 2;
    let mut h = Vec::with_capacity(44);
    h.extend_from_slice(b"RIFF");
    h.extend_from_slice(&(36 + data).to_le_bytes());
    h.extend_from_slice(b"WAVEfmt ");
    h.extend_from_slice(&16u32.to_le_bytes());
    h.extend_from_slice(&1u16.to_le_bytes());
    h.extend_from_slice(&channels.to_le_bytes());
    h.extend_from_slice(&rate.to_le_bytes());
    h.extend_from_slice(&(rate.wrapping_mul(u32::from(channels) * 2)).to_le_bytes());
    h.extend_from_slice(&(channels * 2).to_le_bytes());
    h.extend_from_slice(&16u16.to_le_bytes());
    h.extend_from_slice(b"data");
    h.extend_from_slice(&data.to_le_bytes());
    h
}

/// Ten minutes of 8 kHz audio streamed at 16 kHz: the buffers stay the size of a read and a
/// packet, and the samples are those of resampling the whole.
#[test]
fn a_long_file_streams_in_bounded_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.wav");
    let rate = 8_000u32;
    let frames = 600 * rate;
    let signal: Vec<i16> = (0..frames)
        .map(|n| {
            let t = n as f32 / rate as f32;
            // A tone that glides, so that every chunk differs.
            (8000.0 * (2.0 * std::f32::consts::PI * (200.0 + t) * t).sin()) as i16
        })
        .collect();
    let mut bytes = wav_header(1, rate, frames);
    for s in &signal {
        bytes.extend_from_slice(&s.to_le_bytes());
    }
    std::fs::write(&path, &bytes).unwrap();
    drop(bytes);
    let mut file = AudioFile::open(&path).unwrap();
    let piece = 16_000;
    let (streamed, largest) = stream_all(&mut file, piece);
    let expected_len = 2 * frames as usize;
    assert_eq!(streamed.len(), expected_len);
    // A read's samples, a packet's (symphonia's WAV packets are well under a second) and a
    // resampler chunk: far from the 9.6 million samples of the recording.
    let bound = 2 * piece + 4 * rate as usize;
    assert!(
        largest <= bound,
        "{largest} samples buffered, bound {bound}"
    );
    let whole: Vec<f32> = signal.iter().map(|&s| f32::from(s) / 32768.0).collect();
    let resampled = resample(&whole, rate, SAMPLE_RATE).unwrap();
    assert!(streamed == resampled);
    assert_eq!(file.decoded_seconds(), 600.0);
}

#[test]
fn an_upload_longer_than_the_limit_is_refused_while_decoding() {
    let bytes = std::fs::read(fixture("cards-003.ogg")).unwrap();
    assert!(matches!(
        Audio::from_bytes_at_most(&bytes, "clip.ogg", 1.0),
        Err(Error::AudioTooLong { limit_seconds, .. }) if limit_seconds == 1.0
    ));
    let within = Audio::from_bytes_at_most(&bytes, "clip.ogg", 2.0).unwrap();
    assert_eq!(within, Audio::from_bytes(&bytes, "clip.ogg").unwrap());
}

fn is_bad(result: engine_asr::Result<Audio>) -> bool {
    matches!(result, Err(Error::BadAudio { .. }))
}

#[test]
fn truncated_corrupt_and_empty_files_are_typed_errors() {
    for (name, _) in FIXTURES {
        let bytes = std::fs::read(fixture(name)).unwrap();
        for fraction in [0.0, 0.01, 0.3, 0.5, 0.9] {
            let cut = &bytes[..(bytes.len() as f64 * fraction) as usize];
            let result = Audio::from_bytes(cut, name);
            assert!(
                is_bad(result),
                "{name} cut to {fraction}: {:?}",
                Audio::from_bytes(cut, name).map(|a| a.samples.len())
            );
        }
        // 64 bytes garbled in the middle: the formats with checksums (FLAC's frames, OGG's
        // pages) or strict syntax (AAC) notice; raw PCM and MP3 frames may decode to noise,
        // but never panic and keep the clip's length.
        let mut garbled = bytes.clone();
        let middle = garbled.len() / 2;
        for byte in &mut garbled[middle..middle + 64] {
            *byte ^= 0x5a;
        }
        match Audio::from_bytes(&garbled, name) {
            Err(Error::BadAudio { .. }) => {}
            Ok(audio) if name.ends_with(".wav") || name.ends_with(".mp3") => {
                let clip = Audio::read(&fixture(name)).unwrap();
                let dropped = clip.samples.len().abs_diff(audio.samples.len());
                assert!(
                    dropped <= audio.sample_rate as usize / 20,
                    "{name}: {dropped}"
                );
            }
            other => panic!("{name} garbled: {:?}", other.map(|a| a.samples.len())),
        }
    }
    assert!(matches!(
        Audio::from_bytes(b"", "empty.flac"),
        Err(Error::BadAudio { reason, .. }) if reason.contains("empty")
    ));
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.mp3");
    std::fs::write(&empty, b"").unwrap();
    assert!(is_bad(Audio::read(&empty)));
    assert!(matches!(
        Audio::read(&dir.path().join("absent.flac")),
        Err(Error::Io { .. })
    ));
    assert!(matches!(
        AudioFile::open(&dir.path().join("absent.flac")),
        Err(Error::Io { .. })
    ));
    // A WAV of no samples.
    assert!(matches!(
        Audio::from_bytes(&wav_header(1, 16_000, 0), "silent.wav"),
        Err(Error::Audio(_))
    ));
}

#[test]
fn unsupported_containers_and_codecs_are_named() {
    let error = Audio::read(&fixture("unsupported-opus.ogg")).unwrap_err();
    assert!(
        matches!(&error, Error::UnsupportedAudio { reason, .. } if reason.contains("Opus")),
        "{error}"
    );
    for (bytes, name) in [
        (&b"plain text, not audio at all"[..], "notes.txt"),
        (b"\x1aE\xdf\xa3 a Matroska header", "video.webm"),
        (&[0u8; 4096][..], "zeros.wav"),
    ] {
        let error = Audio::from_bytes(bytes, name).unwrap_err();
        assert!(
            matches!(
                error,
                Error::UnsupportedAudio { .. } | Error::BadAudio { .. }
            ),
            "{name}: {error}"
        );
    }
    assert!(matches!(
        Audio::from_bytes(b"plain text, not audio at all", "notes.txt"),
        Err(Error::UnsupportedAudio { .. })
    ));
}

#[test]
fn impossible_headers_are_typed_errors() {
    let samples = [0u8; 400];
    // No channels; a sample rate of 0 Hz.
    for (channels, rate) in [(0, 16_000), (1, 0)] {
        let mut bytes = wav_header(channels, rate, 100);
        bytes.extend_from_slice(&samples);
        let error = Audio::from_bytes(&bytes, "bad.wav").unwrap_err();
        assert!(matches!(error, Error::BadAudio { .. }), "{error}");
        assert!(AudioFile::from_bytes(&bytes, "bad.wav").is_err());
    }
    // An absurd rate decodes (the header is all there is), but cannot be resampled.
    let mut bytes = wav_header(1, 4_000_000_000, 100);
    bytes.extend_from_slice(&samples);
    match Audio::from_bytes(&bytes, "fast.wav") {
        Ok(audio) => assert!(matches!(audio.to_16k(), Err(Error::Resample { .. }))),
        Err(error) => assert!(matches!(error, Error::BadAudio { .. }), "{error}"),
    }
    assert!(matches!(
        AudioFile::from_bytes(&bytes, "fast.wav"),
        Err(Error::Resample { .. } | Error::BadAudio { .. })
    ));
}

/// Found by fuzzing: a WAVE_FORMAT_EXTENSIBLE header whose channel mask has fewer bits than it
/// has channels overflows a shift in symphonia's RIFF reader (0.6.1, `wave/chunks.rs`), which
/// panics where overflow is checked (debug builds). It is a typed error or a decoding, never a
/// panic.
#[test]
fn a_wav_whose_channel_mask_overflows_the_reader_is_not_a_panic() {
    let channels: u16 = 40;
    let mut bytes = Vec::new();
    let data = vec![0u8; usize::from(channels) * 2 * 10];
    bytes.extend_from_slice(b"RIFF");
    bytes.extend_from_slice(&(4 + 8 + 40 + 8 + data.len() as u32).to_le_bytes());
    bytes.extend_from_slice(b"WAVEfmt ");
    bytes.extend_from_slice(&40u32.to_le_bytes());
    bytes.extend_from_slice(&0xfffeu16.to_le_bytes());
    bytes.extend_from_slice(&channels.to_le_bytes());
    bytes.extend_from_slice(&16_000u32.to_le_bytes());
    bytes.extend_from_slice(&(16_000 * u32::from(channels) * 2).to_le_bytes());
    bytes.extend_from_slice(&(channels * 2).to_le_bytes());
    bytes.extend_from_slice(&16u16.to_le_bytes());
    bytes.extend_from_slice(&22u16.to_le_bytes());
    bytes.extend_from_slice(&16u16.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes()); // the channel mask: no channel named
    bytes.extend_from_slice(&[
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xaa, 0x00, 0x38, 0x9b,
        0x71,
    ]);
    bytes.extend_from_slice(b"data");
    bytes.extend_from_slice(&(data.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&data);
    match Audio::from_bytes(&bytes, "mask.wav") {
        Ok(audio) => assert_eq!(audio.samples.len(), 10),
        Err(error) => assert!(
            matches!(
                error,
                Error::BadAudio { .. } | Error::UnsupportedAudio { .. }
            ),
            "{error}"
        ),
    }
}

/// A float WAV holding a NaN: the whole file reads (as `read_wav` does), and resampling or
/// streaming it names the sample.
#[test]
fn non_finite_samples_are_refused_with_their_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nan.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 22_050,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut writer = hound::WavWriter::create(&path, spec).unwrap();
    for i in 0..30_000 {
        writer
            .write_sample(if i == 20_000 { f32::NAN } else { 0.1 })
            .unwrap();
    }
    writer.finalize().unwrap();
    let audio = Audio::read(&path).unwrap();
    assert!(matches!(
        audio.to_16k(),
        Err(Error::NonFiniteSample { index: 20_000, .. })
    ));
    let mut file = AudioFile::open(&path).unwrap();
    let mut out = Vec::new();
    let error = loop {
        match file.read(&mut out, 1000) {
            Ok(0) => panic!("read to the end past a NaN"),
            Ok(_) => {}
            Err(error) => break error,
        }
    };
    assert!(
        matches!(error, Error::NonFiniteSample { index: 20_000, .. }),
        "{error}"
    );
}

/// Every WAV encoding hound reads, symphonia reads to the same samples.
#[test]
fn wav_files_read_the_same_through_symphonia_and_hound() {
    use hound::SampleFormat::{Float, Int};
    let dir = tempfile::tempdir().unwrap();
    for (bits, format, channels) in [
        (8, Int, 1),
        (16, Int, 2),
        (24, Int, 1),
        (32, Int, 3),
        (32, Float, 2),
    ] {
        let spec = hound::WavSpec {
            channels,
            sample_rate: 11_025,
            bits_per_sample: bits,
            sample_format: format,
        };
        let path = dir.path().join(format!("{bits}{format:?}{channels}.wav"));
        let mut writer = hound::WavWriter::create(&path, spec).unwrap();
        for n in 0..2000 {
            for c in 0..channels {
                let v = 0.6 * ((n as f32) * 0.05 + f32::from(c)).sin();
                match (format, bits) {
                    (Float, _) => writer.write_sample(v).unwrap(),
                    (_, 8) => writer.write_sample((v * 127.0) as i8).unwrap(),
                    (_, 16) => writer.write_sample((v * 32767.0) as i16).unwrap(),
                    (_, b) => writer
                        .write_sample((v * ((1i64 << (b - 1)) - 1) as f32) as i32)
                        .unwrap(),
                }
            }
        }
        writer.finalize().unwrap();
        let hound = Audio::read_wav(&path).unwrap();
        let symphonia = Audio::read(&path).unwrap();
        assert_eq!(symphonia.sample_rate, hound.sample_rate);
        assert_eq!(symphonia.samples.len(), hound.samples.len());
        for (a, b) in symphonia.samples.iter().zip(&hound.samples) {
            assert!((a - b).abs() <= 1e-6, "{bits}-bit {format:?}: {a} {b}");
        }
    }
}

/// The decoder's own view: the rate and the frames its header declares.
#[test]
fn the_decoder_reports_the_rate_and_declared_length() {
    let decoder = AudioDecoder::open(&fixture("cards-003-44k-stereo.flac")).unwrap();
    assert_eq!(decoder.sample_rate(), 44_100);
    let frames = decoder.declared_frames().unwrap();
    assert_eq!(
        frames as usize,
        Audio::read(&fixture("cards-003-44k-stereo.flac"))
            .unwrap()
            .samples
            .len()
    );
    let file = AudioFile::open(&fixture("cards-003-44k-stereo.flac")).unwrap();
    assert_eq!(file.source_sample_rate(), 44_100);
}

/// Whisper tiny.en hears the same words in every format as in the WAV.
#[test]
#[ignore = "needs real models (../shared/models/fetch)"]
fn whisper_transcribes_every_format_as_the_wav() {
    let store = spec_models::Store::new(
        spec_models::models_dir().unwrap(),
        spec_models::Registry::builtin(),
    );
    let model = store.resolve("whisper-tiny.en-ct2").unwrap();
    let mut transcriber =
        engine_asr::Transcriber::load(&model.dir, &engine_asr::LoadOptions::default()).unwrap();
    let options = TranscribeOptions::default();
    let normalize = engine_asr::normalize::basic_normalize;
    let wav = reference().to_16k().unwrap();
    let want = normalize(&transcriber.transcribe(&wav, &options).unwrap().text);
    assert!(want.contains("clubs"), "{want}");
    let mut differ = Vec::new();
    for (name, _) in FIXTURES {
        let samples = Audio::read(&fixture(name)).unwrap().to_16k().unwrap();
        let got = normalize(&transcriber.transcribe(&samples, &options).unwrap().text);
        if got != want {
            differ.push(format!("{name}: {got:?}"));
        }
    }
    assert!(differ.is_empty(), "the WAV gives {want:?}, and {differ:?}");
}
