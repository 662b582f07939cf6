//! Convolution, pooling, attention, rotary and dropout: gradient checks (fused kernels and
//! compositions, strided inputs, groups/stride/padding/dilation, grouped-query heads),
//! fused-vs-composite agreement, known values and bad inputs.

use genesis::nn::functional as F;
use genesis::testing::{composites_only, gradcheck, GradcheckOptions};
use genesis::{manual_seed, DType, Device, ErrorKind, Generator, Result, Tensor};

mod common;
use common::profile_this_thread;

fn cpu() -> Device {
    Device::parse("cpu").unwrap()
}

fn rand(shape: &[usize], seed: u64) -> Tensor {
    Generator::new(seed).uniform(shape, -1.0, 1.0, DType::F64, &cpu()).unwrap().requires_grad_(true).unwrap()
}

fn check(f: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor]) {
    gradcheck(&f, inputs, GradcheckOptions::default()).unwrap();
    composites_only(|| gradcheck(&f, inputs, GradcheckOptions::default())).unwrap();
}

/// Output values, input gradients and the name of the last recorded op.
type Run = (Vec<f64>, Vec<Vec<f64>>, Option<&'static str>);

/// Both paths give the same value and the same first-order gradients.
fn agree(f: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor], tol: f64) {
    let run = |composite: bool| -> Run {
        let go = || -> Result<Run> {
            for t in inputs {
                t.zero_grad();
            }
            let y = f(inputs)?;
            let w = Generator::new(99).uniform(y.shape(), -1.0, 1.0, y.dtype(), y.device())?;
            y.mul(&w)?.sum()?.backward()?;
            let grads =
                inputs.iter().map(|t| t.grad().map_or(Ok(vec![]), |g| g.to_vec::<f64>())).collect::<Result<_>>()?;
            Ok((y.to_vec::<f64>()?, grads, y.grad_fn_name()))
        };
        if composite {
            composites_only(go).unwrap()
        } else {
            go().unwrap()
        }
    };
    let (fused, composite) = (run(false), run(true));
    // The last recorded op tells the two paths apart: make sure both really ran.
    assert_ne!(fused.2, composite.2, "the fused and composite runs took the same path");
    let close = |a: &[f64], b: &[f64], what: &str| {
        assert_eq!(a.len(), b.len(), "{what}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()) || (x.is_nan() && y.is_nan()), "{what}: {x} vs {y}");
        }
    };
    close(&fused.0, &composite.0, "value");
    for (i, (a, b)) in fused.1.iter().zip(&composite.1).enumerate() {
        close(a, b, &format!("grad {i}"));
    }
}

#[test]
fn conv2d_gradcheck_geometries() {
    let x = rand(&[2, 4, 5, 6], 1);
    let w = rand(&[6, 2, 3, 2], 2);
    let b = rand(&[6], 3);
    check(|t| F::conv2d(&t[0], &t[1], Some(&t[2]), [2, 1], [1, 1], [1, 2], 2), &[x.clone(), w.clone(), b]);
    // A strided (transposed twice, sliced) input and no bias.
    let w1 = rand(&[3, 4, 2, 2], 4);
    check(
        |t| {
            F::conv2d(
                &t[0].transpose(2, 3)?.transpose(2, 3)?.slice(3, 0, 6, 2)?,
                &t[1],
                None,
                [1, 1],
                [0, 0],
                [1, 1],
                1,
            )
        },
        &[x, w1],
    );
}

#[test]
fn conv2d_second_order() {
    let x = rand(&[1, 2, 4, 4], 5);
    let w = rand(&[2, 2, 3, 3], 6);
    gradcheck(
        |t| {
            let _on = genesis::autograd::set_grad_enabled(true);
            let x = if t[0].requires_grad() { t[0].clone() } else { t[0].detach().requires_grad_(true)? };
            let y = F::conv2d(&x, &t[1], None, [1, 1], [1, 1], [1, 1], 1)?;
            Ok(genesis::grad(&[y.square()?.sum()?], &[x], None, true, true)?[0].clone().unwrap())
        },
        &[x, w],
        GradcheckOptions::default(),
    )
    .unwrap();
}

#[test]
fn conv2d_fused_matches_composite() {
    let x = rand(&[2, 6, 7, 7], 7);
    let w = rand(&[4, 3, 3, 3], 8);
    let b = rand(&[4], 9);
    agree(|t| F::conv2d(&t[0], &t[1], Some(&t[2]), [2, 2], [1, 1], [1, 1], 2), &[x, w, b], 1e-10);
}

