//! LayerNorm and RmsNorm over the last dim, their backward ops, RmsNorm after a residual
//! addition (`AddRmsNorm`), and that followed by a linear layer (`AddRmsNormLinear`).
//!
//! Statistics are computed in the compute type (f32 for f16/bf16, f64 for f64) and saved as
//! f32, as the interface asks. The weight gradients are summed over rows in fixed blocks so
//! that they are reproducible bit for bit (see `rows_per_block`).

use super::fused::{cvt, dense, min_rows, rows_of, rows_per_block, split_mut, with_float, Dense, Float, Real, C};
use super::{unsupported, Kernel, View};
use crate::element::Arith;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{DType, Op, OpKind, Result};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[
        Op::LayerNorm { eps: 0.0 },
        Op::LayerNormBackward,
        Op::RmsNorm { eps: 0.0 },
        Op::RmsNormBackward,
        Op::AddRmsNorm { eps: 0.0 },
        Op::AddRmsNormLinear { eps: 0.0, gated: false },
    ])
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match *op {
        Op::LayerNorm { eps } => {
            let ([x, w, b], [y, mean, rstd]) = checks::layer_norm(op, eps, inputs, outputs)?;
            with_float!(op, x.dtype, T => layer_norm::<T>(op, eps, [x, w, b], [y, mean, rstd]))
        }
        Op::LayerNormBackward => {
            let ([dy, x, w, mean, rstd], [dx, dw, db]) = checks::layer_norm_backward(op, inputs, outputs)?;
            with_float!(op, x.dtype, T => layer_norm_backward::<T>(op, [dy, x, w, mean, rstd], [dx, dw, db]))
        }
        Op::RmsNorm { eps } => {
            let ([x, w], [y, rstd]) = checks::rms_norm(op, eps, inputs, outputs)?;
            with_float!(op, x.dtype, T => rms_norm::<T>(op, eps, [x, w], [y, rstd]))
        }
        Op::AddRmsNorm { eps } => {
            let ([x, residual, w], [y, sum, rstd]) = checks::add_rms_norm_mixed(op, eps, inputs, outputs)?;
            let (ins, outs) = ([x, residual, w], [y, sum, rstd]);
            match residual.dtype {
                // The mixed form: x f32 (checked), the residual and y in a half dtype.
                DType::F16 if x.dtype == DType::F32 => add_rms_norm::<f32, half::f16>(op, eps, ins, outs),
                DType::BF16 if x.dtype == DType::F32 => add_rms_norm::<f32, half::bf16>(op, eps, ins, outs),
                _ => with_float!(op, x.dtype, T => add_rms_norm::<T, T>(op, eps, ins, outs)),
            }
        }
        Op::AddRmsNormLinear { eps, gated } => {
            let ([x, r, g, w], bias, [y, sum]) = checks::add_rms_norm_linear(op, eps, gated, inputs, outputs)?;
            with_float!(op, x.dtype, T => add_rms_norm_linear::<T>(op, eps, gated, [x, r, g, w], bias, [y, sum]))
        }
        Op::RmsNormBackward => {
            let (([dy, x, w, rstd], dsum, [dx, dw]), dx_half) = checks::rms_norm_backward_half_dx(op, inputs, outputs)?;
            let (ins, outs) = ([dy, x, w, rstd], [dx, dw]);
            match dy.dtype {
                // The mixed form: dy (and dx_half) in a half dtype, x and the rest f32 (checked).
                DType::F16 if x.dtype == DType::F32 => {
                    rms_norm_backward::<f32, half::f16>(op, ins, dsum, outs, dx_half)
                }
                DType::BF16 if x.dtype == DType::F32 => {
                    rms_norm_backward::<f32, half::bf16>(op, ins, dsum, outs, dx_half)
                }
                _ => with_float!(op, x.dtype, T => rms_norm_backward::<T, T>(op, ins, dsum, outs, None)),
            }
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
}

/// Sum per-block partial gradients in block order (see `rows_per_block`).
fn sum_blocks<R: Real>(blocks: Vec<Vec<Vec<R>>>, parts: usize, d: usize) -> Vec<Vec<R>> {
    let mut total = vec![vec![R::ZERO; d]; parts];
    for block in blocks {
        for (t, p) in total.iter_mut().zip(block) {
            for (a, b) in t.iter_mut().zip(p) {
                *a += b;
            }
        }
    }
    total
}

/// The row loop of the backward ops: `dx` in blocks of `rows_per_block` rows, in parallel, each
/// block with its own `parts` partial sums of length `d` (the parameter gradients), summed in
/// block order. `row(index, dx row, partial sums)` computes one row and adds to the sums.
fn backward_rows<T: Float>(
    dx: &mut [T],
    (rows, d): (usize, usize),
    parts: usize,
    row: impl Fn(usize, &mut [T], &mut [Vec<C<T>>]) + Sync,
) -> Vec<Vec<C<T>>> {
    if d == 0 || rows == 0 {
        return vec![vec![C::<T>::ZERO; d]; parts];
    }
    let block = rows_per_block(rows, d);
    let partials = dx
        .par_chunks_mut(block * d)
        .enumerate()
        .map(|(bi, dx_block)| {
            let mut sums = vec![vec![C::<T>::ZERO; d]; parts];
            for (k, dxr) in dx_block.chunks_mut(d).enumerate() {
                row(bi * block + k, dxr, &mut sums);
            }
            sums
        })
        .collect();
    sum_blocks(partials, parts, d)
}

fn store_into<T: Float>(op: &Op, v: &View, values: &[C<T>]) -> Result<()> {
    let mut out = Dense::<T>::output(op, v)?;
    for (o, &x) in out.slice().iter_mut().zip(values) {
        *o = T::store(x);
    }
    out.finish();
    Ok(())
}

fn layer_norm<T: Float>(op: &Op, eps: f64, [x, w, b]: [&View; 3], [y, mean, rstd]: [&View; 3]) -> Result<()> {
    let (xs, ws, bs) = (dense::<T>(op, x)?, dense::<T>(op, w)?, dense::<T>(op, b)?);
    let (mut ys, mut means, mut rstds) =
        (Dense::<T>::output(op, y)?, Dense::<f32>::output(op, mean)?, Dense::<f32>::output(op, rstd)?);
    let (_, d) = rows_of(&x.shape);
    let eps = C::<T>::from_f64(eps);
    let n = C::<T>::from_f64(d as f64);
    if d == 0 {
        // The mean and variance of nothing are NaN, as in PyTorch.
        means.slice().fill(f32::NAN);
        rstds.slice().fill(f32::NAN);
    } else {
        ys.slice()
            .par_chunks_mut(d)
            .zip(means.slice().par_iter_mut().zip(rstds.slice().par_iter_mut()))
            .zip(xs.par_chunks(d))
            .with_min_len(min_rows(d))
            .for_each(|((yr, (mu_out, r_out)), xr)| {
                // Two passes: the variance from deviations, never from E[x²] - E[x]², which
                // cancels catastrophically when |mean| >> std.
                let mu = xr.iter().map(|v| v.compute()).sum::<C<T>>() / n;
                let var = xr
                    .iter()
                    .map(|v| {
                        let c = v.compute() - mu;
                        c * c
                    })
                    .sum::<C<T>>()
                    / n;
                let r = C::<T>::ONE / (var + eps).sqrt();
                for (((o, v), wv), bv) in yr.iter_mut().zip(xr).zip(ws.iter()).zip(bs.iter()) {
                    *o = T::store((v.compute() - mu) * r * wv.compute() + bv.compute());
                }
                *mu_out = mu.to_f32();
                *r_out = r.to_f32();
            });
    }
    ys.finish();
    means.finish();
    rstds.finish();
    Ok(())
}

fn layer_norm_backward<T: Float>(op: &Op, [dy, x, w, mean, rstd]: [&View; 5], [dx, dw, db]: [&View; 3]) -> Result<()> {
    let (dys, xs, ws) = (dense::<T>(op, dy)?, dense::<T>(op, x)?, dense::<T>(op, w)?);
    let (means, rstds) = (dense::<f32>(op, mean)?, dense::<f32>(op, rstd)?);
    let mut dxs = Dense::<T>::output(op, dx)?;
    let (rows, d) = rows_of(&x.shape);
    let n = C::<T>::from_f64(d as f64);
    let grads = backward_rows(dxs.slice(), (rows, d), 2, |row, dxr, sums| {
        let (xr, dyr) = (&xs[row * d..][..d], &dys[row * d..][..d]);
        let (mu, r) = (C::<T>::from_f32(means[row]), C::<T>::from_f32(rstds[row]));
        let xhat = |j: usize| (xr[j].compute() - mu) * r;
        // dx = r * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w.
        let (mut sum_g, mut sum_gx) = (C::<T>::ZERO, C::<T>::ZERO);
        for j in 0..d {
            let g = dyr[j].compute() * ws[j].compute();
            sum_g += g;
            sum_gx += g * xhat(j);
            sums[0][j] += dyr[j].compute() * xhat(j);
            sums[1][j] += dyr[j].compute();
        }
        let (mean_g, mean_gx) = (sum_g / n, sum_gx / n);
        for j in 0..d {
            let g = dyr[j].compute() * ws[j].compute();
            dxr[j] = T::store(r * (g - mean_g - xhat(j) * mean_gx));
        }
    });
    dxs.finish();
    store_into::<T>(op, dw, &grads[0])?;
    store_into::<T>(op, db, &grads[1])
}

fn rms_norm<T: Float>(op: &Op, eps: f64, [x, w]: [&View; 2], [y, rstd]: [&View; 2]) -> Result<()> {
    let xs = dense::<T>(op, x)?;
    rms_rows::<T, T>(op, eps, &xs, w, [y, rstd])
}

/// `sum = x + residual` rounded to `T` (as the `add` op stores it), then [`rms_norm`] of `sum`.
/// In the mixed form `T` is f32 and `H` (residual's and y's type) f16 or bf16: the residual
/// is widened as it is read and y rounded once to `H`; otherwise `H` is `T`.
fn add_rms_norm<T: Float, H: Float>(
    op: &Op,
    eps: f64,
    [x, r, w]: [&View; 3],
    [y, sum, rstd]: [&View; 3],
) -> Result<()> {
    let (xs, rs) = (dense::<T>(op, x)?, dense::<H>(op, r)?);
    let mut sums = Dense::<T>::output(op, sum)?;
    sums.slice()
        .par_iter_mut()
        .zip(xs.par_iter().zip(rs.par_iter()))
        .with_min_len(4096)
        .for_each(|(o, (a, b))| *o = T::store(a.compute() + cvt::<C<H>, C<T>>(b.compute())));
    rms_rows::<T, H>(op, eps, sums.slice(), w, [y, rstd])?;
    sums.finish();
    Ok(())
}

/// [`add_rms_norm`] into a staging buffer, then the `matmul` kernel against the weight's
/// transpose, the bias added and rounded as `add` does, and with `gated` SwiGLU of the two
/// halves: the op's definition, step by step (the point of fusing is a GPU's launches, which
/// a CPU does not pay).
fn add_rms_norm_linear<T: Float>(
    op: &Op,
    eps: f64,
    gated: bool,
    [x, r, g, w]: [&View; 4],
    bias: Option<&View>,
    [y, sum]: [&View; 2],
) -> Result<()> {
    let (rows, k) = rows_of(&x.shape);
    let n = w.shape[0];
    let staged = |data: *mut u8, dtype: DType, shape: Vec<usize>| View {
        base: data,
        dtype,
        strides: genesis_backend_api::contiguous_strides(&shape),
        shape,
    };
    let mut h = vec![T::from_f64(0.0); rows * k];
    let mut rstd = vec![0f32; rows];
    let lead = x.shape[..x.shape.len() - 1].to_vec();
    let h_view = staged(h.as_mut_ptr().cast(), x.dtype, x.shape.clone());
    add_rms_norm::<T, T>(op, eps, [x, r, g], [&h_view, sum, &staged(rstd.as_mut_ptr().cast(), DType::F32, lead)])?;
    let mut ys = Dense::<T>::output(op, y)?;
    // The product goes straight to y, or first to its own rows when the gate halves them.
    let mut gated_product = if gated { vec![T::from_f64(0.0); rows * n] } else { Vec::new() };
    let products = if gated { &mut gated_product[..] } else { ys.slice() };
    let product = staged(products.as_mut_ptr().cast(), y.dtype, vec![rows, n]);
    let h_rows = View { shape: vec![rows, k], strides: vec![k as isize, 1], ..h_view };
    let w_t = View { shape: vec![k, n], strides: vec![w.strides[1], w.strides[0]], ..w.clone() };
    super::matmul::run(&Op::Matmul, &[h_rows, w_t], &[product])?;
    if let Some(bias) = bias {
        let bs = dense::<T>(op, bias)?;
        for row in split_mut(products, rows, n) {
            for (o, b) in row.iter_mut().zip(bs.iter()) {
                *o = T::store(o.compute() + b.compute());
            }
        }
    }
    if gated {
        let half = n / 2;
        for (out, row) in split_mut(ys.slice(), rows, half).into_iter().zip(split_mut(&mut gated_product, rows, n)) {
            let (gates, ups) = row.split_at(half);
            for (o, (&g, &u)) in out.iter_mut().zip(gates.iter().zip(ups)) {
                *o = super::swiglu::gated(g, u);
            }
        }
    }
    ys.finish();
    Ok(())
}

/// The RMS norm of the dense rows `xs` (the shape of `y`) with weight `w`, computed in `T`'s
/// compute type and stored as `Y`.
fn rms_rows<T: Float, Y: Float>(op: &Op, eps: f64, xs: &[T], w: &View, [y, rstd]: [&View; 2]) -> Result<()> {
    let ws = dense::<T>(op, w)?;
    let (mut ys, mut rstds) = (Dense::<Y>::output(op, y)?, Dense::<f32>::output(op, rstd)?);
    let (_, d) = rows_of(&y.shape);
    let eps = C::<T>::from_f64(eps);
    let n = C::<T>::from_f64(d as f64);
    if d == 0 {
        rstds.slice().fill(f32::NAN);
    } else {
        ys.slice()
            .par_chunks_mut(d)
            .zip(rstds.slice().par_iter_mut())
            .zip(xs.par_chunks(d))
            .with_min_len(min_rows(d))
            .for_each(|((yr, r_out), xr)| {
                let ms = xr
                    .iter()
                    .map(|v| {
                        let c = v.compute();
                        c * c
                    })
                    .sum::<C<T>>()
                    / n;
                let r = C::<T>::ONE / (ms + eps).sqrt();
                for ((o, v), wv) in yr.iter_mut().zip(xr).zip(ws.iter()) {
                    *o = Y::store(cvt(v.compute() * r * wv.compute()));
                }
                *r_out = r.to_f32();
            });
    }
    ys.finish();
    rstds.finish();
    Ok(())
}

/// With `dsum`, each element of dx is the norm's gradient rounded to `T`, plus dsum, rounded
/// again: what `rms_norm_backward` and then `add` store. `G` is dy's type: `T`, or in the
/// mixed form f16 or bf16 with `T` f32 (dy widened as it is read), where `dx_half` (like dy)
/// gets dx rounded to `G`.
fn rms_norm_backward<T: Float, G: Float>(
    op: &Op,
    [dy, x, w, rstd]: [&View; 4],
    dsum: Option<&View>,
    [dx, dw]: [&View; 2],
    dx_half: Option<&View>,
) -> Result<()> {
    let (dys, xs, ws) = (dense::<G>(op, dy)?, dense::<T>(op, x)?, dense::<T>(op, w)?);
    let dyc = |v: &G| cvt::<C<G>, C<T>>(v.compute());
    let dsums = dsum.map(|v| dense::<T>(op, v)).transpose()?;
    let rstds = dense::<f32>(op, rstd)?;
    let mut dxs = Dense::<T>::output(op, dx)?;
    let (rows, d) = rows_of(&x.shape);
    let n = C::<T>::from_f64(d as f64);
    let grads = backward_rows(dxs.slice(), (rows, d), 1, |row, dxr, sums| {
        let (xr, dyr) = (&xs[row * d..][..d], &dys[row * d..][..d]);
        let r = C::<T>::from_f32(rstds[row]);
        // dx = r * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * r.
        let mut sum_gx = C::<T>::ZERO;
        for j in 0..d {
            let xhat = xr[j].compute() * r;
            sum_gx += dyc(&dyr[j]) * ws[j].compute() * xhat;
            sums[0][j] += dyc(&dyr[j]) * xhat;
        }
        let mean_gx = sum_gx / n;
        for j in 0..d {
            let xhat = xr[j].compute() * r;
            dxr[j] = T::store(r * (dyc(&dyr[j]) * ws[j].compute() - xhat * mean_gx));
        }
        if let Some(ds) = &dsums {
            for (o, s) in dxr.iter_mut().zip(&ds[row * d..][..d]) {
                *o = T::store(o.compute() + s.compute());
            }
        }
    });
    if let Some(h) = dx_half {
        let mut halves = Dense::<G>::output(op, h)?;
        for (o, v) in halves.slice().iter_mut().zip(dxs.slice().iter()) {
            *o = G::store(cvt::<C<T>, C<G>>(v.compute()));
        }
        halves.finish();
    }
    dxs.finish();
    store_into::<T>(op, dw, &grads[0])
}

inventory::submit! { Kernel { claims, run } }
