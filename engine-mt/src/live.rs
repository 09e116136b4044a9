//! The streaming API: feed source updates, get each update's full output, what to display,
//! and its statistics.

use std::time::Duration;

use engine_llm::{forward_costs, LanguageModel, Message, TextTokenizer};
use spec_core::{AcceptanceRate, ForwardCosts, LookupDrafter};

use crate::bias::{AdaptiveBias, BiasInputs};
use crate::display::{DisplayPolicy, DisplayStage, UpdateView};
use crate::error::{Error, Result};
use crate::metrics::{
    caption_times, display_units, normalized_erasure, stable_caption_delays, word_arrivals,
};
use crate::ssbd::{decode_update, Continuation, Decoding, UpdateDecode};
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

/// How much of the previous output drafts the next update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Masking {
    #[default]
    None,
    /// mask-k: drop the last k tokens of the draft before verifying it. (Display-only mask-k,
    /// which verifies the whole draft and only hides the tail, is [`DisplayPolicy::mask_k`].)
    Draft(usize),
}

/// Settings of a [`LiveTranslator`].
#[derive(Clone, Debug, PartialEq)]
pub struct LiveConfig {
    pub task: TranslationTask,
    pub decoding: Decoding,
    pub masking: Masking,
    /// What each caption shows of its output ([`DisplayPolicy`]). Partial captions show whole
    /// words only: a word cut by the policy is hidden until it is shown whole.
    pub display: DisplayPolicy,
    /// With `Some`, each update's β is chosen by the adaptive rule ([`AdaptiveBias`]), at most
    /// [`Decoding::Ssbd`]'s β (β = 0 stays exact). No effect on [`Decoding::Autoregressive`].
    pub adaptive_bias: Option<AdaptiveBias>,
    /// Most tokens the rest of the previous output drafts at once after the divergence
    /// ([`Continuation::Lookup`]), cut to what the model's measured forward costs and the
    /// acceptance so far pay for; 0 decodes one token per forward there. SSBD only:
    /// [`Decoding::Autoregressive`] stays plain re-translation. An attached assistant model
    /// drafts instead.
    pub lookup_draft: usize,
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
    /// English → `target_language`, tuned for live captions on short and long sentences
    /// (`bench_mt`, both sets): SSBD with the adaptive bias ([`AdaptiveBias::default`]: none up
    /// to 8 source words, rising to β = 0.5 at 16), the previous output drafting again after
    /// the divergence (up to 4 tokens), an unbiased final update (the committed caption is
    /// exactly autoregressive re-translation's), and partial captions that hide the ending the
    /// model gave the unfinished sentence and stop at the first token with a biased probability
    /// below 0.2 ([`DisplayPolicy::open_end`] + [`DisplayPolicy::stability`]). On the short set
    /// this steadies the captions without delaying them (the bias there only kept phrasings the
    /// final update took back); the paper's β = 0.2 with display-only mask-3, the previous
    /// default, flickered more and settled later on both sets.
    pub fn new(target_language: impl Into<String>) -> Self {
        LiveConfig {
            task: TranslationTask::new("English", target_language),
            decoding: Decoding::Ssbd { beta: 0.5 },
            masking: Masking::None,
            display: DisplayPolicy::all_of([
                DisplayPolicy::open_end(),
                DisplayPolicy::stability(0.2),
            ]),
            adaptive_bias: Some(AdaptiveBias::default()),
            lookup_draft: 4,
            max_tokens: 128,
            assistant_gamma: 3,
            unbiased_final: true,
        }
    }

    /// English → `target_language` by plain autoregressive re-translation, the baseline SSBD
    /// is measured against: every update decoded greedily from scratch and shown whole.
    pub fn autoregressive(target_language: impl Into<String>) -> Self {
        LiveConfig {
            decoding: Decoding::Autoregressive,
            masking: Masking::None,
            display: DisplayPolicy::full(),
            adaptive_bias: None,
            lookup_draft: 0,
            ..Self::new(target_language)
        }
    }

