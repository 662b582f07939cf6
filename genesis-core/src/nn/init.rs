//! Initializations, drawn from the default generator (so `manual_seed` makes them
//! reproducible) and written in place under `no_grad`, as `torch.nn.init` does.

use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::random::Generator;
use crate::tensor::Tensor;

/// `(fan_in, fan_out)` of a weight: `(in, out)` for 2-D `(out, in)`, times the receptive
/// field (the product of the dims after the first two) for convolution weights.
pub fn fan_in_and_fan_out(t: &Tensor) -> Result<(usize, usize)> {
    if t.rank() < 2 {
        return Err(Error::invalid(format!(
            "init: fan in and fan out need a tensor with at least 2 dims, got {:?}",
            t.shape()
        )));
    }
    let receptive: usize = t.shape()[2..].iter().product();
    Ok((t.shape()[1] * receptive, t.shape()[0] * receptive))
}

/// Fill with uniform values in `[low, high)`.
pub fn uniform_(t: &Tensor, low: f64, high: f64) -> Result<()> {
    let g = Generator::default_for(t.device());
    let values = g.uniform(t.shape(), low, high, t.dtype(), t.device())?;
    no_grad(|| t.copy_(&values))
}

/// Fill with normal values.
pub fn normal_(t: &Tensor, mean: f64, std: f64) -> Result<()> {
    let g = Generator::default_for(t.device());
    let values = g.normal(t.shape(), mean, std, t.dtype(), t.device())?;
    no_grad(|| t.copy_(&values))
}

/// Fill with a constant.
pub fn constant_(t: &Tensor, value: f64) -> Result<()> {
    no_grad(|| t.fill_(value))
}

/// Fill with zeros.
pub fn zeros_(t: &Tensor) -> Result<()> {
    constant_(t, 0.0)
}

/// Fill with ones.
pub fn ones_(t: &Tensor) -> Result<()> {
    constant_(t, 1.0)
}

/// He (Kaiming) uniform for a leaky ReLU of negative slope `a` in fan-in mode:
/// `U(-b, b)` with `b = sqrt(2 / (1 + a²)) · sqrt(3 / fan_in)`. PyTorch's Linear and Conv
/// layers use `a = sqrt(5)`, which gives `b = 1/sqrt(fan_in)`.
pub fn kaiming_uniform_(t: &Tensor, a: f64) -> Result<()> {
    let (fan_in, _) = fan_in_and_fan_out(t)?;
    if fan_in == 0 {
        return Ok(()); // nothing to initialize in an empty tensor (PyTorch warns and skips)
    }
    let gain = (2.0 / (1.0 + a * a)).sqrt();
    let bound = gain * (3.0 / fan_in as f64).sqrt();
    uniform_(t, -bound, bound)
}

/// Which fan the He initializations scale by: `FanIn` keeps the variance of the forward
/// activations, `FanOut` that of the backward gradients (torchvision's ResNets use `FanOut`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanMode {
    /// Scale by the number of inputs of each output unit.
    FanIn,
    /// Scale by the number of outputs each input unit feeds.
    FanOut,
}

/// He (Kaiming) normal for a leaky ReLU of negative slope `a` (`a = 0`: ReLU, PyTorch's
/// `nonlinearity="relu"`): `N(0, std²)` with `std = sqrt(2 / (1 + a²)) / sqrt(fan)`.
pub fn kaiming_normal_(t: &Tensor, a: f64, mode: FanMode) -> Result<()> {
    let (fan_in, fan_out) = fan_in_and_fan_out(t)?;
    let fan = match mode {
        FanMode::FanIn => fan_in,
        FanMode::FanOut => fan_out,
    };
    if fan == 0 {
        return Ok(()); // an empty tensor: nothing to draw (PyTorch warns and skips)
    }
    let gain = (2.0 / (1.0 + a * a)).sqrt();
    normal_(t, 0.0, gain / (fan as f64).sqrt())
}

/// Glorot (Xavier) uniform: `U(-b, b)` with `b = gain · sqrt(6 / (fan_in + fan_out))`.
pub fn xavier_uniform_(t: &Tensor, gain: f64) -> Result<()> {
    let (fan_in, fan_out) = fan_in_and_fan_out(t)?;
    let bound = gain * (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    uniform_(t, -bound, bound)
}

/// PyTorch's default bias initialization for a layer with weight `w`: `U(±1/sqrt(fan_in))`.
pub fn bias_uniform_(bias: &Tensor, weight: &Tensor) -> Result<()> {
    let (fan_in, _) = fan_in_and_fan_out(weight)?;
    let bound = if fan_in > 0 { 1.0 / (fan_in as f64).sqrt() } else { 0.0 };
    uniform_(bias, -bound, bound)
}
