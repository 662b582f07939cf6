//! Copies: dtype casts, device moves, making contiguous, cloning.

use super::exec;
use crate::autograd::record1;
use crate::device::Device;
use crate::error::Result;
use crate::tensor::Tensor;
use genesis_backend_api::{DType, Op};

impl Tensor {
    /// A dense copy when the view is not contiguous; otherwise the same tensor.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy_op()
    }

    /// A copy with its own storage (`torch.clone`), differentiable.
    pub fn copy(&self) -> Result<Tensor> {
        self.copy_op()
    }

    fn copy_op(&self) -> Result<Tensor> {
        let out = Tensor::empty(self.shape(), self.dtype(), self.device())?;
        exec(&Op::Copy, &[(self, self.layout())], &[&out])?;
        Ok(record1("copy", &[self], out, Box::new(|g| Ok(vec![g[0].clone()]))))
    }

    /// The elements converted to `dtype` (floats to integers truncate toward zero).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let out = Tensor::empty(self.shape(), dtype, self.device())?;
        exec(&Op::Cast, &[(self, self.layout())], &[&out])?;
        if !dtype.is_float() {
            return Ok(out); // not differentiable
        }
        let from = self.dtype();
        Ok(record1(
            "to_dtype",
            &[self],
            out,
            Box::new(move |g| Ok(vec![g[0].as_ref().map(|g| g.to_dtype(from)).transpose()?])),
        ))
    }

    /// The tensor on `device` (a copy through host memory between backends).
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let src = self.contiguous()?;
        let esize = src.dtype().size_in_bytes();
        let mut bytes = vec![0u8; src.numel() * esize];
        {
            let _span = crate::profiler::transfer(src.device(), "copy_to_host", src.shape(), src.dtype());
            src.device().read(src.storage().buffer, src.layout().offset * esize, &mut bytes)?;
        }
        let out = Tensor::empty(self.shape(), self.dtype(), device)?;
        let _span = crate::profiler::transfer(device, "copy_from_host", self.shape(), self.dtype());
        device.write(out.storage().buffer, 0, &bytes)?;
        let back = self.device().clone();
        Ok(record1(
            "to_device",
            &[self],
            out,
            Box::new(move |g| Ok(vec![g[0].as_ref().map(|g| g.to(&back)).transpose()?])),
        ))
    }
}
