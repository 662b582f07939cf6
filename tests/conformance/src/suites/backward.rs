//! Suite `backward`: the interface's backward ops against the oracle's vector-Jacobian
//! products (themselves checked by finite differences in the oracle's tests). Each depends
//! on its forward op passing for the dtype.

use super::nn::{attention_inputs, cross_entropy_sample, CROSS_ENTROPY_SAMPLES};
use super::{only_sample, op_cases, Builder};
use crate::case::{Case, OpCase, Tier};
use crate::gen::{tensor, ValueRange};
use crate::oracle::conv::{
    avg_pool2d_vjp, conv2d_vjp_input, conv2d_vjp_weight, conv_out, max_pool2d, max_pool2d_vjp, out_len,
};
use crate::oracle::nn::{
    attention, attention_vjp, batch_norm, batch_norm_vjp, cross_entropy_vjp, layer_norm, layer_norm_vjp, log_softmax,
    log_softmax_vjp, rms_norm, rms_norm_vjp, softmax, softmax_vjp, swiglu_vjp,
};
use crate::target::{Layout, Spec, Target};
use crate::tolerance::Expected;
use crate::values::{quantize, quantize_all, short_name, ulp, unit_roundoff, FLOATS};
use genesis_backend_api::sdk::checks::AttentionDims;
use genesis_backend_api::{DType, Op, Window2d};

/// Layer/RMS norm and cross-entropy save f32 statistics (mean, rstd, lse) even for f64
/// tensors, so their f64 backward can only be as accurate as f32.
fn stats_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F32
    } else {
        dtype
    }
}

/// A statistic of `shape` that a forward op saved for its backward (mean, rstd, lse): f32,
/// whatever the tensors' dtype, so the oracle's f64 values are rounded to f32.
fn saved_stat(shape: &[usize], values: &[f64]) -> Spec {
    Spec::new(DType::F32, shape, quantize_all(DType::F32, values))
}

/// The cases of the backward op `op` (its wire name names them) in every float dtype, each
/// after its forward op `forward` passed for that dtype.
fn backward_cases(t: &Target, op: Op, forward: &'static str, build: &Builder<'_>) -> Vec<Case> {
    let after = move |d| vec![format!("nn/{forward}/{}/", short_name(d))];
    op_cases(t, "backward", op.name(), op.kind(), &FLOATS, &after, build)
}

