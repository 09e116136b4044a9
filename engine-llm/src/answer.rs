//! Answering: [`LanguageModel::chat`] and [`LanguageModel::chat_stream`], which streams text
//! deltas and can be cancelled, on `spec-core`'s loops (plain, draft-model speculative or
//! prediction-heads decoding) with the options of [`GenerateOptions`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::heads::check_heads;
use spec_core::{
    generate, speculate, speculative_generate, AcceptanceRule, DecodeStats, DraftLength,
    HeadsDrafter, LookupConfig, LookupDrafter, MergedDrafter, SamplingConfig, SpeculativeConfig,
    StopConditions,
};
use spec_nn::heads::MultiTokenHeads;

use crate::chat::{LanguageModel, Message};
use crate::tokenizer::{TextStream, TextTokenizer};
use crate::transformer::Transformer;
use crate::{Error, Result};

/// What a streaming callback asks for after a delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Keep answering.
    Continue,
    /// End the answer now ([`FinishReason::Cancelled`]).
    Stop,
}

/// Cancels an answer from anywhere (another thread, a user interface): clone it into
/// [`GenerateOptions::cancel_token`] and call [`CancelToken::cancel`].
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    /// Ends the answers using this token after their current token.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// How tokens are produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Speculation {
    /// One forward of the model per token.
    #[default]
    Plain,
    /// Draft-model speculative decoding with the draft given to [`LanguageModel::set_draft`]:
    /// the same tokens as plain greedy decoding, or the same distribution when sampling.
    Draft(DraftLength),
    /// Multi-token prediction heads given to [`LanguageModel::set_heads`]: their tree after each
    /// token is verified in the forward that also gives the hidden state they read next, with
    /// lookup chains of at most `lookup` tokens merged in (copied from where the last two or
    /// three tokens occurred before in the prompt or answer, [`lookup_drafter`]; 0: none).
    /// Greedy only: the same tokens as plain greedy decoding.
    Heads { lookup: usize },
    /// Prompt-lookup drafts ([`lookup_drafter`]): at most `max_draft` tokens copied from where
    /// the last two or three tokens occurred before in the prompt or answer, verified in one
    /// forward. Drafting costs no forward, so a turn without such repeats costs what plain
    /// decoding does. Greedy only: the same tokens as plain greedy decoding.
    Lookup { max_draft: usize },
}

/// The lookup drafts merged beside a chat model's heads ([`Speculation::Heads`]): at most
/// `max_draft` tokens after the last two or three tokens' latest earlier occurrence (a single
/// token's match is right too rarely to pay for its rows).
pub fn lookup_drafter(max_draft: usize) -> Result<LookupDrafter> {
    Ok(LookupDrafter::new(LookupConfig {
        max_ngram: 3,
        min_ngram: 2,
        max_draft,
    })?)
}

/// How to answer: sampling, length, stop strings, speculation, seed and cancellation.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct GenerateOptions {
    /// Temperature (0: greedy), top-k, top-p and repetition penalty.
    pub sampling: SamplingConfig,
    /// Most tokens to produce.
    pub max_tokens: usize,
    /// The answer ends before the first of these strings; no text past it is returned.
    pub stop_strings: Vec<String>,
    pub speculation: Speculation,
    /// Seed of the sampler: the same seed gives the same sampled answer.
    pub seed: u64,
    pub cancel: Option<CancelToken>,
}

impl Default for GenerateOptions {
    /// Greedy, at most 256 tokens, no stop strings, plain decoding, seed 0.
    fn default() -> Self {
        Self {
            sampling: SamplingConfig::greedy(),
            max_tokens: 256,
            stop_strings: Vec::new(),
            speculation: Speculation::Plain,
            seed: 0,
            cancel: None,
        }
    }
}

impl GenerateOptions {
    /// Softmax temperature; 0 is greedy decoding.
    pub fn temperature(mut self, temperature: f32) -> Self {
        self.sampling.temperature = temperature;
        self
    }

    /// Samples among the `k` most likely tokens only.
    pub fn top_k(mut self, k: usize) -> Self {
        self.sampling.top_k = Some(k);
        self
    }

    /// Samples among the most likely tokens whose probabilities add up to `p`.
    pub fn top_p(mut self, p: f32) -> Self {
        self.sampling.top_p = Some(p);
        self
    }

    /// Penalty > 1 for recently seen tokens.
    pub fn repetition_penalty(mut self, penalty: f32) -> Self {
        self.sampling.repetition_penalty = penalty;
        self
    }

    pub fn max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Adds a string that ends the answer.
    pub fn stop_string(mut self, stop: impl Into<String>) -> Self {
        self.stop_strings.push(stop.into());
        self
    }

