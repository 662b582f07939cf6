//! The "last dim" families: softmax, layer and RMS norm, cross-entropy, rotary (and its fused
//! cache write); and the elementwise SwiGLU gate, whose operands all share one shape.

use super::{
    dims, expect_dtype, expect_like, expect_meta, expect_self_disjoint, expect_shape, operands, AttentionDims, Meta,
    Operands,
};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::op::Op;

/// Operands of `Softmax`/`LogSoftmax`, `[x] -> [y]`: y has x's shape and dtype.
pub fn softmax<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 1, 1>> {
    let (ins @ [x], outs @ [y]) = operands(op, inputs, outputs)?;
    expect_like(op, "y", y, x)?;
    Ok((ins, outs))
}

/// Operands of `SoftmaxBackward`/`LogSoftmaxBackward`, `[y, dy] -> [dx]`: dy and dx have y's
/// shape and dtype.
pub fn softmax_backward<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 2, 1>> {
    let (ins @ [y, dy], outs @ [dx]) = operands(op, inputs, outputs)?;
    expect_shape(op, "dy", dy, y.shape())?;
    expect_shape(op, "dx", dx, y.shape())?;
    expect_dtype(op, "dy", dy, y.dtype())?;
    expect_dtype(op, "dx", dx, y.dtype())?;
    Ok((ins, outs))
}

/// `InvalidArgument` unless a normalization's eps is >= 0 (not NaN): the rule of layer, RMS
/// and batch norm.
pub fn expect_eps(op: &Op, eps: f64) -> Result<()> {
    if eps.is_nan() || eps < 0.0 {
        return Err(BackendError::invalid(format!("{}: eps must be >= 0, got {eps}", op.name())));
    }
    Ok(())
}

/// A per-feature tensor (weight, bias and their gradients): shape `[d]` with `d` the last dim
/// of x, x's dtype. A rank-0 x is refused here: a norm over nothing has no weight shape.
fn expect_param(op: &Op, name: &str, t: &impl Meta, x: &impl Meta) -> Result<()> {
    let Some(&d) = x.shape().last() else {
        return Err(BackendError::shape(format!("{}: x must have rank >= 1, got a scalar", op.name())));
    };
    if t.shape() != [d] {
        return Err(BackendError::shape(format!(
            "{}: {name} has shape {:?}, expected [{d}] (the last dim of x {:?})",
            op.name(),
            t.shape(),
            x.shape()
        )));
    }
    expect_dtype(op, name, t, x.dtype())
}

/// A saved statistic: f32 with x's leading dims.
fn expect_stat(op: &Op, name: &str, t: &impl Meta, x: &impl Meta) -> Result<()> {
    let lead = &x.shape()[..x.shape().len().saturating_sub(1)];
    expect_meta(op, name, t, lead, DType::F32)
}

/// The operand rules layer and batch norm share, `[x, weight, bias] -> [y, mean, rstd]`:
/// eps >= 0, y like x; `param` checks weight and bias, `stat` mean and rstd (by name), the
/// only rules in which the two norms differ.
pub(super) fn affine_norm<T: Meta>(
    op: &Op,
    eps: f64,
    [x, w, b]: &[T; 3],
    [y, mean, rstd]: &[T; 3],
    param: impl Fn(&str, &T) -> Result<()>,
    stat: impl Fn(&str, &T) -> Result<()>,
) -> Result<()> {
    expect_eps(op, eps)?;
    param("weight", w)?;
    param("bias", b)?;
    expect_like(op, "y", y, x)?;
    stat("mean", mean)?;
    stat("rstd", rstd)
}

/// The backward of [`affine_norm`], `[dy, x, weight, mean, rstd] -> [dx, dweight, dbias]`:
/// dy and dx like x, the gradients under `param` like their parameters.
pub(super) fn affine_norm_backward<T: Meta>(
    op: &Op,
    [dy, x, w, mean, rstd]: &[T; 5],
    [dx, dw, db]: &[T; 3],
    param: impl Fn(&str, &T) -> Result<()>,
    stat: impl Fn(&str, &T) -> Result<()>,
) -> Result<()> {
    expect_like(op, "dy", dy, x)?;
    param("weight", w)?;
    stat("mean", mean)?;
    stat("rstd", rstd)?;
    expect_like(op, "dx", dx, x)?;
    param("dweight", dw)?;
    param("dbias", db)
}

/// Operands of `LayerNorm { eps }`, `[x, weight, bias] -> [y, mean, rstd]`: eps >= 0, weight
/// and bias `[d]` (x's last dim), y like x, mean and rstd f32 with x's leading dims.
pub fn layer_norm<'a, T: Meta>(op: &Op, eps: f64, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 3, 3>> {
    let (ins, outs) = operands(op, inputs, outputs)?;
    let x = &ins[0];
    affine_norm(op, eps, ins, outs, |name, t| expect_param(op, name, t, x), |name, t| expect_stat(op, name, t, x))?;
    Ok((ins, outs))
}

