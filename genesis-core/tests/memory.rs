//! Memory returns to its starting point once every tensor of a training step is dropped.
//! (Its own test binary: other tests allocating concurrently would disturb the count.)

use genesis::{DType, Device, Tensor};

#[test]
fn memory_allocated_returns_to_baseline_after_forward_and_backward() {
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
