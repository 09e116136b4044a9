//! Benchmark of the voice pipeline from audio, every system on the same recordings in one run.
//!
//! - **Voice chat**: spoken questions (the voice set's first questions, spoken by espeak-ng) and
//!   the real clips of the models folder, each played into streaming Whisper with end-of-speech
//!   detection, then answered by the plain cascade and by PredGen (greedy, lossless) and spoken
//!   by each voice of `--voices` (espeak-ng and Kokoro by default). Latency is from the end of
//!   speech (the last voiced audio) to the first audio of the answer, broken down into
//!   endpointing (the silence the detector waits for), ASR after the endpoint, the language
//!   model and speech synthesis.
//! - **Live captions**: English sentences spoken by espeak-ng and the LibriVox clips,
//!   transcribed by streaming Whisper into timed partials once, then captioned by AR
//!   re-translation and by SSBD (the library's default) from the same partials.
//!
//! ```sh
//! cargo run --release -p specvoice --example bench_pipeline -- [--questions 40]
//!     [--caption-sentences 8] [--asr whisper-tiny.en-ct2] [--model NAME]
//!     [--voices espeak,kokoro:af_heart] [--json PATH]
//! ```
//!
//! `cargo xtask bench pipeline` runs it and files the results with the machine and date.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use engine_asr::{resample, Audio, LoadOptions as AsrLoadOptions, Transcriber};
use engine_llm::{LoadOptions, PredGen, PredGenConfig};
use engine_mt::{Caption, LiveConfig, LiveTranslator, StreamSummary};
use engine_tts::espeak::{EspeakSettings, EspeakSynthesizer};
use engine_tts::voices::{self, VoiceChoice};
use spec_cli::{init_logging, open_model, progress_bar};
use spec_core::report::{latency_speedup, speedup, Report, Table, NO_WAIT_SECONDS};
use spec_models::{Registry, Store};
use spec_voice::SentenceSynthesizer;
use specvoice::{
    utterances_of, ChatMode, ClockKind, Listener, ListenerConfig, VoiceChat, VoiceTurn,
};

#[derive(Parser)]
struct Args {
    /// Spoken questions: the first question of this many conversations of the voice set
    #[arg(long, default_value_t = 40)]
    questions: usize,

    /// English sentences of the translation set to caption (besides the LibriVox clips)
    #[arg(long, default_value_t = 8)]
    caption_sentences: usize,

    /// Skip the real clips (LibriVox and cards) in both parts
    #[arg(long)]
    no_clips: bool,

    /// Whisper model
    #[arg(long, default_value = "whisper-tiny.en-ct2")]
    asr: String,

    /// Chat and translation model
    #[arg(long, default_value = spec_cli::DEFAULT_MODEL)]
    model: String,

    /// Most tokens per answer
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,

    /// Silence that ends an utterance, in milliseconds
    #[arg(long, default_value_t = 500)]
    silence_ms: u64,

    /// Silence after speech a transcript must include to be final (and the pause that calls
    /// for a partial at once), in milliseconds
    #[arg(long, default_value_t = 150)]
    margin_ms: u64,

    /// Audio between partial transcripts while the user speaks, in milliseconds
    #[arg(long, default_value_t = 500)]
    partial_ms: u64,

    /// Voices that speak the answers (each answers every recording, cascade and PredGen), by
    /// the names `specvoice --voice` takes
    #[arg(long, num_args = 1.., value_delimiter = ',', default_values = ["espeak", "kokoro:af_heart"])]
    voices: Vec<String>,

    /// Also answer every recording with a long first sentence's first piece spoken only once
    /// the whole sentence is written (`PredGenConfig::first_piece_early` off), interleaved
    /// with the default, and report what speaking it early brings
    #[arg(long)]
    first_piece_ab: bool,

    /// Captions' language
    #[arg(long, default_value = "German")]
    to: String,

    /// The voice set
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../engine-llm/data/voice_questions.txt"))]
    voice_questions: PathBuf,

    /// The translation set (English in the first column)
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../engine-mt/data/sentences.tsv"))]
    sentences: PathBuf,

