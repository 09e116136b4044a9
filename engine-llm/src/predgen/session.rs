//! The PredGen session: turns of a conversation, each heard as partial prompts.
//!
//! A turn runs step by step, so that a live pipeline can drive it: [`PredGen::begin_turn`] when
//! the user starts speaking, [`PredGen::hear`] for each partial transcript of the recogniser,
//! [`PredGen::step`] whenever the caller is free (it does one bounded piece of work and returns
//! what happened, audio included), [`PredGen::cancel_turn`] on barge-in. [`PredGen::turn`]
//! replays a recorded turn through the same steps on a simulated clock, for benchmarks.

use std::fmt;
use std::sync::mpsc::TryRecvError;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::acceptance::Acceptance;
use spec_core::decoder::{common_prefix_len, common_suffix_len, forward_tokens, rewind_to_prefix};
use spec_core::sampling::{argmax, softmax};
use spec_core::{
    forward_continuation, generate, heads_generate, jacobi_generate, speculative_generate,
    tree_speculative_generate, AcceptanceRate, AcceptanceRule, CostAwarePolicy, Decoder,
    DraftLength, FinishReason, ForwardCosts, Generation, HeadsDrafter, Interrupt, LogitRows,
    LookupDrafter, OutputRows, SamplingConfig, SpeculativeConfig, StopConditions,
};
use spec_nn::forward_costs;
use spec_nn::heads::MultiTokenHeads;

use spec_voice::{
    first_streamed_sentence, keeps_words, split_sentences, FinalSignal, Partial, PartialReceiver,
    PreparedAudio, SentenceStream, SentenceSynthesizer, SimClock, Synthesis,
};

use super::{Continuation, PredGenConfig, Verifier, JUDGE_PROMPT};
use crate::chat::{LanguageModel, Message};
use crate::tokenizer::TextTokenizer;
use crate::transformer::CacheState;
use crate::{Error, Result};

mod candidates;

use candidates::Candidates;

/// Something that happened during a turn, at a time of the session clock (from the turn's
/// first input).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub at: Duration,
    pub kind: EventKind,
}

/// The kinds of [`Event`].
#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// The model completed the user's unfinished question; the guess answers this question.
    Completed { question: String },
    /// A partial prompt was taken up (intermediate ones that arrived while the model was busy
    /// are skipped).
    Heard { text: String, is_final: bool },
    /// The guess was verified against the prompt: `kept` of `guessed` tokens (`judged_yes`
    /// when the reflection verifier asked).
    Verified {
        kept: usize,
        guessed: usize,
        judged_yes: Option<bool>,
    },
    /// Tokens generated onto the guess (or the answer).
    Generated { tokens: usize, text: String },
    /// A first sentence was handed to TTS ahead of time; its audio is ready at `ready_at`.
    Prepared {
        sentence: String,
        ready_at: Duration,
    },
    /// The first sentence of the final answer is complete.
    FirstSentence { text: String },
    /// A later sentence of the answer is complete and synthesized; its audio is ready at
    /// `ready_at`.
    Sentence {
        text: String,
        ready_at: Duration,
        audio: Synthesis,
    },
    /// The first sentence's audio starts playing (`prepared`: synthesized before the input
    /// ended).
    AudioStarts { prepared: bool, audio: Synthesis },
    /// A step working ahead of the user was abandoned part-way through a forward: the final
    /// partial arrived (its work is dropped, the answer starts at once).
    Interrupted,
    /// The answer is complete.
    AnswerDone { tokens: usize },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>8.3} s  ", self.at.as_secs_f64())?;
        match &self.kind {
            EventKind::Heard { text, is_final } => {
                let what = if *is_final { "heard (final)" } else { "heard" };
                write!(f, "{what:<14} \"{text}\"")
            }
            EventKind::Verified {
                kept,
                guessed,
                judged_yes,
            } => {
                write!(
                    f,
                    "{:<14} kept {kept} of {guessed} guessed tokens",
                    "verified"
                )?;
                match judged_yes {
                    Some(yes) => write!(f, " (judge: {})", if *yes { "yes" } else { "no" }),
                    None => Ok(()),
                }
            }
            EventKind::Completed { question } => {
                write!(f, "{:<14} \"{question}\"", "completed")
            }
            EventKind::Generated { tokens, text } => {
                write!(f, "{:<14} +{tokens} tokens: \"{text}\"", "generated")
            }
            EventKind::Prepared { sentence, ready_at } => write!(
                f,
                "{:<14} \"{sentence}\" (audio ready at {:.3} s)",
                "to TTS",
                ready_at.as_secs_f64()
            ),
            EventKind::FirstSentence { text } => write!(f, "{:<14} \"{text}\"", "first sentence"),
            EventKind::Sentence { text, ready_at, .. } => write!(
                f,
                "{:<14} \"{text}\" (audio ready at {:.3} s)",
                "next sentence",
                ready_at.as_secs_f64()
            ),
            EventKind::AudioStarts { prepared, .. } => write!(
                f,
                "{:<14} {}",
                "audio starts",
                if *prepared {
                    "(synthesized ahead of time)"
                } else {
                    "(synthesized after the sentence)"
                }
            ),
            EventKind::Interrupted => {
                write!(f, "{:<14} the step in flight (final partial)", "abandoned")
            }
            EventKind::AnswerDone { tokens } => write!(f, "{:<14} {tokens} tokens", "answer done"),
        }
    }
}

/// One turn's answer, latencies and timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// The final prompt text.
    pub question: String,
    pub answer: String,
    pub first_sentence: String,
    /// When the last input arrived (from the first input).
    pub input_end: Duration,
    /// From the end of input until the model took it up: what was left of the step in flight
    /// (up to a layer's time when the step could be abandoned, see [`EventKind::Interrupted`]).
    /// Zero in [`PredGen::live_turn`], which stamps each partial when it takes it up.
    pub final_partial_wait: Duration,
    /// TTFS: from the end of input until the first sentence is complete.
    pub time_to_first_sentence: Duration,
    /// NFETFS: target forward passes after the end of input until the first sentence is
    /// complete (1: accepted at the final verification).
    pub forwards_to_first_sentence: usize,
    /// From the end of input until the first audio plays.
    pub audio_latency: Duration,
    /// From the end of input until the whole answer is generated.
    pub answer_latency: Duration,
    /// Tokens generated while input was still arriving.
    pub tokens_during_input: usize,
    /// Target forward passes while input was still arriving.
    pub forwards_during_input: usize,
    /// The model's completion of the question when the user finished it, if it made one
    /// (`PredGenConfig::complete_questions`).
    pub guessed_question: Option<String>,
    /// Guessed tokens offered to, and kept by, the final verification.
    pub guessed_at_end: usize,
    pub kept_at_end: usize,
    /// The first sentence's audio was synthesized ahead of time.
    pub prepared_audio_used: bool,
    /// The answer's audio, sentence by sentence.
    pub audio: Vec<Synthesis>,
    pub timeline: Vec<Event>,
}

/// The guess or answer being built: tokens (never an end token) and whether it is complete.
#[derive(Clone, Debug, Default)]
struct Answer {
    tokens: Vec<u32>,
    /// `tokens[..settled]` hold for the current prompt (verified, or the model's own); the rest
    /// is guessed and waits for verification.
    settled: usize,
    done: bool,
}

impl Answer {
    fn unsettled(&self) -> bool {
        self.settled < self.tokens.len()
    }

    fn settled_tokens(&self) -> &[u32] {
        &self.tokens[..self.settled]
    }

    /// Appends tokens of the model's own.
    fn extend_settled(&mut self, tokens: impl IntoIterator<Item = u32>) {
        debug_assert!(!self.unsettled());
        self.tokens.extend(tokens);
        self.settled = self.tokens.len();
    }
}

/// Most discarded guesses a turn keeps for the lookup continuation.
const RECYCLED_GUESSES: usize = 16;

/// A lookup drafter of at most `max_draft` tokens copying from the turn's discarded `guesses`,
/// cut by the measured `costs` at the `acceptance` lookup drafts had so far.
fn guess_lookup(
    max_draft: usize,
    costs: Option<&ForwardCosts>,
    acceptance: Option<AcceptanceRate>,
    guesses: &[Vec<u32>],
) -> Result<LookupDrafter> {
    let mut drafter = LookupDrafter::continuing(max_draft, costs, acceptance)?;
    for guess in guesses {
        drafter.add_reference(guess.clone());
    }
    Ok(drafter)
}

/// Most tokens per step the heads continuation copies from the turn's guesses beside the
/// heads' own (the lookup continuation's default length, cut by the same costs).
const HEADS_LOOKUP_DRAFT: usize = 8;

