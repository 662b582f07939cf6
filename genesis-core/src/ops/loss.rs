//! Losses: cross-entropy (the fused kernel when claimed), NLL, MSE, L1, binary cross-entropy
//! on probabilities and on logits. Every loss runs in f32 under autocast.

use super::{common_device, dtype_err, exec, shape_err};
use crate::amp::{cast_for, CastPolicy};
use crate::autograd::{is_grad_enabled, record1, Saved};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::{DType, Op};

/// How per-element losses are combined (`reduction=` in PyTorch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// Keep the per-element losses.
    None,
    /// Average (cross-entropy and NLL average over the targets that are not ignored).
    #[default]
    Mean,
    /// Sum.
    Sum,
}

fn reduce(loss: Tensor, reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::None => Ok(loss),
        Reduction::Mean => loss.mean(),
        Reduction::Sum => loss.sum(),
    }
}

fn float_input(name: &str, x: &Tensor) -> Result<Tensor> {
    let x = cast_for(CastPolicy::Float32, x)?;
    if !x.dtype().is_float() {
        return Err(dtype_err(format!("{name}: expected a floating-point input, got {}", x.dtype())));
    }
    Ok(x)
}

/// Input and target of an elementwise loss: same shape, floats, the target in the input's dtype.
fn pair(name: &str, input: &Tensor, target: &Tensor) -> Result<(Tensor, Tensor)> {
    let x = float_input(name, input)?;
    if input.shape() != target.shape() {
        return Err(shape_err(format!(
            "{name}: input shape {:?} and target shape {:?} differ",
            input.shape(),
            target.shape()
        )));
    }
    common_device(name, &[&x, target])?;
    Ok((x.clone(), target.to_dtype(x.dtype())?))
}

/// Mean squared error (`F.mse_loss`); input and target must have one shape.
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let (x, t) = pair("mse_loss", input, target)?;
    reduce(x.sub(&t)?.square()?, reduction)
}

/// Mean absolute error (`F.l1_loss`).
pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let (x, t) = pair("l1_loss", input, target)?;
    reduce(x.sub(&t)?.abs()?, reduction)
}

/// Binary cross-entropy on probabilities (`F.binary_cross_entropy`); the logs are clamped at
/// -100 as in PyTorch, so a probability of exactly 0 or 1 gives a finite loss. Inputs outside
/// `[0, 1]` are an error.
pub fn binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    let (x, t) = pair("binary_cross_entropy", input, target)?;
    if x.numel() > 0 {
        let (lo, hi) = (x.min()?.item::<f64>()?, x.max()?.item::<f64>()?);
        if lo.is_nan() || hi.is_nan() || lo < 0.0 || hi > 1.0 {
            return Err(Error::invalid(format!(
                "binary_cross_entropy: input values must be probabilities in [0, 1], found a range [{lo}, {hi}]"
            )));
        }
    }
    let log_x = x.log()?.clamp(-100.0, f64::INFINITY)?;
    let log_1mx = x.rsub_scalar(1.0)?.log()?.clamp(-100.0, f64::INFINITY)?;
    let loss = t.mul(&log_x)?.add(&t.rsub_scalar(1.0)?.mul(&log_1mx)?)?.neg()?;
    let loss = match weight {
        Some(w) => loss.mul(&w.to_dtype(loss.dtype())?)?,
        None => loss,
    };
    reduce(loss, reduction)
}

/// Binary cross-entropy on logits (`F.binary_cross_entropy_with_logits`), computed stably as
/// `(1 - t) x + (1 + (pw - 1) t) (log(1 + e^-|x|) + max(-x, 0))`; `pos_weight` weights the
/// positive term and broadcasts against the input.
pub fn binary_cross_entropy_with_logits(
    input: &Tensor,
    target: &Tensor,
    pos_weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    let (x, t) = pair("binary_cross_entropy_with_logits", input, target)?;
    let softplus_neg = x.abs()?.neg()?.exp()?.log1p()?.add(&x.neg()?.relu()?)?;
    let scale = match pos_weight {
        Some(pw) => t.mul(&pw.to_dtype(x.dtype())?.sub_scalar(1.0)?)?.add_scalar(1.0)?,
        None => t.ones_like()?,
    };
    let loss = t.rsub_scalar(1.0)?.mul(&x)?.add(&scale.mul(&softplus_neg)?)?;
    reduce(loss, reduction)
}

