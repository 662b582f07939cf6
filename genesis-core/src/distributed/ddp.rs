//! `DistributedDataParallel`: one replica of a module per process, gradients averaged across
//! the processes during the backward pass, so every replica takes the same optimizer step.
//!
//! How the gradients travel (the design of PyTorch's reducer): the parameters are grouped
//! into buckets in reverse definition order (roughly the order backward produces their
//! gradients), a small first bucket and then buckets of about `bucket_cap_mb`. Each parameter
//! has a post-accumulate-grad hook; when the last gradient of a bucket lands, the bucket is
//! flattened and its average across the ranks is started while backward goes on: on a device
//! with communicators (NCCL) it is queued on the device after the work that made it; on the
//! host ring a communication thread does it. Buckets are launched strictly in order, so every
//! rank runs the same sequence of collectives. At the end of the pass (an autograd callback)
//! the averaged buckets become the parameters' `.grad` (views into the bucket on a device).

use super::ProcessGroup;
use crate::autograd::{current_pass, no_grad, queue_callback};
use crate::error::{Error, Result};
use crate::nn::{Entry, Module};
use crate::ops::shape_err;
use crate::serialize::safetensors_io::{tensor_bytes, tensor_from_bytes};
use crate::tensor::Tensor;
use genesis_backend_api::{CommId, DType};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, Weak};

/// Options of [`DistributedDataParallel`] (PyTorch's constructor arguments of the same names).
#[derive(Debug, Clone, Copy)]
pub struct DdpOptions {
    /// The size of a gradient bucket in MiB (default 25).
    pub bucket_cap_mb: f64,
    /// The size of the first bucket in MiB (default 1), small so that communication starts
    /// early in the backward pass.
    pub first_bucket_cap_mb: f64,
    /// Allow parameters that get no gradient in a pass: they count as zeros in the average.
    /// Off by default, and then such a parameter is an error naming it (not a hang).
    /// Unlike PyTorch, a parameter that no rank used gets a zero `.grad` rather than none
    /// (an optimizer with weight decay or momentum still moves it).
    pub find_unused_parameters: bool,
    /// Copy rank 0's buffers (batch-norm statistics) to every rank before each forward
    /// (default on, as PyTorch).
    pub broadcast_buffers: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_mb: 25.0,
            first_bucket_cap_mb: 1.0,
            find_unused_parameters: false,
            broadcast_buffers: true,
        }
    }
}

/// A module replicated across the ranks of a [`ProcessGroup`] (`torch.nn.parallel.
/// DistributedDataParallel`). Construction copies rank 0's parameters and buffers to every
/// rank (after checking that all ranks built the same model); each backward pass then leaves
/// the same averaged gradients on every rank. Use [`no_sync`](Self::no_sync) to accumulate
/// gradients locally over several passes, and [`module`](Self::module) to reach the wrapped
/// module (its state dict has no `module.` prefix).
///
/// The gradients are synchronized whichever way the forward pass was called (through this
/// wrapper or the inner module's own methods): the hooks are on the parameters.
pub struct DistributedDataParallel<M: Module> {
    module: M,
    group: ProcessGroup,
    options: DdpOptions,
    buffers: Vec<Tensor>,
    reducer: Arc<Mutex<Reducer>>,
}

/// A group of parameters whose gradients travel together.
struct Bucket {
    params: Vec<usize>,
    dtype: DType,
    /// Averaged through the device's communicator (else through the host ring's thread).
    on_device: bool,
}