pub fn cases(t: &Target) -> Vec<Case> {
    let mut cases = Vec::new();
    for (forward, op) in [("softmax", Op::SoftmaxBackward), ("log_softmax", Op::LogSoftmaxBackward)] {
        cases.extend(backward_cases(t, op, forward, &|dtype, rng| {
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
                    (sample.to_string(), Tier::Core, OpCase::single(op, vec![ys, dy], Spec::out(dtype, &shape), exp))
                })
                .collect()
        }));
    }
    let eps = 1e-5;
    cases.extend(backward_cases(t, Op::LayerNormBackward, "layer_norm", &|dtype, rng| {
        let (rows, n) = (6usize, 24usize);
        let x = tensor(rng, dtype, &[rows, n], Layout::Contiguous, ValueRange::normal(2.0));
        let w = tensor(rng, dtype, &[n], Layout::Contiguous, ValueRange::normal(1.0));
        let dy = tensor(rng, dtype, &[rows, n], Layout::Strided, ValueRange::normal(1.0));
        let (_, mean, rstd) = layer_norm(&x.values, &w.values, &vec![0.0; n], n, eps);
        let (dx, dw, db) = layer_norm_vjp(&x.values, &w.values, &dy.values, n, eps);
        let inputs = vec![dy, x, w, saved_stat(&[rows], &mean), saved_stat(&[rows], &rstd)];
        let outs = vec![Spec::out(dtype, &[rows, n]), Spec::out(dtype, &[n]), Spec::out(dtype, &[n])];
        let exp = vec![
            Some(Expected::normalized(stats_dtype(dtype), dx, n, 2.0)),
            Some(Expected::normalized(stats_dtype(dtype), dw, rows, 2.0)),
            Some(Expected::normalized(stats_dtype(dtype), db, rows, 2.0)),
        ];
        only_sample("rows6x24", OpCase { op: Op::LayerNormBackward, inputs, outputs: outs, expected: exp })
    }));
    cases.extend(backward_cases(t, Op::BatchNormBackward, "batch_norm", &|dtype, rng| {
        let shape = [3usize, 4, 21];
        let (c, m) = (shape[1], shape[0] * shape[2]);
        let x = tensor(rng, dtype, &shape, Layout::Contiguous, ValueRange::normal(2.0));
        let w = tensor(rng, DType::F32, &[c], Layout::Contiguous, ValueRange::normal(1.0));
        let dy = tensor(rng, dtype, &shape, Layout::Strided, ValueRange::normal(1.0));
        let (_, mean, rstd) = batch_norm(&x.values, &w.values, &vec![0.0; c], shape, eps);
        let (dx, dw, db) = batch_norm_vjp(&x.values, &w.values, &dy.values, shape, eps);
        let inputs = vec![dy, x, w, saved_stat(&[c], &mean), saved_stat(&[c], &rstd)];
        let outs = vec![Spec::out(dtype, &shape), Spec::out(DType::F32, &[c]), Spec::out(DType::F32, &[c])];
        let exp = vec![
            Some(Expected::normalized(stats_dtype(dtype), dx, m, 2.0)),
            Some(Expected::normalized(DType::F32, dw, m, 2.0)),
            Some(Expected::normalized(DType::F32, db, m, 2.0)),
        ];
        only_sample("nchw3x4x21", OpCase { op: Op::BatchNormBackward, inputs, outputs: outs, expected: exp })
    }));
    cases.extend(backward_cases(t, Op::RmsNormBackward, "rms_norm", &|dtype, rng| {
        // Without and with the fifth input `dsum` (interface 1.11), added to dx: strided rows
        // of 33, and dense rows of 64 (a backend's vectorized path); and for f16/bf16 the
        // mixed-precision form (interface 1.12), dy in the claimed dtype against f32 rows, also
        // with the third output dx_half (interface 1.13: dx rounded to dy's dtype), on rows that
        // a backend keeps in registers and on rows longer than that (8200).
        let half = matches!(dtype, DType::F16 | DType::BF16);
        let samples = [
            ("rows5x33", 5usize, 33usize, false, false, false, Tier::Core),
            ("rows5x33_dsum", 5, 33, true, false, false, Tier::Core),
            ("rows6x64_dsum", 6, 64, true, false, false, Tier::Core),
            ("mixed_rows5x33", 5, 33, false, true, false, Tier::Core),
            ("mixed_rows6x896_dsum", 6, 896, true, true, false, Tier::Core),
            ("mixed_rows5x33_half_dx", 5, 33, false, true, true, Tier::Core),
            ("mixed_rows6x896_dsum_half_dx", 6, 896, true, true, true, Tier::Core),
            ("mixed_rows2x8200_dsum_half_dx", 2, 8200, true, true, true, Tier::Full),
        ];
        samples
            .into_iter()
            .filter(|&(_, _, _, _, mixed, _, _)| half || !mixed)
            .map(|(sample, rows, n, with_dsum, mixed, half_dx, tier)| {
                let dtype_dy = dtype;
                let dtype = if mixed { DType::F32 } else { dtype };
                let x_layout = if n == 33 { Layout::Offset } else { Layout::Contiguous };
                let x = tensor(rng, dtype, &[rows, n], x_layout, ValueRange::normal(2.0));
                let w = tensor(rng, dtype, &[n], Layout::Contiguous, ValueRange::normal(1.0));
                let dy = tensor(rng, dtype_dy, &[rows, n], Layout::Contiguous, ValueRange::normal(1.0));
                let (_, rstd) = rms_norm(&x.values, &w.values, n, eps);
                let (dx, dw) = rms_norm_vjp(&x.values, &w.values, &dy.values, n, eps);
                let mut inputs = vec![dy, x, w, saved_stat(&[rows], &rstd)];
                let mut dx_exp = Expected::normalized(stats_dtype(dtype), dx.clone(), n, 2.0);
                if with_dsum {
                    let layout = if n == 33 { Layout::Strided } else { Layout::Contiguous };
                    let dsum = tensor(rng, dtype, &[rows, n], layout, ValueRange::normal(1.0));
                    // dx rounded, plus dsum, rounded: each term keeps the norm's own tolerance
                    // and the sum adds an ulp of its magnitude (its own rounding, with room).
                    let total: Vec<f64> = dx.iter().zip(&dsum.values).map(|(a, b)| a + b).collect();
                    let mut e = Expected::normalized(stats_dtype(dtype), total.clone(), n, 2.0);
                    for ((allowed, &t), &part) in e.allowed.iter_mut().zip(&total).zip(&dx_exp.allowed) {
                        *allowed = allowed.max(part + ulp(dtype, t));
                    }
                    dx_exp = e;
                    inputs.push(dsum);
                }
                let mut outs = vec![Spec::out(dtype, &[rows, n]), Spec::out(dtype, &[n])];
                // dx_half: dx's values and tolerance, plus the rounding to dy's dtype.
                let mut half_exp = dx_exp.clone();
                for (allowed, &v) in half_exp.allowed.iter_mut().zip(&dx_exp.values) {
                    *allowed += ulp(dtype_dy, v);
                }
                let mut exp = vec![Some(dx_exp), Some(Expected::normalized(stats_dtype(dtype), dw, rows, 2.0))];
                if half_dx {
                    outs.push(Spec::out(dtype_dy, &[rows, n]));
                    exp.push(Some(half_exp));
                }
                (sample.to_string(), tier, OpCase { op: Op::RmsNormBackward, inputs, outputs: outs, expected: exp })
            })
            .collect()
    }));
    cases.extend(backward_cases(t, Op::SwiGluBackward, "swiglu", &|dtype, rng| {
        [(vec![6usize, 40], Layout::Contiguous, "rows6x40"), (vec![4, 24], Layout::HalfRows, "stacked_halves")]
            .into_iter()
            .map(|(shape, layout, sample)| {
                let r = ValueRange::normal(3.0);
                let dy = tensor(rng, dtype, &shape, Layout::Contiguous, ValueRange::normal(1.0));
                let (gate, up) = (tensor(rng, dtype, &shape, layout, r), tensor(rng, dtype, &shape, layout, r));
                let ((dgate, mag_gate), (dup, mag_up)) = swiglu_vjp(&dy.values, &gate.values, &up.values);
                let exp = vec![
                    Some(Expected::accumulated(dtype, dgate, &mag_gate, 6, 2.0)),
                    Some(Expected::accumulated(dtype, dup, &mag_up, 4, 2.0)),
                ];
                let outs = vec![Spec::out(dtype, &shape), Spec::out(dtype, &shape)];
                let inputs = vec![dy, gate, up];
                (
                    sample.to_string(),
                    Tier::Core,
                    OpCase { op: Op::SwiGluBackward, inputs, outputs: outs, expected: exp },
                )
            })
            .collect()
    }));
    let ceb = |label_smoothing| Op::CrossEntropyBackward { ignore_index: -100, label_smoothing };
    cases.extend(backward_cases(t, ceb(0.0), "cross_entropy", &|dtype, rng| {
        CROSS_ENTROPY_SAMPLES
            .into_iter()
            .map(|(smoothing, sample)| {
                let (x, target, [n, c], [_, lse]) = cross_entropy_sample(rng, dtype, 4, smoothing);
                let dloss: Vec<f64> = (0..n).map(|_| quantize(DType::F32, rng.normal())).collect();
                let d = cross_entropy_vjp(&x.values, &target, &dloss, c, -100, smoothing);
                let inputs = vec![
                    x,
                    Spec::new(DType::I64, &[n], target),
                    saved_stat(&[n], &lse),
                    Spec::new(DType::F32, &[n], dloss),
                ];
                let exp = Expected::normalized(stats_dtype(dtype), d, c, 2.0);
                (sample.to_string(), Tier::Core, OpCase::single(ceb(smoothing), inputs, Spec::out(dtype, &[n, c]), exp))
            })
            .collect()
    }));
    cases.extend(attention_cases(t));
    cases.extend(conv_cases(t));
    cases.extend(pool_cases(t));
    cases
}

