//! Batch normalization of `(n, c, s)` with the batch's statistics, and its backward op.
//!
//! Per-channel sums run over the batch and spatial dims in a fixed order, in the compute type
//! (f32 for f16/bf16, f64 for f64), so they are reproducible bit for bit; the statistics and
//! the parameter gradients are f32, as the interface asks.

use super::fused::{dense, min_rows, with_float, Dense, Float, Real, C};
use super::{unsupported, Kernel, View};
use crate::element::Arith;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{DType, Op, OpKind, Result};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::BatchNorm { eps: 0.0 }, Op::BatchNormBackward])
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match *op {
        Op::BatchNorm { eps } => {
            let ([x, w, b], [y, mean, rstd]) = checks::batch_norm(op, eps, inputs, outputs)?;
            with_float!(op, x.dtype, T => forward::<T>(op, eps, [x, w, b], [y, mean, rstd]))
        }
        Op::BatchNormBackward => {
            let ([dy, x, w, mean, rstd], [dx, dw, db]) = checks::batch_norm_backward(op, inputs, outputs)?;
            with_float!(op, x.dtype, T => backward::<T>(op, [dy, x, w, mean, rstd], [dx, dw, db]))
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
}

/// `f(ch)` for every channel, in parallel.
fn per_channel<R: Send>(c: usize, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    (0..c).into_par_iter().map(f).collect()
}

/// The `n` runs of `s` values of channel `ch` in a dense `(n, c, s)` slice.
fn runs<X>(data: &[X], [n, c, s]: [usize; 3], ch: usize) -> impl Iterator<Item = &[X]> {
    (0..n).map(move |i| &data[(i * c + ch) * s..][..s])
}

fn store_f32(op: &Op, v: &View, values: impl Iterator<Item = f32>) -> Result<()> {
    let mut out = Dense::<f32>::output(op, v)?;
    for (o, x) in out.slice().iter_mut().zip(values) {
        *o = x;
    }
    out.finish();
    Ok(())
}

fn forward<T: Float>(op: &Op, eps: f64, [x, w, b]: [&View; 3], [y, mean, rstd]: [&View; 3]) -> Result<()> {
    let (xs, ws, bs) = (dense::<T>(op, x)?, dense::<f32>(op, w)?, dense::<f32>(op, b)?);
    let shape = [x.shape[0], x.shape[1], x.shape[2]];
    let [n, c, s] = shape;
    let m = C::<T>::from_f64((n * s) as f64);
    let eps = C::<T>::from_f64(eps);
    // Two passes: the variance from deviations, never from E[x²] - E[x]², which cancels
    // catastrophically when |mean| >> std. No values: NaN statistics, as in PyTorch.
    let stats: Vec<(C<T>, C<T>)> = per_channel(c, |ch| {
        let mu = runs(&xs, shape, ch).flat_map(|r| r.iter().map(|v| v.compute())).sum::<C<T>>() / m;
        let var = runs(&xs, shape, ch)
            .flat_map(|r| {
                r.iter().map(move |v| {
                    let d = v.compute() - mu;
                    d * d
                })
            })
            .sum::<C<T>>()
            / m;
        (mu, C::<T>::ONE / (var + eps).sqrt())
    });
    let mut ys = Dense::<T>::output(op, y)?;
    if s > 0 {
        ys.slice().par_chunks_mut(s).zip(xs.par_chunks(s)).enumerate().with_min_len(min_rows(s)).for_each(
            |(row, (yr, xr))| {
                let ch = row % c;
                let (mu, r) = stats[ch];
                let scale = r * C::<T>::from_f32(ws[ch]);
                let shift = C::<T>::from_f32(bs[ch]);
                for (o, v) in yr.iter_mut().zip(xr) {
                    *o = T::store((v.compute() - mu) * scale + shift);
                }
            },
        );
    }
    ys.finish();
    store_f32(op, mean, stats.iter().map(|st| st.0.to_f32()))?;
    store_f32(op, rstd, stats.iter().map(|st| st.1.to_f32()))
}

fn backward<T: Float>(op: &Op, [dy, x, w, mean, rstd]: [&View; 5], [dx, dw, db]: [&View; 3]) -> Result<()> {
    let (dys, xs, ws) = (dense::<T>(op, dy)?, dense::<T>(op, x)?, dense::<f32>(op, w)?);
    let (means, rstds) = (dense::<f32>(op, mean)?, dense::<f32>(op, rstd)?);
    let shape = [x.shape[0], x.shape[1], x.shape[2]];
    let [n, c, s] = shape;
    let m = C::<T>::from_f64((n * s) as f64);
    // Per channel: dbias = Σ dy, dweight = Σ dy · x̂.
    let sums: Vec<(C<T>, C<T>)> = per_channel(c, |ch| {
        let (mu, r) = (C::<T>::from_f32(means[ch]), C::<T>::from_f32(rstds[ch]));
        let (mut sum_dy, mut sum_dyx) = (C::<T>::ZERO, C::<T>::ZERO);
        for (dr, xr) in runs(&dys, shape, ch).zip(runs(&xs, shape, ch)) {
            for (g, v) in dr.iter().zip(xr) {
                let g = g.compute();
                sum_dy += g;
                sum_dyx += g * (v.compute() - mu) * r;
            }
        }
        (sum_dy, sum_dyx)
    });
    let mut dxs = Dense::<T>::output(op, dx)?;
    if s > 0 {
        dxs.slice()
            .par_chunks_mut(s)
            .zip(dys.par_chunks(s).zip(xs.par_chunks(s)))
            .enumerate()
            .with_min_len(min_rows(s))
            .for_each(|(row, (dxr, (dr, xr)))| {
                let ch = row % c;
                let (mu, r) = (C::<T>::from_f32(means[ch]), C::<T>::from_f32(rstds[ch]));
                let (mean_dy, mean_dyx) = (sums[ch].0 / m, sums[ch].1 / m);
                let k = C::<T>::from_f32(ws[ch]) * r;
                for ((o, g), v) in dxr.iter_mut().zip(dr).zip(xr) {
                    let xhat = (v.compute() - mu) * r;
                    *o = T::store(k * (g.compute() - mean_dy - xhat * mean_dyx));
                }
            });
    }
    dxs.finish();
    store_f32(op, dw, sums.iter().map(|st| st.1.to_f32()))?;
    store_f32(op, db, sums.iter().map(|st| st.0.to_f32()))
}

inventory::submit! { Kernel { claims, run } }
