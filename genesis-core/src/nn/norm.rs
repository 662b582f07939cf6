//! Normalization layers: `LayerNorm`, `RMSNorm`, `BatchNorm1d`, `BatchNorm2d`.

use super::functional;
use super::module::{Entry, Module, Param, TrainingFlag};
use crate::device::Device;
use crate::error::Result;
use crate::ops::shape_err;
use crate::tensor::Tensor;
use genesis_backend_api::DType;

fn affine(shape: &[usize], device: &Device, bias: bool) -> Result<(Param, Option<Param>)> {
    let w = Param::parameter(Tensor::ones(shape, DType::F32, device)?)?;
    let b = if bias { Some(Param::parameter(Tensor::zeros(shape, DType::F32, device)?)?) } else { None };
    Ok((w, b))
}

/// Layer normalization over the trailing `normalized_shape` dims (`nn.LayerNorm`), weight
/// ones and bias zeros.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// The normalized trailing shape.
    pub normalized_shape: Vec<usize>,
    /// Added to the variance.
    pub eps: f64,
    /// Scale (absent without `elementwise_affine`).
    pub weight: Option<Param>,
    /// Shift (absent without `elementwise_affine` or `bias`).
    pub bias: Option<Param>,
}

impl LayerNorm {
    /// `nn.LayerNorm(normalized_shape, eps=1e-5, elementwise_affine, bias)`.
    pub fn new(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        bias: bool,
        device: &Device,
    ) -> Result<LayerNorm> {
        let (weight, bias) = if elementwise_affine {
            let (w, b) = affine(normalized_shape, device, bias)?;
            (Some(w), b)
        } else {
            (None, None)
        };
        Ok(LayerNorm { normalized_shape: normalized_shape.to_vec(), eps, weight, bias })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = (self.weight.as_ref().map(Param::get), self.bias.as_ref().map(Param::get));
        functional::layer_norm(x, &self.normalized_shape, w.as_ref(), b.as_ref(), self.eps)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        if let Some(w) = &self.weight {
            f("weight", Entry::Param(w));
        }
        if let Some(b) = &self.bias {
            f("bias", Entry::Param(b));
        }
    }
}

/// RMS normalization (`nn.RMSNorm`), weight ones; `eps = None` uses the dtype's epsilon.
#[derive(Debug, Clone)]
pub struct RMSNorm {
    /// The normalized trailing shape.
    pub normalized_shape: Vec<usize>,
    /// Added to the mean square.
    pub eps: Option<f64>,
    /// Scale (absent without `elementwise_affine`).
    pub weight: Option<Param>,
}

impl RMSNorm {
    /// `nn.RMSNorm(normalized_shape, eps, elementwise_affine)`.
    pub fn new(
        normalized_shape: &[usize],
        eps: Option<f64>,
        elementwise_affine: bool,
        device: &Device,
    ) -> Result<RMSNorm> {
        let weight = if elementwise_affine { Some(affine(normalized_shape, device, false)?.0) } else { None };
        Ok(RMSNorm { normalized_shape: normalized_shape.to_vec(), eps, weight })
    }

    /// `(self(x + residual), x + residual)`: the residual addition before the norm done in the
    /// same pass ([`functional::add_rms_norm`]); the sum is the residual stream that goes on.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
        let w = self.weight.as_ref().map(Param::get);
        functional::add_rms_norm(x, residual, &self.normalized_shape, w.as_ref(), self.eps)
    }
}

impl Module for RMSNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w = self.weight.as_ref().map(Param::get);
        functional::rms_norm(x, &self.normalized_shape, w.as_ref(), self.eps)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        if let Some(w) = &self.weight {
            f("weight", Entry::Param(w));
        }
    }
}

/// Batch normalization over the channel dim of `(n, c)` / `(n, c, l)` (`BatchNorm1d`) or
/// `(n, c, h, w)` (`BatchNorm2d`) inputs, with running statistics (momentum 0.1 by default)
/// and a `num_batches_tracked` counter, under PyTorch's state-dict names.
#[derive(Debug)]
pub struct BatchNorm {
    ranks: &'static [usize],
    name: &'static str,
    /// Added to the variance.
    pub eps: f64,
    /// Weight of the new batch in the running averages.
    pub momentum: f64,
    /// Scale.
    pub weight: Option<Param>,
    /// Shift.
    pub bias: Option<Param>,
    /// Running mean (buffer).
    pub running_mean: Param,
    /// Running variance (buffer).
    pub running_var: Param,
    /// Number of training batches seen (i64 buffer).
    pub num_batches_tracked: Param,
    training: TrainingFlag,
}

/// `nn.BatchNorm1d`.
pub type BatchNorm1d = BatchNorm;
/// `nn.BatchNorm2d`.
pub type BatchNorm2d = BatchNorm;

impl BatchNorm {
    fn build(name: &'static str, ranks: &'static [usize], c: usize, device: &Device) -> Result<BatchNorm> {
        super::linear::positive(name, "num_features", c)?;
        let (w, b) = affine(&[c], device, true)?;
        Ok(BatchNorm {
            ranks,
            name,
            eps: 1e-5,
            momentum: 0.1,
            weight: Some(w),
            bias: b,
            running_mean: Param::buffer(Tensor::zeros(&[c], DType::F32, device)?),
            running_var: Param::buffer(Tensor::ones(&[c], DType::F32, device)?),
            num_batches_tracked: Param::buffer(Tensor::zeros(&[], DType::I64, device)?),
            training: TrainingFlag::default(),
        })
    }

    /// `nn.BatchNorm1d(num_features)` for `(n, c)` or `(n, c, l)` inputs.
    pub fn new_1d(num_features: usize, device: &Device) -> Result<BatchNorm> {
        Self::build("BatchNorm1d", &[2, 3], num_features, device)
    }

    /// `nn.BatchNorm2d(num_features)` for `(n, c, h, w)` inputs.
    pub fn new_2d(num_features: usize, device: &Device) -> Result<BatchNorm> {
        Self::build("BatchNorm2d", &[4], num_features, device)
    }
}

impl Module for BatchNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.ranks.contains(&x.rank()) {
            return Err(shape_err(format!(
                "{}: expected an input of rank {:?}, got shape {:?}",
                self.name,
                self.ranks,
                x.shape()
            )));
        }
        let training = self.training.get();
        if training {
            crate::autograd::no_grad(|| self.num_batches_tracked.get().add_scalar_(1))?;
        }
        let (w, b) = (self.weight.as_ref().map(Param::get), self.bias.as_ref().map(Param::get));
        functional::batch_norm(
            x,
            Some(&self.running_mean.get()),
            Some(&self.running_var.get()),
            w.as_ref(),
            b.as_ref(),
            training,
            self.momentum,
            self.eps,
        )
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        if let Some(w) = &self.weight {
            f("weight", Entry::Param(w));
        }
        if let Some(b) = &self.bias {
            f("bias", Entry::Param(b));
        }
        f("running_mean", Entry::Buffer(&self.running_mean));
        f("running_var", Entry::Buffer(&self.running_var));
        f("num_batches_tracked", Entry::Buffer(&self.num_batches_tracked));
        f("", Entry::Training(&self.training));
    }
}
