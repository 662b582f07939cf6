//! Adam and AdamW. AdamW (and Adam without weight decay, which is the same update) uses the
//! device's fused multi-tensor `Op::AdamW` when the device claims it for the parameter's
//! dtype; otherwise the update is composed of elementwise ops.

use super::groups::{buffer_for, check, parse_state_key, GroupOptions, Groups, OptimState, ParamGroup};
use super::Optimizer;
use crate::autograd::no_grad;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::exec;
use crate::tensor::Tensor;
use genesis_backend_api::{DType, Op};

/// Hyperparameters of [`Adam`] and [`AdamW`] (PyTorch's defaults for Adam; PyTorch's AdamW
/// defaults to `weight_decay = 0.01`, see [`AdamOptions::adamw`]).
#[derive(Clone, Debug, PartialEq)]
pub struct AdamOptions {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Decay of the first and second moment estimates (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator for stability (default 1e-8).
    pub eps: f64,
    /// Adam: L2 penalty added to the gradient; AdamW: decoupled decay `p *= 1 - lr·wd`.
    pub weight_decay: f64,
    /// Ascend instead of descend.
    pub maximize: bool,
}

impl Default for AdamOptions {
    fn default() -> Self {
        AdamOptions { lr: 1e-3, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.0, maximize: false }
    }
}

impl AdamOptions {
    /// PyTorch's AdamW defaults: as [`Default`] with `weight_decay = 0.01`.
    pub fn adamw() -> Self {
        AdamOptions { weight_decay: 0.01, ..Default::default() }
    }
}

impl GroupOptions for AdamOptions {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn to_values(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("lr", self.lr),
            ("beta1", self.betas.0),
            ("beta2", self.betas.1),
            ("eps", self.eps),
            ("weight_decay", self.weight_decay),
            ("maximize", self.maximize as u8 as f64),
        ]
    }
    fn from_values(get: &dyn Fn(&str) -> Result<f64>) -> Result<Self> {
        Ok(AdamOptions {
            lr: get("lr")?,
            betas: (get("beta1")?, get("beta2")?),
            eps: get("eps")?,
            weight_decay: get("weight_decay")?,
            maximize: get("maximize")? != 0.0,
        })
    }
    fn validate(&self) -> Result<()> {
        check(self.lr.is_finite() && self.lr >= 0.0, "learning rate", self.lr, "must be finite and >= 0")?;
        let (b1, b2) = self.betas;
        check((0.0..1.0).contains(&b1), "beta1", b1, "must be in [0, 1)")?;
        check((0.0..1.0).contains(&b2), "beta2", b2, "must be in [0, 1)")?;
        check(self.eps.is_finite() && self.eps >= 0.0, "eps", self.eps, "must be finite and >= 0")?;
        check(self.weight_decay.is_finite() && self.weight_decay >= 0.0, "weight_decay", self.weight_decay, ">= 0")
    }
}

/// Moments and step count of one parameter.
#[derive(Debug)]
struct Moments {
    step: u64,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

/// The shared implementation; `decoupled` selects AdamW's weight decay.
#[derive(Debug)]
struct AdamCore {
    kind: &'static str,
    decoupled: bool,
    groups: Groups<AdamOptions>,
    state: Vec<Option<Moments>>,
}

/// Parameters updated by one fused call: same device, dtype and step.
struct FusedBatch {
    device: Device,
    step: u64,
    /// Global indices of the batch's parameters.
    params: Vec<usize>,
    grads: Vec<Tensor>,
    /// The gradient scale as the kernel's last input (f32, one element), if any.
    scale: Option<Tensor>,
    outputs: Vec<Tensor>,
}

impl AdamCore {
    fn new(kind: &'static str, decoupled: bool, groups: Vec<ParamGroup<AdamOptions>>) -> Result<Self> {
        let groups = Groups::new(kind, groups)?;
        let state = (0..groups.num_params()).map(|_| None).collect();
        Ok(AdamCore { kind, decoupled, groups, state })
    }

