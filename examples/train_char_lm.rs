//! A small causal transformer language model trained from scratch on 200 KB of Shakespeare,
//! one character per token, then asked to write.
//!
//! `cargo run --release --example train_char_lm [-- --device cuda --steps N --out DIR]`
//! (400 steps by default: 2 to 4 minutes on two CPU cores; 300 steps took 5 s on an H100)
//!
//! Prints the validation loss against the unigram entropy of the text (the loss of a model
//! that knows only character frequencies; the goal is to end well below it, at most 0.7×),
//! a sample, and writes metrics CSV, curves PNG and the weights under `--out` (default
//! `target/train_char_lm`).
//!
//! Data-parallel: `genesis-run --nproc-per-node N target/release/examples/train_char_lm`
//! trains a `DistributedDataParallel` replica per rank (on `cuda:{LOCAL_RANK}` with `--device
//! cuda`), each on its own random windows (32 per rank and step); rank 0 reports and writes.

use genesis::distributed::{MaybeDdp, ProcessGroup};
use genesis::monitor::{MetricsLog, Progress};
use genesis::nn::functional::{cross_entropy, gelu, scaled_dot_product_attention};
use genesis::nn::{init, Embedding, Entry, LayerNorm, Linear, Module, ModuleList, Reduction};
use genesis::optim::{AdamOptions, AdamW, Optimizer, WarmupCosineLR};
use genesis::{no_grad, DType, Device, Error, Result, Tensor};
use std::collections::BTreeSet;
use std::path::PathBuf;

const TEXT: &str = include_str!("data/shakespeare.txt");
const GOAL_RATIO: f64 = 0.7;

/// Model and training sizes: small enough to train in a few minutes on two CPU cores.
struct Config {
    vocab: usize,
    context: usize,
    width: usize,
    heads: usize,
    layers: usize,
    batch: usize,
}

/// Pre-norm transformer block: `x + attn(ln(x))`, then `x + mlp(ln(x))`.
struct Block {
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    fc: Linear,
    out: Linear,
    heads: usize,
}

impl Block {
    fn new(c: &Config, device: &Device) -> Result<Block> {
        let w = c.width;
        Ok(Block {
            ln1: LayerNorm::new(&[w], 1e-5, true, true, device)?,
            qkv: Linear::new(w, 3 * w, true, device)?,
            proj: Linear::new(w, w, true, device)?,
            ln2: LayerNorm::new(&[w], 1e-5, true, true, device)?,
            fc: Linear::new(w, 4 * w, true, device)?,
            out: Linear::new(4 * w, w, true, device)?,
            heads: c.heads,
        })
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, w) = (x.shape()[0] as isize, x.shape()[1] as isize, x.shape()[2] as isize);
        let h = self.heads as isize;
        // (b, t, 3w) -> three (b, h, t, w/h) views for the attention op.
        let qkv = self.qkv.forward(&self.ln1.forward(x)?)?.reshape(&[b, t, 3, h, w / h])?;
        let part = |i: isize| qkv.select(2, i)?.transpose(1, 2);
        let y = scaled_dot_product_attention(&part(0)?, &part(1)?, &part(2)?, None, true, None)?;
        let x = x.add(&self.proj.forward(&y.transpose(1, 2)?.reshape(&[b, t, w])?)?)?;
        let m = self.out.forward(&gelu(&self.fc.forward(&self.ln2.forward(&x)?)?, false)?)?;
        x.add(&m)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("ln1", Entry::Child(&self.ln1));
        f("attn_qkv", Entry::Child(&self.qkv));
        f("attn_proj", Entry::Child(&self.proj));
        f("ln2", Entry::Child(&self.ln2));
        f("mlp_fc", Entry::Child(&self.fc));
        f("mlp_out", Entry::Child(&self.out));
    }
}

/// Token and position embeddings, blocks, a final norm and the vocabulary head.
struct CharLm {
    tokens: Embedding,
    positions: Embedding,
    blocks: ModuleList<Block>,
    ln: LayerNorm,
    head: Linear,
}

impl CharLm {
    fn new(c: &Config, device: &Device) -> Result<CharLm> {
        let lm = CharLm {
            tokens: Embedding::new(c.vocab, c.width, device)?,
            positions: Embedding::new(c.context, c.width, device)?,
            blocks: ModuleList::new((0..c.layers).map(|_| Block::new(c, device)).collect::<Result<_>>()?),
            ln: LayerNorm::new(&[c.width], 1e-5, true, true, device)?,
            head: Linear::new(c.width, c.vocab, true, device)?,
        };
        // Small embeddings (GPT-2's 0.02) keep the residual stream calm at the start;
        // nn.Embedding's N(0, 1) default is made for other uses.
        init::normal_(&lm.tokens.weight.get(), 0.0, 0.02)?;
        init::normal_(&lm.positions.weight.get(), 0.0, 0.02)?;
        Ok(lm)
    }
}

