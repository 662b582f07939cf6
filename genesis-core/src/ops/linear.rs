//! `linear`: `x @ weight^T + bias`, in the autocast low-precision dtype inside a scope.

use super::{dtype_err, shape_err};
use crate::amp::{autocast_dtype, cast_for, CastPolicy};
use crate::autograd::{is_grad_enabled, no_grad, record1, Saved};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::{DType, Op};

/// `x (.., in) @ weight (out, in)^T + bias (out)` (`F.linear`).
///
/// Under autocast an f32 weight is multiplied in the autocast dtype, as in PyTorch. Where the
/// backend writes f32 products of half-precision operands (interface 1.13), the weight's
/// gradient is then formed in f32 by the product itself rather than rounded to the autocast
/// dtype and cast back (PyTorch's order): the same f32 sums, one rounding fewer, and no cast.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let x = cast_for(CastPolicy::Low, x)?;
    let low_weight = widened_grad_dtype(&x, weight);
    let w = match low_weight {
        Some(low) => no_grad(|| weight.to_dtype(low))?,
        None => cast_for(CastPolicy::Low, weight)?,
    };
    if w.rank() != 2 || x.rank() == 0 || x.shape()[x.rank() - 1] != w.shape()[1] {
        return Err(shape_err(format!(
            "linear: input {:?} does not fit weight {:?} (expected (.., in) and (out, in))",
            x.shape(),
            w.shape()
        )));
    }
    if x.dtype() != w.dtype() {
        return Err(dtype_err(format!("linear: input dtype {} differs from weight dtype {}", x.dtype(), w.dtype())));
    }
    let y = match low_weight {
        Some(_) => product_with_f32_weight_grad(&x, weight, w.clone())?,
        None => x.matmul(&w.t()?)?,
    };
    match bias {
        None => Ok(y),
        Some(b) => {
            let b = cast_for(CastPolicy::Low, b)?;
            if b.shape() != [w.shape()[0]] {
                return Err(shape_err(format!("linear: bias {:?} should have shape [{}]", b.shape(), w.shape()[0])));
            }
            y.add(&b.to_dtype(y.dtype())?)
        }
    }
}

/// The autocast dtype when `x @ weight^T` takes [`product_with_f32_weight_grad`]: an f32
/// weight (rank 2, on `x`'s device) whose gradient is recorded, `x` already in that dtype, and
/// a backend that writes f32 products of half-precision operands.
fn widened_grad_dtype(x: &Tensor, weight: &Tensor) -> Option<DType> {
    let low = autocast_dtype().filter(|d| matches!(d, DType::F16 | DType::BF16))?;
    let applies = weight.dtype() == DType::F32
        && weight.rank() == 2
        && x.dtype() == low
        && x.rank() >= 2
        && is_grad_enabled()
        && weight.requires_grad()
        && x.device() == weight.device()
        && x.device().backend().takes_widened_matmul();
    applies.then_some(low)
}

/// `x @ w_low^T`, recorded as one node whose inputs are `x` and the f32 `weight` (`w_low` is
/// its cast to `x`'s dtype, made without recording): the backward forms `dx = g @ w_low` in
/// `x`'s dtype and `dweight = gᵀ @ x` over all the rows as one widened product, in f32. A
/// backward that builds a graph (`create_graph`) takes the recorded composition instead (the
/// cast, then products in the half dtype), so that gradients of gradients reach the weight.
fn product_with_f32_weight_grad(x: &Tensor, weight: &Tensor, w_low: Tensor) -> Result<Tensor> {
    let y = no_grad(|| x.matmul(&w_low.t()?))?;
    let (sx, sw, sw_low) = (Saved::new(x), Saved::new(weight), Saved::new(&w_low));
    let x_grad = x.requires_grad();
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = g[0].as_ref().ok_or_else(|| Error::invalid("linear: missing gradient"))?;
        let x = sx.get("linear")?;
        let (out, inp) = (g.shape()[g.rank() - 1] as isize, x.shape()[x.rank() - 1] as isize);
        let (g2, x2) = (g.reshape(&[-1, out])?, x.reshape(&[-1, inp])?);
        if is_grad_enabled() {
            let w_low = sw.get("linear")?.to_dtype(x.dtype())?;
            let dw = g2.t()?.matmul(&x2)?.to_dtype(DType::F32)?;
            return Ok(vec![x_grad.then(|| g.matmul(&w_low)).transpose()?, Some(dw)]);
        }
        let dx = x_grad.then(|| g.matmul(sw_low.get("linear")?)).transpose()?;
        Ok(vec![dx, Some(super::matmul::matmul_widened(&g2.t()?, &x2)?)])
    });
    Ok(record1("linear", &[x, weight], y, backward))
}

