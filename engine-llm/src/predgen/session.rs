//! The PredGen session: turns of a conversation, each heard as partial prompts.
//!
//! A turn runs step by step, so that a live pipeline can drive it: [`PredGen::begin_turn`] when
//! the user starts speaking, [`PredGen::hear`] for each partial transcript of the recogniser,
//! [`PredGen::step`] whenever the caller is free (it does one bounded piece of work and returns
//! what happened, the sentences ready for speech included: the caller speaks them, see
//! [`TurnVoice`](super::TurnVoice)), [`PredGen::cancel_turn`] on barge-in. [`PredGen::turn`]
//! replays a recorded turn through the same steps on a simulated clock, for benchmarks.

use std::fmt;
use std::sync::mpsc::TryRecvError;
use std::time::{Duration, Instant};

use spec_core::{AcceptanceRate, CostAwarePolicy, ForwardCosts, HeadsDrafter, Interrupt};
use spec_nn::forward_costs;
use spec_nn::heads::MultiTokenHeads;

use spec_voice::{Clock, Partial, PartialReceiver, SentenceSynthesizer, SpeechEvent};

use super::{Continuation, PredGenConfig, SpokenTurn, TurnVoice, Verifier};
use crate::chat::{LanguageModel, Message};
use crate::transformer::CacheState;
use crate::{Error, Result};

mod answer;
mod candidates;
mod completion;
mod continuation;
mod end_of_turn;
mod guess;
mod turn;
mod verify;

use candidates::Candidates;
use completion::Completing;
use continuation::{Drafting, Until, RECYCLED_GUESSES};
pub use end_of_turn::EndOfTurn;
use turn::{check_inputs, heard_event, FinalArrival, Phase, TurnKind, TurnState};
pub use turn::{Progress, Status};
use verify::{verified_event, JudgeTokens};

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
    /// The model's estimate that the user's turn ends after `words` (see [`EndOfTurn`]).
    EndOfTurn { words: String, probability: f32 },
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
    /// A guessed answer's first sentence is complete: worth synthesizing ahead of time.
    SpeakAhead { sentence: String },
    /// The first piece of the final answer's first sentence is settled before the sentence is
    /// complete (`spec_voice::settled_first_piece`): to be spoken now, while the rest is
    /// written.
    FirstPiece { text: String },
    /// The first sentence of the final answer is complete: to be spoken now (after its first
    /// piece, if that was reported).
    FirstSentence { text: String },
    /// A later sentence of the answer is complete: to be spoken after the ones before it.
    NextSentence { text: String },
    /// What the turn's voice did with the sentences ([`TurnVoice`]).
    Speech(SpeechEvent),
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
            EventKind::EndOfTurn { words, probability } => {
                write!(
                    f,
                    "{:<14} P = {probability:.2} after \"{words}\"",
                    "end of turn"
                )
            }
            EventKind::Completed { question } => {
                write!(f, "{:<14} \"{question}\"", "completed")
            }
            EventKind::Generated { tokens, text } => {
                write!(f, "{:<14} +{tokens} tokens: \"{text}\"", "generated")
            }
            EventKind::SpeakAhead { sentence } => {
                write!(f, "{:<14} \"{sentence}\"", "guessed")
            }
            EventKind::FirstPiece { text } => write!(f, "{:<14} \"{text}\"", "first piece"),
            EventKind::FirstSentence { text } => write!(f, "{:<14} \"{text}\"", "first sentence"),
            EventKind::NextSentence { text } => write!(f, "{:<14} \"{text}\"", "sentence"),
            EventKind::Speech(speech) => write!(f, "{speech}"),
            EventKind::Interrupted => {
                write!(f, "{:<14} the step in flight (final partial)", "abandoned")
            }
            EventKind::AnswerDone { tokens } => write!(f, "{:<14} {tokens} tokens", "answer done"),
        }
    }
}

/// One turn's answer, the model's latencies and timeline (its speech: [`SpokenTurn`]).
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
    /// From the end of input until the answer's first words could go to speech: the first
    /// sentence's first piece when it was settled before the sentence was complete
    /// ([`EventKind::FirstPiece`]), the first sentence otherwise.
    pub time_to_first_words: Duration,
    /// NFETFS: target forward passes after the end of input until the first sentence is
    /// complete (1: accepted at the final verification).
    pub forwards_to_first_sentence: usize,
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
    pub timeline: Vec<Event>,
}

