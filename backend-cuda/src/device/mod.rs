//! One opened CUDA device: its stream, memory and the op dispatch. Kernel modules and launches
//! are in [`modules`], the deferred index check in [`index_check`].
//!
//! All work of a device goes to one stream in issue order. Errors of asynchronous work (a
//! kernel fault, say) surface at the next synchronizing call; the message then lists the ops
//! issued since the last synchronization, and `GENESIS_CUDA_SYNC=1` synchronizes after every
//! op to name the exact one.

mod graphs;
mod index_check;
mod modules;
mod staging;

pub use index_check::IndexCheck;
use modules::LoadedModule;
use staging::Staging;

use crate::allocator::{CachingAllocator, Memory, ReserveError};
use crate::events::EventPool;
use crate::kernels::{Args, Operand};
use crate::ops;
use cudarc::driver::{result, sys, CudaContext, DriverError};
use genesis_backend_api::{
    BackendError, BufferId, Capability, DType, Device, ErrorKind, EventId, GraphId, MemoryStats, Op, Result, TensorDesc,
};
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// "`call`: CUDA_ERROR_...: text".
pub fn driver_error(call: &str, e: DriverError) -> BackendError {
    let text = match e.error_string() {
        Ok(text) => format!("{:?}: {}", e.0, text.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    };
    let kind =
        if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY { ErrorKind::OutOfMemory } else { ErrorKind::Internal };
    BackendError::new(kind, format!("cuda: {call} failed: {text}"))
}

/// Segments straight from the driver.
pub struct DriverMemory {
    stream: sys::CUstream,
}

// SAFETY: the stream handle is only used under the device's locks; CUDA handles may be used
// from any thread once the context is current.
unsafe impl Send for DriverMemory {}

impl Memory for DriverMemory {
    fn reserve(&mut self, bytes: usize) -> std::result::Result<u64, ReserveError> {
        // SAFETY: plain allocation in the current context (the device binds it first).
        match unsafe { result::malloc_sync(bytes) } {
            Ok(ptr) => Ok(ptr),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(ReserveError::OutOfMemory(format!("cuMemAlloc of {bytes} bytes: CUDA_ERROR_OUT_OF_MEMORY")))
            }
            Err(e) => Err(ReserveError::Failed(driver_error("cuMemAlloc", e))),
        }
    }

    fn release(&mut self, ptr: u64, _bytes: usize) -> Result<()> {
        // Queued work may still use cached blocks of this segment: wait for it first.
        // SAFETY: the stream belongs to this device; `ptr` came from `reserve`.
        unsafe {
            result::stream::synchronize(self.stream).map_err(|e| driver_error("cuStreamSynchronize", e))?;
            result::free_sync(ptr).map_err(|e| driver_error("cuMemFree", e))
        }
    }

    fn device_memory(&self) -> Option<(usize, usize)> {
        result::mem_get_info().ok()
    }
}

/// "add (f32)": how an issued op is named in an error.
fn pending_text(what: &str, dtype: Option<DType>) -> String {
    match dtype {
        Some(d) => format!("{what} ({d})"),
        None => what.to_string(),
    }
}

/// Facts about the device that kernels and launches need.
#[derive(Debug, Clone, Copy)]
pub struct Facts {
    /// Compute capability as `10*major + minor` (90 for Hopper).
    pub arch: u32,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// CUDA version the driver supports, as the driver encodes it (13000 for 13.0).
    pub driver: i32,
    /// The most dynamic shared memory a block may opt in to, in bytes.
    pub max_smem_optin: u32,
}

/// The plugin's own kernels that an environment variable can turn off, read once when the
/// device opens (so that A/B runs need no rebuild and the launch path reads no environment).
#[derive(Debug, Clone, Copy)]
pub struct Switches {
    /// Products of one or two rows on `gemv_{1,2}` (`GENESIS_CUDA_GEMV=0` sends them to cuBLAS).
    pub gemv: bool,
    /// One-query masked attention on `attn_decode_{64,128}` (`GENESIS_CUDA_DECODE_ATTENTION=0`
    /// sends it to `attn_masked`).
    pub decode_attention: bool,
    /// Kernels written for it start before the kernel ahead of them ends (programmatic
    /// dependent launch, sm_90+; `GENESIS_CUDA_EARLY_LAUNCH=0` turns it off).
    pub early_launch: bool,
}