/// Move the class dim (1) of `(n, c, d1, ..)` logits last and flatten to rows `(m, c)`; `(c,)`
/// logits become one row. Returns the rows and the target flattened to `(m,)` i64.
fn class_rows(name: &str, input: &Tensor, target: &Tensor) -> Result<(Tensor, Tensor, Vec<usize>)> {
    if target.dtype().is_float() || target.dtype() == DType::Bool {
        return Err(dtype_err(format!(
            "{name}: target must hold integer class indices, got {} (class probabilities are not supported)",
            target.dtype()
        )));
    }
    let expected: Vec<usize> = match input.rank() {
        0 => return Err(shape_err(format!("{name}: input must have a class dim, got a scalar"))),
        1 => vec![],
        _ => input.shape().iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, &n)| n).collect(),
    };
    if target.shape() != expected.as_slice() {
        return Err(shape_err(format!(
            "{name}: target shape {:?} does not match input {:?} (expected {:?})",
            target.shape(),
            input.shape(),
            expected
        )));
    }
    common_device(name, &[input, target])?;
    let c = if input.rank() == 1 { input.shape()[0] } else { input.shape()[1] };
    let rows = if input.rank() <= 2 { input.clone() } else { input.transpose(1, -1)? };
    let rows = rows.reshape(&[-1, c as isize])?;
    Ok((rows, target.to_dtype(DType::I64)?.reshape(&[-1])?, expected))
}

/// Error unless every target is `ignore_index` or in `[0, c)` (the composite path's check;
/// the fused kernel checks in the backend).
fn check_targets(name: &str, target: &Tensor, c: usize, ignore_index: i64) -> Result<()> {
    for (row, t) in target.to_vec::<i64>()?.into_iter().enumerate() {
        if t != ignore_index && !(0..c as i64).contains(&t) {
            return Err(Error::invalid(format!(
                "{name}: target {t} of row {row} is outside [0, {c}) and is not ignore_index ({ignore_index})"
            )));
        }
    }
    Ok(())
}

/// Mean over the targets that are not ignored (NaN when all are, as in PyTorch).
fn reduce_rows(loss: Tensor, valid: &Tensor, shape: &[usize], reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::None => loss.reshape(&shape.iter().map(|&n| n as isize).collect::<Vec<_>>()),
        Reduction::Sum => loss.sum(),
        Reduction::Mean => loss.sum()?.div(&valid.to_dtype(loss.dtype())?.sum()?),
    }
}

/// Negative log-likelihood of log-probabilities `(n, c, d1, ..)` or `(c,)` at integer class
/// targets (`F.nll_loss`).
pub fn nll_loss(input: &Tensor, target: &Tensor, ignore_index: i64, reduction: Reduction) -> Result<Tensor> {
    let x = float_input("nll_loss", input)?;
    let (rows, t, shape) = class_rows("nll_loss", &x, target)?;
    let c = rows.shape()[1];
    check_targets("nll_loss", &t, c, ignore_index)?;
    let valid = t.ne_scalar(ignore_index)?;
    let safe = t.masked_fill(&valid.logical_not()?, 0i64)?;
    let picked = rows.gather(1, &safe.unsqueeze(1)?)?.squeeze(Some(1))?;
    let loss = picked.neg()?.mul(&valid.to_dtype(picked.dtype())?)?;
    reduce_rows(loss, &valid, &shape, reduction)
}

/// Cross-entropy of logits `(n, c, d1, ..)` or `(c,)` against integer class targets
/// (`F.cross_entropy`), with `ignore_index` and label smoothing `ε ∈ [0, 1)`:
/// `(1-ε)·nll + ε·mean_j(-log_softmax_j)`. Uses the backend's fused kernel when claimed
/// (except for f64, whose fused loss would be rounded to f32); the result has the input's dtype.
pub fn cross_entropy(
    input: &Tensor,
    target: &Tensor,
    ignore_index: i64,
    label_smoothing: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    let x = float_input("cross_entropy", input)?;
    if !(0.0..1.0).contains(&label_smoothing) {
        return Err(Error::invalid(format!("cross_entropy: label_smoothing must be in [0, 1), got {label_smoothing}")));
    }
    let (rows, t, shape) = class_rows("cross_entropy", &x, target)?;
    let c = rows.shape()[1];
    let valid = t.ne_scalar(ignore_index)?;
    let op = Op::CrossEntropy { ignore_index, label_smoothing };
    let loss = if super::fused::use_fused(&op, &rows)? {
        cross_entropy_fused(&rows, &t, ignore_index, label_smoothing)?.to_dtype(x.dtype())?
    } else {
        check_targets("cross_entropy", &t, c, ignore_index)?;
        let logp = rows.log_softmax(-1)?;
        let safe = t.masked_fill(&valid.logical_not()?, 0i64)?;
        let nll = logp.gather(1, &safe.unsqueeze(1)?)?.squeeze(Some(1))?.neg()?;
        let per_row = if label_smoothing > 0.0 {
            let smooth = logp.mean_dims(&[-1], false)?.neg()?;
            nll.mul_scalar(1.0 - label_smoothing)?.add(&smooth.mul_scalar(label_smoothing)?)?
        } else {
            nll
        };
        per_row.mul(&valid.to_dtype(per_row.dtype())?)?
    };
    reduce_rows(loss, &valid, &shape, reduction)
}

