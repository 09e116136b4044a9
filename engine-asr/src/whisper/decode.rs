//! Decoding one 30-second window: greedy, sampled (temperature fallback) and beam search, with
//! Whisper's logit rules, the no-speech probability and the quality measures the fallback uses
//! (average log-probability, compression ratio).
//!
//! Beam search keeps every beam in the one KV cache as a token tree: each step forwards the
//! beams' newest tokens together, each attending to its own ancestors through a tree mask, and
//! the cache is compacted to the live beams' ancestors afterwards — one forward of a few rows
//! per step instead of one forward per beam.

use std::io::Write;

use candle_core::Tensor;
use rand::rngs::StdRng;
use spec_core::decoder::forward_tokens;
use spec_core::heads::{HeadsDrafter, TokenHeads};
use spec_core::sampling::{argmax, log_probability, sample, softmax, top_k_tokens};
use spec_core::{
    speculate, AcceptanceRule, DecodeStats, Decoder, DraftInput, FinishReason, Forward, LogitRows,
    Logits, Speculation, StopConditions, TreeDraft, TreeDrafter, Verification,
};

use crate::whisper::model::Whisper;
use crate::whisper::rules::LogitRules;
use crate::Result;

/// What one decoding of a window produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Sampled tokens (text and timestamps), without the prompt and the end token.
    pub tokens: Vec<u32>,
    /// Sum of the chosen tokens' log-probabilities (end token included).
    pub sum_logprob: f32,
    /// Whether the end token was chosen (rather than the length limit reached).
    pub finished: bool,
    /// Decoder forwards spent.
    pub forwards: usize,
}

impl Candidate {
    /// Whisper's average log-probability: the sum over `tokens + 1`.
    pub fn avg_logprob(&self) -> f32 {
        self.sum_logprob / (self.tokens.len() + 1) as f32
    }
}

/// The gzip-style compression ratio of a text (bytes / deflated bytes), Whisper's
/// repetition detector (fallback above 2.4).
pub fn compression_ratio(text: &str) -> f32 {
    if text.is_empty() {
        return 0.0;
    }
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    let compressed = encoder
        .write_all(text.as_bytes())
        .and_then(|()| encoder.finish())
        .map_or(text.len(), |c| c.len());
    text.len() as f32 / compressed.max(1) as f32
}

/// Runs the prompt; returns the no-speech probability (at the start-of-transcript row, before
/// any rule) and the logits after the prompt.
pub fn run_prompt(
    model: &mut Whisper,
    prompt: &[u32],
    start_of_transcript_index: usize,
    no_speech: u32,
) -> Result<(f32, Vec<f32>)> {
    model.reset();
    let rows = prompt.len() - start_of_transcript_index;
    let logits = forward_tokens(model, prompt, LogitRows::Last(rows))?;
    let no_speech_probability = log_probability(logits.row(0), no_speech).exp();
    Ok((no_speech_probability, logits.into_last_row()))
}

/// Greedy decoding (`temperature == 0`) or sampling at `temperature` after the prompt, whose
/// logits are `next`.
pub fn sample_window(
    model: &mut Whisper,
    rules: &LogitRules,
    next: Vec<f32>,
    end_of_text: u32,
    max_tokens: usize,
    temperature: f32,
    rng: &mut StdRng,
) -> Result<Candidate> {
    let start = Candidate {
        tokens: Vec::new(),
        sum_logprob: 0.0,
        finished: false,
        forwards: 1,
    };
    extend_window(
        model,
        rules,
        next,
        start,
        end_of_text,
        max_tokens,
        temperature,
        rng,
    )
}

