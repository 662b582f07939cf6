//! Scaled dot-product attention (the fused kernel when claimed and no explicit mask is given,
//! a composition otherwise).

use super::{common_device, dtype_err, exec, shape_err};
use crate::amp::{cast_for, CastPolicy};
use crate::autograd::{is_grad_enabled, record, Saved};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::sdk::checks::{self, Geometry};
use genesis_backend_api::{DType, Op};

/// `k (b, hk, t, d)` repeated to `hq = hk·group` heads (query head `h` reads kv head
/// `h / group`, as the kernel does).
fn repeat_kv(k: &Tensor, group: usize) -> Result<Tensor> {
    if group == 1 {
        return Ok(k.clone());
    }
    let s = k.shape();
    let (b, hk, t, d) = (s[0] as isize, s[1] as isize, s[2] as isize, s[3] as isize);
    k.unsqueeze(2)?.expand(&[b, hk, group as isize, t, d])?.reshape(&[b, hk * group as isize, t, d])
}

/// Where the causal mask's diagonal starts when there are `s` queries and `t` keys. The two
/// agree when `s == t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Causal {
    /// Key `j` is visible to query `i` when `j <= i` (PyTorch's `is_causal`).
    UpperLeft,
    /// Key `j` is visible to query `i` when `j <= i + t - s`: the queries are the last `s`
    /// positions of the `t` keys (a KV cache; PyTorch's `causal_lower_right`, the backend
    /// kernel's `causal`).
    LowerRight,
}

/// The `(s, t)` bool mask of the keys each query sees.
fn causal_keep(s: usize, t: usize, causal: Causal, like: &Tensor) -> Result<Tensor> {
    // Positions in f32 where it holds them exactly: a float arange is in the required set, an
    // integer one is not, so a backend with only that set still runs causal attention.
    let dtype = if t <= 1 << f32::MANTISSA_DIGITS { DType::F32 } else { DType::I64 };
    let i = Tensor::arange(0.0, s as f64, 1.0, dtype, like.device())?.unsqueeze(1)?;
    let j = Tensor::arange(0.0, t as f64, 1.0, dtype, like.device())?.unsqueeze(0)?;
    let shift = if causal == Causal::LowerRight { t as i64 - s as i64 } else { 0 };
    j.sub_scalar(shift)?.le(&i)
}

/// `scores` where `keep` is true, `-inf` elsewhere (one `where`: no bool op is needed, which a
/// backend with only the required set may lack).
fn hide_unkept(scores: &Tensor, keep: &Tensor) -> Result<Tensor> {
    let hidden = Tensor::full(&[], f64::NEG_INFINITY, scores.dtype(), scores.device())?;
    Tensor::where_(keep, scores, &hidden)
}

/// Attention probabilities `softmax(scale·q kᵀ + mask)` with `k` already repeated to q's heads.
fn probabilities(q: &Tensor, k: &Tensor, mask: Option<&Tensor>, causal: Option<Causal>, scale: f64) -> Result<Tensor> {
    let mut scores = q.matmul(&k.transpose(-1, -2)?)?.mul_scalar(scale)?;
    if let Some(causal) = causal {
        scores = hide_unkept(&scores, &causal_keep(q.shape()[2], k.shape()[2], causal, q)?)?;
    }
    if let Some(m) = mask {
        scores = if m.dtype() == DType::Bool {
            hide_unkept(&scores, m)?
        } else {
            scores.add(&m.to_dtype(scores.dtype())?)?
        };
    }
    scores.softmax(-1)
}

/// A mask of rank up to 4 with leading dims of size 1 added to make it `(b, h, s, t)`-shaped.
fn rank4(mask: &Tensor) -> Result<Tensor> {
    let mut m = mask.clone();
    while m.rank() < 4 {
        m = m.unsqueeze(0)?;
    }
    Ok(m)
}