/// Operands of `LayerNormBackward`, `[dy, x, weight, mean, rstd] -> [dx, dweight, dbias]`,
/// with the forward's rules (dy and dx like x, the gradients like their parameters).
pub fn layer_norm_backward<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 5, 3>> {
    let (ins, outs) = operands(op, inputs, outputs)?;
    let x = &ins[1];
    affine_norm_backward(op, ins, outs, |name, t| expect_param(op, name, t, x), |name, t| expect_stat(op, name, t, x))?;
    Ok((ins, outs))
}

/// Operands of `RmsNorm { eps }`, `[x, weight] -> [y, rstd]`, with [`layer_norm`]'s rules.
pub fn rms_norm<'a, T: Meta>(op: &Op, eps: f64, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 2, 2>> {
    let (ins @ [x, w], outs @ [y, rstd]) = operands(op, inputs, outputs)?;
    expect_eps(op, eps)?;
    expect_param(op, "weight", w, x)?;
    expect_like(op, "y", y, x)?;
    expect_stat(op, "rstd", rstd, x)?;
    Ok((ins, outs))
}

/// The half-precision operand of a mixed-precision norm (interface 1.12): f16 or bf16 with
/// an f32 `x`, shaped like `x`.
fn expect_half_of(op: &Op, name: &str, t: &impl Meta, x: &impl Meta) -> Result<()> {
    expect_shape(op, name, t, x.shape())?;
    if x.dtype() != DType::F32 || !matches!(t.dtype(), DType::F16 | DType::BF16) {
        return Err(BackendError::dtype(format!(
            "{}: {name} is {} and x {}: expected the same dtype, or f16/bf16 with an f32 x",
            op.name(),
            t.dtype(),
            x.dtype()
        )));
    }
    Ok(())
}

/// Operands of `RmsNormBackward`, `[dy, x, weight, rstd] -> [dx, dweight]`.
pub fn rms_norm_backward<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 4, 2>> {
    rms_norm_backward_of(op, inputs, outputs, false)
}

/// [`rms_norm_backward`]'s rules, and with `mixed` its mixed form too.
fn rms_norm_backward_of<'a, T: Meta>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
    mixed: bool,
) -> Result<Operands<'a, T, 4, 2>> {
    let (ins @ [dy, x, w, rstd], outs @ [dx, dw]) = operands(op, inputs, outputs)?;
    if mixed && dy.dtype() != x.dtype() {
        expect_half_of(op, "dy", dy, x)?;
    } else {
        expect_like(op, "dy", dy, x)?;
    }
    expect_param(op, "weight", w, x)?;
    expect_stat(op, "rstd", rstd, x)?;
    expect_like(op, "dx", dx, x)?;
    expect_param(op, "dweight", dw, x)?;
    Ok((ins, outs))
}

/// `inputs` without its optional last operand, and that operand, which is there when there
/// are `full` inputs.
fn optional_last<T>(inputs: &[T], full: usize) -> (&[T], Option<&T>) {
    match inputs {
        [first @ .., last] if inputs.len() == full => (first, Some(last)),
        _ => (inputs, None),
    }
}

/// `RmsNormBackward`'s four inputs, its optional `dsum` and its two outputs.
pub type RmsBackwardOperands<'a, T> = (&'a [T; 4], Option<&'a T>, &'a [T; 2]);

/// Operands of `RmsNormBackward` with or without its optional fifth input,
/// `[dy, x, weight, rstd]` or `[dy, x, weight, rstd, dsum] -> [dx, dweight]`: dsum like x
/// (interface 1.11), the rest with [`rms_norm_backward`]'s rules. Returns the four inputs,
/// dsum and the outputs.
pub fn rms_norm_backward_dsum<'a, T: Meta>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<RmsBackwardOperands<'a, T>> {
    rms_norm_backward_dsum_of(op, inputs, outputs, false)
}

/// Operands of `RmsNormBackward` in every form of interface 1.12: [`rms_norm_backward_dsum`]'s,
/// and the mixed form, dy f16 or bf16 (the claimed dtype) with x and everything else f32. A
/// plugin that runs the mixed form takes this check; the older ones refuse a mixed call.
pub fn rms_norm_backward_mixed<'a, T: Meta>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<RmsBackwardOperands<'a, T>> {
    rms_norm_backward_dsum_of(op, inputs, outputs, true)
}

