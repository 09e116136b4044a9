//! CosyVoice 2 end to end (the reference's `CosyVoice2Model`): text → speech tokens ([`SpeechLm`])
//! → mel frames ([`Flow`]) → 24 kHz audio ([`Hift`]), in the voice of a [`SpeakerPrompt`].
//!
//! One-shot ([`CosyVoice2::speak`]): all speech tokens, one flow call with full attention, one
//! vocoder call. Streaming ([`CosyVoice2::synthesize_stream`]): the reference's schedule —
//! [`FlowStream`] turns the tokens into mel chunks as the language model draws them (a hop of
//! new tokens plus 3 look-ahead, the first hop lengthened to align the prompt, the hop doubling
//! up to 4×, a last call with full attention), and each chunk goes through HiFT after the
//! previous chunk's last 8 mel frames, with the previous source's last 3840 samples in place of
//! the start of its own; its first 3840 samples are cross-faded (the two halves of a symmetric
//! Hamming window of 7680) with the previous chunk's held-back tail, and every chunk but the
//! last holds back its own last 3840 samples for the next. The streamed audio therefore has the
//! one-shot length, 480 samples per mel frame, 2 frames per speech token; its samples differ
//! (chunk-causal attention, vocoding in pieces, the cross-fades) unless the tokens never fill a
//! chunk, when the stream is the one-shot call.
//!
//! Choices where the reference has quirks: the hop starts afresh with each synthesis (the
//! reference keeps doubling it across utterances); the last flow call uses full attention, as
//! the reference's does. Randomness comes from one seed: it seeds three generators, one each for
//! the language model's sampling, the flow's starting noise and HiFT's sine noise, so one-shot
//! and streamed synthesis of a text draw the same speech tokens. The flow's noise is drawn for
//! the most frames the text can take (the reference instead slices a fixed seed-0 tensor,
//! [`crate::cosyvoice::flow::reference_noise`]).
//!
//! With [`CosyVoice2::with_ssd`], the speech tokens are drawn by Speech Speculative Decoding
//! (a draft of the model's own layers, [`SpeechLm::ssd_draft`]); streaming then hands the flow
//! each verified round's tokens.
//!
//! Out of scope: making a prompt from a recording (the release's ONNX speech tokenizer and
//! CAM++ speaker model, and the prompt mel); a [`SpeakerPrompt`] is read ready-made. The
//! tokenizer adds none of CosyVoice's extra special tokens (`[breath]`, `<|endofprompt|>`, …):
//! text is spoken as text.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use engine_llm::LoadOptions;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cosyvoice::flow::{Flow, FlowConfig, FlowPrompt, FlowStream};
use crate::cosyvoice::hift::{Hift, HiftConfig, SineNoise};
use crate::cosyvoice::lm::{SpeechLm, SpeechLmConfig, SsdConfig};
use crate::cosyvoice::{CosyVoiceError, Result};

/// Mel frames HiFT sees again from the previous chunk when streaming.
pub const MEL_CACHE_FRAMES: usize = 8;

/// CosyVoice 2's first streaming hop, in speech tokens.
pub const TOKEN_HOP: usize = 25;

/// The voice to speak in: a recording's transcript (text token ids), its speech tokens, its mel
/// frames and its speaker's x-vector.
///
/// In a safetensors file ([`SpeakerPrompt::load`]): `prompt_text` (integer ids `[n]`),
/// `prompt_speech_token` (integer ids `[m]`), `prompt_mel` (`[T, 80]`, f32: the reference's
/// log-mel at 24 kHz, hop 480) and `speaker_embedding` (`[192]`, f32: CAM++'s x-vector).
#[derive(Clone, Debug)]
pub struct SpeakerPrompt {
    pub text: Vec<u32>,
    pub speech_tokens: Vec<u32>,
    /// `[2 · speech tokens, mel channels]`.
    pub mel: Tensor,
    /// `[speaker dim]`.
    pub speaker: Tensor,
}

impl SpeakerPrompt {
    /// A prompt from its parts, cut as the reference's zero-shot front end cuts them: to
    /// `min(T / 2, tokens)` tokens and twice as many mel frames.
    pub fn new(
        text: Vec<u32>,
        speech_tokens: Vec<u32>,
        mel: Tensor,
        speaker: Tensor,
    ) -> Result<Self> {
        let (frames, _) = mel.dims2().map_err(|_| {
            CosyVoiceError::Input(format!(
                "prompt mel of shape {:?}; expected [T, mel channels]",
                mel.dims()
            ))
        })?;
        if speaker.dims().len() != 1 {
            return Err(CosyVoiceError::Input(format!(
                "speaker embedding of shape {:?}; expected one vector",
                speaker.dims()
            )));
        }
        let tokens = (frames / 2).min(speech_tokens.len());
        let mut speech_tokens = speech_tokens;
        speech_tokens.truncate(tokens);
        Ok(Self {
            text,
            speech_tokens,
            mel: mel.narrow(0, 0, 2 * tokens)?.to_dtype(DType::F32)?,
            speaker: speaker.to_dtype(DType::F32)?,
        })
    }

