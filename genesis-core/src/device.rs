//! Devices: a backend plus a device index, named like PyTorch's (`"cpu"`, `"cuda:1"`).

use crate::backend::{self, Backend};
use crate::error::{Error, ErrorKind, Result};
use abi_stable::std_types::RSlice;
use genesis_backend_api::{
    BufferId, Capability, CollectiveArg, CollectiveOp, CommId, DeviceActivity, DeviceProperties, EventId, GraphId,
    MemoryStats, Op, RawOp, TensorDesc,
};
use std::fmt;
use std::sync::Arc;

/// An opened device. Cheap to clone; two handles are equal when they name the same device of
/// the same loaded backend.
#[derive(Clone)]
pub struct Device {
    backend: Arc<Backend>,
    index: u32,
}

impl Device {
    /// Parse `"name"` or `"name:index"`, find the backend, check availability and open the
    /// device. Errors name the backend and list the known ones, give the probe's reason, or
    /// the device count.
    pub fn parse(spec: &str) -> Result<Device> {
        let (name, index) = match spec.split_once(':') {
            None => (spec, 0u32),
            Some((name, index)) => {
                let index = index.parse::<u32>().map_err(|_| {
                    Error::invalid(format!("device '{spec}': index '{index}' is not a non-negative integer"))
                })?;
                (name, index)
            }
        };
        if name.is_empty() {
            return Err(Error::invalid(format!("device '{spec}': empty backend name")));
        }
        let backend = backend::find(name)?;
        let probe = backend.probe();
        if probe.device_count == 0 {
            let reason = probe.unavailable_reason.clone().unwrap_or_else(|| "it reports no devices".into());
            return Err(Error::new(ErrorKind::DeviceUnavailable, format!("backend '{name}' is unavailable: {reason}")));
        }
        if index as usize >= probe.device_count {
            return Err(Error::invalid(format!(
                "device index {index} is out of range: backend '{name}' has {} device(s)",
                probe.device_count
            )));
        }
        let device = Device { backend, index };
        device.check((device.module().open_device())(index), "open_device")?;
        Ok(device)
    }

    /// The CPU device (`"cpu:0"`).
    pub fn cpu() -> Result<Device> {
        Device::parse("cpu")
    }

    /// The backend running this device.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The device index within its backend.
    pub fn index(&self) -> usize {
        self.index as usize
    }

    /// Name, memory size and architecture.
    pub fn properties(&self) -> Result<DeviceProperties> {
        self.check((self.module().device_properties())(self.index), "device_properties").map(Into::into)
    }

    /// Memory statistics, as `torch.cuda.memory_stats`.
    pub fn memory_stats(&self) -> Result<MemoryStats> {
        self.check((self.module().memory_stats())(self.index), "memory_stats")
    }

    /// Bytes held by live tensors (`torch.cuda.memory_allocated`).
    pub fn memory_allocated(&self) -> Result<u64> {
        Ok(self.memory_stats()?.allocated_bytes)
    }

    /// Bytes held from the system or driver, live plus cached (`memory_reserved`).
    pub fn memory_reserved(&self) -> Result<u64> {
        Ok(self.memory_stats()?.reserved_bytes)
    }

    /// Peak of [`Device::memory_allocated`] since the last reset.
    pub fn max_memory_allocated(&self) -> Result<u64> {
        Ok(self.memory_stats()?.peak_allocated_bytes)
    }

    /// A readable table of the memory statistics (`torch.cuda.memory_summary`).
    pub fn memory_summary(&self) -> Result<String> {
        let s = self.memory_stats()?;
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let mut out = format!("memory summary of {self}\n");
        out += &format!(
            "  {:<24} {:>12.3} MiB (peak {:.3} MiB)\n",
            "allocated",
            mib(s.allocated_bytes),
            mib(s.peak_allocated_bytes)
        );
        out += &format!(
            "  {:<24} {:>12.3} MiB (peak {:.3} MiB)\n",
            "reserved",
            mib(s.reserved_bytes),
            mib(s.peak_reserved_bytes)
        );
        out += &format!("  {:<24} {:>12}\n", "live allocations", s.active_allocations);
        out += &format!("  {:<24} {:>12}\n", "allocation requests", s.allocation_requests);
        out += &format!("  {:<24} {:>12} hits / {} misses\n", "cache", s.cache_hits, s.cache_misses);
        out += &format!("  {:<24} {:>12}\n", "out-of-memory errors", s.oom_count);
        Ok(out)
    }

    /// Reset the peak memory counters.
    pub fn reset_peak_memory_stats(&self) -> Result<()> {
        self.check((self.module().reset_peak_memory())(self.index), "reset_peak_memory")
    }

    /// Return cached, unused memory to the system or driver.
    pub fn empty_cache(&self) -> Result<()> {
        self.check((self.module().empty_cache())(self.index), "empty_cache")
    }

