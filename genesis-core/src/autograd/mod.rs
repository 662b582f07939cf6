//! Reverse-mode automatic differentiation over a dynamic graph.
//!
//! Every differentiable op that sees an input requiring grad (with grad mode on) records a
//! `Node`: its backward function and one edge per input, pointing at the node that made the
//! input or at the leaf tensor itself. [`Tensor::backward`] and [`grad`] walk the graph from
//! the outputs in dependency order, summing gradients that meet, running hooks, and either
//! accumulating into leaves' `.grad` or capturing the gradients asked for.
//!
//! Backward functions are written with ordinary tensor ops. With `create_graph` they run with
//! grad mode on, so the gradient is itself differentiable (higher-order gradients).

mod engine;
mod mode;

pub use engine::grad;
pub(crate) use engine::{current_pass, queue_callback, run_backward, takes_kept_gradients};
pub use mode::{is_grad_enabled, no_grad, set_grad_enabled, GradModeGuard};

use crate::error::{Error, ErrorKind, Result};
use crate::tensor::{Tensor, TensorInner};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A gradient hook: sees the gradient, may replace it.
pub type Hook = Box<dyn Fn(&Tensor) -> Result<Option<Tensor>> + Send + Sync>;

/// A post-accumulate-grad hook: sees the leaf after its `.grad` was updated.
pub type PostAccumulateHook = Box<dyn Fn(&Tensor) -> Result<()> + Send + Sync>;

/// Computes input gradients from output gradients (`None` = zero / not needed).
pub(crate) type BackwardFn = Box<dyn Fn(&[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// Adds a node's gradient for its one input into `sum`, a gradient already pending for that
/// input in the backward pass that nothing else holds, in place; `Ok(false)` when it cannot
/// (then the engine calls the node's backward). See [`record1_adding_into`].
pub(crate) type AddIntoFn = Box<dyn Fn(&[Option<Tensor>], &Tensor) -> Result<bool> + Send + Sync>;

/// Where an input's gradient goes.
pub(crate) enum Edge {
    /// Output `index` of another node.
    Node(Arc<Node>, usize),
    /// A leaf tensor that requires grad.
    Leaf(Arc<TensorInner>),
}

/// One recorded op in the graph.
pub(crate) struct Node {
    pub name: &'static str,
    /// The backward and, for ops of one input whose gradient is mostly zeros, the function
    /// that adds that gradient into a pending sum instead. Taken (set to `None`) after a
    /// backward without `retain_graph`, which frees the saved tensors they captured.
    pub backward: Mutex<Option<(BackwardFn, Option<AddIntoFn>)>>,
    /// One entry per input; `None` for inputs that need no gradient.
    pub edges: Vec<Option<Edge>>,
    pub n_outputs: usize,
    /// Hooks registered on this node's output tensors, by output index.
    pub hooks: Mutex<Vec<(usize, Arc<Hook>)>>,
    /// Non-leaf outputs whose `.grad` should be kept (`retain_grad`), by output index.
    pub retained: Mutex<Vec<(usize, std::sync::Weak<TensorInner>)>>,
}

/// The edge for input tensor `t`, or `None` when it needs no gradient.
pub(crate) fn edge_of(t: &Tensor) -> Option<Edge> {
    match t.grad_fn_and_index() {
        Some((node, index)) => Some(Edge::Node(node, index)),
        None if t.requires_grad() => Some(Edge::Leaf(t.inner_arc())),
        None => None,
    }
}

/// Record an op: if grad mode is on and an input requires grad, attach a node to `outputs`.
pub(crate) fn record(
    name: &'static str,
    inputs: &[&Tensor],
    outputs: Vec<Tensor>,
    backward: BackwardFn,
) -> Vec<Tensor> {
    record_node(name, inputs, outputs, backward, None)
}

/// [`record1`] for an op of one input whose gradient is mostly zeros, a gather's (an
/// embedding's rows). When a gradient for that input from elsewhere is already pending in the
/// backward pass and nothing else holds it, the engine calls `add_into` to add this op's part
/// into it in place, instead of `backward` making zeros of the input's size for the engine to
/// add: where a language model's tied embedding meets its output head's gradient, that saves
/// a fill and an addition of the whole table. A backward that builds a graph takes `backward`.
pub(crate) fn record1_adding_into(
    name: &'static str,
    input: &Tensor,
    output: Tensor,
    backward: BackwardFn,
    add_into: AddIntoFn,
) -> Tensor {
    record_node(name, &[input], vec![output], backward, Some(add_into)).pop().expect("one output")
}

fn record_node(
    name: &'static str,
    inputs: &[&Tensor],
    outputs: Vec<Tensor>,
    backward: BackwardFn,
    add_into: Option<AddIntoFn>,
) -> Vec<Tensor> {
    if !is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
        return outputs;
    }
    let node = Arc::new(Node {
        name,
        backward: Mutex::new(Some((backward, add_into))),
        edges: inputs.iter().map(|t| edge_of(t)).collect(),
        n_outputs: outputs.len(),
        hooks: Mutex::new(Vec::new()),
        retained: Mutex::new(Vec::new()),
    });
    outputs.into_iter().enumerate().map(|(i, t)| t.with_grad_fn(node.clone(), i)).collect()
}

/// Record a single-output op.
pub(crate) fn record1(name: &'static str, inputs: &[&Tensor], output: Tensor, backward: BackwardFn) -> Tensor {
    record(name, inputs, vec![output], backward).pop().expect("one output")
}

/// A tensor saved for backward, with the version of its storage at save time, so that an
/// in-place change before backward is caught instead of silently giving wrong gradients.
#[derive(Clone)]
pub(crate) struct Saved {
    tensor: Tensor,
    version: u64,
}

impl Saved {
    pub fn new(t: &Tensor) -> Saved {
        Saved { tensor: t.clone(), version: t.version() }
    }

    pub fn get(&self, op: &str) -> Result<&Tensor> {
        if self.tensor.version() != self.version {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{op} backward: a tensor of shape {:?} saved for the gradient was modified by an in-place operation \
                     (version {} at save, now {})",
                    self.tensor.shape(),
                    self.version,
                    self.tensor.version()
                ),
            ));
        }
        Ok(&self.tensor)
    }
}

