//! 2-D max and average pooling, forward and backward, against the f64 references below (see
//! `common::fused` for the method and the tolerances).

mod common;

use common::fused::*;
use common::reference::*;
use genesis_backend_api::{DType, ErrorKind, Op, Window2d};
use rstest::rstest;

#[derive(Debug, Clone, Copy)]
struct Pool {
    /// x's shape `(n, c, h, w)`.
    x: [usize; 4],
    win: Window,
}

impl Pool {
    fn y_shape(&self) -> [usize; 4] {
        [self.x[0], self.x[1], self.out(0), self.out(1)]
    }
    /// For every output element (plane, oy, ox) in order, the in-bounds flat plane indices of
    /// its window.
    fn windows(&self) -> Vec<(usize, Vec<usize>)> {
        let mut out = vec![];
        for p in 0..self.x[0] * self.x[1] {
            for oy in 0..self.out(0) {
                for ox in 0..self.out(1) {
                    out.push((p, self.taps(oy, ox).into_iter().map(|(_, _, t)| t).collect()));
                }
            }
        }
        out
    }
}

impl Sliding for Pool {
    fn x_shape(&self) -> [usize; 4] {
        self.x
    }
    fn sweep(&self) -> Window {
        self.win
    }
}

/// (y, argmax): the first maximum, or the first NaN.
fn max_pool_ref(pl: &Pool, x: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let plane = pl.x[2] * pl.x[3];
    let (mut y, mut idx) = (vec![], vec![]);
    for (p, taps) in pl.windows() {
        let (mut best, mut at) = (f64::NEG_INFINITY, taps[0]);
        for &t in &taps {
            let v = x[p * plane + t];
            if !best.is_nan() && (v > best || v.is_nan()) {
                best = v;
                at = t;
            }
        }
        y.push(best);
        idx.push(at as f64);
    }
    (y, idx)
}

fn max_pool_backward_ref(pl: &Pool, dy: &[f64], idx: &[f64]) -> Vec<f64> {
    let plane = pl.x[2] * pl.x[3];
    let mut dx = vec![0.0; pl.x[0] * pl.x[1] * plane];
    for (i, ((p, _), g)) in pl.windows().iter().zip(dy).enumerate() {
        dx[p * plane + idx[i] as usize] += g;
    }
    dx
}

fn avg_pool_ref(pl: &Pool, x: &[f64]) -> Vec<f64> {
    let plane = pl.x[2] * pl.x[3];
    let div = (pl.win.k[0] * pl.win.k[1]) as f64;
    pl.windows().iter().map(|(p, taps)| taps.iter().map(|&t| x[p * plane + t]).sum::<f64>() / div).collect()
}

fn avg_pool_backward_ref(pl: &Pool, dy: &[f64]) -> Vec<f64> {
    let plane = pl.x[2] * pl.x[3];
    let div = (pl.win.k[0] * pl.win.k[1]) as f64;
    let mut dx = vec![0.0; pl.x[0] * pl.x[1] * plane];
    for ((p, taps), g) in pl.windows().iter().zip(dy) {
        for &t in taps {
            dx[p * plane + t] += g / div;
        }
    }
    dx
}

const POOL_SMALL: Pool = Pool { x: [2, 2, 7, 6], win: Window { k: [3, 2], stride: [2, 1], pad: [1, 1], dil: [1, 2] } };

#[test]
fn reference_pool_backwards_match_finite_differences() {
    let pl = POOL_SMALL;
    let mut rng = Rng(17);
    let x = rng.vec(pl.x_shape().iter().product(), 1.0);
    let dy = rng.vec(pl.y_shape().iter().product(), 1.0);
    let (_, idx) = max_pool_ref(&pl, &x);
    check_fd("max_pool", |x| dot(&max_pool_ref(&pl, x).0, &dy), &x, &max_pool_backward_ref(&pl, &dy, &idx));
    let pl = Pool { win: Window { dil: [1, 1], ..pl.win }, ..pl };
    check_fd("avg_pool", |x| dot(&avg_pool_ref(&pl, x), &dy), &x, &avg_pool_backward_ref(&pl, &dy));
}

