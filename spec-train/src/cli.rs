//! The command-line options of the training programs (`clap`), and their progress display:
//! [`TrainArgs`], what every `train_heads` program takes, [`SsdTrainArgs`], what every
//! `train_ssd_draft` program takes, and [`read_text_lines`], their prompts or sentences.

use std::path::{Path, PathBuf};

use engine_llm::ssd::{Backbone, DistilledSequence};
use indicatif::{ProgressBar, ProgressStyle};
use spec_cli::progress_bar;
use spec_nn::heads::HeadKind;
use spec_nn::Result;

use crate::heads::{train, Progress, TrainConfig, TrainingSet};
use crate::ssd::{SsdProgress, SsdTrainConfig, TrainedDraft};

/// The head architectures, as a command-line value.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Kind {
    /// d×d transforms before the model's own unembedding (SiLU, residual)
    Latent,
    /// An output matrix per head
    Projection,
    /// Latent heads that also read the token before their guess and the state of the
    /// head before them
    Chained,
}

/// How to train the heads.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    #[arg(long, value_enum, default_value_t = Kind::Latent)]
    pub kind: Kind,
    #[arg(long, default_value_t = 8)]
    pub epochs: usize,
    #[arg(long)]
    pub learning_rate: Option<f64>,
    /// AdamW's decoupled weight decay.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    #[arg(long, default_value_t = 256)]
    pub batch_size: usize,
    /// Weight of the Smooth L1 loss between a latent or chained head's state and the
    /// model's own state for its target (EAGLE's feature regression; 0: none).
    #[arg(long, default_value_t = 0.0)]
    pub feature_weight: f32,
    /// Learn the model's whole distribution for each target, not only its token.
    #[arg(long)]
    pub soft_targets: bool,
    /// λ_k of the loss Σ_k λ_k · CE_k, one per head [default: 0.2 each, the paper's]. Chained
    /// heads pass their state on, so a deeper head's loss also trains the heads before it;
    /// smaller weights for the deeper heads keep the first head's accuracy.
    #[arg(long, value_delimiter = ',')]
    pub loss_weights: Vec<f32>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output folder [default: $SPECVOICE_MODELS/heads/MODEL-KIND-COUNT].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write to `$SPECVOICE_MODELS/heads/MODEL-<this>` instead (the name benchmarks and
    /// `--heads` options take), e.g. `chained-1-quick` for a small trial.
    #[arg(long, conflicts_with = "out")]
    pub variant: Option<String>,
}

impl TrainArgs {
    /// The training settings these options ask for.
    pub fn config(&self) -> TrainConfig {
        let kind = match self.kind {
            Kind::Latent => HeadKind::latent(),
            Kind::Projection => HeadKind::Projection,
            Kind::Chained => HeadKind::Chained,
        };
        let mut config = TrainConfig::new(kind, self.heads);
        config.epochs = self.epochs;
        config.batch_size = self.batch_size;
        config.seed = self.seed;
        config.weight_decay = self.weight_decay;
        config.feature_weight = self.feature_weight;
        config.soft_targets = self.soft_targets;
        if !self.loss_weights.is_empty() {
            config.loss_weights = self.loss_weights.clone();
        }
        if let Some(lr) = self.learning_rate {
            config.learning_rate = lr;
        }
        config
    }

