//! Training data for the heads: each sequence's hidden states and the tokens after them, and
//! the examples each head learns from (eq. 11's targets).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use spec_nn::heads::{expand, weights_fingerprint};
use spec_nn::{Error, Result};

use super::train::TrainableHead;

/// One recording's (or answer's) hidden states and the tokens after them.
#[derive(Debug, Clone)]
pub(super) struct Sequence {
    /// `[positions, hidden]`.
    pub(super) hidden: Tensor,
    pub(super) next: Vec<u32>,
    /// Sequences of one group (one sentence in several voices) are validated together.
    pub(super) group: u32,
}

/// Hidden states of a model's own outputs, with what each head should predict from them.
#[derive(Debug, Clone)]
pub struct TrainingSet {
    pub(super) hidden_size: usize,
    pub(super) sequences: Vec<Sequence>,
}

impl TrainingSet {
    pub fn new(hidden_size: usize) -> Self {
        Self {
            hidden_size,
            sequences: Vec::new(),
        }
    }

    /// Adds one sequence: `hidden` `[n, hidden_size]`, the hidden state at each position, and
    /// `next` (`n` tokens), the token the model emitted after each (its own greedy output:
    /// self-distillation). Head k learns `next[i + k + 1]` from `hidden[i]`. Sequences of one
    /// `group` (the same text spoken in several voices) fall on the same side of the
    /// validation split, so validation measures text the heads never saw.
    pub fn push(&mut self, hidden: Tensor, next: Vec<u32>, group: u32) -> Result<()> {
        let (n, width) = hidden.dims2()?;
        if width != self.hidden_size || n != next.len() {
            return Err(Error::Config(format!(
                "a training sequence of {n} hidden states {width} wide with {} tokens; expected \
                 one token per state and width {}",
                next.len(),
                self.hidden_size
            )));
        }
        self.sequences.push(Sequence {
            hidden: hidden.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
            next,
            group,
        });
        Ok(())
    }

    /// Adds every sequence of `other` (built apart, e.g. from another prompt file), its groups
    /// numbered after this set's so that no two sets share a group.
    pub fn append(&mut self, other: TrainingSet) -> Result<()> {
        if other.hidden_size != self.hidden_size && !other.is_empty() {
            return Err(Error::Config(format!(
                "cannot join training sets of hidden states {} and {} wide",
                self.hidden_size, other.hidden_size
            )));
        }
        let offset = self
            .sequences
            .iter()
            .map(|s| s.group + 1)
            .max()
            .unwrap_or(0);
        self.sequences
            .extend(other.sequences.into_iter().map(|s| Sequence {
                group: s.group + offset,
                ..s
            }));
        Ok(())
    }

    /// Sequences held.
    pub fn len(&self) -> usize {
        self.sequences.len()
    }

    /// True when there is no sequence.
    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    /// Positions held.
    pub fn positions(&self) -> usize {
        self.sequences.iter().map(|s| s.next.len()).sum()
    }

