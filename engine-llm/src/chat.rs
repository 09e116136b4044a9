//! Conversations ([`Message`], [`Role`]) and [`LanguageModel`], which bundles weights,
//! tokenizer and chat template: loading by name or path, and safe prompts for a conversation.
//! Answering is in [`crate::answer`].

use std::path::{Path, PathBuf};

use crate::load::LoadOptions;
use crate::template::{ChatTemplate, JinjaTemplate};
use crate::tokenizer::TextTokenizer;
use crate::transformer::Transformer;
use crate::{Error, Result};
use spec_core::HeadsDrafter;
use spec_nn::heads::{weights_fingerprint, MultiTokenHeads};
use spec_nn::GgufFile;

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: Role::System,
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: Role::Assistant,
            content: content.into(),
        }
    }
}

/// A chat model ready to prompt: weights, tokenizer and template.
#[derive(Debug)]
pub struct LanguageModel {
    pub model: Transformer,
    pub tokenizer: TextTokenizer,
    pub template: ChatTemplate,
    /// The weights file it was loaded from (the first shard of a safetensors checkpoint).
    pub weights: PathBuf,
    /// A draft model for [`Speculation::Draft`](crate::Speculation::Draft).
    pub(crate) draft: Option<Transformer>,
    /// Prediction heads for [`Speculation::Heads`](crate::Speculation::Heads).
    pub(crate) heads: Option<HeadsDrafter<MultiTokenHeads>>,
}

impl LanguageModel {
    /// Loads a model by registry name, by folder name in the models folder, or by path (see
    /// [`spec_models::Store::resolve`]): a GGUF file, or a Hugging Face folder with safetensors.
    pub fn open(name_or_path: &str, options: &LoadOptions) -> Result<Self> {
        Self::open_in(&spec_models::Store::from_env()?, name_or_path, options)
    }

    /// [`LanguageModel::open`] with a given models folder and registry.
    pub fn open_in(
        store: &spec_models::Store<'_>,
        name_or_path: &str,
        options: &LoadOptions,
    ) -> Result<Self> {
        let files = store.resolve(name_or_path)?;
        if let Some(entry) = &files.entry {
            if entry.kind != spec_models::ModelKind::ChatLlm {
                return Err(Error::Config(format!(
                    "`{}` is a {} model, not a chat LLM",
                    entry.name, entry.kind
                )));
            }
        }
        match files.with_extension("gguf").as_slice() {
            [gguf] => Self::load_gguf(gguf, options),
            [] if files.file("config.json").is_some() => Self::load_hf_folder(&files.dir, options),
            [] => Err(Error::Config(format!(
                "`{name_or_path}` ({}) holds neither a GGUF file nor config.json with safetensors",
                files.dir.display()
            ))),
            _ => Err(Error::Config(format!(
                "{} holds several GGUF files; name one",
                files.dir.display()
            ))),
        }
    }

    /// Loads a GGUF file, or a folder holding one, or a Hugging Face folder (`config.json`,
    /// `*.safetensors`, `tokenizer.json`, optionally `tokenizer_config.json`).
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self> {
        if path.is_dir() {
            let gguf = files_with_extension(path, "gguf")?;
            match gguf.as_slice() {
                [single] => return Self::load_gguf(single, options),
                [] => {}
                _ => {
                    return Err(Error::Config(format!(
                        "{} holds several GGUF files; name one",
                        path.display()
                    )))
                }
            }
            return Self::load_hf_folder(path, options);
        }
        Self::load_gguf(path, options)
    }

    fn load_gguf(path: &Path, options: &LoadOptions) -> Result<Self> {
        // One open file: its header serves the tokenizer and template, then the weights.
        let gguf = GgufFile::open(path)?;
        let tokenizer = TextTokenizer::from_gguf(&gguf)?;
        let token = |key: &str| -> Result<Option<String>> {
            match gguf.metadata().get(key) {
                Some(id) => Ok(tokenizer.token(id.to_u32()?)),
                None => Ok(None),
            }
        };
        let jinja = match gguf.metadata().get("tokenizer.chat_template") {
            Some(v) => Some(JinjaTemplate::new(
                format!("{}: tokenizer.chat_template", path.display()),
                v.to_string()?.clone(),
                token("tokenizer.ggml.bos_token_id")?,
                token("tokenizer.ggml.eos_token_id")?,
            )?),
            None => None,
        };
        let template = ChatTemplate::for_model(jinja, &tokenizer)?;
        let model = Transformer::from_gguf_file(gguf, options)?;
        Self::checked(model, tokenizer, template, path.to_path_buf())
    }

