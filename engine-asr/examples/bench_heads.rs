//! Benchmark of multi-token prediction heads on Whisper ("Faster Speech-LLaMA Inference with
//! Multi-token Prediction"): greedy decoding against decoding with trained heads (greedy
//! acceptance as a chain and as a branching tree: lossless; top-k and threshold acceptance:
//! lossy) in the same run, on the real clips and on sentences spoken by espeak-ng that the
//! heads never saw. Reports the paper's decoder forwards per word (eq. 13), acceptance per
//! head, decoder time split between heads and target, WER and identical transcripts.
//!
//! ```sh
//! cargo run --release -p engine-asr --example bench_heads -- [--models whisper-tiny.en-ct2,whisper-base-ct2]
//!     [--heads latent-4] [--repeats 3] [--chains 1,2] [--json PATH]
//! ```
//!
//! The heads come from `cargo xtask train-heads MODEL` (`$SPECVOICE_MODELS/heads/MODEL-KIND-COUNT`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::Parser;
use engine_asr::normalize::EnglishTextNormalizer;
use engine_asr::wer::word_errors;
use engine_asr::whisper::model_fingerprint;
use engine_asr::{LoadOptions, TranscribeOptions, Transcriber};
use spec_core::heads::{HeadsDrafter, HeadsTree};
use spec_core::report::{speedup, Report, Table};
use spec_core::{AcceptanceRule, DecodeStats};
use spec_models::{Registry, Store};
use spec_nn::heads::{training_command, MultiTokenHeads};

// The clips' paths are for bench_asr's peers.
#[allow(dead_code)]
#[path = "common/speech_sets.rs"]
mod speech_sets;
use speech_sets::{clips, fastest_transcript, spoken_set, Clip};

#[derive(Parser, Debug)]
#[command(about = "Whisper with multi-token prediction heads against greedy decoding")]
struct Args {
    /// Models (names in the models folder).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "whisper-tiny.en-ct2,whisper-base-ct2"
    )]
    models: Vec<String>,
    /// Heads of each model: `$SPECVOICE_MODELS/heads/MODEL-<this>`.
    #[arg(long, default_value = "latent-4")]
    heads: String,
    /// Runs per clip and system; the fastest decoder time counts.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Sentences of the spoken test set.
    #[arg(long, default_value_t = 40)]
    spoken_sentences: usize,
    /// Top-k verification's k.
    #[arg(long, default_value_t = 3)]
    top_k: usize,
    /// Threshold acceptance's least target probability.
    #[arg(long, default_value_t = 0.1)]
    threshold: f32,
    /// Also the chain with greedy acceptance drafting only the depths whose head is at least
    /// this sure of its guess, once per value.
    #[arg(long, value_delimiter = ',', default_values_t = [0.4, 0.7])]
    min_probability: Vec<f32>,
    /// Also shorter chains with greedy acceptance, once per length (e.g. `1,2`): fewer rows
    /// to verify per step, only the surest heads.
    #[arg(long, value_delimiter = ',')]
    chains: Vec<usize>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One way of decoding.
struct System {
    name: String,
    tree: Option<HeadsTree>,
    rule: Option<AcceptanceRule>,
    /// A head drafts only when at least this sure of its guess.
    min_probability: f32,
}

/// What a system did on a set.
#[derive(Default)]
struct Outcome {
    texts: Vec<String>,
    forwards: usize,
    decoder_time: Duration,
    heads: DecodeStats,
}

const COLUMNS: [&str; 11] = [
    "model",
    "decoding",
    "forwards/word (eq. 13)",
    "fewer forwards",
    "decoder time",
    "decoder speed-up",
    "heads' share",
    "tokens/forward",
    "accepted at depth 1…K",
    "WER % (Δ)",
    "same text as greedy",
];