/// What the hooks share: the buckets and the progress of the current backward pass.
struct Reducer {
    names: Vec<String>,
    params: Vec<Tensor>,
    buckets: Vec<Bucket>,
    find_unused: bool,
    no_sync: bool,
    /// The backward pass under way (its finishing callback is queued), by the engine's id.
    armed: Option<u64>,
    ready: Vec<bool>,
    launched: usize,
    /// The host-ring buckets of this pass on the group's communication thread: where their
    /// averages will arrive.
    on_ring: Vec<Option<Receiver<Result<Vec<u8>>>>>,
    /// The flat gradients of device buckets launched in this pass, being summed, and the
    /// communicator to wait for.
    flat: Vec<Option<(Tensor, Option<CommId>)>>,
    group: ProcessGroup,
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wrap `module` (already on this rank's device) with the default options.
    pub fn new(module: M, group: &ProcessGroup) -> Result<Self> {
        Self::with_options(module, group, DdpOptions::default())
    }

    /// Wrap `module` with `options`. Every rank must call this in the same order; a model
    /// whose parameter names, shapes or dtypes differ between ranks is an error on all of
    /// them.
    pub fn with_options(module: M, group: &ProcessGroup, options: DdpOptions) -> Result<Self> {
        let named: Vec<(String, Tensor)> = module.named_parameters();
        let buffers: Vec<(String, Tensor)> = module.named_buffers();
        let key = group.next_wrapper_key("ddp");
        check_same_model(group, &key, &named, &buffers)?;
        let everything: Vec<Tensor> = named.iter().chain(&buffers).map(|(_, t)| t.clone()).collect();
        broadcast_all(group, &everything)?;

        let trained: Vec<(String, Tensor)> = named.into_iter().filter(|(_, t)| t.requires_grad()).collect();
        let mut buckets = make_buckets(&trained, &options);
        for bucket in &mut buckets {
            bucket.on_device = group.device_comm(trained[bucket.params[0]].1.device())?.is_some();
        }
        let n = trained.len();
        let (names, params): (Vec<String>, Vec<Tensor>) = trained.into_iter().unzip();
        let reducer = Arc::new(Mutex::new(Reducer {
            names,
            params: params.clone(),
            buckets,
            find_unused: options.find_unused_parameters,
            no_sync: false,
            armed: None,
            ready: vec![false; n],
            launched: 0,
            on_ring: Vec::new(),
            flat: Vec::new(),
            group: group.clone(),
        }));
        for (i, p) in params.iter().enumerate() {
            let weak = Arc::downgrade(&reducer);
            p.register_post_accumulate_grad_hook(move |_| gradient_ready(&weak, i))?;
        }
        let buffers = buffers.into_iter().map(|(_, t)| t).collect();
        Ok(DistributedDataParallel { module, group: group.clone(), options, buffers, reducer })
    }

    /// The wrapped module.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The process group the gradients are averaged over.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.group
    }

    /// The parameters of each gradient bucket by name, in launch order.
    pub fn buckets(&self) -> Vec<Vec<String>> {
        let r = lock(&self.reducer);
        r.buckets.iter().map(|b| b.params.iter().map(|&p| r.names[p].clone()).collect()).collect()
    }

    /// Skip gradient synchronization while the guard lives (`with ddp.no_sync():`): gradients
    /// accumulate locally, and the next synchronized pass averages the accumulated sums.
    /// The flag is read when backward runs (PyTorch reads it at forward time): run the
    /// backward passes to accumulate inside the guard's scope.
    pub fn no_sync(&self) -> NoSync {
        let previous = std::mem::replace(&mut lock(&self.reducer).no_sync, true);
        NoSync { reducer: Arc::downgrade(&self.reducer), previous }
    }

    /// The hooks sit on the parameter tensors seen at construction: a module whose
    /// parameters were replaced since (moved to another device or dtype) would train without
    /// synchronization, so that is an error.
    fn check_parameters(&self) -> Result<()> {
        let r = lock(&self.reducer);
        let current: Vec<Tensor> = self.module.parameters().into_iter().filter(Tensor::requires_grad).collect();
        let same = current.len() == r.params.len() && current.iter().zip(&r.params).all(|(a, b)| a.shares_storage(b));
        if !same {
            return Err(Error::invalid(
                "DistributedDataParallel: the module's parameters were replaced after wrapping (moved to another \
                 device or dtype?); move the module first, then wrap it",
            ));
        }
        Ok(())
    }

    /// Copy rank 0's buffers to every rank (done before each forward with `broadcast_buffers`).
    pub fn sync_buffers(&self) -> Result<()> {
        broadcast_all(&self.group, &self.buffers)
    }
}

/// While alive, [`DistributedDataParallel::no_sync`] is in force.
pub struct NoSync {
    reducer: Weak<Mutex<Reducer>>,
    previous: bool,
}

