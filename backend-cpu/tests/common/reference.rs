//! Reference math that more than one fused-op test file uses, in f64: the dot product, the
//! stable exponential sum under softmax, log-sum-exp and attention, and the geometry of the
//! sliding window that convolution and pooling share.

use genesis_backend_api::Window2d;

/// The dot product.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// A row's maximum `m` and `sum(exp(v - m))`: softmax is `exp(v - m) / sum` and log-sum-exp
/// is `m + ln(sum)`. An empty row gives (-inf, 0); an all -inf row gives (-inf, NaN).
pub fn max_and_exp_sum(row: &[f64]) -> (f64, f64) {
    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (m, row.iter().map(|v| (v - m).exp()).sum())
}

/// A 2-D sliding window (kernel size, stride, padding and dilation per axis; axis 0 is the
/// height, axis 1 the width), as convolution and pooling use it.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub k: [usize; 2],
    pub stride: [usize; 2],
    pub pad: [usize; 2],
    pub dil: [usize; 2],
}

impl Window {
    /// The output length along axis `a` of an input of length `len`.
    pub fn out(&self, a: usize, len: usize) -> usize {
        (len + 2 * self.pad[a] - self.dil[a] * (self.k[a] - 1) - 1) / self.stride[a] + 1
    }

    /// The input position that tap `kk` of output position `o` reads along axis `a`; outside
    /// the input (negative, or past its end), it reads padding.
    pub fn tap(&self, a: usize, o: usize, kk: usize) -> i64 {
        (o * self.stride[a] + kk * self.dil[a]) as i64 - self.pad[a] as i64
    }

    /// The window as an op takes it.
    pub fn desc(&self) -> Window2d {
        let i = |a: [usize; 2]| [a[0] as i64, a[1] as i64];
        Window2d { kernel: i(self.k), stride: i(self.stride), padding: i(self.pad), dilation: i(self.dil) }
    }
}
