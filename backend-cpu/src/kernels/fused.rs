//! What every fused kernel shares: the compute type, dense views, row blocking, lane reductions.
//!
//! The fused kernels (softmax, norms, cross-entropy, AdamW, rotary, attention, convolution,
//! pooling) use it for float-only dtype dispatch, a `Real` trait with the transcendental
//! functions they need, dense access to strided operands and the row-parallel helpers. It is
//! a module of its own rather than part of `kernels/mod.rs` so that the fused kernels stay
//! independent of the primitive ones.

use super::View;
use crate::element::{Arith, Element};
use genesis_backend_api::{BackendError, Op, Result};
use std::borrow::Cow;
use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub, SubAssign};

/// Below this many elements of work a kernel runs on the calling thread: handing a few
/// microseconds of work to the pool costs more than it saves.
pub(super) const PAR_MIN_ELEMS: usize = 1 << 15;

/// The minimum number of rows of length `row_len` per parallel task.
pub(super) fn min_rows(row_len: usize) -> usize {
    (PAR_MIN_ELEMS / row_len.max(1)).max(1)
}

/// Rows per block when a kernel sums over rows (weight gradients). The block count depends on
/// the shape only, never on the thread count or on work stealing, so the partial sums are
/// added in the same order on every run and the result is bitwise reproducible.
pub(super) fn rows_per_block(rows: usize, row_len: usize) -> usize {
    const MAX_BLOCKS: usize = 64;
    rows.div_ceil(MAX_BLOCKS).max(min_rows(row_len)).max(1)
}

/// The compute types of the float dtypes (f32 for f32/f16/bf16, f64 for f64).
pub(super) trait Real:
    Arith
    + Default
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + std::iter::Sum
{
    /// Negative infinity.
    const NEG_INFINITY: Self;
    /// A quiet NaN.
    const NAN: Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Round to f32 (the dtype of saved statistics).
    fn to_f32(self) -> f32;
    /// Widen an f32 statistic.
    fn from_f32(v: f32) -> Self;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            const NAN: Self = <$t>::NAN;
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn to_f32(self) -> f32 {
                self as f32
            }
            fn from_f32(v: f32) -> Self {
                v as $t
            }
        }
    };
}
real!(f32);
real!(f64);

/// A float element type: its compute type is a [`Real`].
pub(super) trait Float: Element<Compute: Real> {}
impl<T: Element<Compute: Real>> Float for T {}

/// Shorthand for the compute type of `T`.
pub(super) type C<T> = <T as Element>::Compute;

/// Convert between compute types (exact when widening; f32 to f64 to f32 folds away).
pub(super) fn cvt<A: Real, B: Real>(a: A) -> B {
    B::from_f64(a.to_f64())
}

/// Run `$body` (a `Result`) with `$T` bound to the element type of a float `$dtype`; any other
/// dtype is `Unsupported`. Unlike `with_dtype!`, this never instantiates a body for integers,
/// so bodies may require [`Float`].
macro_rules! with_float {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        $crate::match_dtype!($dtype, $T => $body;
            F32: f32, F64: f64, F16: half::f16, BF16: half::bf16;
            other => Err($crate::kernels::unsupported($op, other)))
    };
}
pub(super) use with_float;

/// The last dim's size and the number of rows (a rank-0 tensor is one row of one element).
pub(super) fn rows_of(shape: &[usize]) -> (usize, usize) {
    let d = shape.last().copied().unwrap_or(1);
    let rows = shape[..shape.len().saturating_sub(1)].iter().product();
    (rows, d)
}

/// Refuse views whose first element is not aligned for `T`: the byte offset is free in the
/// interface, but typed access to a misaligned address is undefined behaviour.
fn check_typed<T: Element>(op: &Op, v: &View) -> Result<()> {
    if v.dtype != T::DTYPE {
        return Err(BackendError::internal(format!(
            "{}: a {} operand reached the {} kernel",
            op.name(),
            v.dtype,
            T::DTYPE
        )));
    }
    if v.numel() > 0 && (v.base as usize) % std::mem::align_of::<T>() != 0 {
        return Err(BackendError::invalid(format!(
            "{}: a {} operand's byte offset is not a multiple of its element size",
            op.name(),
            v.dtype
        )));
    }
    Ok(())
}

