//! Gradient clipping, in PyTorch's form. Gradients are replaced by scaled copies rather than
//! scaled in place: a gradient may share storage with another tensor of the backward pass
//! (the gradient of an addition reaches both inputs as one tensor).

use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::DType;

/// One gradient's part of the total norm as a 0-d tensor on its device: the sum of
/// `|g|^norm_type`, or `max |g|` for the infinity norm (`None` for an empty gradient there).
/// Sums run in f32 or wider so that f16 squares cannot overflow.
fn norm_part(g: &Tensor, norm_type: f64) -> Result<Option<Tensor>> {
    let g = if g.dtype() == DType::F64 { g.clone() } else { g.to_dtype(DType::F32)? };
    if norm_type == f64::INFINITY {
        return if g.numel() == 0 { Ok(None) } else { g.abs()?.max().map(Some) };
    }
    let powered = if norm_type == 2.0 { g.square()? } else { g.abs()?.pow_scalar(norm_type)? };
    powered.sum().map(Some)
}

/// The total `norm_type`-norm of `grads`. The parts stay on their devices and are combined
/// there, one read to the host per (device, dtype) group: a read per gradient would wait for
/// the device hundreds of times a step.
fn total_norm<'a>(grads: impl IntoIterator<Item = &'a Tensor>, norm_type: f64) -> Result<f64> {
    let mut groups: Vec<Vec<Tensor>> = Vec::new();
    for g in grads {
        let Some(part) = norm_part(g, norm_type)? else { continue };
        match groups.iter_mut().find(|group| group[0].device() == part.device() && group[0].dtype() == part.dtype()) {
            Some(group) => group.push(part),
            None => groups.push(vec![part]),
        }
    }
    let mut total = 0.0f64;
    for group in &groups {
        let parts = Tensor::stack(group, 0)?;
        if norm_type == f64::INFINITY {
            let max = parts.max()?.item::<f64>()?;
            total = if max.is_nan() || total.is_nan() { f64::NAN } else { total.max(max) };
        } else {
            total += parts.sum()?.item::<f64>()?;
        }
    }
    Ok(if norm_type == f64::INFINITY { total } else { total.powf(1.0 / norm_type) })
}

/// Scale the gradients of `params` together so that their combined `norm_type`-norm is at
/// most `max_norm`, and return that norm before clipping (PyTorch's `clip_grad_norm_`:
/// gradients are multiplied by `max_norm / (norm + 1e-6)` when that is below 1). Parameters
/// without a gradient are skipped. A non-finite norm is returned as it is, so the caller can
/// skip the step.
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<f64> {
    if norm_type.is_nan() || norm_type <= 0.0 {
        return Err(Error::invalid(format!("clip_grad_norm_: norm_type must be > 0 (or infinity), got {norm_type}")));
    }
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::invalid(format!("clip_grad_norm_: max_norm must be >= 0, got {max_norm}")));
    }
    no_grad(|| {
        let grads: Vec<(&Tensor, Tensor)> = params.iter().filter_map(|p| p.grad().map(|g| (p, g))).collect();
        let total = total_norm(grads.iter().map(|(_, g)| g), norm_type)?;
        let coef = max_norm / (total + 1e-6);
        // A NaN coefficient (NaN norm) scales too, spreading the NaN as PyTorch does.
        if coef.is_nan() || coef < 1.0 {
            for (p, g) in &grads {
                p.set_grad(Some(g.mul_scalar(coef)?))?;
            }
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
