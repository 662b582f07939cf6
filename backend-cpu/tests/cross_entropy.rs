//! Cross-entropy (with ignored targets and label smoothing), forward and backward, against the
//! f64 references below (see `common::fused` for the method and the tolerances).

mod common;

use common::fused::*;
use common::reference::*;
use genesis_backend_api::{DType, ErrorKind, Op};
use rstest::rstest;

const IGNORE: i64 = -100;

/// (loss, lse)
fn cross_entropy_ref(x: &[f64], target: &[i64], c: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let (mut loss, mut lse) = (vec![], vec![]);
    for (r, &t) in x.chunks(c).zip(target) {
        let (m, s) = max_and_exp_sum(r);
        let l = m + s.ln();
        lse.push(l);
        let mean = r.iter().sum::<f64>() / c as f64;
        loss.push(if t == IGNORE { 0.0 } else { (1.0 - eps) * (l - r[t as usize]) + eps * (l - mean) });
    }
    (loss, lse)
}

fn cross_entropy_backward_ref(x: &[f64], target: &[i64], lse: &[f64], dloss: &[f64], c: usize, eps: f64) -> Vec<f64> {
    let mut out = vec![];
    for (i, (r, &t)) in x.chunks(c).zip(target).enumerate() {
        for (j, v) in r.iter().enumerate() {
            out.push(if t == IGNORE {
                0.0
            } else {
                let onehot = if j as i64 == t { 1.0 - eps } else { 0.0 };
                dloss[i] * ((v - lse[i]).exp() - onehot - eps / c as f64)
            });
        }
    }
    out
}

#[test]
fn reference_cross_entropy_backward_matches_finite_differences() {
    let mut rng = Rng(7);
    let (n, c) = (4, 5);
    let x = rng.vec(n * c, 3.0);
    let target = [2, IGNORE, 0, 4];
    let dloss = rng.vec(n, 1.0);
    for eps in [0.0, 0.2] {
        let (_, lse) = cross_entropy_ref(&x, &target, c, eps);
        let grad = cross_entropy_backward_ref(&x, &target, &lse, &dloss, c, eps);
        check_fd("cross_entropy", |x| dot(&cross_entropy_ref(x, &target, c, eps).0, &dloss), &x, &grad);
    }
}

#[rstest]
fn cross_entropy(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(0.0, 0.1)] smoothing: f64,
    #[values((6, 5), (70, 500))] nc: (usize, usize),
) {
    let (n, c) = nc;
    let h = Harness::new();
    let mut rng = Rng(8);
    let mut x = rng.vec(n * c, 4.0);
    x[..c].iter_mut().for_each(|v| *v += 100.0);
    let x = round(dtype, &x);
    let target: Vec<i64> = (0..n).map(|i| if i % 4 == 1 { IGNORE } else { (rng.next() % c as u64) as i64 }).collect();
    let target_f: Vec<f64> = target.iter().map(|&t| t as f64).collect();
    let op = Op::CrossEntropy { ignore_index: IGNORE, label_smoothing: smoothing };
    let (xt, tt) = (h.input(dtype, &[n, c], layout, &x), h.input(I64, &[n], layout, &target_f));
    let (lt, st) = (h.output(F32, &[n], layout), h.output(F32, &[n], layout));
    h.ok(op, &[&xt, &tt], &[&lt, &st]);
    let (loss, lse) = cross_entropy_ref(&x, &target, c, smoothing);
    assert_close("loss", &h.download(&lt), &loss, STAT_TOL);
    assert_close("lse", &h.download(&st), &lse, STAT_TOL);

    let lse = round(F32, &lse);
    let dloss = round(F32, &rng.vec(n, 1.0));
    let (st, dt) = (h.input(F32, &[n], layout, &lse), h.input(F32, &[n], layout, &dloss));
    let gt = h.output(dtype, &[n, c], layout);
    let op = Op::CrossEntropyBackward { ignore_index: IGNORE, label_smoothing: smoothing };
    h.ok(op, &[&xt, &tt, &st, &dt], &[&gt]);
    let want = cross_entropy_backward_ref(&x, &target, &lse, &dloss, c, smoothing);
    assert_close("dlogits", &h.download(&gt), &want, 8.0 * eps_of_compute(dtype));
}

#[test]
fn cross_entropy_refuses_targets_out_of_range() {
    let h = Harness::new();
    let x = h.input(F32, &[2, 3], Dense, &[0.0; 6]);
    let (loss, lse) = (h.output(F32, &[2], Dense), h.output(F32, &[2], Dense));
    let dloss = h.input(F32, &[2], Dense, &[1.0; 2]);
    let dx = h.output(F32, &[2, 3], Dense);
    for bad in [3.0, -1.0] {
        let t = h.input(I64, &[2], Dense, &[0.0, bad]);
        let op = Op::CrossEntropy { ignore_index: IGNORE, label_smoothing: 0.0 };
        let m = h.fails(op, &[&x, &t], &[&loss, &lse], ErrorKind::InvalidArgument);
        assert!(m.contains(&format!("{}", bad as i64)), "{m}");
        let op = Op::CrossEntropyBackward { ignore_index: IGNORE, label_smoothing: 0.0 };
        h.fails(op, &[&x, &t, &lse, &dloss], &[&dx], ErrorKind::InvalidArgument);
    }
    // -1 is fine when it is the ignore index, and its row's loss is 0.
    let t = h.input(I64, &[2], Dense, &[0.0, -1.0]);
    h.ok(Op::CrossEntropy { ignore_index: -1, label_smoothing: 0.0 }, &[&x, &t], &[&loss, &lse]);
    assert_close("loss", &h.download(&loss), &[3f64.ln(), 0.0], STAT_TOL);
    let op = Op::CrossEntropy { ignore_index: IGNORE, label_smoothing: 1.0 };
    h.fails(op, &[&x, &t], &[&loss, &lse], ErrorKind::InvalidArgument);
    let t32 = h.input(F32, &[2], Dense, &[0.0; 2]);
    h.fails(
        Op::CrossEntropy { ignore_index: -1, label_smoothing: 0.0 },
        &[&x, &t32],
        &[&loss, &lse],
        ErrorKind::DtypeMismatch,
    );
}
