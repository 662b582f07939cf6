//! The ResNet training step's speed: forward under autocast, cross-entropy, backward and an
//! SGD step (momentum 0.9, weight decay 1e-4) on a fixed batch of random images already on
//! the device, so only the model's work is timed (the data pipeline is not).
//!
//! `cargo run --release --example resnet_bench -- [--device cuda] [--arch resnet50]
//!  [--batch 256] [--image-size 224] [--steps 20] [--warmup 5] [--autocast bf16|off]
//!  [--profile N] [--by-shape]`
//!
//! Prints one JSON line: images/s, milliseconds per step and peak device memory. `--profile N`
//! adds the profiler's op table (device time) over N more steps; `--by-shape` gives it a row
//! per (op, input shapes).
//! `benches/resnet/bench_torch.py` measures PyTorch the same way (eager, AMP, channels-last);
//! `benches/resnet/gpu_run.sh` runs both on the GPU machine.

use genesis::models::resnet::{ResNet, ResNetConfig};
use genesis::nn::{CrossEntropyLoss, Module};
use genesis::optim::{Optimizer, SgdOptions, SGD};
use genesis::profiler::{profile, ProfilerOptions, SortBy, TableOptions};
use genesis::{amp, DType, Device, Error, Generator, Result, Tensor};
use std::time::Instant;

struct Args {
    device: String,
    arch: String,
    batch: usize,
    image_size: usize,
    steps: usize,
    warmup: usize,
    autocast: bool,
    profile: usize,
    by_shape: bool,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        device: "cpu".into(),
        arch: "resnet50".into(),
        batch: 256,
        image_size: 224,
        steps: 20,
        warmup: 5,
        autocast: true,
        profile: 0,
        by_shape: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| Error::invalid(format!("{flag} needs a value")));
        let number = |v: String| v.parse::<usize>().map_err(|_| Error::invalid(format!("not a number: {v}")));
        match flag.as_str() {
            "--device" => a.device = value()?,
            "--arch" => a.arch = value()?,
            "--batch" => a.batch = number(value()?)?,
            "--image-size" => a.image_size = number(value()?)?,
            "--steps" => a.steps = number(value()?)?,
            "--warmup" => a.warmup = number(value()?)?,
            "--profile" => a.profile = number(value()?)?,
            "--by-shape" => a.by_shape = true,
            "--autocast" => a.autocast = value()? != "off",
            other => return Err(Error::invalid(format!("unknown argument {other} (see the file's header)"))),
        }
    }
    if a.steps == 0 || a.batch == 0 {
        return Err(Error::invalid("--steps and --batch must be positive"));
    }
    Ok(a)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let device = Device::parse(&args.device)?;
    let config = match args.arch.as_str() {
        "resnet18" => ResNetConfig::resnet18(1000),
        "resnet34" => ResNetConfig::resnet34(1000),
        "resnet50" => ResNetConfig::resnet50(1000),
        "resnet101" => ResNetConfig::resnet101(1000),
        other => return Err(Error::invalid(format!("--arch: unknown architecture {other}"))),
    };
    genesis::manual_seed(0);
    let model = ResNet::new(&config, &device)?;
    let mut sgd =
        SGD::new(model.parameters(), SgdOptions { lr: 0.1, momentum: 0.9, weight_decay: 1e-4, ..Default::default() })?;
    let generator = Generator::new(1);
    let s = args.image_size;
    let images = generator.normal(&[args.batch, 3, s, s], 0.0, 1.0, DType::F32, &device)?;
    let labels = generator.uniform(&[args.batch], 0.0, 1000.0, DType::F32, &device)?.floor()?.to_dtype(DType::I64)?;
    let loss_fn = CrossEntropyLoss::default();
    let step = |sgd: &mut SGD| -> Result<Tensor> {
        let logits = if args.autocast {
            amp::autocast(DType::BF16, || model.forward(&images))??
        } else {
            model.forward(&images)?
        };
        let loss = loss_fn.forward(&logits.to_dtype(DType::F32)?, &labels)?;
        sgd.zero_grad();
        loss.backward()?;
        sgd.step()?;
        Ok(loss)
    };
    for _ in 0..args.warmup {
        step(&mut sgd)?;
    }
    device.synchronize()?;
    device.reset_peak_memory_stats()?;
    let start = Instant::now();
    let mut loss = None;
    for _ in 0..args.steps {
        loss = Some(step(&mut sgd)?);
    }
    let loss = loss.map(|l| l.item::<f32>()).transpose()?.unwrap_or(f32::NAN); // synchronizes
    let seconds = start.elapsed().as_secs_f64();
    let peak = device.max_memory_allocated()? as f64 / (1u64 << 30) as f64;
    println!(
        "{{\"framework\": \"genesis\", \"device\": \"{}\", \"arch\": \"{}\", \"batch\": {}, \"image_size\": {s}, \
         \"autocast\": {}, \"steps\": {}, \"images_per_s\": {:.1}, \"ms_per_step\": {:.2}, \"peak_memory_gib\": {peak:.2}, \
         \"last_loss\": {loss:.4}}}",
        device.properties()?.name,
        args.arch,
        args.batch,
        args.autocast,
        args.steps,
        (args.batch * args.steps) as f64 / seconds,
        seconds * 1e3 / args.steps as f64,
    );
    if args.profile > 0 {
        let options = ProfilerOptions { record_shapes: args.by_shape, profile_memory: false, device_time: true };
        let ((), prof) = profile(options, || (0..args.profile).try_for_each(|_| step(&mut sgd).map(|_| ())))?;
        let table = TableOptions { sort_by: SortBy::SelfDevice, row_limit: 30, group_by_input_shape: args.by_shape };
        println!("profile of {} steps:\n{}", args.profile, prof.table(&table));
    }
    Ok(())
}
