//! Functional forms of the layers and losses (`torch.nn.functional`).

pub use crate::ops::attention::{scaled_dot_product_attention, scaled_dot_product_attention_lower_right};
pub use crate::ops::conv::{adaptive_avg_pool2d, avg_pool2d, conv2d, max_pool2d};
pub use crate::ops::dropout::dropout;
pub use crate::ops::linear::{add_rms_norm_linear, linear};
pub use crate::ops::linear_loss::linear_cross_entropy;
pub use crate::ops::loss::{
    binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy, l1_loss, mse_loss, nll_loss, Reduction,
};
pub use crate::ops::norm::{add_rms_norm, batch_norm, layer_norm, rms_norm};
pub use crate::ops::rotary::rotary_embedding;
pub use crate::ops::swiglu::{swiglu, swiglu_halves, swiglu_linear};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Rows of `weight (num, dim)` for the integer `ids` of any shape (`F.embedding`); the result
/// has shape `ids.shape + [dim]`. Float ids are an error.
pub fn embedding(ids: &Tensor, weight: &Tensor) -> Result<Tensor> {
    if ids.dtype().is_float() || ids.dtype() == genesis_backend_api::DType::Bool {
        return Err(Error::new(
            crate::error::ErrorKind::DtypeMismatch,
            format!("embedding: ids must be an integer tensor, got {}", ids.dtype()),
        ));
    }
    weight.embedding(ids)
}

/// `max(x, 0)`.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    x.relu()
}

/// GELU; `tanh_approximate` selects PyTorch's `approximate='tanh'`.
pub fn gelu(x: &Tensor, tanh_approximate: bool) -> Result<Tensor> {
    if tanh_approximate {
        x.gelu_tanh()
    } else {
        x.gelu()
    }
}

/// `x·sigmoid(x)`.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    x.silu()
}

/// Softmax along `dim`.
pub fn softmax(x: &Tensor, dim: isize) -> Result<Tensor> {
    x.softmax(dim)
}

/// Log-softmax along `dim`.
pub fn log_softmax(x: &Tensor, dim: isize) -> Result<Tensor> {
    x.log_softmax(dim)
}
