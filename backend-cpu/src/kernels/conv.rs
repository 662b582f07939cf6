//! 2-D convolution (stride, zero padding, dilation, groups) and its two backward ops, by
//! im2col and the `gemm` crate.
//!
//! Every dtype runs the matrix products in its compute type: f32 for f16 and bf16 (their
//! im2col buffers are widened while being gathered, so this costs nothing extra, and it is
//! what keeps the accumulation in f32), f64 for f64. The geometry and operand checks are the
//! SDK's `sdk::window::Conv2d`, shared with the other backends.

use super::fused::{dense, with_float, Dense, Float, Real, C, PAR_MIN_ELEMS};
use super::{unsupported, Kernel, View};
use crate::element::Arith;
use gemm::Parallelism;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::sdk::window::Conv2d as Geom;
use genesis_backend_api::{DType, Op, OpKind, Result, Window2d};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    let (window, groups) = (Window2d::default(), 1);
    domain::claims(&[
        Op::Conv2d { window, groups },
        Op::Conv2dBackwardInput { window, groups },
        Op::Conv2dBackwardWeight { window, groups },
    ])
}

/// Work of one batch element, to decide how to parallelize.
fn work(g: &Geom) -> usize {
    g.o.max(1) * g.ck().max(1) * g.l().max(1)
}

/// Let gemm split each product over the pool when the batch alone cannot fill it.
fn inner_parallelism(g: &Geom, tasks: usize) -> Parallelism {
    if tasks < rayon::current_num_threads() && work(g) >= PAR_MIN_ELEMS {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match *op {
        Op::Conv2d { window, groups } => {
            let (g, ([x, w, y], bias)) = Geom::forward(op, &window, groups, inputs, outputs)?;
            with_float!(op, x.dtype, T => forward::<T>(op, &g, x, w, bias, y))
        }
        Op::Conv2dBackwardInput { window, groups } => {
            let (g, [dy, w, dx]) = Geom::backward_input(op, &window, groups, inputs, outputs)?;
            with_float!(op, dy.dtype, T => backward_input::<T>(op, &g, dy, w, dx))
        }
        Op::Conv2dBackwardWeight { window, groups } => {
            let (g, ([dy, x, dw], db)) = Geom::backward_weight(op, &window, groups, inputs, outputs)?;
            with_float!(op, dy.dtype, T => backward_weight::<T>(op, &g, dy, x, dw, db))
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
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
        let plane = &x_n[(grp * cg + ci) * g.plane_in()..][..g.plane_in()];
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
        let plane = &mut dx_n[(grp * cg + ci) * g.plane_in()..][..g.plane_in()];
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
    (PAR_MIN_ELEMS / work(g)).max(1)
}

fn forward<T: Float>(op: &Op, g: &Geom, x: &View, w: &View, bias: Option<&View>, y: &View) -> Result<()> {
    let xs = dense::<T>(op, x)?;
    let ws: Vec<C<T>> = dense::<T>(op, w)?.iter().map(|v| v.compute()).collect();
    let bs: Option<Vec<C<T>>> = match bias {
        Some(b) => Some(dense::<T>(op, b)?.iter().map(|v| v.compute()).collect()),
        None => None,
    };
    let mut ys = Dense::<T>::output(op, y)?;
    let (og, ck, l, x_len) = (g.og(), g.ck(), g.l(), g.c * g.plane_in());
    let par = inner_parallelism(g, g.n);
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
    let (og, ck, l, x_len) = (g.og(), g.ck(), g.l(), g.c * g.plane_in());
    let par = inner_parallelism(g, g.n);
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
    let (og, ck, l, x_len) = (g.og(), g.ck(), g.l(), g.c * g.plane_in());
    // The batch is summed in at most 8 fixed blocks (each with its own dW buffer), added in
    // block order: reproducible, and the extra memory stays at 8 weight-sized buffers.
    let per_block = g.n.div_ceil(8).max(1);
    let blocks = g.n.div_ceil(per_block);
    let par = inner_parallelism(g, blocks);
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
