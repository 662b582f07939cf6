//! LayerNorm and RmsNorm, forward and backward, and AddRmsNorm, against the f64 references
//! below (see
//! `common::fused` for the method and the tolerances).

mod common;

use common::fused::*;
use common::reference::*;
use genesis_backend_api::{DType, ErrorKind, Op};
use rstest::rstest;

/// (y, mean, rstd)
fn layer_norm_ref(x: &[f64], w: &[f64], b: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = w.len();
    let (mut y, mut mean, mut rstd) = (vec![], vec![], vec![]);
    for r in x.chunks(d) {
        let mu = r.iter().sum::<f64>() / d as f64;
        let var = r.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / d as f64;
        let rs = 1.0 / (var + eps).sqrt();
        y.extend(r.iter().zip(w).zip(b).map(|((v, w), b)| (v - mu) * rs * w + b));
        mean.push(mu);
        rstd.push(rs);
    }
    (y, mean, rstd)
}

/// (dx, dweight, dbias) from the saved statistics, PyTorch's formula.
fn layer_norm_backward_ref(
    dy: &[f64],
    x: &[f64],
    w: &[f64],
    mean: &[f64],
    rstd: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = w.len();
    let (mut dx, mut dw, mut db) = (vec![], vec![0.0; d], vec![0.0; d]);
    for (i, (xr, gr)) in x.chunks(d).zip(dy.chunks(d)).enumerate() {
        let xhat: Vec<f64> = xr.iter().map(|v| (v - mean[i]) * rstd[i]).collect();
        let g: Vec<f64> = gr.iter().zip(w).map(|(a, b)| a * b).collect();
        let mg = g.iter().sum::<f64>() / d as f64;
        let mgx = dot(&g, &xhat) / d as f64;
        dx.extend((0..d).map(|j| rstd[i] * (g[j] - mg - xhat[j] * mgx)));
        for j in 0..d {
            dw[j] += gr[j] * xhat[j];
            db[j] += gr[j];
        }
    }
    (dx, dw, db)
}

/// (y, rstd)
fn rms_norm_ref(x: &[f64], w: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>) {
    let d = w.len();
    let (mut y, mut rstd) = (vec![], vec![]);
    for r in x.chunks(d) {
        let rs = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
        y.extend(r.iter().zip(w).map(|(v, w)| v * rs * w));
        rstd.push(rs);
    }
    (y, rstd)
}

fn rms_norm_backward_ref(dy: &[f64], x: &[f64], w: &[f64], rstd: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let d = w.len();
    let (mut dx, mut dw) = (vec![], vec![0.0; d]);
    for (i, (xr, gr)) in x.chunks(d).zip(dy.chunks(d)).enumerate() {
        let xhat: Vec<f64> = xr.iter().map(|v| v * rstd[i]).collect();
        let g: Vec<f64> = gr.iter().zip(w).map(|(a, b)| a * b).collect();
        let mgx = dot(&g, &xhat) / d as f64;
        dx.extend((0..d).map(|j| rstd[i] * (g[j] - xhat[j] * mgx)));
        for j in 0..d {
            dw[j] += gr[j] * xhat[j];
        }
    }
    (dx, dw)
}

#[test]
fn reference_norm_backwards_match_finite_differences() {
    let mut rng = Rng(4);
    let (d, rows, eps) = (5, 3, 1e-5);
    let (x, w, b, dy) = (rng.vec(rows * d, 2.0), rng.vec(d, 1.0), rng.vec(d, 1.0), rng.vec(rows * d, 1.0));
    let (_, mean, rstd) = layer_norm_ref(&x, &w, &b, eps);
    let (dx, dw, db) = layer_norm_backward_ref(&dy, &x, &w, &mean, &rstd);
    check_fd("layer_norm dx", |x| dot(&layer_norm_ref(x, &w, &b, eps).0, &dy), &x, &dx);
    check_fd("layer_norm dw", |w| dot(&layer_norm_ref(&x, w, &b, eps).0, &dy), &w, &dw);
    check_fd("layer_norm db", |b| dot(&layer_norm_ref(&x, &w, b, eps).0, &dy), &b, &db);
    let (_, rstd) = rms_norm_ref(&x, &w, eps);
    let (dx, dw) = rms_norm_backward_ref(&dy, &x, &w, &rstd);
    check_fd("rms_norm dx", |x| dot(&rms_norm_ref(x, &w, eps).0, &dy), &x, &dx);
    check_fd("rms_norm dw", |w| dot(&rms_norm_ref(&x, w, eps).0, &dy), &w, &dw);
}

