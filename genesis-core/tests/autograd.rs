//! Autograd behaviour: accumulation, graph lifetime, modes, hooks, higher order, errors.

use genesis::{autograd, grad, no_grad, DType, Device, ErrorKind, Tensor};

mod common;
use common::profile_this_thread;

fn cpu() -> Device {
    Device::parse("cpu").expect("cpu")
}

fn leaf(values: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(values, shape, &cpu()).unwrap().requires_grad_(true).unwrap()
}

#[test]
fn gradient_of_a_sum_of_squares_and_accumulation() {
    let x = leaf(&[1.0, -2.0, 3.0], &[3]);
    let y = x.mul(&x).unwrap().sum().unwrap();
    y.backward_with(None, true, false).unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![2.0, -4.0, 6.0]);
    // A second backward through the retained graph accumulates.
    y.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![4.0, -8.0, 12.0]);
    x.zero_grad();
    assert!(x.grad().is_none());
}

#[test]
fn backward_twice_without_retain_graph_is_an_error() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.exp().unwrap().sum().unwrap();
    y.backward().unwrap();
    let e = y.backward().unwrap_err();
    assert!(e.message().contains("second time"), "{e}");
}

#[test]
fn non_scalar_backward_needs_a_gradient() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.mul_scalar(3.0).unwrap();
    let e = y.backward().unwrap_err();
    assert!(e.message().contains("scalar") && e.message().contains("[2]"), "{e}");
    let g = Tensor::from_slice(&[1.0f64, 10.0], &[2], &cpu()).unwrap();
    y.backward_with(Some(&g), false, false).unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![3.0, 30.0]);
}

#[test]
fn backward_of_a_tensor_without_grad_is_an_error() {
    let x = Tensor::from_slice(&[1.0f64], &[], &cpu()).unwrap();
    assert_eq!(x.backward().unwrap_err().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn no_grad_and_detach_cut_the_graph() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = no_grad(|| x.mul_scalar(2.0)).unwrap();
    assert!(!y.requires_grad());
    let z = x.detach().mul_scalar(2.0).unwrap();
    assert!(!z.requires_grad());
    assert!(x.mul_scalar(2.0).unwrap().requires_grad());
    assert!(autograd::is_grad_enabled());
}

#[test]
fn hooks_see_and_replace_gradients() {
    let x = leaf(&[1.0, 2.0], &[2]);
    x.register_hook(|g| Ok(Some(g.mul_scalar(10.0)?))).unwrap();
    let h = x.mul_scalar(3.0).unwrap();
    h.register_hook(|g| Ok(Some(g.add_scalar(1.0)?))).unwrap();
    h.retain_grad();
    h.sum().unwrap().backward().unwrap();
    // dh = 1 + 1 = 2 (hook on h), dx = 3 * 2 = 6, times 10 (hook on x).
    assert_eq!(h.grad().unwrap().to_vec::<f64>().unwrap(), vec![2.0, 2.0]);
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![60.0, 60.0]);
}

#[test]
fn grad_returns_gradients_without_touching_dot_grad() {
    let x = leaf(&[2.0], &[]);
    let w = leaf(&[5.0], &[]);
    let y = x.mul(&w).unwrap();
    let g = grad(&[y], &[x.clone(), w.clone()], None, false, false).unwrap();
    assert_eq!(g[0].as_ref().unwrap().item::<f64>().unwrap(), 5.0);
    assert_eq!(g[1].as_ref().unwrap().item::<f64>().unwrap(), 2.0);
    assert!(x.grad().is_none() && w.grad().is_none());
}

#[test]
fn second_derivative_with_create_graph() {
    // d/dx x^3 = 3x^2, d2/dx2 = 6x.
    let x = leaf(&[2.0], &[]);
    let y = x.pow_scalar(3.0).unwrap();
    let dy = grad(&[y], std::slice::from_ref(&x), None, true, true).unwrap().remove(0).unwrap();
    assert!((dy.item::<f64>().unwrap() - 12.0).abs() < 1e-12);
    let d2 = grad(&[dy], std::slice::from_ref(&x), None, false, false).unwrap().remove(0).unwrap();
    assert!((d2.item::<f64>().unwrap() - 12.0).abs() < 1e-12);
    // Through a product of two functions too: d2/dx2 (sin x * x) = 2 cos x - x sin x.
    let x = leaf(&[0.7], &[]);
    let y = x.sin().unwrap().mul(&x).unwrap();
    let dy = grad(&[y], std::slice::from_ref(&x), None, true, true).unwrap().remove(0).unwrap();
    let d2 = grad(&[dy], std::slice::from_ref(&x), None, false, false).unwrap().remove(0).unwrap();
    let expected = 2.0 * 0.7f64.cos() - 0.7 * 0.7f64.sin();
    assert!((d2.item::<f64>().unwrap() - expected).abs() < 1e-12);
}

