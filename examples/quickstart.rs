//! The first steps with Genesis: pick a device, make tensors, compute, read results back.
//!
//! `cargo run --release --example quickstart [-- --device cuda:0]`

use genesis::{DType, Device, Tensor};

fn main() -> genesis::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().position(|a| a == "--device").and_then(|i| args.get(i + 1)).map_or("cpu", String::as_str);
    let device = Device::parse(spec)?;
    println!("device: {device} ({})", device.properties()?.name);

    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &device)?;
    let b = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], &[3], &device)?;
    let sum = a.add(&b)?; // b broadcasts over the rows of a
    let product = a.mul(&a)?;
    println!("a + b = {:?} (shape {:?})", sum.to_vec::<f32>()?, sum.shape());
    println!("a * a = {:?}", product.to_vec::<f32>()?);

    let ones = Tensor::ones(&[2, 3], DType::F32, &device)?;
    println!("a + 1 = {:?}", a.add(&ones)?.to_vec::<f32>()?);
    let stats = device.memory_stats()?;
    println!("memory: {} bytes allocated, {} reserved", stats.allocated_bytes, stats.reserved_bytes);
    Ok(())
}
