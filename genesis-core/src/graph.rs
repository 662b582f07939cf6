//! Capture and replay of device work (`torch.cuda.CUDAGraph`): the ops a closure issues to a
//! device are recorded once and then run again with one call, so a step of hundreds of small
//! kernels costs one launch from the host instead of hundreds.
//!
//! ```
//! use genesis::{graph::Graph, no_grad, DType, Device, Tensor};
//! let device = Device::cpu()?;
//! let x = Tensor::zeros(&[4], DType::F32, &device)?; // a static input: refilled before each replay
//! let (graph, y) = no_grad(|| Graph::capture(&device, || x.mul_scalar(2.0)?.add_scalar(1.0)))?;
//! for step in 0..3 {
//!     x.copy_(&Tensor::full(&[4], step as f64, DType::F32, &device)?)?;
//!     graph.replay()?;
//!     assert_eq!(y.to_vec::<f32>()?, vec![2.0 * step as f32 + 1.0; 4]);
//! }
//! # Ok::<(), genesis::Error>(())
//! ```
//!
//! The rules are PyTorch's:
//! - While capturing, the work is recorded, **not run**: the closure's results hold their
//!   values only after the first [`Graph::replay`]. Reading a tensor on the host, or copying
//!   one in from the host, is an error inside the closure.
//! - A replay runs the same ops on the same memory: change inputs by writing into the tensors
//!   the capture read (`copy_`), and read results from the tensors it returned. Shapes, host
//!   scalars and other op attributes are fixed at capture (a random op draws the same numbers
//!   on every replay).
//! - Every buffer a captured op touched stays allocated while the graph lives, so a replay
//!   never writes memory that was handed to another tensor. Temporaries of the closure are
//!   therefore not reused within the capture, which costs memory.
//! - A capture records the work its thread issues. On CUDA no other thread may issue work to
//!   the capturing device meanwhile (the device has one stream, and all of it is captured);
//!   the CPU backend records only the capturing thread's work.
//!
//! Backends offer capture through interface 1.5 (optional): CUDA captures its stream into a
//! CUDA graph; the CPU backend records its ops. On a backend without it,
//! [`Graph::capture`] returns an `Unsupported` error and callers run the work uncaptured
//! ([`Graph::supported`] asks first).

use crate::device::Device;
use crate::error::{Error, Result};
use crate::storage::Storage;
use crate::tensor::Tensor;
use genesis_backend_api::GraphId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// How many threads are capturing (one relaxed load per op when none is).
static CAPTURING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The buffers the capture of this thread has touched, by address.
    static TOUCHED: RefCell<Option<HashMap<usize, Arc<Storage>>>> = const { RefCell::new(None) };
}

/// Whether ops must report their buffers to a capture ([`keep_alive`]).
pub(crate) fn capturing() -> bool {
    CAPTURING.load(Ordering::Relaxed) > 0
}

/// Keep the buffers of `tensors` alive for as long as the graph this thread is capturing
/// lives (nothing when this thread is not capturing).
pub(crate) fn keep_alive<'a>(tensors: impl Iterator<Item = &'a Tensor>) {
    TOUCHED.with(|touched| {
        if let Some(list) = touched.borrow_mut().as_mut() {
            for t in tensors {
                list.entry(Arc::as_ptr(t.storage()) as usize).or_insert_with(|| t.storage().clone());
            }
        }
    });
}

/// Device work recorded by [`Graph::capture`], replayable with [`Graph::replay`].
pub struct Graph {
    device: Device,
    id: GraphId,
    /// Every buffer the captured ops read or write.
    buffers: Vec<Arc<Storage>>,
}

impl Graph {
    /// Whether `device`'s backend can capture graphs (interface 1.5). Asks by capturing an
    /// empty graph.
    pub fn supported(device: &Device) -> bool {
        Graph::capture(device, || Ok(())).is_ok()
    }

    /// Record the work `f` issues to `device` instead of running it; returns the graph and
    /// what `f` returned (tensors whose values a [`Graph::replay`] computes). Fails with
    /// `Unsupported` when the backend cannot capture, and with the error of `f` or of the
    /// capture otherwise (no graph is left behind).
    pub fn capture<T>(device: &Device, f: impl FnOnce() -> Result<T>) -> Result<(Graph, T)> {
        if TOUCHED.with(|t| t.borrow().is_some()) {
            return Err(Error::invalid("graph capture: this thread is already capturing a graph"));
        }
        device.capture_begin()?;
        TOUCHED.with(|t| *t.borrow_mut() = Some(HashMap::new()));
        CAPTURING.fetch_add(1, Ordering::Relaxed);
        let result = f();
        CAPTURING.fetch_sub(1, Ordering::Relaxed);
        let buffers: Vec<Arc<Storage>> =
            TOUCHED.with(|t| t.borrow_mut().take()).unwrap_or_default().into_values().collect();
        let ended = device.capture_end();
        match (result, ended) {
            (Ok(value), Ok(id)) => Ok((Graph { device: device.clone(), id, buffers }, value)),
            (Err(e), Ok(id)) => {
                let _ = device.graph_release(id);
                Err(e.context("while capturing a graph"))
            }
            (Err(e), Err(_)) => Err(e.context("while capturing a graph")),
            (Ok(_), Err(e)) => Err(e),
        }
    }

    /// Run the captured work again on the tensors it was captured with (asynchronously, in
    /// issue order like any op).
    pub fn replay(&self) -> Result<()> {
        self.device.graph_replay(self.id)
    }

    /// The device the graph runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// How many buffers the graph keeps alive.
    pub fn buffer_count(&self) -> usize {
        self.buffers.len()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Release the graph before its buffers (dropped after this body) can be reused.
        let _ = self.device.graph_release(self.id);
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({} on {}, {} buffers)", self.id.0, self.device, self.buffers.len())
    }
}
