//! Rotary position embedding in the "rotate half" layout: the fused kernel when the device
//! claims it, a composition otherwise; the backward is the inverse rotation. And the decode
//! step's fused rotary embedding and key/value cache write ([`rotary_kv_write`]).

use super::{common_device, dtype_err, exec};
use crate::autograd::record1;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::sdk::checks::{self, Geometry};
use genesis_backend_api::{DType, Op};

/// Rotary position embedding of `x (b, h, s, d)` in the "rotate half" layout with `cos, sin`
/// of shape `(s, d/2)` (x's dtype): pairs `(i, i + d/2)` are rotated by the angle of their
/// position. `cos` and `sin` are treated as constants (no gradient flows to them).
pub fn rotary_embedding(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if !x.dtype().is_float() {
        return Err(dtype_err(format!("rotary: expected a floating-point x, got {}", x.dtype())));
    }
    // The SDK's rules and wording (y, not yet allocated, is described like x).
    let inputs = [x, cos, sin].map(Geometry::like);
    checks::rotary(&Op::Rotary { inverse: false }, &inputs, &[Geometry::dense(x.dtype(), x.shape())])?;
    common_device("rotary", &[x, cos, sin])?;
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
    let y = x.empty_like()?;
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

/// The decode step's rotary embedding and cache write: returns `rotary(q)` for `q (b, hq, s,
/// d)` and writes `rotary(k)` and `v` (both `(b, hk, s, d)`) into the caches `k_cache,
/// v_cache (b, hk, t, d)` at positions `p..p + s`, with `p` the value of the device tensor
/// `position (1,)` (i64) and `cos, sin (s, d/2)` the angles of those positions. One fused
/// kernel when the device claims `RotaryKvWrite`; else `rotary_embedding` of q and k and
/// `index_add_` of k and v into the caches, which writes the values only where the caches
/// hold zeros: **the positions `p..p + s` of both caches must be zero**, as for
/// [`KvCache::write_at`](crate::models::KvCache::write_at). Either way a `p` outside
/// `[0, t - s]` is an error (on a device that checks indices on the device, from the next
/// synchronization) and writes nothing into the caches. The position is never read on the
/// host, so the call can be captured in a graph. Not differentiable: tensors that take part
/// in autograd are refused (run it under `no_grad`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rotary_kv_write(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    position: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
) -> Result<Tensor> {
    const NAME: &str = "rotary_kv_write";
    k_cache.check_in_place(NAME, &[v_cache, q, k, v, cos, sin])?;
    if !q.dtype().is_float() {
        return Err(dtype_err(format!("{NAME}: expected a floating-point q, got {}", q.dtype())));
    }
    // The SDK's rules and wording (q_out, not yet allocated, is described like q).
    let inputs = [q, k, v, cos, sin, position].map(Geometry::like);
    let outputs = [Geometry::dense(q.dtype(), q.shape()), Geometry::like(k_cache), Geometry::like(v_cache)];
    let (dims, _, _) = checks::rotary_kv_write(&Op::RotaryKvWrite, &inputs, &outputs)?;
    let s = dims.s;
    common_device(NAME, &[q, k, v, cos, sin, position, k_cache, v_cache])?;
    let op = Op::RotaryKvWrite;
    if !super::fused::use_fused(&op, q)? {
        let q_out = rotary_embedding(q, cos, sin)?;
        let k_rot = rotary_embedding(k, cos, sin)?;
        let index = if s == 1 {
            position.clone()
        } else {
            position.add(&Tensor::arange(0.0, s as f64, 1.0, DType::I64, q.device())?)?
        };
        k_cache.index_add_(2, &index, &k_rot)?;
        v_cache.index_add_(2, &index, v)?;
        return Ok(q_out);
    }
    let q_out = Tensor::empty(q.shape(), q.dtype(), q.device())?;
    let inputs = [q, k, v, cos, sin, position].map(|x| (x, x.layout()));
    exec(&op, &inputs, &[&q_out, k_cache, v_cache])?;
    k_cache.storage().bump_version();
    v_cache.storage().bump_version();
    Ok(q_out)
}
