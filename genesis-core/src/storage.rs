//! Device buffers owned by the core: freed through their backend when the last tensor that
//! uses them is dropped.

use crate::device::Device;
use genesis_backend_api::BufferId;
use std::sync::atomic::{AtomicU64, Ordering};

/// A buffer on a device, shared by every tensor view of it.
pub(crate) struct Storage {
    pub device: Device,
    pub buffer: BufferId,
    bytes: usize,
    /// Bumped by every in-place write, so autograd can tell a saved tensor was changed.
    version: AtomicU64,
}

impl Storage {
    pub fn new(device: &Device, bytes: usize) -> crate::Result<Storage> {
        let buffer = device.allocate(bytes)?;
        if crate::profiler::active() {
            crate::profiler::memory(device, bytes as i64);
        }
        Ok(Storage { device: device.clone(), buffer, bytes, version: AtomicU64::new(0) })
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    pub fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // A failed free cannot be reported from drop; the backend's statistics still show it.
        let _ = self.device.free(self.buffer);
        if crate::profiler::active() {
            crate::profiler::memory(&self.device, -(self.bytes as i64));
        }
    }
}
