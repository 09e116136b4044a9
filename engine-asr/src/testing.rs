//! Tiny random-weight Whisper models for tests and examples: the same weights written in both
//! supported layouts (Hugging Face safetensors and CTranslate2 `model.bin`), with a small
//! byte-level tokenizer carrying Whisper's special tokens. The model has a 2-second window
//! (100 encoder positions) and about 220,000 parameters; its transcripts are noise, but every
//! decoding path runs on it exactly as on real weights.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde_json::json;
use spec_nn::ctranslate2::{write_model_bin, Ct2Variable};

use crate::whisper::load::CT2_DIRECT_TENSORS;
use crate::whisper::{LogitRules, WhisperTokenizer};
use crate::{Error, LogMel, Result};

/// Greedy decoding without the temperature fallback or its thresholds: what the speculative
/// methods and streaming partials compute.
pub fn greedy_options() -> crate::TranscribeOptions {
    crate::TranscribeOptions {
        temperatures: vec![0.0],
        compression_ratio_threshold: None,
        log_prob_threshold: None,
        no_speech_threshold: None,
        ..crate::TranscribeOptions::default()
    }
}

/// A deterministic test recording of `seconds` at 16 kHz: a tone at `pitch` Hz and one at
/// 1375 Hz under a slow amplitude envelope.
pub fn tones(seconds: f32, pitch: f32) -> Vec<f32> {
    let n = (seconds * 16_000.0) as usize;
    (0..n)
        .map(|i| {
            let t = i as f32 / 16_000.0;
            let envelope = 0.5 + 0.5 * (2.0 * std::f32::consts::PI * 1.3 * t).sin();
            envelope
                * (0.3 * (2.0 * std::f32::consts::PI * pitch * t).sin()
                    + 0.2 * (2.0 * std::f32::consts::PI * 1375.0 * t).sin())
        })
        .collect()
}

/// The WAV files in `dir`, sorted (none when it cannot be read): the real clips' folder for
/// tests that skip without it.
pub fn wav_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut wavs: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    wavs.retain(|p| p.extension().is_some_and(|e| e == "wav"));
    wavs.sort();
    wavs
}

/// Deterministic white noise of `rms`, `len` samples (uniform on ±√3·rms, which has that
/// RMS), from `seed`.
pub fn white_noise(len: usize, rms: f32, seed: u32) -> Vec<f32> {
    let mut state = seed | 1;
    let half_width = rms * 3f32.sqrt();
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32 * 2.0 - 1.0) * half_width
        })
        .collect()
}

/// Width of the model (`d_model`).
pub const HIDDEN: usize = 64;
/// Attention heads of the encoder and the decoder.
pub const HEADS: usize = 4;
/// Width of the feed-forward layers.
pub const FFN: usize = 128;
/// Mel bins of the input.
pub const MELS: usize = 80;
/// Encoder positions: a window of twice as many mel frames (2 seconds).
pub const SOURCE_POSITIONS: usize = 100;
/// Decoder positions.
pub const TARGET_POSITIONS: usize = 160;
/// Ordinary tokens of the tiny vocabulary.
pub const TEXT_TOKENS: u32 = 40;
/// The specials in Whisper's order after the text tokens (English-only layout).
pub const SPECIALS: [&str; 8] = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
];
/// Timestamp tokens after the specials.
pub const TIMESTAMPS: u32 = 30;
/// The whole vocabulary: text, specials and timestamps.
pub const VOCAB: usize = (TEXT_TOKENS + SPECIALS.len() as u32 + TIMESTAMPS) as usize;
/// `<|endoftext|>`.
pub const END_OF_TEXT: u32 = TEXT_TOKENS;
/// `<|startoftranscript|>`.
pub const START_OF_TRANSCRIPT: u32 = TEXT_TOKENS + 1;
/// `<|notimestamps|>`.
pub const NO_TIMESTAMPS: u32 = TEXT_TOKENS + 7;

/// Layer counts of the tiny model.
pub const ENCODER_LAYERS: usize = 2;
pub const DECODER_LAYERS: usize = 2;