/// Attention backward: grouped-query and plain heads, causal with `s == t` and `t > s`
/// (bottom-right aligned), odd sizes. The saved `o` (in the dtype) and `lse` (f32) come from
/// the oracle's forward, rounded as a backend would store them.
/// For f16/bf16 the attention backward may round P and dS to the input dtype before its
/// products (flash-style kernels do, to use tensor cores): allow, per element, that rounding's
/// worst-case first-order error, `u·Σ|terms|`, where it exceeds the normalized tolerance.
/// Where P is concentrated (a query that sees few keys) this bound is the larger one.
fn rounded_intermediates(dtype: DType, mut expected: Expected, magnitude: &[f64]) -> Expected {
    if matches!(dtype, DType::F16 | DType::BF16) {
        let u = unit_roundoff(dtype);
        for (allowed, m) in expected.allowed.iter_mut().zip(magnitude) {
            *allowed = allowed.max(u * m);
        }
        expected.describe = format!("{}, or u·Σ|terms| (P and dS rounded to {dtype})", expected.describe);
    }
    expected
}

fn attention_cases(t: &Target) -> Vec<Case> {
    let attn = |causal, scale| Op::AttentionBackward { causal, scale };
    backward_cases(t, attn(false, 1.0), "attention", &|dtype, rng| {
        // The small shapes vary the layouts; the full tier's "tiles" shapes are dense and
        // large enough to cross the tile edges of blocked (tensor-core) kernels, with
        // queries that see no key (s > t) and the largest head dim such kernels take.
        let g = |b, hq, hk, s, t, d| AttentionDims { b, hq, hk, s, t, d };
        [
            ("gqa", g(1, 4, 2, 5, 7, 8), false, Tier::Core),
            ("gqa_causal_t_gt_s", g(1, 4, 2, 5, 7, 8), true, Tier::Core),
            ("mha_causal_batched", g(2, 2, 2, 6, 6, 4), true, Tier::Core),
            ("odd_gqa_causal", g(1, 3, 1, 9, 9, 5), true, Tier::Core),
            ("tiles_gqa_causal_t_gt_s", g(1, 4, 2, 80, 150, 64), true, Tier::Full),
            ("tiles_causal_s_gt_t", g(1, 2, 1, 150, 80, 64), true, Tier::Full),
            ("tiles_d128", g(2, 2, 2, 70, 70, 128), false, Tier::Full),
        ]
        .into_iter()
        .map(|(sample, g, causal, tier)| {
            let r = ValueRange::normal(1.0);
            let tiles = tier == Tier::Full;
            let dense_or = |layout| if tiles { Layout::Contiguous } else { layout };
            let [q, k, v] = attention_inputs(rng, dtype, g, dense_or(Layout::Offset));
            let d_o =
                tensor(rng, dtype, &q.shape, dense_or(if causal { Layout::Strided } else { Layout::Contiguous }), r);
            let scale = 1.0 / (g.d as f64).sqrt();
            let (o, lse) = attention(&q.values, &k.values, &v.values, g, causal, scale);
            let (o, lse) = (quantize_all(dtype, &o), quantize_all(DType::F32, &lse));
            let ((dq, dk, dv), (mq, mk, mv)) =
                attention_vjp(&q.values, &k.values, &v.values, &o, &lse, &d_o.values, g, causal, scale);
            // dq sums over the keys, dk and dv over the queries of the kv head's group.
            let group_queries = g.hq / g.hk * g.s;
            let expect = |values, n, magnitude: Vec<f64>| {
                rounded_intermediates(dtype, Expected::normalized(stats_dtype(dtype), values, n, 2.0), &magnitude)
            };
            let exp = vec![
                Some(expect(dq, g.t, mq)),
                Some(expect(dk, group_queries, mk)),
                Some(expect(dv, group_queries, mv)),
            ];
            let outs = vec![Spec::out(dtype, &q.shape), Spec::out(dtype, &k.shape), Spec::out(dtype, &v.shape)];
            let inputs = vec![Spec::new(dtype, &q.shape, o), Spec::new(DType::F32, &[g.b, g.hq, g.s], lse), d_o];
            let inputs = [vec![q, k, v], inputs].concat();
            (sample.to_string(), tier, OpCase { op: attn(causal, scale), inputs, outputs: outs, expected: exp })
        })
        .collect()
    })
}

