//! Multi-tensor AdamW, in place.
//!
//! Each (grad, param, exp_avg, exp_avg_sq) group is dispatched on its own dtypes, so one call
//! may update parameters of several dtypes. The update runs in the param's compute type (f32
//! for f16/bf16 params); the moments are stored in the param's dtype or in f32.

use super::fused::{cvt, dense, with_float, Dense, Float, Real, C, PAR_MIN_ELEMS};
use super::{unsupported, Kernel, View};
use crate::element::Arith;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::sdk::{checks, expect_disjoint_updates, Extent};
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::AdamW { lr: 0.0, beta1: 0.0, beta2: 0.0, eps: 0.0, weight_decay: 0.0, step: 1 }])
}

/// The per-call constants of the update, in f64 (rounded to the compute type per group).
#[derive(Clone, Copy)]
struct Hyper {
    decay: f64,
    beta1: f64,
    beta2: f64,
    step_size: f64,
    bc2_sqrt: f64,
    eps: f64,
    /// Multiplies every gradient as it is read (the optional `scale` input, else 1).
    scale: f64,
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    let Op::AdamW { lr, beta1, beta2, eps, weight_decay, step } = *op else {
        return Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype)));
    };
    checks::adamw(op, inputs, outputs, |dtype| unsupported(op, dtype))?;
    check_disjoint(op, inputs, outputs)?;
    let (grads, scale) = checks::adamw_grad_scale(inputs, outputs);
    let scale = match scale {
        Some(s) => dense::<f32>(op, s)?[0] as f64,
        None => 1.0,
    };
    // Bias corrections in f64: early on, 1 - β2^step is a small difference of numbers near 1,
    // which f32 would get wrong in the third digit.
    let bc1 = 1.0 - beta1.powf(step as f64);
    let bc2 = 1.0 - beta2.powf(step as f64);
    let h =
        Hyper { decay: 1.0 - lr * weight_decay, beta1, beta2, step_size: lr / bc1, bc2_sqrt: bc2.sqrt(), eps, scale };
    for (i, g) in grads.iter().enumerate() {
        let [p, m, v] = [&outputs[3 * i], &outputs[3 * i + 1], &outputs[3 * i + 2]];
        with_float!(op, p.dtype, P => {
            if m.dtype == p.dtype {
                update::<P, P>(op, &h, g, p, m, v)
            } else {
                update::<P, f32>(op, &h, g, p, m, v)
            }
        })?;
    }
    Ok(())
}

/// The device skips its overlap check for in-place ops, so this kernel makes its own: an
/// output may not share a byte with any other output or with a grad (two grads may overlap;
/// they are only read). Views carry absolute addresses, so they all share region 0.
fn check_disjoint(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    for (i, v) in outputs.iter().enumerate() {
        if v.numel() > 1 && v.shape.iter().zip(&v.strides).any(|(&n, &s)| n > 1 && s == 0) {
            return Err(BackendError::invalid(format!(
                "adamw: output {i} has a zero stride (it would overlap itself)"
            )));
        }
    }
    let extents = |list: &[View]| -> Vec<Option<Extent>> {
        list.iter().map(|v| v.address_range().map(|(s, e)| (0, s, e))).collect()
    };
    expect_disjoint_updates(op, "grad", &extents(inputs), &extents(outputs))
}

fn update<P: Float, M: Float>(op: &Op, h: &Hyper, g: &View, p: &View, m: &View, v: &View) -> Result<()> {
    let gs = dense::<P>(op, g)?;
    let (mut ps, mut ms, mut vs) =
        (Dense::<P>::in_place(op, p)?, Dense::<M>::in_place(op, m)?, Dense::<M>::in_place(op, v)?);
    let k = |x: f64| C::<P>::from_f64(x);
    let (decay, b1, b2, step_size, bc2_sqrt, eps) =
        (k(h.decay), k(h.beta1), k(h.beta2), k(h.step_size), k(h.bc2_sqrt), k(h.eps));
    let (one_b1, one_b2, scale) = (k(1.0 - h.beta1), k(1.0 - h.beta2), k(h.scale));
    ps.slice()
        .par_iter_mut()
        .zip(ms.slice().par_iter_mut().zip(vs.slice().par_iter_mut()))
        .zip(gs.par_iter())
        .with_min_len(PAR_MIN_ELEMS)
        .for_each(|((pe, (me, ve)), ge)| {
            let gc = ge.compute() * scale;
            let mc = b1 * cvt::<C<M>, C<P>>(me.compute()) + one_b1 * gc;
            let vc = b2 * cvt::<C<M>, C<P>>(ve.compute()) + one_b2 * gc * gc;
            let pc = pe.compute() * decay - step_size * mc / (vc.sqrt() / bc2_sqrt + eps);
            *pe = P::store(pc);
            *me = M::store(cvt::<C<P>, C<M>>(mc));
            *ve = M::store(cvt::<C<P>, C<M>>(vc));
        });
    ps.finish();
    ms.finish();
    vs.finish();
    Ok(())
}

inventory::submit! { Kernel { claims, run } }
