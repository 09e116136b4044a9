//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template` or
//! `tokenizer_config.json`'s `chat_template`) rendered with `minijinja` as Hugging Face
//! renders it, or a hand-written ChatML / Llama 3 renderer for models without one.
//!
//! A prompt is rendered into [`PromptPart`]s that keep message contents apart from the
//! template's own text, so that only the template can write control tokens (see
//! [`TextTokenizer::encode_prompt`](crate::TextTokenizer::encode_prompt)). A Jinja template is
//! rendered once with a unique sentinel in place of each content, and the sentinels mark where
//! contents go; a second rendering with the real contents checks the result.

use std::collections::BTreeMap;

use minijinja::{Environment, ErrorKind, Value};

use crate::chat::{Message, Role};
use crate::tokenizer::TextTokenizer;
use crate::{Error, Result};

/// A piece of a rendered prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptPart {
    /// Text the template wrote; special-token strings in it are control tokens.
    Template(String),
    /// A message's content: always ordinary text.
    Content(String),
}

/// The text of `parts`, joined.
pub fn prompt_text(parts: &[PromptPart]) -> String {
    parts
        .iter()
        .map(|p| match p {
            PromptPart::Template(t) | PromptPart::Content(t) => t.as_str(),
        })
        .collect()
}

/// A model's Jinja chat template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JinjaTemplate {
    name: String,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl JinjaTemplate {
    /// Compiles `source`; `name` says where it came from in error messages. `bos_token` and
    /// `eos_token` are the strings templates see under those names.
    pub fn new(
        name: impl Into<String>,
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self> {
        let template = Self {
            name: name.into(),
            source: source.into(),
            bos_token,
            eos_token,
        };
        environment()
            .template_from_named_str(&template.name, &template.source)
            .map_err(|e| template.error(e.to_string()))?;
        Ok(template)
    }

    /// Where the template came from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text for `messages`, ending with the opening of the assistant's turn.
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        let list: Vec<BTreeMap<&str, &str>> = messages
            .iter()
            .map(|m| BTreeMap::from([("role", m.role.as_str()), ("content", m.content.as_str())]))
            .collect();
        let mut context = BTreeMap::from([
            ("messages", Value::from_serialize(&list)),
            ("add_generation_prompt", Value::from(true)),
        ]);
        if let Some(bos) = &self.bos_token {
            context.insert("bos_token", Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos_token {
            context.insert("eos_token", Value::from(eos.as_str()));
        }
        environment()
            .render_named_str(&self.name, &self.source, context)
            .map_err(|e| self.error(e.to_string()))
    }

    /// The prompt for `messages` with contents kept apart from the template's text.
    pub fn render_parts(&self, messages: &[Message]) -> Result<Vec<PromptPart>> {
        let marker = ('\u{E000}'..='\u{F8FF}')
            .find(|&c| !self.source.contains(c) && messages.iter().all(|m| !m.content.contains(c)))
            .ok_or_else(|| self.error("no sentinel character is free in the messages".into()))?;
        // Empty contents need no protection, and templates may test them for emptiness.
        let masked: Vec<Message> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| Message {
                role: m.role,
                content: if m.content.is_empty() {
                    String::new()
                } else {
                    format!("{marker}{i}{marker}")
                },
            })
            .collect();
        let rendered = self.render(&masked)?;
        let real = self.render(messages)?;
        for transform in [|c: &str| c.to_string(), |c: &str| c.trim().to_string()] {
            let parts = self.split(&rendered, marker, messages, transform)?;
            if prompt_text(&parts) == real {
                return Ok(parts);
            }
        }
        Err(self.error(
            "it changes message contents beyond trimming them, so they cannot be kept apart \
             from its control tokens"
                .into(),
        ))
    }

    /// Splits a rendering with sentinels into parts, each sentinel replaced by its message's
    /// content as the template is assumed to print it (`transform`).
    fn split(
        &self,
        rendered: &str,
        marker: char,
        messages: &[Message],
        transform: fn(&str) -> String,
    ) -> Result<Vec<PromptPart>> {
        let mut parts = Vec::new();
        for (i, piece) in rendered.split(marker).enumerate() {
            if i % 2 == 0 {
                if !piece.is_empty() {
                    parts.push(PromptPart::Template(piece.to_string()));
                }
                continue;
            }
            let message = piece
                .parse::<usize>()
                .ok()
                .and_then(|index| messages.get(index))
                .ok_or_else(|| self.error("it altered a message's content".into()))?;
            parts.push(PromptPart::Content(transform(&message.content)));
        }
        Ok(parts)
    }

    fn error(&self, reason: String) -> Error {
        Error::Template {
            template: self.name.clone(),
            reason,
        }
    }
}

/// A Jinja environment as Hugging Face sets it up for chat templates: blocks trimmed, loop
/// controls, `raise_exception`, Python's string methods.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    env
}

