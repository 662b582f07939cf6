//! Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay.

use super::groups::{buffer_for, check, parse_state_key, GroupOptions, Groups, OptimState, ParamGroup};
use super::Optimizer;
use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Hyperparameters of [`SGD`] (PyTorch's defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct SgdOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Momentum factor (default 0: plain SGD).
    pub momentum: f64,
    /// Dampening of the gradient added to the momentum buffer (default 0).
    pub dampening: f64,
    /// L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum (needs momentum > 0 and dampening 0).
    pub nesterov: bool,
    /// Ascend instead of descend.
    pub maximize: bool,
}

impl Default for SgdOptions {
    fn default() -> Self {
        SgdOptions { lr: 1e-3, momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false, maximize: false }
    }
}

impl GroupOptions for SgdOptions {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn to_values(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("lr", self.lr),
            ("momentum", self.momentum),
            ("dampening", self.dampening),
            ("weight_decay", self.weight_decay),
            ("nesterov", self.nesterov as u8 as f64),
            ("maximize", self.maximize as u8 as f64),
        ]
    }
    fn from_values(get: &dyn Fn(&str) -> Result<f64>) -> Result<Self> {
        Ok(SgdOptions {
            lr: get("lr")?,
            momentum: get("momentum")?,
            dampening: get("dampening")?,
            weight_decay: get("weight_decay")?,
            nesterov: get("nesterov")? != 0.0,
            maximize: get("maximize")? != 0.0,
        })
    }
    fn validate(&self) -> Result<()> {
        check(self.lr.is_finite() && self.lr >= 0.0, "learning rate", self.lr, "must be finite and >= 0")?;
        check(self.momentum.is_finite() && self.momentum >= 0.0, "momentum", self.momentum, "must be >= 0")?;
        check(self.dampening.is_finite(), "dampening", self.dampening, "must be finite")?;
        check(self.weight_decay.is_finite() && self.weight_decay >= 0.0, "weight_decay", self.weight_decay, ">= 0")?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::invalid("Nesterov momentum requires a momentum > 0 and zero dampening"));
        }
        Ok(())
    }
}

/// SGD with PyTorch's update rule: `g = grad + wd·p`; with momentum `b = μ·b + (1-τ)·g` (the
/// first buffer is `g` itself) and `g = b`, or `g = g + μ·b` for Nesterov; `p -= lr·g`.
#[derive(Debug)]
pub struct SGD {
    groups: Groups<SgdOptions>,
    /// Momentum buffer per parameter, created on its first update.
    buffers: Vec<Option<Tensor>>,
}

impl SGD {
    /// SGD over one group of `params`.
    pub fn new(params: Vec<Tensor>, options: SgdOptions) -> Result<SGD> {
        Self::with_groups(vec![ParamGroup::new(params, options)])
    }

    /// SGD over parameter groups, each with its own options.
    pub fn with_groups(groups: Vec<ParamGroup<SgdOptions>>) -> Result<SGD> {
        let groups = Groups::new("SGD", groups)?;
        let buffers = vec![None; groups.num_params()];
        Ok(SGD { groups, buffers })
    }

    /// The parameter groups.
    pub fn param_groups(&self) -> &[ParamGroup<SgdOptions>] {
        &self.groups.groups
    }

    /// Change the options of group `group` (checked).
    pub fn set_options(&mut self, group: usize, options: SgdOptions) -> Result<()> {
        options.validate()?;
        let n = self.groups.groups.len();
        let g =
            self.groups.groups.get_mut(group).ok_or_else(|| Error::invalid(format!("SGD: no group {group} of {n}")))?;
        g.options = options;
        Ok(())
    }
}

impl Optimizer for SGD {
    fn step(&mut self) -> Result<()> {
        no_grad(|| {
            for (i, o, p) in self.groups.iter() {
                let Some(grad) = p.grad() else { continue };
                let mut d = if o.maximize { grad.neg()? } else { grad };
                if o.weight_decay != 0.0 {
                    d = d.add(&p.mul_scalar(o.weight_decay)?)?;
                }
                if o.momentum != 0.0 {
                    let buf = match &self.buffers[i] {
                        None => d.copy()?,
                        Some(b) => {
                            b.mul_scalar_(o.momentum)?;
                            b.add_(&d.mul_scalar(1.0 - o.dampening)?)?;
                            b.clone()
                        }
                    };
                    d = if o.nesterov { d.add(&buf.mul_scalar(o.momentum)?)? } else { buf.clone() };
                    self.buffers[i] = Some(buf);
                }
                p.sub_(&d.mul_scalar(o.lr)?)?;
            }
            Ok(())
        })
    }

    fn params(&self) -> Vec<Tensor> {
        self.groups.params()
    }

    fn lrs(&self) -> Vec<f64> {
        self.groups.lrs()
    }

    fn set_lrs(&mut self, lrs: &[f64]) -> Result<()> {
        self.groups.set_lrs("SGD", lrs)
    }

    fn state_dict(&self) -> Result<OptimState> {
        let mut state = self.groups.state_dict("SGD");
        for (i, b) in self.buffers.iter().enumerate() {
            if let Some(b) = b {
                state.tensors.insert(format!("state.{i}.momentum_buffer"), no_grad(|| b.copy())?);
            }
        }
        Ok(state)
    }

    fn load_state_dict(&mut self, state: &OptimState) -> Result<()> {
        let options = self.groups.check_state("SGD", state)?;
        let params = self.groups.params();
        let mut buffers = vec![None; params.len()];
        for (name, t) in &state.tensors {
            match parse_state_key(name) {
                Some((i, "momentum_buffer")) => buffers[i] = Some(buffer_for(&params[i], t)?),
                _ => return Err(Error::invalid(format!("SGD.load_state_dict: unexpected entry `{name}`"))),
            }
        }
        if let Some(name) = state.scalars.keys().find(|k| k.starts_with("state.")) {
            return Err(Error::invalid(format!("SGD.load_state_dict: unexpected entry `{name}`")));
        }
        self.groups.set_options(options);
        self.buffers = buffers;
        Ok(())
    }
}
