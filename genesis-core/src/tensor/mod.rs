//! Tensors: shared device storage, a strided layout, a dtype and autograd metadata.
//!
//! Ops live in `crate::ops` (one file per family); this file holds the type itself, creation
//! from host data, reading back, and the autograd-facing methods.

mod create;
mod display;
pub(crate) mod layout;

use crate::autograd::{self, Hook, Node, PostAccumulateHook};
use crate::device::Device;
use crate::element::Element;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::shape_err;
use crate::storage::Storage;
use genesis_backend_api::{DType, TensorDesc};
pub use layout::broadcast_shapes;
pub(crate) use layout::Layout;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub use create::TensorData;

/// The SDK's operand checks read a tensor's dtype, shape and strides: the core validates an
/// op's operands with the same rules and wording as every backend.
impl genesis_backend_api::sdk::checks::Meta for Tensor {
    fn dtype(&self) -> DType {
        self.inner.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.inner.layout.shape
    }
    fn strides(&self) -> &[isize] {
        &self.inner.layout.strides
    }
}

/// An n-dimensional array on a device, with PyTorch's semantics: cloning is cheap and shares
/// the data; views share storage; ops record an autograd graph when an input requires grad.
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<TensorInner>,
}

pub(crate) struct TensorInner {
    pub storage: Arc<Storage>,
    pub layout: Layout,
    pub dtype: DType,
    grad_fn: Option<(Arc<Node>, usize)>,
    requires_grad: AtomicBool,
    grad: Mutex<Option<Tensor>>,
    hooks: Mutex<Vec<Arc<Hook>>>,
    post_accumulate_hooks: Mutex<Vec<Arc<PostAccumulateHook>>>,
}

impl TensorInner {
    fn new(storage: Arc<Storage>, layout: Layout, dtype: DType) -> TensorInner {
        TensorInner {
            storage,
            layout,
            dtype,
            grad_fn: None,
            requires_grad: AtomicBool::new(false),
            grad: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
            post_accumulate_hooks: Mutex::new(Vec::new()),
        }
    }

    /// `.grad += g` (detached unless building a higher-order graph).
    pub(crate) fn accumulate_grad(inner: &Arc<TensorInner>, g: &Tensor, create_graph: bool) -> Result<()> {
        let g = if create_graph { g.clone() } else { g.detach() };
        let mut slot = inner.grad.lock().unwrap_or_else(|p| p.into_inner());
        let summed = match slot.take() {
            None => g,
            Some(old) if create_graph => old.add(&g)?,
            Some(old) => autograd::no_grad(|| old.add(&g))?,
        };
        *slot = Some(summed);
        Ok(())
    }

    pub(crate) fn accumulate_grad_with_hooks(
        inner: &Arc<TensorInner>,
        mut g: Tensor,
        create_graph: bool,
    ) -> Result<()> {
        let hooks: Vec<Arc<Hook>> = inner.hooks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for hook in hooks {
            if let Some(replaced) = hook(&g)? {
                g = replaced;
            }
        }
        Self::accumulate_grad(inner, &g, create_graph)?;
        let post: Vec<Arc<PostAccumulateHook>> =
            inner.post_accumulate_hooks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if !post.is_empty() {
            let tensor = Tensor { inner: inner.clone() };
            for hook in post {
                hook(&tensor)?;
            }
        }
        Ok(())
    }
}

impl Tensor {
    pub(crate) fn from_parts(storage: Arc<Storage>, layout: Layout, dtype: DType) -> Tensor {
        Tensor { inner: Arc::new(TensorInner::new(storage, layout, dtype)) }
    }

