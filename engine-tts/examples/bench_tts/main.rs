//! Benchmark of Speech Speculative Decoding (SSD) on CosyVoice 2's speech-token LM, every
//! comparison in the same run: plain autoregressive decoding (`SpeechLm::generate`) against
//! `SpeechLm::generate_speculative` with SSD's layer draft (layers 0, 1 and 18–23 of 24) at
//! γ = 3 and β from 0 to 0.4, on the same texts with the same seeds.
//!
//! The model has CosyVoice 2's shape (the Qwen2.5-0.5B backbone, 6561 speech tokens and 3
//! specials) with random weights from a fixed seed, backbone matrices in Q8_0 as
//! `CosyVoice2::load` has them: it measures what decoding costs, not what a trained draft
//! would accept.
//!
//! ```sh
//! cargo run --release -p engine-tts --example bench_tts -- [--texts 4] [--max-ratio 6] [--json PATH]
//! ```
//!
//! A second section ([`text_lm`]) measures SSD where real weights exist here: a Qwen2 text
//! model with its trained SSD draft (`cargo xtask train-ssd-draft MODEL`), the same draft
//! construction and training CosyVoice 2's LM gets.
//!
//! `cargo xtask bench tts` runs it and files the results with the machine and date.

mod text_lm;
mod voices;

use text_lm::Section;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use clap::Parser;
use engine_llm::{LoadOptions, TransformerConfig};
use engine_tts::cosyvoice::lm::{SpeechLm, SpeechLmConfig, SsdConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spec_cli::{init_logging, progress_bar};
use spec_core::report::{speedup, Report, Table};
use spec_core::DecodeStats;

/// CosyVoice 2's speech-token rate (`token_frame_rate`, reference/cosyvoice2-reference.md).
const TOKEN_RATE_HZ: f64 = 25.0;
/// The released backbone's `config.json` (Qwen2.5-0.5B), the text vocabulary aside.
const BACKBONE: &str = r#"{
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
    "tie_word_embeddings": true, "vocab_size": VOCAB
}"#;
const SPEECH_TOKENS: usize = 6561;
/// Standard deviation of every random weight and bias (norm weights are 1).
const WEIGHT_STD: f32 = 0.02;
const MODEL_SEED: u64 = 0;
/// SSD's draft: the lower 2 and upper 6 of the 24 layers.
const DRAFT_LAYERS: [usize; 8] = [0, 1, 18, 19, 20, 21, 22, 23];
const GAMMA: usize = 3;
const TOLERANCES: [f32; 5] = [0.0, 0.1, 0.2, 0.3, 0.4];
/// Text lengths, cycled through for `--texts`.
const TEXT_LENGTHS: [usize; 3] = [8, 16, 24];
const PROMPT_TEXT_LEN: usize = 4;
const PROMPT_SPEECH_LEN: usize = 6;

/// SSD on a CosyVoice-shaped random speech-token LM against plain decoding.
#[derive(Parser)]
struct Args {
    /// Random texts to speak (lengths 8, 16, 24 tokens, cycled)
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    texts: u64,

    /// Most speech tokens per text token (CosyVoice 2's is 20; lower keeps the run short, as
    /// the random model seldom draws the end token)
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(2..=20))]
    max_ratio: u64,

    /// Text vocabulary of the backbone's embeddings (Qwen2.5's is 151936)
    #[arg(long, default_value_t = 151_936, value_parser = clap::value_parser!(u64).range(64..))]
    text_vocab: u64,

    #[command(flatten)]
    text: text_lm::TextArgs,

    #[command(flatten)]
    voices: voices::VoiceArgs,

    /// Seed of the text-model section's sampling (question i uses seed + i)
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// Also write the report as JSON here
    #[arg(long)]
    json: Option<PathBuf>,
}

/// `len` numbers with mean 0 and standard deviation `std` (uniform, so cheap to draw).
fn uniform(rng: &mut StdRng, len: usize, std: f32) -> Vec<f32> {
    let half_width = std * 3f32.sqrt();
    (0..len)
        .map(|_| rng.random_range(-half_width..half_width))
        .collect()
}

