//! Sliding-window geometry (convolution and pooling), validated once for every backend,
//! with the operand checks of the convolution and pooling ops.

use super::checks::{dims, expect_dtype, expect_meta, expect_shape, Meta};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::op::{Op, Window2d};

/// One spatial axis of a sliding window: input length, taps, and the output length from
/// `out = (in + 2p - d(k-1) - 1)/s + 1`, with the window attributes.
///
/// [`Axis::new`] refuses attributes out of range and windows larger than the padded input,
/// and guarantees that every tap coordinate `o*s + k*d - p` fits in an `i64`, so kernels may
/// compute them without overflow checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Axis {
    /// Input length.
    pub input: usize,
    /// Number of taps.
    pub kernel: usize,
    /// Output length.
    pub output: usize,
    /// Step between windows (≥ 1).
    pub stride: i64,
    /// Zero padding on each side (≥ 0).
    pub pad: i64,
    /// Spacing between taps (≥ 1).
    pub dilation: i64,
}

impl Axis {
    /// Validate one axis of `op`'s window; `name` ("height", "width") is for messages.
    pub fn new(op: &Op, name: &str, input: usize, kernel: i64, stride: i64, pad: i64, dilation: i64) -> Result<Axis> {
        let bad = |what: &str, v: i64| {
            let bound = if what == "padding" { ">= 0" } else { ">= 1" };
            Err(BackendError::invalid(format!("{}: {name} {what} must be {bound}, got {v}", op.name())))
        };
        if kernel < 1 {
            return bad("kernel size", kernel);
        }
        if stride < 1 {
            return bad("stride", stride);
        }
        if pad < 0 {
            return bad("padding", pad);
        }
        if dilation < 1 {
            return bad("dilation", dilation);
        }
        // i128: every term fits, so hostile attributes cannot overflow here.
        let span = dilation as i128 * (kernel as i128 - 1) + 1;
        let padded = input as i128 + 2 * pad as i128;
        if padded < span {
            return Err(BackendError::invalid(format!(
                "{}: the {name} window spans {span} positions but the padded input has {padded}",
                op.name()
            )));
        }
        let output = (padded - span) / stride as i128 + 1;
        let reach = (output - 1) * stride as i128 + span;
        if reach > i64::MAX as i128 || output > isize::MAX as i128 {
            return Err(BackendError::invalid(format!("{}: the {name} window geometry overflows", op.name())));
        }
        Ok(Axis { input, kernel: kernel as usize, output: output as usize, stride, pad, dilation })
    }

    /// The input coordinate of tap `k` of output position `o`, `None` in the padding.
    #[inline]
    pub fn tap(&self, o: usize, k: usize) -> Option<usize> {
        let x = o as i64 * self.stride + k as i64 * self.dilation - self.pad;
        (x >= 0 && (x as usize) < self.input).then_some(x as usize)
    }
}

/// The geometry of one 2-D convolution: x `(n, c, h, w)`, weight `(o, c/groups, kh, kw)`,
/// y `(n, o, oh, ow)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2d {
    /// Batch.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Output channels.
    pub o: usize,
    /// Channel groups (≥ 1, dividing `c` and `o`).
    pub groups: usize,
    /// The height axis.
    pub rows: Axis,
    /// The width axis.
    pub cols: Axis,
}

/// Operands of a convolution op in order, the optional bias (or its gradient) last.
pub type ConvOperands<'a, T> = ([&'a T; 3], Option<&'a T>);

