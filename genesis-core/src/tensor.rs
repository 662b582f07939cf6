//! Tensors: a shared device buffer plus a strided view of it.

use crate::device::Device;
use crate::element::Element;
use crate::error::{Error, ErrorKind, Result};
use crate::storage::Storage;
use genesis_backend_api::{contiguous_strides, BinaryOp, DType, Op, TensorDesc};
use std::fmt;
use std::sync::Arc;

/// An n-dimensional array on a device. Cloning is cheap and shares the data.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    shape: Vec<usize>,
    strides: Vec<isize>,
    /// Offset of element zero, in elements.
    offset: usize,
    dtype: DType,
}

impl Tensor {
    fn alloc(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let numel = checked_numel(shape)?;
        let bytes = numel
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| Error::invalid(format!("shape {shape:?} is too large")))?;
        Ok(Tensor {
            storage: Arc::new(Storage::new(device, bytes)?),
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
            dtype,
        })
    }

    /// A tensor holding `data` with `shape` on `device`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        Self::from_slice(&data, shape, device)
    }

    /// A tensor holding a copy of `data` with `shape` on `device`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        let numel = checked_numel(shape)?;
        if numel != data.len() {
            return Err(Error::new(
                ErrorKind::ShapeMismatch,
                format!("tensor: {} values do not fill shape {shape:?} ({numel} elements)", data.len()),
            ));
        }
        let t = Self::alloc(shape, T::DTYPE, device)?;
        let mut bytes = Vec::with_capacity(t.storage.bytes);
        T::write_bytes(data, &mut bytes);
        device.write(t.storage.buffer, 0, &bytes)?;
        Ok(t)
    }

    /// A tensor of `shape` filled with `value`.
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let t = Self::alloc(shape, dtype, device)?;
        device.execute(&Op::Fill { value }, &[], &[t.desc()?])?;
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

    /// The size of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device holding the data.
    pub fn device(&self) -> &Device {
        &self.storage.device
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn desc(&self) -> Result<TensorDesc> {
        self.desc_as(&self.shape, &self.strides)
    }

    fn desc_as(&self, shape: &[usize], strides: &[isize]) -> Result<TensorDesc> {
        Ok(TensorDesc::new(self.storage.buffer, self.offset * self.dtype.size_in_bytes(), self.dtype, shape, strides)?)
    }

    /// Strides that present this tensor with `shape` by broadcasting (stride 0 on new or
    /// size-1 dims), or `None` when the shapes are incompatible.
    fn broadcast_strides(&self, shape: &[usize]) -> Option<Vec<isize>> {
        let lead = shape.len().checked_sub(self.shape.len())?;
        let mut strides = vec![0isize; shape.len()];
        for (i, (&n, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
            match (n, shape[lead + i]) {
                (a, b) if a == b => strides[lead + i] = s,
                (1, _) => strides[lead + i] = 0,
                _ => return None,
            }
        }
        Some(strides)
    }

    /// A dense copy when the view is not contiguous; otherwise a cheap clone.
    pub fn contiguous(&self) -> Result<Tensor> {
        if is_contiguous(&self.shape, &self.strides) {
            return Ok(self.clone());
        }
        let out = Self::alloc(&self.shape, self.dtype, self.device())?;
        self.device().execute(&Op::Copy, &[self.desc()?], &[out.desc()?])?;
        Ok(out)
    }

    /// Copy the elements to the host in row-major order. `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::new(
                ErrorKind::DtypeMismatch,
                format!("to_vec: tensor is {}, asked for {}", self.dtype, T::DTYPE),
            ));
        }
        let dense = self.contiguous()?;
        let mut bytes = vec![0u8; dense.numel() * self.dtype.size_in_bytes()];
        dense.device().read(dense.storage.buffer, dense.offset * self.dtype.size_in_bytes(), &mut bytes)?;
        Ok(T::read_bytes(&bytes))
    }

    fn binary(&self, other: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let name = op.name();
        if self.device() != other.device() {
            return Err(Error::invalid(format!("{name}: tensors are on {} and {}", self.device(), other.device())));
        }
        if self.dtype != other.dtype {
            return Err(Error::new(
                ErrorKind::DtypeMismatch,
                format!("{name}: dtypes {} and {} differ", self.dtype, other.dtype),
            ));
        }
        let shape = broadcast_shapes(&self.shape, &other.shape).ok_or_else(|| {
            Error::new(
                ErrorKind::ShapeMismatch,
                format!("{name}: shapes {:?} and {:?} do not broadcast", self.shape, other.shape),
            )
        })?;
        let out_dtype = if op.is_predicate() { DType::Bool } else { self.dtype };
        let out = Self::alloc(&shape, out_dtype, self.device())?;
        let (sa, sb) = (self.broadcast_strides(&shape), other.broadcast_strides(&shape));
        let (Some(sa), Some(sb)) = (sa, sb) else { return Err(Error::invalid(format!("{name}: broadcast failed"))) };
        let inputs = [self.desc_as(&shape, &sa)?, other.desc_as(&shape, &sb)?];
        self.device().execute(&Op::Binary(op), &inputs, &[out.desc()?])?;
        Ok(out)
    }

    /// Elementwise sum with broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Add)
    }

    /// Elementwise product with broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Mul)
    }
}

fn checked_numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .ok_or_else(|| Error::invalid(format!("shape {shape:?} overflows")))
}

fn is_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    let mut expected = 1isize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected *= n as isize;
    }
    true
}

/// The broadcast shape of `a` and `b` (NumPy rules), or `None`.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            match (x, y) {
                (x, y) if x == y => Some(x),
                (1, y) => Some(y),
                (x, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor(shape={:?}, dtype={}, device={})", self.shape, self.dtype, self.device())
    }
}
