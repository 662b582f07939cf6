//! Layer norm, RMS norm and RMS norm after a residual addition (fused kernels when claimed,
//! compositions otherwise), and batch norm (with the running statistics update).

use super::{common_device, dtype_err, exec, shape_err};
use crate::amp::{cast_for, CastPolicy};
use crate::autograd::{is_grad_enabled, no_grad, record, record_reading_output, BackwardFn, Saved};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::sdk::checks::{expect_eps, expect_meta, expect_shape};
use genesis_backend_api::{DType, Op};

fn grad0(g: &[Option<Tensor>]) -> Result<&Tensor> {
    g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))
}

/// Check `x`'s trailing dims against `normalized_shape` (the core's rule) and the affine
/// parameters `[weight(, bias)]` (the SDK's); returns `x` reshaped to `(.., d)` and the
/// parameters flattened to `[d]`.
fn prepare(
    op: &Op,
    x: &Tensor,
    normalized_shape: &[usize],
    params: &[Option<&Tensor>],
) -> Result<(Tensor, Vec<Option<Tensor>>)> {
    let name = op.name();
    if !x.dtype().is_float() {
        return Err(dtype_err(format!("{name}: expected a floating-point input, got {}", x.dtype())));
    }
    let k = normalized_shape.len();
    if k == 0 || x.rank() < k || x.shape()[x.rank() - k..] != *normalized_shape {
        return Err(shape_err(format!(
            "{name}: normalized_shape {normalized_shape:?} must be non-empty and match the trailing dims of the input \
             {:?}",
            x.shape()
        )));
    }
    let d: usize = normalized_shape.iter().product();
    let mut flat: Vec<Option<Tensor>> = Vec::new();
    for (p, pname) in params.iter().zip(["weight", "bias"]) {
        flat.push(match p {
            None => None,
            Some(p) => {
                // The SDK's rule and wording for one operand, against the user's normalized_shape
                // (the kernel sees it flattened to `[d]`).
                expect_meta(op, pname, *p, normalized_shape, x.dtype())?;
                common_device(name, &[x, p])?;
                Some(p.reshape(&[d as isize])?)
            }
        });
    }
    let mut shape: Vec<isize> = x.shape()[..x.rank() - k].iter().map(|&n| n as isize).collect();
    shape.push(d as isize);
    Ok((x.reshape(&shape)?, flat))
}

/// The parameter or a constant (ones for scales, zeros for shifts) the kernel can read.
fn or_const(p: &Option<Tensor>, value: f64, x: &Tensor) -> Result<Tensor> {
    match p {
        Some(p) => Ok(p.clone()),
        None => Tensor::full(&[*x.shape().last().unwrap_or(&1)], value, x.dtype(), x.device()),
    }
}

/// `y` with `x`'s shape (a no-op, not even a recorded reshape, when it already has it).
fn restore_shape(y: Tensor, x: &Tensor) -> Result<Tensor> {
    if y.shape() == x.shape() {
        return Ok(y);
    }
    y.reshape(&x.shape().iter().map(|&n| n as isize).collect::<Vec<_>>())
}

/// Sum over every dim but the last (the per-feature gradient of a weight).
fn sum_rows(t: &Tensor) -> Result<Tensor> {
    let dims: Vec<isize> = (0..t.rank() as isize - 1).collect();
    if dims.is_empty() {
        Ok(t.clone())
    } else {
        t.sum_dims(&dims, false)
    }
}

/// Layer normalization over the trailing `normalized_shape` dims (`F.layer_norm`):
/// `(x - mean) / sqrt(var + eps) * weight + bias` with the biased variance.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let x = cast_for(CastPolicy::Float32, x)?;
    let weight = weight.map(|w| cast_for(CastPolicy::Float32, w)).transpose()?;
    let bias = bias.map(|b| cast_for(CastPolicy::Float32, b)).transpose()?;
    expect_eps(&Op::LayerNorm { eps }, eps)?;
    let (x2, p) = prepare(&Op::LayerNorm { eps }, &x, normalized_shape, &[weight.as_ref(), bias.as_ref()])?;
    let y = if super::fused::use_fused(&Op::LayerNorm { eps }, &x2)? {
        layer_norm_fused(&x2, &p[0], &p[1], eps)?
    } else {
        let mu = x2.mean_dims(&[-1], true)?;
        let xc = x2.sub(&mu)?;
        let r = xc.square()?.mean_dims(&[-1], true)?.add_scalar(eps)?.rsqrt()?;
        affine(&xc.mul(&r)?, &p[0], &p[1])?
    };
    restore_shape(y, &x)
}

