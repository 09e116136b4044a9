//! Speak a question into PredGen and watch the answer being prepared while you talk.
//!
//! ```sh
//! cargo run --release -p engine-llm --example predgen -- \
//!     --question "What are three tips for staying productive while working from home?"
//! cargo run --release -p engine-llm --example predgen -- --verifier top3 \
//!     --partials engine-llm/data/partials.txt
//! cargo run --release -p engine-llm --example predgen -- --continuation draft \
//!     --draft qwen2.5-coder-0.5b-instruct --question "How do vaccines work?"
//! cargo run --release -p engine-llm --example predgen -- --continuation heads \
//!     --question "How do vaccines work?"   # after `cargo xtask train-heads MODEL …`
//! cargo run --release -p engine-llm --example predgen -- --live \
//!     --question "How often should I water a snake plant?"
//! ```
//!
//! The question is revealed word by word at a speaking rate (or replayed from a file of ASR
//! partials); each turn prints PredGen's timeline, then the plain cascade's latency on the same
//! question for comparison. Time is simulated: it advances by the measured compute of each step
//! and skips ahead while the model waits for the next word. With `--live` the words are spoken
//! in real time from another thread instead and PredGen runs on the wall clock, printing each
//! event as it happens (the live pipeline's way of driving it).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use engine_llm::predgen::{
    partial_channel, spoken_at_rate, FixedLatencySynthesizer, Partial, PartialReceiver,
};
use engine_llm::spec_voice::{read_partials, DEFAULT_CHARS_PER_MINUTE};
use engine_llm::{
    Continuation, LanguageModel, LoadOptions, Message, PredGen, PredGenConfig, SpokenTurn, Verifier,
};
use spec_cli::{init_logging, open_model, HeadsArgs, ModelArgs};
use spec_core::report::latency_speedup;
use spec_core::{Decoder, LogitRows};

/// Speak a question into PredGen and watch the answer being prepared while you talk.
#[derive(Parser)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["question", "partials"])))]
struct Args {
    #[command(flatten)]
    model: ModelArgs,

    /// Draft model for `--continuation draft` [default: qwen2.5-coder-0.5b-instruct there]
    #[arg(long)]
    draft: Option<String>,

    /// How the guess is verified on each new partial prompt: greedy, topK (e.g. top3),
    /// reflection
    #[arg(long, default_value = "greedy")]
    verifier: Verifier,

    /// How the answer is continued after the kept guess: lookup[:MAX_DRAFT], ar,
    /// jacobi[:WINDOW], draft[:GAMMA], heads
    #[arg(long, default_value = "lookup")]
    continuation: Continuation,

    #[command(flatten)]
    heads: HeadsArgs,

    /// Candidate completions of the question answered ahead (1: the greedy completion alone)
    #[arg(long, default_value_t = PredGenConfig::default().question_candidates)]
    question_candidates: usize,

    /// A question to speak word by word (repeat for a conversation)
    #[arg(long)]
    question: Vec<String>,

    /// A file of timed ASR partials to replay instead
    #[arg(long)]
    partials: Option<PathBuf>,

    /// Speaking rate of --question in characters per minute
    #[arg(long, default_value_t = DEFAULT_CHARS_PER_MINUTE)]
    rate: f64,

    /// Latency of the stand-in speech synthesizer, in milliseconds
    #[arg(long, default_value_t = 200)]
    tts_latency: u64,

    /// Most tokens per answer
    #[arg(long, default_value_t = PredGenConfig::default().max_answer_tokens)]
    max_tokens: usize,

    /// Skip the plain cascade's run on the same questions
    #[arg(long)]
    no_baseline: bool,

    /// Speak the words in real time and run PredGen on the wall clock
    #[arg(long)]
    live: bool,
}

impl Args {
    fn config(&self) -> PredGenConfig {
        PredGenConfig {
            verifier: self.verifier,
            continuation: self.continuation,
            max_answer_tokens: self.max_tokens,
            question_candidates: self.question_candidates,
            ..PredGenConfig::default()
        }
    }

    fn turns(&self) -> Result<Vec<Vec<Partial>>> {
        Ok(match &self.partials {
            Some(path) => read_partials(path)?,
            None => self
                .question
                .iter()
                .map(|q| spoken_at_rate(q, self.rate))
                .collect::<Result<_, _>>()?,
        })
    }