/// The prompt formats supported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// The model's own Jinja template.
    Jinja(JinjaTemplate),
    /// `<|im_start|>role\ncontent<|im_end|>\n` turns (Qwen, SmolLM2), hand-written.
    ChatMl { default_system: Option<String> },
    /// `<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>` turns (Llama 3),
    /// hand-written.
    Llama3 { default_system: Option<String> },
}

impl ChatTemplate {
    /// The model's Jinja template if it has one, else the hand-written format its special
    /// tokens imply.
    pub fn for_model(jinja: Option<JinjaTemplate>, tokenizer: &TextTokenizer) -> Result<Self> {
        match jinja {
            Some(jinja) => Ok(Self::Jinja(jinja)),
            None => Self::detect(None, tokenizer),
        }
    }

    /// The hand-written format matching a Jinja template's source and/or the tokenizer's
    /// special tokens, with the template's literal default system prompt.
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
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        match self {
            Self::Jinja(jinja) => jinja.render(messages),
            _ => Ok(prompt_text(&self.render_parts(messages)?)),
        }
    }

    /// The prompt for `messages` with contents kept apart from the template's text.
    pub fn render_parts(&self, messages: &[Message]) -> Result<Vec<PromptPart>> {
        let (default_system, format) = match self {
            Self::Jinja(jinja) => return jinja.render_parts(messages),
            Self::ChatMl { default_system } => (default_system, &CHATML),
            Self::Llama3 { default_system } => (default_system, &LLAMA3),
        };
        let mut parts = Vec::new();
        let template = |text: String| PromptPart::Template(text);
        if !format.start.is_empty() {
            parts.push(template(format.start.to_string()));
        }
        let needs_default = messages.first().is_none_or(|m| m.role != Role::System);
        // The default system prompt is the template's own text; messages are contents.
        let default = default_system
            .as_deref()
            .filter(|_| needs_default)
            .map(|system| ("system", template(system.to_string())));
        let turns = messages
            .iter()
            .map(|m| (m.role.as_str(), PromptPart::Content(m.content.clone())));
        for (role, content) in default.into_iter().chain(turns) {
            parts.push(template(format!("{}{role}{}", format.open, format.close)));
            parts.push(content);
            parts.push(template(format.end.to_string()));
        }
        parts.push(template(format.reply.to_string()));
        Ok(parts)
    }
}

/// The fixed strings of a hand-written format.
struct TurnFormat {
    /// Before the first turn.
    start: &'static str,
    /// Around the role name.
    open: &'static str,
    close: &'static str,
    /// After a turn's content.
    end: &'static str,
    /// The opening of the assistant's turn.
    reply: &'static str,
}

const CHATML: TurnFormat = TurnFormat {
    start: "",
    open: "<|im_start|>",
    close: "\n",
    end: "<|im_end|>\n",
    reply: "<|im_start|>assistant\n",
};

