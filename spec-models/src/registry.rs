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
    /// Voice activity detection (Silero VAD).
    Vad,
    /// Not a model: a library the engines load at run time (ONNX Runtime).
    Runtime,
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelKind::ChatLlm => "chat-llm",
            ModelKind::Whisper => "whisper",
            ModelKind::Tts => "tts",
            ModelKind::Vad => "vad",
            ModelKind::Runtime => "runtime",
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
    Onnx,
    /// A native shared library (`.so`).
    SharedLibrary,
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightFormat::Gguf => "gguf",
            WeightFormat::Safetensors => "safetensors",
            WeightFormat::Ctranslate2 => "ctranslate2",
            WeightFormat::Cosyvoice => "cosyvoice",
            WeightFormat::Onnx => "onnx",
            WeightFormat::SharedLibrary => "shared-library",
        })
    }
}

/// One file of a model: in the entry's Hub repository (`remote`), or at an address of its own
/// (`url`), exactly one of the two.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Path inside the entry's repository (for a [`ModelEntry::manual`] entry, inside the
    /// archive its instructions name).
    #[serde(default)]
    pub remote: Option<String>,
    /// Full download address of a file kept outside the entry's repository (a GitHub release,
    /// another repository at a pinned commit). The Hub token is never sent to it.
    #[serde(default)]
    pub url: Option<String>,
    /// Name in the model's folder (defaults to `remote`, else the last part of `url`).
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
        self.local
            .as_deref()
            .or(self.remote.as_deref())
            .or_else(|| self.url.as_deref()?.rsplit('/').next())
            .unwrap_or_default()
    }

    /// Whether the file comes from the Hub (and may be sent the Hub token).
    pub fn on_hub(&self) -> bool {
        self.url.is_none()
    }

    /// How the registry names the file in its messages.
    fn label(&self) -> &str {
        self.remote
            .as_deref()
            .or(self.url.as_deref())
            .unwrap_or_else(|| self.local())
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
    /// Repository, `owner/name`: on the Hugging Face Hub, unless every file has its own `url`
    /// or the entry is `manual`.
    pub repo: String,
    /// Branch, tag or commit to download from.
    pub revision: String,
    /// The Hub requires an accepted licence and a token (`HF_TOKEN`).
    #[serde(default)]
    pub gated: bool,
    /// How to get the files by hand, for an entry the downloader cannot fetch (its files come
    /// in an archive): such an entry is checked and resolved like any other, never downloaded.
    #[serde(default)]
    pub manual: Option<String>,
    pub files: Vec<FileEntry>,
}

impl ModelEntry {
    /// Download address of `file`: its own `url`, else its place on the Hub at `endpoint`
    /// (e.g. `https://huggingface.co`).
    pub fn url(&self, endpoint: &str, file: &FileEntry) -> String {
        match (&file.url, &file.remote) {
            (Some(url), _) => url.clone(),
            (None, remote) => format!(
                "{}/{}/resolve/{}/{}",
                endpoint.trim_end_matches('/'),
                self.repo,
                self.revision,
                remote.as_deref().unwrap_or_default()
            ),
        }
    }

    /// Total size of the pinned files (`None` if any size is not pinned, or the sizes add up
    /// past `u64::MAX`, as only a corrupt registry's can).
    pub fn size(&self) -> Option<u64> {
        self.files
            .iter()
            .try_fold(0u64, |total, f| total.checked_add(f.size?))
    }

    /// Instructions for placing the files by hand into `dir`.
    pub fn manual_instructions(&self, dir: &std::path::Path) -> String {
        let mut text = format!("Place these files in {} by hand:", dir.display());
        if let Some(manual) = &self.manual {
            for file in &self.files {
                text.push_str(&format!("\n  {}", file.local()));
            }
            text.push_str(&format!("\n{manual}"));
            return text;
        }
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
                return fail("a name is ASCII letters, digits, `.`, `-` and `_`".into());
            }
            // Names are folder names: two that differ only in case are one folder on some
            // file systems.
            if !names.insert(model.name.to_ascii_lowercase()) {
                return fail("listed twice (names are compared ignoring case)".into());
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
                match (&file.remote, &file.url) {
                    (Some(remote), None) if is_relative_path(remote) => {}
                    (None, Some(url)) if is_download_url(url) => {}
                    (Some(_), Some(_)) | (None, None) => {
                        return fail(format!(
                            "file `{}` needs exactly one of `remote` and `url`",
                            file.label()
                        ))
                    }
                    (Some(remote), None) => {
                        return fail(format!("file `{remote}` is not a plain relative path"))
                    }
                    (None, Some(url)) => {
                        return fail(format!(
                            "`{url}` is not an http(s) address ending in a file name"
                        ))
                    }
                }
                if !is_relative_path(file.local()) {
                    return fail(format!(
                        "file `{}` is not a plain relative path",
                        file.local()
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
                            file.label()
                        ));
                    }
                }
                if file.size == Some(0) {
                    return fail(format!("`{}`: size 0", file.label()));
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
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// An `http(s)://host/…/name` address: the file name is the default local name.
fn is_download_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return false;
    };
    match rest.split_once('/') {
        Some((host, path)) => {
            !host.is_empty()
                && !url.contains(char::is_whitespace)
                && path.rsplit('/').next().is_some_and(|name| !name.is_empty())
        }
        None => false,
    }
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

