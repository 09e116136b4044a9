//! Text ↔ token ids, from a `tokenizer.json` or from the vocabulary and merges inside a GGUF.
//!
//! A GGUF names its pre-tokenizer (`tokenizer.ggml.pre`); each one is rebuilt here from the
//! `tokenizers` crate's parts to match the model's Hugging Face `tokenizer.json`: a regex split
//! (Qwen2, Llama 3) or individual digits (SmolLM), then GPT-2 byte-level mapping and byte-pair
//! merges. Control and user-defined tokens become added tokens, matched whole in text.
//!
//! Chat prompts are encoded with [`TextTokenizer::encode_prompt`]: control tokens come only
//! from the template, while message contents are always ordinary text, so a user who types
//! `<|im_end|>` cannot end a turn or forge a system message.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::tokenizer::step_decode_stream;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::template::PromptPart;
use crate::{Error, Result};
use spec_nn::GgufFile;

/// Qwen2's split pattern (its `tokenizer.json`).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split pattern: as Qwen2's, with numbers in groups of up to three digits.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token strings that end a chat turn or the text, in the families supported.
const END_TOKENS: [&str; 5] = [
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|eom_id|>",
];

/// Reads a Hugging Face `tokenizer.json` ([`Error::Tokenizer`] naming the file when it cannot).
/// The text is checked to be JSON first: `tokenizers` panics on a syntax error inside the
/// `decoder` entry where it returns an error for one elsewhere.
pub fn read_tokenizer_json(path: &Path) -> Result<Tokenizer> {
    let fail = |reason: String| Error::Tokenizer(format!("{}: {reason}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    serde_json::from_str::<serde_json::Value>(&text).map_err(|e| fail(e.to_string()))?;
    text.parse()
        .map_err(|e: tokenizers::Error| fail(e.to_string()))
}

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// A tokenizer with the special tokens generation needs; clones share the vocabulary.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Arc<Tokenizer>,
    /// The same tokenizer with special-token matching off: special-token strings are text.
    plain: Arc<Tokenizer>,
    /// Special tokens' strings and ids, longest first.
    specials: Vec<(String, u32)>,
    end_tokens: Vec<u32>,
    /// [`TextTokenizer::sentence_end_tokens`], found on first use.
    sentence_ends: Arc<OnceLock<Vec<u32>>>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("end_tokens", &self.end_tokens)
            .finish()
    }
}