/// Continues `candidate` (whose tokens are already in the cache after the prompt; `next` are
/// the logits after them) until the end token or `max_tokens` tokens.
#[allow(clippy::too_many_arguments)]
pub fn extend_window(
    model: &mut Whisper,
    rules: &LogitRules,
    mut next: Vec<f32>,
    mut candidate: Candidate,
    end_of_text: u32,
    max_tokens: usize,
    temperature: f32,
    rng: &mut StdRng,
) -> Result<Candidate> {
    if candidate.tokens.len() >= max_tokens {
        return Ok(candidate);
    }
    loop {
        rules.apply(&mut next, &candidate.tokens);
        let token = if temperature > 0.0 {
            let scaled: Vec<f32> = next.iter().map(|&l| l / temperature).collect();
            sample(&softmax(&scaled), rng)
        } else {
            argmax(&next)
        };
        candidate.sum_logprob += log_probability(&next, token);
        if token == end_of_text {
            candidate.finished = true;
            break;
        }
        candidate.tokens.push(token);
        if candidate.tokens.len() >= max_tokens || model.cached_len() >= model.max_len() {
            break;
        }
        next = forward_tokens(model, &[token], LogitRows::Last(1))?.into_last_row();
        candidate.forwards += 1;
    }
    Ok(candidate)
}

/// Most output rows (a tree's nodes and their heads' rows) a verification computes with the
/// heads' guesses: the kernels take a Q8_0 output layer four tokens at a time, so up to four
/// rows cost about one pass over it, where on demand every judged row and the heads' own
/// shortlist cost one each (Whisper's chain of one: two nodes and their first heads).
const MAX_GUESSING_ROWS: usize = 4;

/// Heads drafting for Whisper: each head's row adjusted by Whisper's rules for the tokens
/// sampled so far, as the decoder's own rows are.
struct RuledHeads<'a, H> {
    drafter: &'a HeadsDrafter<H>,
    rules: &'a LogitRules,
}

impl<H: TokenHeads> TreeDrafter for RuledHeads<'_, H> {
    fn draft_tree(&mut self, input: DraftInput<'_>) -> spec_core::Result<TreeDraft> {
        let (rules, sampled) = (self.rules, input.produced());
        let adjust = &mut |_, row: &mut [f32]| rules.apply(row, sampled);
        self.drafter.draft_input(input, adjust)
    }
    fn reads_hidden(&self) -> bool {
        true
    }
    fn finish(&mut self, _committed: &[u32]) -> spec_core::Result<()> {
        Ok(())
    }
}

/// Greedy decoding with multi-token prediction heads after the prompt (whose logits are
/// `next`; the model's last hidden state is the prompt's): [`speculative_window`] with the
/// heads' trees, each head's row adjusted by Whisper's rules for the tokens before it. With
/// greedy acceptance the tokens, log-probabilities and stopping point are exactly
/// [`sample_window`]'s at temperature 0. Heads that share the model's output layer guess in
/// the verifying pass ([`Verification::WithGuesses`]) where a tree needs at most four output
/// rows (the chain of one). Returns the candidate and the steps' statistics (heads time as
/// draft time).
pub fn heads_window<H: TokenHeads>(
    model: &mut Whisper,
    rules: &LogitRules,
    drafter: &HeadsDrafter<H>,
    rule: &AcceptanceRule,
    next: Vec<f32>,
    end_of_text: u32,
    max_tokens: usize,
) -> Result<(Candidate, DecodeStats)> {
    let guesses = drafter.tree().depth();
    let rows = (drafter.tree().nodes() + 1) * (1 + guesses);
    let verification =
        match drafter.heads().shares_output_layer() && guesses > 0 && rows <= MAX_GUESSING_ROWS {
            true => Verification::WithGuesses {
                heads: drafter.heads(),
                guesses,
            },
            false => Verification::OnDemand,
        };
    let prompt = model.cached_tokens().to_vec();
    speculative_window(
        model,
        rules,
        &mut RuledHeads { drafter, rules },
        rule,
        verification,
        &prompt,
        Some(next),
        end_of_text,
        max_tokens,
    )
}