    /// Wait for all work issued to this device.
    pub fn synchronize(&self) -> Result<()> {
        self.check((self.module().synchronize())(self.index), "synchronize")
    }

    /// The (op, dtype) pairs this device claims.
    pub fn capabilities(&self) -> Result<Vec<Capability>> {
        self.check((self.module().capabilities())(self.index), "capabilities").map(|v| v.into_vec())
    }

    /// True when this device claims `op` for `dtype` (the capability list is read once).
    pub fn supports(&self, op: &Op, dtype: genesis_backend_api::DType) -> Result<bool> {
        #[cfg(test)]
        if let Some(claimed) = crate::ops::required_set::claimed(op, dtype) {
            return Ok(claimed);
        }
        let caps = self.backend.capabilities(self.index, || self.capabilities())?;
        Ok(caps.contains(&(op.kind().0, dtype as u32)))
    }

    /// Low level (the conformance harness and other interface-level tools): allocate a raw
    /// buffer of `bytes` on this device. The caller owns it and must [`Device::free`] it.
    pub fn allocate(&self, bytes: usize) -> Result<BufferId> {
        self.check((self.module().allocate())(self.index, bytes as u64), format_args!("allocate of {bytes} bytes"))
    }

    /// Low level: release a buffer from [`Device::allocate`].
    pub fn free(&self, buffer: BufferId) -> Result<()> {
        self.check((self.module().free())(self.index, buffer), "free")
    }

    /// Low level: copy host bytes into `buffer` at byte `offset`.
    pub fn write(&self, buffer: BufferId, offset: usize, bytes: &[u8]) -> Result<()> {
        self.check((self.module().write())(self.index, buffer, offset as u64, bytes.into()), "write")
    }

    /// Low level: copy bytes of `buffer` from byte `offset` to the host, after pending work.
    pub fn read(&self, buffer: BufferId, offset: usize, bytes: &mut [u8]) -> Result<()> {
        self.check((self.module().read())(self.index, buffer, offset as u64, bytes.into()), "read")
    }

    /// Low level: run `op` on raw descriptors, exactly as the backend receives them (no
    /// capability check, no shape inference).
    pub fn execute(&self, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        self.execute_raw(&op.encode(), inputs, outputs)
    }

    /// Low level: run an op in its wire form, which may carry a kind code this host does not
    /// know (to test that a backend refuses it).
    pub fn execute_raw(&self, raw: &RawOp, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        let result =
            (self.module().execute())(self.index, raw, RSlice::from_slice(inputs), RSlice::from_slice(outputs));
        result.into_result().map_err(|e| {
            // Named only on failure: execute is the hot path of every tensor op.
            let op = Op::decode(raw)
                .map(|op| op.name().to_string())
                .unwrap_or_else(|_| format!("op kind {:#x}", raw.kind.0));
            Error::from(genesis_backend_api::BackendError::from(e)).context(format_args!("{op} on {self}"))
        })
    }

    /// Low level (the profiler): record a timing event after the work issued so far.
    /// `Unsupported` when the backend has no timing events (interface 1.2, optional).
    pub fn record_event(&self) -> Result<EventId> {
        let function = self.module().record_event().ok_or_else(|| self.lacks("record_event"))?;
        self.check(function(self.index), "record_event")
    }

    /// Low level: microseconds of device time between two events of [`Device::record_event`],
    /// waiting for `end` to complete.
    pub fn event_elapsed_us(&self, start: EventId, end: EventId) -> Result<f64> {
        let function = self.module().event_elapsed_us().ok_or_else(|| self.lacks("event_elapsed_us"))?;
        self.check(function(self.index, start, end), "event_elapsed_us")
    }

    /// Low level: release events of [`Device::record_event`].
    pub fn release_events(&self, events: &[EventId]) -> Result<()> {
        let function = self.module().release_events().ok_or_else(|| self.lacks("release_events"))?;
        self.check(function(self.index, RSlice::from_slice(events)), "release_events")
    }

    /// Low level (the profiler): start recording the device activity (kernels, copies,
    /// fills) of every device of this device's backend; returns the backend's activity clock
    /// in nanoseconds. `Unsupported` when the backend has no activity records (interface
    /// 1.4, optional).
    pub fn activity_start(&self) -> Result<u64> {
        let function = self.module().activity_start().ok_or_else(|| self.lacks("activity_start"))?;
        self.check(function(), "activity_start")
    }

    /// Low level: tag the activity this thread issues from now on (0: none).
    pub fn activity_tag(&self, tag: u64) -> Result<()> {
        let function = self.module().activity_tag().ok_or_else(|| self.lacks("activity_tag"))?;
        self.check(function(tag), "activity_tag")
    }