impl Drop for NoSync {
    fn drop(&mut self) {
        if let Some(r) = self.reducer.upgrade() {
            lock(&r).no_sync = self.previous;
        }
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        self.check_parameters()?;
        if self.options.broadcast_buffers && !self.buffers.is_empty() && self.group.world_size() > 1 {
            self.sync_buffers()?;
        }
        self.module.forward(input)
    }

    /// The wrapped module is the child `module`, so state-dict keys carry PyTorch's
    /// `module.` prefix.
    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("module", Entry::Child(&self.module));
    }
}

/// A module as a script trains it whether or not it was launched as one rank of a group:
/// wrapped in [`DistributedDataParallel`] with a group, on its own without one. Scripts that
/// run both ways hold this instead of choosing between the two at every use.
pub enum MaybeDdp<M: Module> {
    /// No group: the module alone.
    Local(M),
    /// One rank of a group: the module under DDP.
    Ddp(DistributedDataParallel<M>),
}

impl<M: Module> MaybeDdp<M> {
    /// `module` under [`DistributedDataParallel::new`] when `group` is given, alone otherwise.
    pub fn new(module: M, group: Option<&ProcessGroup>) -> Result<Self> {
        Ok(match group {
            Some(group) => MaybeDdp::Ddp(DistributedDataParallel::new(module, group)?),
            None => MaybeDdp::Local(module),
        })
    }

    /// The module itself (inside the wrapper under DDP): its parameters and state-dict keys
    /// are the unwrapped ones.
    pub fn module(&self) -> &M {
        match self {
            MaybeDdp::Local(module) => module,
            MaybeDdp::Ddp(ddp) => ddp.module(),
        }
    }

    /// What a training step runs forward: the DDP wrapper (which averages the gradients), or
    /// the module alone.
    pub fn trained(&self) -> &dyn Module {
        match self {
            MaybeDdp::Local(module) => module,
            MaybeDdp::Ddp(ddp) => ddp,
        }
    }
}

fn lock(r: &Mutex<Reducer>) -> std::sync::MutexGuard<'_, Reducer> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// The post-accumulate hook of parameter `i`.
fn gradient_ready(reducer: &Weak<Mutex<Reducer>>, i: usize) -> Result<()> {
    let Some(shared) = reducer.upgrade() else { return Ok(()) };
    let mut r = lock(&shared);
    if r.no_sync {
        return Ok(());
    }
    let pass = current_pass();
    if r.armed != pass {
        // A new pass. If an earlier one failed before its end, its buckets are still out:
        // collect them before they are forgotten (their memory may still be written).
        if r.armed.is_some() {
            r.abandon();
        }
        r.armed = pass;
        r.ready.iter_mut().for_each(|x| *x = false);
        r.launched = 0;
        r.flat = vec![None; r.buckets.len()];
        r.on_ring = (0..r.buckets.len()).map(|_| None).collect();
        let weak = reducer.clone();
        queue_callback(move || finish(&weak))?;
    }
    r.ready[i] = true;
    r.launch_ready()
}

impl Reducer {
    /// Wait for the buckets a failed pass launched and drop them.
    fn abandon(&mut self) {
        for result in std::mem::take(&mut self.on_ring).into_iter().flatten() {
            let _ = result.recv();
        }
        for (tensor, comm) in std::mem::take(&mut self.flat).into_iter().flatten() {
            if let Some(comm) = comm {
                let _ = tensor.device().comm_wait(comm);
            }
        }
        self.launched = 0;
        self.armed = None;
    }

    /// Launch, in order, every bucket whose gradients are all ready.
    fn launch_ready(&mut self) -> Result<()> {
        while self.launched < self.buckets.len() && self.buckets[self.launched].params.iter().all(|&p| self.ready[p]) {
            self.launch(self.launched)?;
            self.launched += 1;
        }
        Ok(())
    }

