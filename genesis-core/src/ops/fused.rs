//! Whether an nn op takes its fused kernel, with a per-thread switch that forces the
//! compositions (so tests can compare the two paths on one backend).

use crate::error::Result;
use crate::tensor::Tensor;
use genesis_backend_api::{DType, Op};
use std::cell::Cell;

thread_local! {
    static COMPOSITES_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// True when `op` should run as the fused kernel for `t`'s device and dtype.
///
/// f64 never takes the kernels that save f32 statistics (mean and rstd, log-sum-exp: the
/// interface fixes them at f32 for every dtype): their f64 gradients would be only
/// f32-accurate, while the compositions are exact to f64, as gradcheck-grade work needs.
pub(crate) fn use_fused(op: &Op, t: &Tensor) -> Result<bool> {
    if COMPOSITES_ONLY.with(Cell::get) || (t.dtype() == DType::F64 && keeps_f32_statistics(op)) {
        return Ok(false);
    }
    t.device().supports(op, t.dtype())
}

fn keeps_f32_statistics(op: &Op) -> bool {
    matches!(
        op,
        Op::LayerNorm { .. }
            | Op::LayerNormBackward
            | Op::RmsNorm { .. }
            | Op::RmsNormBackward
            | Op::AddRmsNorm { .. }
            | Op::Attention { .. }
            | Op::AttentionBackward { .. }
            | Op::CrossEntropy { .. }
            | Op::CrossEntropyBackward { .. }
            | Op::BatchNorm { .. }
            | Op::BatchNormBackward
    )
}

/// Run `f` with the nn ops (norms, cross-entropy, attention, rotary, SwiGLU, dropout, convolution,
/// pooling) computed by their compositions of primitive ops instead of the backends' fused
/// kernels, on this thread. For tests and debugging.
pub fn composites_only<T>(f: impl FnOnce() -> T) -> T {
    crate::testing::scoped(&COMPOSITES_ONLY, true, f)
}