/// An opened CUDA device.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    memory: Mutex<CachingAllocator<DriverMemory>>,
    /// Loaded modules by (module name, element type).
    modules: Mutex<HashMap<(&'static str, DType), LoadedModule>>,
    /// Ops issued since the last synchronization (name, dtype), for error messages. Names
    /// are static for ops so that noting one costs no allocation on the launch path.
    pending: Mutex<VecDeque<(Cow<'static, str>, Option<DType>)>>,
    /// Index checks queued since the last synchronization; a check's number is its
    /// position + 1. Held while a check is queued and while faults are read, so that no
    /// check can be queued between the read and the reset.
    index_checks: Mutex<Vec<IndexCheck>>,
    /// Timing events of the profiler.
    events: Mutex<EventPool>,
    /// Facts about the device.
    pub facts: Facts,
    /// Which of the plugin's optional kernels are on.
    pub switches: Switches,
    sync_each_op: bool,
    /// The op name whose launches are replaced by a faulting kernel (fault-handling tests).
    plant_fault: Option<String>,
    /// cuBLAS, opened on the first matrix product.
    pub(crate) blas: OnceLock<Result<crate::blas::Blas>>,
    /// cuDNN on this device's stream, opened on the first convolution.
    pub(crate) cudnn: OnceLock<Result<crate::cudnn::Dnn>>,
    /// Captured graphs and the capture in progress.
    graphs: graphs::Graphs,
    /// Page-locked memory for small reads and the index-fault words, made on first use
    /// (locked after `index_checks`).
    staging: Mutex<Option<Staging>>,
}

// SAFETY: the raw CUDA handles are used under locks or are immutable after creation; the
// driver API is thread-safe once the context is current on the calling thread (every entry
// point binds it).
unsafe impl Send for CudaDevice {}
unsafe impl Sync for CudaDevice {}

const PENDING_KEPT: usize = 16;

impl CudaDevice {
    /// Create the stream and the allocator on an opened context.
    pub fn open(ctx: Arc<CudaContext>) -> Result<CudaDevice> {
        let ordinal = ctx.ordinal();
        let err = |call: &str, e: DriverError| {
            let e = driver_error(call, e);
            BackendError::new(ErrorKind::DeviceUnavailable, format!("opening cuda:{ordinal}: {}", e.message))
        };
        // We never use cudarc's CudaSlice, but make sure nothing records per-allocation events.
        // SAFETY: this device orders all its work on one stream.
        unsafe { ctx.disable_event_tracking() };
        ctx.bind_to_thread().map_err(|e| err("cuCtxSetCurrent", e))?;
        let attribute = |a| ctx.attribute(a);
        use sys::CUdevice_attribute as A;
        let major = attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).map_err(|e| err("attribute", e))?;
        let minor = attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR).map_err(|e| err("attribute", e))?;
        let sm_count = attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(|e| err("attribute", e))?;
        // Read once: kernels with large tiles compare against it on every launch.
        let max_smem_optin = attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| err("attribute", e))?
            .max(0) as u32;
        let mut driver = 0;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut driver) }.result().map_err(|e| err("cuDriverGetVersion", e))?;
        let stream =
            result::stream::create(result::stream::StreamKind::NonBlocking).map_err(|e| err("cuStreamCreate", e))?;
        Ok(CudaDevice {
            ctx,
            stream,
            memory: Mutex::new(CachingAllocator::new(DriverMemory { stream })),
            modules: Mutex::new(HashMap::new()),
            pending: Mutex::new(VecDeque::new()),
            index_checks: Mutex::new(Vec::new()),
            events: Mutex::new(EventPool::default()),
            facts: Facts {
                arch: (major * 10 + minor) as u32,
                sm_count: sm_count.max(1) as u32,
                driver,
                max_smem_optin,
            },
            switches: Switches {
                gemv: std::env::var_os("GENESIS_CUDA_GEMV").is_none_or(|v| v != "0"),
                decode_attention: std::env::var_os("GENESIS_CUDA_DECODE_ATTENTION").is_none_or(|v| v != "0"),
                // Stream capture keeps the early start in graphs from CUDA 12.3.
                early_launch: major >= 9
                    && driver >= 12030
                    && std::env::var_os("GENESIS_CUDA_EARLY_LAUNCH").is_none_or(|v| v != "0"),
            },
            sync_each_op: std::env::var_os("GENESIS_CUDA_SYNC").is_some_and(|v| v != "0"),
            plant_fault: std::env::var("GENESIS_CUDA_PLANT_FAULT").ok().filter(|v| !v.is_empty()),
            blas: OnceLock::new(),
            cudnn: OnceLock::new(),
            graphs: graphs::Graphs::default(),
            staging: Mutex::new(None),
        })
    }

    /// The device's context (shared with threads that must bind it, such as the one that
    /// joins a communicator).
    pub fn context(&self) -> Arc<CudaContext> {
        self.ctx.clone()
    }

    /// Whether the stream is being captured into a graph.
    pub fn capturing(&self) -> bool {
        self.graphs.capturing()
    }

    /// The stream all work goes to.
    pub fn stream(&self) -> sys::CUstream {
        self.stream
    }

    /// Make this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    fn memory(&self) -> MutexGuard<'_, CachingAllocator<DriverMemory>> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolve an operand against its buffer.
    pub fn operand(&self, desc: &TensorDesc) -> Result<Operand> {
        let live = self.memory().get(desc.buffer)?;
        Operand::resolve(desc, live.ptr, live.requested)
    }

    /// A scratch buffer for an op (freed by the caller with [`CudaDevice::free_scratch`]).
    pub fn scratch(&self, bytes: usize) -> Result<(BufferId, u64)> {
        let mut memory = self.memory();
        let id = memory.allocate(bytes)?;
        Ok((id, memory.get(id)?.ptr))
    }

    /// Return a scratch buffer; stream order makes this safe while the op is still queued.
    pub fn free_scratch(&self, id: BufferId) -> Result<()> {
        if self.graphs.hold_scratch(id) {
            return Ok(());
        }
        self.memory().free(id)
    }

    /// Note an issued op; with `GENESIS_CUDA_SYNC=1`, also wait for it.
    fn issued(&self, op: &Op, inputs: &[TensorDesc]) -> Result<()> {
        let dtype = inputs.first().and_then(|d| d.dtype().ok());
        self.note_pending(Cow::Borrowed(op.name()), dtype)
    }

    /// Note work queued on the stream by `what` (named in a later error); with
    /// `GENESIS_CUDA_SYNC=1`, also wait for it.
    pub fn note_issued(&self, what: String) -> Result<()> {
        self.note_pending(Cow::Owned(what), None)
    }

    fn note_pending(&self, what: Cow<'static, str>, dtype: Option<DType>) -> Result<()> {
        let after = self.sync_each_op.then(|| format!("after {}", pending_text(&what, dtype)));
        {
            let mut pending = Self::lock(&self.pending);
            if pending.len() == PENDING_KEPT {
                pending.pop_front();
            }
            pending.push_back((what, dtype));
        }
        if let Some(when) = after {
            self.bind()?;
            self.wait(&when)?;
        }
        Ok(())
    }

    /// Wait for the stream; an error names the ops that may have caused it.
    fn wait(&self, when: &str) -> Result<()> {
        self.wait_locked(&mut Self::lock(&self.index_checks), when)
    }

    /// [`CudaDevice::wait`] for a caller that holds the index-check lock (always taken
    /// before `pending`'s).
    fn wait_locked(&self, checks: &mut Vec<IndexCheck>, when: &str) -> Result<()> {
        self.wait_staged(checks, when, None)
    }

    /// [`CudaDevice::wait_locked`], copying `read` (a source address and a destination of at
    /// most [`staging::STAGED_READ`] bytes) through the staging area: its copy and those of
    /// the index-fault words queue behind the work, and one synchronization covers them.
    fn wait_staged(&self, checks: &mut Vec<IndexCheck>, when: &str, read: Option<(u64, &mut [u8])>) -> Result<()> {
        // Collectives across processes first: a peer that died must fail them, not hang us.
        crate::groups::wait_for_collectives(self.ctx.ordinal())?;
        let mut staging = Self::lock(&self.staging);
        if staging.is_none() && (read.is_some() || !checks.is_empty()) {
            *staging = Some(Staging::new()?);
        }
        let words = Self::fault_words(checks);
        let staged_words = words.len().min(staging::FAULT_SLOTS);
        if let Some(area) = staging.as_mut() {
            // SAFETY: page-locked destinations inside the staging area, which the lock keeps
            // ours until the synchronization below has completed the copies.
            unsafe {
                if let Some((src, dst)) = &read {
                    result::memcpy_dtoh_async(area.data(dst.len()), *src, self.stream)
                        .map_err(|e| driver_error("read (cuMemcpyDtoHAsync)", e))?;
                }
                for (i, &word) in words.iter().take(staged_words).enumerate() {
                    result::memcpy_dtoh_async(area.fault(i), word, self.stream)
                        .map_err(|e| driver_error("reading index_fault", e))?;
                }
            }
        }
        // SAFETY: our stream.
        let Err(e) = (unsafe { result::stream::synchronize(self.stream) }) else {
            Self::lock(&self.pending).clear();
            let mut faults = vec![[0u8; 16]; staged_words];
            if let Some(area) = staging.as_mut() {
                if let Some((_, dst)) = read {
                    let len = dst.len();
                    dst.copy_from_slice(area.data(len));
                }
                for (i, f) in faults.iter_mut().enumerate() {
                    f.copy_from_slice(area.fault(i));
                }
            }
            return Self::take_index_fault(checks, &words, &faults);
        };
        checks.clear();
        let ops: Vec<String> = Self::lock(&self.pending).drain(..).map(|(what, d)| pending_text(&what, d)).collect();
        let e = driver_error("cuStreamSynchronize", e);
        Err(BackendError::new(
            ErrorKind::Internal,
            format!(
                "{} ({when}); the failing work is one of the ops issued since the last synchronization: [{}] \
                 (set GENESIS_CUDA_SYNC=1 to check after every op). A kernel fault leaves the CUDA context \
                 unusable: restart the process.",
                e.message,
                ops.join(", ")
            ),
        ))
    }

    fn range(&self, buffer: BufferId, offset: usize, len: usize) -> Result<u64> {
        let live = self.memory().get(buffer)?;
        match offset.checked_add(len) {
            Some(end) if end <= live.requested => Ok(live.ptr + offset as u64),
            _ => Err(BackendError::invalid(format!(
                "cuda: bytes {offset}..{} are outside a {}-byte buffer",
                offset.saturating_add(len),
                live.requested
            ))),
        }
    }

    /// Peek at allocator counters the interface does not carry (driver releases).
    pub fn driver_releases(&self) -> u64 {
        self.memory().driver_releases
    }
}

