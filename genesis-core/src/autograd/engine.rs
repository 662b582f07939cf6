//! The backward pass: dependency counting, gradient accumulation, hooks, capture.

use super::{set_grad_enabled, Edge, Node};
use crate::error::{Error, ErrorKind, Result};
use crate::tensor::{Tensor, TensorInner};
use std::collections::HashMap;
use std::sync::Arc;

fn node_key(n: &Arc<Node>) -> usize {
    Arc::as_ptr(n) as usize
}

fn inner_key(t: &Arc<TensorInner>) -> usize {
    Arc::as_ptr(t) as usize
}

/// A function to run when the current backward pass has accumulated every gradient.
type Callback = Box<dyn FnOnce() -> Result<()>>;

/// What a backward pass running on this thread keeps beside its graph walk.
struct Frame {
    /// The pass's id.
    id: u64,
    /// Callbacks queued to run at its end.
    callbacks: Vec<Callback>,
    /// The ones it made itself as the gradients of scalar roots (`loss.backward()`), with
    /// their storage versions, when it frees each node's backward after running it: see
    /// [`takes_kept_gradients`]. Weak, so they stay unique to the pass.
    unit_seeds: Vec<(std::sync::Weak<TensorInner>, u64)>,
}

thread_local! {
    /// One frame per backward pass running on this thread, innermost last (a hook may itself
    /// run a backward pass).
    static FRAMES: std::cell::RefCell<Vec<Frame>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Ids of backward passes: each pass gets a new one.
static PASSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The frame of one backward pass, removed when the pass ends, however it ends.
struct FrameGuard;

impl FrameGuard {
    fn push(unit_seeds: Vec<(std::sync::Weak<TensorInner>, u64)>) -> FrameGuard {
        let id = PASSES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        FRAMES.with(|f| f.borrow_mut().push(Frame { id, callbacks: Vec::new(), unit_seeds }));
        FrameGuard
    }

    /// The callbacks queued so far (callbacks queued while they run are not run).
    fn take(&self) -> Vec<Callback> {
        FRAMES.with(|f| f.borrow_mut().last_mut().map(|f| std::mem::take(&mut f.callbacks)).unwrap_or_default())
    }
}

impl Drop for FrameGuard {
    fn drop(&mut self) {
        FRAMES.with(|f| f.borrow_mut().pop());
    }
}

/// The id of the backward pass running on this thread (innermost), if any: a hook that keeps
/// state across a pass can tell a new pass from the rest of one that failed.
pub(crate) fn current_pass() -> Option<u64> {
    FRAMES.with(|f| f.borrow().last().map(|f| f.id))
}

/// Whether a backward whose output's gradient is `g` may return gradients it kept as they
/// are: `g` is a gradient of exactly one that the running pass made itself for a scalar root,
/// unchanged since, and the pass frees the backward once it has run, so nothing it kept can
/// see what later happens to the tensors it hands over (`.grad` written in place, say). The
/// chunked head loss keeps gradients the size of the vocabulary's table and so skips a pass.
pub(crate) fn takes_kept_gradients(g: &Tensor) -> bool {
    let inner = g.inner_arc();
    FRAMES.with(|f| {
        f.borrow().last().is_some_and(|frame| {
            frame.unit_seeds.iter().any(|(seed, version)| {
                std::ptr::eq(seed.as_ptr(), Arc::as_ptr(&inner)) && *version == inner.storage.version()
            })
        })
    })
}

/// Run `callback` at the end of the backward pass running on this thread, after every
/// gradient has been accumulated (PyTorch's `queue_callback`); its error becomes the pass's
/// error. Outside a backward pass, an error.
pub(crate) fn queue_callback(callback: impl FnOnce() -> Result<()> + 'static) -> Result<()> {
    FRAMES.with(|f| match f.borrow_mut().last_mut() {
        Some(frame) => {
            frame.callbacks.push(Box::new(callback));
            Ok(())
        }
        None => Err(Error::invalid("queue_callback: no backward pass is running on this thread")),
    })
}

/// What to capture instead of accumulating into `.grad` (for [`grad`]).
enum Target {
    Leaf(usize),
    Output(usize, usize),
}

fn add_grads(a: Option<Tensor>, b: Tensor) -> Result<Tensor> {
    match a {
        None => Ok(b),
        Some(a) => a.add(&b),
    }
}

/// Run backward from `outputs` with the gradients `grad_outputs` (ones for scalar outputs
/// when `None`). With `targets`, return the gradients of those tensors instead of touching
/// any `.grad`.
pub(crate) fn run_backward(
    outputs: &[Tensor],
    grad_outputs: Option<&[Tensor]>,
    retain_graph: bool,
    create_graph: bool,
    targets: Option<&[Tensor]>,
) -> Result<Vec<Option<Tensor>>> {
    let roots = crate::tensor::seed_gradients(outputs, grad_outputs)?;
    let unit_seeds = match grad_outputs {
        None if !retain_graph => roots.iter().map(|(_, g)| (Arc::downgrade(&g.inner_arc()), g.version())).collect(),
        _ => Vec::new(),
    };
    let _mode = set_grad_enabled(create_graph);
    let callbacks = FrameGuard::push(unit_seeds);
    // Backward runs in the dtypes the forward chose, whatever autocast scope it is called in.
    let _amp = crate::amp::suspend();
    let targets: Option<Vec<Target>> = targets.map(|ts| {
        ts.iter()
            .map(|t| match t.grad_fn_and_index() {
                Some((n, i)) => Target::Output(node_key(&n), i),
                None => Target::Leaf(inner_key(&t.inner_arc())),
            })
            .collect()
    });
    let mut captured: Vec<Option<Tensor>> = vec![None; targets.as_ref().map_or(0, Vec::len)];
    let capture_index = |edge_leaf: Option<usize>, node_out: Option<(usize, usize)>| -> Option<usize> {
        targets.as_ref()?.iter().position(|t| match (t, edge_leaf, node_out) {
            (Target::Leaf(k), Some(l), _) => *k == l,
            (Target::Output(k, i), _, Some((n, j))) => *k == n && *i == j,
            _ => false,
        })
    };

    // Seed: gradients of the roots.
    let mut pending: HashMap<usize, Vec<Option<Tensor>>> = HashMap::new();
    let mut nodes: HashMap<usize, Arc<Node>> = HashMap::new();
    let mut leaf_grads: Vec<(Arc<TensorInner>, Tensor)> = Vec::new();
    for (root, grad) in &roots {
        match root.grad_fn_and_index() {
            Some((node, index)) => {
                let slot = pending.entry(node_key(&node)).or_insert_with(|| vec![None; node.n_outputs]);
                slot[index] = Some(add_grads(slot[index].take(), grad.clone())?);
                nodes.insert(node_key(&node), node);
            }
            None if root.requires_grad() => leaf_grads.push((root.inner_arc(), grad.clone())),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "backward: the tensor does not require grad and has no grad_fn (nothing to differentiate)",
                ))
            }
        }
    }

    // Count, for every node reachable from the roots, how many edges point at it.
    // Leaves are counted too: a leaf's gradient is complete once every edge into it has been
    // walked, and it is accumulated then (its post-accumulate hooks run while the rest of the
    // backward goes on, which is what lets data-parallel training overlap communication).
    let mut deps: HashMap<usize, usize> = HashMap::new();
    let mut leaf_deps: HashMap<usize, usize> = HashMap::new();
    let mut stack: Vec<Arc<Node>> = nodes.values().cloned().collect();
    let mut seen: std::collections::HashSet<usize> = nodes.keys().copied().collect();
    while let Some(node) = stack.pop() {
        for edge in node.edges.iter().flatten() {
            match edge {
                Edge::Node(next, _) => {
                    *deps.entry(node_key(next)).or_insert(0) += 1;
                    if seen.insert(node_key(next)) {
                        stack.push(next.clone());
                    }
                }
                Edge::Leaf(inner) => *leaf_deps.entry(inner_key(inner)).or_insert(0) += 1,
            }
        }
    }
    // Gradients of leaves still waiting for some of their edges, summed so far.
    let mut leaf_pending: HashMap<usize, (Arc<TensorInner>, Option<Tensor>)> = HashMap::new();
    for (inner, g) in leaf_grads.drain(..) {
        let entry = leaf_pending.entry(inner_key(&inner)).or_insert_with(|| (inner.clone(), None));
        entry.1 = Some(add_grads(entry.1.take(), g)?);
    }
    let finish_leaf = |inner: Arc<TensorInner>, g: Option<Tensor>, captured: &mut Vec<Option<Tensor>>| {
        let Some(g) = g else { return Ok(()) };
        match capture_index(Some(inner_key(&inner)), None) {
            Some(slot) => captured[slot] = Some(add_grads(captured[slot].take(), g)?),
            None if targets.is_none() => TensorInner::accumulate_grad_with_hooks(&inner, g, create_graph)?,
            None => {}
        }
        Ok::<(), Error>(())
    };
    // Root leaves that no node reaches are complete from the start.
    let complete: Vec<usize> = leaf_pending.keys().filter(|k| !leaf_deps.contains_key(k)).copied().collect();
    for key in complete {
        if let Some((inner, g)) = leaf_pending.remove(&key) {
            finish_leaf(inner, g, &mut captured)?;
        }
    }

    let mut ready: Vec<Arc<Node>> =
        nodes.values().filter(|n| deps.get(&node_key(n)).copied().unwrap_or(0) == 0).cloned().collect();
    while let Some(node) = ready.pop() {
        let key = node_key(&node);
        let mut grads = pending.remove(&key).unwrap_or_else(|| vec![None; node.n_outputs]);

        // Hooks and retained grads of this node's output tensors see the summed gradient.
        for (index, hook) in node.hooks.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if let Some(g) = &grads[*index] {
                if let Some(replaced) = hook(g)? {
                    grads[*index] = Some(replaced);
                }
            }
        }
        for (index, weak) in node.retained.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if let (Some(inner), Some(g)) = (weak.upgrade(), &grads[*index]) {
                TensorInner::accumulate_grad(&inner, g, create_graph)?;
            }
        }
        for (index, g) in grads.iter().enumerate() {
            if let (Some(slot), Some(g)) = (capture_index(None, Some((key, index))), g) {
                captured[slot] = Some(add_grads(captured[slot].take(), g.clone())?);
            }
        }

        let input_grads = {
            let guard = node.backward.lock().unwrap_or_else(|p| p.into_inner());
            let (f, add_into) = guard.as_ref().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "backward through {} a second time: its saved tensors were freed after the first backward; \
                         pass retain_graph = true the first time",
                        node.name
                    ),
                )
            })?;
            if grads.iter().all(Option::is_none) {
                vec![None; node.edges.len()]
            } else {
                let _span =
                    crate::profiler::Span::begin(crate::profiler::EventKind::Backward, || backward_name(node.name));
                let context = |e: Error| e.context(format_args!("{} backward", node.name));
                let sum = match (add_into, &node.edges[..]) {
                    (Some(_), [Some(edge)]) if !create_graph => sole_pending(edge, &pending, &leaf_pending),
                    _ => None,
                };
                match (add_into, sum) {
                    (Some(add_into), Some(sum)) if add_into(&grads, sum).map_err(context)? => vec![None],
                    _ => f(&grads).map_err(context)?,
                }
            }
        };
        if !retain_graph {
            node.backward.lock().unwrap_or_else(|p| p.into_inner()).take();
        }

        for (edge, g) in node.edges.iter().zip(input_grads) {
            let Some(edge) = edge else { continue };
            match edge {
                Edge::Node(next, index) => {
                    let next_key = node_key(next);
                    if let Some(g) = g {
                        let slot = pending.entry(next_key).or_insert_with(|| vec![None; next.n_outputs]);
                        slot[*index] = Some(add_grads(slot[*index].take(), g)?);
                    }
                    let count = deps.get_mut(&next_key).expect("counted above");
                    *count -= 1;
                    if *count == 0 {
                        ready.push(next.clone());
                    }
                }
                Edge::Leaf(inner) => {
                    let key = inner_key(inner);
                    let entry = leaf_pending.entry(key).or_insert_with(|| (inner.clone(), None));
                    if let Some(g) = g {
                        entry.1 = Some(add_grads(entry.1.take(), g)?);
                    }
                    let count = leaf_deps.get_mut(&key).expect("counted above");
                    *count -= 1;
                    if *count == 0 {
                        if let Some((inner, g)) = leaf_pending.remove(&key) {
                            finish_leaf(inner, g, &mut captured)?;
                        }
                    }
                }
            }
        }
    }
    // Every counted edge has been walked unless an error stopped the pass above.
    for (_, (inner, g)) in leaf_pending {
        finish_leaf(inner, g, &mut captured)?;
    }
    for callback in callbacks.take() {
        callback()?;
    }
    Ok(captured)
}