    /// One step; with `grad_scale`, every gradient is read multiplied by it (the gradients
    /// themselves are left as they are).
    fn step(&mut self, grad_scale: Option<&Tensor>) -> Result<()> {
        if let Some(s) = grad_scale {
            if s.numel() != 1 || !s.dtype().is_float() {
                return Err(Error::invalid(format!(
                    "{}: the gradient scale must be one floating-point element, got {} of shape {:?}",
                    self.kind,
                    s.dtype(),
                    s.shape()
                )));
            }
        }
        // The scale as an f32 on each device, made once per device.
        let mut scales: Vec<Tensor> = Vec::new();
        let mut scale_on = |device: &Device| -> Result<Option<Tensor>> {
            let Some(s) = grad_scale else { return Ok(None) };
            if let Some(found) = scales.iter().find(|t| t.device() == device) {
                return Ok(Some(found.clone()));
            }
            let t = s.detach().reshape(&[])?.to(device)?.to_dtype(DType::F32)?;
            scales.push(t.clone());
            Ok(Some(t))
        };
        no_grad(|| {
            for (g_idx, group) in self.groups.groups.iter().enumerate() {
                let o = &group.options;
                let first = self.groups.groups[..g_idx].iter().map(|g| g.params.len()).sum::<usize>();
                let mut batches: Vec<FusedBatch> = Vec::new();
                for (k, p) in group.params.iter().enumerate() {
                    let Some(grad) = p.grad() else { continue };
                    // The moments are made on the first step only (an eager `get_or_insert`
                    // argument would allocate and zero two parameter-sized tensors every step).
                    let slot = &mut self.state[first + k];
                    if slot.is_none() {
                        *slot = Some(Moments { step: 0, exp_avg: p.zeros_like()?, exp_avg_sq: p.zeros_like()? });
                    }
                    let m = slot.as_mut().expect("made above");
                    let step = m.step + 1;
                    let fused = Self::fusable(self.decoupled, o, p, &grad)?;
                    // The kernel takes the scale as an input from interface 1.10 on; the
                    // composed update and older plugins get the gradient scaled first.
                    let (grad, kernel_scale) = match scale_on(p.device())? {
                        Some(s) if fused && p.device().backend().takes_adamw_grad_scale() => (grad, Some(s)),
                        Some(s) => (grad.mul(&s.to_dtype(grad.dtype())?)?, None),
                        None => (grad, None),
                    };
                    if fused {
                        // The step count moves only once the fused call succeeded (below), so
                        // a refused call leaves the state as it was.
                        let batch = match batches.iter_mut().position(|b| b.step == step && &b.device == p.device()) {
                            Some(j) => &mut batches[j],
                            None => {
                                batches.push(FusedBatch {
                                    device: p.device().clone(),
                                    step,
                                    params: Vec::new(),
                                    grads: Vec::new(),
                                    scale: None,
                                    outputs: Vec::new(),
                                });
                                batches.last_mut().expect("just pushed")
                            }
                        };
                        batch.params.push(first + k);
                        batch.grads.push(grad.contiguous()?);
                        batch.scale = kernel_scale;
                        batch.outputs.extend([p.clone(), m.exp_avg.clone(), m.exp_avg_sq.clone()]);
                    } else {
                        m.step = step;
                        composite_update(self.decoupled, o, p, &grad, m)?;
                    }
                }
                for b in batches {
                    let (beta1, beta2) = o.betas;
                    let op =
                        Op::AdamW { lr: o.lr, beta1, beta2, eps: o.eps, weight_decay: o.weight_decay, step: b.step };
                    let ins: Vec<_> = b.grads.iter().chain(&b.scale).map(|g| (g, g.layout())).collect();
                    let outs: Vec<&Tensor> = b.outputs.iter().collect();
                    exec(&op, &ins, &outs)
                        .map_err(|e| e.context(format_args!("{} step on {}", self.kind, b.device)))?;
                    for t in &b.outputs {
                        t.storage().bump_version();
                    }
                    for &i in &b.params {
                        if let Some(m) = self.state[i].as_mut() {
                            m.step = b.step;
                        }
                    }
                }
            }
            Ok(())
        })
    }

