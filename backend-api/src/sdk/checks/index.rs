//! Indexing along one dim: gather, scatter_add, index_select, index_add and cumsum, with
//! PyTorch's shape rules. A rank-0 operand should be passed as shape `[1]` (PyTorch accepts
//! `dim = 0` on scalars). The index values are the backend's to check, before it writes.

use super::{expect_dtype, expect_self_disjoint, Meta};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::op::Op;

fn expect_dim(op: &Op, dim: usize, t: &impl Meta) -> Result<()> {
    if dim >= t.shape().len() {
        return Err(BackendError::invalid(format!(
            "{}: dim {dim} is out of range for shape {:?}",
            op.name(),
            t.shape()
        )));
    }
    Ok(())
}

/// `Gather { dim }`, `[x, index] -> [y]`: an i64 index of x's rank no larger than x off
/// `dim`, y of x's dtype and the index's shape.
pub fn gather<T: Meta>(op: &Op, x: &T, index: &T, y: &T, dim: usize) -> Result<()> {
    expect_dtype(op, "the index", index, DType::I64)?;
    expect_dtype(op, "the output", y, x.dtype())?;
    expect_dim(op, dim, x)?;
    let (is, xs) = (index.shape(), x.shape());
    let fits = is.len() == xs.len() && is.iter().zip(xs).enumerate().all(|(d, (&i, &s))| d == dim || i <= s);
    if !fits || y.shape() != is {
        return Err(BackendError::shape(format!(
            "{}: index {is:?} must have the rank of x {xs:?} and fit it outside dim {dim}, and the output {:?} the index's shape",
            op.name(),
            y.shape()
        )));
    }
    Ok(())
}

/// `ScatterAdd { dim }`, `[src, index] -> [y]` in place: an i64 index of one rank with src and
/// y, no larger than src, and than y off `dim`; y of src's dtype, not overlapping itself.
pub fn scatter_add<T: Meta>(op: &Op, src: &T, index: &T, y: &T, dim: usize) -> Result<()> {
    expect_dtype(op, "the index", index, DType::I64)?;
    expect_dtype(op, "the output", y, src.dtype())?;
    expect_dim(op, dim, y)?;
    let (is, ss, ys) = (index.shape(), src.shape(), y.shape());
    let rank = ys.len();
    let fits =
        is.len() == rank && ss.len() == rank && (0..rank).all(|d| is[d] <= ss[d] && (d == dim || is[d] <= ys[d]));
    if !fits {
        return Err(BackendError::shape(format!(
            "{}: index {is:?} must have the rank of src {ss:?} and output {ys:?}, fit src, and fit the output outside dim {dim}",
            op.name()
        )));
    }
    expect_self_disjoint(op, y)
}

/// Shared rule of index_select/index_add: a rank-1 i64 index, and `small` equal to `big` with
/// `dim` resized to the index length.
fn expect_selected(op: &Op, big: &impl Meta, index: &impl Meta, small: &impl Meta, dim: usize) -> Result<()> {
    expect_dtype(op, "the index", index, DType::I64)?;
    expect_dim(op, dim, big)?;
    let mut want = big.shape().to_vec();
    if let [n] = index.shape() {
        want[dim] = *n;
    }
    if index.shape().len() != 1 || small.shape() != want {
        return Err(BackendError::shape(format!(
            "{}: index must be rank 1 and the selected shape the full one {:?} with dim {dim} of the index's length; got index {:?} and {:?}",
            op.name(),
            big.shape(),
            index.shape(),
            small.shape()
        )));
    }
    Ok(())
}

/// `IndexSelect { dim }`, `[x, index] -> [y]`: a rank-1 i64 index, y of x's dtype and shape
/// but for `dim`, which has the index's length.
pub fn index_select<T: Meta>(op: &Op, x: &T, index: &T, y: &T, dim: usize) -> Result<()> {
    expect_dtype(op, "the output", y, x.dtype())?;
    expect_selected(op, x, index, y, dim)
}

/// `IndexAdd { dim }`, `[src, index] -> [y]` in place: src is y with `dim` of the rank-1
/// index's length, of y's dtype; y does not overlap itself.
pub fn index_add<T: Meta>(op: &Op, src: &T, index: &T, y: &T, dim: usize) -> Result<()> {
    expect_dtype(op, "the output", y, src.dtype())?;
    expect_selected(op, y, index, src, dim)?;
    expect_self_disjoint(op, y)
}

/// `CumSum { dim }`, `[x] -> [y]`: y of x's dtype and shape, `dim` in range.
pub fn cumsum<T: Meta>(op: &Op, x: &T, y: &T, dim: usize) -> Result<()> {
    expect_dtype(op, "the output", y, x.dtype())?;
    expect_dim(op, dim, x)?;
    if x.shape() != y.shape() {
        return Err(BackendError::shape(format!("{}: shapes {:?} and {:?} differ", op.name(), x.shape(), y.shape())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Fake;
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn index_rules() {
        let (f, i) = (|s: &[usize]| Fake::new(DType::F32, s), |s: &[usize]| Fake::new(DType::I64, s));
        let op = Op::Gather { dim: 1 };
        assert!(gather(&op, &f(&[2, 5]), &i(&[2, 3]), &f(&[2, 3]), 1).is_ok());
        assert_eq!(gather(&op, &f(&[2, 5]), &i(&[3, 3]), &f(&[3, 3]), 1).unwrap_err().kind, ErrorKind::ShapeMismatch);
        assert_eq!(gather(&op, &f(&[2, 5]), &i(&[2, 3]), &f(&[2, 3]), 2).unwrap_err().kind, ErrorKind::InvalidArgument);
        let op = Op::IndexAdd { dim: 0 };
        assert!(index_add(&op, &f(&[3, 4]), &i(&[3]), &f(&[7, 4]), 0).is_ok());
        let overlapping = Fake(DType::F32, vec![7, 4], vec![1, 1]);
        assert!(index_add(&op, &f(&[3, 4]), &i(&[3]), &overlapping, 0)
            .unwrap_err()
            .message
            .contains("overlaps itself"));
    }
}
