//! GPU check of the fused norm, rotary and AdamW kernels at sizes the conformance suite does
//! not reach (multi-warp rows, rows past the register budget, strided and unaligned views,
//! multi-chunk AdamW tables), against the CPU backend; plus a determinism check of the weight
//! gradients and timings of the PERFORMANCE.md shapes.
//!
//! `fused_check <plugin.so> [--bench]`; exits non-zero when a check fails.

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use common::{encode, load_plugin, values as decode, Dev, R};
use genesis_backend_api::{contiguous_strides, BufferId, DType, Op, TensorDesc};
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A tensor spec: dtype, shape, strides and element offset in its own buffer of `elems`, with
/// the buffer's contents.
#[derive(Clone)]
struct Spec {
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
    data: Vec<f64>,
}

impl Spec {
    fn dense(rng: &mut Rng, dtype: DType, shape: &[usize], lo: f64, hi: f64) -> Spec {
        let n: usize = shape.iter().product();
        let data = (0..n).map(|_| lo + (hi - lo) * rng.unit()).collect();
        Spec { dtype, shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0, data }
    }
    /// `shape` viewed with dims `a` and `b` swapped in memory (a strided view), plus `offset`.
    fn permuted(rng: &mut Rng, dtype: DType, shape: &[usize], a: usize, b: usize, offset: usize) -> Spec {
        let mut mem = shape.to_vec();
        mem.swap(a, b);
        let mut st = contiguous_strides(&mem);
        st.swap(a, b);
        let n: usize = shape.iter().product::<usize>() + offset;
        let data = (0..n).map(|_| -2.0 + 4.0 * rng.unit()).collect();
        Spec { dtype, shape: shape.to_vec(), strides: st, offset, data }
    }
    fn zeros(dtype: DType, shape: &[usize]) -> Spec {
        let n: usize = shape.iter().product();
        Spec { dtype, shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0, data: vec![0.0; n] }
    }
    fn upload(&self, dev: &Dev) -> R<(BufferId, TensorDesc)> {
        // At least one byte: an empty spec still gets a buffer of its own.
        let b = dev.alloc((self.data.len() * self.dtype.size_in_bytes()).max(1))?;
        dev.write(b, &encode(self.dtype, &self.data))?;
        let d = TensorDesc::new(b, self.offset * self.dtype.size_in_bytes(), self.dtype, &self.shape, &self.strides)?;
        Ok((b, d))
    }
}

/// Run `op` on a device; returns the output buffers' contents (whole buffers).
fn run(dev: &Dev, op: &Op, ins: &[Spec], outs: &[Spec]) -> R<Vec<Vec<f64>>> {
    let ins: Vec<TensorDesc> = ins.iter().map(|s| s.upload(dev).map(|x| x.1)).collect::<R<_>>()?;
    let outs_up: Vec<(BufferId, TensorDesc)> = outs.iter().map(|s| s.upload(dev)).collect::<R<_>>()?;
    let descs: Vec<TensorDesc> = outs_up.iter().map(|x| x.1).collect();
    dev.exec(op, &ins, &descs)?;
    dev.sync()?;
    outs.iter()
        .zip(&outs_up)
        .map(|(s, (b, _))| Ok(decode(s.dtype, &dev.read(*b, s.data.len() * s.dtype.size_in_bytes())?)))
        .collect()
}

fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-4,
        DType::F64 => 1e-6, // saved statistics are f32
        DType::F16 => 1e-2,
        _ => 6e-2,
    }
}

struct Tally<'a> {
    cuda: &'a Dev,
    cpu: &'a Dev,
    failed: usize,
    passed: usize,
}

impl Tally<'_> {
    fn compare(&mut self, label: &str, op: &Op, ins: &[Spec], outs: &[Spec], scale: f64) {
        let (a, b) = match (run(self.cuda, op, ins, outs), run(self.cpu, op, ins, outs)) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                println!("FAIL {label}: cuda {:?} / cpu {:?}", a.err(), b.err());
                self.failed += 1;
                return;
            }
        };
        for (k, (x, y)) in a.iter().zip(&b).enumerate() {
            let t = tol(outs[k].dtype) * scale;
            let mut worst = (0.0f64, 0usize);
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                let e = if p.is_nan() && q.is_nan() { 0.0 } else { (p - q).abs() / (1.0 + q.abs()) };
                let e = if e.is_nan() { f64::INFINITY } else { e };
                if e > worst.0 {
                    worst = (e, i);
                }
            }
            if worst.0 > t {
                println!(
                    "FAIL {label} output {k}: rel err {:.3e} at {} (cuda {} cpu {})",
                    worst.0, worst.1, x[worst.1], y[worst.1]
                );
                self.failed += 1;
                return;
            }
        }
        self.passed += 1;
    }
}