    /// The fused kernel applies decoupled decay, so Adam can use it only without decay.
    fn fusable(decoupled: bool, o: &AdamOptions, p: &Tensor, g: &Tensor) -> Result<bool> {
        if o.maximize || (!decoupled && o.weight_decay != 0.0) || g.dtype() != p.dtype() || g.shape() != p.shape() {
            return Ok(false);
        }
        let probe = Op::AdamW { lr: 0.0, beta1: 0.0, beta2: 0.0, eps: 0.0, weight_decay: 0.0, step: 1 };
        p.device().supports(&probe, p.dtype())
    }

    fn state_dict(&self) -> Result<OptimState> {
        let mut state = self.groups.state_dict(self.kind);
        for (i, m) in self.state.iter().enumerate() {
            if let Some(m) = m {
                state.scalars.insert(format!("state.{i}.step"), m.step as f64);
                state.tensors.insert(format!("state.{i}.exp_avg"), m.exp_avg.copy()?);
                state.tensors.insert(format!("state.{i}.exp_avg_sq"), m.exp_avg_sq.copy()?);
            }
        }
        Ok(state)
    }

    fn load_state_dict(&mut self, state: &OptimState) -> Result<()> {
        let kind = self.kind;
        let options = self.groups.check_state(kind, state)?;
        let params = self.groups.params();
        let unexpected = |name: &str| Error::invalid(format!("{kind}.load_state_dict: unexpected entry `{name}`"));
        for name in state.tensors.keys() {
            if !matches!(parse_state_key(name), Some((_, "exp_avg" | "exp_avg_sq"))) {
                return Err(unexpected(name));
            }
        }
        let mut moments: Vec<Option<Moments>> = (0..params.len()).map(|_| None).collect();
        for name in state.scalars.keys().filter(|k| k.starts_with("state.")) {
            let Some((i, "step")) = parse_state_key(name) else { return Err(unexpected(name)) };
            let step = state.scalar(name)?;
            if !(step.fract() == 0.0 && step >= 1.0) {
                return Err(Error::invalid(format!("{kind}.load_state_dict: `{name}` is {step}, not a step count")));
            }
            let get = |buf: &str| {
                state.tensors.get(&format!("state.{i}.{buf}")).ok_or_else(|| {
                    Error::invalid(format!("{kind}.load_state_dict: parameter {i} has a step but no `{buf}`"))
                })
            };
            moments[i] = Some(Moments {
                step: step as u64,
                exp_avg: buffer_for(&params[i], get("exp_avg")?)?,
                exp_avg_sq: buffer_for(&params[i], get("exp_avg_sq")?)?,
            });
        }
        if let Some(name) = state.tensors.keys().find(|k| parse_state_key(k).is_some_and(|(i, _)| moments[i].is_none()))
        {
            return Err(Error::invalid(format!("{kind}.load_state_dict: `{name}` has no step count beside it")));
        }
        self.groups.set_options(options);
        self.state = moments;
        Ok(())
    }
}

/// One parameter's update from elementwise ops, PyTorch's formula.
fn composite_update(decoupled: bool, o: &AdamOptions, p: &Tensor, grad: &Tensor, m: &Moments) -> Result<()> {
    let (b1, b2) = o.betas;
    let mut g = if o.maximize { grad.neg()? } else { grad.clone() };
    if o.weight_decay != 0.0 {
        if decoupled {
            p.mul_scalar_(1.0 - o.lr * o.weight_decay)?;
        } else {
            g = g.add(&p.mul_scalar(o.weight_decay)?)?;
        }
    }
    m.exp_avg.mul_scalar_(b1)?;
    m.exp_avg.add_(&g.mul_scalar(1.0 - b1)?)?;
    m.exp_avg_sq.mul_scalar_(b2)?;
    m.exp_avg_sq.add_(&g.mul(&g)?.mul_scalar(1.0 - b2)?)?;
    // Bias corrections in f64, as the fused kernel does.
    let bc1 = 1.0 - b1.powf(m.step as f64);
    let bc2 = 1.0 - b2.powf(m.step as f64);
    let denom = m.exp_avg_sq.sqrt()?.div_scalar(bc2.sqrt())?.add_scalar(o.eps)?;
    p.sub_(&m.exp_avg.div(&denom)?.mul_scalar(o.lr / bc1)?)
}

macro_rules! adam_type {
    ($name:ident, $decoupled:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug)]
        pub struct $name {
            core: AdamCore,
        }

