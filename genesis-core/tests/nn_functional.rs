//! Gradient checks of the nn functional ops (fused kernels and compositions), including
//! strided and broadcast inputs, and the errors bad inputs give.

use genesis::nn::functional as F;
use genesis::nn::Reduction;
use genesis::testing::{gradcheck, GradcheckOptions};
use genesis::{DType, Device, ErrorKind, Generator, Result, Tensor};

mod common;
use common::profile_this_thread;

/// How many `op` events `f` records on the calling thread.
fn ops_on_this_thread<T>(op: &str, f: impl FnOnce() -> Result<T>) -> usize {
    let (_, events) = profile_this_thread(Default::default(), f).unwrap();
    events.iter().filter(|e| e.name == op).count()
}

fn cpu() -> Device {
    Device::parse("cpu").unwrap()
}

fn rand(shape: &[usize], seed: u64) -> Tensor {
    Generator::new(seed).uniform(shape, -1.0, 1.0, DType::F64, &cpu()).unwrap().requires_grad_(true).unwrap()
}

fn ids(values: Vec<i64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(values, shape, &cpu()).unwrap()
}

fn check(f: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor]) {
    gradcheck(f, inputs, GradcheckOptions::default()).unwrap();
}

#[test]
fn layer_norm_gradcheck_fused_with_strided_input() {
    // The transposed input is strided; the weight and bias are checked too.
    let x = rand(&[5, 3], 1);
    let (w, b) = (rand(&[3], 2), rand(&[3], 3));
    check(|t| F::layer_norm(&t[0].t()?.t()?.slice(0, 0, 5, 2)?, &[3], Some(&t[1]), Some(&t[2]), 1e-5), &[x, w, b]);
    let x = rand(&[2, 3, 4], 4);
    check(|t| F::layer_norm(&t[0], &[3, 4], None, None, 1e-5), &[x]);
}

#[test]
fn layer_norm_second_order_through_the_composition() {
    // create_graph uses the composite backward, which must itself be differentiable.
    let x = rand(&[3, 4], 5);
    let w = rand(&[4], 6);
    check(
        |t| {
            // Finite differences evaluate this under no_grad with plain inputs: turn grad mode
            // back on and make x differentiable there, so the inner gradient exists either way.
            let _on = genesis::autograd::set_grad_enabled(true);
            let x = if t[0].requires_grad() { t[0].clone() } else { t[0].detach().requires_grad_(true)? };
            let y = F::layer_norm(&x, &[4], Some(&t[1]), None, 1e-5)?;
            let g = genesis::grad(&[y.square()?.sum()?], &[x], None, true, true)?;
            Ok(g[0].clone().unwrap())
        },
        &[x, w],
    );
}

#[test]
fn rms_norm_gradcheck() {
    let x = rand(&[4, 6], 7);
    let w = rand(&[6], 8);
    check(|t| F::rms_norm(&t[0].t()?.t()?, &[6], Some(&t[1]), Some(1e-6)), &[x, w]);
    let x = rand(&[2, 2, 3], 9);
    check(|t| F::rms_norm(&t[0], &[3], None, None), &[x]);
}

#[test]
fn batch_norm_gradcheck_and_running_stats() {
    let x = rand(&[4, 3, 2, 2], 10);
    let (w, b) = (rand(&[3], 11), rand(&[3], 12));
    check(|t| F::batch_norm(&t[0], None, None, Some(&t[1]), Some(&t[2]), true, 0.1, 1e-5), &[x.clone(), w, b]);
    let rm = Tensor::zeros(&[3], DType::F64, &cpu()).unwrap();
    let rv = Tensor::ones(&[3], DType::F64, &cpu()).unwrap();
    F::batch_norm(&x, Some(&rm), Some(&rv), None, None, true, 0.1, 1e-5).unwrap();
    let mean = x.mean_dims(&[0, 2, 3], false).unwrap().to_vec::<f64>().unwrap();
    let var = x.var_dims(&[0, 2, 3], 1, false).unwrap().to_vec::<f64>().unwrap();
    for c in 0..3 {
        assert!((rm.to_vec::<f64>().unwrap()[c] - 0.1 * mean[c]).abs() < 1e-12);
        assert!((rv.to_vec::<f64>().unwrap()[c] - (0.9 + 0.1 * var[c])).abs() < 1e-12);
    }
    // Eval mode normalizes with the running statistics.
    let y = F::batch_norm(&x, Some(&rm), Some(&rv), None, None, false, 0.1, 1e-5).unwrap();
    let expect = x
        .sub(&rm.reshape(&[3, 1, 1]).unwrap())
        .unwrap()
        .div(&rv.add_scalar(1e-5).unwrap().sqrt().unwrap().reshape(&[3, 1, 1]).unwrap())
        .unwrap();
    let diff = y.sub(&expect).unwrap().abs().unwrap().max().unwrap().item::<f64>().unwrap();
    assert!(diff < 1e-12, "{diff}");
}

#[test]
fn linear_gradcheck_with_broadcast_batch() {
    let x = rand(&[2, 3, 4], 13);
    let (w, b) = (rand(&[5, 4], 14), rand(&[5], 15));
    check(|t| F::linear(&t[0], &t[1], Some(&t[2])), &[x, w, b]);
}

