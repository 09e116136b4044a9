//! Audio files through symphonia: the container found by probing the content (the extension is
//! only a hint), the first audio track decoded packet by packet and mixed down to mono; and
//! [`AudioFile`], the same resampled to 16 kHz as it is read, a [`SampleSource`].

use std::fs::File;
use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use symphonia::core::codecs::audio::well_known as codec;
use symphonia::core::codecs::audio::{AudioCodecId, AudioDecoder as SymphoniaDecoder};
use symphonia::core::codecs::audio::{AudioCodecParameters, AudioDecoderOptions};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSource, MediaSourceStream};
use symphonia::core::meta::MetadataOptions;

use super::{SampleSource, StreamResampler, SAMPLE_RATE};
use crate::{Error, Result};

/// Where a decoder reads from, kept to start again from the beginning.
#[derive(Clone, Debug)]
enum Input<'a> {
    File(PathBuf),
    Bytes(&'a [u8]),
}

/// An audio file decoded packet by packet into mono samples at the file's own sample rate.
///
/// Opened on a path ([`AudioDecoder::open`]) or on bytes in memory
/// ([`AudioDecoder::from_bytes`]); the format is found from the content, the name's extension
/// only breaking ties. Containers: WAV, FLAC, MP3, OGG, MP4/M4A (and raw ADTS AAC); codecs: PCM,
/// FLAC, MP3, Vorbis, AAC-LC. Anything else is an [`Error::UnsupportedAudio`]; a corrupt or
/// truncated file is an [`Error::BadAudio`], never a panic.
pub struct AudioDecoder<'a> {
    input: Input<'a>,
    name: PathBuf,
    format: Box<dyn FormatReader + 'a>,
    decoder: Box<dyn SymphoniaDecoder>,
    track_id: u32,
    sample_rate: u32,
    /// Frames the container says the track holds, if it says.
    declared_frames: Option<u64>,
    /// Frames decoded since the start.
    decoded_frames: u64,
    /// The last packet's samples, interleaved (reused).
    interleaved: Vec<f32>,
    /// Set after the end or an error: the decoder gives nothing more until rewound.
    done: bool,
}

impl std::fmt::Debug for AudioDecoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AudioDecoder")
            .field("name", &self.name)
            .field("sample_rate", &self.sample_rate)
            .field("declared_frames", &self.declared_frames)
            .field("decoded_frames", &self.decoded_frames)
            .finish()
    }
}

impl AudioDecoder<'static> {
    /// Opens the audio file at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::start(Input::File(path.to_path_buf()), path.to_path_buf())
    }
}

impl<'a> AudioDecoder<'a> {
    /// A decoder of the audio file `bytes` (an upload); `name` names it in errors and its
    /// extension is a hint to the format.
    pub fn from_bytes(bytes: &'a [u8], name: &str) -> Result<Self> {
        Self::start(Input::Bytes(bytes), PathBuf::from(name))
    }