/// The gradient summed so far for the input `edge` leads to, when it is dense and nothing but
/// this pass holds it or its memory (not a caller's gradient, a saved tensor, or a view one
/// backward handed to two inputs): a node may then add into it in place.
fn sole_pending<'a>(
    edge: &Edge,
    pending: &'a HashMap<usize, Vec<Option<Tensor>>>,
    leaf_pending: &'a HashMap<usize, (Arc<TensorInner>, Option<Tensor>)>,
) -> Option<&'a Tensor> {
    let sum = match edge {
        Edge::Node(next, index) => pending.get(&node_key(next))?[*index].as_ref(),
        Edge::Leaf(inner) => leaf_pending.get(&inner_key(inner))?.1.as_ref(),
    }?;
    (sum.is_sole_owner() && sum.is_contiguous()).then_some(sum)
}

/// Gradients of `outputs` (weighted by `grad_outputs`, ones for scalars when `None`) with
/// respect to `inputs`, without touching any `.grad` (`torch.autograd.grad`). An input the
/// outputs do not depend on gets `None`.
pub fn grad(
    outputs: &[Tensor],
    inputs: &[Tensor],
    grad_outputs: Option<&[Tensor]>,
    retain_graph: bool,
    create_graph: bool,
) -> Result<Vec<Option<Tensor>>> {
    run_backward(outputs, grad_outputs, retain_graph || create_graph, create_graph, Some(inputs))
}

/// The profiler's name of a node's backward, as PyTorch names them: `rms_norm` →
/// `RmsNormBackward` (distinct from backend ops such as `attention_backward`).
fn backward_name(op: &str) -> String {
    let mut name: String = op
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_uppercase().chain(c).collect::<String>()).unwrap_or_default()
        })
        .collect();
    name.push_str("Backward");
    name
}
