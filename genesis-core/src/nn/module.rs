//! The [`Module`] trait: a forward function plus a description of the module's parameters,
//! buffers, children and training flag, from which naming, state dicts, mode switches and
//! device/dtype moves are derived.

use crate::autograd::no_grad;
use crate::device::Device;
use crate::error::{Error, ErrorKind, Result};
use crate::serialize::{LoadReport, StateDict};
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// A shared slot holding one parameter or buffer tensor. Clones share the slot, and
/// [`Param::get`] returns the very tensor the module computes with (shared storage and
/// autograd identity), so an optimizer updating it in place under `no_grad` is seen by the
/// next forward. Only moving the module to another device or dtype puts a new tensor in the slot.
#[derive(Clone)]
pub struct Param {
    slot: Arc<RwLock<Tensor>>,
}

impl Param {
    /// A trainable parameter: `t` detached and marked as a leaf that requires grad.
    pub fn parameter(t: Tensor) -> Result<Param> {
        Ok(Param::buffer(t.detach().requires_grad_(true)?))
    }

    /// A buffer (state that is saved but not trained, such as running statistics).
    pub fn buffer(t: Tensor) -> Param {
        Param { slot: Arc::new(RwLock::new(t)) }
    }

    /// The tensor (a cheap handle to the same tensor, not a copy).
    pub fn get(&self) -> Tensor {
        self.slot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, t: Tensor) {
        *self.slot.write().unwrap_or_else(|p| p.into_inner()) = t;
    }
}

impl std::fmt::Debug for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Param({:?})", self.get())
    }
}

/// A module's training-mode flag (`module.training` in PyTorch); on by default.
#[derive(Debug)]
pub struct TrainingFlag(AtomicBool);

impl Default for TrainingFlag {
    fn default() -> Self {
        TrainingFlag(AtomicBool::new(true))
    }
}

impl TrainingFlag {
    /// True in training mode.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, training: bool) {
        self.0.store(training, Ordering::Relaxed);
    }
}

