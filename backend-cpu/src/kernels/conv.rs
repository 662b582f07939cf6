//! 2-D convolution (stride, zero padding, dilation, groups) and its two backward ops, by
//! im2col and the `gemm` crate.
//!
//! Every dtype runs the matrix products in its compute type: f32 for f16 and bf16 (their
//! im2col buffers are widened while being gathered, so this costs nothing extra, and it is
//! what keeps the accumulation in f32), f64 for f64. The window geometry is the SDK's
//! [`Axis`], shared with pooling and the other backends.

use super::softmax::{
    dense, dims, expect_dtype, expect_shape, float_claims, with_float, Dense, Float, Real, C, PAR_MIN_ELEMS,
};
use super::{unsupported, Kernel, View};
use crate::element::Arith;
use gemm::Parallelism;
use genesis_backend_api::sdk::window::Axis;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, Window2d};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    let (window, groups) = (Window2d::default(), 1);
    float_claims(&[
        Op::Conv2d { window, groups },
        Op::Conv2dBackwardInput { window, groups },
        Op::Conv2dBackwardWeight { window, groups },
    ])
}

/// The geometry of one convolution.
#[derive(Debug, Clone, Copy)]
struct Geom {
    n: usize,
    c: usize,
    o: usize,
    groups: usize,
    rows: Axis,
    cols: Axis,
}

impl Geom {
    /// Channels per group in x and in y.
    fn cg(&self) -> usize {
        self.c / self.groups
    }
    fn og(&self) -> usize {
        self.o / self.groups
    }
    /// Rows of the im2col matrix of one group: (channel, kernel row, kernel column).
    fn ck(&self) -> usize {
        self.cg() * self.rows.kernel * self.cols.kernel
    }
    /// Output positions per plane.
    fn l(&self) -> usize {
        self.rows.output * self.cols.output
    }
    fn plane(&self) -> usize {
        self.rows.input * self.cols.input
    }
    fn y_shape(&self) -> [usize; 4] {
        [self.n, self.o, self.rows.output, self.cols.output]
    }
    /// Work of one batch element, to decide how to parallelize.
    fn work(&self) -> usize {
        self.o.max(1) * self.ck().max(1) * self.l().max(1)
    }
    /// Let gemm split each product over the pool when the batch alone cannot fill it.
    fn inner_parallelism(&self, tasks: usize) -> Parallelism {
        if tasks < rayon::current_num_threads() && self.work() >= PAR_MIN_ELEMS {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        }
    }
}