/// Greedy decoding after `prompt` where each step `drafter` proposes a token tree after the
/// committed tokens and the target verifies it in one forward
/// ([`speculate`](spec_core::speculate())), keeping the longest path `rule` accepts, each node
/// judged on its logits after Whisper's rules for its own path. `prefilled`: the prompt's
/// logits, when the model's cache holds it already (its forward counts in the candidate's
/// forwards); otherwise the prompt is forwarded first, with the drafter's chain when it drafts
/// one with the prefill (a previous partial). With greedy acceptance the tokens,
/// log-probabilities and stopping point are exactly [`sample_window`]'s at temperature 0.
/// Returns the candidate and the steps' statistics (drafting time as draft time, verification
/// as target time).
#[allow(clippy::too_many_arguments)]
pub fn speculative_window(
    model: &mut Whisper,
    rules: &LogitRules,
    drafter: &mut dyn TreeDrafter,
    rule: &AcceptanceRule,
    verification: Verification<'_>,
    prompt: &[u32],
    prefilled: Option<Vec<f32>>,
    end_of_text: u32,
    max_tokens: usize,
) -> Result<(Candidate, DecodeStats)> {
    let before = usize::from(prefilled.is_some());
    let mut sum_logprob = 0f32;
    let adjust = &mut |tokens: &[u32], row: &mut [f32]| rules.apply(row, &tokens[prompt.len()..]);
    let score = &mut |token, row: &[f32]| sum_logprob += log_probability(row, token);
    let speculation = Speculation {
        verification,
        adjust: Some(adjust),
        on_row: Some(score),
        prefilled,
        ..Speculation::new(rule)
    };
    let stop = StopConditions::new(max_tokens).with_eos([end_of_text]);
    let generation = speculate(model, drafter, prompt, speculation, &stop, &mut |_| {})?;
    let mut tokens = generation.tokens;
    let finished = generation.finish == FinishReason::Eos;
    if finished {
        tokens.pop();
    }
    let candidate = Candidate {
        tokens,
        sum_logprob,
        finished,
        forwards: before + generation.stats.target_forwards,
    };
    Ok((candidate, generation.stats))
}

/// A beam: its tokens and where its newest token sits in the cache.
#[derive(Clone, Debug)]
struct Beam {
    tokens: Vec<u32>,
    sum_logprob: f32,
    /// Cache index of the newest token (the prompt's last position for the root).
    head: usize,
    logits: Vec<f32>,
}