    fn start(input: Input<'a>, name: PathBuf) -> Result<Self> {
        let source: Box<dyn MediaSource + 'a> = match &input {
            Input::File(path) => Box::new(File::open(path).map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?),
            Input::Bytes(bytes) => Box::new(Cursor::new(*bytes)),
        };
        let stream = MediaSourceStream::new(source, Default::default());
        let mut hint = Hint::new();
        if let Some(extension) = name.extension().and_then(|e| e.to_str()) {
            hint.with_extension(extension);
        }
        let probed = guarded(&name, "probing the format", || {
            symphonia::default::get_probe().probe(
                &hint,
                stream,
                FormatOptions::default(),
                MetadataOptions::default(),
            )
        })?;
        let format = probed.map_err(|e| match e {
            SymphoniaError::Unsupported(_) => not_readable(&input, &name),
            other => decode_error(&name, "reading the header", other),
        })?;
        let bad = |reason: String| Error::BadAudio {
            path: name.clone(),
            reason,
        };
        let track = format
            .default_track(TrackType::Audio)
            .ok_or_else(|| bad("it has no audio track".into()))?;
        let params = track
            .codec_params
            .as_ref()
            .and_then(|p| p.audio())
            .ok_or_else(|| Error::UnsupportedAudio {
                path: name.clone(),
                reason: "its audio track names no codec this engine knows".into(),
            })?;
        let sample_rate = params
            .sample_rate
            .ok_or_else(|| bad("its audio track has no sample rate".into()))?;
        if sample_rate == 0 {
            return Err(bad("its sample rate is 0 Hz".into()));
        }
        if params.channels.as_ref().is_some_and(|c| c.count() == 0) {
            return Err(bad("its audio track has no channels".into()));
        }
        // symphonia 0.6.1 derives a WAV's channels from its channel mask, with a shift that
        // wraps when the mask names fewer channels than the header counts: the samples would be
        // split into the wrong number of channels.
        if let (Some(declared), Some(channels)) = (wav_channels(&input), params.channels.as_ref()) {
            if usize::from(declared) != channels.count() {
                return Err(bad(format!(
                    "its header counts {declared} channels but its channel mask names {}",
                    channels.count()
                )));
            }
        }
        let track_id = track.id;
        let declared_frames = track.num_frames;
        let decoder = make_decoder(&name, params)?;
        Ok(Self {
            input,
            name,
            format,
            decoder,
            track_id,
            sample_rate,
            declared_frames,
            decoded_frames: 0,
            interleaved: Vec::new(),
            done: false,
        })
    }

    /// The sample rate of the decoded samples.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// The number of frames (samples per channel) the container says the track holds, when it
    /// says.
    pub fn declared_frames(&self) -> Option<u64> {
        self.declared_frames
    }

    /// The file's name, as errors give it.
    pub fn name(&self) -> &Path {
        &self.name
    }

    /// Decodes the next packet and appends its samples, mixed down to mono (the mean of the
    /// channels), to `out`. Returns how many it appended (0 for a packet that holds none), or
    /// `None` at the end of the track.
    pub fn next_packet(&mut self, out: &mut Vec<f32>) -> Result<Option<usize>> {
        if self.done {
            return Ok(None);
        }
        let result = self.decode_next(out);
        if !matches!(result, Ok(Some(_))) {
            self.done = true;
        }
        result
    }

    fn decode_next(&mut self, out: &mut Vec<f32>) -> Result<Option<usize>> {
        loop {
            let name = &self.name;
            let format = &mut self.format;
            let packet = guarded(name, "reading a packet", || format.next_packet())?;
            let packet = match packet {
                Ok(Some(packet)) => packet,
                Ok(None) => {
                    self.check_complete()?;
                    return Ok(None);
                }
                Err(SymphoniaError::ResetRequired) => {
                    return Err(Error::UnsupportedAudio {
                        path: self.name.clone(),
                        reason: "its stream changes format midway (a chained stream)".into(),
                    })
                }
                Err(e) => return Err(self.error_at("reading", e)),
            };
            if packet.track_id != self.track_id {
                continue;
            }
            let decoder = &mut self.decoder;
            let interleaved = &mut self.interleaved;
            let decoded = guarded(name, "decoding a packet", || {
                decoder.decode(&packet).map(|buffer| {
                    buffer.copy_to_vec_interleaved(interleaved);
                    (buffer.spec().rate(), buffer.spec().channels().count())
                })
            })?;
            let (rate, channels) = decoded.map_err(|e| self.error_at("decoding", e))?;
            if channels == 0 {
                return Err(self.bad("a packet decodes to no channels".into()));
            }
            if rate != self.sample_rate {
                return Err(self.bad(format!(
                    "its sample rate changes from {} Hz to {rate} Hz",
                    self.sample_rate
                )));
            }
            let frames = self.interleaved.len() / channels;
            out.extend(
                self.interleaved
                    .chunks_exact(channels)
                    .map(|frame| frame.iter().sum::<f32>() / channels as f32),
            );
            self.decoded_frames += frames as u64;
            return Ok(Some(frames));
        }
    }

    /// Fails when the container promised more frames than were decoded (by over 50 ms): a file
    /// cut short at a packet boundary, which the demuxers take for its end, or one whose
    /// corrupt frames a demuxer skipped.
    fn check_complete(&self) -> Result<()> {
        let Some(declared) = self.declared_frames else {
            return Ok(());
        };
        let slack = u64::from(self.sample_rate / 20);
        if self.decoded_frames.saturating_add(slack) < declared {
            return Err(self.bad(format!(
                "the header promises {declared} frames and only {} decode: the file is \
                 truncated or corrupt",
                self.decoded_frames
            )));
        }
        Ok(())
    }

    /// Starts again from the first sample (by opening the input again: every format can, where
    /// seeking back is exact in only some).
    pub fn rewind(&mut self) -> Result<()> {
        *self = Self::start(self.input.clone(), self.name.clone())?;
        Ok(())
    }

    /// Seconds decoded so far.
    pub fn decoded_seconds(&self) -> f64 {
        self.decoded_frames as f64 / f64::from(self.sample_rate)
    }

    /// How many samples the decoder's own buffer holds at most (one packet, interleaved).
    pub fn buffer_capacity(&self) -> usize {
        self.interleaved.capacity()
    }

    fn bad(&self, reason: String) -> Error {
        Error::BadAudio {
            path: self.name.clone(),
            reason,
        }
    }

    /// A symphonia error while `doing` something, with the time where it happened.
    fn error_at(&self, doing: &str, error: SymphoniaError) -> Error {
        let at = format!("{doing} at {:.2} s", self.decoded_seconds());
        decode_error(&self.name, &at, error)
    }
}

