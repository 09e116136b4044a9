//! The command-line options of the training programs (`clap`), and their progress display:
//! [`TrainArgs`], what every `train_heads` program takes.

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use spec_nn::heads::HeadKind;
use spec_nn::Result;

use crate::heads::{train, Progress, TrainConfig, TrainingSet};

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
