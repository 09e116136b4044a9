//! The turn-taking set of issue 75 (semantic end of turn): the utterances of `turns.txt`, each
//! spoken by one voice (Kokoro voices and espeak-ng in rotation), with pauses of exactly the
//! marked length, as a clean recording and as copies in white, pink and babble noise at
//! [`SNR_DB`], with the ground truth of every pause and of the end of speech.
//!
//! How an utterance is made:
//!
//! - Each piece of text between two pause marks is synthesized on its own and resampled to
//!   16 kHz mono.
//! - TTS pads its audio with near-silence, so each piece's *voiced extent* is measured: from
//!   the first to the last sample whose magnitude is within [`VOICED_THRESHOLD_DB`] (−40 dB) of
//!   the piece's loudest sample ([`voiced_extent`]). At most [`MARGIN`] of the quiet audio on
//!   either side is kept (so a soft decay is not cut off), the rest dropped.
//! - The pieces are laid out so that the voiced audio starts after [`LEAD`] of silence and each
//!   pause, from the end of one piece's voiced audio to the start of the next's, is exactly the
//!   marked length (the kept quiet edges lie inside it). [`TAIL`] of silence follows the end of
//!   speech, enough for any end-of-turn policy to decide.
//! - The recording is scaled so that its voiced audio has an RMS level of
//!   [`SPEECH_LEVEL_DBFS`], whatever the voice.
//! - The noisy copies add noise over the whole recording (leading silence, pauses and tail too),
//!   scaled so that the speech power over the voiced audio is [`SNR_DB`] above the noise power
//!   ([`mix_at_snr`]). White noise is Gaussian, pink noise is made by the Voss–McCartney method
//!   ([`pink_noise`]), babble is [`BABBLE_TALKERS`] other utterances of the set (their voiced
//!   audio, each at the same level, looped from a random offset) spoken at once. The noise is
//!   seeded by the utterance and the noise kind: a remake gives the same samples.
//!
//! The set is cached in a folder: one 32-bit float WAV per version (`t01-clean.wav`,
//! `t01-white.wav`, …, bit-exact) and `manifest.json` with the ground truth in samples at
//! 16 kHz. It is reused while the manifest's key (the format, a hash of `turns.txt`, the voices)
//! matches; otherwise it is made again.

use std::fmt;
use std::ops::{Range, RangeInclusive};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use engine_asr::resample;
use engine_tts::espeak::{EspeakSettings, EspeakSynthesizer};
use engine_tts::voices::{self, VoiceChoice};
use serde::{Deserialize, Serialize};
use spec_voice::SentenceSynthesizer;
use specvoice::endpoint::{duration_of, samples_in};
use tracing::{info, warn};

/// The utterances, one a line (the syntax is described at the top of the file).
pub const TURNS: &str = include_str!("turns.txt");

/// The set's sample rate (the pipeline's).
pub const SAMPLE_RATE: u32 = specvoice::SAMPLE_RATE;

/// Silence before the speech.
pub const LEAD: Duration = Duration::from_millis(300);

/// Silence after the end of speech.
pub const TAIL: Duration = Duration::from_millis(1500);

/// Quiet audio kept on either side of a piece's voiced extent. Less than half the shortest
/// pause, so that two pieces' kept edges never overlap.
const MARGIN: Duration = Duration::from_millis(40);

/// Where voiced audio starts and ends: this far below the loudest sample of a piece, in dB.
pub const VOICED_THRESHOLD_DB: f32 = -40.0;

/// The RMS level of every recording's voiced audio, in dB relative to full scale.
const SPEECH_LEVEL_DBFS: f64 = -26.0;

/// Speech power over the voiced audio against the noise power, in the noisy copies.
pub const SNR_DB: f64 = 10.0;

/// How many other utterances make up the babble.
const BABBLE_TALKERS: usize = 6;

/// Rows of the Voss–McCartney pink-noise generator: 1/f from about 0.25 Hz up at 16 kHz.
const PINK_ROWS: usize = 16;