/// The summed cross-entropy of `logits (n, c)` at `target (n,)` and, with `grad_scale` (a
/// scalar tensor on the logits' device), the gradient of `grad_scale · sum` with respect to
/// the logits (in the logits' dtype), without recording autograd: the building block of a
/// loss computed a block of rows at a time. The fused kernels run where the device claims
/// them (f32 statistics, so not for f64); otherwise the composition `softmax - onehot`.
pub(crate) fn cross_entropy_sum_and_grad(
    logits: &Tensor,
    target: &Tensor,
    ignore_index: i64,
    grad_scale: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>)> {
    let n = logits.shape()[0];
    let forward = Op::CrossEntropy { ignore_index, label_smoothing: 0.0 };
    let backward = Op::CrossEntropyBackward { ignore_index, label_smoothing: 0.0 };
    let fused = super::fused::use_fused(&forward, logits)?
        && (grad_scale.is_none() || super::fused::use_fused(&backward, logits)?);
    let valid = target.ne_scalar(ignore_index)?;
    if fused {
        let device = logits.device();
        let (loss, lse) = (Tensor::empty(&[n], DType::F32, device)?, Tensor::empty(&[n], DType::F32, device)?);
        exec(&forward, &[(logits, logits.layout()), (target, target.layout())], &[&loss, &lse])?;
        let grad = match grad_scale {
            Some(scale) => {
                let g = valid.to_dtype(DType::F32)?.mul(&scale.to_dtype(DType::F32)?)?;
                let dx = Tensor::empty(logits.shape(), logits.dtype(), device)?;
                let ins = [logits, target, &lse, &g];
                exec(&backward, &ins.iter().map(|t| (*t, t.layout())).collect::<Vec<_>>(), &[&dx])?;
                Some(dx)
            }
            None => None,
        };
        // The kernel writes 0 for ignored rows.
        return Ok((loss.sum()?, grad));
    }
    check_targets("cross_entropy", target, logits.shape()[1], ignore_index)?;
    let x = if logits.dtype() == DType::F64 { logits.clone() } else { logits.to_dtype(DType::F32)? };
    let sum = cross_entropy(&x, target, ignore_index, 0.0, Reduction::Sum)?;
    let grad = match grad_scale {
        Some(scale) => {
            let safe = target.masked_fill(&valid.logical_not()?, 0i64)?;
            let onehot = safe.one_hot(logits.shape()[1])?.to_dtype(x.dtype())?;
            let rows = valid.to_dtype(x.dtype())?.mul(&scale.to_dtype(x.dtype())?)?.unsqueeze(1)?;
            Some(x.softmax(-1)?.sub(&onehot)?.mul(&rows)?.to_dtype(logits.dtype())?)
        }
        None => None,
    };
    Ok((sum, grad))
}

/// Per-row f32 losses from the fused kernel, with a backward through the fused backward op
/// (first order) or the composition `dloss·(softmax - (1-ε)·onehot - ε/c)` (higher order).
fn cross_entropy_fused(rows: &Tensor, target: &Tensor, ignore_index: i64, eps: f64) -> Result<Tensor> {
    let n = rows.shape()[0];
    let (loss, lse) =
        (Tensor::empty(&[n], DType::F32, rows.device())?, Tensor::empty(&[n], DType::F32, rows.device())?);
    exec(
        &Op::CrossEntropy { ignore_index, label_smoothing: eps },
        &[(rows, rows.layout()), (target, target.layout())],
        &[&loss, &lse],
    )?;
    let (sx, st) = (Saved::new(rows), target.clone());
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        let x = sx.get("cross_entropy")?;
        let op = Op::CrossEntropyBackward { ignore_index, label_smoothing: eps };
        if !is_grad_enabled() && super::fused::use_fused(&op, x)? {
            let g = g.to_dtype(DType::F32)?;
            let dx = Tensor::empty(x.shape(), x.dtype(), x.device())?;
            let ins = [x, &st, &lse, &g];
            exec(&op, &ins.iter().map(|t| (*t, t.layout())).collect::<Vec<_>>(), &[&dx])?;
            return Ok(vec![Some(dx)]);
        }
        let c = x.shape()[1];
        let valid = st.ne_scalar(ignore_index)?;
        let safe = st.masked_fill(&valid.logical_not()?, 0i64)?;
        let onehot = safe.one_hot(c)?.to_dtype(x.dtype())?;
        let p = x.softmax(-1)?;
        let d = p.sub(&onehot.mul_scalar(1.0 - eps)?)?.sub_scalar(eps / c as f64)?;
        let scale = g.to_dtype(x.dtype())?.mul(&valid.to_dtype(x.dtype())?)?.unsqueeze(1)?;
        Ok(vec![Some(d.mul(&scale)?)])
    });
    Ok(record1("cross_entropy", &[rows], loss, backward))
}
