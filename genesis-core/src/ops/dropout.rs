//! Dropout, drawing its mask from the default generator so `manual_seed` reproduces it. The
//! mask is a pure function of `(seed, offset)`: the fused kernel and the composition draw the
//! same uniforms (`RandUniform` at the same position), and the backward redraws instead of
//! saving the mask.

use super::exec;
use crate::autograd::{is_grad_enabled, record1};
use crate::error::{Error, Result};
use crate::random::Generator;
use crate::tensor::Tensor;
use genesis_backend_api::sdk::philox::Draw;
use genesis_backend_api::Op;

/// The keep mask (1 kept, 0 dropped) scaled by `1/(1-p)`, in `like`'s dtype and shape.
fn scaled_mask(like: &Tensor, seed: u64, offset: u64, p: f64) -> Result<Tensor> {
    let u = Tensor::empty(like.shape(), like.dtype(), like.device())?;
    exec(&Op::RandUniform { seed, offset, low: 0.0, high: 1.0 }, &[], &[&u])?;
    u.ge_scalar(p)?.to_dtype(like.dtype())?.div_scalar(1.0 - p)
}

/// Zero each element with probability `p` and scale the rest by `1/(1-p)` in training; the
/// identity otherwise (`F.dropout`). `p = 1` zeroes everything.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid(format!("dropout: p must be in [0, 1], got {p}")));
    }
    if !x.dtype().is_float() {
        return Err(super::dtype_err(format!("dropout: expected a floating-point input, got {}", x.dtype())));
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    if p == 1.0 {
        return x.mul_scalar(0.0);
    }
    let (seed, offset) = Generator::default_for(x.device()).advance(Draw::Uniform, x.dtype(), x.numel());
    let op = Op::Dropout { seed, offset, p };
    if !super::fused::use_fused(&op, x)? {
        return x.mul(&scaled_mask(x, seed, offset, p)?);
    }
    let y = Tensor::empty(x.shape(), x.dtype(), x.device())?;
    exec(&op, &[(x, x.layout())], &[&y])?;
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        if !is_grad_enabled() && super::fused::use_fused(&op, g)? {
            let dx = Tensor::empty(g.shape(), g.dtype(), g.device())?;
            exec(&op, &[(g, g.layout())], &[&dx])?;
            return Ok(vec![Some(dx)]);
        }
        Ok(vec![Some(g.mul(&scaled_mask(g, seed, offset, p)?)?)])
    });
    Ok(record1("dropout", &[x], y, backward))
}
