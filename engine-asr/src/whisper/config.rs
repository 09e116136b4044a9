//! Whisper's hyper-parameters, read from a Hugging Face `config.json` or inferred from the
//! tensors of a CTranslate2 `model.bin` (whose `config.json` holds decoding settings only).

use std::path::Path;

use serde::Deserialize;
use spec_nn::{Ct2File, WeightSource};

use crate::{Error, Result};

/// The sizes of a Whisper model (tiny … large-v3, English-only or multilingual).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct WhisperConfig {
    /// Mel bins of the input (80, or 128 for large-v3).
    #[serde(rename = "num_mel_bins")]
    pub n_mels: usize,
    /// 51864 (English-only), 51865 (multilingual), 51866 (large-v3).
    pub vocab_size: usize,
    /// Width of every layer of the encoder and the decoder.
    #[serde(rename = "d_model")]
    pub hidden_size: usize,
    pub encoder_layers: usize,
    pub encoder_attention_heads: usize,
    pub encoder_ffn_dim: usize,
    pub decoder_layers: usize,
    pub decoder_attention_heads: usize,
    pub decoder_ffn_dim: usize,
    /// Encoder positions: 1500, i.e. 30 s of audio after the stride-2 convolution.
    pub max_source_positions: usize,
    /// Decoder positions: 448 tokens.
    pub max_target_positions: usize,
}

impl WhisperConfig {
    /// From a Hugging Face `config.json`.
    pub fn from_hf_json(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let config: Self = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        config.validate()?;
        Ok(config)
    }

    /// From the shapes and scalars stored in a CTranslate2 `WhisperSpec` model.
    pub fn from_ct2(file: &mut Ct2File) -> Result<Self> {
        if file.spec() != "WhisperSpec" {
            return Err(Error::Config(format!(
                "{} holds a CTranslate2 `{}`, not a Whisper model",
                file.path().display(),
                file.spec()
            )));
        }
        let dims = |file: &Ct2File, name: &str| {
            file.dims(name).ok_or_else(|| {
                Error::Nn(spec_nn::Error::MissingTensor {
                    path: file.path().to_path_buf(),
                    name: name.into(),
                })
            })
        };
        let dim = |d: &[usize], i: usize, name: &str| {
            d.get(i).copied().ok_or_else(|| {
                Error::Config(format!(
                    "`{name}` has shape {d:?}, expected more dimensions"
                ))
            })
        };
        let layers = |file: &Ct2File, stack: &str| {
            (0..)
                .take_while(|i| file.contains(&format!("{stack}/layer_{i}/ffn/linear_0/weight")))
                .count()
        };
        let embeddings = dims(file, "decoder/embeddings/weight")?;
        let conv = dims(file, "encoder/conv1/weight")?;
        let encoder_ffn = dims(file, "encoder/layer_0/ffn/linear_0/weight")?;
        let decoder_ffn = dims(file, "decoder/layer_0/ffn/linear_0/weight")?;
        let source = dims(file, "encoder/position_encodings/encodings")?;
        let target = dims(file, "decoder/position_encodings/encodings")?;
        let config = Self {
            n_mels: dim(&conv, 1, "encoder/conv1/weight")?,
            vocab_size: dim(&embeddings, 0, "decoder/embeddings/weight")?,
            hidden_size: dim(&embeddings, 1, "decoder/embeddings/weight")?,
            encoder_layers: layers(file, "encoder"),
            encoder_attention_heads: file.scalar("encoder/num_heads")?.max(0) as usize,
            encoder_ffn_dim: dim(&encoder_ffn, 0, "encoder ffn")?,
            decoder_layers: layers(file, "decoder"),
            decoder_attention_heads: file.scalar("decoder/num_heads")?.max(0) as usize,
            decoder_ffn_dim: dim(&decoder_ffn, 0, "decoder ffn")?,
            max_source_positions: dim(&source, 0, "encoder positions")?,
            max_target_positions: dim(&target, 0, "decoder positions")?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the sizes fit together.
    pub fn validate(&self) -> Result<()> {
        let heads_fit = |heads: usize| heads > 0 && self.hidden_size.is_multiple_of(heads);
        let problem = if !heads_fit(self.encoder_attention_heads) {
            Some(format!(
                "{} encoder heads do not divide width {}",
                self.encoder_attention_heads, self.hidden_size
            ))
        } else if !heads_fit(self.decoder_attention_heads) {
            Some(format!(
                "{} decoder heads do not divide width {}",
                self.decoder_attention_heads, self.hidden_size
            ))
        } else if self.encoder_layers == 0 || self.decoder_layers == 0 {
            Some("a Whisper model needs encoder and decoder layers".into())
        } else if self.n_mels == 0 || self.vocab_size == 0 || self.max_target_positions == 0 {
            Some("mel bins, vocabulary and decoder positions must be positive".into())
        } else if self.max_source_positions == 0 {
            Some("the encoder needs positions".into())
        } else {
            None
        };
        match problem {
            Some(p) => Err(Error::Config(p)),
            None => Ok(()),
        }
    }

    /// Whether the vocabulary is the multilingual one (language and task tokens are used).
    pub fn is_multilingual(&self) -> bool {
        self.vocab_size >= 51865
    }

    /// Mel frames of a full window (3000: two per encoder position).
    pub fn window_frames(&self) -> usize {
        2 * self.max_source_positions
    }

    /// Multiply-adds of the encoder on `mel_frames` frames (the two convolutions, then per
    /// layer the attention's projections and scores and the MLP): what compares two
    /// encoders' costs.
    pub fn encoder_cost(&self, mel_frames: usize) -> f64 {
        let (frames, width) = ((mel_frames / 2) as f64, self.hidden_size as f64);
        let stem =
            3.0 * mel_frames as f64 * self.n_mels as f64 * width + 3.0 * frames * width * width;
        let layer = frames * (4.0 * width * width + 2.0 * width * self.encoder_ffn_dim as f64)
            + 2.0 * frames * frames * width;
        stem + self.encoder_layers as f64 * layer
    }
}

/// The alignment heads a model folder names, `(decoder layer, head)` pairs: the
/// `alignment_heads` of Hugging Face's `generation_config.json` or of CTranslate2's
/// `config.json`; `None` when neither lists them.
pub fn read_alignment_heads(folder: &Path) -> Result<Option<Vec<(usize, usize)>>> {
    for name in ["generation_config.json", "config.json"] {
        let path = folder.join(name);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let bad = |e: String| Error::Config(format!("{}: {e}", path.display()));
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let Some(heads) = value.get("alignment_heads") else {
            continue;
        };
        let heads: Vec<(usize, usize)> = serde_json::from_value(heads.clone()).map_err(|e| {
            bad(format!(
                "`alignment_heads` is not a list of [layer, head]: {e}"
            ))
        })?;
        return Ok(Some(heads));
    }
    Ok(None)
}
