//! The supervised fine-tuning loop as a library piece: AdamW with a warmup-cosine schedule,
//! gradient accumulation and clipping, autocast, a chunked head loss, evaluation, atomic
//! checkpoints that resume exactly, a stop flag (Ctrl-C), progress, CSV and PNG curves.

use super::model::SftModel;
use super::{packed_batch, pad_batch, shift_labels, PackedRow, SftBatches, SftExample, IGNORE_INDEX};
use crate::amp::autocast;
use crate::autograd::no_grad;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::monitor::{MetricsLog, Progress};
use crate::nn::functional::linear_cross_entropy;
use crate::nn::Reduction;
use crate::optim::{clip_coefficient, get_total_norm, AdamOptions, AdamW, LrScheduler, Optimizer, WarmupCosineLR};
use crate::tensor::Tensor;
use crate::{DType, Device};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// How [`SftTrainer`] trains. The defaults suit a small model; set at least `max_steps`.
#[derive(Debug, Clone)]
pub struct SftConfig {
    /// Optimizer steps to run.
    pub max_steps: u64,
    /// Examples per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per optimizer step (the loss is the mean over all their assistant
    /// tokens, as one large batch would give).
    pub grad_accum: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warmup steps from 0 to `lr`, then a half cosine to `lr · min_lr_ratio`.
    pub warmup_steps: u64,
    /// The learning rate at the end, as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW's betas.
    pub betas: (f64, f64),
    /// Clip the gradients' global 2-norm to this (`None`: no clipping).
    pub max_grad_norm: Option<f64>,
    /// Run the forward pass under autocast to this dtype (bf16 on GPUs; `None` on the CPU).
    pub autocast: Option<DType>,
    /// Rows of the head's logits computed at once by the loss (the `(tokens × vocabulary)`
    /// logits are never materialized whole).
    pub loss_chunk_rows: usize,
    /// Evaluate on the held-out split every this many steps (0: only at the end).
    pub eval_every: u64,
    /// Save a checkpoint every this many steps (0: only at the end or when stopped).
    pub save_every: u64,
    /// Keep at most this many checkpoints (older ones are deleted once a newer is complete).
    pub keep_checkpoints: usize,
    /// Seed of the data order.
    pub seed: u64,
    /// Draw a progress bar on stderr (when it is a terminal).
    pub progress: bool,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            max_steps: 100,
            batch_size: 8,
            grad_accum: 1,
            lr: 1e-4,
            warmup_steps: 10,
            min_lr_ratio: 0.0,
            weight_decay: 0.0,
            betas: (0.9, 0.999),
            max_grad_norm: Some(1.0),
            autocast: None,
            loss_chunk_rows: 2048,
            eval_every: 0,
            save_every: 0,
            keep_checkpoints: 2,
            seed: 0,
            progress: true,
        }
    }
}

/// What one batch of items gives the model and the loss.
#[derive(Debug, Clone)]
pub struct ModelInputs {
    /// Token ids `(b, s)`, `i64`.
    pub input_ids: Tensor,
    /// The target of each position's logits `(b, s)`, `i64`, [`IGNORE_INDEX`] where there is
    /// none (already shifted: `targets[t]` is the token after position `t`).
    pub targets: Tensor,
    /// `(b, 1, s, s)` bool attention mask when plain causal attention is not enough (packed
    /// rows); `None` for right-padded rows, whose real tokens never see a pad.
    pub attention_mask: Option<Tensor>,
    /// Real tokens in the batch (for throughput).
    pub tokens: usize,
    /// Targets that count in the loss.
    pub target_count: usize,
}

/// An item the trainer can batch: an [`SftExample`] (right-padded) or a [`PackedRow`].
pub trait SftItem {
    /// The batch of `items` on `device`.
    fn collate(items: &[&Self], device: &Device) -> Result<ModelInputs>;
    /// The item's token ids and labels (what identifies the data of a run).
    fn tokens_and_labels(&self) -> (&[u32], &[i64]);
}

impl SftItem for SftExample {
    fn collate(items: &[&Self], device: &Device) -> Result<ModelInputs> {
        // Pads follow the real tokens and are never targets, so their id does not matter.
        let batch = pad_batch(items, 0, device)?;
        Ok(ModelInputs {
            input_ids: batch.input_ids,
            targets: batch.targets,
            attention_mask: None,
            tokens: items.iter().map(|e| e.len()).sum(),
            target_count: items.iter().map(|e| e.target_count()).sum(),
        })
    }

