//! The fuzz targets: each writes an input where the parser reads it (a file for the readers
//! that take paths), runs the parser and what uses its result, and says what happened. An
//! error is a refused input, which is fine; a panic, an abort or memory out of proportion to
//! the input is a finding.

use std::fmt::{Display, Write as _};
use std::io::Cursor;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use engine_asr::{Audio, Transcriber, WhisperTokenizer};
use engine_llm::{TextTokenizer, TransformerConfig};
use spec_nn::ctranslate2::{write_model_bin, Ct2Variable};
use spec_nn::{Ct2File, GgufFile, SafetensorsFiles, WeightSource};

/// A parser under test.
pub struct Target {
    pub name: &'static str,
    /// What the target runs, for `--list` and the docs.
    pub covers: &'static str,
    /// Writes the files the parser reads beside its input (a model folder's other files).
    pub prepare: fn(&Path) -> Result<()>,
    /// Valid inputs for mutations to start from, given the prepared folder.
    pub seeds: fn(&Path) -> Result<Vec<Vec<u8>>>,
    /// Parses one input in the prepared folder; what each step did.
    pub parse: fn(&Path, &[u8]) -> Trace,
    /// Tokens of the format, for mutations to insert.
    pub dictionary: &'static [&'static [u8]],
    /// Longest input the mutations make.
    pub max_len: usize,
    /// Memory one parse may hold at once: this many bytes per input byte, plus
    /// [`Target::memory_base`].
    pub memory_per_byte: u64,
    pub memory_base: u64,
}

impl Target {
    /// The most bytes a parse of `len` input bytes may hold at once.
    pub fn memory_limit(&self, len: usize) -> u64 {
        self.memory_per_byte * len as u64 + self.memory_base
    }
}

/// What each step of a parse did: its name, and the error it ended in, if any.
#[derive(Debug, Default)]
pub struct Trace {
    steps: Vec<(&'static str, Option<String>)>,
}

impl Trace {
    /// Notes a step's result and passes its value on.
    pub fn step<T, E: Display>(&mut self, step: &'static str, result: Result<T, E>) -> Option<T> {
        match result {
            Ok(value) => {
                self.steps.push((step, None));
                Some(value)
            }
            Err(error) => {
                self.steps.push((step, Some(error.to_string())));
                None
            }
        }
    }

    /// Whether a step past writing the input succeeded.
    pub fn got_past_writing(&self) -> bool {
        self.steps
            .iter()
            .any(|(step, error)| *step != "write" && error.is_none())
    }

