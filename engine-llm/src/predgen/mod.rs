//! PredGen: input-time speculation for voice assistants (Li & Grover, "PredGen: Accelerated
//! Inference of Large Language Models through Input-Time Speculation for Real-Time Speech
//! Interaction").
//!
//! In a cascade assistant (ASR → LLM → TTS, sentence by sentence) the user waits, after the
//! last word, for the whole first sentence of the answer and then for its speech. PredGen works
//! while the user is still speaking: on every new partial prompt it verifies the answer it
//! guessed before ([`Verifier`]), keeps what still holds, generates on ([`Continuation`]), and
//! reports the guessed first sentence, which the caller's voice synthesizes ahead of time
//! ([`TurnVoice`]). When the input ends, one forward over
//! the rest of the prompt and the guessed answer is both the prefill and the final
//! verification (the paper's Algorithm 1); if the first sentence survives, its audio plays at
//! once.
//!
//! A turn runs step by step: a live pipeline feeds it partial transcripts as they arrive
//! ([`PredGen::hear`], or a [`partial_channel`] with [`PredGen::live_turn`]) and lets it work
//! whenever it is free ([`PredGen::step`]), on the wall clock; benchmarks replay recorded turns
//! through the same steps on a simulated clock ([`PredGen::turn`]), where time advances by the
//! measured compute of each step and jumps to the next input when the model is idle. Live and
//! replayed turns abandon the forward working ahead as soon as the final partial arrives
//! ([`spec_core::Interrupt`]), so the answer starts within a layer's time of the last word.
//! Partial transcripts, sentence splitting and speech synthesis are `spec-voice`'s types,
//! re-exported here.

mod session;
mod voice;

pub use session::{
    EndOfTurn, Event, EventKind, PredGen, Progress, Status, Turn, MAX_COMPLETION_TOKENS,
};
pub use spec_voice::{
    partial_channel, spoken_at_rate, AudioChunk, Clock, ClockKind, FinalSignal,
    FixedLatencySynthesizer, Partial, PartialReceiver, PartialSender, SentenceSynthesizer, Speech,
    SpeechEvent, Synthesis,
};
pub use voice::{SpokenTurn, TurnVoice};

use crate::{Error, Result};

/// The paper's system prompt for partial input.
pub const PARTIAL_INPUT_SYSTEM_PROMPT: &str = "The instruction provided by the user may be \
truncated. In such cases, respond based on your best guess of the incomplete instruction. Do \
not complain about incomplete prompts.";

/// The paper's judge prompt of the reflection verifier; the partial prompt and the first
/// sentence of the guessed answer follow it.
pub const JUDGE_PROMPT: &str = "You are given an incomplete prompt and the model's speculative \
partial answer. Please judge whether the partial prompt is consistent with the model's answer.";

/// How the previous guess is judged against a new partial prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verifier {
    /// Keep guessed tokens while each is the model's argmax: lossless, the final answer is
    /// exactly the model's greedy answer to the full prompt.
    Greedy,
    /// Keep guessed tokens while each is among the model's `k` most likely (lossy; k = 3 in
    /// the paper).
    TopK(usize),
    /// Ask the model whether the guessed first sentence is consistent with the prompt (the
    /// paper's judge prompt, P("yes") against P("no") in one forward); if so keep the whole
    /// first sentence, else fall back to greedy (lossy).
    Reflection,
}