    fn tokens_and_labels(&self) -> (&[u32], &[i64]) {
        (&self.input_ids, &self.labels)
    }
}

impl SftItem for PackedRow {
    fn collate(items: &[&Self], device: &Device) -> Result<ModelInputs> {
        let batch = packed_batch(items, device)?;
        let targets = |r: &PackedRow| shift_labels(&r.labels).iter().filter(|&&t| t != IGNORE_INDEX).count();
        Ok(ModelInputs {
            input_ids: batch.input_ids,
            targets: batch.targets,
            attention_mask: Some(batch.attention_mask),
            tokens: items.iter().map(|r| r.segment_ids.iter().filter(|&&s| s != 0).count()).sum(),
            target_count: items.iter().map(|r| targets(r)).sum(),
        })
    }

    fn tokens_and_labels(&self) -> (&[u32], &[i64]) {
        (&self.input_ids, &self.labels)
    }
}

/// How a call to [`SftTrainer::train`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SftOutcome {
    /// `max_steps` reached.
    Finished,
    /// The stop flag was raised (Ctrl-C); a checkpoint of the last step was saved.
    Stopped,
    /// [`SftTrainer::train_for`] ran the steps it was asked for, before `max_steps`.
    Paused,
}

/// What [`SftTrainer::train`] did.
#[derive(Debug, Clone)]
pub struct SftReport {
    /// How it ended.
    pub outcome: SftOutcome,
    /// The optimizer step reached.
    pub step: u64,
    /// `(step, training loss)` of every step of this call.
    pub losses: Vec<(u64, f64)>,
    /// `(step, held-out loss)` of every evaluation of this call.
    pub eval_losses: Vec<(u64, f64)>,
    /// Real tokens trained on in this call, and their rate.
    pub tokens: u64,
    /// Tokens per second over this call.
    pub tokens_per_second: f64,
    /// The checkpoints written by this call.
    pub checkpoints: Vec<PathBuf>,
}

/// One row of the metrics history (kept in checkpoints so a resumed run's CSV continues).
type MetricRow = (u64, Vec<(String, f64)>);

/// The training loop. Holds the optimizer, the schedule, the step and the metrics; the model
/// is borrowed.
pub struct SftTrainer<'m, M: SftModel> {
    model: &'m M,
    config: SftConfig,
    out: PathBuf,
    optimizer: AdamW,
    scheduler: LrScheduler,
    step: u64,
    history: Vec<MetricRow>,
    data_fingerprint: Option<String>,
    stop: Arc<AtomicBool>,
}

const STATE_FILE: &str = "trainer_state.safetensors";

