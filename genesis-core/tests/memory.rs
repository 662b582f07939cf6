//! Memory returns to its starting point once every tensor of a training step is dropped.
//! (Its own test binary: other tests allocating concurrently would disturb the count.)

use genesis::nn::functional as F;
use genesis::{DType, Device, Tensor};
use std::sync::Mutex;

/// The tests of this binary take turns: each counts the bytes allocated while it runs.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn memory_allocated_returns_to_baseline_after_forward_and_backward() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::parse("cpu").unwrap();
    let before = cpu.memory_allocated().unwrap();
    {
        let w1 = Tensor::randn(&[16, 32], DType::F32, &cpu).unwrap().requires_grad_(true).unwrap();
        let w2 = Tensor::randn(&[32, 4], DType::F32, &cpu).unwrap().requires_grad_(true).unwrap();
        let x = Tensor::randn(&[8, 16], DType::F32, &cpu).unwrap();
        let loss = x.matmul(&w1).unwrap().relu().unwrap().matmul(&w2).unwrap().log_softmax(-1).unwrap().mean().unwrap();
        loss.backward().unwrap();
        assert!(w1.grad().is_some() && w2.grad().is_some());
        assert!(cpu.memory_allocated().unwrap() > before);
    }
    assert_eq!(cpu.memory_allocated().unwrap(), before);
    assert!(cpu.max_memory_allocated().unwrap() > before);
    assert!(cpu.memory_summary().unwrap().contains("allocated"));
}

/// `swiglu_linear` holds no activation between forward and backward: its graph keeps `p` and
/// the weight, which exist anyway, while the composition it replaces also keeps
/// `swiglu_halves(p)` for the product's backward.
#[test]
fn swiglu_linear_keeps_no_activation_for_backward() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::parse("cpu").unwrap();
    let p = Tensor::randn(&[64, 256], DType::F32, &cpu).unwrap().requires_grad_(true).unwrap();
    let w = Tensor::randn(&[32, 128], DType::F32, &cpu).unwrap().requires_grad_(true).unwrap();
    let held = |f: &dyn Fn() -> Tensor| {
        let before = cpu.memory_allocated().unwrap();
        let y = f();
        let bytes = cpu.memory_allocated().unwrap() - before;
        y.sum().unwrap().backward().unwrap();
        bytes
    };
    let recomputed = held(&|| F::swiglu_linear(&p, &w).unwrap());
    let kept = held(&|| F::linear(&F::swiglu_halves(&p).unwrap(), &w, None).unwrap());
    let activation = 64 * 128 * 4;
    assert!(recomputed + activation <= kept, "swiglu_linear holds {recomputed} bytes, the composition {kept}");
}
