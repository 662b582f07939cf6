//! Learning-rate schedulers. Each computes the learning rate of every parameter group from
//! the group's base learning rate and the epoch count (PyTorch's closed forms), so a
//! scheduler restored from its state dict continues exactly.
//!
//! As in PyTorch, creating a scheduler sets epoch 0's learning rate on the optimizer, and
//! [`LrScheduler::step`] (called after `optimizer.step()`) moves to the next epoch.

// `StepLR::new(...)` and friends keep PyTorch's names but all build one `LrScheduler`.
#![allow(clippy::new_ret_no_self)]

use super::Optimizer;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::f64::consts::PI;

/// A scheduler's state: `last_epoch` and `base_lrs.{g}`, plus the schedule's own numbers.
pub type SchedulerState = BTreeMap<String, f64>;

/// How a schedule turns `(group, base lr, epoch)` into a learning rate.
trait Schedule: Send {
    fn name(&self) -> &'static str;
    fn lr(&self, group: usize, base_lr: f64, epoch: u64) -> Result<f64>;
}

/// A learning-rate scheduler: the base learning rates, the epoch, and a schedule.
pub struct LrScheduler {
    schedule: Box<dyn Schedule>,
    base_lrs: Vec<f64>,
    last_epoch: u64,
    last_lrs: Vec<f64>,
}

impl LrScheduler {
    fn start(optimizer: &mut dyn Optimizer, schedule: Box<dyn Schedule>) -> Result<LrScheduler> {
        let base_lrs = optimizer.lrs();
        let mut s = LrScheduler { schedule, base_lrs, last_epoch: 0, last_lrs: Vec::new() };
        s.apply(optimizer)?;
        Ok(s)
    }

    fn apply(&mut self, optimizer: &mut dyn Optimizer) -> Result<()> {
        if optimizer.lrs().len() != self.base_lrs.len() {
            return Err(Error::invalid(format!(
                "{}: the optimizer has {} parameter groups, the scheduler was made for {}",
                self.schedule.name(),
                optimizer.lrs().len(),
                self.base_lrs.len()
            )));
        }
        let lrs = (self.base_lrs.iter().enumerate())
            .map(|(g, &base)| self.schedule.lr(g, base, self.last_epoch))
            .collect::<Result<Vec<f64>>>()?;
        optimizer.set_lrs(&lrs)?;
        self.last_lrs = lrs;
        Ok(())
    }

    /// Move to the next epoch and set its learning rates on `optimizer`.
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<()> {
        self.last_epoch += 1;
        self.apply(optimizer).inspect_err(|_| self.last_epoch -= 1)
    }

    /// The learning rates set by the last step (`get_last_lr()`).
    pub fn last_lrs(&self) -> &[f64] {
        &self.last_lrs
    }

    /// The number of steps taken.
    pub fn last_epoch(&self) -> u64 {
        self.last_epoch
    }

    /// The epoch count and base learning rates (a `LambdaLR`'s function is not saved: it is
    /// given again when the scheduler is made).
    pub fn state_dict(&self) -> SchedulerState {
        let mut s = SchedulerState::new();
        s.insert("last_epoch".into(), self.last_epoch as f64);
        for (g, lr) in self.base_lrs.iter().enumerate() {
            s.insert(format!("base_lrs.{g}"), *lr);
        }
        s
    }