/// Operands of `RmsNormBackward` in every form of interface 1.13: [`rms_norm_backward_mixed`]'s,
/// and in the mixed form an optional third output `dx_half` like dy (f16 or bf16), which gets
/// dx rounded to its dtype: the gradient of the half-precision residual of `AddRmsNorm`'s mixed
/// form, written in the same pass. Returns the operands and `dx_half`. A plugin that writes
/// `dx_half` takes this check; the older ones refuse a third output.
pub fn rms_norm_backward_half_dx<'a, T: Meta>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<(RmsBackwardOperands<'a, T>, Option<&'a T>)> {
    let (outs, dx_half) = optional_last(outputs, 3);
    let operands = rms_norm_backward_dsum_of(op, inputs, outs, true).map_err(|e| match outputs.len() {
        2 | 3 => e,
        n => super::super::arity_error(op, 4, 2, inputs.len(), n),
    })?;
    if let Some(h) = dx_half {
        let [dy, x, ..] = operands.0;
        if dy.dtype() == x.dtype() {
            return Err(BackendError::invalid(format!(
                "{}: dx_half belongs to the mixed form (an f16/bf16 dy with an f32 x), got dy {} and x {}",
                op.name(),
                dy.dtype(),
                x.dtype()
            )));
        }
        expect_like(op, "dx_half", h, dy)?;
    }
    Ok((operands, dx_half))
}

fn rms_norm_backward_dsum_of<'a, T: Meta>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
    mixed: bool,
) -> Result<RmsBackwardOperands<'a, T>> {
    let (first, dsum) = optional_last(inputs, 5);
    let (ins, outs) = rms_norm_backward_of(op, first, outputs, mixed).map_err(|e| match inputs.len() {
        4 | 5 => e,
        n => super::super::arity_error(op, 4, 2, n, outputs.len()),
    })?;
    if let Some(dsum) = dsum {
        expect_like(op, "dsum", dsum, &ins[1])?;
    }
    Ok((ins, dsum, outs))
}

/// Operands of `AddRmsNorm { eps }`, `[x, residual, weight] -> [y, sum, rstd]`: residual, y
/// and sum like x, the rest with [`rms_norm`]'s rules.
pub fn add_rms_norm<'a, T: Meta>(
    op: &Op,
    eps: f64,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<Operands<'a, T, 3, 3>> {
    add_rms_norm_of(op, eps, inputs, outputs, false)
}

/// Operands of `AddRmsNorm { eps }` in both forms of interface 1.12: [`add_rms_norm`]'s, and
/// the mixed form, x f32 with residual and y f16 or bf16 (the claimed dtype), weight, sum and
/// rstd f32. A plugin that runs the mixed form takes this check; the older ones refuse a mixed
/// call.
pub fn add_rms_norm_mixed<'a, T: Meta>(
    op: &Op,
    eps: f64,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<Operands<'a, T, 3, 3>> {
    add_rms_norm_of(op, eps, inputs, outputs, true)
}

fn add_rms_norm_of<'a, T: Meta>(
    op: &Op,
    eps: f64,
    inputs: &'a [T],
    outputs: &'a [T],
    mixed: bool,
) -> Result<Operands<'a, T, 3, 3>> {
    let (ins @ [x, residual, w], outs @ [y, sum, rstd]) = operands(op, inputs, outputs)?;
    expect_eps(op, eps)?;
    if mixed && residual.dtype() != x.dtype() {
        expect_half_of(op, "residual", residual, x)?;
        expect_like(op, "y", y, residual)?;
    } else {
        expect_like(op, "residual", residual, x)?;
        expect_like(op, "y", y, x)?;
    }
    expect_param(op, "weight", w, x)?;
    expect_like(op, "sum", sum, x)?;
    expect_stat(op, "rstd", rstd, x)?;
    Ok((ins, outs))
}

/// Operands of `AddRmsNormLinear { eps, gated }`, `[x, residual, norm_weight, weight]` or
/// with a fifth input `bias`, `-> [y, sum]`: [`add_rms_norm`]'s rules for x, residual,
/// norm_weight and sum; weight `(n, k)` with k the last dim of x, bias `[n]`, y `(.., n)` (or
/// `(.., n/2)` with `gated`, where n must be even) with x's leading dims, all of x's dtype.
/// Returns the four inputs, the bias and the outputs.
#[allow(clippy::type_complexity)]
pub fn add_rms_norm_linear<'a, T: Meta>(
    op: &Op,
    eps: f64,
    gated: bool,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<(&'a [T; 4], Option<&'a T>, &'a [T; 2])> {
    let (first, bias) = optional_last(inputs, 5);
    let (ins @ [x, residual, norm_weight, weight], outs @ [y, sum]) =
        operands(op, first, outputs).map_err(|_| super::super::arity_error(op, 4, 2, inputs.len(), outputs.len()))?;
    expect_eps(op, eps)?;
    expect_like(op, "residual", residual, x)?;
    expect_param(op, "norm_weight", norm_weight, x)?;
    expect_like(op, "sum", sum, x)?;
    let (lead, k) = x.shape().split_at(x.shape().len() - 1);
    let [n, wk] = dims(op, "weight (n, k)", weight)?;
    if wk != k[0] {
        return Err(BackendError::shape(format!(
            "{}: weight has shape {:?}, expected (n, {}) (the last dim of x {:?})",
            op.name(),
            weight.shape(),
            k[0],
            x.shape()
        )));
    }
    expect_dtype(op, "weight", weight, x.dtype())?;
    if let Some(bias) = bias {
        expect_meta(op, "bias", bias, &[n], x.dtype())?;
    }
    if gated && n % 2 != 0 {
        return Err(BackendError::shape(format!(
            "{}: a gated weight stacks gate and up rows, so its row count must be even, got {:?}",
            op.name(),
            weight.shape()
        )));
    }
    let outputs_n = if gated { n / 2 } else { n };
    expect_meta(op, "y", y, &[lead, &[outputs_n]].concat(), x.dtype())?;
    Ok((ins, bias, outs))
}