    /// Reads a prompt from a safetensors file (tensor names in the type's docs).
    pub fn load(path: &Path) -> Result<Self> {
        let file_error = |reason: String| CosyVoiceError::File {
            path: path.to_path_buf(),
            reason,
        };
        let mut tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load(path, &Device::Cpu)
                .map_err(|e| file_error(e.to_string()))?;
        let mut take = |name: &str| {
            tensors
                .remove(name)
                .ok_or_else(|| file_error(format!("no tensor `{name}`")))
        };
        let ids = |t: Tensor| -> Result<Vec<u32>> {
            Ok(t.flatten_all()?
                .to_dtype(DType::I64)?
                .to_vec1::<i64>()?
                .into_iter()
                .map(|v| v as u32)
                .collect())
        };
        let text = ids(take("prompt_text")?)?;
        let speech_tokens = ids(take("prompt_speech_token")?)?;
        let mel = take("prompt_mel")?;
        let speaker = take("speaker_embedding")?;
        Self::new(text, speech_tokens, mel, speaker)
    }
}

/// Speech tokens and the audio made of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Speech {
    pub tokens: Vec<u32>,
    /// Mono samples at 24 kHz.
    pub audio: Vec<f32>,
}

/// CosyVoice 2: the three models, the text tokenizer and the voice. See the module docs.
pub struct CosyVoice2 {
    lm: SpeechLm,
    flow: Flow,
    hift: Hift,
    tokenizer: tokenizers::Tokenizer,
    prompt: FlowPrompt,
    prompt_text: Vec<u32>,
    token_hop: usize,
    seed: u64,
    /// Speech Speculative Decoding's draft and settings, when attached.
    ssd: Option<(SpeechLm, SsdConfig)>,
}

/// The three generators one seed makes.
struct Randomness {
    lm: StdRng,
    flow: StdRng,
    hift: StdRng,
}

impl Randomness {
    fn new(seed: u64) -> Self {
        let mut root = StdRng::seed_from_u64(seed);
        Self {
            lm: StdRng::seed_from_u64(root.random()),
            flow: StdRng::seed_from_u64(root.random()),
            hift: StdRng::seed_from_u64(root.random()),
        }
    }
}

/// What HiFT keeps from one streamed chunk for the next.
struct HiftCache {
    /// The last [`MEL_CACHE_FRAMES`] mel frames `[1, 80, 8]`.
    mel: Tensor,
    /// The source's last samples `[1, 1, n]`.
    source: Tensor,
    /// The audio held back for the cross-fade.
    speech: Vec<f32>,
}

impl CosyVoice2 {
    /// The synthesizer from loaded parts; checks that they fit together (the language model's
    /// speech tokens within the flow's vocabulary, the flow's mel channels HiFT's input, the
    /// prompt's shapes the flow's). Streams with CosyVoice 2's hop of [`TOKEN_HOP`] tokens; seed 0.
    pub fn from_parts(
        lm: SpeechLm,
        flow: Flow,
        hift: Hift,
        tokenizer: tokenizers::Tokenizer,
        prompt: SpeakerPrompt,
    ) -> Result<Self> {
        let (flow_config, hift_config) = (flow.config(), hift.config());
        let mismatch = |what: String| Err(CosyVoiceError::Config(what));
        if lm.config().speech_token_size > flow_config.vocab_size {
            return mismatch(format!(
                "the language model's {} speech tokens exceed the flow's vocabulary of {}",
                lm.config().speech_token_size,
                flow_config.vocab_size
            ));
        }
        if flow_config.mel_channels != hift_config.in_channels {
            return mismatch(format!(
                "the flow makes {} mel channels, HiFT takes {}",
                flow_config.mel_channels, hift_config.in_channels
            ));
        }
        if prompt.mel.dim(1)? != flow_config.mel_channels
            || prompt.speaker.dim(0)? != flow_config.speaker_dim
        {
            return Err(CosyVoiceError::Input(format!(
                "a prompt mel of {:?} and a speaker embedding of {:?}; the flow takes [T, {}] and [{}]",
                prompt.mel.dims(),
                prompt.speaker.dims(),
                flow_config.mel_channels,
                flow_config.speaker_dim
            )));
        }
        if let Some(&bad) = prompt
            .speech_tokens
            .iter()
            .find(|&&t| t as usize >= lm.config().speech_token_size)
        {
            return Err(CosyVoiceError::Input(format!(
                "prompt speech token {bad} is not a speech token"
            )));
        }
        let flow_prompt = FlowPrompt {
            tokens: prompt.speech_tokens,
            mel: prompt.mel.unsqueeze(0)?,
            speaker: prompt.speaker.unsqueeze(0)?,
        };
        Ok(Self {
            lm,
            flow,
            hift,
            tokenizer,
            prompt: flow_prompt,
            prompt_text: prompt.text,
            token_hop: TOKEN_HOP,
            seed: 0,
            ssd: None,
        })
    }