    pub fn speculation(mut self, speculation: Speculation) -> Self {
        self.speculation = speculation;
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Lets `token` cancel the answer.
    pub fn cancel_token(mut self, token: CancelToken) -> Self {
        self.cancel = Some(token);
        self
    }

    fn validate(&self) -> Result<()> {
        self.sampling.validate()?;
        if self.stop_strings.iter().any(String::is_empty) {
            return Err(Error::Input("stop strings must not be empty".into()));
        }
        Ok(())
    }
}

/// Why an answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinishReason {
    /// The model ended its turn (the end token is the last of [`Answer::tokens`]).
    EndToken,
    /// [`GenerateOptions::max_tokens`] were produced.
    MaxTokens,
    /// A stop string was produced; the text ends before it.
    StopString,
    /// The callback returned [`Flow::Stop`] or the [`CancelToken`] was cancelled.
    Cancelled,
    /// The model's context is full.
    ContextFull,
}

/// A finished answer.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The text, without special tokens: exactly the deltas streamed, concatenated.
    pub text: String,
    /// Every token produced, the end token or the one completing a stop string included.
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stats: DecodeStats,
}

impl LanguageModel {
    /// Attaches a draft model for [`Speculation::Draft`]; it must share the vocabulary.
    pub fn set_draft(&mut self, draft: LanguageModel) -> Result<()> {
        self.check_draft(&draft)?;
        self.draft = Some(draft.model);
        Ok(())
    }

    /// Detaches the draft model.
    pub fn take_draft(&mut self) -> Option<Transformer> {
        self.draft.take()
    }

    /// Attaches prediction heads for [`Speculation::Heads`] (from [`LanguageModel::load_heads`],
    /// which refuses heads trained for another model); they must read this model's hidden
    /// states.
    pub fn set_heads(&mut self, heads: HeadsDrafter<MultiTokenHeads>) -> Result<()> {
        check_heads(heads.heads(), &self.model)?;
        self.heads = Some(heads);
        Ok(())
    }

    /// Detaches the heads.
    pub fn take_heads(&mut self) -> Option<HeadsDrafter<MultiTokenHeads>> {
        self.heads.take()
    }

    /// The assistant's answer to `messages`.
    pub fn chat(&mut self, messages: &[Message], options: &GenerateOptions) -> Result<Answer> {
        self.chat_stream(messages, options, |_| Flow::Continue)
    }

    /// The assistant's answer to `messages`, handing each new piece of text to `on_delta` as
    /// it is produced; `on_delta` returns [`Flow::Stop`] to cancel. The model's cache keeps
    /// the conversation, so a follow-up call with a longer history forwards only what is new.
    pub fn chat_stream(
        &mut self,
        messages: &[Message],
        options: &GenerateOptions,
        on_delta: impl FnMut(&str) -> Flow,
    ) -> Result<Answer> {
        let prompt = self.chat_prompt(messages)?;
        self.complete_stream(&prompt, options, on_delta)
    }

    /// [`LanguageModel::chat_stream`] on a prompt of token ids (e.g. raw text, encoded).
    pub fn complete_stream(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        mut on_delta: impl FnMut(&str) -> Flow,
    ) -> Result<Answer> {
        options.validate()?;
        if prompt.is_empty() {
            return Err(Error::Input("the prompt is empty".into()));
        }
        let max = spec_core::Decoder::max_len(&self.model);
        if prompt.len() > max {
            return Err(Error::PromptTooLong {
                tokens: prompt.len(),
                max,
            });
        }
        if options
            .cancel
            .as_ref()
            .is_some_and(CancelToken::is_cancelled)
        {
            return Ok(Answer {
                text: String::new(),
                tokens: Vec::new(),
                finish: FinishReason::Cancelled,
                stats: DecodeStats::default(),
            });
        }
        // Set when the answer must end early; spec-core's loops check it after every token.
        let halt = Arc::new(AtomicBool::new(false));
        let stop = {
            let (halt, cancel) = (halt.clone(), options.cancel.clone());
            StopConditions::new(options.max_tokens)
                .with_eos(self.tokenizer.end_tokens().iter().copied())
                .with_predicate(move |_| {
                    halt.load(Ordering::Relaxed)
                        || cancel.as_ref().is_some_and(CancelToken::is_cancelled)
                })
        };
        let mut rng = StdRng::seed_from_u64(options.seed);
        let mut text = Streamer::new(&self.tokenizer, &options.stop_strings);
        let mut failure = None;
        let mut on_token = |id: u32| match text.push(id, &mut on_delta) {
            Ok(Flow::Continue) => {}
            Ok(Flow::Stop) => halt.store(true, Ordering::Relaxed),
            Err(e) => {
                failure.get_or_insert(e);
                halt.store(true, Ordering::Relaxed);
            }
        };
        let generation = match &options.speculation {
            Speculation::Plain => generate(
                &mut self.model,
                prompt,
                &options.sampling,
                &stop,
                &mut rng,
                &mut on_token,
            )?,
            Speculation::Draft(length) => {
                let draft = self.draft.as_mut().ok_or_else(|| {
                    Error::Config("draft speculation needs a draft model (set_draft)".into())
                })?;
                let config = SpeculativeConfig {
                    draft_length: length.clone(),
                    rule: if options.sampling.is_greedy() {
                        AcceptanceRule::greedy()
                    } else {
                        AcceptanceRule::speculative_sampling(0.0)
                    },
                    sampling: options.sampling.clone(),
                };
                speculative_generate(
                    &mut self.model,
                    draft,
                    prompt,
                    &config,
                    &stop,
                    &mut rng,
                    &mut on_token,
                )?
            }
            Speculation::Heads { lookup } => {
                let heads = self.heads.as_ref().ok_or_else(|| {
                    Error::Config("heads speculation needs heads (set_heads)".into())
                })?;
                check_greedy("heads", &options.sampling)?;
                let greedy = AcceptanceRule::greedy();
                let mut drafter = MergedDrafter {
                    first: heads,
                    second: match lookup {
                        0 => None,
                        &most => Some(lookup_drafter(most)?),
                    },
                };
                speculate(
                    &mut self.model,
                    &mut drafter,
                    prompt,
                    spec_core::Speculation::new(&greedy),
                    &stop,
                    &mut on_token,
                )?
            }
            Speculation::Lookup { max_draft } => {
                check_greedy("lookup", &options.sampling)?;
                let mut drafter = lookup_drafter(*max_draft)?;
                speculate(
                    &mut self.model,
                    &mut drafter,
                    prompt,
                    spec_core::Speculation::new(&AcceptanceRule::greedy()),
                    &stop,
                    &mut on_token,
                )?
            }
        };
        if let Some(e) = failure {
            return Err(e);
        }
        let finish = match generation.finish {
            spec_core::FinishReason::Eos => FinishReason::EndToken,
            spec_core::FinishReason::MaxTokens => FinishReason::MaxTokens,
            spec_core::FinishReason::ContextFull => FinishReason::ContextFull,
            spec_core::FinishReason::Stop if text.stopped => FinishReason::StopString,
            spec_core::FinishReason::Stop => FinishReason::Cancelled,
        };
        let text = text.finish(&generation.tokens, finish, &mut on_delta)?;
        Ok(Answer {
            text,
            tokens: generation.tokens,
            finish,
            stats: generation.stats,
        })
    }
}