#[test]
fn conv2d_known_value() {
    // A 2x2 all-ones kernel sums each 2x2 window.
    let x = Tensor::from_vec((0..9).map(|v| v as f32).collect(), &[1, 1, 3, 3], &cpu()).unwrap();
    let w = Tensor::ones(&[1, 1, 2, 2], DType::F32, &cpu()).unwrap();
    let y = F::conv2d(&x, &w, None, [1, 1], [0, 0], [1, 1], 1).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![8.0, 12.0, 20.0, 24.0]);
    let y = composites_only(|| F::conv2d(&x, &w, None, [1, 1], [0, 0], [1, 1], 1)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![8.0, 12.0, 20.0, 24.0]);
}

#[test]
fn pooling_gradcheck_and_agreement() {
    // Distinct values so the max is unique and both paths route the gradient alike.
    let x =
        Tensor::from_vec((0..2 * 3 * 6 * 5).map(|v| ((v * 37) % 101) as f64 / 50.0).collect(), &[2, 3, 6, 5], &cpu())
            .unwrap()
            .requires_grad_(true)
            .unwrap();
    check(|t| F::max_pool2d(&t[0], [3, 2], [2, 1], [1, 1], [1, 2]), std::slice::from_ref(&x));
    check(|t| F::avg_pool2d(&t[0], [3, 3], [2, 2], [1, 1]), std::slice::from_ref(&x));
    check(|t| F::adaptive_avg_pool2d(&t[0], [4, 3]), std::slice::from_ref(&x));
    agree(|t| F::max_pool2d(&t[0], [2, 2], [2, 2], [0, 0], [1, 1]), std::slice::from_ref(&x), 1e-12);
    agree(|t| F::avg_pool2d(&t[0], [3, 2], [1, 2], [1, 1]), std::slice::from_ref(&x), 1e-12);
}

#[test]
fn pooling_known_values() {
    let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), &[1, 1, 4, 4], &cpu()).unwrap();
    assert_eq!(
        F::max_pool2d(&x, [2, 2], [2, 2], [0, 0], [1, 1]).unwrap().to_vec::<f32>().unwrap(),
        vec![5.0, 7.0, 13.0, 15.0]
    );
    assert_eq!(F::avg_pool2d(&x, [2, 2], [2, 2], [0, 0]).unwrap().to_vec::<f32>().unwrap(), vec![2.5, 4.5, 10.5, 12.5]);
    // Adaptive pooling of 4 into 3 bins uses [0,2), [1,3), [2,4) as PyTorch does.
    let a = F::adaptive_avg_pool2d(&x, [1, 3]).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, vec![6.5, 7.5, 8.5]);
    assert_eq!(F::adaptive_avg_pool2d(&x, [1, 1]).unwrap().to_vec::<f32>().unwrap(), vec![7.5]);
}

#[test]
fn attention_gradcheck_causal_and_grouped() {
    let q = rand(&[1, 4, 3, 2], 10);
    let k = rand(&[1, 2, 5, 2], 11);
    let v = rand(&[1, 2, 5, 2], 12);
    for causal in [false, true] {
        check(
            |t| F::scaled_dot_product_attention(&t[0], &t[1], &t[2], None, causal, None),
            &[q.clone(), k.clone(), v.clone()],
        );
    }
    check(
        |t| F::scaled_dot_product_attention_lower_right(&t[0], &t[1], &t[2], None),
        &[q.clone(), k.clone(), v.clone()],
    );
    // An explicit mask (composite path) and a strided query.
    let keep = Tensor::from_vec(vec![true, false, true, true, true], &[1, 1, 1, 5], &cpu()).unwrap();
    check(
        |t| {
            F::scaled_dot_product_attention(
                &t[0].transpose(2, 3)?.transpose(2, 3)?,
                &t[1],
                &t[2],
                Some(&keep),
                false,
                Some(0.3),
            )
        },
        &[q, k, v],
    );
}

