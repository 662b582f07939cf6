//! SwiGLU, the gated feed-forward's activation `silu(gate) · up`: the fused kernel when the
//! device claims it, the composition otherwise.

use super::{common_device, exec};
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
        // With a graph of the gradients wanted (double backward), the composition records it.
        if is_grad_enabled() || !super::fused::use_fused(&Op::SwiGluBackward, dy)? || dy.dtype() != gate.dtype() {
            let s = gate.sigmoid()?;
            let dup = dy.mul(&gate.mul(&s)?)?;
            let dsilu = s.mul(&gate.mul(&s.neg()?.add_scalar(1.0)?)?.add_scalar(1.0)?)?;
            return Ok(vec![Some(dy.mul(up)?.mul(&dsilu)?), Some(dup)]);
        }
        let dgate = Tensor::empty(gate.shape(), gate.dtype(), gate.device())?;
        let dup = Tensor::empty(gate.shape(), gate.dtype(), gate.device())?;
        exec(&Op::SwiGluBackward, &[(dy, dy.layout()), (gate, gate.layout()), (up, up.layout())], &[&dgate, &dup])?;
        Ok(vec![Some(dgate), Some(dup)])
    });
    Ok(record("swiglu", &[gate, up], vec![y], backward).remove(0))
}