#[rstest]
#[case::padded_dilated(POOL_SMALL)]
#[case::overlapping(Pool { x: [1, 3, 9, 8], win: Window { k: [3, 3], stride: [1, 1], pad: [1, 1], dil: [1, 1] } })]
#[case::large(Pool { x: [4, 16, 32, 32], win: Window { k: [2, 2], stride: [2, 2], pad: [0, 0], dil: [1, 1] } })]
fn max_pool(#[values(F32, F64, F16, BF16)] dtype: DType, #[values(Dense, Strided)] layout: Layout, #[case] pl: Pool) {
    let h = Harness::new();
    let mut rng = Rng(18);
    let (xs, ys) = (pl.x_shape(), pl.y_shape());
    let x = round(dtype, &rng.vec(xs.iter().product(), 4.0));
    let xt = h.input(dtype, &xs, layout, &x);
    let (yt, it) = (h.output(dtype, &ys, layout), h.output(I64, &ys, layout));
    h.ok(Op::MaxPool2d { window: pl.window() }, &[&xt], &[&yt, &it]);
    let (y, idx) = max_pool_ref(&pl, &x);
    assert_eq!(h.download(&yt), y, "y");
    assert_eq!(h.download(&it), idx, "argmax");

    let dy = round(dtype, &rng.vec(ys.iter().product(), 1.0));
    let (dyt, it) = (h.input(dtype, &ys, layout, &dy), h.input(I64, &ys, layout, &idx));
    let dxt = h.output(dtype, &xs, layout);
    h.ok(Op::MaxPool2dBackward { window: pl.window() }, &[&dyt, &it], &[&dxt]);
    assert_close("dx", &h.download(&dxt), &max_pool_backward_ref(&pl, &dy, &idx), 4.0 * eps(dtype));
}

#[rstest]
#[case::padded(Pool { win: Window { dil: [1, 1], ..POOL_SMALL.win }, ..POOL_SMALL })]
#[case::overlapping(Pool { x: [1, 3, 9, 8], win: Window { k: [3, 3], stride: [1, 1], pad: [1, 1], dil: [1, 1] } })]
#[case::large(Pool { x: [4, 16, 32, 32], win: Window { k: [3, 3], stride: [2, 2], pad: [1, 1], dil: [1, 1] } })]
fn avg_pool(#[values(F32, F64, F16, BF16)] dtype: DType, #[values(Dense, Strided)] layout: Layout, #[case] pl: Pool) {
    let h = Harness::new();
    let mut rng = Rng(19);
    let (xs, ys) = (pl.x_shape(), pl.y_shape());
    let x = round(dtype, &rng.vec(xs.iter().product(), 4.0));
    let xt = h.input(dtype, &xs, layout, &x);
    let yt = h.output(dtype, &ys, layout);
    // Average pooling has no dilation; an unset (0) field is accepted like 1.
    let window = Window2d { dilation: [0, 0], ..pl.window() };
    h.ok(Op::AvgPool2d { window }, &[&xt], &[&yt]);
    assert_close("y", &h.download(&yt), &avg_pool_ref(&pl, &x), 4.0 * eps_of_compute(dtype));

    let dy = round(dtype, &rng.vec(ys.iter().product(), 1.0));
    let dyt = h.input(dtype, &ys, layout, &dy);
    let dxt = h.output(dtype, &xs, layout);
    h.ok(Op::AvgPool2dBackward { window: pl.window() }, &[&dyt], &[&dxt]);
    assert_close("dx", &h.download(&dxt), &avg_pool_backward_ref(&pl, &dy), 4.0 * eps_of_compute(dtype));
}

