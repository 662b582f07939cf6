//! Device memory of the example backend: plain host `Vec<u8>`s behind integer handles, plus
//! the two functions every kernel uses to move a strided tensor in and out of a `Vec`.

use genesis_backend_api::sdk;
use genesis_backend_api::{BackendError, BufferId, DType, ErrorKind, MemoryStats, Result, TensorDesc, MAX_DIMS};
use std::collections::HashMap;
use std::ops::Range;

/// All buffers of the device and their accounting. The device keeps it behind one mutex.
pub struct Memory {
    buffers: HashMap<u64, Vec<u8>>,
    next_id: u64,
    stats: MemoryStats,
}

impl Memory {
    pub fn new() -> Memory {
        // Handles start at 1 so that a zeroed `BufferId` is never a live buffer.
        Memory { buffers: HashMap::new(), next_id: 1, stats: MemoryStats::default() }
    }

    pub fn allocate(&mut self, bytes: usize) -> Result<BufferId> {
        // `try_reserve` reports a failed allocation; `vec![0; bytes]` would abort the host.
        let mut buffer = Vec::new();
        if buffer.try_reserve_exact(bytes).is_err() {
            self.stats.oom_count += 1;
            return Err(BackendError::new(
                ErrorKind::OutOfMemory,
                format!("example device: cannot allocate {bytes} bytes"),
            ));
        }
        buffer.resize(bytes, 0);

        let id = self.next_id;
        self.next_id += 1;
        self.buffers.insert(id, buffer);

        // There is no caching allocator: every request is a miss and reserved == allocated.
        let s = &mut self.stats;
        s.record_allocation(bytes as u64);
        s.record_reservation(bytes as u64);
        s.allocation_requests += 1;
        s.cache_misses += 1;
        Ok(BufferId(id))
    }

    pub fn free(&mut self, id: BufferId) -> Result<()> {
        let buffer = self
            .buffers
            .remove(&id.0)
            .ok_or_else(|| BackendError::invalid(format!("free: unknown buffer {}", id.0)))?;
        let s = &mut self.stats;
        s.record_release(buffer.len() as u64);
        s.reserved_bytes = s.allocated_bytes;
        Ok(())
    }

    pub fn write(&mut self, id: BufferId, offset: usize, src: &[u8]) -> Result<()> {
        let buffer = self.buffer_mut(id)?;
        let range = byte_range("write", id, buffer.len(), offset, src.len())?;
        buffer[range].copy_from_slice(src);
        Ok(())
    }

    pub fn read(&self, id: BufferId, offset: usize, dst: &mut [u8]) -> Result<()> {
        let buffer = self.buffer(id)?;
        let range = byte_range("read", id, buffer.len(), offset, dst.len())?;
        dst.copy_from_slice(&buffer[range]);
        Ok(())
    }

    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    pub fn reset_peaks(&mut self) {
        self.stats.reset_peaks();
    }

    fn buffer(&self, id: BufferId) -> Result<&Vec<u8>> {
        self.buffers.get(&id.0).ok_or_else(|| BackendError::invalid(format!("unknown buffer {}", id.0)))
    }

    fn buffer_mut(&mut self, id: BufferId) -> Result<&mut Vec<u8>> {
        self.buffers.get_mut(&id.0).ok_or_else(|| BackendError::invalid(format!("unknown buffer {}", id.0)))
    }

    /// Check that `t` is a well-formed view lying inside its buffer.
    ///
    /// The core is trusted to send sane descriptors, but a plugin must never crash its host,
    /// so every operand goes through this (with overflow-checked arithmetic) before the SDK
    /// helpers or a kernel touch it.
    pub fn check_view(&self, t: &TensorDesc) -> Result<()> {
        let dtype = t.dtype()?;
        let bad = |why: String| BackendError::invalid(format!("tensor view on buffer {}: {why}", t.buffer.0));
        if t.ndim as usize > MAX_DIMS {
            return Err(bad(format!("rank {} exceeds {MAX_DIMS}", t.ndim)));
        }
        let (shape, strides) = (t.shape(), t.strides());
        if strides.iter().any(|&s| s < 0) {
            return Err(bad(format!("negative stride in {strides:?}")));
        }
        // Even an empty tensor must have a representable element count, or the SDK's
        // `numel()` and `offsets()` would overflow on it.
        let non_empty_count = shape.iter().filter(|&&n| n > 0).try_fold(1usize, |acc, &n| acc.checked_mul(n));
        if non_empty_count.is_none() {
            return Err(bad(format!("shape {shape:?} has too many elements")));
        }
        let buffer_len = self.buffer(t.buffer)?.len();
        if shape.contains(&0) {
            return Ok(());
        }
        // The last element sits at sum((n - 1) * stride); size-1 dims add nothing whatever
        // their stride.
        let last = shape
            .iter()
            .zip(&strides)
            .try_fold(0usize, |acc, (&n, &s)| (n - 1).checked_mul(s as usize).and_then(|step| acc.checked_add(step)));
        let end = last
            .and_then(|last| (last + 1).checked_mul(dtype.size_in_bytes()))
            .and_then(|bytes| bytes.checked_add(usize::try_from(t.offset_bytes).ok()?));
        match end {
            Some(end) if end <= buffer_len => Ok(()),
            _ => Err(bad(format!(
                "shape {shape:?}, strides {strides:?} and byte offset {} reach past the buffer's {buffer_len} bytes",
                t.offset_bytes
            ))),
        }
    }