/// How tokens are generated after the kept part of the guess. All are greedy: they give the
/// same tokens and differ in forward passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continuation {
    /// One forward per token.
    Autoregressive,
    /// Jacobi decoding over a window of guessed tokens, seeded with the rejected rest of the
    /// previous guess.
    Jacobi { window: usize },
    /// Draft-model speculative decoding with draft length `gamma` (beyond the paper; needs a
    /// draft model, see [`PredGen::with_draft`]).
    DraftModel { gamma: usize },
    /// Drafts copied from tokens already seen (beyond the paper): where the answer's last
    /// tokens occurred in the turn's discarded guesses (the newest first) or earlier in the
    /// conversation, what followed them there, at most `max_draft` tokens, cut to the length
    /// the measured forward costs and the observed acceptance pay for
    /// ([`spec_core::LookupDrafter`]). Costs no forward.
    Lookup { max_draft: usize },
    /// Drafts from the model's multi-token prediction heads (beyond the paper; needs heads
    /// trained for the model, see [`PredGen::with_heads`]): every verifying forward also gives
    /// the hidden state the heads guess the next tokens from, so drafting costs no forward.
    /// Runs copied from the turn's guesses, as [`Continuation::Lookup`] drafts them, are
    /// verified in the same forward beside the heads' guesses.
    Heads,
}

impl std::str::FromStr for Verifier {
    type Err = Error;

    /// `greedy`, `topK` (e.g. `top3`) or `reflection`.
    fn from_str(text: &str) -> Result<Self> {
        let k = text.strip_prefix("top").map(str::parse::<usize>);
        match (text, k) {
            ("greedy", _) => Ok(Self::Greedy),
            ("reflection", _) => Ok(Self::Reflection),
            (_, Some(Ok(k))) if k > 0 => Ok(Self::TopK(k)),
            _ => Err(Error::Input(format!(
                "unknown verifier `{text}` (greedy, topK with K ≥ 1, reflection)"
            ))),
        }
    }
}

impl std::str::FromStr for Continuation {
    type Err = Error;

    /// `ar`, `jacobi` or `jacobi:WINDOW` (default 8), `draft` or `draft:GAMMA` (default 3),
    /// `lookup` or `lookup:MAX_DRAFT` (default 8), `heads`.
    fn from_str(text: &str) -> Result<Self> {
        let (name, value) = text.split_once(':').unwrap_or((text, ""));
        let number = |default: usize| -> Result<usize> {
            match value {
                "" => Ok(default),
                v => v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    Error::Input(format!("`{v}` in `{text}` is not a positive number"))
                }),
            }
        };
        Ok(match name {
            "ar" => Self::Autoregressive,
            "jacobi" => Self::Jacobi { window: number(8)? },
            "draft" => Self::DraftModel { gamma: number(3)? },
            "lookup" => Self::Lookup {
                max_draft: number(8)?,
            },
            "heads" if value.is_empty() => Self::Heads,
            _ => {
                return Err(Error::Input(format!(
                    "unknown continuation `{text}` (ar, jacobi[:WINDOW], draft[:GAMMA], lookup[:MAX_DRAFT], heads)"
                )))
            }
        })
    }
}