fn systems(args: &Args, count: usize) -> Result<Vec<System>> {
    if let Some(&bad) = args.chains.iter().find(|&&d| d == 0 || d > count) {
        bail!("--chains {bad}: a chain is 1 to {count} heads deep");
    }
    let mut systems = vec![
        System {
            name: "greedy".into(),
            tree: None,
            rule: None,
            min_probability: 0.0,
        },
        System {
            name: format!("heads, chain of {count}, greedy acceptance"),
            tree: Some(HeadsTree::chain(count)),
            rule: Some(AcceptanceRule::greedy()),
            min_probability: 0.0,
        },
        System {
            name: format!("heads, tree ({count} deep, 2 wide), greedy acceptance"),
            tree: Some(HeadsTree::branching(count, 2)),
            rule: Some(AcceptanceRule::greedy()),
            min_probability: 0.0,
        },
        System {
            name: format!("heads, chain of {count}, top-{} acceptance", args.top_k),
            tree: Some(HeadsTree::chain(count)),
            rule: Some(AcceptanceRule::top_k(args.top_k)),
            min_probability: 0.0,
        },
        System {
            name: format!("heads, chain of {count}, threshold {}", args.threshold),
            tree: Some(HeadsTree::chain(count)),
            rule: Some(AcceptanceRule::threshold(args.threshold)),
            min_probability: 0.0,
        },
    ];
    // A chain of all the heads is the row above.
    for &length in args.chains.iter().filter(|&&n| n < count) {
        systems.push(System {
            name: format!("heads, chain of {length}, greedy acceptance"),
            tree: Some(HeadsTree::chain(length)),
            rule: Some(AcceptanceRule::greedy()),
            min_probability: 0.0,
        });
    }
    for &p in &args.min_probability {
        systems.push(System {
            name: format!("heads, chain of {count}, depths with p ≥ {p}, greedy acceptance"),
            tree: Some(HeadsTree::chain(count)),
            rule: Some(AcceptanceRule::greedy()),
            min_probability: p,
        });
    }
    systems.retain(|s| s.tree.as_ref().is_none_or(|t| t.depth() <= count));
    Ok(systems)
}

/// Every system on every clip: each clip is decoded by all systems, one after the other,
/// before the next clip, so that the machine's drift over minutes (±15–20 % here) meets every
/// system alike instead of the ones that run last.
fn run(
    transcriber: &mut Transcriber,
    heads: &MultiTokenHeads,
    systems: &[System],
    clips: &[Clip],
    repeats: usize,
) -> Result<Vec<Outcome>> {
    let drafters = systems
        .iter()
        .map(|system| {
            system
                .tree
                .as_ref()
                .map(|tree| {
                    HeadsDrafter::new(heads.clone(), tree.clone())?
                        .with_min_probability(system.min_probability)
                })
                .transpose()
        })
        .collect::<spec_core::Result<Vec<_>>>()?;
    let mut outcomes: Vec<Outcome> = systems.iter().map(|_| Outcome::default()).collect();
    for (i, clip) in clips.iter().enumerate() {
        eprint!("\r   clip {}/{}", i + 1, clips.len());
        for ((system, drafter), outcome) in systems.iter().zip(&drafters).zip(&mut outcomes) {
            if let Some(drafter) = drafter {
                transcriber.set_heads(drafter.clone())?;
            }
            // Greedy decoding without the temperature fallback: the heads accelerate the greedy
            // pass, and a fallback's sampling would swamp the comparison.
            let options = TranscribeOptions {
                language: Some("en".into()),
                temperatures: vec![0.0],
                heads: system.rule,
                ..TranscribeOptions::default()
            };
            let t = fastest_transcript(
                transcriber,
                &clip.samples,
                &options,
                repeats,
                |s| s.decoder_time,
                &mut |_| {},
            )?;
            outcome.forwards += t.stats.forwards;
            outcome.decoder_time += t.stats.decoder_time;
            outcome.heads.merge(&t.stats.heads);
            outcome.texts.push(t.text);
        }
    }
    eprintln!();
    Ok(outcomes)
}

fn words(normalizer: &EnglishTextNormalizer, text: &str) -> usize {
    normalizer.normalize(text).split_whitespace().count()
}