/// The tiny model's two stacks by name, each with its layer count.
const STACKS: [(&str, usize); 2] = [("encoder", ENCODER_LAYERS), ("decoder", DECODER_LAYERS)];

fn random(shape: &[usize], scale: f32, seed: &mut u64) -> Result<Tensor> {
    // A small deterministic generator, so both layouts get the same values.
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        })
        .collect();
    Ok(Tensor::from_vec(values, shape, &Device::Cpu)?)
}

/// The weights under Hugging Face names; the same `seed` gives the same values.
pub fn hf_weights(seed: u64) -> Result<HashMap<String, Tensor>> {
    let mut s = seed.wrapping_add(17);
    let mut w = HashMap::new();
    let scale = 1.0 / (HIDDEN as f32).sqrt();
    let mut put = |name: String, shape: &[usize], scale: f32, s: &mut u64| -> Result<()> {
        w.insert(name, random(shape, scale, s)?);
        Ok(())
    };
    put(
        "model.encoder.conv1.weight".into(),
        &[HIDDEN, MELS, 3],
        0.05,
        &mut s,
    )?;
    put("model.encoder.conv1.bias".into(), &[HIDDEN], 0.1, &mut s)?;
    put(
        "model.encoder.conv2.weight".into(),
        &[HIDDEN, HIDDEN, 3],
        0.05,
        &mut s,
    )?;
    put("model.encoder.conv2.bias".into(), &[HIDDEN], 0.1, &mut s)?;
    put(
        "model.encoder.embed_positions.weight".into(),
        &[SOURCE_POSITIONS, HIDDEN],
        0.5,
        &mut s,
    )?;
    put(
        "model.decoder.embed_tokens.weight".into(),
        &[VOCAB, HIDDEN],
        1.0,
        &mut s,
    )?;
    put(
        "model.decoder.embed_positions.weight".into(),
        &[TARGET_POSITIONS, HIDDEN],
        0.5,
        &mut s,
    )?;
    for (stack, layers) in STACKS {
        for i in 0..layers {
            let base = format!("model.{stack}.layers.{i}");
            let blocks: &[&str] = if stack == "encoder" {
                &["self_attn"]
            } else {
                &["self_attn", "encoder_attn"]
            };
            for block in blocks {
                for p in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                    put(
                        format!("{base}.{block}.{p}.weight"),
                        &[HIDDEN, HIDDEN],
                        scale,
                        &mut s,
                    )?;
                    if p != "k_proj" {
                        put(format!("{base}.{block}.{p}.bias"), &[HIDDEN], 0.1, &mut s)?;
                    }
                }
                put(
                    format!("{base}.{block}_layer_norm.weight"),
                    &[HIDDEN],
                    0.2,
                    &mut s,
                )?;
                put(
                    format!("{base}.{block}_layer_norm.bias"),
                    &[HIDDEN],
                    0.1,
                    &mut s,
                )?;
            }
            put(format!("{base}.fc1.weight"), &[FFN, HIDDEN], scale, &mut s)?;
            put(format!("{base}.fc1.bias"), &[FFN], 0.1, &mut s)?;
            put(
                format!("{base}.fc2.weight"),
                &[HIDDEN, FFN],
                1.0 / (FFN as f32).sqrt(),
                &mut s,
            )?;
            put(format!("{base}.fc2.bias"), &[HIDDEN], 0.1, &mut s)?;
            put(
                format!("{base}.final_layer_norm.weight"),
                &[HIDDEN],
                0.2,
                &mut s,
            )?;
            put(
                format!("{base}.final_layer_norm.bias"),
                &[HIDDEN],
                0.1,
                &mut s,
            )?;
        }
        put(
            format!("model.{stack}.layer_norm.weight"),
            &[HIDDEN],
            0.2,
            &mut s,
        )?;
        put(
            format!("model.{stack}.layer_norm.bias"),
            &[HIDDEN],
            0.1,
            &mut s,
        )?;
    }
    // LayerNorm gains near 1.
    for (name, t) in w.iter_mut() {
        if name.contains("layer_norm.weight") {
            *t = (t.clone() + 1.0)?;
        }
    }
    Ok(w)
}