#[test]
fn cross_entropy_gradcheck_all_options() {
    let x = rand(&[4, 5], 16);
    let t = ids(vec![1, -100, 4, 0], &[4]);
    for smoothing in [0.0, 0.2] {
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            check(|a| F::cross_entropy(&a[0], &t, -100, smoothing, reduction), std::slice::from_ref(&x));
        }
    }
    // (n, c, d) logits with the class on dim 1.
    let x = rand(&[2, 3, 4], 17);
    let t = ids(vec![0, 1, 2, 1, 2, 2, 0, 0], &[2, 4]);
    check(|a| F::cross_entropy(&a[0], &t, -100, 0.1, Reduction::Mean), &[x]);
}

#[test]
fn cross_entropy_fused_f32_matches_composite_f64() {
    let x64 = rand(&[6, 7], 18).detach();
    let t = ids(vec![0, 6, 3, 2, 5, 1], &[6]);
    let x32 = x64.to_dtype(DType::F32).unwrap().requires_grad_(true).unwrap();
    let x64 = x64.requires_grad_(true).unwrap();
    let l32 = F::cross_entropy(&x32, &t, -100, 0.1, Reduction::Mean).unwrap();
    let l64 = F::cross_entropy(&x64, &t, -100, 0.1, Reduction::Mean).unwrap();
    assert!((l32.item::<f64>().unwrap() - l64.item::<f64>().unwrap()).abs() < 1e-6);
    l32.backward().unwrap();
    l64.backward().unwrap();
    let (g32, g64) = (x32.grad().unwrap().to_vec::<f64>().unwrap(), x64.grad().unwrap().to_vec::<f64>().unwrap());
    for (a, b) in g32.iter().zip(&g64) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
}

#[test]
fn cross_entropy_known_value() {
    // Uniform logits over 4 classes: the loss is ln 4 whatever the target.
    let x = Tensor::zeros(&[2, 4], DType::F32, &cpu()).unwrap();
    let l = F::cross_entropy(&x, &ids(vec![3, 0], &[2]), -100, 0.0, Reduction::Mean).unwrap();
    assert!((l.item::<f64>().unwrap() - 4f64.ln()).abs() < 1e-6);
}

#[test]
fn losses_gradcheck() {
    let (x, y) = (rand(&[3, 4], 19), rand(&[3, 4], 20).detach());
    check(|a| F::mse_loss(&a[0], &y, Reduction::Mean), std::slice::from_ref(&x));
    check(|a| F::l1_loss(&a[0], &y, Reduction::Sum), std::slice::from_ref(&x));
    let target = y.abs().unwrap();
    check(|a| F::binary_cross_entropy_with_logits(&a[0], &target, None, Reduction::Mean), std::slice::from_ref(&x));
    let pw = Tensor::full(&[4], 2.0, DType::F64, &cpu()).unwrap();
    check(
        |a| F::binary_cross_entropy_with_logits(&a[0], &target, Some(&pw), Reduction::None),
        std::slice::from_ref(&x),
    );
    check(|a| F::binary_cross_entropy(&a[0].sigmoid()?, &target, None, Reduction::Mean), std::slice::from_ref(&x));
    let t = ids(vec![1, 0, 3], &[3]);
    check(|a| F::nll_loss(&a[0].log_softmax(1)?, &t, -100, Reduction::Mean), &[x]);
}

#[test]
fn bce_with_logits_matches_bce_of_sigmoid() {
    let x = rand(&[10], 21).detach();
    let t = rand(&[10], 22).detach().abs().unwrap();
    let a = F::binary_cross_entropy_with_logits(&x, &t, None, Reduction::Sum).unwrap().item::<f64>().unwrap();
    let b = F::binary_cross_entropy(&x.sigmoid().unwrap(), &t, None, Reduction::Sum).unwrap().item::<f64>().unwrap();
    assert!((a - b).abs() < 1e-10, "{a} vs {b}");
}

