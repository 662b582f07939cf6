//! Reductions over dims: sum, mean, var, std, max, min, prod, argmax, argmin, logsumexp.

use super::exec;
use crate::autograd::{record1, record1_reading_output, BackwardFn, Saved, SavedOutput};
use crate::error::{Error, Result};
use crate::tensor::layout::{reduced_shape, wrap_dim, wrap_dims};
use crate::tensor::Tensor;
use genesis_backend_api::{DType, Op, ReduceOp};

/// Reduce `x` over `dims` (already wrapped) into a keepdim-shaped tensor of `dtype`.
fn reduce_raw(op: ReduceOp, x: &Tensor, dims: &[usize], dtype: DType) -> Result<Tensor> {
    let shape = reduced_shape(x.shape(), dims, true);
    let out = Tensor::empty(&shape, dtype, x.device())?;
    exec(&Op::Reduce(op), &[(x, x.layout())], &[&out])?;
    Ok(out)
}

/// `op` over every element of `x` (no autograd), written into `slot`, a one-element view
/// (say, one entry of a vector that collects many such results without copies). A
/// `SumSquares` the backend does not claim for `x`'s dtype is a `square` then a `Sum`.
pub(crate) fn reduce_all_into(op: ReduceOp, x: &Tensor, slot: &Tensor) -> Result<()> {
    if op == ReduceOp::SumSquares && !super::fused::use_fused(&Op::Reduce(op), x)? {
        return reduce_all_into(ReduceOp::Sum, &x.detach().square()?, slot);
    }
    let out = slot.reshape(&vec![1; x.rank()])?;
    exec(&Op::Reduce(op), &[(x, x.layout())], &[&out])
}

fn all_dims(x: &Tensor) -> Vec<isize> {
    (0..x.rank() as isize).collect()
}

fn drop_dims(t: Tensor, x_shape: &[usize], dims: &[usize], keepdim: bool) -> Result<Tensor> {
    if keepdim {
        return Ok(t);
    }
    let shape: Vec<isize> = reduced_shape(x_shape, dims, false).iter().map(|&n| n as isize).collect();
    t.reshape(&shape)
}

fn grad0(g: &[Option<Tensor>]) -> Result<&Tensor> {
    g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))
}