impl Conv2d {
    /// Validate the window and channels; `x` is `(n, c, h, w)` and `w` `(o, c/groups, kh, kw)`,
    /// whichever operands carry them for the op at hand.
    pub fn new(op: &Op, window: &Window2d, groups: u32, x: &impl Meta, w: &impl Meta) -> Result<Conv2d> {
        let [n, c, h, wd] = dims::<4>(op, "x (n, c, h, w)", x)?;
        let [o, cg, kh, kw] = dims::<4>(op, "weight (o, c/groups, kh, kw)", w)?;
        let groups = groups as usize;
        if groups == 0 || c % groups != 0 || o % groups != 0 {
            return Err(BackendError::invalid(format!(
                "{}: groups ({groups}) must be >= 1 and divide the input channels ({c}) and the output channels ({o})",
                op.name()
            )));
        }
        if cg * groups != c {
            return Err(BackendError::shape(format!(
                "{}: weight {:?} has {cg} input channels per group, expected {} (x {:?}, groups {groups})",
                op.name(),
                w.shape(),
                c / groups,
                x.shape()
            )));
        }
        let to_i64 = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let rows = Axis::new(op, "height", h, to_i64(kh), window.stride[0], window.padding[0], window.dilation[0])?;
        let cols = Axis::new(op, "width", wd, to_i64(kw), window.stride[1], window.padding[1], window.dilation[1])?;
        Ok(Conv2d { n, c, o, groups, rows, cols })
    }

    /// Operands of `Conv2d`, `[x, weight(, bias)] -> [y]`: returns `([x, weight, y], bias)`.
    /// weight, y and bias `(o)` have x's dtype.
    pub fn forward<'a, T: Meta>(
        op: &Op,
        window: &Window2d,
        groups: u32,
        inputs: &'a [T],
        outputs: &'a [T],
    ) -> Result<(Conv2d, ConvOperands<'a, T>)> {
        let (x, w, bias, y) = match (inputs, outputs) {
            ([x, w], [y]) => (x, w, None, y),
            ([x, w, b], [y]) => (x, w, Some(b), y),
            _ => return Err(count(op, "2 or 3 inputs (x, weight[, bias]) and 1 output")),
        };
        let g = Conv2d::new(op, window, groups, x, w)?;
        expect_dtype(op, "weight", w, x.dtype())?;
        expect_meta(op, "y", y, &g.y_shape(), x.dtype())?;
        if let Some(b) = bias {
            expect_meta(op, "bias", b, &[g.o], x.dtype())?;
        }
        Ok((g, ([x, w, y], bias)))
    }

    /// Operands of `Conv2dBackwardInput`, `[dy, weight] -> [dx]`, all of dy's dtype: returns
    /// `[dy, weight, dx]`.
    pub fn backward_input<'a, T: Meta>(
        op: &Op,
        window: &Window2d,
        groups: u32,
        inputs: &'a [T],
        outputs: &'a [T],
    ) -> Result<(Conv2d, [&'a T; 3])> {
        let ([dy, w], [dx]) = (inputs, outputs) else {
            return Err(count(op, "2 inputs (dy, weight) and 1 output (dx)"));
        };
        let g = Conv2d::new(op, window, groups, dx, w)?;
        expect_shape(op, "dy", dy, &g.y_shape())?;
        for (name, t) in [("weight", w), ("dx", dx)] {
            expect_dtype(op, name, t, dy.dtype())?;
        }
        Ok((g, [dy, w, dx]))
    }

    /// Operands of `Conv2dBackwardWeight`, `[dy, x] -> [dweight(, dbias)]`, all of dy's dtype:
    /// returns `([dy, x, dweight], dbias)`.
    pub fn backward_weight<'a, T: Meta>(
        op: &Op,
        window: &Window2d,
        groups: u32,
        inputs: &'a [T],
        outputs: &'a [T],
    ) -> Result<(Conv2d, ConvOperands<'a, T>)> {
        let (dy, x, dw, db) = match (inputs, outputs) {
            ([dy, x], [dw]) => (dy, x, dw, None),
            ([dy, x], [dw, db]) => (dy, x, dw, Some(db)),
            _ => return Err(count(op, "2 inputs (dy, x) and 1 or 2 outputs (dweight[, dbias])")),
        };
        let g = Conv2d::new(op, window, groups, x, dw)?;
        expect_shape(op, "dy", dy, &g.y_shape())?;
        for (name, t) in [("x", x), ("dweight", dw)] {
            expect_dtype(op, name, t, dy.dtype())?;
        }
        if let Some(db) = db {
            expect_meta(op, "dbias", db, &[g.o], dy.dtype())?;
        }
        Ok((g, ([dy, x, dw], db)))
    }

    /// Channels per group in x.
    pub fn cg(&self) -> usize {
        self.c / self.groups
    }

    /// Channels per group in y.
    pub fn og(&self) -> usize {
        self.o / self.groups
    }

    /// Rows of one group's im2col matrix: (channel, kernel row, kernel column).
    pub fn ck(&self) -> usize {
        self.cg() * self.rows.kernel * self.cols.kernel
    }

    /// Output positions per plane.
    pub fn l(&self) -> usize {
        self.rows.output * self.cols.output
    }

    /// Elements per input plane.
    pub fn plane_in(&self) -> usize {
        self.rows.input * self.cols.input
    }

    /// The shape of y.
    pub fn y_shape(&self) -> [usize; 4] {
        [self.n, self.o, self.rows.output, self.cols.output]
    }
}