    /// The elements of `t` in row-major order.
    pub fn load<T: Element>(&self, t: &TensorDesc) -> Result<Vec<T>> {
        expect_element_dtype::<T>(t)?;
        let buffer = self.buffer(t.buffer)?;
        let mut values = Vec::new();
        values.try_reserve_exact(t.numel()).map_err(|_| {
            // A broadcast (stride 0) input can describe far more elements than its buffer holds.
            BackendError::new(ErrorKind::OutOfMemory, format!("cannot hold {} elements on the host", t.numel()))
        })?;
        for at in element_bytes::<T>(t)? {
            let value = buffer.get(at.clone()).and_then(T::decode).ok_or_else(|| out_of_bounds(t, at))?;
            values.push(value);
        }
        Ok(values)
    }

    /// Write `values` (row-major) through the strides of `t`.
    pub fn store<T: Element>(&mut self, t: &TensorDesc, values: &[T]) -> Result<()> {
        expect_element_dtype::<T>(t)?;
        if values.len() != t.numel() {
            return Err(BackendError::internal(format!(
                "kernel produced {} values for a tensor of shape {:?}",
                values.len(),
                t.shape()
            )));
        }
        let positions = element_bytes::<T>(t)?;
        let buffer = self.buffer_mut(t.buffer)?;
        for (at, &value) in positions.zip(values) {
            let slot = buffer.get_mut(at.clone()).ok_or_else(|| out_of_bounds(t, at))?;
            value.encode(slot);
        }
        Ok(())
    }

    /// [`Memory::load`] for whichever of the handled dtypes `t` has.
    pub fn load_values(&self, t: &TensorDesc) -> Result<Values> {
        match t.dtype()? {
            DType::F32 => Ok(Values::F32(self.load(t)?)),
            DType::I64 => Ok(Values::I64(self.load(t)?)),
            DType::Bool => Ok(Values::Bool(self.load(t)?)),
            other => Err(BackendError::unsupported(format!("example backend cannot read {other} tensors"))),
        }
    }

    /// [`Memory::store`] for whichever of the handled dtypes `values` holds.
    pub fn store_values(&mut self, t: &TensorDesc, values: &Values) -> Result<()> {
        match values {
            Values::F32(v) => self.store(t, v),
            Values::I64(v) => self.store(t, v),
            Values::Bool(v) => self.store(t, v),
        }
    }
}

/// The elements of one tensor, for ops that work on several dtypes (copy, cast).
pub enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

/// A Rust type that stores one element of a Genesis dtype. Buffers hold host-native bytes,
/// because the core writes and reads them as plain host memory.
pub trait Element: Copy {
    const DTYPE: DType;
    /// `None` when `bytes` is not exactly one element long.
    fn decode(bytes: &[u8]) -> Option<Self>;
    /// `out` is exactly one element long.
    fn encode(self, out: &mut [u8]);
}

/// [`Element`] for a number type stored as its native-endian bytes.
macro_rules! native_element {
    ($t:ty, $dtype:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn decode(bytes: &[u8]) -> Option<$t> {
                Some(<$t>::from_ne_bytes(bytes.try_into().ok()?))
            }
            fn encode(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_ne_bytes());
            }
        }
    };
}
native_element!(f32, DType::F32);
native_element!(i64, DType::I64);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn decode(bytes: &[u8]) -> Option<bool> {
        // Any non-zero byte reads as true, so a sloppy producer cannot create an invalid bool.
        match bytes {
            [b] => Some(*b != 0),
            _ => None,
        }
    }
    fn encode(self, out: &mut [u8]) {
        out.fill(u8::from(self));
    }
}

fn expect_element_dtype<T: Element>(t: &TensorDesc) -> Result<()> {
    let dtype = t.dtype()?;
    if dtype != T::DTYPE {
        return Err(BackendError::dtype(format!("expected a {} tensor, got {dtype}", T::DTYPE)));
    }
    Ok(())
}

/// Byte ranges of the elements of `t`, in row-major order.
fn element_bytes<T: Element>(t: &TensorDesc) -> Result<impl Iterator<Item = Range<usize>>> {
    let size = T::DTYPE.size_in_bytes();
    let base = usize::try_from(t.offset_bytes).map_err(|_| BackendError::invalid("byte offset too large"))?;
    // A size-1 dim never moves, so its stride (which may be anything) is left out of the
    // offset arithmetic.
    let strides: Vec<isize> = t.shape().iter().zip(t.strides()).map(|(&n, s)| if n == 1 { 0 } else { s }).collect();
    Ok(sdk::offsets(&t.shape(), &strides).map(move |element| {
        // `check_view` rejected negative strides and extents past the buffer, so these stay
        // small; saturating keeps a bad descriptor an error (via `get`) rather than a panic.
        let start = base.saturating_add((element as usize).saturating_mul(size));
        start..start.saturating_add(size)
    }))
}

fn byte_range(what: &str, id: BufferId, len: usize, offset: usize, count: usize) -> Result<Range<usize>> {
    match offset.checked_add(count) {
        Some(end) if end <= len => Ok(offset..end),
        _ => Err(BackendError::invalid(format!(
            "{what} of {count} bytes at offset {offset} does not fit buffer {} of {len} bytes",
            id.0
        ))),
    }
}

fn out_of_bounds(t: &TensorDesc, at: Range<usize>) -> BackendError {
    BackendError::invalid(format!("element bytes {at:?} lie outside buffer {}", t.buffer.0))
}
