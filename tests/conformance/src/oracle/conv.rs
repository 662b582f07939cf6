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

/// Output extents `(oh, ow)` of a pooling window over `x (.., h, w)` with `dilation` (the
/// window's for max pooling; average pooling has none, 1).
fn pool_out(xs: [usize; 4], win: &Window2d, dilation: [i64; 2]) -> (usize, usize) {
    let [kh, kw] = [win.kernel[0] as usize, win.kernel[1] as usize];
    (
        out_len(xs[2], kh, win.stride[0], win.padding[0], dilation[0]),
        out_len(xs[3], kw, win.stride[1], win.padding[1], dilation[1]),
    )
}

/// The number of outputs of a pooling window over `x (n, c, h, w)` (see [`pool_out`]).
fn pool_outputs(xs: [usize; 4], win: &Window2d, dilation: [i64; 2]) -> usize {
    let (oh, ow) = pool_out(xs, win, dilation);
    xs[0] * xs[1] * oh * ow
}

/// Visit every in-bounds (output position, input position) pair of a pooling window over the
/// planes of `x (n, c, h, w)`: `f(y index, x index, input position in its plane)`, flat and
/// row-major, each output's taps in row-major window order.
fn pool_taps(xs: [usize; 4], win: &Window2d, dilation: [i64; 2], mut f: impl FnMut(usize, usize, usize)) {
    let [n, c, h, w] = xs;
    let [kh, kw] = [win.kernel[0] as usize, win.kernel[1] as usize];
    let (oh, ow) = pool_out(xs, win, dilation);
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let yi = (plane * oh + i) * ow + j;
                for ki in 0..kh {
                    for kj in 0..kw {
                        if let (Some(r), Some(s)) = (
                            tap(i, ki, win.stride[0], win.padding[0], dilation[0], h),
                            tap(j, kj, win.stride[1], win.padding[1], dilation[1], w),
                        ) {
                            f(yi, plane * h * w + r * w + s, r * w + s);
                        }
                    }
                }
            }
        }
    }
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
    let (oh, ow) = conv_out(xs, ws, win);
    let (plane, o) = (oh * ow, ws[0]);
    // Each output's terms: its bias, then its products in `conv_taps`' order.
    let mut terms: Vec<Vec<f64>> =
        (0..xs[0] * o * plane).map(|yi| vec![bias.map_or(0.0, |bs| bs[yi / plane % o])]).collect();
    conv_taps(xs, ws, win, groups, |yi, xi, wi| terms[yi].push(x[xi] * w[wi]));
    let (y, mag, _) = finish(terms);
    (y, mag, ws[1] * ws[2] * ws[3] + 1)
}

/// Max pooling with -inf padding: `(y, argmax as ih*w+iw)`; NaN wins, first maximum on ties.
pub fn max_pool2d(x: &[f64], xs: [usize; 4], win: &Window2d) -> (Vec<f64>, Vec<f64>) {
    let outputs = pool_outputs(xs, win, win.dilation);
    let (mut y, mut at) = (vec![f64::NEG_INFINITY; outputs], vec![None; outputs]);
    pool_taps(xs, win, win.dilation, |yi, xi, p| {
        let v = x[xi];
        if at[yi].is_none() || (!y[yi].is_nan() && (v.is_nan() || v > y[yi])) {
            y[yi] = v;
            at[yi] = Some(p);
        }
    });
    (y, at.iter().map(|a| a.map_or(-1.0, |a| a as f64)).collect())
}

/// Average pooling with zero padding counted in the divisor: `(y, Σ|terms|/K, K)`.
pub fn avg_pool2d(x: &[f64], xs: [usize; 4], win: &Window2d) -> (Vec<f64>, Vec<f64>, usize) {
    let k = (win.kernel[0] * win.kernel[1]) as usize;
    let mut terms = vec![Vec::new(); pool_outputs(xs, win, [1, 1])];
    pool_taps(xs, win, [1, 1], |yi, xi, _| terms[yi].push(x[xi]));
    let y = terms.iter().map(|t| sum(t) / k as f64).collect();
    let mag = terms.iter().map(|t| t.iter().map(|v| v.abs()).sum::<f64>() / k as f64).collect();
    (y, mag, k)
}