fn window(kernel: i64, stride: [i64; 2], padding: [i64; 2], dilation: [i64; 2]) -> Window2d {
    Window2d { kernel: [kernel; 2], stride, padding, dilation }
}

/// Conv2d backward (input; weight with and without the bias gradient): padding, stride,
/// dilation, groups, each per axis in the last geometry.
fn conv_cases(t: &Target) -> Vec<Case> {
    // (name, x shape, weight shape, window, groups, dy layout)
    let geometries = [
        (
            "k3_pad1",
            [2usize, 3, 7, 7],
            [4usize, 3, 3, 3],
            window(0, [1, 1], [1, 1], [1, 1]),
            1usize,
            Layout::Contiguous,
        ),
        ("stride2_dilation2", [2, 2, 9, 8], [3, 2, 2, 3], window(0, [2, 2], [0, 0], [2, 2]), 1, Layout::Strided),
        ("groups2_pad1", [1, 4, 6, 6], [4, 2, 3, 3], window(0, [1, 1], [1, 1], [1, 1]), 2, Layout::Offset),
        ("groups3_mixed", [1, 6, 8, 7], [6, 2, 3, 2], window(0, [2, 1], [1, 2], [1, 2]), 3, Layout::Contiguous),
    ];
    let r = ValueRange::normal(1.0);
    let bwd_in = |window, groups: usize| Op::Conv2dBackwardInput { window, groups: groups as u32 };
    let bwd_w = |window, groups: usize| Op::Conv2dBackwardWeight { window, groups: groups as u32 };
    let mut cases = backward_cases(t, bwd_in(Window2d::default(), 1), "conv2d", &|dtype, rng| {
        geometries
            .iter()
            .map(|&(name, xs, ws, win, groups, dy_layout)| {
                let (oh, ow) = conv_out(xs, ws, &win);
                let dy = tensor(rng, dtype, &[xs[0], ws[0], oh, ow], dy_layout, r);
                let w = tensor(rng, dtype, &ws, Layout::Offset, r);
                let (dx, mag, k) = conv2d_vjp_input(&dy.values, &w.values, xs, ws, &win, groups);
                let case = OpCase::single(
                    bwd_in(win, groups),
                    vec![dy, w],
                    Spec::out(dtype, &xs),
                    Expected::accumulated(dtype, dx, &mag, k, 1.0),
                );
                (name.to_string(), Tier::Core, case)
            })
            .collect()
    });
    cases.extend(backward_cases(t, bwd_w(Window2d::default(), 1), "conv2d", &|dtype, rng| {
        geometries
            .iter()
            .flat_map(|&g| [(g, false), (g, true)])
            .map(|((name, xs, ws, win, groups, dy_layout), with_bias)| {
                let (oh, ow) = conv_out(xs, ws, &win);
                let dy = tensor(rng, dtype, &[xs[0], ws[0], oh, ow], dy_layout, r);
                let x = tensor(rng, dtype, &xs, Layout::Contiguous, r);
                let ((dw, mag_w, kw), (db, mag_b, kb)) = conv2d_vjp_weight(&dy.values, &x.values, xs, ws, &win, groups);
                let mut outputs = vec![Spec::out(dtype, &ws)];
                let mut expected = vec![Some(Expected::accumulated(dtype, dw, &mag_w, kw, 1.0))];
                if with_bias {
                    outputs.push(Spec::out(dtype, &[ws[0]]));
                    expected.push(Some(Expected::accumulated(dtype, db, &mag_b, kb, 1.0)));
                }
                let case = OpCase { op: bwd_w(win, groups), inputs: vec![dy, x], outputs, expected };
                let sample = if with_bias { format!("{name}_dbias") } else { name.to_string() };
                (sample, Tier::Core, case)
            })
            .collect()
    }));
    cases
}