#[test]
fn attention_fused_matches_composite() {
    let (q, k, v) = (rand(&[2, 4, 6, 8], 13), rand(&[2, 2, 6, 8], 14), rand(&[2, 2, 6, 8], 15));
    // In f32: f64 always takes the composition (the kernel's log-sum-exp is f32).
    let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap().detach().requires_grad_(true).unwrap();
    for causal in [false, true] {
        agree(
            |t| F::scaled_dot_product_attention(&t[0], &t[1], &t[2], None, causal, None),
            &[f32(&q), f32(&k), f32(&v)],
            2e-6,
        );
    }
    // A causal mask written out as a bool mask gives the fused causal result.
    let keep: Vec<bool> = (0..6).flat_map(|i| (0..6).map(move |j| j <= i)).collect();
    let keep = Tensor::from_vec(keep, &[6, 6], &cpu()).unwrap();
    let a = F::scaled_dot_product_attention(&q, &k, &v, None, true, None).unwrap().to_vec::<f64>().unwrap();
    let b = F::scaled_dot_product_attention(&q, &k, &v, Some(&keep), false, None).unwrap().to_vec::<f64>().unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-6);
    }
}

/// Rotary and attention write their outputs (and attention its input gradients) in the
/// memory order of their inputs: heads split from `(b, s, h·d)` projections as `(b, h, s, d)`
/// views come back as views of `(b, s, h·d)`, with no transposing copy either way, and the
/// values and gradients equal those of contiguous inputs.
#[test]
fn rotary_and_attention_keep_the_memory_order_of_their_inputs() -> Result<()> {
    let (b, s, h, hk, d) = (2, 5, 4, 2, 8);
    let f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap().detach().requires_grad_(true).unwrap();
    let q = f32(rand(&[b, s, h * d], 40));
    let kv = f32(rand(&[b, s, 2 * hk * d], 41));
    let ang = Generator::new(42).uniform(&[s, d / 2], -3.0, 3.0, DType::F32, &cpu())?;
    let (c, sn) = (ang.cos()?, ang.sin()?);
    let heads = |x: &Tensor, n: usize| x.reshape(&[b as isize, s as isize, n as isize, d as isize])?.transpose(1, 2);
    let run = |contiguous: bool| -> Result<(Tensor, Vec<Vec<f32>>)> {
        for t in [&q, &kv] {
            t.zero_grad();
        }
        let parts = kv.chunk(2, -1)?;
        let fix = |t: Tensor| if contiguous { t.contiguous() } else { Ok(t) };
        let qh = F::rotary_embedding(&fix(heads(&q, h)?)?, &c, &sn)?;
        let kh = F::rotary_embedding(&fix(heads(&parts[0], hk)?)?, &c, &sn)?;
        let vh = fix(heads(&parts[1], hk)?)?;
        if !contiguous {
            assert!(qh.transpose(1, 2)?.is_contiguous(), "rotary keeps (b, s, h, d): {:?}", qh.strides());
        }
        let o = F::scaled_dot_product_attention(&qh, &kh, &vh, None, true, None)?.transpose(1, 2)?;
        o.square()?.sum()?.backward()?;
        let grads = [&q, &kv].iter().map(|t| t.grad().unwrap().to_vec::<f32>()).collect::<Result<_>>()?;
        Ok((o, grads))
    };
    let (o, grads) = run(false)?;
    assert!(o.is_contiguous(), "attention's output is a view of (b, s, h, d): {:?}", o.strides());
    let (o_dense, grads_dense) = run(true)?;
    assert_eq!(o.to_vec::<f32>()?, o_dense.to_vec::<f32>()?);
    for (x, y) in grads.iter().zip(&grads_dense) {
        for (a, e) in x.iter().zip(y) {
            assert!((a - e).abs() <= 1e-6 * e.abs().max(1.0), "{a} vs {e}");
        }
    }
    Ok(())
}

/// Issue 26 item 5: `is_causal` is PyTorch's (query `i` sees keys `0..=i`, aligned to the top
/// left) when there are more keys than queries; the lower-right alignment of a KV cache has its
/// own function. Both equal the explicit bool mask.
#[test]
fn causal_alignment_with_more_keys_than_queries() {
    let (q, k, v) = (rand(&[1, 2, 3, 4], 30), rand(&[1, 2, 5, 4], 31), rand(&[1, 2, 5, 4], 32));
    let mask = |shift: usize| {
        let keep: Vec<bool> = (0..3).flat_map(|i| (0..5).map(move |j| j <= i + shift)).collect();
        Tensor::from_vec(keep, &[3, 5], &cpu()).unwrap()
    };
    let explicit = |shift| F::scaled_dot_product_attention(&q, &k, &v, Some(&mask(shift)), false, None).unwrap();
    let close = |a: Tensor, b: Tensor| {
        let (a, b) = (a.to_vec::<f64>().unwrap(), b.to_vec::<f64>().unwrap());
        a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-12)
    };
    assert!(close(F::scaled_dot_product_attention(&q, &k, &v, None, true, None).unwrap(), explicit(0)));
    assert!(close(F::scaled_dot_product_attention_lower_right(&q, &k, &v, None).unwrap(), explicit(2)));
    assert!(!close(explicit(0), explicit(2)));
}

