//! 2-D convolution (grouped, strided, padded, dilated), forward and both backward ops, against
//! the f64 references below (see `common::fused` for the method and the tolerances).

mod common;

use common::fused::*;
use common::reference::*;
use genesis_backend_api::{DType, ErrorKind, Op, TensorDesc, Window2d};
use rstest::rstest;

#[derive(Debug, Clone, Copy)]
struct Conv {
    /// x's shape `(n, c, h, w)`.
    x: [usize; 4],
    win: Window,
    /// Output channels.
    o: usize,
    groups: usize,
}

impl Conv {
    fn w_shape(&self) -> [usize; 4] {
        [self.o, self.x[1] / self.groups, self.win.k[0], self.win.k[1]]
    }
    fn y_shape(&self) -> [usize; 4] {
        [self.x[0], self.o, self.out(0), self.out(1)]
    }
    /// Visit every (x index, weight index, y index) product of the convolution.
    fn for_each(&self, mut f: impl FnMut(usize, usize, usize)) {
        let [batch, c, h, w] = self.x;
        let (cg, og) = (c / self.groups, self.o / self.groups);
        let (oh, ow) = (self.out(0), self.out(1));
        for n in 0..batch {
            for oc in 0..self.o {
                let g = oc / og;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let yi = ((n * self.o + oc) * oh + oy) * ow + ox;
                        for ci in 0..cg {
                            for (ky, kx, t) in self.taps(oy, ox) {
                                let xi = (n * c + g * cg + ci) * h * w + t;
                                let wi = ((oc * cg + ci) * self.win.k[0] + ky) * self.win.k[1] + kx;
                                f(xi, wi, yi);
                            }
                        }
                    }
                }
            }
        }
    }
}

impl Sliding for Conv {
    fn x_shape(&self) -> [usize; 4] {
        self.x
    }
    fn sweep(&self) -> Window {
        self.win
    }
}

fn conv_ref(cv: &Conv, x: &[f64], w: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
    let mut y = vec![0.0; cv.y_shape().iter().product()];
    cv.for_each(|xi, wi, yi| y[yi] += x[xi] * w[wi]);
    if let Some(b) = bias {
        let plane = cv.out(0) * cv.out(1);
        for (i, v) in y.iter_mut().enumerate() {
            *v += b[i / plane % cv.o];
        }
    }
    y
}

/// (dx, dweight, dbias)
fn conv_backward_ref(cv: &Conv, x: &[f64], w: &[f64], dy: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; cv.o]);
    cv.for_each(|xi, wi, yi| {
        dx[xi] += dy[yi] * w[wi];
        dw[wi] += dy[yi] * x[xi];
    });
    let plane = cv.out(0) * cv.out(1);
    for (i, g) in dy.iter().enumerate() {
        db[i / plane % cv.o] += g;
    }
    (dx, dw, db)
}

const CONV_SMALL: Conv =
    Conv { x: [2, 4, 7, 6], win: Window { k: [3, 2], stride: [2, 1], pad: [1, 2], dil: [2, 1] }, o: 4, groups: 2 };

#[test]
fn reference_conv_backward_matches_finite_differences() {
    let cv = CONV_SMALL;
    let mut rng = Rng(15);
    let (x, w, b) =
        (rng.vec(cv.x_shape().iter().product(), 1.0), rng.vec(cv.w_shape().iter().product(), 1.0), rng.vec(cv.o, 1.0));
    let dy = rng.vec(cv.y_shape().iter().product(), 1.0);
    let (dx, dw, db) = conv_backward_ref(&cv, &x, &w, &dy);
    check_fd("dx", |x| dot(&conv_ref(&cv, x, &w, Some(&b)), &dy), &x, &dx);
    check_fd("dw", |w| dot(&conv_ref(&cv, &x, w, Some(&b)), &dy), &w, &dw);
    check_fd("db", |b| dot(&conv_ref(&cv, &x, &w, Some(b)), &dy), &b, &db);
}

