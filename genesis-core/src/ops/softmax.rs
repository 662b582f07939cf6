//! Softmax and log-softmax along a dim, forward and backward. Each uses the backend's
//! fused kernel when the device claims it and a composition of primitives otherwise.

use super::exec;
use crate::autograd::{record1_reading_output, BackwardFn, SavedOutput};
use crate::error::{Error, Result};
use crate::tensor::layout::wrap_dim;
use crate::tensor::Tensor;
use genesis_backend_api::Op;

impl Tensor {
    /// Softmax along `dim`; an all `-inf` slice gives NaN as in PyTorch.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        crate::amp::cast_for(crate::amp::CastPolicy::Float32, self)?.softmax_impl(dim, false)
    }

    /// Log-softmax along `dim`.
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        crate::amp::cast_for(crate::amp::CastPolicy::Float32, self)?.softmax_impl(dim, true)
    }

    fn softmax_impl(&self, dim: isize, log: bool) -> Result<Tensor> {
        let name = if log { "log_softmax" } else { "softmax" };
        if !self.dtype().is_float() {
            return Err(super::dtype_err(format!("{name}: expected a floating-point tensor, got {}", self.dtype())));
        }
        let d = wrap_dim(name, dim, self.rank())?;
        let last = self.rank().saturating_sub(1);
        if self.rank() > 0 && d != last {
            // Kernels work on the last dim; move `d` there and back (views, no copies).
            return self.transpose(d as isize, -1)?.softmax_impl(-1, log)?.transpose(d as isize, -1);
        }
        let (forward, backward) =
            if log { (Op::LogSoftmax, Op::LogSoftmaxBackward) } else { (Op::Softmax, Op::SoftmaxBackward) };
        if !self.device().supports(&forward, self.dtype())? {
            return self.softmax_composite(log);
        }
        let y = Tensor::empty(self.shape(), self.dtype(), self.device())?;
        exec(&forward, &[(self, self.layout())], &[&y])?;
        let grad_fn = move |sy: SavedOutput| -> BackwardFn {
            Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
                let g = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
                let y = &sy.get(name)?;
                // The fused backward is used for first-order gradients only: its own gradient is
                // not defined, so with create_graph the composition is used instead.
                if !crate::autograd::is_grad_enabled() && g.device().supports(&backward, g.dtype())? {
                    let dx = Tensor::empty(g.shape(), g.dtype(), g.device())?;
                    exec(&backward, &[(y, y.layout()), (g, g.layout())], &[&dx])?;
                    return Ok(vec![Some(dx)]);
                }
                let dx = if log {
                    g.sub(&y.exp()?.mul(&g.sum_dims(&[-1], true)?)?)?
                } else {
                    y.mul(&g.sub(&g.mul(y)?.sum_dims(&[-1], true)?)?)?
                };
                Ok(vec![Some(dx)])
            })
        };
        Ok(record1_reading_output(name, &[self], y, grad_fn))
    }

    fn softmax_composite(&self, log: bool) -> Result<Tensor> {
        let shifted = self.sub(&self.detach().max_dims(&[-1], true)?)?;
        if log {
            shifted.sub(&shifted.exp()?.sum_dims(&[-1], true)?.log()?)
        } else {
            let e = shifted.exp()?;
            e.div(&e.sum_dims(&[-1], true)?)
        }
    }
}