/// The decoder of a track's codec, or the reason there is none.
fn make_decoder(name: &Path, params: &AudioCodecParameters) -> Result<Box<dyn SymphoniaDecoder>> {
    let registry = symphonia::default::get_codecs();
    if registry.get_audio_decoder(params.codec).is_none() {
        return Err(Error::UnsupportedAudio {
            path: name.to_path_buf(),
            reason: format!("no decoder for its codec, {}", codec_name(params.codec)),
        });
    }
    let made = guarded(name, "starting the decoder", || {
        registry.make_audio_decoder(params, &AudioDecoderOptions::default())
    })?;
    made.map_err(|e| match e {
        SymphoniaError::Unsupported(what) => Error::UnsupportedAudio {
            path: name.to_path_buf(),
            reason: format!("{} ({what})", codec_name(params.codec)),
        },
        other => decode_error(name, "starting the decoder", other),
    })
}

/// The error of an input no format reader took: empty, a known container too damaged to
/// open (an MP4 cut before its index, say), or something else.
/// The channel count of a RIFF/WAVE file's `fmt ` chunk, if `input` is one (read from its
/// first 64 KiB).
fn wav_channels(input: &Input<'_>) -> Option<u16> {
    const HEAD: usize = 1 << 16;
    let owned;
    let head: &[u8] = match input {
        Input::Bytes(bytes) => &bytes[..bytes.len().min(HEAD)],
        Input::File(path) => {
            use std::io::Read;
            let mut buffer = Vec::with_capacity(HEAD);
            File::open(path)
                .ok()?
                .take(HEAD as u64)
                .read_to_end(&mut buffer)
                .ok()?;
            owned = buffer;
            &owned
        }
    };
    if head.get(..4)? != b"RIFF" || head.get(8..12)? != b"WAVE" {
        return None;
    }
    let mut at = 12;
    while at + 8 <= head.len() {
        let size = u32::from_le_bytes(head[at + 4..at + 8].try_into().ok()?) as usize;
        if &head[at..at + 4] == b"fmt " {
            let channels = head.get(at + 10..at + 12)?;
            return Some(u16::from_le_bytes([channels[0], channels[1]]));
        }
        at = at.checked_add(8)?.checked_add(size + size % 2)?;
    }
    None
}

