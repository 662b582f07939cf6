//! Indexing along one dim: gather, scatter_add (in place), index_select, index_add (in place)
//! and cumsum. Shape rules follow PyTorch.
//!
//! All five share one traversal: the operands are split at `dim` into `outer` (dims before),
//! the indexed dim and `inner` (dims after). A task owns one outer position and a chunk of
//! inner positions, computes the inner offsets once, and walks the indexed dim in order over
//! them. Tasks therefore write disjoint output elements (even the scatters: two tasks never
//! share an outer/inner coordinate), the order of accumulation into one element is the order
//! along `dim` whatever the thread count, and the innermost loop runs over the inner dims,
//! which are the contiguous ones in the common layouts (embedding rows, `dim = 0`).
//!
//! Indices are checked before anything is written, so a bad index leaves in-place outputs
//! untouched.

use super::{for_each_run, map_tasks, merge_dims, unsupported, Kernel, SyncPtr, View, PAR_CHUNK, PAR_MIN};
use crate::element::{Accumulate, Arith, Element};
use crate::with_dtype;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result};

fn claims() -> Vec<(OpKind, DType)> {
    domain::index_claims()
}

/// Rank 0 behaves as shape `[1]` (PyTorch accepts `dim = 0` on scalars).
fn lift(v: &View) -> View {
    let mut v = v.clone();
    if v.shape.is_empty() {
        v.shape = vec![1];
        v.strides = vec![0];
    }
    v
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    let name = op.name();
    let (Some(a), [y]) = (inputs.first(), outputs) else {
        return Err(BackendError::invalid(format!(
            "{name}: wrong number of operands ({} inputs, {} outputs)",
            inputs.len(),
            outputs.len()
        )));
    };
    // The second input of the two-input ops (the counts are checked per op below).
    let b = inputs.get(1).unwrap_or(a);
    let (a, b, y) = (lift(a), lift(b), lift(y));
    // The two-input ops, `(values, index) -> y` along `dim`; cumsum has one input.
    type Indexed = fn(&Op, &View, &View, &View, usize) -> Result<()>;
    let (kernel, dim): (Indexed, u32) = match *op {
        Op::Gather { dim } => (gather, dim),
        Op::ScatterAdd { dim } => (scatter_add, dim),
        Op::IndexSelect { dim } => (index_select, dim),
        Op::IndexAdd { dim } => (index_add, dim),
        Op::CumSum { dim } => {
            expect_inputs(op, inputs, 1)?;
            return cumsum(op, &a, &y, dim as usize);
        }
        _ => return Err(unsupported(op, a.dtype)),
    };
    expect_inputs(op, inputs, 2)?;
    kernel(op, &a, &b, &y, dim as usize)
}

fn expect_inputs(op: &Op, inputs: &[View], n: usize) -> Result<()> {
    if inputs.len() != n {
        return Err(BackendError::invalid(format!("{}: expected {n} input(s), got {}", op.name(), inputs.len())));
    }
    Ok(())
}

/// In-place ops are exempt from the device's overlap check: their read-only operands must
/// still not overlap the updated output (the SDK checks refuse an output that overlaps
/// itself).
fn expect_reads_disjoint(op: &Op, y: &View, reads: &[&View]) -> Result<()> {
    if reads.iter().any(|r| r.overlaps(y)) {
        return Err(BackendError::invalid(format!("{}: the output overlaps an input", op.name())));
    }
    Ok(())
}

/// Every index in `[0, size)`, checked before any write.
fn check_indices(op: &Op, index: &View, dim: usize, size: usize) -> Result<()> {
    // SAFETY: `index` is a bounds-checked i64 view (dtype checked by the caller).
    unsafe {
        for o in index.offsets() {
            let v = *index.at::<i64>(o);
            if v < 0 || v as u64 >= size as u64 {
                return Err(BackendError::invalid(format!(
                    "{}: index {v} is out of range for dim {dim} of size {size}",
                    op.name()
                )));
            }
        }
    }
    Ok(())
}

