//! SwiGLU, the gated feed-forward's activation `silu(gate) · up`: the fused kernel when the
//! device claims it, the composition otherwise.

use super::{common_device, exec, exec_views};
use crate::amp::{cast_for, CastPolicy};
use crate::autograd::{is_grad_enabled, record, Saved};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::Op;

/// `silu(gate) · up`, the activation of the SwiGLU feed-forward (LLaMA, Qwen2): the same
/// result as `gate.silu()?.mul(up)` (PyTorch's `F.silu(gate) * up`), with its broadcasting and
/// type promotion. When both have one shape and float dtype and the device has the fused
/// kernel, it runs as one kernel and its backward as one more, saving only `gate` and `up`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    common_device("swiglu", &[gate, up])?;
    let op = Op::SwiGlu;
    let same = gate.shape() == up.shape() && gate.dtype() == up.dtype() && gate.dtype().is_float();
    if !same || !super::fused::use_fused(&op, gate)? {
        return gate.silu()?.mul(up);
    }
    let y = Tensor::empty(gate.shape(), gate.dtype(), gate.device())?;
    exec(&op, &[(gate, gate.layout()), (up, up.layout())], &[&y])?;
    let (sg, su) = (Saved::new(gate), Saved::new(up));
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let dy = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        let (gate, up) = (sg.get("swiglu")?, su.get("swiglu")?);
        if !fused_backward(dy, gate)? {
            return Ok(composed_backward(dy, gate, up)?.map(Some).to_vec());
        }
        let (dgate, dup) = (
            Tensor::empty(gate.shape(), gate.dtype(), gate.device())?,
            Tensor::empty(up.shape(), up.dtype(), up.device())?,
        );
        exec(&Op::SwiGluBackward, &[(dy, dy.layout()), (gate, gate.layout()), (up, up.layout())], &[&dgate, &dup])?;
        Ok(vec![Some(dgate), Some(dup)])
    });
    Ok(record("swiglu", &[gate, up], vec![y], backward).remove(0))
}

/// `swiglu` of the two halves of the last dim of `p (.., 2n)`: `silu(p[.., :n]) · p[.., n:]`,
/// a gated feed-forward whose gate and up projections run as one stacked layer (the halves
/// split as `F.glu` splits its input). With the fused kernels the gradient is written into
/// one `(.., 2n)` buffer, each half in place, rather than as two tensors joined afterwards.
pub fn swiglu_halves(p: &Tensor) -> Result<Tensor> {
    let last = p.shape().last().copied().unwrap_or(0);
    if p.rank() == 0 || last % 2 != 0 {
        return Err(super::shape_err(format!("swiglu_halves: the last dim of {:?} must be even", p.shape())));
    }
    let n = last / 2;
    let op = Op::SwiGlu;
    if !p.dtype().is_float() || !super::fused::use_fused(&op, p)? {
        let halves = p.split_with_sizes(&[n, n], -1)?;
        return swiglu(&halves[0], &halves[1]);
    }
    let y = Tensor::empty(&halves_out_shape(p), p.dtype(), p.device())?;
    let [gate, up] = halves(p);
    exec(&op, &[(&gate, gate.layout()), (&up, up.layout())], &[&y])?;
    let saved = Saved::new(p);
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let dy = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        Ok(vec![Some(halves_backward(dy, saved.get("swiglu_halves")?)?)])
    });
    Ok(record("swiglu", &[p], vec![y], backward).remove(0))
}

