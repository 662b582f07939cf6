//! Views and shape changes: they share storage where the strides allow, and their backward
//! maps the gradient back to the input's shape.

use super::{common_device, exec_views, shape_err, sum_to};
use crate::autograd::record1;
use crate::error::{Error, Result};
use crate::tensor::layout::{infer_shape, wrap_dim, Layout};
use crate::tensor::Tensor;
use genesis_backend_api::Op;

fn grad0(g: &[Option<Tensor>]) -> Result<&Tensor> {
    g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))
}

fn as_isize(shape: &[usize]) -> Vec<isize> {
    shape.iter().map(|&n| n as isize).collect()
}

impl Tensor {
    /// The same elements with a new shape (one entry may be -1); a view when the strides
    /// allow, a copy otherwise (`torch.reshape`).
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        let shape = infer_shape("reshape", self.numel(), shape)?;
        let source = match self.layout().view(&shape) {
            Some(layout) => self.with_layout(layout),
            None => {
                let dense = crate::autograd::no_grad(|| self.contiguous())?.detach();
                dense.with_layout(Layout { shape: shape.clone(), ..Layout::contiguous(&shape) })
            }
        };
        let original = as_isize(self.shape());
        Ok(record1("reshape", &[self], source, Box::new(move |g| Ok(vec![Some(grad0(g)?.reshape(&original)?)]))))
    }

    /// A view with a new shape; fails when the strides do not allow one (`torch.view`).
    pub fn view(&self, shape: &[isize]) -> Result<Tensor> {
        let target = infer_shape("view", self.numel(), shape)?;
        if self.layout().view(&target).is_none() {
            return Err(shape_err(format!(
                "view: shape {target:?} is not compatible with the strides {:?} of this {:?} tensor; use reshape",
                self.strides(),
                self.shape()
            )));
        }
        self.reshape(shape)
    }

    /// Flatten dims `start..=end` into one.
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape(&[1]);
        }
        let (s, e) = (wrap_dim("flatten", start, self.rank())?, wrap_dim("flatten", end, self.rank())?);
        if s > e {
            return Err(Error::invalid(format!("flatten: start dim {start} comes after end dim {end}")));
        }
        let mut shape = as_isize(&self.shape()[..s]);
        shape.push(self.shape()[s..=e].iter().product::<usize>() as isize);
        shape.extend(as_isize(&self.shape()[e + 1..]));
        self.reshape(&shape)
    }

    /// Reorder dims (`torch.permute`), a view.
    pub fn permute(&self, dims: &[isize]) -> Result<Tensor> {
        if dims.len() != self.rank() {
            return Err(Error::invalid(format!(
                "permute: {} dims given for a tensor of rank {}",
                dims.len(),
                self.rank()
            )));
        }
        let dims = crate::tensor::layout::wrap_dims("permute", dims, self.rank())?;
        let mut inverse = vec![0isize; dims.len()];
        for (i, &d) in dims.iter().enumerate() {
            inverse[d] = i as isize;
        }
        let view = self.with_layout(self.layout().permute(&dims));
        Ok(record1("permute", &[self], view, Box::new(move |g| Ok(vec![Some(grad0(g)?.permute(&inverse)?)]))))
    }

    /// Swap two dims, a view.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let rank = self.rank();
        let (a, b) = (wrap_dim("transpose", a, rank)?, wrap_dim("transpose", b, rank)?);
        let mut dims: Vec<isize> = (0..rank as isize).collect();
        dims.swap(a, b);
        self.permute(&dims)
    }

    /// Transpose of a matrix (rank ≤ 2).
    pub fn t(&self) -> Result<Tensor> {
        match self.rank() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            r => Err(Error::invalid(format!("t: expects a tensor of rank <= 2, got rank {r}"))),
        }
    }

    /// Broadcast to `shape` without copying (-1 keeps a dim), a view (`torch.expand`).
    pub fn expand(&self, shape: &[isize]) -> Result<Tensor> {
        let lead = shape.len().checked_sub(self.rank()).ok_or_else(|| {
            shape_err(format!("expand: target {shape:?} has fewer dims than the tensor's {:?}", self.shape()))
        })?;
        let target: Vec<usize> = shape
            .iter()
            .enumerate()
            .map(|(i, &n)| if n == -1 && i >= lead { self.shape()[i - lead] } else { n.max(0) as usize })
            .collect();
        self.broadcast_to(&target)
    }

    /// Broadcast to `shape`, a view.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let layout = self.layout().broadcast_to(shape).ok_or_else(|| {
            shape_err(format!("broadcast_to: shape {:?} cannot be broadcast to {shape:?}", self.shape()))
        })?;
        let original = self.shape().to_vec();
        let view = self.with_layout(layout);
        Ok(record1("expand", &[self], view, Box::new(move |g| Ok(vec![Some(sum_to(grad0(g)?, &original)?)]))))
    }

    /// Remove size-1 dims (all of them, or just `dim`).
    pub fn squeeze(&self, dim: Option<isize>) -> Result<Tensor> {
        let shape: Vec<isize> = match dim {
            None => self.shape().iter().filter(|&&n| n != 1).map(|&n| n as isize).collect(),
            Some(d) => {
                let d = wrap_dim("squeeze", d, self.rank())?;
                let mut s = as_isize(self.shape());
                if self.shape().get(d) == Some(&1) {
                    s.remove(d);
                }
                s
            }
        };
        self.reshape(&shape)
    }

    /// Insert a size-1 dim at `dim` (which may be `rank` to append).
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let d = wrap_dim("unsqueeze", dim, self.rank() + 1)?;
        let mut shape = as_isize(self.shape());
        shape.insert(d, 1);
        self.reshape(&shape)
    }

    /// Elements `start..end` of `dim` in steps of `step`, a view (Python's `x[a:b:s]`).
    /// Bounds are clamped like Python slices; negative bounds count from the end.
    pub fn slice(&self, dim: isize, start: isize, end: isize, step: usize) -> Result<Tensor> {
        let d = wrap_dim("slice", dim, self.rank())?;
        if step == 0 {
            return Err(Error::invalid("slice: step must be positive"));
        }
        let n = self.shape()[d] as isize;
        let clampi = |i: isize| if i < 0 { (i + n).max(0) } else { i.min(n) };
        let (s, e) = (clampi(start), clampi(end));
        let len = if e > s { ((e - s) as usize).div_ceil(step) } else { 0 };
        let view = self.with_layout(self.layout().slice(d, s as usize, len, step));
        let input_shape = self.shape().to_vec();
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            Ok(vec![Some(slice_backward(grad0(g)?, &input_shape, d, s as usize, step)?)])
        });
        Ok(record1("slice", &[self], view, backward))
    }

    /// `length` elements of `dim` from `start`, a view (`torch.narrow`).
    pub fn narrow(&self, dim: isize, start: usize, length: usize) -> Result<Tensor> {
        let d = wrap_dim("narrow", dim, self.rank())?;
        if start + length > self.shape()[d] {
            return Err(Error::invalid(format!(
                "narrow: range {start}..{} is outside dim {d} of size {}",
                start + length,
                self.shape()[d]
            )));
        }
        self.slice(d as isize, start as isize, (start + length) as isize, 1)
    }

    /// Index `index` of `dim`, removing the dim, a view (`x[i]`).
    pub fn select(&self, dim: isize, index: isize) -> Result<Tensor> {
        let d = wrap_dim("select", dim, self.rank())?;
        let n = self.shape()[d] as isize;
        let i = if index < 0 { index + n } else { index };
        if i < 0 || i >= n {
            return Err(Error::invalid(format!("select: index {index} is out of range for dim {d} of size {n}")));
        }
        self.narrow(d as isize, i as usize, 1)?.squeeze(Some(d as isize))
    }

    /// Split into pieces of `size` along `dim` (the last may be smaller).
    pub fn split(&self, size: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = wrap_dim("split", dim, self.rank())?;
        if size == 0 {
            return Err(Error::invalid("split: size must be positive"));
        }
        let n = self.shape()[d];
        let sizes: Vec<usize> = (0..n).step_by(size).map(|start| size.min(n - start)).collect();
        self.split_with_sizes(&sizes, d as isize)
    }

    /// Split into pieces of `sizes` along `dim`, which must add up to its length (`torch.split`
    /// with a list). The pieces are views; their gradients are joined by one concatenation
    /// (zeros for a piece without one), not each spread over zeros of the whole.
    pub fn split_with_sizes(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        let d = wrap_dim("split_with_sizes", dim, self.rank())?;
        if sizes.iter().sum::<usize>() != self.shape()[d] {
            return Err(shape_err(format!(
                "split_with_sizes: sizes {sizes:?} do not add up to dim {d} of shape {:?}",
                self.shape()
            )));
        }
        let mut start = 0;
        let mut pieces = Vec::with_capacity(sizes.len());
        for &n in sizes {
            pieces.push(self.with_layout(self.layout().slice(d, start, n, 1)));
            start += n;
        }
        let shapes: Vec<Vec<usize>> = pieces.iter().map(|p| p.shape().to_vec()).collect();
        let (dtype, device) = (self.dtype(), self.device().clone());
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            let parts = g
                .iter()
                .zip(&shapes)
                .map(|(g, shape)| g.clone().map_or_else(|| Tensor::zeros(shape, dtype, &device), Ok))
                .collect::<Result<Vec<_>>>()?;
            Ok(vec![Some(Tensor::cat(&parts, d as isize)?)])
        });
        Ok(crate::autograd::record("split", &[self], pieces, backward))
    }

    /// Split into `chunks` nearly equal pieces along `dim`.
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = wrap_dim("chunk", dim, self.rank())?;
        if chunks == 0 {
            return Err(Error::invalid("chunk: number of chunks must be positive"));
        }
        self.split(self.shape()[d].div_ceil(chunks).max(1), d as isize)
    }

    /// Concatenate along `dim` (`torch.cat`).
    pub fn cat(tensors: &[Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::invalid("cat: expected at least one tensor"))?;
        let d = wrap_dim("cat", dim, first.rank())?;
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let device = common_device("cat", &refs)?;
        let dtype = tensors.iter().map(Tensor::dtype).reduce(super::promote_types).unwrap_or(first.dtype());
        for t in tensors {
            let same = t.rank() == first.rank() && (0..t.rank()).all(|i| i == d || t.shape()[i] == first.shape()[i]);
            if !same {
                return Err(shape_err(format!(
                    "cat: shapes {:?} and {:?} differ outside dim {d}",
                    first.shape(),
                    t.shape()
                )));
            }
        }
        let mut shape = first.shape().to_vec();
        shape[d] = tensors.iter().map(|t| t.shape()[d]).sum();
        let out = Tensor::empty(&shape, dtype, device)?;
        let mut start = 0;
        let mut sizes = Vec::new();
        for t in tensors {
            let n = t.shape()[d];
            let part = out.layout().slice(d, start, n, 1);
            let op = if t.dtype() == dtype { Op::Copy } else { Op::Cast };
            exec_views(&op, &[(t, t.layout())], &[(&out, &part)])?;
            sizes.push(n);
            start += n;
        }
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            Ok(grad0(g)?.split_with_sizes(&sizes, d as isize)?.into_iter().map(Some).collect())
        });
        Ok(record1("cat", &refs, out, backward))
    }

    /// The rows of `parts` (contiguous, each `(n_i, ..)`) as one `(Σ n_i, ..)` tensor without a
    /// copy, when they lie back to back in one storage; `None` otherwise. What `cat(parts, 0)`
    /// gives, gradient included (each part's gradient is its rows of the output's, a view):
    /// layers whose weights are stored together run as one (see `models::qwen2`).
    pub(crate) fn adjacent_rows(parts: &[Tensor]) -> Option<Tensor> {
        let first = parts.first()?;
        let mut next = first.layout().offset;
        for p in parts {
            let fits = p.is_contiguous()
                && p.rank() == first.rank()
                && p.rank() >= 1
                && p.shape()[1..] == first.shape()[1..]
                && p.dtype() == first.dtype()
                && p.shares_storage(first)
                && p.layout().offset == next;
            if !fits {
                return None;
            }
            next += p.numel();
        }
        let mut shape = first.shape().to_vec();
        shape[0] = parts.iter().map(|p| p.shape()[0]).sum();
        let mut layout = crate::tensor::Layout::contiguous(&shape);
        layout.offset = first.layout().offset;
        let rows: Vec<usize> = parts.iter().map(|p| p.shape()[0]).collect();
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            Ok(grad0(g)?.split_with_sizes(&rows, 0)?.into_iter().map(Some).collect())
        });
        Some(record1("cat", &parts.iter().collect::<Vec<_>>(), first.with_layout(layout), backward))
    }

    /// Stack along a new dim (`torch.stack`).
    pub fn stack(tensors: &[Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::invalid("stack: expected at least one tensor"))?;
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            return Err(shape_err(format!("stack: shapes {:?} and {:?} differ", first.shape(), t.shape())));
        }
        let expanded = tensors.iter().map(|t| t.unsqueeze(dim)).collect::<Result<Vec<_>>>()?;
        Tensor::cat(&expanded, dim)
    }
}

/// The gradient of a slice: `g` placed into zeros of the input's shape. Differentiable (its
/// own backward is the slice again) so that higher-order gradients work.
pub(crate) fn slice_backward(
    g: &Tensor,
    input_shape: &[usize],
    dim: usize,
    start: usize,
    step: usize,
) -> Result<Tensor> {
    let out = Tensor::zeros(input_shape, g.dtype(), g.device())?;
    let part = out.layout().slice(dim, start, g.shape()[dim], step);
    exec_views(&Op::Copy, &[(g, g.layout())], &[(&out, &part)])?;
    let len = g.shape()[dim];
    let backward = Box::new(move |gg: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let gg = grad0(gg)?;
        let end = if len == 0 { start } else { start + (len - 1) * step + 1 };
        Ok(vec![Some(gg.slice(dim as isize, start as isize, end as isize, step)?)])
    });
    Ok(record1("slice_backward", &[g], out, backward))
}
