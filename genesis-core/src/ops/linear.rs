//! `linear`: `x @ weight^T + bias`, in the autocast low-precision dtype inside a scope.

use super::{dtype_err, shape_err};
use crate::amp::{cast_for, CastPolicy};
use crate::error::Result;
use crate::tensor::Tensor;

/// `x (.., in) @ weight (out, in)^T + bias (out)` (`F.linear`).
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let x = cast_for(CastPolicy::Low, x)?;
    let w = cast_for(CastPolicy::Low, weight)?;
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
    let y = x.matmul(&w.t()?)?;
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