    fn load_hf_folder(dir: &Path, options: &LoadOptions) -> Result<Self> {
        let shards = files_with_extension(dir, "safetensors")?;
        let model = Transformer::from_safetensors(&dir.join("config.json"), &shards, options)?;
        let tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json"))?;
        let template = ChatTemplate::for_model(hf_template(dir)?, &tokenizer)?;
        let weights = shards.first().cloned().unwrap_or_else(|| dir.to_path_buf());
        Self::checked(model, tokenizer, template, weights)
    }

    /// A model from its parts (weights built in memory, a tokenizer and template of one's
    /// choosing); `weights` names where the weights came from.
    pub fn from_parts(
        model: Transformer,
        tokenizer: TextTokenizer,
        template: ChatTemplate,
        weights: PathBuf,
    ) -> Result<Self> {
        Self::checked(model, tokenizer, template, weights)
    }

    fn checked(
        model: Transformer,
        tokenizer: TextTokenizer,
        template: ChatTemplate,
        weights: PathBuf,
    ) -> Result<Self> {
        // The embedding matrix may be padded past the tokenizer's last id, never the reverse.
        if tokenizer.vocab_size() > model.config().vocab_size {
            return Err(Error::VocabularyMismatch(format!(
                "the tokenizer has {} tokens but the model only {} embeddings",
                tokenizer.vocab_size(),
                model.config().vocab_size
            )));
        }
        Ok(Self {
            model,
            tokenizer,
            template,
            weights,
            draft: None,
            heads: None,
        })
    }

    /// Token ids of the prompt for `messages`. Control tokens come only from the template:
    /// special-token strings inside contents are encoded as ordinary text.
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<Vec<u32>> {
        self.tokenizer
            .encode_prompt(&self.template.render_parts(messages)?)
    }

    /// Fails unless `draft` can draft for this model: the same vocabulary size and the same
    /// string for every token id.
    pub fn check_draft(&self, draft: &LanguageModel) -> Result<()> {
        let (t, d) = (
            self.model.config().vocab_size,
            draft.model.config().vocab_size,
        );
        if t != d {
            return Err(Error::VocabularyMismatch(format!(
                "the target has {t} embeddings, the draft {d}"
            )));
        }
        self.tokenizer.check_same_vocabulary(
            &draft.tokenizer,
            self.tokenizer
                .vocab_size()
                .max(draft.tokenizer.vocab_size()),
        )
    }

    /// The multi-token prediction heads in `dir` (`heads.json`, `heads.safetensors`, as
    /// `cargo xtask train-heads` writes them); fails unless they were trained for this model's
    /// weights.
    pub fn load_heads(&self, dir: &Path) -> Result<MultiTokenHeads> {
        let fingerprint = weights_fingerprint(&self.weights)?;
        let device = spec_core::Decoder::device(&self.model);
        Ok(MultiTokenHeads::load(
            dir,
            &self.model,
            &fingerprint,
            device,
        )?)
    }
}

/// The Jinja template in a Hugging Face folder's `tokenizer_config.json` (a string, or the
/// `default` one of a list of named templates), with its `bos_token` and `eos_token`.
fn hf_template(dir: &Path) -> Result<Option<JinjaTemplate>> {
    let path = dir.join("tokenizer_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    let source = match config.get("chat_template") {
        Some(serde_json::Value::String(source)) => source.clone(),
        Some(serde_json::Value::Array(named)) => {
            let default = named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"));
            match default.and_then(|t| t.get("template")?.as_str()) {
                Some(source) => source.to_string(),
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    // A special token is written as its string or as an object with its `content`.
    let token = |key: &str| {
        let value = config.get(key)?;
        value
            .as_str()
            .or_else(|| value.get("content")?.as_str())
            .map(str::to_string)
    };
    JinjaTemplate::new(
        format!("{}: chat_template", path.display()),
        source,
        token("bos_token"),
        token("eos_token"),
    )
    .map(Some)
}

fn files_with_extension(dir: &Path, extension: &str) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    Ok(files)
}
