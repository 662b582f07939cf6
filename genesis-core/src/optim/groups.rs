//! Parameter groups and the optimizer state dict shared by every optimizer.

use crate::error::{Error, ErrorKind, Result};
use crate::ops::shape_err;
use crate::serialize::StateDict;
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Parameters that share hyperparameters (`optimizer.param_groups[i]` in PyTorch).
#[derive(Clone, Debug)]
pub struct ParamGroup<O> {
    /// The parameters: leaf tensors, updated in place.
    pub params: Vec<Tensor>,
    /// This group's hyperparameters.
    pub options: O,
}

impl<O> ParamGroup<O> {
    /// A group of `params` with `options`.
    pub fn new(params: Vec<Tensor>, options: O) -> Self {
        ParamGroup { params, options }
    }
}

/// Hyperparameters of one parameter group, convertible to and from named numbers so that
/// they can travel in an [`OptimState`].
pub trait GroupOptions: Clone + Send + std::fmt::Debug {
    /// The learning rate.
    fn lr(&self) -> f64;
    /// Change the learning rate.
    fn set_lr(&mut self, lr: f64);
    /// Every hyperparameter by name (booleans as 0 or 1).
    fn to_values(&self) -> Vec<(&'static str, f64)>;
    /// The options with every hyperparameter read through `get` (which errors on a missing
    /// name).
    fn from_values(get: &dyn Fn(&str) -> Result<f64>) -> Result<Self>;
    /// An error naming the first invalid hyperparameter.
    fn validate(&self) -> Result<()>;
}

/// An optimizer's state: `kind` names the optimizer, `tensors` holds per-parameter buffers
/// named `state.{i}.{buffer}` (`i` counts parameters over all groups, as PyTorch's state
/// dict does), and `scalars` holds `param_groups.{g}.{option}`, `param_groups.{g}.num_params`
/// and per-parameter numbers such as `state.{i}.step`.
#[derive(Clone, Debug, Default)]
pub struct OptimState {
    /// The optimizer that made this state (`"SGD"`, `"Adam"`, `"AdamW"`).
    pub kind: String,
    /// Per-parameter buffers.
    pub tensors: StateDict,
    /// Hyperparameters and per-parameter numbers.
    pub scalars: BTreeMap<String, f64>,
}

impl OptimState {
    /// The scalar `name`, or an error naming it.
    pub fn scalar(&self, name: &str) -> Result<f64> {
        self.scalars
            .get(name)
            .copied()
            .ok_or_else(|| Error::invalid(format!("optimizer state dict ({}): missing entry `{name}`", self.kind)))
    }
}

/// Groups checked for use by an optimizer: valid options, leaf floating-point parameters,
/// no parameter twice.
#[derive(Debug)]
pub(crate) struct Groups<O> {
    pub groups: Vec<ParamGroup<O>>,
}

impl<O: GroupOptions> Groups<O> {
    pub fn new(optimizer: &str, groups: Vec<ParamGroup<O>>) -> Result<Self> {
        if groups.is_empty() {
            return Err(Error::invalid(format!("{optimizer}: no parameter groups given")));
        }
        let mut seen: Vec<*const ()> = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            group.options.validate().map_err(|e| e.context(format_args!("{optimizer}: parameter group {g}")))?;
            for (i, p) in group.params.iter().enumerate() {
                if !p.is_leaf() {
                    return Err(Error::invalid(format!(
                        "{optimizer}: parameter {i} of group {g} is not a leaf tensor (it was computed by {}); \
                         optimize the leaves it came from",
                        p.grad_fn_name().unwrap_or("an op")
                    )));
                }
                if !p.dtype().is_float() {
                    return Err(Error::new(
                        ErrorKind::DtypeMismatch,
                        format!("{optimizer}: parameter {i} of group {g} is {}, not floating point", p.dtype()),
                    ));
                }
                let id = Arc::as_ptr(&p.inner_arc()) as *const ();
                if seen.contains(&id) {
                    return Err(Error::invalid(format!(
                        "{optimizer}: parameter {i} of group {g} appears more than once among the parameters"
                    )));
                }
                seen.push(id);
            }
        }
        Ok(Groups { groups })
    }

    pub fn num_params(&self) -> usize {
        self.groups.iter().map(|g| g.params.len()).sum()
    }

    pub fn params(&self) -> Vec<Tensor> {
        self.groups.iter().flat_map(|g| g.params.iter().cloned()).collect()
    }