/// Validate the window and channels; `x` is (n, c, h, w) and `w` is (o, c/groups, kh, kw),
/// whichever operands carry them for the op at hand.
fn geometry(op: &Op, window: &Window2d, groups: u32, x: &View, w: &View) -> Result<Geom> {
    let [n, c, h, wd] = dims::<4>(op, "x (n, c, h, w)", x)?;
    let [o, cg, kh, kw] = dims::<4>(op, "weight (o, c/groups, kh, kw)", w)?;
    let groups = groups as usize;
    if groups == 0 || c % groups != 0 || o % groups != 0 {
        return Err(BackendError::invalid(format!(
            "{}: groups ({groups}) must be >= 1 and divide the input channels ({c}) and the output channels ({o})",
            op.name()
        )));
    }
    if cg * groups != c {
        return Err(BackendError::shape(format!(
            "{}: weight {:?} has {cg} input channels per group, expected {} (x {:?}, groups {groups})",
            op.name(),
            w.shape,
            c / groups,
            x.shape
        )));
    }
    let to_i64 = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
    let rows = Axis::new(op, "height", h, to_i64(kh), window.stride[0], window.padding[0], window.dilation[0])?;
    let cols = Axis::new(op, "width", wd, to_i64(kw), window.stride[1], window.padding[1], window.dilation[1])?;
    Ok(Geom { n, c, o, groups, rows, cols })
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match *op {
        Op::Conv2d { window, groups } => {
            let (x, w, bias, y) = match (inputs, outputs) {
                ([x, w], [y]) => (x, w, None, y),
                ([x, w, b], [y]) => (x, w, Some(b), y),
                _ => return Err(arity(op, "2 or 3 inputs (x, weight[, bias]) and 1 output")),
            };
            let g = geometry(op, &window, groups, x, w)?;
            expect_dtype(op, "weight", w, x.dtype)?;
            expect_shape(op, "y", y, &g.y_shape())?;
            expect_dtype(op, "y", y, x.dtype)?;
            if let Some(b) = bias {
                expect_shape(op, "bias", b, &[g.o])?;
                expect_dtype(op, "bias", b, x.dtype)?;
            }
            with_float!(op, x.dtype, T => forward::<T>(op, &g, x, w, bias, y))
        }
        Op::Conv2dBackwardInput { window, groups } => {
            let ([dy, w], [dx]) = match (inputs, outputs) {
                ([dy, w], [dx]) => ([dy, w], [dx]),
                _ => return Err(arity(op, "2 inputs (dy, weight) and 1 output (dx)")),
            };
            let g = geometry(op, &window, groups, dx, w)?;
            expect_shape(op, "dy", dy, &g.y_shape())?;
            for (name, t) in [("weight", w), ("dx", dx)] {
                expect_dtype(op, name, t, dy.dtype)?;
            }
            with_float!(op, dy.dtype, T => backward_input::<T>(op, &g, dy, w, dx))
        }
        Op::Conv2dBackwardWeight { window, groups } => {
            let (dy, x, dw, db) = match (inputs, outputs) {
                ([dy, x], [dw]) => (dy, x, dw, None),
                ([dy, x], [dw, db]) => (dy, x, dw, Some(db)),
                _ => return Err(arity(op, "2 inputs (dy, x) and 1 or 2 outputs (dweight[, dbias])")),
            };
            let g = geometry(op, &window, groups, x, dw)?;
            expect_shape(op, "dy", dy, &g.y_shape())?;
            for (name, t) in [("x", x), ("dweight", dw)] {
                expect_dtype(op, name, t, dy.dtype)?;
            }
            if let Some(db) = db {
                expect_shape(op, "dbias", db, &[g.o])?;
                expect_dtype(op, "dbias", db, dy.dtype)?;
            }
            with_float!(op, dy.dtype, T => backward_weight::<T>(op, &g, dy, x, dw, db))
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
}

fn arity(op: &Op, expected: &str) -> BackendError {
    BackendError::invalid(format!("{}: expected {expected}", op.name()))
}

/// A strided matrix: data, row stride, column stride (elements).
type Mat<'a, R> = (&'a [R], usize, usize);

/// `dst = lhs · rhs` (`m×k` times `k×n`), or `dst += lhs · rhs` with `accumulate`; `dst` is
/// row-major with row stride `dst_rs`.
fn matmul<R: Real>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [R],
    dst_rs: usize,
    accumulate: bool,
    lhs: Mat<'_, R>,
    rhs: Mat<'_, R>,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * dst_rs..][..n].fill(R::ZERO);
            }
        }
        return;
    }
    // Internal invariants (the callers size every buffer from one `Geom`); they guard the
    // raw-pointer call below, so they are checked in release builds too.
    let last = |rs: usize, cs: usize, rows: usize, cols: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(last(dst_rs, 1, m, n) < dst.len(), "conv: gemm destination out of bounds");
    assert!(last(lhs.1, lhs.2, m, k) < lhs.0.len(), "conv: gemm lhs out of bounds");
    assert!(last(rhs.1, rhs.2, k, n) < rhs.0.len(), "conv: gemm rhs out of bounds");
    // SAFETY: every index gemm touches is in bounds (asserted above); `R` is f32 or f64, the
    // types gemm implements; dst does not alias lhs or rhs (distinct borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.0.as_ptr(),
            lhs.2 as isize,
            lhs.1 as isize,
            rhs.0.as_ptr(),
            rhs.2 as isize,
            rhs.1 as isize,
            R::ONE,
            R::ONE,
            false,
            false,
            false,
            par,
        );
    }
}

