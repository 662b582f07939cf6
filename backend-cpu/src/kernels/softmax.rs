//! Softmax and log-softmax over the last dim, and their backward ops.

use super::fused::{dense, lane_max, lane_sum, min_rows, rows_of, with_float, Dense, Float, Real, C};
use super::{unsupported, Kernel, View};
use crate::element::Arith;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{DType, Op, OpKind, Result};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::Softmax, Op::LogSoftmax, Op::SoftmaxBackward, Op::LogSoftmaxBackward])
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match op {
        Op::Softmax | Op::LogSoftmax => {
            let ([x], [y]) = checks::softmax(op, inputs, outputs)?;
            let log = matches!(op, Op::LogSoftmax);
            with_float!(op, x.dtype, T => forward::<T>(op, x, y, log))
        }
        Op::SoftmaxBackward | Op::LogSoftmaxBackward => {
            let ([y, dy], [dx]) = checks::softmax_backward(op, inputs, outputs)?;
            let log = matches!(op, Op::LogSoftmaxBackward);
            with_float!(op, y.dtype, T => backward::<T>(op, y, dy, dx, log))
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
}

fn forward<T: Float>(op: &Op, x: &View, y: &View, log: bool) -> Result<()> {
    let xs = dense::<T>(op, x)?;
    let mut out = Dense::<T>::output(op, y)?;
    let (_, d) = rows_of(&x.shape);
    if d > 0 {
        // The exponentials go to a per-task scratch row (f16/bf16 outputs cannot hold them
        // exactly), so each is computed once.
        out.slice().par_chunks_mut(d).zip(xs.par_chunks(d)).with_min_len(min_rows(d)).for_each_init(
            || vec![C::<T>::ZERO; d],
            |e, (yr, xr)| {
                // Separate passes over the scratch row, each a loop the compiler vectorizes
                // (one fused loop with a running sum cannot be: float addition is ordered).
                for (ej, v) in e.iter_mut().zip(xr) {
                    *ej = v.compute();
                }
                let m = lane_max(e);
                for ej in e.iter_mut() {
                    *ej = (*ej - m).exp();
                }
                let sum = lane_sum(e);
                if log {
                    // (x - m) - ln(sum) rather than x - (m + ln(sum)): the first difference is
                    // exact for the largest entries, which are the ones that matter.
                    let ls = sum.ln();
                    for (o, v) in yr.iter_mut().zip(xr) {
                        *o = T::store(v.compute() - m - ls);
                    }
                } else {
                    for (o, &ej) in yr.iter_mut().zip(e.iter()) {
                        *o = T::store(ej / sum);
                    }
                }
            },
        );
    }
    out.finish();
    Ok(())
}

fn backward<T: Float>(op: &Op, y: &View, dy: &View, dx: &View, log: bool) -> Result<()> {
    let (ys, dys) = (dense::<T>(op, y)?, dense::<T>(op, dy)?);
    let mut out = Dense::<T>::output(op, dx)?;
    let (_, d) = rows_of(&y.shape);
    if d > 0 {
        out.slice().par_chunks_mut(d).zip(ys.par_chunks(d).zip(dys.par_chunks(d))).with_min_len(min_rows(d)).for_each(
            |(dxr, (yr, dyr))| {
                if log {
                    // dx = dy - softmax * sum(dy), softmax = exp(log-softmax).
                    let s: C<T> = dyr.iter().map(|g| g.compute()).sum();
                    for ((o, yv), g) in dxr.iter_mut().zip(yr).zip(dyr) {
                        *o = T::store(g.compute() - yv.compute().exp() * s);
                    }
                } else {
                    // dx = y * (dy - <dy, y>).
                    let s: C<T> = yr.iter().zip(dyr).map(|(yv, g)| yv.compute() * g.compute()).sum();
                    for ((o, yv), g) in dxr.iter_mut().zip(yr).zip(dyr) {
                        *o = T::store(yv.compute() * (g.compute() - s));
                    }
                }
            },
        );
    }
    out.finish();
    Ok(())
}

inventory::submit! { Kernel { claims, run } }