    /// Restore a state from [`state_dict`](Self::state_dict) and set its learning rates on
    /// `optimizer`. A state for another number of groups is an error and changes nothing.
    pub fn load_state_dict(&mut self, state: &SchedulerState, optimizer: &mut dyn Optimizer) -> Result<()> {
        let name = self.schedule.name();
        let err = |m: String| Error::invalid(format!("{name}.load_state_dict: {m}"));
        let epoch = *state.get("last_epoch").ok_or_else(|| err("missing `last_epoch`".into()))?;
        if !(epoch >= 0.0 && epoch.fract() == 0.0) {
            return Err(err(format!("`last_epoch` is {epoch}, not an epoch count")));
        }
        let n = state.keys().filter(|k| k.starts_with("base_lrs.")).count();
        if n != self.base_lrs.len() {
            return Err(err(format!(
                "the state has {n} base learning rates, this scheduler has {}",
                self.base_lrs.len()
            )));
        }
        let base_lrs = (0..n).map(|g| {
            state.get(&format!("base_lrs.{g}")).copied().ok_or_else(|| err(format!("missing `base_lrs.{g}`")))
        });
        let base_lrs = base_lrs.collect::<Result<Vec<f64>>>()?;
        if let Some(k) = state.keys().find(|k| k.as_str() != "last_epoch" && !k.starts_with("base_lrs.")) {
            return Err(err(format!("unexpected entry `{k}`")));
        }
        let saved = (std::mem::replace(&mut self.base_lrs, base_lrs), self.last_epoch);
        self.last_epoch = epoch as u64;
        if let Err(e) = self.apply(optimizer) {
            (self.base_lrs, self.last_epoch) = saved;
            return Err(e);
        }
        Ok(())
    }
}

fn positive(name: &str, what: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(format!("{name}: {what} must be finite and > 0, got {v}")))
    }
}

struct Step {
    step_size: u64,
    gamma: f64,
}
impl Schedule for Step {
    fn name(&self) -> &'static str {
        "StepLR"
    }
    fn lr(&self, _: usize, base: f64, epoch: u64) -> Result<f64> {
        Ok(base * self.gamma.powi((epoch / self.step_size) as i32))
    }
}

/// Multiply the learning rate by `gamma` every `step_size` epochs.
pub struct StepLR;
impl StepLR {
    /// Start the schedule on `optimizer`.
    pub fn new(optimizer: &mut dyn Optimizer, step_size: u64, gamma: f64) -> Result<LrScheduler> {
        if step_size == 0 {
            return Err(Error::invalid("StepLR: step_size must be > 0"));
        }
        positive("StepLR", "gamma", gamma)?;
        LrScheduler::start(optimizer, Box::new(Step { step_size, gamma }))
    }
}

struct MultiStep {
    milestones: Vec<u64>,
    gamma: f64,
}
impl Schedule for MultiStep {
    fn name(&self) -> &'static str {
        "MultiStepLR"
    }
    fn lr(&self, _: usize, base: f64, epoch: u64) -> Result<f64> {
        let passed = self.milestones.iter().filter(|&&m| m <= epoch).count();
        Ok(base * self.gamma.powi(passed as i32))
    }
}

/// Multiply the learning rate by `gamma` at each milestone epoch.
pub struct MultiStepLR;
impl MultiStepLR {
    /// Start the schedule on `optimizer` (a milestone listed twice counts twice, as in PyTorch).
    pub fn new(optimizer: &mut dyn Optimizer, milestones: &[u64], gamma: f64) -> Result<LrScheduler> {
        positive("MultiStepLR", "gamma", gamma)?;
        LrScheduler::start(optimizer, Box::new(MultiStep { milestones: milestones.to_vec(), gamma }))
    }
}

struct Exponential {
    gamma: f64,
}
impl Schedule for Exponential {
    fn name(&self) -> &'static str {
        "ExponentialLR"
    }
    fn lr(&self, _: usize, base: f64, epoch: u64) -> Result<f64> {
        Ok(base * self.gamma.powf(epoch as f64))
    }
}

/// Multiply the learning rate by `gamma` every epoch.
pub struct ExponentialLR;
impl ExponentialLR {
    /// Start the schedule on `optimizer`.
    pub fn new(optimizer: &mut dyn Optimizer, gamma: f64) -> Result<LrScheduler> {
        positive("ExponentialLR", "gamma", gamma)?;
        LrScheduler::start(optimizer, Box::new(Exponential { gamma }))
    }
}

struct Cosine {
    t_max: u64,
    eta_min: f64,
}
impl Schedule for Cosine {
    fn name(&self) -> &'static str {
        "CosineAnnealingLR"
    }
    fn lr(&self, _: usize, base: f64, epoch: u64) -> Result<f64> {
        let c = (PI * epoch as f64 / self.t_max as f64).cos();
        Ok(self.eta_min + (base - self.eta_min) * (1.0 + c) / 2.0)
    }
}