/// The backend's `MaskedAttention` kernel, when it applies: a bool mask shared by the heads
/// (`(b, 1, s, t)` or broadcastable to it), no causal flag, nothing to differentiate (the op
/// has no backward), and the op claimed. `None` otherwise.
fn masked_fused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: Option<Causal>,
    scale: f64,
) -> Result<Option<Tensor>> {
    let Some(mask) = mask.filter(|m| m.dtype() == DType::Bool && m.rank() <= 4) else { return Ok(None) };
    let heads_shared = mask.rank() < 3 || mask.shape()[mask.rank() - 3] == 1;
    let differentiable = is_grad_enabled() && [q, k, v].iter().any(|t| t.requires_grad());
    let op = Op::MaskedAttention { scale };
    if causal.is_some() || !heads_shared || differentiable || !super::fused::use_fused(&op, q)? {
        return Ok(None);
    }
    let (qs, t) = (q.shape(), k.shape()[2]);
    // (.., 1, s, t) → (b, s, t), a broadcast view.
    let keep = rank4(mask)?.squeeze(Some(1))?.expand(&[qs[0] as isize, qs[2] as isize, t as isize])?;
    // o (and below dq, dk, dv) in the memory order of q (k, v): for the model's views of
    // `(b, s, h·d)` projections, o is then a view of `(b, s, h·d)` too.
    let o = q.empty_like()?;
    exec(&op, &[(q, q.layout()), (k, k.layout()), (v, v.layout()), (&keep, keep.layout())], &[&o])?;
    Ok(Some(o))
}

/// The composition `softmax(scale·q kᵀ + mask) v` for `q (b, hq, s, d)` and `k, v (b, hk, t,
/// d)`: each kv head's `group` query heads are stacked into one matrix of `group·s` rows (a
/// reshape), so `k` and `v` are read in place, never repeated per query head.
fn grouped(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: Option<Causal>,
    scale: f64,
    group: usize,
) -> Result<Tensor> {
    let (qs, t) = (q.shape(), k.shape()[2]);
    let (b, hq, s, d) = (qs[0] as isize, qs[1] as isize, qs[2] as isize, qs[3] as isize);
    let (hk, g) = (k.shape()[1] as isize, group as isize);
    let rows = q.reshape(&[b, hk, g * s, d])?;
    let mut scores = rows.matmul(&k.transpose(-1, -2)?)?.mul_scalar(scale)?.reshape(&[b, hk, g, s, t as isize])?;
    if let Some(causal) = causal {
        scores = hide_unkept(&scores, &causal_keep(qs[2], t, causal, q)?)?;
    }
    if let Some(m) = mask {
        // (.., heads, s, t) with heads 1 or hq: split the heads like the queries.
        let m = rank4(m)?;
        let ms: Vec<isize> = m.shape().iter().map(|&n| n as isize).collect();
        let m = if ms[1] == 1 { m.unsqueeze(1)? } else { m.reshape(&[ms[0], hk, g, ms[2], ms[3]])? };
        scores = if m.dtype() == DType::Bool {
            hide_unkept(&scores, &m)?
        } else {
            scores.add(&m.to_dtype(scores.dtype())?)?
        };
    }
    let p = scores.softmax(-1)?.reshape(&[b, hk, g * s, t as isize])?;
    p.matmul(v)?.reshape(&[b, hq, s, d])
}

/// Scaled dot-product attention (`F.scaled_dot_product_attention`) of `q (b, hq, s, d)` with
/// `k, v (b, hk, t, d)`, `hq` a multiple of `hk` (grouped-query attention). `attn_mask`
/// broadcasts to `(b, hq, s, t)`: a bool mask keeps the `true` positions, a float mask is
/// added to the scores. `is_causal` hides from query `i` the keys after position `i`, as in
/// PyTorch (aligned to the top left: with more keys than queries, the last keys are hidden
/// from every query; see [`scaled_dot_product_attention_lower_right`] for queries that are the
/// last positions of the keys, as with a KV cache). `scale` defaults to `1/sqrt(d)`. A query
/// that sees no key gets NaN.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    attention(q, k, v, attn_mask, is_causal.then_some(Causal::UpperLeft), scale)
}

/// Causal attention whose `s` queries are the last `s` of the `t` key positions: query `i`
/// sees keys `0..=i + t - s` (PyTorch's `causal_lower_right` bias). This is what decoding with
/// a KV cache needs; with `s == t` it equals `scaled_dot_product_attention(.., is_causal: true)`.
pub fn scaled_dot_product_attention_lower_right(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: Option<f64>,
) -> Result<Tensor> {
    attention(q, k, v, None, Some(Causal::LowerRight), scale)
}

fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    causal: Option<Causal>,
    scale: Option<f64>,
) -> Result<Tensor> {
    let (q, k, v) = (cast_for(CastPolicy::Low, q)?, cast_for(CastPolicy::Low, k)?, cast_for(CastPolicy::Low, v)?);
    common_device("attention", &[&q, &k, &v])?;
    if !q.dtype().is_float() {
        return Err(dtype_err(format!("attention: expected a floating-point q, got {}", q.dtype())));
    }
    // The SDK's rules and wording for q, k and v (the outputs, not yet allocated, described
    // as the kernel would get them; the op is for the name).
    let probe = Op::Attention { causal: causal.is_some(), scale: scale.unwrap_or(1.0) };
    let lse_shape = &q.shape()[..q.rank().min(3)];
    let outputs = [Geometry::dense(q.dtype(), q.shape()), Geometry::dense(DType::F32, lse_shape)];
    checks::attention(&probe, &[&q, &k, &v].map(Geometry::like), &outputs)?;
    let (qs, ks) = (q.shape(), k.shape());
    let scale = scale.unwrap_or(1.0 / (qs[3].max(1) as f64).sqrt());
    let group = qs[1] / ks[1];
    // The kernel's causal mask is aligned to the lower right; upper-left differs only when
    // s != t, which then takes the composition.
    let causal = causal.map(|c| if qs[2] == ks[2] { Causal::LowerRight } else { c });
    let op = Op::Attention { causal: causal.is_some(), scale };
    if attn_mask.is_some() || causal == Some(Causal::UpperLeft) || !super::fused::use_fused(&op, &q)? {
        if let Some(m) = attn_mask {
            crate::tensor::broadcast_shapes(m.shape(), &[qs[0], qs[1], qs[2], ks[2]])
                .filter(|s| s == &[qs[0], qs[1], qs[2], ks[2]])
                .ok_or_else(|| {
                    shape_err(format!(
                        "attention: mask {:?} does not broadcast to {:?}",
                        m.shape(),
                        [qs[0], qs[1], qs[2], ks[2]]
                    ))
                })?;
        }
        if let Some(o) = masked_fused(&q, &k, &v, attn_mask, causal, scale)? {
            return Ok(o);
        }
        return grouped(&q, &k, &v, attn_mask, causal, scale, group);
    }
    // o (and below dq, dk, dv) in the memory order of q (k, v): for the model's views of
    // `(b, s, h·d)` projections, o is then a view of `(b, s, h·d)` too.
    let o = q.empty_like()?;
    let lse = Tensor::empty(&qs[..3], DType::F32, q.device())?;
    exec(&op, &[(&q, q.layout()), (&k, k.layout()), (&v, v.layout())], &[&o, &lse])?;
    let (sq, sk, sv, so) = (Saved::new(&q), Saved::new(&k), Saved::new(&v), Saved::new(&o));
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        let (q, k, v) = (sq.get("attention")?, sk.get("attention")?, sv.get("attention")?);
        let bop = Op::AttentionBackward { causal: causal.is_some(), scale };
        if !is_grad_enabled() && super::fused::use_fused(&bop, q)? {
            let o = so.get("attention")?;
            let (dq, dk, dv) = (q.empty_like()?, k.empty_like()?, v.empty_like()?);
            let ins = [q, k, v, o, &lse, g];
            exec(&bop, &ins.iter().map(|t| (*t, t.layout())).collect::<Vec<_>>(), &[&dq, &dk, &dv])?;
            return Ok(vec![Some(dq), Some(dk), Some(dv)]);
        }
        // The composition, differentiable for higher-order gradients.
        let (kx, vx) = (repeat_kv(k, group)?, repeat_kv(v, group)?);
        let p = probabilities(q, &kx, None, causal, scale)?;
        let dvx = p.transpose(-1, -2)?.matmul(g)?;
        let dp = g.matmul(&vx.transpose(-1, -2)?)?;
        let ds = p.mul(&dp.sub(&dp.mul(&p)?.sum_dims(&[-1], true)?)?)?.mul_scalar(scale)?;
        let dq = ds.matmul(&kx)?;
        let dkx = ds.transpose(-1, -2)?.matmul(q)?;
        let fold = |t: Tensor| -> Result<Tensor> {
            if group == 1 {
                return Ok(t);
            }
            let s = k.shape();
            t.reshape(&[s[0] as isize, s[1] as isize, group as isize, s[2] as isize, s[3] as isize])?
                .sum_dims(&[2], false)
        };
        Ok(vec![Some(dq), Some(fold(dkx)?), Some(fold(dvx)?)])
    });
    Ok(record("attention", &[&q, &k, &v], vec![o], backward).remove(0))
}