    /// The steps and their errors as one line, `step:ok` or `step:error`.
    pub fn summary(&self) -> String {
        let mut line = String::new();
        for (step, error) in &self.steps {
            let _ = write!(line, "{step}:{} ", error.as_deref().unwrap_or("ok"));
        }
        line
    }
}

const MIB: u64 = 1 << 20;

/// Every target, in the order `cargo xtask fuzz` runs them.
pub fn all() -> Vec<Target> {
    vec![
        Target {
            name: "wav",
            covers: "engine_asr::Audio::read_wav (hound, every PCM and float encoding), \
                     check_finite and the resampling to 16 kHz",
            prepare: nothing,
            seeds: wav_seeds,
            parse: wav,
            dictionary: &[
                b"RIFF",
                b"WAVE",
                b"fmt ",
                b"data",
                b"LIST",
                b"fact",
                b"\x01\x00",
                b"\x03\x00",
                b"\xfe\xff",
                b"\x10\x00\x00\x00",
                b"\x80\x3e\x00\x00",
            ],
            max_len: 8 << 10,
            memory_per_byte: 64,
            memory_base: MIB,
        },
        Target {
            name: "audio",
            covers: "engine_asr::AudioDecoder::from_bytes (symphonia: probing WAV, FLAC, MP3, \
                     OGG/Vorbis, MP4/AAC, each packet decoded and mixed down), \
                     Audio::from_bytes_at_most with its resampling to 16 kHz, and AudioFile \
                     streamed at 16 kHz with a rewind; at most 60 s of audio decoded a case",
            prepare: nothing,
            seeds: audio_seeds,
            parse: audio,
            dictionary: &[
                b"fLaC",
                b"OggS",
                b"\x01vorbis",
                b"\x05vorbis",
                b"RIFF",
                b"WAVE",
                b"ID3\x04\x00",
                b"\xff\xfb",
                b"\xff\xf1",
                b"Xing",
                b"ftyp",
                b"moov",
                b"mdat",
                b"trak",
                b"stsz",
                b"stco",
                b"esds",
                b"mp4a",
            ],
            max_len: 16 << 10,
            memory_per_byte: 64,
            // Decoder state (a FLAC block of 65 535 frames in 8 channels, Vorbis and AAC
            // tables), symphonia's 64 KiB read buffer, and a resampler whose chunk is a second
            // of audio for a rate prime to 16 kHz.
            memory_base: 64 * MIB,
        },
        Target {
            name: "gguf",
            covers: "spec_nn::GgufFile::open (our alignment scan, candle's header reader, the \
                     truncation check), every metadata value as integer and number, every \
                     tensor read and dequantized, TransformerConfig::from_gguf and \
                     TextTokenizer::from_gguf with an encode/decode",
            prepare: nothing,
            seeds: gguf_seeds,
            parse: gguf,
            dictionary: &[
                b"GGUF",
                b"general.alignment",
                b"general.architecture",
                b"qwen2",
                b"llama",
                b"tokenizer.ggml.tokens",
                b"tokenizer.ggml.merges",
                b"tokenizer.ggml.token_type",
                b"token_embd.weight",
                b"\x00\x00\x00\x00",
                b"\x04\x00\x00\x00",
                b"\x08\x00\x00\x00",
                b"\x09\x00\x00\x00",
                b"\x0a\x00\x00\x00",
                b"\x0c\x00\x00\x00",
            ],
            max_len: 64 << 10,
            memory_per_byte: 64,
            memory_base: 4 * MIB,
        },
        Target {
            name: "ct2",
            covers: "spec_nn::Ct2File::open (CTranslate2 model.bin), every variable read as a \
                     tensor and as a scalar, and engine_asr::Transcriber::load of a tiny \
                     Whisper folder holding the input as its model.bin",
            prepare: ct2_folder,
            seeds: ct2_seeds,
            parse: ct2,
            dictionary: &[
                b"\x06\x00\x00\x00",
                b"\x05\x00\x00\x00",
                b"WhisperSpec\0",
                b"encoder/conv1/weight\0",
                b"decoder/embeddings/weight\0",
                b"decoder/scale_embeddings\0",
                b"\x00",
                b"\x04",
                b"\x05",
            ],
            max_len: 1 << 20,
            memory_per_byte: 64,
            memory_base: 64 * MIB,
        },
        Target {
            name: "safetensors",
            covers: "spec_nn::SafetensorsFiles::open (the safetensors header and candle's \
                     conversion), every tensor read, and engine_asr::Transcriber::load of a \
                     tiny Hugging Face Whisper folder holding the input as its \
                     model.safetensors",
            prepare: hf_folder,
            seeds: hf_seeds,
            parse: safetensors,
            dictionary: &[
                b"\"dtype\"",
                b"\"shape\"",
                b"\"data_offsets\"",
                b"\"F16\"",
                b"\"BF16\"",
                b"\"F32\"",
                b"\"I64\"",
                b"\"U8\"",
                b"\"__metadata__\"",
                b"[]",
                b"[0,0]",
            ],
            max_len: 1 << 20,
            memory_per_byte: 64,
            memory_base: 64 * MIB,
        },
        Target {
            name: "tokenizer-json",
            covers: "tokenizer.json read as engine_llm::TextTokenizer and as \
                     engine_asr::WhisperTokenizer (special tokens, vocabulary and \
                     configuration checks against the tiny model), with encode/decode",
            prepare: nothing,
            seeds: tokenizer_json_seeds,
            parse: tokenizer_json,
            dictionary: JSON_TOKENS,
            max_len: 256 << 10,
            memory_per_byte: 64,
            memory_base: 16 * MIB,
        },
        Target {
            name: "vocab-merges",
            covers: "engine_llm::TextTokenizer::from_vocab_and_merges: vocab.json, merges.txt \
                     and tokenizer_config.json (the input split at NUL-dash-dash-NUL), with \
                     encode/decode",
            prepare: nothing,
            seeds: vocab_merges_seeds,
            parse: vocab_merges,
            dictionary: JSON_TOKENS,
            max_len: 64 << 10,
            memory_per_byte: 64,
            memory_base: 16 * MIB,
        },
        Target {
            name: "registry",
            covers: "spec_models::Registry::parse (models.toml) and every entry's sizes, \
                     addresses and instructions",
            prepare: nothing,
            seeds: registry_seeds,
            parse: registry,
            dictionary: &[
                b"[[model]]",
                b"[[model.files]]",
                b"name = ",
                b"kind = \"whisper\"",
                b"format = \"gguf\"",
                b"repo = \"a/b\"",
                b"revision = \"main\"",
                b"size = ",
                b"sha256 = ",
                b"remote = ",
                b"url = \"https://x/y\"",
                b"local = ",
                b"manual = ",
                b"gated = true",
                b"\"\"\"",
                b"18446744073709551615",
            ],
            max_len: 64 << 10,
            memory_per_byte: 64,
            memory_base: MIB,
        },
        Target {
            name: "partials",
            covers: "spec_voice::parse_partials and read_partials (timed partial \
                     transcripts) and parse_conversations",
            prepare: nothing,
            seeds: partials_seeds,
            parse: partials,
            dictionary: &[
                b"\t", b"\n\n", b"# ", b"0.5\t", b"1e308\t", b"NaN\t", b"inf\t", b"-1\t",
            ],
            max_len: 16 << 10,
            memory_per_byte: 64,
            memory_base: MIB,
        },
        Target {
            name: "protocol",
            covers: "specvoice::serve::protocol: parse_client (and a round trip of what it \
                     accepts), decode_frame, and ServerMessage as a client reads it",
            prepare: nothing,
            seeds: protocol_seeds,
            parse: protocol,
            dictionary: JSON_TOKENS,
            max_len: 8 << 10,
            memory_per_byte: 64,
            memory_base: MIB,
        },
        Target {
            name: "openai",
            covers: "the OpenAI-compatible API's request bodies through the server's router \
                     (access checks, body deadline, the handlers' parsing and checks): chat \
                     completions and speech JSON, transcription multipart forms with their \
                     WAV; the first byte picks the endpoint",
            prepare: openai_router,
            seeds: openai_seeds,
            parse: openai,
            dictionary: OPENAI_TOKENS,
            max_len: 16 << 10,
            memory_per_byte: 64,
            memory_base: 4 * MIB,
        },
    ]
}

const OPENAI_TOKENS: &[&[u8]] = &[
    b"\"model\"",
    b"\"messages\"",
    b"\"role\"",
    b"\"content\"",
    b"\"user\"",
    b"\"system\"",
    b"\"developer\"",
    b"\"assistant\"",
    b"\"text\"",
    b"\"stream\"",
    b"\"stream_options\"",
    b"\"max_tokens\"",
    b"\"temperature\"",
    b"\"top_p\"",
    b"\"stop\"",
    b"\"seed\"",
    b"\"input\"",
    b"\"voice\"",
    b"\"speed\"",
    b"\"response_format\"",
    b"\"pcm\"",
    b"\"alloy\"",
    b"\"specvoice-chat\"",
    b"\"tts-1\"",
    b"--specvoice-fuzz\r\n",
    b"--specvoice-fuzz--\r\n",
    b"Content-Disposition: form-data; name=\"",
    b"\"; filename=\"a.wav\"\r\n",
    b"\r\n\r\n",
    b"RIFF",
    b"WAVE",
    b"verbose_json",
    b"1e999",
    b"-1",
];

const JSON_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"null",
    b"true",
    b"\"type\"",
    b"\"start\"",
    b"\"stop\"",
    b"\"mode\"",
    b"\"caption\"",
    b"\"chat\"",
    b"\"voice\"",
    b"\"to\"",
    b"\"content\"",
    b"\"special\"",
    b"\"added_tokens\"",
    b"\"added_tokens_decoder\"",
    b"\"vocab\"",
    b"\"merges\"",
    b"\"model\"",
    b"\"BPE\"",
    b"\"WordPiece\"",
    b"\"Unigram\"",
    b"\"ByteLevel\"",
    b"\"Split\"",
    b"\"Regex\"",
    b"\"pre_tokenizer\"",
    b"\"normalizer\"",
    b"\"decoder\"",
    b"\"post_processor\"",
    b"\"<|endoftext|>\"",
    b"\"<|notimestamps|>\"",
    b"\\u0000",
    b"\\ud800",
    b"4294967295",
    b"-1",
    b"1e999",
];