/// Logits `(.., c)` and an i64 target of their leading dims; label smoothing in `[0, 1)`.
fn expect_logits(op: &Op, logits: &impl Meta, target: &impl Meta, smoothing: f64) -> Result<()> {
    if !(0.0..1.0).contains(&smoothing) {
        return Err(BackendError::invalid(format!(
            "{}: label smoothing must be in [0, 1), got {smoothing}",
            op.name()
        )));
    }
    let Some((_, lead)) = logits.shape().split_last() else {
        return Err(BackendError::shape(format!(
            "{}: logits must have rank >= 1 (.., classes), got a scalar",
            op.name()
        )));
    };
    expect_meta(op, "target", target, lead, DType::I64)
}

/// Operands of `CrossEntropy`, `[logits, target] -> [loss, lse]`: float logits `(.., c)`, an
/// i64 target and f32 loss and lse of the leading dims. The target values are the backend's
/// to check (each in `[0, c)` or `ignore_index`), before it writes anything.
pub fn cross_entropy<'a, T: Meta>(
    op: &Op,
    label_smoothing: f64,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<Operands<'a, T, 2, 2>> {
    let (ins @ [logits, target], outs @ [loss, lse]) = operands(op, inputs, outputs)?;
    expect_logits(op, logits, target, label_smoothing)?;
    for (name, t) in [("loss", loss), ("lse", lse)] {
        expect_stat(op, name, t, logits)?;
    }
    Ok((ins, outs))
}

/// Operands of `CrossEntropyBackward`, `[logits, target, lse, dloss] -> [dlogits]`, with the
/// forward's rules and dlogits like the logits.
pub fn cross_entropy_backward<'a, T: Meta>(
    op: &Op,
    label_smoothing: f64,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<Operands<'a, T, 4, 1>> {
    let (ins @ [logits, target, lse, dloss], outs @ [dlogits]) = operands(op, inputs, outputs)?;
    expect_logits(op, logits, target, label_smoothing)?;
    for (name, t) in [("lse", lse), ("dloss", dloss)] {
        expect_stat(op, name, t, logits)?;
    }
    expect_like(op, "dlogits", dlogits, logits)?;
    Ok((ins, outs))
}

/// Operands of `Rotary`, `[x, cos, sin] -> [y]`: x `(b, h, s, d)` with `d` even, cos and sin
/// `(s, d/2)`, y like x, all of x's dtype. Returns x's dims with the operands.
#[allow(clippy::type_complexity)]
pub fn rotary<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<([usize; 4], &'a [T; 3], &'a [T; 1])> {
    let (ins @ [x, cos, sin], outs @ [y]) = operands(op, inputs, outputs)?;
    let [b, h, s, d] = dims::<4>(op, "x (b, h, s, d)", x)?;
    if d % 2 != 0 {
        return Err(BackendError::shape(format!("{}: the head dim of x {:?} must be even", op.name(), x.shape())));
    }
    expect_shape(op, "cos", cos, &[s, d / 2])?;
    expect_shape(op, "sin", sin, &[s, d / 2])?;
    expect_shape(op, "y", y, x.shape())?;
    for (name, t) in [("cos", cos), ("sin", sin), ("y", y)] {
        expect_dtype(op, name, t, x.dtype())?;
    }
    Ok(([b, h, s, d], ins, outs))
}