    /// How an update is decoded: [`LiveConfig::decoding`] with β scaled by
    /// [`LiveConfig::adaptive_bias`] when set, except that a final update under SSBD is
    /// verified with β = 0 when [`LiveConfig::unbiased_final`] is set.
    pub fn decoding_for(&self, is_final: bool, inputs: &BiasInputs) -> Decoding {
        match self.decoding {
            Decoding::Ssbd { .. } if is_final && self.unbiased_final => {
                Decoding::Ssbd { beta: 0.0 }
            }
            Decoding::Ssbd { beta } => Decoding::Ssbd {
                beta: self.adaptive_bias.map_or(beta, |a| a.beta(beta, inputs)),
            },
            Decoding::Autoregressive => Decoding::Autoregressive,
        }
    }

    /// Whether the tokens after the divergence are drafted by lookup ([`Continuation::Lookup`]):
    /// SSBD with [`LiveConfig::lookup_draft`] > 0.
    fn uses_lookup(&self) -> bool {
        self.lookup_draft > 0 && matches!(self.decoding, Decoding::Ssbd { .. })
    }

    fn validate(&self) -> Result<()> {
        if let Decoding::Ssbd { beta } = self.decoding {
            if !(0.0..=1.0).contains(&beta) {
                return Err(Error::Config(format!("β must be in [0, 1], got {beta}")));
            }
        }
        if let Some(adaptive) = &self.adaptive_bias {
            adaptive.validate().map_err(Error::Config)?;
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
    /// What to show: the output as far as the display policy allows (all of it when final).
    pub display: String,
    pub is_final: bool,
    /// The bias this update was verified with (0 without a draft or for AR re-translation).
    pub beta: f32,
    pub decode: UpdateDecode,
}

/// Re-translates a growing source, each update drafted by the previous translation.
pub struct LiveTranslator<'m> {
    model: &'m mut LanguageModel,
    assistant: Option<&'m mut LanguageModel>,
    config: LiveConfig,
    display: DisplayPolicy,
    previous: Vec<u32>,
    previous_source: String,
    accepted_so_far: usize,
    forced_so_far: usize,
    /// The target's measured forward costs, when the lookup continuation is on: its drafts are
    /// cut to the length they pay for.
    lookup_costs: Option<ForwardCosts>,
    /// The lookup continuation's acceptance so far, of its lookups and of the target's own
    /// guesses, carried from update to update.
    lookup_acceptance: Option<AcceptanceRate>,
    guess_acceptance: Option<AcceptanceRate>,
}

impl<'m> LiveTranslator<'m> {
    pub fn new(model: &'m mut LanguageModel, config: LiveConfig) -> Result<Self> {
        config.validate()?;
        let lookup_costs = match config.uses_lookup() {
            true => Some(
                forward_costs(&mut model.model, &model.weights).map_err(engine_llm::Error::from)?,
            ),
            false => None,
        };
        Ok(LiveTranslator {
            model,
            assistant: None,
            display: config.display.clone(),
            config,
            previous: Vec::new(),
            previous_source: String::new(),
            accepted_so_far: 0,
            forced_so_far: 0,
            lookup_costs,
            lookup_acceptance: None,
            guess_acceptance: None,
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
            Masking::None => self.previous.len(),
        };
        let draft = &self.previous[..keep];
        let inputs = self.bias_inputs(&update.text);
        let decoding = self.config.decoding_for(update.is_final, &inputs);
        let mut lookup = match self.assistant.is_none() && self.config.uses_lookup() {
            true => Some(self.lookup_drafter()?),
            false => None,
        };
        let continuation = match (self.assistant.as_deref_mut(), lookup.as_mut()) {
            (Some(assistant), _) => Continuation::Assistant {
                model: &mut assistant.model,
                gamma: self.config.assistant_gamma,
            },
            (None, Some(drafter)) => Continuation::Lookup(drafter),
            (None, None) => Continuation::Greedy,
        };
        let decode = decode_update(
            &mut self.model.model,
            continuation,
            &prompt,
            draft,
            &decoding,
            self.model.tokenizer.end_tokens(),
            self.config.max_tokens,
        )?;
        if let Some(drafter) = lookup {
            self.lookup_acceptance = Some(drafter.acceptance());
            self.guess_acceptance = Some(drafter.guess_acceptance());
        }
        let tokenizer = &self.model.tokenizer;
        let output = tokenizer.decode_text(&decode.tokens)?;
        let pieces = token_pieces(tokenizer, &decode.tokens)?;
        let shown = self.display.shown(&UpdateView {
            tokens: &decode.tokens,
            confidence: &decode.confidence,
            pieces: &pieces,
            is_final: update.is_final,
        });
        let by_characters = self.config.task.target_uses_characters();
        let display = display_text(tokenizer, &decode.tokens, shown, by_characters)?;
        let beta = match decoding {
            Decoding::Ssbd { beta } if decode.drafted > 0 => beta,
            _ => 0.0,
        };
        self.accepted_so_far += decode.accepted;
        self.forced_so_far += decode.forced;
        if update.is_final {
            self.start_sentence();
        } else {
            self.previous = decode.tokens.clone();
            self.previous_source = update.text.clone();
        }
        Ok(Caption {
            output: output.trim().to_string(),
            display,
            is_final: update.is_final,
            beta,
            decode,
        })
    }

    /// The lookup continuation's drafter for one update: the previous output is its reference,
    /// and it starts from the acceptance observed so far.
    fn lookup_drafter(&self) -> Result<LookupDrafter> {
        let mut drafter = LookupDrafter::continuing(
            self.config.lookup_draft,
            self.lookup_costs.as_ref(),
            self.lookup_acceptance,
        )?;
        if let Some(acceptance) = self.guess_acceptance {
            drafter = drafter.with_guess_acceptance(acceptance);
        }
        drafter.add_reference(self.previous.clone());
        Ok(drafter)
    }

    /// What the adaptive bias knows of an update of `source`.
    fn bias_inputs(&self, source: &str) -> BiasInputs {
        let words: Vec<&str> = source.split_whitespace().collect();
        let kept = words
            .iter()
            .zip(self.previous_source.split_whitespace())
            .take_while(|(a, b)| *a == b)
            .count();
        BiasInputs {
            source_words: words.len(),
            changed_words: words.len() - kept,
            accepted_so_far: self.accepted_so_far,
            forced_so_far: self.forced_so_far,
        }
    }

    fn start_sentence(&mut self) {
        self.previous.clear();
        self.previous_source.clear();
        self.accepted_so_far = 0;
        self.forced_so_far = 0;
        self.display.reset();
    }

    /// Forgets the previous output (a new sentence without a final update before it).
    pub fn reset(&mut self) {
        self.start_sentence();
    }

    /// Translates every update of one sentence.
    pub fn sentence(&mut self, updates: &[Partial]) -> Result<Vec<Caption>> {
        self.reset();
        updates.iter().map(|u| self.update(u)).collect()
    }
}

/// The caption text of an output of which a display policy shows `shown` tokens: the whole
/// output when every token is shown, else the shown tokens less a character cut in two and, for
/// scripts with spaces between words (not `by_characters`), less a last word the output
/// continues. Trimmed.
pub fn display_text(
    tokenizer: &TextTokenizer,
    tokens: &[u32],
    shown: usize,
    by_characters: bool,
) -> Result<String> {
    let output = tokenizer.decode_text(tokens)?;
    if shown >= tokens.len() {
        return Ok(output.trim().to_string());
    }
    let text = tokenizer.decode_text(&tokens[..shown])?;
    // A cut inside a multi-byte character decodes to U+FFFD: do not show it.
    let text = text.trim_end_matches('\u{FFFD}');
    let text = if by_characters {
        text
    } else {
        whole_words(text, &output)
    };
    Ok(text.trim().to_string())
}

/// What `policy` would have shown of a sentence's `captions` (from its first update; the
/// policy starts afresh): replays a sentence under another display without decoding it again.
pub fn replay_display(
    tokenizer: &TextTokenizer,
    policy: &DisplayPolicy,
    captions: &[Caption],
    by_characters: bool,
) -> Result<Vec<String>> {
    let mut policy = policy.clone();
    policy.reset();
    captions
        .iter()
        .map(|c| {
            let pieces = token_pieces(tokenizer, &c.decode.tokens)?;
            let shown = policy.shown(&UpdateView {
                tokens: &c.decode.tokens,
                confidence: &c.decode.confidence,
                pieces: &pieces,
                is_final: c.is_final,
            });
            display_text(tokenizer, &c.decode.tokens, shown, by_characters)
        })
        .collect()
}

/// Each token's text.
fn token_pieces(tokenizer: &TextTokenizer, tokens: &[u32]) -> Result<Vec<String>> {
    Ok(tokens
        .iter()
        .map(|&t| tokenizer.decode_text(&[t]))
        .collect::<std::result::Result<_, _>>()?)
}

/// `shown`, a prefix of `output`, less a last word that `output` continues: a partial caption
/// shows whole words only.
fn whole_words<'a>(shown: &'a str, output: &str) -> &'a str {
    match output.strip_prefix(shown) {
        Some(rest)
            if rest.starts_with(|c: char| !c.is_whitespace())
                && !shown.ends_with(char::is_whitespace) =>
        {
            shown.trim_end_matches(|c: char| !c.is_whitespace())
        }
        _ => shown,
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
    /// Σ of erased display units over the sentences, and Σ of final display units.
    pub erased_units: f64,
    pub final_units: usize,
    /// Σ over the final display units of timed sentences of their time to a stable caption
    /// ([`stable_caption_delays`]), captions timed by [`caption_times`] from the updates'
    /// arrivals and compute times, and the number of those units.
    pub stable_delay: Duration,
    pub stable_units: usize,
    /// Σ over timed sentences of the time from the last update's arrival to the final caption,
    /// and their number.
    pub final_delay: Duration,
    pub timed_sentences: usize,
}

impl StreamSummary {
    /// Adds one sentence's captions; display units are words, or characters when
    /// `by_characters`. Without the updates' arrival times the caption timing (time to a stable
    /// caption, final caption delay) is not counted: see [`StreamSummary::add_timed_sentence`].
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