    /// Writes the set to one safetensors file (`hidden.{i}`, `next.{i}`, `group.{i}`), so the
    /// trunk runs once.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors = std::collections::HashMap::new();
        for (i, s) in self.sequences.iter().enumerate() {
            tensors.insert(format!("hidden.{i}"), s.hidden.clone());
            tensors.insert(
                format!("next.{i}"),
                Tensor::from_slice(&s.next, s.next.len(), &Device::Cpu)?,
            );
            tensors.insert(
                format!("group.{i}"),
                Tensor::from_slice(&[s.group], 1, &Device::Cpu)?,
            );
        }
        candle_core::safetensors::save(&tensors, path).map_err(|e| Error::BadWeights {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// The set cached at `path`, or (when absent or `refresh`) the one `build` makes, then
    /// saved there: the trunk's forwards run once per set of inputs.
    pub fn cached<E: From<Error>>(
        path: &Path,
        refresh: bool,
        build: impl FnOnce() -> std::result::Result<Self, E>,
    ) -> std::result::Result<Self, E> {
        if path.is_file() && !refresh {
            return Ok(Self::load(path)?);
        }
        let set = build()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        set.save(path)?;
        Ok(set)
    }

    /// One set per file of text lines (prompts, sentences; blank lines skipped), joined in file
    /// order ([`TrainingSet::append`]), so that a new file costs only its own lines. Each is
    /// cached at `cache_path(fingerprint, used)`, from the first 16 hex digits of the file's
    /// [`weights_fingerprint`] and `all` (or the number of lines when `limit`, a cap over all
    /// the files' lines, cut the file short), and built by `build(lines, file)` when absent or
    /// `refresh` ([`TrainingSet::cached`]). A file without lines is an error naming it.
    pub fn cached_per_file<E: From<Error>>(
        files: &[PathBuf],
        limit: Option<usize>,
        refresh: bool,
        cache_path: impl Fn(&str, &str) -> PathBuf,
        mut build: impl FnMut(&[String], &Path) -> std::result::Result<Self, E>,
    ) -> std::result::Result<Self, E> {
        let mut joined: Option<Self> = None;
        let mut left = limit.unwrap_or(usize::MAX);
        for file in files {
            if left == 0 {
                break;
            }
            let text = std::fs::read_to_string(file).map_err(|source| Error::Io {
                path: file.clone(),
                source,
            })?;
            let all: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect();
            if all.is_empty() {
                return Err(Error::Config(format!("{} holds no lines", file.display())).into());
            }
            let lines = &all[..all.len().min(left)];
            left -= lines.len();
            let used = match lines.len() == all.len() {
                true => "all".to_string(),
                false => lines.len().to_string(),
            };
            let cache = cache_path(&weights_fingerprint(file)?[..16], &used);
            let set = Self::cached(&cache, refresh, || build(lines, file))?;
            match &mut joined {
                Some(joined) => joined.append(set)?,
                None => joined = Some(set),
            }
        }
        joined.ok_or_else(|| Error::Config("no files of lines to train on".into()).into())
    }

    /// Reads a set written by [`TrainingSet::save`].
    pub fn load(path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::BadWeights {
            path: path.to_path_buf(),
            reason,
        };
        let tensors =
            candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| bad(e.to_string()))?;
        let count = tensors.len() / 3;
        let mut set = None;
        for i in 0..count {
            let hidden = tensors
                .get(&format!("hidden.{i}"))
                .ok_or_else(|| bad(format!("no hidden.{i}")))?;
            let next = tensors
                .get(&format!("next.{i}"))
                .ok_or_else(|| bad(format!("no next.{i}")))?
                .to_vec1::<u32>()?;
            let group = tensors
                .get(&format!("group.{i}"))
                .ok_or_else(|| bad(format!("no group.{i}")))?
                .to_vec1::<u32>()?;
            let set = set.get_or_insert_with(|| Self::new(hidden.dim(1).unwrap_or(0)));
            set.push(hidden.clone(), next, group.first().copied().unwrap_or(0))?;
        }
        set.ok_or_else(|| bad("no sequences".into()))
    }

    /// The tokens with ids below `below` (all of `vocab_size` for 0) and every token the set
    /// holds, sorted.
    pub(super) fn shortlist(&self, below: u32, vocab_size: usize) -> Result<Vec<u32>> {
        let below = if below == 0 {
            vocab_size
        } else {
            (below as usize).min(vocab_size)
        };
        let mut chosen = vec![false; vocab_size];
        chosen[..below].fill(true);
        for s in &self.sequences {
            for &token in &s.next {
                *chosen.get_mut(token as usize).ok_or_else(|| {
                    Error::Config(format!(
                        "a training token {token} outside the vocabulary of {vocab_size}"
                    ))
                })? = true;
            }
        }
        Ok((0..vocab_size as u32)
            .filter(|&t| chosen[t as usize])
            .collect())
    }

    /// For head `k`: the rows of `sequences` that have a target, the targets as columns of
    /// the shortlist (`column[token]`) and, when `with_states`, the model's own state for each
    /// target (the one that predicted it).
    pub(super) fn examples(
        &self,
        sequences: &[usize],
        k: usize,
        column: &[u32],
        with_states: bool,
    ) -> Result<HeadExamples> {
        let mut rows = Vec::new();
        let mut states = Vec::new();
        let mut targets = Vec::new();
        for &s in sequences {
            let Sequence { hidden, next, .. } = &self.sequences[s];
            let usable = next.len().saturating_sub(k + 1);
            if usable > 0 {
                rows.push(hidden.narrow(0, 0, usable)?);
                if with_states {
                    states.push(hidden.narrow(0, k + 1, usable)?);
                }
                targets.extend(next[k + 1..].iter().map(|&t| column[t as usize]));
            }
        }
        let stack = |rows: &[Tensor]| -> Result<Tensor> {
            Ok(match rows.is_empty() {
                true => Tensor::zeros((0, self.hidden_size), DType::F32, &Device::Cpu)?,
                false => Tensor::cat(rows, 0)?,
            })
        };
        Ok(HeadExamples {
            inputs: stack(&rows)?,
            targets,
            model_states: with_states.then(|| stack(&states)).transpose()?,
        })
    }

    /// For `count` chained heads: every position of `sequences` with a token after the next,
    /// and per head the shortlist row of the token it reads (`none_read` past the end) and of
    /// its target ([`NO_TARGET`] past the end). Head k at position i reads `next[i + k]` and
    /// learns `next[i + k + 1]`, which the model's state `hidden[i + k + 1]` predicted.
    pub(super) fn chain_examples(
        &self,
        sequences: &[usize],
        count: usize,
        column: &[u32],
        none_read: u32,
        read_table: Tensor,
    ) -> Result<ChainExamples> {
        let mut states = Vec::new();
        let mut starts = Vec::new();
        let mut reads = vec![Vec::new(); count];
        let mut targets = vec![Vec::new(); count];
        let mut first_row = 0u32;
        for &s in sequences {
            let Sequence { hidden, next, .. } = &self.sequences[s];
            let usable = next.len().saturating_sub(1);
            if usable == 0 {
                continue;
            }
            states.push(hidden.clone());
            let column_at = |j: usize| next.get(j).map(|&t| column[t as usize]);
            for i in 0..usable {
                starts.push(first_row + i as u32);
                for k in 0..count {
                    reads[k].push(column_at(i + k).unwrap_or(none_read));
                    targets[k].push(column_at(i + k + 1).unwrap_or(NO_TARGET));
                }
            }
            first_row += next.len() as u32;
        }
        let states = match states.is_empty() {
            true => Tensor::zeros((0, self.hidden_size), DType::F32, &Device::Cpu)?,
            false => Tensor::cat(&states, 0)?,
        };
        Ok(ChainExamples {
            states,
            starts,
            reads,
            targets,
            read_table,
        })
    }
}

/// A chained head's target where the sequence has ended.
pub(super) const NO_TARGET: u32 = u32::MAX;

/// One head's examples from [`TrainingSet::examples`].
pub(super) struct HeadExamples {
    /// `[n, hidden]`.
    pub(super) inputs: Tensor,
    pub(super) targets: Vec<u32>,
    /// `[n, hidden]`: the model's state for each target, when the loss reads it.
    pub(super) model_states: Option<Tensor>,
}

/// Training examples of chained heads ([`TrainingSet::chain_examples`]).
pub(super) struct ChainExamples {
    /// `[positions, hidden]`: every state of the sequences, in order.
    pub(super) states: Tensor,
    /// Per example, the row of `states` its chain starts from.
    pub(super) starts: Vec<u32>,
    pub(super) reads: Vec<Vec<u32>>,
    pub(super) targets: Vec<Vec<u32>>,
    /// The rows a head reads a token from: the shortlist's unembedding rows
    /// ([`spec_nn::heads::unit_rms`]) and a zero row for "nothing to read".
    pub(super) read_table: Tensor,
}

/// One head's output on a batch, with what its loss compares it to.
pub(super) struct HeadOutput {
    pub(super) head: usize,
    /// `[n, shortlist]`.
    pub(super) logits: Tensor,
    pub(super) targets: Vec<u32>,
    /// The head's state `z` before the unembedding (latent and chained heads), `[n, hidden]`.
    pub(super) state: Option<Tensor>,
    /// The model's own state for each target, `[n, hidden]` (when the loss reads it).
    pub(super) model_state: Option<Tensor>,
}

impl ChainExamples {
    pub(super) fn rows(&self) -> usize {
        self.starts.len()
    }