#[test]
fn an_in_place_change_of_a_saved_tensor_is_caught_at_backward() {
    let x = leaf(&[1.0, 2.0], &[2]);
    let y = x.exp().unwrap(); // saves y
    let z = y.sum().unwrap();
    no_grad(|| y.add_scalar_(1.0)).unwrap();
    let e = z.backward().unwrap_err();
    assert!(e.message().contains("modified by an in-place operation"), "{e}");
}

#[test]
fn in_place_on_a_leaf_requiring_grad_is_refused() {
    let x = leaf(&[1.0], &[1]);
    let e = x.add_scalar_(1.0).unwrap_err();
    assert!(e.message().contains("in-place"), "{e}");
    no_grad(|| x.add_scalar_(1.0)).unwrap(); // optimizers update under no_grad
    assert_eq!(x.to_vec::<f64>().unwrap(), vec![2.0]);
}

#[test]
fn errors_name_the_op_and_shapes() {
    let d = cpu();
    let a = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[4], DType::F32, &d).unwrap();
    let e = a.add(&b).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
    assert!(e.message().contains("add") && e.message().contains("[2, 3]") && e.message().contains("[4]"), "{e}");
    let e = a.matmul(&a).unwrap_err();
    assert!(e.message().contains("matmul") && e.message().contains("2x3"), "{e}");
    let e = a.sum_dims(&[2], false).unwrap_err();
    assert!(e.message().contains("dimension 2"), "{e}");
    let i = Tensor::zeros(&[2, 3], DType::I64, &d).unwrap();
    assert_eq!(a.matmul(&i.t().unwrap()).unwrap_err().kind(), ErrorKind::DtypeMismatch);
}

#[test]
fn tensors_on_two_devices_do_not_mix() {
    let cpu = cpu();
    let other = Device::parse("example").expect("the example plugin is built with the workspace");
    let a = Tensor::ones(&[2], DType::F32, &cpu).unwrap();
    let b = Tensor::ones(&[2], DType::F32, &other).unwrap();
    let e = a.add(&b).unwrap_err();
    assert!(e.message().contains("cpu:0") && e.message().contains("example:0"), "{e}");
    // Moving works, in both directions, and is differentiable.
    let x = Tensor::from_slice(&[1.0f32, 2.0], &[2], &cpu).unwrap().requires_grad_(true).unwrap();
    let y = x.to(&other).unwrap().mul(&b).unwrap().to(&cpu).unwrap().sum().unwrap();
    y.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
}

/// A leaf reached by several edges: its tensor hook sees the summed gradient once, its
/// post-accumulate hook runs once per pass after `.grad` is updated, and a second pass
/// accumulates (PyTorch's behaviour).
#[test]
fn a_leaf_used_three_times_is_accumulated_once_per_pass() -> genesis::Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let cpu = Device::cpu()?;
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2], &cpu)?.requires_grad_(true)?;
    let seen: Arc<Mutex<Vec<Vec<f32>>>> = Arc::default();
    let record = seen.clone();
    x.register_hook(move |g| {
        record.lock().map_err(|_| genesis::Error::invalid("poisoned"))?.push(g.to_vec::<f32>()?);
        Ok(None)
    })?;
    let after: Arc<Mutex<Vec<Vec<f32>>>> = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let (record, count) = (after.clone(), calls.clone());
    x.register_post_accumulate_grad_hook(move |t| {
        count.fetch_add(1, Ordering::SeqCst);
        let g = t.grad().map(|g| g.to_vec::<f32>()).transpose()?.unwrap_or_default();
        record.lock().map_err(|_| genesis::Error::invalid("poisoned"))?.push(g);
        Ok(())
    })?;
    // y = sum(x*x + x): three edges into x; dy/dx = 2x + 1.
    x.mul(&x)?.add(&x)?.sum()?.backward()?;
    assert_eq!(*seen.lock().unwrap(), vec![vec![3.0, 5.0]]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(*after.lock().unwrap(), vec![vec![3.0, 5.0]]);
    x.mul(&x)?.add(&x)?.sum()?.backward()?;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(after.lock().unwrap()[1], vec![6.0, 10.0]);
    // A leaf that is also a root: its own seed gradient, once.
    let z = Tensor::from_vec(vec![1.0f32], &[1], &cpu)?.requires_grad_(true)?;
    z.backward_with(Some(&Tensor::from_vec(vec![2.0f32], &[1], &cpu)?), false, false)?;
    assert_eq!(z.grad().map(|g| g.to_vec::<f32>()).transpose()?, Some(vec![2.0]));
    Ok(())
}