fn affine(xhat: &Tensor, w: &Option<Tensor>, b: &Option<Tensor>) -> Result<Tensor> {
    let y = match w {
        Some(w) => xhat.mul(w)?,
        None => xhat.clone(),
    };
    match b {
        Some(b) => y.add(b),
        None => Ok(y),
    }
}

fn layer_norm_fused(x: &Tensor, w: &Option<Tensor>, b: &Option<Tensor>, eps: f64) -> Result<Tensor> {
    let (wk, bk) = (or_const(w, 1.0, x)?, or_const(b, 0.0, x)?);
    let lead = &x.shape()[..x.rank() - 1];
    let y = Tensor::empty(x.shape(), x.dtype(), x.device())?;
    let mean = Tensor::empty(lead, DType::F32, x.device())?;
    let rstd = Tensor::empty(lead, DType::F32, x.device())?;
    exec(&Op::LayerNorm { eps }, &[(x, x.layout()), (&wk, wk.layout()), (&bk, bk.layout())], &[&y, &mean, &rstd])?;
    let (sx, sw) = (Saved::new(x), Saved::new(&wk));
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = grad0(g)?;
        let (x, w) = (sx.get("layer_norm")?, sw.get("layer_norm")?);
        if let Some(grads) = fused_norm_backward(&Op::LayerNormBackward, &[g, x, w, &mean, &rstd], &[x, w, w])? {
            return Ok(grads);
        }
        // The composition, differentiable in x, w and g (higher-order gradients).
        let mu = x.mean_dims(&[-1], true)?;
        let xc = x.sub(&mu)?;
        let r = xc.square()?.mean_dims(&[-1], true)?.add_scalar(eps)?.rsqrt()?;
        let xhat = xc.mul(&r)?;
        let gw = g.mul(w)?;
        let dx =
            r.mul(&gw.sub(&gw.mean_dims(&[-1], true)?)?.sub(&xhat.mul(&gw.mul(&xhat)?.mean_dims(&[-1], true)?)?)?)?;
        Ok(vec![Some(dx), Some(sum_rows(&g.mul(&xhat)?)?), Some(sum_rows(g)?)])
    });
    let inputs: Vec<&Tensor> = [Some(x), w.as_ref(), b.as_ref()].into_iter().flatten().collect();
    let mut out = record("layer_norm", &inputs, vec![y], wrap_backward(backward, w.is_some(), b.is_some()));
    Ok(out.remove(0))
}

/// The fused backward `op` of a normalization on `ins` (dy, x, weight, statistics), with
/// one new output shaped like each of `like` (dx like x, the parameter gradients like the
/// weight); `None` when the composition is to run instead (gradients of the gradient are
/// recorded, or the backend does not claim `op`).
fn fused_norm_backward(op: &Op, ins: &[&Tensor], like: &[&Tensor]) -> Result<Option<Vec<Option<Tensor>>>> {
    if is_grad_enabled() || !super::fused::use_fused(op, ins[0])? {
        return Ok(None);
    }
    let outs = like.iter().map(|t| Tensor::empty(t.shape(), t.dtype(), t.device())).collect::<Result<Vec<_>>>()?;
    let ins: Vec<_> = ins.iter().map(|t| (*t, t.layout())).collect();
    exec(op, &ins, &outs.iter().collect::<Vec<_>>())?;
    Ok(Some(outs.into_iter().map(Some).collect()))
}

/// Adapt a backward that always returns `[dx, dweight, dbias]` to the inputs actually
/// recorded (absent parameters are not graph inputs).
fn wrap_backward(f: BackwardFn, has_w: bool, has_b: bool) -> BackwardFn {
    Box::new(move |g| {
        let all = f(g)?;
        Ok(all
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i == 0 || (*i == 1 && has_w) || (*i == 2 && has_b))
            .map(|(_, t)| t)
            .collect())
    })
}

