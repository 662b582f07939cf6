//! Device buffers owned by the core: freed through their backend when the last tensor that
//! uses them is dropped.

use crate::device::Device;
use genesis_backend_api::BufferId;

/// A buffer on a device, shared by every tensor view of it.
pub(crate) struct Storage {
    pub device: Device,
    pub buffer: BufferId,
    pub bytes: usize,
}

impl Storage {
    pub fn new(device: &Device, bytes: usize) -> crate::Result<Storage> {
        let buffer = device.allocate(bytes)?;
        Ok(Storage { device: device.clone(), buffer, bytes })
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // A failed free cannot be reported from drop; the backend counts it in its stats.
        let _ = self.device.free(self.buffer);
    }
}