impl Device for CudaDevice {
    fn allocate(&self, bytes: usize) -> Result<BufferId> {
        self.bind()?;
        self.memory().allocate(bytes)
    }

    fn free(&self, buffer: BufferId) -> Result<()> {
        self.memory().free(buffer)
    }

    fn write(&self, dst: BufferId, offset: usize, src: &[u8]) -> Result<()> {
        self.graphs.refuse_while_capturing("write")?;
        let ptr = self.range(dst, offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the range is inside the buffer. From pageable memory the call returns once
        // `src` has been staged, so the caller may reuse it at once; the copy is ordered
        // after earlier work on the stream.
        unsafe { result::memcpy_htod_async(ptr, src, self.stream) }.map_err(|e| driver_error("write (cuMemcpyHtoD)", e))
    }

    fn read(&self, src: BufferId, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.graphs.refuse_while_capturing("read")?;
        let ptr = self.range(src, offset, dst.len())?;
        self.bind()?;
        crate::groups::wait_for_collectives(self.ctx.ordinal())?;
        if !dst.is_empty() && dst.len() <= staging::STAGED_READ {
            return self.wait_staged(&mut Self::lock(&self.index_checks), "reading a buffer", Some((ptr, dst)));
        }
        if !dst.is_empty() {
            // SAFETY: the range is inside the buffer; we wait for the copy before returning.
            unsafe { result::memcpy_dtoh_async(dst, ptr, self.stream) }
                .map_err(|e| driver_error("read (cuMemcpyDtoH)", e))?;
        }
        self.wait("reading a buffer")
    }

    fn synchronize(&self) -> Result<()> {
        self.graphs.refuse_while_capturing("synchronize")?;
        self.bind()?;
        self.wait("synchronize")
    }

    fn memory_stats(&self) -> Result<MemoryStats> {
        Ok(self.memory().stats())
    }

    fn reset_peak_memory(&self) -> Result<()> {
        self.memory().reset_peak();
        Ok(())
    }

    fn empty_cache(&self) -> Result<()> {
        self.graphs.refuse_while_capturing("empty_cache")?;
        self.bind()?;
        self.memory().empty_cache()
    }

    fn capabilities(&self) -> Vec<Capability> {
        ops::capabilities()
    }

    fn execute(&self, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        self.bind()?;
        if self.plant_fault.as_deref() == Some(op.name()) {
            let mut args = Args { n: 1, ..Args::default() };
            self.launch(op.name(), DType::F32, "plant_fault", &mut args, 1)?;
            return self.issued(op, inputs);
        }
        ops::execute(self, op, inputs, outputs)?;
        self.issued(op, inputs)
    }

    fn record_event(&self) -> Result<EventId> {
        self.bind()?;
        Self::lock(&self.events).record(self.stream)
    }

    fn event_elapsed_us(&self, start: EventId, end: EventId) -> Result<f64> {
        self.bind()?;
        Self::lock(&self.events).elapsed_us(start, end)
    }

    fn release_events(&self, events: &[EventId]) -> Result<()> {
        Self::lock(&self.events).release(events)
    }

    fn capture_begin(&self) -> Result<()> {
        CudaDevice::capture_begin(self)
    }

    fn capture_end(&self) -> Result<GraphId> {
        CudaDevice::capture_end(self)
    }

    fn graph_replay(&self, graph: GraphId) -> Result<()> {
        CudaDevice::graph_replay(self, graph)
    }

    fn graph_release(&self, graph: GraphId) -> Result<()> {
        CudaDevice::graph_release(self, graph)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Best effort: the process is usually exiting; the driver frees the rest.
        if self.bind().is_ok() {
            let _ = self.memory().empty_cache();
            Self::lock(&self.events).destroy_all();
            // Freed while the context is current (the fields drop after it is released).
            drop(Self::lock(&self.staging).take());
            // SAFETY: our stream, destroyed once.
            let _ = unsafe { result::stream::destroy(self.stream) };
        }
    }
}
