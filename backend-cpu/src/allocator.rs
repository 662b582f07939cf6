//! A caching allocator with size classes, 64-byte alignment and the statistics of the
//! interface. Freed blocks go to a per-class free list instead of back to the system, so a
//! training loop that allocates the same sizes every step stops calling the system allocator
//! after the first step.

use genesis_backend_api::{BackendError, BufferId, ErrorKind, MemoryStats, Result};
use std::alloc::{alloc, dealloc, Layout};
use std::collections::HashMap;
use std::sync::Mutex;

/// Every buffer starts on a cache line, so SIMD loads never straddle one needlessly.
pub const ALIGN: usize = 64;

/// A live allocation.
#[derive(Debug, Clone, Copy)]
pub struct Block {
    /// Start of the memory (dangling but aligned for empty blocks).
    pub ptr: *mut u8,
    /// Bytes the caller asked for; kernels may touch exactly these.
    pub requested: usize,
    /// Bytes reserved (the size class).
    pub capacity: usize,
}

// SAFETY: a Block is a plain description of memory owned by the allocator; access to the
// bytes is coordinated by the op contract (outputs do not overlap inputs).
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

#[derive(Default)]
struct State {
    live: HashMap<u64, Block>,
    cached: HashMap<usize, Vec<*mut u8>>,
    next_id: u64,
    stats: MemoryStats,
}

// SAFETY: the raw pointers in the cache are owned by the allocator and only touched under
// the mutex.
unsafe impl Send for State {}

/// The allocator of one CPU device.
#[derive(Default)]
pub struct CachingAllocator {
    state: Mutex<State>,
}

/// Round a request up to its size class: powers of two up to 1 MiB, then 1 MiB steps, so
/// waste stays under 50% for small and under 1 MiB for large blocks.
fn size_class(bytes: usize) -> Option<usize> {
    const MIB: usize = 1 << 20;
    if bytes <= ALIGN {
        Some(ALIGN)
    } else if bytes <= MIB {
        bytes.checked_next_power_of_two()
    } else {
        bytes.checked_add(MIB - 1).map(|b| b / MIB * MIB)
    }
}

impl CachingAllocator {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Allocate `bytes`, from the cache when a block of the class is free.
    pub fn allocate(&self, bytes: usize) -> Result<BufferId> {
        let mut s = self.lock();
        s.stats.allocation_requests += 1;
        let class = size_class(bytes).filter(|&c| c <= isize::MAX as usize - ALIGN);
        let Some(class) = class else {
            s.stats.oom_count += 1;
            return Err(BackendError::new(ErrorKind::OutOfMemory, format!("cpu: cannot allocate {bytes} bytes")));
        };
        let ptr = match s.cached.get_mut(&class).and_then(Vec::pop) {
            Some(ptr) => {
                s.stats.cache_hits += 1;
                ptr
            }
            None => {
                s.stats.cache_misses += 1;
                let layout =
                    Layout::from_size_align(class, ALIGN).map_err(|e| BackendError::internal(e.to_string()))?;
                // SAFETY: the layout has a non-zero size.
                let ptr = unsafe { alloc(layout) };
                if ptr.is_null() {
                    s.stats.oom_count += 1;
                    return Err(BackendError::new(
                        ErrorKind::OutOfMemory,
                        format!(
                            "cpu: the system refused {bytes} bytes ({} bytes reserved already)",
                            s.stats.reserved_bytes
                        ),
                    ));
                }
                s.stats.record_reservation(class as u64);
                ptr
            }
        };
        s.next_id += 1;
        let id = s.next_id;
        s.live.insert(id, Block { ptr, requested: bytes, capacity: class });
        s.stats.record_allocation(bytes as u64);
        Ok(BufferId(id))
    }

    /// Return a block to its class's free list.
    pub fn free(&self, id: BufferId) -> Result<()> {
        let mut s = self.lock();
        let block = s
            .live
            .remove(&id.0)
            .ok_or_else(|| BackendError::invalid(format!("cpu: free of unknown buffer {}", id.0)))?;
        s.stats.record_release(block.requested as u64);
        s.cached.entry(block.capacity).or_default().push(block.ptr);
        Ok(())
    }

    /// The live block behind `id`.
    pub fn block(&self, id: BufferId) -> Result<Block> {
        self.lock()
            .live
            .get(&id.0)
            .copied()
            .ok_or_else(|| BackendError::invalid(format!("cpu: unknown buffer {}", id.0)))
    }

    /// Current statistics.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// Peaks back to the current values.
    pub fn reset_peak(&self) {
        self.lock().stats.reset_peaks();
    }

    /// Give every cached block back to the system.
    pub fn empty_cache(&self) {
        let mut s = self.lock();
        let cached = std::mem::take(&mut s.cached);
        for (class, ptrs) in cached {
            for ptr in ptrs {
                // SAFETY: allocated above with exactly this layout and no longer live.
                unsafe { dealloc(ptr, Layout::from_size_align_unchecked(class, ALIGN)) };
                s.stats.reserved_bytes -= class as u64;
            }
        }
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        self.empty_cache();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_blocks_and_counts() {
        let a = CachingAllocator::default();
        let x = a.allocate(1000).unwrap();
        a.free(x).unwrap();
        let y = a.allocate(900).unwrap();
        let s = a.stats();
        assert_eq!((s.cache_hits, s.cache_misses, s.allocated_bytes, s.reserved_bytes), (1, 1, 900, 1024));
        assert_eq!(a.block(y).unwrap().ptr as usize % ALIGN, 0);
        assert_eq!(a.free(x).unwrap_err().kind, ErrorKind::InvalidArgument);
        a.free(y).unwrap();
        a.empty_cache();
        assert_eq!(a.stats().reserved_bytes, 0);
        assert_eq!(a.allocate(usize::MAX - 10).unwrap_err().kind, ErrorKind::OutOfMemory);
    }
}