fn nothing(_: &Path) -> Result<()> {
    Ok(())
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, bytes)?;
    Ok(path)
}

// --- WAV ---------------------------------------------------------------------------------

fn wav_seeds(_: &Path) -> Result<Vec<Vec<u8>>> {
    use hound::SampleFormat::{Float, Int};
    let layouts = [
        (1, 16_000, 16, Int),
        (2, 8_000, 8, Int),
        (1, 44_100, 24, Int),
        (2, 48_000, 32, Float),
        (3, 22_050, 32, Int),
    ];
    let mut seeds = Vec::new();
    for (channels, sample_rate, bits_per_sample, sample_format) in layouts {
        let spec = hound::WavSpec {
            channels,
            sample_rate,
            bits_per_sample,
            sample_format,
        };
        let mut bytes = Cursor::new(Vec::new());
        let mut writer = hound::WavWriter::new(&mut bytes, spec)?;
        let full_scale = ((1i64 << (bits_per_sample - 1)) - 1) as f32;
        for i in 0..48 {
            let value = (i as f32 * 0.3).sin() * 0.5;
            for _ in 0..channels {
                match sample_format {
                    Float => writer.write_sample(value)?,
                    Int => writer.write_sample((value * full_scale) as i32)?,
                }
            }
        }
        writer.finalize()?;
        seeds.push(bytes.into_inner());
    }
    Ok(seeds)
}

fn wav(dir: &Path, bytes: &[u8]) -> Trace {
    let mut trace = Trace::default();
    let Some(path) = trace.step("write", write(dir, "input.wav", bytes)) else {
        return trace;
    };
    if let Some(audio) = trace.step("read", Audio::read_wav(&path)) {
        trace.step("finite", engine_asr::audio::check_finite(&audio.samples));
        trace.step("16k", audio.to_16k());
    }
    trace
}

// --- Audio files -------------------------------------------------------------------------

/// The most audio one case decodes: a few kilobytes of FLAC or MP3 can hold hours of silence.
const AUDIO_SECONDS: f64 = 60.0;

fn audio_seeds(_: &Path) -> Result<Vec<Vec<u8>>> {
    Ok(vec![
        include_bytes!("../seeds/audio/short.flac").to_vec(),
        include_bytes!("../seeds/audio/short.mp3").to_vec(),
        include_bytes!("../seeds/audio/short.ogg").to_vec(),
        include_bytes!("../seeds/audio/short.m4a").to_vec(),
        include_bytes!("../seeds/audio/short.wav").to_vec(),
    ])
}

