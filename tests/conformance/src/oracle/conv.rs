//! Direct 2-D convolution and pooling in f64 (NCHW), as loops over output positions.

use super::tensor::sum;
use genesis_backend_api::Window2d;

/// Output extent of one spatial dim.
pub fn out_len(n: usize, k: usize, stride: i64, pad: i64, dil: i64) -> usize {
    let span = dil * (k as i64 - 1) + 1;
    let len = n as i64 + 2 * pad - span;
    if len < 0 {
        0
    } else {
        (len / stride + 1) as usize
    }
}

/// Input coordinate of tap `k` of output position `o`, when inside `[0, n)`.
fn tap(o: usize, k: usize, stride: i64, pad: i64, dil: i64, n: usize) -> Option<usize> {
    let at = o as i64 * stride - pad + k as i64 * dil;
    (0..n as i64).contains(&at).then_some(at as usize)
}

/// `conv2d(x (n,c,h,w), weight (o,c/g,kh,kw), bias)`: `(y, Σ|terms|, K)`.
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    bias: Option<&[f64]>,
    win: &Window2d,
    groups: usize,
) -> (Vec<f64>, Vec<f64>, usize) {
    let [n, c, h, wd] = xs;
    let [o, cpg, kh, kw] = ws;
    let (oh, ow) = (
        out_len(h, kh, win.stride[0], win.padding[0], win.dilation[0]),
        out_len(wd, kw, win.stride[1], win.padding[1], win.dilation[1]),
    );
    let opg = o / groups;
    let (mut y, mut mag) = (Vec::new(), Vec::new());
    for b in 0..n {
        for oc in 0..o {
            let g = oc / opg;
            for i in 0..oh {
                for j in 0..ow {
                    let mut terms = vec![bias.map_or(0.0, |bs| bs[oc])];
                    for ci in 0..cpg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let (Some(r), Some(s)) = (
                                    tap(i, ki, win.stride[0], win.padding[0], win.dilation[0], h),
                                    tap(j, kj, win.stride[1], win.padding[1], win.dilation[1], wd),
                                ) else {
                                    continue;
                                };
                                let xv = x[((b * c + g * cpg + ci) * h + r) * wd + s];
                                terms.push(xv * w[((oc * cpg + ci) * kh + ki) * kw + kj]);
                            }
                        }
                    }
                    y.push(sum(&terms));
                    mag.push(terms.iter().map(|t| t.abs()).sum());
                }
            }
        }
    }
    (y, mag, cpg * kh * kw + 1)
}

/// Max pooling with -inf padding: `(y, argmax as ih*w+iw)`; NaN wins, first maximum on ties.
pub fn max_pool2d(x: &[f64], xs: [usize; 4], win: &Window2d) -> (Vec<f64>, Vec<f64>) {
    let [n, c, h, w] = xs;
    let [kh, kw] = [win.kernel[0] as usize, win.kernel[1] as usize];
    let (oh, ow) = (
        out_len(h, kh, win.stride[0], win.padding[0], win.dilation[0]),
        out_len(w, kw, win.stride[1], win.padding[1], win.dilation[1]),
    );
    let (mut y, mut arg) = (Vec::new(), Vec::new());
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let (mut best, mut at) = (f64::NEG_INFINITY, None);
                for ki in 0..kh {
                    for kj in 0..kw {
                        let (Some(r), Some(s)) = (
                            tap(i, ki, win.stride[0], win.padding[0], win.dilation[0], h),
                            tap(j, kj, win.stride[1], win.padding[1], win.dilation[1], w),
                        ) else {
                            continue;
                        };
                        let v = x[plane * h * w + r * w + s];
                        if at.is_none() || (!best.is_nan() && (v.is_nan() || v > best)) {
                            best = v;
                            at = Some(r * w + s);
                        }
                    }
                }
                y.push(best);
                arg.push(at.map_or(-1.0, |a| a as f64));
            }
        }
    }
    (y, arg)
}

/// Average pooling with zero padding counted in the divisor: `(y, Σ|terms|/K, K)`.
pub fn avg_pool2d(x: &[f64], xs: [usize; 4], win: &Window2d) -> (Vec<f64>, Vec<f64>, usize) {
    let [n, c, h, w] = xs;
    let [kh, kw] = [win.kernel[0] as usize, win.kernel[1] as usize];
    let (oh, ow) = (out_len(h, kh, win.stride[0], win.padding[0], 1), out_len(w, kw, win.stride[1], win.padding[1], 1));
    let k = kh * kw;
    let (mut y, mut mag) = (Vec::new(), Vec::new());
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let mut terms = Vec::new();
                for ki in 0..kh {
                    for kj in 0..kw {
                        if let (Some(r), Some(s)) = (
                            tap(i, ki, win.stride[0], win.padding[0], 1, h),
                            tap(j, kj, win.stride[1], win.padding[1], 1, w),
                        ) {
                            terms.push(x[plane * h * w + r * w + s]);
                        }
                    }
                }
                y.push(sum(&terms) / k as f64);
                mag.push(terms.iter().map(|t| t.abs()).sum::<f64>() / k as f64);
            }
        }
    }
    (y, mag, k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_by_one_kernel_scales() {
        let win = Window2d { kernel: [1, 1], stride: [1, 1], padding: [0, 0], dilation: [1, 1] };
        let (y, _, k) = conv2d(&[1.0, 2.0, 3.0, 4.0], [1, 1, 2, 2], &[2.0], [1, 1, 1, 1], Some(&[0.5]), &win, 1);
        assert_eq!((y, k), (vec![2.5, 4.5, 6.5, 8.5], 2));
    }

    #[test]
    fn pooling_of_a_ramp() {
        let win = Window2d { kernel: [2, 2], stride: [2, 2], padding: [0, 0], dilation: [1, 1] };
        let x: Vec<f64> = (0..16).map(|v| v as f64).collect();
        assert_eq!(max_pool2d(&x, [1, 1, 4, 4], &win), (vec![5.0, 7.0, 13.0, 15.0], vec![5.0, 7.0, 13.0, 15.0]));
        assert_eq!(avg_pool2d(&x, [1, 1, 4, 4], &win).0, vec![2.5, 4.5, 10.5, 12.5]);
    }
}