/// The wrong-operand-count error of the window ops, which name their operands.
fn count(op: &Op, expected: &str) -> BackendError {
    BackendError::invalid(format!("{}: expected {expected}", op.name()))
}

/// The geometry of one 2-D pooling: `n·c` planes of x `(n, c, h, w)` and the two axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool2d {
    /// Batch.
    pub n: usize,
    /// Channels.
    pub c: usize,
    /// The height axis.
    pub rows: Axis,
    /// The width axis.
    pub cols: Axis,
}

impl Pool2d {
    /// Validate the window against `x` (n, c, h, w). Average pooling (`max` false) has no
    /// dilation: the field must be 0 (unset) or 1. Max pooling refuses a window that covers
    /// only padding: it has no element to pick (its argmax would point outside the plane).
    /// PyTorch avoids it by requiring padding <= kernel/2; checking the windows themselves
    /// accepts every geometry where the op is defined.
    pub fn new(op: &Op, window: &Window2d, x: &impl Meta, max: bool) -> Result<Pool2d> {
        let [n, c, h, w] = dims::<4>(op, "x (n, c, h, w)", x)?;
        let mut dilation = window.dilation;
        if !max {
            if dilation.iter().any(|&d| d != 0 && d != 1) {
                return Err(BackendError::invalid(format!(
                    "{}: average pooling has no dilation, got {:?}",
                    op.name(),
                    window.dilation
                )));
            }
            dilation = [1, 1];
        }
        let rows = Axis::new(op, "height", h, window.kernel[0], window.stride[0], window.padding[0], dilation[0])?;
        let cols = Axis::new(op, "width", w, window.kernel[1], window.stride[1], window.padding[1], dilation[1])?;
        if max {
            for (name, axis) in [("row", rows), ("column", cols)] {
                if let Some(o) = (0..axis.output).find(|&o| (0..axis.kernel).all(|k| axis.tap(o, k).is_none())) {
                    return Err(BackendError::invalid(format!(
                        "{}: the window of output {name} {o} covers only padding (input {:?}, window {window:?})",
                        op.name(),
                        x.shape()
                    )));
                }
            }
        }
        Ok(Pool2d { n, c, rows, cols })
    }