/// Operands split at `dim`: `outer × dim × inner`, each operand with its own strides.
struct Split<const N: usize> {
    outer: Vec<usize>,
    outer_strides: [Vec<isize>; N],
    inner: Vec<usize>,
    inner_strides: [Vec<isize>; N],
    /// Each operand's stride along `dim`.
    along: [isize; N],
}

impl<const N: usize> Split<N> {
    /// Split `shape` (the iteration space) at `dim`, with strides taken from `views`.
    fn new(shape: &[usize], views: [&View; N], dim: usize) -> Self {
        let (outer, outer_strides) = merge_dims(&shape[..dim], std::array::from_fn(|k| &views[k].strides[..dim]));
        let (inner, inner_strides) =
            merge_dims(&shape[dim + 1..], std::array::from_fn(|k| &views[k].strides[dim + 1..]));
        Split { outer, outer_strides, inner, inner_strides, along: std::array::from_fn(|k| views[k].strides[dim]) }
    }

    /// Call `f(outer_base, inner_offsets)` for every task: one outer position and a chunk of
    /// inner positions. `steps` (the length walked along `dim`) sizes the chunks; `parallel`
    /// allows the rayon pool (callers check that the output does not overlap itself).
    fn drive(&self, steps: usize, parallel: bool, f: impl Fn([isize; N], &[[isize; N]]) + Sync + Send) {
        let n_outer: usize = self.outer.iter().product();
        let n_inner: usize = self.inner.iter().product();
        if n_outer == 0 || n_inner == 0 || steps == 0 {
            return;
        }
        let width = n_inner.min((PAR_CHUNK / steps).max(256));
        let chunks = n_inner.div_ceil(width);
        let parallel = parallel && n_outer * n_inner * steps >= PAR_MIN;
        let outer_strides: [&[isize]; N] = std::array::from_fn(|k| &self.outer_strides[k][..]);
        let inner_strides: [&[isize]; N] = std::array::from_fn(|k| &self.inner_strides[k][..]);
        map_tasks(n_outer * chunks, parallel, |t| {
            let (o, c) = (t / chunks, t % chunks);
            let mut base = [0isize; N];
            for_each_run(&self.outer, outer_strides, o, o + 1, |offs, _, _| base = offs);
            let mut offs = Vec::with_capacity(width);
            for_each_run(&self.inner, inner_strides, c * width, n_inner.min((c + 1) * width), |start, st, len| {
                offs.extend((0..len as isize).map(|j| std::array::from_fn(|k| start[k] + j * st[k])));
            });
            f(base, &offs);
        });
    }
}

fn gather(op: &Op, x: &View, index: &View, y: &View, dim: usize) -> Result<()> {
    checks::gather(op, x, index, y, dim)?;
    check_indices(op, index, dim, x.shape[dim])?;
    let split = Split::new(&index.shape, [index, y, x], dim);
    let steps = index.shape[dim];
    with_dtype!(x.dtype, T => {
        let (pi, py, px) = (SyncPtr(index.base as *mut i64), SyncPtr(y.base as *mut T), SyncPtr(x.base as *mut T));
        let [si, sy, sx] = split.along;
        // SAFETY: offsets come from validated geometry, indices are in range (checked above),
        // and tasks write disjoint elements of `y`, which overlaps no input.
        split.drive(steps, y.is_non_overlapping(), |[bi, by, bx], offs| unsafe {
            for j in 0..steps as isize {
                for &[oi, oy, ox] in offs {
                    let t = *pi.get().offset(bi + j * si + oi) as isize;
                    *py.get().offset(by + j * sy + oy) = *px.get().offset(bx + t * sx + ox);
                }
            }
        });
    });
    Ok(())
}

fn scatter_add(op: &Op, src: &View, index: &View, y: &View, dim: usize) -> Result<()> {
    checks::scatter_add(op, src, index, y, dim)?;
    expect_reads_disjoint(op, y, &[src, index])?;
    check_indices(op, index, dim, y.shape[dim])?;
    let split = Split::new(&index.shape, [index, src, y], dim);
    let steps = index.shape[dim];
    with_dtype!(src.dtype, T => {
        let (pi, ps, py) = (SyncPtr(index.base as *mut i64), SyncPtr(src.base as *mut T), SyncPtr(y.base as *mut T));
        let [si, ss, sy] = split.along;
        // SAFETY: as in `gather`; a task owns its outer/inner coordinates of `y`, so the
        // scattered read-modify-writes of different tasks never meet.
        split.drive(steps, true, |[bi, bs, by], offs| unsafe {
            for j in 0..steps as isize {
                for &[oi, os, oy] in offs {
                    let t = *pi.get().offset(bi + j * si + oi) as isize;
                    let dst = py.get().offset(by + t * sy + oy);
                    *dst = T::store((*dst).compute().add((*ps.get().offset(bs + j * ss + os)).compute()));
                }
            }
        });
    });
    Ok(())
}

