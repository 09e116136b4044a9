//! `cargo xtask demo`: what SpecVoice is for, in one command. A few questions are spoken into
//! PredGen at a speaking rate; each turn's timeline is printed, then the latency against the
//! plain cascade (wait for the question, generate, synthesize) on the same model. Then the
//! questions are spoken aloud by espeak-ng and answered from the audio by `specvoice chat`
//! (Whisper → PredGen → speech, in Kokoro's voice when its files and ONNX Runtime are in the
//! models folder, espeak-ng's otherwise), each question's and answer's audio written to a
//! folder and, with `--play`, played. What is missing first (models, espeak-ng, the release
//! build) is done by [`crate::setup`], saying so.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::setup::{self, CHAT_MODEL, WHISPER};

/// Most tokens of an answer, in the typed and the spoken runs alike. Short answers keep the
/// demo to a few minutes on a 2-core CPU; the latency that matters, to the first sentence's
/// audio, does not depend on it.
const MAX_TOKENS: &str = "96";
/// Audio players tried in turn for `--play`.
const PLAYERS: [&str; 2] = ["aplay", "paplay"];
/// The voice `auto` answers with when Kokoro can speak.
const KOKORO_VOICE: &str = "kokoro:af_heart";

const QUESTIONS: [&str; 3] = [
    "What is the capital of France, and what is it famous for?",
    "Can you give me three tips for sleeping better at night?",
    "How long should I boil an egg if I want the yolk to stay soft?",
];

/// `cargo xtask demo`'s options.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// The chat model (a registry name is downloaded when missing)
    #[arg(long, default_value = CHAT_MODEL)]
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

    /// The answers' voice: auto (Kokoro's af_heart when its files and ONNX Runtime are in the
    /// models folder, espeak-ng otherwise), kokoro:NAME, piper:NAME or espeak; `list` lists the
    /// voices here
    #[arg(long, default_value = "auto")]
    voice: String,

    /// Arguments passed on to the predgen example (after `--`)
    #[arg(last = true)]
    extra: Vec<String>,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let model = &args.model;
    let mut models = vec![model.clone()];
    if args.spoken > 0 {
        models.push(WHISPER.to_string());
    }
    setup::ensure_models(&models)?;
    let spoken = if args.spoken > 0 && !setup::ensure_espeak()? {
        println!("the spoken questions are skipped; the typed ones run");
        0
    } else {
        args.spoken
    };
    let player = (spoken > 0 && args.play).then(player).flatten();
    let programs = setup::build_release()?;
    if args.voice == "list" {
        println!("{}", voices(&programs.specvoice)?.join("\n"));
        return Ok(());
    }
    let voice = match spoken {
        0 => args.voice.clone(),
        _ => answer_voice(&args.voice, &programs.specvoice)?,
    };
    println!(
        "\n== {} typed questions, spoken into PredGen at a speaking rate, then the plain cascade",
        QUESTIONS.len()
    );
    let mut command = Command::new(&programs.predgen);
    command.args(["--model", model]);
    command.args(["--max-tokens", MAX_TOKENS]);
    for question in QUESTIONS {
        command.args(["--question", question]);
    }
    command.args(&args.extra);
    let status = command.status().context("running the predgen example")?;
    if !status.success() {
        bail!("the predgen example failed ({status})");
    }
    if spoken > 0 {
        speak_questions(args, spoken, &voice, &programs.specvoice, player.as_deref())?;
    }
    Ok(())
}

/// The voices `specvoice` finds in the models folder, by the names `--voice` takes.
fn voices(specvoice: &Path) -> Result<Vec<String>> {
    let output = Command::new(specvoice)
        .args(["serve", "--voice", "list"])
        .output()
        .context("running specvoice serve --voice list")?;
    if !output.status.success() {
        bail!(
            "specvoice serve --voice list failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// The voice the answers are spoken in, said once: `auto` is Kokoro's af_heart when Kokoro can
/// speak (its files and ONNX Runtime are in the models folder), espeak-ng otherwise; any other
/// name is taken as it is.
fn answer_voice(choice: &str, specvoice: &Path) -> Result<String> {
    if choice != "auto" {
        println!("the answers are spoken by {choice}");
        return Ok(choice.to_string());
    }
    if voices(specvoice)?.iter().any(|v| v == KOKORO_VOICE) {
        println!("the answers are spoken by Kokoro ({KOKORO_VOICE})");
        return Ok(KOKORO_VOICE.to_string());
    }
    println!(
        "the answers are spoken by espeak-ng: Kokoro's files or ONNX Runtime are not in the \
         models folder (`cargo xtask models` lists kokoro-82m and onnxruntime, and how to get them)"
    );
    Ok("espeak".to_string())
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

/// Speaks the first `spoken` questions into WAVs with espeak-ng, answers each with
/// `specvoice chat` in `voice`, and writes (and plays) the questions and answers.
fn speak_questions(
    args: &DemoArgs,
    spoken: u64,
    voice: &str,
    specvoice: &Path,
    player: Option<&Path>,
) -> Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| args.out.display().to_string())?;
    let mut written = Vec::new();
    for (i, text) in QUESTIONS.iter().take(spoken as usize).enumerate() {
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
        let status = Command::new(specvoice)
            .args(["chat", "--model", &args.model, "--asr", WHISPER])
            .args(["--max-tokens", MAX_TOKENS, "--voice", voice, "--audio"])
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