/// Max pooling backward (the argmax of the oracle's forward, with ties and overlapping
/// windows that pick one element several times) and average pooling backward (zero padding
/// counted in the divisor).
fn pool_cases(t: &Target) -> Vec<Case> {
    let xs = [2usize, 3, 7, 6];
    let out_shape = |win: &Window2d| {
        let (kh, kw) = (win.kernel[0] as usize, win.kernel[1] as usize);
        [
            xs[0],
            xs[1],
            out_len(xs[2], kh, win.stride[0], win.padding[0], 1),
            out_len(xs[3], kw, win.stride[1], win.padding[1], 1),
        ]
    };
    let r = ValueRange::normal(1.0);
    let mut cases =
        backward_cases(t, Op::MaxPool2dBackward { window: Window2d::default() }, "max_pool2d", &|dtype, rng| {
            [
                ("k2s2", window(2, [2, 2], [0, 0], [1, 1]), false),
                ("k3s2_pad1_ties", window(3, [2, 2], [1, 1], [1, 1]), true),
                ("k3s1_pad1_ties", window(3, [1, 1], [1, 1], [1, 1]), true),
            ]
            .into_iter()
            .map(|(name, win, ties)| {
                let mut x = tensor(rng, dtype, &xs, Layout::Contiguous, r);
                if ties {
                    // Half-integers: most windows hold equal maxima (the first one wins).
                    x.values.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0);
                }
                let (_, argmax) = max_pool2d(&x.values, xs, &win);
                let ys = out_shape(&win);
                let dy = tensor(rng, dtype, &ys, if ties { Layout::Strided } else { Layout::Contiguous }, r);
                let (dx, mag, k) = max_pool2d_vjp(&dy.values, &argmax, xs);
                let case = OpCase::single(
                    Op::MaxPool2dBackward { window: win },
                    vec![dy, Spec::new(DType::I64, &ys, argmax)],
                    Spec::out(dtype, &xs),
                    Expected::accumulated(dtype, dx, &mag, k, 1.0),
                );
                (name.to_string(), Tier::Core, case)
            })
            .collect()
        });
    cases.extend(backward_cases(
        t,
        Op::AvgPool2dBackward { window: Window2d::default() },
        "avg_pool2d",
        &|dtype, rng| {
            [
                ("k2s2", window(2, [2, 2], [0, 0], [1, 1])),
                ("k3s2_pad1", window(3, [2, 2], [1, 1], [1, 1])),
                ("k3s1_pad1", window(3, [1, 1], [1, 1], [1, 1])),
            ]
            .into_iter()
            .map(|(name, win)| {
                let dy = tensor(rng, dtype, &out_shape(&win), Layout::Offset, r);
                let (dx, mag, k) = avg_pool2d_vjp(&dy.values, xs, &win);
                let case = OpCase::single(
                    Op::AvgPool2dBackward { window: win },
                    vec![dy],
                    Spec::out(dtype, &xs),
                    Expected::accumulated(dtype, dx, &mag, k, 1.0),
                );
                (name.to_string(), Tier::Core, case)
            })
            .collect()
        },
    ));
    cases
}
