//! Handwritten digits (8×8 pixels, 10 classes): an MLP and a small CNN trained with the
//! `nn`, `optim`, `data` and `monitor` pieces, the way a PyTorch user would write it.
//!
//! `cargo run --release --example train_digits [-- --device cuda --model mlp|cnn|both
//!  --epochs N --out DIR]`
//!
//! Prints the test accuracy of each model (goal ≥ 97%), and writes per-epoch metrics as CSV,
//! the loss/accuracy curves as PNG and the trained weights as safetensors under `--out`
//! (default `target/train_digits`).
//!
//! Data-parallel: `genesis-run --nproc-per-node 2 target/release/examples/train_digits` runs
//! one process per rank (on `cuda:{LOCAL_RANK}` with `--device cuda`); each rank trains a
//! `DistributedDataParallel` replica on its `DistributedSampler` share of every epoch (32
//! images per rank and step), and rank 0 reports and writes the files.

use flate2::read::GzDecoder;
use genesis::data::{random_split, DataLoader, Dataset, DistributedSampler, TensorDataset};
use genesis::distributed::{MaybeDdp, ProcessGroup};
use genesis::monitor::{MetricsLog, Progress};
use genesis::nn::{Conv2d, Conv2dOptions, CrossEntropyLoss, Flatten, Linear, MaxPool2d, Module, ReLU, Sequential};
use genesis::optim::{AdamOptions, AdamW, CosineAnnealingLR, Optimizer};
use genesis::{no_grad, DType, Device, Error, Generator, Result, Tensor};
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

/// The UCI digits set as shipped in the repository (see examples/data/README.md).
const DIGITS_CSV_GZ: &[u8] = include_bytes!("data/digits.csv.gz");
const GOAL: f64 = 0.97;

struct Args {
    device: String,
    model: String,
    epochs: Option<usize>,
    out: PathBuf,
}

fn parse_args() -> Result<Args> {
    let mut args = Args { device: "cpu".into(), model: "both".into(), epochs: None, out: "target/train_digits".into() };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| Error::invalid(format!("{flag} needs a value")));
        match flag.as_str() {
            "--device" => args.device = value()?,
            "--model" => args.model = value()?,
            "--epochs" => {
                let v = value()?;
                args.epochs = Some(v.parse().map_err(|_| Error::invalid(format!("--epochs: not a number: {v}")))?)
            }
            "--out" => args.out = value()?.into(),
            other => return Err(Error::invalid(format!("unknown argument {other} (see the file's header)"))),
        }
    }
    if !["mlp", "cnn", "both"].contains(&args.model.as_str()) {
        return Err(Error::invalid(format!("--model must be mlp, cnn or both, got {}", args.model)));
    }
    Ok(args)
}

/// Pixels scaled to [0, 1] as `(n, 64)` f32 and labels as `(n)` i64.
fn load_digits(device: &Device) -> Result<(Tensor, Tensor)> {
    let mut text = String::new();
    GzDecoder::new(DIGITS_CSV_GZ)
        .read_to_string(&mut text)
        .map_err(|e| Error::invalid(format!("digits.csv.gz: cannot decompress: {e}")))?;
    let (mut pixels, mut labels) = (Vec::new(), Vec::new());
    for (line_no, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        let bad = || Error::invalid(format!("digits.csv.gz line {}: expected 64 pixels and a label", line_no + 1));
        if fields.len() != 65 {
            return Err(bad());
        }
        for f in &fields[..64] {
            pixels.push(f.trim().parse::<f32>().map_err(|_| bad())? / 16.0);
        }
        labels.push(fields[64].trim().parse::<i64>().map_err(|_| bad())?);
    }
    let n = labels.len();
    Ok((Tensor::from_vec(pixels, &[n, 64], device)?, Tensor::from_vec(labels, &[n], device)?))
}

fn mlp(device: &Device) -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Linear::new(64, 128, true, device)?)
        .add(ReLU)
        .add(Linear::new(128, 64, true, device)?)
        .add(ReLU)
        .add(Linear::new(64, 10, true, device)?))
}

/// Two 3×3 convolutions (same padding), a 2×2 max pool and a linear head: 8×8 → 4×4×32 → 10.
fn cnn(device: &Device) -> Result<Sequential> {
    let same = Conv2dOptions { padding: [1, 1], ..Default::default() };
    Ok(Sequential::new()
        .add(Conv2d::new(1, 16, [3, 3], same, device)?)
        .add(ReLU)
        .add(Conv2d::new(16, 32, [3, 3], same, device)?)
        .add(ReLU)
        .add(MaxPool2d::new([2, 2]))
        .add(Flatten::default())
        .add(Linear::new(32 * 4 * 4, 10, true, device)?))
}

/// Images as the model wants them: flat for the MLP, `(n, 1, 8, 8)` for the CNN.
fn shape_input(x: &Tensor, kind: &str) -> Result<Tensor> {
    if kind == "cnn" {
        x.reshape(&[x.shape()[0] as isize, 1, 8, 8])
    } else {
        Ok(x.clone())
    }
}

fn accuracy(model: &dyn Module, kind: &str, data: &dyn Dataset) -> Result<f64> {
    model.eval();
    let indices: Vec<usize> = (0..data.len()).collect();
    let batch = data.get_batch(&indices)?;
    let correct = no_grad(|| -> Result<i64> {
        let predicted = model.forward(&shape_input(&batch[0], kind)?)?.argmax(Some(-1), false)?;
        predicted.eq(&batch[1])?.to_dtype(DType::I64)?.sum()?.item::<i64>()
    })?;
    model.train(true);
    Ok(correct as f64 / data.len() as f64)
}