/// RMS normalization over the trailing `normalized_shape` dims (`F.rms_norm`):
/// `x / sqrt(mean(x²) + eps) * weight`. `eps = None` uses the dtype's machine epsilon, as
/// PyTorch does.
pub fn rms_norm(x: &Tensor, normalized_shape: &[usize], weight: Option<&Tensor>, eps: Option<f64>) -> Result<Tensor> {
    let x = cast_for(CastPolicy::Float32, x)?;
    let weight = weight.map(|w| cast_for(CastPolicy::Float32, w)).transpose()?;
    let eps = rms_eps(eps, x.dtype(), |eps| Op::RmsNorm { eps })?;
    let (x2, p) = prepare(&Op::RmsNorm { eps }, &x, normalized_shape, &[weight.as_ref()])?;
    let w = &p[0];
    let y = if super::fused::use_fused(&Op::RmsNorm { eps }, &x2)? {
        let wk = or_const(w, 1.0, &x2)?;
        let y = Tensor::empty(x2.shape(), x2.dtype(), x2.device())?;
        let rstd = Tensor::empty(&x2.shape()[..x2.rank() - 1], DType::F32, x2.device())?;
        exec(&Op::RmsNorm { eps }, &[(&x2, x2.layout()), (&wk, wk.layout())], &[&y, &rstd])?;
        let (sx, sw) = (Saved::new(&x2), Saved::new(&wk));
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            let (dx, dw, _) =
                rms_norm_vjp(grad0(g)?, sx.get("rms_norm")?, sw.get("rms_norm")?, &rstd, eps, None, false)?;
            Ok(vec![Some(dx), Some(dw), None])
        });
        let inputs: Vec<&Tensor> = [Some(&x2), w.as_ref()].into_iter().flatten().collect();
        record("rms_norm", &inputs, vec![y], wrap_backward(backward, w.is_some(), false)).remove(0)
    } else {
        let r = x2.square()?.mean_dims(&[-1], true)?.add_scalar(eps)?.rsqrt()?;
        affine(&x2.mul(&r)?, w, &None)?
    };
    restore_shape(y, &x)
}

/// The eps of an RMS norm: the given one (>= 0, the SDK's rule for `op(eps)`) or the dtype's
/// machine epsilon.
pub(super) fn rms_eps(eps: Option<f64>, dtype: DType, op: impl Fn(f64) -> Op) -> Result<f64> {
    let eps = eps.unwrap_or(match dtype {
        DType::F64 => f64::EPSILON,
        DType::F16 => 0.0009765625,
        DType::BF16 => 0.0078125,
        _ => f32::EPSILON as f64,
    });
    expect_eps(&op(eps), eps)?;
    Ok(eps)
}

/// `(dx, dweight, dx_half)` of an RMS norm of rows `x (.., d)` with weight `w (d)` (ones when
/// it had none) for the output gradient `g`, with `dsum` (the gradient that reaches `x` by its
/// other uses) added to `dx`: the backend's `rms_norm_backward` when it claims it (taking
/// `dsum` in the same pass from interface 1.11 on), a composition (differentiable in x, w and
/// g) when gradients of the gradient are recorded. With `half_dx`, for a half-precision `g` of
/// an f32 norm, `dx_half` is `dx` rounded to `g`'s dtype where the backend writes it in the
/// same pass (interface 1.13); `None` otherwise, and the caller casts.
fn rms_norm_vjp(
    g: &Tensor,
    x: &Tensor,
    w: &Tensor,
    rstd: &Tensor,
    eps: f64,
    dsum: Option<&Tensor>,
    half_dx: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let backend = x.device().backend();
    // A half-precision g of an f32 norm (the gradient of `add_rms_norm`'s mixed form) goes to
    // the backend as it is where it takes the mixed form (interface 1.12), widened otherwise.
    let widened;
    let g = if g.dtype() != x.dtype() && (is_grad_enabled() || !backend.takes_mixed_norms()) {
        widened = g.to_dtype(x.dtype())?;
        &widened
    } else {
        g
    };
    let fused_dsum = dsum.filter(|s| s.dtype() == x.dtype() && s.shape() == x.shape() && backend.takes_rms_norm_dsum());
    let inputs: Vec<&Tensor> = [g, x, w, rstd].into_iter().chain(fused_dsum).collect();
    let with_half = half_dx && g.dtype() != x.dtype() && backend.takes_half_dx();
    let like: Vec<&Tensor> = [x, w].into_iter().chain(with_half.then_some(g)).collect();
    // `added`: whether dx already holds dsum (the backend's pass took it).
    let (dx, dw, dx_half, added) = match fused_norm_backward(&Op::RmsNormBackward, &inputs, &like)? {
        Some(mut grads) => {
            let missing = || Error::invalid("rms_norm_backward: expected two gradients");
            let dx_half = if with_half { grads.pop().flatten() } else { None };
            let [dx, dw]: [Option<Tensor>; 2] = grads.try_into().map_err(|_| missing())?;
            (dx.ok_or_else(missing)?, dw.ok_or_else(missing)?, dx_half, fused_dsum.is_some())
        }
        None => {
            let r = x.square()?.mean_dims(&[-1], true)?.add_scalar(eps)?.rsqrt()?;
            let xhat = x.mul(&r)?;
            let gw = g.mul(w)?;
            let dx = r.mul(&gw.sub(&xhat.mul(&gw.mul(&xhat)?.mean_dims(&[-1], true)?)?)?)?;
            (dx, sum_rows(&g.mul(&xhat)?)?, None, false)
        }
    };
    match dsum.filter(|_| !added) {
        Some(s) => Ok((dx.add(s)?, dw, None)),
        None => Ok((dx, dw, dx_half)),
    }
}

