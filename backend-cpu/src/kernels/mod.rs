//! The kernel table. Each kernel file registers itself with `inventory::submit!`, naming the
//! (op, dtype) pairs it runs; the device builds its dispatch map and capability list from
//! these entries, so adding a kernel touches no central list.

mod adamw;
mod attention;
mod batch_norm;
mod conv;
mod copy;
mod cross_entropy;
mod elementwise;
mod fused;
mod index;
mod matmul;
mod norm;
mod pool;
mod random;
mod reduce;
mod rotary;
mod softmax;
mod swiglu;

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

genesis_backend_api::impl_meta!(View);

// SAFETY: a View is an address plus geometry; the op contract keeps outputs disjoint from
// the other operands, which is what makes handing views to worker threads sound.
unsafe impl Send for View {}
unsafe impl Sync for View {}

impl View {
    /// Resolve `desc` against the allocator, refusing views that leave their buffer.
    pub fn resolve(desc: &TensorDesc, allocator: &CachingAllocator) -> Result<View> {
        let block = allocator.block(desc.buffer)?;
        desc.validate(block.requested)?;
        let dtype = desc.dtype()?;
        // Kernels dereference typed pointers; a misaligned element would be undefined
        // behaviour (and a silent fault on other architectures), so refuse it here.
        if desc.offset_bytes % dtype.size_in_bytes() as u64 != 0 {
            return Err(BackendError::invalid(format!(
                "tensor view byte offset {} is not a multiple of the {dtype} element size",
                desc.offset_bytes
            )));
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
        genesis_backend_api::is_contiguous(&self.shape, &self.strides)
    }

    /// Element offsets in row-major order.
    pub fn offsets(&self) -> genesis_backend_api::sdk::StridedOffsets {
        genesis_backend_api::sdk::offsets(&self.shape, &self.strides)
    }

    /// True when no two positions of the view share an element, so tasks writing disjoint
    /// positions write disjoint memory. (`expect_no_overlap` only refuses zero strides; a view
    /// like shape `[2, 2]`, strides `[1, 1]` passes it and must not be written in parallel.)
    pub fn is_non_overlapping(&self) -> bool {
        genesis_backend_api::sdk::checks::is_non_overlapping(&self.shape, &self.strides)
    }

    /// The address range `[start, end)` the view can touch; `None` when empty.
    pub fn address_range(&self) -> Option<(usize, usize)> {
        if self.numel() == 0 {
            return None;
        }
        let size = self.dtype.size_in_bytes();
        let last: usize = self.shape.iter().zip(&self.strides).map(|(&n, &s)| (n - 1) * s as usize).sum();
        let start = self.base as usize;
        Some((start, start + (last + 1) * size))
    }

    /// True when the two views can touch a common byte (in-place kernels check their
    /// read-only operands against the updated output with this, since the device skips the
    /// overlap check for them).
    pub fn overlaps(&self, other: &View) -> bool {
        match (self.address_range(), other.address_range()) {
            (Some(a), Some(b)) => a.0 < b.1 && b.0 < a.1,
            _ => false,
        }
    }

    /// Pointer to the element at `offset` (in elements).
    ///
    /// # Safety
    /// `offset` must come from this view's geometry and `T` must match its dtype.
    pub unsafe fn at<T>(&self, offset: isize) -> *mut T {
        (self.base as *mut T).offset(offset)
    }
}

/// Views with at least this many elements are processed on the rayon pool; below it the
/// fork/join overhead (a few microseconds) outweighs the work.
pub const PAR_MIN: usize = 1 << 15;

/// Elements per parallel task: large enough to amortize scheduling, small enough that two
/// cores (or sixty-four) get balanced work on mid-sized tensors.
pub const PAR_CHUNK: usize = 1 << 14;

/// A raw pointer that may cross threads. Kernels use it to hand disjoint parts of one output
/// to rayon tasks; soundness comes from the op contract (outputs do not overlap inputs or each
/// other) plus the kernel writing each element from exactly one task.
///
/// Read it through [`SyncPtr::get`]: closures that name the field directly capture the bare
/// pointer (edition-2021 disjoint captures), which is not `Send`.
#[derive(Debug)]
pub struct SyncPtr<T>(pub *mut T);

impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}
// SAFETY: see the type's documentation; the pointer is only dereferenced under the op contract.
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer.
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// Run `body(start, end)` over `[0, n)`: in one call on this thread when `parallel` is false or
/// `n < PAR_MIN`, otherwise in [`PAR_CHUNK`]-sized pieces on the rayon pool. Chunk boundaries
/// depend only on `n`, so a kernel whose result depends on them stays deterministic.
pub fn for_chunks(n: usize, parallel: bool, body: impl Fn(usize, usize) + Sync + Send) {
    use rayon::prelude::*;
    if !parallel || n < PAR_MIN {
        if n > 0 {
            body(0, n);
        }
        return;
    }
    (0..n.div_ceil(PAR_CHUNK)).into_par_iter().for_each(|c| body(c * PAR_CHUNK, n.min((c + 1) * PAR_CHUNK)));
}