/// Cosine annealing from the base learning rate to `eta_min` over `t_max` epochs (and back
/// up over the next `t_max`, as PyTorch's closed form does).
pub struct CosineAnnealingLR;
impl CosineAnnealingLR {
    /// Start the schedule on `optimizer`.
    pub fn new(optimizer: &mut dyn Optimizer, t_max: u64, eta_min: f64) -> Result<LrScheduler> {
        if t_max == 0 {
            return Err(Error::invalid("CosineAnnealingLR: t_max must be > 0"));
        }
        LrScheduler::start(optimizer, Box::new(Cosine { t_max, eta_min }))
    }
}

struct Linear {
    start: f64,
    end: f64,
    total: u64,
}
impl Schedule for Linear {
    fn name(&self) -> &'static str {
        "LinearLR"
    }
    fn lr(&self, _: usize, base: f64, epoch: u64) -> Result<f64> {
        let t = epoch.min(self.total) as f64 / self.total as f64;
        Ok(base * (self.start + (self.end - self.start) * t))
    }
}

/// Scale the learning rate by a factor going linearly from `start_factor` to `end_factor`
/// over `total_iters` epochs, then staying there.
pub struct LinearLR;
impl LinearLR {
    /// Start the schedule on `optimizer` (PyTorch's defaults: 1/3, 1.0, 5).
    pub fn new(
        optimizer: &mut dyn Optimizer,
        start_factor: f64,
        end_factor: f64,
        total_iters: u64,
    ) -> Result<LrScheduler> {
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(Error::invalid(format!("LinearLR: start_factor must be in (0, 1], got {start_factor}")));
        }
        if !(0.0..=1.0).contains(&end_factor) {
            return Err(Error::invalid(format!("LinearLR: end_factor must be in [0, 1], got {end_factor}")));
        }
        if total_iters == 0 {
            return Err(Error::invalid("LinearLR: total_iters must be > 0"));
        }
        LrScheduler::start(optimizer, Box::new(Linear { start: start_factor, end: end_factor, total: total_iters }))
    }
}

struct WarmupCosine {
    warmup: u64,
    total: u64,
    min_factor: f64,
}
impl Schedule for WarmupCosine {
    fn name(&self) -> &'static str {
        "WarmupCosineLR"
    }
    fn lr(&self, _: usize, base: f64, epoch: u64) -> Result<f64> {
        if epoch < self.warmup {
            return Ok(base * epoch as f64 / self.warmup as f64);
        }
        let span = (self.total - self.warmup).max(1) as f64;
        let progress = ((epoch - self.warmup) as f64 / span).min(1.0);
        let cos = 0.5 * (1.0 + (PI * progress).cos());
        Ok(base * (self.min_factor + (1.0 - self.min_factor) * cos))
    }
}

/// Linear warmup from 0 to the base learning rate over `warmup_steps`, then a half cosine
/// down to `min_factor · base` at `total_steps`, staying there after (the schedule of
/// Hugging Face's `get_cosine_schedule_with_warmup` when `min_factor = 0`).
pub struct WarmupCosineLR;
impl WarmupCosineLR {
    /// Start the schedule on `optimizer`.
    pub fn new(
        optimizer: &mut dyn Optimizer,
        warmup_steps: u64,
        total_steps: u64,
        min_factor: f64,
    ) -> Result<LrScheduler> {
        if warmup_steps > total_steps {
            return Err(Error::invalid(format!(
                "WarmupCosineLR: warmup_steps ({warmup_steps}) exceeds total_steps ({total_steps})"
            )));
        }
        if !(0.0..=1.0).contains(&min_factor) {
            return Err(Error::invalid(format!("WarmupCosineLR: min_factor must be in [0, 1], got {min_factor}")));
        }
        let s = WarmupCosine { warmup: warmup_steps, total: total_steps, min_factor };
        LrScheduler::start(optimizer, Box::new(s))
    }
}