    /// Draws the speech tokens by Speech Speculative Decoding with `draft` (e.g.
    /// [`SpeechLm::ssd_draft`] of [`CosyVoice2::lm`]) and `config` from now on. A draft with
    /// other speech tokens, or bad settings, is refused.
    pub fn with_ssd(mut self, draft: SpeechLm, config: SsdConfig) -> Result<Self> {
        config.validate()?;
        let (ours, its) = (
            self.lm.config().speech_token_size,
            draft.config().speech_token_size,
        );
        if ours != its {
            return Err(CosyVoiceError::Config(format!(
                "the SSD draft has {its} speech tokens, the language model {ours}"
            )));
        }
        self.ssd = Some((draft, config));
        Ok(self)
    }

    /// The speech-token language model (to build an SSD draft of it).
    pub fn lm(&self) -> &SpeechLm {
        &self.lm
    }

    /// Loads the release from `model_dir` (`llm.pt`, `flow.pt`, `hift.pt`,
    /// `CosyVoice-BlankEN/config.json` and the text tokenizer, [`load_tokenizer`]) with the default
    /// configurations, and the voice from the safetensors file `speaker` ([`SpeakerPrompt`]),
    /// on the CPU with the language model's backbone at [`LoadOptions::default`] (its dense
    /// matrices re-quantized to Q8_0; build the parts and use [`CosyVoice2::from_parts`] for
    /// other options). A missing file is [`CosyVoiceError::File`] naming it.
    pub fn load(model_dir: &Path, speaker: &Path) -> Result<Self> {
        let file = |relative: &str| -> Result<PathBuf> {
            let path = model_dir.join(relative);
            if path.is_file() {
                Ok(path)
            } else {
                Err(CosyVoiceError::File {
                    path,
                    reason: "missing".into(),
                })
            }
        };
        let (llm, flow, hift) = (file("llm.pt")?, file("flow.pt")?, file("hift.pt")?);
        let backbone = file("CosyVoice-BlankEN/config.json")?;
        let tokenizer = load_tokenizer(&model_dir.join("CosyVoice-BlankEN"))?;
        if !speaker.is_file() {
            return Err(CosyVoiceError::File {
                path: speaker.to_path_buf(),
                reason: "missing".into(),
            });
        }
        let options = LoadOptions::default();
        let lm = SpeechLm::load(&llm, &backbone, SpeechLmConfig::default(), &options)?;
        let flow = Flow::load(&flow, FlowConfig::default(), &options.device)?;
        let hift = Hift::load(&hift, HiftConfig::default(), &options.device)?;
        Self::from_parts(lm, flow, hift, tokenizer, SpeakerPrompt::load(speaker)?)
    }

    /// Streams with a first hop of `hop` speech tokens (at least 4: a chunk must hold HiFT's
    /// 8-frame mel cache).
    pub fn with_token_hop(mut self, hop: usize) -> Result<Self> {
        if 2 * hop < MEL_CACHE_FRAMES {
            return Err(CosyVoiceError::Config(format!(
                "a streaming hop of {hop} tokens; at least {} are needed",
                MEL_CACHE_FRAMES / 2
            )));
        }
        self.token_hop = hop;
        Ok(self)
    }

    /// Draws every synthesis's randomness from `seed`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Samples per second of the audio (24000).
    pub fn sample_rate(&self) -> u32 {
        self.hift.config().sampling_rate as u32
    }

