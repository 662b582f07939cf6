//! Making tensors: from host data, constants, ranges and random numbers.

use super::{Layout, Tensor};
use crate::device::Device;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::ops::shape_err;
use crate::random::Generator;
use genesis_backend_api::{DType, Op};

/// Host data a tensor can be built from: scalars, `Vec`s, slices and nested arrays
/// (`[[1.0, 2.0], [3.0, 4.0]]`).
pub trait TensorData {
    /// The element type.
    type Elem: Element;
    /// The shape the data describes; `Err` for ragged nesting.
    fn shape(&self) -> Result<Vec<usize>>;
    /// Append the elements in row-major order.
    fn flatten_into(&self, out: &mut Vec<Self::Elem>);
}

macro_rules! scalar_data {
    ($($t:ty),*) => {$(
        impl TensorData for $t {
            type Elem = $t;
            fn shape(&self) -> Result<Vec<usize>> { Ok(vec![]) }
            fn flatten_into(&self, out: &mut Vec<$t>) { out.push(*self); }
        }
    )*};
}
scalar_data!(f32, f64, half::f16, half::bf16, i64, i32, u8, bool);

fn nested_shape<D: TensorData>(items: &[D]) -> Result<Vec<usize>> {
    let inner = match items.first() {
        Some(first) => first.shape()?,
        None => vec![],
    };
    for item in items.iter().skip(1) {
        if item.shape()? != inner {
            return Err(shape_err("tensor: nested data is ragged (rows of different lengths)"));
        }
    }
    Ok(std::iter::once(items.len()).chain(inner).collect())
}

impl<D: TensorData, const N: usize> TensorData for [D; N] {
    type Elem = D::Elem;
    fn shape(&self) -> Result<Vec<usize>> {
        nested_shape(self)
    }
    fn flatten_into(&self, out: &mut Vec<D::Elem>) {
        self.iter().for_each(|d| d.flatten_into(out));
    }
}

impl<D: TensorData> TensorData for Vec<D> {
    type Elem = D::Elem;
    fn shape(&self) -> Result<Vec<usize>> {
        nested_shape(self)
    }
    fn flatten_into(&self, out: &mut Vec<D::Elem>) {
        self.iter().for_each(|d| d.flatten_into(out));
    }
}

impl<D: TensorData> TensorData for &[D] {
    type Elem = D::Elem;
    fn shape(&self) -> Result<Vec<usize>> {
        nested_shape(self)
    }
    fn flatten_into(&self, out: &mut Vec<D::Elem>) {
        self.iter().for_each(|d| d.flatten_into(out));
    }
}

impl Tensor {
    /// A tensor from (nested) host data: `Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &cpu)`.
    pub fn new<D: TensorData>(data: D, device: &Device) -> Result<Tensor> {
        let shape = data.shape()?;
        let mut flat = Vec::with_capacity(shape.iter().product());
        data.flatten_into(&mut flat);
        Self::from_slice(&flat, &shape, device)
    }

    /// A tensor holding `data` with `shape`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        Self::from_slice(&data, shape, device)
    }

    /// A tensor holding a copy of `data` with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        let numel: usize = shape.iter().product();
        if numel != data.len() {
            return Err(shape_err(format!(
                "tensor: {} values do not fill shape {shape:?} ({numel} elements)",
                data.len()
            )));
        }
        let t = Self::empty(shape, T::DTYPE, device)?;
        let mut bytes = Vec::with_capacity(numel * T::DTYPE.size_in_bytes());
        T::write_bytes(data, &mut bytes);
        let _span = crate::profiler::transfer(device, "copy_from_host", shape, T::DTYPE);
        device.write(t.storage().buffer, 0, &bytes)?;
        Ok(t)
    }

    /// A 0-dim tensor holding `value`.
    pub fn scalar<T: Element>(value: T, device: &Device) -> Result<Tensor> {
        Self::from_slice(&[value], &[], device)
    }

    /// `shape` filled with `value` (converted to `dtype`).
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let t = Self::empty(shape, dtype, device)?;
        crate::ops::exec(&Op::Fill { value }, &[], &[&t])?;
        Ok(t)
    }

    /// Zeros.
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Self::full(shape, 0.0, dtype, device)
    }

    /// Ones.
    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Self::full(shape, 1.0, dtype, device)
    }

    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Self::zeros(self.shape(), self.dtype(), self.device())
    }

    /// Ones with this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Result<Tensor> {
        Self::ones(self.shape(), self.dtype(), self.device())
    }

    /// `value` with this tensor's shape, dtype and device.
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Self::full(self.shape(), value, self.dtype(), self.device())
    }

    /// Uniform in `[0, 1)` with this tensor's shape, dtype and device.
    pub fn rand_like(&self) -> Result<Tensor> {
        Self::rand(self.shape(), self.dtype(), self.device())
    }

    /// Standard normal with this tensor's shape, dtype and device.
    pub fn randn_like(&self) -> Result<Tensor> {
        Self::randn(self.shape(), self.dtype(), self.device())
    }

    /// `[start, end)` in steps of `step` (`torch.arange`).
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::invalid(format!("arange: invalid range start={start} end={end} step={step}")));
        }
        // As PyTorch: a step pointing away from `end` is an error, not an empty range.
        if (step > 0.0 && end < start) || (step < 0.0 && end > start) {
            return Err(Error::invalid(format!(
                "arange: the bounds start={start} end={end} are inconsistent with the sign of step={step}"
            )));
        }
        let len = ((end - start) / step).ceil().max(0.0) as usize;
        let t = Self::empty(&[len], dtype, device)?;
        crate::ops::exec(&Op::Arange { start, step }, &[], &[&t])?;
        Ok(t)
    }

    /// `steps` evenly spaced values from `start` to `end` inclusive (`torch.linspace`).
    pub fn linspace(start: f64, end: f64, steps: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let step = if steps > 1 { (end - start) / (steps - 1) as f64 } else { 0.0 };
        let t = Self::empty(&[steps], dtype, device)?;
        crate::ops::exec(&Op::Arange { start, step }, &[], &[&t])?;
        Ok(t)
    }

    /// The `n × n` identity.
    pub fn eye(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let t = Self::zeros(&[n, n], dtype, device)?;
        // The diagonal is a strided view with stride n + 1.
        let diagonal = Layout { shape: vec![n], strides: vec![n as isize + 1], offset: 0 };
        crate::ops::exec_views(&Op::Fill { value: 1.0 }, &[], &[(&t, &diagonal)])?;
        Ok(t)
    }

    /// Uniform in `[0, 1)` from the default generator of `device` (`torch.rand`).
    pub fn rand(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Generator::default_for(device).uniform(shape, 0.0, 1.0, dtype, device)
    }

    /// Standard normal from the default generator (`torch.randn`).
    pub fn randn(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Generator::default_for(device).normal(shape, 0.0, 1.0, dtype, device)
    }

    /// Integers uniform in `[low, high)` as i64 (`torch.randint`).
    pub fn randint(low: i64, high: i64, shape: &[usize], device: &Device) -> Result<Tensor> {
        if high <= low {
            return Err(Error::invalid(format!("randint: empty range [{low}, {high})")));
        }
        let u = Generator::default_for(device).uniform(shape, low as f64, high as f64, DType::F64, device)?;
        // floor, then clamp: rounding of low + (high-low)*u can reach `high` for huge ranges.
        u.floor()?.clamp(low as f64, (high - 1) as f64)?.to_dtype(DType::I64)
    }
}