/// `(0..n).map(f).collect()`, on the rayon pool when `parallel` (results keep their order).
pub fn map_tasks<R: Send>(n: usize, parallel: bool, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    use rayon::prelude::*;
    if parallel && n > 1 {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// Drop size-1 dims and merge neighbours that are contiguous with each other in every one of
/// the `N` stride sets. Row-major order is preserved, so linear positions in the merged shape
/// are the same as in the original one; runs along the last merged dim get as long as possible.
pub fn merge_dims<const N: usize>(shape: &[usize], strides: [&[isize]; N]) -> (Vec<usize>, [Vec<isize>; N]) {
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: [Vec<isize>; N] = std::array::from_fn(|_| Vec::with_capacity(shape.len()));
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        if !out_shape.is_empty() {
            let last = out_shape.len() - 1;
            if (0..N).all(|k| out_strides[k][last] == strides[k][d].wrapping_mul(n as isize)) {
                out_shape[last] *= n;
                for (k, s) in out_strides.iter_mut().enumerate() {
                    s[last] = strides[k][d];
                }
                continue;
            }
        }
        out_shape.push(n);
        for (k, s) in out_strides.iter_mut().enumerate() {
            s.push(strides[k][d]);
        }
    }
    (out_shape, out_strides)
}

/// Visit row-major positions `[start, end)` of `shape` as runs along the last dim: `f(offsets,
/// inner_strides, len)` gets the element offset of the run's first element under each of the
/// `N` stride sets, the last dim's strides and the run length. Rank 0 is one run of length 1.
/// Callers pass `end <= numel`; offsets are those of valid positions, so they are in bounds for
/// any view whose geometry passed `TensorDesc::validate`.
pub fn for_each_run<const N: usize>(
    shape: &[usize],
    strides: [&[isize]; N],
    start: usize,
    end: usize,
    mut f: impl FnMut([isize; N], [isize; N], usize),
) {
    if start >= end {
        return;
    }
    let rank = shape.len();
    if rank == 0 {
        f([0; N], [0; N], 1);
        return;
    }
    let last = shape[rank - 1];
    let inner: [isize; N] = std::array::from_fn(|k| strides[k][rank - 1]);
    // Multi-index of `start`, then its offsets.
    let mut index = vec![0usize; rank];
    let mut rest = start;
    for d in (0..rank).rev() {
        index[d] = rest % shape[d];
        rest /= shape[d];
    }
    let mut offs: [isize; N] = std::array::from_fn(|k| {
        (0..rank).fold(0isize, |acc, d| acc.wrapping_add((index[d] as isize).wrapping_mul(strides[k][d])))
    });
    let mut pos = start;
    loop {
        let len = (last - index[rank - 1]).min(end - pos);
        f(offs, inner, len);
        pos += len;
        if pos >= end {
            return;
        }
        // The run ended at the end of a row: rewind the last dim and carry into the others.
        // Wrapping arithmetic as in `sdk::offsets`: a transient step past a size-1 dim with a
        // huge stride is undone at once.
        for (k, o) in offs.iter_mut().enumerate() {
            *o = o.wrapping_sub((index[rank - 1] as isize).wrapping_mul(inner[k]));
        }
        index[rank - 1] = 0;
        for d in (0..rank - 1).rev() {
            index[d] += 1;
            for (k, o) in offs.iter_mut().enumerate() {
                *o = o.wrapping_add(strides[k][d]);
            }
            if index[d] < shape[d] {
                break;
            }
            for (k, o) in offs.iter_mut().enumerate() {
                *o = o.wrapping_sub(strides[k][d].wrapping_mul(shape[d] as isize));
            }
            index[d] = 0;
        }
    }
}

/// `out[i] = f(a[i])` over row-major order, any strides. Outputs may be the same view as the
/// input (in place) but must not otherwise overlap it. Large views run on the rayon pool:
/// each element is read and written by the same task, which keeps exact aliasing sound.
pub fn map1<A: Copy, O: Copy>(a: &View, out: &View, f: impl Fn(A) -> O + Sync) {
    let n = out.numel();
    let (pa, po) = (SyncPtr(a.base as *mut A), SyncPtr(out.base as *mut O));
    // SAFETY (both branches): views are bounds-checked and typed by the caller's dtype
    // dispatch; raw pointers (not slices) because `out` may alias `a` exactly; tasks write
    // disjoint elements (contiguous, or checked non-overlapping before going parallel).
    if a.is_contiguous() && out.is_contiguous() {
        for_chunks(n, true, |s, e| unsafe {
            let (pa, po) = (pa.get(), po.get());
            for i in s..e {
                *po.add(i) = f(*pa.add(i));
            }
        });
    } else {
        let (shape, [sa, so]) = merge_dims(&out.shape, [&a.strides, &out.strides]);
        for_chunks(n, out.is_non_overlapping(), |s, e| {
            for_each_run(&shape, [&sa, &so], s, e, |[oa, oo], [ia, io], len| unsafe {
                let (pa, po) = (pa.get().offset(oa), po.get().offset(oo));
                if ia == 1 && io == 1 {
                    // Unit strides: the same loop, but one the compiler vectorizes.
                    for j in 0..len {
                        *po.add(j) = f(*pa.add(j));
                    }
                } else {
                    for j in 0..len as isize {
                        *po.offset(j * io) = f(*pa.offset(j * ia));
                    }
                }
            })
        });
    }
}

/// `out[i] = f(a[i], b[i])`, as [`map1`].
pub fn map2<A: Copy, B: Copy, O: Copy>(a: &View, b: &View, out: &View, f: impl Fn(A, B) -> O + Sync) {
    let n = out.numel();
    let (pa, pb, po) = (SyncPtr(a.base as *mut A), SyncPtr(b.base as *mut B), SyncPtr(out.base as *mut O));
    // SAFETY: as in `map1`.
    if a.is_contiguous() && b.is_contiguous() && out.is_contiguous() {
        for_chunks(n, true, |s, e| unsafe {
            let (pa, pb, po) = (pa.get(), pb.get(), po.get());
            for i in s..e {
                *po.add(i) = f(*pa.add(i), *pb.add(i));
            }
        });
    } else {
        let (shape, [sa, sb, so]) = merge_dims(&out.shape, [&a.strides, &b.strides, &out.strides]);
        for_chunks(n, out.is_non_overlapping(), |s, e| {
            for_each_run(&shape, [&sa, &sb, &so], s, e, |[oa, ob, oo], [ia, ib, io], len| unsafe {
                let (pa, pb, po) = (pa.get().offset(oa), pb.get().offset(ob), po.get().offset(oo));
                if ia == 1 && ib == 1 && io == 1 {
                    // Unit strides (e.g. a row broadcast over a matrix): a vectorizable loop.
                    for j in 0..len {
                        *po.add(j) = f(*pa.add(j), *pb.add(j));
                    }
                } else {
                    for j in 0..len as isize {
                        *po.offset(j * io) = f(*pa.offset(j * ia), *pb.offset(j * ib));
                    }
                }
            })
        });
    }
}

/// `Unsupported` for an op/dtype pair the kernel does not handle.
pub fn unsupported(op: &Op, dtype: DType) -> BackendError {
    BackendError::unsupported(format!("cpu: {} is not implemented for {dtype}", op.name()))
}
