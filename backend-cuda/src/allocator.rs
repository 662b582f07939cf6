//! The caching allocator: device memory is taken from the driver in segments and handed out
//! in blocks carved from them, so a training loop that allocates the same sizes every step
//! stops calling the driver after its first step.
//!
//! The policy follows the one PyTorch documents for its CUDA allocator (the numbers are
//! facts of its design; the code is our own):
//! - requests round up to a multiple of 512 bytes;
//! - requests of at most 1 MiB come from a *small* pool of 2 MiB segments, larger ones from a
//!   *large* pool whose segments are 20 MiB for requests under 10 MiB and the request rounded
//!   up to 2 MiB otherwise;
//! - the best-fitting free block is split when the rest is worth keeping (at least 512 bytes
//!   in the small pool, more than 1 MiB in the large one), and freed blocks merge with free
//!   neighbours of their segment;
//! - when the driver is out of memory, every wholly free segment is released and the request
//!   tried once more before the caller gets `OutOfMemory` with a summary of the pools.
//!
//! Work is ordered on the device's single stream, so a block freed by one op can be handed
//! to the next op at once: the stream runs them in issue order.
//!
//! The driver is behind [`Memory`] so the bookkeeping is tested on machines without a GPU.

use genesis_backend_api::{BackendError, BufferId, ErrorKind, MemoryStats, Result};
use std::collections::{BTreeSet, HashMap};

const MIN_BLOCK: usize = 512;
const SMALL_REQUEST: usize = 1 << 20;
const SMALL_SEGMENT: usize = 2 << 20;
const LARGE_SEGMENT: usize = 20 << 20;
const MIN_LARGE_ALONE: usize = 10 << 20;
const LARGE_ROUND: usize = 2 << 20;

/// Why the driver refused a segment.
#[derive(Debug)]
pub enum ReserveError {
    /// The device has no room; the allocator may release cache and retry.
    OutOfMemory(String),
    /// Anything else (a sticky context error, say): reported as is.
    Failed(BackendError),
}

/// Where segments come from: the CUDA driver in the plugin, a fake in tests.
pub trait Memory {
    /// A new segment of `bytes` bytes; returns its device address.
    fn reserve(&mut self, bytes: usize) -> std::result::Result<u64, ReserveError>;
    /// Give a segment (an address `reserve` returned) back.
    fn release(&mut self, ptr: u64, bytes: usize) -> Result<()>;
    /// `(free, total)` bytes of the device, for messages.
    fn device_memory(&self) -> Option<(usize, usize)>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pool {
    Small = 0,
    Large = 1,
}

#[derive(Debug, Clone)]
struct Block {
    ptr: u64,
    size: usize,
    pool: Pool,
    allocated: bool,
    /// Neighbours in the same segment (address order).
    prev: Option<usize>,
    next: Option<usize>,
}

/// A live buffer: its block (none for empty buffers) and the bytes the caller asked for.
#[derive(Debug, Clone, Copy)]
pub struct Live {
    /// Device address of the first byte (0 for an empty buffer).
    pub ptr: u64,
    /// Bytes requested; ops may touch exactly these.
    pub requested: usize,
    block: Option<usize>,
}

/// The allocator of one device. Not thread-safe by itself: the device holds it in a mutex.
pub struct CachingAllocator<M: Memory> {
    memory: M,
    blocks: Vec<Option<Block>>,
    spare_slots: Vec<usize>,
    /// Free blocks per pool, ordered by (size, address) for best fit.
    free: [BTreeSet<(usize, u64, usize)>; 2],
    live: HashMap<u64, Live>,
    next_id: u64,
    segments: usize,
    stats: MemoryStats,
    /// Segments given back to the driver (tests and the steady-state check count these).
    pub driver_releases: u64,
}

fn round_request(bytes: usize) -> Option<usize> {
    if bytes <= MIN_BLOCK {
        Some(MIN_BLOCK)
    } else {
        bytes.checked_add(MIN_BLOCK - 1).map(|b| b / MIN_BLOCK * MIN_BLOCK)
    }
}

fn segment_size(size: usize) -> Option<usize> {
    if size <= SMALL_REQUEST {
        Some(SMALL_SEGMENT)
    } else if size < MIN_LARGE_ALONE {
        Some(LARGE_SEGMENT)
    } else {
        size.checked_add(LARGE_ROUND - 1).map(|b| b / LARGE_ROUND * LARGE_ROUND)
    }
}

fn mib(bytes: impl Into<u64>) -> String {
    format!("{:.1} MiB", bytes.into() as f64 / (1u64 << 20) as f64)
}

impl<M: Memory> CachingAllocator<M> {
    /// An empty allocator over `memory`.
    pub fn new(memory: M) -> Self {
        CachingAllocator {
            memory,
            blocks: Vec::new(),
            spare_slots: Vec::new(),
            free: [BTreeSet::new(), BTreeSet::new()],
            live: HashMap::new(),
            next_id: 0,
            segments: 0,
            stats: MemoryStats::default(),
            driver_releases: 0,
        }
    }

