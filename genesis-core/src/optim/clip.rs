//! Gradient clipping, in PyTorch's form. Gradients are replaced by scaled copies rather than
//! scaled in place: a gradient may share storage with another tensor of the backward pass
//! (the gradient of an addition reaches both inputs as one tensor).

use crate::autograd::no_grad;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::reduce_all_into;
use crate::tensor::Tensor;
use genesis_backend_api::{DType, Op, ReduceOp};

/// The total `norm_type`-norm of `grads` as a 0-d tensor on the first gradient's device (f64
/// when any gradient is f64, else f32), `None` without gradients. Each gradient's part (the
/// sum of `|g|^p`, or `max |g|`) is reduced straight into its entry of one vector per
/// (device, dtype), in f32 or wider so that f16 squares cannot overflow; the 2-norm's parts
/// are one multi-tensor `foreach_sum_squares` where the backend has it (a few launches for all
/// the gradients of a group), else one `sum_squares` pass each. Nothing is read to the host: a read
/// would wait for the whole backward pass, and the host would then issue the clipping and
/// the optimizer step to an idle device (measured in `benches/sft/RESULTS.md`).
fn total_norm(grads: &[Tensor], norm_type: f64) -> Result<Option<Tensor>> {
    // Empty gradients add nothing to any part.
    let mut groups: Vec<Vec<Tensor>> = Vec::new();
    for g in grads.iter().filter(|g| g.numel() > 0) {
        let g = if g.dtype() == DType::F64 { g.clone() } else { g.to_dtype(DType::F32)? };
        match groups.iter_mut().find(|group| group[0].device() == g.device() && group[0].dtype() == g.dtype()) {
            Some(group) => group.push(g),
            None => groups.push(vec![g]),
        }
    }
    let Some(first) = groups.first().map(|group| group[0].device().clone()) else { return Ok(None) };
    let dtype = if groups.iter().any(|group| group[0].dtype() == DType::F64) { DType::F64 } else { DType::F32 };
    let mut totals = Vec::with_capacity(groups.len());
    for group in groups.iter().map(|group| adjacent_runs(group)) {
        let parts = Tensor::empty(&[group.len()], group[0].dtype(), group[0].device())?;
        if norm_type == 2.0 && crate::ops::fused::use_fused(&Op::ForeachSumSquares, &group[0])? {
            // Every part in a few launches (the backend's multi-tensor sum of squares).
            let inputs: Vec<_> = group.iter().map(|g| (g, g.layout())).collect();
            crate::ops::exec(&Op::ForeachSumSquares, &inputs, &[&parts])?;
        } else {
            reduce_each_into(&group, norm_type, &parts)?;
        }
        let total = if norm_type == f64::INFINITY { parts.max()? } else { parts.sum()? };
        totals.push(total.to(&first)?.to_dtype(dtype)?);
    }
    let totals = Tensor::stack(&totals, 0)?;
    Ok(Some(if norm_type == f64::INFINITY { totals.max()? } else { totals.sum()?.pow_scalar(1.0 / norm_type)? }))
}

/// Each gradient's part of the `norm_type`-norm (the sum of `|g|^p`, or `max |g|`) into its
/// entry of `parts`, one reduction per gradient.
fn reduce_each_into(grads: &[Tensor], norm_type: f64, parts: &Tensor) -> Result<()> {
    for (i, g) in grads.iter().enumerate() {
        let slot = parts.narrow(0, i, 1)?;
        if norm_type == 2.0 {
            reduce_all_into(ReduceOp::SumSquares, g, &slot)?;
        } else if norm_type == f64::INFINITY {
            reduce_all_into(ReduceOp::Max, &g.abs()?, &slot)?;
        } else {
            reduce_all_into(ReduceOp::Sum, &g.abs()?.pow_scalar(norm_type)?, &slot)?;
        }
    }
    Ok(())
}