    fn draft(&self) -> Option<String> {
        match (&self.draft, self.continuation) {
            (Some(draft), _) => Some(draft.clone()),
            (None, Continuation::DraftModel { .. }) => Some("qwen2.5-coder-0.5b-instruct".into()),
            (None, _) => None,
        }
    }
}

fn summary(label: &str, turn: &SpokenTurn) -> String {
    format!(
        "{label:<10} TTFS {:>6.0} ms  NFETFS {:>3}  audio latency {:>6.0} ms  answer {:>6.0} ms  \
         tokens during input {:>3}",
        turn.turn.time_to_first_sentence.as_secs_f64() * 1e3,
        turn.turn.forwards_to_first_sentence,
        turn.audio_latency().as_secs_f64() * 1e3,
        turn.turn.answer_latency.as_secs_f64() * 1e3,
        turn.turn.tokens_during_input
    )
}

/// Speaks `partials` in real time from another thread: each is sent at its time.
fn speak(partials: Vec<Partial>) -> PartialReceiver {
    let (sender, receiver) = partial_channel();
    std::thread::spawn(move || {
        let start = Instant::now();
        for partial in partials {
            std::thread::sleep(partial.at.saturating_sub(start.elapsed()));
            if sender.send(partial).is_err() {
                return;
            }
        }
    });
    receiver
}

fn warm_up(model: &mut LanguageModel) -> Result<()> {
    let prompt = model.chat_prompt(&[Message::user("Hello!")])?;
    model.model.forward_tokens(&prompt, LogitRows::Last(1))?;
    model.model.reset();
    Ok(())
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let config = args.config();
    let turns = args.turns()?;
    let mut model = args.model.open()?;
    let mut draft = match args.draft() {
        Some(name) => Some(open_model(&name, &LoadOptions::default())?),
        None => None,
    };
    let mut heads = match config.continuation {
        Continuation::Heads => Some(args.heads.drafter(&model, &args.model.model)?),
        _ => None,
    };
    // The first forward repacks the weights (seconds for the 1.5B): do it before timing.
    warm_up(&mut model)?;
    if let Some(draft) = draft.as_mut() {
        warm_up(draft)?;
    }
    let mut tts = FixedLatencySynthesizer::new(Duration::from_millis(args.tts_latency));
    let mut predgen_turns = Vec::new();
    {
        let mut session = PredGen::new(&mut model, config.clone())?;
        if let Some(draft) = draft.as_mut() {
            session = session.with_draft(draft)?;
        }
        if let Some(heads) = heads.take() {
            session = session.with_heads(heads)?;
        }
        for inputs in &turns {
            println!(
                "\n=== PredGen ({:?}, {:?}{}) ===",
                config.verifier,
                config.continuation,
                if args.live { ", live" } else { "" }
            );
            let turn = if args.live {
                session.live_turn(&speak(inputs.clone()), &mut tts, &mut |event| {
                    println!("{event}");
                })?
            } else {
                let turn = session.turn(inputs, &mut tts)?;
                for event in &turn.turn.timeline {
                    println!("{event}");
                }
                turn
            };
            println!("\nanswer: {}\n", turn.turn.answer);
            predgen_turns.push(turn);
        }
    }
    if !args.no_baseline {
        let mut session = PredGen::new(&mut model, config.clone())?;
        let mut rows = Vec::new();
        for (inputs, predgen) in turns.iter().zip(&predgen_turns) {
            let baseline = session.baseline_turn(inputs, &mut tts)?;
            println!("question: {}", baseline.turn.question);
            println!("{}", summary("PredGen", predgen));
            println!("{}\n", summary("cascade", &baseline));
            rows.push((baseline, predgen));
        }
        println!(
            "| question | cascade audio latency | PredGen audio latency | speed-up | same answer |"
        );
        println!("|---|---|---|---|---|");
        for (baseline, predgen) in rows {
            let (before, after) = (
                baseline.audio_latency().as_secs_f64(),
                predgen.audio_latency().as_secs_f64(),
            );
            println!(
                "| {} | {:.0} ms | {:.0} ms | {} | {} |",
                baseline.turn.question,
                before * 1e3,
                after * 1e3,
                latency_speedup(before, after),
                if predgen.turn.answer == baseline.turn.answer {
                    "yes"
                } else {
                    "no"
                }
            );
        }
    }
    Ok(())
}