fn checks<'a>(cuda: &'a Dev, cpu: &'a Dev) -> Tally<'a> {
    let mut t = Tally { cuda, cpu, failed: 0, passed: 0 };
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let floats = [DType::F32, DType::F64, DType::F16, DType::BF16];
    for &dt in &floats {
        // (shape, layout): dense, odd widths, multi-warp groups, big rows, unaligned, strided.
        let cases: Vec<(&str, Spec)> = vec![
            ("64x4096", Spec::dense(&mut rng, dt, &[64, 4096], -1.0, 3.0)),
            ("3x5x1000", Spec::dense(&mut rng, dt, &[3, 5, 1000], -1.0, 3.0)),
            ("33x770", Spec::dense(&mut rng, dt, &[33, 770], -1.0, 3.0)),
            ("5x20000 big", Spec::dense(&mut rng, dt, &[5, 20000], -1.0, 3.0)),
            ("9x4096 offset1", Spec::permuted(&mut rng, dt, &[9, 4096], 0, 0, 1)),
            ("3x300x96 permuted", Spec::permuted(&mut rng, dt, &[3, 300, 96], 0, 1, 0)),
            ("300x96 transposed", Spec::permuted(&mut rng, dt, &[300, 96], 0, 1, 0)),
            ("2049x64 rows", Spec::dense(&mut rng, dt, &[2049, 64], -1.0, 3.0)),
        ];
        for (name, x) in cases {
            let d = *x.shape.last().unwrap();
            let lead = &x.shape[..x.shape.len() - 1];
            let w = Spec::dense(&mut rng, dt, &[d], 0.5, 1.5);
            let b = Spec::dense(&mut rng, dt, &[d], -0.5, 0.5);
            let y = Spec::zeros(dt, &x.shape);
            let stat = Spec::zeros(DType::F32, lead);
            let op = Op::LayerNorm { eps: 1e-5 };
            let ins = [x.clone(), w.clone(), b.clone()];
            t.compare(&format!("layer_norm {dt} {name}"), &op, &ins, &[y.clone(), stat.clone(), stat.clone()], 1.0);
            let op = Op::RmsNorm { eps: 1e-5 };
            t.compare(&format!("rms_norm {dt} {name}"), &op, &[x.clone(), w.clone()], &[y.clone(), stat.clone()], 1.0);
            // Backward with the CPU's own statistics.
            let stats = run(cpu, &Op::LayerNorm { eps: 1e-5 }, &ins, &[y.clone(), stat.clone(), stat.clone()]).unwrap();
            let mk = |v: &Vec<f64>| Spec { data: v.clone(), ..stat.clone() };
            let (mean, rstd) = (mk(&stats[1]), mk(&stats[2]));
            let dy = Spec::dense(&mut rng, dt, &x.shape, -1.0, 1.0);
            let (dx, dw) = (Spec::zeros(dt, &x.shape), Spec::zeros(dt, &[d]));
            let rows: usize = lead.iter().product();
            let scale = (rows as f64).sqrt().max(4.0);
            t.compare(
                &format!("layer_norm_backward {dt} {name}"),
                &Op::LayerNormBackward,
                &[dy.clone(), x.clone(), w.clone(), mean, rstd.clone()],
                &[dx.clone(), dw.clone(), dw.clone()],
                scale,
            );
            let st = run(cpu, &Op::RmsNorm { eps: 1e-5 }, &[x.clone(), w.clone()], &[y.clone(), stat.clone()]).unwrap();
            let rstd = mk(&st[1]);
            let bins = [dy.clone(), x.clone(), w.clone(), rstd];
            t.compare(
                &format!("rms_norm_backward {dt} {name}"),
                &Op::RmsNormBackward,
                &bins,
                &[dx.clone(), dw.clone()],
                scale,
            );
            // Determinism of the weight gradient.
            let r1 = run(cuda, &Op::RmsNormBackward, &bins, &[dx.clone(), dw.clone()]);
            let r2 = run(cuda, &Op::RmsNormBackward, &bins, &[dx.clone(), dw.clone()]);
            match (r1, r2) {
                (Ok(a), Ok(b)) if a[1].iter().zip(&b[1]).all(|(p, q)| p.to_bits() == q.to_bits()) => t.passed += 1,
                _ => {
                    println!("FAIL rms_norm_backward {dt} {name}: dweight differs between runs");
                    t.failed += 1;
                }
            }
        }
        // Rotary: dense (vectorized), permuted heads/positions (strided), odd half.
        for (name, x) in [
            ("2x4x33x128", Spec::dense(&mut rng, dt, &[2, 4, 33, 128], -1.0, 1.0)),
            ("2x3x17x64 h<->s", Spec::permuted(&mut rng, dt, &[2, 3, 17, 64], 1, 2, 0)),
            ("1x2x9x6", Spec::dense(&mut rng, dt, &[1, 2, 9, 6], -1.0, 1.0)),
        ] {
            let (s, d) = (x.shape[2], x.shape[3]);
            let ang: Vec<f64> = (0..s * d / 2).map(|i| i as f64 * 0.013).collect();
            let mk =
                |f: fn(f64) -> f64| Spec { data: ang.iter().map(|&a| f(a)).collect(), ..Spec::zeros(dt, &[s, d / 2]) };
            let (c, sn) = (mk(f64::cos), mk(f64::sin));
            for inverse in [false, true] {
                let y = Spec::zeros(dt, &x.shape);
                let op = Op::Rotary { inverse };
                t.compare(
                    &format!("rotary {dt} {name} inv={inverse}"),
                    &op,
                    &[x.clone(), c.clone(), sn.clone()],
                    &[y],
                    1.0,
                );
            }
        }
        // AdamW: several sizes (chunk tails, multi-chunk, tiny), moments in the dtype and f32.
        for md in [dt, DType::F32] {
            let op = Op::AdamW { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, step: 3 };
            let (mut ins, mut outs) = (Vec::new(), Vec::new());
            for n in [1usize, 4097, 100_003, 3, 8192] {
                ins.push(Spec::dense(&mut rng, dt, &[n], -1.0, 1.0));
                outs.push(Spec::dense(&mut rng, dt, &[n], -1.0, 1.0));
                outs.push(Spec::dense(&mut rng, md, &[n], -0.1, 0.1));
                outs.push(Spec::dense(&mut rng, md, &[n], 0.0, 0.1));
            }
            // One strided group.
            ins.push(Spec::permuted(&mut rng, dt, &[30, 40], 0, 1, 0));
            outs.push(Spec::permuted(&mut rng, dt, &[30, 40], 0, 1, 0));
            outs.push(Spec { data: vec![0.01; 1200], ..Spec::zeros(md, &[30, 40]) });
            outs.push(Spec { data: vec![0.02; 1200], ..Spec::zeros(md, &[30, 40]) });
            t.compare(&format!("adamw {dt} moments {md}"), &op, &ins, &outs, 1.0);
        }
    }
    t
}