fn audio(_: &Path, bytes: &[u8]) -> Trace {
    use engine_asr::{AudioDecoder, AudioFile, SampleSource};
    let mut trace = Trace::default();
    // Packet by packet at the file's rate, to the end or the time limit.
    if let Some(mut decoder) = trace.step("open", AudioDecoder::from_bytes(bytes, "input")) {
        let mut samples = Vec::new();
        loop {
            samples.clear();
            match decoder.next_packet(&mut samples) {
                Ok(Some(_)) if decoder.decoded_seconds() <= AUDIO_SECONDS => {}
                Ok(_) => {
                    trace.step::<(), String>("packets", Ok(()));
                    break;
                }
                Err(e) => {
                    trace.step::<(), _>("packets", Err(e));
                    break;
                }
            }
        }
    }
    // Whole, bounded, at 16 kHz.
    if let Some(audio) = trace.step(
        "whole",
        Audio::from_bytes_at_most(bytes, "input", AUDIO_SECONDS),
    ) {
        trace.step("16k", audio.to_16k());
    }
    // Streamed at 16 kHz, twice (a rewind between).
    if let Some(mut file) = trace.step("stream", AudioFile::from_bytes(bytes, "input")) {
        let limit = (AUDIO_SECONDS * f64::from(engine_asr::SAMPLE_RATE)) as usize;
        for step in ["read", "reread"] {
            let mut out = Vec::new();
            let mut total = 0;
            let read = loop {
                out.clear();
                match file.read(&mut out, 4096) {
                    Ok(0) => break Ok(()),
                    Ok(n) if total + n < limit => total += n,
                    Ok(_) => break Ok(()),
                    Err(e) => break Err(e),
                }
            };
            if trace.step(step, read).is_none() || trace.step("rewind", file.rewind()).is_none() {
                break;
            }
        }
    }
    trace
}

// --- GGUF --------------------------------------------------------------------------------

/// GPT-2's byte-level alphabet: the 256 characters bytes are written as.
fn byte_level_alphabet() -> Vec<String> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut shifted = 0;
    (0..256u32)
        .map(|b| {
            let code = match printable(b) {
                true => b,
                false => {
                    shifted += 1;
                    255 + shifted
                }
            };
            char::from_u32(code).map(String::from).unwrap_or_default()
        })
        .collect()
}

/// A tiny byte-level BPE vocabulary: the alphabet and three merges.
fn tiny_bpe() -> (Vec<String>, Vec<String>) {
    let mut tokens = byte_level_alphabet();
    tokens.extend(["Ġt", "he", "the", "<|endoftext|>"].map(String::from));
    let merges = ["Ġ t", "h e", "t he"].map(String::from).to_vec();
    (tokens, merges)
}

