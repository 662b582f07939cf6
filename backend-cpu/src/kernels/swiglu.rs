//! SwiGLU, the gated feed-forward's activation: `y = silu(gate) · up`, and its backward in
//! one pass (both gradients from `dy`, `gate` and `up`, nothing saved in between).
//!
//! Any operand may be strided: inputs are gathered into dense copies and a strided output is
//! staged (see `Dense`).

use super::fused::{dense, with_float, Dense, Float, Real, C, PAR_MIN_ELEMS};
use super::{unsupported, Kernel, View};
use crate::element::Arith;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{DType, Op, OpKind, Result};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::SwiGlu, Op::SwiGluBackward])
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match op {
        Op::SwiGlu => {
            let ([gate, up], [y]) = checks::swiglu(op, inputs, outputs)?;
            with_float!(op, gate.dtype, T => forward::<T>(op, gate, up, y))
        }
        Op::SwiGluBackward => {
            let ([dy, gate, up], [dgate, dup]) = checks::swiglu_backward(op, inputs, outputs)?;
            with_float!(op, gate.dtype, T => backward::<T>(op, [dy, gate, up], [dgate, dup]))
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
}

fn sigmoid<R: Real>(x: R) -> R {
    R::ONE / (R::ONE + (-x).exp())
}

/// `silu(gate) · up` of one element pair, rounded to `T` (the forward's arithmetic, shared
/// with the gated `add_rms_norm_linear`).
pub(super) fn gated<T: Float>(gate: T, up: T) -> T {
    let g: C<T> = gate.compute();
    T::store(g * sigmoid(g) * up.compute())
}

fn forward<T: Float>(op: &Op, gate: &View, up: &View, y: &View) -> Result<()> {
    let (g, u) = (dense::<T>(op, gate)?, dense::<T>(op, up)?);
    let mut out = Dense::<T>::output(op, y)?;
    out.slice()
        .par_iter_mut()
        .zip(g.par_iter().zip(u.par_iter()))
        .with_min_len(PAR_MIN_ELEMS)
        .for_each(|(y, (&g, &u))| *y = gated(g, u));
    out.finish();
    Ok(())
}

fn backward<T: Float>(op: &Op, [dy, gate, up]: [&View; 3], [dgate, dup]: [&View; 2]) -> Result<()> {
    let (dys, g, u) = (dense::<T>(op, dy)?, dense::<T>(op, gate)?, dense::<T>(op, up)?);
    let (mut dg_out, mut du_out) = (Dense::<T>::output(op, dgate)?, Dense::<T>::output(op, dup)?);
    let inputs = dys.par_iter().zip(g.par_iter().zip(u.par_iter()));
    dg_out.slice().par_iter_mut().zip(du_out.slice().par_iter_mut()).zip(inputs).with_min_len(PAR_MIN_ELEMS).for_each(
        |((dg, du), (dy, (g, u)))| {
            let (dy, g, u): (C<T>, C<T>, C<T>) = (dy.compute(), g.compute(), u.compute());
            let s = sigmoid(g);
            *du = T::store(dy * g * s);
            *dg = T::store(dy * u * s * (C::<T>::ONE + g * (C::<T>::ONE - s)));
        },
    );
    dg_out.finish();
    du_out.finish();
    Ok(())
}

inventory::submit! { Kernel { claims, run } }
