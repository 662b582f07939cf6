//! Batched matrix products `[a (.., m, k), b (.., k, n)] -> [y (.., m, n)]`.
//!
//! Batch dims of the three operands are equal (broadcast ones arrive with stride 0) and every
//! operand may have any strides, so transposes cost nothing: the `gemm` crate takes a row and
//! a column stride per matrix. f32 and f64 go to `gemm` directly. f16 and bf16 are widened to
//! f32, multiplied by the f32 `gemm` and rounded once: the interface asks for f32
//! accumulation, and `gemm`'s own f16 path rounds partial sums to f16 between its depth blocks
//! (every few hundred terms of k), which would violate it for long k. i64/i32 use a plain
//! loop with wrapping arithmetic.
//!
//! Threads: a product with more than [`GEMM_PARALLEL`] multiply-adds runs `gemm` on the rayon
//! pool; smaller ones run single-threaded, and a batch of small products is spread over the
//! pool one matrix per task instead.

use super::{map_tasks, unsupported, Kernel, SyncPtr, View};
use crate::element::{Arith, Element};
use crate::with_dtype;
use gemm::Parallelism;
use genesis_backend_api::sdk::{checks, domain};
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result};
use half::{bf16, f16};

/// `m*n*k` above which one product is worth several threads.
const GEMM_PARALLEL: usize = 64 * 64 * 64;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::Matmul, Op::Addmm])
}

/// One matrix operand: its first element and its (row, column) strides in elements.
#[derive(Clone, Copy)]
struct Mat<T> {
    ptr: SyncPtr<T>,
    rs: isize,
    cs: isize,
}

impl<T> Mat<T> {
    /// The last two dims of `v`, whose elements are `T`.
    fn of(v: &View) -> Mat<T> {
        let r = v.shape.len();
        Mat { ptr: SyncPtr(v.base as *mut T), rs: v.strides[r - 2], cs: v.strides[r - 1] }
    }

    /// # Safety
    /// `(i, j)` must lie inside the matrix.
    #[inline(always)]
    unsafe fn at(self, i: usize, j: usize) -> *mut T {
        self.ptr.get().offset(i as isize * self.rs + j as isize * self.cs)
    }
}

/// How one dtype multiplies one `(m, k) x (k, n)` matrix pair.
trait MatElem: Element {
    /// `y = a · b` (overwriting `y`).
    ///
    /// # Safety
    /// The matrices lie inside their buffers, `y` overlaps neither input nor, within one call,
    /// itself, and `k > 0`.
    unsafe fn matmul(m: usize, n: usize, k: usize, a: Mat<Self>, b: Mat<Self>, y: Mat<Self>, par: Parallelism);
}

/// `gemm` for its native types: `y = a · b`, or with `accumulate` `y += a · b`. Argument
/// order: dst, dst column stride, dst row stride, read_dst, lhs (cs, rs), rhs (cs, rs), alpha
/// (scales dst; ignored without read_dst), beta (scales the product), three conjugation flags.
unsafe fn native<T: 'static + Copy>(
    (m, n, k): (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    y: Mat<T>,
    (one, zero): (T, T),
    accumulate: bool,
    par: Parallelism,
) {
    let alpha = if accumulate { one } else { zero };
    gemm::gemm(
        m,
        n,
        k,
        y.ptr.get(),
        y.cs,
        y.rs,
        accumulate,
        a.ptr.get(),
        a.cs,
        a.rs,
        b.ptr.get(),
        b.cs,
        b.rs,
        alpha,
        one,
        false,
        false,
        false,
        par,
    );
}

impl MatElem for f32 {
    unsafe fn matmul(m: usize, n: usize, k: usize, a: Mat<f32>, b: Mat<f32>, y: Mat<f32>, par: Parallelism) {
        native((m, n, k), a, b, y, (1.0, 0.0), false, par)
    }
}

impl MatElem for f64 {
    unsafe fn matmul(m: usize, n: usize, k: usize, a: Mat<f64>, b: Mat<f64>, y: Mat<f64>, par: Parallelism) {
        native((m, n, k), a, b, y, (1.0, 0.0), false, par)
    }
}

/// Copy a strided matrix into a dense row-major f32 buffer.
unsafe fn widen<T: Element<Compute = f32>>(rows: usize, cols: usize, src: Mat<T>) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        out.extend((0..cols).map(|j| (*src.at(i, j)).compute()));
    }
    out
}

/// f16/bf16 through the f32 `gemm`: widen both inputs, multiply, round once.
unsafe fn via_f32<T: Element<Compute = f32>>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<T>,
    b: Mat<T>,
    y: Mat<T>,
    par: Parallelism,
) {
    let mut wy = vec![0f32; m * n];
    widened(m, n, k, a, b, dense(&mut wy, n), par);
    round_into(&wy, m, n, y);
}