/// The pause lengths a pause mark may give, in milliseconds.
const PAUSE_MS: RangeInclusive<u32> = 100..=5000;

/// The voices the set is spoken by, in rotation, when the caller names none.
pub const DEFAULT_VOICES: [&str; 4] = [
    "kokoro:af_heart",
    "kokoro:am_michael",
    "kokoro:bf_emma",
    "espeak",
];

/// Bumped whenever the way the set is made changes, so that a set cached by an older program
/// is made again.
const FORMAT: u32 = 1;

/// What an utterance is, as `turns.txt` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A question without pauses.
    Complete,
    /// One or two pauses at hesitation points.
    Paused,
    /// Fillers ("um", "let me think"), perhaps with pauses.
    Filler,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Complete => "complete",
            Self::Paused => "paused",
            Self::Filler => "filler",
        })
    }
}

/// The background of a version of an utterance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Noise {
    Clean,
    White,
    Pink,
    Babble,
}

impl Noise {
    /// Every version of an utterance, clean first.
    pub const ALL: [Noise; 4] = [Self::Clean, Self::White, Self::Pink, Self::Babble];
}

impl fmt::Display for Noise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Clean => "clean",
            Self::White => "white",
            Self::Pink => "pink",
            Self::Babble => "babble",
        })
    }
}

/// One line of `turns.txt`: the pieces of text between pause marks and the pauses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    pub kind: Kind,
    /// The text, split at the pause marks (one piece more than pauses).
    pub pieces: Vec<String>,
    /// The pauses' lengths in milliseconds, in order.
    pub pauses_ms: Vec<u32>,
}

impl Turn {
    /// The whole question, as said.
    pub fn question(&self) -> String {
        self.pieces.join(" ")
    }
}

/// The utterances of a turns file (`KIND: TEXT` lines, `[MS]` pause marks).
pub fn parse_turns(text: &str) -> Result<Vec<Turn>> {
    let mut turns = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let turn = parse_line(line).with_context(|| format!("turns line {}", number + 1))?;
        turns.push(turn);
    }
    Ok(turns)
}

fn parse_line(line: &str) -> Result<Turn> {
    let (kind, mut rest) = line
        .split_once(':')
        .context("no `KIND:` at the start of the line")?;
    let kind = match kind.trim() {
        "complete" => Kind::Complete,
        "paused" => Kind::Paused,
        "filler" => Kind::Filler,
        other => bail!("unknown kind `{other}` (complete, paused or filler)"),
    };
    let (mut pieces, mut pauses_ms) = (Vec::new(), Vec::new());
    while let Some(open) = rest.find('[') {
        pieces.push(rest[..open].trim().to_string());
        let close = open + rest[open..].find(']').context("a `[` without its `]`")?;
        let mark = rest[open + 1..close].trim();
        let ms: u32 = mark
            .parse()
            .with_context(|| format!("`[{mark}]` is not a pause in milliseconds"))?;
        ensure!(
            PAUSE_MS.contains(&ms),
            "a pause of {ms} ms is outside {}..={} ms",
            PAUSE_MS.start(),
            PAUSE_MS.end()
        );
        pauses_ms.push(ms);
        rest = &rest[close + 1..];
    }
    pieces.push(rest.trim().to_string());
    ensure!(
        pieces.iter().all(|p| !p.is_empty() && !p.contains(']')),
        "text missing before, between or after pause marks, or a stray `]`"
    );
    match (kind, pauses_ms.len()) {
        (Kind::Complete, 0) | (Kind::Paused, 1..=2) | (Kind::Filler, 0..=2) => {}
        (Kind::Complete, n) => bail!("a complete question has no pauses ({n} marked)"),
        (_, n) => bail!("{n} pauses marked: paused lines have one or two, fillers at most two"),
    }
    Ok(Turn {
        kind,
        pieces,
        pauses_ms,
    })
}