/// Operands of `RotaryKvWrite`, `[q, k, v, cos, sin, position] -> [q_out, k_cache, v_cache]`:
/// q `(b, hq, s, d)` with `d` even, k and v `(b, hk, s, d)` (q's batch, positions and head
/// dim), cos and sin `(s, d/2)`, position i64 of shape `[1]`, q_out like q, the caches
/// `(b, hk, t, d)` alike with `t >= s`, neither overlapping itself; every operand but the
/// position of q's dtype, a float one. Returns the sizes as attention's (`s` new positions,
/// `t` cache positions). The position's value is the backend's to check (in `[0, t - s]`, see
/// [`AttentionDims::positions_free`]), before it writes anything.
#[allow(clippy::type_complexity)]
pub fn rotary_kv_write<'a, T: Meta>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<(AttentionDims, &'a [T; 6], &'a [T; 3])> {
    let (ins @ [q, k, v, cos, sin, position], outs @ [q_out, k_cache, v_cache]) = operands(op, inputs, outputs)?;
    let [b, hq, s, d] = dims::<4>(op, "q (b, hq, s, d)", q)?;
    if d % 2 != 0 {
        return Err(BackendError::shape(format!("{}: the head dim of q {:?} must be even", op.name(), q.shape())));
    }
    let [bk, hk, sk, dk] = dims::<4>(op, "k (b, hk, s, d)", k)?;
    if (bk, sk, dk) != (b, s, d) {
        return Err(BackendError::shape(format!(
            "{}: q {:?} and k {:?} differ in batch, positions or head dim",
            op.name(),
            q.shape(),
            k.shape()
        )));
    }
    expect_shape(op, "v", v, k.shape())?;
    expect_shape(op, "cos", cos, &[s, d / 2])?;
    expect_shape(op, "sin", sin, &[s, d / 2])?;
    expect_shape(op, "position", position, &[1])?;
    expect_shape(op, "q_out", q_out, q.shape())?;
    let [bc, hc, t, dc] = dims::<4>(op, "k_cache (b, hk, t, d)", k_cache)?;
    if (bc, hc, dc) != (b, hk, d) || t < s {
        return Err(BackendError::shape(format!(
            "{}: k_cache {:?} must be (b, hk, t, d) of k {:?} with t >= {s}",
            op.name(),
            k_cache.shape(),
            k.shape()
        )));
    }
    expect_shape(op, "v_cache", v_cache, k_cache.shape())?;
    if !q.dtype().is_float() {
        return Err(BackendError::unsupported(format!("{}: q is {}, expected a float dtype", op.name(), q.dtype())));
    }
    for (name, t) in [("k", k), ("v", v), ("cos", cos), ("sin", sin), ("q_out", q_out), ("k_cache", k_cache)] {
        expect_dtype(op, name, t, q.dtype())?;
    }
    expect_dtype(op, "v_cache", v_cache, q.dtype())?;
    expect_dtype(op, "position", position, DType::I64)?;
    expect_self_disjoint(op, k_cache)?;
    expect_self_disjoint(op, v_cache)?;
    Ok((AttentionDims { b, hq, hk, s, t, d }, ins, outs))
}

/// Operands of `SwiGlu`, `[gate, up] -> [y]`: up and y have gate's shape and dtype.
pub fn swiglu<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 2, 1>> {
    let (ins @ [gate, up], outs @ [y]) = operands(op, inputs, outputs)?;
    expect_like(op, "up", up, gate)?;
    expect_like(op, "y", y, gate)?;
    Ok((ins, outs))
}

/// Operands of `SwiGluBackward`, `[dy, gate, up] -> [dgate, dup]`: all have gate's shape and
/// dtype.
pub fn swiglu_backward<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 3, 2>> {
    let (ins @ [dy, gate, up], outs @ [dgate, dup]) = operands(op, inputs, outputs)?;
    for (name, t) in [("dy", dy), ("up", up), ("dgate", dgate), ("dup", dup)] {
        expect_like(op, name, t, gate)?;
    }
    Ok((ins, outs))
}