/// The speech-token LM with CosyVoice 2's shape and random weights from [`MODEL_SEED`].
fn random_lm(text_vocab: usize, max_ratio: usize) -> Result<SpeechLm> {
    let backbone =
        TransformerConfig::from_hf_json(&BACKBONE.replace("VOCAB", &text_vocab.to_string()))?;
    let (hidden, ffn) = (backbone.hidden_size, backbone.intermediate_size);
    let q_out = backbone.num_heads * backbone.head_dim;
    let kv_out = backbone.num_kv_heads * backbone.head_dim;
    let speech_rows = SPEECH_TOKENS + 3;
    let mut rng = StdRng::seed_from_u64(MODEL_SEED);
    let mut tensors = HashMap::new();
    let mut add = |name: String, shape: &[usize], std: Option<f32>| -> Result<()> {
        let len = shape.iter().product();
        let values = match std {
            Some(std) => uniform(&mut rng, len, std),
            None => vec![1.0; len],
        };
        tensors.insert(name, Tensor::from_vec(values, shape, &Device::Cpu)?);
        Ok(())
    };
    let w = Some(WEIGHT_STD);
    let model = "llm.model.model";
    add(
        format!("{model}.embed_tokens.weight"),
        &[text_vocab, hidden],
        w,
    )?;
    add(format!("{model}.norm.weight"), &[hidden], None)?;
    for i in 0..backbone.num_layers {
        let layer = format!("{model}.layers.{i}");
        for (name, rows) in [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)] {
            add(
                format!("{layer}.self_attn.{name}.weight"),
                &[rows, hidden],
                w,
            )?;
            add(format!("{layer}.self_attn.{name}.bias"), &[rows], w)?;
        }
        add(
            format!("{layer}.self_attn.o_proj.weight"),
            &[hidden, q_out],
            w,
        )?;
        add(format!("{layer}.mlp.gate_proj.weight"), &[ffn, hidden], w)?;
        add(format!("{layer}.mlp.up_proj.weight"), &[ffn, hidden], w)?;
        add(format!("{layer}.mlp.down_proj.weight"), &[hidden, ffn], w)?;
        add(format!("{layer}.input_layernorm.weight"), &[hidden], None)?;
        add(
            format!("{layer}.post_attention_layernorm.weight"),
            &[hidden],
            None,
        )?;
    }
    add("llm_embedding.weight".into(), &[2, hidden], w)?;
    add("speech_embedding.weight".into(), &[speech_rows, hidden], w)?;
    add("llm_decoder.weight".into(), &[speech_rows, hidden], w)?;
    add("llm_decoder.bias".into(), &[speech_rows], w)?;
    let config = SpeechLmConfig {
        max_token_text_ratio: max_ratio,
        ..SpeechLmConfig::default()
    };
    Ok(SpeechLm::from_tensors(
        tensors,
        backbone,
        config,
        &LoadOptions::default(),
    )?)
}

/// One utterance to speak: text tokens and the speaker prompt's text and speech tokens.
struct Utterance {
    text: Vec<u32>,
    prompt_text: Vec<u32>,
    prompt_speech: Vec<u32>,
}

/// `count` random utterances (seeded), text lengths cycling through [`TEXT_LENGTHS`].
fn utterances(count: usize, text_vocab: usize) -> Vec<Utterance> {
    let mut rng = StdRng::seed_from_u64(1);
    let mut ids = |len: usize, below: usize| -> Vec<u32> {
        (0..len)
            .map(|_| rng.random_range(0..below as u32))
            .collect()
    };
    (0..count)
        .map(|i| Utterance {
            text: ids(TEXT_LENGTHS[i % TEXT_LENGTHS.len()], text_vocab),
            prompt_text: ids(PROMPT_TEXT_LEN, text_vocab),
            prompt_speech: ids(PROMPT_SPEECH_LEN, SPEECH_TOKENS),
        })
        .collect()
}

/// What one decoding configuration did over every utterance.
#[derive(Default)]
struct Totals {
    time: Duration,
    tokens: usize,
    ssd: DecodeStats,
    /// Tokens/s of each utterance, to compare with plain decoding's.
    rates: Vec<f64>,
}