    /// A new tensor with uninitialized contents (every caller writes all of it).
    pub(crate) fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let numel = shape.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n));
        let bytes = numel
            .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
            .ok_or_else(|| Error::invalid(format!("shape {shape:?} is too large")))?;
        Ok(Self::from_parts(Arc::new(Storage::new(device, bytes)?), Layout::contiguous(shape), dtype))
    }

    /// An uninitialised dense tensor shaped like `self` whose elements lie in memory in the
    /// order of `self`'s strides (outermost first), as PyTorch's `empty_like` keeps a
    /// permuted tensor's memory format. An op whose output follows its input's order keeps
    /// transposed views transposed: attention's `(b, h, s, d)` views of `(b, s, h·d)`
    /// projections then need no copy on the way back to `(b, s, h·d)`.
    pub(crate) fn empty_like(&self) -> Result<Tensor> {
        let strides = &self.layout().strides;
        let mut order: Vec<usize> = (0..self.rank()).collect();
        order.sort_by_key(|&d| std::cmp::Reverse(strides[d].unsigned_abs()));
        let shape: Vec<usize> = order.iter().map(|&d| self.shape()[d]).collect();
        let dense = Self::empty(&shape, self.dtype(), self.device())?;
        let mut inverse = vec![0; order.len()];
        for (i, &d) in order.iter().enumerate() {
            inverse[d] = i;
        }
        Ok(dense.with_layout(dense.layout().permute(&inverse)))
    }

    /// A view of the same storage with another layout (no autograd link; callers record).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Self::from_parts(self.inner.storage.clone(), layout, self.inner.dtype)
    }

    pub(crate) fn with_grad_fn(self, node: Arc<Node>, index: usize) -> Tensor {
        let mut inner = TensorInner::new(self.inner.storage.clone(), self.inner.layout.clone(), self.inner.dtype);
        inner.grad_fn = Some((node, index));
        Tensor { inner: Arc::new(inner) }
    }

    /// Whether this handle is the only one to the tensor and the tensor the only one to its
    /// memory: nothing else can see a change made in place.
    pub(crate) fn is_sole_owner(&self) -> bool {
        Arc::strong_count(&self.inner) == 1 && Arc::strong_count(&self.inner.storage) == 1
    }

    pub(crate) fn inner_arc(&self) -> Arc<TensorInner> {
        self.inner.clone()
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    pub(crate) fn storage(&self) -> &Arc<Storage> {
        &self.inner.storage
    }

    pub(crate) fn grad_fn_and_index(&self) -> Option<(Arc<Node>, usize)> {
        self.inner.grad_fn.clone()
    }

    /// The descriptor of this tensor with `layout` (default: its own).
    pub(crate) fn desc_with(&self, layout: &Layout) -> Result<TensorDesc> {
        Ok(TensorDesc::new(
            self.inner.storage.buffer,
            layout.offset * self.inner.dtype.size_in_bytes(),
            self.inner.dtype,
            &layout.shape,
            &layout.strides,
        )?)
    }

    pub(crate) fn desc(&self) -> Result<TensorDesc> {
        self.desc_with(&self.inner.layout)
    }

    /// Version of the underlying storage (bumped by in-place ops).
    pub(crate) fn version(&self) -> u64 {
        self.inner.storage.version()
    }

    // ---- accessors ----

    /// The size of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.inner.layout.shape
    }

    /// The size of dim `d` (negative counts from the end).
    pub fn size(&self, dim: isize) -> Result<usize> {
        Ok(self.shape()[layout::wrap_dim("size", dim, self.rank())?])
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[isize] {
        &self.inner.layout.strides
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.inner.layout.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// The device holding the data.
    pub fn device(&self) -> &Device {
        &self.inner.storage.device
    }

    /// True when the elements are dense and row-major.
    pub fn is_contiguous(&self) -> bool {
        self.inner.layout.is_contiguous()
    }

    /// True when `self` and `other` are views of one storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.inner.storage, &other.inner.storage)
    }

    // ---- reading back ----

    /// The elements in row-major order, converted to `T` when the dtype differs.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let t =
            if T::DTYPE == self.dtype() { self.contiguous()? } else { autograd::no_grad(|| self.to_dtype(T::DTYPE))? };
        let esize = t.dtype().size_in_bytes();
        let mut bytes = vec![0u8; t.numel() * esize];
        let _span = crate::profiler::transfer(t.device(), "copy_to_host", t.shape(), t.dtype());
        t.device().read(t.storage().buffer, t.layout().offset * esize, &mut bytes)?;
        Ok(T::read_bytes(&bytes))
    }

    /// The single element of a one-element tensor.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::invalid(format!(
                "item: tensor of shape {:?} has {} elements, not 1",
                self.shape(),
                self.numel()
            )));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// The elements as f64, whatever the dtype (for printing and tests).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        self.to_vec::<f64>()
    }

    // ---- autograd ----

    /// True when gradients flow to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        self.inner.grad_fn.is_some() || self.inner.requires_grad.load(Ordering::Relaxed)
    }

    /// Mark a leaf as requiring grad (or not). Only floating-point leaves can require grad.
    pub fn requires_grad_(self, requires: bool) -> Result<Tensor> {
        if self.inner.grad_fn.is_some() {
            return Err(Error::invalid("requires_grad_: only leaf tensors can change requires_grad (use detach())"));
        }
        if requires && !self.dtype().is_float() {
            return Err(Error::new(
                ErrorKind::DtypeMismatch,
                format!("requires_grad_: only floating-point tensors can require grad, this one is {}", self.dtype()),
            ));
        }
        self.inner.requires_grad.store(requires, Ordering::Relaxed);
        Ok(self)
    }

    /// True for tensors not produced by a recorded op.
    pub fn is_leaf(&self) -> bool {
        self.inner.grad_fn.is_none()
    }

    /// The accumulated gradient, if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.inner.grad.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Clear the accumulated gradient (`set_to_none`, PyTorch's default).
    pub fn zero_grad(&self) {
        *self.inner.grad.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Replace the gradient (optimizers and gradient clipping use this).
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            if g.shape() != self.shape() {
                return Err(shape_err(format!(
                    "set_grad: gradient shape {:?} differs from tensor shape {:?}",
                    g.shape(),
                    self.shape()
                )));
            }
        }
        *self.inner.grad.lock().unwrap_or_else(|p| p.into_inner()) = grad;
        Ok(())
    }

    /// The node that produced this tensor (`None` for leaves).
    pub(crate) fn grad_node(&self) -> Option<&Arc<Node>> {
        self.inner.grad_fn.as_ref().map(|(n, _)| n)
    }

    /// The name of the op that produced this tensor, for debugging (`None` for leaves).
    pub fn grad_fn_name(&self) -> Option<&'static str> {
        self.inner.grad_fn.as_ref().map(|(n, _)| n.name)
    }

    /// The same data, cut from the graph.
    pub fn detach(&self) -> Tensor {
        self.with_layout(self.inner.layout.clone())
    }

    /// Keep `.grad` of this non-leaf tensor during backward.
    pub fn retain_grad(&self) {
        if let Some((node, index)) = &self.inner.grad_fn {
            node.retained.lock().unwrap_or_else(|p| p.into_inner()).push((*index, Arc::downgrade(&self.inner)));
        }
    }

    /// Call `hook` with this tensor's gradient during backward; a returned tensor replaces
    /// the gradient.
    pub fn register_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<Option<Tensor>> + Send + Sync + 'static,
    ) -> Result<()> {
        if !self.requires_grad() {
            return Err(Error::invalid("register_hook: the tensor does not require grad"));
        }
        let hook: Arc<Hook> = Arc::new(Box::new(hook));
        match &self.inner.grad_fn {
            Some((node, index)) => node.hooks.lock().unwrap_or_else(|p| p.into_inner()).push((*index, hook)),
            None => self.inner.hooks.lock().unwrap_or_else(|p| p.into_inner()).push(hook),
        }
        Ok(())
    }

    /// Call `hook` with this leaf each time a backward pass has finished accumulating into
    /// its `.grad` (`register_post_accumulate_grad_hook`): once per pass, as soon as every
    /// contribution to it is summed, while the rest of the pass goes on.
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        if !self.is_leaf() || !self.requires_grad() {
            return Err(Error::invalid(
                "register_post_accumulate_grad_hook: only leaf tensors that require grad accumulate gradients",
            ));
        }
        let hook: Arc<PostAccumulateHook> = Arc::new(Box::new(hook));
        self.inner.post_accumulate_hooks.lock().unwrap_or_else(|p| p.into_inner()).push(hook);
        Ok(())
    }

    /// Backpropagate from this scalar: gradients accumulate into the leaves' `.grad`, and the
    /// graph is freed.
    pub fn backward(&self) -> Result<()> {
        self.backward_with(None, false, false)
    }

    /// Backpropagate with an explicit output gradient (required for non-scalars), keeping the
    /// graph (`retain_graph`) or recording the gradient computation (`create_graph`).
    ///
    /// With `create_graph`, a leaf's `.grad` holds a graph that leads back to the leaf, a
    /// reference cycle that keeps both alive (as in PyTorch, which warns about it): clear the
    /// gradients (`zero_grad`, or set them to `None`) when done, or use [`crate::grad`], which
    /// returns the gradients instead of storing them.
    pub fn backward_with(&self, gradient: Option<&Tensor>, retain_graph: bool, create_graph: bool) -> Result<()> {
        let outputs = std::slice::from_ref(self);
        autograd::run_backward(
            outputs,
            gradient.map(std::slice::from_ref),
            retain_graph || create_graph,
            create_graph,
            None,
        )
        .map(|_| ())
    }
}