    /// Flatten bucket `b`'s gradients (zeros for a parameter without one) and start their
    /// average.
    fn launch(&mut self, b: usize) -> Result<()> {
        let bucket = &self.buckets[b];
        for &p in &bucket.params {
            if let Some(g) = self.params[p].grad() {
                if g.dtype() != bucket.dtype || g.shape() != self.params[p].shape() {
                    return Err(Error::invalid(format!(
                        "DistributedDataParallel: the gradient of '{}' is {} {:?}, the parameter {} {:?}",
                        self.names[p],
                        g.dtype(),
                        g.shape(),
                        bucket.dtype,
                        self.params[p].shape()
                    )));
                }
            }
        }
        if bucket.on_device {
            let parts = bucket
                .params
                .iter()
                .map(|&p| match self.params[p].grad() {
                    Some(g) => g.reshape(&[-1]),
                    None => Tensor::zeros(&[self.params[p].numel()], bucket.dtype, self.params[p].device()),
                })
                .collect::<Result<Vec<_>>>()?;
            let flat = no_grad(|| Tensor::cat(&parts, 0))?;
            if bucket.dtype == DType::F16 {
                // f16 sums of many ranks overflow: divide first (PyTorch's default hook does).
                no_grad(|| flat.mul_scalar_(1.0 / self.group.world_size() as f64))?;
            }
            let comm = self.group.start_all_reduce_sum(&flat)?;
            self.flat[b] = Some((flat, comm));
            return Ok(());
        }
        let mut bytes = Vec::new();
        for &p in &bucket.params {
            match self.params[p].grad() {
                Some(g) => bytes.extend_from_slice(&tensor_bytes(&g)?),
                None => bytes.resize(bytes.len() + self.params[p].numel() * bucket.dtype.size_in_bytes(), 0),
            }
        }
        let result = self.group.start_ring_average(bytes, bucket.dtype)?;
        self.on_ring[b] = Some(result);
        Ok(())
    }
}

/// The end of a backward pass: check every parameter got a gradient, launch what is left,
/// wait for every bucket and write the averages into `.grad`.
fn finish(reducer: &Weak<Mutex<Reducer>>) -> Result<()> {
    let Some(shared) = reducer.upgrade() else { return Ok(()) };
    let mut r = lock(&shared);
    let unready: Vec<usize> = (0..r.params.len()).filter(|&p| !r.ready[p]).collect();
    if !unready.is_empty() {
        if !r.find_unused {
            let names: Vec<String> = unready.iter().take(8).map(|&p| r.names[p].clone()).collect();
            // Collect what was launched so the next pass starts clean; this rank now fails,
            // and the others see it leave instead of waiting for its buckets.
            r.abandon();
            return Err(Error::invalid(format!(
                "DistributedDataParallel: {} parameter(s) got no gradient in this backward pass ({}{}); if some \
                 parameters are unused by design, construct with DdpOptions {{ find_unused_parameters: true, .. }}",
                unready.len(),
                names.join(", "),
                if unready.len() > names.len() { ", ..." } else { "" }
            )));
        }
        for p in unready {
            r.ready[p] = true;
        }
        r.launch_ready()?;
    }
    let mut done: Vec<Option<Vec<u8>>> = vec![None; r.buckets.len()];
    for (b, result) in std::mem::take(&mut r.on_ring).into_iter().enumerate() {
        if let Some(result) = result {
            let bytes = result
                .recv()
                .map_err(|_| Error::communication("DistributedDataParallel: the communication thread stopped"))?;
            done[b] = Some(bytes?);
        }
    }
    let flat = std::mem::take(&mut r.flat);
    // The device buckets: order the device's work after their sums, then make them means.
    let scale = 1.0 / r.group.world_size() as f64;
    for (tensor, comm) in flat.iter().flatten() {
        if let Some(comm) = comm {
            tensor.device().comm_wait(*comm)?;
        }
        if tensor.dtype() != DType::F16 {
            no_grad(|| tensor.mul_scalar_(scale))?;
        }
    }
    for ((bucket, bytes), flat) in r.buckets.iter().zip(done).zip(flat) {
        let mut offset = 0;
        for &p in &bucket.params {
            let param = &r.params[p];
            let averaged = match &flat {
                Some((flat, _)) => flat.narrow(0, offset, param.numel())?.reshape(&shape_of(param))?,
                None => {
                    let bytes = bytes
                        .as_ref()
                        .ok_or_else(|| Error::communication("DistributedDataParallel: a bucket was not reduced"))?;
                    let size = bucket.dtype.size_in_bytes();
                    let range = offset * size..(offset + param.numel()) * size;
                    tensor_from_bytes(&bytes[range], bucket.dtype, param.shape(), param.device())?
                }
            };
            offset += param.numel();
            param.set_grad(Some(averaged))?;
        }
    }
    r.armed = None;
    Ok(())
}

