//! Cases of suite `nn` for conv2d, max/avg pooling and AdamW (forward only).

use super::{no_deps, op_cases};
use crate::case::{Case, OpCase, Tier};
use crate::gen::{tensor, ValueRange};
use crate::oracle::conv::{avg_pool2d, conv2d, max_pool2d, out_len};
use crate::target::{Layout, Spec, Target};
use crate::tolerance::Expected;
use crate::values::{quantize, Rng, FLOATS};
use genesis_backend_api::{DType, Op, Window2d};

fn win(kernel: i64, stride: i64, padding: i64, dilation: i64) -> Window2d {
    Window2d { kernel: [kernel; 2], stride: [stride; 2], padding: [padding; 2], dilation: [dilation; 2] }
}

pub fn cases(t: &Target) -> Vec<Case> {
    let r = ValueRange::normal(1.0);
    let c = Layout::Contiguous;
    let mut cases = op_cases(
        t,
        "nn",
        "conv2d",
        Op::Conv2d { window: win(0, 1, 0, 1), groups: 1 }.kind(),
        &FLOATS,
        &no_deps,
        &|dtype, rng| {
            [
                ("k3_pad1_bias", [1usize, 3, 7, 7], [4usize, 3, 3, 3], win(0, 1, 1, 1), 1usize, true),
                ("stride2_dilation2", [2, 2, 9, 8], [3, 2, 2, 3], win(0, 2, 0, 2), 1, false),
                ("groups2", [1, 4, 6, 6], [4, 2, 3, 3], win(0, 1, 1, 1), 2, true),
            ]
            .into_iter()
            .map(|(name, xs, ws, window, groups, with_bias)| {
                let x = tensor(rng, dtype, &xs, c, r);
                let w = tensor(rng, dtype, &ws, Layout::Offset, r);
                let b = tensor(rng, dtype, &[ws[0]], c, r);
                let (y, mag, k) =
                    conv2d(&x.values, xs, &w.values, ws, with_bias.then_some(&b.values[..]), &window, groups);
                let (oh, ow) = (
                    out_len(xs[2], ws[2], window.stride[0], window.padding[0], window.dilation[0]),
                    out_len(xs[3], ws[3], window.stride[1], window.padding[1], window.dilation[1]),
                );
                let exp = Expected::accumulated(dtype, y, &mag, k, 1.0);
                let mut inputs = vec![x, w];
                if with_bias {
                    inputs.push(b);
                }
                let out = Spec::out(dtype, &[xs[0], ws[0], oh, ow]);
                (
                    name.to_string(),
                    Tier::Core,
                    OpCase::single(Op::Conv2d { window, groups: groups as u32 }, inputs, out, exp),
                )
            })
            .collect()
        },
    );
    cases.extend(op_cases(
        t,
        "nn",
        "max_pool2d",
        Op::MaxPool2d { window: win(2, 2, 0, 1) }.kind(),
        &FLOATS,
        &no_deps,
        &|dtype, rng| {
            [
                ("k2s2", win(2, 2, 0, 1), false),
                ("k3s2_pad1", win(3, 2, 1, 1), false),
                ("k2s1_nan", win(2, 1, 0, 1), true),
            ]
            .into_iter()
            .map(|(name, window, nan)| {
                let xs = [2usize, 3, 7, 6];
                let mut x = tensor(rng, dtype, &xs, Layout::Strided, r);
                if nan {
                    x.values[8] = f64::NAN;
                }
                let (y, arg) = max_pool2d(&x.values, xs, &window);
                let (oh, ow) = (
                    out_len(7, 2 + (window.kernel[0] as usize - 2), window.stride[0], window.padding[0], 1),
                    out_len(6, window.kernel[1] as usize, window.stride[1], window.padding[1], 1),
                );
                let outs = vec![Spec::out(dtype, &[2, 3, oh, ow]), Spec::out(DType::I64, &[2, 3, oh, ow])];
                let exp = vec![Some(Expected::exact(dtype, y)), Some(Expected::exact(DType::I64, arg))];
                (
                    name.to_string(),
                    Tier::Core,
                    OpCase { op: Op::MaxPool2d { window }, inputs: vec![x], outputs: outs, expected: exp },
                )
            })
            .collect()
        },
    ));
    cases.extend(op_cases(
        t,
        "nn",
        "avg_pool2d",
        Op::AvgPool2d { window: win(2, 2, 0, 1) }.kind(),
        &FLOATS,
        &no_deps,
        &|dtype, rng| {
            [("k2s2", win(2, 2, 0, 1)), ("k3s2_pad1", win(3, 2, 1, 1))]
                .into_iter()
                .map(|(name, window)| {
                    let xs = [2usize, 3, 7, 6];
                    let x = tensor(rng, dtype, &xs, c, r);
                    let (y, mag, k) = avg_pool2d(&x.values, xs, &window);
                    let (oh, ow) = (
                        out_len(7, window.kernel[0] as usize, window.stride[0], window.padding[0], 1),
                        out_len(6, window.kernel[1] as usize, window.stride[1], window.padding[1], 1),
                    );
                    let exp = Expected::accumulated(dtype, y, &mag, k, 1.0);
                    (
                        name.to_string(),
                        Tier::Core,
                        OpCase::single(Op::AvgPool2d { window }, vec![x], Spec::out(dtype, &[2, 3, oh, ow]), exp),
                    )
                })
                .collect()
        },
    ));
    let adamw = Op::AdamW { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, step: 3 };
    cases.extend(op_cases(t, "nn", "adamw", adamw.kind(), &FLOATS, &no_deps, &|dtype, rng| {
        // Without and with the gradient scale (interface 1.10), which multiplies every
        // gradient as it is read.
        [("two_tensors_step3", None), ("two_tensors_step3_grad_scale", Some(quantize(DType::F32, 0.37)))]
            .into_iter()
            .map(|(name, scale)| (name.to_string(), Tier::Core, adamw_case(adamw, dtype, rng, scale)))
            .collect()
    }));
    cases
}