impl Totals {
    fn add(&mut self, time: Duration, tokens: usize, ssd: Option<&DecodeStats>) {
        self.time += time;
        self.tokens += tokens;
        self.rates.push(tokens as f64 / time.as_secs_f64());
        if let Some(s) = ssd {
            self.ssd.merge(s);
        }
    }

    fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.time.as_secs_f64()
    }

    /// LM wall time over the audio's duration at [`TOKEN_RATE_HZ`].
    fn rtf(&self) -> f64 {
        self.time.as_secs_f64() / (self.tokens as f64 / TOKEN_RATE_HZ)
    }
}

/// The table's columns, shared by its rows and the per-utterance details.
const COLUMNS: [&str; 10] = [
    "decoding",
    "LM time (s)",
    "speech tokens",
    "LM-RTF",
    "tokens/s",
    "speed-up",
    "per-text min / max",
    "acceptance",
    "tokens per target forward",
    "draft share",
];

/// A table row for `totals`, its speed-up against `plain`'s tokens/s.
fn row(label: &str, totals: &Totals, plain: &Totals) -> Vec<String> {
    let (lo, hi) = totals
        .rates
        .iter()
        .zip(&plain.rates)
        .map(|(r, p)| r / p)
        .fold((f64::INFINITY, 0f64), |(lo, hi), s| (lo.min(s), hi.max(s)));
    let ssd = &totals.ssd;
    let speculative = ssd.target_forwards > 0;
    let or_dash = |s: String| if speculative { s } else { "—".into() };
    vec![
        label.into(),
        format!("{:.2}", totals.time.as_secs_f64()),
        totals.tokens.to_string(),
        format!("{:.3}", totals.rtf()),
        format!("{:.1}", totals.tokens_per_second()),
        speedup(totals.tokens_per_second(), plain.tokens_per_second()),
        or_dash(format!("{lo:.2}× / {hi:.2}×")),
        or_dash(format!("{:.0} %", 100.0 * ssd.acceptance_rate())),
        if speculative {
            format!("{:.2}", totals.tokens as f64 / ssd.target_forwards as f64)
        } else {
            "1.00".into()
        },
        or_dash(format!(
            "{:.0} %",
            100.0 * ssd.draft_time.as_secs_f64() / totals.time.as_secs_f64()
        )),
    ]
}

