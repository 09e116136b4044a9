//! `cargo xtask demo`: what SpecVoice is for, in one command. A few questions are spoken into
//! PredGen at a speaking rate; each turn's timeline is printed, then the latency against the
//! plain cascade (wait for the question, generate, synthesize) on the same model. Then the
//! questions are spoken aloud by espeak-ng and answered from the audio by `specvoice chat`
//! (Whisper → PredGen → speech), each question's and answer's audio written to a folder and,
//! with `--play`, played.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use spec_models::Store;

use crate::models;

/// The default chat model: the one `../shared/models/fetch` provides.
const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b-instruct";
/// The recognizer `specvoice chat` listens with by default.
const WHISPER: &str = "whisper-tiny.en-ct2";
/// Most tokens of an answer, in the typed and the spoken runs alike. Short answers keep the
/// demo to a few minutes on a 2-core CPU; the latency that matters, to the first sentence's
/// audio, does not depend on it.
const MAX_TOKENS: &str = "96";
/// Audio players tried in turn for `--play`.
const PLAYERS: [&str; 2] = ["aplay", "paplay"];

const QUESTIONS: [&str; 3] = [
    "What is the capital of France, and what is it famous for?",
    "Can you give me three tips for sleeping better at night?",
    "How long should I boil an egg if I want the yolk to stay soft?",
];

/// `cargo xtask demo`'s options.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// The chat model (a registry name is downloaded when missing)
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,

    /// Questions to also ask aloud (espeak-ng → `specvoice chat`), 0 for none
    #[arg(long, default_value_t = QUESTIONS.len() as u64, value_parser = clap::value_parser!(u64).range(0..=QUESTIONS.len() as u64))]
    spoken: u64,

    /// Folder for the spoken questions and answers (question-N.wav, answer-N.wav)
    #[arg(long, default_value = "results/demo")]
    out: PathBuf,

    /// Play each spoken question and its answer (aplay or paplay)
    #[arg(long)]
    play: bool,

    /// Arguments passed on to the predgen example (after `--`)
    #[arg(last = true)]
    extra: Vec<String>,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let model = &args.model;
    let store = Store::from_env()?;
    let player = if args.spoken > 0 {
        check_spoken_prerequisites(&store)?;
        args.play.then(player).flatten()
    } else {
        None
    };
    if let Err(missing) = store.resolve(model) {
        if store.registry().get(model).is_none() {
            return Err(missing).with_context(|| format!("cannot use `{model}`"));
        }
        println!(
            "`{model}` is not in {}: downloading it",
            store.root().display()
        );
        models::download(std::slice::from_ref(model))?;
    }
    let mut command = Command::new(crate::cargo());
    command.args([
        "run",
        "--quiet",
        "--release",
        "-p",
        "engine-llm",
        "--example",
        "predgen",
        "--",
        "--model",
        model,
    ]);
    command.args(["--max-tokens", MAX_TOKENS]);
    for question in QUESTIONS {
        command.args(["--question", question]);
    }
    command.args(&args.extra);
    let status = command.status().context("running the predgen example")?;
    if !status.success() {
        bail!("the predgen example failed ({status})");
    }
    if args.spoken > 0 {
        speak_questions(args, player.as_deref())?;
    }
    Ok(())
}

/// Fails early, saying how to get them, when espeak-ng or the Whisper model is missing.
fn check_spoken_prerequisites(store: &Store) -> Result<()> {
    let espeak = Command::new("espeak-ng").arg("--version").output();
    if !espeak.is_ok_and(|o| o.status.success()) {
        bail!(
            "the spoken questions need espeak-ng (apt-get install espeak-ng); \
             or run with --spoken 0"
        );
    }
    if let Err(missing) = store.resolve(WHISPER) {
        return Err(missing).with_context(|| {
            format!(
                "the spoken questions need {WHISPER}: run ../shared/models/fetch or \
                 cargo xtask download {WHISPER} (cargo xtask models lists what is there); \
                 or run with --spoken 0"
            )
        });
    }
    Ok(())
}

/// The first of [`PLAYERS`] on the `PATH`; None, saying so, when there is none.
fn player() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .flat_map(|dir| PLAYERS.iter().map(move |p| dir.join(p)))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        println!(
            "--play: neither {} is installed (apt-get install alsa-utils or pulseaudio-utils); \
             the audio is only written",
            PLAYERS.join(" nor ")
        );
    }
    found
}

/// Speaks the first `args.spoken` questions into WAVs with espeak-ng, answers each with
/// `specvoice chat`, and writes (and plays) the questions and answers.
fn speak_questions(args: &DemoArgs, player: Option<&Path>) -> Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| args.out.display().to_string())?;
    let mut written = Vec::new();
    for (i, text) in QUESTIONS.iter().take(args.spoken as usize).enumerate() {
        let question = args.out.join(format!("question-{}.wav", i + 1));
        let answer = args.out.join(format!("answer-{}.wav", i + 1));
        println!("\n== spoken question {}: {text}", i + 1);
        let status = Command::new("espeak-ng")
            .arg("-w")
            .arg(&question)
            .arg(text)
            .status()
            .context("running espeak-ng")?;
        if !status.success() {
            bail!("espeak-ng failed ({status}) on {}", question.display());
        }
        let status = Command::new(crate::cargo())
            .args(["run", "--quiet", "--release", "-p", "specvoice", "--"])
            .args(["chat", "--model", &args.model, "--asr", WHISPER])
            .args(["--max-tokens", MAX_TOKENS, "--audio"])
            .arg(&question)
            .arg("--out")
            .arg(&answer)
            .status()
            .context("running specvoice chat")?;
        if !status.success() {
            bail!("specvoice chat failed ({status}) on {}", question.display());
        }
        if let Some(player) = player {
            for wav in [&question, &answer] {
                play(player, wav);
            }
        }
        written.push((question, answer));
    }
    println!("\nThe spoken questions and their answers:");
    for (question, answer) in &written {
        println!("  {}  →  {}", question.display(), answer.display());
    }
    Ok(())
}

/// Plays `wav`; a failure (no sound device, say) is reported, not fatal: the file is written.
fn play(player: &Path, wav: &Path) {
    match Command::new(player).arg(wav).status() {
        Ok(status) if status.success() => {}
        Ok(status) => println!(
            "{} failed ({status}) on {}",
            player.display(),
            wav.display()
        ),
        Err(e) => println!("could not run {}: {e}", player.display()),
    }
}