    /// Two pinned sizes adding up past `u64::MAX` (a corrupt registry) overflowed the sum.
    #[test]
    fn sizes_adding_up_past_u64_have_no_total() {
        let registry = Registry::parse(
            r#"
[[model]]
name = "big"
kind = "whisper"
format = "gguf"
description = "d"
repo = "a/b"
revision = "main"
files = [
    { remote = "a.bin", size = 18446744073709551615 },
    { remote = "b.bin", size = 2 },
]
"#,
        )
        .unwrap();
        assert_eq!(registry.models()[0].size(), None);
    }

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
        for file in registry.models().iter().flat_map(|m| &m.files) {
            if let Some(url) = &file.url {
                assert!(url.starts_with("https://"), "{url}");
            }
        }
    }

    #[test]
    fn the_voices_and_their_runtime_are_registered() {
        let registry = Registry::builtin();
        let kokoro = registry.get("kokoro-82m").unwrap();
        assert_eq!(
            (kokoro.kind, kokoro.format),
            (ModelKind::Tts, WeightFormat::Onnx)
        );
        let file = |model: &ModelEntry, local: &str| {
            model
                .files
                .iter()
                .find(|f| f.local() == local)
                .unwrap_or_else(|| panic!("{}: no {local}", model.name))
                .clone()
        };
        // The model comes from a release of its own, outside the hub repository.
        let model = file(kokoro, "model.onnx");
        assert_eq!(model.size, Some(92_361_271));
        assert!(!model.on_hub());
        assert_eq!(
            kokoro.url("https://mirror.example", &model),
            "https://github.com/thewh1teagle/kokoro-onnx/releases/download/model-files-v1.0/\
             kokoro-v1.0.int8.onnx"
        );
        // The voices the product names are pinned files of the hub repository.
        for voice in ["af_heart", "bm_george"] {
            let local = format!("voices/{voice}.bin");
            let entry = file(kokoro, &local);
            assert_eq!(entry.size, Some(522_240));
            assert!(entry.sha256.is_some() && entry.on_hub());
            assert_eq!(
                kokoro.url("https://huggingface.co", &entry),
                format!(
                    "https://huggingface.co/onnx-community/Kokoro-82M-v1.0-ONNX/resolve/main/{local}"
                )
            );
        }
        let voices = kokoro
            .files
            .iter()
            .filter(|f| f.local().starts_with("voices/"))
            .count();
        assert_eq!(voices, 54);
        assert!(file(kokoro, "lexicon/us_gold.json")
            .url
            .unwrap()
            .starts_with("https://raw.githubusercontent.com/hexgrad/misaki/"));
        assert_eq!(file(kokoro, "vocab.json").sha256, None);

        let piper = registry.get("piper-en_US-joe-medium").unwrap();
        let onnx = file(piper, "model.onnx");
        assert_eq!(
            piper.url("https://huggingface.co", &onnx),
            "https://huggingface.co/rhasspy/piper-voices/resolve/v1.0.0/\
             en/en_US/joe/medium/en_US-joe-medium.onnx"
        );
        assert!(file(piper, "model.onnx.json").sha256.is_some());

        // Silero VAD comes from its GitHub repository at a tag.
        let vad = registry.get("silero-vad").unwrap();
        assert_eq!((vad.kind, vad.format), (ModelKind::Vad, WeightFormat::Onnx));
        let weights = file(vad, "silero_vad_16k_op15.onnx");
        assert_eq!(weights.size, Some(1_289_603));
        assert!(!weights.on_hub() && weights.sha256.is_some());
        assert!(weights
            .url
            .unwrap()
            .starts_with("https://raw.githubusercontent.com/snakers4/silero-vad/v6.2.1/"));

        let runtime = registry.get("onnxruntime").unwrap();
        assert_eq!(runtime.kind, ModelKind::Runtime);
        assert_eq!(runtime.files[0].local(), "libonnxruntime.so");
        let how = runtime.manual_instructions(std::path::Path::new("/m/onnxruntime"));
        assert!(how.contains("/m/onnxruntime"), "{how}");
        assert!(how.contains("onnxruntime-linux-x64-1.31.1.tgz"), "{how}");
        assert!(!how.contains("huggingface.co"), "{how}");
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
        let elsewhere = Registry::parse(&one_model(
            "manual = \"unpack it\"",
            "{ url = \"https://example.org/dl/v1/tool.tgz\" }, { remote = \"lib/x.so\", local = \"x.so\" }",
        ))
        .unwrap();
        let model = elsewhere.get("m").unwrap();
        assert_eq!(model.files[0].local(), "tool.tgz");
        assert_eq!(model.manual.as_deref(), Some("unpack it"));
        // Upper case is allowed (Piper's voices are named so).
        assert!(Registry::parse(&ok.replace("name = \"m\"", "name = \"en_US-m\"")).is_ok());
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
                "ASCII letters",
            ),
            (format!("{ok}{ok}"), "twice"),
            (
                format!("{ok}{}", ok.replace("name = \"m\"", "name = \"M\"")),
                "ignoring case",
            ),
            (
                one_model("", "{ remote = \"a\", url = \"https://h/a\" }"),
                "exactly one",
            ),
            (one_model("", "{ local = \"a\" }"), "exactly one"),
            (one_model("", "{ url = \"ftp://h/a\" }"), "http(s) address"),
            (one_model("", "{ url = \"https://h/\" }"), "http(s) address"),
            (
                one_model("", "{ url = \"https://h/a\", local = \"../a\" }"),
                "relative path",
            ),
        ];
        for (text, reason) in cases {
            let err = Registry::parse(&text).unwrap_err().to_string();
            assert!(err.contains(reason), "expected `{reason}` in: {err}");
        }
    }
}