impl Tensor {
    /// Sum over `dims` (`keepdim` keeps them as size 1). Integers and bool sum to i64.
    pub fn sum_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let dims = wrap_dims("sum", dims, self.rank())?;
        let source = crate::amp::cast_for(crate::amp::CastPolicy::Float32, self)?;
        let dtype = if source.dtype().is_float() { source.dtype() } else { DType::I64 };
        let x = source.to_dtype(dtype)?;
        let y = reduce_raw(ReduceOp::Sum, &x, &dims, dtype)?;
        let shape = x.shape().to_vec();
        let y = record1("sum", &[&x], y, Box::new(move |g| Ok(vec![Some(grad0(g)?.broadcast_to(&shape)?)])));
        drop_dims(y, self.shape(), &dims, keepdim)
    }

    /// Sum of all elements (a 0-dim tensor).
    pub fn sum(&self) -> Result<Tensor> {
        self.sum_dims(&all_dims(self), false)
    }

    /// Mean over `dims`; floating-point only, as in PyTorch.
    pub fn mean_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(super::dtype_err(format!(
                "mean: expected a floating-point tensor, got {} (cast first)",
                self.dtype()
            )));
        }
        let wrapped = wrap_dims("mean", dims, self.rank())?;
        let count: usize = wrapped.iter().map(|&d| self.shape()[d]).product();
        self.sum_dims(dims, keepdim)?.div_scalar(count as f64)
    }

    /// Mean of all elements.
    pub fn mean(&self) -> Result<Tensor> {
        self.mean_dims(&all_dims(self), false)
    }

    /// Variance over `dims` with `correction` (1 = unbiased, PyTorch's default).
    pub fn var_dims(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        let wrapped = wrap_dims("var", dims, self.rank())?;
        let count: usize = wrapped.iter().map(|&d| self.shape()[d]).product();
        let centered = self.sub(&self.mean_dims(dims, true)?)?;
        let denominator = count.saturating_sub(correction) as f64;
        centered.square()?.sum_dims(dims, keepdim)?.div_scalar(denominator)
    }

    /// Standard deviation over `dims` with `correction`.
    pub fn std_dims(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.var_dims(dims, correction, keepdim)?.sqrt()
    }

    fn extreme(&self, op: ReduceOp, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let name = op.name();
        let wrapped = wrap_dims(name, dims, self.rank())?;
        let y = reduce_raw(op, self, &wrapped, self.dtype())?;
        let (sx, sy) = (Saved::new(self), Saved::new(&y));
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            // Ties share the gradient evenly (PyTorch's amax/amin rule).
            let (x, y) = (sx.get(name)?, sy.get(name)?);
            let mask = x.eq(y)?.to_dtype(x.dtype())?;
            let share = mask.div(&mask.sum_dims(&wrapped.iter().map(|&d| d as isize).collect::<Vec<_>>(), true)?)?;
            Ok(vec![Some(grad0(g)?.mul(&share)?)])
        });
        let y = record1(name, &[self], y, backward);
        drop_dims(y, self.shape(), &wrap_dims(name, dims, self.rank())?, keepdim)
    }

    /// Maximum over `dims` (`torch.amax`); NaN propagates.
    pub fn max_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.extreme(ReduceOp::Max, dims, keepdim)
    }

    /// Minimum over `dims` (`torch.amin`); NaN propagates.
    pub fn min_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.extreme(ReduceOp::Min, dims, keepdim)
    }

    /// Maximum of all elements.
    pub fn max(&self) -> Result<Tensor> {
        self.max_dims(&all_dims(self), false)
    }

    /// Minimum of all elements.
    pub fn min(&self) -> Result<Tensor> {
        self.min_dims(&all_dims(self), false)
    }

    /// Product over `dims` (the gradient assumes no zero elements).
    pub fn prod_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let wrapped = wrap_dims("prod", dims, self.rank())?;
        let dtype = if self.dtype().is_float() { self.dtype() } else { DType::I64 };
        let x = self.to_dtype(dtype)?;
        let y = reduce_raw(ReduceOp::Prod, &x, &wrapped, dtype)?;
        let sx = Saved::new(&x);
        let backward = move |sy: SavedOutput| -> BackwardFn {
            Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
                Ok(vec![Some(grad0(g)?.mul(&sy.get("prod")?)?.div(sx.get("prod")?)?)])
            })
        };
        let y = record1_reading_output("prod", &[&x], y, backward);
        drop_dims(y, self.shape(), &wrapped, keepdim)
    }

    fn arg(&self, op: ReduceOp, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        let name = op.name();
        match dim {
            None => {
                let flat = self.reshape(&[-1])?;
                let y = reduce_raw(op, &flat, &[0], DType::I64)?;
                if keepdim {
                    y.reshape(&vec![1; self.rank()])
                } else {
                    y.reshape(&[])
                }
            }
            Some(d) => {
                let d = wrap_dim(name, d, self.rank())?;
                let y = reduce_raw(op, self, &[d], DType::I64)?;
                drop_dims(y, self.shape(), &[d], keepdim)
            }
        }
    }

    /// Index of the maximum along `dim` (or of the flattened tensor); first index on ties.
    pub fn argmax(&self, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        self.arg(ReduceOp::ArgMax, dim, keepdim)
    }

    /// Index of the minimum along `dim` (or of the flattened tensor); first index on ties.
    pub fn argmin(&self, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        self.arg(ReduceOp::ArgMin, dim, keepdim)
    }

    /// `log(sum(exp(x)))` over `dims`, computed stably.
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        // Subtracting the (detached) maximum keeps exp from overflowing; an all -inf slice
        // gives -inf, so replace a non-finite max by 0 before subtracting.
        let m = self.detach().max_dims(dims, true)?;
        let m = m.masked_fill(&m.abs()?.eq_scalar(f64::INFINITY)?, 0.0)?;
        let s = self.sub(&m)?.exp()?.sum_dims(dims, true)?.log()?.add(&m)?;
        if keepdim {
            Ok(s)
        } else {
            let wrapped = wrap_dims("logsumexp", dims, self.rank())?;
            drop_dims(s, self.shape(), &wrapped, false)
        }
    }
}