    /// Text token ids of `text` (no special tokens added, as the reference's `encode`).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        if text.trim().is_empty() {
            return Err(CosyVoiceError::Input("no text to speak".into()));
        }
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| CosyVoiceError::Input(format!("cannot tokenize {text:?}: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The flow's starting noise `[1, 80, frames]` for the most tokens `text` can take.
    fn flow_noise(&self, text_tokens: usize, rng: &mut StdRng) -> Result<Tensor> {
        let tokens = self.prompt.tokens.len() + text_tokens * self.lm.config().max_token_text_ratio;
        let mel = self.flow.config().mel_channels;
        Ok(rng
            .noise((1, 2 * tokens, mel), &Device::Cpu)?
            .transpose(1, 2)?
            .contiguous()?)
    }

    /// Speech for `text` in one pass: all speech tokens, then the flow with full attention and
    /// the vocoder over all of them.
    pub fn speak(&mut self, text: &str) -> Result<Speech> {
        let ids = self.tokenize(text)?;
        let mut rng = Randomness::new(self.seed);
        let noise = self.flow_noise(ids.len(), &mut rng.flow)?;
        let tokens = match &mut self.ssd {
            Some((draft, config)) => {
                self.lm
                    .generate_speculative(
                        draft,
                        &ids,
                        &self.prompt_text,
                        &self.prompt.tokens,
                        config,
                        &mut rng.lm,
                        None,
                    )?
                    .0
            }
            None => self
                .lm
                .generate(&ids, &self.prompt_text, &self.prompt.tokens, &mut rng.lm)?,
        };
        if tokens.is_empty() {
            return Ok(Speech {
                tokens,
                audio: Vec::new(),
            });
        }
        let mel = self
            .flow
            .inference(&tokens, &self.prompt, &noise, false, true)?;
        let (speech, _) = self.hift.inference(&mel, None, &mut rng.hift)?;
        Ok(Speech {
            tokens,
            audio: speech.squeeze(0)?.to_vec1()?,
        })
    }

    /// Audio (24 kHz) for `text`, in one pass ([`CosyVoice2::speak`]).
    pub fn synthesize(&mut self, text: &str) -> Result<Vec<f32>> {
        Ok(self.speak(text)?.audio)
    }

    /// Speech for `text` on the reference's streaming schedule (module docs): each audio chunk
    /// goes to `on_audio` as soon as it is made, while the language model is still drawing.
    /// Returns the speech tokens.
    pub fn synthesize_stream(
        &mut self,
        text: &str,
        on_audio: &mut dyn FnMut(Vec<f32>) -> Result<()>,
    ) -> Result<Vec<u32>> {
        let ids = self.tokenize(text)?;
        let mut rng = Randomness::new(self.seed);
        let noise = self.flow_noise(ids.len(), &mut rng.flow)?;
        let Self {
            lm,
            flow,
            hift,
            prompt,
            prompt_text,
            token_hop,
            ssd,
            ..
        } = self;
        let mut stream = FlowStream::new(flow, prompt, &noise, *token_hop)?;
        let mut cache: Option<HiftCache> = None;
        let mut drawn: Vec<u32> = Vec::new();
        let hift_noise = &mut rng.hift;
        let mut on_token = |token| {
            drawn.push(token);
            if let Some(mel) = stream.next_chunk(&drawn)? {
                on_audio(vocode(hift, &mel, &mut cache, false, hift_noise)?)?;
            }
            Ok(())
        };
        let tokens = match ssd {
            Some((draft, config)) => {
                lm.generate_speculative(
                    draft,
                    &ids,
                    prompt_text,
                    &prompt.tokens,
                    config,
                    &mut rng.lm,
                    Some(&mut on_token),
                )?
                .0
            }
            None => lm.generate_each(
                &ids,
                prompt_text,
                &prompt.tokens,
                &mut rng.lm,
                &mut on_token,
            )?,
        };
        if tokens.is_empty() {
            return Ok(tokens);
        }
        let mel = stream.finish(&tokens)?;
        on_audio(vocode(hift, &mel, &mut cache, true, hift_noise)?)?;
        Ok(tokens)
    }
}

/// One streamed chunk through HiFT (the reference's `token2wav` after the flow): after the
/// cached mel frames and with the cached source, cross-faded into the held-back audio; all but
/// the last chunk hold back their tail and leave a cache.
fn vocode(
    hift: &Hift,
    mel: &Tensor,
    cache: &mut Option<HiftCache>,
    last: bool,
    noise: &mut dyn SineNoise,
) -> Result<Vec<f32>> {
    let overlap = MEL_CACHE_FRAMES * hift.config().samples_per_frame();
    let (mel, cache_source) = match cache.as_ref() {
        Some(c) => (Tensor::cat(&[&c.mel, mel], 2)?, Some(&c.source)),
        None => (mel.clone(), None),
    };
    let (speech, source) = hift.inference(&mel, cache_source, noise)?;
    let mut speech: Vec<f32> = speech.squeeze(0)?.to_vec1()?;
    if let Some(c) = cache.as_ref() {
        let window = hamming(2 * overlap);
        for (i, (s, held)) in speech.iter_mut().zip(&c.speech).enumerate() {
            *s = *s * window[i] as f32 + held * window[overlap + i] as f32;
        }
    }
    if last {
        *cache = None;
        return Ok(speech);
    }
    let (frames, samples) = (mel.dim(2)?, source.dim(2)?);
    if frames < MEL_CACHE_FRAMES || speech.len() < overlap {
        return Err(CosyVoiceError::Input(format!(
            "a streamed chunk of {frames} mel frames; HiFT's cache needs {MEL_CACHE_FRAMES}"
        )));
    }
    let held = speech.split_off(speech.len() - overlap);
    *cache = Some(HiftCache {
        mel: mel.narrow(2, frames - MEL_CACHE_FRAMES, MEL_CACHE_FRAMES)?,
        source: source.narrow(2, samples - overlap, overlap)?,
        speech: held,
    });
    Ok(speech)
}

/// numpy's `hamming(n)`: the symmetric window `0.54 − 0.46 cos(2πk / (n − 1))`.
fn hamming(n: usize) -> Vec<f64> {
    (0..n)
        .map(|k| 0.54 - 0.46 * (2.0 * std::f64::consts::PI * k as f64 / (n - 1) as f64).cos())
        .collect()
}

/// [`CosyVoice2`] as a [`spec_voice::SentenceSynthesizer`]: each sentence streamed on the
/// reference's schedule, its chunks returned as they came at 24 kHz, with the measured time until
/// the first was ready. Every sentence uses the model's seed, so a sentence always sounds the
/// same.
pub struct CosyVoiceSynthesizer {
    model: CosyVoice2,
}

impl CosyVoiceSynthesizer {
    pub fn new(model: CosyVoice2) -> Self {
        Self { model }
    }

    pub fn model(&self) -> &CosyVoice2 {
        &self.model
    }
}

impl From<CosyVoiceError> for spec_voice::Error {
    fn from(error: CosyVoiceError) -> Self {
        spec_voice::Error::Synthesis(Box::new(error))
    }
}

impl spec_voice::SentenceSynthesizer for CosyVoiceSynthesizer {
    fn synthesize(&mut self, sentence: &str) -> spec_voice::Result<spec_voice::Synthesis> {
        let sentence = spec_voice::sentence_to_speak(sentence)?;
        let start = std::time::Instant::now();
        let sample_rate = self.model.sample_rate();
        let mut first_audio_after = None;
        let mut chunks = Vec::new();
        self.model.synthesize_stream(sentence, &mut |samples| {
            first_audio_after.get_or_insert_with(|| start.elapsed());
            chunks.push(spec_voice::AudioChunk {
                samples,
                sample_rate,
            });
            Ok(())
        })?;
        Ok(spec_voice::Synthesis {
            sentence: sentence.to_string(),
            chunks,
            first_audio_after: first_audio_after.unwrap_or_else(|| start.elapsed()),
            compute: start.elapsed(),
        })
    }
}

/// The text tokenizer of a `CosyVoice-BlankEN` folder: its `tokenizer.json` when present, else
/// the Qwen2 byte-level BPE rebuilt from `vocab.json`, `merges.txt` and the added tokens of
/// `tokenizer_config.json` (what the released repository ships). A missing file is
/// [`CosyVoiceError::File`] naming it.
pub fn load_tokenizer(dir: &Path) -> Result<tokenizers::Tokenizer> {
    let fail = |path: PathBuf, reason: String| CosyVoiceError::File { path, reason };
    let json = dir.join("tokenizer.json");
    if json.is_file() {
        return engine_llm::tokenizer::read_tokenizer_json(&json)
            .map_err(|e| fail(json.clone(), e.to_string()));
    }
    let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
    for path in [&vocab, &merges] {
        if !path.is_file() {
            return Err(fail(
                path.clone(),
                format!("missing (and no {} either)", json.display()),
            ));
        }
    }
    let config = dir.join("tokenizer_config.json");
    let tokenizer = engine_llm::TextTokenizer::from_vocab_and_merges(
        &vocab,
        &merges,
        config.is_file().then_some(config.as_path()),
        "qwen2",
    )?;
    Ok(tokenizer.hf_tokenizer().clone())
}