/// SSD with the target's own layers as the draft against plain decoding, utterance by
/// utterance (plain, then each β, so that the machine's drift affects them alike).
fn layer_draft_section(lm: &mut SpeechLm, texts: &[Utterance], report: &mut Report) -> Result<()> {
    let mut draft = lm.draft_from_layers(&DRAFT_LAYERS)?;
    // Warm-up: the kernels' threads and caches, outside every timing.
    let first = &texts[0];
    lm.generate_speculative(
        &mut draft,
        &first.text[..2],
        &[],
        &[],
        &SsdConfig {
            gamma: GAMMA,
            tolerance: 0.0,
            max_tokens: Some(4),
        },
        &mut StdRng::seed_from_u64(0),
        None,
    )?;
    let mut plain = Totals::default();
    let mut speculative: Vec<Totals> = TOLERANCES.iter().map(|_| Totals::default()).collect();
    let mut details = Table::new(
        "Per text: plain decoding and SSD at each β",
        &[
            "text",
            "text tokens",
            "decoding",
            "LM time (s)",
            "speech tokens",
            "acceptance",
        ],
    );
    let bar = progress_bar(texts.len(), "texts");
    for (i, u) in texts.iter().enumerate() {
        let seed = 100 + i as u64;
        let started = Instant::now();
        let tokens = lm.generate(
            &u.text,
            &u.prompt_text,
            &u.prompt_speech,
            &mut StdRng::seed_from_u64(seed),
        )?;
        let time = started.elapsed();
        plain.add(time, tokens.len(), None);
        let detail = |decoding: String, time: Duration, tokens: usize, acceptance: String| {
            vec![
                (i + 1).to_string(),
                u.text.len().to_string(),
                decoding,
                format!("{:.2}", time.as_secs_f64()),
                tokens.to_string(),
                acceptance,
            ]
        };
        details.push(detail("plain".into(), time, tokens.len(), "—".into()));
        for (&beta, totals) in TOLERANCES.iter().zip(speculative.iter_mut()) {
            let started = Instant::now();
            let (tokens, stats) = lm.generate_speculative(
                &mut draft,
                &u.text,
                &u.prompt_text,
                &u.prompt_speech,
                &SsdConfig {
                    gamma: GAMMA,
                    tolerance: beta,
                    max_tokens: None,
                },
                &mut StdRng::seed_from_u64(seed),
                None,
            )?;
            let time = started.elapsed();
            totals.add(time, tokens.len(), Some(&stats));
            details.push(detail(
                format!("SSD β = {beta}"),
                time,
                tokens.len(),
                format!("{:.0} %", 100.0 * stats.acceptance_rate()),
            ));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut table = Table::new(
        format!(
            "SSD on a CosyVoice-shaped random speech-token LM, draft = layers {DRAFT_LAYERS:?} of 24 \
             (untrained: SSD trains the draft's lower layers, so acceptance here says nothing \
             about real speech; this measures cost), γ = {GAMMA}, {} random texts, same seeds; \
             LM-RTF = LM time ÷ (speech tokens ÷ {TOKEN_RATE_HZ} Hz); speed-up in tokens/s over \
             plain decoding in the same run",
            texts.len()
        ),
        &COLUMNS,
    );
    table.push(row("plain (AR)", &plain, &plain));
    for (&beta, totals) in TOLERANCES.iter().zip(&speculative) {
        table.push(row(&format!("SSD β = {beta}"), totals, &plain));
    }
    report.tables.push(table);
    report.details.push(details);
    Ok(())
}

/// Appends a section's tables, notes and details to the report.
fn add_section(report: &mut Report, section: Section) {
    report.tables.extend(section.tables);
    report.notes.extend(section.notes);
    report.details.extend(section.details);
}

fn main() -> Result<()> {
    init_logging();
    let args = Args::parse();
    if let Some(out) = &args.voices.voice_child {
        return voices::run_child(&args.voices, out);
    }
    let (text_vocab, max_ratio) = (args.text_vocab as usize, args.max_ratio as usize);
    let voice_section: Section = voices::run(&args.voices)?;
    let building = Instant::now();
    let mut lm = random_lm(text_vocab, max_ratio).context("building the random model")?;
    tracing::info!("random model built in {:.1?}", building.elapsed());
    let texts = utterances(args.texts as usize, text_vocab);
    let mut report = Report {
        command: format!(
            "cargo run --release -p engine-tts --example bench_tts -- --voices {} --voice-sentences {} \
             --texts {} --max-ratio {max_ratio} --text-vocab {text_vocab} \
             --text-model {} --text-questions {} --text-tokens {} --text-temperature {} --seed {}",
            args.voices.voices.join(","),
            args.voices.voice_sentences,
            args.texts,
            args.text.text_model.join(","),
            args.text.text_questions,
            args.text.text_tokens,
            args.text.text_temperature,
            args.seed
        ),
        notes: vec![format!(
            "The model: CosyVoice 2's LM shape — the Qwen2.5-0.5B backbone (24 layers, hidden 896, \
             14 heads, 2 key/value heads, FFN 4864, rope θ 1e6) with a text vocabulary of \
             {text_vocab}, 6561 speech tokens + 3 specials — random weights (uniform, std \
             {WEIGHT_STD}, norms 1, seed {MODEL_SEED}), backbone matrices in Q8_0 as the real \
             model loads. Texts of {:?} tokens (random ids), a 4-token prompt text and 6 prompt \
             speech tokens; at most {max_ratio} speech tokens per text token (CosyVoice 2: 20), \
             at least 2. The random model's tokens are noise, but the decoding work per token is \
             the real model's.",
            TEXT_LENGTHS
        )],
        ..Report::default()
    };
    add_section(&mut report, voice_section);
    layer_draft_section(&mut lm, &texts, &mut report)?;
    drop(lm);
    add_section(&mut report, text_lm::run(&args.text, args.seed)?);
    print!("{}", report.markdown());
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(())
}