    /// Each head's output over the shortlist at `rows` (those with a target only), the heads
    /// run one after another as at inference: `z_0 = h`,
    /// `z_{k+1} = z_k + SiLU(A_k [z_k; e(read_k)] + b_k)`.
    pub(super) fn outputs(
        &self,
        heads: &[TrainableHead],
        rows: &[u32],
        output: &Tensor,
        with_states: bool,
    ) -> Result<Vec<HeadOutput>> {
        let device = Device::Cpu;
        let starts: Vec<u32> = rows.iter().map(|&r| self.starts[r as usize]).collect();
        let mut z = self
            .states
            .index_select(&Tensor::from_slice(&starts, starts.len(), &device)?, 0)?;
        let mut out = Vec::with_capacity(heads.len());
        for (k, head) in heads.iter().enumerate() {
            let reads: Vec<u32> = rows.iter().map(|&r| self.reads[k][r as usize]).collect();
            let read = self
                .read_table
                .index_select(&Tensor::from_slice(&reads, reads.len(), &device)?, 0)?;
            let input = Tensor::cat(&[&z, &read], 1)?;
            let step = input.matmul(&head.weight.t()?)?.broadcast_add(&head.bias)?;
            z = expand(step, &z, true, true)?;
            let mut kept = Vec::new();
            let mut targets = Vec::new();
            let mut model_rows = Vec::new();
            for (i, &r) in rows.iter().enumerate() {
                let target = self.targets[k][r as usize];
                if target != NO_TARGET {
                    kept.push(i as u32);
                    targets.push(target);
                    model_rows.push(starts[i] + k as u32 + 1);
                }
            }
            if kept.is_empty() {
                break;
            }
            let state = z.index_select(&Tensor::from_slice(&kept, kept.len(), &device)?, 0)?;
            let model_state = with_states
                .then(|| {
                    self.states.index_select(
                        &Tensor::from_slice(&model_rows, model_rows.len(), &device)?,
                        0,
                    )
                })
                .transpose()?;
            out.push(HeadOutput {
                head: k,
                logits: state.matmul(&output.t()?)?,
                targets,
                state: Some(state),
                model_state,
            });
        }
        Ok(out)
    }
}
