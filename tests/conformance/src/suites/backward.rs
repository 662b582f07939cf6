//! Suite `backward`: the interface's backward ops against the oracle's vector-Jacobian
//! products (themselves checked by finite differences in the oracle's tests). Each depends
//! on its forward op passing for the dtype.

use super::op_cases;
use crate::case::{Case, OpCase, Tier};
use crate::gen::{tensor, ValueRange};
use crate::oracle::nn::{
    cross_entropy, cross_entropy_vjp, layer_norm, layer_norm_vjp, log_softmax, log_softmax_vjp, rms_norm, rms_norm_vjp,
    softmax, softmax_vjp,
};
use crate::target::{Layout, Spec, Target};
use crate::tolerance::Expected;
use crate::values::{quantize, quantize_all, short_name, FLOATS};
use genesis_backend_api::{DType, Op};

/// Layer/RMS norm and cross-entropy save f32 statistics (mean, rstd, lse) even for f64
/// tensors, so their f64 backward can only be as accurate as f32.
fn stats_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F32
    } else {
        dtype
    }
}

fn after(forward: &'static str) -> impl Fn(DType) -> Vec<String> {
    move |d| vec![format!("nn/{forward}/{}/", short_name(d))]
}

pub fn cases(t: &Target) -> Vec<Case> {
    let mut cases = Vec::new();
    for (name, forward, op) in [
        ("softmax_backward", "softmax", Op::SoftmaxBackward),
        ("log_softmax_backward", "log_softmax", Op::LogSoftmaxBackward),
    ] {
        cases.extend(op_cases(t, "backward", name, op.kind(), &FLOATS, &after(forward), &|dtype, rng| {
            [(vec![4usize, 7], "rows4x7"), (vec![3, 130], "odd3x130")]
                .into_iter()
                .map(|(shape, sample)| {
                    let n = shape[1];
                    let x = tensor(rng, dtype, &shape, Layout::Contiguous, ValueRange::normal(2.0));
                    let y = quantize_all(
                        dtype,
                        &if op == Op::SoftmaxBackward { softmax(&x.values, n) } else { log_softmax(&x.values, n) },
                    );
                    let dy = tensor(rng, dtype, &shape, Layout::Transposed, ValueRange::normal(1.0));
                    let dx = if op == Op::SoftmaxBackward {
                        softmax_vjp(&y, &dy.values, n)
                    } else {
                        log_softmax_vjp(&y, &dy.values, n)
                    };
                    let exp = Expected::normalized(dtype, dx, n, 2.0);
                    let ys = Spec::new(dtype, &shape, y);
                    (
                        sample.to_string(),
                        Tier::Core,
                        OpCase {
                            op,
                            inputs: vec![ys, dy],
                            outputs: vec![Spec::out(dtype, &shape)],
                            expected: vec![Some(exp)],
                        },
                    )
                })
                .collect()
        }));
    }
    let eps = 1e-5;
    cases.extend(op_cases(
        t,
        "backward",
        "layer_norm_backward",
        Op::LayerNormBackward.kind(),
        &FLOATS,
        &after("layer_norm"),
        &|dtype, rng| {
            let (rows, n) = (6usize, 24usize);
            let x = tensor(rng, dtype, &[rows, n], Layout::Contiguous, ValueRange::normal(2.0));
            let w = tensor(rng, dtype, &[n], Layout::Contiguous, ValueRange::normal(1.0));
            let dy = tensor(rng, dtype, &[rows, n], Layout::Strided, ValueRange::normal(1.0));
            let (_, mean, rstd) = layer_norm(&x.values, &w.values, &vec![0.0; n], n, eps);
            let (mean, rstd) = (quantize_all(DType::F32, &mean), quantize_all(DType::F32, &rstd));
            let (dx, dw, db) = layer_norm_vjp(&x.values, &w.values, &dy.values, n, eps);
            let inputs = vec![dy, x, w, Spec::new(DType::F32, &[rows], mean), Spec::new(DType::F32, &[rows], rstd)];
            let outs = vec![Spec::out(dtype, &[rows, n]), Spec::out(dtype, &[n]), Spec::out(dtype, &[n])];
            let exp = vec![
                Some(Expected::normalized(stats_dtype(dtype), dx, n, 2.0)),
                Some(Expected::normalized(stats_dtype(dtype), dw, rows, 2.0)),
                Some(Expected::normalized(stats_dtype(dtype), db, rows, 2.0)),
            ];
            vec![(
                "rows6x24".to_string(),
                Tier::Core,
                OpCase { op: Op::LayerNormBackward, inputs, outputs: outs, expected: exp },
            )]
        },
    ));
    cases.extend(op_cases(
        t,
        "backward",
        "rms_norm_backward",
        Op::RmsNormBackward.kind(),
        &FLOATS,
        &after("rms_norm"),
        &|dtype, rng| {
            let (rows, n) = (5usize, 33usize);
            let x = tensor(rng, dtype, &[rows, n], Layout::Offset, ValueRange::normal(2.0));
            let w = tensor(rng, dtype, &[n], Layout::Contiguous, ValueRange::normal(1.0));
            let dy = tensor(rng, dtype, &[rows, n], Layout::Contiguous, ValueRange::normal(1.0));
            let (_, rstd) = rms_norm(&x.values, &w.values, n, eps);
            let (dx, dw) = rms_norm_vjp(&x.values, &w.values, &dy.values, n, eps);
            let inputs = vec![dy, x, w, Spec::new(DType::F32, &[rows], quantize_all(DType::F32, &rstd))];
            let outs = vec![Spec::out(dtype, &[rows, n]), Spec::out(dtype, &[n])];
            let exp = vec![
                Some(Expected::normalized(stats_dtype(dtype), dx, n, 2.0)),
                Some(Expected::normalized(stats_dtype(dtype), dw, rows, 2.0)),
            ];
            vec![(
                "rows5x33".to_string(),
                Tier::Core,
                OpCase { op: Op::RmsNormBackward, inputs, outputs: outs, expected: exp },
            )]
        },
    ));
    let ceb = |label_smoothing| Op::CrossEntropyBackward { ignore_index: -100, label_smoothing };
    cases.extend(op_cases(
        t,
        "backward",
        "cross_entropy_backward",
        ceb(0.0).kind(),
        &FLOATS,
        &after("cross_entropy"),
        &|dtype, rng| {
            [(0.0, "plain"), (0.1, "label_smoothing")]
                .into_iter()
                .map(|(smoothing, sample)| {
                    let (n, c) = (6usize, 10usize);
                    let x = tensor(rng, dtype, &[n, c], Layout::Contiguous, ValueRange::normal(3.0));
                    let mut target: Vec<f64> = (0..n).map(|_| rng.below(c) as f64).collect();
                    target[4] = -100.0;
                    let (_, lse) = cross_entropy(&x.values, &target, c, -100, smoothing);
                    let dloss: Vec<f64> = (0..n).map(|_| quantize(DType::F32, rng.normal())).collect();
                    let d = cross_entropy_vjp(&x.values, &target, &dloss, c, -100, smoothing);
                    let inputs = vec![
                        x,
                        Spec::new(DType::I64, &[n], target),
                        Spec::new(DType::F32, &[n], quantize_all(DType::F32, &lse)),
                        Spec::new(DType::F32, &[n], dloss),
                    ];
                    let exp = Expected::normalized(stats_dtype(dtype), d, c, 2.0);
                    (
                        sample.to_string(),
                        Tier::Core,
                        OpCase {
                            op: ceb(smoothing),
                            inputs,
                            outputs: vec![Spec::out(dtype, &[n, c])],
                            expected: vec![Some(exp)],
                        },
                    )
                })
                .collect()
        },
    ));
    cases
}