/// Settings of a [`PredGen`] session.
#[derive(Clone, Debug, PartialEq)]
pub struct PredGenConfig {
    pub verifier: Verifier,
    /// [`Continuation::Lookup`] by default: it costs no forward, so it never delays an answer
    /// by more than the forwards it saves (voice questions: 1.94× the cascade's audio latency
    /// against one token per forward's 1.76×, same run; no turn slower than the cascade's).
    pub continuation: Continuation,
    /// System prompt of every turn (partial prompts and the final one alike, so that the cache
    /// of the conversation is shared and greedy PredGen answers exactly as the plain cascade
    /// does); [`PARTIAL_INPUT_SYSTEM_PROMPT`] by default.
    pub system_prompt: String,
    /// Tokens generated per step while input is still arriving, before checking for new input.
    /// Replayed and live turns abandon a step in flight at the final partial within a layer;
    /// where a step cannot be interrupted (partials handed over with [`PredGen::hear`]), one
    /// still running when the input ends delays the answer by up to this many forwards (on
    /// average half of them), so the default is 1 rather than the reference implementation's
    /// 10: a forward of a 1.5B model takes about 30 ms on a 2-core CPU, 5 % of a short
    /// question's answer latency, against a few ms on a GPU; a step costs nothing besides its
    /// forwards.
    pub tokens_per_step: usize,
    /// Most tokens guessed ahead while input arrives; speculation also stops once the guess
    /// holds a complete first sentence. Longer guesses cost more to verify.
    pub max_guess_tokens: usize,
    /// Most tokens of an answer.
    pub max_answer_tokens: usize,
    /// Decide from the model's measured forward costs (measured once per model and cached
    /// beside its weights) how many guessed tokens each verification carries, whether Jacobi
    /// decoding is worth running, and the draft model's draft lengths, so that speculating
    /// never costs more than it is expected to save. Off: every verification carries the whole
    /// guess and the continuation always runs as configured (the paper's algorithm).
    pub cost_aware: bool,
    /// Guess the end of the question (beyond the paper): on each partial prompt the model
    /// first continues the user's words up to its end of turn, and the guessed answer answers
    /// that completed question; while new words fit the completion, the guess stands without
    /// a check, and if the user ends the question as guessed, the guess is the answer with no
    /// verification at all. Greedy PredGen stays lossless: an answer for another question is
    /// verified against the real one as always. The completion runs a token a step (at most
    /// [`MAX_COMPLETION_TOKENS`]), so even where a step cannot be interrupted, one still
    /// running at the last word delays the answer by one forward at most; it goes on while the
    /// newer words heard are the ones it foresaw, and starts again from them otherwise.
    pub complete_questions: bool,
    /// With `complete_questions`, how many candidate completions of the question are answered
    /// ahead (beyond the paper): the likeliest completed questions, found by a beam search of
    /// this width over the model's completions of the words heard, each answered greedily as
    /// soon as it is complete, all advancing together, one forward per step
    /// ([`spec_core::Branches`]); at the last word the one the user asked is the answer, with
    /// nothing to verify. A forward of a few tokens costs little more than one on a CPU, and
    /// the asked question is often the second or third likeliest completion. Every
    /// candidate's first sentence goes to TTS ahead of time. 1: the greedy completion alone,
    /// answered with the configured continuation and verifier.
    pub question_candidates: usize,
    /// Estimate on every partial how likely the user's turn ends there ([`EndOfTurn`], beyond
    /// the paper): one forward over the prompt up to the user's words, in cascade turns too,
    /// whose most likely token starts the question's completion. A voice pipeline's
    /// semantic end of turn reads it ([`PredGen::end_of_turn`]). Off by default.
    pub estimate_end_of_turn: bool,
    /// Report a long first sentence's first piece for speech as soon as no later token can
    /// change it ([`EventKind::FirstPiece`], `spec_voice::settled_first_piece`), so its audio
    /// is made while the model writes the rest of the sentence; off, the piece waits for the
    /// whole sentence. On by default.
    pub first_piece_early: bool,
}

impl Default for PredGenConfig {
    fn default() -> Self {
        Self {
            verifier: Verifier::Greedy,
            continuation: Continuation::Lookup { max_draft: 8 },
            system_prompt: PARTIAL_INPUT_SYSTEM_PROMPT.to_string(),
            tokens_per_step: 1,
            max_guess_tokens: 48,
            max_answer_tokens: 256,
            cost_aware: true,
            complete_questions: true,
            question_candidates: 1,
            estimate_end_of_turn: false,
            first_piece_early: true,
        }
    }
}

impl PredGenConfig {
    /// The default settings with another verifier.
    pub fn with_verifier(verifier: Verifier) -> Self {
        Self {
            verifier,
            ..Self::default()
        }
    }

    /// Checks every value's range.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::Config(format!("PredGen: {what}")));
        match (self.verifier, self.continuation) {
            (Verifier::TopK(0), _) => bad("the top-k verifier needs k >= 1"),
            (_, Continuation::Jacobi { window: 0 }) => bad("the Jacobi window must be >= 1"),
            (_, Continuation::DraftModel { gamma: 0 }) => bad("the draft length must be >= 1"),
            (_, Continuation::Lookup { max_draft: 0 }) => {
                bad("the lookup draft length must be >= 1")
            }
            _ if self.tokens_per_step == 0 => bad("tokens_per_step must be >= 1"),
            _ if self.max_guess_tokens == 0 => bad("max_guess_tokens must be >= 1"),
            _ if self.max_answer_tokens == 0 => bad("max_answer_tokens must be >= 1"),
            _ if self.question_candidates == 0 => bad("question_candidates must be >= 1"),
            _ => Ok(()),
        }
    }
}

