//! Chat prompts: the ChatML format (Qwen, SmolLM2) and Llama 3's header format, and a
//! [`LanguageModel`] that bundles weights, tokenizer and template.
//!
//! The template family is recognised from the model's own Jinja template (GGUF
//! `tokenizer.chat_template` or `tokenizer_config.json`) or, failing that, from its special
//! tokens; its default system prompt is taken from the template text. Rendering is done here,
//! not by a Jinja engine: tools and other template features beyond plain multi-turn chat are not
//! supported.

use std::path::{Path, PathBuf};

use crate::load::LoadOptions;
use crate::tokenizer::TextTokenizer;
use crate::transformer::Transformer;
use crate::{Error, Result};
use spec_nn::GgufFile;

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    fn as_str(self) -> &'static str {
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

/// The prompt formats supported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// `<|im_start|>role\ncontent<|im_end|>\n` turns (Qwen, SmolLM2).
    ChatMl { default_system: Option<String> },
    /// `<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>` turns (Llama 3).
    Llama3 { default_system: Option<String> },
}

impl ChatTemplate {
    /// Recognises the family from a Jinja template and/or the tokenizer's special tokens.
    pub fn detect(jinja: Option<&str>, tokenizer: &TextTokenizer) -> Result<Self> {
        let source = jinja.unwrap_or_default();
        if source.contains("<|im_start|>")
            || (jinja.is_none() && tokenizer.token_id("<|im_start|>").is_some())
        {
            Ok(Self::ChatMl {
                default_system: default_system(source, "<|im_start|>system", "<|im_end|>"),
            })
        } else if source.contains("<|start_header_id|>")
            || (jinja.is_none() && tokenizer.token_id("<|start_header_id|>").is_some())
        {
            Ok(Self::Llama3 {
                default_system: None,
            })
        } else {
            Err(Error::Tokenizer(
                "unrecognised chat template: neither ChatML nor Llama 3".into(),
            ))
        }
    }

    /// The prompt text for `messages`, ending with the opening of the assistant's turn.
    pub fn render(&self, messages: &[Message]) -> String {
        let mut out = String::new();
        let needs_default = messages.first().is_none_or(|m| m.role != Role::System);
        match self {
            Self::ChatMl { default_system } => {
                let turn = |out: &mut String, role: &str, content: &str| {
                    out.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
                };
                if let (true, Some(system)) = (needs_default, default_system) {
                    turn(&mut out, "system", system);
                }
                for m in messages {
                    turn(&mut out, m.role.as_str(), &m.content);
                }
                out.push_str("<|im_start|>assistant\n");
            }
            Self::Llama3 { default_system } => {
                let turn = |out: &mut String, role: &str, content: &str| {
                    out.push_str(&format!(
                        "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
                    ));
                };
                out.push_str("<|begin_of_text|>");
                if let (true, Some(system)) = (needs_default, default_system) {
                    turn(&mut out, "system", system);
                }
                for m in messages {
                    turn(&mut out, m.role.as_str(), &m.content);
                }
                out.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
            }
        }
        out
    }
}

/// The literal default system prompt of a template: text following `opening` and a newline
/// (real or escaped) up to `closing`, where it contains no template code.
fn default_system(source: &str, opening: &str, closing: &str) -> Option<String> {
    source.match_indices(opening).find_map(|(at, _)| {
        let rest = &source[at + opening.len()..];
        let rest = rest
            .strip_prefix("\\n")
            .or_else(|| rest.strip_prefix('\n'))?;
        let text = &rest[..rest.find(closing)?];
        let literal = !text.is_empty() && !text.contains(['{', '}', '\'', '"', '\\', '\n']);
        literal.then(|| text.to_string())
    })
}

/// A chat model ready to prompt: weights, tokenizer and template.
#[derive(Debug)]
pub struct LanguageModel {
    pub model: Transformer,
    pub tokenizer: TextTokenizer,
    pub template: ChatTemplate,
    /// The weights file it was loaded from (the first shard of a safetensors checkpoint).
    pub weights: PathBuf,
}

impl LanguageModel {
    /// Loads a model by registry name, by folder name in the models folder, or by path (see
    /// [`spec_models::Store::resolve`]): a GGUF file, or a Hugging Face folder with safetensors.
    pub fn open(name_or_path: &str, options: &LoadOptions) -> Result<Self> {
        Self::open_in(&spec_models::Store::from_env()?, name_or_path, options)
    }

    /// [`LanguageModel::open`] with a given models folder and registry.
    pub fn open_in(
        store: &spec_models::Store,
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
        let jinja = match gguf.metadata().get("tokenizer.chat_template") {
            Some(v) => Some(v.to_string()?.clone()),
            None => None,
        };
        let template = ChatTemplate::detect(jinja.as_deref(), &tokenizer)?;
        let model = Transformer::from_gguf_file(gguf, options)?;
        Self::checked(model, tokenizer, template, path.to_path_buf())
    }

    fn load_hf_folder(dir: &Path, options: &LoadOptions) -> Result<Self> {
        let shards = files_with_extension(dir, "safetensors")?;
        let model = Transformer::from_safetensors(&dir.join("config.json"), &shards, options)?;
        let tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json"))?;
        let jinja = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|v| v.get("chat_template")?.as_str().map(str::to_string));
        let template = ChatTemplate::detect(jinja.as_deref(), &tokenizer)?;
        let weights = shards.first().cloned().unwrap_or_else(|| dir.to_path_buf());
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
        })
    }

    /// Token ids of the prompt for `messages`.
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<Vec<u32>> {
        self.tokenizer.encode(&self.template.render(messages))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_with_default_system_and_history() {
        let t = ChatTemplate::ChatMl {
            default_system: Some("Be brief.".into()),
        };
        let text = t.render(&[
            Message::user("Hi"),
            Message::assistant("Hello!"),
            Message::user("2+2?"),
        ]);
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let own = t.render(&[Message::system("Custom."), Message::user("Hi")]);
        assert!(
            own.starts_with("<|im_start|>system\nCustom.<|im_end|>\n")
                && !own.contains("Be brief.")
        );
    }

    #[test]
    fn llama3_turns() {
        let t = ChatTemplate::Llama3 {
            default_system: None,
        };
        assert_eq!(
            t.render(&[Message::user("Hi")]),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn default_system_prompts_are_read_from_templates() {
        let qwen = r"{%- else %}\n        {{- '<|im_start|>system\n' }}{%- if x %}{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}";
        assert_eq!(
            default_system(qwen, "<|im_start|>system", "<|im_end|>").as_deref(),
            Some("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
        );
        let smol = "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}";
        assert_eq!(
            default_system(smol, "<|im_start|>system", "<|im_end|>").as_deref(),
            Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
        );
        assert_eq!(
            default_system("{{ messages }}", "<|im_start|>system", "<|im_end|>"),
            None
        );
    }
}
