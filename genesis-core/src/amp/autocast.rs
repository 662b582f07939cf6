//! The autocast scope: a thread-local low-precision dtype, and the one hook ops call.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use std::cell::Cell;

thread_local! {
    static LOW: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Restores the previous autocast state when dropped (also on unwinding).
pub(crate) struct AutocastGuard {
    previous: Option<DType>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        LOW.with(|c| c.set(self.previous));
    }
}

fn set(dtype: Option<DType>) -> AutocastGuard {
    AutocastGuard { previous: LOW.with(|c| c.replace(dtype)) }
}

/// Run `f` with autocast to `dtype` (`torch.autocast`): on this thread, matmul, linear, conv2d
/// and attention cast their f32/f16/bf16 inputs to `dtype`; softmax, log-softmax, layer/RMS/
/// batch norm, the losses, sums, products, cumsum, exp and log cast f16/bf16 inputs up to f32.
/// f64 tensors are never cast. Scopes nest; the innermost dtype wins. Backward passes run
/// without autocast, in the dtypes the forward chose.
///
/// ```
/// use genesis::{amp, DType, Device, Tensor};
/// let cpu = Device::parse("cpu")?;
/// let a = Tensor::ones(&[2, 3], DType::F32, &cpu)?;
/// let y = amp::autocast(DType::BF16, || a.matmul(&a.t()?))??;
/// assert_eq!(y.dtype(), DType::BF16);
/// # Ok::<(), genesis::Error>(())
/// ```
pub fn autocast<T>(dtype: DType, f: impl FnOnce() -> T) -> Result<T> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(Error::invalid(format!("autocast: the low-precision dtype must be f16 or bf16, got {dtype}")));
    }
    let _guard = set(Some(dtype));
    Ok(f())
}

/// The dtype of the innermost autocast scope on this thread, if any.
pub fn autocast_dtype() -> Option<DType> {
    LOW.with(Cell::get)
}

/// True inside an autocast scope on this thread.
pub fn is_autocast_enabled() -> bool {
    autocast_dtype().is_some()
}

/// Turn autocast off until the guard drops (the backward pass uses this).
pub(crate) fn suspend() -> AutocastGuard {
    set(None)
}

/// What an op wants from autocast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CastPolicy {
    /// Run in the scope's low-precision dtype (contractions).
    Low,
    /// Run in f32 (precision-sensitive ops).
    Float32,
}

/// The input an op should compute with under the current autocast scope: `t` itself outside
/// any scope, for non-float and f64 tensors, or when it already has the wanted dtype.
pub(crate) fn cast_for(policy: CastPolicy, t: &Tensor) -> Result<Tensor> {
    let Some(low) = autocast_dtype() else { return Ok(t.clone()) };
    let target = match (policy, t.dtype()) {
        (CastPolicy::Low, DType::F32 | DType::F16 | DType::BF16) => low,
        (CastPolicy::Float32, DType::F16 | DType::BF16) => DType::F32,
        _ => return Ok(t.clone()),
    };
    t.to_dtype(target)
}
