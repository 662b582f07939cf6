//! `Linear` and `Embedding`.

use super::functional;
use super::init;
use super::module::{Entry, Module, Param};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::DType;

/// `y = x W^T + b` (`nn.Linear`); weight `(out, in)` kaiming-uniform with `a = sqrt(5)` and
/// bias uniform in `±1/sqrt(in)`, as PyTorch initializes them.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `(out_features, in_features)`.
    pub weight: Param,
    /// `(out_features)`.
    pub bias: Option<Param>,
}

impl Linear {
    /// A new f32 layer on `device`.
    pub fn new(in_features: usize, out_features: usize, bias: bool, device: &Device) -> Result<Linear> {
        let w = Tensor::empty_float(&[out_features, in_features], device)?;
        init::kaiming_uniform_(&w, 5f64.sqrt())?;
        let bias = if bias {
            let b = Tensor::empty_float(&[out_features], device)?;
            init::bias_uniform_(&b, &w)?;
            Some(Param::parameter(b)?)
        } else {
            None
        };
        Ok(Linear { weight: Param::parameter(w)?, bias })
    }
}

impl Module for Linear {
    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        functional::linear(input, &self.weight.get(), self.bias.as_ref().map(Param::get).as_ref())
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("weight", Entry::Param(&self.weight));
        if let Some(b) = &self.bias {
            f("bias", Entry::Param(b));
        }
    }
}

/// A lookup table of `num_embeddings` vectors of size `embedding_dim` (`nn.Embedding`),
/// initialized from N(0, 1). The input holds integer ids of any shape.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// `(num_embeddings, embedding_dim)`.
    pub weight: Param,
}

impl Embedding {
    /// A new f32 table on `device`.
    pub fn new(num_embeddings: usize, embedding_dim: usize, device: &Device) -> Result<Embedding> {
        let w = Tensor::empty_float(&[num_embeddings, embedding_dim], device)?;
        init::normal_(&w, 0.0, 1.0)?;
        Ok(Embedding { weight: Param::parameter(w)? })
    }
}

impl Module for Embedding {
    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        functional::embedding(input, &self.weight.get())
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("weight", Entry::Param(&self.weight));
    }
}

impl Tensor {
    /// A zero-filled f32 tensor that initializers overwrite.
    pub(crate) fn empty_float(shape: &[usize], device: &Device) -> Result<Tensor> {
        Tensor::zeros(shape, DType::F32, device)
    }
}

/// Refuse a layer size of zero with a clear message.
pub(crate) fn positive(name: &str, what: &str, n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid(format!("{name}: {what} must be positive")));
    }
    Ok(())
}
