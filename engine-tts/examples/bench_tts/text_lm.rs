//! The text-model section of `bench_tts`: SSD on a real Qwen2 model with real weights. Its draft
//! is built and trained exactly as CosyVoice 2's speech-token LM's would be (the model's own
//! lower 2 and upper 6 layers, the lower ones and the head retrained on the model's outputs,
//! `cargo xtask train-ssd-draft MODEL`), so it is the evidence this machine can give for SSD:
//! acceptance, tokens per target pass and speed-up over sampling without a draft at β = 0, 0.2,
//! 0.4, and how far the output drifts from the target's distribution as β grows (the paper's
//! Table 3 in this setting: the target's own negative log-likelihood of what was produced).

use anyhow::{Context, Result};
use engine_llm::ssd::{draft_dir, draft_layers, SsdDraftWeights};
use engine_llm::{LanguageModel, LoadOptions, Message, Transformer};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spec_core::report::{speedup, Table};
use spec_core::{
    generate, speculative_generate, AcceptanceRule, CostAwarePolicy, DecodeStats, Decoder,
    DraftLength, ForwardCosts, LogitRows, SamplingConfig, SpeculativeConfig, StopConditions,
};
use spec_models::{mt_bench, Store};
use spec_nn::forward_costs;
use spec_nn::heads::weights_fingerprint;

/// What the section measures.
#[derive(Clone, Debug, clap::Args)]
pub struct TextArgs {
    /// The text models whose SSD drafts are measured (trained with `cargo xtask
    /// train-ssd-draft`); a model without a trained draft is skipped with a note
    #[arg(
        long,
        num_args = 1..,
        value_delimiter = ',',
        default_values = ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]
    )]
    pub text_model: Vec<String>,
    /// MT-Bench questions (first turns; never used in training)
    #[arg(long, default_value_t = 10)]
    pub text_questions: usize,
    /// Tokens generated per answer
    #[arg(long, default_value_t = 128)]
    pub text_tokens: usize,
    /// Sampling temperature of every run
    #[arg(long, default_value_t = 0.8)]
    pub text_temperature: f32,
}

/// A section's tables, its notes, and its per-item rows.
#[derive(Default)]
pub struct Section {
    pub tables: Vec<Table>,
    pub notes: Vec<String>,
    pub details: Vec<Table>,
}

/// A configuration of the run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Method {
    Autoregressive,
    /// SSD with the untrained draft (the layers as they are) or the trained one, at tolerance
    /// β, drafting γ tokens or as many as pay (0 to γ, from the measured forward costs).
    Ssd {
        trained: bool,
        beta: f32,
        cost_aware: bool,
    },
}

impl Method {
    fn label(self) -> String {
        match self {
            Self::Autoregressive => "sampling, no draft".into(),
            Self::Ssd {
                trained,
                beta,
                cost_aware,
            } => format!(
                "SSD, {} draft, β = {beta}{}",
                if trained { "trained" } else { "untrained" },
                if cost_aware { ", cost-aware γ" } else { "" }
            ),
        }
    }
}

/// SSD's draft length (the paper's).
const GAMMA: usize = 3;

/// Runs the section for every model; a model or trained draft that is missing gets a note.
pub fn run(args: &TextArgs, seed: u64) -> Result<Section> {
    let mut all = Section {
        tables: Vec::new(),
        notes: Vec::new(),
        details: Vec::new(),
    };
    for model in &args.text_model {
        let section = run_model(model, args, seed)?;
        all.tables.extend(section.tables);
        all.notes.extend(section.notes);
        all.details.extend(section.details);
    }
    Ok(all)
}

