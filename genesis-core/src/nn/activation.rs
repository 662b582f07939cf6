//! Parameter-free layers: activations, `Softmax`, `Flatten`, `Identity`.

use super::module::{Entry, Module};
use crate::error::Result;
use crate::tensor::Tensor;

macro_rules! activation {
    ($(#[$doc:meta])* $name:ident, |$x:ident| $body:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name;

        impl Module for $name {
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                $body
            }
            fn visit(&self, _f: &mut dyn FnMut(&str, Entry<'_>)) {}
        }
    };
}

activation!(
    /// `max(x, 0)` (`nn.ReLU`).
    ReLU, |x| x.relu()
);
activation!(
    /// `x·sigmoid(x)` (`nn.SiLU`).
    SiLU, |x| x.silu()
);
activation!(
    /// `1/(1+e^-x)` (`nn.Sigmoid`).
    Sigmoid, |x| x.sigmoid()
);
activation!(
    /// `tanh(x)` (`nn.Tanh`).
    Tanh, |x| x.tanh()
);
activation!(
    /// The input unchanged (`nn.Identity`).
    Identity, |x| Ok(x.clone())
);

/// GELU (`nn.GELU`), exact (erf) unless `tanh_approximate`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GELU {
    /// PyTorch's `approximate='tanh'`.
    pub tanh_approximate: bool,
}

impl Module for GELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::functional::gelu(x, self.tanh_approximate)
    }
    fn visit(&self, _f: &mut dyn FnMut(&str, Entry<'_>)) {}
}

/// Softmax along `dim` (`nn.Softmax`).
#[derive(Debug, Clone, Copy)]
pub struct Softmax {
    /// The normalized dim.
    pub dim: isize,
}

impl Module for Softmax {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.softmax(self.dim)
    }
    fn visit(&self, _f: &mut dyn FnMut(&str, Entry<'_>)) {}
}

/// Flatten dims `start..=end` (`nn.Flatten`, default `1..=-1`).
#[derive(Debug, Clone, Copy)]
pub struct Flatten {
    /// First flattened dim.
    pub start: isize,
    /// Last flattened dim.
    pub end: isize,
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten { start: 1, end: -1 }
    }
}

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten(self.start, self.end)
    }
    fn visit(&self, _f: &mut dyn FnMut(&str, Entry<'_>)) {}
}