    /// Also write the report as JSON here
    #[arg(long)]
    json: Option<PathBuf>,

    /// Folder for the plot (SVG)
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../results"))]
    plots: PathBuf,
}

/// Silence before each recording, so the endpoint detector hears the room first.
const LEAD_IN: Duration = Duration::from_millis(300);

/// A recording to play: its name, set, 16 kHz samples and what was said.
struct Recording {
    name: String,
    set: &'static str,
    samples: Vec<f32>,
    text: String,
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    let store = Store::new(spec_models::models_dir()?, Registry::builtin());
    let whisper_files = store.resolve(&args.asr)?;
    let mut whisper = Some(
        Transcriber::load(&whisper_files.dir, &AsrLoadOptions::default())
            .with_context(|| format!("loading {}", whisper_files.dir.display()))?,
    );
    let mut model = open_model(&args.model, &LoadOptions::default())?;
    let mut espeak = EspeakSynthesizer::new(EspeakSettings::default())?;

    let mut questions = Vec::new();
    for (i, text) in spec_voice::read_conversations(&args.voice_questions)?
        .into_iter()
        .map(|conversation| conversation[0].clone())
        .take(args.questions)
        .enumerate()
    {
        questions.push(Recording {
            name: format!("q{:02}", i + 1),
            set: "spoken questions (espeak-ng)",
            samples: spoken(&mut espeak, &text)?,
            text,
        });
    }
    if !args.no_clips {
        questions.extend(clips(&store)?);
    }
    let listener_config = ListenerConfig {
        endpoint: specvoice::EndpointConfig {
            silence: Duration::from_millis(args.silence_ms),
            ..specvoice::EndpointConfig::default()
        },
        final_margin: Duration::from_millis(args.margin_ms),
        partial_every: Duration::from_millis(args.partial_ms),
        ..ListenerConfig::default()
    };
    let config = PredGenConfig {
        max_answer_tokens: args.max_tokens,
        ..PredGenConfig::default()
    };