    /// Operands of `MaxPool2d`, `[x] -> [y, argmax]`: y of x's dtype, argmax i64, both
    /// `(n, c, oh, ow)`. Returns `[x, y, argmax]`.
    pub fn max<'a, T: Meta>(
        op: &Op,
        window: &Window2d,
        inputs: &'a [T],
        outputs: &'a [T],
    ) -> Result<(Pool2d, [&'a T; 3])> {
        let ([x], [y, idx]) = (inputs, outputs) else {
            return Err(count(op, "1 input (x) and 2 outputs (y, argmax)"));
        };
        let g = Pool2d::new(op, window, x, true)?;
        expect_meta(op, "y", y, &g.y_shape(), x.dtype())?;
        expect_meta(op, "argmax", idx, &g.y_shape(), DType::I64)?;
        Ok((g, [x, y, idx]))
    }

    /// Operands of `MaxPool2dBackward`, `[dy, argmax] -> [dx]`, the geometry taken from dx.
    /// Returns `[dy, argmax, dx]`.
    pub fn max_backward<'a, T: Meta>(
        op: &Op,
        window: &Window2d,
        inputs: &'a [T],
        outputs: &'a [T],
    ) -> Result<(Pool2d, [&'a T; 3])> {
        let ([dy, idx], [dx]) = (inputs, outputs) else {
            return Err(count(op, "2 inputs (dy, argmax) and 1 output (dx)"));
        };
        let g = Pool2d::new(op, window, dx, true)?;
        expect_shape(op, "dy", dy, &g.y_shape())?;
        expect_meta(op, "argmax", idx, &g.y_shape(), DType::I64)?;
        expect_dtype(op, "dx", dx, dy.dtype())?;
        Ok((g, [dy, idx, dx]))
    }

    /// Operands of `AvgPool2d`, `[x] -> [y]`. Returns `[x, y]`.
    pub fn avg<'a, T: Meta>(
        op: &Op,
        window: &Window2d,
        inputs: &'a [T],
        outputs: &'a [T],
    ) -> Result<(Pool2d, [&'a T; 2])> {
        let ([x], [y]) = (inputs, outputs) else { return Err(count(op, "1 input (x) and 1 output (y)")) };
        let g = Pool2d::new(op, window, x, false)?;
        expect_meta(op, "y", y, &g.y_shape(), x.dtype())?;
        Ok((g, [x, y]))
    }

    /// Operands of `AvgPool2dBackward`, `[dy] -> [dx]`. Returns `[dy, dx]`.
    pub fn avg_backward<'a, T: Meta>(
        op: &Op,
        window: &Window2d,
        inputs: &'a [T],
        outputs: &'a [T],
    ) -> Result<(Pool2d, [&'a T; 2])> {
        let ([dy], [dx]) = (inputs, outputs) else { return Err(count(op, "1 input (dy) and 1 output (dx)")) };
        let g = Pool2d::new(op, window, dx, false)?;
        expect_shape(op, "dy", dy, &g.y_shape())?;
        expect_dtype(op, "dx", dx, dy.dtype())?;
        Ok((g, [dy, dx]))
    }

    /// Elements per input plane.
    pub fn plane_in(&self) -> usize {
        self.rows.input * self.cols.input
    }

    /// Elements per output plane.
    pub fn plane_out(&self) -> usize {
        self.rows.output * self.cols.output
    }

    /// The shape of y (and argmax): `(n, c, oh, ow)`.
    pub fn y_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.rows.output, self.cols.output]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lengths_follow_the_formula() {
        let op = Op::Conv2d { window: Window2d::default(), groups: 1 };
        // (9 + 0 - 2*1 - 1)/2 + 1 = 4
        let a = Axis::new(&op, "height", 9, 2, 2, 0, 2).unwrap();
        assert_eq!(a.output, 4);
        assert_eq!((a.tap(0, 1), a.tap(3, 1)), (Some(2), Some(8)));
        let p = Axis::new(&op, "width", 6, 3, 2, 1, 1).unwrap();
        assert_eq!((p.output, p.tap(0, 0), p.tap(0, 1)), (3, None, Some(0)));
        assert!(Axis::new(&op, "height", 2, 5, 1, 0, 1).unwrap_err().message.contains("spans 5 positions"));
        assert!(Axis::new(&op, "height", 2, 1, 0, 0, 1).unwrap_err().message.contains("stride must be >= 1"));
        assert!(Axis::new(&op, "height", 2, 1, 1, -1, 1).unwrap_err().message.contains("padding must be >= 0"));
        assert!(Axis::new(&op, "height", 4, 2, i64::MAX, 0, i64::MAX / 2).is_err());
    }
}