fn not_readable(input: &Input<'_>, name: &Path) -> Error {
    let mut head = [0u8; 12];
    let len = match input {
        Input::Bytes(bytes) => {
            let len = bytes.len().min(head.len());
            head[..len].copy_from_slice(&bytes[..len]);
            bytes.len()
        }
        Input::File(path) => {
            use std::io::Read;
            let mut start = Vec::with_capacity(head.len());
            let read = File::open(path)
                .and_then(|file| file.take(head.len() as u64).read_to_end(&mut start));
            head[..start.len()].copy_from_slice(&start);
            read.unwrap_or(0)
        }
    };
    let bad = |reason: &str| Error::BadAudio {
        path: name.to_path_buf(),
        reason: reason.to_string(),
    };
    let known = [
        (&b"fLaC"[..], 0, "a FLAC file"),
        (b"OggS", 0, "an OGG file"),
        (b"RIFF", 0, "a RIFF (WAV) file"),
        (b"ID3", 0, "an MP3 file"),
        (b"ftyp", 4, "an MP4 file"),
    ];
    if len == 0 {
        bad("the file is empty")
    } else if let Some((_, _, kind)) = known
        .iter()
        .find(|(magic, at, _)| head.get(*at..at + magic.len()) == Some(*magic))
    {
        bad(&format!(
            "{kind} that cannot be opened: truncated (an MP4 file cut before its index) or \
             corrupt"
        ))
    } else {
        Error::UnsupportedAudio {
            path: name.to_path_buf(),
            reason: "not an audio container this engine reads".into(),
        }
    }
}

/// A codec's common name, for errors.
fn codec_name(id: AudioCodecId) -> String {
    let known = [
        (codec::CODEC_ID_OPUS, "Opus"),
        (codec::CODEC_ID_SPEEX, "Speex"),
        (codec::CODEC_ID_AC3, "AC-3"),
        (codec::CODEC_ID_EAC3, "E-AC-3"),
        (codec::CODEC_ID_DCA, "DTS"),
        (codec::CODEC_ID_WMA, "WMA"),
        (codec::CODEC_ID_ALAC, "ALAC"),
        (codec::CODEC_ID_WAVPACK, "WavPack"),
        (codec::CODEC_ID_MP1, "MPEG Layer I"),
        (codec::CODEC_ID_MP2, "MPEG Layer II"),
        (codec::CODEC_ID_ADPCM_MS, "Microsoft ADPCM"),
        (codec::CODEC_ID_ADPCM_IMA_WAV, "IMA ADPCM"),
    ];
    known
        .iter()
        .find(|(known, _)| *known == id)
        .map_or_else(|| format!("codec {id}"), |(_, name)| (*name).to_string())
}

/// A symphonia error as this crate's.
fn decode_error(name: &Path, doing: &str, error: SymphoniaError) -> Error {
    let path = name.to_path_buf();
    match error {
        SymphoniaError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Error::BadAudio {
                path,
                reason: format!("{doing}: the file ends early (empty or truncated)"),
            }
        }
        // Symphonia's readers report a broken bitstream as an I/O error too.
        SymphoniaError::IoError(e) => Error::BadAudio {
            path,
            reason: format!("{doing}: {e}"),
        },
        SymphoniaError::Unsupported(what) => Error::UnsupportedAudio {
            path,
            reason: format!("{doing}: {what}"),
        },
        other => Error::BadAudio {
            path,
            reason: format!("{doing}: {other}"),
        },
    }
}

