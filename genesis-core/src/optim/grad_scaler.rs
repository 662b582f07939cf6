//! Dynamic loss scaling for float16 training (`torch.amp.GradScaler`).
//!
//! f16 gradients underflow to zero when small; multiplying the loss by a large scale keeps
//! them representable. Before the optimizer step the gradients are divided by the scale; if
//! any of them is inf or NaN the scale was too large: the step is skipped and the scale
//! shrinks. After `growth_interval` clean steps in a row the scale grows again.

use super::Optimizer;
use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// Settings of a [`GradScaler`] (PyTorch's defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct GradScalerOptions {
    /// The first scale (default 2^16).
    pub init_scale: f64,
    /// Factor applied after `growth_interval` steps without inf/NaN (default 2).
    pub growth_factor: f64,
    /// Factor applied when a step finds inf/NaN (default 0.5).
    pub backoff_factor: f64,
    /// Clean steps between growths (default 2000).
    pub growth_interval: u64,
    /// When false the scaler does nothing: `scale` returns the loss and `step` always steps.
    pub enabled: bool,
}

impl Default for GradScalerOptions {
    fn default() -> Self {
        GradScalerOptions {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

/// Dynamic loss scaler. Per iteration: `scaler.scale(&loss)?.backward()?`, optionally
/// `scaler.unscale_(&opt)?` (to clip gradients), `scaler.step(&mut opt)?`, `scaler.update()?`.
#[derive(Debug, Clone)]
pub struct GradScaler {
    options: GradScalerOptions,
    scale: f64,
    growth_tracker: u64,
    /// Whether this iteration's gradients held inf/NaN; `Some` once they were unscaled.
    found_inf: Option<bool>,
}

impl GradScaler {
    /// A scaler with `options`.
    pub fn new(options: GradScalerOptions) -> Result<GradScaler> {
        let o = &options;
        if !(o.init_scale.is_finite() && o.init_scale > 0.0) {
            return Err(Error::invalid(format!("GradScaler: init_scale must be finite and > 0, got {}", o.init_scale)));
        }
        if !(o.growth_factor > 1.0 && o.growth_factor.is_finite()) {
            return Err(Error::invalid(format!("GradScaler: growth_factor must be > 1, got {}", o.growth_factor)));
        }
        if !(o.backoff_factor > 0.0 && o.backoff_factor < 1.0) {
            return Err(Error::invalid(format!(
                "GradScaler: backoff_factor must be in (0, 1), got {}",
                o.backoff_factor
            )));
        }
        if o.growth_interval == 0 {
            return Err(Error::invalid("GradScaler: growth_interval must be > 0"));
        }
        Ok(GradScaler { scale: options.init_scale, options, growth_tracker: 0, found_inf: None })
    }

    /// The current scale (1 when disabled).
    pub fn get_scale(&self) -> f64 {
        if self.options.enabled {
            self.scale
        } else {
            1.0
        }
    }

    /// True when the scaler is on.
    pub fn is_enabled(&self) -> bool {
        self.options.enabled
    }

    /// `loss · scale` (differentiable), to call `backward` on.
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        if !self.options.enabled {
            return Ok(loss.clone());
        }
        loss.mul_scalar(self.scale)
    }

    /// Divide the gradients of `optimizer`'s parameters by the scale and note whether any is
    /// inf or NaN. At most once per iteration (between two [`update`](Self::update)s).
    pub fn unscale_(&mut self, optimizer: &dyn Optimizer) -> Result<()> {
        if !self.options.enabled {
            return Ok(());
        }
        if self.found_inf.is_some() {
            return Err(Error::invalid("GradScaler.unscale_: already called since the last update()"));
        }
        let inv = 1.0 / self.scale;
        let found = no_grad(|| -> Result<bool> {
            let mut found = false;
            for p in optimizer.params() {
                let Some(g) = p.grad() else { continue };
                let g = g.mul_scalar(inv)?;
                // inf·0 and NaN·0 are NaN, finite·0 is 0: one reduction tells whether any
                // element is not finite, and a sum of zeros cannot overflow.
                found |= !g.mul_scalar(0.0)?.sum()?.item::<f64>()?.is_finite();
                p.set_grad(Some(g))?;
            }
            Ok(found)
        })?;
        self.found_inf = Some(found);
        Ok(())
    }

    /// Unscale (if not done yet) and step `optimizer` unless a gradient held inf or NaN.
    /// Returns whether the optimizer stepped.
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        if !self.options.enabled {
            optimizer.step()?;
            return Ok(true);
        }
        if self.found_inf.is_none() {
            self.unscale_(optimizer)?;
        }
        if self.found_inf == Some(true) {
            return Ok(false);
        }
        optimizer.step()?;
        Ok(true)
    }

    /// Adjust the scale for the next iteration: back off after inf/NaN, grow after
    /// `growth_interval` clean steps. Call once per iteration, after [`step`](Self::step).
    pub fn update(&mut self) -> Result<()> {
        if !self.options.enabled {
            return Ok(());
        }
        let found = self.found_inf.take().ok_or_else(|| {
            Error::invalid("GradScaler.update: no gradients were unscaled since the last update (call step first)")
        })?;
        if found {
            self.scale *= self.options.backoff_factor;
            self.growth_tracker = 0;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.options.growth_interval {
                self.scale *= self.options.growth_factor;
                self.growth_tracker = 0;
            }
        }
        Ok(())
    }

    /// Scale and growth tracker, for checkpoints.
    pub fn state_dict(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([("scale".to_string(), self.scale), ("growth_tracker".to_string(), self.growth_tracker as f64)])
    }

    /// Restore [`state_dict`](Self::state_dict)'s numbers.
    pub fn load_state_dict(&mut self, state: &BTreeMap<String, f64>) -> Result<()> {
        let get = |k: &str| {
            state.get(k).copied().ok_or_else(|| Error::invalid(format!("GradScaler.load_state_dict: missing `{k}`")))
        };
        let (scale, tracker) = (get("scale")?, get("growth_tracker")?);
        if !(scale.is_finite() && scale > 0.0 && tracker >= 0.0 && tracker.fract() == 0.0) {
            return Err(Error::invalid(format!(
                "GradScaler.load_state_dict: invalid scale {scale} or growth_tracker {tracker}"
            )));
        }
        self.scale = scale;
        self.growth_tracker = tracker as u64;
        self.found_inf = None;
        Ok(())
    }
}