/// Ops whose backward reads their own output (exp, sqrt, rsqrt, tanh, sigmoid, reciprocal,
/// expm1, division, powers, product, softmax) give right gradients of gradients: with
/// create_graph the saved output is used with its history. Before, it was used as a constant
/// and, for example, the second derivative of exp came out half its value.
#[test]
fn second_order_gradients_through_ops_that_read_their_output() {
    use genesis::testing::{gradcheck, GradcheckOptions};
    use genesis::{Generator, Result};
    type Op = fn(&Tensor) -> Result<Tensor>;
    let ops: [(&str, Op); 13] = [
        ("exp", |x| x.exp()),
        ("sqrt", |x| x.sqrt()),
        ("rsqrt", |x| x.rsqrt()),
        ("tanh", |x| x.tanh()),
        ("sigmoid", |x| x.sigmoid()),
        ("reciprocal", |x| x.reciprocal()),
        ("expm1", |x| x.expm1()),
        ("div", |x| x.div(&x.mean_dims(&[-1], true)?)),
        ("rdiv_scalar", |x| x.rdiv_scalar(2.0)),
        ("pow", |x| x.pow(&x.mean_dims(&[-1], true)?)),
        ("prod", |x| x.prod_dims(&[-1], true)),
        ("softmax", |x| x.softmax(-1)),
        ("log_softmax", |x| x.log_softmax(-1)),
    ];
    for (name, f) in ops {
        let x = Generator::new(5).uniform(&[3, 4], 0.5, 1.5, DType::F64, &cpu()).unwrap().requires_grad_(true).unwrap();
        // The gradient of sum(f(x)²), itself differentiated by gradcheck.
        let checked = gradcheck(
            |t| {
                let _on = autograd::set_grad_enabled(true);
                let x = if t[0].requires_grad() { t[0].clone() } else { t[0].detach().requires_grad_(true)? };
                let y = f(&x)?;
                Ok(grad(&[y.square()?.sum()?], &[x], None, true, true)?[0].clone().unwrap())
            },
            &[x],
            GradcheckOptions::default(),
        );
        assert!(checked.is_ok(), "{name}: {:?}", checked.err());
    }
}

/// An embedding's gradient (a gather's: zeros but for the rows it read) is added in place
/// into a gradient the pass already holds for the same table (a tied output head's), with no
/// zeros of the table's size; a sum that something else can see (here the caller's seed) is
/// never written, and the gradients are the same either way.
#[test]
fn gather_gradients_are_added_into_a_pending_sum_only_when_nothing_else_holds_it() {
    let table: Vec<f64> = (0..15).map(|i| i as f64 * 0.5 - 3.0).collect();
    let w = leaf(&table, &[5, 3]);
    let ids = Tensor::from_slice(&[1i64, 3, 1, 0], &[4], &cpu()).unwrap();
    let scale: Vec<f64> = (0..15).map(|i| 1.0 + i as f64).collect();
    let upstream: Vec<f64> = (0..12).map(|i| 0.25 * i as f64 - 1.0).collect();
    let c = Tensor::from_slice(&scale, &[5, 3], &cpu()).unwrap();
    let u = Tensor::from_slice(&upstream, &[4, 3], &cpu()).unwrap();
    // d/dw of sum(w ⊙ c) + sum(w[ids] ⊙ u): c plus u's rows added at ids.
    let mut expected = scale.clone();
    for (r, &id) in [1usize, 3, 1, 0].iter().enumerate() {
        for k in 0..3 {
            expected[id * 3 + k] += upstream[r * 3 + k];
        }
    }
    // The head's part (a fresh product) is pending when the embedding's backward runs (the
    // pass walks an op's inputs last to first, as a model's embedding comes last).
    let embedded = w.embedding(&ids).unwrap().mul(&u).unwrap().sum().unwrap();
    let loss = embedded.add(&w.mul(&c).unwrap().sum().unwrap()).unwrap();
    let ((), mine) = profile_this_thread(Default::default(), || loss.backward()).unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f64>().unwrap(), expected);
    let node = mine.iter().find(|e| e.name == "IndexSelectBackward").map(|e| e.id);
    let ops: Vec<&str> = mine.iter().filter(|e| node.is_some() && e.parent == node).map(|e| e.name.as_str()).collect();
    assert_eq!(ops, ["index_add"], "the embedding's gradient goes into the pending sum, with no zeros");
    // The table's other gradient a view of the caller's seed: added out of place, the seed intact.
    w.zero_grad();
    let joined =
        Tensor::cat(&[w.embedding(&ids).unwrap().reshape(&[-1]).unwrap(), w.reshape(&[-1]).unwrap()], 0).unwrap();
    let seed_values: Vec<f64> = upstream.iter().chain(&scale).copied().collect();
    let seed = Tensor::from_slice(&seed_values, &[27], &cpu()).unwrap();
    joined.backward_with(Some(&seed), false, false).unwrap();
    assert_eq!(seed.to_vec::<f64>().unwrap(), seed_values, "the caller's gradient is not written");
    assert_eq!(w.grad().unwrap().to_vec::<f64>().unwrap(), expected);
}