/// One thing a module owns, as reported by [`Module::visit`].
pub enum Entry<'a> {
    /// A trainable parameter.
    Param(&'a Param),
    /// A buffer (saved in the state dict, not trained).
    Buffer(&'a Param),
    /// A submodule; its entries get the name as a dotted prefix.
    Child(&'a dyn Module),
    /// The module's training flag (the name is ignored).
    Training(&'a TrainingFlag),
}

/// The tensors `pick` takes from the entries of `module` and its descendants, with their
/// dotted names, in walk order: the one walk behind the parameter, buffer and state-dict
/// views.
fn named_tensors<M: Module + ?Sized>(module: &M, pick: impl Fn(Entry<'_>) -> Option<Tensor>) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    module.walk("", &mut |name, e| out.extend(pick(e).map(|t| (name, t))));
    out
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A neural-network module (`torch.nn.Module`). Implement [`forward`](Module::forward) and
/// [`visit`](Module::visit); everything else is derived from them.
///
/// ```
/// use genesis::nn::{Entry, Linear, Module};
/// use genesis::{Device, Result, Tensor};
/// struct Mlp { fc1: Linear, fc2: Linear }
/// impl Module for Mlp {
///     fn forward(&self, x: &Tensor) -> Result<Tensor> {
///         self.fc2.forward(&self.fc1.forward(x)?.relu()?)
///     }
///     fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
///         f("fc1", Entry::Child(&self.fc1));
///         f("fc2", Entry::Child(&self.fc2));
///     }
/// }
/// let cpu = Device::parse("cpu")?;
/// let m = Mlp { fc1: Linear::new(4, 8, true, &cpu)?, fc2: Linear::new(8, 2, true, &cpu)? };
/// let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
/// # Ok::<(), genesis::Error>(())
/// ```
pub trait Module: Send + Sync {
    /// The computation.
    fn forward(&self, input: &Tensor) -> Result<Tensor>;

    /// Call `f` with each parameter, buffer, child module and training flag this module owns
    /// directly, under its attribute name (the names become the state-dict keys).
    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>));

    /// Every entry of this module and its descendants with dotted names (children expanded).
    fn walk(&self, prefix: &str, f: &mut dyn FnMut(String, Entry<'_>)) {
        self.visit(&mut |name, entry| {
            let full = join(prefix, name);
            match entry {
                Entry::Child(child) => child.walk(&full, f),
                other => f(full, other),
            }
        });
    }

    /// Parameters with their dotted names, in definition order.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        named_tensors(self, |e| match e {
            Entry::Param(p) => Some(p.get()),
            _ => None,
        })
    }

    /// The parameters (the tensors forward uses, for optimizers).
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// Buffers with their dotted names.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        named_tensors(self, |e| match e {
            Entry::Buffer(b) => Some(b.get()),
            _ => None,
        })
    }

    /// Total number of parameter elements.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Tensor::numel).sum()
    }

    /// Parameters and buffers by dotted name, detached (sharing storage with the module).
    fn state_dict(&self) -> StateDict {
        named_tensors(self, |e| match e {
            Entry::Param(p) | Entry::Buffer(p) => Some(p.get().detach()),
            _ => None,
        })
        .into_iter()
        .collect()
    }

    /// Copy `state` into the parameters and buffers (cast to their dtype and device), as
    /// PyTorch's `load_state_dict`: every key and shape is checked and every value converted
    /// before the first write, so on an error nothing was loaded. A shape mismatch is always an
    /// error; missing or unexpected keys are an error with `strict` and are listed in the
    /// returned report otherwise. (To replace a layer of another shape, leave its entries out
    /// of `state` and load with `strict` off.) The same rules as
    /// [`crate::serialize::load_state_dict_into`], which this calls.
    fn load_state_dict(&self, state: &StateDict, strict: bool) -> Result<LoadReport> {
        let own: StateDict = named_tensors(self, |e| match e {
            Entry::Param(p) | Entry::Buffer(p) => Some(p.get()),
            _ => None,
        })
        .into_iter()
        .collect();
        crate::serialize::load_state_dict_into(&own, state, strict)
    }

    /// Set training mode on this module and every descendant.
    fn train(&self, training: bool) {
        self.walk("", &mut |_, e| {
            if let Entry::Training(flag) = e {
                flag.set(training);
            }
        });
    }

    /// Evaluation mode (`train(false)`).
    fn eval(&self) {
        self.train(false);
    }

    /// The first training flag found (the module's own before its children's); true when
    /// neither it nor any descendant has one.
    fn is_training(&self) -> bool {
        let mut found = None;
        self.walk("", &mut |_, e| {
            if let (Entry::Training(flag), None) = (e, found) {
                found = Some(flag.get());
            }
        });
        found.unwrap_or(true)
    }

    /// Clear the gradients of every parameter.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }

    /// Move every parameter and buffer to `device`. Parameters become new leaves there, so
    /// create optimizers after moving (as PyTorch recommends). All-or-nothing.
    fn to_device(&self, device: &Device) -> Result<()> {
        self.replace_all(&|t| t.to(device))
    }

    /// Cast every floating-point parameter and buffer to the floating-point `dtype` (integer
    /// buffers such as counters keep theirs). All-or-nothing.
    fn to_dtype(&self, dtype: DType) -> Result<()> {
        if !dtype.is_float() {
            return Err(Error::new(
                ErrorKind::DtypeMismatch,
                format!("to_dtype: modules can only be cast to a floating-point dtype, got {dtype}"),
            ));
        }
        self.replace_all(&|t| if t.dtype().is_float() { t.to_dtype(dtype) } else { Ok(t.clone()) })
    }

    /// Put `convert(t)` in every parameter and buffer slot, keeping `requires_grad`.
    fn replace_all(&self, convert: &dyn Fn(&Tensor) -> Result<Tensor>) -> Result<()> {
        let mut slots: Vec<Param> = Vec::new();
        self.walk("", &mut |_, e| {
            if let Entry::Param(p) | Entry::Buffer(p) = e {
                slots.push(p.clone());
            }
        });
        let new = no_grad(|| {
            slots
                .iter()
                .map(|p| {
                    let old = p.get();
                    let t = convert(&old.detach())?;
                    let t = if t.shares_storage(&old) && t.dtype() == old.dtype() { old.clone() } else { t };
                    if old.requires_grad() && !t.requires_grad() {
                        t.detach().requires_grad_(true)
                    } else {
                        Ok(t)
                    }
                })
                .collect::<Result<Vec<_>>>()
        })?;
        for (p, t) in slots.iter().zip(new) {
            p.set(t);
        }
        Ok(())
    }
}