/// The residual addition of a pre-norm transformer and the RMS norm after it:
/// `(rms_norm(x + residual), x + residual)`, what
/// `let h = x.add(residual)?; (rms_norm(&h, ..)?, h)` gives, type promotion and autocast
/// included, in one pass of the backend's `add_rms_norm` when it claims it (the sum is read
/// once instead of written by one kernel and read back by the next). Not in PyTorch; the
/// fused residual norm of inference engines (vLLM's `fused_add_rms_norm`), differentiable.
///
/// Under autocast, when one of `x` and `residual` is f32 (a residual stream kept in f32) and
/// the other is in the autocast dtype (a half-precision layer's output), `y` comes out in the
/// autocast dtype: the norm computed in f32 and rounded once, the value an autocast layer
/// reading it would cast it to, without the f32 copy (the backend's mixed-precision form where
/// it takes it, interface 1.12). The composition, and this function otherwise, gives an f32 `y`.
pub fn add_rms_norm(
    x: &Tensor,
    residual: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Result<(Tensor, Tensor)> {
    if let Some(out) = add_rms_norm_mixed(x, residual, normalized_shape, weight, eps)? {
        return Ok(out);
    }
    let dtype = super::promote_types(x.dtype(), residual.dtype());
    // Under autocast a half-precision sum is normalized in f32 (rms_norm's policy), which the
    // kernel, writing y in the sum's dtype, does not do: that case takes the composition.
    let half_under_autocast = crate::amp::is_autocast_enabled() && matches!(dtype, DType::F16 | DType::BF16);
    if x.shape() != residual.shape() || !dtype.is_float() || half_under_autocast {
        let h = x.add(residual)?;
        return Ok((rms_norm(&h, normalized_shape, weight, eps)?, h));
    }
    let (x, residual) = (x.to_dtype(dtype)?, residual.to_dtype(dtype)?);
    let weight = weight.map(|w| cast_for(CastPolicy::Float32, w)).transpose()?;
    let eps = rms_eps(eps, dtype, |eps| Op::AddRmsNorm { eps })?;
    let op = Op::AddRmsNorm { eps };
    let (x2, p) = prepare(&op, &x, normalized_shape, &[weight.as_ref()])?;
    if !super::fused::use_fused(&op, &x2)? {
        let h = x.add(&residual)?;
        return Ok((rms_norm(&h, normalized_shape, weight.as_ref(), Some(eps))?, h));
    }
    let r2 = residual.reshape(&x2.shape().iter().map(|&n| n as isize).collect::<Vec<_>>())?;
    let w = &p[0];
    let wk = or_const(w, 1.0, &x2)?;
    let (y, sum) = (Tensor::empty(x2.shape(), dtype, x2.device())?, Tensor::empty(x2.shape(), dtype, x2.device())?);
    let rstd = Tensor::empty(&x2.shape()[..x2.rank() - 1], DType::F32, x2.device())?;
    exec(&op, &[(&x2, x2.layout()), (&r2, r2.layout()), (&wk, wk.layout())], &[&y, &sum, &rstd])?;
    let (y, sum) = record_add_rms_norm([&x2, &r2], w.as_ref(), &wk, [sum, y, rstd], eps)?;
    Ok((restore_shape(y, &x)?, restore_shape(sum, &x)?))
}

/// Records an `add_rms_norm` that ran on the addends `[a, b]` (in the caller's order) and the
/// weight `w` (`wk`, ones when there is none) into `[sum, y, rstd]`; returns `(y, sum)`. The
/// backward reads the sum (with its history when gradients of the gradient are recorded);
/// each addend gets the sum's gradient in its own dtype.
fn record_add_rms_norm(
    addends: [&Tensor; 2],
    w: Option<&Tensor>,
    wk: &Tensor,
    [sum, y, rstd]: [Tensor; 3],
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    let sw = Saved::new(wk);
    let has_w = w.is_some();
    let dtypes = addends.map(Tensor::dtype);
    let backward = move |saved_sum: crate::autograd::SavedOutput| -> BackwardFn {
        Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            let (g_sum, g_y) = (g[0].as_ref(), g[1].as_ref());
            // The sum's gradient: the norm's, plus what reaches the sum directly (in the
            // norm's backward pass where the backend takes it).
            // With the mixed form, the branch's gradient (the sum's, rounded to the branch's
            // half dtype) comes from the same pass where the backend writes it.
            let (d_sum, dw, d_half) = match g_y {
                Some(g_y) => {
                    let (sum, w) = (saved_sum.get("add_rms_norm")?, sw.get("add_rms_norm")?);
                    let (dx, dw, dx_half) = rms_norm_vjp(g_y, &sum, w, &rstd, eps, g_sum, true)?;
                    (Some(dx), Some(dw), dx_half)
                }
                None => (g_sum.cloned(), None, None),
            };
            let mut grads = dtypes
                .iter()
                .map(|&dt| match (&d_half, &d_sum) {
                    (Some(h), _) if h.dtype() == dt => Ok(Some(h.clone())),
                    (_, d) => d.as_ref().map(|d| d.to_dtype(dt)).transpose(),
                })
                .collect::<Result<Vec<_>>>()?;
            if has_w {
                grads.push(dw);
            }
            Ok(grads)
        })
    };
    let inputs: Vec<&Tensor> = addends.into_iter().chain(w).collect();
    // Outputs in the order [sum, y]: the backward reads the sum.
    let mut outs = record_reading_output("add_rms_norm", &inputs, vec![sum, y], backward);
    let y = outs.pop().ok_or_else(|| Error::invalid("add_rms_norm: missing output"))?;
    let sum = outs.pop().ok_or_else(|| Error::invalid("add_rms_norm: missing output"))?;
    Ok((y, sum))
}

