//! Indexing ops: gather, scatter_add, index_select, embedding, one_hot, topk, cumsum.

use super::{common_device, exec, exec_views};
use crate::autograd::record1;
use crate::error::{Error, Result};
use crate::tensor::layout::wrap_dim;
use crate::tensor::Tensor;
use genesis_backend_api::{DType, Op};

fn grad0(g: &[Option<Tensor>]) -> Result<&Tensor> {
    g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))
}

fn index_i64(op: &str, index: &Tensor) -> Result<Tensor> {
    if index.dtype().is_float() || index.dtype() == DType::Bool {
        return Err(super::dtype_err(format!("{op}: index must be an integer tensor, got {}", index.dtype())));
    }
    index.to_dtype(DType::I64)
}

impl Tensor {
    /// `out[i][j] = self[index[i][j]][j]` for `dim = 0`, and so on (`torch.gather`).
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let d = wrap_dim("gather", dim, self.rank())?;
        let index = index_i64("gather", index)?;
        common_device("gather", &[self, &index])?;
        let out = Tensor::empty(index.shape(), self.dtype(), self.device())?;
        exec(&Op::Gather { dim: d as u32 }, &[(self, self.layout()), (&index, index.layout())], &[&out])?;
        let shape = self.shape().to_vec();
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            let op = Op::ScatterAdd { dim: d as u32 };
            let g = grad0(g)?;
            Ok(vec![Some(added_to_zeros(&shape, &op, g, &index, |z| z.scatter_add(d as isize, &index, g))?)])
        });
        Ok(record1("gather", &[self], out, backward))
    }

    /// A copy of `self` with `src` added at `index` along `dim` (`torch.scatter_add`).
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let d = wrap_dim("scatter_add", dim, self.rank())?;
        let index = index_i64("scatter_add", index)?;
        common_device("scatter_add", &[self, &index, src])?;
        let src = src.to_dtype(self.dtype())?;
        let out = crate::autograd::no_grad(|| self.copy())?;
        exec(&Op::ScatterAdd { dim: d as u32 }, &[(&src, src.layout()), (&index, index.layout())], &[&out])?;
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            let g = grad0(g)?;
            Ok(vec![Some(g.clone()), Some(g.gather(d as isize, &index)?)])
        });
        Ok(record1("scatter_add", &[self, &src], out, backward))
    }

    /// Entries of `dim` picked by the 1-D `index` (`torch.index_select`).
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let d = wrap_dim("index_select", dim, self.rank())?;
        let index = index_i64("index_select", index)?;
        if index.rank() != 1 {
            return Err(super::shape_err(format!("index_select: index must be 1-D, got shape {:?}", index.shape())));
        }
        common_device("index_select", &[self, &index])?;
        let mut shape = self.shape().to_vec();
        shape[d] = index.numel();
        let out = Tensor::empty(&shape, self.dtype(), self.device())?;
        exec(&Op::IndexSelect { dim: d as u32 }, &[(self, self.layout()), (&index, index.layout())], &[&out])?;
        let input_shape = self.shape().to_vec();
        let (rows, shape) = (index.clone(), input_shape.clone());
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            let op = Op::IndexAdd { dim: d as u32 };
            let g = grad0(g)?;
            Ok(vec![Some(added_to_zeros(&input_shape, &op, g, &index, |z| index_add(z, d, &index, g))?)])
        });
        // Into a gradient already summed for the input (a tied output head's), in place.
        let add_into = Box::new(move |g: &[Option<Tensor>], sum: &Tensor| -> Result<bool> {
            let g = grad0(g)?;
            if sum.shape() != shape.as_slice() || sum.dtype() != g.dtype() {
                return Ok(false);
            }
            sum.index_add_(d as isize, &rows, g)?;
            Ok(true)
        });
        Ok(crate::autograd::record1_adding_into("index_select", self, out, backward, add_into))
    }

    /// Add `src`'s slices along `dim` into this tensor at the positions `index` (1-D) names,
    /// in place (`Tensor.index_add_`): `self.select(dim, index[i]) += src.select(dim, i)`.
    /// Not differentiable (like every in-place op here, it refuses tensors that take part in
    /// autograd); the index stays on the device, so it works inside a captured graph.
    pub fn index_add_(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<()> {
        self.check_in_place("index_add_", &[src])?;
        let d = wrap_dim("index_add_", dim, self.rank())?;
        let index = index_i64("index_add_", index)?;
        let mut expected = self.shape().to_vec();
        expected[d] = index.numel();
        if index.rank() != 1 || src.shape() != expected.as_slice() {
            return Err(super::shape_err(format!(
                "index_add_: index must be 1-D and source {expected:?} for {:?} along dim {d}, got index {:?} and \
                 source {:?}",
                self.shape(),
                index.shape(),
                src.shape()
            )));
        }
        if src.dtype() != self.dtype() {
            return Err(super::dtype_err(format!(
                "index_add_: source dtype {} differs from the tensor's {}",
                src.dtype(),
                self.dtype()
            )));
        }
        common_device("index_add_", &[self, &index, src])?;
        exec_views(
            &Op::IndexAdd { dim: d as u32 },
            &[(src, src.layout()), (&index, index.layout())],
            &[(self, self.layout())],
        )?;
        self.storage().bump_version();
        Ok(())
    }

    /// Rows of the `(num, dim)` table `self` for integer `ids` of any shape
    /// (`F.embedding`): the result has shape `ids.shape + [dim]`.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 {
            return Err(super::shape_err(format!("embedding: weight must be 2-D, got {:?}", self.shape())));
        }
        let flat = ids.reshape(&[-1])?;
        let rows = self.index_select(0, &flat)?;
        let mut shape: Vec<isize> = ids.shape().iter().map(|&n| n as isize).collect();
        shape.push(self.shape()[1] as isize);
        rows.reshape(&shape)
    }

    /// One-hot i64 encoding of integer classes in `[0, classes)`.
    pub fn one_hot(&self, classes: usize) -> Result<Tensor> {
        let ids = index_i64("one_hot", self)?;
        let range = Tensor::arange(0.0, classes as f64, 1.0, DType::I64, self.device())?;
        let hot = ids.unsqueeze(-1)?.eq(&range)?;
        // An id outside the range matches no class: report it instead of returning a zero row.
        let per_row = hot.to_dtype(DType::I64)?.sum_dims(&[-1], false)?;
        if per_row.numel() > 0 && per_row.min()?.item::<i64>()? == 0 {
            return Err(Error::invalid(format!("one_hot: a class id is outside [0, {classes})")));
        }
        hot.to_dtype(DType::I64)
    }

    /// The `k` largest (or smallest) entries along `dim` and their indices (`torch.topk`).
    /// Indices are found on the host; values come from `gather`, so they are differentiable.
    pub fn topk(&self, k: usize, dim: isize, largest: bool) -> Result<(Tensor, Tensor)> {
        let d = wrap_dim("topk", dim, self.rank())?;
        let n = self.shape()[d];
        if k > n {
            return Err(Error::invalid(format!("topk: k = {k} exceeds the size {n} of dim {d}")));
        }
        let moved = self.detach().transpose(d as isize, -1)?.contiguous()?;
        let values = moved.to_vec::<f64>()?;
        let mut picked: Vec<i64> = Vec::with_capacity(values.len() / n.max(1) * k);
        for row in values.chunks(n.max(1)) {
            let mut order: Vec<usize> = (0..row.len()).collect();
            // NaN counts as the largest value, as in PyTorch; the sort is stable.
            order.sort_by(|&i, &j| {
                let (a, b) = (row[i], row[j]);
                let c = a.partial_cmp(&b).unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()));
                if largest {
                    c.reverse()
                } else {
                    c
                }
            });
            picked.extend(order[..k].iter().map(|&i| i as i64));
        }
        let mut shape: Vec<usize> = moved.shape().to_vec();
        let last = shape.len() - 1;
        shape[last] = k;
        let index = Tensor::from_vec(picked, &shape, self.device())?.transpose(d as isize, -1)?.contiguous()?;
        Ok((self.gather(d as isize, &index)?, index))
    }

    /// Inclusive prefix sums along `dim`.
    pub fn cumsum(&self, dim: isize) -> Result<Tensor> {
        let d = wrap_dim("cumsum", dim, self.rank())?;
        let out = Tensor::empty(self.shape(), self.dtype(), self.device())?;
        exec(&Op::CumSum { dim: d as u32 }, &[(self, self.layout())], &[&out])?;
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            // The gradient of x_i is the sum of g_j for j >= i: total - cumsum + g.
            let g = grad0(g)?;
            Ok(vec![Some(g.sum_dims(&[d as isize], true)?.sub(&g.cumsum(d as isize)?)?.add(g)?)])
        });
        Ok(record1("cumsum", &[self], out, backward))
    }
}