fn gguf_seeds(_: &Path) -> Result<Vec<Vec<u8>>> {
    let device = Device::Cpu;
    let ramp = |rows: usize, cols: usize| {
        Tensor::arange(0f32, (rows * cols) as f32, &device)?
            .affine(1.0 / (rows * cols) as f64, -0.5)?
            .reshape((rows, cols))
    };
    let embedding = QTensor::quantize(&ramp(8, 32)?, GgmlDType::Q8_0)?;
    let q4 = QTensor::quantize(&ramp(2, 32)?, GgmlDType::Q4_0)?;
    let q4k = QTensor::quantize(&ramp(1, 256)?, GgmlDType::Q4K)?;
    let dense = QTensor::quantize(&ramp(2, 4)?, GgmlDType::F32)?;
    let half = QTensor::quantize(&ramp(1, 8)?, GgmlDType::F16)?;
    let (tokens, merges) = tiny_bpe();
    let strings =
        |items: &[String]| Value::Array(items.iter().cloned().map(Value::String).collect());
    let mut types = vec![Value::I32(1); tokens.len()];
    if let Some(last) = types.last_mut() {
        *last = Value::I32(3);
    }
    let model_metadata = vec![
        ("general.architecture", Value::String("qwen2".into())),
        ("general.alignment", Value::U32(32)),
        ("qwen2.attention.head_count", Value::U32(2)),
        ("qwen2.attention.head_count_kv", Value::U32(1)),
        ("qwen2.embedding_length", Value::U32(32)),
        ("qwen2.feed_forward_length", Value::U64(64)),
        ("qwen2.block_count", Value::I32(1)),
        ("qwen2.context_length", Value::U32(128)),
        ("qwen2.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("qwen2.rope.freq_base", Value::F64(10_000.0)),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("qwen2".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.merges", strings(&merges)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        (
            "tokenizer.ggml.eos_token_id",
            Value::U32(tokens.len() as u32 - 1),
        ),
        ("general.flag", Value::Bool(true)),
        ("general.small", Value::I8(-3)),
        ("general.wide", Value::I64(-1)),
        (
            "general.nested",
            Value::Array(vec![Value::Array(vec![Value::U16(7), Value::U16(8)])]),
        ),
    ];
    let model_tensors = [
        ("token_embd.weight", &embedding),
        ("blk.0.attn_q.weight", &q4),
        ("blk.0.ffn_down.weight", &q4k),
        ("output_norm.weight", &dense),
        ("rope_freqs.weight", &half),
    ];
    let header_only = vec![("general.alignment", Value::U8(64))];
    let mut seeds = Vec::new();
    for (metadata, tensors) in [
        (&model_metadata, &model_tensors[..]),
        (&header_only, &model_tensors[3..4]),
        (&header_only, &[][..]),
    ] {
        let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let mut bytes = Cursor::new(Vec::new());
        gguf_file::write(&mut bytes, &metadata, tensors)?;
        let mut bytes = bytes.into_inner();
        seeds.push(bytes.clone());
        // The same as version 3 (the writer writes 2; their layouts agree).
        bytes[4] = 3;
        seeds.push(bytes);
    }
    Ok(seeds)
}

fn gguf(dir: &Path, bytes: &[u8]) -> Trace {
    let mut trace = Trace::default();
    let Some(path) = trace.step("write", write(dir, "model.gguf", bytes)) else {
        return trace;
    };
    let Some(mut file) = trace.step("open", GgufFile::open(&path)) else {
        return trace;
    };
    let mut keys: Vec<String> = file.metadata().keys().cloned().collect();
    keys.sort();
    for key in keys.iter().take(64) {
        let _ = file.usize(key);
        let _ = file.f32(key);
    }
    let mut names: Vec<String> = file.tensor_names().map(String::from).collect();
    names.sort();
    for name in names.iter().take(16) {
        let _ = file.dims(name);
        let tensor = file.tensor(name, &Device::Cpu);
        if let Some(tensor) = trace.step("tensor", tensor) {
            trace.step("dequantize", tensor.into_f32(&Device::Cpu));
        }
    }
    if let Some(config) = trace.step("config", TransformerConfig::from_gguf(&file)) {
        trace.step("validate", config.validate());
    }
    if let Some(tokenizer) = trace.step("tokenizer", TextTokenizer::from_gguf(&file)) {
        encode_and_decode(&mut trace, &tokenizer);
    }
    trace
}

fn encode_and_decode(trace: &mut Trace, tokenizer: &TextTokenizer) {
    if let Some(ids) = trace.step("encode", tokenizer.encode(SAMPLE_TEXT)) {
        trace.step("decode", tokenizer.decode(&ids));
    }
    let end = u32::try_from(tokenizer.vocab_size()).unwrap_or(u32::MAX);
    trace.step(
        "decode-edges",
        tokenizer.decode(&[0, end.saturating_sub(1), end]),
    );
}

/// Text to encode with a parsed tokenizer: words, digits, spaces, a special token, non-ASCII.
const SAMPLE_TEXT: &str = "the Theme 42  <|endoftext|> Grüße, 世界!\n";

// --- CTranslate2 and Whisper folders -----------------------------------------------------

fn ct2_folder(dir: &Path) -> Result<()> {
    engine_asr::testing::write_ct2(dir, 1, DType::F16).context("writing the tiny CT2 Whisper")
}

fn ct2_seeds(dir: &Path) -> Result<Vec<Vec<u8>>> {
    let model = std::fs::read(dir.join("model.bin"))?;
    let small = dir.join("small.bin");
    let device = Device::Cpu;
    write_model_bin(
        &small,
        "WhisperSpec",
        &[
            (
                "encoder/layer_norm/gamma".into(),
                Ct2Variable::Tensor(Tensor::ones(4, DType::F32, &device)?),
            ),
            (
                "decoder/embeddings/weight".into(),
                Ct2Variable::Tensor(Tensor::ones((2, 4), DType::BF16, &device)?),
            ),
            ("num_heads".into(), Ct2Variable::I16(4)),
            ("decoder/scale_embeddings".into(), Ct2Variable::I8(1)),
        ],
        &[(
            "decoder/projection/weight".into(),
            "decoder/embeddings/weight".into(),
        )],
    )?;
    Ok(vec![model, std::fs::read(&small)?])
}

fn ct2(dir: &Path, bytes: &[u8]) -> Trace {
    let mut trace = Trace::default();
    let Some(path) = trace.step("write", write(dir, "model.bin", bytes)) else {
        return trace;
    };
    if let Some(mut file) = trace.step("open", Ct2File::open(&path)) {
        let mut names: Vec<String> = file.names().map(String::from).collect();
        names.sort();
        for name in names.iter().take(64) {
            let _ = file.dims(name);
            trace.step("tensor", file.tensor(name, &Device::Cpu));
            trace.step("scalar", file.scalar(name));
        }
    }
    transcriber(&mut trace, dir);
    trace
}

fn transcriber(trace: &mut Trace, dir: &Path) {
    let options = engine_asr::LoadOptions::default();
    trace.step("transcriber", Transcriber::load(dir, &options));
}

fn hf_folder(dir: &Path) -> Result<()> {
    engine_asr::testing::write_hf(dir, 1).context("writing the tiny Hugging Face Whisper")
}

fn hf_seeds(dir: &Path) -> Result<Vec<Vec<u8>>> {
    let model = std::fs::read(dir.join("model.safetensors"))?;
    let device = Device::Cpu;
    let small = [
        ("a", Tensor::ones((2, 3), DType::F16, &device)?),
        ("b", Tensor::new(&[1i64, -2], &device)?),
        ("c", Tensor::new(3.5f32, &device)?),
        ("d", Tensor::ones(4, DType::BF16, &device)?),
        ("e", Tensor::new(&[1u8, 2, 3], &device)?),
    ];
    let path = dir.join("small.safetensors");
    candle_core::safetensors::save(
        &small.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        &path,
    )?;
    Ok(vec![model, std::fs::read(&path)?])
}

fn safetensors(dir: &Path, bytes: &[u8]) -> Trace {
    let mut trace = Trace::default();
    let Some(path) = trace.step("write", write(dir, "model.safetensors", bytes)) else {
        return trace;
    };
    if let Some(mut files) = trace.step("open", SafetensorsFiles::open(&[path], &Device::Cpu)) {
        let mut names: Vec<String> = files.names().map(String::from).collect();
        names.sort();
        for name in names.iter().take(64) {
            let _ = files.dims(name);
            if let Some(tensor) = trace.step("tensor", files.tensor(name, &Device::Cpu)) {
                trace.step("f32", tensor.into_f32(&Device::Cpu));
            }
        }
    }
    transcriber(&mut trace, dir);
    trace
}

// --- Tokenizers --------------------------------------------------------------------------

/// The Whisper `tokenizer.json` of a models folder, cut down to its first `keep` vocabulary
/// entries, the merges among them and its added tokens: a real file's structure, small enough
/// to fuzz quickly.
fn shrunk_real_whisper_tokenizer(keep: u64) -> Option<Vec<u8>> {
    let models = std::env::var_os("SPECVOICE_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/specvoice/models"))
        })?;
    let path = std::fs::read_dir(models)
        .ok()?
        .flatten()
        .map(|entry| entry.path().join("tokenizer.json"))
        .filter(|path| path.to_string_lossy().contains("whisper"))
        .find(|path| path.is_file())?;
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let model = json.get_mut("model")?.as_object_mut()?;
    let vocab = model.get_mut("vocab")?.as_object_mut()?;
    vocab.retain(|_, id| id.as_u64().is_some_and(|id| id < keep));
    let kept: std::collections::HashSet<String> = vocab.keys().cloned().collect();
    let merges = model.get_mut("merges")?.as_array_mut()?;
    merges.retain(|merge| {
        let pair: Option<(&str, &str)> = match merge {
            serde_json::Value::String(text) => text.split_once(' '),
            serde_json::Value::Array(pair) => pair
                .first()
                .and_then(|a| a.as_str())
                .zip(pair.get(1).and_then(|b| b.as_str())),
            _ => None,
        };
        pair.is_some_and(|(a, b)| {
            kept.contains(a) && kept.contains(b) && kept.contains(&format!("{a}{b}"))
        })
    });
    serde_json::to_vec(&json).ok()
}

