//! Matrix products with PyTorch's `matmul` rules (vectors, batches, broadcasting).

use super::{common_device, exec, exec_views, sum_to};
use crate::autograd::{record1, Saved};
use crate::error::{Error, Result};
use crate::tensor::layout::broadcast_or_err;
use crate::tensor::Tensor;
use genesis_backend_api::{DType, Op};

impl Tensor {
    /// Matrix product: 1-D·1-D is a dot product, 1-D operands are promoted to matrices and
    /// the added dim removed, batch dims broadcast (`torch.matmul`).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let low = |t| crate::amp::cast_for(crate::amp::CastPolicy::Low, t);
        low(self)?.matmul_uncast(&low(other)?)
    }

    /// `self += a @ b` for matrices `a (m, k)` and `b (k, n)`: PyTorch's `self.addmm_(a, b)`
    /// with `beta = alpha = 1`. `a` and `b` share a float dtype and `self` has it too or, unlike
    /// PyTorch, is f32 when it is f16 or bf16: the products are summed in f32 and added to
    /// `self` with one rounding, so a gradient summed over blocks of rows can stay in f32
    /// without a cast and an addition per block. One op where the device has it, else the
    /// product (in f32 for an f32 `self`) and an in-place addition. In place, so outside
    /// autograd: none of the three may take part in a recorded graph (use `no_grad`).
    pub fn addmm_(&self, a: &Tensor, b: &Tensor) -> Result<()> {
        common_device("addmm_", &[self, a, b])?;
        self.check_in_place("addmm_", &[a, b])?;
        let op = Op::Addmm;
        genesis_backend_api::sdk::checks::addmm(&op, &[a.clone(), b.clone()], std::slice::from_ref(self))?;
        if super::fused::use_fused(&op, a)? {
            exec_views(&op, &[(a, a.layout()), (b, b.layout())], &[(self, self.layout())])?;
            self.storage().bump_version();
            return Ok(());
        }
        // In `self`'s dtype: f32 products of f16/bf16 values for an f32 `self`.
        self.add_(&a.to_dtype(self.dtype())?.matmul_uncast(&b.to_dtype(self.dtype())?)?)
    }

    fn matmul_uncast(&self, other: &Tensor) -> Result<Tensor> {
        common_device("matmul", &[self, other])?;
        if self.dtype() != other.dtype() {
            return Err(super::dtype_err(format!(
                "matmul: operands have dtypes {} and {} (cast one of them)",
                self.dtype(),
                other.dtype()
            )));
        }
        if self.rank() == 0 || other.rank() == 0 {
            return Err(Error::invalid("matmul: both operands need at least one dimension"));
        }
        let a = if self.rank() == 1 { self.unsqueeze(0)? } else { self.clone() };
        let b = if other.rank() == 1 { other.unsqueeze(1)? } else { other.clone() };
        let y = matmul_2d_or_batched(&a, &b)?;
        match (self.rank() == 1, other.rank() == 1) {
            (true, true) => y.reshape(&[]),
            (true, false) => y.squeeze(Some(-2)),
            (false, true) => y.squeeze(Some(-1)),
            (false, false) => Ok(y),
        }
    }
}

/// `a (m, k) @ b (k, n)` for f16/bf16 matrices of one dtype into a new f32 matrix: the
/// backend's widened `Matmul` (interface 1.13; the caller checks that the backend takes it),
/// the f32 sums stored without rounding to the operands' dtype. Not recorded.
pub(crate) fn matmul_widened(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    common_device("matmul", &[a, b])?;
    let (m, k, k2, n) = match (a.shape(), b.shape()) {
        ([m, k], [k2, n]) => (*m, *k, *k2, *n),
        _ => {
            return Err(Error::invalid(format!(
                "matmul: expected two matrices, got {:?} and {:?}",
                a.shape(),
                b.shape()
            )))
        }
    };
    if k != k2 {
        return Err(super::shape_err(format!(
            "matmul: shapes {:?} and {:?} cannot be multiplied",
            a.shape(),
            b.shape()
        )));
    }
    let out = Tensor::empty(&[m, n], DType::F32, a.device())?;
    exec(&Op::Matmul, &[(a, a.layout()), (b, b.layout())], &[&out])?;
    Ok(out)
}

/// `a (.., m, k) @ b (.., k, n)` with batch broadcasting.
fn matmul_2d_or_batched(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    if k != k2 {
        return Err(super::shape_err(format!(
            "matmul: shapes {:?} and {:?} cannot be multiplied ({m}x{k} and {k2}x{n})",
            a.shape(),
            b.shape()
        )));
    }
    let batch = broadcast_or_err("matmul", &a.shape()[..ra - 2], &b.shape()[..rb - 2])?;
    let shape_of = |tail: [usize; 2]| batch.iter().copied().chain(tail).collect::<Vec<_>>();
    let la = a.layout().broadcast_to(&shape_of([m, k])).ok_or_else(|| Error::invalid("matmul: broadcast failed"))?;
    let lb = b.layout().broadcast_to(&shape_of([k, n])).ok_or_else(|| Error::invalid("matmul: broadcast failed"))?;
    let out = Tensor::empty(&shape_of([m, n]), a.dtype(), a.device())?;
    exec(&Op::Matmul, &[(a, &la), (b, &lb)], &[&out])?;
    let (sa, sb) = (Saved::new(a), Saved::new(b));
    let (shape_a, shape_b) = (a.shape().to_vec(), b.shape().to_vec());
    let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let g = g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        let (a, b) = (sa.get("matmul")?, sb.get("matmul")?);
        let da = matmul_2d_or_batched(g, &b.transpose(-1, -2)?)?;
        let b_transposed = b.rank() == 2 && !b.is_contiguous() && b.t()?.is_contiguous();
        Ok(vec![Some(sum_to(&da, &shape_a)?), Some(shared_operand_grad(a, g, &shape_b, b_transposed)?)])
    });
    Ok(record1("matmul", &[a, b], out, backward))
}

/// The gradient of `b` in `a @ b` from the output gradient `g`. When `b` is one matrix that
/// every batch entry of `a` multiplies (`x (batch, s, k) @ w (k, n)`: every linear layer),
/// its gradient is one product over all the batch's rows, `a (rows, k)ᵀ @ g (rows, n)`,
/// rather than one product per entry and a sum over them: one GEMM with the whole reduction
/// accumulated in the GEMM's precision, and no `(batch, k, n)` intermediate.
fn shared_operand_grad(a: &Tensor, g: &Tensor, shape_b: &[usize], b_transposed: bool) -> Result<Tensor> {
    let (ra, rg) = (a.rank(), g.rank());
    let shared = shape_b[..shape_b.len() - 2].iter().product::<usize>() == 1;
    if shared && ra > 2 && a.shape()[..ra - 2] == g.shape()[..rg - 2] {
        let (k, n) = (a.shape()[ra - 1] as isize, g.shape()[rg - 1] as isize);
        let (a, g) = (a.reshape(&[-1, k])?, g.reshape(&[-1, n])?);
        let db = if b_transposed {
            // `b` is `w.t()` (a linear layer): the gradient in `w`'s own layout, so that what
            // follows it (the transpose's backward, autocast's cast back to f32) reads it densely.
            matmul_2d_or_batched(&g.t()?, &a)?.t()?
        } else {
            matmul_2d_or_batched(&a.t()?, &g)?
        };
        return db.reshape(&shape_b.iter().map(|&d| d as isize).collect::<Vec<_>>());
    }
    sum_to(&matmul_2d_or_batched(&a.transpose(-1, -2)?, g)?, shape_b)
}
