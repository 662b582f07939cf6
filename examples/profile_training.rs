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

/// How a round of [`overhead`] runs its additions.
#[derive(Clone, Copy)]
enum Round {
    /// No profiler.
    Plain,
    /// A profiler with these options.
    Profiled(ProfilerOptions),
    /// No profiler, the backend recording activity (what device time starts).
    Activity,
    /// As `Activity`, each op also tagged as the profiler tags it.
    Tagged,
}

/// Host time per tiny op (an addition of one element) in each of `rounds`: the best of
/// `repeats` rounds of `n` ops, the rounds taken in turn, so a noisy neighbour on the host
/// does not pass for a cost. `None` for a round the device cannot run (no activity records).
fn overhead(device: &Device, rounds: &[Round], n: usize, repeats: usize) -> Result<Vec<Option<f64>>> {
    let x = Tensor::ones(&[1], DType::F32, device)?;
    let mut best: Vec<Option<f64>> = vec![Some(f64::INFINITY); rounds.len()];
    for _ in 0..=repeats {
        for (best, &round) in best.iter_mut().zip(rounds) {
            let Some(so_far) = *best else { continue };
            let profiler = match round {
                Round::Profiled(options) => Some(Profiler::start(options)?),
                _ => None,
            };
            let activity = matches!(round, Round::Activity | Round::Tagged);
            if activity && device.activity_start().is_err() {
                *best = None;
                continue;
            }
            let tag = matches!(round, Round::Tagged);
            let start = Instant::now();
            for id in 1..=n as u64 {
                if tag {
                    device.activity_tag(id)?;
                }
                x.add(&x)?;
                if tag {
                    device.activity_tag(0)?;
                }
            }
            device.synchronize()?;
            let us = start.elapsed().as_secs_f64() * 1e6 / n as f64;
            if activity {
                device.activity_stop()?;
            }
            drop(profiler);
            *best = Some(so_far.min(us));
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
    for (name, count, ns) in prof.kernel_totals().into_iter().take(10) {
        let name: String = name.chars().take(90).collect();
        println!("{:>10.1} us {count:>5}x  {name}", ns as f64 / 1e3);
    }
    let trace = out.join("trace.json");
    prof.export_chrome_trace(&trace)?;
    std::fs::write(out.join("table.txt"), prof.table(&TableOptions::default()))
        .map_err(|e| Error::invalid(format!("writing the table: {e}")))?;
    println!("trace: {} ({} events); table: {}", trace.display(), prof.events().len(), out.join("table.txt").display());

    println!("{}", device.memory_summary()?);
    let shapes = ProfilerOptions { record_shapes: true, profile_memory: true, device_time: false };
    let timed = ProfilerOptions { device_time: true, ..shapes };
    let rounds = [Round::Plain, Round::Profiled(shapes), Round::Profiled(timed), Round::Activity, Round::Tagged];
    let us = overhead(&device, &rounds, 2_000, 30)?;
    let off = us[0].unwrap_or(f64::NAN);
    let cost = |i: usize| us[i].map_or("n/a".to_string(), |t| format!("{t:.2} us (+{:.2} us)", t - off));
    println!(
        "host time per tiny op: {off:.2} us without a profiler, {} recording shapes and memory, {} with device time too",
        cost(1),
        cost(2)
    );
    // Only for a backend with activity records (the others have no device-time cost to split).
    if us[3].is_some() {
        println!(
            "device time's share, without a profiler: the backend recording activity {}, and tagging each op as \
         the profiler does {}",
            cost(3),
            cost(4)
        );
    }
    Ok(())
}