/// A dense row-major f32 buffer of `cols` columns as a matrix.
fn dense(v: &mut [f32], cols: usize) -> Mat<f32> {
    Mat { ptr: SyncPtr(v.as_mut_ptr()), rs: cols as isize, cs: 1 }
}

/// Round a dense row-major f32 result once into the strided `y`.
unsafe fn round_into<T: Element<Compute = f32>>(values: &[f32], rows: usize, cols: usize, y: Mat<T>) {
    for i in 0..rows {
        for j in 0..cols {
            *y.at(i, j) = T::store(values[i * cols + j]);
        }
    }
}

impl MatElem for f16 {
    unsafe fn matmul(m: usize, n: usize, k: usize, a: Mat<f16>, b: Mat<f16>, y: Mat<f16>, par: Parallelism) {
        via_f32(m, n, k, a, b, y, par)
    }
}

impl MatElem for bf16 {
    unsafe fn matmul(m: usize, n: usize, k: usize, a: Mat<bf16>, b: Mat<bf16>, y: Mat<bf16>, par: Parallelism) {
        via_f32(m, n, k, a, b, y, par)
    }
}

/// Integers: row of `y` accumulated in the compute type (wrapping), `i-p-j` order so the
/// inner loop streams a row of `b`.
unsafe fn int_loop<T: Element>(m: usize, n: usize, k: usize, a: Mat<T>, b: Mat<T>, y: Mat<T>) {
    let mut row = vec![T::Compute::ZERO; n];
    for i in 0..m {
        row.fill(T::Compute::ZERO);
        for p in 0..k {
            let av = (*a.at(i, p)).compute();
            for (j, acc) in row.iter_mut().enumerate() {
                *acc = acc.add(av.mul((*b.at(p, j)).compute()));
            }
        }
        for (j, &acc) in row.iter().enumerate() {
            *y.at(i, j) = T::store(acc);
        }
    }
}

impl MatElem for i64 {
    unsafe fn matmul(m: usize, n: usize, k: usize, a: Mat<i64>, b: Mat<i64>, y: Mat<i64>, _: Parallelism) {
        int_loop(m, n, k, a, b, y)
    }
}

impl MatElem for i32 {
    unsafe fn matmul(m: usize, n: usize, k: usize, a: Mat<i32>, b: Mat<i32>, y: Mat<i32>, _: Parallelism) {
        int_loop(m, n, k, a, b, y)
    }
}

/// Integer dtypes without a matmul: kept out of the claims; never called (run refuses them).
macro_rules! no_matmul {
    ($($t:ty),*) => {$(
        impl MatElem for $t {
            unsafe fn matmul(_: usize, _: usize, _: usize, _: Mat<$t>, _: Mat<$t>, _: Mat<$t>, _: Parallelism) {}
        }
    )*};
}
no_matmul!(u8, crate::element::Bool);

pub(super) fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    if *op == Op::Addmm {
        return addmm(op, inputs, outputs);
    }
    let ([a, b], [y]) = (inputs, outputs) else {
        return Err(BackendError::invalid(format!(
            "matmul: expected 2 inputs and 1 output, got {} and {}",
            inputs.len(),
            outputs.len()
        )));
    };
    if !domain::contains(Op::Matmul.kind(), a.dtype) {
        return Err(unsupported(op, a.dtype));
    }
    let mnk = checks::matmul_widened(op, a, b, y)?;
    match (a.dtype, y.dtype) {
        (DType::F16, DType::F32) => batched::<f16, f32>(a, b, y, mnk, widened::<f16>),
        (DType::BF16, DType::F32) => batched::<bf16, f32>(a, b, y, mnk, widened::<bf16>),
        _ => with_dtype!(a.dtype, T => batched::<T, T>(a, b, y, mnk, T::matmul)),
    }
    Ok(())
}

/// One `(m, k) x (k, n)` product into `y` (overwritten), with the safety contract of
/// [`MatElem::matmul`].
type Product<T, Y> = unsafe fn(usize, usize, usize, Mat<T>, Mat<T>, Mat<Y>, Parallelism);

/// `y = a · b` for f16/bf16 `a` and `b` into an f32 `y` (the widened form): both widened,
/// the f32 `gemm` writing `y` directly, no rounding to `T`.
///
/// # Safety
/// As for [`MatElem::matmul`].
unsafe fn widened<T: Element<Compute = f32>>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<T>,
    b: Mat<T>,
    y: Mat<f32>,
    par: Parallelism,
) {
    let (mut wa, mut wb) = (widen(m, k, a), widen(k, n, b));
    native((m, n, k), dense(&mut wa, k), dense(&mut wb, n), y, (1.0, 0.0), false, par);
}