#[rstest]
fn max_pool_picks_first_maximum_and_first_nan(#[values(F32, F64, F16, BF16)] dtype: DType) {
    let h = Harness::new();
    let pl = Pool { x: [1, 1, 2, 4], win: Window { k: [2, 2], stride: [2, 2], pad: [0, 0], dil: [1, 1] } };
    let ninf = f64::NEG_INFINITY;
    // Window 0: a tie (the first wins); window 1: two NaNs after a larger value (the first NaN wins).
    let x = [1.0, 3.0, 5.0, f64::NAN, 3.0, 2.0, f64::NAN, 9.0];
    let xt = h.input(dtype, &pl.x_shape(), Dense, &x);
    let (yt, it) = (h.output(dtype, &pl.y_shape(), Dense), h.output(I64, &pl.y_shape(), Dense));
    h.ok(Op::MaxPool2d { window: pl.window() }, &[&xt], &[&yt, &it]);
    let y = h.download(&yt);
    assert_eq!(y[0], 3.0);
    assert!(y[1].is_nan());
    assert_eq!(h.download(&it), vec![1.0, 3.0]);
    // An all -inf window still points at its first in-bounds element.
    let pl = Pool { x: [1, 1, 2, 2], win: Window { k: [2, 2], stride: [1, 1], pad: [1, 1], dil: [1, 1] } };
    let xt = h.input(dtype, &pl.x_shape(), Dense, &[ninf; 4]);
    let (yt, it) = (h.output(dtype, &pl.y_shape(), Dense), h.output(I64, &pl.y_shape(), Dense));
    h.ok(Op::MaxPool2d { window: pl.window() }, &[&xt], &[&yt, &it]);
    assert_eq!(h.download(&yt), vec![ninf; 9]);
    assert_eq!(h.download(&it), vec![0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 3.0]);
}

#[test]
fn pools_validate_operands() {
    let h = Harness::new();
    let pl = POOL_SMALL;
    let x = h.input(F32, &pl.x_shape(), Dense, &vec![0.0; pl.x_shape().iter().product()]);
    let (y, idx) = (h.output(F32, &pl.y_shape(), Dense), h.output(I64, &pl.y_shape(), Dense));
    let idx32 = h.output(F32, &pl.y_shape(), Dense);
    h.fails(Op::MaxPool2d { window: pl.window() }, &[&x], &[&y, &idx32], ErrorKind::DtypeMismatch);
    let [n, c, oh, ow] = pl.y_shape();
    let bad = h.output(F32, &[n, c, oh, ow + 1], Dense);
    h.fails(Op::MaxPool2d { window: pl.window() }, &[&x], &[&bad, &idx], ErrorKind::ShapeMismatch);
    h.fails(Op::AvgPool2d { window: pl.window() }, &[&x], &[&y], ErrorKind::InvalidArgument);
    let zero_stride = Window2d { stride: [0, 1], ..pl.window() };
    h.fails(Op::MaxPool2d { window: zero_stride }, &[&x], &[&y, &idx], ErrorKind::InvalidArgument);
    // A window that covers only padding has no argmax.
    let tiny = Pool { x: [1, 1, 2, 2], win: Window { k: [2, 1], stride: [1, 1], pad: [1, 0], dil: [3, 1] } };
    let (xt, yt, it) = (
        h.input(F32, &tiny.x_shape(), Dense, &[0.0; 4]),
        h.output(F32, &tiny.y_shape(), Dense),
        h.output(I64, &tiny.y_shape(), Dense),
    );
    let m = h.fails(Op::MaxPool2d { window: tiny.window() }, &[&xt], &[&yt, &it], ErrorKind::InvalidArgument);
    assert!(m.contains("padding"), "{m}");
    // Backward refuses an argmax outside the plane.
    let dy = h.input(F32, &pl.y_shape(), Dense, &vec![1.0; pl.y_shape().iter().product()]);
    let mut bad_idx = vec![0.0; pl.y_shape().iter().product()];
    bad_idx[3] = (pl.x[2] * pl.x[3]) as f64;
    let it = h.input(I64, &pl.y_shape(), Dense, &bad_idx);
    let dx = h.output(F32, &pl.x_shape(), Dense);
    h.fails(Op::MaxPool2dBackward { window: pl.window() }, &[&dy, &it], &[&dx], ErrorKind::InvalidArgument);
}