/// `(linear(rms_norm(x + residual), weight, bias), x + residual)`: a pre-norm transformer's
/// residual addition, the RMS norm over the last dim after it (weight `norm_weight`) and the
/// linear layer that reads the norm, which is what
/// `let (h, sum) = add_rms_norm(x, residual, ..)?; (linear(&h, weight, bias)?, sum)` gives.
///
/// With `gated`, `weight (2n, k)` is a gated feed-forward's stacked projection, the gate's
/// rows then the up projection's, and the first output is `swiglu(p[.., :n], p[.., n:])` of
/// the linear layer's `p (.., 2n)`, as `swiglu_halves(&p)` gives; `p` itself is never
/// stored by the fused op.
///
/// Without recorded gradients, with one float dtype throughout and autocast off, it is one op
/// of the backend (`add_rms_norm_linear`) when the backend claims it: on a GPU a decode step's
/// norm then costs no launch of its own. Otherwise, and whenever a gradient is recorded, it
/// is that composition (the op is forward only). Not in PyTorch.
pub fn add_rms_norm_linear(
    x: &Tensor,
    residual: &Tensor,
    norm_weight: Option<&Tensor>,
    eps: Option<f64>,
    weight: &Tensor,
    bias: Option<&Tensor>,
    gated: bool,
) -> Result<(Tensor, Tensor)> {
    let k = x.shape().last().copied().unwrap_or(0);
    let rows = weight.shape().first().copied().unwrap_or(0);
    if gated && rows % 2 != 0 {
        return Err(shape_err(format!(
            "add_rms_norm_linear: a gated weight stacks gate and up rows, so its row count must be even, got {:?}",
            weight.shape()
        )));
    }
    let composition = || -> Result<(Tensor, Tensor)> {
        let (h, sum) = super::norm::add_rms_norm(x, residual, &[k], norm_weight, eps)?;
        let p = linear(&h, weight, bias)?;
        let y = if gated { super::swiglu::swiglu_halves(&p)? } else { p };
        Ok((y, sum))
    };
    let dtype = x.dtype();
    let operands: Vec<&Tensor> =
        [Some(x), Some(residual), norm_weight, Some(weight), bias].into_iter().flatten().collect();
    let recorded = crate::autograd::is_grad_enabled() && operands.iter().any(|t| t.requires_grad());
    let plain = !recorded
        && !crate::amp::is_autocast_enabled()
        && dtype.is_float()
        && x.rank() >= 1
        && residual.shape() == x.shape()
        && norm_weight.is_some()
        && operands.iter().all(|t| t.dtype() == dtype && t.device() == x.device());
    if !plain {
        return composition();
    }
    let eps = super::norm::rms_eps(eps, dtype, |eps| Op::AddRmsNormLinear { eps, gated })?;
    let op = Op::AddRmsNormLinear { eps, gated };
    if !super::fused::use_fused(&op, x)? {
        return composition();
    }
    let mut y_shape = x.shape().to_vec();
    *y_shape.last_mut().unwrap_or(&mut 0) = if gated { rows / 2 } else { rows };
    let (y, sum) = (Tensor::empty(&y_shape, dtype, x.device())?, Tensor::empty(x.shape(), dtype, x.device())?);
    let inputs: Vec<(&Tensor, &crate::tensor::Layout)> = operands.iter().map(|t| (*t, t.layout())).collect();
    super::exec(&op, &inputs, &[&y, &sum])?;
    Ok((y, sum))
}