/// [`add_rms_norm`] under autocast with an f32 stream and a half-precision branch in the
/// autocast dtype, by the backend's mixed-precision `add_rms_norm` (`y` in the autocast dtype,
/// the sum in f32); `None` where that form does not apply (the caller then casts).
fn add_rms_norm_mixed(
    x: &Tensor,
    residual: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Result<Option<(Tensor, Tensor)>> {
    let Some(low) = crate::amp::autocast_dtype().filter(|d| matches!(d, DType::F16 | DType::BF16)) else {
        return Ok(None);
    };
    // The stream (f32) and the branch (`low`), and whether the branch is `x`.
    let (stream, branch, branch_first) = match (x.dtype(), residual.dtype()) {
        (DType::F32, d) if d == low => (x, residual, false),
        (d, DType::F32) if d == low => (residual, x, true),
        _ => return Ok(None),
    };
    if stream.shape() != branch.shape()
        || !stream.device().backend().takes_mixed_norms()
        || common_device("add_rms_norm", &[stream, branch]).is_err()
    {
        return Ok(None);
    }
    let weight = weight.map(|w| cast_for(CastPolicy::Float32, w)).transpose()?;
    let eps = rms_eps(eps, DType::F32, |eps| Op::AddRmsNorm { eps })?;
    let op = Op::AddRmsNorm { eps };
    let (s2, p) = prepare(&op, stream, normalized_shape, &[weight.as_ref()])?;
    if !super::fused::use_fused(&op, branch)? {
        return Ok(None);
    }
    let b2 = branch.reshape(&s2.shape().iter().map(|&n| n as isize).collect::<Vec<_>>())?;
    let w = &p[0];
    let wk = or_const(w, 1.0, &s2)?;
    let y = Tensor::empty(s2.shape(), low, s2.device())?;
    let sum = Tensor::empty(s2.shape(), DType::F32, s2.device())?;
    let rstd = Tensor::empty(&s2.shape()[..s2.rank() - 1], DType::F32, s2.device())?;
    exec(&op, &[(&s2, s2.layout()), (&b2, b2.layout()), (&wk, wk.layout())], &[&y, &sum, &rstd])?;
    // The branch's gradient is the sum's, rounded to the branch's dtype.
    let addends = if branch_first { [&b2, &s2] } else { [&s2, &b2] };
    let (y, sum) = record_add_rms_norm(addends, w.as_ref(), &wk, [sum, y, rstd], eps)?;
    Ok(Some((restore_shape(y, stream)?, restore_shape(sum, stream)?)))
}

/// Batch normalization of `x (n, c, ..)` per channel (`F.batch_norm`). In training mode the
/// batch statistics normalize (biased variance) and, when given, the running statistics are
/// updated in place: `running = (1 - momentum) * running + momentum * batch` with the unbiased
/// batch variance. In eval mode the running statistics normalize.
///
/// With the batch's statistics it runs the backend's `batch_norm` op where claimed: `x` keeps
/// its dtype (a bf16 input under autocast gives a bf16 output, as in PyTorch) while the
/// statistics, scale and shift are f32. Otherwise, and for f64, a composition in f32 (f64).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    if !x.dtype().is_float() {
        return Err(dtype_err(format!("batch_norm: expected a floating-point input, got {}", x.dtype())));
    }
    if x.rank() < 2 {
        return Err(shape_err(format!("batch_norm: expected an input (n, c, ..), got {:?}", x.shape())));
    }
    let op = Op::BatchNorm { eps };
    expect_eps(&op, eps)?;
    let c = x.shape()[1];
    let per_channel =
        [("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)];
    for (name, t) in per_channel {
        if let Some(t) = t {
            expect_shape(&op, name, t, &[c])?;
            common_device("batch_norm", &[x, t])?;
        }
    }
    let count = x.numel() / c.max(1);
    let running = match (running_mean, running_var) {
        (Some(rm), Some(rv)) => Some((rm, rv)),
        _ => None,
    };
    if training || running.is_none() {
        if count <= 1 && training {
            return Err(Error::invalid(format!(
                "batch_norm: training needs more than one value per channel, got input {:?}",
                x.shape()
            )));
        }
        let (y, mean, var) = if super::fused::use_fused(&Op::BatchNorm { eps }, x)? {
            batch_norm_fused(x, weight, bias, eps)?
        } else {
            batch_norm_composite(x, weight, bias, eps)?
        };
        if let (true, Some((rm, rv))) = (training, running) {
            no_grad(|| -> Result<()> {
                let unbiased = var.mul_scalar(count as f64 / (count as f64 - 1.0))?;
                rm.mul_scalar_(1.0 - momentum)?;
                rm.add_(&mean.to_dtype(rm.dtype())?.mul_scalar(momentum)?)?;
                rv.mul_scalar_(1.0 - momentum)?;
                rv.add_(&unbiased.to_dtype(rv.dtype())?.mul_scalar(momentum)?)
            })?;
        }
        return Ok(y);
    }
    // Eval with running statistics: one scale and one shift per channel.
    let (rm, rv) = running.ok_or_else(|| Error::invalid("batch_norm: no running statistics"))?;
    let x = cast_for(CastPolicy::Float32, x)?;
    let per_channel = per_channel_shape(&x);
    let mut scale = rv.detach().to_dtype(x.dtype())?.add_scalar(eps)?.rsqrt()?;
    if let Some(w) = weight {
        scale = scale.mul(&w.to_dtype(x.dtype())?)?;
    }
    let mut shift = rm.detach().to_dtype(x.dtype())?.neg()?.mul(&scale)?;
    if let Some(b) = bias {
        shift = shift.add(&b.to_dtype(x.dtype())?)?;
    }
    x.mul(&scale.reshape(&per_channel)?)?.add(&shift.reshape(&per_channel)?)
}

/// `(c, 1, .., 1)`: a per-channel tensor's shape against `x (n, c, ..)`.
fn per_channel_shape(x: &Tensor) -> Vec<isize> {
    let mut shape = vec![x.shape()[1] as isize];
    shape.extend(std::iter::repeat_n(1, x.rank() - 2));
    shape
}

/// Batch statistics by the backend's op: `(y, mean, biased var)`, the statistics f32 `[c]`.
fn batch_norm_fused(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let x3 = x.reshape(&[n as isize, c as isize, -1])?;
    // The op takes f32 parameters; a cast is recorded, so other dtypes get their gradients back.
    let param = |p: Option<&Tensor>, value: f64| -> Result<Tensor> {
        match p {
            Some(p) => p.to_dtype(DType::F32),
            None => Tensor::full(&[c], value, DType::F32, x.device()),
        }
    };
    let (w, b) = (param(weight, 1.0)?, param(bias, 0.0)?);
    let y = Tensor::empty(x3.shape(), x3.dtype(), x3.device())?;
    let mean = Tensor::empty(&[c], DType::F32, x.device())?;
    let rstd = Tensor::empty(&[c], DType::F32, x.device())?;
    exec(&Op::BatchNorm { eps }, &[(&x3, x3.layout()), (&w, w.layout()), (&b, b.layout())], &[&y, &mean, &rstd])?;
    let (sx, sw, smean, srstd) = (Saved::new(&x3), Saved::new(&w), mean.clone(), rstd.clone());
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = grad0(g)?;
        let (x, w) = (sx.get("batch_norm")?, sw.get("batch_norm")?);
        // w is the f32 parameter the op took, so dw and db come out f32.
        if let Some(grads) = fused_norm_backward(&Op::BatchNormBackward, &[g, x, w, &smean, &srstd], &[x, w, w])? {
            return Ok(grads);
        }
        // The composition, differentiable in x, w and g (higher-order gradients), in f32.
        let (g32, x32) = (g.to_dtype(DType::F32)?, x.to_dtype(DType::F32)?);
        let mu = x32.mean_dims(&[0, 2], true)?;
        let xc = x32.sub(&mu)?;
        let r = xc.square()?.mean_dims(&[0, 2], true)?.add_scalar(eps)?.rsqrt()?;
        let xhat = xc.mul(&r)?;
        let gw = g32.mul(&w.reshape(&[-1, 1])?)?;
        let mean_of = |t: &Tensor| t.mean_dims(&[0, 2], true);
        let dx = r.mul(&gw.sub(&mean_of(&gw)?)?.sub(&xhat.mul(&mean_of(&gw.mul(&xhat)?)?)?)?)?;
        let dw = g32.mul(&xhat)?.sum_dims(&[0, 2], false)?;
        Ok(vec![Some(dx.to_dtype(x.dtype())?), Some(dw), Some(g32.sum_dims(&[0, 2], false)?)])
    });
    let inputs: Vec<&Tensor> = [Some(&x3), weight.map(|_| &w), bias.map(|_| &b)].into_iter().flatten().collect();
    let y = record("batch_norm", &inputs, vec![y], wrap_backward(backward, weight.is_some(), bias.is_some())).remove(0);
    let var = rstd.square()?.reciprocal()?.sub_scalar(eps)?.relu()?;
    Ok((y.reshape(&x.shape().iter().map(|&d| d as isize).collect::<Vec<_>>())?, mean, var))
}

/// Batch statistics by primitive ops (in f32, or f64 for f64): `(y, mean, biased var)`, the
/// statistics `[c]`.
fn batch_norm_composite(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let x = cast_for(CastPolicy::Float32, x)?;
    let per_channel = per_channel_shape(&x);
    let dims: Vec<isize> = std::iter::once(0).chain(2..x.rank() as isize).collect();
    let mean = x.mean_dims(&dims, true)?;
    let var = x.sub(&mean)?.square()?.mean_dims(&dims, true)?;
    let mut y = x.sub(&mean)?.mul(&var.add_scalar(eps)?.rsqrt()?)?;
    if let Some(w) = weight {
        y = y.mul(&w.to_dtype(x.dtype())?.reshape(&per_channel)?)?;
    }
    if let Some(b) = bias {
        y = y.add(&b.to_dtype(x.dtype())?.reshape(&per_channel)?)?;
    }
    let c = x.shape()[1] as isize;
    Ok((y, mean.detach().reshape(&[c])?, var.detach().reshape(&[c])?))
}
