//! Optimizer behaviour beyond the PyTorch reference values: state dicts and their errors,
//! gradient clipping, the loss scaler, parameter checks.

use genesis::optim::{
    clip_coefficient, clip_grad_norm_, clip_grad_value_, get_total_norm, Adam, AdamOptions, AdamW, GradScaler,
    GradScalerOptions, Optimizer, SgdOptions, SGD,
};
use genesis::{f16, DType, Device, Result, Tensor};

mod common;
use common::one_profiler;

fn param(values: &[f32], shape: &[usize], cpu: &Device) -> Result<Tensor> {
    Tensor::from_slice(values, shape, cpu)?.requires_grad_(true)
}

fn set_grad(p: &Tensor, values: &[f32]) -> Result<()> {
    p.set_grad(Some(Tensor::from_slice(values, p.shape(), p.device())?.to_dtype(p.dtype())?))
}

#[test]
fn adam_state_dict_round_trip_continues_identically() -> Result<()> {
    let cpu = Device::cpu()?;
    let make = || -> Result<(Vec<Tensor>, AdamW)> {
        let ps = vec![param(&[1.0, -2.0, 3.0], &[3], &cpu)?, param(&[0.5, 0.25], &[1, 2], &cpu)?];
        let opt = AdamW::new(ps.clone(), AdamOptions { lr: 0.1, ..AdamOptions::adamw() })?;
        Ok((ps, opt))
    };
    let grads = |k: f32| [vec![0.1 * k, -0.2, 0.3], vec![k, -k]];
    let (ps, mut opt) = make()?;
    for k in 0..3 {
        for (p, g) in ps.iter().zip(grads(k as f32)) {
            set_grad(p, &g)?;
        }
        opt.step()?;
    }
    let state = opt.state_dict()?;
    assert_eq!(state.kind, "AdamW");
    assert_eq!(state.scalar("state.0.step")?, 3.0);
    let (ps2, mut opt2) = make()?;
    for (a, b) in ps2.iter().zip(&ps) {
        genesis::no_grad(|| a.copy_(b))?;
    }
    opt2.load_state_dict(&state)?;
    for k in 3..5 {
        for (p, g) in ps.iter().chain(&ps2).zip(grads(k as f32).iter().chain(grads(k as f32).iter())) {
            set_grad(p, g)?;
        }
        opt.step()?;
        opt2.step()?;
    }
    for (a, b) in ps.iter().zip(&ps2) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    }
    Ok(())
}

#[test]
fn state_dicts_for_other_parameters_are_refused_and_change_nothing() -> Result<()> {
    let cpu = Device::cpu()?;
    let a = param(&[1.0, 2.0], &[2], &cpu)?;
    let mut source = SGD::new(vec![a.clone()], SgdOptions { lr: 0.1, momentum: 0.9, ..Default::default() })?;
    set_grad(&a, &[1.0, 1.0])?;
    source.step()?;
    let state = source.state_dict()?;

    // Wrong count.
    let (b, c) = (param(&[0.0, 0.0], &[2], &cpu)?, param(&[0.0], &[1], &cpu)?);
    let mut two = SGD::new(vec![b.clone(), c], SgdOptions { lr: 0.5, ..Default::default() })?;
    let err = two.load_state_dict(&state).unwrap_err();
    assert!(err.message().contains("parameters"), "{err}");
    assert_eq!(two.lrs(), vec![0.5], "a refused state must not change the options");

    // Wrong shape.
    let d = param(&[0.0, 0.0, 0.0], &[3], &cpu)?;
    let mut other_shape = SGD::new(vec![d.clone()], SgdOptions { lr: 0.5, ..Default::default() })?;
    let err = other_shape.load_state_dict(&state).unwrap_err();
    assert_eq!(err.kind(), genesis::ErrorKind::ShapeMismatch, "{err}");
    assert_eq!(other_shape.lrs(), vec![0.5]);
    set_grad(&d, &[1.0, 1.0, 1.0])?;
    other_shape.step()?; // no momentum buffer was half-loaded: plain SGD step
    assert_eq!(d.to_vec::<f32>()?, vec![-0.5, -0.5, -0.5]);

    // Wrong optimizer kind.
    let mut adam = Adam::new(vec![b], AdamOptions::default())?;
    let err = adam.load_state_dict(&state).unwrap_err();
    assert!(err.message().contains("made by SGD"), "{err}");

    // Missing entries.
    let mut broken = state.clone();
    broken.scalars.remove("param_groups.0.momentum");
    let e =
        SGD::new(vec![param(&[0.0, 0.0], &[2], &cpu)?], SgdOptions::default())?.load_state_dict(&broken).unwrap_err();
    assert!(e.message().contains("param_groups.0.momentum"), "{e}");
    Ok(())
}