/// What a continuation may draft from besides the model, and when it runs.
#[derive(Clone, Copy, Default)]
struct Drafting<'a> {
    /// The rejected part of the last guess: Jacobi's starting guess.
    tail: &'a [u32],
    /// The turn's discarded guesses, the newest last: lookup's references.
    guesses: &'a [Vec<u32>],
    /// While the user speaks, where a step's time is idle time: the draft model's policy may
    /// try drafts to learn their acceptance; after the last word it follows its estimate.
    listening: bool,
}

/// What verifying a guess gave.
struct Check {
    /// Guessed tokens waiting for verification before this check.
    guessed: usize,
    /// Guessed tokens that held.
    kept: usize,
    /// The model's own tokens added after the kept ones (its correction, or none when the
    /// check covered only part of the guess and all of it held).
    produced: usize,
    /// The guess after the first token not kept: Jacobi's starting guess.
    rejected_tail: Vec<u32>,
    /// The whole guess as it was, when part of it was not kept (recycled by lookup).
    discarded: Option<Vec<u32>>,
    forwards: usize,
    judged_yes: Option<bool>,
}

/// A voice-assistant conversation with input-time speculation.
pub struct PredGen<'m> {
    model: &'m mut LanguageModel,
    draft: Option<&'m mut LanguageModel>,
    /// The drafter of [`Continuation::Heads`].
    heads: Option<HeadsDrafter<MultiTokenHeads>>,
    judge_cache: CacheState,
    /// Built with the reflection verifier, or on the first [`PredGen::judge`].
    judge_tokens: Option<JudgeTokens>,
    config: PredGenConfig,
    history: Vec<Message>,
    turn: Option<TurnState>,
    /// The target's measured forward costs, when the config is cost-aware.
    costs: Option<ForwardCosts>,
    /// How often guessed tokens held so far in this session (from a prior of 0.8, past checks
    /// weighing 0.95 each).
    survival: AcceptanceRate,
    /// Decayed tokens and forwards of the Jacobi continuation, to tell whether it pays.
    jacobi_rate: (f64, f64),
    /// How often the lookup continuation's drafted tokens held so far in this session.
    lookup_acceptance: Option<AcceptanceRate>,
    /// The draft-model continuation's draft lengths, chosen from both models' costs.
    draft_policy: Option<CostAwarePolicy>,
    /// Tokens of a chat prompt after the user's words.
    assistant_opening: Option<usize>,
}

/// Token ids of the judge's two answers, in the spellings a model may start with.
#[derive(Clone, Debug)]
struct JudgeTokens {
    yes: Vec<u32>,
    no: Vec<u32>,
}

impl JudgeTokens {
    fn new(tokenizer: &TextTokenizer) -> Result<Self> {
        let ids = |words: [&str; 4]| -> Result<Vec<u32>> {
            let mut ids = Vec::new();
            for word in words {
                if let [id] = tokenizer.encode(word)?.as_slice() {
                    if !ids.contains(id) {
                        ids.push(*id);
                    }
                }
            }
            Ok(ids)
        };
        let yes = ids(["yes", "Yes", " yes", " Yes"])?;
        let no = ids(["no", "No", " no", " No"])?;
        if yes.is_empty() || no.is_empty() {
            return Err(Error::Tokenizer(
                "the reflection verifier needs single tokens for \"yes\" and \"no\"".into(),
            ));
        }
        Ok(Self { yes, no })
    }

    /// P(yes) > P(no) after the judge prompt.
    fn says_yes(&self, logits: &[f32]) -> bool {
        let probs = softmax(logits);
        let mass = |ids: &[u32]| ids.iter().map(|&i| probs[i as usize]).sum::<f32>();
        mass(&self.yes) > mass(&self.no)
    }
}

impl<'m> PredGen<'m> {
    /// A session on `model`; fails on settings out of range, and for the reflection verifier
    /// when the tokenizer has no single token for "yes" and "no".
    pub fn new(model: &'m mut LanguageModel, config: PredGenConfig) -> Result<Self> {
        config.validate()?;
        let judge_tokens = match config.verifier {
            Verifier::Reflection => Some(JudgeTokens::new(&model.tokenizer)?),
            _ => None,
        };
        let costs = match config.cost_aware {
            true => Some(forward_costs(&mut model.model, &model.weights)?),
            false => None,
        };
        Ok(Self {
            judge_cache: model.model.new_cache(),
            judge_tokens,
            model,
            draft: None,
            heads: None,
            config,
            history: Vec::new(),
            turn: None,
            costs,
            survival: AcceptanceRate::new(4.0, 1.0, 0.95),
            jacobi_rate: (0.0, 0.0),
            lookup_acceptance: None,
            draft_policy: None,
            assistant_opening: None,
        })
    }

    /// Attaches the draft model of [`Continuation::DraftModel`]; it must share the vocabulary.
    pub fn with_draft(mut self, draft: &'m mut LanguageModel) -> Result<Self> {
        self.model.check_draft(draft)?;
        if let (Some(costs), Continuation::DraftModel { gamma }) =
            (&self.costs, self.config.continuation)
        {
            let draft_costs = forward_costs(&mut draft.model, &draft.weights)?;
            self.draft_policy = Some(CostAwarePolicy::new(costs.clone(), draft_costs, gamma));
        }
        self.draft = Some(draft);
        Ok(self)
    }

    /// Attaches the heads of [`Continuation::Heads`] (loaded for this model with
    /// [`LanguageModel::load_heads`], which refuses heads trained for another), in the tree
    /// shape and with the confidence gate `drafter` has.
    pub fn with_heads(mut self, drafter: HeadsDrafter<MultiTokenHeads>) -> Result<Self> {
        drafter.heads().info().check_fits(&self.model.model)?;
        self.heads = Some(drafter);
        Ok(self)
    }

    /// Uses `costs` as the target's forward costs (seconds per forward by token count) instead
    /// of the measured ones, e.g. costs measured elsewhere; ignored unless the config is
    /// cost-aware.
    pub fn with_costs(mut self, costs: ForwardCosts) -> Self {
        if self.config.cost_aware {
            self.costs = Some(costs);
        }
        self
    }

    /// The settings.
    pub fn config(&self) -> &PredGenConfig {
        &self.config
    }

    /// The conversation so far (user and assistant turns).
    pub fn history(&self) -> &[Message] {
        &self.history
    }

    /// Starts a new conversation (a turn in progress is cancelled).
    pub fn clear_history(&mut self) -> Result<()> {
        self.cancel_turn()?;
        self.history.clear();
        Ok(())
    }

    /// The user starts speaking: a turn with input-time speculation begins, timed by `clock`.
    /// Feed it the recogniser's partial transcripts with [`PredGen::hear`] and call
    /// [`PredGen::step`] whenever the caller is free; a turn already in progress is cancelled.
    pub fn begin_turn(&mut self, clock: TurnClock) -> Result<()> {
        self.begin(clock, TurnKind::Speculative)
    }

    /// As [`PredGen::begin_turn`], for the plain cascade: nothing is done before the final
    /// partial, then the answer is generated autoregressively and spoken sentence by sentence.
    pub fn begin_cascade_turn(&mut self, clock: TurnClock) -> Result<()> {
        self.begin(clock, TurnKind::Cascade)
    }

    fn begin(&mut self, clock: TurnClock, kind: TurnKind) -> Result<()> {
        if matches!(self.config.continuation, Continuation::DraftModel { .. })
            && self.draft.is_none()
        {
            return Err(Error::Config(
                "the draft-model continuation needs a draft model (PredGen::with_draft)".into(),
            ));
        }
        if self.config.continuation == Continuation::Heads && self.heads.is_none() {
            return Err(Error::Config(
                "the heads continuation needs heads trained for the model (PredGen::with_heads)"
                    .into(),
            ));
        }
        self.turn = None;
        self.start_turn()?;
        self.turn = Some(TurnState::new(clock, kind));
        Ok(())
    }

    /// The user interrupts (barge-in) or the turn is abandoned: its work is dropped, the model's
    /// cache rolled back to the conversation before it, and the history left without it.
    pub fn cancel_turn(&mut self) -> Result<()> {
        if self.turn.take().is_some() {
            self.start_turn()?;
        }
        Ok(())
    }

    /// The time of the turn's clock (zero with no turn in progress): partial transcripts of a
    /// live turn are stamped with it.
    pub fn now(&self) -> Duration {
        self.turn.as_ref().map_or(Duration::ZERO, |t| t.clock.now())
    }

    /// On a simulated clock, lets time pass until `at` (the model has nothing to do until the
    /// next partial arrives then); the wall clock passes by itself.
    pub fn wait_until(&mut self, at: Duration) {
        if let Some(turn) = &mut self.turn {
            turn.clock.wait_until(at);
        }
    }