    /// `(global index, group options, param)` for every parameter.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &O, &Tensor)> {
        self.groups
            .iter()
            .flat_map(|g| g.params.iter().map(move |p| (&g.options, p)))
            .enumerate()
            .map(|(i, (o, p))| (i, o, p))
    }

    pub fn lrs(&self) -> Vec<f64> {
        self.groups.iter().map(|g| g.options.lr()).collect()
    }

    pub fn set_lrs(&mut self, optimizer: &str, lrs: &[f64]) -> Result<()> {
        if lrs.len() != self.groups.len() {
            return Err(Error::invalid(format!(
                "{optimizer}: {} learning rates for {} parameter groups",
                lrs.len(),
                self.groups.len()
            )));
        }
        if let Some(lr) = lrs.iter().find(|lr| !(lr.is_finite() && **lr >= 0.0)) {
            return Err(Error::invalid(format!("{optimizer}: invalid learning rate {lr}")));
        }
        for (g, &lr) in self.groups.iter_mut().zip(lrs) {
            g.options.set_lr(lr);
        }
        Ok(())
    }

    /// The group part of a state dict: options and parameter counts.
    pub fn state_dict(&self, kind: &str) -> OptimState {
        let mut scalars = BTreeMap::new();
        for (g, group) in self.groups.iter().enumerate() {
            for (name, v) in group.options.to_values() {
                scalars.insert(format!("param_groups.{g}.{name}"), v);
            }
            scalars.insert(format!("param_groups.{g}.num_params"), group.params.len() as f64);
        }
        OptimState { kind: kind.to_string(), tensors: StateDict::new(), scalars }
    }

    /// Check that `state` was made by a `kind` optimizer for parameters like ours (group
    /// count, parameter counts, buffer shapes and that every buffer belongs to a parameter),
    /// and return the options it holds. Nothing is changed here, so a refused state leaves
    /// the optimizer as it was.
    pub fn check_state(&self, kind: &str, state: &OptimState) -> Result<Vec<O>> {
        let err = |m: String| Error::invalid(format!("{kind}.load_state_dict: {m}"));
        if state.kind != kind {
            return Err(err(format!("the state dict was made by {}, not {kind}", state.kind)));
        }
        let n_groups =
            state.scalars.keys().filter(|k| k.starts_with("param_groups.") && k.ends_with(".num_params")).count();
        if n_groups != self.groups.len() {
            return Err(err(format!(
                "the state dict has {n_groups} parameter groups, this optimizer has {}",
                self.groups.len()
            )));
        }
        let mut options = Vec::with_capacity(n_groups);
        for (g, group) in self.groups.iter().enumerate() {
            let n = state.scalar(&format!("param_groups.{g}.num_params"))?;
            if n != group.params.len() as f64 {
                return Err(err(format!(
                    "parameter group {g} has {n} parameters in the state dict and {} here",
                    group.params.len()
                )));
            }
            let o = O::from_values(&|name| state.scalar(&format!("param_groups.{g}.{name}")))?;
            o.validate().map_err(|e| e.context(format_args!("{kind}.load_state_dict: parameter group {g}")))?;
            options.push(o);
        }
        let params = self.params();
        for (name, t) in &state.tensors {
            let (i, _) = parse_state_key(name).ok_or_else(|| err(format!("unexpected entry `{name}`")))?;
            let p = params.get(i).ok_or_else(|| {
                err(format!("entry `{name}` is for parameter {i}, but there are {} parameters", params.len()))
            })?;
            if t.shape() != p.shape() {
                return Err(shape_err(format!(
                    "{kind}.load_state_dict: `{name}` has shape {:?} but parameter {i} has shape {:?}",
                    t.shape(),
                    p.shape()
                )));
            }
        }
        for name in state.scalars.keys().filter(|k| k.starts_with("state.")) {
            let (i, _) = parse_state_key(name).ok_or_else(|| err(format!("unexpected entry `{name}`")))?;
            if i >= params.len() {
                return Err(err(format!(
                    "entry `{name}` is for parameter {i}, but there are {} parameters",
                    params.len()
                )));
            }
        }
        Ok(options)
    }

    /// Install options checked by [`check_state`](Self::check_state).
    pub fn set_options(&mut self, options: Vec<O>) {
        for (g, o) in self.groups.iter_mut().zip(options) {
            g.options = o;
        }
    }
}

/// `state.{i}.{buffer}` → `(i, buffer)`.
pub(crate) fn parse_state_key(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("state.")?;
    let (i, buffer) = rest.split_once('.')?;
    Some((i.parse().ok()?, buffer))
}

/// A state buffer for `param`, moved to its device and dtype (a state dict may come from a
/// checkpoint loaded elsewhere), as its own storage.
pub(crate) fn buffer_for(param: &Tensor, t: &Tensor) -> Result<Tensor> {
    crate::autograd::no_grad(|| t.to(param.device())?.to_dtype(param.dtype())?.copy())
}

/// A hyperparameter check: `ok` or an error naming it and its value.
pub(crate) fn check(ok: bool, name: &str, value: f64, rule: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("invalid {name} {value}: {rule}")))
    }
}