#[test]
fn bad_parameters_and_options_are_errors() -> Result<()> {
    let cpu = Device::cpu()?;
    let a = param(&[1.0], &[1], &cpu)?;
    assert!(SGD::new(vec![a.clone(), a.clone()], SgdOptions::default()).is_err(), "duplicate parameter");
    let non_leaf = a.mul_scalar(2.0)?;
    let err = SGD::new(vec![non_leaf], SgdOptions::default()).unwrap_err();
    assert!(err.message().contains("not a leaf"), "{err}");
    let ints = Tensor::from_vec(vec![1i64], &[1], &cpu)?;
    assert!(SGD::new(vec![ints], SgdOptions::default()).is_err());
    assert!(SGD::new(vec![a.clone()], SgdOptions { nesterov: true, ..Default::default() }).is_err());
    assert!(Adam::new(vec![a.clone()], AdamOptions { betas: (1.0, 0.999), ..Default::default() }).is_err());
    assert!(Adam::new(vec![a.clone()], AdamOptions { lr: f64::NAN, ..Default::default() }).is_err());
    let mut opt = SGD::new(vec![a], SgdOptions::default())?;
    assert!(opt.set_lrs(&[0.1, 0.2]).is_err());
    Ok(())
}

/// The fused kernel (AdamW, or Adam without weight decay) and the composed update agree:
/// Adam with maximize on negated gradients takes the composed path for the same update.
#[test]
fn fused_and_composed_adam_agree() -> Result<()> {
    let cpu = Device::cpu()?;
    let init = [0.3f32, -1.2, 2.5, 0.0, 7.0, -0.01];
    let (p1, p2) = (param(&init, &[2, 3], &cpu)?, param(&init, &[2, 3], &cpu)?);
    let o = AdamOptions { lr: 0.05, ..Default::default() };
    let mut fused = Adam::new(vec![p1.clone()], o.clone())?;
    let mut composed = Adam::new(vec![p2.clone()], AdamOptions { maximize: true, ..o })?;
    for k in 0..4 {
        let g: Vec<f32> = init.iter().map(|v| (v * (k as f32 + 1.0)).sin()).collect();
        set_grad(&p1, &g)?;
        set_grad(&p2, &g.iter().map(|v| -v).collect::<Vec<_>>())?;
        fused.step()?;
        composed.step()?;
    }
    for (x, y) in p1.to_vec::<f32>()?.iter().zip(p2.to_vec::<f32>()?) {
        assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{x} vs {y}");
    }
    Ok(())
}