fn tokenizer_json_seeds(_: &Path) -> Result<Vec<Vec<u8>>> {
    let whisper = serde_json::to_vec(&engine_asr::testing::tokenizer_json())?;
    let text = engine_llm::testing::tiny_tokenizer()?
        .hf_tokenizer()
        .to_string(false)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut seeds = vec![whisper, text.into_bytes()];
    seeds.extend(shrunk_real_whisper_tokenizer(1_000));
    Ok(seeds)
}

fn tokenizer_json(dir: &Path, bytes: &[u8]) -> Trace {
    let mut trace = Trace::default();
    let Some(path) = trace.step("write", write(dir, "tokenizer.json", bytes)) else {
        return trace;
    };
    if let Some(tokenizer) = trace.step("text", TextTokenizer::from_file(&path)) {
        encode_and_decode(&mut trace, &tokenizer);
    }
    if let Some(tokenizer) = trace.step("whisper", WhisperTokenizer::from_file(&path)) {
        let ids_end = tokenizer.ids_end();
        trace.step("fits", tokenizer.check_fits_vocabulary(ids_end));
        trace.step(
            "fits-tiny",
            tokenizer.check_fits_vocabulary(engine_asr::testing::VOCAB),
        );
        trace.step("fits-none", tokenizer.check_fits_vocabulary(0));
        trace.step(
            "configured",
            tokenizer.check_configured_tokens(&path, &engine_asr::testing::hf_config()),
        );
        if let Some(ids) = trace.step("encode", tokenizer.encode(SAMPLE_TEXT)) {
            trace.step("decode", tokenizer.decode(&ids));
        }
        let _ = tokenizer.same_vocabulary(&tokenizer);
        let _ = tokenizer.token_text(tokenizer.timestamp_begin);
        let _ = tokenizer.is_timestamp(tokenizer.timestamp_begin);
    }
    trace
}

/// Separates the files of a `vocab-merges` input.
const FILE_SEPARATOR: &[u8] = b"\0--\0";

fn vocab_merges_seeds(_: &Path) -> Result<Vec<Vec<u8>>> {
    let (tokens, merges) = tiny_bpe();
    let end_of_text = tokens.len() - 1;
    let vocab: serde_json::Map<String, serde_json::Value> = tokens[..end_of_text]
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id.into()))
        .collect();
    let merges = format!("#version: 0.2\n{}\n", merges.join("\n"));
    let config = serde_json::json!({"added_tokens_decoder": {
        end_of_text.to_string(): {"content": "<|endoftext|>", "special": true},
        (end_of_text + 1).to_string(): {"content": "<tool>", "special": false},
    }});
    let mut with_config = serde_json::to_vec(&vocab)?;
    with_config.extend_from_slice(FILE_SEPARATOR);
    with_config.extend_from_slice(merges.as_bytes());
    let without_config = with_config.clone();
    with_config.extend_from_slice(FILE_SEPARATOR);
    with_config.extend_from_slice(&serde_json::to_vec(&config)?);
    Ok(vec![with_config, without_config])
}

fn vocab_merges(dir: &Path, bytes: &[u8]) -> Trace {
    let mut trace = Trace::default();
    let mut parts = split(bytes, FILE_SEPARATOR).into_iter();
    let vocab = parts.next().unwrap_or_default();
    let merges = parts.next().unwrap_or_default();
    let config = parts.next();
    let written = (|| -> std::io::Result<_> {
        Ok((
            write(dir, "vocab.json", vocab)?,
            write(dir, "merges.txt", merges)?,
            config
                .map(|c| write(dir, "tokenizer_config.json", c))
                .transpose()?,
        ))
    })();
    let Some((vocab, merges, config)) = trace.step("write", written) else {
        return trace;
    };
    let pre = ["qwen2", "llama-bpe", "smollm", "gpt2"][bytes.len() % 4];
    let tokenizer = TextTokenizer::from_vocab_and_merges(&vocab, &merges, config.as_deref(), pre);
    if let Some(tokenizer) = trace.step("load", tokenizer) {
        encode_and_decode(&mut trace, &tokenizer);
    }
    trace
}

