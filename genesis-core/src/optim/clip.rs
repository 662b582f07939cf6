//! Gradient clipping, in PyTorch's form. Gradients are replaced by scaled copies rather than
//! scaled in place: a gradient may share storage with another tensor of the backward pass
//! (the gradient of an addition reaches both inputs as one tensor).

use crate::autograd::no_grad;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::reduce_all_into;
use crate::tensor::Tensor;
use genesis_backend_api::{DType, ReduceOp};

/// The total `norm_type`-norm of `grads` as a 0-d tensor on the first gradient's device (f64
/// when any gradient is f64, else f32), `None` without gradients. Each gradient's part (the
/// sum of `|g|^p`, or `max |g|`) is reduced straight into its entry of one vector per
/// (device, dtype), in f32 or wider so that f16 squares cannot overflow; the 2-norm's part
/// is one `sum_squares` pass where the backend has it. Nothing is read to the host: a read
/// would wait for the whole backward pass, and the host would then issue the clipping and
/// the optimizer step to an idle device (10 ms of a 95 ms Qwen2 SFT step).
fn total_norm<'a>(grads: impl IntoIterator<Item = &'a Tensor>, norm_type: f64) -> Result<Option<Tensor>> {
    // Empty gradients add nothing to any part.
    let mut groups: Vec<Vec<Tensor>> = Vec::new();
    for g in grads.into_iter().filter(|g| g.numel() > 0) {
        let g = if g.dtype() == DType::F64 { g.clone() } else { g.to_dtype(DType::F32)? };
        match groups.iter_mut().find(|group| group[0].device() == g.device() && group[0].dtype() == g.dtype()) {
            Some(group) => group.push(g),
            None => groups.push(vec![g]),
        }
    }
    let Some(first) = groups.first().map(|group| group[0].device().clone()) else { return Ok(None) };
    let dtype = if groups.iter().any(|group| group[0].dtype() == DType::F64) { DType::F64 } else { DType::F32 };
    let mut totals = Vec::with_capacity(groups.len());
    for group in &groups {
        let parts = Tensor::empty(&[group.len()], group[0].dtype(), group[0].device())?;
        for (i, g) in group.iter().enumerate() {
            let slot = parts.narrow(0, i, 1)?;
            if norm_type == 2.0 {
                reduce_all_into(ReduceOp::SumSquares, g, &slot)?;
            } else if norm_type == f64::INFINITY {
                reduce_all_into(ReduceOp::Max, &g.abs()?, &slot)?;
            } else {
                reduce_all_into(ReduceOp::Sum, &g.abs()?.pow_scalar(norm_type)?, &slot)?;
            }
        }
        let total = if norm_type == f64::INFINITY { parts.max()? } else { parts.sum()? };
        totals.push(total.to(&first)?.to_dtype(dtype)?);
    }
    let totals = Tensor::stack(&totals, 0)?;
    Ok(Some(if norm_type == f64::INFINITY { totals.max()? } else { totals.sum()?.pow_scalar(1.0 / norm_type)? }))
}

/// Scale the gradients of `params` together so that their combined `norm_type`-norm is at
/// most `max_norm`, and return that norm before clipping as a 0-d tensor (PyTorch's
/// `clip_grad_norm_`: gradients are multiplied by `min(max_norm / (norm + 1e-6), 1)`).
/// Parameters without a gradient are skipped; without any, the norm is `0.0` on the CPU.
///
/// Like PyTorch's, it never waits for the device: the norm and the factor stay device
/// tensors, and every gradient is multiplied by the factor (by exactly 1 when under the
/// limit, which leaves it unchanged). The norm is f32 (f64 when a gradient is f64) on the
/// first gradient's device; read it with `item` when the step is issued. A non-finite norm
/// is returned as it is and makes the gradients NaN, as in PyTorch, so the caller can skip
/// the step.
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    if norm_type.is_nan() || norm_type <= 0.0 {
        return Err(Error::invalid(format!("clip_grad_norm_: norm_type must be > 0 (or infinity), got {norm_type}")));
    }
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::invalid(format!("clip_grad_norm_: max_norm must be >= 0, got {max_norm}")));
    }
    no_grad(|| {
        let grads: Vec<(&Tensor, Tensor)> = params.iter().filter_map(|p| p.grad().map(|g| (p, g))).collect();
        let Some(total) = total_norm(grads.iter().map(|(_, g)| g), norm_type)? else {
            return Tensor::full(&[], 0.0, DType::F32, &Device::cpu()?);
        };
        // clamp propagates NaN, so a NaN norm spreads to the gradients as in PyTorch.
        let coef = total.add_scalar(1e-6)?.reciprocal()?.mul_scalar(max_norm)?.clamp(f64::NEG_INFINITY, 1.0)?;
        let mut coefs: Vec<Tensor> = Vec::new();
        for (p, g) in &grads {
            let found = coefs.iter().find(|c| c.device() == g.device() && c.dtype() == g.dtype()).cloned();
            let c = match found {
                Some(c) => c,
                None => {
                    let c = coef.to(g.device())?.to_dtype(g.dtype())?;
                    coefs.push(c.clone());
                    c
                }
            };
            p.set_grad(Some(g.mul(&c)?))?;
        }
        Ok(total)
    })
}

/// Clamp every gradient of `params` to `[-clip_value, clip_value]` (`clip_grad_value_`).
pub fn clip_grad_value_(params: &[Tensor], clip_value: f64) -> Result<()> {
    if clip_value.is_nan() || clip_value < 0.0 {
        return Err(Error::invalid(format!("clip_grad_value_: clip_value must be >= 0, got {clip_value}")));
    }
    no_grad(|| {
        for p in params {
            if let Some(g) = p.grad() {
                p.set_grad(Some(g.clamp(-clip_value, clip_value)?))?;
            }
        }
        Ok(())
    })
}
