//! The first steps with Genesis: tensors, matmul, sum, backward, a printed gradient, and one
//! training step of a small model written with tensor ops.
//!
//! `cargo run --release --example quickstart [-- --device cuda:0]`

use genesis::{no_grad, DType, Device, Tensor};

fn main() -> genesis::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().position(|a| a == "--device").and_then(|i| args.get(i + 1)).map_or("cpu", String::as_str);
    let device = Device::parse(spec)?;
    println!("device: {device} ({})", device.properties()?.name);

    // Tensors with automatic differentiation.
    let x = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &device)?.requires_grad_(true)?;
    let y = Tensor::new([[2.0f32, 0.0], [0.0, 2.0]], &device)?.requires_grad_(true)?;
    let z = x.matmul(&y)?;
    let loss = z.sum()?;
    loss.backward()?;
    println!("z = {z}");
    println!("gradient of x: {}", x.grad().expect("x requires grad"));
    println!("gradient of y: {}", y.grad().expect("y requires grad"));

    // One training step of a two-layer network on random data, by hand: forward, loss,
    // backward, SGD update under no_grad.
    genesis::manual_seed(0);
    let w1 = Tensor::randn(&[4, 16], DType::F32, &device)?.mul_scalar(0.5)?.requires_grad_(true)?;
    let w2 = Tensor::randn(&[16, 3], DType::F32, &device)?.mul_scalar(0.25)?.requires_grad_(true)?;
    let inputs = Tensor::randn(&[32, 4], DType::F32, &device)?;
    let targets = Tensor::randint(0, 3, &[32], &device)?;
    let lr = 0.5;
    for step in 0..5 {
        let logits = inputs.matmul(&w1)?.relu()?.matmul(&w2)?;
        let picked = logits.log_softmax(-1)?.gather(1, &targets.unsqueeze(1)?)?;
        let loss = picked.mean()?.neg()?;
        loss.backward()?;
        no_grad(|| -> genesis::Result<()> {
            for w in [&w1, &w2] {
                let g = w.grad().expect("requires grad");
                w.sub_(&g.mul_scalar(lr)?)?;
                w.zero_grad();
            }
            Ok(())
        })?;
        println!("step {step}: cross-entropy {:.4}", loss.item::<f32>()?);
    }
    let stats = device.memory_stats()?;
    println!("memory: {} bytes allocated, {} reserved", stats.allocated_bytes, stats.reserved_bytes);
    Ok(())
}
