//! Cross-entropy with label smoothing and an ignored target value, per row of logits.
//!
//! The logits are `(.., c)` with the classes on the last dim (the interface documents
//! `(n, c)`; more leading dims are rows, as for every "last dim" op); target, loss, lse and
//! dloss have the leading dims.

use super::fused::{dense, min_rows, row_max, with_float, Dense, Float, Real, C};
use super::{unsupported, Kernel, View};
use crate::element::Arith;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[
        Op::CrossEntropy { ignore_index: 0, label_smoothing: 0.0 },
        Op::CrossEntropyBackward { ignore_index: 0, label_smoothing: 0.0 },
    ])
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match *op {
        Op::CrossEntropy { ignore_index, label_smoothing } => {
            let ([logits, target], [loss, lse]) = checks::cross_entropy(op, label_smoothing, inputs, outputs)?;
            let targets = targets(op, logits, target, ignore_index)?;
            with_float!(op, logits.dtype, T => forward::<T>(op, logits, &targets, label_smoothing, loss, lse))
        }
        Op::CrossEntropyBackward { ignore_index, label_smoothing } => {
            let ([logits, target, lse, dloss], [dlogits]) =
                checks::cross_entropy_backward(op, label_smoothing, inputs, outputs)?;
            let targets = targets(op, logits, target, ignore_index)?;
            with_float!(op, logits.dtype, T => backward::<T>(op, logits, &targets, label_smoothing, lse, dloss, dlogits))
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
}

/// The class of each row, `None` for ignored rows. Checked up front, so an out-of-range
/// target fails the op before anything is written.
fn targets(op: &Op, logits: &View, target: &View, ignore_index: i64) -> Result<Vec<Option<usize>>> {
    let c = logits.shape.last().copied().unwrap_or(0);
    dense::<i64>(op, target)?
        .iter()
        .enumerate()
        .map(|(row, &t)| match t {
            t if t == ignore_index => Ok(None),
            t if t >= 0 && (t as u64) < c as u64 => Ok(Some(t as usize)),
            t => Err(BackendError::invalid(format!(
                "{}: target {t} of row {row} is outside [0, {c}) and is not ignore_index ({ignore_index}); logits {:?}",
                op.name(),
                logits.shape
            ))),
        })
        .collect()
}

fn forward<T: Float>(
    op: &Op,
    logits: &View,
    targets: &[Option<usize>],
    eps: f64,
    loss: &View,
    lse: &View,
) -> Result<()> {
    let xs = dense::<T>(op, logits)?;
    let (mut losses, mut lses) = (Dense::<f32>::output(op, loss)?, Dense::<f32>::output(op, lse)?);
    let c = logits.shape.last().copied().unwrap_or(0);
    if c == 0 {
        // No classes: every row is ignored (anything else failed in `targets`), lse = ln 0.
        losses.slice().fill(0.0);
        lses.slice().fill(f32::NEG_INFINITY);
    } else {
        let eps = C::<T>::from_f64(eps);
        let (keep, inv_c) = (C::<T>::ONE - eps, C::<T>::ONE / C::<T>::from_f64(c as f64));
        losses
            .slice()
            .par_iter_mut()
            .zip(lses.slice().par_iter_mut())
            .zip(xs.par_chunks(c).zip(targets.par_iter()))
            .with_min_len(min_rows(c))
            .for_each(|((loss, lse), (xr, &t))| {
                let m = row_max(xr.iter().map(|v| v.compute()));
                let l = m + xr.iter().map(|v| (v.compute() - m).exp()).sum::<C<T>>().ln();
                *lse = l.to_f32();
                *loss = match t {
                    None => 0.0,
                    Some(t) => {
                        let nll = l - xr[t].compute();
                        if eps == C::<T>::ZERO {
                            nll.to_f32()
                        } else {
                            let mean = xr.iter().map(|v| v.compute()).sum::<C<T>>() * inv_c;
                            (keep * nll + eps * (l - mean)).to_f32()
                        }
                    }
                };
            });
    }
    losses.finish();
    lses.finish();
    Ok(())
}

fn backward<T: Float>(
    op: &Op,
    logits: &View,
    targets: &[Option<usize>],
    eps: f64,
    lse: &View,
    dloss: &View,
    dlogits: &View,
) -> Result<()> {
    let (xs, lses, dls) = (dense::<T>(op, logits)?, dense::<f32>(op, lse)?, dense::<f32>(op, dloss)?);
    let mut out = Dense::<T>::output(op, dlogits)?;
    let c = logits.shape.last().copied().unwrap_or(0);
    if c > 0 {
        let eps = C::<T>::from_f64(eps);
        let (keep, smooth) = (C::<T>::ONE - eps, eps / C::<T>::from_f64(c as f64));
        out.slice()
            .par_chunks_mut(c)
            .zip(xs.par_chunks(c))
            .zip(lses.par_iter().zip(dls.par_iter()).zip(targets.par_iter()))
            .with_min_len(min_rows(c))
            .for_each(|((gr, xr), ((&l, &dl), &t))| {
                let Some(t) = t else {
                    gr.fill(T::store(C::<T>::ZERO));
                    return;
                };
                let (l, dl) = (C::<T>::from_f32(l), C::<T>::from_f32(dl));
                for (j, (g, v)) in gr.iter_mut().zip(xr).enumerate() {
                    let onehot = if j == t { keep } else { C::<T>::ZERO };
                    *g = T::store(dl * ((v.compute() - l).exp() - onehot - smooth));
                }
            });
    }
    out.finish();
    Ok(())
}

inventory::submit! { Kernel { claims, run } }