fn run_model(model: &str, args: &TextArgs, seed: u64) -> Result<Section> {
    let store = Store::from_env()?;
    let name = match store.resolve(model) {
        Ok(files) => files.name,
        Err(e) => {
            return Ok(skipped(format!(
                "{e}; fetch it with ../shared/models/fetch"
            )))
        }
    };
    let mut lm = LanguageModel::open(model, &LoadOptions::default())
        .with_context(|| format!("opening {model}"))?;
    let dir = draft_dir(store.root(), &name);
    let weights = match SsdDraftWeights::load(&dir, &weights_fingerprint(&lm.weights)?) {
        Ok(weights) => weights,
        Err(e) => {
            return Ok(skipped(format!(
                "{e}; train it with `cargo xtask train-ssd-draft {name}`"
            )))
        }
    };
    let info = weights.info.clone();
    let mut trained = lm.model.ssd_draft(&weights)?;
    let mut untrained = lm.model.with_layers(&draft_layers(
        lm.model.config().num_layers,
        info.lower_layers,
        info.upper_layers,
    )?)?;
    let turns = mt_bench::first_turns(&store, args.text_questions)?;
    let sampling = SamplingConfig::with_temperature(args.text_temperature);
    let stop = StopConditions::new(args.text_tokens);

    let ssd = |trained, beta, cost_aware| Method::Ssd {
        trained,
        beta,
        cost_aware,
    };
    let methods = [
        Method::Autoregressive,
        ssd(false, 0.0, false),
        ssd(true, 0.0, false),
        ssd(true, 0.2, false),
        ssd(true, 0.4, false),
        ssd(true, 0.0, true),
        ssd(true, 0.4, true),
    ];
    let target_costs = forward_costs(&mut lm.model, &lm.weights)?;
    let draft_costs = ForwardCosts::measure(&mut trained, 8, 3)?;
    let mut totals = vec![(DecodeStats::default(), 0f64, 0usize); methods.len()];
    let target_step_ms = 1e3 * target_costs.cost(1);
    let draft_step_ms = 1e3 * draft_costs.cost(1);
    let mut detail = Table::new(
        format!("SSD on {name}, per question"),
        &[
            "question",
            "method",
            "tokens",
            "decode tok/s",
            "accepted",
            "target NLL/token",
        ],
    );
    let mut greedy_identical = 0;
    warm_up(&mut lm, &mut trained, &mut untrained, &sampling)?;
    for (q, turn) in turns.iter().enumerate() {
        let prompt = lm.chat_prompt(&[Message::user(turn.as_str())])?;
        for (m, &method) in methods.iter().enumerate() {
            let mut rng = StdRng::seed_from_u64(seed + q as u64);
            lm.model.reset();
            let generation = match method {
                Method::Autoregressive => generate(
                    &mut lm.model,
                    &prompt,
                    &sampling,
                    &stop,
                    &mut rng,
                    &mut |_| {},
                )?,
                Method::Ssd {
                    trained: t,
                    beta,
                    cost_aware,
                } => {
                    let draft = if t { &mut trained } else { &mut untrained };
                    draft.reset();
                    let draft_length = if cost_aware {
                        DraftLength::CostAware(CostAwarePolicy::new(
                            target_costs.clone(),
                            draft_costs.clone(),
                            GAMMA,
                        ))
                    } else {
                        DraftLength::Fixed(GAMMA)
                    };
                    speculative_generate(
                        &mut lm.model,
                        draft,
                        &prompt,
                        &SpeculativeConfig {
                            draft_length,
                            rule: AcceptanceRule::speculative_sampling(beta),
                            sampling: sampling.clone(),
                        },
                        &stop,
                        &mut rng,
                        &mut |_| {},
                    )?
                }
            };
            let nll = target_nll(
                &mut lm.model,
                &prompt,
                &generation.tokens,
                args.text_temperature,
            )?;
            detail.push(vec![
                (q + 1).to_string(),
                method.label(),
                generation.tokens.len().to_string(),
                format!("{:.1}", generation.stats.decode_tokens_per_second()),
                format!("{:.0} %", 100.0 * generation.stats.acceptance_rate()),
                format!("{nll:.3}"),
            ]);
            let total = &mut totals[m];
            total.0.merge(&generation.stats);
            total.1 += nll * generation.tokens.len() as f64;
            total.2 += generation.tokens.len();
        }
        greedy_identical +=
            usize::from(greedy_matches(&mut lm.model, &mut trained, &prompt, &stop)?);
    }

    let base = totals[0].0.decode_tokens_per_second();
    let mut table = Table::new(
        format!(
            "SSD on the real {name} (γ = {GAMMA}, temperature {}, {} MT-Bench questions × {} tokens; \
             draft: lower {} retrained + upper {} of {} layers, head over {} tokens; top-1 agreement \
             with the target on held-out answers {:.0} % untrained → {:.0} % trained)",
            args.text_temperature,
            turns.len(),
            args.text_tokens,
            info.lower_layers,
            info.upper_layers,
            lm.model.config().num_layers,
            info.shortlist_size,
            100.0 * info.untrained_agreement,
            100.0 * info.validation_agreement
        ),
        &[
            "method",
            "decode tok/s",
            "LM-RTF if 25 tokens/s of audio",
            "speed-up",
            "acceptance",
            "tokens per target pass",
            "draft share of time",
            "target NLL/token",
        ],
    );
    for (method, (stats, nll_sum, tokens)) in methods.iter().zip(&totals) {
        let ssd = matches!(method, Method::Ssd { .. });
        let dash = || "–".to_string();
        table.push(vec![
            method.label(),
            format!("{:.1}", stats.decode_tokens_per_second()),
            format!("{:.3}", 25.0 / stats.decode_tokens_per_second()),
            speedup(stats.decode_tokens_per_second(), base),
            if ssd {
                format!("{:.0} %", 100.0 * stats.acceptance_rate())
            } else {
                dash()
            },
            format!("{:.2}", stats.tokens_per_target_pass()),
            if ssd {
                format!(
                    "{:.0} %",
                    100.0 * stats.draft_time.as_secs_f64() / stats.total_time.as_secs_f64()
                )
            } else {
                dash()
            },
            format!("{:.3}", nll_sum / (*tokens).max(1) as f64),
        ]);
    }
    Ok(Section {
        tables: vec![table],
        notes: vec![format!(
            "Text-model SSD on {name}: every run samples with the same seed per question; β = 0 is exact \
             speculative sampling, so its NLL differs from plain sampling's only by chance. \
             Greedy verification with the trained draft gave the target's greedy answer on \
             {greedy_identical}/{} questions (lossless). One forward of one token: target \
             {target_step_ms:.1} ms, draft {draft_step_ms:.1} ms ({:.0} % of the target's); the \
             cost-aware rows draft only as many tokens (0 to γ) as the measured costs and the \
             running acceptance say pay.",
            turns.len(),
            100.0 * draft_step_ms / target_step_ms
        )],
        details: vec![detail],
    })
}