impl<'m, M: SftModel> SftTrainer<'m, M> {
    /// A trainer for `model` writing checkpoints and metrics under `out`.
    pub fn new(model: &'m M, config: SftConfig, out: impl Into<PathBuf>) -> Result<Self> {
        if config.max_steps == 0 || config.batch_size == 0 || config.grad_accum == 0 {
            return Err(Error::invalid("SftConfig: max_steps, batch_size and grad_accum must be positive"));
        }
        if !(config.lr > 0.0 && config.lr.is_finite()) {
            return Err(Error::invalid(format!("SftConfig: lr must be positive, got {}", config.lr)));
        }
        let options = AdamOptions {
            lr: config.lr,
            betas: config.betas,
            weight_decay: config.weight_decay,
            ..AdamOptions::adamw()
        };
        let mut optimizer = AdamW::new(model.parameters(), options)?;
        let warmup = config.warmup_steps.min(config.max_steps);
        let scheduler = WarmupCosineLR::new(&mut optimizer, warmup, config.max_steps, config.min_lr_ratio)?;
        Ok(SftTrainer {
            model,
            config,
            out: out.into(),
            optimizer,
            scheduler,
            step: 0,
            history: Vec::new(),
            data_fingerprint: None,
            stop: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A flag that stops training after the current step, with a checkpoint (set it from a
    /// Ctrl-C handler).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// The optimizer steps done so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The metrics so far (training loss, learning rate, gradient norm, tokens/s, held-out
    /// loss), including those of the run a checkpoint was resumed from.
    pub fn metrics(&self) -> MetricsLog {
        let mut log = MetricsLog::new();
        for (step, values) in &self.history {
            let values: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            log.record(*step, &values);
        }
        log
    }

    /// The mean loss per target token of `items` (no gradients).
    pub fn evaluate<T: SftItem>(&self, items: &[T]) -> Result<f64> {
        let device = self.model.device();
        let (mut total, mut count) = (0.0, 0usize);
        no_grad(|| -> Result<()> {
            for chunk in items.chunks(self.config.batch_size) {
                let refs: Vec<&T> = chunk.iter().collect();
                let inputs = T::collate(&refs, &device)?;
                total += self.loss(&inputs, Reduction::Sum)?.item::<f32>()? as f64;
                count += inputs.target_count;
            }
            Ok(())
        })?;
        Ok(total / count.max(1) as f64)
    }

    /// The summed (or mean) loss of one batch, in f32.
    fn loss(&self, inputs: &ModelInputs, reduction: Reduction) -> Result<Tensor> {
        let forward = || -> Result<Tensor> {
            let h = self.model.hidden_states(&inputs.input_ids, inputs.attention_mask.as_ref())?;
            let dim = h.shape()[2] as isize;
            linear_cross_entropy(
                &h.reshape(&[-1, dim])?,
                &self.model.lm_head_weight(),
                &inputs.targets.reshape(&[-1])?,
                IGNORE_INDEX,
                reduction,
                self.config.loss_chunk_rows,
            )
        };
        match self.config.autocast {
            Some(dtype) => autocast(dtype, forward)?,
            None => forward(),
        }
    }

    /// Train until `max_steps` or the stop flag, drawing batches from `data` (its position
    /// is saved in checkpoints) and evaluating on `eval` every `eval_every` steps.
    pub fn train<T: SftItem>(&mut self, data: &mut SftBatches<T>, eval: Option<&[T]>) -> Result<SftReport> {
        self.train_for(data, eval, u64::MAX)
    }

    /// As [`SftTrainer::train`], for at most `steps` more steps (a later call continues where
    /// this one stopped, as after a stop request): a warm-up step and then timed steps of one
    /// trainer, say, without a second optimizer and its state.
    pub fn train_for<T: SftItem>(
        &mut self,
        data: &mut SftBatches<T>,
        eval: Option<&[T]>,
        steps: u64,
    ) -> Result<SftReport> {
        let fingerprint = data_fingerprint(data);
        if let Some(saved) = &self.data_fingerprint {
            if saved != &fingerprint {
                return Err(Error::invalid(format!(
                    "resume: the checkpoint was trained on other data ({saved}), this run has {fingerprint}"
                )));
            }
        }
        self.data_fingerprint = Some(fingerprint);
        let device = self.model.device();
        let params = self.model.parameters();
        let total = self.config.max_steps;
        let end = total.min(self.step.saturating_add(steps));
        let left = end.saturating_sub(self.step);
        let mut bar = if self.config.progress { Progress::new(left, "sft") } else { Progress::hidden(left, "sft") }
            .unit("tokens");
        let mut report = SftReport {
            outcome: SftOutcome::Finished,
            step: self.step,
            losses: Vec::new(),
            eval_losses: Vec::new(),
            tokens: 0,
            tokens_per_second: 0.0,
            checkpoints: Vec::new(),
        };
        let started = Instant::now();
        while self.step < end {
            let step_start = Instant::now();
            let batches = (0..self.config.grad_accum)
                .map(|_| T::collate(&data.next_batch(), &device))
                .collect::<Result<Vec<_>>>()?;
            let targets: usize = batches.iter().map(|b| b.target_count).sum();
            let tokens: usize = batches.iter().map(|b| b.tokens).sum();
            let mut parts = Vec::with_capacity(batches.len());
            for inputs in &batches {
                // Each micro-batch's share of the mean over all the step's targets. With one
                // micro-batch that is its mean, and a backward from the loss itself lets the
                // head's loss keep its gradients as they are, without a pass to scale them.
                let part = match batches.len() {
                    1 if targets > 0 => self.loss(inputs, Reduction::Mean)?,
                    _ => self.loss(inputs, Reduction::Sum)?.mul_scalar(1.0 / targets.max(1) as f64)?,
                };
                part.backward()?;
                parts.push(part.detach());
            }
            let lr = self.optimizer.lrs().first().copied().unwrap_or(self.config.lr);
            // Clipping inside the update: AdamW reads each gradient times the factor.
            let grad_norm = match self.config.max_grad_norm {
                Some(max) => {
                    let norm = get_total_norm(&params, 2.0)?;
                    self.optimizer.step_with_grad_scale(&clip_coefficient(&norm, max)?)?;
                    Some(norm)
                }
                None => {
                    self.optimizer.step()?;
                    None
                }
            };
            self.optimizer.zero_grad();
            self.scheduler.step(&mut self.optimizer)?;
            // Read the loss and the norm only now: a read waits for the device, and the host
            // must have issued the whole step by then or the device idles while it catches up.
            let loss: f64 = Tensor::stack(&parts, 0)?.to_vec::<f64>()?.iter().sum();
            let grad_norm = grad_norm.map(|n| n.item::<f64>()).transpose()?.unwrap_or(f64::NAN);
            self.step += 1;
            let seconds = step_start.elapsed().as_secs_f64();
            report.tokens += tokens as u64;
            report.losses.push((self.step, loss));
            bar.step(loss, tokens as u64);
            let mut row = vec![
                ("train_loss".to_string(), loss),
                ("lr".to_string(), lr),
                ("tokens_per_s".to_string(), tokens as f64 / seconds.max(1e-9)),
            ];
            if grad_norm.is_finite() {
                row.push(("grad_norm".to_string(), grad_norm));
            }
            let last = self.step == total;
            if let Some(eval) = eval.filter(|_| last || every(self.step, self.config.eval_every)) {
                let eval_loss = self.evaluate(eval)?;
                row.push(("eval_loss".to_string(), eval_loss));
                report.eval_losses.push((self.step, eval_loss));
                bar.println(format!("step {}: train loss {loss:.4}, held-out loss {eval_loss:.4}", self.step));
            }
            self.history.push((self.step, row));
            let stop = self.stop.load(Ordering::Relaxed);
            if stop || (!last && every(self.step, self.config.save_every)) {
                report.checkpoints.push(self.save_checkpoint(data)?);
            }
            if stop {
                // Handled: a later call to `train` continues.
                self.stop.store(false, Ordering::Relaxed);
                report.outcome = SftOutcome::Stopped;
                bar.println(format!("stopped at step {}: checkpoint saved", self.step));
                break;
            }
        }
        bar.finish();
        if report.outcome == SftOutcome::Finished && self.step < total {
            report.outcome = SftOutcome::Paused;
        }
        self.write_metrics()?;
        report.step = self.step;
        report.tokens_per_second = report.tokens as f64 / started.elapsed().as_secs_f64().max(1e-9);
        Ok(report)
    }

    /// Write `metrics.csv` and `curves.png` under the output folder.
    pub fn write_metrics(&self) -> Result<()> {
        std::fs::create_dir_all(&self.out).map_err(|e| io_error("creating", &self.out, e))?;
        let log = self.metrics();
        log.write_csv(self.out.join("metrics.csv"))?;
        if !self.history.is_empty() {
            log.plot_png(self.out.join("curves.png"))?;
        }
        Ok(())
    }

    /// Save a checkpoint of the current step under `out/checkpoints/checkpoint-{step}`: the
    /// model as a Hugging Face folder (`config.json`, `model.safetensors`) and
    /// `trainer_state.safetensors` (optimizer, schedule, generator, data position, metrics).
    /// The folder is written under a temporary name and renamed when complete, so a crash
    /// never leaves a partial checkpoint and never removes a complete one; only then are
    /// checkpoints beyond `keep_checkpoints` deleted, oldest first.
    pub fn save_checkpoint<T: SftItem>(&self, data: &SftBatches<T>) -> Result<PathBuf> {
        let root = self.out.join("checkpoints");
        let dir = root.join(format!("checkpoint-{:06}", self.step));
        let tmp = root.join(format!(".checkpoint-{:06}.partial", self.step));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| io_error("removing", &tmp, e))?;
        }
        self.model.save_pretrained(&tmp)?;
        let mut metadata = crate::serialize::Metadata::new();
        let data_state = serde_json::to_string(&data.state_dict()).map_err(|e| Error::invalid(e.to_string()))?;
        metadata.insert("data".into(), data_state);
        metadata.insert("data_fingerprint".into(), data_fingerprint(data));
        metadata.insert("model_fingerprint".into(), self.model.fingerprint());
        let history = serde_json::to_string(&self.history).map_err(|e| Error::invalid(e.to_string()))?;
        metadata.insert("history".into(), history);
        let state = Checkpoint {
            model: Default::default(),
            optimizer: Some(self.optimizer.state_dict()?),
            scheduler: Some(self.scheduler.state_dict()),
            extra: Default::default(),
            rng: Some(crate::random::get_rng_state()),
            step: self.step,
            metadata,
        };
        state.save(tmp.join(STATE_FILE))?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| io_error("replacing", &dir, e))?;
        }
        std::fs::rename(&tmp, &dir).map_err(|e| io_error("renaming a checkpoint into", &dir, e))?;
        self.prune_checkpoints(&root)?;
        Ok(dir)
    }

