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

/// `ForeachSumSquares`, `[x_0, .., x_{n-1}] -> [y (n)]`: at least one input, every input of
/// the first one's float dtype, `y` of that dtype with shape `[n]` and not overlapping itself.
/// Returns the inputs and `y`.
pub fn foreach_sum_squares<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<(&'a [T], &'a T)> {
    let ([first, ..], [y]) = (inputs, outputs) else {
        return Err(BackendError::invalid(format!(
            "{}: expected at least 1 input and 1 output, got {} and {}",
            op.name(),
            inputs.len(),
            outputs.len()
        )));
    };
    let dtype = first.dtype();
    if !dtype.is_float() {
        return Err(BackendError::unsupported(format!("{}: x_0 is {dtype}, expected a float dtype", op.name())));
    }
    for (i, x) in inputs.iter().enumerate() {
        super::expect_dtype(op, &format!("x_{i}"), x, dtype)?;
    }
    super::expect_meta(op, "y", y, &[inputs.len()], dtype)?;
    super::expect_self_disjoint(op, y)?;
    Ok((inputs, y))
}

#[cfg(test)]
mod tests {
    use super::super::Fake;
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn foreach_sum_squares_rules() {
        let op = Op::ForeachSumSquares;
        let f = |d, s: &[usize]| Fake::new(d, s);
        let (f32_, bf) = (DType::F32, DType::BF16);
        let xs = [f(f32_, &[2, 3]), f(f32_, &[]), f(f32_, &[0, 4])];
        let ys = [f(f32_, &[3])];
        let (ins, y) = foreach_sum_squares(&op, &xs, &ys).unwrap();
        assert_eq!((ins.len(), y.shape()), (3, &[3][..]));
        assert_eq!(foreach_sum_squares(&op, &xs, &[f(f32_, &[2])]).unwrap_err().kind, ErrorKind::ShapeMismatch);
        assert_eq!(foreach_sum_squares(&op, &xs, &[f(bf, &[3])]).unwrap_err().kind, ErrorKind::DtypeMismatch);
        let mixed = [f(f32_, &[2]), f(bf, &[2])];
        assert_eq!(foreach_sum_squares(&op, &mixed, &[f(f32_, &[2])]).unwrap_err().kind, ErrorKind::DtypeMismatch);
        assert!(foreach_sum_squares(&op, &[] as &[Fake], &[f(f32_, &[0])]).is_err());
        let ints = [f(DType::I64, &[2])];
        assert_eq!(foreach_sum_squares(&op, &ints, &[f(DType::I64, &[1])]).unwrap_err().kind, ErrorKind::Unsupported);
        // Two entries of y at one address.
        let y = Fake(f32_, vec![3], vec![0]);
        assert!(foreach_sum_squares(&op, &xs, &[y]).unwrap_err().message.contains("overlaps itself"));
    }

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