#[test]
fn bad_inputs_are_clear_errors() {
    let x = Tensor::zeros(&[2, 3], DType::F32, &cpu()).unwrap();
    let kind = |r: Result<Tensor>| r.unwrap_err().kind();
    // Out-of-range class, fused (f32) and composite (f64) paths.
    let e = F::cross_entropy(&x, &ids(vec![0, 3], &[2]), -100, 0.0, Reduction::Mean).unwrap_err();
    assert!(e.message().contains("outside"), "{e}");
    let e = F::cross_entropy(&x.to_dtype(DType::F64).unwrap(), &ids(vec![-1, 0], &[2]), -100, 0.0, Reduction::Mean)
        .unwrap_err();
    assert!(e.message().contains("outside"), "{e}");
    assert_eq!(
        kind(F::cross_entropy(&x, &ids(vec![0, 1, 2], &[3]), -100, 0.0, Reduction::Mean)),
        ErrorKind::ShapeMismatch
    );
    assert_eq!(
        kind(F::cross_entropy(&x, &x.sum_dims(&[1], false).unwrap(), -100, 0.0, Reduction::Mean)),
        ErrorKind::DtypeMismatch
    );
    assert_eq!(
        kind(F::cross_entropy(&x, &ids(vec![0, 1], &[2]), -100, 1.0, Reduction::Mean)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(kind(F::nll_loss(&x, &ids(vec![0, 7], &[2]), -100, Reduction::Mean)), ErrorKind::InvalidArgument);
    assert_eq!(kind(F::mse_loss(&x, &x.t().unwrap(), Reduction::Mean)), ErrorKind::ShapeMismatch);
    assert_eq!(
        kind(F::binary_cross_entropy(&x.add_scalar(2.0).unwrap(), &x, None, Reduction::Mean)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(kind(F::layer_norm(&x, &[2], None, None, 1e-5)), ErrorKind::ShapeMismatch);
    let w16 = Tensor::ones(&[3], DType::F16, &cpu()).unwrap();
    assert_eq!(kind(F::layer_norm(&x, &[3], Some(&w16), None, 1e-5)), ErrorKind::DtypeMismatch);
    assert_eq!(kind(F::layer_norm(&ids(vec![1, 2, 3], &[3]), &[3], None, None, 1e-5)), ErrorKind::DtypeMismatch);
    // The parameters are checked with the SDK's rule and wording, naming the argument.
    let b4 = Tensor::zeros(&[4], DType::F32, &cpu()).unwrap();
    let e = F::layer_norm(&x, &[3], None, Some(&b4), 1e-5).unwrap_err();
    assert_eq!((e.kind(), e.message()), (ErrorKind::ShapeMismatch, "layer_norm: bias has shape [4], expected [3]"));
    let e = F::rms_norm(&x, &[3], Some(&w16), Some(-1.0)).unwrap_err();
    assert_eq!((e.kind(), e.message()), (ErrorKind::InvalidArgument, "rms_norm: eps must be >= 0, got -1"));
    let e = F::batch_norm(&x, Some(&b4), None, None, None, false, 0.1, 1e-5).unwrap_err();
    assert_eq!(
        (e.kind(), e.message()),
        (ErrorKind::ShapeMismatch, "batch_norm: running_mean has shape [4], expected [3]")
    );
    assert_eq!(
        kind(F::linear(&x, &Tensor::zeros(&[4, 2], DType::F32, &cpu()).unwrap(), None)),
        ErrorKind::ShapeMismatch
    );
    assert_eq!(
        kind(F::batch_norm(&x.reshape(&[6]).unwrap(), None, None, None, None, true, 0.1, 1e-5)),
        ErrorKind::ShapeMismatch
    );
    assert!(F::embedding(&x, &x).is_err());
    let table = Tensor::zeros(&[3, 2], DType::F32, &cpu()).unwrap();
    assert!(F::embedding(&ids(vec![0, 3], &[2]), &table).is_err());
}

#[test]
fn norms_fused_match_composite() {
    // In f32: f64 always takes the compositions (the kernels' statistics are f32).
    let f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap().detach().requires_grad_(true).unwrap();
    let x = f32(rand(&[3, 5], 30));
    let w = f32(rand(&[5], 31));
    let b = f32(rand(&[5], 32));
    let run = |composite: bool, rms: bool| -> (Vec<f64>, Vec<f64>, Option<&'static str>) {
        let go = || -> Result<(Vec<f64>, Vec<f64>, Option<&'static str>)> {
            x.zero_grad();
            let y = if rms {
                F::rms_norm(&x, &[5], Some(&w), Some(1e-6))?
            } else {
                F::layer_norm(&x, &[5], Some(&w), Some(&b), 1e-5)?
            };
            y.mul(&y)?.sum()?.backward()?;
            Ok((y.to_vec::<f64>()?, x.grad().unwrap().to_vec::<f64>()?, y.grad_fn_name()))
        };
        if composite {
            genesis::testing::composites_only(go).unwrap()
        } else {
            go().unwrap()
        }
    };
    for rms in [false, true] {
        let (a, b) = (run(false, rms), run(true, rms));
        assert_ne!(a.2, b.2, "both runs took one path");
        for (x, y) in a.0.iter().chain(&a.1).zip(b.0.iter().chain(&b.1)) {
            assert!((x - y).abs() < 2e-6 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}

#[test]
fn batch_norm_fused_matches_composite() {
    // f32 (f64 always takes the composition); a strided 4-D input and a 2-D one; weight, bias,
    // running statistics, first and second-order gradients.
    let f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap().detach().requires_grad_(true).unwrap();
    for shape in [&[3, 4, 2, 5][..], &[6, 3]] {
        let x = f32(rand(shape, 40));
        let c = shape[1];
        let (w, b) = (f32(rand(&[c], 41)), f32(rand(&[c], 42)));
        let run = |composite: bool| -> Vec<Vec<f64>> {
            let go = || -> Result<Vec<Vec<f64>>> {
                let (rm, rv) = (Tensor::zeros(&[c], DType::F32, &cpu())?, Tensor::ones(&[c], DType::F32, &cpu())?);
                let input = if shape.len() == 4 { x.permute(&[0, 1, 3, 2])? } else { x.clone() };
                let y = F::batch_norm(&input, Some(&rm), Some(&rv), Some(&w), Some(&b), true, 0.1, 1e-5)?;
                let loss = y.square()?.mul(&y)?.sum()?;
                // First order as training runs it (the backward op), then with create_graph
                // (the composition) for a second-order gradient.
                let g =
                    genesis::grad(std::slice::from_ref(&loss), &[x.clone(), w.clone(), b.clone()], None, true, false)?;
                let gx = genesis::grad(&[loss], std::slice::from_ref(&x), None, false, true)?[0].clone().unwrap();
                let second = genesis::grad(&[gx.square()?.sum()?], std::slice::from_ref(&w), None, false, false)?;
                let mut out = vec![y.to_vec::<f64>()?, rm.to_vec::<f64>()?, rv.to_vec::<f64>()?];
                out.extend(g.iter().map(|t| t.as_ref().unwrap().to_vec::<f64>().unwrap()));
                out.push(second[0].as_ref().unwrap().to_vec::<f64>()?);
                out.push(vec![y.grad_fn_name().map_or(0.0, |n| n.len() as f64)]);
                Ok(out)
            };
            if composite {
                genesis::testing::composites_only(go).unwrap()
            } else {
                go().unwrap()
            }
        };
        let (fused, composite) = (run(false), run(true));
        assert_ne!(fused.last(), composite.last(), "both runs took one path");
        let names = ["y", "running_mean", "running_var", "dx", "dweight", "dbias", "second order"];
        for (name, (a, b)) in names.iter().zip(fused.iter().zip(&composite)) {
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() < 1e-4 * (1.0 + y.abs()), "{shape:?} {name}: {x} vs {y}");
            }
        }
    }
    // bf16 in, bf16 out (the statistics in f32), close to the f32 result.
    let x = rand(&[4, 3, 6], 43).detach();
    let y32 = F::batch_norm(&x.to_dtype(DType::F32).unwrap(), None, None, None, None, true, 0.1, 1e-5).unwrap();
    let y16 = F::batch_norm(&x.to_dtype(DType::BF16).unwrap(), None, None, None, None, true, 0.1, 1e-5).unwrap();
    assert_eq!(y16.dtype(), DType::BF16);
    let diff =
        y16.to_dtype(DType::F32).unwrap().sub(&y32).unwrap().abs().unwrap().max().unwrap().item::<f32>().unwrap();
    assert!(diff < 0.03, "{diff}");
}

/// The gradient of `sum(f(x)²)` for `x`, itself recorded (`create_graph`): checking it
/// against finite differences checks `f`'s second-order gradient.
fn gradient_of_square_sum(f: impl Fn(&Tensor) -> Result<Tensor>, x: &Tensor) -> Result<Tensor> {
    let _on = genesis::autograd::set_grad_enabled(true);
    let x = if x.requires_grad() { x.clone() } else { x.detach().requires_grad_(true)? };
    let y = f(&x)?;
    Ok(genesis::grad(&[y.square()?.sum()?], &[x], None, true, true)?[0].clone().unwrap())
}

#[test]
fn swiglu_gradcheck_fused_and_second_order() {
    // The halves of one stacked projection (row-strided views), as Qwen2's MLP passes them.
    let stacked = rand(&[4, 6], 30);
    check(|t| F::swiglu(&t[0].narrow(1, 0, 3)?, &t[0].narrow(1, 3, 3)?), std::slice::from_ref(&stacked));
    // The same through swiglu_halves (its gradient written into one buffer), fused and composed.
    check(|t| F::swiglu_halves(&t[0]), std::slice::from_ref(&stacked));
    check(|t| F::swiglu_halves(&t[0].transpose(0, 1)?), &[rand(&[8, 2], 34)]);
    genesis::testing::composites_only(|| {
        check(|t| F::swiglu_halves(&t[0]), std::slice::from_ref(&stacked));
        Ok::<(), genesis::Error>(())
    })
    .unwrap();
    check(|t| gradient_of_square_sum(F::swiglu_halves, &t[0]), &[stacked]);
    assert!(F::swiglu_halves(&rand(&[2, 5], 35)).is_err(), "an odd last dim has no halves");
}

#[test]
fn swiglu_linear_recomputes_and_matches_the_composition() {
    let (p, w) = (rand(&[2, 3, 8], 36), rand(&[5, 4], 37));
    check(|t| F::swiglu_linear(&t[0], &t[1]), &[p.clone(), w.clone()]);
    genesis::testing::composites_only(|| {
        check(|t| F::swiglu_linear(&t[0], &t[1]), &[p.clone(), w.clone()]);
        Ok::<(), genesis::Error>(())
    })
    .unwrap();
    // A gradient of the gradient goes through the recomputation.
    check(|t| gradient_of_square_sum(|p| F::swiglu_linear(p, &t[1]), &t[0]), &[p.clone(), w.clone()]);
    // The same values as the composition it replaces (what it keeps: tests/memory.rs).
    let y = F::swiglu_linear(&p, &w).unwrap();
    let reference = F::linear(&F::swiglu_halves(&p).unwrap(), &w, None).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), reference.to_vec::<f64>().unwrap());
    assert_eq!(y.grad_fn_name(), Some("swiglu_linear"));
    assert!(F::swiglu_linear(&p, &rand(&[5, 3], 38)).is_err(), "weight (5, 3) does not fit halves of 4");
    let (gate, up) = (rand(&[2, 5], 31), rand(&[2, 5], 32));
    check(|t| F::swiglu(&t[0], &t[1]), &[gate.clone(), up.clone()]);
    // Broadcasting (the composition, as PyTorch's `silu(gate) * up` broadcasts).
    check(|t| F::swiglu(&t[0], &t[1]), &[gate.clone(), rand(&[5], 33)]);
    // create_graph takes the composite backward, itself differentiable.
    check(|t| gradient_of_square_sum(|g| F::swiglu(g, &t[1]), &t[0]), &[gate, up]);
}

/// Output, both gradients, and the backward node's name.
type Run = (Vec<f32>, Vec<f32>, Vec<f32>, Option<&'static str>);

#[test]
fn swiglu_fused_matches_composite() {
    let run = |composite: bool| {
        let go = || -> Result<Run> {
            let g = Generator::new(40).normal(&[3, 70], 0.0, 2.0, DType::F32, &cpu())?.requires_grad_(true)?;
            let u = Generator::new(41).normal(&[3, 70], 0.0, 2.0, DType::F32, &cpu())?.requires_grad_(true)?;
            let y = F::swiglu(&g, &u)?;
            y.mul(&y)?.sum()?.backward()?;
            Ok((y.to_vec()?, g.grad().unwrap().to_vec()?, u.grad().unwrap().to_vec()?, y.grad_fn_name()))
        };
        if composite {
            genesis::testing::composites_only(go).unwrap()
        } else {
            go().unwrap()
        }
    };
    let (fused, composite) = (run(false), run(true));
    assert_eq!(fused.3, Some("swiglu"));
    assert_ne!(fused.3, composite.3, "both runs took one path");
    for (a, b) in [(&fused.0, &composite.0), (&fused.1, &composite.1), (&fused.2, &composite.2)] {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 2e-6 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}

/// The largest difference between autograd's gradient of `sum(f(x) · w)` (w fixed, random)
/// for input `which` and a fourth-order finite difference (error O(h⁴) ≈ 1e-13 at h = 1e-3),
/// fine enough to tell f64-exact gradients (~1e-13) from f32-accurate ones (~1e-7).
fn fine_gradient_error(f: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor], which: usize) -> f64 {
    inputs[which].zero_grad();
    let y = f(inputs).unwrap();
    let w = Generator::new(77).uniform(y.shape(), -1.0, 1.0, DType::F64, &cpu()).unwrap();
    y.mul(&w).unwrap().sum().unwrap().backward().unwrap();
    let auto = inputs[which].grad().unwrap().to_vec::<f64>().unwrap();
    let base = inputs[which].to_vec::<f64>().unwrap();
    let loss = |values: &[f64]| -> f64 {
        let mut args: Vec<Tensor> = inputs.iter().map(|t| t.detach()).collect();
        args[which] = Tensor::from_vec(values.to_vec(), inputs[which].shape(), &cpu()).unwrap();
        f(&args).unwrap().mul(&w).unwrap().sum().unwrap().item::<f64>().unwrap()
    };
    let h = 1e-3;
    let mut worst: f64 = 0.0;
    for i in 0..base.len() {
        let at = |d: f64| {
            let mut v = base.clone();
            v[i] += d;
            loss(&v)
        };
        let fd = (at(-2.0 * h) - 8.0 * at(-h) + 8.0 * at(h) - at(2.0 * h)) / (12.0 * h);
        worst = worst.max((fd - auto[i]).abs());
    }
    worst
}

/// Issue 26 item 1: f64 through layer norm, RMS norm, attention and cross-entropy takes the
/// compositions, so its gradients are exact to f64 (the fused kernels keep f32 statistics,
/// which gave errors around 1e-7 here).
#[test]
fn f64_gradients_through_the_norms_attention_and_cross_entropy_are_f64_exact() {
    let (x, w, b) = (rand(&[3, 6], 50), rand(&[6], 51), rand(&[6], 52));
    let errors = [
        fine_gradient_error(
            |t| F::layer_norm(&t[0], &[6], Some(&t[1]), Some(&t[2]), 1e-5),
            &[x.clone(), w.clone(), b],
            0,
        ),
        fine_gradient_error(|t| F::rms_norm(&t[0], &[6], Some(&t[1]), Some(1e-6)), &[x.clone(), w], 0),
        fine_gradient_error(
            |t| F::scaled_dot_product_attention(&t[0], &t[1], &t[2], None, false, None),
            &[rand(&[1, 2, 4, 3], 53), rand(&[1, 1, 5, 3], 54), rand(&[1, 1, 5, 3], 55)],
            0,
        ),
        fine_gradient_error(
            |t| F::cross_entropy(&t[0], &ids(vec![1, 0, 5], &[3]), -100, 0.0, Reduction::Mean),
            &[x],
            0,
        ),
    ];
    assert!(errors.iter().all(|&e| e < 1e-11), "{errors:?}");
}

#[test]
fn add_rms_norm_fused_matches_the_addition_then_the_norm() {
    // f32 (f64 always takes the composition). The loss reads both outputs, so the gradient of
    // the sum flows into x and the residual beside the norm's; a strided residual; the second
    // run records the gradient's own graph (create_graph) and differentiates it again.
    let f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap().detach().requires_grad_(true).unwrap();
    let x = f32(rand(&[3, 5], 60));
    let r = f32(rand(&[5, 3], 61));
    let w = f32(rand(&[5], 62));
    let run = |composite: bool| -> Vec<Vec<f64>> {
        let go = || -> Result<Vec<Vec<f64>>> {
            for t in [&x, &r, &w] {
                t.zero_grad();
            }
            let (y, sum) = F::add_rms_norm(&x, &r.t()?, &[5], Some(&w), Some(1e-6))?;
            let loss = y.mul(&y)?.sum()?.add(&sum.mul(&y)?.sum()?)?;
            let g = genesis::grad(&[loss], &[x.clone(), w.clone()], None, true, true)?;
            let (gx, gw) = (g[0].clone().unwrap(), g[1].clone().unwrap());
            gx.square()?.sum()?.add(&gw.square()?.sum()?)?.backward()?;
            Ok(vec![
                y.to_vec::<f64>()?,
                sum.to_vec::<f64>()?,
                gx.to_vec::<f64>()?,
                gw.to_vec::<f64>()?,
                x.grad().unwrap().to_vec::<f64>()?,
                r.grad().unwrap().to_vec::<f64>()?,
                w.grad().unwrap().to_vec::<f64>()?,
            ])
        };
        if composite {
            genesis::testing::composites_only(go).unwrap()
        } else {
            go().unwrap()
        }
    };
    let (fused, composite) = (run(false), run(true));
    for (a, b) in fused.iter().flatten().zip(composite.iter().flatten()) {
        assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
    }
    // The sum is exactly what `add` stores, and the fused node is the one recorded.
    let (y, sum) = F::add_rms_norm(&x, &r.t().unwrap(), &[5], Some(&w), Some(1e-6)).unwrap();
    assert_eq!(sum.to_vec::<f32>().unwrap(), x.add(&r.t().unwrap()).unwrap().to_vec::<f32>().unwrap());
    assert_eq!(y.grad_fn_name(), Some("add_rms_norm"));
}

/// The gradient that reaches the sum directly goes into the norm's backward op (interface
/// 1.11): `AddRmsNormBackward` runs `rms_norm_backward` and no separate `add`, and the
/// gradients equal those of the addition then the norm, composed, and those of the path for
/// older plugins.
#[test]
fn add_rms_norm_backward_adds_the_sum_gradient_in_the_norm_pass() {
    use genesis::profiler::ProfilerOptions;
    let f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap().detach().requires_grad_(true).unwrap();
    let (x, r, w) = (f32(rand(&[4, 6], 70)), f32(rand(&[4, 6], 71)), f32(rand(&[6], 72)));
    let run = || -> Result<(Vec<String>, Vec<Vec<f32>>)> {
        for t in [&x, &r, &w] {
            t.zero_grad();
        }
        let (y, sum) = F::add_rms_norm(&x, &r, &[6], Some(&w), Some(1e-6))?;
        let loss = y.mul(&y)?.sum()?.add(&sum.mul_scalar(0.5)?.sum()?)?;
        let options = ProfilerOptions { device_time: false, ..Default::default() };
        let ((), events) = profile_this_thread(options, || loss.backward())?;
        let node = events.iter().find(|e| e.name == "AddRmsNormBackward").map(|e| e.id);
        let ops = events.iter().filter(|e| node.is_some() && e.parent == node).map(|e| e.name.clone()).collect();
        let grads = [&x, &r, &w].iter().map(|t| t.grad().unwrap().to_vec::<f32>()).collect::<Result<Vec<_>>>()?;
        Ok((ops, grads))
    };
    let (ops, fused) = run().unwrap();
    assert_eq!(ops, vec!["rms_norm_backward".to_string()], "the ops of AddRmsNormBackward");
    let (_, composite) = genesis::testing::composites_only(run).unwrap();
    for (a, b) in fused.iter().flatten().zip(composite.iter().flatten()) {
        assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
    }
    // A plugin older than interface 1.11 is not sent dsum: the core adds it afterwards, and
    // in f32 the result is the same bit for bit.
    let (older_ops, older) = genesis::testing::as_interface(10, run).unwrap();
    assert_eq!(older_ops, vec!["rms_norm_backward".to_string(), "add".to_string()]);
    assert_eq!(older, fused);
}

/// Under autocast, an f32 stream plus a half-precision branch takes the backend's
/// mixed-precision `add_rms_norm` (interface 1.12): y comes out in the autocast dtype, the
/// sum in f32, and y, the sum and every gradient equal bit for bit what the f32 op with the
/// casts around it gives (the path of older plugins), with the branch's cast gone.
#[test]
fn add_rms_norm_mixed_precision_under_autocast() {
    use genesis::amp::autocast;
    for low in [DType::BF16, DType::F16] {
        let leaf = |t: Tensor| t.detach().requires_grad_(true).unwrap();
        let x = leaf(rand(&[3, 2, 8], 80).to_dtype(DType::F32).unwrap());
        let branch = leaf(rand(&[3, 2, 8], 81).to_dtype(low).unwrap());
        let w = leaf(rand(&[8], 82).to_dtype(DType::F32).unwrap());
        let proj = rand(&[5, 8], 83).to_dtype(DType::F32).unwrap().detach();
        // Both orders of the operands (the sum commutes), read by an autocast layer as in a
        // transformer block, and the sum read on.
        let run = |branch_first: bool| -> Result<(DType, Vec<Vec<f32>>)> {
            for t in [&x, &branch, &w] {
                t.zero_grad();
            }
            autocast(low, || -> Result<(DType, Vec<Vec<f32>>)> {
                let (y, sum) = if branch_first {
                    F::add_rms_norm(&branch, &x, &[8], Some(&w), Some(1e-6))?
                } else {
                    F::add_rms_norm(&x, &branch, &[8], Some(&w), Some(1e-6))?
                };
                assert_eq!(sum.dtype(), DType::F32);
                let h = F::linear(&y, &proj, None)?;
                let loss = h.mul(&h)?.sum()?.add(&sum.mul(&sum)?.sum()?)?;
                loss.backward()?;
                let mut out = vec![y.to_dtype(low)?.to_dtype(DType::F32)?.to_vec::<f32>()?, sum.to_vec::<f32>()?];
                for t in [&x, &branch, &w] {
                    out.push(t.grad().unwrap().to_dtype(DType::F32)?.to_vec::<f32>()?);
                }
                Ok((y.dtype(), out))
            })?
        };
        for branch_first in [false, true] {
            let (y_dtype, mixed) = run(branch_first).unwrap();
            assert_eq!(y_dtype, low, "the mixed form's y is in the autocast dtype");
            let (old_dtype, cast) = genesis::testing::as_interface(11, || run(branch_first)).unwrap();
            assert_eq!(old_dtype, DType::F32, "an older plugin's path gives the composition's f32 y");
            assert_eq!(mixed, cast, "{low} branch_first={branch_first}");
        }
        assert_eq!(branch.grad().unwrap().dtype(), low);
        // From 1.13 the norm's backward writes the branch's gradient in its half dtype too:
        // one cast fewer than 1.12, which rounds the f32 gradient with a cast.
        let casts = |minor: u32| ops_on_this_thread("cast", || genesis::testing::as_interface(minor, || run(false)));
        assert_eq!(casts(13) + 1, casts(12), "{low}");
    }
}

/// Under autocast a linear layer's f32 weight takes its gradient from a widened product (the
/// f32 sums of the half-precision operands, interface 1.13); an older plugin's path rounds it
/// to the autocast dtype first. Everything else is the same bit for bit, and a backward that
/// builds a graph takes the composition.
#[test]
fn linear_weight_gradient_under_autocast_is_formed_in_f32() {
    use genesis::amp::autocast;
    type Grads = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);
    let values = |t: &Tensor| t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    for low in [DType::BF16, DType::F16] {
        let leaf = |t: Tensor| t.to_dtype(DType::F32).unwrap().detach().requires_grad_(true).unwrap();
        let (x, w, b) = (leaf(rand(&[3, 4, 40], 90)), leaf(rand(&[6, 40], 91)), leaf(rand(&[6], 92)));
        let upstream = rand(&[3, 4, 6], 93).detach().to_dtype(low).unwrap();
        let f32s = |t: &Tensor| t.to_dtype(DType::F32).and_then(|t| t.to_vec::<f32>());
        let run = || -> Result<Grads> {
            for t in [&x, &w, &b] {
                t.zero_grad();
            }
            autocast(low, || -> Result<Grads> {
                let y = F::linear(&x, &w, Some(&b))?;
                assert_eq!(y.dtype(), low);
                y.mul(&upstream)?.sum()?.backward()?;
                let grad = |t: &Tensor| f32s(&t.grad().expect("a gradient"));
                Ok((f32s(&y)?, grad(&x)?, grad(&w)?, grad(&b)?))
            })?
        };
        let (y, dx, dw, db) = run().unwrap();
        assert_eq!(w.grad().unwrap().dtype(), DType::F32);
        let (y_old, dx_old, dw_old, db_old) = genesis::testing::as_interface(12, run).unwrap();
        assert_eq!((y, dx, db), (y_old, dx_old, db_old), "{low}: only the weight's gradient may differ");
        // dW[o][i] = Σ_rows g[r][o] · x_low[r][i], from the half-precision values, in f64.
        let (g, xl) = (values(&upstream), values(&x.detach().to_dtype(low).unwrap()));
        let (mut max_new, mut max_old) = (0f64, 0f64);
        for o in 0..6 {
            for i in 0..40 {
                let terms = (0..12).map(|r| g[r * 6 + o] * xl[r * 40 + i]);
                let (exact, size) = terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()));
                let (new, old) = (dw[o * 40 + i] as f64, dw_old[o * 40 + i] as f64);
                assert!((new - exact).abs() <= 1e-6 * size + 1e-30, "{low} dW[{o}][{i}]: {new} against {exact}");
                max_new = max_new.max((new - exact).abs());
                max_old = max_old.max((old - exact).abs());
            }
        }
        assert!(max_new * 50.0 < max_old, "{low}: f32 error {max_new:e}, rounded path's {max_old:e}");
        let casts = |minor: u32| ops_on_this_thread("cast", || genesis::testing::as_interface(minor, run));
        assert_eq!(casts(13) + 1, casts(12), "{low}: the weight's gradient needs no cast");
        // With create_graph the gradient is the composition's, and differentiable.
        let grads = autocast(low, || -> Result<Vec<Option<Tensor>>> {
            let y = F::linear(&x, &w, Some(&b))?;
            genesis::grad(&[y.mul(&upstream)?.sum()?], std::slice::from_ref(&w), None, false, true)
        })
        .unwrap()
        .unwrap();
        let dw_graph = grads[0].as_ref().expect("a gradient");
        assert!(dw_graph.requires_grad());
        assert_eq!(f32s(dw_graph).unwrap(), dw_old);
    }
}

#[test]
fn add_rms_norm_gradcheck_and_errors() {
    let (x, r, w) = (rand(&[2, 4], 63), rand(&[2, 4], 64), rand(&[4], 65));
    check(
        |t| {
            let (y, sum) = F::add_rms_norm(&t[0], &t[1], &[4], Some(&t[2]), Some(1e-6))?;
            y.mul(&sum)
        },
        &[x.clone(), r, w],
    );
    let kind = |r: Result<(Tensor, Tensor)>| r.unwrap_err().kind();
    assert_eq!(kind(F::add_rms_norm(&x, &rand(&[2, 4], 1), &[3], None, None)), ErrorKind::ShapeMismatch);
    assert_eq!(kind(F::add_rms_norm(&x, &rand(&[2, 3], 1), &[4], None, None)), ErrorKind::ShapeMismatch);
    assert_eq!(kind(F::add_rms_norm(&x, &x, &[4], None, Some(-1.0))), ErrorKind::InvalidArgument);
}

#[test]
fn add_rms_norm_linear_is_the_residual_norm_then_the_linear_layer() {
    // Without gradients it is the backend's fused op; the separate ops are the reference. One
    // row, two rows, a batch of sequences, strided operands, with and without a bias, gated or
    // not, in f32 and bf16 (where the op rounds the normed rows, the product and the gate as
    // the separate ops do).
    let no_grad = |t: Tensor, dtype: DType| t.to_dtype(dtype).unwrap().detach();
    for dtype in [DType::F32, DType::BF16] {
        for (lead, seed) in [(vec![1, 1], 70), (vec![2, 1], 71), (vec![2, 3], 72)] {
            let k = 16;
            let shape = [lead.clone(), vec![k]].concat();
            let x = no_grad(rand(&shape, seed), dtype);
            let r = no_grad(rand(&[shape.clone(), vec![2]].concat(), seed + 1), dtype).select(-1, 1).unwrap();
            let g = no_grad(rand(&[k], seed + 2), dtype);
            let w = no_grad(rand(&[k, 12], seed + 3), dtype).t().unwrap();
            let b = no_grad(rand(&[12], seed + 4), dtype);
            for (bias, gated) in [(None, false), (Some(&b), false), (None, true), (Some(&b), true)] {
                let fused = || F::add_rms_norm_linear(&x, &r, Some(&g), Some(1e-6), &w, bias, gated);
                let (y, sum) = genesis::autograd::no_grad(fused).unwrap();
                // The ops it is defined by, one at a time.
                let separate = || -> Result<(Tensor, Tensor)> {
                    let (h, sum) = F::add_rms_norm(&x, &r, &[k], Some(&g), Some(1e-6))?;
                    let p = F::linear(&h, &w, bias)?;
                    let y = if gated { F::swiglu(&p.narrow(-1, 0, 6)?, &p.narrow(-1, 6, 6)?)? } else { p };
                    Ok((y, sum))
                };
                let (y_ref, sum_ref) = separate().unwrap();
                assert_eq!(y.shape(), [lead.clone(), vec![if gated { 6 } else { 12 }]].concat());
                assert_eq!(sum.to_vec::<f32>().unwrap(), sum_ref.to_vec::<f32>().unwrap());
                let tol = if dtype == DType::BF16 { 1e-2 } else { 1e-5 };
                for (a, e) in y.to_vec::<f32>().unwrap().iter().zip(y_ref.to_vec::<f32>().unwrap()) {
                    assert!((a - e).abs() <= tol * (1.0 + e.abs()), "{dtype} {lead:?}: {a} vs {e}");
                }
            }
        }
    }
}

#[test]
fn add_rms_norm_linear_records_gradients_through_the_composition() {
    let (x, r, g, w, b) = (rand(&[2, 4], 80), rand(&[2, 4], 81), rand(&[4], 82), rand(&[3, 4], 83), rand(&[3], 84));
    // The finite differences run the fused op (no gradient recorded there), the analytic
    // gradient the composition.
    check(
        |t| {
            let (y, sum) = F::add_rms_norm_linear(&t[0], &t[1], Some(&t[2]), Some(1e-6), &t[3], Some(&t[4]), false)?;
            y.sum_dims(&[-1], true)?.mul(&sum)
        },
        &[x.clone(), r, g.clone(), w.clone(), b],
    );
    let kind = |res: Result<(Tensor, Tensor)>| res.unwrap_err().kind();
    let plain = |t: &Tensor| t.detach();
    let bad_weight = plain(&rand(&[3, 5], 1));
    assert_eq!(
        kind(genesis::autograd::no_grad(|| {
            F::add_rms_norm_linear(&plain(&x), &plain(&x), Some(&plain(&g)), None, &bad_weight, None, false)
        })),
        ErrorKind::ShapeMismatch
    );
    assert_eq!(
        kind(F::add_rms_norm_linear(&x, &rand(&[2, 3], 1), Some(&g), None, &w, None, false)),
        ErrorKind::ShapeMismatch
    );
    // A gated weight needs an even row count (gate rows, then as many up rows).
    assert_eq!(kind(F::add_rms_norm_linear(&x, &x, Some(&g), None, &w, None, true)), ErrorKind::ShapeMismatch);
    let (w2, b2) = (rand(&[6, 4], 85), rand(&[6], 86));
    check(
        |t| {
            let (y, sum) = F::add_rms_norm_linear(&t[0], &t[1], Some(&t[2]), Some(1e-6), &t[3], Some(&t[4]), true)?;
            y.sum_dims(&[-1], true)?.mul(&sum)
        },
        &[x, rand(&[2, 4], 87), g, w2, b2],
    );
}
