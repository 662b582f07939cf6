//! Suite `nn`: fused softmax, log-softmax, layer norm, RMS norm (alone, after a residual
//! addition and before a linear layer), cross-entropy, rotary (and its fused cache write), SwiGLU, attention forward,
//! masked attention and batch norm.

use super::{no_deps, op_cases};
use crate::case::{Case, OpCase, Tier};
use crate::gen::{tensor, ValueRange};
use crate::oracle::nn::{
    add_rms_norm, add_rms_norm_linear, attention, batch_norm, cross_entropy, layer_norm, log_softmax, masked_attention,
    rms_norm, rotary, rotary_kv_write, softmax, swiglu, swiglu_halves,
};
use crate::target::{Layout, Spec, Target};
use crate::tolerance::Expected;
use crate::values::{quantize, unit_roundoff, Rng, FLOATS};
use genesis_backend_api::sdk::checks::AttentionDims;
use genesis_backend_api::{DType, Op};

/// Row inputs for the softmax family: ordinary, odd and non-contiguous rows, large
/// magnitudes (overflow without max subtraction), masked entries and a fully masked row.
pub fn softmax_inputs(rng: &mut Rng, dtype: DType) -> Vec<(String, Tier, Spec)> {
    let r = ValueRange::normal(2.0);
    let mut masked = tensor(rng, dtype, &[4, 9], Layout::Contiguous, r);
    for i in [1, 4, 11, 20] {
        masked.values[i] = f64::NEG_INFINITY;
    }
    for v in &mut masked.values[27..36] {
        *v = f64::NEG_INFINITY;
    }
    vec![
        ("rows4x7".into(), Tier::Smoke, tensor(rng, dtype, &[4, 7], Layout::Contiguous, r)),
        ("odd3x130".into(), Tier::Core, tensor(rng, dtype, &[3, 130], Layout::Offset, r)),
        ("transposed".into(), Tier::Core, tensor(rng, dtype, &[6, 9], Layout::Transposed, r)),
        (
            "large_values".into(),
            Tier::Core,
            tensor(rng, dtype, &[5, 16], Layout::Contiguous, ValueRange::normal(300.0)),
        ),
        ("masked".into(), Tier::Core, masked),
        ("one_column".into(), Tier::Core, tensor(rng, dtype, &[3, 1], Layout::Contiguous, r)),
    ]
}

/// The samples of the cross-entropy cases, forward and backward: `(label smoothing, name)`.
pub const CROSS_ENTROPY_SAMPLES: [(f64, &str); 2] = [(0.0, "plain"), (0.1, "label_smoothing")];

/// One sample of the cross-entropy cases, forward and backward, drawn from `rng`: `(6, 10)`
/// logits `x` of `dtype` and a target class per row, row `ignored` set to the ignore index
/// -100, with the oracle's forward of them with `smoothing`: `(x, target, [n, c], [loss, lse])`.
pub fn cross_entropy_sample(
    rng: &mut Rng,
    dtype: DType,
    ignored: usize,
    smoothing: f64,
) -> (Spec, Vec<f64>, [usize; 2], [Vec<f64>; 2]) {
    let (n, c) = (6usize, 10usize);
    let x = tensor(rng, dtype, &[n, c], Layout::Contiguous, ValueRange::normal(3.0));
    let mut target: Vec<f64> = (0..n).map(|_| rng.below(c) as f64).collect();
    target[ignored] = -100.0;
    let (loss, lse) = cross_entropy(&x.values, &target, c, -100, smoothing);
    (x, target, [n, c], [loss, lse])
}

/// The inputs of the attention cases, forward and backward: q `(b, hq, s, d)`, k and v
/// `(b, hk, t, d)` of shape `g` (normal, σ 1), q and k contiguous, v laid out as `v_layout`.
pub fn attention_inputs(rng: &mut Rng, dtype: DType, g: AttentionDims, v_layout: Layout) -> [Spec; 3] {
    let r = ValueRange::normal(1.0);
    let q = tensor(rng, dtype, &[g.b, g.hq, g.s, g.d], Layout::Contiguous, r);
    let k = tensor(rng, dtype, &[g.b, g.hk, g.t, g.d], Layout::Contiguous, r);
    let v = tensor(rng, dtype, &[g.b, g.hk, g.t, g.d], v_layout, r);
    [q, k, v]
}