    /// The memory source (the device uses it for driver calls of its own).
    pub fn memory(&self) -> &M {
        &self.memory
    }

    fn block(&self, i: usize) -> &Block {
        self.blocks[i].as_ref().expect("block slots referenced by the lists are occupied")
    }

    fn block_mut(&mut self, i: usize) -> &mut Block {
        self.blocks[i].as_mut().expect("block slots referenced by the lists are occupied")
    }

    fn add_block(&mut self, block: Block) -> usize {
        match self.spare_slots.pop() {
            Some(i) => {
                self.blocks[i] = Some(block);
                i
            }
            None => {
                self.blocks.push(Some(block));
                self.blocks.len() - 1
            }
        }
    }

    fn remove_block(&mut self, i: usize) -> Block {
        let block = self.blocks[i].take().expect("removing an occupied slot");
        self.spare_slots.push(i);
        block
    }

    fn insert_free(&mut self, i: usize) {
        let b = self.block(i);
        let key = (b.size, b.ptr, i);
        self.free[b.pool as usize].insert(key);
    }

    fn remove_free(&mut self, i: usize) {
        let b = self.block(i);
        let key = (b.size, b.ptr, i);
        self.free[b.pool as usize].remove(&key);
    }

    /// Allocate `bytes` (0 gives a valid empty buffer that owns no device memory).
    pub fn allocate(&mut self, bytes: usize) -> Result<BufferId> {
        self.stats.allocation_requests += 1;
        let live = if bytes == 0 {
            self.stats.cache_hits += 1;
            Live { ptr: 0, requested: 0, block: None }
        } else {
            let i = self.take_block(bytes)?;
            Live { ptr: self.block(i).ptr, requested: bytes, block: Some(i) }
        };
        self.next_id += 1;
        let id = self.next_id;
        self.live.insert(id, live);
        self.stats.record_allocation(bytes as u64);
        Ok(BufferId(id))
    }

    fn take_block(&mut self, bytes: usize) -> Result<usize> {
        let too_big = || {
            BackendError::new(
                ErrorKind::OutOfMemory,
                format!("cuda: cannot allocate {bytes} bytes: the size overflows"),
            )
        };
        let size = round_request(bytes).ok_or_else(too_big)?;
        let pool = if size <= SMALL_REQUEST { Pool::Small } else { Pool::Large };
        let found = self.free[pool as usize].range((size, 0, 0)..).next().copied();
        let i = match found {
            Some((_, _, i)) => {
                self.stats.cache_hits += 1;
                self.remove_free(i);
                i
            }
            None => {
                let segment = segment_size(size).ok_or_else(too_big)?;
                let ptr = self.reserve_segment(bytes, segment)?;
                self.stats.cache_misses += 1;
                self.add_block(Block { ptr, size: segment, pool, allocated: false, prev: None, next: None })
            }
        };
        let block = self.block(i).clone();
        let rest = block.size - size;
        let worth_splitting = match pool {
            Pool::Small => rest >= MIN_BLOCK,
            Pool::Large => rest > SMALL_REQUEST,
        };
        if worth_splitting {
            let tail = Block {
                ptr: block.ptr + size as u64,
                size: rest,
                pool,
                allocated: false,
                prev: Some(i),
                next: block.next,
            };
            let t = self.add_block(tail);
            if let Some(n) = block.next {
                self.block_mut(n).prev = Some(t);
            }
            let head = self.block_mut(i);
            head.size = size;
            head.next = Some(t);
            self.insert_free(t);
        }
        self.block_mut(i).allocated = true;
        Ok(i)
    }

    /// A segment from the driver; on out-of-memory, release the cache and try once more.
    fn reserve_segment(&mut self, requested: usize, segment: usize) -> Result<u64> {
        let first = match self.memory.reserve(segment) {
            Ok(ptr) => Ok(ptr),
            Err(ReserveError::OutOfMemory(_)) => {
                self.empty_cache()?;
                self.memory.reserve(segment)
            }
            Err(e) => Err(e),
        };
        match first {
            Ok(ptr) => {
                self.segments += 1;
                self.stats.record_reservation(segment as u64);
                Ok(ptr)
            }
            Err(ReserveError::OutOfMemory(reason)) => {
                self.stats.oom_count += 1;
                Err(BackendError::new(
                    ErrorKind::OutOfMemory,
                    format!(
                        "cuda: out of memory allocating {requested} bytes (a {} segment): {reason}. {}",
                        mib(segment as u64),
                        self.summary()
                    ),
                ))
            }
            Err(ReserveError::Failed(e)) => Err(e),
        }
    }

