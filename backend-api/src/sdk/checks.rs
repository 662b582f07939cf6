//! Operand checks of the op families, written once for every backend: a bad call gets the
//! same error kind and message whichever backend runs it, and a new backend inherits the
//! rules instead of copying them.
//!
//! The checks read an operand through [`Meta`] (dtype, shape, strides), which a backend
//! implements on its own resolved-operand type. A family check takes the op's operand slices,
//! refuses wrong counts, shapes and dtypes in a fixed order, and hands back the operands as
//! arrays ready to destructure. What depends on the data (index and target values) stays
//! with the backend, which alone can read it.

mod adamw;
mod attention;
mod batch_norm;
mod index;
mod linalg;
mod rows;
mod shape;

// Every public item of a family file is a check (or its result type): re-exported whole, so
// a new check is written in one place.
pub use adamw::*;
pub use attention::*;
pub use batch_norm::*;
pub use index::*;
pub use linalg::*;
pub use rows::*;
pub use shape::*;

use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::op::Op;
use crate::tensor::TensorDesc;

/// What the checks read of an operand. Backends implement it on the type they resolve
/// [`crate::TensorDesc`]s into (a pointer plus geometry); shapes and strides are in elements.
pub trait Meta {
    /// The element type.
    fn dtype(&self) -> DType;
    /// The size of each dim.
    fn shape(&self) -> &[usize];
    /// The stride of each dim, in elements (never negative).
    fn strides(&self) -> &[isize];
}

/// Implements [`Meta`] for a struct with the fields `dtype: DType`, `shape: Vec<usize>` and
/// `strides: Vec<isize>` (the usual resolved-operand type):
/// `genesis_backend_api::impl_meta!(View);`.
#[macro_export]
macro_rules! impl_meta {
    ($operand:ty) => {
        impl $crate::sdk::checks::Meta for $operand {
            fn dtype(&self) -> $crate::DType {
                self.dtype
            }
            fn shape(&self) -> &[usize] {
                &self.shape
            }
            fn strides(&self) -> &[isize] {
                &self.strides
            }
        }
    };
}

/// A descriptor's dtype, shape and strides as a [`Meta`]: lets a backend that works on
/// [`TensorDesc`]s directly (no resolved-operand type of its own) use the family checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
}

impl Geometry {
    /// The geometry of `desc`; `Unsupported` for an unknown dtype code.
    pub fn of(desc: &TensorDesc) -> Result<Geometry> {
        Ok(Geometry { dtype: desc.dtype()?, shape: desc.shape(), strides: desc.strides() })
    }

    /// A copy of any operand's dtype, shape and strides: lets a caller hand one check
    /// operands of different types (existing tensors and [`Geometry::dense`] outputs).
    pub fn like(t: &impl Meta) -> Geometry {
        Geometry { dtype: t.dtype(), shape: t.shape().to_vec(), strides: t.strides().to_vec() }
    }

    /// A dense, row-major operand of `dtype` and `shape`: describes an output before it is
    /// allocated, so a caller can run an op's check first.
    pub fn dense(dtype: DType, shape: &[usize]) -> Geometry {
        Geometry { dtype, shape: shape.to_vec(), strides: crate::tensor::contiguous_strides(shape) }
    }
}

crate::impl_meta!(Geometry);

/// An op's operands as fixed-size arrays, inputs then outputs: what [`operands`] and the
/// family checks hand back.
pub type Operands<'a, T, const I: usize, const O: usize> = (&'a [T; I], &'a [T; O]);

/// The operands as fixed-size arrays, or `InvalidArgument` naming the expected counts (the
/// message of [`super::expect_arity`]).
pub fn operands<'a, T, const I: usize, const O: usize>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<Operands<'a, T, I, O>> {
    match (<&[T; I]>::try_from(inputs), <&[T; O]>::try_from(outputs)) {
        (Ok(i), Ok(o)) => Ok((i, o)),
        _ => Err(super::arity_error(op, I, O, inputs.len(), outputs.len())),
    }
}

/// `ShapeMismatch` unless `t` has shape `shape`; `name` says which operand.
pub fn expect_shape(op: &Op, name: &str, t: &impl Meta, shape: &[usize]) -> Result<()> {
    if t.shape() != shape {
        return Err(BackendError::shape(format!(
            "{}: {name} has shape {:?}, expected {shape:?}",
            op.name(),
            t.shape()
        )));
    }
    Ok(())
}

/// `DtypeMismatch` unless `t` has dtype `dtype`; `name` says which operand.
pub fn expect_dtype(op: &Op, name: &str, t: &impl Meta, dtype: DType) -> Result<()> {
    if t.dtype() != dtype {
        return Err(BackendError::dtype(format!("{}: {name} is {}, expected {dtype}", op.name(), t.dtype())));
    }
    Ok(())
}