/// One version of one utterance of the set, with its ground truth.
#[derive(Clone, Debug)]
pub struct TurnUtterance {
    /// `t01`, `t02`, … in the order of `turns.txt`; the same for every version.
    pub id: String,
    /// The voice, by the name `--voice` takes (`kokoro:af_heart`, `espeak`).
    pub voice: String,
    pub noise: Noise,
    pub kind: Kind,
    /// The whole question, without pause marks.
    pub question: String,
    /// 16 kHz mono.
    pub samples: Vec<f32>,
    /// Each pause: from the end of the voiced audio before it to the start of the voiced audio
    /// after it.
    pub pauses: Vec<(Duration, Duration)>,
    /// The start of the first voiced audio ([`LEAD`]).
    pub speech_start: Duration,
    /// The end of the last voiced audio.
    pub speech_end: Duration,
}

impl TurnUtterance {
    /// The voiced audio, as sample ranges: the speech without its pauses.
    pub fn voiced(&self) -> Vec<Range<usize>> {
        let mut edges = vec![self.speech_start];
        for &(start, end) in &self.pauses {
            edges.extend([start, end]);
        }
        edges.push(self.speech_end);
        edges
            .chunks(2)
            .map(|span| samples_in(span[0])..samples_in(span[1]))
            .collect()
    }
}

/// Every version of every utterance: by utterance, each in the order of [`Noise::ALL`].
#[derive(Clone, Debug)]
pub struct TurnSet {
    pub utterances: Vec<TurnUtterance>,
}

/// What a cached set must match to be reused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Key {
    format: u32,
    /// FNV-1a of `turns.txt`, in hex.
    turns_hash: String,
    voices: Vec<String>,
}

/// `manifest.json`.
#[derive(Serialize, Deserialize)]
struct Manifest {
    key: Key,
    sample_rate: u32,
    utterances: Vec<Entry>,
}

/// An utterance in the manifest; its versions are the files `ID-NOISE.wav`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    id: String,
    kind: Kind,
    voice: String,
    question: String,
    /// The voiced audio, `[start, end)` in samples: the first starts the speech, the last ends
    /// it, the gaps between are the pauses.
    voiced: Vec<(usize, usize)>,
}

impl Entry {
    fn version(&self, noise: Noise, samples: Vec<f32>) -> TurnUtterance {
        TurnUtterance {
            id: self.id.clone(),
            voice: self.voice.clone(),
            noise,
            kind: self.kind,
            question: self.question.clone(),
            samples,
            pauses: self
                .voiced
                .windows(2)
                .map(|w| (duration_of(w[0].1), duration_of(w[1].0)))
                .collect(),
            speech_start: duration_of(self.voiced[0].0),
            speech_end: duration_of(self.voiced[self.voiced.len() - 1].1),
        }
    }

    fn file(&self, noise: Noise) -> String {
        format!("{}-{noise}.wav", self.id)
    }
}

/// The turn-taking set in the folder `dir` when it is there and was made from this `turns.txt`
/// with these voices; otherwise made (Kokoro from the models folder `models`) and saved there.
/// Kokoro voices are left out, with a warning, when Kokoro is not in the models folder;
/// espeak-ng is required.
pub fn load_or_make(dir: &Path, models: &Path, voices: &[VoiceChoice]) -> Result<TurnSet> {
    let turns = parse_turns(TURNS)?;
    let voices = usable_voices(models, voices)?;
    let key = Key {
        format: FORMAT,
        turns_hash: format!("{:016x}", fnv1a(TURNS.as_bytes())),
        voices: voices.iter().map(VoiceChoice::to_string).collect(),
    };
    match load(dir, &key) {
        Ok(Some(set)) => {
            info!("the turn set, from {}", dir.display());
            return Ok(set);
        }
        Ok(None) => info!(
            "making the turn set in {} ({} utterances; voices {})",
            dir.display(),
            turns.len(),
            key.voices.join(", ")
        ),
        Err(error) => warn!("making the turn set again: {error:#}"),
    }
    let (entries, recordings) = make(&turns, models, &voices)?;
    save(dir, key, &entries, &recordings)?;
    Ok(assemble(&entries, recordings))
}