    /// One line about the pools and the device, for out-of-memory messages.
    pub fn summary(&self) -> String {
        let cached: usize = self.free.iter().flatten().map(|&(size, _, _)| size).sum();
        let device = match self.memory.device_memory() {
            Some((free, total)) => format!("; device: {} free of {}", mib(free as u64), mib(total as u64)),
            None => String::new(),
        };
        format!(
            "Memory summary: {} allocated in {} live buffers (peak {}), {} reserved in {} segments \
             (peak {}), {} of it cached and free; {} allocation failures so far{device}",
            mib(self.stats.allocated_bytes),
            self.stats.active_allocations,
            mib(self.stats.peak_allocated_bytes),
            mib(self.stats.reserved_bytes),
            self.segments,
            mib(self.stats.peak_reserved_bytes),
            mib(cached as u64),
            self.stats.oom_count + 1,
        )
    }

    /// Release a buffer into the cache, merging it with free neighbours.
    pub fn free(&mut self, id: BufferId) -> Result<()> {
        let live = self
            .live
            .remove(&id.0)
            .ok_or_else(|| BackendError::invalid(format!("cuda: free of unknown buffer {}", id.0)))?;
        self.stats.record_release(live.requested as u64);
        let Some(mut i) = live.block else { return Ok(()) };
        self.block_mut(i).allocated = false;
        if let Some(p) = self.block(i).prev.filter(|&p| !self.block(p).allocated) {
            self.remove_free(p);
            self.absorb(p, i);
            i = p;
        }
        if let Some(n) = self.block(i).next.filter(|&n| !self.block(n).allocated) {
            self.remove_free(n);
            self.absorb(i, n);
        }
        self.insert_free(i);
        Ok(())
    }

    /// Merge block `next`, the one after block `i` in its segment, into `i`, which grows by
    /// its size and takes its place in the segment's list.
    fn absorb(&mut self, i: usize, next: usize) {
        let absorbed = self.remove_block(next);
        let block = self.block_mut(i);
        block.size += absorbed.size;
        block.next = absorbed.next;
        if let Some(after) = absorbed.next {
            self.block_mut(after).prev = Some(i);
        }
    }

    /// The live buffer behind `id`.
    pub fn get(&self, id: BufferId) -> Result<Live> {
        self.live.get(&id.0).copied().ok_or_else(|| BackendError::invalid(format!("cuda: unknown buffer {}", id.0)))
    }

    /// Current statistics.
    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    /// Peaks back to the current values.
    pub fn reset_peak(&mut self) {
        self.stats.reset_peaks();
    }

