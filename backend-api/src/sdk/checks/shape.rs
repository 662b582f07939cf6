//! Elementwise and reduction operands: the shape rules every backend applies before its
//! kernels run.

use super::Meta;
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::op::{Op, ReduceOp};

/// `ShapeMismatch` unless every operand has the first one's shape. Elementwise ops get
/// operands already broadcast by the core (as strides), so equal shapes are the rule.
pub fn same_shapes<T: Meta>(op: &Op, operands: &[&T]) -> Result<()> {
    let Some(first) = operands.first().map(|o| o.shape()) else { return Ok(()) };
    match operands.iter().find(|o| o.shape() != first) {
        Some(other) => Err(BackendError::shape(format!(
            "{}: operand shapes {first:?} and {:?} differ (the core broadcasts before calling)",
            op.name(),
            other.shape()
        ))),
        None => Ok(()),
    }
}

/// `Reduce(r)`, `[x] -> [y]`: y has x's rank, size 1 on each reduced axis and x's size on
/// the others; its dtype is x's (i64 for the arg reductions); an arg reduction reduces one
/// axis; max/min and the arg reductions refuse an empty reduced extent (no identity).
/// Returns which axes are reduced.
pub fn reduce<T: Meta>(op: &Op, r: ReduceOp, x: &T, y: &T) -> Result<Vec<bool>> {
    let is_arg = matches!(r, ReduceOp::ArgMax | ReduceOp::ArgMin);
    let out_dtype = if is_arg { DType::I64 } else { x.dtype() };
    if y.dtype() != out_dtype {
        return Err(BackendError::dtype(format!(
            "{}: a {} input needs a {out_dtype} output, got {}",
            op.name(),
            x.dtype(),
            y.dtype()
        )));
    }
    let (xs, ys) = (x.shape(), y.shape());
    let reduced = crate::sdk::reduced_by_shape(op, xs, ys)?;
    let axes: Vec<usize> = (0..reduced.len()).filter(|&d| reduced[d]).collect();
    if is_arg && axes.len() > 1 {
        return Err(BackendError::invalid(format!(
            "{}: reduces exactly one axis, but input {xs:?} -> output {ys:?} reduces axes {axes:?}",
            op.name()
        )));
    }
    let extent: usize = axes.iter().map(|&d| xs[d]).product();
    if extent == 0 && !matches!(r, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod | ReduceOp::SumSquares) {
        return Err(BackendError::invalid(format!(
            "{}: cannot reduce an empty axis (input {xs:?}, output {ys:?}): the op has no identity",
            op.name()
        )));
    }
    Ok(reduced)
}

#[cfg(test)]
mod tests {
    use super::super::Fake;
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn reduce_rules() {
        let f = |s: &[usize]| Fake::new(DType::F32, s);
        let sum = Op::Reduce(ReduceOp::Sum);
        assert_eq!(reduce(&sum, ReduceOp::Sum, &f(&[2, 3]), &f(&[2, 1])).ok(), Some(vec![false, true]));
        assert_eq!(reduce(&sum, ReduceOp::Sum, &f(&[2, 0]), &f(&[2, 1])).ok(), Some(vec![false, true]));
        let kind = |r: Result<Vec<bool>>| r.err().map(|e| e.kind);
        assert_eq!(kind(reduce(&sum, ReduceOp::Sum, &f(&[2, 3]), &f(&[3, 1]))), Some(ErrorKind::ShapeMismatch));
        assert_eq!(kind(reduce(&sum, ReduceOp::Sum, &f(&[2, 3]), &f(&[2]))), Some(ErrorKind::ShapeMismatch));
        let max = Op::Reduce(ReduceOp::Max);
        assert_eq!(kind(reduce(&max, ReduceOp::Max, &f(&[2, 0]), &f(&[2, 1]))), Some(ErrorKind::InvalidArgument));
        let arg = Op::Reduce(ReduceOp::ArgMax);
        let i = Fake::new(DType::I64, &[1, 1]);
        assert_eq!(kind(reduce(&arg, ReduceOp::ArgMax, &f(&[2, 3]), &i)), Some(ErrorKind::InvalidArgument));
        assert_eq!(kind(reduce(&arg, ReduceOp::ArgMax, &f(&[2, 3]), &f(&[2, 1]))), Some(ErrorKind::DtypeMismatch));
        assert!(same_shapes(&sum, &[&f(&[2, 3]), &f(&[2, 3])]).is_ok());
        assert_eq!(
            same_shapes(&sum, &[&f(&[2, 3]), &f(&[3, 2])]).err().map(|e| e.kind),
            Some(ErrorKind::ShapeMismatch)
        );
    }
}
