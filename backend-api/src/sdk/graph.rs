//! Graph capture by recording (interface 1.5): for a backend without a graph facility of its
//! own, capture keeps the [`Op`]s issued to a device with their operands instead of running
//! them, and a replay runs them again in order. The host's side of the contract (buffers a
//! graph touches stay alive while it exists) makes replaying the same descriptors safe.
//!
//! A capture records the work of the thread that began it; other threads keep using the
//! device as usual (and may capture graphs of their own).
//!
//! ```
//! use genesis_backend_api::sdk::graph::Recorder;
//! use genesis_backend_api::{Op, Result, TensorDesc};
//! let graphs = Recorder::default();
//! let mut ran = 0;
//! let mut execute = |op: &Op, ins: &[TensorDesc], outs: &[TensorDesc]| -> Result<()> {
//!     if !graphs.record(op, ins, outs) {
//!         ran += 1; // the backend runs the op here
//!     }
//!     Ok(())
//! };
//! graphs.begin()?;
//! execute(&Op::Copy, &[], &[])?; // recorded, not run
//! let graph = graphs.end()?;
//! graphs.replay(graph, |op, ins, outs| execute(op, ins, outs))?; // now it runs
//! graphs.release(graph)?;
//! # Ok::<(), genesis_backend_api::BackendError>(())
//! ```

use crate::error::{BackendError, Result};
use crate::op::Op;
use crate::tensor::TensorDesc;
use crate::traits::GraphId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::{current, ThreadId};

/// One recorded call of `execute`.
#[derive(Debug, Clone)]
struct Step {
    op: Op,
    inputs: Vec<TensorDesc>,
    outputs: Vec<TensorDesc>,
}

#[derive(Default)]
struct State {
    /// The captures in progress, by the thread that began each.
    captures: HashMap<ThreadId, Vec<Step>>,
    graphs: HashMap<u64, Vec<Step>>,
    next: u64,
}

/// The graphs of one device, and the captures in progress.
#[derive(Default)]
pub struct Recorder {
    /// How many captures are in progress: one load on every `execute` when none is.
    capturing: AtomicUsize,
    state: Mutex<State>,
}

impl Recorder {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start capturing ([`crate::Device::capture_begin`]).
    pub fn begin(&self) -> Result<()> {
        let mut state = self.state();
        if state.captures.contains_key(&current().id()) {
            return Err(BackendError::invalid("capture_begin: this thread is already capturing on this device"));
        }
        state.captures.insert(current().id(), Vec::new());
        self.capturing.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// While the calling thread captures, keep `op` and its operands and return true (the
    /// backend must then not run it); otherwise return false. Call it after the operand
    /// checks, so that a bad call fails at once rather than at replay.
    pub fn record(&self, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> bool {
        if self.capturing.load(Ordering::Acquire) == 0 {
            return false;
        }
        match self.state().captures.get_mut(&current().id()) {
            Some(steps) => {
                steps.push(Step { op: *op, inputs: inputs.to_vec(), outputs: outputs.to_vec() });
                true
            }
            None => false,
        }
    }

    /// An `InvalidArgument` error naming `what` while the calling thread captures (host reads
    /// and writes have no place in a graph), `Ok` otherwise.
    pub fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        if self.capturing.load(Ordering::Acquire) > 0 && self.state().captures.contains_key(&current().id()) {
            return Err(BackendError::invalid(format!(
                "{what} is not allowed while the device is capturing a graph (copy inputs in before \
                 the capture or before a replay, and read outputs after it)"
            )));
        }
        Ok(())
    }

    /// Stop capturing and keep what was recorded as a graph ([`crate::Device::capture_end`]).
    pub fn end(&self) -> Result<GraphId> {
        let mut state = self.state();
        let steps = state
            .captures
            .remove(&current().id())
            .ok_or_else(|| BackendError::invalid("capture_end: this thread has no capture in progress"))?;
        self.capturing.fetch_sub(1, Ordering::AcqRel);
        state.next += 1;
        let id = state.next;
        state.graphs.insert(id, steps);
        Ok(GraphId(id))
    }

    /// Run every recorded step of `graph` through `execute`, in order; stops at the first
    /// error.
    pub fn replay(
        &self,
        graph: GraphId,
        mut execute: impl FnMut(&Op, &[TensorDesc], &[TensorDesc]) -> Result<()>,
    ) -> Result<()> {
        self.refuse_while_capturing("graph_replay")?;
        let steps = self.state().graphs.get(&graph.0).cloned().ok_or_else(|| unknown(graph))?;
        steps.iter().try_for_each(|s| execute(&s.op, &s.inputs, &s.outputs))
    }

    /// Forget `graph` ([`crate::Device::graph_release`]).
    pub fn release(&self, graph: GraphId) -> Result<()> {
        self.state().graphs.remove(&graph.0).map(|_| ()).ok_or_else(|| unknown(graph))
    }
}

fn unknown(graph: GraphId) -> BackendError {
    BackendError::invalid(format!("unknown or released graph {}", graph.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_steps_replay_in_order_and_host_access_is_refused_while_capturing() {
        let graphs = Recorder::default();
        assert!(!graphs.record(&Op::Copy, &[], &[]));
        graphs.begin().unwrap();
        assert!(graphs.begin().is_err());
        assert!(graphs.record(&Op::Copy, &[], &[]));
        assert!(graphs.record(&Op::Cast, &[], &[]));
        assert!(graphs.refuse_while_capturing("read").is_err());
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(!graphs.record(&Op::Copy, &[], &[]), "another thread's work runs");
                assert!(graphs.refuse_while_capturing("read").is_ok());
            });
        });
        let graph = graphs.end().unwrap();
        assert!(graphs.refuse_while_capturing("read").is_ok());
        let mut seen = Vec::new();
        for _ in 0..2 {
            graphs
                .replay(graph, |op, _, _| {
                    seen.push(op.name());
                    Ok(())
                })
                .unwrap();
        }
        assert_eq!(seen, ["copy", "cast", "copy", "cast"]);
        graphs.release(graph).unwrap();
        assert!(graphs.replay(graph, |_, _, _| Ok(())).is_err());
        assert!(graphs.release(graph).is_err());
        assert!(graphs.end().is_err());
    }
}