#[test]
fn rotary_gradcheck_and_inverse() {
    let x = rand(&[1, 2, 3, 4], 16);
    let ang = Generator::new(17).uniform(&[3, 2], -3.0, 3.0, DType::F64, &cpu()).unwrap();
    let (c, s) = (ang.cos().unwrap(), ang.sin().unwrap());
    check(|t| F::rotary_embedding(&t[0], &c, &s), std::slice::from_ref(&x));
    agree(|t| F::rotary_embedding(&t[0], &c, &s), std::slice::from_ref(&x), 1e-12);
    // A rotation keeps each pair's norm.
    let y = F::rotary_embedding(&x, &c, &s).unwrap();
    let norm = |t: &Tensor| t.square().unwrap().sum().unwrap().item::<f64>().unwrap();
    assert!((norm(&y) - norm(&x)).abs() < 1e-10);
}

#[test]
fn dropout_is_seeded_scaled_and_matches_composite() {
    let x = Tensor::ones(&[1000], DType::F32, &cpu()).unwrap().requires_grad_(true).unwrap();
    manual_seed(5);
    let a = F::dropout(&x, 0.3, true).unwrap();
    manual_seed(5);
    let b = composites_only(|| F::dropout(&x, 0.3, true)).unwrap();
    let (va, vb) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(va, vb, "fused and composite masks differ");
    assert_eq!((a.grad_fn_name(), b.grad_fn_name()), (Some("dropout"), Some("mul")));
    let kept = va.iter().filter(|&&v| v != 0.0).count();
    assert!((600..800).contains(&kept), "{kept} of 1000 kept at p = 0.3");
    assert!(va.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.7).abs() < 1e-6));
    // The gradient uses the same mask.
    a.sum().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), va);
    // Another draw differs; eval mode is the identity.
    assert_ne!(F::dropout(&x, 0.3, true).unwrap().to_vec::<f32>().unwrap(), va);
    assert_eq!(F::dropout(&x, 0.3, false).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 1000]);
}

