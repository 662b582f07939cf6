//! `Conv2d`, `MaxPool2d`, `AvgPool2d`, `AdaptiveAvgPool2d`.

use super::functional;
use super::init;
use super::module::{Entry, Module, Param};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Options of [`Conv2d`] besides the channel counts and kernel size (PyTorch's defaults).
#[derive(Debug, Clone, Copy)]
pub struct Conv2dOptions {
    /// Step between windows.
    pub stride: [usize; 2],
    /// Zero padding on each side.
    pub padding: [usize; 2],
    /// Spacing between kernel taps.
    pub dilation: [usize; 2],
    /// Channel groups (`in` and `out` must be multiples).
    pub groups: usize,
    /// Whether the layer has a bias.
    pub bias: bool,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1, bias: true }
    }
}

/// 2-D convolution (`nn.Conv2d`), weight `(out, in/groups, kh, kw)` kaiming-uniform with
/// `a = sqrt(5)` and bias uniform in `±1/sqrt(fan_in)`, as PyTorch initializes them.
#[derive(Debug, Clone)]
pub struct Conv2d {
    /// `(out, in/groups, kh, kw)`.
    pub weight: Param,
    /// `(out)`.
    pub bias: Option<Param>,
    /// Stride, padding, dilation, groups.
    pub options: Conv2dOptions,
}

impl Conv2d {
    /// A new f32 layer on `device`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: Conv2dOptions,
        device: &Device,
    ) -> Result<Conv2d> {
        let g = options.groups;
        if g == 0 || in_channels % g != 0 || out_channels % g != 0 || in_channels == 0 || out_channels == 0 {
            return Err(Error::invalid(format!(
                "Conv2d: channels ({in_channels} in, {out_channels} out) must be positive multiples of groups ({g})"
            )));
        }
        if kernel.contains(&0) {
            return Err(Error::invalid(format!("Conv2d: kernel size must be positive, got {kernel:?}")));
        }
        let w = Tensor::empty_float(&[out_channels, in_channels / g, kernel[0], kernel[1]], device)?;
        init::kaiming_uniform_(&w, 5f64.sqrt())?;
        let bias = if options.bias {
            let b = Tensor::empty_float(&[out_channels], device)?;
            init::bias_uniform_(&b, &w)?;
            Some(Param::parameter(b)?)
        } else {
            None
        };
        Ok(Conv2d { weight: Param::parameter(w)?, bias, options })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let o = self.options;
        let b = self.bias.as_ref().map(Param::get);
        functional::conv2d(x, &self.weight.get(), b.as_ref(), o.stride, o.padding, o.dilation, o.groups)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("weight", Entry::Param(&self.weight));
        if let Some(b) = &self.bias {
            f("bias", Entry::Param(b));
        }
    }
}

/// 2-D max pooling (`nn.MaxPool2d`); `new` sets the stride to the kernel size.
#[derive(Debug, Clone, Copy)]
pub struct MaxPool2d {
    /// Window size.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// -inf padding on each side (at most half the kernel).
    pub padding: [usize; 2],
    /// Spacing between window taps.
    pub dilation: [usize; 2],
}

impl MaxPool2d {
    /// Non-overlapping windows of `kernel`.
    pub fn new(kernel: [usize; 2]) -> MaxPool2d {
        MaxPool2d { kernel, stride: kernel, padding: [0, 0], dilation: [1, 1] }
    }
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::max_pool2d(x, self.kernel, self.stride, self.padding, self.dilation)
    }
    fn visit(&self, _f: &mut dyn FnMut(&str, Entry<'_>)) {}
}

/// 2-D average pooling (`nn.AvgPool2d`, `count_include_pad=True`); `new` sets the stride to
/// the kernel size.
#[derive(Debug, Clone, Copy)]
pub struct AvgPool2d {
    /// Window size.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Zero padding on each side (at most half the kernel).
    pub padding: [usize; 2],
}

impl AvgPool2d {
    /// Non-overlapping windows of `kernel`.
    pub fn new(kernel: [usize; 2]) -> AvgPool2d {
        AvgPool2d { kernel, stride: kernel, padding: [0, 0] }
    }
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::avg_pool2d(x, self.kernel, self.stride, self.padding)
    }
    fn visit(&self, _f: &mut dyn FnMut(&str, Entry<'_>)) {}
}

/// Adaptive average pooling to a fixed output size (`nn.AdaptiveAvgPool2d`).
#[derive(Debug, Clone, Copy)]
pub struct AdaptiveAvgPool2d {
    /// `(oh, ow)`.
    pub output_size: [usize; 2],
}

impl Module for AdaptiveAvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::adaptive_avg_pool2d(x, self.output_size)
    }
    fn visit(&self, _f: &mut dyn FnMut(&str, Entry<'_>)) {}
}