/// Beam search with `beam_size` beams after the prompt (whose logits are `next`), as Whisper
/// does it: each beam proposes its `beam_size + 1` best tokens, the best `beam_size`
/// unfinished continuations go on, finished ones are collected until there are `beam_size`;
/// the winner has the best sum of log-probabilities divided by its length.
pub fn beam_window(
    model: &mut Whisper,
    rules: &LogitRules,
    next: Vec<f32>,
    end_of_text: u32,
    max_tokens: usize,
    beam_size: usize,
) -> Result<Candidate> {
    let prompt_len = model.cached_len();
    // parent[i]: the cache index before position i along its beam (None for the first).
    let mut parent: Vec<Option<usize>> = (0..prompt_len).map(|i| i.checked_sub(1)).collect();
    let mut beams = vec![Beam {
        tokens: Vec::new(),
        sum_logprob: 0.0,
        head: prompt_len - 1,
        logits: next,
    }];
    let mut finished: Vec<Candidate> = Vec::new();
    let mut unfinished: Vec<Candidate> = Vec::new();
    let mut forwards = 1;
    loop {
        let mut proposals: Vec<(f32, usize, u32)> = Vec::new();
        for (b, beam) in beams.iter_mut().enumerate() {
            rules.apply(&mut beam.logits, &beam.tokens);
            for token in top_k_tokens(&beam.logits, beam_size + 1) {
                let score = beam.sum_logprob + log_probability(&beam.logits, token);
                if score.is_finite() {
                    proposals.push((score, b, token));
                }
            }
        }
        proposals.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut continuing: Vec<(f32, usize, u32)> = Vec::new();
        // Down the ranking until `beam_size` continuations: the endings ranked above the last
        // of them finish (as in Whisper's `BeamSearchDecoder.update`).
        for (score, b, token) in proposals {
            if token == end_of_text {
                if finished.len() < beam_size {
                    finished.push(Candidate {
                        tokens: beams[b].tokens.clone(),
                        sum_logprob: score,
                        finished: true,
                        forwards: 0,
                    });
                }
            } else {
                continuing.push((score, b, token));
                if continuing.len() == beam_size {
                    break;
                }
            }
        }
        let depth = beams[0].tokens.len() + 1;
        if finished.len() >= beam_size || continuing.is_empty() {
            break;
        }
        let cached = model.cached_len();
        let out_of_room = cached + continuing.len() > model.cache_capacity()
            || prompt_len + depth > model.max_len();
        if depth >= max_tokens || out_of_room {
            // The length limit: the continuations end here, unfinished.
            unfinished = continuing
                .iter()
                .map(|&(score, b, token)| Candidate {
                    tokens: [beams[b].tokens.as_slice(), &[token]].concat(),
                    sum_logprob: score,
                    finished: false,
                    forwards: 0,
                })
                .collect();
            break;
        }
        // Forward every continuation as one token tree: row i sees its beam's ancestors.
        let n = continuing.len();
        let width = cached + n;
        let mut mask = vec![f32::NEG_INFINITY; n * width];
        for (i, &(_, b, _)) in continuing.iter().enumerate() {
            let row = &mut mask[i * width..(i + 1) * width];
            let mut at = Some(beams[b].head);
            while let Some(p) = at {
                row[p] = 0.0;
                at = parent[p];
            }
            row[cached + i] = 0.0;
        }
        let tokens: Vec<u32> = continuing.iter().map(|c| c.2).collect();
        let positions = vec![prompt_len + depth - 1; n];
        let mask = Tensor::from_vec(mask, (1, 1, n, width), model.device())?;
        let step = Forward::tokens(&tokens, &positions).with_mask(&mask);
        let logits = Logits::from_tensor(&model.forward(&step)?, n, model.vocab_size())?;
        forwards += 1;
        let mut next_beams = Vec::with_capacity(n);
        for (i, &(score, b, token)) in continuing.iter().enumerate() {
            parent.push(Some(beams[b].head));
            let mut tokens = beams[b].tokens.clone();
            tokens.push(token);
            next_beams.push(Beam {
                tokens,
                sum_logprob: score,
                head: cached + i,
                logits: logits.row(i).to_vec(),
            });
        }
        beams = next_beams;
        compact(model, &mut parent, &mut beams, prompt_len)?;
    }
    // Too few finished beams: the best unfinished ones complete the pool (Whisper's
    // `finalize`).
    let missing = beam_size.saturating_sub(finished.len());
    let mut pool = finished;
    pool.extend(unfinished.into_iter().take(missing));
    let best = pool
        .into_iter()
        .max_by(|a, b| {
            let score = |c: &Candidate| c.sum_logprob / c.tokens.len().max(1) as f32;
            score(a).total_cmp(&score(b))
        })
        .map(|mut c| {
            c.forwards = forwards;
            c
        });
    Ok(best.unwrap_or(Candidate {
        tokens: Vec::new(),
        sum_logprob: 0.0,
        finished: false,
        forwards,
    }))
}

/// Drops the cache positions no live beam descends from.
fn compact(
    model: &mut Whisper,
    parent: &mut Vec<Option<usize>>,
    beams: &mut [Beam],
    prompt_len: usize,
) -> Result<()> {
    let mut live = vec![false; parent.len()];
    live[..prompt_len].fill(true);
    for beam in beams.iter() {
        let mut at = Some(beam.head);
        while let Some(p) = at {
            if live[p] {
                break;
            }
            live[p] = true;
            at = parent[p];
        }
    }
    if live.iter().all(|&l| l) {
        return Ok(());
    }
    let kept: Vec<usize> = (0..live.len()).filter(|&p| live[p]).collect();
    let mut new_index = vec![usize::MAX; live.len()];
    for (i, &p) in kept.iter().enumerate() {
        new_index[p] = i;
    }
    model.keep_positions(&kept)?;
    *parent = kept
        .iter()
        .map(|&p| parent[p].map(|q| new_index[q]))
        .collect();
    for beam in beams.iter_mut() {
        beam.head = new_index[beam.head];
    }
    Ok(())
}