/// `bytes` cut at every `separator`.
fn split<'a>(bytes: &'a [u8], separator: &[u8]) -> Vec<&'a [u8]> {
    let mut parts = Vec::new();
    let mut rest = bytes;
    while let Some(at) = rest
        .windows(separator.len())
        .position(|window| window == separator)
    {
        parts.push(&rest[..at]);
        rest = &rest[at + separator.len()..];
    }
    parts.push(rest);
    parts
}

// --- Text formats ------------------------------------------------------------------------

fn registry_seeds(_: &Path) -> Result<Vec<Vec<u8>>> {
    let builtin = include_str!("../../spec-models/models.toml");
    let small = r#"
[[model]]
name = "tiny"
kind = "whisper"
format = "ctranslate2"
description = "a model"
repo = "owner/name"
revision = "0123abc"
files = [
    { remote = "model.bin", size = 10, sha256 = "0000000000000000000000000000000000000000000000000000000000000000" },
    { url = "https://example.com/x/config.json", local = "sub/config.json" },
]

[[model]]
name = "by-hand"
kind = "runtime"
format = "shared-library"
description = "a library"
repo = "owner/other"
revision = "main"
gated = true
manual = "unpack the archive"
files = [{ remote = "lib/x.so", size = 1 }]
"#;
    Ok(vec![builtin.as_bytes().to_vec(), small.as_bytes().to_vec()])
}

fn registry(_: &Path, bytes: &[u8]) -> Trace {
    let mut trace = Trace::default();
    let text = String::from_utf8_lossy(bytes);
    if let Some(registry) = trace.step("parse", spec_models::Registry::parse(&text)) {
        for model in registry.models() {
            let _ = model.size();
            let _ = model.manual_instructions(Path::new("/models"));
            for file in &model.files {
                let _ = model.url("https://huggingface.co/", file);
                let _ = (file.local(), file.on_hub());
            }
            let _ = registry.get(&model.name);
        }
    }
    trace
}

fn partials_seeds(_: &Path) -> Result<Vec<Vec<u8>>> {
    let partials = "# a comment\n0.0\thello\n0.4\thello there\n1.25\thello there, how are you\n\n\
                    0\tsecond turn\n3e0\tsecond turn ends\n";
    let conversations = "What is the time?\nAnd the date?\n\nTell me a joke.\n";
    Ok(vec![partials.into(), conversations.into()])
}

fn partials(dir: &Path, bytes: &[u8]) -> Trace {
    let mut trace = Trace::default();
    let text = String::from_utf8_lossy(bytes);
    trace.step("parse", spec_voice::parse_partials(&text));
    if let Some(path) = trace.step("write", write(dir, "partials.tsv", bytes)) {
        trace.step("read", spec_voice::partial::read_partials(&path));
    }
    let conversations = spec_voice::parse_conversations(&text);
    trace.step::<_, std::convert::Infallible>("conversations", Ok(conversations));
    trace
}

fn protocol_seeds(_: &Path) -> Result<Vec<Vec<u8>>> {
    let messages = [
        r#"{"type":"start","mode":"chat"}"#,
        r#"{"type":"start","mode":"chat","voice":"kokoro:af_heart"}"#,
        r#"{"type":"start","mode":"caption","to":"German"}"#,
        r#"{"type":"stop"}"#,
        r#"{"type":"ready","mode":"caption","to":"French","sample_rate":16000,"max_frame_samples":4096}"#,
        r#"{"type":"partial","at_ms":120,"text":"hello"}"#,
        r#"{"type":"caption","at_ms":5,"source":"a","display":"b","output":"c","final":true}"#,
        r#"{"type":"error","code":"bad_json","message":"no"}"#,
        r#"{"type":"end_of_turn","at_ms":1,"probability":0.5,"wait_ms":300}"#,
    ];
    Ok(messages.iter().map(|m| m.as_bytes().to_vec()).collect())
}

fn protocol(_: &Path, bytes: &[u8]) -> Trace {
    use specvoice::serve::protocol::{decode_frame, parse_client, ServerMessage};
    let mut trace = Trace::default();
    let text = String::from_utf8_lossy(bytes);
    if let Some(message) = trace.step("client", parse_client(&text)) {
        let again = serde_json::to_string(&message)
            .map_err(|e| e.to_string())
            .and_then(|json| parse_client(&json).map_err(|e| e.to_string()));
        assert_eq!(
            again.as_ref(),
            Ok(&message),
            "an accepted client message must read back as itself"
        );
    }
    trace.step("frame", decode_frame(bytes, 4096));
    trace.step("server", serde_json::from_slice::<ServerMessage>(bytes));
    trace
}

/// The multipart boundary of the fuzzed transcription forms.
const BOUNDARY: &str = "specvoice-fuzz";

/// The endpoint an `openai` input's first byte picks: method, path and content type.
const OPENAI_ENDPOINTS: [(&str, &str, &str); 4] = [
    ("POST", "/v1/chat/completions", "application/json"),
    ("POST", "/v1/audio/speech", "application/json"),
    (
        "POST",
        "/v1/audio/transcriptions",
        "multipart/form-data; boundary=specvoice-fuzz",
    ),
    ("GET", "/v1/models", "text/plain"),
];

/// A voice that makes a millisecond of silence for any sentence: the speech endpoint runs to
/// its end without the input's length deciding the audio's.
#[derive(Clone)]
struct Murmur;