    let models = spec_models::models_dir()?;
    let mut report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        ..Report::default()
    };
    std::fs::create_dir_all(&args.plots)?;
    for name in &args.voices {
        let choice: VoiceChoice = name.parse()?;
        let voice = voices::open_shared(&choice, &models)
            .with_context(|| format!("opening the voice {choice}"))?;
        let mut turns: Vec<(&Recording, VoiceTurn, VoiceTurn)> = Vec::new();
        let mut piece_with_sentence: Vec<(VoiceTurn, VoiceTurn)> = Vec::new();
        let bar = progress_bar(questions.len(), format!("voice chat, {choice}"));
        for (index, recording) in questions.iter().enumerate() {
            let mut play = |mode, config: &PredGenConfig| -> Result<VoiceTurn> {
                let listener =
                    Listener::new(whisper.take().expect("Whisper"), listener_config.clone())?;
                let session = PredGen::new(&mut model, config.clone())?;
                let mut chat = VoiceChat::new(
                    listener,
                    session,
                    Box::new(voice.clone()),
                    mode,
                    ClockKind::Simulated,
                );
                let played = chat.play(&recording.samples, trailing(&listener_config), &mut |_| {});
                whisper = Some(chat.into_parts().0.into_transcriber());
                let mut played = played?;
                ensure!(
                    played.len() == 1,
                    "{}: {} turns heard (one expected)",
                    recording.name,
                    played.len()
                );
                Ok(played.remove(0))
            };
            // Alternating which setting answers first spreads the machine's drift over both.
            let late = PredGenConfig {
                first_piece_early: false,
                ..config.clone()
            };
            let settings: Vec<&PredGenConfig> = match (args.first_piece_ab, index % 2) {
                (false, _) => vec![&config],
                (true, 0) => vec![&config, &late],
                (true, _) => vec![&late, &config],
            };
            let mut answered = Vec::new();
            for setting in &settings {
                let cascade = play(ChatMode::Cascade, setting)?;
                answered.push((cascade, play(ChatMode::PredGen, setting)?));
            }
            if settings.len() == 2 {
                let late_at = usize::from(index % 2 == 0);
                piece_with_sentence.push(answered.remove(late_at));
            }
            let (cascade, predgen) = answered.remove(0);
            turns.push((recording, cascade, predgen));
            bar.inc(1);
        }
        bar.finish_and_clear();
        let voice_name = choice.to_string();
        report.tables.push(chat_table(&turns, &args, &voice_name));
        if args.first_piece_ab {
            report
                .tables
                .push(first_piece_table(&turns, &piece_with_sentence, &voice_name));
        }
        report.details.push(chat_details(&turns, &voice_name));
        let plot = args.plots.join(format!(
            "pipeline-latency-{}.svg",
            voice_name.replace(':', "-")
        ));
        std::fs::write(&plot, breakdown_svg(&turns, &voice_name))
            .with_context(|| format!("writing {}", plot.display()))?;
    }

    // Live captions: the same timed partials for both systems.
    let mut sources: Vec<Recording> = Vec::new();
    for (i, text) in english_sentences(&args.sentences)?
        .into_iter()
        .take(args.caption_sentences)
        .enumerate()
    {
        sources.push(Recording {
            name: format!("s{:02}", i + 1),
            set: "sentences (espeak-ng)",
            samples: spoken(&mut espeak, &text)?,
            text,
        });
    }
    if !args.no_clips {
        sources.extend(
            clips(&store)?
                .into_iter()
                .filter(|c| c.set.contains("LibriVox")),
        );
    }
    let mut listener = Listener::new(whisper.take().expect("Whisper"), listener_config.clone())?;
    let mut updates = Vec::new();
    for source in &sources {
        updates.extend(utterances_of(
            &mut listener,
            &source.samples,
            trailing(&listener_config),
        )?);
    }
    let ssbd = LiveConfig::new(&args.to);
    let ar = LiveConfig::autoregressive(&args.to);
    let bar = progress_bar(updates.len() * 2, "captions");
    let mut captioned: Vec<(&str, StreamSummary, Vec<String>)> = Vec::new();
    for (name, config) in [("AR re-translation", ar), ("SSBD (library default)", ssbd)] {
        let by_characters = config.task.target_uses_characters();
        let mut translator = LiveTranslator::new(&mut model, config)?;
        let mut summary = StreamSummary::default();
        let mut finals = Vec::new();
        for utterance in &updates {
            let captions: Vec<Caption> = translator.sentence(utterance)?;
            summary.add_sentence(&captions, by_characters);
            finals.push(
                captions
                    .last()
                    .map(|c| c.output.clone())
                    .unwrap_or_default(),
            );
            bar.inc(1);
        }
        captioned.push((name, summary, finals));
    }
    bar.finish_and_clear();
    report.tables.push(caption_table(
        &captioned,
        &sources,
        updates.iter().map(Vec::len).sum(),
        &args,
    ));
    report.notes.push(format!(
        "Latency is from the end of speech (the end of the last voiced 20 ms frame) to the first \
         audio of the answer, on a simulated clock: audio arrives in 20 ms packets at its real \
         time, and Whisper, the model and the voice charge their measured compute to one \
         timeline, as they share the CPU. Endpointing is the {} ms of silence the detector waits \
         for; ASR is recognition still needed after it (zero when the transcript made at the \
         speaker's pause already covers the end); LLM is until the first words can go to the \
         voice: the first sentence, or a long one's first piece (before its first clause \
         boundary) as soon as no later token can change it; TTS until their audio is ready. After \
         the endpoint is the latency without the endpointing silence. PredGen synthesizes its \
         guessed first sentence's first piece while the user pauses; \"prepared\" counts the \
         turns whose answer began with that piece. Each recording is a fresh conversation, \
         answered by the cascade and by PredGen greedy (lossless: the same answer) with each \
         voice. The per-turn breakdown is plotted in `results/pipeline-latency-VOICE.svg`. \
         Captions: each recording is transcribed once into timed partials (Whisper every 500 ms \
         and at pauses), and both systems caption the same partials; output tokens/s is output \
         tokens over translation compute; NE is normalized erasure of the displayed captions.",
        args.silence_ms
    ));
    print!("{}", report.markdown());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// The endpoint detector's silence and a margin after each recording.