#[rstest]
#[case::plain(Conv { x: [2, 3, 7, 6], win: Window { k: [3, 3], stride: [1, 1], pad: [1, 1], dil: [1, 1] }, o: 4, groups: 1 }, true)]
#[case::grouped_strided_dilated(CONV_SMALL, false)]
#[case::depthwise(Conv { x: [1, 6, 5, 5], win: Window { k: [3, 3], stride: [1, 2], pad: [1, 1], dil: [1, 1] }, o: 6, groups: 6 }, true)]
#[case::pointwise(Conv { x: [3, 5, 4, 3], win: Window { k: [1, 1], stride: [1, 1], pad: [0, 0], dil: [1, 1] }, o: 2, groups: 1 }, false)]
#[case::large(Conv { x: [3, 8, 16, 16], win: Window { k: [3, 3], stride: [1, 1], pad: [1, 1], dil: [1, 1] }, o: 8, groups: 1 }, true)]
fn conv2d(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[case] cv: Conv,
    #[case] with_bias: bool,
) {
    let h = Harness::new();
    let mut rng = Rng(16);
    let (xs, ws, ys) = (cv.x_shape(), cv.w_shape(), cv.y_shape());
    let x = round(dtype, &rng.vec(xs.iter().product(), 1.0));
    let w = round(dtype, &rng.vec(ws.iter().product(), 1.0));
    let b = round(dtype, &rng.vec(cv.o, 1.0));
    let (xt, wt, bt) =
        (h.input(dtype, &xs, layout, &x), h.input(dtype, &ws, layout, &w), h.input(dtype, &[cv.o], layout, &b));
    let yt = h.output(dtype, &ys, layout);
    let (window, groups) = (cv.window(), cv.groups as u32);
    let inputs: Vec<&TensorDesc> = if with_bias { vec![&xt, &wt, &bt] } else { vec![&xt, &wt] };
    h.ok(Op::Conv2d { window, groups }, &inputs, &[&yt]);
    let tol = 8.0 * eps_of_compute(dtype);
    assert_close("y", &h.download(&yt), &conv_ref(&cv, &x, &w, with_bias.then_some(&b[..])), tol);

    let dy = round(dtype, &rng.vec(ys.iter().product(), 1.0));
    let dyt = h.input(dtype, &ys, layout, &dy);
    let (dx, dw, db) = conv_backward_ref(&cv, &x, &w, &dy);
    let dxt = h.output(dtype, &xs, layout);
    h.ok(Op::Conv2dBackwardInput { window, groups }, &[&dyt, &wt], &[&dxt]);
    assert_close("dx", &h.download(&dxt), &dx, tol);
    let (dwt, dbt) = (h.output(dtype, &ws, layout), h.output(dtype, &[cv.o], layout));
    let outputs: Vec<&TensorDesc> = if with_bias { vec![&dwt, &dbt] } else { vec![&dwt] };
    h.ok(Op::Conv2dBackwardWeight { window, groups }, &[&dyt, &xt], &outputs);
    assert_close("dweight", &h.download(&dwt), &dw, tol);
    if with_bias {
        assert_close("dbias", &h.download(&dbt), &db, tol);
    }
}

#[test]
fn conv2d_validates_geometry() {
    let h = Harness::new();
    let cv = CONV_SMALL;
    let (window, groups) = (cv.window(), cv.groups as u32);
    let x = h.input(F32, &cv.x_shape(), Dense, &vec![0.0; cv.x_shape().iter().product()]);
    let w = h.input(F32, &cv.w_shape(), Dense, &vec![0.0; cv.w_shape().iter().product()]);
    let [n, o, oh, ow] = cv.y_shape();
    let y = h.output(F32, &[n, o, oh, ow], Dense);
    let bad = h.output(F32, &[n, o, oh + 1, ow], Dense);
    let m = h.fails(Op::Conv2d { window, groups }, &[&x, &w], &[&bad], ErrorKind::ShapeMismatch);
    assert!(m.contains("conv2d") && m.contains(&format!("{:?}", [n, o, oh, ow])), "{m}");
    h.fails(Op::Conv2d { window, groups: 3 }, &[&x, &w], &[&y], ErrorKind::InvalidArgument);
    h.fails(Op::Conv2d { window, groups: 1 }, &[&x, &w], &[&y], ErrorKind::ShapeMismatch);
    let unset = Window2d { dilation: [0, 0], ..window };
    h.fails(Op::Conv2d { window: unset, groups }, &[&x, &w], &[&y], ErrorKind::InvalidArgument);
    // (Axis 0: the wire form packs `groups` into the high half of dilation[1].)
    let huge = Window2d { dilation: [i64::MAX, 1], ..window };
    h.fails(Op::Conv2d { window: huge, groups }, &[&x, &w], &[&y], ErrorKind::InvalidArgument);
    let b = h.input(F32, &[o + 1], Dense, &vec![0.0; o + 1]);
    h.fails(Op::Conv2d { window, groups }, &[&x, &w, &b], &[&y], ErrorKind::ShapeMismatch);
    let w16 = h.input(F16, &cv.w_shape(), Dense, &vec![0.0; cv.w_shape().iter().product()]);
    h.fails(Op::Conv2d { window, groups }, &[&x, &w16], &[&y], ErrorKind::DtypeMismatch);
    let dx = h.output(F32, &cv.x_shape(), Dense);
    h.fails(Op::Conv2dBackwardInput { window, groups }, &[&bad, &w], &[&dx], ErrorKind::ShapeMismatch);
}