/// The Hugging Face `config.json` of the tiny model.
pub fn hf_config() -> serde_json::Value {
    json!({
        "num_mel_bins": MELS,
        "vocab_size": VOCAB,
        "d_model": HIDDEN,
        "encoder_layers": ENCODER_LAYERS,
        "encoder_attention_heads": HEADS,
        "encoder_ffn_dim": FFN,
        "decoder_layers": DECODER_LAYERS,
        "decoder_attention_heads": HEADS,
        "decoder_ffn_dim": FFN,
        "max_source_positions": SOURCE_POSITIONS,
        "max_target_positions": TARGET_POSITIONS,
    })
}

/// The tokenizer of the tiny model written to `dir` ([`write_hf`], [`write_ct2`]) and the logit
/// rules the decoding tests apply with it, with or without timestamps: ids 3 and 4 suppressed,
/// 26 and the end of text blocked at the first step, the first timestamp at most 0.1 s.
pub fn logit_rules(dir: &Path, timestamps: bool) -> Result<(WhisperTokenizer, LogitRules)> {
    let tokenizer = WhisperTokenizer::from_file(&dir.join("tokenizer.json"))?;
    let rules = LogitRules::new(
        &tokenizer,
        &[3, 4],
        &[26, END_OF_TEXT],
        timestamps,
        Some(0.1),
    );
    Ok((tokenizer, rules))
}

/// A byte-level BPE tokenizer: letters and space as text tokens, then Whisper's specials.
pub fn tokenizer_json() -> serde_json::Value {
    let mut vocab = serde_json::Map::new();
    let letters: Vec<String> = ('a'..='z')
        .map(String::from)
        .chain(["Ġ".to_string(), ".".to_string(), ",".to_string()])
        .chain((0..(TEXT_TOKENS as usize - 29)).map(|i| format!("Ġ{}", (b'a' + i as u8) as char)))
        .collect();
    for (i, l) in letters.iter().enumerate() {
        vocab.insert(l.clone(), json!(i));
    }
    let added: Vec<serde_json::Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": TEXT_TOKENS as usize + i, "content": s, "single_word": false,
                   "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": []}
    })
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    std::fs::write(path, format!("{value:#}")).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A Hugging Face folder: `model.safetensors`, `config.json`, `generation_config.json`,
/// `tokenizer.json`.
pub fn write_hf(dir: &Path, seed: u64) -> Result<()> {
    let weights = hf_weights(seed)?;
    candle_core::safetensors::save(&weights, dir.join("model.safetensors"))?;
    write_json(&dir.join("config.json"), &hf_config())?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"suppress_tokens": [3, 4], "begin_suppress_tokens": [26, END_OF_TEXT]}),
    )?;
    write_json(&dir.join("tokenizer.json"), &tokenizer_json())
}