/// Train one model (a data-parallel replica when `group` is given); returns its test
/// accuracy.
fn train(
    kind: &str,
    epochs: usize,
    train_set: Arc<dyn Dataset>,
    test_set: &dyn Dataset,
    device: &Device,
    out: &std::path::Path,
    group: Option<&ProcessGroup>,
) -> Result<f64> {
    genesis::manual_seed(0);
    let net = if kind == "cnn" { cnn(device)? } else { mlp(device)? };
    let leader = group.is_none_or(|g| g.rank() == 0);
    let replica = MaybeDdp::new(net, group)?;
    let (model, inner): (&dyn Module, &dyn Module) = (replica.trained(), replica.module());
    if leader {
        println!("{kind}: {} parameters, {epochs} epochs", model.num_parameters());
    }
    let mut loader = DataLoader::new(train_set.clone(), 32)?;
    let mut sampler = None;
    match group {
        Some(g) => {
            let s = Arc::new(DistributedSampler::new(train_set.len(), g.world_size(), g.rank())?.seed(1));
            loader = loader.sampler(s.clone());
            sampler = Some(s);
        }
        None => loader = loader.shuffle(Generator::new(1)),
    }
    let mut optimizer =
        AdamW::new(model.parameters(), AdamOptions { lr: 3e-3, weight_decay: 1e-4, ..AdamOptions::adamw() })?;
    let mut scheduler = CosineAnnealingLR::new(&mut optimizer, epochs as u64, 1e-5)?;
    let loss_fn = CrossEntropyLoss::default();
    let mut log = MetricsLog::new();
    let total = (epochs * loader.len()) as u64;
    let mut bar = if leader { Progress::new(total, kind) } else { Progress::hidden(total, kind) };
    let mut step = 0u64;
    for epoch in 1..=epochs {
        let (mut loss_sum, mut batches) = (0.0, 0);
        if let Some(s) = &sampler {
            s.set_epoch(epoch as u64);
        }
        for batch in &loader {
            let batch = batch?;
            let loss = loss_fn.forward(&model.forward(&shape_input(&batch[0], kind)?)?, &batch[1])?;
            optimizer.zero_grad();
            loss.backward()?;
            optimizer.step()?;
            let loss = loss.item::<f32>()? as f64;
            loss_sum += loss;
            batches += 1;
            step += 1;
            bar.step(loss, batch[0].shape()[0] as u64);
        }
        let lr = optimizer.lrs()[0];
        scheduler.step(&mut optimizer)?;
        let test_accuracy = accuracy(model, kind, test_set)?;
        log.record(
            epoch as u64,
            &[("train_loss", loss_sum / batches as f64), ("test_accuracy", test_accuracy), ("lr", lr)],
        );
        if leader && (epoch % 5 == 0 || epoch == epochs) {
            bar.println(format!(
                "{kind} epoch {epoch:3}: train loss {:.4}, test accuracy {:.2}%",
                loss_sum / batches as f64,
                100.0 * test_accuracy
            ));
        }
    }
    bar.finish();
    let test_accuracy = accuracy(model, kind, test_set)?;
    if !leader {
        return Ok(test_accuracy);
    }
    let csv = out.join(format!("{kind}_metrics.csv"));
    let png = out.join(format!("{kind}_curves.png"));
    let weights = out.join(format!("{kind}.safetensors"));
    log.write_csv(&csv)?;
    log.plot_png(&png)?;
    genesis::serialize::save(&weights, &inner.state_dict(), &Default::default())?;
    println!(
        "{kind}: test accuracy {:.2}% ({} steps; goal ≥ {:.0}%: {}); wrote {}, {}, {}",
        100.0 * test_accuracy,
        step,
        100.0 * GOAL,
        if test_accuracy >= GOAL { "met" } else { "NOT met" },
        csv.display(),
        png.display(),
        weights.display()
    );
    Ok(test_accuracy)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    // Started by genesis-run or torchrun: one rank of a data-parallel job.
    let group = ProcessGroup::from_env_if_launched()?;
    let device = ProcessGroup::device(group.as_ref(), &args.device)?;
    let leader = group.as_ref().is_none_or(|g| g.rank() == 0);
    match &group {
        Some(g) => {
            println!("rank {} of {}, device: {device} ({})", g.rank(), g.world_size(), device.properties()?.name)
        }
        None => println!("device: {device} ({})", device.properties()?.name),
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| Error::invalid(format!("cannot create {}: {e}", args.out.display())))?;

    let (x, y) = load_digits(&device)?;
    let n = y.shape()[0];
    let n_test = n / 5;
    let data: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![x, y])?);
    let mut split = random_split(data, &[n - n_test, n_test], &Generator::new(42))?.into_iter();
    let (train_set, test_set) = (split.next(), split.next());
    let (Some(train_set), Some(test_set)) = (train_set, test_set) else {
        return Err(Error::invalid("random_split returned fewer than two parts"));
    };
    if leader {
        println!("digits: {} training and {} test images of 8x8 pixels", train_set.len(), test_set.len());
    }
    let train_set: Arc<dyn Dataset> = Arc::new(train_set);

    let kinds: &[&str] = match args.model.as_str() {
        "both" => &["mlp", "cnn"],
        "mlp" => &["mlp"],
        _ => &["cnn"],
    };
    let mut all_met = true;
    for &kind in kinds {
        let epochs = args.epochs.unwrap_or(if kind == "cnn" { 15 } else { 30 });
        let acc = train(kind, epochs, train_set.clone(), &test_set, &device, &args.out, group.as_ref())?;
        all_met &= acc >= GOAL;
    }
    if !all_met {
        return Err(Error::invalid(format!("a model stayed below the {:.0}% test accuracy goal", 100.0 * GOAL)));
    }
    Ok(())
}
