//! Choosing the next token from a batch of logits, entirely on the logits' device: only the
//! chosen ids (one per row) ever reach the host.
//!
//! The processors run in transformers' order: repetition penalty, temperature, top-k, top-p,
//! min-p, then a draw. The repetition penalty counts the prompt's real tokens, not its left
//! padding (transformers counts the pad id too). Top-k and top-p need a per-row threshold; with no sort among the
//! backend primitives they find it by bisection (a fixed number of halvings of the value
//! range, all on the device), which keeps every token tied with the threshold, as
//! transformers' top-k does. The draw is Gumbel-max, `argmax(logits + Gumbel noise)`, which
//! picks token `i` with probability `softmax(logits)_i` without a cumulative sum.

use super::GenerationConfig;
use crate::autograd::no_grad;
use crate::error::Result;
use crate::random::Generator;
use crate::tensor::Tensor;
use genesis_backend_api::DType;

/// Halvings of the search interval when looking for a top-k or top-p threshold: the interval
/// ends up below f32 resolution for logits in any realistic range.
const BISECTION_STEPS: usize = 40;

/// The per-row largest `tau` for which `enough(tau)` holds, given `lo` (where it holds) and
/// `hi` (where it does not), both `(b, 1)`; `enough` must be monotone (true below some value).
fn bisect(lo: Tensor, hi: Tensor, enough: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let (mut lo, mut hi) = (lo, hi);
    for _ in 0..BISECTION_STEPS {
        let mid = lo.add(&hi)?.mul_scalar(0.5)?;
        let ok = enough(&mid)?;
        lo = Tensor::where_(&ok, &mid, &lo)?;
        hi = Tensor::where_(&ok, &hi, &mid)?;
    }
    Ok(lo)
}

/// `logits (b, V)` with every token outside the `k` largest of its row set to `-inf`.
pub fn top_k_filter(logits: &Tensor, k: usize) -> Result<Tensor> {
    let vocab = rows_of("top_k_filter", logits)?;
    if k == 0 || k >= vocab {
        return Ok(logits.clone());
    }
    // The search starts at the smallest unmasked logit (masked `-inf` ones would make the
    // interval infinite); masked entries are never counted.
    let masked = logits.eq_scalar(f64::NEG_INFINITY)?;
    let lo = logits.masked_fill(&masked, f64::INFINITY)?.min_dims(&[-1], true)?;
    let hi = logits.max_dims(&[-1], true)?.add_scalar(1.0)?;
    let tau = bisect(lo, hi, |t| logits.ge(t)?.to_dtype(DType::F32)?.sum_dims(&[-1], true)?.ge_scalar(k as f64))?;
    logits.masked_fill(&logits.lt(&tau)?, f64::NEG_INFINITY)
}

/// The vocabulary size of `(b, V)` logits, or an error naming `op`.
fn rows_of(op: &str, logits: &Tensor) -> Result<usize> {
    match logits.shape() {
        [_, vocab] if *vocab > 0 => Ok(*vocab),
        other => Err(crate::Error::invalid(format!("{op}: expected logits (batch, vocab), got shape {other:?}"))),
    }
}

/// `logits (b, V)` keeping the smallest set of most likely tokens whose probability reaches
/// `p` (at least one token per row).
pub fn top_p_filter(logits: &Tensor, p: f64) -> Result<Tensor> {
    rows_of("top_p_filter", logits)?;
    if p >= 1.0 {
        return Ok(logits.clone());
    }
    let probs = logits.softmax(-1)?;
    let lo = Tensor::zeros(&[probs.shape()[0], 1], probs.dtype(), probs.device())?;
    let hi = probs.max_dims(&[-1], true)?.add_scalar(1.0)?;
    let tau = bisect(lo, hi, |t| probs.mul(&probs.ge(t)?.to_dtype(DType::F32)?)?.sum_dims(&[-1], true)?.ge_scalar(p))?;
    // The most likely token always stays, whatever the rounding of the sums.
    let keep = probs.ge(&tau)?.logical_or(&probs.ge(&probs.max_dims(&[-1], true)?)?)?;
    logits.masked_fill(&keep.logical_not()?, f64::NEG_INFINITY)
}

/// `logits (b, V)` without the tokens whose probability is below `min_p` times the row's
/// largest.
pub fn min_p_filter(logits: &Tensor, min_p: f64) -> Result<Tensor> {
    rows_of("min_p_filter", logits)?;
    if min_p <= 0.0 {
        return Ok(logits.clone());
    }
    let probs = logits.softmax(-1)?;
    let floor = probs.max_dims(&[-1], true)?.mul_scalar(min_p)?;
    logits.masked_fill(&probs.lt(&floor)?, f64::NEG_INFINITY)
}

/// transformers' repetition penalty: where `seen (b, V)` is nonzero, positive logits are
/// divided by `penalty` and negative ones multiplied.
pub fn repetition_penalty(logits: &Tensor, seen: &Tensor, penalty: f64) -> Result<Tensor> {
    if penalty == 1.0 {
        return Ok(logits.clone());
    }
    let penalized =
        Tensor::where_(&logits.lt_scalar(0.0)?, &logits.mul_scalar(penalty)?, &logits.div_scalar(penalty)?)?;
    Tensor::where_(&seen.gt_scalar(0.0)?, &penalized, logits)
}

/// The next token of every row of `logits (b, V)` under `config`, as `(b,)` i64 on the
/// logits' device. `seen (b, V)` counts the tokens of each row so far (for the repetition
/// penalty). Greedy decoding takes the first maximum, as `argmax` does.
pub fn sample(logits: &Tensor, seen: Option<&Tensor>, config: &GenerationConfig, rng: &Generator) -> Result<Tensor> {
    rows_of("sample", logits)?;
    no_grad(|| {
        let penalty = seen.filter(|_| config.repetition_penalty != 1.0);
        if !config.do_sample && penalty.is_none() {
            // The argmax of the logits as they are: casting first would change nothing.
            return logits.argmax(Some(-1), false);
        }
        let mut l = logits.to_dtype(DType::F32)?;
        if let Some(seen) = penalty {
            l = repetition_penalty(&l, seen, config.repetition_penalty)?;
        }
        if !config.do_sample {
            return l.argmax(Some(-1), false);
        }
        if config.temperature != 1.0 {
            l = l.div_scalar(config.temperature)?;
        }
        l = top_k_filter(&l, config.top_k)?;
        l = top_p_filter(&l, config.top_p)?;
        l = min_p_filter(&l, config.min_p)?;
        let u = rng.uniform(l.shape(), 0.0, 1.0, DType::F32, l.device())?;
        let gumbel = u.log()?.neg()?.log()?.neg()?;
        l.add(&gumbel)?.argmax(Some(-1), false)
    })
}
