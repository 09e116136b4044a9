//! The streaming API: feed source updates, get each update's full output, what to display,
//! and its statistics.

use std::time::Duration;

use engine_llm::{LanguageModel, Message};
use spec_core::Decoder;

use crate::error::{Error, Result};
use crate::metrics::{display_units, normalized_erasure};
use crate::ssbd::{decode_update, Decoding, UpdateDecode};
use spec_voice::Partial;

/// What to translate from and into, as a chat LLM is asked to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TranslationTask {
    pub source_language: String,
    pub target_language: String,
}

impl TranslationTask {
    pub fn new(source_language: impl Into<String>, target_language: impl Into<String>) -> Self {
        TranslationTask {
            source_language: source_language.into(),
            target_language: target_language.into(),
        }
    }

    /// The chat turns asking for the translation of `source`.
    pub fn messages(&self, source: &str) -> Vec<Message> {
        vec![
            Message::system(format!(
                "You are a professional {} to {} translator. Reply with the translation only.",
                self.source_language, self.target_language
            )),
            Message::user(format!(
                "Translate into {}:\n{}",
                self.target_language,
                source.trim()
            )),
        ]
    }

    /// Whether the target language is written without spaces between words, so that flicker is
    /// counted in characters rather than words.
    pub fn target_uses_characters(&self) -> bool {
        let language = self.target_language.to_lowercase();
        ["chinese", "japanese", "thai", "mandarin", "cantonese"]
            .iter()
            .any(|l| language.contains(l))
    }
}

/// How the previous output is trimmed (mask-k) or hidden (display-only mask-k).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Masking {
    #[default]
    None,
    /// mask-k: drop the last k tokens of the draft before verifying it.
    Draft(usize),
    /// Display-only mask-k: verify the whole draft, hide the last k tokens of a non-final
    /// output (the paper's recommendation: less flicker at no cost in speed).
    Display(usize),
}

/// Settings of a [`LiveTranslator`].
#[derive(Clone, Debug, PartialEq)]
pub struct LiveConfig {
    pub task: TranslationTask,
    pub decoding: Decoding,
    pub masking: Masking,
    /// Most tokens in one output.
    pub max_tokens: usize,
    /// Draft length of the assistant model, when one is attached.
    pub assistant_gamma: usize,
    /// Verify the final update of a sentence without bias: with `Ssbd { beta }`, the final
    /// update is decoded with `Ssbd { beta: 0.0 }`, still drafted by the previous output (so it
    /// stays fast), while the non-final updates keep β. The bias then only steadies the partial
    /// captions, and the committed translation is exactly autoregressive re-translation's. Off,
    /// the final update is biased too (the paper's setting) and may keep earlier phrasings the
    /// model would revise. No effect on [`Decoding::Autoregressive`].
    pub unbiased_final: bool,
}

impl LiveConfig {
    /// English → `target_language` with SSBD at the paper's default β = 0.2, display-only
    /// mask-3, and an unbiased final update: the bias steadies what is shown while the sentence
    /// grows, but the committed caption is exactly the model's own translation of the whole
    /// sentence (what autoregressive re-translation gives), never a stale phrasing the bias kept.
    pub fn new(target_language: impl Into<String>) -> Self {
        LiveConfig {
            task: TranslationTask::new("English", target_language),
            decoding: Decoding::Ssbd { beta: 0.2 },
            masking: Masking::Display(3),
            max_tokens: 128,
            assistant_gamma: 3,
            unbiased_final: true,
        }
    }

    /// How an update is decoded: [`LiveConfig::decoding`], except that a final update under
    /// SSBD is verified with β = 0 when [`LiveConfig::unbiased_final`] is set.
    pub fn decoding_for(&self, is_final: bool) -> Decoding {
        match self.decoding {
            Decoding::Ssbd { .. } if is_final && self.unbiased_final => {
                Decoding::Ssbd { beta: 0.0 }
            }
            ref decoding => decoding.clone(),
        }
    }

    fn validate(&self) -> Result<()> {
        if let Decoding::Ssbd { beta } = self.decoding {
            if !(0.0..=1.0).contains(&beta) {
                return Err(Error::Config(format!("β must be in [0, 1], got {beta}")));
            }
        }
        if self.max_tokens == 0 {
            return Err(Error::Config("max_tokens must be at least 1".into()));
        }
        if self.assistant_gamma == 0 {
            return Err(Error::Config("assistant_gamma must be at least 1".into()));
        }
        Ok(())
    }
}

/// The result of one source update.
#[derive(Clone, Debug, PartialEq)]
pub struct Caption {
    /// The whole translation of this update.
    pub output: String,
    /// What to show: the output, less the masked tail of a non-final update.
    pub display: String,
    pub is_final: bool,
    pub decode: UpdateDecode,
}

/// Re-translates a growing source, each update drafted by the previous translation.
pub struct LiveTranslator<'m> {
    model: &'m mut LanguageModel,
    assistant: Option<&'m mut LanguageModel>,
    config: LiveConfig,
    previous: Vec<u32>,
}