#[cfg(test)]
mod tests {
    use super::super::Fake;
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn norm_and_cross_entropy_rules() {
        let f = |shape: &[usize]| Fake::new(DType::F32, shape);
        let op = Op::LayerNorm { eps: 1e-5 };
        let outs = [f(&[2, 3]), f(&[2]), f(&[2])];
        assert!(layer_norm(&op, 1e-5, &[f(&[2, 3]), f(&[3]), f(&[3])], &outs).is_ok());
        let err = layer_norm(&op, 1e-5, &[f(&[2, 3]), f(&[4]), f(&[3])], &outs).unwrap_err();
        assert_eq!(err.message, "layer_norm: weight has shape [4], expected [3] (the last dim of x [2, 3])");
        let err = layer_norm(&op, -1.0, &[f(&[2, 3]), f(&[3]), f(&[3])], &outs).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        let op = Op::CrossEntropy { ignore_index: -100, label_smoothing: 0.0 };
        let ins = [f(&[4, 5]), Fake::new(DType::I64, &[4])];
        let err = cross_entropy(&op, 0.0, &ins, &[f(&[4]), Fake::new(DType::F16, &[4])]).unwrap_err();
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::DtypeMismatch, "cross_entropy: lse is float16, expected float32")
        );
    }

    #[test]
    fn add_rms_norm_takes_a_residual_like_x() {
        let f = |shape: &[usize]| Fake::new(DType::F32, shape);
        let op = Op::AddRmsNorm { eps: 1e-6 };
        let outs = [f(&[2, 3]), f(&[2, 3]), f(&[2])];
        assert!(add_rms_norm(&op, 1e-6, &[f(&[2, 3]), f(&[2, 3]), f(&[3])], &outs).is_ok());
        let err = add_rms_norm(&op, 1e-6, &[f(&[2, 3]), f(&[3, 2]), f(&[3])], &outs).unwrap_err();
        assert_eq!(err.kind, ErrorKind::ShapeMismatch);
        assert!(err.message.starts_with("add_rms_norm: residual has shape [3, 2]"), "{}", err.message);
        let ins = [f(&[2, 3]), Fake::new(DType::F16, &[2, 3]), f(&[3])];
        assert_eq!(add_rms_norm(&op, 1e-6, &ins, &outs).unwrap_err().kind, ErrorKind::DtypeMismatch);
        let outs = [f(&[2, 3]), f(&[2, 3]), Fake::new(DType::F16, &[2])];
        let ins = [f(&[2, 3]), f(&[2, 3]), f(&[3])];
        assert_eq!(add_rms_norm(&op, 1e-6, &ins, &outs).unwrap_err().kind, ErrorKind::DtypeMismatch);
        assert_eq!(
            add_rms_norm(&op, f64::NAN, &ins, &[f(&[2, 3]), f(&[2, 3]), f(&[2])]).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn mixed_precision_norms_take_a_half_operand_with_an_f32_stream() {
        let (f, h, b) = (
            |s: &[usize]| Fake::new(DType::F32, s),
            |s: &[usize]| Fake::new(DType::F16, s),
            |s: &[usize]| Fake::new(DType::BF16, s),
        );
        let op = Op::AddRmsNorm { eps: 1e-6 };
        // x f32, residual and y bf16, the rest f32.
        let (ins, outs) = ([f(&[2, 3]), b(&[2, 3]), f(&[3])], [b(&[2, 3]), f(&[2, 3]), f(&[2])]);
        assert!(add_rms_norm_mixed(&op, 1e-6, &ins, &outs).is_ok());
        // The check of plugins older than 1.12 refuses it.
        assert_eq!(add_rms_norm(&op, 1e-6, &ins, &outs).unwrap_err().kind, ErrorKind::DtypeMismatch);
        // y must follow the half operand; a half x with an f32 residual is not the mixed form.
        for (ins, outs) in [
            ([f(&[2, 3]), b(&[2, 3]), f(&[3])], [f(&[2, 3]), f(&[2, 3]), f(&[2])]),
            ([f(&[2, 3]), b(&[2, 3]), f(&[3])], [h(&[2, 3]), f(&[2, 3]), f(&[2])]),
            ([b(&[2, 3]), f(&[2, 3]), b(&[3])], [b(&[2, 3]), b(&[2, 3]), f(&[2])]),
            ([f(&[2, 3]), b(&[2, 3]), b(&[3])], [b(&[2, 3]), f(&[2, 3]), f(&[2])]),
            ([f(&[2, 3]), b(&[2, 3]), f(&[3])], [b(&[2, 3]), b(&[2, 3]), f(&[2])]),
        ] {
            assert_eq!(add_rms_norm_mixed(&op, 1e-6, &ins, &outs).unwrap_err().kind, ErrorKind::DtypeMismatch);
        }
        assert_eq!(
            add_rms_norm_mixed(&op, 1e-6, &[f(&[2, 3]), b(&[3, 2]), f(&[3])], &[b(&[2, 3]), f(&[2, 3]), f(&[2])])
                .unwrap_err()
                .kind,
            ErrorKind::ShapeMismatch
        );

        let op = Op::RmsNormBackward;
        let outs = [f(&[2, 3]), f(&[3])];
        let ins = [h(&[2, 3]), f(&[2, 3]), f(&[3]), f(&[2])];
        assert!(rms_norm_backward_mixed(&op, &ins, &outs).is_ok());
        assert_eq!(rms_norm_backward_dsum(&op, &ins, &outs).unwrap_err().kind, ErrorKind::DtypeMismatch);
        let dsum = [b(&[2, 3]), f(&[2, 3]), f(&[3]), f(&[2]), f(&[2, 3])];
        assert!(rms_norm_backward_mixed(&op, &dsum, &outs).is_ok());
        let ins = [f(&[2, 3]), b(&[2, 3]), b(&[3]), f(&[2])];
        assert_eq!(
            rms_norm_backward_mixed(&op, &ins, &[b(&[2, 3]), b(&[3])]).unwrap_err().kind,
            ErrorKind::DtypeMismatch
        );
        assert_eq!(
            rms_norm_backward_mixed(&op, &[b(&[2, 3]), f(&[2, 3]), f(&[3]), f(&[2])], &[b(&[2, 3]), f(&[3])])
                .unwrap_err()
                .kind,
            ErrorKind::DtypeMismatch
        );
        // Interface 1.13: dx rounded to dy's half dtype as a third output, in the mixed form only.
        let mixed = [b(&[2, 3]), f(&[2, 3]), f(&[3]), f(&[2])];
        let three = [f(&[2, 3]), f(&[3]), b(&[2, 3])];
        let (_, dx_half) = rms_norm_backward_half_dx(&op, &mixed, &three).unwrap();
        assert!(dx_half.is_some());
        assert!(rms_norm_backward_half_dx(&op, &mixed, &outs).unwrap().1.is_none());
        assert!(rms_norm_backward_half_dx(&op, &dsum, &three).is_ok());
        // The older checks refuse the third output.
        assert_eq!(rms_norm_backward_mixed(&op, &mixed, &three).unwrap_err().kind, ErrorKind::InvalidArgument);
        // Like dy: its dtype and x's shape; and not for the plain form.
        for bad in [h(&[2, 3]), b(&[3, 2]), f(&[2, 3])] {
            assert!(rms_norm_backward_half_dx(&op, &mixed, &[f(&[2, 3]), f(&[3]), bad]).is_err());
        }
        let plain = [f(&[2, 3]), f(&[2, 3]), f(&[3]), f(&[2])];
        let err = rms_norm_backward_half_dx(&op, &plain, &[f(&[2, 3]), f(&[3]), f(&[2, 3])]).unwrap_err();
        assert!(err.message.contains("mixed form"), "{}", err.message);
        assert!(rms_norm_backward_half_dx(&op, &mixed, &[f(&[2, 3])]).is_err());
    }

    #[test]
    fn add_rms_norm_linear_takes_a_weight_over_the_last_dim_and_an_optional_bias() {
        let op = Op::AddRmsNormLinear { eps: 1e-6, gated: false };
        let f = |s: &[usize]| Fake::new(DType::BF16, s);
        let ins = [f(&[2, 3]), f(&[2, 3]), f(&[3]), f(&[5, 3])];
        let outs = [f(&[2, 5]), f(&[2, 3])];
        let (_, bias, _) = add_rms_norm_linear(&op, 1e-6, false, &ins, &outs).unwrap();
        assert!(bias.is_none());
        let with_bias = [ins.to_vec(), vec![f(&[5])]].concat();
        assert!(add_rms_norm_linear(&op, 1e-6, false, &with_bias, &outs).unwrap().1.is_some());
        let bad_bias = [ins.to_vec(), vec![f(&[3])]].concat();
        assert_eq!(add_rms_norm_linear(&op, 1e-6, false, &bad_bias, &outs).unwrap_err().kind, ErrorKind::ShapeMismatch);
        let err =
            add_rms_norm_linear(&op, 1e-6, false, &[f(&[2, 3]), f(&[2, 3]), f(&[3]), f(&[5, 4])], &outs).unwrap_err();
        assert!(err.message.starts_with("add_rms_norm_linear: weight has shape [5, 4]"), "{}", err.message);
        let err = add_rms_norm_linear(&op, 1e-6, false, &ins, &[f(&[2, 4]), f(&[2, 3])]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::ShapeMismatch);
        let err = add_rms_norm_linear(&op, 1e-6, false, &ins[..3], &outs).unwrap_err();
        assert!(err.message.contains("expected 4 input"), "{}", err.message);
        // Gated: half the rows come out; an odd row count cannot be split.
        let gated = Op::AddRmsNormLinear { eps: 1e-6, gated: true };
        let even = [f(&[2, 3]), f(&[2, 3]), f(&[3]), f(&[6, 3])];
        assert!(add_rms_norm_linear(&gated, 1e-6, true, &even, &[f(&[2, 3]), f(&[2, 3])]).is_ok());
        let err = add_rms_norm_linear(&gated, 1e-6, true, &ins, &[f(&[2, 2]), f(&[2, 3])]).unwrap_err();
        assert!(err.message.contains("must be even"), "{}", err.message);
        let mixed = [f(&[2, 3]), f(&[2, 3]), f(&[3]), Fake::new(DType::F32, &[5, 3])];
        assert_eq!(add_rms_norm_linear(&op, 1e-6, false, &mixed, &outs).unwrap_err().kind, ErrorKind::DtypeMismatch);
    }

    #[test]
    fn rotary_kv_write_rules() {
        let f = |shape: &[usize]| Fake::new(DType::F32, shape);
        let op = Op::RotaryKvWrite;
        let pos = Fake::new(DType::I64, &[1]);
        let (q, kv, cache) = ([2, 14, 1, 8], [2, 2, 1, 8], [2, 2, 40, 8]);
        let ins = |q: Fake, k: Fake, cos: Fake, position: Fake| [q, k.clone(), k, cos.clone(), cos, position];
        let good_ins = ins(f(&q), f(&kv), f(&[1, 4]), pos.clone());
        let good_outs = [f(&q), f(&cache), f(&cache)];
        let (dims, _, _) = rotary_kv_write(&op, &good_ins, &good_outs).unwrap();
        assert_eq!(dims, AttentionDims { b: 2, hq: 14, hk: 2, s: 1, t: 40, d: 8 });
        assert_eq!(dims.positions_free(), 40);
        // Counts.
        let err = rotary_kv_write(&op, &good_ins[..5], &good_outs).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        let refused = |ins: &[Fake], outs: &[Fake]| rotary_kv_write(&op, ins, outs).unwrap_err();
        // An odd head dim, k of another batch or length, a rank-3 q.
        let odd = refused(&ins(f(&[2, 14, 1, 7]), f(&[2, 2, 1, 7]), f(&[1, 3]), pos.clone()), &good_outs);
        assert_eq!(
            (odd.kind, odd.message.as_str()),
            (ErrorKind::ShapeMismatch, "rotary_kv_write: the head dim of q [2, 14, 1, 7] must be even")
        );
        let err = refused(&ins(f(&q), f(&[2, 2, 2, 8]), f(&[1, 4]), pos.clone()), &good_outs);
        assert_eq!(err.kind, ErrorKind::ShapeMismatch);
        assert!(err.message.contains("differ in batch, positions or head dim"), "{}", err.message);
        assert_eq!(
            refused(&ins(f(&[2, 14, 8]), f(&kv), f(&[1, 4]), pos.clone()), &good_outs).kind,
            ErrorKind::ShapeMismatch
        );
        // cos/sin of the wrong shape, a position of two elements or of another dtype.
        let err = refused(&ins(f(&q), f(&kv), f(&[2, 4]), pos.clone()), &good_outs);
        assert_eq!(err.message, "rotary_kv_write: cos has shape [2, 4], expected [1, 4]");
        assert_eq!(
            refused(&ins(f(&q), f(&kv), f(&[1, 4]), Fake::new(DType::I64, &[2])), &good_outs).kind,
            ErrorKind::ShapeMismatch
        );
        let err = refused(&ins(f(&q), f(&kv), f(&[1, 4]), Fake::new(DType::I32, &[1])), &good_outs);
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::DtypeMismatch, "rotary_kv_write: position is int32, expected int64")
        );
        // Caches shorter than the new positions, of other heads, or unlike each other.
        let many = ins(f(&[1, 2, 5, 8]), f(&[1, 1, 5, 8]), f(&[5, 4]), pos.clone());
        let short = refused(&many, &[f(&[1, 2, 5, 8]), f(&[1, 1, 4, 8]), f(&[1, 1, 4, 8])]);
        assert_eq!(short.kind, ErrorKind::ShapeMismatch);
        assert!(short.message.contains("with t >= 5"), "{}", short.message);
        assert!(rotary_kv_write(&op, &many, &[f(&[1, 2, 5, 8]), f(&[1, 1, 5, 8]), f(&[1, 1, 5, 8])]).is_ok());
        assert_eq!(refused(&good_ins, &[f(&q), f(&[2, 1, 40, 8]), f(&[2, 1, 40, 8])]).kind, ErrorKind::ShapeMismatch);
        assert_eq!(refused(&good_ins, &[f(&q), f(&cache), f(&[2, 2, 41, 8])]).kind, ErrorKind::ShapeMismatch);
        assert_eq!(refused(&good_ins, &[f(&[2, 14, 1, 4]), f(&cache), f(&cache)]).kind, ErrorKind::ShapeMismatch);
        // Dtypes: one float dtype for every operand but the position.
        let h = |shape: &[usize]| Fake::new(DType::F16, shape);
        let err = refused(&good_ins, &[f(&q), f(&cache), h(&cache)]);
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::DtypeMismatch, "rotary_kv_write: v_cache is float16, expected float32")
        );
        let err = refused(&ins(f(&q), h(&kv), f(&[1, 4]), pos.clone()), &good_outs);
        assert_eq!(err.kind, ErrorKind::DtypeMismatch);
        let i = |shape: &[usize]| Fake::new(DType::I64, shape);
        let err = refused(&ins(i(&q), i(&kv), i(&[1, 4]), pos.clone()), &[i(&q), i(&cache), i(&cache)]);
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::Unsupported, "rotary_kv_write: q is int64, expected a float dtype")
        );
        // A cache that overlaps itself.
        let overlapping = Fake(DType::F32, cache.to_vec(), vec![8, 8, 8, 1]);
        let err = refused(&good_ins, &[f(&q), f(&cache), overlapping]);
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains("overlaps itself"), "{}", err.message);
    }

    #[test]
    fn swiglu_operands_share_one_shape_and_dtype() {
        let f = |shape: &[usize]| Fake::new(DType::F32, shape);
        assert!(swiglu(&Op::SwiGlu, &[f(&[2, 3]), f(&[2, 3])], &[f(&[2, 3])]).is_ok());
        let err = swiglu(&Op::SwiGlu, &[f(&[2, 3]), f(&[3, 2])], &[f(&[2, 3])]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::ShapeMismatch);
        assert!(err.message.starts_with("swiglu: up has shape [3, 2]"), "{}", err.message);
        let op = Op::SwiGluBackward;
        let ins = [f(&[4]), f(&[4]), f(&[4])];
        assert!(swiglu_backward(&op, &ins, &[f(&[4]), f(&[4])]).is_ok());
        let err = swiglu_backward(&op, &ins, &[f(&[4]), Fake::new(DType::F16, &[4])]).unwrap_err();
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::DtypeMismatch, "swiglu_backward: dup is float16, expected float32")
        );
    }
}