/// Gather group `grp` of one batch element's input `x_n` (c, h, w) into `cols` (ck × l):
/// row (ci, ky, kx), column (oy, ox) holds the input under that tap, 0 in the padding.
fn im2col<T: Float>(g: &Geom, grp: usize, x_n: &[T], cols: &mut [C<T>]) {
    let (cg, kh, kw, l, ow) = (g.cg(), g.rows.kernel, g.cols.kernel, g.l(), g.cols.output);
    for ci in 0..cg {
        let plane = &x_n[(grp * cg + ci) * g.plane()..][..g.plane()];
        for ky in 0..kh {
            for kx in 0..kw {
                let row = &mut cols[((ci * kh + ky) * kw + kx) * l..][..l];
                for oy in 0..g.rows.output {
                    let out = &mut row[oy * ow..][..ow];
                    match g.rows.tap(oy, ky) {
                        None => out.fill(C::<T>::ZERO),
                        Some(iy) => {
                            let line = &plane[iy * g.cols.input..][..g.cols.input];
                            for (ox, o) in out.iter_mut().enumerate() {
                                *o = g.cols.tap(ox, kx).map_or(C::<T>::ZERO, |ix| line[ix].compute());
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: add `cols` back into group `grp` of `dx_n` (c, h, w).
fn col2im<R: Real>(g: &Geom, grp: usize, cols: &[R], dx_n: &mut [R]) {
    let (cg, kh, kw, l, ow) = (g.cg(), g.rows.kernel, g.cols.kernel, g.l(), g.cols.output);
    for ci in 0..cg {
        let plane = &mut dx_n[(grp * cg + ci) * g.plane()..][..g.plane()];
        for ky in 0..kh {
            for kx in 0..kw {
                let row = &cols[((ci * kh + ky) * kw + kx) * l..][..l];
                for oy in 0..g.rows.output {
                    let Some(iy) = g.rows.tap(oy, ky) else { continue };
                    let line = &mut plane[iy * g.cols.input..][..g.cols.input];
                    for (ox, &v) in row[oy * ow..][..ow].iter().enumerate() {
                        if let Some(ix) = g.cols.tap(ox, kx) {
                            line[ix] += v;
                        }
                    }
                }
            }
        }
    }
}

/// Batch elements per parallel task.
fn batch_min_len(g: &Geom) -> usize {
    (PAR_MIN_ELEMS / g.work()).max(1)
}

fn forward<T: Float>(op: &Op, g: &Geom, x: &View, w: &View, bias: Option<&View>, y: &View) -> Result<()> {
    let xs = dense::<T>(op, x)?;
    let ws: Vec<C<T>> = dense::<T>(op, w)?.iter().map(|v| v.compute()).collect();
    let bs: Option<Vec<C<T>>> = match bias {
        Some(b) => Some(dense::<T>(op, b)?.iter().map(|v| v.compute()).collect()),
        None => None,
    };
    let mut ys = Dense::<T>::output(op, y)?;
    let (og, ck, l, x_len) = (g.og(), g.ck(), g.l(), g.c * g.plane());
    let par = g.inner_parallelism(g.n);
    if g.o * l > 0 {
        ys.slice().par_chunks_mut(g.o * l).enumerate().with_min_len(batch_min_len(g)).for_each(|(b, y_n)| {
            let x_n = &xs[b * x_len..][..x_len];
            let mut cols = vec![C::<T>::ZERO; ck * l];
            let mut acc = vec![C::<T>::ZERO; g.o * l];
            for grp in 0..g.groups {
                im2col::<T>(g, grp, x_n, &mut cols);
                let w_g = (&ws[grp * og * ck..][..og * ck], ck, 1);
                matmul((og, l, ck), &mut acc[grp * og * l..], l, false, w_g, (&cols, l, 1), par);
            }
            if let Some(bs) = &bs {
                for (row, &bv) in acc.chunks_mut(l).zip(bs) {
                    row.iter_mut().for_each(|v| *v += bv);
                }
            }
            for (o, &a) in y_n.iter_mut().zip(&acc) {
                *o = T::store(a);
            }
        });
    }
    ys.finish();
    Ok(())
}

fn backward_input<T: Float>(op: &Op, g: &Geom, dy: &View, w: &View, dx: &View) -> Result<()> {
    let dys = dense::<T>(op, dy)?;
    let ws: Vec<C<T>> = dense::<T>(op, w)?.iter().map(|v| v.compute()).collect();
    let mut dxs = Dense::<T>::output(op, dx)?;
    let (og, ck, l, x_len) = (g.og(), g.ck(), g.l(), g.c * g.plane());
    let par = g.inner_parallelism(g.n);
    if x_len > 0 {
        dxs.slice().par_chunks_mut(x_len).enumerate().with_min_len(batch_min_len(g)).for_each(|(b, dx_n)| {
            let dy_n: Vec<C<T>> = dys[b * g.o * l..][..g.o * l].iter().map(|v| v.compute()).collect();
            let mut cols = vec![C::<T>::ZERO; ck * l];
            let mut acc = vec![C::<T>::ZERO; x_len];
            for grp in 0..g.groups {
                // cols = W_gᵀ · dy_g: W_g is og × ck row-major, read transposed via strides.
                let w_t = (&ws[grp * og * ck..][..og * ck], 1, ck);
                let dy_g = (&dy_n[grp * og * l..][..og * l], l, 1);
                matmul((ck, l, og), &mut cols, l, false, w_t, dy_g, par);
                col2im(g, grp, &cols, &mut acc);
            }
            for (o, &a) in dx_n.iter_mut().zip(&acc) {
                *o = T::store(a);
            }
        });
    }
    dxs.finish();
    Ok(())
}

fn backward_weight<T: Float>(op: &Op, g: &Geom, dy: &View, x: &View, dw: &View, db: Option<&View>) -> Result<()> {
    let (dys, xs) = (dense::<T>(op, dy)?, dense::<T>(op, x)?);
    let (og, ck, l, x_len) = (g.og(), g.ck(), g.l(), g.c * g.plane());
    // The batch is summed in at most 8 fixed blocks (each with its own dW buffer), added in
    // block order: reproducible, and the extra memory stays at 8 weight-sized buffers.
    let per_block = g.n.div_ceil(8).max(1);
    let blocks = g.n.div_ceil(per_block);
    let par = g.inner_parallelism(blocks);
    let partials: Vec<Vec<C<T>>> = (0..blocks)
        .into_par_iter()
        .map(|blk| {
            let mut acc = vec![C::<T>::ZERO; g.o * ck];
            let mut cols = vec![C::<T>::ZERO; ck * l];
            for b in blk * per_block..g.n.min((blk + 1) * per_block) {
                let x_n = &xs[b * x_len..][..x_len];
                let dy_n: Vec<C<T>> = dys[b * g.o * l..][..g.o * l].iter().map(|v| v.compute()).collect();
                for grp in 0..g.groups {
                    im2col::<T>(g, grp, x_n, &mut cols);
                    // dW_g += dy_g · colsᵀ: cols is ck × l row-major, read transposed.
                    let dy_g = (&dy_n[grp * og * l..][..og * l], l, 1);
                    matmul((og, ck, l), &mut acc[grp * og * ck..], ck, true, dy_g, (&cols, 1, l), par);
                }
            }
            acc
        })
        .collect();
    let mut total = vec![C::<T>::ZERO; g.o * ck];
    for p in partials {
        total.iter_mut().zip(p).for_each(|(t, v)| *t += v);
    }
    let mut dws = Dense::<T>::output(op, dw)?;
    for (o, &a) in dws.slice().iter_mut().zip(&total) {
        *o = T::store(a);
    }
    dws.finish();
    if let Some(db) = db {
        let mut dbs = Dense::<T>::output(op, db)?;
        for (oc, out) in dbs.slice().iter_mut().enumerate() {
            let mut s = C::<T>::ZERO;
            for b in 0..g.n {
                s += dys[(b * g.o + oc) * l..][..l].iter().map(|v| v.compute()).sum::<C<T>>();
            }
            *out = T::store(s);
        }
        dbs.finish();
    }
    Ok(())
}

inventory::submit! { Kernel { claims, run } }
