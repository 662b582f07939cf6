//! # genesis-backend-example
//!
//! A complete, deliberately simple Genesis backend written against the SDK alone: one
//! "device" whose memory is host `Vec<u8>`s and whose kernels are plain loops. It is meant
//! to be read and copied; see `README.md` for how to turn a copy into your own backend.
//!
//! - `lib.rs` (this file): the [`Backend`] and [`Device`] implementations.
//! - `memory.rs`: buffers, memory statistics, and moving strided tensors in and out of `Vec`s.
//! - `kernels.rs`: the capability list and one function per op; the scalar functions behind
//!   the elementwise ops are the SDK's (`sdk::scalar`).
//! - `activity.rs`: device activity records for the profiler (optional).

mod activity;
mod kernels;
mod memory;
#[cfg(test)]
mod tests;

use genesis_backend_api::{
    Backend, BackendError, BackendInfo, BufferId, Capability, Device, DeviceActivity, DeviceProperties, EventId,
    MemoryStats, Op, Probe, Result, TensorDesc,
};
use memory::Memory;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

genesis_backend_api::export_backend!("example", ExampleBackend, ExampleBackend::new);

/// The backend: stateless, because everything lives in the device it opens.
#[derive(Debug, Default)]
pub struct ExampleBackend;

impl ExampleBackend {
    /// Cheap, as the interface requires: no device is touched until `probe`/`open_device`.
    pub fn new() -> ExampleBackend {
        ExampleBackend
    }
}

impl Backend for ExampleBackend {
    type Device = ExampleDevice;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "example".into(),
            vendor: "Genesis".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Reference plugin: host memory and plain-Rust f32 kernels".into(),
        }
    }

    fn probe(&self) -> Probe {
        Probe { device_count: 1, unavailable_reason: None }
    }

    fn device_properties(&self, index: usize) -> Result<DeviceProperties> {
        check_index(index)?;
        Ok(DeviceProperties {
            name: "example device".into(),
            // The memory is the host's, and its size is not ours to report.
            total_memory: 0,
            compute_capability: (0, 0),
            thread_safe: true,
        })
    }

    fn open_device(&self, index: usize) -> Result<ExampleDevice> {
        check_index(index)?;
        Ok(ExampleDevice { memory: Mutex::new(Memory::new()), events: Mutex::new(Events::default()) })
    }

    fn activity_start(&self) -> Result<u64> {
        activity::start()
    }

    fn activity_tag(&self, tag: u64) -> Result<()> {
        activity::tag(tag);
        Ok(())
    }

    fn activity_stop(&self) -> Result<Vec<DeviceActivity>> {
        activity::stop()
    }
}

// The export glue already checks indices against `probe`; checking again keeps direct
// callers (like the tests) honest too.
fn check_index(index: usize) -> Result<()> {
    if index != 0 {
        return Err(BackendError::invalid(format!(
            "the example backend has one device; index {index} is out of range"
        )));
    }
    Ok(())
}

/// The one device. Every call takes the memory lock, so calls from several threads simply
/// run one after another and all work is finished when a call returns.
pub struct ExampleDevice {
    memory: Mutex<Memory>,
    events: Mutex<Events>,
}

/// Timing events (optional, for the profiler's device time). Work here is finished when its
/// call returns, so an event is simply the moment it was recorded; an asynchronous backend
/// records a marker on its queue instead (the CUDA backend uses CUDA events).
#[derive(Default)]
struct Events {
    recorded: HashMap<u64, Instant>,
    next: u64,
}

impl ExampleDevice {
    fn memory(&self) -> MutexGuard<'_, Memory> {
        // A panic caught by the export glue would poison the lock and make the device
        // unusable for good; the memory map stays consistent between statements, so carry on.
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn events(&self) -> MutexGuard<'_, Events> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn unknown_event(id: EventId) -> BackendError {
    BackendError::invalid(format!("timing event {} is unknown or released", id.0))
}

impl Device for ExampleDevice {
    fn allocate(&self, bytes: usize) -> Result<BufferId> {
        self.memory().allocate(bytes)
    }

    fn free(&self, buffer: BufferId) -> Result<()> {
        self.memory().free(buffer)
    }

    fn write(&self, dst: BufferId, offset: usize, src: &[u8]) -> Result<()> {
        self.memory().write(dst, offset, src)
    }

    fn read(&self, src: BufferId, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.memory().read(src, offset, dst)
    }

    fn memory_stats(&self) -> Result<MemoryStats> {
        Ok(self.memory().stats())
    }

    fn reset_peak_memory(&self) -> Result<()> {
        self.memory().reset_peaks();
        Ok(())
    }

    fn capabilities(&self) -> Vec<Capability> {
        kernels::capabilities()
    }

    fn execute(&self, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        activity::record(op.name(), || kernels::execute(&mut self.memory(), op, inputs, outputs))
    }

    fn record_event(&self) -> Result<EventId> {
        let mut events = self.events();
        events.next += 1;
        let id = events.next;
        events.recorded.insert(id, Instant::now());
        Ok(EventId(id))
    }

    fn event_elapsed_us(&self, start: EventId, end: EventId) -> Result<f64> {
        let events = self.events();
        let time = |id: EventId| events.recorded.get(&id.0).copied().ok_or_else(|| unknown_event(id));
        let (start, end) = (time(start)?, time(end)?);
        Ok(end.saturating_duration_since(start).as_secs_f64() * 1e6)
    }

    fn release_events(&self, ids: &[EventId]) -> Result<()> {
        let mut events = self.events();
        let mut unknown = None;
        for &id in ids {
            if events.recorded.remove(&id.0).is_none() {
                unknown = Some(id);
            }
        }
        unknown.map_or(Ok(()), |id| Err(unknown_event(id)))
    }
}