/// `grads` with each run of gradients that lie back to back in one storage (the gradients of
/// layers stored together, such as a stacked q/k/v projection's weights, which parameter lists
/// interleave with their biases) as one tensor, so that the run costs one reduction instead of
/// one per gradient. Gradients sharing a storage are taken in the order of their offsets.
fn adjacent_runs(grads: &[Tensor]) -> Vec<Tensor> {
    let mut buckets: Vec<Vec<Tensor>> = Vec::new();
    for g in grads {
        match buckets.iter_mut().find(|b| b[0].shares_storage(g)) {
            Some(bucket) => bucket.push(g.clone()),
            None => buckets.push(vec![g.clone()]),
        }
    }
    let mut units: Vec<Tensor> = Vec::new();
    for mut bucket in buckets {
        bucket.sort_by_key(|g| g.layout().offset);
        let mut run: Vec<Tensor> = Vec::new();
        for g in bucket {
            // Each gradient adjacent to the one before it makes the whole run adjacent.
            if let Some(last) = run.last() {
                if Tensor::adjacent_rows(&[last.clone(), g.clone()]).is_none() {
                    units.extend(joined(std::mem::take(&mut run)));
                }
            }
            run.push(g);
        }
        units.extend(joined(run));
    }
    units
}

/// One run of [`adjacent_runs`] as the tensor that covers it (the run itself when it is one
/// gradient, or cannot be joined).
fn joined(run: Vec<Tensor>) -> Vec<Tensor> {
    if run.len() < 2 {
        return run;
    }
    Tensor::adjacent_rows(&run).map_or(run, |t| vec![t])
}

fn check_max_norm(what: &str, max_norm: f64) -> Result<()> {
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::invalid(format!("{what}: max_norm must be >= 0, got {max_norm}")));
    }
    Ok(())
}

fn check_norm_type(what: &str, norm_type: f64) -> Result<()> {
    if norm_type.is_nan() || norm_type <= 0.0 {
        return Err(Error::invalid(format!("{what}: norm_type must be > 0 (or infinity), got {norm_type}")));
    }
    Ok(())
}

/// The combined `norm_type`-norm of the gradients of `params` as a 0-d tensor, without
/// changing them (PyTorch's `get_total_norm` over the parameters' gradients): f32 (f64 when
/// a gradient is f64) on the first gradient's device, `0.0` on the CPU when no parameter has
/// a gradient. Nothing is read to the host.
pub fn get_total_norm(params: &[Tensor], norm_type: f64) -> Result<Tensor> {
    check_norm_type("get_total_norm", norm_type)?;
    no_grad(|| {
        let grads: Vec<Tensor> = params.iter().filter_map(Tensor::grad).collect();
        match total_norm(&grads, norm_type)? {
            Some(total) => Ok(total),
            None => Tensor::full(&[], 0.0, DType::F32, &Device::cpu()?),
        }
    })
}

/// The factor `min(max_norm / (total_norm + 1e-6), 1)` that clipping multiplies every
/// gradient by, as a tensor beside `total_norm` (no host read). A NaN norm gives a NaN
/// factor, which spreads to the gradients as in PyTorch.
pub fn clip_coefficient(total_norm: &Tensor, max_norm: f64) -> Result<Tensor> {
    check_max_norm("clip_coefficient", max_norm)?;
    // clamp propagates NaN.
    no_grad(|| total_norm.add_scalar(1e-6)?.reciprocal()?.mul_scalar(max_norm)?.clamp(f64::NEG_INFINITY, 1.0))
}

/// Scale the gradients of `params` together so that their combined `norm_type`-norm is at
/// most `max_norm`, and return that norm before clipping as a 0-d tensor (PyTorch's
/// `clip_grad_norm_`: [`get_total_norm`], then every gradient multiplied by
/// [`clip_coefficient`]). Parameters without a gradient are skipped.
///
/// Like PyTorch's, it never waits for the device: the norm and the factor stay device
/// tensors, and every gradient is multiplied by the factor (by exactly 1 when under the
/// limit, which leaves it unchanged); read the norm with `item` once the step is issued. A
/// non-finite norm is returned as it is and makes the gradients NaN, as in PyTorch, so the
/// caller can skip the step. With AdamW, [`AdamW::step_with_grad_scale`](super::AdamW::step_with_grad_scale)
/// and the factor do the clipping inside the update, without this pass over the gradients.
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    check_norm_type("clip_grad_norm_", norm_type)?;
    // Checked before any work, with this function's name in the message.
    check_max_norm("clip_grad_norm_", max_norm)?;
    let total = get_total_norm(params, norm_type)?;
    let coef = clip_coefficient(&total, max_norm)?;
    no_grad(|| {
        let mut coefs: Vec<Tensor> = Vec::new();
        for (p, g) in params.iter().filter_map(|p| p.grad().map(|g| (p, g))) {
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
