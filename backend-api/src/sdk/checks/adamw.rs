//! Multi-tensor AdamW.

use super::{expect_dtype, expect_shape, Meta};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::op::Op;

/// Operands and attributes of `AdamW`, `[grad_0, .. (, scale)] -> [param_0, exp_avg_0,
/// exp_avg_sq_0, ..]`: three outputs per grad, `step >= 1`, betas in `[0, 1)`, an optional
/// last input `scale` (one f32 element, interface 1.10; see [`adamw_grad_scale`]), and per
/// group a float param (else the error `unsupported` makes), a grad of its dtype, all four
/// of one shape, and moments both of the param's dtype or both f32. Every group is checked
/// before any is updated, so a refused call changes nothing. The overlap rule is
/// [`crate::sdk::expect_disjoint_updates`].
pub fn adamw<T: Meta>(op: &Op, inputs: &[T], outputs: &[T], unsupported: impl Fn(DType) -> BackendError) -> Result<()> {
    let Op::AdamW { beta1, beta2, step, .. } = *op else {
        return Err(unsupported(inputs.first().map_or(DType::F32, |g| g.dtype())));
    };
    let (grads, scale) = adamw_grad_scale(inputs, outputs);
    if outputs.len() != 3 * grads.len() {
        return Err(BackendError::invalid(format!(
            "adamw: {} grad(s) need {} outputs (param, exp_avg, exp_avg_sq each), got {}",
            grads.len(),
            3 * grads.len(),
            outputs.len()
        )));
    }
    if let Some(scale) = scale {
        expect_dtype(op, "scale", scale, DType::F32)?;
        if scale.shape().iter().product::<usize>() != 1 {
            return Err(BackendError::shape(format!(
                "adamw: the gradient scale must have one element, got shape {:?}",
                scale.shape()
            )));
        }
    }
    if step == 0 {
        return Err(BackendError::invalid("adamw: step counts from 1 (it is the step after this update), got 0"));
    }
    // A beta of 1 or more zeroes the bias correction and turns every parameter into NaN.
    for (name, b) in [("beta1", beta1), ("beta2", beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(BackendError::invalid(format!("adamw: {name} must be in [0, 1), got {b}")));
        }
    }
    for (i, (g, group)) in grads.iter().zip(outputs.chunks(3)).enumerate() {
        let [p, m, v] = [&group[0], &group[1], &group[2]];
        if !matches!(p.dtype(), DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
            return Err(unsupported(p.dtype()));
        }
        // Operand names are formatted only for an error: this runs for every tensor of a step.
        if g.dtype() != p.dtype() {
            expect_dtype(op, &format!("grad {i}"), g, p.dtype())?;
        }
        for (name, t) in [("param", p), ("exp_avg", m), ("exp_avg_sq", v)] {
            if t.shape() != g.shape() {
                expect_shape(op, &format!("{name} {i}"), t, g.shape())?;
            }
        }
        let (pd, md, vd) = (p.dtype(), m.dtype(), v.dtype());
        if md != vd || (md != pd && md != DType::F32) {
            return Err(BackendError::dtype(format!(
                "adamw: moments of param {i} are {md} and {vd}; both must be the param's dtype ({pd}) or float32"
            )));
        }
    }
    Ok(())
}

/// The gradients of an `AdamW` call and its optional gradient scale: with one input more
/// than a third of the outputs, the last input is `scale`, a one-element f32 tensor every
/// gradient is multiplied by as it is read (the gradients themselves are not written). A
/// trainer that clips by the global norm passes the clipping factor here instead of scaling
/// every gradient in a pass of its own.
pub fn adamw_grad_scale<'a, T>(inputs: &'a [T], outputs: &[T]) -> (&'a [T], Option<&'a T>) {
    match inputs.split_last() {
        Some((scale, grads)) if outputs.len() % 3 == 0 && 3 * grads.len() == outputs.len() => (grads, Some(scale)),
        _ => (inputs, None),
    }
}
