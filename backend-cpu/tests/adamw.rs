//! The AdamW step against the f64 reference below (see `common::fused` for the method and the
//! tolerances).

mod common;

use common::fused::*;
use genesis_backend_api::{DType, ErrorKind, Op, TensorDesc};
use rstest::rstest;

struct Adam {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    wd: f64,
}

/// One step in f64 from the given state; returns (param, m, v).
fn adamw_ref(a: &Adam, step: u64, p: &[f64], m: &[f64], v: &[f64], g: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let bc1 = 1.0 - a.beta1.powi(step as i32);
    let bc2 = 1.0 - a.beta2.powi(step as i32);
    let mut out = (vec![], vec![], vec![]);
    for i in 0..p.len() {
        let mi = a.beta1 * m[i] + (1.0 - a.beta1) * g[i];
        let vi = a.beta2 * v[i] + (1.0 - a.beta2) * g[i] * g[i];
        let pi = p[i] * (1.0 - a.lr * a.wd) - a.lr / bc1 * mi / (vi.sqrt() / bc2.sqrt() + a.eps);
        out.0.push(pi);
        out.1.push(mi);
        out.2.push(vi);
    }
    out
}

#[rstest]
fn adamw(#[values(F32, F64, F16, BF16)] dtype: DType, #[values(Dense, Strided)] layout: Layout) {
    let h = Harness::new();
    let mut rng = Rng(9);
    let a = Adam { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, wd: 0.1 };
    // Two groups: moments in the param's dtype, and in f32; one large enough to go parallel.
    let groups = [(vec![3usize, 4], dtype), (vec![40_000usize], F32)];
    let mut state: Vec<[Vec<f64>; 3]> = groups
        .iter()
        .map(|(shape, mdt)| {
            let n = shape.iter().product();
            [
                round(dtype, &rng.vec(n, 1.0)),
                round(*mdt, &rng.vec(n, 0.1)),
                round(*mdt, &rng.vec(n, 0.01).iter().map(|v| v.abs()).collect::<Vec<_>>()),
            ]
        })
        .collect();
    let tensors: Vec<[TensorDesc; 3]> = groups
        .iter()
        .zip(&state)
        .map(|((shape, mdt), [p, m, v])| {
            [h.input(dtype, shape, layout, p), h.input(*mdt, shape, layout, m), h.input(*mdt, shape, layout, v)]
        })
        .collect();
    for step in 1..=3u64 {
        let grads: Vec<Vec<f64>> =
            groups.iter().map(|(s, _)| round(dtype, &rng.vec(s.iter().product(), 1.0))).collect();
        let gt: Vec<TensorDesc> = groups.iter().zip(&grads).map(|((s, _), g)| h.input(dtype, s, layout, g)).collect();
        let op = Op::AdamW { lr: a.lr, beta1: a.beta1, beta2: a.beta2, eps: a.eps, weight_decay: a.wd, step };
        let outs: Vec<&TensorDesc> = tensors.iter().flatten().collect();
        h.ok(op, &gt.iter().collect::<Vec<_>>(), &outs);
        for (i, ((_, mdt), ts)) in groups.iter().zip(&tensors).enumerate() {
            let [p, m, v] = &state[i];
            let (wp, wm, wv) = adamw_ref(&a, step, p, m, v, &grads[i]);
            let got: Vec<Vec<f64>> = ts.iter().map(|t| h.download(t)).collect();
            assert_close(&format!("param {i} step {step}"), &got[0], &wp, 4.0 * eps_of_compute(dtype));
            assert_close(&format!("exp_avg {i} step {step}"), &got[1], &wm, 4.0 * eps_of_compute(*mdt));
            assert_close(&format!("exp_avg_sq {i} step {step}"), &got[2], &wv, 4.0 * eps_of_compute(*mdt));
            state[i] = [got[0].clone(), got[1].clone(), got[2].clone()];
        }
    }
}

#[test]
fn adamw_validates_operands() {
    let h = Harness::new();
    let g = h.input(F32, &[4], Dense, &[0.5; 4]);
    let (p, m, v) = (
        h.input(F32, &[4], Dense, &[1.0; 4]),
        h.input(F32, &[4], Dense, &[0.0; 4]),
        h.input(F32, &[4], Dense, &[0.0; 4]),
    );
    let op = |step| Op::AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, step };
    let m0 = h.fails(op(0), &[&g], &[&p, &m, &v], ErrorKind::InvalidArgument);
    assert!(m0.contains("step"), "{m0}");
    h.fails(op(1), &[&g], &[&p, &m], ErrorKind::InvalidArgument);
    // The grad aliasing its param, or two outputs sharing memory, is refused.
    h.fails(op(1), &[&p], &[&p, &m, &v], ErrorKind::InvalidArgument);
    h.fails(op(1), &[&g], &[&p, &m, &m], ErrorKind::InvalidArgument);
    let m16 = h.input(F16, &[4], Dense, &[0.0; 4]);
    h.fails(op(1), &[&g], &[&p, &m16, &v], ErrorKind::DtypeMismatch);
    let p5 = h.input(F32, &[5], Dense, &[0.0; 5]);
    h.fails(op(1), &[&g], &[&p5, &m, &v], ErrorKind::ShapeMismatch);
    let bad_beta = Op::AdamW { lr: 1e-3, beta1: 1.0, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, step: 1 };
    h.fails(bad_beta, &[&g], &[&p, &m, &v], ErrorKind::InvalidArgument);
    // Nothing was modified by the refused calls.
    assert_eq!(h.download(&p), vec![1.0; 4]);
    h.ok(op(1), &[], &[]);
}
