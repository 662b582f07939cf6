//! SwiGLU, the gated feed-forward's activation `silu(gate) · up`: the fused kernel when the
//! device claims it, the composition otherwise.

use super::{common_device, exec, exec_views};
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
        if !fused_backward(dy, &gate)? {
            return Ok(composed_backward(dy, &gate, &up)?.map(Some).to_vec());
        }
        let (dgate, dup) = (Tensor::empty(gate.shape(), gate.dtype(), gate.device())?, Tensor::empty(up.shape(), up.dtype(), up.device())?);
        let outputs = [(&dgate, dgate.layout()), (&dup, dup.layout())];
        exec_views(&Op::SwiGluBackward, &[(dy, dy.layout()), (&gate, gate.layout()), (&up, up.layout())], &outputs)?;
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
    let halves = move |t: &Tensor| -> [Tensor; 2] {
        let d = t.rank() - 1;
        [t.with_layout(t.layout().slice(d, 0, n, 1)), t.with_layout(t.layout().slice(d, n, n, 1))]
    };
    let mut shape = p.shape().to_vec();
    shape[p.rank() - 1] = n;
    let y = Tensor::empty(&shape, p.dtype(), p.device())?;
    let [gate, up] = halves(p);
    exec(&op, &[(&gate, gate.layout()), (&up, up.layout())], &[&y])?;
    let saved = Saved::new(p);
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let dy = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        let p = saved.get("swiglu_halves")?;
        if !fused_backward(dy, p)? {
            // Views through `split` keep the link to `p` that a gradient of this gradient needs.
            let halves = p.split_with_sizes(&[n, n], -1)?;
            return Ok(vec![Some(Tensor::cat(&composed_backward(dy, &halves[0], &halves[1])?, -1)?)]);
        }
        let [gate, up] = halves(p);
        let dp = Tensor::empty(&[&gate.shape()[..gate.rank() - 1], &[2 * n]].concat(), gate.dtype(), gate.device())?;
        let [dgate, dup] = halves(&dp);
        let outputs = [(&dp, dgate.layout()), (&dp, dup.layout())];
        exec_views(&Op::SwiGluBackward, &[(dy, dy.layout()), (&gate, gate.layout()), (&up, up.layout())], &outputs)?;
        Ok(vec![Some(dp)])
    });
    Ok(record("swiglu", &[p], vec![y], backward).remove(0))
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
