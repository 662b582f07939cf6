//! Decode benchmark of a Qwen2.5-0.5B-shaped model with random weights: a prefill of
//! `--prompt` tokens, then `--new` greedy tokens for `--batch` rows. Prints time to first
//! token (of the first prompt of that length in the process, and again once warm), decode tokens/s (all rows) and peak device memory as one JSON line per mode:
//! `--graph both` (the default) runs the decode step uncaptured, then replayed from a captured
//! graph, and checks that both produce the same ids. `--profile N` adds, per mode, the device
//! time and kernel count per token over N profiled tokens (`--trace PATH` also writes their
//! Chrome trace; with both modes, the graph's). (`benches/qwen2/gpu_run.sh` runs
//! it next to transformers on the same GPU.)
//!
//! `cargo run --release --example qwen2_bench -- --device cuda --dtype bf16 [--prompt 512 --new 256 --batch 1]`

use genesis::generation::{Generation, GenerationConfig, GraphUse, TOKENS_PER_READ};
use genesis::models::hf::parse_dtype;
use genesis::models::qwen2::{Qwen2Config, Qwen2ForCausalLM};
use genesis::profiler::{profile, ProfilerOptions};
use genesis::{Device, Error, Result};
use std::time::Instant;

struct Args {
    device: String,
    dtype: String,
    prompt: usize,
    new: usize,
    batch: usize,
    layers: Option<usize>,
    graph: Vec<bool>,
    profile: usize,
    /// Where `--profile` writes the profiled tokens' Chrome trace, if anywhere.
    trace: Option<String>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        device: "cuda".into(),
        dtype: "bf16".into(),
        prompt: 512,
        new: 256,
        batch: 1,
        layers: None,
        graph: vec![false, true],
        profile: 0,
        trace: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| Error::invalid(format!("{flag} needs a value")));
        let number = |v: String| v.parse::<usize>().map_err(|_| Error::invalid(format!("{flag}: not a number: {v}")));
        match flag.as_str() {
            "--device" => args.device = value()?,
            "--dtype" => args.dtype = value()?,
            "--prompt" => args.prompt = number(value()?)?,
            "--new" => args.new = number(value()?)?,
            "--layers" => args.layers = Some(number(value()?)?),
            "--batch" => args.batch = number(value()?)?.max(1),
            "--profile" => args.profile = number(value()?)?,
            "--trace" => args.trace = Some(value()?),
            "--graph" => {
                args.graph = match value()?.as_str() {
                    "on" => vec![true],
                    "off" => vec![false],
                    "both" => vec![false, true],
                    other => return Err(Error::invalid(format!("--graph: on, off or both, not {other}"))),
                }
            }
            other => return Err(Error::invalid(format!("unknown flag {other}"))),
        }
    }
    Ok(args)
}

fn graph_use(on: bool) -> GraphUse {
    if on {
        GraphUse::Always
    } else {
        GraphUse::Never
    }
}

/// What one generation measured.
struct Run {
    /// Prefill and one sampled id per row on the host, seconds.
    ttft: f64,
    /// Seconds of the remaining `new - 1` steps.
    decode: f64,
    ids: Vec<Vec<Option<u32>>>,
    graph: bool,
}

fn run(model: &Qwen2ForCausalLM, prompts: &[Vec<u32>], new: usize, use_graph: bool) -> Result<Run> {
    let config = GenerationConfig { max_new_tokens: new, graph: graph_use(use_graph), ..Default::default() };
    let start = Instant::now();
    let mut generation = Generation::new(model, prompts, &config)?;
    let mut ids = vec![generation.step()?];
    let ttft = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    while !generation.is_done() {
        ids.push(generation.step()?);
    }
    if ids.len() != new {
        return Err(Error::invalid(format!("expected {new} tokens, generated {}", ids.len())));
    }
    Ok(Run { ttft, decode: decode_start.elapsed().as_secs_f64(), ids, graph: generation.uses_graph() })
}