/// Output extents `(oh, ow)` of a convolution of `x (.., h, w)` by a `kh×kw` kernel.
pub fn conv_out(xs: [usize; 4], ws: [usize; 4], win: &Window2d) -> (usize, usize) {
    (
        out_len(xs[2], ws[2], win.stride[0], win.padding[0], win.dilation[0]),
        out_len(xs[3], ws[3], win.stride[1], win.padding[1], win.dilation[1]),
    )
}

/// Per-element sums of collected terms: `(Σ terms, Σ|terms|, the largest term count)`.
fn finish(terms: Vec<Vec<f64>>) -> (Vec<f64>, Vec<f64>, usize) {
    let k = terms.iter().map(Vec::len).max().unwrap_or(0);
    let mag = terms.iter().map(|t| t.iter().map(|v| v.abs()).sum()).collect();
    (terms.iter().map(|t| sum(t)).collect(), mag, k.max(1))
}

/// Visit every (output position, input position, weight position) triple of a convolution:
/// `f(y index, x index, w index)` with flat row-major indices.
fn conv_taps(xs: [usize; 4], ws: [usize; 4], win: &Window2d, groups: usize, mut f: impl FnMut(usize, usize, usize)) {
    let [n, c, h, wd] = xs;
    let [o, cpg, kh, kw] = ws;
    let (oh, ow) = conv_out(xs, ws, win);
    let opg = o / groups;
    for b in 0..n {
        for oc in 0..o {
            let g = oc / opg;
            for i in 0..oh {
                for j in 0..ow {
                    let yi = ((b * o + oc) * oh + i) * ow + j;
                    for ci in 0..cpg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let (Some(r), Some(s)) = (
                                    tap(i, ki, win.stride[0], win.padding[0], win.dilation[0], h),
                                    tap(j, kj, win.stride[1], win.padding[1], win.dilation[1], wd),
                                ) else {
                                    continue;
                                };
                                f(yi, ((b * c + g * cpg + ci) * h + r) * wd + s, ((oc * cpg + ci) * kh + ki) * kw + kj);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Conv2d VJP with respect to the input: `dx (n,c,h,w)` from `dy (n,o,oh,ow)` and the weight,
/// as `(dx, Σ|terms|, K)` with K the most terms any element sums (at most o/g·kh·kw).
pub fn conv2d_vjp_input(
    dy: &[f64],
    w: &[f64],
    xs: [usize; 4],
    ws: [usize; 4],
    win: &Window2d,
    groups: usize,
) -> (Vec<f64>, Vec<f64>, usize) {
    let mut terms = vec![Vec::new(); xs.iter().product()];
    conv_taps(xs, ws, win, groups, |yi, xi, wi| terms[xi].push(dy[yi] * w[wi]));
    finish(terms)
}

/// Conv2d VJP with respect to the weight and the bias: `(dw, Σ|terms|, K, dbias, Σ|terms|, K)`,
/// K the most terms an element sums (at most n·oh·ow).
#[allow(clippy::type_complexity)]
pub fn conv2d_vjp_weight(
    dy: &[f64],
    x: &[f64],
    xs: [usize; 4],
    ws: [usize; 4],
    win: &Window2d,
    groups: usize,
) -> ((Vec<f64>, Vec<f64>, usize), (Vec<f64>, Vec<f64>, usize)) {
    let mut terms = vec![Vec::new(); ws.iter().product()];
    conv_taps(xs, ws, win, groups, |yi, xi, wi| terms[wi].push(dy[yi] * x[xi]));
    let (n, o) = (xs[0], ws[0]);
    let (oh, ow) = conv_out(xs, ws, win);
    let bias_terms =
        (0..o).map(|oc| (0..n).flat_map(|b| dy[(b * o + oc) * oh * ow..][..oh * ow].to_vec()).collect()).collect();
    (finish(terms), finish(bias_terms))
}

/// Max pooling VJP: `dy` added at the input element each window picked (`argmax`, flat in the
/// plane, as the forward returns it): `(dx, Σ|terms|, K)`, K the most windows that picked one
/// element.
pub fn max_pool2d_vjp(dy: &[f64], argmax: &[f64], xs: [usize; 4]) -> (Vec<f64>, Vec<f64>, usize) {
    let [n, c, h, w] = xs;
    let plane_out = dy.len() / (n * c).max(1);
    let mut terms = vec![Vec::new(); n * c * h * w];
    for (i, (&g, &a)) in dy.iter().zip(argmax).enumerate() {
        terms[i / plane_out * h * w + a as usize].push(g);
    }
    finish(terms)
}

/// Average pooling VJP (zero padding counted in the divisor `kh·kw`): each window spreads
/// `dy/(kh·kw)` over its in-bounds taps: `(dx, Σ|terms|, K)`, K the most windows covering one
/// element.
pub fn avg_pool2d_vjp(dy: &[f64], xs: [usize; 4], win: &Window2d) -> (Vec<f64>, Vec<f64>, usize) {
    let k = (win.kernel[0] * win.kernel[1]) as f64;
    let mut terms = vec![Vec::new(); xs.iter().product()];
    pool_taps(xs, win, [1, 1], |yi, xi, _| terms[xi].push(dy[yi] / k));
    finish(terms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::fd::{assert_close, data, fd_vjp};

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

    fn window(stride: [i64; 2], padding: [i64; 2], dilation: [i64; 2]) -> Window2d {
        Window2d { kernel: [0, 0], stride, padding, dilation }
    }

    #[test]
    fn conv2d_vjps_match_finite_differences() {
        for (xs, ws, win, groups) in [
            ([2usize, 3, 5, 6], [4usize, 3, 3, 3], window([1, 1], [1, 1], [1, 1]), 1usize),
            ([1, 2, 7, 6], [3, 2, 2, 3], window([2, 2], [0, 0], [2, 2]), 1),
            ([1, 6, 6, 7], [6, 2, 3, 2], window([2, 1], [1, 2], [1, 2]), 3),
        ] {
            let (oh, ow) = conv_out(xs, ws, &win);
            let (x, w, bias) = (data("cvx", xs.iter().product()), data("cvw", ws.iter().product()), data("cvb", ws[0]));
            let dy = data("cvdy", xs[0] * ws[0] * oh * ow);
            let f = |x: &[f64], w: &[f64], b: &[f64]| conv2d(x, xs, w, ws, Some(b), &win, groups).0;
            let what = format!("conv2d x {xs:?} w {ws:?} {win:?} groups {groups}");
            let (dx, _, _) = conv2d_vjp_input(&dy, &w, xs, ws, &win, groups);
            assert_close(&dx, &fd_vjp(&|x| f(x, &w, &bias), &x, &dy), &format!("{what}: dx"));
            let ((dw, _, _), (db, _, _)) = conv2d_vjp_weight(&dy, &x, xs, ws, &win, groups);
            assert_close(&dw, &fd_vjp(&|w| f(&x, w, &bias), &w, &dy), &format!("{what}: dw"));
            assert_close(&db, &fd_vjp(&|b| f(&x, &w, b), &bias, &dy), &format!("{what}: dbias"));
        }
    }

    #[test]
    fn pooling_vjps_match_finite_differences() {
        let xs = [2usize, 2, 7, 6];
        // Distinct values: max pooling is differentiable there (away from ties).
        let x = data("px", 2 * 2 * 7 * 6);
        for (kernel, stride, padding) in [(2i64, 2i64, 0i64), (3, 2, 1), (3, 1, 1)] {
            let win = Window2d { kernel: [kernel; 2], stride: [stride; 2], padding: [padding; 2], dilation: [1, 1] };
            let (y, arg) = max_pool2d(&x, xs, &win);
            let dy = data("pdy", y.len());
            let what = format!("k{kernel} s{stride} p{padding}");
            let dx = max_pool2d_vjp(&dy, &arg, xs).0;
            assert_close(&dx, &fd_vjp(&|x| max_pool2d(x, xs, &win).0, &x, &dy), &format!("max_pool2d {what}"));
            let dx = avg_pool2d_vjp(&dy, xs, &win).0;
            assert_close(&dx, &fd_vjp(&|x| avg_pool2d(x, xs, &win).0, &x, &dy), &format!("avg_pool2d {what}"));
        }
    }
}