    fn prune_checkpoints(&self, root: &Path) -> Result<()> {
        let mut done = complete_checkpoints(root)?;
        while done.len() > self.config.keep_checkpoints.max(1) {
            let oldest = done.remove(0);
            std::fs::remove_dir_all(&oldest).map_err(|e| io_error("removing", &oldest, e))?;
        }
        Ok(())
    }

    /// Continue from a checkpoint folder (or an output folder, meaning its newest
    /// checkpoint): model weights, optimizer, schedule, generator, metrics, and `data`'s
    /// position. A checkpoint of another model shape, or of other data, is an error.
    pub fn resume<T: SftItem>(&mut self, from: impl AsRef<Path>, data: &mut SftBatches<T>) -> Result<PathBuf> {
        let dir = resolve_checkpoint(from.as_ref())?;
        let device = self.model.device();
        let state = Checkpoint::load(dir.join(STATE_FILE), &device)?;
        let meta = |key: &str| {
            state.metadata.get(key).ok_or_else(|| Error::load(format!("{}: `{key}` is missing", dir.display())))
        };
        let saved_model = meta("model_fingerprint")?;
        if saved_model != &self.model.fingerprint() {
            return Err(Error::invalid(format!(
                "resume: {} is a checkpoint of another model ({saved_model}), not of this one ({})",
                dir.display(),
                self.model.fingerprint()
            )));
        }
        let saved_data = meta("data_fingerprint")?;
        if saved_data != &data_fingerprint(data) {
            return Err(Error::invalid(format!(
                "resume: {} was trained on other data ({saved_data}), this run has {}",
                dir.display(),
                data_fingerprint(data)
            )));
        }
        let data_state = serde_json::from_str(meta("data")?).map_err(|e| Error::load(format!("data state: {e}")))?;
        let history = serde_json::from_str(meta("history")?).map_err(|e| Error::load(format!("history: {e}")))?;
        let weights = crate::serialize::load(dir.join("model.safetensors"), &device)?;
        self.model.load_state_dict(&weights, true)?;
        let optimizer = state.optimizer.as_ref().ok_or_else(|| Error::load("the checkpoint has no optimizer"))?;
        self.optimizer.load_state_dict(optimizer)?;
        let scheduler = state.scheduler.as_ref().ok_or_else(|| Error::load("the checkpoint has no schedule"))?;
        self.scheduler.load_state_dict(scheduler, &mut self.optimizer)?;
        if let Some(rng) = state.rng {
            crate::random::set_rng_state(rng);
        }
        data.load_state_dict(&data_state)?;
        self.history = history;
        self.step = state.step;
        self.data_fingerprint = Some(saved_data.clone());
        Ok(dir)
    }
}