    /// A partial transcript arrives: everything heard so far, at `partial.at` on the turn's
    /// clock, the last of the turn with `is_final`. Cheap: the work it calls for happens in the
    /// next [`PredGen::step`]s (partials that arrive meanwhile replace it unheard). A partial
    /// stamped ahead of the turn's clock moves a simulated clock on to its time and is an
    /// [`Error::Input`] on the wall clock.
    pub fn hear(&mut self, partial: Partial) -> Result<()> {
        let turn = self.turn.as_mut().ok_or_else(|| {
            Error::Input("no turn in progress: begin one before hearing partials".into())
        })?;
        if turn.final_input.is_some() {
            return Err(Error::Input(
                "the turn's final partial was already heard".into(),
            ));
        }
        if turn.last_heard_at.is_some_and(|last| partial.at < last) {
            return Err(Error::Input("partials must arrive in order of time".into()));
        }
        if partial.is_final && partial.text.trim().is_empty() {
            return Err(Error::Input("the final partial is empty".into()));
        }
        // A partial is heard no earlier than its time: a simulated clock moves on to it (the
        // model cannot have worked on it before), a wall clock cannot, so there it is refused
        // (every latency of the turn is measured from the final partial's time).
        let now = turn.clock.now();
        if partial.at > now {
            if let Clock::Wall(_) = turn.clock {
                return Err(Error::Input(format!(
                    "a partial stamped {:?} was heard at {now:?} on the turn's wall clock: \
                     stamp partials with the time they arrive (PredGen::now)",
                    partial.at
                )));
            }
            turn.clock.wait_until(partial.at);
        }
        turn.last_heard_at = Some(partial.at);
        if partial.is_final {
            turn.final_input = Some(partial);
        } else {
            turn.pending = Some(partial);
        }
        Ok(())
    }

    /// Does the next piece of work of the turn: verify the guess against the newest partial,
    /// or extend the guess by up to `tokens_per_step` tokens and hand its first sentence to
    /// `tts`; after the final partial, verify the guess against the whole question, then speak
    /// the answer sentence by sentence. Returns what happened, and whether there is more to do
    /// now ([`Status::Working`]), nothing until the next partial ([`Status::Idle`]), or the
    /// answer is complete ([`Status::Done`]; the turn joins the history).
    pub fn step(&mut self, tts: &mut dyn SentenceSynthesizer) -> Result<Progress> {
        let mut turn = self
            .turn
            .take()
            .ok_or_else(|| Error::Input("no turn in progress: begin one before stepping".into()))?;
        let status = self.advance(&mut turn, tts);
        let events = turn.timeline[turn.reported..].to_vec();
        turn.reported = turn.timeline.len();
        match status {
            Ok(Status::Done(done)) => Ok(Progress {
                events,
                status: Status::Done(done),
            }),
            Ok(status) => {
                self.turn = Some(turn);
                Ok(Progress { events, status })
            }
            Err(e) => {
                self.start_turn()?;
                Err(e)
            }
        }
    }

    /// One turn with input-time speculation, replayed on a simulated clock: `inputs` are the
    /// user's partial prompts in order of arrival, the last one final. Returns the answer with
    /// its latencies; the turn joins the history.
    pub fn turn(&mut self, inputs: &[Partial], tts: &mut dyn SentenceSynthesizer) -> Result<Turn> {
        check_inputs(inputs)?;
        self.begin_turn(TurnClock::Simulated)?;
        self.replay(inputs, tts)
    }

