//! `linear_cross_entropy`: the chunked head loss equals `cross_entropy(hidden · weightᵀ)` in
//! value and gradients, for any chunk size, with ignored targets, and refuses bad input.

use genesis::nn::functional::{cross_entropy, linear_cross_entropy};
use genesis::nn::Reduction;
use genesis::{DType, Device, Tensor};

mod common;
use common::profile_this_thread;

fn cpu() -> Device {
    Device::cpu().unwrap()
}

fn rand(shape: &[usize], seed: u64) -> Tensor {
    genesis::Generator::new(seed).normal(shape, 0.0, 1.0, DType::F64, &cpu()).unwrap()
}

fn leaf(t: &Tensor) -> Tensor {
    t.detach().requires_grad_(true).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    a.sub(b).unwrap().abs().unwrap().max().unwrap().item::<f64>().unwrap()
}

#[test]
fn equals_cross_entropy_of_the_full_logits_for_any_chunk() {
    let (n, dim, classes) = (11, 6, 13);
    let hidden = rand(&[n, dim], 1);
    let weight = rand(&[classes, dim], 2);
    let target = Tensor::from_vec(vec![0i64, 3, -100, 12, 5, 5, -100, 1, 7, 2, 9], &[n], &cpu()).unwrap();
    for reduction in [Reduction::Mean, Reduction::Sum] {
        let (h0, w0) = (leaf(&hidden), leaf(&weight));
        let logits = h0.matmul(&w0.t().unwrap()).unwrap();
        let reference = cross_entropy(&logits, &target, -100, 0.0, reduction).unwrap();
        reference.backward().unwrap();
        for chunk in [1, 4, 11, 64] {
            let (h, w) = (leaf(&hidden), leaf(&weight));
            let loss = linear_cross_entropy(&h, &w, &target, -100, reduction, chunk).unwrap();
            let (a, b) = (loss.item::<f64>().unwrap(), reference.item::<f64>().unwrap());
            assert!((a - b).abs() < 1e-12 * b.abs().max(1.0), "chunk {chunk}: {a} vs {b}");
            // Scale the incoming gradient to check that the backward applies it.
            loss.mul_scalar(3.0).unwrap().backward().unwrap();
            let expected_h = h0.grad().unwrap().mul_scalar(3.0).unwrap();
            let expected_w = w0.grad().unwrap().mul_scalar(3.0).unwrap();
            assert!(max_diff(&h.grad().unwrap(), &expected_h) < 1e-12, "chunk {chunk}: hidden gradient");
            assert!(max_diff(&w.grad().unwrap(), &expected_w) < 1e-12, "chunk {chunk}: weight gradient");
        }
    }
}

/// The mean's count of targets stays on the device: the loss and its gradients read nothing
/// back to the host (so a captured graph can hold them). With every target ignored the mean
/// is NaN, as in PyTorch, the sum 0, and the gradients zero.
#[test]
fn reads_nothing_to_the_host_and_every_target_ignored_gives_nan_and_zero_gradients() {
    use genesis::profiler::ProfilerOptions;
    // In f32, which takes the fused kernels (f64's composition checks the targets on the host).
    let f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap();
    let (hidden, weight) = (f32(rand(&[6, 4], 5)), f32(rand(&[9, 4], 6)));
    let target = Tensor::from_vec(vec![1i64, -100, 3, 8, 0, 2], &[6], &cpu()).unwrap();
    let (h, w) = (leaf(&hidden), leaf(&weight));
    let options = ProfilerOptions { device_time: false, ..Default::default() };
    let (_, events) =
        profile_this_thread(options, || linear_cross_entropy(&h, &w, &target, -100, Reduction::Mean, 4)?.backward())
            .unwrap();
    let reads = events.iter().filter(|e| e.name == "copy_to_host").count();
    assert_eq!(reads, 0, "reads to the host");
    let ignored = Tensor::from_vec(vec![-100i64; 6], &[6], &cpu()).unwrap();
    for (reduction, expected) in [(Reduction::Mean, f64::NAN), (Reduction::Sum, 0.0)] {
        let (h, w) = (leaf(&hidden), leaf(&weight));
        let loss = linear_cross_entropy(&h, &w, &ignored, -100, reduction, 4).unwrap();
        let value = loss.item::<f64>().unwrap();
        assert!(value == expected || (value.is_nan() && expected.is_nan()), "{reduction:?}: {value}");
        loss.backward().unwrap();
        for g in [h.grad().unwrap(), w.grad().unwrap()] {
            assert!(g.to_vec::<f32>().unwrap().iter().all(|&x| x == 0.0), "{reduction:?}: zero gradients");
        }
    }
}