fn every(step: u64, n: u64) -> bool {
    n > 0 && step % n == 0
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::invalid(format!("{what} {}: {e}", path.display()))
}

/// Complete checkpoint folders under `root`, oldest first.
fn complete_checkpoints(root: &Path) -> Result<Vec<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(root) else { return Ok(Vec::new()) };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("checkpoint-"))
                && p.join(STATE_FILE).is_file()
        })
        .collect();
    found.sort();
    Ok(found)
}

/// A checkpoint folder itself, or the newest complete checkpoint of an output folder.
fn resolve_checkpoint(from: &Path) -> Result<PathBuf> {
    if from.join(STATE_FILE).is_file() {
        return Ok(from.to_path_buf());
    }
    complete_checkpoints(&from.join("checkpoints"))?.pop().ok_or_else(|| {
        Error::load(format!("resume: {} is neither a checkpoint nor an output folder with one", from.display()))
    })
}

/// What identifies a run's data: a hash of every item's tokens and labels (FNV-1a, stable
/// across builds), the item count, batch size, seed and shuffling.
fn data_fingerprint<T: SftItem>(data: &SftBatches<T>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for byte in x.to_le_bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for item in data.items() {
        let (ids, labels) = item.tokens_and_labels();
        eat(ids.len() as u64);
        ids.iter().for_each(|&i| eat(u64::from(i)));
        labels.iter().for_each(|&l| eat(l as u64));
    }
    let s = data.state_dict();
    format!("{} items (hash {hash:016x}), batches of {}, seed {}, shuffle {}", s.items, s.batch_size, s.seed, s.shuffle)
}