fn batched<T: Element, Y: Element>(a: &View, b: &View, y: &View, [m, k, n]: [usize; 3], product: Product<T, Y>) {
    let r = a.shape.len();
    let batch_shape = &y.shape[..r - 2];
    let batches: usize = batch_shape.iter().product();
    if batches == 0 || m == 0 || n == 0 {
        return;
    }
    let (ma, mb, my) = (Mat::<T>::of(a), Mat::<T>::of(b), Mat::<Y>::of(y));
    // Batch offsets of the three operands in row-major batch order.
    let offsets = |v: &View| genesis_backend_api::sdk::offsets(batch_shape, &v.strides[..r - 2]).collect::<Vec<_>>();
    let (oa, ob, oy) = (offsets(a), offsets(b), offsets(y));
    fn shift<E>(mt: Mat<E>, o: isize) -> Mat<E> {
        Mat { ptr: SyncPtr(mt.ptr.get().wrapping_offset(o)), ..mt }
    }
    let work = m.saturating_mul(n).saturating_mul(k);
    let one = |i: usize, par: Parallelism| {
        let yi = shift(my, oy[i]);
        // SAFETY: views are bounds-checked and `y` is disjoint from `a` and `b` (checked by
        // the device); each batch writes its own matrix of `y` (checked non-overlapping
        // before batches run in parallel).
        unsafe {
            if k == 0 {
                // The empty sum: zeros, without asking `gemm` about a degenerate depth.
                for r in 0..m {
                    for c in 0..n {
                        *yi.at(r, c) = Y::store(Y::Compute::ZERO);
                    }
                }
            } else {
                product(m, n, k, shift(ma, oa[i]), shift(mb, ob[i]), yi, par);
            }
        }
    };
    // `gemm`'s threads write disjoint positions of `y`, which must then be disjoint memory.
    if work > GEMM_PARALLEL && y.is_non_overlapping() {
        let threads = rayon::current_num_threads();
        (0..batches).for_each(|i| one(i, Parallelism::Rayon(threads)));
    } else {
        // Small products: one per task when there are several and they cannot collide.
        let parallel = batches > 1 && batches.saturating_mul(work) > GEMM_PARALLEL && y.is_non_overlapping();
        map_tasks(batches, parallel, |i| one(i, Parallelism::None));
    }
}

/// `Addmm`, `y += a · b`: f32 and f64 through their `gemm` reading `y`; f16 and bf16
/// widened to f32 and multiplied by the f32 `gemm`, which reads `y` in place when it is f32,
/// or a widened copy that is rounded once into `y` otherwise.
fn addmm(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    let (([a, b], [y]), [m, k, n]) = checks::addmm(op, inputs, outputs)?;
    if m == 0 || n == 0 || k == 0 {
        return Ok(());
    }
    let par = if m.saturating_mul(n).saturating_mul(k) > GEMM_PARALLEL {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    };
    let mkn = (m, n, k);
    // SAFETY: the views are bounds-checked by the device, `y` overlaps neither input (checked
    // by the device) nor itself (checked above), and `k > 0`.
    unsafe {
        match a.dtype {
            DType::F64 => native(mkn, Mat::<f64>::of(a), Mat::of(b), Mat::of(y), (1.0, 0.0), true, par),
            DType::F32 => native(mkn, Mat::<f32>::of(a), Mat::of(b), Mat::of(y), (1.0, 0.0), true, par),
            DType::F16 => addmm_widened::<f16>(mkn, a, b, y, par),
            DType::BF16 => addmm_widened::<bf16>(mkn, a, b, y, par),
            other => return Err(unsupported(op, other)),
        }
    }
    Ok(())
}

/// `y += a · b` for f16/bf16 `a` and `b` through the f32 `gemm`; `y` is f32 or `T`.
unsafe fn addmm_widened<T: Element<Compute = f32>>(
    (m, n, k): (usize, usize, usize),
    a: &View,
    b: &View,
    y: &View,
    par: Parallelism,
) {
    let (mut wa, mut wb) = (widen::<T>(m, k, Mat::of(a)), widen::<T>(k, n, Mat::of(b)));
    let (ma, mb) = (dense(&mut wa, k), dense(&mut wb, n));
    if y.dtype == DType::F32 {
        native((m, n, k), ma, mb, Mat::of(y), (1.0, 0.0), true, par);
    } else {
        let mut wy = widen::<T>(m, n, Mat::of(y));
        native((m, n, k), ma, mb, dense(&mut wy, n), (1.0, 0.0), true, par);
        round_into::<T>(&wy, m, n, Mat::of(y));
    }
}

inventory::submit! { Kernel { claims, run } }
