//! The registry of known models (`models.toml`, compiled in).

use std::collections::HashSet;
use std::fmt;
use std::sync::OnceLock;

use serde::Deserialize;

use crate::error::{Error, Result};

/// What a model is for, which decides the engine that loads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    ChatLlm,
    Whisper,
    Tts,
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelKind::ChatLlm => "chat-llm",
            ModelKind::Whisper => "whisper",
            ModelKind::Tts => "tts",
        })
    }
}

/// How the weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightFormat {
    Gguf,
    Safetensors,
    Ctranslate2,
    Cosyvoice,
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightFormat::Gguf => "gguf",
            WeightFormat::Safetensors => "safetensors",
            WeightFormat::Ctranslate2 => "ctranslate2",
            WeightFormat::Cosyvoice => "cosyvoice",
        })
    }
}

/// One file of a model.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Path inside the Hub repository.
    pub remote: String,
    /// Name in the model's folder (defaults to `remote`).
    #[serde(default)]
    local: Option<String>,
    /// Size in bytes, where pinned.
    pub size: Option<u64>,
    /// Lower-case hex SHA-256, where pinned.
    pub sha256: Option<String>,
}

impl FileEntry {
    /// Name of the file in the model's folder (may contain `/` for a sub-folder).
    pub fn local(&self) -> &str {
        self.local.as_deref().unwrap_or(&self.remote)
    }
}

/// One known model.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Short name: the folder name in the models folder and what users type.
    pub name: String,
    pub kind: ModelKind,
    pub format: WeightFormat,
    pub description: String,
    /// Hugging Face repository, `owner/name`.
    pub repo: String,
    /// Branch, tag or commit to download from.
    pub revision: String,
    /// The Hub requires an accepted licence and a token (`HF_TOKEN`).
    #[serde(default)]
    pub gated: bool,
    pub files: Vec<FileEntry>,
}

impl ModelEntry {
    /// Download address of `file` on the Hub at `endpoint` (e.g. `https://huggingface.co`).
    pub fn url(&self, endpoint: &str, file: &FileEntry) -> String {
        format!(
            "{}/{}/resolve/{}/{}",
            endpoint.trim_end_matches('/'),
            self.repo,
            self.revision,
            file.remote
        )
    }

