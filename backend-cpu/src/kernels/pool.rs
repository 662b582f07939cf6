//! 2-D max and average pooling and their backward ops, one (batch, channel) plane per task.

use super::fused::{dense, with_float, Dense, Float, Real, C, PAR_MIN_ELEMS};
use super::{unsupported, Kernel, View};
use crate::element::Arith;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::sdk::window::{Axis, Pool2d as Geom};
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, Window2d};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    let window = Window2d::default();
    domain::claims(&[
        Op::MaxPool2d { window },
        Op::MaxPool2dBackward { window },
        Op::AvgPool2d { window },
        Op::AvgPool2dBackward { window },
    ])
}

/// Planes per parallel task.
fn min_planes(g: &Geom) -> usize {
    let work = g.plane_out() * g.rows.kernel * g.cols.kernel + g.plane_in();
    (PAR_MIN_ELEMS / work.max(1)).max(1)
}

/// Compute the `n·c` planes of `output` in parallel, `f(plane, its input, its output)`: the
/// input read densely in planes of `in_len` elements, the output written in planes of
/// `out_len`.
fn per_plane<T: Float>(
    op: &Op,
    g: &Geom,
    (input, in_len): (&View, usize),
    (output, out_len): (&View, usize),
    f: impl Fn(usize, &[T], &mut [T]) + Sync,
) -> Result<()> {
    let xs = dense::<T>(op, input)?;
    let mut ys = Dense::<T>::output(op, output)?;
    if out_len > 0 {
        ys.slice()
            .par_chunks_mut(out_len)
            .enumerate()
            .with_min_len(min_planes(g))
            .for_each(|(p, y_p)| f(p, &xs[p * in_len..][..in_len], y_p));
    }
    ys.finish();
    Ok(())
}