/// The backward of a gather-like op: `src` added at `index` into new zeros of `shape` by
/// `op` (`scatter_add`, `index_add`). When no gradient of this gradient is recorded, in place
/// on the fresh zeros; otherwise through `differentiable`, whose copy of its base (an
/// embedding's whole table) only that case needs.
fn added_to_zeros(
    shape: &[usize],
    op: &Op,
    src: &Tensor,
    index: &Tensor,
    differentiable: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let zeros = Tensor::zeros(shape, src.dtype(), src.device())?;
    if crate::autograd::is_grad_enabled() {
        return differentiable(&zeros);
    }
    exec_views(op, &[(src, src.layout()), (index, index.layout())], &[(&zeros, zeros.layout())])?;
    Ok(zeros)
}

/// `base` with `src` rows added at `index` along `dim` (differentiable; used by backward).
fn index_add(base: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    let out = crate::autograd::no_grad(|| base.copy())?;
    exec_views(
        &Op::IndexAdd { dim: dim as u32 },
        &[(src, src.layout()), (index, index.layout())],
        &[(&out, out.layout())],
    )?;
    let index = index.clone();
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = grad0(g)?;
        Ok(vec![Some(g.clone()), Some(g.index_select(dim as isize, &index)?)])
    });
    Ok(record1("index_add", &[base, src], out, backward))
}