/// Pair each output with its seed gradient: the given one, or ones for a scalar.
pub(crate) fn seed_gradients(outputs: &[Tensor], grads: Option<&[Tensor]>) -> Result<Vec<(Tensor, Tensor)>> {
    if let Some(grads) = grads {
        if grads.len() != outputs.len() {
            return Err(Error::invalid(format!("backward: {} gradients for {} outputs", grads.len(), outputs.len())));
        }
    }
    outputs
        .iter()
        .enumerate()
        .map(|(i, out)| {
            let g = match grads {
                Some(gs) => {
                    let g = gs[i].clone();
                    if g.shape() != out.shape() {
                        return Err(shape_err(format!(
                            "backward: gradient shape {:?} does not match output shape {:?}",
                            g.shape(),
                            out.shape()
                        )));
                    }
                    g
                }
                None if out.numel() == 1 => Tensor::ones_like(out)?,
                None => {
                    return Err(Error::invalid(format!(
                        "backward: grad can be implicitly created only for scalar outputs; this output has shape {:?} \
                         (pass a gradient)",
                        out.shape()
                    )))
                }
            };
            Ok((out.clone(), g))
        })
        .collect()
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor(shape={:?}, dtype={}, device={})", self.shape(), self.dtype(), self.device())
    }
}