/// The same weights as a CTranslate2 folder (`model.bin` with fused projections,
/// `config.json` with the suppression lists, `tokenizer.json`), stored as `dtype`.
pub fn write_ct2(dir: &Path, seed: u64, dtype: DType) -> Result<()> {
    let hf = hf_weights(seed)?;
    let get = |name: &str| hf[name].to_dtype(dtype);
    let zeros = Tensor::zeros(HIDDEN, dtype, &Device::Cpu)?;
    let mut vars: Vec<(String, Ct2Variable)> = Vec::new();
    let mut put = |name: String, t: candle_core::Result<Tensor>| -> Result<()> {
        vars.push((name, Ct2Variable::Tensor(t?)));
        Ok(())
    };
    for (ct2, hf_name) in CT2_DIRECT_TENSORS.into_iter().chain([
        (
            "encoder/layer_norm/gamma",
            "model.encoder.layer_norm.weight",
        ),
        ("encoder/layer_norm/beta", "model.encoder.layer_norm.bias"),
        (
            "decoder/layer_norm/gamma",
            "model.decoder.layer_norm.weight",
        ),
        ("decoder/layer_norm/beta", "model.decoder.layer_norm.bias"),
    ]) {
        put(ct2.into(), get(hf_name))?;
    }
    let cat = |names: &[&str]| {
        let parts = names
            .iter()
            .map(|n| get(n))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Tensor::cat(&parts, 0)
    };
    for (stack, layers) in STACKS {
        for i in 0..layers {
            let h = format!("model.{stack}.layers.{i}");
            let c = format!("{stack}/layer_{i}");
            let sa = format!("{h}.self_attn");
            put(
                format!("{c}/self_attention/linear_0/weight"),
                cat(&[
                    &format!("{sa}.q_proj.weight"),
                    &format!("{sa}.k_proj.weight"),
                    &format!("{sa}.v_proj.weight"),
                ]),
            )?;
            put(
                format!("{c}/self_attention/linear_0/bias"),
                Tensor::cat(
                    &[
                        get(&format!("{sa}.q_proj.bias"))?,
                        zeros.clone(),
                        get(&format!("{sa}.v_proj.bias"))?,
                    ],
                    0,
                ),
            )?;
            put(
                format!("{c}/self_attention/linear_1/weight"),
                get(&format!("{sa}.out_proj.weight")),
            )?;
            put(
                format!("{c}/self_attention/linear_1/bias"),
                get(&format!("{sa}.out_proj.bias")),
            )?;
            put(
                format!("{c}/self_attention/layer_norm/gamma"),
                get(&format!("{h}.self_attn_layer_norm.weight")),
            )?;
            put(
                format!("{c}/self_attention/layer_norm/beta"),
                get(&format!("{h}.self_attn_layer_norm.bias")),
            )?;
            if stack == "decoder" {
                let ca = format!("{h}.encoder_attn");
                put(
                    format!("{c}/attention/linear_0/weight"),
                    get(&format!("{ca}.q_proj.weight")),
                )?;
                put(
                    format!("{c}/attention/linear_0/bias"),
                    get(&format!("{ca}.q_proj.bias")),
                )?;
                put(
                    format!("{c}/attention/linear_1/weight"),
                    cat(&[
                        &format!("{ca}.k_proj.weight"),
                        &format!("{ca}.v_proj.weight"),
                    ]),
                )?;
                put(
                    format!("{c}/attention/linear_1/bias"),
                    Tensor::cat(&[zeros.clone(), get(&format!("{ca}.v_proj.bias"))?], 0),
                )?;
                put(
                    format!("{c}/attention/linear_2/weight"),
                    get(&format!("{ca}.out_proj.weight")),
                )?;
                put(
                    format!("{c}/attention/linear_2/bias"),
                    get(&format!("{ca}.out_proj.bias")),
                )?;
                put(
                    format!("{c}/attention/layer_norm/gamma"),
                    get(&format!("{h}.encoder_attn_layer_norm.weight")),
                )?;
                put(
                    format!("{c}/attention/layer_norm/beta"),
                    get(&format!("{h}.encoder_attn_layer_norm.bias")),
                )?;
            }
            put(
                format!("{c}/ffn/linear_0/weight"),
                get(&format!("{h}.fc1.weight")),
            )?;
            put(
                format!("{c}/ffn/linear_0/bias"),
                get(&format!("{h}.fc1.bias")),
            )?;
            put(
                format!("{c}/ffn/linear_1/weight"),
                get(&format!("{h}.fc2.weight")),
            )?;
            put(
                format!("{c}/ffn/linear_1/bias"),
                get(&format!("{h}.fc2.bias")),
            )?;
            put(
                format!("{c}/ffn/layer_norm/gamma"),
                get(&format!("{h}.final_layer_norm.weight")),
            )?;
            put(
                format!("{c}/ffn/layer_norm/beta"),
                get(&format!("{h}.final_layer_norm.bias")),
            )?;
        }
    }
    vars.push(("encoder/num_heads".into(), Ct2Variable::I16(HEADS as i16)));
    vars.push(("decoder/num_heads".into(), Ct2Variable::I16(HEADS as i16)));
    vars.push(("decoder/pre_norm".into(), Ct2Variable::I8(1)));
    write_model_bin(
        &dir.join("model.bin"),
        "WhisperSpec",
        &vars,
        &[(
            "decoder/projection/weight".into(),
            "decoder/embeddings/weight".into(),
        )],
    )?;
    write_json(
        &dir.join("config.json"),
        &json!({"suppress_ids": [3, 4], "suppress_ids_begin": [26, END_OF_TEXT]}),
    )?;
    write_json(&dir.join("tokenizer.json"), &tokenizer_json())
}