impl spec_voice::SentenceSynthesizer for Murmur {
    fn synthesize(&mut self, sentence: &str) -> spec_voice::Result<spec_voice::Synthesis> {
        Ok(spec_voice::Synthesis {
            sentence: spec_voice::sentence_to_speak(sentence)?.to_string(),
            chunks: vec![spec_voice::AudioChunk {
                samples: vec![0.0; 24],
                sample_rate: 24_000,
            }],
            first_audio_after: std::time::Duration::ZERO,
            compute: std::time::Duration::ZERO,
        })
    }
}

thread_local! {
    /// The runtime and router the `openai` target's requests go through, made by its
    /// `prepare` (before the memory of a case is counted).
    static OPENAI: std::cell::OnceCell<(tokio::runtime::Runtime, axum::Router)> =
        const { std::cell::OnceCell::new() };
}

fn openai_router(_: &Path) -> Result<()> {
    use specvoice::serve::{copies_of, router_without_engines, ServeConfig};
    let config = ServeConfig {
        // One client sends every case: its budgets must not be what answers.
        requests_per_minute: u32::MAX,
        sessions_per_client: usize::MAX,
        ..ServeConfig::default()
    };
    let router = router_without_engines(config, copies_of(Murmur))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    OPENAI.with(|cell| {
        cell.get_or_init(move || (runtime, router));
    });
    Ok(())
}

fn openai_seeds(_: &Path) -> Result<Vec<Vec<u8>>> {
    let chat = br#"{"model":"specvoice-chat","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi?"}]}],"max_tokens":8,"temperature":0,"stop":["."],"stream":true,"stream_options":{"include_usage":true}}"#;
    let speech = br#"{"model":"tts-1","input":"Hello there.","voice":"alloy","response_format":"pcm","speed":1.5}"#;
    let mut wav = Vec::new();
    {
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 16_000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut writer = hound::WavWriter::new(Cursor::new(&mut wav), spec)?;
        for i in 0..160 {
            writer.write_sample((i * 97 % 2000) as i16)?;
        }
        writer.finalize()?;
    }
    let field = |name: &str, value: &str| {
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
        )
    };
    let mut form = field("model", "whisper-1").into_bytes();
    form.extend(field("response_format", "verbose_json").into_bytes());
    form.extend(field("language", "en").into_bytes());
    form.extend(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; \
             filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
        )
        .into_bytes(),
    );
    form.extend(wav);
    form.extend(format!("\r\n--{BOUNDARY}--\r\n").into_bytes());
    Ok([&chat[..], speech, &form, b""]
        .iter()
        .enumerate()
        .map(|(endpoint, body)| [&[endpoint as u8][..], body].concat())
        .collect())
}

fn openai(_: &Path, bytes: &[u8]) -> Trace {
    use axum::extract::ConnectInfo;
    use axum::http::{header, Request, StatusCode};
    use tower_service::Service;
    let mut trace = Trace::default();
    let Some((&pick, body)) = bytes.split_first() else {
        trace.step("endpoint", Err::<(), _>("empty input"));
        return trace;
    };
    let (method, path, content_type) = OPENAI_ENDPOINTS[usize::from(pick) % OPENAI_ENDPOINTS.len()];
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, content_type)
        .extension(ConnectInfo(std::net::SocketAddr::from(([127, 0, 0, 1], 9))))
        .body(axum::body::Body::from(body.to_vec()));
    let Some(request) = trace.step("request", request) else {
        return trace;
    };
    OPENAI.with(|cell| {
        let (runtime, router) = cell.get().expect("the openai target is prepared");
        let mut router = router.clone();
        let (status, body) = runtime.block_on(async move {
            let response = match router.call(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            let status = response.status();
            // The whole response: a streamed one runs its handler to the end.
            let body = axum::body::to_bytes(response.into_body(), 64 << 20).await;
            (status, body)
        });
        assert_ne!(
            status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "a request must not fail the server: {body:?}"
        );
        let Some(body) = trace.step("body", body) else {
            return;
        };
        // The error's message tells the ways a request is refused apart (its numbers aside).
        let answered: Result<(), String> = match status.is_success() {
            true => Ok(()),
            false => Err(serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|error| error["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned())
                .chars()
                .take(160)
                .collect()),
        };
        trace.step(path, answered);
    });
    trace
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed is a valid input: its parse gets past the first step.
    #[test]
    fn seeds_parse() {
        for target in all() {
            let dir = std::env::temp_dir().join(format!(
                "spec-fuzz-seeds-{}-{}",
                target.name,
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            (target.prepare)(&dir).unwrap();
            let seeds = (target.seeds)(&dir).unwrap();
            assert!(!seeds.is_empty(), "{}", target.name);
            for seed in seeds {
                let trace = (target.parse)(&dir, &seed);
                assert!(
                    trace.got_past_writing(),
                    "{}: {}",
                    target.name,
                    trace.summary()
                );
                assert!(
                    seed.len() <= target.max_len,
                    "{}: seed of {}",
                    target.name,
                    seed.len()
                );
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn files_are_split_at_the_separator() {
        assert_eq!(
            split(b"a\0--\0bc\0--\0", FILE_SEPARATOR),
            [&b"a"[..], b"bc", b""]
        );
        assert_eq!(split(b"abc", FILE_SEPARATOR), [&b"abc"[..]]);
    }
}