#[test]
fn without_gradients_it_only_computes_the_loss() {
    let hidden = rand(&[5, 4], 3);
    let weight = rand(&[7, 4], 4);
    let target = Tensor::from_vec(vec![1i64, 2, 3, 4, 5], &[5], &cpu()).unwrap();
    let loss = linear_cross_entropy(&hidden, &weight, &target, -100, Reduction::Mean, 2).unwrap();
    assert!(!loss.requires_grad());
    let reference = cross_entropy(&hidden.matmul(&weight.t().unwrap()).unwrap(), &target, -100, 0.0, Reduction::Mean)
        .unwrap()
        .item::<f64>()
        .unwrap();
    assert!((loss.item::<f64>().unwrap() - reference).abs() < 1e-12);
}

#[test]
fn bad_input_is_a_clear_error() {
    let hidden = rand(&[5, 4], 5);
    let weight = rand(&[7, 4], 6);
    let target = Tensor::from_vec(vec![1i64, 2, 3, 4, 5], &[5], &cpu()).unwrap();
    let err = |r: genesis::Result<Tensor>| r.expect_err("an error").to_string();
    assert!(err(linear_cross_entropy(&hidden, &weight, &target, -100, Reduction::None, 2)).contains("scalar"));
    assert!(err(linear_cross_entropy(&hidden, &weight, &target, -100, Reduction::Mean, 0)).contains("chunk_rows"));
    let short = target.narrow(0, 0, 4).unwrap();
    assert!(err(linear_cross_entropy(&hidden, &weight, &short, -100, Reduction::Mean, 2)).contains("do not fit"));
    let wrong_dim = rand(&[7, 3], 7);
    assert!(err(linear_cross_entropy(&hidden, &wrong_dim, &target, -100, Reduction::Mean, 2)).contains("do not fit"));
    let float_target = target.to_dtype(DType::F32).unwrap();
    assert!(err(linear_cross_entropy(&hidden, &weight, &float_target, -100, Reduction::Mean, 2)).contains("integer"));
    let out_of_range = Tensor::from_vec(vec![1i64, 2, 3, 4, 70], &[5], &cpu()).unwrap();
    assert!(linear_cross_entropy(&hidden, &weight, &out_of_range, -100, Reduction::Mean, 2).is_err());
}

/// After `loss.backward()` (the pass's own gradient of one) the kept gradients are given as
/// they are; a gradient the caller passes, even of ones, is multiplied in, and so is the
/// seed of a pass that keeps the graph (what it hands over must not alias what it keeps: a
/// `.grad` written in place would change the next backward). Equal bit for bit.
#[test]
fn the_implicit_gradient_of_one_is_not_multiplied_in() {
    use genesis::profiler::ProfilerOptions;
    let f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap();
    let (hidden, weight) = (f32(rand(&[6, 4], 7)), f32(rand(&[9, 4], 8)));
    let target = Tensor::from_vec(vec![1i64, -100, 3, 8, 0, 2], &[6], &cpu()).unwrap();
    let run = |explicit: bool, retain: bool| {
        let (h, w) = (leaf(&hidden), leaf(&weight));
        let loss = linear_cross_entropy(&h, &w, &target, -100, Reduction::Mean, 4).unwrap();
        let one = Tensor::ones(&[], DType::F32, &cpu()).unwrap();
        let options = ProfilerOptions { device_time: false, ..Default::default() };
        let ((), events) =
            profile_this_thread(options, || loss.backward_with(explicit.then_some(&one), retain, false)).unwrap();
        let node = events.iter().find(|e| e.name == "LinearCrossEntropyBackward").map(|e| e.id);
        let muls = events.iter().filter(|e| node.is_some() && e.parent == node && e.name == "mul").count();
        let grads = [h.grad().unwrap(), w.grad().unwrap()].map(|g| g.to_vec::<f32>().unwrap());
        if retain {
            // Written in place, then a second backward: its gradient is unchanged.
            w.grad().unwrap().mul_scalar_(0.0).unwrap();
            w.zero_grad();
            loss.backward().unwrap();
            assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), grads[1]);
        }
        (muls, grads)
    };
    let (implicit_muls, implicit) = run(false, false);
    let (explicit_muls, explicit) = run(true, false);
    let (retained_muls, retained) = run(false, true);
    assert_eq!((implicit_muls, explicit_muls, retained_muls), (0, 2, 2));
    assert_eq!(implicit, explicit);
    assert_eq!(implicit, retained);
}