        impl $name {
            /// The optimizer over one group of `params`.
            pub fn new(params: Vec<Tensor>, options: AdamOptions) -> Result<$name> {
                Self::with_groups(vec![ParamGroup::new(params, options)])
            }

            /// The optimizer over parameter groups, each with its own options.
            pub fn with_groups(groups: Vec<ParamGroup<AdamOptions>>) -> Result<$name> {
                Ok($name { core: AdamCore::new(stringify!($name), $decoupled, groups)? })
            }

            /// The parameter groups.
            pub fn param_groups(&self) -> &[ParamGroup<AdamOptions>] {
                &self.core.groups.groups
            }

            /// One step with every gradient multiplied by `grad_scale` (one floating-point
            /// element, on any device) as it is read; the gradients are left as they are. A
            /// trainer that clips by the global norm passes the clipping factor
            /// ([`clip_coefficient`](super::clip_coefficient)) here, which the fused kernel
            /// applies in the pass it makes anyway, instead of scaling every gradient in a
            /// pass of its own (PyTorch's fused AdamW takes a `grad_scale` likewise, as a
            /// divisor, for mixed precision). Nothing is read to the host.
            pub fn step_with_grad_scale(&mut self, grad_scale: &Tensor) -> Result<()> {
                self.core.step(Some(grad_scale))
            }

            /// Change the options of group `group` (checked).
            pub fn set_options(&mut self, group: usize, options: AdamOptions) -> Result<()> {
                options.validate()?;
                let n = self.core.groups.groups.len();
                let g = self
                    .core
                    .groups
                    .groups
                    .get_mut(group)
                    .ok_or_else(|| Error::invalid(format!("{}: no group {group} of {n}", stringify!($name))))?;
                g.options = options;
                Ok(())
            }
        }

        impl Optimizer for $name {
            fn step(&mut self) -> Result<()> {
                self.core.step(None)
            }
            fn params(&self) -> Vec<Tensor> {
                self.core.groups.params()
            }
            fn lrs(&self) -> Vec<f64> {
                self.core.groups.lrs()
            }
            fn set_lrs(&mut self, lrs: &[f64]) -> Result<()> {
                self.core.groups.set_lrs(self.core.kind, lrs)
            }
            fn state_dict(&self) -> Result<OptimState> {
                self.core.state_dict()
            }
            fn load_state_dict(&mut self, state: &OptimState) -> Result<()> {
                self.core.load_state_dict(state)
            }
        }
    };
}

adam_type!(
    Adam,
    false,
    "Adam (PyTorch's rule): `g = grad + wd·p`; `m = β1·m + (1-β1)·g`; `v = β2·v + (1-β2)·g²`; \
     `p -= lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + eps)`."
);
adam_type!(
    AdamW,
    true,
    "AdamW (decoupled weight decay, PyTorch's rule): `p *= 1 - lr·wd`, then Adam's update without the \
     L2 term. Uses the device's fused multi-tensor kernel when it claims one."
);
