//! # genesis-backend-cpu
//!
//! The CPU backend of Genesis: a plugin like any other (built as a `cdylib`), and also linked
//! into the core as its embedded default (as an `rlib`), so a fresh checkout runs with no
//! plugin setup. It is the reference every other backend is compared with.
//!
//! Layout: [`allocator`] (size-class caching allocator with statistics), `element` (dtypes
//! and their arithmetic, written once), `kernels` (one file per op family, each registering
//! itself with `inventory`).

pub mod allocator;
pub mod element;
mod kernels;
mod math;

use allocator::CachingAllocator;
use genesis_backend_api::sdk::expect_no_overlap;
use genesis_backend_api::sdk::graph::Recorder;
use genesis_backend_api::{
    Backend, BackendError, BackendInfo, BufferId, Capability, Device, DeviceProperties, GraphId, MemoryStats, Op,
    Probe, Result, TensorDesc,
};
use kernels::View;

/// The CPU backend: one device, the host.
#[derive(Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// A new backend (cheap).
    pub fn new() -> Self {
        CpuBackend
    }
}

impl Backend for CpuBackend {
    type Device = CpuDevice;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "cpu".into(),
            vendor: "Genesis".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "host CPU (reference backend)".into(),
        }
    }

    fn probe(&self) -> Probe {
        Probe { device_count: 1, unavailable_reason: None }
    }

    fn device_properties(&self, _index: usize) -> Result<DeviceProperties> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(DeviceProperties {
            name: format!("host CPU ({threads} threads)"),
            total_memory: 0,
            compute_capability: (0, 0),
            thread_safe: true,
        })
    }

    fn open_device(&self, _index: usize) -> Result<CpuDevice> {
        Ok(CpuDevice { allocator: CachingAllocator::default(), graphs: Recorder::default() })
    }
}

/// The host as a device.
pub struct CpuDevice {
    allocator: CachingAllocator,
    /// Graphs are recorded ops (the host's work is all there is to save on a CPU).
    graphs: Recorder,
}

impl CpuDevice {
    fn range(&self, buffer: BufferId, offset: usize, len: usize) -> Result<*mut u8> {
        let block = self.allocator.block(buffer)?;
        let end = offset.checked_add(len).filter(|&end| end <= block.requested).ok_or_else(|| {
            BackendError::invalid(format!(
                "cpu: bytes {offset}..{} are outside a {}-byte buffer",
                offset.saturating_add(len),
                block.requested
            ))
        })?;
        let _ = end;
        // SAFETY: offset + len is within the block (checked above).
        Ok(unsafe { block.ptr.add(offset) })
    }
}

impl Device for CpuDevice {
    fn allocate(&self, bytes: usize) -> Result<BufferId> {
        self.allocator.allocate(bytes)
    }

    fn free(&self, buffer: BufferId) -> Result<()> {
        self.allocator.free(buffer)
    }

    fn write(&self, dst: BufferId, offset: usize, src: &[u8]) -> Result<()> {
        self.graphs.refuse_while_capturing("cpu: write")?;
        let ptr = self.range(dst, offset, src.len())?;
        // SAFETY: the destination range is inside the buffer; host memory never aliases it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr, src.len()) };
        Ok(())
    }

    fn read(&self, src: BufferId, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.graphs.refuse_while_capturing("cpu: read")?;
        let ptr = self.range(src, offset, dst.len())?;
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(ptr, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn memory_stats(&self) -> Result<MemoryStats> {
        Ok(self.allocator.stats())
    }

    fn reset_peak_memory(&self) -> Result<()> {
        self.allocator.reset_peak();
        Ok(())
    }

    fn empty_cache(&self) -> Result<()> {
        self.allocator.empty_cache();
        Ok(())
    }

    fn capabilities(&self) -> Vec<Capability> {
        kernels::capabilities()
    }

    fn execute(&self, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        let kernel = kernels::table()
            .get(&op.kind())
            .ok_or_else(|| BackendError::unsupported(format!("cpu: {} is not implemented", op.name())))?;
        // In-place ops update their outputs by design; elementwise ops may also write over an
        // input that is exactly the output view (`x.add_(y)`); nothing else may overlap.
        let in_place = matches!(op, Op::ScatterAdd { .. } | Op::IndexAdd { .. } | Op::AdamW { .. });
        let elementwise = matches!(
            op,
            Op::Unary(_) | Op::Binary(_) | Op::BinaryScalar { .. } | Op::Clamp { .. } | Op::Where | Op::Copy | Op::Cast
        );
        if !in_place {
            expect_no_overlap(op, inputs, outputs, elementwise)?;
        }
        let resolve =
            |descs: &[TensorDesc]| descs.iter().map(|d| View::resolve(d, &self.allocator)).collect::<Result<Vec<_>>>();
        let (ins, outs) = (resolve(inputs)?, resolve(outputs)?);
        if self.graphs.record(op, inputs, outputs) {
            return Ok(());
        }
        (kernel.run)(op, &ins, &outs)
    }

    fn capture_begin(&self) -> Result<()> {
        self.graphs.begin()
    }

    fn capture_end(&self) -> Result<GraphId> {
        self.graphs.end()
    }

    fn graph_replay(&self, graph: GraphId) -> Result<()> {
        self.graphs.replay(graph, |op, inputs, outputs| self.execute(op, inputs, outputs))
    }

    fn graph_release(&self, graph: GraphId) -> Result<()> {
        self.graphs.release(graph)
    }
}

genesis_backend_api::export_backend!("cpu", CpuBackend, CpuBackend::new);