/// An op's output saved for its own backward (PyTorch saves outputs the same way): the plain
/// tensor and a weak link to the node that made it. A backward that builds a graph
/// (`create_graph`) gets the output with its history, so gradients of gradients through it
/// are right; the node holds no strong reference to itself.
#[derive(Clone)]
pub(crate) struct SavedOutput {
    saved: Saved,
    node: Arc<OnceLock<Weak<Node>>>,
}

impl SavedOutput {
    /// The output; with grad mode on (inside a `create_graph` backward), with its history.
    pub fn get(&self, op: &str) -> Result<Tensor> {
        let t = self.saved.get(op)?.clone();
        match self.node.get().and_then(Weak::upgrade) {
            Some(node) if is_grad_enabled() => Ok(t.with_grad_fn(node, 0)),
            _ => Ok(t),
        }
    }
}

/// [`record1`] for an op whose backward reads its output: `backward` receives the output as
/// a [`SavedOutput`].
pub(crate) fn record1_reading_output(
    name: &'static str,
    inputs: &[&Tensor],
    output: Tensor,
    backward: impl FnOnce(SavedOutput) -> BackwardFn,
) -> Tensor {
    record_reading_output(name, inputs, vec![output], backward).pop().expect("one output")
}

/// [`record`] for an op whose backward reads its first output: `backward` receives that
/// output as a [`SavedOutput`].
pub(crate) fn record_reading_output(
    name: &'static str,
    inputs: &[&Tensor],
    outputs: Vec<Tensor>,
    backward: impl FnOnce(SavedOutput) -> BackwardFn,
) -> Vec<Tensor> {
    let saved = SavedOutput { saved: Saved::new(&outputs[0]), node: Arc::new(OnceLock::new()) };
    let link = saved.node.clone();
    let ys = record(name, inputs, outputs, backward(saved));
    if let Some(node) = ys[0].grad_node() {
        let _ = link.set(Arc::downgrade(node));
    }
    ys
}