fn time(dev: &Dev, reps: usize, mut f: impl FnMut() -> R<()>) -> R<f64> {
    f()?;
    dev.sync()?;
    let mut samples = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..reps {
            f()?;
        }
        dev.sync()?;
        samples.push(t.elapsed().as_secs_f64() * 1e3 / reps as f64);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[3])
}

fn bench(dev: &Dev) -> R<()> {
    let mut rng = Rng(7);
    let mut tensor = |dtype: DType, shape: &[usize]| -> R<TensorDesc> {
        Ok(Spec::dense(&mut rng, dtype, shape, -1.0, 2.0).upload(dev)?.1)
    };
    let s = 4096;
    println!("| work | genesis ms | GB/s |");
    for dt in [DType::F32, DType::BF16] {
        let e = dt.size_in_bytes();
        let (x, y, dy, dx) = (tensor(dt, &[s, s])?, tensor(dt, &[s, s])?, tensor(dt, &[s, s])?, tensor(dt, &[s, s])?);
        let (w, b, dw, db) = (tensor(dt, &[s])?, tensor(dt, &[s])?, tensor(dt, &[s])?, tensor(dt, &[s])?);
        let (mean, rstd) = (tensor(DType::F32, &[s])?, tensor(DType::F32, &[s])?);
        let mb = (s * s * e) as f64 / 1e6;
        let ms = time(dev, 20, || dev.exec(&Op::LayerNorm { eps: 1e-5 }, &[x, w, b], &[y, mean, rstd]))?;
        println!("| layer_norm {s}x{s} {dt} | {ms:.4} | {:.0} |", 2.0 * mb / ms);
        let ms = time(dev, 20, || dev.exec(&Op::LayerNormBackward, &[dy, x, w, mean, rstd], &[dx, dw, db]))?;
        println!("| layer_norm_backward {s}x{s} {dt} | {ms:.4} | {:.0} |", 3.0 * mb / ms);
        let ms = time(dev, 20, || dev.exec(&Op::RmsNorm { eps: 1e-5 }, &[x, w], &[y, rstd]))?;
        println!("| rms_norm {s}x{s} {dt} | {ms:.4} | {:.0} |", 2.0 * mb / ms);
        let ms = time(dev, 20, || dev.exec(&Op::RmsNormBackward, &[dy, x, w, rstd], &[dx, dw]))?;
        println!("| rms_norm_backward {s}x{s} {dt} | {ms:.4} | {:.0} |", 3.0 * mb / ms);
        let (q, cs, sn) = (tensor(dt, &[8, 16, 1024, 128])?, tensor(dt, &[1024, 64])?, tensor(dt, &[1024, 64])?);
        let qo = tensor(dt, &[8, 16, 1024, 128])?;
        let ms = time(dev, 20, || dev.exec(&Op::Rotary { inverse: false }, &[q, cs, sn], &[qo]))?;
        println!("| rotary 8x16x1024x128 {dt} | {ms:.4} | {:.0} |", 2.0 * (8 * 16 * 1024 * 128 * e) as f64 / 1e6 / ms);
    }
    // AdamW over 200 tensors of 1 Mi f32 (g, p, m, v: 4 reads, 3 writes per element),
    // filled on the device (random host data would take longer than the run).
    let filled = |value: f64, n: usize| -> R<TensorDesc> {
        let d = TensorDesc::contiguous(dev.alloc(n * 4)?, 0, DType::F32, &[n])?;
        dev.exec(&Op::Fill { value }, &[], &[d])?;
        Ok(d)
    };
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for _ in 0..200 {
        ins.push(filled(0.1, 1 << 20)?);
        for v in [0.5, 0.01, 0.02] {
            outs.push(filled(v, 1 << 20)?);
        }
    }
    let op = Op::AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, step: 5 };
    let ms = time(dev, 5, || dev.exec(&op, &ins, &outs))?;
    println!("| adamw 200 x 1Mi f32 | {ms:.4} | {:.0} |", 7.0 * 200.0 * 4.0 * (1 << 20) as f64 / 1e6 / ms);
    let n = 64 << 20;
    let (a, c) = (filled(1.0, n)?, filled(2.0, n)?);
    let ms = time(dev, 20, || dev.exec(&Op::Copy, &[a], &[c]))?;
    println!("| copy 64Mi f32 (reference) | {ms:.4} | {:.0} |", 8.0 * n as f64 / 1e6 / ms);
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or_else(|| "libgenesis_backend_cuda.so".into());
    let module = load_plugin(&path).unwrap_or_else(|e| {
        eprintln!("cannot load {path}: {e}");
        std::process::exit(2)
    });
    let cuda = Dev { m: module };
    let cpu = Dev { m: genesis_backend_cpu::genesis_plugin_module() };
    let t = Instant::now();
    let tally = checks(&cuda, &cpu);
    println!("fused checks: {} passed, {} failed ({:.1} s)", tally.passed, tally.failed, t.elapsed().as_secs_f64());
    if args.iter().any(|a| a == "--bench") {
        if let Err(e) = bench(&cuda) {
            println!("bench failed: {e}");
        }
    }
    std::process::exit(if tally.failed == 0 { 0 } else { 1 });
}