/// Runs a step of symphonia on untrusted data, turning a panic in it into an
/// [`Error::BadAudio`]: a malformed file must be an error, whatever the decoder does with it.
fn guarded<T>(name: &Path, doing: &str, step: impl FnOnce() -> T) -> Result<T> {
    catch_unwind(AssertUnwindSafe(step)).map_err(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Error::BadAudio {
            path: name.to_path_buf(),
            reason: format!("{doing}: the decoder failed on malformed data ({message})"),
        }
    })
}

/// An audio file read as mono 16 kHz samples, decoded, mixed down and resampled piece by piece:
/// it holds one packet and the piece asked for, never the whole recording. Its samples are
/// those of [`super::Audio::read`] followed by [`super::Audio::to_16k`], to the bit.
#[derive(Debug)]
pub struct AudioFile<'a> {
    decoder: AudioDecoder<'a>,
    resampler: StreamResampler,
    /// The last packet's mono samples at the file's rate.
    packet: Vec<f32>,
    /// 16 kHz samples decoded but not read yet.
    ready: Vec<f32>,
    finished: bool,
}

impl AudioFile<'static> {
    /// Opens the audio file at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::new(AudioDecoder::open(path)?)
    }
}

impl<'a> AudioFile<'a> {
    /// Reads the audio file `bytes` (an upload); `name` names it in errors.
    pub fn from_bytes(bytes: &'a [u8], name: &str) -> Result<Self> {
        Self::new(AudioDecoder::from_bytes(bytes, name)?)
    }

    /// 16 kHz samples of what `decoder` decodes. Its sample rate must lie in
    /// [`super::SAMPLE_RATES`] ([`Error::Resample`]).
    pub fn new(decoder: AudioDecoder<'a>) -> Result<Self> {
        let resampler = StreamResampler::new(decoder.sample_rate(), SAMPLE_RATE)?;
        Ok(Self {
            decoder,
            resampler,
            packet: Vec::new(),
            ready: Vec::new(),
            finished: false,
        })
    }

    /// The sample rate of the file.
    pub fn source_sample_rate(&self) -> u32 {
        self.decoder.sample_rate()
    }

    /// Seconds of the file decoded so far.
    pub fn decoded_seconds(&self) -> f64 {
        self.decoder.decoded_seconds()
    }

    /// The length its header declares, in seconds, if it declares one.
    pub fn declared_seconds(&self) -> Option<f64> {
        let frames = self.decoder.declared_frames()?;
        Some(frames as f64 / f64::from(self.decoder.sample_rate()))
    }

    /// The file's name, as errors give it.
    pub fn name(&self) -> &Path {
        self.decoder.name()
    }

    /// Samples held in its buffers (allocated capacity, the decoder's and the resampler's
    /// included): after a `read` of at most `max` samples, at most `max` plus a packet and a
    /// resampler chunk, whatever the file's length.
    pub fn buffered_capacity(&self) -> usize {
        self.packet.capacity()
            + self.ready.capacity()
            + self.decoder.buffer_capacity()
            + self.resampler.buffer_capacity()
    }
}

impl SampleSource for AudioFile<'_> {
    fn read(&mut self, out: &mut Vec<f32>, max: usize) -> Result<usize> {
        while self.ready.len() < max && !self.finished {
            self.packet.clear();
            match self.decoder.next_packet(&mut self.packet)? {
                Some(_) => self.resampler.push(&self.packet, &mut self.ready)?,
                None => {
                    self.resampler.finish(&mut self.ready)?;
                    self.finished = true;
                }
            }
        }
        let n = max.min(self.ready.len());
        out.extend(self.ready.drain(..n));
        Ok(n)
    }

    fn rewind(&mut self) -> Result<()> {
        self.decoder.rewind()?;
        self.resampler = StreamResampler::new(self.decoder.sample_rate(), SAMPLE_RATE)?;
        self.ready.clear();
        self.finished = false;
        Ok(())
    }
}