    /// Give every wholly free segment back to the driver. The caller has made sure no queued
    /// work still uses cached blocks (the device synchronizes its stream first).
    pub fn empty_cache(&mut self) -> Result<()> {
        let whole: Vec<usize> = self
            .free
            .iter()
            .flatten()
            .map(|&(_, _, i)| i)
            .filter(|&i| self.block(i).prev.is_none() && self.block(i).next.is_none())
            .collect();
        for i in whole {
            self.remove_free(i);
            let block = self.remove_block(i);
            self.memory.release(block.ptr, block.size)?;
            self.driver_releases += 1;
            self.segments -= 1;
            self.stats.reserved_bytes -= block.size as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake device with `capacity` bytes and a bump allocator, counting driver calls.
    struct Fake {
        capacity: usize,
        used: usize,
        next: u64,
        reserves: usize,
        sizes: HashMap<u64, usize>,
    }

    impl Fake {
        fn new(capacity: usize) -> Self {
            Fake { capacity, used: 0, next: 1 << 32, reserves: 0, sizes: HashMap::new() }
        }
    }

    impl Memory for Fake {
        fn reserve(&mut self, bytes: usize) -> std::result::Result<u64, ReserveError> {
            if self.used + bytes > self.capacity {
                return Err(ReserveError::OutOfMemory("fake device full".into()));
            }
            self.used += bytes;
            self.reserves += 1;
            let ptr = self.next;
            self.next += bytes as u64 + 4096;
            self.sizes.insert(ptr, bytes);
            Ok(ptr)
        }
        fn release(&mut self, ptr: u64, bytes: usize) -> Result<()> {
            assert_eq!(self.sizes.remove(&ptr), Some(bytes), "release of a segment not reserved");
            self.used -= bytes;
            Ok(())
        }
        fn device_memory(&self) -> Option<(usize, usize)> {
            Some((self.capacity - self.used, self.capacity))
        }
    }

    #[test]
    fn rounding_and_segment_sizes_follow_the_policy() {
        assert_eq!(round_request(1), Some(512));
        assert_eq!(round_request(513), Some(1024));
        assert_eq!(segment_size(1 << 20), Some(2 << 20));
        assert_eq!(segment_size((1 << 20) + 512), Some(20 << 20));
        assert_eq!(segment_size((10 << 20) + 1), Some(12 << 20));
        assert_eq!(round_request(usize::MAX), None);
    }

    #[test]
    fn small_requests_share_a_segment_and_merge_back() {
        let mut a = CachingAllocator::new(Fake::new(1 << 30));
        let ids: Vec<BufferId> = (0..4).map(|_| a.allocate(1000).unwrap()).collect();
        let ptrs: Vec<u64> = ids.iter().map(|&id| a.get(id).unwrap().ptr).collect();
        // One 2 MiB segment, blocks 1024 bytes apart.
        assert_eq!(a.memory.reserves, 1);
        assert_eq!(ptrs[1] - ptrs[0], 1024);
        let s = a.stats();
        assert_eq!((s.allocated_bytes, s.reserved_bytes, s.cache_misses, s.cache_hits), (4000, 2 << 20, 1, 3));
        // Free in an order that exercises merging on both sides.
        for &i in &[1usize, 3, 0, 2] {
            a.free(ids[i]).unwrap();
        }
        assert_eq!(a.free[0].len(), 1, "all blocks merged into the whole segment");
        assert_eq!(a.free(ids[0]).unwrap_err().kind, ErrorKind::InvalidArgument);
        a.empty_cache().unwrap();
        assert_eq!(a.stats().reserved_bytes, 0);
        assert_eq!(a.memory.used, 0);
    }

    #[test]
    fn steady_state_needs_no_driver_calls() {
        let mut a = CachingAllocator::new(Fake::new(1 << 32));
        let sizes = [4 << 20, 123, 64 << 20, 3000, 1 << 20, 17 << 20, 512];
        for step in 0..5 {
            let ids: Vec<BufferId> = sizes.iter().map(|&s| a.allocate(s).unwrap()).collect();
            for id in ids.into_iter().rev() {
                a.free(id).unwrap();
            }
            if step == 0 {
                a.reset_peak();
            }
        }
        let first_step = a.memory.reserves;
        for _ in 0..10 {
            let ids: Vec<BufferId> = sizes.iter().map(|&s| a.allocate(s).unwrap()).collect();
            for id in ids {
                a.free(id).unwrap();
            }
        }
        assert_eq!(a.memory.reserves, first_step, "no new segments after warm-up");
        assert_eq!(a.stats().allocated_bytes, 0);
        assert_eq!(a.stats().active_allocations, 0);
    }

    #[test]
    fn out_of_memory_frees_the_cache_retries_then_reports() {
        let mut a = CachingAllocator::new(Fake::new(100 << 20));
        // Fill the cache with a 40 MiB segment that is free but cached.
        let big = a.allocate(40 << 20).unwrap();
        a.free(big).unwrap();
        // 80 MiB only fits once the cached segment is released.
        let x = a.allocate(80 << 20).unwrap();
        assert_eq!(a.memory.used, 80 << 20);
        assert_eq!(a.driver_releases, 1);
        // Now nothing fits: a clear error with the summary, and the allocator still works.
        let e = a.allocate(50 << 20).unwrap_err();
        assert_eq!(e.kind, ErrorKind::OutOfMemory);
        assert!(e.message.contains("Memory summary") && e.message.contains("fake device full"), "{}", e.message);
        assert_eq!(a.stats().oom_count, 1);
        a.free(x).unwrap();
        let y = a.allocate(50 << 20).unwrap();
        a.free(y).unwrap();
    }

    #[test]
    fn empty_buffers_are_valid() {
        let mut a = CachingAllocator::new(Fake::new(1 << 20));
        let e = a.allocate(0).unwrap();
        assert_eq!(a.get(e).unwrap().requested, 0);
        assert_eq!(a.memory.reserves, 0);
        a.free(e).unwrap();
        assert_eq!(a.stats().active_allocations, 0);
    }
}