/// A deterministic log-mel window of `frames` frames in Whisper's value range.
pub fn mel(frames: usize, seed: u64) -> Result<LogMel> {
    let mut s = seed;
    let data = random(&[MELS * frames], 1.0, &mut s)?.to_vec1::<f32>()?;
    Ok(LogMel {
        n_mels: MELS,
        frames,
        data,
    })
}

/// A long recording of clips joined by silences, made as it is read: a
/// [`SampleSource`](crate::SampleSource) holding only the clips, for long-form tests and
/// benchmarks of any length.
#[derive(Clone, Debug)]
pub struct JoinedSpeech {
    clips: Vec<Vec<f32>>,
    /// Clip index (or `None`: silence) and length of each piece, in order.
    pieces: Vec<(Option<usize>, usize)>,
    piece: usize,
    offset: usize,
}

impl JoinedSpeech {
    /// The 16 kHz `clips` in turn, each followed by the next of `gap_seconds` of silence (in
    /// turn), until the recording lasts at least `seconds` (whole clips).
    pub fn new(clips: Vec<Vec<f32>>, gap_seconds: &[f32], seconds: f64) -> Result<Self> {
        if clips.iter().all(Vec::is_empty) || gap_seconds.is_empty() {
            return Err(Error::Audio(
                "a joined recording needs a clip with samples and a gap".into(),
            ));
        }
        let mut pieces = Vec::new();
        let mut length = 0;
        let mut turn = 0;
        while (length as f64) < seconds * 16_000.0 {
            let clip = turn % clips.len();
            let gap = (gap_seconds[turn % gap_seconds.len()].max(0.0) * 16_000.0) as usize;
            pieces.push((Some(clip), clips[clip].len()));
            pieces.push((None, gap));
            length += clips[clip].len() + gap;
            turn += 1;
        }
        Ok(Self {
            clips,
            pieces,
            piece: 0,
            offset: 0,
        })
    }

    /// Samples in the recording.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(|(_, n)| n).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The clips in the order they are heard.
    pub fn order(&self) -> Vec<usize> {
        self.pieces.iter().filter_map(|(clip, _)| *clip).collect()
    }

    /// The whole recording in memory.
    pub fn samples(&self) -> Vec<f32> {
        self.pieces
            .iter()
            .flat_map(|&(clip, n)| match clip {
                Some(c) => self.clips[c].clone(),
                None => vec![0.0; n],
            })
            .collect()
    }
}

impl crate::SampleSource for JoinedSpeech {
    fn read(&mut self, out: &mut Vec<f32>, max: usize) -> Result<usize> {
        let mut given = 0;
        while given < max {
            let Some(&(clip, n)) = self.pieces.get(self.piece) else {
                break;
            };
            let take = (n - self.offset).min(max - given);
            match clip {
                Some(c) => out.extend_from_slice(&self.clips[c][self.offset..self.offset + take]),
                None => out.resize(out.len() + take, 0.0),
            }
            given += take;
            self.offset += take;
            if self.offset == n {
                (self.piece, self.offset) = (self.piece + 1, 0);
            }
        }
        Ok(given)
    }

    fn rewind(&mut self) -> Result<()> {
        (self.piece, self.offset) = (0, 0);
        Ok(())
    }
}