    /// [`StreamSummary::add_sentence`], and the captions' timing: `captions[i]` translates
    /// `updates[i]`, which arrived at `updates[i].at`.
    pub fn add_timed_sentence(
        &mut self,
        updates: &[Partial],
        captions: &[Caption],
        by_characters: bool,
    ) {
        self.add_sentence(captions, by_characters);
        let arrivals: Vec<Duration> = updates.iter().map(|u| u.at).collect();
        let compute: Vec<Duration> = captions.iter().map(|c| c.decode.time).collect();
        let shown = caption_times(&arrivals, &compute);
        let timed: Vec<(Duration, Vec<String>)> = shown
            .iter()
            .zip(captions)
            .map(|(&at, c)| (at, display_units(&c.display, by_characters)))
            .collect();
        self.stable_delay += stable_caption_delays(&timed, &word_arrivals(updates))
            .iter()
            .sum::<Duration>();
        self.stable_units += timed.last().map_or(0, |(_, units)| units.len());
        if let (Some(&last_shown), Some(&last_arrival)) = (shown.last(), arrivals.last()) {
            self.final_delay += last_shown.saturating_sub(last_arrival);
        }
        self.timed_sentences += 1;
    }

    /// Mean time to a stable caption over the final display units.
    pub fn time_to_stable(&self) -> Duration {
        self.stable_delay / self.stable_units.max(1) as u32
    }

    /// Mean time from a sentence's last update to its final caption.
    pub fn final_caption_delay(&self) -> Duration {
        self.final_delay / self.timed_sentences.max(1) as u32
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