/// An input as a dense row-major slice: borrowed when the view is contiguous, gathered into a
/// copy when it is strided (the fused ops read each input a few times at most).
pub(super) fn dense<'a, T: Element>(op: &Op, v: &'a View) -> Result<Cow<'a, [T]>> {
    check_typed::<T>(op, v)?;
    let n = v.numel();
    if n == 0 {
        return Ok(Cow::Owned(Vec::new()));
    }
    // SAFETY: the view was bounds-checked against its buffer when it was resolved, its dtype
    // and alignment are checked above, and inputs are not written while an op runs.
    unsafe {
        if v.is_contiguous() {
            Ok(Cow::Borrowed(std::slice::from_raw_parts(v.at::<T>(0), n)))
        } else {
            Ok(Cow::Owned(v.offsets().map(|o| *v.at::<T>(o)).collect()))
        }
    }
}

/// An input widened to the compute type (for kernels that read it many times).
pub(super) fn dense_compute<T: Float>(op: &Op, v: &View) -> Result<Vec<C<T>>> {
    Ok(dense::<T>(op, v)?.iter().map(|x| x.compute()).collect())
}

/// An output as a dense row-major slice. A contiguous view is written in place; a strided one
/// is staged in a Vec and scattered by [`Dense::finish`], sequentially, so that even an output
/// whose strides make it overlap itself is written without a data race.
pub(super) enum Dense<'a, T> {
    /// The output's own memory.
    Direct(&'a mut [T]),
    /// A staging copy and the view it goes to.
    Staged(&'a View, Vec<T>),
}

impl<'a, T: Element> Dense<'a, T> {
    /// An output whose previous contents are not needed. The kernel must write every
    /// element: a direct slice holds whatever was there before.
    pub(super) fn output(op: &Op, v: &'a View) -> Result<Self> {
        Self::open(op, v, false)
    }

    /// An output updated in place: the slice starts with the view's current values.
    pub(super) fn in_place(op: &Op, v: &'a View) -> Result<Self> {
        Self::open(op, v, true)
    }

    fn open(op: &Op, v: &'a View, gather: bool) -> Result<Self> {
        check_typed::<T>(op, v)?;
        let n = v.numel();
        if n == 0 {
            return Ok(Dense::Direct(&mut []));
        }
        // SAFETY: bounds, dtype and alignment are checked; the op contract (enforced by the
        // device for ordinary ops and by the AdamW kernel for itself) keeps an output from
        // overlapping any other operand, so this is the only reference to these bytes.
        unsafe {
            if v.is_contiguous() {
                Ok(Dense::Direct(std::slice::from_raw_parts_mut(v.at::<T>(0), n)))
            } else if gather {
                Ok(Dense::Staged(v, v.offsets().map(|o| *v.at::<T>(o)).collect()))
            } else {
                Ok(Dense::Staged(v, vec![T::from_f64(0.0); n]))
            }
        }
    }

    /// The elements in row-major order.
    pub(super) fn slice(&mut self) -> &mut [T] {
        match self {
            Dense::Direct(s) => s,
            Dense::Staged(_, buf) => buf,
        }
    }

    /// Write a staged output back to its view.
    pub(super) fn finish(self) {
        if let Dense::Staged(v, buf) = self {
            // SAFETY: as in `open`; the offsets come from the view's own geometry.
            unsafe {
                for (o, x) in v.offsets().zip(buf) {
                    *v.at::<T>(o) = x;
                }
            }
        }
    }
}

/// Split `data` into `n` consecutive chunks of `len` elements; `len` may be zero (then every
/// chunk is empty), which `chunks_mut` does not allow.
pub(super) fn split_mut<T>(data: &mut [T], n: usize, len: usize) -> Vec<&mut [T]> {
    if len == 0 {
        (0..n).map(|_| <&mut [T]>::default()).collect()
    } else {
        data.chunks_mut(len).take(n).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Lane reductions.
// ---------------------------------------------------------------------------------------------

/// The row maximum; NaN is skipped here but still poisons the row through `exp`, and an all
/// `-inf` row keeps `-inf`, so `x - max` is NaN there, as in PyTorch.
pub(super) fn row_max<R: Real>(row: impl Iterator<Item = R>) -> R {
    row.fold(R::NEG_INFINITY, |m, v| if v > m { v } else { m })
}

/// Lanes of the reductions below: independent accumulators the compiler keeps in one vector.
const LANES: usize = 8;

/// [`row_max`] of a slice, vectorizable: the maximum does not depend on the order.
pub(super) fn lane_max<R: Real>(row: &[R]) -> R {
    let mut acc = [R::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = row_max(chunks.remainder().iter().copied());
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    row_max(acc.into_iter().chain([tail]))
}

/// The sum of a slice in [`LANES`] interleaved partial sums (vectorizable, and no less
/// accurate than one running sum).
pub(super) fn lane_sum<R: Real>(row: &[R]) -> R {
    let mut acc = [R::ZERO; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail: R = chunks.remainder().iter().copied().sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.into_iter().sum::<R>() + tail
}
