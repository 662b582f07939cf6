//! Page-locked host memory for the small reads of a synchronization: a decode step's chosen
//! ids and the index-fault words. Copies into it are asynchronous, so they queue behind the
//! work and one stream synchronization covers them all, where each copy into pageable memory
//! would wait on its own (a few microseconds each, per token in a decode loop).

use super::driver_error;
use cudarc::driver::result;
use genesis_backend_api::Result;

/// Bytes of a read that go through the staging area; longer reads copy directly.
pub(super) const STAGED_READ: usize = 4096;
/// Index-fault word pairs (16 bytes each, one per module that checks indices) it holds.
pub(super) const FAULT_SLOTS: usize = 32;

/// `STAGED_READ` bytes of data, then `FAULT_SLOTS` fault word pairs.
pub(super) struct Staging {
    ptr: *mut u8,
}

// SAFETY: plain host memory, used under the device's lock.
unsafe impl Send for Staging {}

impl Staging {
    pub(super) fn new() -> Result<Staging> {
        // SAFETY: a fresh allocation of the size every accessor below stays within.
        let ptr = unsafe { result::malloc_host(STAGED_READ + FAULT_SLOTS * 16, 0) }
            .map_err(|e| driver_error("cuMemHostAlloc", e))?;
        Ok(Staging { ptr: ptr.cast() })
    }

    /// The first `len` (at most [`STAGED_READ`]) data bytes.
    pub(super) fn data(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: inside the allocation; `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len.min(STAGED_READ)) }
    }

    /// Fault slot `i` (below [`FAULT_SLOTS`]).
    pub(super) fn fault(&mut self, i: usize) -> &mut [u8] {
        let start = STAGED_READ + i.min(FAULT_SLOTS - 1) * 16;
        // SAFETY: inside the allocation; `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), 16) }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once.
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}