fn shape_of(t: &Tensor) -> Vec<isize> {
    t.shape().iter().map(|&d| d as isize).collect()
}

/// Split parameters (in definition order) into buckets in reverse order: the first up to
/// `first_bucket_cap_mb`, the rest up to `bucket_cap_mb`; a change of dtype or device starts
/// a new bucket, since a bucket is one flat buffer.
fn make_buckets(params: &[(String, Tensor)], options: &DdpOptions) -> Vec<Bucket> {
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut bytes = 0usize;
    for (i, (_, t)) in params.iter().enumerate().rev() {
        let size = t.numel() * t.dtype().size_in_bytes();
        let cap = if buckets.len() <= 1 { options.first_bucket_cap_mb } else { options.bucket_cap_mb };
        let cap = (cap * 1048576.0) as usize;
        let fits = buckets.last().is_some_and(|b| {
            b.dtype == t.dtype() && params[b.params[0]].1.device() == t.device() && bytes + size <= cap.max(1)
        });
        if !fits {
            buckets.push(Bucket { params: Vec::new(), dtype: t.dtype(), on_device: false });
            bytes = 0;
        }
        if let Some(b) = buckets.last_mut() {
            b.params.push(i);
        }
        bytes += size;
    }
    buckets
}

/// Every rank publishes a description of its parameters and buffers; all compare them with
/// rank 0's, so a mismatch fails every rank with the same message.
fn check_same_model(
    group: &ProcessGroup,
    key: &str,
    params: &[(String, Tensor)],
    buffers: &[(String, Tensor)],
) -> Result<()> {
    let describe = |kind: &str, (name, t): &(String, Tensor)| format!("{kind} '{name}' {:?} {}", t.shape(), t.dtype());
    let mine: Vec<String> =
        params.iter().map(|p| describe("parameter", p)).chain(buffers.iter().map(|b| describe("buffer", b))).collect();
    let store = group.store();
    store.set(&format!("{key}/{}", group.rank()), mine.join("\n").as_bytes())?;
    let reference = String::from_utf8_lossy(&store.get(&format!("{key}/0"))?).into_owned();
    let reference: Vec<&str> = reference.lines().collect();
    for rank in 1..group.world_size() {
        let theirs = String::from_utf8_lossy(&store.get(&format!("{key}/{rank}"))?).into_owned();
        let theirs: Vec<&str> = theirs.lines().collect();
        let first_difference = (0..reference.len().max(theirs.len())).find(|&i| reference.get(i) != theirs.get(i));
        if let Some(i) = first_difference {
            return Err(shape_err(format!(
                "DistributedDataParallel: the ranks built different models: rank 0 has {} where rank {rank} has {}",
                reference.get(i).unwrap_or(&"nothing"),
                theirs.get(i).unwrap_or(&"nothing")
            )));
        }
    }
    Ok(())
}

/// Copy rank 0's `tensors` to every rank, in one message.
fn broadcast_all(group: &ProcessGroup, tensors: &[Tensor]) -> Result<()> {
    if group.world_size() == 1 || tensors.is_empty() {
        return Ok(());
    }
    let mut bytes = Vec::new();
    for t in tensors {
        bytes.extend_from_slice(&tensor_bytes(t)?);
    }
    group.ring().broadcast(&mut bytes, 0)?;
    let mut offset = 0;
    for t in tensors {
        let len = t.numel() * t.dtype().size_in_bytes();
        let value = tensor_from_bytes(&bytes[offset..offset + len], t.dtype(), t.shape(), t.device())?;
        offset += len;
        no_grad(|| t.copy_(&value))?;
    }
    Ok(())
}
