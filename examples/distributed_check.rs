//! Checks a data-parallel job end to end on any device; run it under the launcher:
//!
//! `genesis-run --nproc-per-node N target/release/examples/distributed_check [--device cuda]
//!  [--fail-rank R]`
//!
//! Every rank checks the four collectives on its device (`cuda:{LOCAL_RANK}` with `--device
//! cuda`: through NCCL), then trains a small network for a few steps with
//! `DistributedDataParallel` on its share of each batch and compares the result with a
//! one-process run on the whole batch. With `--fail-rank R`, rank R then exits in the middle
//! of a series of all-reduces, and every other rank must stop with an error (exit code 3)
//! instead of waiting forever.

use genesis::distributed::{DistributedDataParallel, ProcessGroup, ReduceOp};
use genesis::nn::{functional::mse_loss, Linear, Module, Reduction, Sequential, Tanh};
use genesis::optim::{Optimizer, SgdOptions, SGD};
use genesis::{DType, Device, Error, Result, Tensor};
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let fail_rank: Option<usize> =
        flag("--fail-rank").map(|v| v.parse().map_err(|_| Error::invalid(format!("--fail-rank: {v}")))).transpose()?;
    let group = ProcessGroup::from_env()?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = match flag("--device").as_deref() {
        Some("cuda") => Device::parse(&format!("cuda:{}", group.local_rank()))?,
        Some(other) => Device::parse(other)?,
        None => Device::cpu()?,
    };
    let transport =
        if group.uses_device_communicator(&device)? { "the device's communicator" } else { "the host ring" };
    println!("rank {rank} of {world} on {device}, collectives through {transport}");

    check_collectives(&group, &device)?;
    println!("rank {rank}: all_reduce (sum, average), broadcast, all_gather, reduce_scatter correct");

    let worst = check_ddp(&group, &device)?;
    println!("rank {rank}: DistributedDataParallel equals one process on the whole batch (max difference {worst:.2e})");

    if let Some(failing) = fail_rank {
        let start = Instant::now();
        let t = Tensor::ones(&[1 << 20], DType::F32, &device)?;
        for step in 0..1000 {
            if rank == failing && step == 3 {
                println!("rank {rank}: exiting on purpose");
                std::process::exit(7);
            }
            let outcome = group.all_reduce_(&t, ReduceOp::Average).and_then(|()| t.sum()?.item::<f32>());
            if let Err(e) = outcome {
                println!("rank {rank}: stopped with an error after {:.1} s: {e}", start.elapsed().as_secs_f64());
                std::process::exit(3);
            }
        }
        return Err(Error::invalid(format!("rank {rank}: rank {failing} exited but the collectives went on")));
    }
    Ok(())
}

fn check_collectives(group: &ProcessGroup, device: &Device) -> Result<()> {
    let (rank, world) = (group.rank() as f32, group.world_size());
    let ranks_total: f32 = (0..world).map(|r| r as f32).sum();
    let expect = |what: &str, got: Vec<f32>, want: Vec<f32>| -> Result<()> {
        if got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0)) && got.len() == want.len() {
            Ok(())
        } else {
            Err(Error::invalid(format!("rank {rank}: {what} gave {got:?}, expected {want:?}")))
        }
    };
    let values = |r: f32| (0..1000).map(|i| r * 1000.0 + i as f32).collect::<Vec<f32>>();
    let sum = Tensor::from_vec(values(rank), &[1000], device)?;
    group.all_reduce_(&sum, ReduceOp::Sum)?;
    let want: Vec<f32> = (0..1000).map(|i| ranks_total * 1000.0 + (world * i) as f32).collect();
    expect("all_reduce sum", sum.to_vec()?, want.clone())?;
    let mean = Tensor::from_vec(values(rank), &[1000], device)?;
    group.all_reduce_(&mean, ReduceOp::Average)?;
    expect("all_reduce average", mean.to_vec()?, want.iter().map(|v| v / world as f32).collect())?;
    let from_last = Tensor::full(&[3, 5], f64::from(rank), DType::F32, device)?;
    group.broadcast_(&from_last, world - 1)?;
    expect("broadcast", from_last.to_vec()?, vec![(world - 1) as f32; 15])?;
    let gathered = group.all_gather(&Tensor::full(&[2], f64::from(rank), DType::F32, device)?)?;
    let gathered: Vec<f32> = gathered.iter().map(|t| t.to_vec::<f32>()).collect::<Result<Vec<_>>>()?.concat();
    expect("all_gather", gathered, (0..world).flat_map(|r| [r as f32; 2]).collect())?;
    let rows = Tensor::from_vec((0..world * 4).map(|i| i as f32 + rank).collect(), &[world * 4], device)?;
    let mine = group.reduce_scatter(&rows, ReduceOp::Sum)?;
    let r = group.rank();
    expect("reduce_scatter", mine.to_vec()?, (r * 4..r * 4 + 4).map(|i| (world * i) as f32 + ranks_total).collect())
}

fn network(device: &Device, seed: u64) -> Result<Sequential> {
    genesis::manual_seed(seed);
    Ok(Sequential::new().add(Linear::new(8, 32, true, device)?).add(Tanh).add(Linear::new(32, 4, true, device)?))
}

fn batch(step: usize, rows: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..rows * 8).map(|i| ((i * 7 + step * 13) % 17) as f32 / 8.0 - 1.0).collect();
    let y: Vec<f32> = (0..rows * 4).map(|i| ((i * 5 + step * 3) % 11) as f32 / 5.0 - 1.0).collect();
    Ok((Tensor::from_vec(x, &[rows, 8], device)?, Tensor::from_vec(y, &[rows, 4], device)?))
}

/// Train with DDP and without on the same data; the largest parameter difference.
fn check_ddp(group: &ProcessGroup, device: &Device) -> Result<f32> {
    let (rank, world, per_rank, steps) = (group.rank(), group.world_size(), 4, 5);
    let options = SgdOptions { lr: 0.1, momentum: 0.9, ..Default::default() };
    let reference = network(device, 0)?;
    let mut sgd = SGD::new(reference.parameters(), options.clone())?;
    for step in 0..steps {
        let (x, y) = batch(step, per_rank * world, device)?;
        mse_loss(&reference.forward(&x)?, &y, Reduction::Mean)?.backward()?;
        sgd.step()?;
        sgd.zero_grad();
    }
    // Ranks other than 0 start elsewhere: the wrapper must copy rank 0's weights.
    let model = DistributedDataParallel::new(network(device, rank as u64 * 7)?, group)?;
    let mut sgd = SGD::new(model.parameters(), options)?;
    for step in 0..steps {
        let (x, y) = batch(step, per_rank * world, device)?;
        let (x, y) = (x.narrow(0, rank * per_rank, per_rank)?, y.narrow(0, rank * per_rank, per_rank)?);
        mse_loss(&model.forward(&x)?, &y, Reduction::Mean)?.backward()?;
        sgd.step()?;
        sgd.zero_grad();
    }
    let mut worst = 0.0f32;
    for (a, b) in model.module().parameters().iter().zip(reference.parameters()) {
        for (u, v) in a.to_vec::<f32>()?.iter().zip(b.to_vec::<f32>()?) {
            worst = worst.max((u - v).abs());
        }
    }
    if worst > 1e-5 {
        return Err(Error::invalid(format!("rank {rank}: DDP differs from one process by {worst}")));
    }
    Ok(worst)
}