#[allow(clippy::too_many_arguments)]
fn push_rows(
    table: &mut Table,
    model: &str,
    systems: &[System],
    outcomes: &[Outcome],
    clips: &[Clip],
    normalizer: &EnglishTextNormalizer,
    count: usize,
) {
    let reference_words: usize = clips.iter().map(|c| words(normalizer, &c.reference)).sum();
    let greedy = &outcomes[0];
    let wer = |o: &Outcome| {
        let mut errors = 0;
        let mut total = 0;
        for (clip, text) in clips.iter().zip(&o.texts) {
            let e = word_errors(
                &normalizer.normalize(&clip.reference),
                &normalizer.normalize(text),
            );
            errors += e.errors();
            total += e.reference_words;
        }
        100.0 * errors as f64 / total.max(1) as f64
    };
    let per_word = |o: &Outcome| {
        let hypothesis_words: usize = o.texts.iter().map(|t| words(normalizer, t)).sum();
        let f_ref = o.forwards as f64 / reference_words.max(1) as f64;
        let f_hyp = o.forwards as f64 / hypothesis_words.max(1) as f64;
        2.0 / (1.0 / f_ref + 1.0 / f_hyp)
    };
    let greedy_wer = wer(greedy);
    for (system, o) in systems.iter().zip(outcomes) {
        let same = o
            .texts
            .iter()
            .zip(&greedy.texts)
            .filter(|(a, b)| a == b)
            .count();
        let steps = o.heads.steps.len().max(1) as f64;
        let depths: Vec<String> = (1..=count)
            .map(|k| {
                let reached = o.heads.steps.iter().filter(|s| s.accepted >= k).count();
                format!("{:.0}", 100.0 * reached as f64 / steps)
            })
            .collect();
        let heads_share = o.heads.draft_time.as_secs_f64() / o.decoder_time.as_secs_f64();
        let tokens: usize = o.heads.steps.iter().map(|s| s.accepted + 1).sum();
        let is_heads = system.tree.is_some();
        let wer_now = wer(o);
        table.push(vec![
            model.into(),
            system.name.clone(),
            format!("{:.3}", per_word(o)),
            speedup(per_word(greedy), per_word(o)),
            format!("{:.0} ms", o.decoder_time.as_secs_f64() * 1e3),
            speedup(
                greedy.decoder_time.as_secs_f64(),
                o.decoder_time.as_secs_f64(),
            ),
            if is_heads {
                format!("{:.0} %", 100.0 * heads_share)
            } else {
                "–".into()
            },
            if is_heads {
                format!("{:.2}", tokens as f64 / steps)
            } else {
                "1".into()
            },
            if is_heads {
                format!("{} %", depths.join(" / "))
            } else {
                "–".into()
            },
            format!("{wer_now:.2} ({:+.2})", wer_now - greedy_wer),
            format!("{same}/{}", clips.len()),
        ]);
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let normalizer = EnglishTextNormalizer::from_file(&store.data_file("whisper/english.json")?)?;
    let real = clips(&store)?;
    let spoken_dir = tempfile::tempdir()?;
    let Some(spoken) = spoken_set(&store, args.spoken_sentences, spoken_dir.path())? else {
        bail!("the spoken test set needs espeak-ng: apt-get install espeak-ng");
    };
    let sets = [
        ("the real clips of data/speech", &real),
        ("MT-Bench sentences spoken by espeak-ng", &spoken),
    ];
    let mut tables: Vec<Table> = sets
        .iter()
        .map(|(name, clips)| {
            let seconds: f64 = clips.iter().map(|c| c.seconds).sum();
            Table::new(
                format!(
                    "Whisper with multi-token prediction heads on {name} ({} clips, {seconds:.1} s), best of {} run(s) per clip, 2 threads",
                    clips.len(),
                    args.repeats
                ),
                &COLUMNS,
            )
        })
        .collect();
    let mut notes = Vec::new();
    for name in &args.models {
        let model = store.resolve(name)?;
        let heads_dir = store
            .root()
            .join("heads")
            .join(format!("{name}-{}", args.heads));
        let mut transcriber = Transcriber::load(&model.dir, &LoadOptions::default())?;
        let heads = MultiTokenHeads::load(
            &heads_dir,
            transcriber.model(),
            &model_fingerprint(&model.dir)?,
            &Device::Cpu,
        )
        .with_context(|| {
            format!(
                "heads for {name} (train them: {})",
                training_command(name, &args.heads)
            )
        })?;
        let count = heads.info().count;
        notes.push(format!(
            "{name}: {count} {:?} heads, validation top-1 {:?}, trained by `{}`.",
            heads.info().kind,
            heads
                .info()
                .validation_accuracy
                .iter()
                .map(|a| format!("{:.1} %", 100.0 * a))
                .collect::<Vec<_>>(),
            heads.info().trained_for.command
        ));
        let systems = systems(&args, count)?;
        for ((set, clips), table) in sets.iter().zip(&mut tables) {
            eprintln!("== {name} on {set}");
            let outcomes = run(&mut transcriber, &heads, &systems, clips, args.repeats)?;
            push_rows(table, name, &systems, &outcomes, clips, &normalizer, count);
        }
    }
    notes.push("Forwards/word is the paper's eq. 13: the harmonic mean of decoder forwards per reference word and per hypothesis word (prompt forwards included). Decoder time covers the prompt, the heads and the verifying forwards; the encoder is the same for every row. \"Accepted at depth k\" is the share of steps whose accepted path reached depth k. Greedy acceptance is lossless: its transcripts must equal greedy decoding's.".into());
    let report = Report {
        command: format!(
            "cargo run --release -p engine-asr --example bench_heads -- --models {} --heads {} --repeats {} --spoken-sentences {} --top-k {} --threshold {}",
            args.models.join(","),
            args.heads,
            args.repeats,
            args.spoken_sentences,
            args.top_k,
            args.threshold
        ),
        tables,
        notes,
        ..Report::default()
    };
    print!("{}", report.markdown());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