#[rstest]
fn layer_norm(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(&[4, 3, 10][..], &[300, 128][..])] shape: &[usize],
) {
    let h = Harness::new();
    let mut rng = Rng(5);
    let (n, d) = (shape.iter().product::<usize>(), shape[shape.len() - 1]);
    let lead = &shape[..shape.len() - 1];
    let mut x = rng.vec(n, 2.0);
    // A row far from zero: the variance must come from deviations, not E[x²] - E[x]².
    x[..d].iter_mut().for_each(|v| *v += 30.0);
    let (x, w, b) = (round(dtype, &x), round(dtype, &rng.vec(d, 1.5)), round(dtype, &rng.vec(d, 1.0)));
    let eps = 1e-5;
    let (xt, wt, bt) =
        (h.input(dtype, shape, layout, &x), h.input(dtype, &[d], layout, &w), h.input(dtype, &[d], layout, &b));
    let (yt, mt, rt) = (h.output(dtype, shape, layout), h.output(F32, lead, layout), h.output(F32, lead, layout));
    h.ok(Op::LayerNorm { eps }, &[&xt, &wt, &bt], &[&yt, &mt, &rt]);
    let (y, mean, rstd) = layer_norm_ref(&x, &w, &b, eps);
    assert_close("y", &h.download(&yt), &y, 8.0 * eps_of_compute(dtype));
    assert_close("mean", &h.download(&mt), &mean, STAT_TOL);
    assert_close("rstd", &h.download(&rt), &rstd, STAT_TOL);

    // Backward from the saved (f32) statistics, which the reference uses too.
    let (mean, rstd) = (round(F32, &mean), round(F32, &rstd));
    let dy = round(dtype, &rng.vec(n, 1.0));
    let dyt = h.input(dtype, shape, layout, &dy);
    let (mt, rt) = (h.input(F32, lead, layout, &mean), h.input(F32, lead, layout, &rstd));
    let (dxt, dwt, dbt) =
        (h.output(dtype, shape, layout), h.output(dtype, &[d], layout), h.output(dtype, &[d], layout));
    h.ok(Op::LayerNormBackward, &[&dyt, &xt, &wt, &mt, &rt], &[&dxt, &dwt, &dbt]);
    let (dx, dw, db) = layer_norm_backward_ref(&dy, &x, &w, &mean, &rstd);
    assert_close("dx", &h.download(&dxt), &dx, 16.0 * eps_of_compute(dtype));
    assert_close("dweight", &h.download(&dwt), &dw, 16.0 * eps_of_compute(dtype));
    assert_close("dbias", &h.download(&dbt), &db, 16.0 * eps_of_compute(dtype));
}

#[rstest]
fn rms_norm(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(&[4, 3, 10][..], &[300, 128][..])] shape: &[usize],
) {
    let h = Harness::new();
    let mut rng = Rng(6);
    let (n, d) = (shape.iter().product::<usize>(), shape[shape.len() - 1]);
    let lead = &shape[..shape.len() - 1];
    let (x, w) = (round(dtype, &rng.vec(n, 2.0)), round(dtype, &rng.vec(d, 1.5)));
    let eps = 1e-6;
    let (xt, wt) = (h.input(dtype, shape, layout, &x), h.input(dtype, &[d], layout, &w));
    let (yt, rt) = (h.output(dtype, shape, layout), h.output(F32, lead, layout));
    h.ok(Op::RmsNorm { eps }, &[&xt, &wt], &[&yt, &rt]);
    let (y, rstd) = rms_norm_ref(&x, &w, eps);
    assert_close("y", &h.download(&yt), &y, 8.0 * eps_of_compute(dtype));
    assert_close("rstd", &h.download(&rt), &rstd, STAT_TOL);

    let rstd = round(F32, &rstd);
    let dy = round(dtype, &rng.vec(n, 1.0));
    let (dyt, rt) = (h.input(dtype, shape, layout, &dy), h.input(F32, lead, layout, &rstd));
    let (dxt, dwt) = (h.output(dtype, shape, layout), h.output(dtype, &[d], layout));
    h.ok(Op::RmsNormBackward, &[&dyt, &xt, &wt, &rt], &[&dxt, &dwt]);
    let (dx, dw) = rms_norm_backward_ref(&dy, &x, &w, &rstd);
    assert_close("dx", &h.download(&dxt), &dx, 16.0 * eps_of_compute(dtype));
    assert_close("dweight", &h.download(&dwt), &dw, 16.0 * eps_of_compute(dtype));
}