#[test]
fn clip_grad_norm_scales_to_max_norm_and_returns_the_total() -> Result<()> {
    let cpu = Device::cpu()?;
    let (a, b, c) = (param(&[0.0, 0.0], &[2], &cpu)?, param(&[0.0], &[1], &cpu)?, param(&[0.0], &[1], &cpu)?);
    set_grad(&a, &[3.0, 0.0])?;
    set_grad(&b, &[4.0])?; // c has no gradient: skipped
    let params = [a.clone(), b.clone(), c.clone()];
    let total = clip_grad_norm_(&params, 1.0, 2.0)?;
    assert_eq!((total.shape(), total.dtype()), (&[][..], DType::F32));
    assert!((total.item::<f64>()? - 5.0).abs() < 1e-6);
    let coef = 1.0 / (5.0 + 1e-6);
    assert!((a.grad().unwrap().to_vec::<f32>()?[0] as f64 - 3.0 * coef).abs() < 1e-6);
    assert!((b.grad().unwrap().to_vec::<f32>()?[0] as f64 - 4.0 * coef).abs() < 1e-6);
    assert!(c.grad().is_none());
    // Under the limit: unchanged; infinity norm.
    set_grad(&a, &[0.1, -0.2])?;
    set_grad(&b, &[0.05])?;
    assert!((clip_grad_norm_(&params, 1.0, f64::INFINITY)?.item::<f64>()? - 0.2).abs() < 1e-7);
    assert_eq!(a.grad().unwrap().to_vec::<f32>()?, vec![0.1, -0.2]);
    assert!(clip_grad_norm_(&params, 1.0, 0.0).is_err());
    clip_grad_value_(&params, 0.15)?;
    assert_eq!(a.grad().unwrap().to_vec::<f32>()?, vec![0.1, -0.15]);
    Ok(())
}

/// The total norm and the clipping stay on the device: no read to the host however many
/// gradients there are (the reads of the Qwen2 SFT step left the device idle ~10 ms a step).
/// Also checks the 1-norm, that a NaN gradient gives a NaN norm, and that no gradients give 0.
#[test]
fn clip_grad_norm_never_reads_the_device() -> Result<()> {
    use genesis::profiler::{profile, record_function, ProfilerOptions};
    let cpu = Device::cpu()?;
    let params = (0..12).map(|i| param(&[i as f32, -1.0, 2.0], &[3], &cpu)).collect::<Result<Vec<_>>>()?;
    for (i, p) in params.iter().enumerate() {
        set_grad(p, &[0.5 * i as f32, -1.0, 0.0])?;
    }
    let options = ProfilerOptions { device_time: false, ..Default::default() };
    // Other tests of this binary may run ops meanwhile: count the reads inside this span.
    let _profiling = one_profiler();
    let (total, prof) = profile(options, || {
        let _clip = record_function("clip");
        clip_grad_norm_(&params, 1e9, 1.0)
    })?;
    let clip = prof.events().iter().find(|e| e.name == "clip").map(|e| e.id);
    let reads = prof.events().iter().filter(|e| e.name == "copy_to_host" && e.parent == clip).count();
    assert_eq!(reads, 0, "reads to the host: {reads}");
    let expected: f64 = (0..12).map(|i| 0.5 * i as f64 + 1.0).sum();
    assert!((total.item::<f64>()? - expected).abs() < 1e-4, "{total:?} vs {expected}");
    set_grad(&params[3], &[f32::NAN, 0.0, 0.0])?;
    assert!(clip_grad_norm_(&params, 1.0, 2.0)?.item::<f64>()?.is_nan());
    assert!(params[0].grad().unwrap().to_vec::<f32>()?.iter().all(|g| g.is_nan()), "a NaN norm spreads");
    assert!(clip_grad_norm_(&params, 1.0, f64::INFINITY)?.item::<f64>()?.is_nan());
    let none = param(&[1.0], &[1], &cpu)?;
    assert_eq!(clip_grad_norm_(&[none], 1.0, 2.0)?.item::<f64>()?, 0.0);
    Ok(())
}