    /// Low level: stop recording device activity and return it.
    pub fn activity_stop(&self) -> Result<Vec<DeviceActivity>> {
        let function = self.module().activity_stop().ok_or_else(|| self.lacks("activity_stop"))?;
        self.check(function(), "activity_stop").map(|records| records.into_vec())
    }

    /// Low level ([`crate::graph::Graph`]): start capturing this device's work into a graph.
    /// `Unsupported` when the backend has no graphs (interface 1.5, optional).
    pub fn capture_begin(&self) -> Result<()> {
        let function = self.module().capture_begin().ok_or_else(|| self.lacks("capture_begin"))?;
        self.check(function(self.index), "capture_begin")
    }

    /// Low level: stop capturing and return the graph.
    pub fn capture_end(&self) -> Result<GraphId> {
        let function = self.module().capture_end().ok_or_else(|| self.lacks("capture_end"))?;
        self.check(function(self.index), "capture_end")
    }

    /// Low level: run a captured graph again.
    pub fn graph_replay(&self, graph: GraphId) -> Result<()> {
        let function = self.module().graph_replay().ok_or_else(|| self.lacks("graph_replay"))?;
        self.check(function(self.index, graph), "graph_replay")
    }

    /// Low level: release a captured graph.
    pub fn graph_release(&self, graph: GraphId) -> Result<()> {
        let function = self.module().graph_release().ok_or_else(|| self.lacks("graph_release"))?;
        self.check(function(self.index, graph), "graph_release")
    }

    /// Device `index` of the same backend, without opening it (the profiler names devices
    /// from their activity records).
    pub(crate) fn sibling(&self, index: u32) -> Device {
        Device { backend: self.backend.clone(), index }
    }

    /// Whether both devices belong to the same loaded backend.
    pub(crate) fn same_backend(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.backend, &other.backend)
    }

    /// Low level (process groups): a new id for a group of processes, from this device's
    /// backend. `Unsupported` when the backend has no communicators across processes
    /// (interface 1.3, optional).
    pub fn comm_unique_id(&self) -> Result<Vec<u8>> {
        let function = self.module().comm_unique_id().ok_or_else(|| self.lacks("comm_unique_id"))?;
        self.check(function(), "comm_unique_id").map(|id| id.into_vec())
    }

    /// Low level: join the group `id` as `rank` of `world_size` on this device, giving up
    /// after `timeout`.
    pub fn comm_init_rank(
        &self,
        id: &[u8],
        rank: usize,
        world_size: usize,
        timeout: std::time::Duration,
    ) -> Result<CommId> {
        let function = self.module().comm_init_rank().ok_or_else(|| self.lacks("comm_init_rank"))?;
        let timeout_ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        self.check(
            function(self.index, RSlice::from_slice(id), rank as u32, world_size as u32, timeout_ms),
            format_args!("comm_init_rank (rank {rank} of {world_size})"),
        )
    }

    /// Low level: queue this process's part of `op` on `comm` (`root`: a broadcast's source).
    pub fn comm_collective(
        &self,
        comm: CommId,
        op: CollectiveOp,
        root: usize,
        world_size: usize,
        input: TensorDesc,
        output: TensorDesc,
    ) -> Result<()> {
        let function = self.module().comm_collective().ok_or_else(|| self.lacks("comm_collective"))?;
        let arg = CollectiveArg { device: self.index, input, output };
        self.check(
            function(self.index, comm, op as u32, root as u32, world_size as u32, &arg),
            format_args!("{} across processes", op.name()),
        )
    }

    /// Low level: order this device's later work after the collectives queued on `comm`.
    pub fn comm_wait(&self, comm: CommId) -> Result<()> {
        let function = self.module().comm_wait().ok_or_else(|| self.lacks("comm_wait"))?;
        self.check(function(self.index, comm), "comm_wait")
    }

    /// Low level: leave and free `comm`.
    pub fn comm_abort(&self, comm: CommId) -> Result<()> {
        let function = self.module().comm_abort().ok_or_else(|| self.lacks("comm_abort"))?;
        self.check(function(comm), "comm_abort")
    }

    /// The error for an interface function the plugin's (older) interface version lacks.
    fn lacks(&self, call: &str) -> Error {
        Error::new(
            ErrorKind::Unsupported,
            format!(
                "backend '{}' (interface {}) does not provide `{call}`",
                self.backend.name(),
                self.backend.api_version()
            ),
        )
    }

    fn module(&self) -> genesis_backend_api::abi::PluginModuleRef {
        self.backend.module()
    }

    fn check<T>(&self, result: genesis_backend_api::abi::RawResult<T>, call: impl fmt::Display) -> Result<T> {
        result.into_result().map_err(|e| {
            Error::from(genesis_backend_api::BackendError::from(e)).context(format_args!("{call} on {self}"))
        })
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.backend, &other.backend) && self.index == other.index
    }
}

impl Eq for Device {}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend.name(), self.index)
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({self})")
    }
}