impl TextTokenizer {
    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        Ok(Self::with_end_tokens(read_tokenizer_json(path)?, None))
    }

    /// Builds the tokenizer stored in a GGUF file.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let model = gguf.value("tokenizer.ggml.model")?.to_string()?;
        if model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "GGUF tokenizer model `{model}` is not supported (only byte-level BPE, `gpt2`)"
            )));
        }
        let tokens = string_array(gguf, "tokenizer.ggml.tokens")?;
        let merges = string_array(gguf, "tokenizer.ggml.merges")?;
        let types: Vec<i32> = match gguf.metadata().get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()?
                .iter()
                .map(|t| t.to_i32())
                .collect::<candle_core::Result<_>>()?,
            None => vec![1; tokens.len()],
        };
        let pre = match gguf.metadata().get("tokenizer.ggml.pre") {
            Some(v) => v.to_string()?.clone(),
            None => "default".to_string(),
        };
        let eos = gguf
            .metadata()
            .get("tokenizer.ggml.eos_token_id")
            .map(|v| v.to_u32())
            .transpose()?;
        Self::byte_level(&tokens, &merges, &types, &pre, eos)
    }

    /// Builds a byte-level BPE tokenizer from a Hugging Face checkpoint's "slow" files (for
    /// checkpoints without a `tokenizer.json`): `vocab.json` (token → id), `merges.txt` (one
    /// `a b` merge per line after a `#version` header) and, when given, the added tokens of
    /// `tokenizer_config.json` (`added_tokens_decoder`; special ones are matched whole).
    /// `pre` names the pre-tokenizer as a GGUF would (`qwen2`, `llama-bpe`, `smollm`, `gpt2`).
    pub fn from_vocab_and_merges(
        vocab: &Path,
        merges: &Path,
        tokenizer_config: Option<&Path>,
        pre: &str,
    ) -> Result<Self> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })
        };
        let malformed =
            |path: &Path, reason: String| Error::Tokenizer(format!("{}: {reason}", path.display()));
        let ids: std::collections::HashMap<String, u32> =
            serde_json::from_str(&read(vocab)?).map_err(|e| malformed(vocab, e.to_string()))?;
        let mut added: Vec<(u32, String, bool)> = Vec::new();
        if let Some(config) = tokenizer_config {
            let json: serde_json::Value = serde_json::from_str(&read(config)?)
                .map_err(|e| malformed(config, e.to_string()))?;
            if let Some(decoder) = json.get("added_tokens_decoder").and_then(|d| d.as_object()) {
                for (id, token) in decoder {
                    let id: u32 = id
                        .parse()
                        .map_err(|_| malformed(config, format!("added token id `{id}`")))?;
                    let content =
                        token
                            .get("content")
                            .and_then(|c| c.as_str())
                            .ok_or_else(|| {
                                malformed(config, format!("added token {id} has no content"))
                            })?;
                    let special = token
                        .get("special")
                        .and_then(|s| s.as_bool())
                        .unwrap_or(false);
                    added.push((id, content.to_string(), special));
                }
            }
        }
        let all_ids: std::collections::HashSet<u32> = ids
            .values()
            .copied()
            .chain(added.iter().map(|(id, _, _)| *id))
            .collect();
        // Ids number the tokens from 0 without a gap: `size` distinct ids all below `size`.
        // Checked before the table is allocated, so a stray id (4 294 967 295, say) cannot
        // size it; then every slot of the table is filled below.
        let size = all_ids.len();
        if let Some(missing) = (0..size as u32).find(|id| !all_ids.contains(id)) {
            return Err(malformed(vocab, format!("no token has id {missing}")));
        }
        let mut tokens = vec![String::new(); size];
        let mut types = vec![1; size];
        for (token, &id) in &ids {
            tokens[id as usize] = token.clone();
        }
        for (id, content, special) in added {
            tokens[id as usize] = content;
            types[id as usize] = if special {
                TOKEN_TYPE_CONTROL
            } else {
                TOKEN_TYPE_USER_DEFINED
            };
        }
        let merges: Vec<String> = read(merges)?
            .lines()
            .filter(|l| !l.starts_with("#version") && !l.trim().is_empty())
            .map(String::from)
            .collect();
        Self::byte_level(&tokens, &merges, &types, pre, None)
    }

    /// The underlying Hugging Face tokenizer (for callers that add their own processing).
    pub fn hf_tokenizer(&self) -> &Tokenizer {
        &self.inner
    }

    /// A byte-level BPE tokenizer as a GGUF describes it: token strings, merges (`"a b"`),
    /// llama.cpp token types, the pre-tokenizer's name and the end-of-text id.
    pub(crate) fn byte_level(
        tokens: &[String],
        merges: &[String],
        types: &[i32],
        pre: &str,
        eos: Option<u32>,
    ) -> Result<Self> {
        let merges: Vec<(String, String)> = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| Error::Tokenizer(format!("malformed merge `{m}`")))
            })
            .collect::<Result<_>>()?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre == "llama-bpe")
            .build()
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut inner = Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        if pre == "qwen2" {
            inner
                .with_normalizer(Some(NFC))
                .map_err(|e| Error::Tokenizer(e.to_string()))?;
        }
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
            .map(|(s, _)| AddedToken::from(s.clone(), true))
            .collect();
        inner
            .add_special_tokens(specials)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(Self::with_end_tokens(inner, eos))
    }

    fn with_end_tokens(inner: Tokenizer, eos: Option<u32>) -> Self {
        let mut end_tokens: Vec<u32> = END_TOKENS
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .collect();
        end_tokens.extend(eos);
        end_tokens.sort_unstable();
        end_tokens.dedup();
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        let mut specials: Vec<(String, u32)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special && !token.content.is_empty())
            .map(|(id, token)| (token.content, id))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Self {
            inner: Arc::new(inner),
            plain: Arc::new(plain),
            specials,
            end_tokens,
            sentence_ends: Arc::default(),
        }
    }

    /// Token ids of `text`; special-token strings in it become their tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of `text` as ordinary text: special-token strings in it are spelt out with
    /// text tokens, never turned into control tokens.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .plain
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of a rendered chat prompt: special tokens written by the template become
    /// control tokens; everything else, message contents included, is ordinary text. For
    /// contents free of special-token strings the ids are those of [`TextTokenizer::encode`]
    /// on the whole text.
    pub fn encode_prompt(&self, parts: &[PromptPart]) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut run = String::new();
        for part in parts {
            match part {
                PromptPart::Content(text) => run.push_str(text),
                PromptPart::Template(text) => {
                    let mut rest = text.as_str();
                    while let Some((at, token, id)) = self.find_special(rest) {
                        run.push_str(&rest[..at]);
                        ids.extend(self.encode_text(&run)?);
                        run.clear();
                        ids.push(id);
                        rest = &rest[at + token.len()..];
                    }
                    run.push_str(rest);
                }
            }
        }
        ids.extend(self.encode_text(&run)?);
        Ok(ids)
    }

    /// The first special token in `text` (the longest one at that place): its byte offset,
    /// string and id.
    fn find_special<'a>(&'a self, text: &str) -> Option<(usize, &'a str, u32)> {
        text.char_indices().find_map(|(at, _)| {
            let rest = &text[at..];
            self.specials
                .iter()
                .find(|(token, _)| rest.starts_with(token.as_str()))
                .map(|(token, id)| (at, token.as_str(), *id))
        })
    }

    /// An incremental decoder of generated ids (special tokens left out); it holds a cheap
    /// clone of the tokenizer, so it can outlive this borrow.
    pub fn stream(&self) -> TextStream {
        TextStream {
            tokenizer: Arc::clone(&self.inner),
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Text of `ids` without special tokens.
    pub fn decode_text(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The id of a token string.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The string of a token id.
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Tokens that end an answer (end of turn, end of text).
    pub fn end_tokens(&self) -> &[u32] {
        &self.end_tokens
    }

    /// Tokens that end a sentence: the end tokens, and every token whose text starts (after
    /// white space) with a full stop, a question mark or an exclamation mark, an ellipsis
    /// excluded (`...` trails off rather than ends). Found by decoding each token once.
    pub fn sentence_end_tokens(&self) -> &[u32] {
        self.sentence_ends.get_or_init(|| {
            let mut ids: Vec<u32> = (0..self.vocab_size() as u32)
                .filter(|&id| {
                    let text = self.decode_text(&[id]).unwrap_or_default();
                    let text = text.trim_start();
                    let ellipsis = text.starts_with("..") || text.starts_with('…');
                    !ellipsis && text.starts_with(['.', '?', '!', '。', '？', '！'])
                })
                .chain(self.end_tokens.iter().copied())
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        })
    }

    /// Checks that `other` maps every id below `ids` to the same string, as a draft model must.
    pub fn check_same_vocabulary(&self, other: &TextTokenizer, ids: usize) -> Result<()> {
        for id in 0..ids as u32 {
            let (a, b) = (self.token(id), other.token(id));
            if a != b {
                return Err(Error::VocabularyMismatch(format!(
                    "token {id} is {a:?} in one and {b:?} in the other"
                )));
            }
        }
        Ok(())
    }
}

/// Incremental detokenization: each id is decoded once, with a few ids before it for context,
/// and the text it adds is returned once it is complete UTF-8 (`tokenizers`' decode-stream
/// step, on a tokenizer this stream shares).
pub struct TextStream {
    tokenizer: Arc<Tokenizer>,
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl TextStream {
    /// The text `id` completes, if any yet (a character split across ids comes with the last).
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        step_decode_stream(
            &self.tokenizer,
            vec![id],
            true,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        )
        .map_err(|e| Error::Tokenizer(e.to_string()))
    }
}

fn string_array(gguf: &GgufFile, key: &str) -> Result<Vec<String>> {
    gguf.value(key)?
        .to_vec()?
        .iter()
        .map(|v| Ok(v.to_string()?.clone()))
        .collect()
}

/// The pre-tokenizer a GGUF names, as its model's `tokenizer.json` defines it.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let split_then_bytes = |pattern: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(
            SplitPattern::Regex(pattern.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, false, false).into(),
        ])
        .into())
    };
    match pre {
        "qwen2" => split_then_bytes(QWEN2_PATTERN),
        "llama-bpe" | "llama3" => split_then_bytes(LLAMA3_PATTERN),
        "smollm" => Ok(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into()),
        "gpt2" | "gpt-2" | "default" => Ok(ByteLevel::new(false, true, true).into()),
        other => Err(Error::Tokenizer(format!(
            "GGUF pre-tokenizer `{other}` is not supported (qwen2, llama-bpe, smollm, gpt2)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `cargo xtask fuzz tokenizer-json`: `tokenizers` panicked on a syntax error
    /// inside the `decoder` entry instead of returning an error.
    #[test]
    fn a_tokenizer_json_broken_inside_its_decoder_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        for broken in [
            r#"{"decoder":{"type","ByteLevel"}}"#,
            r#"{"decoder":{"type":"ByteLevel","tr\ud800s":true}}"#,
        ] {
            std::fs::write(&path, broken).unwrap();
            let err = TextTokenizer::from_file(&path).unwrap_err();
            assert!(matches!(err, Error::Tokenizer(_)), "{err}");
        }
    }

    #[test]
    fn vocab_and_merges_files_build_the_tokenizer_with_its_added_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let vocab = dir.path().join("vocab.json");
        let merges = dir.path().join("merges.txt");
        let config = dir.path().join("tokenizer_config.json");
        std::fs::write(
            &vocab,
            r#"{"h":0,"e":1,"l":2,"o":3,"he":4,"ll":5,"hell":6,"hello":7,"Ġ":8}"#,
        )
        .unwrap();
        std::fs::write(&merges, "#version: 0.2\nh e\nl l\nhe ll\nhell o\n").unwrap();
        std::fs::write(
            &config,
            r#"{"added_tokens_decoder": {"9": {"content": "<|endoftext|>", "special": true}}}"#,
        )
        .unwrap();
        let tokenizer =
            TextTokenizer::from_vocab_and_merges(&vocab, &merges, Some(&config), "qwen2").unwrap();
        assert_eq!(tokenizer.encode("hello<|endoftext|>").unwrap(), [7, 9]);
        assert_eq!(tokenizer.encode_text("hello hell").unwrap(), [7, 8, 6]);
        assert_eq!(tokenizer.end_tokens(), [9]);
        assert_eq!(tokenizer.decode(&[7, 8, 6]).unwrap(), "hello hell");

        std::fs::write(&vocab, r#"{"h":0,"e":2}"#).unwrap();
        let err = TextTokenizer::from_vocab_and_merges(&vocab, &merges, None, "qwen2").unwrap_err();
        assert!(err.to_string().contains("no token has id 1"), "{err}");
        std::fs::write(&vocab, r#"{"h":0,"e":4294967295}"#).unwrap();
        let err = TextTokenizer::from_vocab_and_merges(&vocab, &merges, None, "qwen2").unwrap_err();
        assert!(err.to_string().contains("no token has id 1"), "{err}");
        let missing = dir.path().join("nowhere.json");
        assert!(matches!(
            TextTokenizer::from_vocab_and_merges(&missing, &merges, None, "qwen2"),
            Err(Error::Io { .. })
        ));
    }
}