#[rstest]
fn add_rms_norm(#[values(F32, F64, F16, BF16)] dtype: DType, #[values(Dense, Strided)] layout: Layout) {
    let h = Harness::new();
    let mut rng = Rng(7);
    let (shape, d) = ([5usize, 24], 24);
    let n = shape.iter().product::<usize>();
    let (x, r, w) = (round(dtype, &rng.vec(n, 2.0)), round(dtype, &rng.vec(n, 2.0)), round(dtype, &rng.vec(d, 1.5)));
    let eps = 1e-6;
    let (xt, res, wt) =
        (h.input(dtype, &shape, layout, &x), h.input(dtype, &shape, Dense, &r), h.input(dtype, &[d], layout, &w));
    let (yt, st, rt) = (h.output(dtype, &shape, layout), h.output(dtype, &shape, Dense), h.output(F32, &[5], layout));
    h.ok(Op::AddRmsNorm { eps }, &[&xt, &res, &wt], &[&yt, &st, &rt]);
    // The sum is rounded to the dtype before it is normalized.
    let sum = round(dtype, &x.iter().zip(&r).map(|(a, b)| a + b).collect::<Vec<_>>());
    assert_eq!(h.download(&st), sum);
    let (y, rstd) = rms_norm_ref(&sum, &w, eps);
    assert_close("y", &h.download(&yt), &y, 8.0 * eps_of_compute(dtype));
    assert_close("rstd", &h.download(&rt), &rstd, STAT_TOL);
    let r3 = h.input(dtype, &[5, 3, 8], Dense, &r);
    let m = h.fails(Op::AddRmsNorm { eps }, &[&xt, &r3, &wt], &[&yt, &st, &rt], ErrorKind::ShapeMismatch);
    assert!(m.contains("add_rms_norm") && m.contains("residual"), "{m}");
}

#[test]
fn norms_validate_operands() {
    let h = Harness::new();
    let x = h.input(F32, &[2, 4], Dense, &[1.0; 8]);
    let w3 = h.input(F32, &[3], Dense, &[1.0; 3]);
    let w4 = h.input(F32, &[4], Dense, &[1.0; 4]);
    let w4h = h.input(F16, &[4], Dense, &[1.0; 4]);
    let y = h.output(F32, &[2, 4], Dense);
    let (r2, r3, r2h) = (h.output(F32, &[2], Dense), h.output(F32, &[3], Dense), h.output(F16, &[2], Dense));
    let m = h.fails(Op::RmsNorm { eps: 1e-5 }, &[&x, &w3], &[&y, &r2], ErrorKind::ShapeMismatch);
    assert!(m.contains("rms_norm") && m.contains("[3]"), "{m}");
    h.fails(Op::RmsNorm { eps: 1e-5 }, &[&x, &w4], &[&y, &r3], ErrorKind::ShapeMismatch);
    h.fails(Op::RmsNorm { eps: 1e-5 }, &[&x, &w4], &[&y, &r2h], ErrorKind::DtypeMismatch);
    h.fails(Op::RmsNorm { eps: 1e-5 }, &[&x, &w4h], &[&y, &r2], ErrorKind::DtypeMismatch);
    h.fails(Op::RmsNorm { eps: -1.0 }, &[&x, &w4], &[&y, &r2], ErrorKind::InvalidArgument);
    h.fails(Op::LayerNorm { eps: 1e-5 }, &[&x, &w4], &[&y, &r2], ErrorKind::InvalidArgument);
}