fn skipped(reason: String) -> Section {
    Section {
        tables: Vec::new(),
        notes: vec![format!("Text-model SSD skipped: {reason}.")],
        details: Vec::new(),
    }
}

/// One short run of each model, so no timing includes first-use work.
fn warm_up(
    lm: &mut LanguageModel,
    trained: &mut Transformer,
    untrained: &mut Transformer,
    sampling: &SamplingConfig,
) -> Result<()> {
    let prompt = lm.chat_prompt(&[Message::user("Hello!")])?;
    let stop = StopConditions::new(8);
    let mut rng = StdRng::seed_from_u64(0);
    for draft in [trained, untrained] {
        lm.model.reset();
        draft.reset();
        speculative_generate(
            &mut lm.model,
            draft,
            &prompt,
            &SpeculativeConfig {
                draft_length: DraftLength::Fixed(GAMMA),
                rule: AcceptanceRule::speculative_sampling(0.0),
                sampling: sampling.clone(),
            },
            &stop,
            &mut rng,
            &mut |_| {},
        )?;
    }
    Ok(())
}

/// The target's mean negative log-likelihood per token of `tokens` after `prompt`, under the
/// distribution every run samples from (temperature `temperature`).
fn target_nll(
    target: &mut Transformer,
    prompt: &[u32],
    tokens: &[u32],
    temperature: f32,
) -> Result<f64> {
    if tokens.is_empty() {
        return Ok(0.0);
    }
    target.reset();
    let sequence: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
    let logits = target.forward_tokens(
        &sequence[..sequence.len() - 1],
        LogitRows::Last(tokens.len()),
    )?;
    target.reset();
    let sampling = SamplingConfig::with_temperature(temperature);
    let mut sum = 0f64;
    for (i, &token) in tokens.iter().enumerate() {
        let p = sampling.probabilities(logits.row(i))?[token as usize];
        sum -= f64::from(p.max(f32::MIN_POSITIVE)).ln();
    }
    Ok(sum / tokens.len() as f64)
}

/// Whether greedy verification with `draft` gives exactly the target's greedy answer.
fn greedy_matches(
    target: &mut Transformer,
    draft: &mut Transformer,
    prompt: &[u32],
    stop: &StopConditions,
) -> Result<bool> {
    let mut rng = StdRng::seed_from_u64(0);
    target.reset();
    let greedy = generate(
        target,
        prompt,
        &SamplingConfig::greedy(),
        stop,
        &mut rng,
        &mut |_| {},
    )?;
    target.reset();
    draft.reset();
    let speculative = speculative_generate(
        target,
        draft,
        prompt,
        &SpeculativeConfig {
            draft_length: DraftLength::Fixed(GAMMA),
            rule: AcceptanceRule::greedy(),
            sampling: SamplingConfig::greedy(),
        },
        stop,
        &mut rng,
        &mut |_| {},
    )?;
    Ok(speculative.tokens == greedy.tokens)
}