#[test]
fn bad_inputs_are_clear_errors() {
    let x = Tensor::zeros(&[1, 4, 5, 5], DType::F32, &cpu()).unwrap();
    let w = Tensor::zeros(&[2, 3, 3, 3], DType::F32, &cpu()).unwrap();
    let kind = |r: Result<Tensor>| r.unwrap_err().kind();
    assert_eq!(kind(F::conv2d(&x, &w, None, [1, 1], [0, 0], [1, 1], 1)), ErrorKind::ShapeMismatch);
    // The window checks are the SDK's, worded as every backend words them.
    let w = Tensor::zeros(&[2, 4, 7, 7], DType::F32, &cpu()).unwrap();
    let err = F::conv2d(&x, &w, None, [1, 1], [0, 0], [1, 1], 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(err.message(), "conv2d: the height window spans 7 positions but the padded input has 5");
    let w = Tensor::zeros(&[2, 4, 3, 3], DType::F64, &cpu()).unwrap();
    assert_eq!(kind(F::conv2d(&x, &w, None, [1, 1], [0, 0], [1, 1], 1)), ErrorKind::DtypeMismatch);
    let err = F::conv2d(&x, &w.to_dtype(DType::F32).unwrap(), None, [0, 1], [0, 0], [1, 1], 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(err.message(), "conv2d: height stride must be >= 1, got 0");
    let bias = Tensor::zeros(&[3], DType::F32, &cpu()).unwrap();
    let err = F::conv2d(&x, &w.to_dtype(DType::F32).unwrap(), Some(&bias), [1, 1], [0, 0], [1, 1], 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch);
    assert_eq!(err.message(), "conv2d: bias has shape [3], expected [2]");
    assert_eq!(kind(F::max_pool2d(&x, [2, 2], [2, 2], [2, 2], [1, 1])), ErrorKind::InvalidArgument);
    assert_eq!(kind(F::avg_pool2d(&x.reshape(&[4, 5, 5]).unwrap(), [2, 2], [2, 2], [0, 0])), ErrorKind::ShapeMismatch);
    let q = Tensor::zeros(&[1, 3, 2, 4], DType::F32, &cpu()).unwrap();
    let k = Tensor::zeros(&[1, 2, 2, 4], DType::F32, &cpu()).unwrap();
    let err = F::scaled_dot_product_attention(&q, &k, &k, None, false, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch);
    assert_eq!(
        err.message(),
        "attention: the query heads (3) must be a multiple of the kv heads (2 in k [1, 2, 2, 4])"
    );
    let k64 = k.to_dtype(DType::F64).unwrap();
    let err = F::scaled_dot_product_attention(&k, &k64, &k64, None, false, None).unwrap_err();
    assert_eq!((err.kind(), err.message()), (ErrorKind::DtypeMismatch, "attention: k is float64, expected float32"));
    assert_eq!(kind(F::dropout(&x, 1.5, true)), ErrorKind::InvalidArgument);
    let c = Tensor::zeros(&[2, 3], DType::F32, &cpu()).unwrap();
    let err = F::rotary_embedding(&q, &c, &c).unwrap_err();
    assert_eq!(
        (err.kind(), err.message()),
        (ErrorKind::ShapeMismatch, "rotary: cos has shape [2, 3], expected [2, 2]")
    );
    let odd = Tensor::zeros(&[1, 3, 2, 3], DType::F32, &cpu()).unwrap();
    let err = F::rotary_embedding(&odd, &c, &c).unwrap_err();
    assert_eq!(err.message(), "rotary: the head dim of x [1, 3, 2, 3] must be even");
}

/// Grouped-query attention with a mask per batch, query head and position (and a float mask)
/// equals attention over keys and values repeated to every query head.
#[test]
fn grouped_masked_attention_equals_repeated_heads() {
    let (q, k, v) = (rand(&[2, 6, 3, 4], 40), rand(&[2, 2, 5, 4], 41), rand(&[2, 2, 5, 4], 42));
    let heads = Tensor::from_vec(vec![0i64, 0, 0, 1, 1, 1], &[6], &cpu()).unwrap();
    let (kr, vr) = (k.index_select(1, &heads).unwrap(), v.index_select(1, &heads).unwrap());
    // Every query sees key 0, so no row is empty.
    let keep: Vec<bool> = (0..2 * 6 * 3 * 5).map(|i| i % 5 == 0 || (i * 7919) % 3 != 0).collect();
    let keep = Tensor::from_vec(keep, &[2, 6, 3, 5], &cpu()).unwrap();
    let bias = Generator::new(43).uniform(&[2, 1, 3, 5], -2.0, 2.0, DType::F64, &cpu()).unwrap();
    for mask in [keep, bias] {
        let a = F::scaled_dot_product_attention(&q, &k, &v, Some(&mask), false, None).unwrap();
        let b = F::scaled_dot_product_attention(&q, &kr, &vr, Some(&mask), false, None).unwrap();
        let (a, b) = (a.to_vec::<f64>().unwrap(), b.to_vec::<f64>().unwrap());
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-12));
    }
}

/// Without gradients, a bool mask shared by the heads takes the backend's masked attention
/// kernel, which equals the composition (a query that keeps no key gives NaN in both).
#[test]
fn masked_attention_kernel_matches_composite() {
    let f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap().detach();
    let (q, k, v) = (f32(rand(&[2, 6, 3, 4], 50)), f32(rand(&[2, 2, 5, 4], 51)), f32(rand(&[2, 2, 5, 4], 52)));
    let mut keep: Vec<bool> = (0..2 * 3 * 5).map(|i| (i * 7) % 3 != 1).collect();
    keep[5..10].fill(false); // batch 0, query 1 keeps nothing
    let per_batch = Tensor::from_vec(keep.clone(), &[2, 1, 3, 5], &cpu()).unwrap();
    let shared = Tensor::from_vec(keep[..15].to_vec(), &[3, 5], &cpu()).unwrap();
    for mask in [per_batch, shared] {
        let run = || {
            genesis::no_grad(|| F::scaled_dot_product_attention(&q, &k, &v, Some(&mask), false, Some(0.7)))
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
        };
        let (fused, events) = profile_this_thread(Default::default(), || Ok(run())).unwrap();
        assert!(events.iter().any(|e| e.name == "masked_attention"), "the kernel ran");
        let composite = composites_only(run);
        assert_eq!(fused.iter().filter(|x| x.is_nan()).count(), 6 * 4 * if mask.rank() == 4 { 1 } else { 2 });
        for (a, b) in fused.iter().zip(&composite) {
            assert!((a.is_nan() && b.is_nan()) || (a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}