/// The voices of `wanted` that can speak here, as `voices::available` names them: the Kokoro
/// ones are dropped when Kokoro is missing, and espeak-ng speaks when none is left.
fn usable_voices(models: &Path, wanted: &[VoiceChoice]) -> Result<Vec<VoiceChoice>> {
    EspeakSynthesizer::new(EspeakSettings::default()).context(
        "the turn set needs espeak-ng (a voice of its own, and Kokoro's phonemes): \
         install it with `apt-get install espeak-ng`",
    )?;
    let available = voices::available(models)?;
    let kokoro_present = available.iter().any(|name| name.starts_with("kokoro:"));
    let mut usable: Vec<VoiceChoice> = Vec::new();
    for choice in wanted {
        let choice = choice.resolve(models)?;
        match choice {
            VoiceChoice::Kokoro(_) if !kokoro_present => {
                warn!(
                    "{choice} left out of the turn set: Kokoro's files or ONNX Runtime are not in {}",
                    models.display()
                );
                continue;
            }
            VoiceChoice::Fixed => bail!("`fixed` is silence, not a voice for the turn set"),
            _ => ensure!(
                available.contains(&choice.to_string()),
                "no voice {choice} here (there are: {})",
                available.join(", ")
            ),
        }
        if !usable.contains(&choice) {
            usable.push(choice);
        }
    }
    if usable.is_empty() {
        warn!("the turn set is spoken by espeak-ng only");
        usable.push(VoiceChoice::Espeak);
    }
    Ok(usable)
}