    /// The plain cascade for comparison, on a simulated clock: wait for the final input,
    /// generate greedily, then synthesize the first sentence. The turn joins the history.
    pub fn baseline_turn(
        &mut self,
        inputs: &[Partial],
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Turn> {
        check_inputs(inputs)?;
        self.begin_cascade_turn(TurnClock::Simulated)?;
        self.replay(inputs, tts)
    }

    /// One turn driven live on the wall clock: partial transcripts arrive on `partials`
    /// ([`spec_voice::partial_channel`]) as the recogniser produces them (each is stamped with
    /// its arrival time on the turn's clock; the sender's `at` is not used), the model works
    /// between them, and `on_event` sees every event as it happens, audio to play included. A
    /// forward working ahead when the final partial is sent stops at its next layer
    /// ([`EventKind::Interrupted`]). Returns the turn once the answer is complete; the sender
    /// closing the channel before a final partial is an error.
    pub fn live_turn(
        &mut self,
        partials: &PartialReceiver,
        tts: &mut dyn SentenceSynthesizer,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<Turn> {
        self.begin_turn(TurnClock::Wall)?;
        if let Some(turn) = &mut self.turn {
            turn.final_arrival = FinalArrival::Signalled(partials.final_signal());
        }
        let closed = || Error::Input("the partials ended without a final one".into());
        loop {
            loop {
                match partials.try_recv() {
                    Ok(partial) => self.hear_now(partial)?,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if self.turn.as_ref().is_some_and(|t| t.final_input.is_none()) {
                            self.cancel_turn()?;
                            return Err(closed());
                        }
                        break;
                    }
                }
            }
            let progress = self.step(tts)?;
            progress.events.iter().for_each(&mut *on_event);
            match progress.status {
                Status::Done(turn) => return Ok(*turn),
                Status::Working => {}
                Status::Idle => match partials.recv() {
                    Ok(partial) => self.hear_now(partial)?,
                    Err(_) => {
                        self.cancel_turn()?;
                        return Err(closed());
                    }
                },
            }
        }
    }

    /// Hears `partial` as arriving now.
    fn hear_now(&mut self, partial: Partial) -> Result<()> {
        let at = self.now();
        self.hear(Partial { at, ..partial })
    }

    /// Drives a turn begun on the simulated clock: each partial is heard once its time has
    /// come, and time jumps to the next one when the model is idle.
    fn replay(&mut self, inputs: &[Partial], tts: &mut dyn SentenceSynthesizer) -> Result<Turn> {
        if let (Some(turn), Some(last)) = (&mut self.turn, inputs.last()) {
            turn.final_arrival = FinalArrival::At(last.at);
        }
        let mut next = 0;
        loop {
            while inputs.get(next).is_some_and(|p| p.at <= self.now()) {
                self.hear(inputs[next].clone())?;
                next += 1;
            }
            match self.step(tts)?.status {
                Status::Done(turn) => return Ok(*turn),
                Status::Working => {}
                Status::Idle => match inputs.get(next) {
                    Some(partial) => self.wait_until(partial.at),
                    None => {
                        return Err(Error::Input(
                            "the partials ended without a final one".into(),
                        ))
                    }
                },
            }
        }
    }

    /// The work of one step, by phase.
    fn advance(
        &mut self,
        turn: &mut TurnState,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Status> {
        match turn.phase {
            Phase::Listening => self.listen(turn, tts),
            Phase::FirstSentence => {
                if self.complete_first_sentence(turn)? {
                    turn.phase = Phase::Speaking;
                }
                Ok(Status::Working)
            }
            Phase::Speaking => {
                self.speak_first_sentence(turn, tts)?;
                turn.phase = Phase::Rest;
                Ok(Status::Working)
            }
            Phase::Rest => self.answer_on(turn, tts),
        }
    }

    /// Before the final partial: work ahead of the user ([`PredGen::work_ahead`]), abandoning
    /// the step part-way through a forward once the final partial arrives, when the turn can
    /// tell ([`FinalArrival`]): the answer then starts within a layer's time of the last word
    /// instead of after what is left of the step (up to a forward and more).
    fn listen(
        &mut self,
        turn: &mut TurnState,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Status> {
        if let Some(final_input) = turn.final_input.clone() {
            self.hear_final(turn, &final_input)?;
            turn.phase = Phase::FirstSentence;
            return Ok(Status::Working);
        }
        if turn.kind == TurnKind::Cascade {
            return Ok(Status::Idle);
        }
        let started = Instant::now();
        let clock_before = turn.clock.now();
        self.set_interrupt(turn.final_arrival.interrupt(started, clock_before));
        let worked = self.work_ahead(turn, tts);
        self.set_interrupt(None);
        match worked {
            Err(Error::Core(spec_core::Error::Interrupted)) => {
                // The parts of the step charge their compute when they finish: the abandoned
                // one did not.
                let charged = turn.clock.now().saturating_sub(clock_before);
                turn.clock.charge(started.elapsed().saturating_sub(charged));
                turn.timeline.push(turn.event(EventKind::Interrupted));
                Ok(Status::Working)
            }
            other => other,
        }
    }

    /// The models' forwards ask `interrupt` between their layers (see [`Interrupt`]).
    fn set_interrupt(&mut self, interrupt: Option<Interrupt>) {
        if let Some(draft) = self.draft.as_deref_mut() {
            draft.model.set_interrupt(interrupt.clone());
        }
        self.model.model.set_interrupt(interrupt);
    }

    /// A step of work ahead of the user: verify the newest partial, or guess on. A
    /// verification is followed by a step of generation even when a newer partial is waiting:
    /// verifying alone would starve generation whenever a verification outlasts a spoken word.
    /// Abandoned part-way (an interrupt), it leaves the guess and the caches consistent: each
    /// part changes them only once its forwards are done, and the final verification checks
    /// whatever is left unsettled.
    fn work_ahead(
        &mut self,
        turn: &mut TurnState,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Status> {
        if self.config.complete_questions && self.config.question_candidates > 1 {
            return Ok(match self.listen_with_candidates(turn, tts)? {
                true => Status::Working,
                false => Status::Idle,
            });
        }
        let generate_now = turn.just_verified || turn.pending.is_none();
        turn.just_verified = false;
        if generate_now && turn.guess.unsettled() && turn.heard_prompt.is_some() {
            // The rest of a guess that held so far: checking it is cheaper than generating.
            let prompt = turn.heard_prompt.clone().unwrap_or_default();
            let text = turn.heard_text.clone();
            let check = self.check_rest(turn, &prompt, &text)?;
            turn.forwards_during_input += check.forwards;
            turn.tokens_during_input += check.produced;
        } else if generate_now && self.guess_wanted(turn)? {
            self.guess_on(turn)?;
        } else if let Some(partial) = turn.pending.take() {
            if self.config.complete_questions && turn.question_for(&partial.text).is_none() {
                // Steps of their own, a token each, so that no step grows long: the partial is
                // verified against the completed question once the completion ends.
                let started = Instant::now();
                self.complete_question_step(turn, &partial.text)?;
                turn.clock.charge(started.elapsed());
                turn.pending = Some(partial);
                return Ok(Status::Working);
            }
            self.verify_partial(turn, &partial)?;
            turn.just_verified = true;
        } else {
            return Ok(Status::Idle);
        }
        self.prepare_first_sentence(turn, tts)?;
        Ok(Status::Working)
    }

    /// Whether guessing on is worth a step: a partial has been verified, and the guess is
    /// neither finished, nor at its length limit, nor holding a complete first sentence.
    fn guess_wanted(&self, turn: &TurnState) -> Result<bool> {
        Ok(turn.heard_prompt.is_some() && !self.guess_complete(&turn.guess)?)
    }

    /// Whether a guess needs no more tokens: it is finished, at its length limit, or holds a
    /// complete first sentence.
    fn guess_complete(&self, guess: &Answer) -> Result<bool> {
        Ok(guess.done
            || guess.tokens.len() >= self.guess_limit()
            || self.first_sentence(guess)?.is_some())
    }

    /// Most tokens a guess holds: `max_guess_tokens`, and never more than an answer may
    /// (a kept guess becomes the answer's beginning).
    fn guess_limit(&self) -> usize {
        self.config
            .max_guess_tokens
            .min(self.config.max_answer_tokens)
    }

    fn verify_partial(&mut self, turn: &mut TurnState, partial: &Partial) -> Result<()> {
        turn.timeline.push(turn.event(heard_event(partial)));
        let started = Instant::now();
        // Without question completion there is no completed question: the words themselves.
        let question = turn
            .question_for(&partial.text)
            .unwrap_or_else(|| partial.text.clone());
        let prompt = self.prompt_for(&question)?;
        if turn.heard_prompt.as_ref() == Some(&prompt) {
            // The same prompt as before (the words heard so far fit the completed question):
            // the guess was made for it, nothing to check.
            turn.clock.charge(started.elapsed());
            return Ok(());
        }
        // A new prompt: the whole guess is to be checked again.
        turn.guess.settled = 0;
        let check = self.verify(&prompt, &question, &mut turn.guess)?;
        turn.clock.charge(started.elapsed());
        turn.forwards_during_input += check.forwards;
        turn.tokens_during_input += check.produced;
        turn.timeline.push(turn.event(verified_event(&check)));
        turn.recycle(check.discarded);
        turn.rejected_tail = check.rejected_tail;
        turn.heard_prompt = Some(prompt);
        turn.heard_text = question;
        Ok(())
    }

    /// One token of the model's completion of the words `heard`: its own continuation of the
    /// user's words up to its end of turn, kept as the turn's completed question once it ends,
    /// none when the model does not end the question within [`MAX_COMPLETION_TOKENS`]. A
    /// completion begun for earlier words goes on while what it says so far holds every word
    /// heard since; otherwise (newer words it did not foresee) it is dropped for one of `heard`.
    fn complete_question_step(&mut self, turn: &mut TurnState, heard: &str) -> Result<()> {
        let mut completing = match turn.completing.take() {
            Some(c) if c.words == heard || keeps_words(heard, &self.completing_text(&c)?) => c,
            _ => {
                let prompt = self.prompt_for(heard)?;
                let words_end = prompt.len().saturating_sub(self.assistant_opening_len()?);
                Completing {
                    words: heard.to_string(),
                    context: prompt[..words_end].to_vec(),
                    tokens: Vec::new(),
                }
            }
        };
        let end_tokens = self.model.tokenizer.end_tokens().to_vec();
        let context: Vec<u32> = completing
            .context
            .iter()
            .chain(&completing.tokens)
            .copied()
            .collect();
        let gen = generate(
            &mut self.model.model,
            &context,
            &SamplingConfig::greedy(),
            &StopConditions::new(1),
            &mut StdRng::seed_from_u64(0),
            &mut |_| {},
        )?;
        turn.forwards_during_input += gen.stats.target_forwards;
        let completed = match gen.tokens.first() {
            Some(token) if end_tokens.contains(token) => {
                self.completed_question(&completing.words, &completing.tokens)?
            }
            Some(&token) if completing.tokens.len() + 1 < MAX_COMPLETION_TOKENS => {
                completing.tokens.push(token);
                turn.completing = Some(completing);
                return Ok(());
            }
            // Too long, or a full context: no completion.
            _ => None,
        };
        turn.completion_tried = Some(heard.to_string());
        if let Some(question) = &completed {
            turn.timeline.push(turn.event(EventKind::Completed {
                question: question.clone(),
            }));
        }
        turn.completed = completed;
        Ok(())
    }

    /// The question that `words` and the model's ended `completion` of them ask, trimmed;
    /// none when the completion starts a new line (something else than the question's end).
    fn completed_question(&self, words: &str, completion: &[u32]) -> Result<Option<String>> {
        let rest = self.model.tokenizer.decode_text(completion)?;
        Ok((!rest.contains('\n')).then(|| format!("{words}{rest}").trim().to_string()))
    }

    /// The words a completion continues and what it says after them so far.
    fn completing_text(&self, completing: &Completing) -> Result<String> {
        let rest = self.model.tokenizer.decode_text(&completing.tokens)?;
        Ok(format!("{}{rest}", completing.words))
    }

    /// How many tokens a chat prompt has after the user's words: the end of the user's turn and
    /// the opening of the assistant's (the same for every question).
    fn assistant_opening_len(&mut self) -> Result<usize> {
        if let Some(len) = self.assistant_opening {
            return Ok(len);
        }
        let len = common_suffix_len(&self.prompt_for("a")?, &self.prompt_for("b")?);
        self.assistant_opening = Some(len);
        Ok(len)
    }

    /// Checks the next part of a guess whose start held for `prompt`.
    fn check_rest(&mut self, turn: &mut TurnState, prompt: &[u32], text: &str) -> Result<Check> {
        let started = Instant::now();
        let mut check = self.verify(prompt, text, &mut turn.guess)?;
        turn.clock.charge(started.elapsed());
        turn.timeline.push(turn.event(verified_event(&check)));
        turn.recycle(check.discarded.take());
        if !check.rejected_tail.is_empty() {
            turn.rejected_tail = check.rejected_tail.clone();
        }
        Ok(check)
    }

    fn guess_on(&mut self, turn: &mut TurnState) -> Result<()> {
        let started = Instant::now();
        let prompt = turn.heard_prompt.clone().unwrap_or_default();
        let budget = self
            .config
            .tokens_per_step
            .min(self.guess_limit() - turn.guess.tokens.len());
        let before = turn.guess.tokens.len();
        let tail = std::mem::take(&mut turn.rejected_tail);
        let drafting = Drafting {
            tail: &tail,
            guesses: &turn.recycled,
            listening: true,
        };
        let gen = self.extend(&prompt, &mut turn.guess, drafting, budget, Some(1))?;
        turn.clock.charge(started.elapsed());
        turn.forwards_during_input += gen.stats.target_forwards;
        turn.tokens_during_input += turn.guess.tokens.len() - before;
        let generated = self.generated_event(&turn.guess.tokens[before..])?;
        turn.timeline.push(turn.event(generated));
        Ok(())
    }

    /// Hands the guessed first sentence to TTS as soon as it is complete.
    fn prepare_first_sentence(
        &mut self,
        turn: &mut TurnState,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<()> {
        match self.first_sentence(&turn.guess)? {
            Some(sentence) => self.prepare_sentence(turn, sentence, tts),
            None => Ok(()),
        }
    }

    /// Synthesizes `sentence` ahead of time, unless it was already.
    fn prepare_sentence(
        &mut self,
        turn: &mut TurnState,
        sentence: String,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<()> {
        if turn.prepared.iter().any(|p| p.matches(&sentence)) {
            return Ok(());
        }
        let synthesis = tts.synthesize(&sentence)?;
        let ready_at = turn.clock.now() + synthesis.first_audio_after;
        turn.timeline
            .push(turn.event(EventKind::Prepared { sentence, ready_at }));
        turn.prepared.push(PreparedAudio {
            synthesis,
            ready_at,
        });
        Ok(())
    }

    /// The final partial: one forward verifies the guess against the whole question (the
    /// cascade generates its answer's first sentence from scratch instead).
    fn hear_final(&mut self, turn: &mut TurnState, final_input: &Partial) -> Result<()> {
        turn.input_end = final_input.at;
        turn.final_partial_wait = turn.clock.now().saturating_sub(final_input.at);
        turn.timeline.push(turn.event(heard_event(final_input)));
        let prompt = self.prompt_for(&final_input.text)?;
        if turn.kind == TurnKind::Speculative {
            let started = Instant::now();
            self.settle_candidates(turn, &prompt)?;
            turn.clock.charge(started.elapsed());
        }
        match turn.kind {
            TurnKind::Speculative if turn.heard_prompt.as_ref() == Some(&prompt) => {
                // The question is the one the guess was made for (completed rightly, or heard
                // whole before its end was signalled): what holds of the guess still holds.
                turn.guessed_at_end = turn.guess.tokens.len();
                turn.kept_at_end = turn.guess.settled;
                turn.timeline.push(turn.event(EventKind::Verified {
                    kept: turn.guess.settled,
                    guessed: turn.guess.tokens.len(),
                    judged_yes: None,
                }));
            }
            TurnKind::Speculative => {
                turn.guessed_at_end = turn.guess.tokens.len();
                turn.guess.settled = 0;
                let started = Instant::now();
                let check = self.verify(&prompt, &final_input.text, &mut turn.guess)?;
                turn.clock.charge(started.elapsed());
                turn.timeline.push(turn.event(verified_event(&check)));
                turn.kept_at_end = check.kept;
                turn.forwards_to_first_sentence = check.forwards;
                turn.recycle(check.discarded);
                turn.rejected_tail = check.rejected_tail;
            }
            TurnKind::Cascade => {
                turn.guess = Answer::default();
                let started = Instant::now();
                let budget = self.config.max_answer_tokens;
                let gen = self.extend_with(
                    Continuation::Autoregressive,
                    &prompt,
                    &mut turn.guess,
                    Drafting::default(),
                    budget,
                    Some(1),
                )?;
                turn.clock.charge(started.elapsed());
                let generated = self.generated_event(&turn.guess.tokens)?;
                turn.timeline.push(turn.event(generated));
                turn.forwards_to_first_sentence = gen.stats.target_forwards;
            }
        }
        turn.question = final_input.text.clone();
        turn.prompt = prompt;
        Ok(())
    }

    /// Generates on until the answer's first sentence is complete, if verification did not
    /// leave one.
    fn complete_first_sentence(&mut self, turn: &mut TurnState) -> Result<bool> {
        if self.settled_first_sentence(&turn.guess)?.is_some()
            || (turn.guess.done && !turn.guess.unsettled())
        {
            return Ok(true);
        }
        if turn.guess.unsettled() {
            let (prompt, text) = (turn.prompt.clone(), turn.question.clone());
            let check = self.check_rest(turn, &prompt, &text)?;
            turn.forwards_to_first_sentence += check.forwards;
            turn.kept_at_end += check.kept;
            return Ok(false);
        }
        let started = Instant::now();
        let before = turn.guess.tokens.len();
        let budget = self.config.max_answer_tokens - before;
        let (prompt, tail) = (turn.prompt.clone(), std::mem::take(&mut turn.rejected_tail));
        let continuation = self.runnable(turn.continuation(&self.config), false);
        let drafting = Drafting {
            tail: &tail,
            guesses: &turn.recycled,
            listening: false,
        };
        let gen = self.extend_with(
            continuation,
            &prompt,
            &mut turn.guess,
            drafting,
            budget,
            Some(1),
        )?;
        turn.clock.charge(started.elapsed());
        turn.forwards_to_first_sentence += gen.stats.target_forwards;
        let generated = self.generated_event(&turn.guess.tokens[before..])?;
        turn.timeline.push(turn.event(generated));
        Ok(true)
    }

    /// The first sentence is complete: its audio plays, prepared ahead of time if the guess
    /// got it right, synthesized now otherwise.
    fn speak_first_sentence(
        &mut self,
        turn: &mut TurnState,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<()> {
        let first_at = turn.clock.now();
        turn.first_sentence_at = first_at;
        // An answer cut off before its first sentence ends is spoken whole.
        let first_sentence = match self.settled_first_sentence(&turn.guess)? {
            Some(sentence) => sentence,
            None => self.answer_text(&turn.guess)?,
        };
        turn.timeline.push(turn.event(EventKind::FirstSentence {
            text: first_sentence.clone(),
        }));
        let prepared = turn
            .prepared
            .iter()
            .position(|p| !first_sentence.is_empty() && p.matches(&first_sentence))
            .map(|i| turn.prepared.swap_remove(i));
        turn.prepared_audio_used = prepared.is_some();
        let (audio_at, audio) = match prepared {
            Some(p) => (p.ready_at.max(first_at), Some(p.synthesis)),
            None if first_sentence.is_empty() => (first_at, None),
            None => {
                let synthesis = tts.synthesize(&first_sentence)?;
                (first_at + synthesis.first_audio_after, Some(synthesis))
            }
        };
        turn.audio_at = audio_at;
        turn.first_sentence = first_sentence;
        turn.spoken = 1;
        if let Some(audio) = audio {
            turn.audio.push(audio.clone());
            turn.timeline.push(Event {
                at: audio_at,
                kind: EventKind::AudioStarts {
                    prepared: turn.prepared_audio_used,
                    audio,
                },
            });
        }
        Ok(())
    }

    /// The rest of the answer, sentence by sentence, each to TTS as soon as it is complete.
    fn answer_on(
        &mut self,
        turn: &mut TurnState,
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<Status> {
        let max = self.config.max_answer_tokens;
        if turn.guess.unsettled() {
            let (prompt, text) = (turn.prompt.clone(), turn.question.clone());
            self.check_rest(turn, &prompt, &text)?;
        } else if turn.guess.done || turn.guess.tokens.len() >= max {
            return self.finish_turn(turn).map(|t| Status::Done(Box::new(t)));
        } else {
            let started = Instant::now();
            let budget = max - turn.guess.tokens.len();
            let prompt = turn.prompt.clone();
            let continuation = self.runnable(turn.continuation(&self.config), false);
            let drafting = Drafting {
                tail: &[],
                guesses: &turn.recycled,
                listening: false,
            };
            self.extend_with(
                continuation,
                &prompt,
                &mut turn.guess,
                drafting,
                budget,
                Some(turn.spoken + 1),
            )?;
            turn.clock.charge(started.elapsed());
        }
        let text = self
            .model
            .tokenizer
            .decode_text(turn.guess.settled_tokens())?;
        let complete =
            !turn.guess.unsettled() && (turn.guess.done || turn.guess.tokens.len() >= max);
        let (sentences, _) = split_sentences(&text, complete);
        for sentence in sentences.iter().skip(turn.spoken) {
            let audio = tts.synthesize(sentence)?;
            let ready_at = turn.clock.now() + audio.first_audio_after;
            turn.audio.push(audio.clone());
            turn.timeline.push(turn.event(EventKind::Sentence {
                text: sentence.clone(),
                ready_at,
                audio,
            }));
        }
        turn.spoken = turn.spoken.max(sentences.len());
        Ok(Status::Working)
    }

    /// The answer is complete: it joins the history, and the turn's figures are gathered.
    fn finish_turn(&mut self, turn: &mut TurnState) -> Result<Turn> {
        turn.timeline.push(turn.event(EventKind::AnswerDone {
            tokens: turn.guess.tokens.len(),
        }));
        let answer = self.answer_text(&turn.guess)?;
        self.history.push(Message::user(turn.question.clone()));
        self.history.push(Message::assistant(answer.clone()));
        let mut timeline = turn.timeline.clone();
        timeline.sort_by_key(|e| e.at);
        Ok(Turn {
            question: turn.question.clone(),
            answer,
            first_sentence: turn.first_sentence.clone(),
            input_end: turn.input_end,
            final_partial_wait: turn.final_partial_wait,
            time_to_first_sentence: turn.first_sentence_at - turn.input_end,
            forwards_to_first_sentence: turn.forwards_to_first_sentence,
            audio_latency: turn.audio_at - turn.input_end,
            answer_latency: turn.clock.now() - turn.input_end,
            tokens_during_input: turn.tokens_during_input,
            forwards_during_input: turn.forwards_during_input,
            guessed_question: turn.completed.clone(),
            guessed_at_end: turn.guessed_at_end,
            kept_at_end: turn.kept_at_end,
            prepared_audio_used: turn.prepared_audio_used,
            audio: std::mem::take(&mut turn.audio),
            timeline,
        })
    }

    /// Keeps only the cached conversation so far, as a real assistant's cache would hold it
    /// when the user starts speaking (another session may have used the model since).
    fn start_turn(&mut self) -> Result<()> {
        let conversation = self.conversation(None);
        let tokens = self.model.chat_prompt(&conversation)?;
        let keep = common_prefix_len(self.model.model.cached_tokens(), &tokens);
        self.model.model.truncate(keep)?;
        Ok(())
    }

    fn conversation(&self, question: Option<&str>) -> Vec<Message> {
        let mut messages = vec![Message::system(self.config.system_prompt.clone())];
        messages.extend(self.history.iter().cloned());
        messages.extend(question.map(Message::user));
        messages
    }

    fn prompt_for(&self, text: &str) -> Result<Vec<u32>> {
        let prompt = self.model.chat_prompt(&self.conversation(Some(text)))?;
        let needed = prompt.len() + 1;
        if needed > self.model.model.max_len() {
            return Err(Error::Core(spec_core::Error::ContextOverflow {
                requested: needed,
                max: self.model.model.max_len(),
            }));
        }
        Ok(prompt)
    }

    /// The text of `answer`, trimmed.
    fn answer_text(&self, answer: &Answer) -> Result<String> {
        Ok(self
            .model
            .tokenizer
            .decode_text(&answer.tokens)?
            .trim()
            .to_string())
    }

    /// The first complete sentence of the part of `answer` that holds for the prompt.
    fn settled_first_sentence(&self, answer: &Answer) -> Result<Option<String>> {
        let complete = answer.done && !answer.unsettled();
        let found = self.first_sentence_in(answer.settled_tokens(), complete)?;
        Ok(found.map(|(_, sentence)| sentence))
    }

    /// The first complete sentence of `answer`, if it has one.
    fn first_sentence(&self, answer: &Answer) -> Result<Option<String>> {
        let found = self.first_sentence_in(&answer.tokens, answer.done)?;
        Ok(found.map(|(_, sentence)| sentence))
    }

    /// The first sentence of `tokens` as the cascade finds it, streaming them to TTS
    /// ([`first_streamed_sentence`]), with how many tokens it takes; `complete`: the tokens
    /// are the whole answer.
    fn first_sentence_in(&self, tokens: &[u32], complete: bool) -> Result<Option<(usize, String)>> {
        let mut text = self.model.tokenizer.stream();
        let pieces = tokens
            .iter()
            .map(|&t| Ok(text.push(t)?.unwrap_or_default()))
            .collect::<Result<Vec<String>>>()?;
        Ok(first_streamed_sentence(&pieces, complete))
    }

    /// Verifies the guess against `prompt` with the configured verifier and keeps what holds:
    /// `guess.tokens[..guess.settled]` already hold for this prompt, the rest is checked. With
    /// the cost model, one forward carries only as many guessed tokens as are expected to pay
    /// for their share of it; when all of them hold, the next guessed token is judged by the
    /// same forward and the rest waits for another check. Otherwise the model's own next token
    /// follows the kept ones. The cache then holds `prompt` and the settled tokens but the last.
    fn verify(&mut self, prompt: &[u32], prompt_text: &str, guess: &mut Answer) -> Result<Check> {
        let room = self.model.model.max_len() - prompt.len() - 1;
        let limit = room.min(self.config.max_answer_tokens - 1);
        if guess.tokens.len() > limit {
            guess.tokens.truncate(limit);
            guess.done = false;
        }
        let settled = guess.settled.min(guess.tokens.len());
        let context: Vec<u32> = prompt
            .iter()
            .chain(&guess.tokens[..settled])
            .copied()
            .collect();
        let candidates = guess.tokens[settled..].to_vec();
        let offered = self.tokens_worth_verifying(&context, candidates.len());
        let logits = forward_continuation(&mut self.model.model, &context, &candidates[..offered])?;
        let rule = match self.config.verifier {
            Verifier::TopK(k) => AcceptanceRule::top_k(k),
            Verifier::Greedy | Verifier::Reflection => AcceptanceRule::greedy(),
        };
        let verdict = rule.verify_by_judging(&candidates[..offered], &logits)?;
        let mut kept = verdict.accepted;
        let mut forwards = 1;
        let mut judged_yes = None;
        if self.config.verifier == Verifier::Reflection {
            // The judge is asked only when greedy verification loses part of the first
            // sentence: where greedy keeps it all, the judge could keep nothing more.
            if let Some((sentence_len, _)) = self.first_sentence_in(&guess.tokens, false)? {
                if settled + kept < sentence_len {
                    let sentence = self
                        .model
                        .tokenizer
                        .decode_text(&guess.tokens[..sentence_len])?;
                    let yes = self.judge(prompt_text, sentence.trim())?;
                    forwards += 1;
                    judged_yes = Some(yes);
                    if yes {
                        kept = sentence_len - settled;
                    }
                }
            }
        }
        let guessed = candidates.len();
        if kept == offered
            && offered < guessed
            && rule.judge(candidates[offered], logits.row(offered)) == Some(true)
        {
            // Everything offered held, and so does the next guessed token: the rest of the
            // guess waits for the next check.
            self.survival.observe(offered + 1, offered + 1);
            self.model.model.truncate(context.len() + offered)?;
            guess.settled = settled + offered + 1;
            return Ok(Check {
                guessed,
                kept: offered + 1,
                produced: 0,
                rejected_tail: Vec::new(),
                discarded: None,
                forwards,
                judged_yes,
            });
        }
        self.survival
            .observe((kept + 1).min(guessed), kept.min(guessed));
        // Jacobi continues after the kept tokens and the model's next one: the rest of the
        // guess from the position after that is its starting guess.
        let rejected_tail = candidates.get(kept + 2..).unwrap_or_default().to_vec();
        let full = kept == guessed;
        let discarded = (!full).then(|| guess.tokens.clone());
        guess.tokens.truncate(settled + kept);
        self.model.model.truncate(context.len() + kept)?;
        if full && guess.done {
            // A finished guess, every token kept: the model's next token decides whether the
            // answer still ends there.
            guess.done = false;
        }
        let next = argmax(logits.row(kept));
        let produced = if self.model.tokenizer.end_tokens().contains(&next) {
            guess.done = true;
            0
        } else {
            guess.tokens.push(next);
            guess.done = false;
            1
        };
        guess.settled = guess.tokens.len();
        Ok(Check {
            guessed,
            kept,
            produced,
            rejected_tail,
            discarded,
            forwards,
            judged_yes,
        })
    }

    /// How many of `available` guessed tokens one forward after `context` should carry: the
    /// number that maximises the expected time saved, each token holding (given the ones
    /// before it held) at the session's survival rate α and then sparing one forward of its
    /// own, minus what carrying them adds to the forward: argmax over g of
    /// cost(1) · Σᵢ₌₁..g αⁱ − (cost(s + g) − cost(s)), s the forward's uncached tokens. All of
    /// them without the cost model, and for the reflection verifier (its judge reads the whole
    /// guessed first sentence).
    fn tokens_worth_verifying(&self, context: &[u32], available: usize) -> usize {
        let Some(costs) = &self.costs else {
            return available;
        };
        if self.config.verifier == Verifier::Reflection || available == 0 {
            return available;
        }
        let cached = common_prefix_len(self.model.model.cached_tokens(), context)
            .min(context.len().saturating_sub(1));
        let uncached = context.len() - cached;
        let alpha = self.survival.rate().min(0.99);
        let (base, step) = (costs.cost(uncached), costs.cost(1));
        let (mut best, mut best_value, mut expected, mut chance) = (0, 0.0, 0.0, 1.0);
        for g in 1..=available {
            chance *= alpha;
            expected += chance;
            let value = step * expected - (costs.cost(uncached + g) - base);
            if value > best_value {
                (best, best_value) = (g, value);
            }
        }
        best
    }

    /// The reflection verifier's question: is `answer` consistent with the (possibly partial)
    /// `prompt`? P("yes") against P("no") after the paper's judge prompt, in one forward in a
    /// cache of its own, so that the conversation's stays as it is.
    pub fn judge(&mut self, prompt: &str, answer: &str) -> Result<bool> {
        let answers = match &self.judge_tokens {
            Some(answers) => answers.clone(),
            None => {
                let answers = JudgeTokens::new(&self.model.tokenizer)?;
                self.judge_tokens = Some(answers.clone());
                answers
            }
        };
        let question = format!(
            "{JUDGE_PROMPT}\nPartial Prompt: {prompt}\nPartial Answer: {answer}\n\
             Answer with yes or no."
        );
        let tokens = self.model.chat_prompt(&[Message::user(question)])?;
        self.model.model.swap_cache(&mut self.judge_cache)?;
        let logits = rewind_to_prefix(&mut self.model.model, &tokens).and_then(|keep| {
            forward_tokens(&mut self.model.model, &tokens[keep..], LogitRows::Last(1))
        });
        self.model.model.swap_cache(&mut self.judge_cache)?;
        Ok(answers.says_yes(&logits?.into_last_row()))
    }

    /// Generates onto `answer` with the configured continuation.
    fn extend(
        &mut self,
        prompt: &[u32],
        answer: &mut Answer,
        drafting: Drafting<'_>,
        budget: usize,
        until_sentences: Option<usize>,
    ) -> Result<Generation> {
        let continuation = self.runnable(self.config.continuation, true);
        self.extend_with(
            continuation,
            prompt,
            answer,
            drafting,
            budget,
            until_sentences,
        )
    }

    /// Generates up to `budget` tokens onto `answer` (greedy, by `continuation`), stopping at
    /// an end token, a full context, or, with `until_sentences: Some(n)`, once the answer holds
    /// `n` complete sentences.
    fn extend_with(
        &mut self,
        continuation: Continuation,
        prompt: &[u32],
        answer: &mut Answer,
        drafting: Drafting<'_>,
        budget: usize,
        until_sentences: Option<usize>,
    ) -> Result<Generation> {
        let context: Vec<u32> = prompt.iter().chain(&answer.tokens).copied().collect();
        let end_tokens = self.model.tokenizer.end_tokens().to_vec();
        let mut stop = StopConditions::new(budget).with_eos(end_tokens.iter().copied());
        if let Some(wanted) = until_sentences {
            // The answer's text is followed token by token: each one decoded once, each
            // sentence found once.
            let mut text = self.model.tokenizer.stream();
            let mut sentences = SentenceStream::new();
            for &token in &answer.tokens {
                if let Some(delta) = text.push(token)? {
                    sentences.push(&delta);
                }
            }
            let seen = Mutex::new((text, sentences, 0));
            stop = stop.with_predicate(move |generated| {
                let Ok(mut guard) = seen.lock() else {
                    return true;
                };
                let (text, sentences, read) = &mut *guard;
                for &token in &generated[*read..] {
                    if let Ok(Some(delta)) = text.push(token) {
                        sentences.push(&delta);
                    }
                }
                *read = generated.len();
                sentences.reported() >= wanted
            });
        }
        let target = &mut self.model.model;
        let mut rng = StdRng::seed_from_u64(0);
        let gen = match continuation {
            Continuation::Autoregressive => generate(
                target,
                &context,
                &SamplingConfig::greedy(),
                &stop,
                &mut rng,
                &mut |_| {},
            )?,
            Continuation::Jacobi { window } => {
                let gen =
                    jacobi_generate(target, &context, drafting.tail, window, &stop, &mut |_| {})?;
                let (tokens, forwards) = self.jacobi_rate;
                self.jacobi_rate = (
                    JACOBI_DECAY * tokens + gen.tokens.len() as f64,
                    JACOBI_DECAY * forwards + gen.stats.target_forwards as f64,
                );
                gen
            }
            Continuation::DraftModel { gamma } => {
                let draft_length = match &self.draft_policy {
                    Some(policy) if drafting.listening => DraftLength::CostAware(policy.clone()),
                    Some(policy) => DraftLength::CostAware(policy.clone().without_exploration()),
                    None => DraftLength::Fixed(gamma),
                };
                let draft = self.draft.as_deref_mut().ok_or_else(|| {
                    Error::Config("the draft-model continuation needs a draft model".into())
                })?;
                let gen = speculative_generate(
                    target,
                    &mut draft.model,
                    &context,
                    &SpeculativeConfig {
                        draft_length,
                        ..Default::default()
                    },
                    &stop,
                    &mut rng,
                    &mut |_| {},
                )?;
                if let Some(policy) = &mut self.draft_policy {
                    for step in &gen.stats.steps {
                        policy.observe(step.drafted, step.accepted);
                    }
                }
                gen
            }
            Continuation::Lookup { max_draft } => {
                let mut drafter = guess_lookup(
                    max_draft,
                    self.costs.as_ref(),
                    self.lookup_acceptance,
                    drafting.guesses,
                )?;
                let gen = tree_speculative_generate(
                    target,
                    &mut drafter,
                    &context,
                    &AcceptanceRule::greedy(),
                    &stop,
                    &mut |_| {},
                )?;
                self.lookup_acceptance = Some(drafter.acceptance());
                gen
            }
            Continuation::Heads => {
                let drafter = self
                    .heads
                    .as_ref()
                    .ok_or_else(|| Error::Config("the heads continuation needs heads".into()))?;
                // Beside the heads' guesses, runs copied from the turn's discarded guesses, as
                // the lookup continuation drafts them.
                let mut copies = guess_lookup(
                    HEADS_LOOKUP_DRAFT,
                    self.costs.as_ref(),
                    self.lookup_acceptance,
                    drafting.guesses,
                )?;
                let gen = heads_generate(
                    target,
                    drafter,
                    Some(&mut copies),
                    &context,
                    &AcceptanceRule::greedy(),
                    OutputRows::Batched,
                    &stop,
                    &mut |_| {},
                )?;
                self.lookup_acceptance = Some(copies.acceptance());
                gen
            }
        };
        let ended = gen.finish == FinishReason::Eos;
        answer.extend_settled(
            gen.tokens
                .iter()
                .copied()
                .take_while(|t| !end_tokens.contains(t)),
        );
        answer.done = ended
            || gen.finish == FinishReason::ContextFull
            || answer.tokens.len() >= self.config.max_answer_tokens;
        Ok(gen)
    }

    /// What runs of `continuation` now: Jacobi decoding only while it is on trial (its first
    /// few forwards of the session, and only while the user speaks, where a slow step costs
    /// idle time) or has shown that it produces tokens faster than one forward per token, from
    /// the tokens per forward it achieved so far and the measured forward costs; plain decoding
    /// otherwise.
    fn runnable(&self, continuation: Continuation, listening: bool) -> Continuation {
        let Continuation::Jacobi { window } = continuation else {
            return continuation;
        };
        let Some(costs) = &self.costs else {
            return continuation;
        };
        let (tokens, forwards) = self.jacobi_rate;
        let pays = match forwards < 8.0 {
            true => listening,
            false => tokens / forwards * costs.cost(1) >= costs.cost(window + 1),
        };
        match pays {
            true => continuation,
            false => Continuation::Autoregressive,
        }
    }

    fn generated_event(&self, tokens: &[u32]) -> Result<EventKind> {
        Ok(EventKind::Generated {
            tokens: tokens.len(),
            text: self.model.tokenizer.decode_text(tokens)?,
        })
    }
}

/// Most tokens of the model's completion of an unfinished question.
pub const MAX_COMPLETION_TOKENS: usize = 8;

/// Weight of the Jacobi continuation's earlier runs in its running rate, per run.
const JACOBI_DECAY: f64 = 0.9;

/// How time runs during a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnClock {
    /// Real time from [`PredGen::begin_turn`]: the live pipeline's clock.
    Wall,
    /// Compute time: the clock advances by the measured compute of each step and jumps to the
    /// next partial when the model is idle ([`PredGen::wait_until`]), so replaying a recorded
    /// turn costs compute time, not speaking time, while every latency is real measured
    /// compute. Speech synthesis runs beside the model, so its time is not charged.
    Simulated,
}

/// The clock of a turn in progress.
#[derive(Clone, Copy, Debug)]
enum Clock {
    Wall(Instant),
    Simulated(SimClock),
}

impl Clock {
    fn now(&self) -> Duration {
        match self {
            Self::Wall(start) => start.elapsed(),
            Self::Simulated(clock) => clock.now(),
        }
    }

    /// Compute spent by the model: the wall clock has seen it pass already.
    fn charge(&mut self, compute: Duration) {
        if let Self::Simulated(clock) = self {
            clock.advance(compute);
        }
    }

    fn wait_until(&mut self, at: Duration) {
        if let Self::Simulated(clock) = self {
            clock.wait_until(at);
        }
    }
}

/// What a [`PredGen::step`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// What happened, in order (audio to play is in [`EventKind::AudioStarts`] and
    /// [`EventKind::Sentence`]).
    pub events: Vec<Event>,
    pub status: Status,
}

/// Whether a turn has more to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// There is more to do now: step again (after hearing any partial that arrived).
    Working,
    /// Nothing to do until the next partial arrives.
    Idle,
    /// The answer is complete; the turn has joined the history.
    Done(Box<Turn>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TurnKind {
    Speculative,
    Cascade,
}

/// Where a turn is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The user is speaking.
    Listening,
    /// The final partial is verified; the first sentence may need generating.
    FirstSentence,
    /// The first sentence is complete and goes to the speaker.
    Speaking,
    /// The rest of the answer.
    Rest,
}

/// How a turn knows, while a step works ahead of the user, that the final partial arrived.
enum FinalArrival {
    /// It cannot tell: a step runs to its end (partials handed over with [`PredGen::hear`]).
    Unknown,
    /// At this time of the simulated clock (a replayed turn).
    At(Duration),
    /// When the sender of a live turn's partials has sent it.
    Signalled(FinalSignal),
}

impl FinalArrival {
    /// The interrupt of a step that starts at `started` (the wall clock) and `now` (the turn's).
    fn interrupt(&self, started: Instant, now: Duration) -> Option<Interrupt> {
        match self {
            Self::Unknown => None,
            // The simulated clock advances by the compute charged, so the step reaches the
            // final partial's time once its compute outlasts the time left.
            Self::At(at) => Some(Interrupt::at(started + at.saturating_sub(now))),
            Self::Signalled(signal) => {
                let signal = signal.clone();
                Some(Interrupt::new(move || signal.arrived()))
            }
        }
    }
}

/// The model's completion of the user's words, being generated a token a step.
struct Completing {
    /// The words it completes.
    words: String,
    /// The chat prompt up to the end of those words.
    context: Vec<u32>,
    /// What the model said after them so far (no end token).
    tokens: Vec<u32>,
}

/// A turn in progress.
struct TurnState {
    clock: Clock,
    kind: TurnKind,
    phase: Phase,
    /// The newest partial not yet taken up.
    pending: Option<Partial>,
    final_input: Option<Partial>,
    /// How a step working ahead learns that the final partial arrived.
    final_arrival: FinalArrival,
    last_heard_at: Option<Duration>,
    /// The last step verified a partial: the next one generates.
    just_verified: bool,
    /// The prompt the guess answers (the partial verified last, or its completion), and its
    /// question.
    heard_prompt: Option<Vec<u32>>,
    heard_text: String,
    /// The question as the model completed it last.
    completed: Option<String>,
    /// The words the model last completed, or would not end within
    /// [`MAX_COMPLETION_TOKENS`].
    completion_tried: Option<String>,
    /// A completion in progress, a token a step.
    completing: Option<Completing>,
    /// The guess, and after the final partial the answer.
    guess: Answer,
    /// The rejected part of the last guess: Jacobi's starting guess.
    rejected_tail: Vec<u32>,
    /// Every guess of the turn that lost a part to verification, the newest last (at most
    /// [`RECYCLED_GUESSES`]): the lookup continuation copies from them, as SpecASR recycles
    /// its drafts, since a guess made for an earlier partial often says what the answer to
    /// the whole question says a few words later.
    recycled: Vec<Vec<u32>>,
    /// First sentences synthesized ahead of time.
    prepared: Vec<PreparedAudio>,
    /// Candidate questions answered ahead, with `question_candidates` above 1.
    candidates: Option<Candidates>,
    timeline: Vec<Event>,
    /// Events already returned by a step.
    reported: usize,
    tokens_during_input: usize,
    forwards_during_input: usize,
    question: String,
    prompt: Vec<u32>,
    input_end: Duration,
    final_partial_wait: Duration,
    guessed_at_end: usize,
    kept_at_end: usize,
    forwards_to_first_sentence: usize,
    first_sentence: String,
    first_sentence_at: Duration,
    audio_at: Duration,
    prepared_audio_used: bool,
    /// Sentences spoken so far.
    spoken: usize,
    audio: Vec<Synthesis>,
}

impl TurnState {
    /// Keeps a discarded guess for lookup, dropping the oldest beyond [`RECYCLED_GUESSES`].
    fn recycle(&mut self, discarded: Option<Vec<u32>>) {
        if let Some(guess) = discarded.filter(|g| !g.is_empty()) {
            if self.recycled.len() == RECYCLED_GUESSES {
                self.recycled.remove(0);
            }
            self.recycled.push(guess);
        }
    }

    fn new(clock: TurnClock, kind: TurnKind) -> Self {
        Self {
            clock: match clock {
                TurnClock::Wall => Clock::Wall(Instant::now()),
                TurnClock::Simulated => Clock::Simulated(SimClock::new()),
            },
            kind,
            phase: Phase::Listening,
            pending: None,
            final_input: None,
            final_arrival: FinalArrival::Unknown,
            last_heard_at: None,
            just_verified: false,
            heard_prompt: None,
            heard_text: String::new(),
            completed: None,
            completion_tried: None,
            completing: None,
            guess: Answer::default(),
            rejected_tail: Vec::new(),
            recycled: Vec::new(),
            prepared: Vec::new(),
            candidates: None,
            timeline: Vec::new(),
            reported: 0,
            tokens_during_input: 0,
            forwards_during_input: 0,
            question: String::new(),
            prompt: Vec::new(),
            input_end: Duration::ZERO,
            final_partial_wait: Duration::ZERO,
            guessed_at_end: 0,
            kept_at_end: 0,
            forwards_to_first_sentence: 0,
            first_sentence: String::new(),
            first_sentence_at: Duration::ZERO,
            audio_at: Duration::ZERO,
            prepared_audio_used: false,
            spoken: 0,
            audio: Vec::new(),
        }
    }

    /// The question the words `heard` ask, as far as the model's completions tell: the
    /// completed question while `heard` fits it, `heard` itself when the model was asked to
    /// complete exactly these words and would not end them; `None` when it was not asked yet.
    fn question_for(&self, heard: &str) -> Option<String> {
        if let Some(completed) = &self.completed {
            if keeps_words(heard, completed) {
                return Some(completed.clone());
            }
        }
        (self.completion_tried.as_deref() == Some(heard)).then(|| heard.to_string())
    }

    fn event(&self, kind: EventKind) -> Event {
        Event {
            at: self.clock.now(),
            kind,
        }
    }

    /// How the answer is generated after the final partial.
    fn continuation(&self, config: &PredGenConfig) -> Continuation {
        match self.kind {
            TurnKind::Speculative => config.continuation,
            TurnKind::Cascade => Continuation::Autoregressive,
        }
    }
}

fn check_inputs(inputs: &[Partial]) -> Result<()> {
    let Some(last) = inputs.last() else {
        return Err(Error::Input("a turn needs at least one input".into()));
    };
    if !last.is_final || inputs[..inputs.len() - 1].iter().any(|p| p.is_final) {
        return Err(Error::Input(
            "the last input of a turn, and only the last, must be final".into(),
        ));
    }
    if inputs.windows(2).any(|w| w[1].at < w[0].at) {
        return Err(Error::Input("inputs must arrive in order of time".into()));
    }
    if last.text.trim().is_empty() {
        return Err(Error::Input("the final input is empty".into()));
    }
    Ok(())
}

fn heard_event(input: &Partial) -> EventKind {
    EventKind::Heard {
        text: input.text.clone(),
        is_final: input.is_final,
    }
}

fn verified_event(check: &Check) -> EventKind {
    EventKind::Verified {
        kept: check.kept,
        guessed: check.guessed,
        judged_yes: check.judged_yes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_keeps_its_newest_discarded_guesses() {
        let mut turn = TurnState::new(TurnClock::Simulated, TurnKind::Speculative);
        turn.recycle(None);
        turn.recycle(Some(Vec::new()));
        assert!(turn.recycled.is_empty());
        let extra = 3;
        for i in 0..(RECYCLED_GUESSES + extra) as u32 {
            turn.recycle(Some(vec![i, i + 1]));
        }
        assert_eq!(turn.recycled.len(), RECYCLED_GUESSES);
        assert_eq!(turn.recycled[0], vec![extra as u32, extra as u32 + 1]);
        let newest = (RECYCLED_GUESSES + extra - 1) as u32;
        assert_eq!(turn.recycled.last(), Some(&vec![newest, newest + 1]));
    }
}
