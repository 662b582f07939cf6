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

/// A [`Window`] sliding over the `h × w` planes of an input `(n, c, h, w)`: a convolution or
/// pooling test case.
pub trait Sliding {
    /// The input's shape `(n, c, h, w)`.
    fn x_shape(&self) -> [usize; 4];

    /// The window.
    fn sweep(&self) -> Window;

    /// The output length along axis `a` (0 the height, 1 the width).
    fn out(&self, a: usize) -> usize {
        self.sweep().out(a, self.x_shape()[2 + a])
    }

    /// The window as an op takes it.
    fn window(&self) -> Window2d {
        self.sweep().desc()
    }

    /// The taps of output position `(oy, ox)` that fall inside the plane, in row-major tap
    /// order: `(ky, kx, iy * w + ix)`, the tap and the flat plane index it reads.
    fn taps(&self, oy: usize, ox: usize) -> Vec<(usize, usize, usize)> {
        let (sweep, [_, _, h, w]) = (self.sweep(), self.x_shape());
        let mut taps = vec![];
        for ky in 0..sweep.k[0] {
            for kx in 0..sweep.k[1] {
                let (iy, ix) = (sweep.tap(0, oy, ky), sweep.tap(1, ox, kx));
                if iy >= 0 && ix >= 0 && iy < h as i64 && ix < w as i64 {
                    taps.push((ky, kx, iy as usize * w + ix as usize));
                }
            }
        }
        taps
    }
}
