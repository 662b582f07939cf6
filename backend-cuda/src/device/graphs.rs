//! Graph capture (interface 1.5): the device's stream is captured into a CUDA graph, which a
//! replay launches with one call.
//!
//! What the capture must take care of, beyond the driver calls:
//! - Host reads, writes and synchronizations are refused while capturing (on a capturing
//!   stream they would invalidate the capture, or be recorded as copies from stale memory).
//! - Scratch buffers of ops captured into the graph are held until the graph is released: the
//!   graph writes them on every replay, so the allocator must not hand them to anyone else.
//!   (The host keeps the buffers of the tensors a graph touches alive itself.)
//! - Deferred index checks: the capture starts with an empty list of checks, so the checks
//!   captured are numbered from 1; a replay starts from an empty list again and queues copies
//!   of them, so a fault found at the next synchronization names its op as usual.

use super::{driver_error, CudaDevice, IndexCheck};
use cudarc::driver::sys;
use genesis_backend_api::{BackendError, BufferId, GraphId, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// The graphs of one device and the capture in progress.
#[derive(Default)]
pub struct Graphs {
    /// Whether the stream is being captured (checked on host transfers).
    capturing: AtomicBool,
    state: std::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Scratch buffers freed by ops captured so far.
    held: Option<Vec<BufferId>>,
    graphs: HashMap<u64, Captured>,
    next: u64,
}

struct Captured {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    scratch: Vec<BufferId>,
    checks: Vec<IndexCheck>,
}

// SAFETY: the graph handles are used only under the device's locks, with its context bound.
unsafe impl Send for Captured {}

impl Graphs {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An error naming `what` while the stream is captured.
    pub fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        if self.capturing.load(Ordering::Acquire) {
            return Err(BackendError::invalid(format!(
                "cuda: {what} is not allowed while the device is capturing a graph (copy inputs in before \
                 the capture or before a replay, and read outputs after it)"
            )));
        }
        Ok(())
    }

    /// Whether the stream is being captured.
    pub fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    /// While capturing, keep a freed scratch buffer for the graph (returns true); otherwise
    /// return false and let the caller free it.
    pub fn hold_scratch(&self, id: BufferId) -> bool {
        if !self.capturing.load(Ordering::Acquire) {
            return false;
        }
        match self.state().held.as_mut() {
            Some(held) => {
                held.push(id);
                true
            }
            None => false,
        }
    }
}

impl CudaDevice {
    /// Start capturing the stream (after the work issued so far has finished, so that the
    /// list of index checks starts empty and earlier errors are reported now).
    pub(crate) fn capture_begin(&self) -> Result<()> {
        self.bind()?;
        let mut checks = Self::lock(&self.index_checks);
        if self.graphs.state().held.is_some() {
            return Err(BackendError::invalid("capture_begin: this device is already capturing"));
        }
        self.wait_locked(&mut checks, "before a graph capture")?;
        // Relaxed: allocating a new segment (cuMemAlloc) while capturing is allowed.
        // SAFETY: our stream, not being captured (checked above).
        unsafe { sys::cuStreamBeginCapture_v2(self.stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) }
            .result()
            .map_err(|e| driver_error("cuStreamBeginCapture", e))?;
        self.graphs.state().held = Some(Vec::new());
        self.graphs.capturing.store(true, Ordering::Release);
        Ok(())
    }

    /// Stop capturing and instantiate the graph. The stream leaves capture mode whatever
    /// happens.
    pub(crate) fn capture_end(&self) -> Result<GraphId> {
        self.bind()?;
        let mut checks = Self::lock(&self.index_checks);
        let held = self
            .graphs
            .state()
            .held
            .take()
            .ok_or_else(|| BackendError::invalid("capture_end: no capture in progress"))?;
        self.graphs.capturing.store(false, Ordering::Release);
        // The captured checks never ran; they belong to the graph now.
        let captured_checks: Vec<IndexCheck> = checks.drain(..).collect();
        Self::lock(&self.pending).clear();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: our stream, in capture mode since `capture_begin`.
        let ended = unsafe { sys::cuStreamEndCapture(self.stream, &mut graph) }.result();
        let instantiated = ended.map_err(|e| driver_error("cuStreamEndCapture", e)).and_then(|()| {
            let mut exec: sys::CUgraphExec = std::ptr::null_mut();
            // SAFETY: `graph` is the valid graph the capture produced.
            unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }
                .result()
                .map(|()| exec)
                .map_err(|e| driver_error("cuGraphInstantiate", e))
        });
        let exec = match instantiated {
            Ok(exec) => exec,
            Err(e) => {
                if !graph.is_null() {
                    // SAFETY: the graph the capture produced, not instantiated.
                    unsafe { sys::cuGraphDestroy(graph) };
                }
                drop(checks);
                for id in held {
                    let _ = self.memory().free(id);
                }
                return Err(e);
            }
        };
        let mut state = self.graphs.state();
        state.next += 1;
        let id = state.next;
        state.graphs.insert(id, Captured { graph, exec, scratch: held, checks: captured_checks });
        Ok(GraphId(id))
    }

    /// Launch a graph on the stream.
    pub(crate) fn graph_replay(&self, graph: GraphId) -> Result<()> {
        self.bind()?;
        self.graphs.refuse_while_capturing("graph_replay")?;
        let mut checks = Self::lock(&self.index_checks);
        let state = self.graphs.state();
        let captured = state.graphs.get(&graph.0).ok_or_else(|| unknown(graph))?;
        if !captured.checks.is_empty() {
            if !checks.is_empty() {
                // The graph's checks carry the numbers 1..; make room for them.
                self.wait_locked(&mut checks, "before a graph replay")?;
            }
            checks.extend(captured.checks.iter().cloned());
        }
        // SAFETY: an instantiated graph of this device, launched on its stream.
        unsafe { sys::cuGraphLaunch(captured.exec, self.stream) }
            .result()
            .map_err(|e| driver_error("cuGraphLaunch", e))?;
        drop(state);
        drop(checks);
        self.note_issued(format!("graph replay {}", graph.0))
    }

    /// Destroy a graph and free the scratch buffers it held.
    pub(crate) fn graph_release(&self, graph: GraphId) -> Result<()> {
        self.bind()?;
        let captured = self.graphs.state().graphs.remove(&graph.0).ok_or_else(|| unknown(graph))?;
        // SAFETY: our stream; then handles of a graph of this device, destroyed once, after
        // its last launch finished (an error of that work is reported by the next wait).
        unsafe {
            let _ = cudarc::driver::result::stream::synchronize(self.stream);
            sys::cuGraphExecDestroy(captured.exec).result().map_err(|e| driver_error("cuGraphExecDestroy", e))?;
            sys::cuGraphDestroy(captured.graph).result().map_err(|e| driver_error("cuGraphDestroy", e))?;
        }
        for id in captured.scratch {
            self.memory().free(id)?;
        }
        Ok(())
    }
}

fn unknown(graph: GraphId) -> BackendError {
    BackendError::invalid(format!("cuda: unknown or released graph {}", graph.0))
}