/// [`expect_shape`] then [`expect_dtype`]: the usual rule for one operand.
pub fn expect_meta(op: &Op, name: &str, t: &impl Meta, shape: &[usize], dtype: DType) -> Result<()> {
    expect_shape(op, name, t, shape)?;
    expect_dtype(op, name, t, dtype)
}

/// [`expect_meta`] against `like`'s shape and dtype.
pub fn expect_like(op: &Op, name: &str, t: &impl Meta, like: &impl Meta) -> Result<()> {
    expect_meta(op, name, t, like.shape(), like.dtype())
}

/// The shape of `t` as an array, or `ShapeMismatch` unless its rank is `R`; `name` describes
/// the operand and its dims, e.g. `"x (n, c, h, w)"`.
pub fn dims<const R: usize>(op: &Op, name: &str, t: &impl Meta) -> Result<[usize; R]> {
    <[usize; R]>::try_from(t.shape()).map_err(|_| {
        BackendError::shape(format!("{}: {name} must have rank {R}, got shape {:?}", op.name(), t.shape()))
    })
}

/// True when no two positions of a view with `shape` and (non-negative) `strides` share an
/// element, so writes to distinct positions never meet. Zero strides are not the only way to
/// overlap: shape `[2, 2]` with strides `[1, 1]` reaches element 1 twice.
pub fn is_non_overlapping(shape: &[usize], strides: &[isize]) -> bool {
    if shape.iter().product::<usize>() <= 1 {
        return true;
    }
    let mut dims: Vec<(usize, usize)> =
        shape.iter().zip(strides).filter(|(&n, _)| n > 1).map(|(&n, &s)| (s.unsigned_abs(), n)).collect();
    dims.sort_unstable();
    // Sorted by stride, each stride must step past everything the smaller ones reach.
    let mut reach = 0usize;
    for (s, n) in dims {
        if s <= reach {
            return false;
        }
        reach = reach.saturating_add(s.saturating_mul(n - 1));
    }
    true
}

/// An in-place output must not overlap itself: two positions at one address would each get
/// their `+=`.
fn expect_self_disjoint(op: &Op, y: &impl Meta) -> Result<()> {
    if !is_non_overlapping(y.shape(), y.strides()) {
        return Err(BackendError::invalid(format!(
            "{}: the output (shape {:?}, strides {:?}) overlaps itself",
            op.name(),
            y.shape(),
            y.strides()
        )));
    }
    Ok(())
}

/// A plain operand for tests: dtype and dense shape.
#[cfg(test)]
#[derive(Debug, Clone)]
pub(crate) struct Fake(pub DType, pub Vec<usize>, pub Vec<isize>);

#[cfg(test)]
impl Fake {
    pub(crate) fn new(dtype: DType, shape: &[usize]) -> Fake {
        Fake(dtype, shape.to_vec(), crate::tensor::contiguous_strides(shape))
    }
}

#[cfg(test)]
impl Meta for Fake {
    fn dtype(&self) -> DType {
        self.0
    }
    fn shape(&self) -> &[usize] {
        &self.1
    }
    fn strides(&self) -> &[isize] {
        &self.2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn overlap_and_counts() {
        assert!(is_non_overlapping(&[2, 3], &[3, 1]));
        assert!(!is_non_overlapping(&[2, 2], &[1, 1]));
        assert!(!is_non_overlapping(&[3], &[0]));
        assert!(is_non_overlapping(&[1, 5], &[0, 1]));
        let x = [Fake::new(DType::F32, &[2])];
        let err = operands::<_, 1, 1>(&Op::Softmax, &x, &[]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert_eq!(err.message, "softmax: expected 1 input(s) and 1 output(s), got 1 and 0");
    }

    #[test]
    fn rms_norm_backward_takes_an_optional_dsum_like_x() {
        let f = |shape: &[usize]| Fake::new(DType::F32, shape);
        let (rows, d) = (f(&[3, 4]), f(&[4]));
        let ins = [rows.clone(), rows.clone(), d.clone(), f(&[3]), rows.clone()];
        let outs = [rows.clone(), d.clone()];
        let op = Op::RmsNormBackward;
        assert!(rms_norm_backward_dsum(&op, &ins[..4], &outs).unwrap().1.is_none());
        assert!(rms_norm_backward_dsum(&op, &ins, &outs).unwrap().1.is_some());
        let mut bad = ins.clone();
        bad[4] = f(&[3, 5]);
        let err = rms_norm_backward_dsum(&op, &bad, &outs).unwrap_err();
        assert_eq!(err.kind, ErrorKind::ShapeMismatch, "{}", err.message);
        assert!(err.message.contains("dsum"), "{}", err.message);
        let six = [ins.to_vec(), vec![rows]].concat();
        let err = rms_norm_backward_dsum(&op, &six, &outs).unwrap_err();
        assert_eq!(err.message, "rms_norm_backward: expected 4 input(s) and 2 output(s), got 6 and 2");
    }
}
