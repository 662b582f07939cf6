//! Strided tensor descriptors: how the core tells a backend where an operand lives.

use crate::dtype::DType;
use crate::error::{BackendError, Result};
use abi_stable::StableAbi;

/// The largest rank a descriptor carries. The core merges contiguous dimensions before it
/// calls a backend, so only tensors with more than this many non-mergeable dims are refused.
pub const MAX_DIMS: usize = 8;

/// An opaque buffer handle. Its meaning belongs to the backend that allocated it; the core
/// only passes it back to the same backend.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferId(pub u64);

/// A strided view of a buffer: plain data, copied freely across the boundary.
///
/// Element `(i0, i1, ...)` lives at byte `offset + (i0*strides[0] + i1*strides[1] + ...) *
/// dtype.size_in_bytes()` of `buffer`. Strides are in elements and may be 0 (a broadcast
/// input) but are never negative. Only the first `ndim` entries of `shape`/`strides` count.
/// Rank 0 is a scalar with one element.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDesc {
    /// The buffer the elements live in.
    pub buffer: BufferId,
    /// Byte offset of element zero in the buffer.
    pub offset_bytes: u64,
    /// A [`DType`] code.
    pub dtype: u32,
    /// Number of dimensions, at most [`MAX_DIMS`].
    pub ndim: u32,
    /// Size of each dimension.
    pub shape: [u64; MAX_DIMS],
    /// Stride of each dimension, in elements.
    pub strides: [i64; MAX_DIMS],
}

impl TensorDesc {
    /// A descriptor; fails if the rank exceeds [`MAX_DIMS`] or the lengths differ.
    pub fn new(
        buffer: BufferId,
        offset_bytes: usize,
        dtype: DType,
        shape: &[usize],
        strides: &[isize],
    ) -> Result<TensorDesc> {
        if shape.len() != strides.len() {
            return Err(BackendError::invalid(format!("shape {shape:?} and strides {strides:?} differ in rank")));
        }
        if shape.len() > MAX_DIMS {
            return Err(BackendError::unsupported(format!(
                "rank {} exceeds the interface maximum of {MAX_DIMS}",
                shape.len()
            )));
        }
        if strides.iter().any(|&s| s < 0) {
            return Err(BackendError::invalid(format!("negative stride in {strides:?}")));
        }
        let mut desc = TensorDesc {
            buffer,
            offset_bytes: offset_bytes as u64,
            dtype: dtype as u32,
            ndim: shape.len() as u32,
            shape: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        for (i, (&n, &s)) in shape.iter().zip(strides).enumerate() {
            desc.shape[i] = n as u64;
            desc.strides[i] = s as i64;
        }
        Ok(desc)
    }

    /// A contiguous (row-major) descriptor.
    pub fn contiguous(buffer: BufferId, offset_bytes: usize, dtype: DType, shape: &[usize]) -> Result<TensorDesc> {
        Self::new(buffer, offset_bytes, dtype, shape, &contiguous_strides(shape))
    }

    /// The element type; an unknown code is `Unsupported`.
    pub fn dtype(&self) -> Result<DType> {
        DType::from_code(self.dtype)
    }

    /// The rank, validated against [`MAX_DIMS`].
    pub fn rank(&self) -> usize {
        (self.ndim as usize).min(MAX_DIMS)
    }

    /// The shape as `usize`s.
    pub fn shape(&self) -> Vec<usize> {
        self.shape[..self.rank()].iter().map(|&n| n as usize).collect()
    }

    /// The strides in elements.
    pub fn strides(&self) -> Vec<isize> {
        self.strides[..self.rank()].iter().map(|&s| s as isize).collect()
    }

    /// Number of elements (saturating: [`TensorDesc::validate`] rejects overflowing shapes).
    pub fn numel(&self) -> usize {
        self.shape[..self.rank()]
            .iter()
            .fold(1usize, |acc, &n| acc.saturating_mul(usize::try_from(n).unwrap_or(usize::MAX)))
    }

    /// Check that the descriptor is well formed and that every element it can reach lies in
    /// a buffer of `buffer_len` bytes. Backends call this on every operand before touching
    /// memory; after it passes, [`crate::sdk::offsets`] and [`TensorDesc::byte_extent`] are
    /// safe to use.
    pub fn validate(&self, buffer_len: usize) -> Result<()> {
        if self.ndim as usize > MAX_DIMS {
            return Err(BackendError::invalid(format!(
                "rank {} exceeds the interface maximum of {MAX_DIMS}",
                self.ndim
            )));
        }
        self.dtype()?;
        if self.strides[..self.rank()].iter().any(|&s| s < 0) {
            return Err(BackendError::invalid(format!("negative stride in {:?}", self.strides())));
        }
        let numel = self.shape[..self.rank()].iter().try_fold(1u64, |acc, &n| acc.checked_mul(n));
        if numel.is_none_or(|n| n > isize::MAX as u64) {
            return Err(BackendError::invalid(format!("shape {:?} has too many elements", self.shape())));
        }
        if let Some((_, end)) = self.byte_extent()? {
            if end > buffer_len {
                return Err(BackendError::invalid(format!(
                    "tensor view (shape {:?}, strides {:?}, byte offset {}) reaches byte {end} of a {buffer_len}-byte buffer",
                    self.shape(),
                    self.strides(),
                    self.offset_bytes
                )));
            }
        }
        Ok(())
    }

    /// True when the elements are dense and row-major.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1i64;
        for i in (0..self.rank()).rev() {
            if self.shape[i] != 1 && self.strides[i] != expected {
                return false;
            }
            expected *= self.shape[i] as i64;
        }
        true
    }

    /// The byte range `[start, end)` of the buffer the view can touch; `None` when empty.
    pub fn byte_extent(&self) -> Result<Option<(usize, usize)>> {
        if self.numel() == 0 {
            return Ok(None);
        }
        let too_big = || BackendError::invalid("tensor view exceeds the address space");
        let elem = self.dtype()?.size_in_bytes() as u128;
        let mut last = 0u128;
        for i in 0..self.rank() {
            let reach = (self.shape[i] as u128 - 1) * self.strides[i].max(0) as u128;
            last = last.checked_add(reach).ok_or_else(too_big)?;
        }
        let start = self.offset_bytes as u128;
        let end = last
            .checked_add(1)
            .and_then(|n| n.checked_mul(elem))
            .and_then(|n| n.checked_add(start))
            .ok_or_else(too_big)?;
        if end > usize::MAX as u128 {
            return Err(too_big());
        }
        Ok(Some((start as usize, end as usize)))
    }
}

/// True when a view of `shape` with `strides` (in elements) is dense in row-major order
/// (size-1 dims may have any stride).
pub fn is_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    let mut expected = 1isize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected = expected.wrapping_mul(n as isize);
    }
    true
}

/// Row-major strides of `shape`, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc *= shape[i].max(1) as isize;
    }
    strides
}