pub fn cases(t: &Target) -> Vec<Case> {
    let mut cases = Vec::new();
    for (name, op) in [("softmax", Op::Softmax), ("log_softmax", Op::LogSoftmax)] {
        cases.extend(op_cases(t, "nn", name, op.kind(), &FLOATS, &no_deps, &|dtype, rng| {
            softmax_inputs(rng, dtype)
                .into_iter()
                .map(|(sample, tier, x)| {
                    let n = *x.shape.last().unwrap_or(&1);
                    let y = if op == Op::Softmax { softmax(&x.values, n) } else { log_softmax(&x.values, n) };
                    let exp = Expected::normalized(dtype, y, n, 1.0);
                    let out = Spec::out(dtype, &x.shape);
                    (sample, tier, OpCase::single(op, vec![x], out, exp))
                })
                .collect()
        }));
    }
    let eps = 1e-5;
    cases.extend(op_cases(t, "nn", "layer_norm", Op::LayerNorm { eps }.kind(), &FLOATS, &no_deps, &|dtype, rng| {
        [
            (vec![6usize, 32], Layout::Contiguous, "rows6x32"),
            (vec![4, 77], Layout::Strided, "odd_strided"),
            (vec![2, 3, 1], Layout::Contiguous, "width1"),
        ]
        .into_iter()
        .map(|(shape, layout, sample)| {
            let n = *shape.last().unwrap_or(&1);
            let rows = shape.iter().product::<usize>() / n;
            let mut x = tensor(rng, dtype, &shape, layout, ValueRange::normal(3.0));
            x.values.iter_mut().for_each(|v| *v = quantize(dtype, *v + 5.0));
            let w = tensor(rng, dtype, &[n], Layout::Contiguous, ValueRange::normal(1.0));
            let b = tensor(rng, dtype, &[n], Layout::Contiguous, ValueRange::normal(1.0));
            let (y, mean, rstd) = layer_norm(&x.values, &w.values, &b.values, n, eps);
            let lead = &shape[..shape.len() - 1];
            let outs = vec![Spec::out(dtype, &shape), Spec::out(DType::F32, lead), Spec::out(DType::F32, lead)];
            let exp = vec![
                Some(Expected::normalized(dtype, y, n, 1.0)),
                Some(Expected::normalized(DType::F32, mean, n, 1.0)),
                Some(Expected::normalized(DType::F32, rstd, n, 1.0)),
            ];
            let _ = rows;
            (
                sample.to_string(),
                Tier::Core,
                OpCase { op: Op::LayerNorm { eps }, inputs: vec![x, w, b], outputs: outs, expected: exp },
            )
        })
        .collect()
    }));
    cases.extend(op_cases(t, "nn", "batch_norm", Op::BatchNorm { eps }.kind(), &FLOATS, &no_deps, &|dtype, rng| {
        [
            ([4usize, 3, 10], Layout::Contiguous, "nchw4x3x10"),
            ([2, 5, 67], Layout::Strided, "odd_strided"),
            ([9, 6, 1], Layout::Offset, "batchnorm1d"),
        ]
        .into_iter()
        .map(|(shape, layout, sample)| {
            let c = shape[1];
            let m = shape[0] * shape[2];
            // An offset mean: the variance must come from deviations, not E[x²] - E[x]².
            let mut x = tensor(rng, dtype, &shape, layout, ValueRange::normal(2.0));
            x.values.iter_mut().for_each(|v| *v = quantize(dtype, *v + 4.0));
            let w = tensor(rng, DType::F32, &[c], Layout::Contiguous, ValueRange::normal(1.0));
            let b = tensor(rng, DType::F32, &[c], Layout::Contiguous, ValueRange::normal(1.0));
            let (y, mean, rstd) = batch_norm(&x.values, &w.values, &b.values, shape, eps);
            let outs = vec![Spec::out(dtype, &shape), Spec::out(DType::F32, &[c]), Spec::out(DType::F32, &[c])];
            let exp = vec![
                Some(Expected::normalized(dtype, y, m, 1.0)),
                Some(Expected::normalized(DType::F32, mean, m, 1.0)),
                Some(Expected::normalized(DType::F32, rstd, m, 1.0)),
            ];
            (
                sample.to_string(),
                Tier::Core,
                OpCase { op: Op::BatchNorm { eps }, inputs: vec![x, w, b], outputs: outs, expected: exp },
            )
        })
        .collect()
    }));
    cases.extend(op_cases(t, "nn", "rms_norm", Op::RmsNorm { eps }.kind(), &FLOATS, &no_deps, &|dtype, rng| {
        [(vec![6usize, 32], Layout::Contiguous, "rows6x32"), (vec![4, 77], Layout::Transposed, "odd_transposed")]
            .into_iter()
            .map(|(shape, layout, sample)| {
                let n = shape[1];
                let x = tensor(rng, dtype, &shape, layout, ValueRange::normal(3.0));
                let w = tensor(rng, dtype, &[n], Layout::Contiguous, ValueRange::normal(1.0));
                let (y, rstd) = rms_norm(&x.values, &w.values, n, eps);
                let outs = vec![Spec::out(dtype, &shape), Spec::out(DType::F32, &shape[..1])];
                let exp = vec![
                    Some(Expected::normalized(dtype, y, n, 1.0)),
                    Some(Expected::normalized(DType::F32, rstd, n, 1.0)),
                ];
                (
                    sample.to_string(),
                    Tier::Core,
                    OpCase { op: Op::RmsNorm { eps }, inputs: vec![x, w], outputs: outs, expected: exp },
                )
            })
            .collect()
    }));
    let add_norm = Op::AddRmsNorm { eps };
    cases.extend(op_cases(t, "nn", "add_rms_norm", add_norm.kind(), &FLOATS, &no_deps, &|dtype, rng| {
        // The CUDA kernel's paths: dense rows (packs), a decoder's width, rows read through
        // strides, and rows longer than its registers hold (8,192 elements).
        // The mixed-precision form (interface 1.12, f16/bf16 only): an f32 x, weight and sum
        // with a residual and y in the claimed dtype.
        let half = matches!(dtype, DType::F16 | DType::BF16);
        [
            (vec![6usize, 32], Layout::Contiguous, Layout::Contiguous, "rows6x32", Tier::Core, false),
            (vec![2, 896], Layout::Contiguous, Layout::Offset, "hidden896", Tier::Core, false),
            (vec![4, 77], Layout::Transposed, Layout::Strided, "odd_transposed", Tier::Core, false),
            (vec![2, 8200], Layout::Contiguous, Layout::Contiguous, "long_rows", Tier::Full, false),
            (vec![6, 64], Layout::Contiguous, Layout::Contiguous, "mixed_rows6x64", Tier::Core, true),
            (vec![3, 896], Layout::Contiguous, Layout::Offset, "mixed_hidden896", Tier::Core, true),
            (vec![4, 77], Layout::Transposed, Layout::Strided, "mixed_odd_transposed", Tier::Core, true),
            (vec![2, 8200], Layout::Contiguous, Layout::Contiguous, "mixed_long_rows", Tier::Full, true),
        ]
        .into_iter()
        .filter(|&(.., mixed)| half || !mixed)
        .map(|(shape, x_layout, r_layout, sample, tier, mixed)| {
            let n = shape[1];
            let stream = if mixed { DType::F32 } else { dtype };
            let x = tensor(rng, stream, &shape, x_layout, ValueRange::normal(3.0));
            let r = tensor(rng, dtype, &shape, r_layout, ValueRange::normal(3.0));
            let w = tensor(rng, stream, &[n], Layout::Contiguous, ValueRange::normal(1.0));
            let (y, sum, rstd) = add_rms_norm(&x.values, &r.values, &w.values, n, eps, stream);
            let outs = vec![Spec::out(dtype, &shape), Spec::out(stream, &shape), Spec::out(DType::F32, &shape[..1])];
            let exp = vec![
                Some(Expected::normalized(dtype, y, n, 1.0)),
                Some(Expected::correctly_rounded(stream, sum)),
                Some(Expected::normalized(DType::F32, rstd, n, 1.0)),
            ];
            (sample.to_string(), tier, OpCase { op: add_norm, inputs: vec![x, r, w], outputs: outs, expected: exp })
        })
        .collect()
    }));
    let norm_linear = |gated| Op::AddRmsNormLinear { eps, gated };
    cases.extend(op_cases(
        t,
        "nn",
        "add_rms_norm_linear",
        norm_linear(false).kind(),
        &FLOATS,
        &no_deps,
        &|dtype, rng| {
            // The CUDA kernel's one- and two-row paths (a decode step's width among them, gated
            // as a feed-forward's gate and up projections), then shapes it leaves to the separate
            // ops: more rows, strided x, a weight stored (k, n), a weight of no rows.
            let c = Layout::Contiguous;
            [
                (vec![1usize], 64usize, 40usize, c, c, true, false, "row1"),
                (vec![1, 1], 896, 136, c, c, true, false, "decode896"),
                (vec![2, 1], 128, 33, c, c, false, false, "rows2"),
                (vec![1, 1], 896, 96, c, c, false, true, "gated_decode896"),
                (vec![2], 64, 24, c, c, true, true, "gated_rows2_bias"),
                (vec![5], 48, 20, c, c, true, false, "rows5"),
                (vec![4], 32, 18, c, c, false, true, "gated_rows4"),
                (vec![3], 40, 12, Layout::Transposed, Layout::Transposed, true, false, "strided"),
                // No outputs, but the sum is still stored.
                (vec![1], 32, 0, c, c, false, false, "no_outputs"),
            ]
            .into_iter()
            .map(|(lead, k, n, x_layout, w_layout, with_bias, gated, sample)| {
                let shape = [lead.clone(), vec![k]].concat();
                let x = tensor(rng, dtype, &shape, x_layout, ValueRange::normal(3.0));
                let r = tensor(rng, dtype, &shape, c, ValueRange::normal(3.0));
                let g = tensor(rng, dtype, &[k], c, ValueRange::normal(1.0));
                let w = tensor(rng, dtype, &[n, k], w_layout, ValueRange::normal(1.0));
                let b = tensor(rng, dtype, &[n], c, ValueRange::normal(1.0));
                let bias = with_bias.then_some(&b.values[..]);
                let (p, magnitude, rounded, sum) =
                    add_rms_norm_linear(&x.values, &r.values, &g.values, &w.values, bias, (k, n), eps, dtype);
                let mut y = Expected::accumulated(dtype, p, &magnitude, k, 1.0);
                for (allowed, r) in y.allowed.iter_mut().zip(&rounded) {
                    *allowed += 2.0 * unit_roundoff(dtype) * r;
                }
                let outputs_n = if gated { n / 2 } else { n };
                if gated {
                    let (values, allowed) = swiglu_halves(&y.values, &y.allowed, n, dtype);
                    y = Expected {
                        values,
                        allowed,
                        signed_zero: false,
                        describe: "gated: the products' bound through silu".into(),
                    };
                }
                let outs = vec![Spec::out(dtype, &[lead.clone(), vec![outputs_n]].concat()), Spec::out(dtype, &shape)];
                let exp = vec![Some(y), Some(Expected::correctly_rounded(dtype, sum))];
                let mut inputs = vec![x, r, g, w];
                if with_bias {
                    inputs.push(b);
                }
                let case = OpCase { op: norm_linear(gated), inputs, outputs: outs, expected: exp };
                (sample.to_string(), Tier::Core, case)
            })
            .collect()
        },
    ));
    let ce = |ignore_index, label_smoothing| Op::CrossEntropy { ignore_index, label_smoothing };
    cases.extend(op_cases(t, "nn", "cross_entropy", ce(-100, 0.0).kind(), &FLOATS, &no_deps, &|dtype, rng| {
        CROSS_ENTROPY_SAMPLES
            .into_iter()
            .map(|(smoothing, sample)| {
                let (x, target, [n, c], [loss, lse]) = cross_entropy_sample(rng, dtype, 2, smoothing);
                let tgt = Spec::new(DType::I64, &[n], target);
                let outs = vec![Spec::out(DType::F32, &[n]), Spec::out(DType::F32, &[n])];
                let exp = vec![
                    Some(Expected::normalized(DType::F32, loss, c, 2.0)),
                    Some(Expected::normalized(DType::F32, lse, c, 2.0)),
                ];
                (
                    sample.to_string(),
                    Tier::Core,
                    OpCase { op: ce(-100, smoothing), inputs: vec![x, tgt], outputs: outs, expected: exp },
                )
            })
            .collect()
    }));
    cases.extend(op_cases(
        t,
        "nn",
        "rotary",
        Op::Rotary { inverse: false }.kind(),
        &FLOATS,
        &no_deps,
        &|dtype, rng| {
            // The last sample's x rows are strided (the first halves of rows twice as long, as
            // a head view of a stacked projection's output has), 32 bytes or more each.
            let contiguous = (8usize, Layout::Contiguous);
            [
                (false, "forward", contiguous),
                (true, "inverse", contiguous),
                (false, "half_rows", (16, Layout::HalfRows)),
            ]
            .into_iter()
            .map(|(inverse, sample, (d, layout))| {
                let (b, h, s) = (2usize, 3usize, 5usize);
                let x = tensor(rng, dtype, &[b, h, s, d], layout, ValueRange::normal(1.0));
                let angles: Vec<f64> =
                    (0..s * d / 2).map(|i| (i / (d / 2)) as f64 * 0.37 + (i % (d / 2)) as f64 * 0.11).collect();
                let cos = Spec::new(dtype, &[s, d / 2], angles.iter().map(|a| quantize(dtype, a.cos())).collect());
                let sin = Spec::new(dtype, &[s, d / 2], angles.iter().map(|a| quantize(dtype, a.sin())).collect());
                let (y, mag) = rotary(&x.values, &cos.values, &sin.values, s, d, inverse);
                let exp = Expected::accumulated(dtype, y, &mag, 2, 1.0);
                let out = Spec::out(dtype, &x.shape);
                (sample.to_string(), Tier::Core, OpCase::single(Op::Rotary { inverse }, vec![x, cos, sin], out, exp))
            })
            .collect()
        },
    ));
    cases.extend(op_cases(t, "nn", "rotary_kv_write", Op::RotaryKvWrite.kind(), &FLOATS, &no_deps, &|dtype, rng| {
        // Decode steps of Qwen2.5-0.5B's heads (7 query heads a kv head) at head dims 64 and 128,
        // at the first, a middle and the last position; several new positions (a prefill) up
        // to the caches' end; strided layouts of every operand (q, k and v transposed or as
        // the halves of longer rows, the caches with gaps, the tables at an offset). The
        // caches start with random values: every position but the new ones must keep them.
        let g = |b, hq, hk, s, t, d| AttentionDims { b, hq, hk, s, t, d };
        let (c, tr, st) = (Layout::Contiguous, Layout::Transposed, Layout::Strided);
        [
            (g(2, 14, 2, 1, 40, 64), 17, [c, c, c], "decode_d64", Tier::Core),
            (g(2, 14, 2, 1, 40, 128), 39, [c, c, c], "decode_d128_last", Tier::Core),
            (g(2, 14, 2, 1, 40, 64), 0, [tr, st, Layout::Offset], "decode_strided_first", Tier::Core),
            (g(1, 4, 2, 5, 9, 8), 4, [c, c, c], "prefill_s5_to_the_end", Tier::Core),
            (g(2, 4, 2, 3, 12, 16), 6, [Layout::HalfRows, st, Layout::Offset], "prefill_half_rows_strided", Tier::Core),
            (g(2, 6, 3, 4, 10, 6), 2, [tr, tr, st], "transposed_odd_half", Tier::Core),
            (g(4, 14, 2, 7, 300, 128), 150, [c, c, c], "batch4_s7_t300_d128", Tier::Full),
        ]
        .into_iter()
        .map(|(g, p, [lx, lc, lt], sample, tier)| {
            let r = ValueRange::normal(1.0);
            let (qs, kvs, cs) = ([g.b, g.hq, g.s, g.d], [g.b, g.hk, g.s, g.d], [g.b, g.hk, g.t, g.d]);
            let q = tensor(rng, dtype, &qs, lx, r);
            let k = tensor(rng, dtype, &kvs, lx, r);
            let v = tensor(rng, dtype, &kvs, lx, r);
            let half = g.d / 2;
            let angles: Vec<f64> =
                (0..g.s * half).map(|i| (p + i / half) as f64 * 0.37 + (i % half) as f64 * 0.11).collect();
            let table = |f: fn(f64) -> f64| {
                let values = angles.iter().map(|&a| quantize(dtype, f(a))).collect();
                Spec::new(dtype, &[g.s, half], values).with_layout(lt)
            };
            let (cos, sin) = (table(f64::cos), table(f64::sin));
            let position = Spec::new(DType::I64, &[1], vec![p as f64]);
            let (k_cache, v_cache) = (tensor(rng, dtype, &cs, lc, r), tensor(rng, dtype, &cs, lc, r));
            let out = rotary_kv_write(
                &q.values,
                &k.values,
                &v.values,
                &cos.values,
                &sin.values,
                &k_cache.values,
                &v_cache.values,
                g,
                p,
            );
            // The rotated elements within rotary's bound; everything else exactly as it was
            // (or, for v, exactly v).
            let mut k_exp = Expected::accumulated(dtype, out.k_cache, &out.k_mag, 2, 1.0);
            for (allowed, &written) in k_exp.allowed.iter_mut().zip(&out.written) {
                if !written {
                    *allowed = 0.0;
                }
            }
            let exp = vec![
                Some(Expected::accumulated(dtype, out.q_out, &out.q_mag, 2, 1.0)),
                Some(k_exp),
                Some(Expected::exact_signed(dtype, out.v_cache)),
            ];
            let outputs = vec![Spec::out(dtype, &qs).with_layout(lx), k_cache, v_cache];
            let case =
                OpCase { op: Op::RotaryKvWrite, inputs: vec![q, k, v, cos, sin, position], outputs, expected: exp };
            (sample.to_string(), tier, case)
        })
        .collect()
    }));
    cases.extend(op_cases(t, "nn", "swiglu", Op::SwiGlu.kind(), &FLOATS, &no_deps, &|dtype, rng| {
        // Dense rows, the halves of one stacked projection (a row stride of 2d), and a
        // transposed pair with an odd length (no packs).
        [
            (vec![6usize, 40], Layout::Contiguous, "rows6x40"),
            (vec![4, 24], Layout::HalfRows, "stacked_halves"),
            (vec![5, 33], Layout::Transposed, "transposed_odd"),
        ]
        .into_iter()
        .map(|(shape, layout, sample)| {
            let r = ValueRange::normal(3.0);
            let (gate, up) = (tensor(rng, dtype, &shape, layout, r), tensor(rng, dtype, &shape, layout, r));
            let (y, mag) = swiglu(&gate.values, &up.values);
            let exp = Expected::accumulated(dtype, y, &mag, 4, 2.0);
            let op = OpCase::single(Op::SwiGlu, vec![gate, up], Spec::out(dtype, &shape), exp);
            (sample.to_string(), Tier::Core, op)
        })
        .collect()
    }));
    cases.extend(op_cases(
        t,
        "nn",
        "attention",
        Op::Attention { causal: false, scale: 1.0 }.kind(),
        &FLOATS,
        &no_deps,
        &|dtype, rng| {
            // The full tier's "tiles" shapes cross the tile edges of blocked kernels, with
            // queries that see no key (s > t) and the largest head dim such kernels take.
            let g = |b, hq, hk, s, t, d| AttentionDims { b, hq, hk, s, t, d };
            [
                (false, g(1, 4, 2, 5, 7, 8), "gqa", Tier::Core),
                (true, g(1, 4, 2, 5, 7, 8), "gqa_causal", Tier::Core),
                (true, g(2, 2, 2, 6, 6, 4), "mha_causal_batched", Tier::Core),
                (true, g(1, 4, 2, 80, 150, 64), "tiles_gqa_causal_t_gt_s", Tier::Full),
                (true, g(1, 2, 1, 150, 80, 64), "tiles_causal_s_gt_t", Tier::Full),
                (false, g(2, 2, 2, 70, 70, 128), "tiles_d128", Tier::Full),
            ]
            .into_iter()
            .map(|(causal, g, sample, tier)| {
                let [q, k, v] = attention_inputs(rng, dtype, g, Layout::Contiguous);
                let scale = 1.0 / (g.d as f64).sqrt();
                let (o, lse) = attention(&q.values, &k.values, &v.values, g, causal, scale);
                let outs = vec![Spec::out(dtype, &q.shape), Spec::out(DType::F32, &[g.b, g.hq, g.s])];
                let exp = vec![
                    Some(Expected::normalized(dtype, o, g.t, 2.0)),
                    Some(Expected::normalized(DType::F32, lse, g.t, 2.0)),
                ];
                (
                    sample.to_string(),
                    tier,
                    OpCase { op: Op::Attention { causal, scale }, inputs: vec![q, k, v], outputs: outs, expected: exp },
                )
            })
            .collect()
        },
    ));
    cases.extend(op_cases(
        t,
        "nn",
        "masked_attention",
        Op::MaskedAttention { scale: 1.0 }.kind(),
        &FLOATS,
        &no_deps,
        &|dtype, rng| {
            // Decode-shaped rows (one query; at head dims 64 and 128 the CUDA plugin serves a key
            // head's query heads together), several queries sharing one mask across the batch
            // (a stride-0 operand), and more keys than one chunk of a blocked kernel. Key 0 is
            // always kept: the NaN of an empty row is checked by the core's tests.
            let g = |b, hq, hk, s, t, d| AttentionDims { b, hq, hk, s, t, d };
            [
                (g(2, 4, 2, 1, 9, 8), Layout::Contiguous, "decode_gqa", Tier::Core),
                (g(2, 6, 3, 3, 7, 16), Layout::Broadcast(0), "queries_keep_shared_by_batch", Tier::Core),
                (g(1, 2, 1, 1, 1500, 64), Layout::Contiguous, "long_keys_d64", Tier::Full),
                // Qwen2.5-0.5B's grouping (7 query heads a key head) at head dim 128.
                (g(2, 14, 2, 1, 300, 128), Layout::Contiguous, "decode_group7_d128", Tier::Core),
            ]
            .into_iter()
            .map(|(g, keep_layout, sample, tier)| {
                let [q, k, v] = attention_inputs(rng, dtype, g, Layout::Contiguous);
                let row: Vec<Vec<f64>> = (0..g.b * g.s)
                    .map(|_| (0..g.t).map(|j| if j == 0 || rng.below(3) != 0 { 1.0 } else { 0.0 }).collect())
                    .collect();
                let keep: Vec<f64> = (0..g.b * g.s)
                    .flat_map(|bi| {
                        // A mask shared by the batch repeats the first row's queries.
                        let src = if keep_layout == Layout::Contiguous { bi } else { bi % g.s };
                        row[src].clone()
                    })
                    .collect();
                let keep = Spec { dtype: DType::Bool, shape: vec![g.b, g.s, g.t], layout: keep_layout, values: keep };
                let scale = 1.0 / (g.d as f64).sqrt();
                let o = masked_attention(&q.values, &k.values, &v.values, &keep.values, g, scale);
                (
                    sample.to_string(),
                    tier,
                    OpCase::single(
                        Op::MaskedAttention { scale },
                        vec![q, k, v, keep],
                        Spec::out(dtype, &[g.b, g.hq, g.s, g.d]),
                        Expected::normalized(dtype, o, g.t, 2.0),
                    ),
                )
            })
            .collect()
        },
    ));
    cases
}