/// Device time and kernels per token over `tokens` profiled decode steps, rounded up to whole
/// reads (after the prompt, the capture and a first read, which are not profiled). The
/// profiler's own work slows the replays, so its wall time is not the benchmark's.
fn profile_tokens(
    model: &Qwen2ForCausalLM,
    prompts: &[Vec<u32>],
    tokens: usize,
    use_graph: bool,
    trace: Option<&str>,
) -> Result<String> {
    // Greedy replays compute TOKENS_PER_READ tokens per read: the window starts after the
    // prompt, the capture and one whole read, and covers whole reads, so that the tokens it
    // returns are the tokens the device computed in it.
    let tokens = tokens.next_multiple_of(TOKENS_PER_READ);
    let warm = 1 + TOKENS_PER_READ;
    let config = GenerationConfig { max_new_tokens: warm + tokens, graph: graph_use(use_graph), ..Default::default() };
    let mut generation = Generation::new(model, prompts, &config)?;
    (0..warm).try_for_each(|_| generation.step().map(|_| ()))?;
    let options = ProfilerOptions { record_shapes: false, profile_memory: false, device_time: true };
    let start = Instant::now();
    let (_, prof) = profile(options, || (0..tokens).try_for_each(|_| generation.step().map(|_| ())))?;
    let wall = start.elapsed().as_secs_f64();
    if let Some(path) = trace {
        prof.export_chrome_trace(path)?;
    }
    let busy: u64 = prof.kernels().iter().map(|k| k.end_ns - k.start_ns).sum();
    // Kernels launched early overlap the one before: the device is busy for the union of
    // their intervals, and idle for the rest of the span from the first start to the last end.
    let (covered, span) = prof.device_coverage();
    let top: Vec<String> = prof
        .kernel_totals()
        .into_iter()
        .take(14)
        .map(|(name, n, ns)| {
            let short: String = name.chars().take(48).collect();
            format!(
                "{{\"kernel\": \"{short}\", \"per_token\": {:.1}, \"us_per_token\": {:.1}}}",
                n as f64 / tokens as f64,
                ns as f64 / 1e3 / tokens as f64
            )
        })
        .collect();
    Ok(format!(
        "{{\"profile\": \"{}\", \"tokens\": {tokens}, \"kernels_per_token\": {:.1}, \"device_busy_ms_per_token\": {:.3}, \
         \"wall_ms_per_token_profiled\": {:.3}, \"covered_ms_per_token\": {:.3}, \"idle_ms_per_token\": {:.3}, \
         \"top\": [{}]}}",
        if generation.uses_graph() { "graph" } else { "plain" },
        prof.kernels().len() as f64 / tokens as f64,
        busy as f64 / 1e6 / tokens as f64,
        wall * 1e3 / tokens as f64,
        covered as f64 / 1e6 / tokens as f64,
        (span - covered) as f64 / 1e6 / tokens as f64,
        top.join(", ")
    ))
}

/// FNV-1a of the generated ids (a finished row's `None` included): runs on other plugins or
/// settings compare by this one value.
fn fnv(ids: &[Vec<Option<u32>>]) -> u64 {
    ids.iter()
        .flatten()
        .fold(0xcbf2_9ce4_8422_2325, |h, id| (h ^ id.map_or(u64::MAX, u64::from)).wrapping_mul(0x100_0000_01b3))
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let device = Device::parse(&args.device)?;
    let dtype = parse_dtype(&args.dtype)?;
    let mut config = Qwen2Config::qwen2_5_0_5b();
    if let Some(layers) = args.layers {
        config.num_hidden_layers = layers;
    }
    genesis::manual_seed(0);
    let model = Qwen2ForCausalLM::new(config.clone(), &device, dtype)?;
    let prompts: Vec<Vec<u32>> = (0..args.batch)
        .map(|row| (0..args.prompt).map(|i| ((i * 7919 + row * 104_729 + 13) % config.vocab_size) as u32).collect())
        .collect();
    let warm: Vec<Vec<u32>> = prompts.iter().map(|p| p[..args.prompt.min(64)].to_vec()).collect();
    let mut reference: Option<Vec<Vec<Option<u32>>>> = None;
    for &use_graph in &args.graph {
        // Warm-up: kernel compilation, library handles and the allocator stay out of the numbers.
        run(&model, &warm, 8, use_graph)?;
        // The first prompt of the full length still pays for what that length needs first (device
        // memory for its activations, library plans for its shapes): its time to first token is
        // reported apart, and the measured run is the steady state, as a server sees it.
        let first = run(&model, &prompts, 2, use_graph)?;
        device.synchronize()?;
        device.reset_peak_memory_stats()?;
        let r = run(&model, &prompts, args.new, use_graph)?;
        let peak = device.max_memory_allocated()? as f64 / (1u64 << 30) as f64;
        let tokens_per_s = ((args.new - 1) * args.batch) as f64 / r.decode;
        let same = match &reference {
            None => {
                reference = Some(r.ids.clone());
                "null".to_string()
            }
            Some(ids) => (ids == &r.ids).to_string(),
        };
        println!(
            "{{\"engine\": \"genesis\", \"device\": \"{}\", \"dtype\": \"{}\", \"prompt\": {}, \"new\": {}, \
             \"batch\": {}, \"graph\": {}, \"ttft_first_ms\": {:.2}, \"ttft_ms\": {:.2}, \"decode_tokens_per_s\": {:.1}, \"peak_memory_gib\": {:.3}, \
             \"same_ids_as_first_mode\": {same}, \"ids_fnv\": \"{:016x}\"}}",
            device.properties()?.name,
            args.dtype,
            args.prompt,
            args.new,
            args.batch,
            r.graph,
            first.ttft * 1e3,
            r.ttft * 1e3,
            tokens_per_s,
            peak,
            fnv(&r.ids)
        );
        if args.profile > 0 {
            println!("{}", profile_tokens(&model, &prompts, args.profile, use_graph, args.trace.as_deref())?);
        }
    }
    Ok(())
}