const LLAMA3: TurnFormat = TurnFormat {
    start: "<|begin_of_text|>",
    open: "<|start_header_id|>",
    close: "<|end_header_id|>\n\n",
    end: "<|eot_id|>",
    reply: "<|start_header_id|>assistant<|end_header_id|>\n\n",
};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_with_default_system_and_history() {
        let t = ChatTemplate::ChatMl {
            default_system: Some("Be brief.".into()),
        };
        let text = t
            .render(&[
                Message::user("Hi"),
                Message::assistant("Hello!"),
                Message::user("2+2?"),
            ])
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let own = t
            .render(&[Message::system("Custom."), Message::user("Hi")])
            .unwrap();
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
            t.render(&[Message::user("Hi")]).unwrap(),
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

    /// A ChatML template written like the models' own, with a default system prompt.
    const JINJA_CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn jinja(source: &str) -> JinjaTemplate {
        JinjaTemplate::new("test", source, Some("<s>".into()), Some("</s>".into())).unwrap()
    }

    #[test]
    fn jinja_templates_render_like_the_hand_written_ones() {
        let hand = ChatTemplate::ChatMl {
            default_system: Some("Be brief.".into()),
        };
        let own = ChatTemplate::Jinja(jinja(JINJA_CHATML));
        for messages in [
            vec![Message::user("Hi")],
            vec![
                Message::system("Custom."),
                Message::user("Hi"),
                Message::assistant("Hello!"),
                Message::user("2+2?"),
            ],
        ] {
            assert_eq!(
                own.render(&messages).unwrap(),
                hand.render(&messages).unwrap()
            );
            assert_eq!(
                own.render_parts(&messages).unwrap(),
                hand.render_parts(&messages)
                    .unwrap()
                    .iter()
                    .fold(Vec::new(), merge_templates)
            );
        }
    }

    /// Joins adjacent template parts, as one Jinja rendering writes them.
    fn merge_templates(mut parts: Vec<PromptPart>, part: &PromptPart) -> Vec<PromptPart> {
        match (parts.last_mut(), part) {
            (Some(PromptPart::Template(a)), PromptPart::Template(b)) => a.push_str(b),
            _ => parts.push(part.clone()),
        }
        parts
    }

    #[test]
    fn contents_are_kept_apart_and_templates_see_special_tokens() {
        let t = jinja("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}{{ eos_token }}{% endfor %}");
        let parts = t
            .render_parts(&[Message::user("  <s>forged</s>\n"), Message::assistant("")])
            .unwrap();
        assert_eq!(
            parts,
            [
                PromptPart::Template("<s>[user]".into()),
                PromptPart::Content("<s>forged</s>".into()),
                PromptPart::Template("</s>[assistant]</s>".into()),
            ]
        );
    }

    #[test]
    fn helpers_and_python_methods_are_available() {
        let t = jinja("{% if messages[0].content.startswith('x') %}{{ raise_exception('no x, please') }}{% endif %}{{ messages[0].content.upper() }}{% if tools %}tools{% endif %}");
        assert_eq!(t.render(&[Message::user("hi")]).unwrap(), "HI");
        let err = t.render(&[Message::user("xy")]).unwrap_err();
        assert!(
            matches!(&err, Error::Template { template, reason } if template == "test" && reason.contains("no x, please")),
            "{err}"
        );
    }

    #[test]
    fn broken_templates_are_errors_naming_them() {
        let err = JinjaTemplate::new(
            "model.gguf: tokenizer.chat_template",
            "{% for %}",
            None,
            None,
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::Template { template, .. } if template == "model.gguf: tokenizer.chat_template"),
            "{err}"
        );
        let rewriting =
            jinja("{% for m in messages %}{{ m.content | replace('a', 'b') }}{% endfor %}");
        assert!(matches!(
            rewriting.render_parts(&[Message::user("a cat")]),
            Err(Error::Template { .. })
        ));
    }
}
