//! Softmax and log-softmax, forward and backward, against the f64 references below (see
//! `common::fused` for the method and the tolerances).

mod common;

use common::fused::*;
use common::reference::*;
use genesis_backend_api::{DType, ErrorKind, Op};
use rstest::rstest;

fn softmax_ref(x: &[f64], d: usize, log: bool) -> Vec<f64> {
    x.chunks(d)
        .flat_map(|r| {
            let (m, s) = max_and_exp_sum(r);
            r.iter().map(move |v| if log { v - m - s.ln() } else { (v - m).exp() / s }).collect::<Vec<_>>()
        })
        .collect()
}

fn softmax_backward_ref(y: &[f64], dy: &[f64], d: usize, log: bool) -> Vec<f64> {
    y.chunks(d)
        .zip(dy.chunks(d))
        .flat_map(|(y, dy)| {
            if log {
                let s: f64 = dy.iter().sum();
                y.iter().zip(dy).map(|(y, g)| g - y.exp() * s).collect::<Vec<_>>()
            } else {
                let s = dot(y, dy);
                y.iter().zip(dy).map(|(y, g)| y * (g - s)).collect()
            }
        })
        .collect()
}

#[test]
fn reference_softmax_backward_matches_finite_differences() {
    let mut rng = Rng(1);
    let (x, dy) = (rng.vec(12, 2.0), rng.vec(12, 1.0));
    for log in [false, true] {
        let y = softmax_ref(&x, 4, log);
        let grad = softmax_backward_ref(&y, &dy, 4, log);
        check_fd("softmax", |x| dot(&softmax_ref(x, 4, log), &dy), &x, &grad);
    }
}

#[rstest]
fn softmax_forward(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(false, true)] log: bool,
    #[values(&[3, 2, 7][..], &[64, 600][..], &[5][..])] shape: &[usize],
) {
    let h = Harness::new();
    let mut rng = Rng(2);
    let n: usize = shape.iter().product();
    let d = shape[shape.len() - 1];
    let mut x = rng.vec(n, 4.0);
    // A shifted row (exp would overflow without the max subtraction) and, when there are
    // several rows, an all -inf row (NaN, as in PyTorch).
    x[..d].iter_mut().for_each(|v| *v += 100.0);
    if n > d {
        x[d..2 * d].fill(f64::NEG_INFINITY);
    }
    let x = round(dtype, &x);
    let (xt, yt) = (h.input(dtype, shape, layout, &x), h.output(dtype, shape, layout));
    h.ok(if log { Op::LogSoftmax } else { Op::Softmax }, &[&xt], &[&yt]);
    let want = softmax_ref(&x, d, log);
    if n > d {
        assert!(want[d..2 * d].iter().all(|v| v.is_nan()));
    }
    assert_close("softmax", &h.download(&yt), &want, 4.0 * eps_of_compute(dtype));
}

#[rstest]
fn softmax_backward(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(false, true)] log: bool,
    #[values(&[3, 2, 7][..], &[64, 600][..])] shape: &[usize],
) {
    let h = Harness::new();
    let mut rng = Rng(3);
    let n: usize = shape.iter().product();
    let d = shape[shape.len() - 1];
    let y = round(dtype, &softmax_ref(&rng.vec(n, 3.0), d, log));
    let dy = round(dtype, &rng.vec(n, 1.0));
    let (yt, dyt, dxt) =
        (h.input(dtype, shape, layout, &y), h.input(dtype, shape, layout, &dy), h.output(dtype, shape, layout));
    h.ok(if log { Op::LogSoftmaxBackward } else { Op::SoftmaxBackward }, &[&yt, &dyt], &[&dxt]);
    assert_close("softmax backward", &h.download(&dxt), &softmax_backward_ref(&y, &dy, d, log), 8.0 * eps(dtype));
}

#[test]
fn softmax_validates_operands() {
    let h = Harness::new();
    let x = h.input(F32, &[2, 3], Dense, &[0.0; 6]);
    let bad_shape = h.output(F32, &[3, 2], Dense);
    let bad_dtype = h.output(F64, &[2, 3], Dense);
    h.fails(Op::Softmax, &[&x], &[&bad_shape], ErrorKind::ShapeMismatch);
    h.fails(Op::Softmax, &[&x], &[&bad_dtype], ErrorKind::DtypeMismatch);
    h.fails(Op::SoftmaxBackward, &[&x], &[&bad_dtype], ErrorKind::InvalidArgument);
}
