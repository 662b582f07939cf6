//! Gradient clipping, in PyTorch's form. Gradients are replaced by scaled copies rather than
//! scaled in place: a gradient may share storage with another tensor of the backward pass
//! (the gradient of an addition reaches both inputs as one tensor).

use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::DType;

/// The p-norm of one gradient, as f64 on the host; sums run in f32 or wider so that f16
/// squares cannot overflow.
fn grad_norm(g: &Tensor, norm_type: f64) -> Result<f64> {
    let g = if g.dtype() == DType::F64 { g.clone() } else { g.to_dtype(DType::F32)? };
    if norm_type == f64::INFINITY {
        return if g.numel() == 0 { Ok(0.0) } else { g.abs()?.max()?.item::<f64>() };
    }
    let sum = if norm_type == 2.0 { g.square()?.sum()? } else { g.abs()?.pow_scalar(norm_type)?.sum()? };
    Ok(sum.item::<f64>()?.powf(1.0 / norm_type))
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
        let norms = grads.iter().map(|(_, g)| grad_norm(g, norm_type)).collect::<Result<Vec<f64>>>()?;
        let total = if norm_type == f64::INFINITY {
            norms.iter().fold(0.0f64, |a, &b| if b.is_nan() || a.is_nan() { f64::NAN } else { a.max(b) })
        } else {
            norms.iter().map(|n| n.powf(norm_type)).sum::<f64>().powf(1.0 / norm_type)
        };
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
