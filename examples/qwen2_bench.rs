//! Decode benchmark of a Qwen2.5-0.5B-shaped model with random weights: a prefill of
//! `--prompt` tokens, then `--new` greedy tokens at batch 1. Prints time to first token,
//! decode tokens/s and peak device memory as one JSON line (`benches/qwen2/run.sh` runs it
//! next to transformers on the same GPU).
//!
//! `cargo run --release --example qwen2_bench -- --device cuda --dtype bf16 [--prompt 512 --new 256]`

use genesis::generation::{Generation, GenerationConfig};
use genesis::models::hf::parse_dtype;
use genesis::models::qwen2::{Qwen2Config, Qwen2ForCausalLM};
use genesis::{Device, Error, Result};
use std::time::Instant;

struct Args {
    device: String,
    dtype: String,
    prompt: usize,
    new: usize,
    layers: Option<usize>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args { device: "cuda".into(), dtype: "bf16".into(), prompt: 512, new: 256, layers: None };
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
            other => return Err(Error::invalid(format!("unknown flag {other}"))),
        }
    }
    Ok(args)
}

/// Time to first token (prefill and one sampled id on the host) and the seconds of the
/// remaining `new - 1` steps.
fn run(model: &Qwen2ForCausalLM, prompt: &[u32], new: usize) -> Result<(f64, f64)> {
    let config = GenerationConfig { max_new_tokens: new, ..Default::default() };
    let start = Instant::now();
    let mut generation = Generation::new(model, &[prompt.to_vec()], &config)?;
    generation.step()?;
    let ttft = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut steps = 0;
    while !generation.is_done() {
        generation.step()?;
        steps += 1;
    }
    if steps + 1 != new {
        return Err(Error::invalid(format!("expected {new} tokens, generated {}", steps + 1)));
    }
    Ok((ttft, decode_start.elapsed().as_secs_f64()))
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
    let prompt: Vec<u32> = (0..args.prompt).map(|i| ((i * 7919 + 13) % config.vocab_size) as u32).collect();
    // Warm-up: kernel compilation, library handles and the allocator stay out of the numbers.
    run(&model, &prompt[..args.prompt.min(64)], 8)?;
    device.synchronize()?;
    device.reset_peak_memory_stats()?;
    let (ttft, decode) = run(&model, &prompt, args.new)?;
    let peak = device.max_memory_allocated()? as f64 / (1u64 << 30) as f64;
    let tokens_per_s = (args.new - 1) as f64 / decode;
    println!(
        "{{\"engine\": \"genesis\", \"device\": \"{}\", \"dtype\": \"{}\", \"prompt\": {}, \"new\": {}, \"ttft_ms\": {:.2}, \
         \"decode_tokens_per_s\": {:.1}, \"peak_memory_gib\": {:.3}}}",
        device.properties()?.name,
        args.dtype,
        args.prompt,
        args.new,
        ttft * 1e3,
        tokens_per_s,
        peak
    );
    Ok(())
}