impl Turn {
    /// When the timeline's first event that `wanted` picks happened.
    pub fn first_event_at(&self, wanted: impl Fn(&EventKind) -> bool) -> Option<Duration> {
        self.timeline.iter().find(|e| wanted(&e.kind)).map(|e| e.at)
    }

    /// The first sentence's first piece and when it went to speech, when it went before the
    /// sentence was complete ([`EventKind::FirstPiece`]).
    pub fn first_piece(&self) -> Option<(&str, Duration)> {
        self.timeline.iter().find_map(|e| match &e.kind {
            EventKind::FirstPiece { text } => Some((text.as_str(), e.at)),
            _ => None,
        })
    }
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
        if config.estimate_end_of_turn {
            // Found once per tokenizer; now rather than during the first turn.
            model.tokenizer.sentence_end_tokens();
        }
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

    /// Turns estimating the end of the user's turn on every partial on or off
    /// ([`PredGenConfig::estimate_end_of_turn`]); from the next turn on.
    pub fn set_estimate_end_of_turn(&mut self, on: bool) {
        if on {
            self.model.tokenizer.sentence_end_tokens();
        }
        self.config.estimate_end_of_turn = on;
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

    /// Takes the last completed turn back, as if it had not been asked: a turn in progress is
    /// cancelled, and the last question and answer leave the history (the user had not
    /// finished: the question goes on in the next turn). Returns the question taken back,
    /// `None` when the history has no turn.
    pub fn retract_last_turn(&mut self) -> Result<Option<String>> {
        self.cancel_turn()?;
        let n = self.history.len();
        if n < 2 {
            return Ok(None);
        }
        let question = self.history[n - 2].content.clone();
        self.history.truncate(n - 2);
        self.start_turn()?;
        Ok(Some(question))
    }

    /// The user starts speaking: a turn with input-time speculation begins on the session's
    /// `clock` (shared: the turn charges its compute to it and stamps its events with it).
    /// Feed it the recogniser's partial transcripts with [`PredGen::hear`] and call
    /// [`PredGen::step`] whenever the caller is free; a turn already in progress is cancelled.
    pub fn begin_turn(&mut self, clock: &Clock) -> Result<()> {
        self.begin(clock, TurnKind::Speculative)
    }

    /// As [`PredGen::begin_turn`], for the plain cascade: nothing is done before the final
    /// partial, then the answer is generated autoregressively and spoken sentence by sentence.
    pub fn begin_cascade_turn(&mut self, clock: &Clock) -> Result<()> {
        self.begin(clock, TurnKind::Cascade)
    }

    fn begin(&mut self, clock: &Clock, kind: TurnKind) -> Result<()> {
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
        self.turn = Some(TurnState::new(clock.clone(), kind));
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
            if !turn.clock.is_simulated() {
                return Err(Error::Input(format!(
                    "a partial stamped {:?} was heard at {now:?} on the session's wall clock: \
                     stamp partials with the time they arrive (Clock::now)",
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
    /// or extend the guess by up to `tokens_per_step` tokens and report its first sentence for
    /// synthesis ahead of time ([`EventKind::SpeakAhead`]); after the final partial, verify the
    /// guess against the whole question, then report the answer sentence by sentence
    /// ([`EventKind::FirstSentence`], [`EventKind::NextSentence`]) for the caller to speak.
    /// Returns what happened, and whether there is more to do now ([`Status::Working`]),
    /// nothing until the next partial ([`Status::Idle`]), or the answer is complete
    /// ([`Status::Done`]; the turn joins the history).
    pub fn step(&mut self) -> Result<Progress> {
        let mut turn = self
            .turn
            .take()
            .ok_or_else(|| Error::Input("no turn in progress: begin one before stepping".into()))?;
        let status = self.advance(&mut turn);
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

    /// One turn with input-time speculation, replayed on a simulated clock and spoken with
    /// `tts`: `inputs` are the user's partial prompts in order of arrival, the last one final.
    /// Returns the answer with its latencies; the turn joins the history.
    pub fn turn(
        &mut self,
        inputs: &[Partial],
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<SpokenTurn> {
        check_inputs(inputs)?;
        self.begin_turn(&Clock::simulated())?;
        self.replay(inputs, tts)
    }

    /// The plain cascade for comparison, on a simulated clock: wait for the final input,
    /// generate greedily, then synthesize the first sentence. The turn joins the history.
    pub fn baseline_turn(
        &mut self,
        inputs: &[Partial],
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<SpokenTurn> {
        check_inputs(inputs)?;
        self.begin_cascade_turn(&Clock::simulated())?;
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
    ) -> Result<SpokenTurn> {
        let clock = Clock::wall();
        self.begin_turn(&clock)?;
        if let Some(turn) = &mut self.turn {
            turn.final_arrival = FinalArrival::Signalled(partials.final_signal());
        }
        let mut voice = TurnVoice::new(clock);
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
            let progress = self.step()?;
            progress.events.iter().for_each(&mut *on_event);
            voice
                .speak(&progress.events, tts)?
                .iter()
                .for_each(&mut *on_event);
            match progress.status {
                Status::Done(turn) => return Ok(voice.finish(*turn)),
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
        let at = self.turn.as_ref().map_or(Duration::ZERO, |t| t.clock.now());
        self.hear(Partial { at, ..partial })
    }

    /// Drives a turn begun on the simulated clock: each partial is heard once its time has
    /// come, and time jumps to the next one when the model is idle.
    fn replay(
        &mut self,
        inputs: &[Partial],
        tts: &mut dyn SentenceSynthesizer,
    ) -> Result<SpokenTurn> {
        let Some(turn) = &mut self.turn else {
            return Err(Error::Input("no turn in progress to replay".into()));
        };
        if let Some(last) = inputs.last() {
            turn.final_arrival = FinalArrival::At(last.at);
        }
        let clock = turn.clock.clone();
        let mut voice = TurnVoice::new(clock.clone());
        let mut next = 0;
        loop {
            while inputs.get(next).is_some_and(|p| p.at <= clock.now()) {
                self.hear(inputs[next].clone())?;
                next += 1;
            }
            let progress = self.step()?;
            voice.speak(&progress.events, tts)?;
            match progress.status {
                Status::Done(turn) => return Ok(voice.finish(*turn)),
                Status::Working => {}
                Status::Idle => match inputs.get(next) {
                    Some(partial) => clock.wait_until(partial.at),
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
    fn advance(&mut self, turn: &mut TurnState) -> Result<Status> {
        match turn.phase {
            Phase::Listening => self.listen(turn),
            Phase::FirstSentence => {
                if self.report_first_piece(turn)? {
                    return Ok(Status::Working);
                }
                if self.complete_first_sentence(turn)? {
                    turn.phase = Phase::Speaking;
                }
                Ok(Status::Working)
            }
            Phase::Speaking => {
                self.speak_first_sentence(turn)?;
                turn.phase = Phase::Rest;
                Ok(Status::Working)
            }
            Phase::Rest => self.answer_on(turn),
        }
    }

    /// Before the final partial: estimate the end of the user's turn after the newest partial
    /// (when configured, in cascade turns too), and work ahead of the user
    /// ([`PredGen::work_ahead`]), abandoning
    /// the step part-way through a forward once the final partial arrives, when the turn can
    /// tell ([`FinalArrival`]): the answer then starts within a layer's time of the last word
    /// instead of after what is left of the step (up to a forward and more).
    fn listen(&mut self, turn: &mut TurnState) -> Result<Status> {
        if let Some(final_input) = turn.final_input.clone() {
            self.hear_final(turn, &final_input)?;
            turn.phase = Phase::FirstSentence;
            return Ok(Status::Working);
        }
        let estimate = self.end_of_turn_wanted(turn);
        if turn.kind == TurnKind::Cascade && estimate.is_none() {
            return Ok(Status::Idle);
        }
        let started = Instant::now();
        let clock_before = turn.clock.now();
        self.set_interrupt(turn.final_arrival.interrupt(started, clock_before));
        let worked = match estimate {
            Some(words) => self
                .estimate_end_of_turn(turn, &words)
                .map(|()| Status::Working),
            None => self.work_ahead(turn),
        };
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
    fn work_ahead(&mut self, turn: &mut TurnState) -> Result<Status> {
        if self.config.complete_questions && self.config.question_candidates > 1 {
            return Ok(match self.listen_with_candidates(turn)? {
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
        self.prepare_first_sentence(turn)?;
        Ok(Status::Working)
    }
}

/// Most tokens of the model's completion of an unfinished question.
pub const MAX_COMPLETION_TOKENS: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_keeps_its_newest_discarded_guesses() {
        let mut turn = TurnState::new(Clock::simulated(), TurnKind::Speculative);
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