impl Module for CharLm {
    /// Token ids `(b, t)` -> logits `(b, t, vocab)`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.shape()[1];
        let positions = Tensor::arange(0.0, t as f64, 1.0, DType::I64, ids.device())?;
        let mut x = self.tokens.forward(ids)?.add(&self.positions.forward(&positions)?)?;
        for block in self.blocks.iter() {
            x = block.forward(&x)?;
        }
        self.head.forward(&self.ln.forward(&x)?)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("tok_emb", Entry::Child(&self.tokens));
        f("pos_emb", Entry::Child(&self.positions));
        f("blocks", Entry::Child(&self.blocks));
        f("ln_f", Entry::Child(&self.ln));
        f("head", Entry::Child(&self.head));
    }
}

/// The character vocabulary and the text as ids.
struct Corpus {
    chars: Vec<char>,
    ids: Vec<i64>,
}

impl Corpus {
    fn new(text: &str) -> Corpus {
        let chars: Vec<char> = text.chars().collect::<BTreeSet<_>>().into_iter().collect();
        let ids = text.chars().map(|ch| chars.binary_search(&ch).map_or(0, |i| i as i64)).collect();
        Corpus { chars, ids }
    }

    /// Entropy in nats of the character frequencies of `ids`.
    fn unigram_entropy(&self, ids: &[i64]) -> f64 {
        let mut counts = vec![0usize; self.chars.len()];
        ids.iter().for_each(|&i| counts[i as usize] += 1);
        let n = ids.len() as f64;
        counts.iter().filter(|&&c| c > 0).map(|&c| -(c as f64 / n) * (c as f64 / n).ln()).sum()
    }
}

/// A batch of `batch` windows starting at `starts`: inputs and the next-character targets.
fn batch_at(ids: &[i64], starts: &[usize], context: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let mut x = Vec::with_capacity(starts.len() * context);
    let mut y = Vec::with_capacity(starts.len() * context);
    for &s in starts {
        x.extend_from_slice(&ids[s..s + context]);
        y.extend_from_slice(&ids[s + 1..s + context + 1]);
    }
    let shape = [starts.len(), context];
    Ok((Tensor::from_vec(x, &shape, device)?, Tensor::from_vec(y, &shape, device)?))
}

/// Random window starts from the genesis generator (so `manual_seed` fixes the run).
fn random_starts(n: usize, len: usize, context: usize, device: &Device) -> Result<Vec<usize>> {
    let limit = len - context - 1;
    let u = Tensor::rand(&[n], DType::F64, device)?.to_vec::<f64>()?;
    Ok(u.into_iter().map(|u| ((u * limit as f64) as usize).min(limit - 1)).collect())
}

fn lm_loss(model: &CharLm, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let logits = model.forward(x)?;
    let v = logits.shape()[2] as isize;
    cross_entropy(&logits.reshape(&[-1, v])?, &y.reshape(&[-1])?, -100, 0.0, Reduction::Mean)
}

/// Mean loss over fixed, evenly spaced windows of `ids` (the same windows every time).
fn evaluate(model: &CharLm, ids: &[i64], c: &Config, device: &Device) -> Result<f64> {
    model.eval();
    let windows = 8 * c.batch;
    let stride = (ids.len() - c.context - 1) / windows;
    let starts: Vec<usize> = (0..windows).map(|i| i * stride).collect();
    let mut total = 0.0;
    for chunk in starts.chunks(c.batch) {
        let (x, y) = batch_at(ids, chunk, c.context, device)?;
        total += no_grad(|| lm_loss(model, &x, &y))?.item::<f32>()? as f64 * chunk.len() as f64;
    }
    model.train(true);
    Ok(total / windows as f64)
}

/// Continue `prompt` by `n` characters, sampling from the softmax at `temperature`.
fn sample(model: &CharLm, corpus: &Corpus, prompt: &str, n: usize, temperature: f64, c: &Config) -> Result<String> {
    model.eval();
    let device = model.head.weight.get().device().clone();
    let mut ids: Vec<i64> = prompt.chars().map(|ch| corpus.chars.binary_search(&ch).map_or(0, |i| i as i64)).collect();
    let mut out = prompt.to_string();
    for _ in 0..n {
        let window = &ids[ids.len().saturating_sub(c.context)..];
        let x = Tensor::from_vec(window.to_vec(), &[1, window.len()], &device)?;
        let probs = no_grad(|| -> Result<Vec<f32>> {
            let logits = model.forward(&x)?.select(1, -1)?.reshape(&[-1])?;
            logits.div_scalar(temperature)?.softmax(-1)?.to_vec::<f32>()
        })?;
        let u = Tensor::rand(&[1], DType::F64, &device)?.item::<f64>()?;
        let mut acc = 0.0;
        let next = probs.iter().position(|&p| {
            acc += p as f64;
            acc > u
        });
        let next = next.unwrap_or(probs.len() - 1);
        ids.push(next as i64);
        out.push(corpus.chars[next]);
    }
    model.train(true);
    Ok(out)
}