/// Word-level ROUGE-L F1 of two texts (longest common subsequence of their words): 1 for the
/// same words in the same order, 0 for nothing in common. Used to compare an answer with the
/// plain cascade's.
pub fn answer_similarity(a: &str, b: &str) -> f64 {
    let a: Vec<&str> = a.split_whitespace().collect();
    let b: Vec<&str> = b.split_whitespace().collect();
    if a.is_empty() || b.is_empty() {
        return if a.len() == b.len() { 1.0 } else { 0.0 };
    }
    let mut row = vec![0usize; b.len() + 1];
    for x in &a {
        let mut diagonal = 0;
        for (j, y) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if x == y {
                diagonal + 1
            } else {
                above.max(row[j])
            };
            diagonal = above;
        }
    }
    let lcs = row[b.len()] as f64;
    let (precision, recall) = (lcs / a.len() as f64, lcs / b.len() as f64);
    if lcs == 0.0 {
        0.0
    } else {
        2.0 * precision * recall / (precision + recall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn similarity_of_answers() {
        assert_eq!(answer_similarity("a b c", "a b c"), 1.0);
        assert_eq!(answer_similarity("a b c", "d e"), 0.0);
        assert_eq!(answer_similarity("", ""), 1.0);
        assert_eq!(answer_similarity("", "a"), 0.0);
        // LCS "a c" of 3 and 2 words: P = 2/3, R = 1, F1 = 0.8.
        assert!((answer_similarity("a b c", "a c") - 0.8).abs() < 1e-12);
        assert_eq!(
            answer_similarity("x y z", "z y x"),
            answer_similarity("z y x", "x y z")
        );
    }

    #[test]
    fn configs_are_checked() {
        assert!(PredGenConfig::default().validate().is_ok());
        assert!(PredGenConfig::with_verifier(Verifier::TopK(0))
            .validate()
            .is_err());
        let jacobi = PredGenConfig {
            continuation: Continuation::Jacobi { window: 0 },
            ..PredGenConfig::default()
        };
        assert!(jacobi.validate().is_err());
        let steps = PredGenConfig {
            tokens_per_step: 0,
            ..PredGenConfig::default()
        };
        assert!(steps.validate().is_err());
    }

    #[test]
    fn verifiers_and_continuations_parse_from_their_names() {
        assert_eq!("greedy".parse::<Verifier>().unwrap(), Verifier::Greedy);
        assert_eq!("top3".parse::<Verifier>().unwrap(), Verifier::TopK(3));
        assert_eq!(
            "reflection".parse::<Verifier>().unwrap(),
            Verifier::Reflection
        );
        for bad in ["top0", "top", "topx", "Greedy", ""] {
            assert!(bad.parse::<Verifier>().is_err(), "{bad}");
        }
        assert_eq!(
            "ar".parse::<Continuation>().unwrap(),
            Continuation::Autoregressive
        );
        assert_eq!(
            "jacobi".parse::<Continuation>().unwrap(),
            Continuation::Jacobi { window: 8 }
        );
        assert_eq!(
            "draft:5".parse::<Continuation>().unwrap(),
            Continuation::DraftModel { gamma: 5 }
        );
        assert_eq!(
            "lookup".parse::<Continuation>().unwrap(),
            Continuation::Lookup { max_draft: 8 }
        );
        assert_eq!(
            "heads".parse::<Continuation>().unwrap(),
            Continuation::Heads
        );
        for bad in ["jacobi:0", "draft:x", "lookup:0", "heads:3", "beam"] {
            assert!(bad.parse::<Continuation>().is_err(), "{bad}");
        }
    }
}