/// `f(iy * w + ix)` for every tap of output position `(oy, ox)` that falls inside the input
/// plane, in row-major tap order.
#[inline(always)]
fn for_taps(g: &Geom, oy: usize, ox: usize, mut f: impl FnMut(usize)) {
    for ky in 0..g.rows.kernel {
        let Some(iy) = g.rows.tap(oy, ky) else { continue };
        for kx in 0..g.cols.kernel {
            if let Some(ix) = g.cols.tap(ox, kx) {
                f(iy * g.cols.input + ix);
            }
        }
    }
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match *op {
        Op::MaxPool2d { window } => {
            let (g, [x, y, idx]) = Geom::max(op, &window, inputs, outputs)?;
            with_float!(op, x.dtype, T => max_pool::<T>(op, &g, x, y, idx))
        }
        Op::MaxPool2dBackward { window } => {
            let (g, [dy, idx, dx]) = Geom::max_backward(op, &window, inputs, outputs)?;
            with_float!(op, dy.dtype, T => max_pool_backward::<T>(op, &g, dy, idx, dx))
        }
        Op::AvgPool2d { window } => {
            let (g, [x, y]) = Geom::avg(op, &window, inputs, outputs)?;
            with_float!(op, x.dtype, T => avg_pool::<T>(op, &g, x, y))
        }
        Op::AvgPool2dBackward { window } => {
            let (g, [dy, dx]) = Geom::avg_backward(op, &window, inputs, outputs)?;
            with_float!(op, dy.dtype, T => avg_pool_backward::<T>(op, &g, dy, dx))
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
}

fn max_pool<T: Float>(op: &Op, g: &Geom, x: &View, y: &View, idx: &View) -> Result<()> {
    let xs = dense::<T>(op, x)?;
    let (mut ys, mut idxs) = (Dense::<T>::output(op, y)?, Dense::<i64>::output(op, idx)?);
    let (pin, pout) = (g.plane_in(), g.plane_out());
    if pout > 0 {
        ys.slice()
            .par_chunks_mut(pout)
            .zip(idxs.slice().par_chunks_mut(pout))
            .enumerate()
            .with_min_len(min_planes(g))
            .for_each(|(p, (y_p, i_p))| {
                let x_p = &xs[p * pin..][..pin];
                for oy in 0..g.rows.output {
                    for ox in 0..g.cols.output {
                        // PyTorch's rule: the index starts at the first in-bounds tap and the
                        // value at -inf (so an all -inf window still points into the plane); a
                        // strictly larger value replaces it (the first of equal maxima wins),
                        // and so does the first NaN, after which nothing does.
                        let (mut best, mut at) = (C::<T>::NEG_INFINITY, None);
                        for_taps(g, oy, ox, |pos| {
                            let v = x_p[pos].compute();
                            if at.is_none() {
                                at = Some(pos);
                            }
                            if !best.is_nan() && (v > best || v.is_nan()) {
                                best = v;
                                at = Some(pos);
                            }
                        });
                        // `geometry` refused windows without an in-bounds tap, so `at` is set.
                        y_p[oy * g.cols.output + ox] = T::store(best);
                        i_p[oy * g.cols.output + ox] = at.map_or(-1, |a| a as i64);
                    }
                }
            });
    }
    ys.finish();
    idxs.finish();
    Ok(())
}

fn max_pool_backward<T: Float>(op: &Op, g: &Geom, dy: &View, idx: &View, dx: &View) -> Result<()> {
    let idxs = dense::<i64>(op, idx)?;
    let (pin, pout) = (g.plane_in(), g.plane_out());
    if let Some((at, &bad)) = idxs.iter().enumerate().find(|(_, &i)| i < 0 || i as u64 >= pin as u64) {
        return Err(BackendError::invalid(format!(
            "{}: argmax {bad} at flat position {at} is outside the {}x{} input plane",
            op.name(),
            g.rows.input,
            g.cols.input
        )));
    }
    per_plane(op, g, (dy, pout), (dx, pin), |p, dy_p, dx_p: &mut [T]| {
        // Accumulate in the compute type: overlapping windows can pick one input many times.
        let mut acc = vec![C::<T>::ZERO; pin];
        for (&i, d) in idxs[p * pout..][..pout].iter().zip(dy_p) {
            acc[i as usize] += d.compute();
        }
        for (o, a) in dx_p.iter_mut().zip(acc) {
            *o = T::store(a);
        }
    })
}

/// The divisor of a window with padding counted in (`count_include_pad`): its extent clipped
/// to the padded input, as in PyTorch. With floor-mode output sizes no window leaves the padded
/// input, so this is the kernel area; the clipping keeps the formula honest anyway.
fn divisor(axis: &Axis, o: usize) -> usize {
    let start = o.saturating_mul(axis.stride as usize);
    let end = start.saturating_add(axis.kernel).min(axis.input.saturating_add((axis.pad as usize).saturating_mul(2)));
    end.saturating_sub(start)
}

fn avg_pool<T: Float>(op: &Op, g: &Geom, x: &View, y: &View) -> Result<()> {
    let (rows_div, cols_div) = divisors(g);
    per_plane(op, g, (x, g.plane_in()), (y, g.plane_out()), |_, x_p: &[T], y_p| {
        for oy in 0..g.rows.output {
            for ox in 0..g.cols.output {
                let mut s = C::<T>::ZERO;
                for_taps(g, oy, ox, |pos| s += x_p[pos].compute());
                let div = C::<T>::from_f64((rows_div[oy] * cols_div[ox]) as f64);
                y_p[oy * g.cols.output + ox] = T::store(s / div);
            }
        }
    })
}

fn divisors(g: &Geom) -> (Vec<usize>, Vec<usize>) {
    let per_axis = |a: &Axis| (0..a.output).map(|o| divisor(a, o)).collect();
    (per_axis(&g.rows), per_axis(&g.cols))
}

fn avg_pool_backward<T: Float>(op: &Op, g: &Geom, dy: &View, dx: &View) -> Result<()> {
    let (pin, pout) = (g.plane_in(), g.plane_out());
    let (rows_div, cols_div) = divisors(g);
    per_plane(op, g, (dy, pout), (dx, pin), |_, dy_p: &[T], dx_p| {
        let mut acc = vec![C::<T>::ZERO; pin];
        for oy in 0..g.rows.output {
            for ox in 0..g.cols.output {
                let div = C::<T>::from_f64((rows_div[oy] * cols_div[ox]) as f64);
                let share = dy_p[oy * g.cols.output + ox].compute() / div;
                for_taps(g, oy, ox, |pos| acc[pos] += share);
            }
        }
        for (o, a) in dx_p.iter_mut().zip(acc) {
            *o = T::store(a);
        }
    })
}

inventory::submit! { Kernel { claims, run } }