fn main() -> Result<()> {
    let mut device_name = "cpu".to_string();
    let mut steps = 400usize;
    let mut out_dir = PathBuf::from("target/train_char_lm");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| Error::invalid(format!("{flag} needs a value")))?;
        match flag.as_str() {
            "--device" => device_name = value,
            "--steps" => {
                steps = value.parse().map_err(|_| Error::invalid(format!("--steps: not a number: {value}")))?
            }
            "--out" => out_dir = value.into(),
            other => return Err(Error::invalid(format!("unknown argument {other} (see the file's header)"))),
        }
    }
    if steps == 0 {
        return Err(Error::invalid("--steps must be at least 1"));
    }
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| Error::invalid(format!("cannot create {}: {e}", out_dir.display())))?;
    // Started by genesis-run or torchrun: one rank of a data-parallel job.
    let group = ProcessGroup::from_env_if_launched()?;
    let device = ProcessGroup::device(group.as_ref(), &device_name)?;
    let rank = group.as_ref().map_or(0, ProcessGroup::rank);
    let leader = rank == 0;
    match &group {
        Some(g) => println!("rank {rank} of {}, device: {device} ({})", g.world_size(), device.properties()?.name),
        None => println!("device: {device} ({})", device.properties()?.name),
    }

    let corpus = Corpus::new(TEXT);
    let split = corpus.ids.len() * 9 / 10;
    let (train_ids, val_ids) = (&corpus.ids[..split], &corpus.ids[split..]);
    let c = Config { vocab: corpus.chars.len(), context: 64, width: 128, heads: 4, layers: 3, batch: 32 };
    let entropy = corpus.unigram_entropy(val_ids);
    let say = |line: String| {
        if leader {
            println!("{line}");
        }
    };
    say(format!(
        "text: {} characters, vocabulary {}, unigram entropy of the validation text {entropy:.3} nats",
        corpus.ids.len(),
        c.vocab
    ));

    genesis::manual_seed(1337);
    let replica = MaybeDdp::new(CharLm::new(&c, &device)?, group.as_ref())?;
    if group.is_some() {
        // Rank 0's weights everywhere; from here each rank draws its own windows.
        genesis::manual_seed(1337 + rank as u64);
    }
    let model = replica.module();
    say(format!(
        "model: {} layers, width {}, {} heads, context {}: {} parameters",
        c.layers,
        c.width,
        c.heads,
        c.context,
        model.num_parameters()
    ));
    let mut optimizer =
        AdamW::new(model.parameters(), AdamOptions { lr: 2e-3, weight_decay: 0.01, ..AdamOptions::adamw() })?;
    let warmup = (steps / 20).max(1) as u64;
    let mut scheduler = WarmupCosineLR::new(&mut optimizer, warmup, steps as u64, 0.1)?;
    let mut log = MetricsLog::new();
    let mut bar =
        if leader { Progress::new(steps as u64, "char-lm") } else { Progress::hidden(steps as u64, "char-lm") }
            .unit("tokens");
    let eval_every = (steps / 10).max(1);
    for step in 1..=steps {
        let starts = random_starts(c.batch, train_ids.len(), c.context, &device)?;
        let (x, y) = batch_at(train_ids, &starts, c.context, &device)?;
        let loss = lm_loss(model, &x, &y)?;
        optimizer.zero_grad();
        loss.backward()?;
        genesis::optim::clip_grad_norm_(&model.parameters(), 1.0, 2.0)?;
        optimizer.step()?;
        scheduler.step(&mut optimizer)?;
        let loss = loss.item::<f32>()? as f64;
        bar.step(loss, (c.batch * c.context) as u64);
        log.record(step as u64, &[("train_loss", loss)]);
        if step % eval_every == 0 || step == steps {
            let val = evaluate(model, val_ids, &c, &device)?;
            log.record(step as u64, &[("val_loss", val)]);
            if leader {
                bar.println(format!("step {step:5}: train loss {loss:.3}, validation loss {val:.3} nats"));
            }
        }
    }
    bar.finish();
    let val = evaluate(model, val_ids, &c, &device)?;
    say(format!(
        "validation loss {val:.3} nats = {:.2} x the unigram entropy {entropy:.3} (goal <= {GOAL_RATIO}x: {}); {:.0} \
         tokens/s",
        val / entropy,
        if val <= GOAL_RATIO * entropy { "met" } else { "NOT met" },
        bar.throughput()
    ));
    if !leader {
        return if val > GOAL_RATIO * entropy { Err(Error::invalid("validation loss above the goal")) } else { Ok(()) };
    }
    println!("--- sample (temperature 0.8) ---");
    println!("{}", sample(model, &corpus, "ROMEO:\n", 400, 0.8, &c)?);
    println!("---");

    let (csv, png, weights) =
        (out_dir.join("metrics.csv"), out_dir.join("curves.png"), out_dir.join("char_lm.safetensors"));
    log.write_csv(&csv)?;
    log.plot_png(&png)?;
    genesis::serialize::save(&weights, &model.state_dict(), &Default::default())?;
    println!("wrote {}, {}, {}", csv.display(), png.display(), weights.display());
    if val > GOAL_RATIO * entropy {
        return Err(Error::invalid(format!(
            "validation loss {val:.3} stayed above {GOAL_RATIO} x the unigram entropy ({entropy:.3})"
        )));
    }
    Ok(())
}
