//! One SFT configuration of a Qwen2.5-0.5B-shaped model with random weights, timed: f32
//! weights and AdamW state, bf16 autocast, batch `--batch` × `--len` tokens of random ids (all
//! of them targets), the head's loss in blocks (`linear_cross_entropy`). Prints ms/step,
//! tokens/s and peak device memory as one JSON line (`benches/sft/gpu_run.sh` runs it next to
//! PyTorch + transformers on the same GPU).
//!
//! `cargo run --release --example sft_bench -- --device cuda [--batch 8 --len 1024 --steps 5]`
//! (`--chunk N`: rows per block of the head's loss, the trainer's 2,048 by default; `--no-autocast`: the same
//! steps in f32, the reference for the bf16 losses; `--recompute`: the MLP activations computed
//! again in the backward pass instead of kept)
//!
//! `--profile` then profiles one more step: the op table by device time, the kernels with the
//! most device time, how much of the step's span the device was busy, and the memory peak's op
//! (`--trace PATH` also writes the step's Chrome trace; `--shapes` gives the table a row per
//! op and input shapes).
//!
//! Data-parallel under `genesis-run --nproc-per-node N`: each rank trains a
//! `DistributedDataParallel` replica on `cuda:{LOCAL_RANK}` with its own batch of `--batch`
//! sequences, and rank 0 prints the line with the world size and the tokens/s of all ranks.

use genesis::distributed::{MaybeDdp, ProcessGroup};
use genesis::models::qwen2::{Qwen2Config, Qwen2ForCausalLM};
use genesis::profiler::{profile, Profile, ProfilerOptions, SortBy, TableOptions};
use genesis::sft::{SftBatches, SftConfig, SftExample, SftTrainer};
use genesis::{DType, Error, Result};
use std::time::Instant;