/// `linear(swiglu_halves(p), weight)` without a bias, the end of a gated feed-forward
/// (`down(silu(gate) · up)` from the stacked gate/up projection `p (.., 2n)`, `weight
/// (out, n)`), whose backward computes `swiglu_halves(p)` again instead of keeping it: the
/// `(.., n)` activation, the largest a transformer layer would save after `p`, is not held
/// from the forward to the backward pass (one extra SwiGLU kernel in the backward). Under
/// autocast it runs in the low-precision dtype, as `linear` does. Not in PyTorch, where
/// `torch.utils.checkpoint` around the activation and the layer recomputes both.
pub fn swiglu_linear(p: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let p = cast_for(CastPolicy::Low, p)?;
    let w = cast_for(CastPolicy::Low, weight)?;
    let n = p.shape().last().copied().unwrap_or(0) / 2;
    if w.rank() != 2 || w.shape()[1] != n {
        return Err(super::shape_err(format!(
            "swiglu_linear: weight {:?} does not fit the halves of {:?} (expected (out, {n}))",
            w.shape(),
            p.shape()
        )));
    }
    let y = crate::autograd::no_grad(|| super::linear::linear(&swiglu_halves(&p)?, &w, None))?;
    let (sp, sw) = (Saved::new(&p), Saved::new(&w));
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let dy = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        let (p, w) = (sp.get("swiglu_linear")?, sw.get("swiglu_linear")?);
        let h = swiglu_halves(p)?;
        let rows = |t: &Tensor| t.reshape(&[-1, *t.shape().last().unwrap_or(&0) as isize]);
        let dw = rows(dy)?.t()?.matmul(&rows(&h)?)?;
        drop(h);
        let dp = halves_backward(&dy.matmul(w)?, p)?;
        Ok(vec![Some(dp), Some(dw)])
    });
    Ok(record("swiglu_linear", &[&p, &w], vec![y], backward).remove(0))
}

/// `p (.., 2n)`'s gate and up halves as views, without autograd links.
fn halves(p: &Tensor) -> [Tensor; 2] {
    let (d, n) = (p.rank() - 1, p.shape()[p.rank() - 1] / 2);
    [p.with_layout(p.layout().slice(d, 0, n, 1)), p.with_layout(p.layout().slice(d, n, n, 1))]
}

/// The shape of `swiglu_halves(p)`: `p`'s with the last dim halved.
fn halves_out_shape(p: &Tensor) -> Vec<usize> {
    let mut shape = p.shape().to_vec();
    shape[p.rank() - 1] /= 2;
    shape
}

/// The gradient of `swiglu_halves(p)` for `p` from the output's `dy`: one `(.., 2n)` buffer
/// that the fused kernel writes half by half, or the composition (differentiable, for a
/// gradient of this gradient).
fn halves_backward(dy: &Tensor, p: &Tensor) -> Result<Tensor> {
    if !fused_backward(dy, p)? {
        // Views through `split` keep the link to `p` that a gradient of this gradient needs.
        let n = p.shape()[p.rank() - 1] / 2;
        let parts = p.split_with_sizes(&[n, n], -1)?;
        return Tensor::cat(&composed_backward(dy, &parts[0], &parts[1])?, -1);
    }
    let [gate, up] = halves(p);
    let inputs = [(dy, dy.layout()), (&gate, gate.layout()), (&up, up.layout())];
    if !p.device().backend().takes_interleaved_outputs() {
        let (dgate, dup) =
            (Tensor::empty(gate.shape(), p.dtype(), p.device())?, Tensor::empty(up.shape(), p.dtype(), p.device())?);
        exec_views(&Op::SwiGluBackward, &inputs, &[(&dgate, dgate.layout()), (&dup, dup.layout())])?;
        return Tensor::cat(&[dgate, dup], -1);
    }
    let dp = Tensor::empty(p.shape(), p.dtype(), p.device())?;
    let [dgate, dup] = halves(&dp);
    exec_views(&Op::SwiGluBackward, &inputs, &[(&dp, dgate.layout()), (&dp, dup.layout())])?;
    Ok(dp)
}

/// Whether the backward runs as the fused kernel: the device has it, `dy` has the
/// operands' dtype, and no gradient of the gradient is recorded.
fn fused_backward(dy: &Tensor, gate: &Tensor) -> Result<bool> {
    Ok(!is_grad_enabled() && dy.dtype() == gate.dtype() && super::fused::use_fused(&Op::SwiGluBackward, dy)?)
}

/// `[dgate, dup]` by the composition (differentiable, for higher-order gradients).
fn composed_backward(dy: &Tensor, gate: &Tensor, up: &Tensor) -> Result<[Tensor; 2]> {
    let s = gate.sigmoid()?;
    let dup = dy.mul(&gate.mul(&s)?)?;
    let dsilu = s.mul(&gate.mul(&s.neg()?.add_scalar(1.0)?)?.add_scalar(1.0)?)?;
    Ok([dy.mul(up)?.mul(&dsilu)?, dup])
}