/// Tree speculation here verifies greedily: it needs greedy sampling without a penalty.
fn check_greedy(speculation: &str, sampling: &SamplingConfig) -> Result<()> {
    if !sampling.is_greedy() || sampling.has_penalty() {
        return Err(Error::Config(format!(
            "{speculation} speculation decodes greedily: set the temperature to 0 and no \
             repetition penalty"
        )));
    }
    Ok(())
}

/// Turns generated ids into text deltas: each id is decoded once, and text that may begin a
/// stop string is held back until it is known not to.
struct Streamer<'a> {
    tokenizer: &'a TextTokenizer,
    stream: TextStream,
    stops: &'a [String],
    /// Text handed out so far.
    sent: String,
    /// Decoded text held back while it may begin a stop string.
    held: String,
    /// A stop string was found.
    stopped: bool,
}

impl<'a> Streamer<'a> {
    fn new(tokenizer: &'a TextTokenizer, stops: &'a [String]) -> Self {
        Self {
            tokenizer,
            stream: tokenizer.stream(),
            stops,
            sent: String::new(),
            held: String::new(),
            stopped: false,
        }
    }

    fn push(&mut self, id: u32, on_delta: &mut impl FnMut(&str) -> Flow) -> Result<Flow> {
        let Some(piece) = self.stream.push(id)? else {
            return Ok(Flow::Continue);
        };
        self.held.push_str(&piece);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            self.held.truncate(at);
            let before = std::mem::take(&mut self.held);
            self.stopped = true;
            self.send(&before, on_delta);
            return Ok(Flow::Stop);
        }
        let ready = self.held.len() - self.stop_prefix_len();
        let text: String = self.held.drain(..ready).collect();
        Ok(self.send(&text, on_delta))
    }

    /// Length of the longest end of `held` that begins a stop string.
    fn stop_prefix_len(&self) -> usize {
        self.held
            .char_indices()
            .map(|(at, _)| at)
            .find(|&at| self.stops.iter().any(|s| s.starts_with(&self.held[at..])))
            .map_or(0, |at| self.held.len() - at)
    }

    fn send(&mut self, text: &str, on_delta: &mut impl FnMut(&str) -> Flow) -> Flow {
        if text.is_empty() {
            return Flow::Continue;
        }
        self.sent.push_str(text);
        on_delta(text)
    }

    /// The answer's text; unless it was cut short, text still held back (or not yet complete
    /// UTF-8 in the stream) is handed out first.
    fn finish(
        mut self,
        tokens: &[u32],
        finish: FinishReason,
        on_delta: &mut impl FnMut(&str) -> Flow,
    ) -> Result<String> {
        if matches!(finish, FinishReason::StopString | FinishReason::Cancelled) {
            return Ok(self.sent);
        }
        let full = self.tokenizer.decode_text(tokens)?;
        let rest = match full.strip_prefix(self.sent.as_str()) {
            Some(rest) => rest.to_string(),
            None => std::mem::take(&mut self.held),
        };
        self.send(&rest, on_delta);
        Ok(self.sent)
    }
}