fn main() -> Result<()> {
    let (mut device, mut batch, mut len, mut steps, mut layers) = ("cuda".to_string(), 8, 1024, 5u64, None);
    let (mut profiled, mut trace, mut chunk, mut autocast) = (false, None, SftConfig::default().loss_chunk_rows, true);
    let (mut shapes, mut recompute) = (false, false);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| Error::invalid(format!("{flag} needs a value")));
        let number = |v: String| v.parse::<usize>().map_err(|_| Error::invalid(format!("{flag}: not a number: {v}")));
        match flag.as_str() {
            "--device" => device = value()?,
            "--batch" => batch = number(value()?)?,
            "--len" => len = number(value()?)?,
            "--steps" => steps = number(value()?)? as u64,
            "--layers" => layers = Some(number(value()?)?),
            "--chunk" => chunk = number(value()?)?,
            "--no-autocast" => autocast = false,
            "--recompute" => recompute = true,
            "--profile" => profiled = true,
            "--trace" => (profiled, trace) = (true, Some(value()?)),
            "--shapes" => (profiled, shapes) = (true, true),
            other => return Err(Error::invalid(format!("unknown flag {other}"))),
        }
    }
    let group = ProcessGroup::from_env_if_launched()?;
    let device = ProcessGroup::device(group.as_ref(), &device)?;
    let (rank, world) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.world_size()));
    let mut config = Qwen2Config::qwen2_5_0_5b();
    if let Some(n) = layers {
        config.num_hidden_layers = n;
    }
    genesis::manual_seed(0);
    let net = Qwen2ForCausalLM::new(config.clone(), &device, DType::F32)?;
    net.set_recompute_mlp_activations(recompute);
    let replica = MaybeDdp::new(net, group.as_ref())?;
    let model = replica.module();
    let vocab = config.vocab_size as u64;
    // Random token ids from a fixed sequence (no device RNG needed); every token is a target.
    // Each rank its own sequences.
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (rank as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab) as u32
    };
    let examples: Vec<SftExample> = (0..batch)
        .map(|_| {
            let ids: Vec<u32> = (0..len).map(|_| next()).collect();
            SftExample { labels: ids.iter().map(|&i| i64::from(i)).collect(), input_ids: ids }
        })
        .collect();
    let on_gpu = device.backend().name() != "cpu";
    let autocast = on_gpu && autocast;
    // One trainer (one optimizer and its state, as in the PyTorch script): a warm-up step,
    // the timed steps, then the profiled step if asked for.
    let sft = SftConfig {
        max_steps: 1 + steps + u64::from(profiled),
        batch_size: batch,
        // A constant learning rate, as the PyTorch script's AdamW has.
        lr: 1e-5,
        warmup_steps: 0,
        min_lr_ratio: 1.0,
        autocast: autocast.then_some(DType::BF16),
        loss_chunk_rows: chunk,
        progress: false,
        ..SftConfig::default()
    };
    let out = std::env::temp_dir().join(format!("genesis-sft-bench-{}", std::process::id()));
    let barrier = || group.as_ref().map_or(Ok(()), |g| g.barrier());
    let mut trainer = SftTrainer::new(model, sft, &out)?;
    let mut data = SftBatches::new(examples.clone(), batch, 0)?;
    trainer.train_for(&mut data, None, 1)?; // warm-up: kernels compiled, allocator filled, optimizer state made
    device.synchronize()?;
    device.reset_peak_memory_stats()?;
    barrier()?;
    let start = Instant::now();
    let report = trainer.train_for(&mut data, None, steps)?;
    device.synchronize()?;
    barrier()?;
    let seconds = start.elapsed().as_secs_f64();
    let peak = device.max_memory_allocated()?;
    if profiled {
        let options = ProfilerOptions { record_shapes: shapes, profile_memory: true, device_time: true };
        let (_, prof) = profile(options, || trainer.train_for(&mut data, None, 1))?;
        if rank == 0 {
            print_profile(&prof, shapes);
        }
        if let Some(path) = &trace {
            prof.export_chrome_trace(path)?;
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    let peak = peak as f64 / (1u64 << 30) as f64;
    if rank != 0 {
        return Ok(());
    }
    println!(
        "{{\"system\": \"genesis\", \"world\": {world}, \"batch\": {batch}, \"len\": {len}, \"layers\": {}, \
         \"chunk\": {chunk}, \"autocast\": {autocast}, \"recompute\": {recompute}, \"ms_per_step\": {:.1}, \"tokens_per_s\": {:.0}, \"peak_gib\": {peak:.2}, \"losses\": {:?}}}",
        config.num_hidden_layers,
        1e3 * seconds / steps as f64,
        (world * batch * len) as f64 * steps as f64 / seconds,
        report.losses.iter().map(|l| l.1 as f32).collect::<Vec<_>>()
    );
    Ok(())
}

/// One profiled step: the ops by device time, the kernels by device time, the device's busy
/// and idle time over the step's span, and the op at the memory peak.
fn print_profile(prof: &Profile, by_shape: bool) {
    let row_limit = if by_shape { 80 } else { 40 };
    println!(
        "{}",
        prof.table(&TableOptions { sort_by: SortBy::SelfDevice, row_limit, group_by_input_shape: by_shape })
    );
    let (busy, span) = prof.device_coverage();
    println!(
        "device: {} kernels, busy {:.1} ms of a {:.1} ms span (idle {:.1} ms)",
        prof.kernels().len(),
        busy as f64 / 1e6,
        span as f64 / 1e6,
        (span - busy) as f64 / 1e6
    );
    for (name, count, ns) in prof.kernel_totals().into_iter().take(30) {
        let name: String = name.chars().take(100).collect();
        println!("{:>9.2} ms {count:>5}x  {name}", ns as f64 / 1e6);
    }
    for (device, bytes, op) in prof.memory_peaks() {
        println!(
            "memory peak on {device}: {:.2} GiB above the start, while running `{op}`",
            bytes as f64 / (1u64 << 30) as f64
        );
    }
}