/// Two AdamW groups of `dtype` (17 and 5 elements) at step 3, with `scale` as the optional
/// last input, and their expected updates.
fn adamw_case(op: Op, dtype: DType, rng: &mut Rng, scale: Option<f64>) -> OpCase {
    let Op::AdamW { lr, beta1: b1, beta2: b2, eps, weight_decay: wd, step } = op else {
        unreachable!("adamw_case takes an AdamW op")
    };
    let (c, r) = (Layout::Contiguous, ValueRange::normal(1.0));
    let (mut inputs, mut outputs, mut expected) = (Vec::new(), Vec::new(), Vec::new());
    for n in [17usize, 5] {
        let g = tensor(rng, dtype, &[n], c, r);
        let p = tensor(rng, dtype, &[n], c, r);
        let m = tensor(rng, dtype, &[n], c, ValueRange::normal(0.1));
        let mut v = tensor(rng, dtype, &[n], c, ValueRange::normal(0.1));
        v.values.iter_mut().for_each(|x| *x = quantize(dtype, x.abs()));
        let (mut pe, mut me, mut ve) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let gi = g.values[i] * scale.unwrap_or(1.0);
            let pi = p.values[i] * (1.0 - lr * wd);
            let mi = b1 * m.values[i] + (1.0 - b1) * gi;
            let vi = b2 * v.values[i] + (1.0 - b2) * gi * gi;
            let denom = vi.sqrt() / (1.0 - b2.powi(step as i32)).sqrt() + eps;
            pe.push(pi - lr / (1.0 - b1.powi(step as i32)) * mi / denom);
            me.push(mi);
            ve.push(vi);
        }
        inputs.push(g);
        outputs.extend([p, m, v]);
        expected.extend([pe, me, ve].map(|e| Some(Expected::normalized(dtype, e, 1, 4.0))));
    }
    inputs.extend(scale.map(|s| Spec::new(DType::F32, &[1], vec![s])));
    OpCase { op, inputs, outputs, expected }
}
