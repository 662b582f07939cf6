//! Automatic mixed precision: [`autocast`] scopes in which contractions (matmul, linear,
//! conv2d, attention) run in a low-precision float type while numerically sensitive ops
//! (softmax, log-softmax, norms, losses, sums, exp, log) run in f32, following PyTorch's
//! autocast op lists. The gradient scaler for f16 training lives in `optim`.

mod autocast;

pub use crate::optim::{GradScaler, GradScalerOptions};
pub use autocast::{autocast, autocast_dtype, is_autocast_enabled};
pub(crate) use autocast::{cast_for, suspend, CastPolicy};