fn index_select(op: &Op, x: &View, index: &View, y: &View, dim: usize) -> Result<()> {
    checks::index_select(op, x, index, y, dim)?;
    check_indices(op, index, dim, x.shape[dim])?;
    let split = Split::new(&y.shape, [y, x], dim);
    let (steps, istride) = (index.shape[0], index.strides[0]);
    with_dtype!(x.dtype, T => {
        let (pi, py, px) = (SyncPtr(index.base as *mut i64), SyncPtr(y.base as *mut T), SyncPtr(x.base as *mut T));
        let [sy, sx] = split.along;
        // SAFETY: as in `gather`.
        split.drive(steps, y.is_non_overlapping(), |[by, bx], offs| unsafe {
            for j in 0..steps as isize {
                let t = *pi.get().offset(j * istride) as isize;
                let (dst, src) = (py.get().offset(by + j * sy), px.get().offset(bx + t * sx));
                for &[oy, ox] in offs {
                    *dst.offset(oy) = *src.offset(ox);
                }
            }
        });
    });
    Ok(())
}

fn index_add(op: &Op, src: &View, index: &View, y: &View, dim: usize) -> Result<()> {
    checks::index_add(op, src, index, y, dim)?;
    expect_reads_disjoint(op, y, &[src, index])?;
    check_indices(op, index, dim, y.shape[dim])?;
    let split = Split::new(&src.shape, [src, y], dim);
    let (steps, istride) = (index.shape[0], index.strides[0]);
    with_dtype!(src.dtype, T => {
        let (pi, ps, py) = (SyncPtr(index.base as *mut i64), SyncPtr(src.base as *mut T), SyncPtr(y.base as *mut T));
        let [ss, sy] = split.along;
        // SAFETY: as in `scatter_add`.
        split.drive(steps, true, |[bs, by], offs| unsafe {
            for j in 0..steps as isize {
                let t = *pi.get().offset(j * istride) as isize;
                let (dst, from) = (py.get().offset(by + t * sy), ps.get().offset(bs + j * ss));
                for &[os, oy] in offs {
                    let d = dst.offset(oy);
                    *d = T::store((*d).compute().add((*from.offset(os)).compute()));
                }
            }
        });
    });
    Ok(())
}

fn cumsum(op: &Op, x: &View, y: &View, dim: usize) -> Result<()> {
    if x.dtype == DType::Bool {
        return Err(unsupported(op, x.dtype));
    }
    checks::cumsum(op, x, y, dim)?;
    let split = Split::new(&x.shape, [x, y], dim);
    let steps = x.shape[dim];
    with_dtype!(x.dtype, T => {
        let (px, py) = (SyncPtr(x.base as *mut T), SyncPtr(y.base as *mut T));
        let [sx, sy] = split.along;
        // SAFETY: as in `gather`; `y` overlaps no input (device check).
        split.drive(steps, y.is_non_overlapping(), |[bx, by], offs| unsafe {
            // Running sums in the accumulator type (f32 for f16/bf16, f64 for f32).
            let mut acc = vec![<<T as Accumulate>::Acc as Arith>::ZERO; offs.len()];
            for j in 0..steps as isize {
                let (src, dst) = (px.get().offset(bx + j * sx), py.get().offset(by + j * sy));
                for (a, &[ox, oy]) in acc.iter_mut().zip(offs) {
                    *a = a.add((*src.offset(ox)).to_acc());
                    *dst.offset(oy) = T::from_acc(*a);
                }
            }
        });
    });
    Ok(())
}

inventory::submit! { Kernel { claims, run } }