/// Gradients that lie back to back in one buffer (those of layers stored together, such as
/// Qwen2's stacked q/k/v projections) are reduced as one tensor, one input of the multi-tensor
/// `foreach_sum_squares` (or one `sum_squares`, per gradient path) per run, and give the norm
/// of the same values held apart; a gap in the buffer starts a new run.
#[test]
fn adjacent_gradients_are_reduced_together() -> Result<()> {
    use genesis::profiler::{profile, record_function, ProfilerOptions};
    let cpu = Device::cpu()?;
    let values: Vec<f32> = (0..20).map(|i| (i as f32 - 7.5) * 0.25).collect();
    let buffer = Tensor::from_slice(&values, &[20], &cpu)?;
    // Rows 0..4, 4..10 and 10..12 are back to back (listed out of order, as a parameter list
    // interleaves stacked weights with their biases); 14..20 follows a gap.
    let spans = [(4, 6), (14, 6), (0, 4), (10, 2)];
    let zeros = |&(_, len): &(usize, usize)| param(&vec![0.0; len], &[len], &cpu);
    let joined = spans.iter().map(zeros).collect::<Result<Vec<_>>>()?;
    let apart = spans.iter().map(zeros).collect::<Result<Vec<_>>>()?;
    for ((j, a), &(start, len)) in joined.iter().zip(&apart).zip(&spans) {
        j.set_grad(Some(buffer.narrow(0, start, len)?))?;
        a.set_grad(Some(Tensor::from_slice(&values[start..start + len], &[len], &cpu)?))?;
    }
    let options = ProfilerOptions { device_time: false, record_shapes: true, ..Default::default() };
    // The norm, the tensors reduced (inputs of the reductions) and the launches of reductions.
    let reductions = |params: &[Tensor]| -> Result<(f64, usize, usize)> {
        let _profiling = one_profiler();
        let (total, prof) = profile(options, || {
            let _norm = record_function("norm");
            get_total_norm(params, 2.0)
        })?;
        let norm = prof.events().iter().find(|e| e.name == "norm").map(|e| e.id);
        let ops: Vec<_> = prof
            .events()
            .iter()
            .filter(|e| (e.name == "sum_squares" || e.name == "foreach_sum_squares") && e.parent == norm)
            .collect();
        Ok((total.item::<f64>()?, ops.iter().map(|e| e.shapes.len()).sum(), ops.len()))
    };
    let (joined_norm, joined_count, joined_ops) = reductions(&joined)?;
    let (apart_norm, apart_count, apart_ops) = reductions(&apart)?;
    assert_eq!((joined_count, apart_count), (2, 4));
    // The CPU backend has the multi-tensor op: one op for the whole list.
    assert_eq!((joined_ops, apart_ops), (1, 1));
    // Without the fused kernels each run is its own reduction, to the same norm.
    let composed = genesis::testing::composites_only(|| get_total_norm(&apart, 2.0))?.item::<f64>()?;
    assert!((composed - apart_norm).abs() < 1e-6, "{composed} vs {apart_norm}");
    let expected = spans.iter().flat_map(|&(s, n)| &values[s..s + n]).map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
    assert!(
        (joined_norm - expected).abs() < 1e-5 && (apart_norm - expected).abs() < 1e-5,
        "{joined_norm} {apart_norm}"
    );
    // The max-norm over the joined run too.
    assert_eq!(get_total_norm(&joined, f64::INFINITY)?.item::<f64>()?, 2.875);
    Ok(())
}

