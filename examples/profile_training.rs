//! Profile a few training steps of a small Qwen2-shaped transformer: prints the op table
//! (`key_averages().table()` shape) and the memory peak, writes a Chrome trace (open it in
//! Perfetto or chrome://tracing), and measures what profiling costs per op.
//!
//! `cargo run --release --example profile_training [-- --device cuda --steps 3 --out DIR]`
//!
//! The trace has one track per host thread: each step is a `step` span holding `forward`,
//! `backward` and `optimizer` spans; under them every backend op (`matmul`, `rms_norm`,
//! `attention`, ...), and in `backward` one span per autograd node (`MatmulBackward`, ...)
//! around the ops it runs; a counter track shows the device's allocated bytes. On a device
//! with activity records (CUDA with CUPTI) each kernel, copy and fill is on a track of its
//! device stream, with an arrow from the op that issued it, and the table has device
//! columns; the ten kernels with the most device time are listed.

use genesis::generation::CausalLM;
use genesis::models::qwen2::{Qwen2Config, Qwen2ForCausalLM};
use genesis::nn::functional::cross_entropy;
use genesis::nn::{Module, Reduction};
use genesis::optim::{AdamOptions, AdamW, Optimizer};
use genesis::profiler::{profile, record_function, Profiler, ProfilerOptions, SortBy, TableOptions};
use genesis::{DType, Device, Error, Result, Tensor};
use std::path::PathBuf;
use std::time::Instant;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn small_config() -> Qwen2Config {
    let mut c = Qwen2Config::qwen2_5_0_5b();
    (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) = (512, 128, 256, 2);
    (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.max_position_embeddings) = (4, 2, 32, 256);
    c
}

/// Host time per op of `n` tiny additions without a profiler, recording shapes and memory,
/// and recording device time too: the best of five rounds, the three taken in turn, so a
/// noisy neighbour on the host does not pass for a cost.
fn overhead(device: &Device, n: usize) -> Result<[f64; 3]> {
    let x = Tensor::ones(&[1], DType::F32, device)?;
    let time = |x: &Tensor| -> Result<f64> {
        let start = Instant::now();
        for _ in 0..n {
            x.add(x)?;
        }
        device.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
    };
    time(&x)?; // warm-up
    let shapes = ProfilerOptions { record_shapes: true, profile_memory: true, device_time: false };
    let configs = [None, Some(shapes), Some(ProfilerOptions { device_time: true, ..shapes })];
    let mut best = [f64::INFINITY; 3];
    for _ in 0..5 {
        for (best, options) in best.iter_mut().zip(configs) {
            let profiler = options.map(Profiler::start).transpose()?;
            *best = best.min(time(&x)?);
            drop(profiler);
        }
    }
    Ok(best)
}

fn main() -> Result<()> {
    let device = Device::parse(&arg("--device").unwrap_or_else(|| "cpu".into()))?;
    let steps: usize = arg("--steps").map_or(Ok(3), |s| s.parse().map_err(|_| Error::invalid("--steps: a number")))?;
    let out = PathBuf::from(arg("--out").unwrap_or_else(|| "target/profile".into()));
    std::fs::create_dir_all(&out).map_err(|e| Error::invalid(format!("creating {}: {e}", out.display())))?;

    genesis::manual_seed(0);
    let model = Qwen2ForCausalLM::new(small_config(), &device, DType::F32)?;
    let mut optimizer = AdamW::new(model.parameters(), AdamOptions { lr: 1e-3, ..AdamOptions::adamw() })?;
    let (batch, len, vocab) = (4, 64, model.vocab_size());
    let tokens = Tensor::randint(0, vocab as i64, &[batch, len + 1], &device)?;
    let (inputs, targets) = (tokens.narrow(1, 0, len)?, tokens.narrow(1, 1, len)?);

    let step = |optimizer: &mut AdamW| -> Result<f32> {
        let _step = record_function("step");
        let loss = {
            let _f = record_function("forward");
            let logits = model.forward(&inputs)?;
            cross_entropy(
                &logits.reshape(&[-1, vocab as isize])?,
                &targets.reshape(&[-1])?,
                -100,
                0.0,
                Reduction::Mean,
            )?
        };
        {
            let _b = record_function("backward");
            loss.backward()?;
        }
        let _o = record_function("optimizer");
        optimizer.step()?;
        optimizer.zero_grad();
        loss.item::<f32>()
    };
    step(&mut optimizer)?; // warm-up outside the profile (kernel compilation, allocator)
    let options = ProfilerOptions { record_shapes: true, profile_memory: true, device_time: true };
    let (losses, prof) = profile(options, || (0..steps).map(|_| step(&mut optimizer)).collect::<Result<Vec<_>>>())?;
    println!("{steps} training steps of a 2-layer Qwen2-shaped model on {device}, losses {losses:?}\n");
    let timed = prof.events().iter().any(|e| e.device_ns.is_some());
    let sort_by = if timed { SortBy::SelfDevice } else { SortBy::SelfHost };
    println!("{}", prof.table(&TableOptions { sort_by, row_limit: 25, ..Default::default() }));
    for (device, peak, op) in prof.memory_peaks() {
        println!("memory peak on {device}: {:.2} MiB above the start, while running `{op}`", peak as f64 / 1048576.0);
    }
    for timing in prof.device_timing() {
        println!("device time on {}: {:?}", timing.device, timing.source.ok_or(&timing.unavailable));
    }
    // The kernels that took the most device time (with activity records, the kernels'
    // own names; with timing events, the ops').
    let mut kernels: std::collections::HashMap<&str, (usize, u64)> = Default::default();
    for k in prof.kernels() {
        let entry = kernels.entry(k.name.as_str()).or_default();
        *entry = (entry.0 + 1, entry.1 + (k.end_ns - k.start_ns));
    }
    let mut kernels: Vec<_> = kernels.into_iter().collect();
    kernels.sort_by_key(|(_, (_, ns))| std::cmp::Reverse(*ns));
    for (name, (count, ns)) in kernels.iter().take(10) {
        let name: String = name.chars().take(90).collect();
        println!("{:>10.1} us {count:>5}x  {name}", *ns as f64 / 1e3);
    }
    let trace = out.join("trace.json");
    prof.export_chrome_trace(&trace)?;
    std::fs::write(out.join("table.txt"), prof.table(&TableOptions::default()))
        .map_err(|e| Error::invalid(format!("writing the table: {e}")))?;
    println!("trace: {} ({} events); table: {}", trace.display(), prof.events().len(), out.join("table.txt").display());

    println!("{}", device.memory_summary()?);
    let [off, on, timed] = overhead(&device, 20_000)?;
    println!(
        "host time per tiny op: {off:.2} us without a profiler, {on:.2} us recording shapes and memory (+{:.2} us), \
         {timed:.2} us with device time too (+{:.2} us)",
        on - off,
        timed - off
    );
    Ok(())
}