impl<'m> LiveTranslator<'m> {
    pub fn new(model: &'m mut LanguageModel, config: LiveConfig) -> Result<Self> {
        config.validate()?;
        Ok(LiveTranslator {
            model,
            assistant: None,
            config,
            previous: Vec::new(),
        })
    }

    /// Lets a small model of the same vocabulary speculate the tokens after the point where the
    /// new translation leaves the previous one (SSBD + draft-model speculative decoding; still
    /// exactly greedy at β = 0).
    pub fn with_assistant(mut self, assistant: &'m mut LanguageModel) -> Result<Self> {
        self.model.check_draft(assistant)?;
        self.assistant = Some(assistant);
        Ok(self)
    }

    pub fn config(&self) -> &LiveConfig {
        &self.config
    }

    /// Translates one update of the source.
    pub fn update(&mut self, update: &Partial) -> Result<Caption> {
        if update.text.trim().is_empty() {
            return Err(Error::Input("an empty source update".into()));
        }
        let prompt = self
            .model
            .chat_prompt(&self.config.task.messages(&update.text))?;
        let keep = match self.config.masking {
            Masking::Draft(k) => self.previous.len().saturating_sub(k),
            _ => self.previous.len(),
        };
        let draft = &self.previous[..keep];
        let assistant = self.assistant.as_deref_mut().map(|a| {
            (
                &mut a.model as &mut dyn Decoder,
                self.config.assistant_gamma,
            )
        });
        let decode = decode_update(
            &mut self.model.model,
            assistant,
            &prompt,
            draft,
            &self.config.decoding_for(update.is_final),
            self.model.tokenizer.end_tokens(),
            self.config.max_tokens,
        )?;
        let tokenizer = &self.model.tokenizer;
        let output = tokenizer.decode_text(&decode.tokens)?;
        let display = match self.config.masking {
            Masking::Display(k) if !update.is_final => {
                let shown = &decode.tokens[..decode.tokens.len().saturating_sub(k)];
                // A cut inside a multi-byte character decodes to U+FFFD: do not show it.
                let text = tokenizer.decode_text(shown)?;
                text.trim_end_matches('\u{FFFD}').to_string()
            }
            _ => output.clone(),
        };
        self.previous = if update.is_final {
            Vec::new()
        } else {
            decode.tokens.clone()
        };
        Ok(Caption {
            output: output.trim().to_string(),
            display: display.trim().to_string(),
            is_final: update.is_final,
            decode,
        })
    }

    /// Forgets the previous output (a new sentence without a final update before it).
    pub fn reset(&mut self) {
        self.previous.clear();
    }

    /// Translates every update of one sentence.
    pub fn sentence(&mut self, updates: &[Partial]) -> Result<Vec<Caption>> {
        self.reset();
        updates.iter().map(|u| self.update(u)).collect()
    }
}

/// Totals over the captions of one or more sentences.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamSummary {
    pub updates: usize,
    pub output_tokens: usize,
    pub drafted: usize,
    pub accepted: usize,
    pub target_forwards: usize,
    pub draft_forwards: usize,
    pub time: Duration,
    /// Σ of erased display units over the sentences, and Σ of final display lengths.
    pub erased_units: f64,
    pub final_units: usize,
}

impl StreamSummary {
    /// Adds one sentence's captions; display units are words, or characters when
    /// `by_characters`.
    pub fn add_sentence(&mut self, captions: &[Caption], by_characters: bool) {
        let displays: Vec<Vec<String>> = captions
            .iter()
            .map(|c| display_units(&c.display, by_characters))
            .collect();
        let final_units = displays.last().map_or(0, Vec::len);
        self.erased_units += normalized_erasure(&displays) * final_units as f64;
        self.final_units += final_units;
        for caption in captions {
            let d = &caption.decode;
            self.updates += 1;
            self.output_tokens += d.tokens.len();
            self.drafted += d.drafted;
            self.accepted += d.accepted;
            self.target_forwards += d.target_forwards;
            self.draft_forwards += d.draft_forwards;
            self.time += d.time;
        }
    }

    /// Normalized erasure over everything added (erased units over final display units).
    pub fn normalized_erasure(&self) -> f64 {
        if self.final_units == 0 {
            0.0
        } else {
            self.erased_units / self.final_units as f64
        }
    }

    /// Accepted over drafted tokens (A/D).
    pub fn accepted_per_drafted(&self) -> f64 {
        ratio(self.accepted, self.drafted)
    }

    /// Accepted over output tokens (A/O).
    pub fn accepted_per_output(&self) -> f64 {
        ratio(self.accepted, self.output_tokens)
    }

    /// Output tokens per second of compute.
    pub fn tokens_per_second(&self) -> f64 {
        self.output_tokens as f64 / self.time.as_secs_f64().max(1e-9)
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