fn trailing(config: &ListenerConfig) -> Duration {
    config.endpoint.silence + Duration::from_millis(300)
}

/// `text` spoken by espeak-ng at 16 kHz, after [`LEAD_IN`].
fn spoken(espeak: &mut EspeakSynthesizer, text: &str) -> Result<Vec<f32>> {
    let audio = espeak.synthesize(text)?.joined()?;
    Ok(with_lead_in(resample(
        &audio.samples,
        audio.sample_rate,
        specvoice::SAMPLE_RATE,
    )?))
}

fn with_lead_in(samples: Vec<f32>) -> Vec<f32> {
    let lead = specvoice::endpoint::samples_in(LEAD_IN);
    [vec![0.0; lead], samples].concat()
}

/// The real clips ([`spec_models::speech::clips`]): LibriVox sentences, then the cards set.
fn clips(store: &Store<'_>) -> Result<Vec<Recording>> {
    let all = spec_models::speech::clips(store)?;
    let mut clips = Vec::new();
    for (folder, set) in [
        ("librivox", "real clips (LibriVox)"),
        ("cards", "real clips (cards)"),
    ] {
        for clip in all.iter().filter(|c| c.set == folder) {
            let audio = Audio::read_wav(&clip.wav)?;
            clips.push(Recording {
                name: clip.id.clone(),
                set,
                samples: with_lead_in(audio.to_16k()?),
                text: clip.transcript.clone(),
            });
        }
    }
    Ok(clips)
}

