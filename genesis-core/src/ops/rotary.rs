//! Rotary position embedding in the "rotate half" layout: the fused kernel when the device
//! claims it, a composition otherwise; the backward is the inverse rotation.

use super::{common_device, dtype_err, exec, shape_err};
use crate::autograd::record1;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::Op;

/// Rotary position embedding of `x (b, h, s, d)` in the "rotate half" layout with `cos, sin`
/// of shape `(s, d/2)` (x's dtype): pairs `(i, i + d/2)` are rotated by the angle of their
/// position. `cos` and `sin` are treated as constants (no gradient flows to them).
pub fn rotary_embedding(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if x.rank() != 4 || x.shape()[3] % 2 != 0 {
        return Err(shape_err(format!("rotary: x must be (b, h, s, d) with an even d, got {:?}", x.shape())));
    }
    let (s, half) = (x.shape()[2], x.shape()[3] / 2);
    for t in [cos, sin] {
        if t.shape() != [s, half] {
            return Err(shape_err(format!("rotary: cos/sin must have shape [{s}, {half}], got {:?}", t.shape())));
        }
        if t.dtype() != x.dtype() || !x.dtype().is_float() {
            return Err(dtype_err(format!(
                "rotary: x ({}) and cos/sin ({}) must share a float dtype",
                x.dtype(),
                t.dtype()
            )));
        }
        common_device("rotary", &[x, t])?;
    }
    rotary(x, &cos.detach(), &sin.detach(), false)
}

fn rotary(x: &Tensor, cos: &Tensor, sin: &Tensor, inverse: bool) -> Result<Tensor> {
    let op = Op::Rotary { inverse };
    if !super::fused::use_fused(&op, x)? {
        let half = x.shape()[3];
        let half = half / 2;
        let (x1, x2) = (x.narrow(-1, 0, half)?, x.narrow(-1, half, half)?);
        let sin = if inverse { sin.neg()? } else { sin.clone() };
        return Tensor::cat(&[x1.mul(cos)?.sub(&x2.mul(&sin)?)?, x2.mul(cos)?.add(&x1.mul(&sin)?)?], -1);
    }
    let y = Tensor::empty(x.shape(), x.dtype(), x.device())?;
    exec(&op, &[(x, x.layout()), (cos, cos.layout()), (sin, sin.layout())], &[&y])?;
    let (c, s) = (cos.clone(), sin.clone());
    // The rotation is linear and orthogonal: its backward is the inverse rotation, itself
    // recorded, so higher-order gradients follow.
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        Ok(vec![Some(rotary(g, &c, &s, !inverse)?)])
    });
    Ok(record1("rotary", &[x], y, backward))
}