struct Lambda<F> {
    f: F,
}
impl<F: Fn(u64) -> f64 + Send> Schedule for Lambda<F> {
    fn name(&self) -> &'static str {
        "LambdaLR"
    }
    fn lr(&self, _: usize, base: f64, epoch: u64) -> Result<f64> {
        Ok(base * (self.f)(epoch))
    }
}

/// The learning rate is the base learning rate times `f(epoch)`.
pub struct LambdaLR;
impl LambdaLR {
    /// Start the schedule on `optimizer`.
    pub fn new(optimizer: &mut dyn Optimizer, f: impl Fn(u64) -> f64 + Send + 'static) -> Result<LrScheduler> {
        LrScheduler::start(optimizer, Box::new(Lambda { f }))
    }
}

struct OneCycle {
    max_lrs: Vec<f64>,
    total: u64,
    /// End of the warm phase, as a fractional step (`pct_start · total - 1`).
    peak: f64,
    div_factor: f64,
    final_div_factor: f64,
}
impl Schedule for OneCycle {
    fn name(&self) -> &'static str {
        "OneCycleLR"
    }
    fn lr(&self, group: usize, _: f64, epoch: u64) -> Result<f64> {
        if epoch >= self.total {
            return Err(Error::invalid(format!(
                "OneCycleLR: tried to step {} times; the schedule has {} total steps",
                epoch + 1,
                self.total
            )));
        }
        let max = self.max_lrs[group.min(self.max_lrs.len() - 1)];
        let initial = max / self.div_factor;
        let min = initial / self.final_div_factor;
        let cos = |start: f64, end: f64, pct: f64| end + (start - end) / 2.0 * (1.0 + (PI * pct).cos());
        let t = epoch as f64;
        let last = (self.total - 1) as f64;
        Ok(if t <= self.peak {
            cos(initial, max, t / self.peak)
        } else {
            cos(max, min, (t - self.peak) / (last - self.peak))
        })
    }
}

/// The one-cycle policy (PyTorch's two-phase cosine form): from `max_lr / div_factor` up to
/// `max_lr` over the first `pct_start` of `total_steps`, then down to
/// `max_lr / (div_factor · final_div_factor)`. PyTorch's momentum cycling is not done here:
/// momentum stays as set (as with `cycle_momentum=False`).
pub struct OneCycleLR;
impl OneCycleLR {
    /// Start the schedule on `optimizer`; `max_lrs` has one value for every group, or one
    /// for all (PyTorch's defaults: pct_start 0.3, div_factor 25, final_div_factor 1e4).
    pub fn new(
        optimizer: &mut dyn Optimizer,
        max_lrs: &[f64],
        total_steps: u64,
        pct_start: f64,
        div_factor: f64,
        final_div_factor: f64,
    ) -> Result<LrScheduler> {
        let groups = optimizer.lrs().len();
        if max_lrs.len() != 1 && max_lrs.len() != groups {
            return Err(Error::invalid(format!("OneCycleLR: {} max_lrs for {groups} parameter groups", max_lrs.len())));
        }
        if total_steps < 2 {
            return Err(Error::invalid("OneCycleLR: total_steps must be at least 2"));
        }
        if !(pct_start > 0.0 && pct_start < 1.0) {
            return Err(Error::invalid(format!("OneCycleLR: pct_start must be in (0, 1), got {pct_start}")));
        }
        let peak = pct_start * total_steps as f64 - 1.0;
        if !(peak > 0.0 && peak < (total_steps - 1) as f64) {
            return Err(Error::invalid(format!(
                "OneCycleLR: pct_start {pct_start} of {total_steps} steps leaves an empty phase"
            )));
        }
        positive("OneCycleLR", "div_factor", div_factor)?;
        positive("OneCycleLR", "final_div_factor", final_div_factor)?;
        for &m in max_lrs {
            positive("OneCycleLR", "max_lr", m)?;
        }
        let s = OneCycle { max_lrs: max_lrs.to_vec(), total: total_steps, peak, div_factor, final_div_factor };
        LrScheduler::start(optimizer, Box::new(s))
    }
}