/// English sentences of the translation set.
fn english_sentences(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split('\t').next())
        .map(|s| s.trim().to_string())
        .collect())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let values: Vec<f64> = values.collect();
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The median of the turns' speed-ups (cascade latency over PredGen's): "no wait" when it is a
/// turn whose PredGen latency prints as zero.
fn median_latency_speedup(turns: impl Iterator<Item = (Duration, Duration)>) -> String {
    let ratios = turns.map(|(cascade, predgen)| {
        if predgen.as_secs_f64() <= NO_WAIT_SECONDS {
            f64::INFINITY
        } else {
            cascade.as_secs_f64() / predgen.as_secs_f64()
        }
    });
    match median(ratios) {
        m if m.is_infinite() => "no wait".into(),
        m => speedup(m, 1.0),
    }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Speaking a long first sentence's first piece early against with its sentence: the same
/// recordings, each setting answering them interleaved.
fn first_piece_table(
    early: &[(&Recording, VoiceTurn, VoiceTurn)],
    with_sentence: &[(VoiceTurn, VoiceTurn)],
    voice: &str,
) -> Table {
    let mut table = Table::new(
        format!(
            "A long first sentence's first piece spoken as soon as it is settled, against once \
             its sentence is written: {voice}, {} recordings, both settings interleaved",
            early.len()
        ),
        &[
            "system",
            "first piece",
            "mean latency (ms)",
            "median (ms)",
            "LLM",
            "TTS",
            "turns spoken from an early piece",
            "same answer",
        ],
    );
    for (system, pick) in [("cascade", 0usize), ("PredGen greedy", 1)] {
        let early: Vec<&VoiceTurn> = early
            .iter()
            .map(|(_, c, p)| if pick == 0 { c } else { p })
            .collect();
        let late: Vec<&VoiceTurn> = with_sentence
            .iter()
            .map(|(c, p)| if pick == 0 { c } else { p })
            .collect();
        let same = early
            .iter()
            .zip(&late)
            .filter(|(a, b)| a.turn.answer == b.turn.answer)
            .count();
        for (setting, turns) in [("early", &early), ("with its sentence", &late)] {
            let streamed = turns
                .iter()
                .filter(|t| t.turn.first_piece().is_some())
                .count();
            table.push(vec![
                system.to_string(),
                setting.to_string(),
                format!("{:.0}", mean(turns.iter().map(|t| ms(t.latency())))),
                format!("{:.0}", median(turns.iter().map(|t| ms(t.latency())))),
                format!("{:.0}", mean(turns.iter().map(|t| ms(t.breakdown().llm)))),
                format!("{:.0}", mean(turns.iter().map(|t| ms(t.breakdown().tts)))),
                format!("{streamed}/{}", turns.len()),
                format!("{same}/{}", turns.len()),
            ]);
        }
    }
    table
}

fn chat_table(turns: &[(&Recording, VoiceTurn, VoiceTurn)], args: &Args, voice: &str) -> Table {
    let mut table = Table::new(
        format!(
            "Voice chat from audio: end of speech → first answer audio, {} + {} + {voice}, {} ms end-of-speech silence, {}-token answers",
            args.asr, args.model, args.silence_ms, args.max_tokens
        ),
        &[
            "recordings",
            "system",
            "mean latency (ms)",
            "median (ms)",
            "endpointing",
            "ASR",
            "LLM",
            "TTS",
            "speed-up (mean)",
            "median per-turn speed-up",
            "after the endpoint (ms)",
            "speed-up after the endpoint",
            "prepared",
            "same answer",
        ],
    );
    let mut sets: Vec<&str> = turns.iter().map(|(r, _, _)| r.set).collect();
    sets.dedup();
    sets.push("all");
    for set in sets {
        let rows: Vec<&(&Recording, VoiceTurn, VoiceTurn)> = turns
            .iter()
            .filter(|(r, _, _)| set == "all" || r.set == set)
            .collect();
        let cascade_mean = mean(rows.iter().map(|(_, c, _)| ms(c.latency())));
        let after_endpoint = |t: &VoiceTurn| ms(t.latency() - t.breakdown().endpointing);
        let cascade_after = mean(rows.iter().map(|(_, c, _)| after_endpoint(c)));
        for (system, pick) in [("cascade", 0usize), ("PredGen greedy", 1)] {
            let of = |row: &&(&Recording, VoiceTurn, VoiceTurn)| -> VoiceTurn {
                if pick == 0 {
                    row.1.clone()
                } else {
                    row.2.clone()
                }
            };
            let latencies: Vec<f64> = rows.iter().map(|r| ms(of(r).latency())).collect();
            let part = |f: fn(&specvoice::LatencyBreakdown) -> Duration| {
                format!(
                    "{:.0}",
                    mean(rows.iter().map(|r| ms(f(&of(r).breakdown()))))
                )
            };
            let this_mean = mean(latencies.iter().copied());
            let this_after = mean(rows.iter().map(|r| after_endpoint(&of(r))));
            let (speedup, per_turn, after_speedup, prepared, same) = if pick == 0 {
                let none = || "–".to_string();
                (
                    "1.00×".to_string(),
                    none(),
                    "1.00×".to_string(),
                    none(),
                    none(),
                )
            } else {
                (
                    latency_speedup(cascade_mean / 1e3, this_mean / 1e3),
                    median_latency_speedup(rows.iter().map(|(_, c, p)| (c.latency(), p.latency()))),
                    latency_speedup(cascade_after / 1e3, this_after / 1e3),
                    format!(
                        "{}/{}",
                        rows.iter()
                            .filter(|(_, _, p)| p.speech.prepared_audio_used)
                            .count(),
                        rows.len()
                    ),
                    format!(
                        "{}/{}",
                        rows.iter()
                            .filter(|(_, c, p)| c.turn.answer == p.turn.answer)
                            .count(),
                        rows.len()
                    ),
                )
            };
            table.push(vec![
                format!("{set} ({})", rows.len()),
                system.to_string(),
                format!("{this_mean:.0}"),
                format!("{:.0}", median(latencies.iter().copied())),
                part(|b| b.endpointing),
                part(|b| b.asr),
                part(|b| b.llm),
                part(|b| b.tts),
                speedup,
                per_turn,
                format!("{this_after:.0}"),
                after_speedup,
                prepared,
                same,
            ]);
        }
    }
    table
}

fn chat_details(turns: &[(&Recording, VoiceTurn, VoiceTurn)], voice: &str) -> Table {
    let mut table = Table::new(
        format!("Every turn, {voice}: latencies (ms) and their breakdown"),
        &[
            "recording",
            "said",
            "heard",
            "cascade",
            "PredGen",
            "cascade ASR/LLM/TTS",
            "PredGen ASR/LLM/TTS",
            "same answer",
        ],
    );
    for (recording, cascade, predgen) in turns {
        let parts = |t: &VoiceTurn| {
            let b = t.breakdown();
            format!("{:.0}/{:.0}/{:.0}", ms(b.asr), ms(b.llm), ms(b.tts))
        };
        table.push(vec![
            recording.name.clone(),
            recording.text.clone(),
            predgen.turn.question.clone(),
            format!("{:.0}", ms(cascade.latency())),
            format!("{:.0}", ms(predgen.latency())),
            parts(cascade),
            parts(predgen),
            (cascade.turn.answer == predgen.turn.answer).to_string(),
        ]);
    }
    table
}

fn caption_table(
    captioned: &[(&str, StreamSummary, Vec<String>)],
    sources: &[Recording],
    updates: usize,
    args: &Args,
) -> Table {
    let mut table = Table::new(
        format!(
            "Live captions from audio: {} recordings ({} partial transcripts by {}), English → {}, {}",
            sources.len(),
            updates,
            args.asr,
            args.to,
            args.model
        ),
        &[
            "system",
            "output tokens/s",
            "speed-up",
            "normalized erasure",
            "NE change",
            "final captions = AR's",
        ],
    );
    let (_, ar, ar_finals) = &captioned[0];
    for (name, summary, finals) in captioned {
        let same = finals.iter().zip(ar_finals).filter(|(a, b)| a == b).count();
        table.push(vec![
            name.to_string(),
            format!("{:.1}", summary.tokens_per_second()),
            speedup(summary.tokens_per_second(), ar.tokens_per_second()),
            format!("{:.3}", summary.normalized_erasure()),
            format!(
                "{:+.0} %",
                100.0 * (summary.normalized_erasure() / ar.normalized_erasure().max(1e-9) - 1.0)
            ),
            format!("{same}/{}", finals.len()),
        ]);
    }
    table
}

/// Each turn's latency as stacked bars (cascade above PredGen), split into endpointing, ASR,
/// LLM and TTS.
fn breakdown_svg(turns: &[(&Recording, VoiceTurn, VoiceTurn)], voice: &str) -> String {
    let (left, top, bar, gap, width) = (70.0, 40.0, 7.0, 6.0, 620.0);
    let longest = turns
        .iter()
        .flat_map(|(_, c, p)| [ms(c.latency()), ms(p.latency())])
        .fold(1.0, f64::max);
    let scale = width / longest;
    let height = top + turns.len() as f64 * (2.0 * bar + gap) + 50.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"10\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"18\" font-size=\"12\">End of speech → first answer audio per recording, {voice} (upper bar: cascade, lower: PredGen greedy)</text>\n",
        left + width + 40.0
    );
    let colors = ["#bbbbbb", "#4c78a8", "#f58518", "#54a24b"];
    for (i, (recording, cascade, predgen)) in turns.iter().enumerate() {
        let y = top + i as f64 * (2.0 * bar + gap);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            left - 4.0,
            y + 1.5 * bar,
            recording.name
        );
        for (row, turn) in [cascade, predgen].into_iter().enumerate() {
            let b = turn.breakdown();
            let mut x = left;
            for (part, color) in [b.endpointing, b.asr, b.llm, b.tts].into_iter().zip(colors) {
                let w = ms(part) * scale;
                let _ = writeln!(
                    svg,
                    "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{}\" fill=\"{color}\"/>",
                    y + row as f64 * bar,
                    bar - 1.0
                );
                x += w;
            }
        }
    }
    let legend_y = height - 20.0;
    for (i, (name, color)) in ["endpointing", "ASR", "LLM", "TTS"]
        .iter()
        .zip(colors)
        .enumerate()
    {
        let x = left + i as f64 * 110.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{x}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{name}</text>",
            legend_y - 9.0,
            x + 14.0,
            legend_y
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{legend_y}\" text-anchor=\"end\">{longest:.0} ms full width</text>",
        left + width
    );
    svg.push_str("</svg>\n");
    svg
}
