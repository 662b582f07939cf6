//! Loss modules: each holds its options and calls the functional form.

use super::functional::{self, Reduction};
use crate::error::Result;
use crate::tensor::Tensor;

/// `nn.CrossEntropyLoss`: logits `(n, c, ..)` against integer class targets.
#[derive(Debug, Clone, Copy)]
pub struct CrossEntropyLoss {
    /// Target value that contributes nothing (default -100).
    pub ignore_index: i64,
    /// Label smoothing in `[0, 1)`.
    pub label_smoothing: f64,
    /// Reduction.
    pub reduction: Reduction,
}

impl Default for CrossEntropyLoss {
    fn default() -> Self {
        CrossEntropyLoss { ignore_index: -100, label_smoothing: 0.0, reduction: Reduction::Mean }
    }
}

impl CrossEntropyLoss {
    /// The loss of `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        functional::cross_entropy(input, target, self.ignore_index, self.label_smoothing, self.reduction)
    }
}

/// `nn.NLLLoss`: log-probabilities `(n, c, ..)` against integer class targets.
#[derive(Debug, Clone, Copy)]
pub struct NLLLoss {
    /// Target value that contributes nothing (default -100).
    pub ignore_index: i64,
    /// Reduction.
    pub reduction: Reduction,
}

impl Default for NLLLoss {
    fn default() -> Self {
        NLLLoss { ignore_index: -100, reduction: Reduction::Mean }
    }
}

impl NLLLoss {
    /// The loss of `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        functional::nll_loss(input, target, self.ignore_index, self.reduction)
    }
}

macro_rules! elementwise_loss {
    ($(#[$doc:meta])* $name:ident => $f:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name {
            /// Reduction.
            pub reduction: Reduction,
        }

        impl $name {
            /// The loss of `input` against `target` (same shape).
            pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
                functional::$f(input, target, self.reduction)
            }
        }
    };
}

elementwise_loss!(
    /// `nn.MSELoss`.
    MSELoss => mse_loss
);
elementwise_loss!(
    /// `nn.L1Loss`.
    L1Loss => l1_loss
);

/// `nn.BCELoss` on probabilities.
#[derive(Debug, Clone, Default)]
pub struct BCELoss {
    /// Per-element weight (broadcast), if any.
    pub weight: Option<Tensor>,
    /// Reduction.
    pub reduction: Reduction,
}

impl BCELoss {
    /// The loss of `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        functional::binary_cross_entropy(input, target, self.weight.as_ref(), self.reduction)
    }
}

/// `nn.BCEWithLogitsLoss` on logits.
#[derive(Debug, Clone, Default)]
pub struct BCEWithLogitsLoss {
    /// Weight of the positive term (broadcast), if any.
    pub pos_weight: Option<Tensor>,
    /// Reduction.
    pub reduction: Reduction,
}

impl BCEWithLogitsLoss {
    /// The loss of `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        functional::binary_cross_entropy_with_logits(input, target, self.pos_weight.as_ref(), self.reduction)
    }
}
