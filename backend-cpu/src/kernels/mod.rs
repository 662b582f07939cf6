//! The kernel table. Each kernel file registers itself with `inventory::submit!`, naming the
//! (op, dtype) pairs it runs; the device builds its dispatch map and capability list from
//! these entries, so adding a kernel touches no central list.

mod copy;
mod elementwise;

use crate::allocator::CachingAllocator;
use genesis_backend_api::{BackendError, Capability, DType, Op, OpKind, Result, TensorDesc};
use std::collections::HashMap;
use std::sync::OnceLock;

/// A kernel: what it claims and how to run it.
pub struct Kernel {
    /// The (op, dtype) pairs it runs.
    pub claims: fn() -> Vec<(OpKind, DType)>,
    /// Run one op; operands are already resolved to bounds-checked views.
    pub run: fn(&Op, &[View], &[View]) -> Result<()>,
}

inventory::collect!(Kernel);

/// The dispatch map from op kind to kernel, built once per process.
pub fn table() -> &'static HashMap<OpKind, &'static Kernel> {
    static TABLE: OnceLock<HashMap<OpKind, &'static Kernel>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut map = HashMap::new();
        for kernel in inventory::iter::<Kernel> {
            for (kind, _) in (kernel.claims)() {
                map.insert(kind, kernel);
            }
        }
        map
    })
}

/// Every claim of every kernel.
pub fn capabilities() -> Vec<Capability> {
    let mut caps: Vec<Capability> = inventory::iter::<Kernel>
        .into_iter()
        .flat_map(|k| (k.claims)())
        .map(|(op, dtype)| Capability { op, dtype: dtype as u32 })
        .collect();
    caps.sort();
    caps.dedup();
    caps
}

/// A bounds-checked strided view of device memory.
#[derive(Debug, Clone)]
pub struct View {
    /// Address of element zero.
    pub base: *mut u8,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Strides in elements.
    pub strides: Vec<isize>,
}

// SAFETY: a View is an address plus geometry; the op contract keeps outputs disjoint from
// the other operands, which is what makes handing views to worker threads sound.
unsafe impl Send for View {}
unsafe impl Sync for View {}

impl View {
    /// Resolve `desc` against the allocator, refusing views that leave their buffer.
    pub fn resolve(desc: &TensorDesc, allocator: &CachingAllocator) -> Result<View> {
        let dtype = desc.dtype()?;
        let block = allocator.block(desc.buffer)?;
        if let Some((_, end)) = desc.byte_extent()? {
            if end > block.requested {
                return Err(BackendError::invalid(format!(
                    "tensor view (shape {:?}, strides {:?}, offset {}) reaches byte {end} of a {}-byte buffer",
                    desc.shape(),
                    desc.strides(),
                    desc.offset_bytes,
                    block.requested
                )));
            }
        }
        // SAFETY: the offset is inside the buffer (checked above when the view is non-empty;
        // an empty view is never dereferenced).
        let base = unsafe { block.ptr.add((desc.offset_bytes as usize).min(block.requested)) };
        Ok(View { base, dtype, shape: desc.shape(), strides: desc.strides() })
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Dense row-major?
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1isize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n as isize;
        }
        true
    }

    /// Element offsets in row-major order.
    pub fn offsets(&self) -> genesis_backend_api::sdk::StridedOffsets {
        genesis_backend_api::sdk::offsets(&self.shape, &self.strides)
    }

    /// Pointer to the element at `offset` (in elements).
    ///
    /// # Safety
    /// `offset` must come from this view's geometry and `T` must match its dtype.
    pub unsafe fn at<T>(&self, offset: isize) -> *mut T {
        (self.base as *mut T).offset(offset)
    }
}

/// `out[i] = f(a[i])` over row-major order, any strides. Outputs may be the same view as the
/// input (in place) but must not otherwise overlap it.
pub fn map1<A: Copy, O: Copy>(a: &View, out: &View, f: impl Fn(A) -> O) {
    let n = out.numel();
    // SAFETY: views are bounds-checked and typed by the caller's dtype dispatch; raw
    // pointers (not slices) because `out` may alias `a` exactly.
    unsafe {
        if a.is_contiguous() && out.is_contiguous() {
            let (pa, po) = (a.at::<A>(0), out.at::<O>(0));
            for i in 0..n {
                *po.add(i) = f(*pa.add(i));
            }
        } else {
            for (ia, io) in a.offsets().zip(out.offsets()) {
                *out.at::<O>(io) = f(*a.at::<A>(ia));
            }
        }
    }
}

/// `out[i] = f(a[i], b[i])`, as [`map1`].
pub fn map2<A: Copy, B: Copy, O: Copy>(a: &View, b: &View, out: &View, f: impl Fn(A, B) -> O) {
    let n = out.numel();
    // SAFETY: as in `map1`.
    unsafe {
        if a.is_contiguous() && b.is_contiguous() && out.is_contiguous() {
            let (pa, pb, po) = (a.at::<A>(0), b.at::<B>(0), out.at::<O>(0));
            for i in 0..n {
                *po.add(i) = f(*pa.add(i), *pb.add(i));
            }
        } else {
            for ((ia, ib), io) in a.offsets().zip(b.offsets()).zip(out.offsets()) {
                *out.at::<O>(io) = f(*a.at::<A>(ia), *b.at::<B>(ib));
            }
        }
    }
}

/// `Unsupported` for an op/dtype pair the kernel does not handle.
pub fn unsupported(op: &Op, dtype: DType) -> BackendError {
    BackendError::unsupported(format!("cpu: {} is not implemented for {dtype}", op.name()))
}