    /// Total size of the pinned files (`None` if any size is not pinned).
    pub fn size(&self) -> Option<u64> {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Instructions for placing the files by hand into `dir`.
    pub fn manual_instructions(&self, dir: &std::path::Path) -> String {
        let mut text = format!("Place these files in {} by hand:", dir.display());
        for file in &self.files {
            text.push_str(&format!(
                "\n  {}  <-  {}",
                file.local(),
                self.url("https://huggingface.co", file)
            ));
        }
        if self.gated {
            text.push_str(
                "\n(gated on the Hub: accept the licence on the model page and set HF_TOKEN)",
            );
        }
        text
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryFile {
    model: Vec<ModelEntry>,
}

/// The known models.
#[derive(Clone, Debug)]
pub struct Registry {
    models: Vec<ModelEntry>,
}

impl Registry {
    /// The registry shipped with this crate (`models.toml`).
    pub fn builtin() -> &'static Registry {
        static BUILTIN: OnceLock<Registry> = OnceLock::new();
        BUILTIN.get_or_init(|| {
            Registry::parse(include_str!("../models.toml"))
                .expect("models.toml is checked by the crate's tests")
        })
    }

    /// Parses and checks a registry in the `models.toml` format.
    pub fn parse(text: &str) -> Result<Self> {
        let file: RegistryFile =
            toml::from_str(text).map_err(|e| Error::Registry(e.to_string()))?;
        let registry = Registry { models: file.model };
        registry.check()?;
        Ok(registry)
    }

    pub fn models(&self) -> &[ModelEntry] {
        &self.models
    }

    pub fn get(&self, name: &str) -> Option<&ModelEntry> {
        self.models.iter().find(|m| m.name == name)
    }

    fn check(&self) -> Result<()> {
        let mut names = HashSet::new();
        for model in &self.models {
            let fail = |what: String| Err(Error::Registry(format!("`{}`: {what}", model.name)));
            if !is_safe_name(&model.name) {
                return fail("a name is lower-case letters, digits, `.`, `-` and `_`".into());
            }
            if !names.insert(model.name.as_str()) {
                return fail("listed twice".into());
            }
            let repo_parts: Vec<&str> = model.repo.split('/').collect();
            if repo_parts.len() != 2 || repo_parts.iter().any(|p| p.is_empty()) {
                return fail(format!("repo `{}` is not `owner/name`", model.repo));
            }
            if model.revision.is_empty() || model.revision.contains('/') {
                return fail(format!(
                    "revision `{}` is not a branch or commit",
                    model.revision
                ));
            }
            if model.files.is_empty() {
                return fail("lists no files".into());
            }
            let mut locals = HashSet::new();
            for file in &model.files {
                if !is_relative_path(&file.remote) || !is_relative_path(file.local()) {
                    return fail(format!(
                        "file `{}` is not a plain relative path",
                        file.remote
                    ));
                }
                if !locals.insert(file.local()) {
                    return fail(format!("two files are saved as `{}`", file.local()));
                }
                if let Some(sha) = &file.sha256 {
                    let hex = sha.len() == 64
                        && sha
                            .bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                    if !hex {
                        return fail(format!(
                            "`{}`: sha256 is not 64 lower-case hex digits",
                            file.remote
                        ));
                    }
                }
                if file.size == Some(0) {
                    return fail(format!("`{}`: size 0", file.remote));
                }
            }
        }
        Ok(())
    }
}

fn is_safe_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

fn is_relative_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_registry_is_well_formed() {
        let registry = Registry::builtin();
        assert!(registry.models().len() >= 20);
        for name in [
            "smollm2-135m-instruct",
            "qwen2.5-coder-0.5b-instruct",
            "qwen2.5-coder-1.5b-instruct",
            "whisper-tiny.en-ct2",
            "whisper-base-ct2",
        ] {
            let model = registry.get(name).unwrap();
            assert!(
                model
                    .files
                    .iter()
                    .all(|f| f.size.is_some() && f.sha256.is_some()),
                "{name}: the models the tests use are pinned"
            );
        }
        let qwen = registry.get("qwen2.5-coder-1.5b-instruct").unwrap();
        assert_eq!(qwen.files[0].local(), "model.gguf");
        assert_eq!(
            qwen.url("https://huggingface.co/", &qwen.files[0]),
            "https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/resolve/\
             38f6bab61d341b23a6c00226f32c0d6148bf9f43/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
        );
        assert_eq!(qwen.size(), Some(1117320768));
        assert!(registry.get("llama-3.2-1b-instruct").unwrap().gated);
        assert_eq!(
            registry.get("whisper-large-v3").unwrap().kind,
            ModelKind::Whisper
        );
    }

    fn one_model(extra: &str, files: &str) -> String {
        format!(
            "[[model]]\nname = \"m\"\nkind = \"chat-llm\"\nformat = \"gguf\"\ndescription = \"d\"\n\
             repo = \"o/r\"\nrevision = \"main\"\n{extra}\nfiles = [{files}]\n"
        )
    }

    #[test]
    fn malformed_registries_are_rejected_with_the_reason() {
        let ok = one_model("", "{ remote = \"a.gguf\" }");
        assert!(Registry::parse(&ok).is_ok());
        let cases = [
            (one_model("", ""), "no files"),
            (one_model("", "{ remote = \"../a\" }"), "relative path"),
            (
                one_model("", "{ remote = \"a\", sha256 = \"ABC\" }"),
                "sha256",
            ),
            (one_model("", "{ remote = \"a\", size = 0 }"), "size 0"),
            (
                one_model("", "{ remote = \"a\" }, { remote = \"b\", local = \"a\" }"),
                "saved as",
            ),
            (
                one_model("colour = 1", "{ remote = \"a\" }"),
                "unknown field",
            ),
            (ok.replace("o/r", "no-owner"), "owner/name"),
            (ok.replace("chat-llm", "vision"), "unknown variant"),
            (
                ok.replace("name = \"m\"", "name = \"Big Model\""),
                "lower-case",
            ),
            (format!("{ok}{ok}"), "twice"),
        ];
        for (text, reason) in cases {
            let err = Registry::parse(&text).unwrap_err().to_string();
            assert!(err.contains(reason), "expected `{reason}` in: {err}");
        }
    }
}
