//! Cross-entropy of a linear layer's output, `hidden @ weight^T`, a block of rows at a time,
//! so the `(rows × classes)` logits of a language model's head never exist whole: with
//! Qwen2's 151,936-word vocabulary, 8×1024 tokens of f32 logits and their gradient would take
//! 10 GB against the model's 1 GB of weights.
//!
//! When a gradient is needed, each block's gradients are computed in the forward pass (the
//! block's logits are at hand there) and kept: `∂/∂hidden` is `(rows × dim)` and `∂/∂weight`
//! the weight's size, so three matrix products per block, as without chunking. The backward
//! only scales them by the incoming gradient, which is why the loss must be a scalar.

use super::loss::{cross_entropy_sum_and_grad, Reduction};
use crate::autograd::{is_grad_enabled, no_grad, record};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::DType;

/// Cross-entropy of `hidden (n, dim) @ weight (classes, dim)^T` against `target (n,)`
/// (integer classes, `ignore_index` skipped), reduced to a scalar by `reduction` (`Mean`
/// over the targets that are not ignored, or `Sum`), computed `chunk_rows` rows at a time.
///
/// Equal to `cross_entropy(hidden.matmul(weight.t()), target, ignore_index, 0.0, reduction)`
/// up to rounding, with the same gradients for `hidden` and `weight`, but the peak memory of
/// one `(chunk_rows × classes)` block. Under autocast the products run in the autocast
/// dtype and the softmax in f32; the loss is f32 (f64 for f64 inputs). Gradients need one backward pass (no
/// higher order).
pub fn linear_cross_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    target: &Tensor,
    ignore_index: i64,
    reduction: Reduction,
    chunk_rows: usize,
) -> Result<Tensor> {
    let name = "linear_cross_entropy";
    if hidden.rank() != 2 || weight.rank() != 2 || target.rank() != 1 {
        return Err(Error::invalid(format!(
            "{name}: expected hidden (n, dim), weight (classes, dim) and target (n,), got {:?}, {:?} and {:?}",
            hidden.shape(),
            weight.shape(),
            target.shape()
        )));
    }
    let (n, dim) = (hidden.shape()[0], hidden.shape()[1]);
    if weight.shape()[1] != dim || target.shape()[0] != n {
        return Err(Error::invalid(format!(
            "{name}: hidden {:?}, weight {:?} and target {:?} do not fit (n, dim), (classes, dim), (n,)",
            hidden.shape(),
            weight.shape(),
            target.shape()
        )));
    }
    if !matches!(target.dtype(), DType::I64 | DType::I32) {
        return Err(Error::invalid(format!("{name}: target must hold integer classes, got {}", target.dtype())));
    }
    if chunk_rows == 0 {
        return Err(Error::invalid(format!("{name}: chunk_rows must be positive")));
    }
    if reduction == Reduction::None {
        return Err(Error::invalid(format!("{name}: the loss must be a scalar (Mean or Sum), not per row")));
    }
    let target = target.to_dtype(DType::I64)?;
    // f64 stays f64 (gradient checks); every other dtype takes its softmax in f32.
    let compute = if hidden.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let wants_grad = is_grad_enabled() && (hidden.requires_grad() || weight.requires_grad());
    // The mean's count of targets stays on the device: the loss waits for no read to the host
    // (and a captured graph can hold it). With every target ignored the mean is NaN, as in
    // PyTorch (0 / 0), and the gradients are zero.
    let counted = match reduction {
        Reduction::Mean => Some(target.ne_scalar(ignore_index)?.to_dtype(compute)?.sum()?),
        _ => None,
    };
    let grad_scale = match (&counted, wants_grad) {
        (Some(count), true) => Some(count.gt_scalar(0.0)?.to_dtype(compute)?.div(&count.clamp(1.0, f64::INFINITY)?)?),
        (None, true) => Some(Tensor::ones(&[], compute, hidden.device())?),
        (_, false) => None,
    };
    let (loss, grads) = no_grad(|| -> Result<(Tensor, Option<(Tensor, Tensor)>)> {
        // The head weight as the products use it (cast once under autocast, not per block).
        let w = crate::amp::cast_for(crate::amp::CastPolicy::Low, weight)?;
        let w_t = w.t()?;
        let mut total = Tensor::zeros(&[], compute, hidden.device())?;
        let mut grad_hidden = Vec::new();
        let mut grad_weight: Option<Tensor> = None;
        let mut start = 0;
        while start < n {
            let rows = chunk_rows.min(n - start);
            let (h, t) = (hidden.narrow(0, start, rows)?, target.narrow(0, start, rows)?);
            let logits = h.matmul(&w_t)?;
            let (block, d) = cross_entropy_sum_and_grad(&logits, &t, ignore_index, grad_scale.as_ref())?;
            total = total.add(&block.to_dtype(compute)?)?;
            if let Some(d) = d {
                // `matmul` applies autocast; without it the logits, hidden and weight share a dtype.
                grad_hidden.push(d.matmul(&w)?.to_dtype(hidden.dtype())?);
                // The head's gradient, summed over the blocks in one `compute` buffer that
                // each block's product is accumulated into by the GEMM itself (`addmm_`):
                // no block-sized product, cast or addition of the whole (classes, dim). The
                // first block's product starts the buffer: a widened product (f32 sums of
                // half-precision operands) where the backend has it, else zeros to add to.
                let (d_t, h) = (d.to_dtype(w.dtype())?.t()?, h.to_dtype(w.dtype())?);
                match &grad_weight {
                    Some(acc) => acc.addmm_(&d_t, &h)?,
                    None if matches!(w.dtype(), DType::F16 | DType::BF16)
                        && compute == DType::F32
                        && hidden.device().backend().takes_widened_matmul() =>
                    {
                        grad_weight = Some(super::matmul::matmul_widened(&d_t, &h)?);
                    }
                    None => grad_weight.insert(Tensor::zeros(w.shape(), compute, hidden.device())?).addmm_(&d_t, &h)?,
                }
            }
            start += rows;
        }
        let loss = match &counted {
            Some(count) => total.div(count)?,
            None => total,
        };
        let grads = match (wants_grad, grad_weight) {
            (true, Some(gw)) => Some((Tensor::cat(&grad_hidden, 0)?, gw.to_dtype(weight.dtype())?)),
            _ => None,
        };
        Ok((loss, grads))
    })?;
    let Some((grad_hidden, grad_weight)) = grads else { return Ok(loss) };
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = g[0].as_ref().ok_or_else(|| Error::invalid("linear_cross_entropy: missing gradient"))?;
        // After `loss.backward()` the gradients kept are the answer: no pass over the head's.
        if crate::autograd::takes_kept_gradients(g) {
            return Ok(vec![Some(grad_hidden.clone()), Some(grad_weight.clone())]);
        }
        let gh = grad_hidden.mul(&g.to_dtype(grad_hidden.dtype())?)?;
        let gw = grad_weight.mul(&g.to_dtype(grad_weight.dtype())?)?;
        Ok(vec![Some(gh), Some(gw)])
    });
    Ok(record(name, &[hidden, weight], vec![loss], backward).pop().expect("one output"))
}