    /// Trains on `data` with a progress bar and each epoch's figures printed, and writes the
    /// heads for `model` (its name and weights fingerprint) to `--out` or
    /// `heads_root/MODEL-VARIANT` (`KIND-COUNT` unless `--variant` names it); returns the
    /// folder.
    pub fn train_and_save(
        &self,
        data: &TrainingSet,
        unembedding: &candle_core::Tensor,
        heads_root: &Path,
        model: &str,
        fingerprint: &str,
    ) -> Result<PathBuf> {
        let bar = ProgressBar::new(0).with_style(
            ProgressStyle::with_template("epoch {prefix} {bar:30} {pos}/{len} batches, loss {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let trained = train(
            data,
            unembedding,
            &self.config(),
            &mut |progress| match progress {
                Progress::Batch {
                    epoch,
                    batch,
                    batches,
                    loss,
                } => {
                    bar.set_length(*batches as u64);
                    bar.set_prefix(format!("{}", epoch + 1));
                    bar.set_position(*batch as u64 + 1);
                    bar.set_message(format!("{loss:.3}"));
                }
                Progress::Epoch(report) => {
                    bar.suspend(|| println!("{report}"));
                    bar.reset();
                }
            },
        )?;
        bar.finish_and_clear();
        let kind = match self.kind {
            Kind::Latent => "latent",
            Kind::Projection => "projection",
            Kind::Chained => "chained",
        };
        let variant = self
            .variant
            .clone()
            .unwrap_or_else(|| format!("{kind}-{}", self.heads));
        let out = self
            .out
            .clone()
            .unwrap_or_else(|| heads_root.join(format!("{model}-{variant}")));
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        trained.save(&out, model, fingerprint, &command)
    }
}

/// The settings of an SSD draft's training ([`SsdTrainConfig`]) every `train_ssd_draft` program
/// takes.
#[derive(clap::Args, Clone, Debug)]
pub struct SsdTrainArgs {
    /// Retrained lower layers
    #[arg(long, default_value_t = 2)]
    pub lower: usize,
    /// Upper layers of the model the draft keeps
    #[arg(long, default_value_t = 6)]
    pub upper: usize,
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    #[arg(long, default_value_t = 2e-4)]
    pub learning_rate: f64,
    /// The model's most likely next tokens kept per position as the label
    #[arg(long, default_value_t = 8)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SsdTrainArgs {
    pub fn config(&self) -> SsdTrainConfig {
        SsdTrainConfig {
            lower_layers: self.lower,
            upper_layers: self.upper,
            epochs: self.epochs,
            learning_rate: self.learning_rate,
            label_top_k: self.top_k,
            seed: self.seed,
            ..Default::default()
        }
    }

    /// These options as command-line arguments, to record how a draft was trained.
    pub fn arguments(&self) -> String {
        format!(
            "--lower {} --upper {} --epochs {} --learning-rate {} --top-k {} --seed {}",
            self.lower, self.upper, self.epochs, self.learning_rate, self.top_k, self.seed
        )
    }

    /// Trains on `data` with a progress bar on a terminal (log lines otherwise) and the
    /// validation figures printed as they come.
    pub fn train(
        &self,
        backbone: &Backbone<'_>,
        data: &[DistilledSequence],
    ) -> engine_llm::Result<TrainedDraft> {
        let bar = progress_bar(0, "training");
        let trained =
            crate::ssd::train(
                backbone,
                data,
                &self.config(),
                &mut |progress| match progress {
                    SsdProgress::Step {
                        epoch,
                        step,
                        steps,
                        loss,
                    } => {
                        bar.set_length(*steps as u64);
                        bar.set_position(*step as u64 + 1);
                        bar.set_message(format!("epoch {} loss {loss:.3}", epoch + 1));
                        if bar.is_hidden() && step % 50 == 0 {
                            tracing::info!(epoch = epoch + 1, step, steps, loss, "training");
                        }
                    }
                    SsdProgress::Validation(report) => bar.suspend(|| println!("{report}")),
                },
            );
        bar.finish_and_clear();
        trained
    }
}

/// The non-empty lines of the text files `paths`, trimmed, in order, at most `limit` of them: the
/// prompts or sentences a training program reads.
pub fn read_text_lines(paths: &[&Path], limit: Option<usize>) -> engine_llm::Result<Vec<String>> {
    let mut lines = Vec::new();
    for &path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| engine_llm::Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        lines.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from),
        );
    }
    lines.truncate(limit.unwrap_or(usize::MAX));
    Ok(lines)
}
