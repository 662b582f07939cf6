//! Sliding-window geometry (convolution and pooling), validated once for every backend.

use crate::error::{BackendError, Result};
use crate::op::Op;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Window2d;

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