/// Clipping inside AdamW's update (`step_with_grad_scale` with `clip_coefficient`) gives the
/// parameters `clip_grad_norm_` then `step` gives, on the fused kernel and on the composed
/// update (Adam's L2 decay takes the composition), and leaves the gradients as they were.
#[test]
fn adamw_step_with_the_clip_factor_equals_clipping_then_stepping() -> Result<()> {
    use genesis::testing::composites_only;
    let cpu = Device::cpu()?;
    let grads = [vec![3.0, -4.0, 0.5], vec![12.0, -0.25]];
    // The parameters and the gradients after two steps.
    type Values = Vec<Vec<f32>>;
    let run = |scaled: bool, composed: bool, l2: bool| -> Result<(Values, Values)> {
        let ps = vec![param(&[1.0, -2.0, 3.0], &[3], &cpu)?, param(&[0.5, 0.25], &[1, 2], &cpu)?];
        let options = AdamOptions {
            lr: 0.1,
            ..if l2 { AdamOptions { weight_decay: 0.1, ..Default::default() } } else { AdamOptions::adamw() }
        };
        let mut adamw = AdamW::new(ps.clone(), options.clone())?;
        let mut adam = Adam::new(ps.clone(), options)?;
        for _ in 0..2 {
            for (p, g) in ps.iter().zip(&grads) {
                set_grad(p, g)?;
            }
            let mut step = || -> Result<()> {
                match (scaled, l2) {
                    (true, false) => adamw.step_with_grad_scale(&clip_coefficient(&get_total_norm(&ps, 2.0)?, 1.0)?),
                    (true, true) => adam.step_with_grad_scale(&clip_coefficient(&get_total_norm(&ps, 2.0)?, 1.0)?),
                    (false, _) => {
                        clip_grad_norm_(&ps, 1.0, 2.0)?;
                        if l2 {
                            adam.step()
                        } else {
                            adamw.step()
                        }
                    }
                }
            };
            if composed {
                composites_only(&mut step)?
            } else {
                step()?
            }
        }
        let values = |f: &dyn Fn(&Tensor) -> Result<Vec<f32>>| ps.iter().map(f).collect::<Result<Vec<_>>>();
        Ok((values(&|p| p.to_vec::<f32>())?, values(&|p| p.grad().unwrap().to_vec::<f32>())?))
    };
    for (composed, l2) in [(false, false), (true, false), (false, true)] {
        let (clipped, _) = run(false, composed, l2)?;
        let (scaled, grads_after) = run(true, composed, l2)?;
        for (a, b) in clipped.iter().flatten().zip(scaled.iter().flatten()) {
            assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "composed {composed}, l2 {l2}: {a} vs {b}");
        }
        assert_eq!(grads_after, grads.to_vec(), "the gradients are left as they were");
    }
    // A plugin older than interface 1.10 is not sent the scale: the core scales the gradients
    // first (into copies), with the same result.
    let (fused, _) = run(true, false, false)?;
    let (older, grads_after) = genesis::testing::as_interface(9, || run(true, false, false))?;
    assert_eq!(older, fused, "interface 1.9");
    assert_eq!(grads_after, grads.to_vec(), "interface 1.9: the gradients are left as they were");
    let p = param(&[1.0], &[1], &cpu)?;
    set_grad(&p, &[1.0])?;
    let mut opt = AdamW::new(vec![p.clone()], AdamOptions::adamw())?;
    assert!(opt.step_with_grad_scale(&Tensor::from_slice(&[1.0f32, 2.0], &[2], &cpu)?).is_err());
    assert_eq!(p.to_vec::<f32>()?, vec![1.0], "a refused step changes nothing");
    Ok(())
}

/// A gradient shared between two parameters (as the backward of an addition gives) is
/// clipped once for each, not twice.
#[test]
fn clipping_does_not_scale_shared_gradients_twice() -> Result<()> {
    let cpu = Device::cpu()?;
    let (a, b) = (param(&[1.0], &[1], &cpu)?, param(&[2.0], &[1], &cpu)?);
    a.add(&b)?.mul_scalar(10.0)?.sum()?.backward()?;
    clip_grad_norm_(&[a.clone(), b.clone()], 1.0, 2.0)?;
    let expect = 10.0 / (200f64.sqrt() + 1e-6);
    for p in [&a, &b] {
        assert!((p.grad().unwrap().item::<f32>()? as f64 - expect).abs() < 1e-6);
    }
    Ok(())
}