/// The cached set, or `None` when there is none or it was made from other text or voices.
fn load(dir: &Path, key: &Key) -> Result<Option<TurnSet>> {
    let path = dir.join("manifest.json");
    let Ok(json) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let manifest: Manifest =
        serde_json::from_str(&json).with_context(|| format!("reading {}", path.display()))?;
    if manifest.key != *key || manifest.sample_rate != SAMPLE_RATE {
        return Ok(None);
    }
    let mut recordings = Vec::new();
    for entry in &manifest.utterances {
        for noise in Noise::ALL {
            let path = dir.join(entry.file(noise));
            let mut reader = hound::WavReader::open(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let samples = reader
                .samples::<f32>()
                .collect::<Result<Vec<f32>, _>>()
                .with_context(|| format!("reading {}", path.display()))?;
            recordings.push(samples);
        }
    }
    Ok(Some(assemble(&manifest.utterances, recordings)))
}

/// The set from its entries and their recordings (each entry's in the order of [`Noise::ALL`]).
fn assemble(entries: &[Entry], recordings: Vec<Vec<f32>>) -> TurnSet {
    let versions = entries
        .iter()
        .flat_map(|entry| Noise::ALL.map(|noise| (entry, noise)));
    TurnSet {
        utterances: versions
            .zip(recordings)
            .map(|((entry, noise), samples)| entry.version(noise, samples))
            .collect(),
    }
}

/// Writes the recordings as WAV files, then the manifest (last, so that an interrupted save
/// leaves no manifest that would be trusted).
fn save(dir: &Path, key: Key, entries: &[Entry], recordings: &[Vec<f32>]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: SAMPLE_RATE,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let files = entries
        .iter()
        .flat_map(|entry| Noise::ALL.map(|noise| entry.file(noise)));
    for (file, samples) in files.zip(recordings) {
        let path = dir.join(file);
        let write = || -> Result<(), hound::Error> {
            let mut writer = hound::WavWriter::create(&path, spec)?;
            for &sample in samples {
                writer.write_sample(sample)?;
            }
            writer.finalize()
        };
        write().with_context(|| format!("writing {}", path.display()))?;
    }
    let manifest = Manifest {
        key,
        sample_rate: SAMPLE_RATE,
        utterances: entries.to_vec(),
    };
    let path = dir.join("manifest.json");
    std::fs::write(&path, serde_json::to_string_pretty(&manifest)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// Speaks every turn (turn `i` by voice `i mod voices`) and makes its noisy copies: the entries
/// and their recordings, each entry's in the order of [`Noise::ALL`].
fn make(
    turns: &[Turn],
    models: &Path,
    voices: &[VoiceChoice],
) -> Result<(Vec<Entry>, Vec<Vec<f32>>)> {
    let mut spoken: Vec<(usize, Spoken)> = Vec::new();
    let bar = spec_cli::progress_bar(turns.len(), "speaking the turn set");
    // One voice at a time, so that one Kokoro model at most is in memory.
    for (v, choice) in voices.iter().enumerate() {
        let mut voice =
            voices::open(choice, models).with_context(|| format!("opening the voice {choice}"))?;
        for i in (v..turns.len()).step_by(voices.len()) {
            let recording = speak(&mut *voice, &turns[i])
                .with_context(|| format!("speaking {:?} with {choice}", turns[i].question()))?;
            spoken.push((i, recording));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    spoken.sort_by_key(|&(i, _)| i);
    let spoken: Vec<Spoken> = spoken.into_iter().map(|(_, s)| s).collect();
    ensure!(
        spoken.len() > BABBLE_TALKERS,
        "the babble needs more than {BABBLE_TALKERS} utterances"
    );
    // The babble's talkers: each utterance's voiced audio alone, at one level.
    let talkers: Vec<Vec<f32>> = spoken
        .iter()
        .map(|Spoken { samples, voiced }| {
            let speech: Vec<f32> = voiced
                .iter()
                .flat_map(|r| samples[r.clone()].iter().copied())
                .collect();
            let gain = mean_square(&speech).sqrt().recip();
            speech
                .iter()
                .map(|&s| (f64::from(s) * gain) as f32)
                .collect()
        })
        .collect();

    let mut entries = Vec::new();
    let mut recordings = Vec::new();
    for (i, (turn, spoken)) in turns.iter().zip(&spoken).enumerate() {
        let (clean, voiced) = (&spoken.samples, &spoken.voiced);
        let id = format!("t{:02}", i + 1);
        for noise in Noise::ALL {
            let mut rng = Rng(fnv1a(format!("{id}/{noise}").as_bytes()));
            let len = clean.len();
            let background = match noise {
                Noise::Clean => {
                    recordings.push(clean.clone());
                    continue;
                }
                Noise::White => (0..len).map(|_| rng.gaussian() as f32).collect(),
                Noise::Pink => pink_noise(len, &mut rng),
                Noise::Babble => {
                    let others: Vec<&[f32]> = talkers
                        .iter()
                        .enumerate()
                        .filter(|&(j, _)| j != i)
                        .map(|(_, talker)| talker.as_slice())
                        .collect();
                    babble(len, &others, &mut rng)
                }
            };
            recordings.push(mix_at_snr(clean, voiced, &background, SNR_DB));
        }
        entries.push(Entry {
            id,
            kind: turn.kind,
            voice: voices[i % voices.len()].to_string(),
            question: turn.question(),
            voiced: voiced.iter().map(|r| (r.start, r.end)).collect(),
        });
    }
    Ok((entries, recordings))
}

/// A clean recording of a turn.
struct Spoken {
    /// 16 kHz mono.
    samples: Vec<f32>,
    /// The voiced audio, one range a piece of text.
    voiced: Vec<Range<usize>>,
}

/// `turn` spoken by `voice`.
fn speak(voice: &mut dyn SentenceSynthesizer, turn: &Turn) -> Result<Spoken> {
    let margin = samples_in(MARGIN);
    let mut samples: Vec<f32> = Vec::new();
    let mut voiced: Vec<Range<usize>> = Vec::new();
    // Where the next piece's voiced audio starts.
    let mut next = samples_in(LEAD);
    for (k, piece) in turn.pieces.iter().enumerate() {
        let audio = voice.synthesize(piece)?.joined()?;
        let audio = resample(&audio.samples, audio.sample_rate, SAMPLE_RATE)?;
        let extent = voiced_extent(&audio, VOICED_THRESHOLD_DB)
            .with_context(|| format!("{piece:?} came out silent"))?;
        let kept = extent.start.saturating_sub(margin)..(extent.end + margin).min(audio.len());
        // Where the kept audio starts: after the previous piece's, as the pause is longer than
        // two margins.
        let at = next - (extent.start - kept.start);
        samples.resize(at, 0.0);
        samples.extend_from_slice(&audio[kept]);
        let span = next..next + extent.len();
        if let Some(&ms) = turn.pauses_ms.get(k) {
            next = span.end + samples_in(Duration::from_millis(u64::from(ms)));
        }
        voiced.push(span);
    }
    let speech_end = voiced.last().context("no text")?.end;
    samples.resize(speech_end + samples_in(TAIL), 0.0);
    let gain = 10f64.powf(SPEECH_LEVEL_DBFS / 20.0) / power(&samples, &voiced).sqrt();
    for sample in &mut samples {
        *sample = (f64::from(*sample) * gain) as f32;
    }
    Ok(Spoken { samples, voiced })
}

/// From the first to the last sample whose magnitude is at most `threshold_db` (negative) below
/// the loudest sample's; `None` for silence.
pub fn voiced_extent(samples: &[f32], threshold_db: f32) -> Option<Range<usize>> {
    let peak = samples.iter().fold(0f32, |peak, s| peak.max(s.abs()));
    if peak == 0.0 {
        return None;
    }
    let level = peak * 10f32.powf(threshold_db / 20.0);
    let loud = |s: &f32| s.abs() >= level;
    Some(samples.iter().position(loud)?..samples.iter().rposition(loud)? + 1)
}

/// The mean square of `samples` over `ranges` (zero when they are empty).
pub fn power(samples: &[f32], ranges: &[Range<usize>]) -> f64 {
    let sum: f64 = ranges
        .iter()
        .map(|r| sum_of_squares(&samples[r.clone()]))
        .sum();
    let count: usize = ranges.iter().map(Range::len).sum();
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

/// The mean square of all of `samples` (zero when there are none).
fn mean_square(samples: &[f32]) -> f64 {
    sum_of_squares(samples) / samples.len().max(1) as f64
}

fn sum_of_squares(samples: &[f32]) -> f64 {
    samples.iter().map(|&s| f64::from(s) * f64::from(s)).sum()
}

/// `clean` with `noise` (as long) added, scaled so that the power of `clean` over `voiced` is
/// `snr_db` above the noise's power over the whole recording.
fn mix_at_snr(clean: &[f32], voiced: &[Range<usize>], noise: &[f32], snr_db: f64) -> Vec<f32> {
    let noise_power = mean_square(noise);
    let wanted = power(clean, voiced) / 10f64.powf(snr_db / 10.0);
    let gain = (wanted / noise_power).sqrt();
    clean
        .iter()
        .zip(noise)
        .map(|(&c, &n)| (f64::from(c) + gain * f64::from(n)) as f32)
        .collect()
}

/// The SNR of `mixed` = `clean` + noise, in dB: the power of `clean` over `voiced` against the
/// power of the noise (`mixed − clean`) over the whole recording.
pub fn snr_db(clean: &[f32], mixed: &[f32], voiced: &[Range<usize>]) -> f64 {
    let noise: Vec<f32> = mixed.iter().zip(clean).map(|(m, c)| m - c).collect();
    10.0 * (power(clean, voiced) / mean_square(&noise)).log10()
}

/// Pink noise (power falling 3 dB an octave) by the Voss–McCartney method: [`PINK_ROWS`]
/// Gaussian values, row `k` drawn again every `2^(k+1)` samples (sample `n`'s row is the
/// number of trailing zeros of `n`), summed with a fresh Gaussian value at every sample.
fn pink_noise(len: usize, rng: &mut Rng) -> Vec<f32> {
    let mut rows = [0.0; PINK_ROWS];
    for row in &mut rows {
        *row = rng.gaussian();
    }
    (1..=len)
        .map(|n| {
            if let Some(row) = rows.get_mut(n.trailing_zeros() as usize) {
                *row = rng.gaussian();
            }
            (rows.iter().sum::<f64>() + rng.gaussian()) as f32
        })
        .collect()
}

/// [`BABBLE_TALKERS`] of `talkers` (picked at random) speaking at once, each looped from a
/// random offset over `len` samples.
fn babble(len: usize, talkers: &[&[f32]], rng: &mut Rng) -> Vec<f32> {
    let mut order: Vec<usize> = (0..talkers.len()).collect();
    let mut mix = vec![0.0f32; len];
    for k in 0..BABBLE_TALKERS {
        // A partial Fisher–Yates shuffle: the first BABBLE_TALKERS of `order`, all different.
        order.swap(k, k + rng.below(talkers.len() - k));
        let talker = talkers[order[k]];
        let offset = rng.below(talker.len());
        for (t, out) in mix.iter_mut().enumerate() {
            *out += talker[(offset + t) % talker.len()];
        }
    }
    mix
}

/// FNV-1a, 64 bits: a hash that stays the same across programs and Rust versions.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// SplitMix64: a small seeded generator whose sequence is fixed, so the noise is the same on
/// every run.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        ((self.uniform() * n as f64) as usize).min(n - 1)
    }

    /// Standard normal, by the Box–Muller transform.
    fn gaussian(&mut self) -> f64 {
        let radius = (-2.0 * (1.0 - self.uniform()).ln()).sqrt();
        radius * (std::f64::consts::TAU * self.uniform()).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_parses_with_its_mix_of_kinds() {
        let turns = parse_turns(TURNS).unwrap();
        assert!(turns.len() >= 64, "{} utterances", turns.len());
        let count = |kind| turns.iter().filter(|t| t.kind == kind).count();
        assert!(count(Kind::Complete) * 4 >= turns.len());
        assert!(count(Kind::Paused) * 5 >= turns.len() * 2);
        assert!(count(Kind::Filler) >= 8);
        let pauses: Vec<u32> = turns.iter().flat_map(|t| t.pauses_ms.clone()).collect();
        assert!(pauses.iter().all(|ms| (300..=900).contains(ms)));
        assert!(pauses.contains(&300) && pauses.contains(&900));
    }

    #[test]
    fn lines_split_at_pause_marks() {
        let text = "# a comment\n\n\
                    complete: How are you?\n\
                    paused:  I'd like a table for [700] four people [ 350 ] tonight.\n\
                    filler: Um, [500] what time is it?\n";
        let turns = parse_turns(text).unwrap();
        assert_eq!(turns.len(), 3);
        assert_eq!(turns[0].pieces, ["How are you?"]);
        assert!(turns[0].pauses_ms.is_empty());
        assert_eq!(
            turns[1],
            Turn {
                kind: Kind::Paused,
                pieces: vec![
                    "I'd like a table for".into(),
                    "four people".into(),
                    "tonight.".into()
                ],
                pauses_ms: vec![700, 350],
            }
        );
        assert_eq!(
            turns[1].question(),
            "I'd like a table for four people tonight."
        );
        assert_eq!(turns[2].question(), "Um, what time is it?");
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        for (line, why) in [
            ("How are you?", "KIND"),
            ("question: How are you?", "unknown kind"),
            ("complete: How are [500] you?", "no pauses"),
            ("paused: How are you?", "0 pauses"),
            ("paused: a [300] b [300] c [300] d", "3 pauses"),
            ("paused: How are [fast] you?", "not a pause"),
            ("paused: How are [20] you?", "outside"),
            ("paused: How are [500 you?", "without its"),
            ("paused: [500] How are you?", "text missing"),
            ("paused: How are [500] [500] you?", "text missing"),
            ("paused: How are] [500] you?", "stray"),
        ] {
            let error = format!("{:#}", parse_turns(&format!("\n{line}")).unwrap_err());
            assert!(error.starts_with("turns line 2"), "{error}");
            assert!(error.contains(why), "{line}: {error}");
        }
    }

    #[test]
    fn the_voiced_extent_ignores_quiet_edges() {
        let mut samples = vec![0.0f32; 100];
        samples.extend((0..400).map(|i| 0.5 * (i as f32 * 0.3).sin()));
        // A decay just above −40 dB of the peak, then hiss below it.
        samples.extend([0.006f32, -0.006]);
        samples.extend((0..200).map(|i| if i % 2 == 0 { 0.004 } else { -0.004 }));
        let extent = voiced_extent(&samples, -40.0).unwrap();
        assert_eq!(extent.start, 101, "the sine is 0 at its first sample");
        assert_eq!(extent.end, 502);
        assert_eq!(voiced_extent(&[0.0; 50], -40.0), None);
    }

    #[test]
    fn mixing_gives_the_snr_asked_for() {
        let mut rng = Rng(7);
        let mut clean = vec![0.0f32; 8000];
        let voiced = [1000..3000, 4000..7000];
        for range in &voiced {
            for s in &mut clean[range.clone()] {
                *s = 0.3 * rng.gaussian() as f32;
            }
        }
        let noise: Vec<f32> = (0..clean.len()).map(|_| rng.gaussian() as f32).collect();
        for target in [0.0, 10.0, 20.0] {
            let mixed = mix_at_snr(&clean, &voiced, &noise, target);
            assert!((snr_db(&clean, &mixed, &voiced) - target).abs() < 1e-3);
            // The noise is everywhere, the silences too.
            assert!(mixed[..1000].iter().all(|&s| s != 0.0));
        }
    }

    /// The mean power of the DFT bins `bins` of 4096-sample blocks of `samples`.
    fn band_power(samples: &[f32], bins: Range<usize>) -> f64 {
        let n = 4096;
        let mut total = 0.0;
        let blocks = samples.len() / n;
        for block in samples.chunks_exact(n) {
            for k in bins.clone() {
                let (mut re, mut im) = (0.0, 0.0);
                for (t, &s) in block.iter().enumerate() {
                    let phase = std::f64::consts::TAU * (k * t % n) as f64 / n as f64;
                    re += f64::from(s) * phase.cos();
                    im -= f64::from(s) * phase.sin();
                }
                total += re * re + im * im;
            }
        }
        total / (blocks * bins.len()) as f64
    }

    #[test]
    fn pink_noise_falls_3_db_an_octave_and_white_is_flat() {
        let len = 16 * 4096;
        let pink = pink_noise(len, &mut Rng(1));
        let mut rng = Rng(1);
        let white: Vec<f32> = (0..len).map(|_| rng.gaussian() as f32).collect();
        // 62–125 Hz against 1–2 kHz at 16 kHz: four octaves apart, 12 dB for pink noise.
        let drop = |s: &[f32]| 10.0 * (band_power(s, 16..32) / band_power(s, 256..512)).log10();
        let pink_drop = drop(&pink);
        assert!((9.0..15.0).contains(&pink_drop), "pink: {pink_drop:.1} dB");
        let white_drop = drop(&white);
        assert!(white_drop.abs() < 1.5, "white: {white_drop:.1} dB");
    }

    #[test]
    fn noise_is_the_same_for_the_same_seed() {
        assert_eq!(pink_noise(1000, &mut Rng(3)), pink_noise(1000, &mut Rng(3)));
        assert_ne!(pink_noise(1000, &mut Rng(3)), pink_noise(1000, &mut Rng(4)));
        let talkers: Vec<Vec<f32>> = (0..8).map(|k| vec![k as f32; 10 + k]).collect();
        let talkers: Vec<&[f32]> = talkers.iter().map(Vec::as_slice).collect();
        let once = babble(100, &talkers, &mut Rng(5));
        assert_eq!(once, babble(100, &talkers, &mut Rng(5)));
        // Six different talkers of the values 0 to 7 at every sample.
        assert!(once.iter().all(|&s| (15.0..=27.0).contains(&s)));
    }
}