#[test]
fn grad_scaler_skips_steps_on_inf_and_adapts_the_scale() -> Result<()> {
    let cpu = Device::cpu()?;
    let w = Tensor::from_vec(vec![f16::from_f32(1.0), f16::from_f32(2.0)], &[2], &cpu)?.requires_grad_(true)?;
    let mut opt = SGD::new(vec![w.clone()], SgdOptions { lr: 0.5, ..Default::default() })?;
    let options = GradScalerOptions { init_scale: 1024.0, growth_interval: 2, ..Default::default() };
    let mut scaler = GradScaler::new(options)?;

    // A clean step: gradient of sum(w) is 1 each, scaled by 1024 in f16, unscaled before the step.
    let loss = w.to_dtype(DType::F32)?.sum()?;
    scaler.scale(&loss)?.backward()?;
    assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![1024.0, 1024.0]);
    assert!(scaler.step(&mut opt)?);
    scaler.update()?;
    assert_eq!(w.to_vec::<f32>()?, vec![0.5, 1.5]);
    assert_eq!(scaler.get_scale(), 1024.0);

    // An overflowing gradient: 1024 · 100 exceeds f16's range, so the step is skipped.
    opt.zero_grad();
    let loss = w.to_dtype(DType::F32)?.mul_scalar(100.0)?.sum()?;
    scaler.scale(&loss)?.backward()?;
    assert!(w.grad().unwrap().to_vec::<f32>()?.iter().any(|v| v.is_infinite()));
    assert!(!scaler.step(&mut opt)?, "the step must be skipped");
    scaler.update()?;
    assert_eq!(w.to_vec::<f32>()?, vec![0.5, 1.5], "weights unchanged by a skipped step");
    assert_eq!(scaler.get_scale(), 512.0);

    // Two clean steps in a row grow the scale again.
    for _ in 0..2 {
        opt.zero_grad();
        scaler.scale(&w.to_dtype(DType::F32)?.sum()?)?.backward()?;
        scaler.unscale_(&opt)?;
        assert!(scaler.unscale_(&opt).is_err(), "unscale_ twice in one iteration");
        assert!(scaler.step(&mut opt)?);
        scaler.update()?;
    }
    assert_eq!(scaler.get_scale(), 1024.0);
    assert!(scaler.update().is_err(), "update without a step");
    let state = scaler.state_dict();
    let mut other = GradScaler::new(GradScalerOptions::default())?;
    other.load_state_dict(&state)?;
    assert_eq!(other.get_scale(), 1024.0);
    Ok(())
}

/// The moments are made once: a later AdamW step fills no new tensors (making them on every
/// step, then dropping them, cost a zeroed copy of the parameters twice per step).
#[test]
fn adamw_makes_its_moments_on_the_first_step_only() -> Result<()> {
    use genesis::profiler::{profile, record_function, ProfilerOptions};
    let cpu = Device::cpu()?;
    let params = vec![param(&[1.0, -2.0, 3.0], &[3], &cpu)?, param(&[0.5, 0.25], &[1, 2], &cpu)?];
    let mut opt = AdamW::new(params.clone(), AdamOptions { lr: 0.1, ..AdamOptions::adamw() })?;
    let fills_in_step = |opt: &mut AdamW| -> Result<usize> {
        for p in &params {
            set_grad(p, &vec![0.5; p.numel()])?;
        }
        let options = ProfilerOptions { device_time: false, ..Default::default() };
        let _profiling = one_profiler();
        let ((), prof) = profile(options, || {
            let _step = record_function("step");
            opt.step()
        })?;
        let step = prof.events().iter().find(|e| e.name == "step").map(|e| e.id);
        Ok(prof.events().iter().filter(|e| e.name == "fill" && e.parent == step).count())
    };
    assert_eq!(fills_in_step(&mut opt)?, 4, "two moments per parameter on the first step");
    assert_eq!(fills_in_step(&mut opt)?, 0, "none after it");
    Ok(())
}
