//! The GPU benchmark: the work of PERFORMANCE.md on the CUDA plugin, driven through the wire
//! interface as the core drives it. Every row is first checked against a float64 host
//! reference on a slice of its output (random inputs, never zeros), then timed. An op the
//! plugin does not claim is reported as "not claimed", not as a failure.
//!
//! `cuda_bench <plugin.so> [--json FILE] [--filter SUBSTR] [--cpu]`
//!
//! `scripts/torch_bench.py --genesis FILE` runs the same work in PyTorch on the same GPU and
//! prints the combined table (work names are the join key: keep them in step).
//!
//! Timing: the interface has no device events, so the host clock brackets N back-to-back
//! launches and one synchronize (N chosen so a round lasts about 20 ms, which makes the launch
//! latency of the first op and the synchronize negligible); the median of 7 rounds is kept.
//! Working sets under 100 MiB are rotated between several copies so the L2 cache (50-60 MB
//! on H100/H200) does not serve the inputs.
//!
//! With two or more GPUs, all-reduce rows time the plugin's NCCL collective over all of them
//! (host clock around 10 calls and a synchronize of every device; `torch_bench.py` times
//! `torch.cuda.nccl.all_reduce` the same way).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use common::{encode, load_plugin, values, Dev, Rng, R};
use genesis_backend_api::{
    BackendError, BinaryOp, BufferId, CollectiveArg, CollectiveOp, DType, Op, OpKind, ReduceOp, TensorDesc,
};
use std::collections::HashSet;
use std::time::Instant;

const ROUNDS: usize = 7;
const ROUND_MS: f64 = 20.0;
const ROTATE_BELOW: usize = 100 << 20;
const ROTATE_TOTAL: usize = 256 << 20;
const S: usize = 4096;
/// Elements per device of the all-reduce rows (256 MiB of f32: a mid-sized model's gradients).
const ALL_REDUCE_ELEMS: usize = 64 << 20;
const ALL_REDUCE_REPS: usize = 10;

struct Row {
    work: String,
    ms: Option<f64>,
    unit: &'static str,
    status: &'static str,
    detail: String,
}

/// The outcome of the host check: `Ok(how close)` or `Err(first mismatch)`.
type Check = Result<String, String>;

struct Cx {
    dev: Dev,
    caps: HashSet<(OpKind, DType)>,
    rng: Rng,
    owned: Vec<BufferId>,
    rows: Vec<Row>,
    filter: Option<String>,
}

impl Cx {
    fn claims(&self, op: &Op, dtype: DType) -> bool {
        self.caps.contains(&(op.kind(), dtype))
    }

    /// How many copies of a working set of `bytes` to rotate between.
    fn sets(bytes: usize) -> usize {
        if bytes >= ROTATE_BELOW {
            1
        } else {
            ROTATE_TOTAL.div_ceil(bytes.max(1)).clamp(2, 8)
        }
    }

    fn empty(&mut self, dtype: DType, shape: &[usize]) -> R<TensorDesc> {
        let n: usize = shape.iter().product();
        let b = self.dev.alloc((n * dtype.size_in_bytes()).max(1))?;
        self.owned.push(b);
        TensorDesc::contiguous(b, 0, dtype, shape)
    }

    /// A tensor of values uniform in `[low, high)`: drawn on the device when the plugin claims
    /// `rand_uniform` (gigabytes of AdamW state would take seconds from the host), else
    /// written from the host.
    fn tensor(&mut self, dtype: DType, shape: &[usize], low: f64, high: f64) -> R<TensorDesc> {
        let t = self.empty(dtype, shape)?;
        let op = Op::RandUniform { seed: self.rng.next(), offset: 0, low, high };
        if self.claims(&op, dtype) {
            self.dev.exec(&op, &[], &[t])?;
        } else {
            let n = t.numel();
            let chunk = 1 << 22;
            let mut at = 0;
            while at < n {
                let m = chunk.min(n - at);
                let xs: Vec<f64> = (0..m).map(|_| low + (high - low) * self.rng.unit()).collect();
                self.dev.write_at(t.buffer, at * dtype.size_in_bytes(), &encode(dtype, &xs))?;
                at += m;
            }
        }
        Ok(t)
    }

    fn host(&mut self, dtype: DType, shape: &[usize], xs: &[f64]) -> R<TensorDesc> {
        let t = self.empty(dtype, shape)?;
        self.dev.write(t.buffer, &encode(dtype, xs))?;
        Ok(t)
    }

    /// `n` elements of a dense tensor from element `start`, as f64.
    fn vals(&self, t: &TensorDesc, start: usize, n: usize) -> R<Vec<f64>> {
        let dtype = t.dtype()?;
        let s = dtype.size_in_bytes();
        Ok(values(dtype, &self.dev.read_at(t.buffer, t.offset_bytes as usize + start * s, n * s)?))
    }

    fn all(&self, t: &TensorDesc) -> R<Vec<f64>> {
        self.vals(t, 0, t.numel())
    }

    /// Run one row: skip it when filtered out, report it "not claimed" when the plugin lacks
    /// an op of `needs`, else check and time it with `f`, and free what it allocated.
    fn row(
        &mut self,
        work: &str,
        unit: &'static str,
        needs: &[(Op, DType)],
        f: impl FnOnce(&mut Cx) -> R<(f64, Check)>,
    ) {
        if let Some(pat) = &self.filter {
            if !work.to_lowercase().contains(&pat.to_lowercase()) {
                return;
            }
        }
        let missing: Vec<String> =
            needs.iter().filter(|(op, d)| !self.claims(op, *d)).map(|(op, d)| format!("{} {d}", op.name())).collect();
        let row = if !missing.is_empty() {
            Row { work: work.into(), ms: None, unit, status: "not claimed", detail: missing.join(", ") }
        } else {
            let t = Instant::now();
            let r = f(self);
            let secs = t.elapsed().as_secs_f64();
            match r {
                Ok((ms, Ok(d))) => Row { work: work.into(), ms: Some(ms), unit, status: "ok", detail: d },
                Ok((ms, Err(d))) => Row { work: work.into(), ms: Some(ms), unit, status: "wrong", detail: d },
                Err(e) => Row { work: work.into(), ms: None, unit, status: "error", detail: e.to_string() },
            }
            .with_secs(secs)
        };
        let _ = self.dev.sync();
        for b in std::mem::take(&mut self.owned) {
            let _ = self.dev.free(b);
        }
        let _ = self.dev.empty_cache();
        let ms = row.ms.map_or("-".to_string(), |m| format!("{m:.4}"));
        println!("| {} | {ms} {} | {} | {} |", row.work, row.unit, row.status, row.detail);
        self.rows.push(row);
    }
}

impl Row {
    fn with_secs(mut self, secs: f64) -> Row {
        self.detail = format!("{}; row took {secs:.1} s", self.detail);
        self
    }
}

/// The dtype as the work names spell it (PyTorch-style short names; the join key with
/// torch_bench.py).
fn short(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F64 => "f64",
        _ => "other",
    }
}

/// Median milliseconds per call of `f(i)`, `i` cycling over `sets` working sets.
fn time_ops(dev: &Dev, sets: usize, mut f: impl FnMut(usize) -> R<()>) -> R<f64> {
    // Warm-up: first launches compile or load kernels and fill the allocator's cache.
    for i in 0..sets {
        f(i)?;
    }
    dev.sync()?;
    let t = Instant::now();
    for i in 0..sets {
        f(i)?;
    }
    dev.sync()?;
    let estimate = t.elapsed().as_secs_f64() * 1e3 / sets as f64;
    let reps = ((ROUND_MS / estimate.max(1e-4)).ceil() as usize).clamp(sets.max(3), 5000);
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for r in 0..reps {
            f(r % sets)?;
        }
        dev.sync()?;
        samples.push(t.elapsed().as_secs_f64() * 1e3 / reps as f64);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[ROUNDS / 2])
}

/// Relative tolerance against a magnitude scale: f32 results get `f32_rtol`, half types
/// their rounding plus f32 accumulation.
fn rtol(dtype: DType, f32_rtol: f64) -> f64 {
    match dtype {
        DType::BF16 => f32_rtol.max(1e-2),
        DType::F16 => f32_rtol.max(2e-3),
        _ => f32_rtol,
    }
}

/// Collects comparisons with the float64 reference. Each element must satisfy
/// `|got - want| <= rtol * scale`, where `scale` bounds the magnitudes the result is built
/// from, so cancellation is not blamed on rounding.
#[derive(Default)]
struct Verdict {
    worst: f64,
    compared: usize,
    fail: Option<String>,
}

impl Verdict {
    fn add(&mut self, what: &str, got: &[f64], want: &[f64], scale: &[f64], rtol: f64) {
        if got.len() != want.len() {
            self.fail.get_or_insert(format!("{what}: {} values, reference has {}", got.len(), want.len()));
            return;
        }
        for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
            let allowed = rtol * s.abs() + 1e-12;
            let used = (g - w).abs() / allowed;
            // NaN fails too.
            if used.is_nan() || used > 1.0 {
                self.fail.get_or_insert(format!("{what}[{i}]: got {g:e}, reference {w:e} (allowed {allowed:.1e})"));
            }
            if used.is_finite() {
                self.worst = self.worst.max(used);
            }
        }
        self.compared += got.len();
    }
    fn done(self) -> Check {
        match self.fail {
            Some(f) => Err(format!("WRONG {f}")),
            None => Ok(format!("checked {} values, worst {:.2} of tolerance", self.compared, self.worst)),
        }
    }
}

fn abs(xs: &[f64]) -> Vec<f64> {
    xs.iter().map(|x| x.abs()).collect()
}

fn add(cx: &mut Cx, dtype: DType, broadcast: bool) -> R<(f64, Check)> {
    let n = S * S;
    let sets = Cx::sets(if broadcast { 2 } else { 3 } * n * dtype.size_in_bytes());
    let mut v = Vec::new();
    for _ in 0..sets {
        let a = cx.tensor(dtype, &[S, S], -2.0, 2.0)?;
        let b = if broadcast {
            let row = cx.tensor(dtype, &[S], -2.0, 2.0)?;
            TensorDesc::new(row.buffer, 0, dtype, &[S, S], &[0, 1])?
        } else {
            cx.tensor(dtype, &[S, S], -2.0, 2.0)?
        };
        v.push([a, b, cx.empty(dtype, &[S, S])?]);
    }
    let op = Op::Binary(BinaryOp::Add);
    let [a, b, y] = v[0];
    cx.dev.exec(&op, &[a, b], &[y])?;
    let mut ck = Verdict::default();
    for r in [0, S / 2 + 1, S - 1] {
        let av = cx.vals(&a, r * S, S)?;
        let bv = cx.vals(&b, if broadcast { 0 } else { r * S }, S)?;
        let want: Vec<f64> = av.iter().zip(&bv).map(|(x, z)| x + z).collect();
        ck.add("y", &cx.vals(&y, r * S, S)?, &want, &abs(&want), rtol(dtype, 1e-6));
    }
    let ms = time_ops(&cx.dev, sets, |i| cx.dev.exec(&op, &v[i][..2], &v[i][2..]))?;
    Ok((ms, ck.done()))
}

fn copy(cx: &mut Cx, transpose: bool) -> R<(f64, Check)> {
    let dtype = DType::F32;
    let sets = Cx::sets(2 * S * S * 4);
    let mut v = Vec::new();
    for _ in 0..sets {
        let a = cx.tensor(dtype, &[S, S], -2.0, 2.0)?;
        let x = if transpose { TensorDesc::new(a.buffer, 0, dtype, &[S, S], &[1, S as isize])? } else { a };
        v.push([x, cx.empty(dtype, &[S, S])?]);
    }
    let [x, y] = v[0];
    cx.dev.exec(&Op::Copy, &[x], &[y])?;
    let a = cx.all(&TensorDesc::contiguous(x.buffer, 0, dtype, &[S, S])?)?;
    let mut ck = Verdict::default();
    for r in [0, 1, S / 3, S - 1] {
        let want: Vec<f64> = (0..S).map(|c| if transpose { a[c * S + r] } else { a[r * S + c] }).collect();
        ck.add("y", &cx.vals(&y, r * S, S)?, &want, &abs(&want), 0.0);
    }
    let ms = time_ops(&cx.dev, sets, |i| cx.dev.exec(&Op::Copy, &v[i][..1], &v[i][1..]))?;
    Ok((ms, ck.done()))
}

fn sum(cx: &mut Cx, dtype: DType, over_rows: bool) -> R<(f64, Check)> {
    let sets = Cx::sets(S * S * dtype.size_in_bytes());
    let out_shape = if over_rows { [S, 1] } else { [1, S] };
    let mut v = Vec::new();
    for _ in 0..sets {
        v.push([cx.tensor(dtype, &[S, S], -2.0, 2.0)?, cx.empty(dtype, &out_shape)?]);
    }
    let op = Op::Reduce(ReduceOp::Sum);
    let [a, y] = v[0];
    cx.dev.exec(&op, &[a], &[y])?;
    let av = cx.all(&a)?;
    let (mut want, mut scale) = (vec![0.0; S], vec![0.0; S]);
    for r in 0..S {
        for c in 0..S {
            let (k, x) = (if over_rows { r } else { c }, av[r * S + c]);
            want[k] += x;
            scale[k] += x.abs();
        }
    }
    let mut ck = Verdict::default();
    ck.add("sum", &cx.all(&y)?, &want, &scale, rtol(dtype, 1e-5));
    let ms = time_ops(&cx.dev, sets, |i| cx.dev.exec(&op, &v[i][..1], &v[i][1..]))?;
    Ok((ms, ck.done()))
}

fn matmul(cx: &mut Cx, dtype: DType, tf32: bool) -> R<(f64, Check)> {
    let sets = Cx::sets(3 * S * S * dtype.size_in_bytes());
    let mut v = Vec::new();
    for _ in 0..sets {
        let (a, b) = (cx.tensor(dtype, &[S, S], -1.0, 1.0)?, cx.tensor(dtype, &[S, S], -1.0, 1.0)?);
        v.push([a, b, cx.empty(dtype, &[S, S])?]);
    }
    // The plugin reads this opt-in at each f32 matmul; edition 2021, and the plugin reads the
    // environment only on this thread, inside our calls.
    if tf32 {
        std::env::set_var("GENESIS_CUDA_ALLOW_TF32", "1");
    }
    let result: R<(f64, Check)> = (|| {
        let [a, b, y] = v[0];
        cx.dev.exec(&Op::Matmul, &[a, b], &[y])?;
        let bv = cx.all(&b)?;
        let mut ck = Verdict::default();
        for i in [0, 1777, S - 1] {
            let ar = cx.vals(&a, i * S, S)?;
            let (mut want, mut scale) = (vec![0.0; S], vec![0.0; S]);
            for (k, &x) in ar.iter().enumerate() {
                for j in 0..S {
                    want[j] += x * bv[k * S + j];
                    scale[j] += (x * bv[k * S + j]).abs();
                }
            }
            let tol = if tf32 { 3e-3 } else { rtol(dtype, 1e-5) };
            ck.add(&format!("y row {i}"), &cx.vals(&y, i * S, S)?, &want, &scale, tol);
        }
        let ms = time_ops(&cx.dev, sets, |i| cx.dev.exec(&Op::Matmul, &v[i][..2], &v[i][2..]))?;
        Ok((ms, ck.done()))
    })();
    if tf32 {
        std::env::remove_var("GENESIS_CUDA_ALLOW_TF32");
    }
    result
}

fn softmax(cx: &mut Cx, dtype: DType) -> R<(f64, Check)> {
    let (rows, c) = (8192, 8192);
    let sets = Cx::sets(2 * rows * c * dtype.size_in_bytes());
    let mut v = Vec::new();
    for _ in 0..sets {
        v.push([cx.tensor(dtype, &[rows, c], -4.0, 4.0)?, cx.empty(dtype, &[rows, c])?]);
    }
    let [x, y] = v[0];
    cx.dev.exec(&Op::Softmax, &[x], &[y])?;
    let mut ck = Verdict::default();
    for r in [0, rows / 2 + 3, rows - 1] {
        let xr = cx.vals(&x, r * c, c)?;
        let m = xr.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = xr.iter().map(|x| (x - m).exp()).collect();
        let total: f64 = e.iter().sum();
        let want: Vec<f64> = e.iter().map(|x| x / total).collect();
        ck.add(&format!("row {r}"), &cx.vals(&y, r * c, c)?, &want, &want, rtol(dtype, 1e-5));
    }
    let ms = time_ops(&cx.dev, sets, |i| cx.dev.exec(&Op::Softmax, &v[i][..1], &v[i][1..]))?;
    Ok((ms, ck.done()))
}

/// Softmax backward over 8192x8192: dx = y * (dy - sum(y * dy)) per row, y a softmax output.
fn softmax_backward(cx: &mut Cx, dtype: DType) -> R<(f64, Check)> {
    let (rows, c) = (8192, 8192);
    let sets = Cx::sets(3 * rows * c * dtype.size_in_bytes());
    let mut v = Vec::new();
    for _ in 0..sets {
        // y in [0, 2/c]: the scale of a softmax row, without the forward's cost.
        let y = cx.tensor(dtype, &[rows, c], 0.0, 2.0 / c as f64)?;
        v.push([y, cx.tensor(dtype, &[rows, c], -1.0, 1.0)?, cx.empty(dtype, &[rows, c])?]);
    }
    let [y, dy, dx] = v[0];
    cx.dev.exec(&Op::SoftmaxBackward, &[y, dy], &[dx])?;
    let mut ck = Verdict::default();
    for r in [0, rows / 2 + 3, rows - 1] {
        let (yr, gr) = (cx.vals(&y, r * c, c)?, cx.vals(&dy, r * c, c)?);
        let s: f64 = yr.iter().zip(&gr).map(|(a, b)| a * b).sum();
        let want: Vec<f64> = yr.iter().zip(&gr).map(|(a, b)| a * (b - s)).collect();
        let scale: Vec<f64> = yr.iter().zip(&gr).map(|(a, b)| a * (b.abs() + s.abs())).collect();
        ck.add(&format!("dx row {r}"), &cx.vals(&dx, r * c, c)?, &want, &scale, rtol(dtype, 1e-5));
    }
    let ms = time_ops(&cx.dev, sets, |i| cx.dev.exec(&Op::SoftmaxBackward, &v[i][..2], &v[i][2..]))?;
    Ok((ms, ck.done()))
}

/// Per-row statistics in f64: (mean, rstd) for layer norm, (0, rstd) for RMS norm.
fn row_stats(x: &[f64], rms: bool, eps: f64) -> (f64, f64) {
    let d = x.len() as f64;
    if rms {
        (0.0, 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / d + eps).sqrt())
    } else {
        let mean = x.iter().sum::<f64>() / d;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d;
        (mean, 1.0 / (var + eps).sqrt())
    }
}

/// Layer norm (`rms` false) or RMS norm over 4096x4096, forward or backward (timed alone,
/// its saved statistics made by one forward per working set).
fn norm(cx: &mut Cx, dtype: DType, rms: bool, backward: bool) -> R<(f64, Check)> {
    let eps = 1e-5;
    let n = S * S;
    let fwd = if rms { Op::RmsNorm { eps } } else { Op::LayerNorm { eps } };
    let bwd = if rms { Op::RmsNormBackward } else { Op::LayerNormBackward };
    let sets = Cx::sets(if backward { 3 } else { 2 } * n * dtype.size_in_bytes());
    // Forward: inputs, outputs; backward: inputs, outputs of the backward op.
    let mut v: Vec<(Vec<TensorDesc>, Vec<TensorDesc>)> = Vec::new();
    for _ in 0..sets {
        let x = cx.tensor(dtype, &[S, S], -2.0, 2.0)?;
        let w = cx.tensor(dtype, &[S], 0.5, 1.5)?;
        let b = cx.tensor(dtype, &[S], -0.5, 0.5)?;
        let y = cx.empty(dtype, &[S, S])?;
        let rstd = cx.empty(DType::F32, &[S])?;
        let (fi, fo) = if rms {
            (vec![x, w], vec![y, rstd])
        } else {
            let mean = cx.empty(DType::F32, &[S])?;
            (vec![x, w, b], vec![y, mean, rstd])
        };
        cx.dev.exec(&fwd, &fi, &fo)?;
        if backward {
            let dy = cx.tensor(dtype, &[S, S], -1.0, 1.0)?;
            let dx = cx.empty(dtype, &[S, S])?;
            let dw = cx.empty(dtype, &[S])?;
            if rms {
                v.push((vec![dy, x, w, rstd], vec![dx, dw]));
            } else {
                let db = cx.empty(dtype, &[S])?;
                v.push((vec![dy, x, w, fo[1], rstd], vec![dx, dw, db]));
            }
        } else {
            v.push((fi, fo));
        }
    }
    let tol = rtol(dtype, 1e-5);
    let mut ck = Verdict::default();
    if !backward {
        let (fi, fo) = &v[0];
        let wv = cx.all(&fi[1])?;
        let bv = if rms { vec![0.0; S] } else { cx.all(&fi[2])? };
        let rstd_dev = cx.all(fo.last().unwrap())?;
        let mean_dev = if rms { vec![0.0; S] } else { cx.all(&fo[1])? };
        for r in [0, S / 2 + 1, S - 1] {
            let xr = cx.vals(&fi[0], r * S, S)?;
            let (mean, rstd) = row_stats(&xr, rms, eps);
            let xhat: Vec<f64> = xr.iter().map(|x| (x - mean) * rstd).collect();
            let want: Vec<f64> = (0..S).map(|j| xhat[j] * wv[j] + bv[j]).collect();
            // The last term covers the f32 mean's absolute error, which does not shrink with xhat.
            let scale: Vec<f64> = (0..S).map(|j| (xhat[j] * wv[j]).abs() + bv[j].abs() + 1e-2 * wv[j].abs()).collect();
            ck.add(&format!("y row {r}"), &cx.vals(&fo[0], r * S, S)?, &want, &scale, tol);
            ck.add("rstd", &[rstd_dev[r]], &[rstd], &[rstd], 1e-5);
            if !rms {
                let mean_abs = xr.iter().map(|x| x.abs()).sum::<f64>() / S as f64;
                ck.add("mean", &[mean_dev[r]], &[mean], &[mean_abs], 1e-5);
            }
        }
        let ms = time_ops(&cx.dev, sets, |i| cx.dev.exec(&fwd, &v[i].0, &v[i].1))?;
        return Ok((ms, ck.done()));
    }
    let (bi, bo) = v[0].clone();
    cx.dev.exec(&bwd, &bi, &bo)?;
    let (dy, x, wv) = (cx.all(&bi[0])?, cx.all(&bi[1])?, cx.all(&bi[2])?);
    let (mut dw, mut dw_scale, mut db, mut db_scale) = (vec![0.0; S], vec![0.0; S], vec![0.0; S], vec![0.0; S]);
    let check_rows = [0, S / 2 + 1, S - 1];
    for r in 0..S {
        let (xr, dyr) = (&x[r * S..(r + 1) * S], &dy[r * S..(r + 1) * S]);
        let (mean, rstd) = row_stats(xr, rms, eps);
        let xhat: Vec<f64> = xr.iter().map(|x| (x - mean) * rstd).collect();
        for j in 0..S {
            dw[j] += dyr[j] * xhat[j];
            dw_scale[j] += (dyr[j] * xhat[j]).abs();
            db[j] += dyr[j];
            db_scale[j] += dyr[j].abs();
        }
        if check_rows.contains(&r) {
            let g: Vec<f64> = (0..S).map(|j| dyr[j] * wv[j]).collect();
            let d = S as f64;
            let mg = if rms { 0.0 } else { g.iter().sum::<f64>() / d };
            let mgx = (0..S).map(|j| g[j] * xhat[j]).sum::<f64>() / d;
            let mg_abs = if rms { 0.0 } else { g.iter().map(|v| v.abs()).sum::<f64>() / d };
            let mgx_abs = (0..S).map(|j| (g[j] * xhat[j]).abs()).sum::<f64>() / d;
            // Layer norm: rstd (g - mean g - xhat mean(g xhat)); RMS norm: the same without
            // the mean terms, xhat being x rstd.
            let want: Vec<f64> = (0..S).map(|j| rstd * (g[j] - mg - xhat[j] * mgx)).collect();
            let scale: Vec<f64> = (0..S).map(|j| rstd * (g[j].abs() + mg_abs + xhat[j].abs() * mgx_abs)).collect();
            ck.add(&format!("dx row {r}"), &cx.vals(&bo[0], r * S, S)?, &want, &scale, tol);
        }
    }
    ck.add("dweight", &cx.all(&bo[1])?, &dw, &dw_scale, tol);
    if !rms {
        ck.add("dbias", &cx.all(&bo[2])?, &db, &db_scale, tol);
    }
    let ms = time_ops(&cx.dev, sets, |i| cx.dev.exec(&bwd, &v[i].0, &v[i].1))?;
    Ok((ms, ck.done()))
}

const ATT: [usize; 4] = [8, 16, 1024, 64];

/// Float64 causal attention of one head: (o, lse), and with `dout` the gradients
/// (dq, dk, dv) and their scales.
struct HeadRef {
    o: Vec<f64>,
    o_scale: Vec<f64>,
    lse: Vec<f64>,
    grads: Option<[(Vec<f64>, Vec<f64>); 3]>,
}

fn attention_head(q: &[f64], k: &[f64], v: &[f64], dout: Option<&[f64]>, scale: f64) -> HeadRef {
    let (s, d) = (ATT[2], ATT[3]);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let mut p = vec![0.0; s * s];
    let (mut o, mut o_scale, mut lse) = (vec![0.0; s * d], vec![0.0; s * d], vec![0.0; s]);
    for i in 0..s {
        let qi = &q[i * d..(i + 1) * d];
        let sc: Vec<f64> = (0..=i).map(|j| scale * dot(qi, &k[j * d..(j + 1) * d])).collect();
        let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = sc.iter().map(|x| (x - m).exp()).sum();
        lse[i] = m + l.ln();
        for j in 0..=i {
            let pij = (sc[j] - lse[i]).exp();
            p[i * s + j] = pij;
            for t in 0..d {
                o[i * d + t] += pij * v[j * d + t];
                o_scale[i * d + t] += pij * v[j * d + t].abs();
            }
        }
    }
    let grads = dout.map(|dout| {
        let mut g: [(Vec<f64>, Vec<f64>); 3] = std::array::from_fn(|_| (vec![0.0; s * d], vec![0.0; s * d]));
        for i in 0..s {
            let doi = &dout[i * d..(i + 1) * d];
            let delta = dot(doi, &o[i * d..(i + 1) * d]);
            // The kernel forms delta from its bf16 o: its error scales with sum |do o|, not |delta|.
            let delta_abs: f64 = (0..d).map(|t| (doi[t] * o[i * d + t]).abs()).sum();
            for j in 0..=i {
                let pij = p[i * s + j];
                let dp = dot(doi, &v[j * d..(j + 1) * d]);
                let ds = pij * (dp - delta);
                let ds_abs = pij * (dp.abs() + delta_abs);
                for t in 0..d {
                    g[0].0[i * d + t] += scale * ds * k[j * d + t];
                    g[0].1[i * d + t] += scale * ds_abs * k[j * d + t].abs();
                    g[1].0[j * d + t] += scale * ds * q[i * d + t];
                    g[1].1[j * d + t] += scale * ds_abs * q[i * d + t].abs();
                    g[2].0[j * d + t] += pij * doi[t];
                    g[2].1[j * d + t] += pij * doi[t].abs();
                }
            }
        }
        g
    });
    HeadRef { o, o_scale, lse, grads }
}

fn attention(cx: &mut Cx, backward: bool) -> R<(f64, Check)> {
    let dtype = DType::BF16;
    let [b, h, s, d] = ATT;
    let scale = 1.0 / (d as f64).sqrt();
    let fwd = Op::Attention { causal: true, scale };
    let bwd = Op::AttentionBackward { causal: true, scale };
    let n = b * h * s * d;
    let sets = Cx::sets(if backward { 8 } else { 4 } * n * 2);
    // [q, k, v, o, lse, do, dq, dk, dv]
    let mut v: Vec<Vec<TensorDesc>> = Vec::new();
    for _ in 0..sets {
        let mut t = Vec::new();
        for _ in 0..3 {
            t.push(cx.tensor(dtype, &ATT, -2.0, 2.0)?);
        }
        t.push(cx.empty(dtype, &ATT)?);
        t.push(cx.empty(DType::F32, &[b, h, s])?);
        if backward {
            t.push(cx.tensor(dtype, &ATT, -1.0, 1.0)?);
            for _ in 0..3 {
                t.push(cx.empty(dtype, &ATT)?);
            }
        }
        v.push(t);
    }
    let run = |t: &[TensorDesc]| -> R<()> {
        cx.dev.exec(&fwd, &t[..3], &t[3..5])?;
        if backward {
            cx.dev.exec(&bwd, &t[..6], &t[6..9])?;
        }
        Ok(())
    };
    run(&v[0])?;
    let t = &v[0];
    let mut ck = Verdict::default();
    let hd = s * d;
    for bh in [0, b * h - 1] {
        let [q, k, vv] = [0, 1, 2].map(|i| cx.vals(&t[i], bh * hd, hd));
        let dout = if backward { Some(cx.vals(&t[5], bh * hd, hd)?) } else { None };
        let r = attention_head(&q?, &k?, &vv?, dout.as_deref(), scale);
        ck.add(&format!("o head {bh}"), &cx.vals(&t[3], bh * hd, hd)?, &r.o, &r.o_scale, 2e-2);
        ck.add(
            &format!("lse head {bh}"),
            &cx.vals(&t[4], bh * s, s)?,
            &r.lse,
            &r.lse.iter().map(|x| x.abs() + 1.0).collect::<Vec<_>>(),
            1e-4,
        );
        if let Some(g) = &r.grads {
            for (j, name) in ["dq", "dk", "dv"].iter().enumerate() {
                ck.add(&format!("{name} head {bh}"), &cx.vals(&t[6 + j], bh * hd, hd)?, &g[j].0, &g[j].1, 2e-2);
            }
        }
    }
    let ms = time_ops(&cx.dev, sets, |i| run(&v[i]))?;
    Ok((ms, ck.done()))
}

fn cross_entropy(cx: &mut Cx, dtype: DType, backward: bool) -> R<(f64, Check)> {
    let (n, c) = (8192, 32000);
    let (ignore_index, label_smoothing) = (-100, 0.0);
    let fwd = Op::CrossEntropy { ignore_index, label_smoothing };
    let bwd = Op::CrossEntropyBackward { ignore_index, label_smoothing };
    let sets = Cx::sets(if backward { 2 } else { 1 } * n * c * dtype.size_in_bytes());
    // [logits, target, loss, lse, dloss, dlogits]
    let mut v: Vec<Vec<TensorDesc>> = Vec::new();
    for _ in 0..sets {
        let logits = cx.tensor(dtype, &[n, c], -4.0, 4.0)?;
        let targets: Vec<f64> = (0..n).map(|_| (cx.rng.next() % c as u64) as f64).collect();
        let target = cx.host(DType::I64, &[n], &targets)?;
        let (loss, lse) = (cx.empty(DType::F32, &[n])?, cx.empty(DType::F32, &[n])?);
        let mut t = vec![logits, target, loss, lse];
        if backward {
            // The gradient of the mean loss, as PyTorch's default reduction gives.
            t.push(cx.host(DType::F32, &[n], &vec![1.0 / n as f64; n])?);
            t.push(cx.empty(dtype, &[n, c])?);
        }
        v.push(t);
    }
    let run = |t: &[TensorDesc]| -> R<()> {
        cx.dev.exec(&fwd, &t[..2], &t[2..4])?;
        if backward {
            cx.dev.exec(&bwd, &[t[0], t[1], t[3], t[4]], &t[5..6])?;
        }
        Ok(())
    };
    run(&v[0])?;
    let t = &v[0];
    let (target, loss, lse) = (cx.all(&t[1])?, cx.all(&t[2])?, cx.all(&t[3])?);
    let mut ck = Verdict::default();
    for r in [0, n / 2 + 3, n - 1] {
        let x = cx.vals(&t[0], r * c, c)?;
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let want_lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        let tgt = target[r] as usize;
        ck.add("lse", &[lse[r]], &[want_lse], &[want_lse.abs() + 1.0], 2e-5);
        ck.add("loss", &[loss[r]], &[want_lse - x[tgt]], &[want_lse.abs() + x[tgt].abs()], 2e-5);
        if backward {
            let dl = 1.0 / n as f64;
            let p: Vec<f64> = x.iter().map(|v| (v - want_lse).exp()).collect();
            let want: Vec<f64> = (0..c).map(|j| dl * (p[j] - if j == tgt { 1.0 } else { 0.0 })).collect();
            let scale: Vec<f64> = (0..c).map(|j| dl * (p[j] + if j == tgt { 1.0 } else { 0.0 })).collect();
            ck.add(&format!("dlogits row {r}"), &cx.vals(&t[5], r * c, c)?, &want, &scale, rtol(dtype, 3e-5));
        }
    }
    let ms = time_ops(&cx.dev, sets, |i| run(&v[i]))?;
    Ok((ms, ck.done()))
}

/// Sizes of the AdamW tensors: 24 of 16.8 M and 25.2 M elements, 503 M in all.
fn adamw_sizes() -> Vec<usize> {
    (0..24).map(|i| if i % 2 == 0 { 4096 * 6144 } else { 4096 * 4096 }).collect()
}

const ADAMW: (f64, f64, f64, f64, f64) = (1e-3, 0.9, 0.999, 1e-8, 1e-2);

fn adamw(cx: &mut Cx) -> R<(f64, Check)> {
    let dtype = DType::F32;
    let (lr, beta1, beta2, eps, weight_decay) = ADAMW;
    let op = |step| Op::AdamW { lr, beta1, beta2, eps, weight_decay, step };
    let (mut grads, mut state) = (Vec::new(), Vec::new());
    for &len in &adamw_sizes() {
        grads.push(cx.tensor(dtype, &[len], -1.0, 1.0)?);
        state.push(cx.tensor(dtype, &[len], -1.0, 1.0)?);
        state.push(cx.tensor(dtype, &[len], -0.1, 0.1)?);
        state.push(cx.tensor(dtype, &[len], 0.0, 0.01)?);
    }
    // Slices checked: the head of the first tensor and the tail of the last (a partial chunk).
    let last = grads.len() - 1;
    let len_last = grads[last].numel();
    let probes = [(0, 0), (last, len_last - 4096)];
    let mut before = Vec::new();
    for &(t, at) in &probes {
        let g = cx.vals(&grads[t], at, 4096)?;
        let [p, m, v] = [0, 1, 2].map(|k| cx.vals(&state[3 * t + k], at, 4096));
        before.push((g, p?, m?, v?));
    }
    cx.dev.exec(&op(1), &grads, &state)?;
    let mut ck = Verdict::default();
    let (bc1, bc2) = (1.0 - beta1, 1.0 - beta2);
    for (&(t, at), (g, p, m, v)) in probes.iter().zip(&before) {
        let (mut wp, mut sp, mut wm, mut sm, mut wv, mut sv) = (vec![], vec![], vec![], vec![], vec![], vec![]);
        for i in 0..4096 {
            let m1 = beta1 * m[i] + (1.0 - beta1) * g[i];
            let v1 = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
            let decayed = p[i] * (1.0 - lr * weight_decay);
            let update = lr / bc1 * m1 / (v1.sqrt() / bc2.sqrt() + eps);
            wp.push(decayed - update);
            sp.push(decayed.abs() + update.abs());
            wm.push(m1);
            sm.push((beta1 * m[i]).abs() + ((1.0 - beta1) * g[i]).abs());
            wv.push(v1);
            sv.push(v1);
        }
        ck.add(&format!("param {t}"), &cx.vals(&state[3 * t], at, 4096)?, &wp, &sp, 1e-5);
        ck.add(&format!("exp_avg {t}"), &cx.vals(&state[3 * t + 1], at, 4096)?, &wm, &sm, 1e-5);
        ck.add(&format!("exp_avg_sq {t}"), &cx.vals(&state[3 * t + 2], at, 4096)?, &wv, &sv, 1e-5);
    }
    let mut step = 1;
    let ms = time_ops(&cx.dev, 1, |_| {
        step += 1;
        cx.dev.exec(&op(step), &grads, &state)
    })?;
    Ok((ms, ck.done()))
}

const ALLOC_SIZES: [usize; 10] = [4 << 20, 123, 64 << 20, 3000, 1 << 20, 17 << 20, 512, 40_000, 9 << 20, 1];

/// Milliseconds per 1000 alloc/free pairs; wrong when the driver is called after warm-up.
fn allocator(cx: &mut Cx) -> R<(f64, Check)> {
    let dev = &cx.dev;
    let round = || -> R<()> {
        let ids = ALLOC_SIZES.iter().map(|&s| dev.alloc(s)).collect::<R<Vec<_>>>()?;
        for id in ids.into_iter().rev() {
            dev.free(id)?;
        }
        Ok(())
    };
    round()?;
    let before = dev.stats()?;
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..100 {
            round()?;
        }
        samples.push(t.elapsed().as_secs_f64() * 1e3 / (100.0 * ALLOC_SIZES.len() as f64 / 1000.0));
    }
    samples.sort_by(f64::total_cmp);
    let after = dev.stats()?;
    let check = if after.cache_misses != before.cache_misses || after.reserved_bytes != before.reserved_bytes {
        Err(format!("WRONG driver allocations after warm-up: {before:?} -> {after:?}"))
    } else {
        Ok("no driver allocation after warm-up".to_string())
    };
    Ok((samples[ROUNDS / 2], check))
}

/// Host microseconds per tiny add, launches only (the device keeps up with the host).
fn small_op(cx: &mut Cx) -> R<(f64, Check)> {
    let a = cx.host(DType::F32, &[16], &(0..16).map(|i| i as f64 + 0.5).collect::<Vec<_>>())?;
    let y = cx.empty(DType::F32, &[16])?;
    let op = Op::Binary(BinaryOp::Add);
    for _ in 0..100 {
        cx.dev.exec(&op, &[a, a], &[y])?;
    }
    cx.dev.sync()?;
    let want: Vec<f64> = (0..16).map(|i| 2.0 * (i as f64 + 0.5)).collect();
    let mut ck = Verdict::default();
    ck.add("y", &cx.all(&y)?, &want, &want, 0.0);
    let n = 5000;
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..n {
            cx.dev.exec(&op, &[a, a], &[y])?;
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        cx.dev.sync()?;
    }
    samples.sort_by(f64::total_cmp);
    Ok((samples[ROUNDS / 2], ck.done()))
}

/// All-reduce (sum) of `ALL_REDUCE_ELEMS` elements over devices `0..count`, out of place,
/// through the plugin's `collective` (NCCL). Device 0 is the `Cx`'s; the others are driven
/// through the module directly. The host clock brackets the calls and a synchronize of
/// every device.
fn all_reduce(cx: &mut Cx, dtype: DType, count: u32) -> R<(f64, Check)> {
    let m = cx.dev.m;
    let Some(collective) = m.collective() else {
        return Err(BackendError::unsupported("the plugin has no `collective` entry"));
    };
    let n = ALL_REDUCE_ELEMS;
    let bytes = (n * dtype.size_in_bytes()) as u64;
    let mut buffers: Vec<(u32, BufferId)> = Vec::new();
    let result = (|| -> R<(f64, Check)> {
        let mut args = Vec::new();
        for device in 0..count {
            let mut pair = Vec::with_capacity(2);
            for k in 0..2 {
                let b = (m.allocate())(device, bytes).into_result().map_err(BackendError::from)?;
                buffers.push((device, b));
                let t = TensorDesc::contiguous(b, 0, dtype, &[n])?;
                if k == 0 {
                    let op = Op::RandUniform { seed: cx.rng.next(), offset: 0, low: -4.0, high: 4.0 }.encode();
                    (m.execute())(device, &op, (&[][..]).into(), std::slice::from_ref(&t).into())
                        .into_result()
                        .map_err(BackendError::from)?;
                }
                pair.push(t);
            }
            args.push(CollectiveArg { device, input: pair[0], output: pair[1] });
        }
        let run = || -> R<()> {
            (collective)(CollectiveOp::AllReduceSum as u32, args.as_slice().into()).into_result().map_err(Into::into)
        };
        let sync_all = || -> R<()> {
            for device in 0..count {
                (m.synchronize())(device).into_result().map_err(BackendError::from)?;
            }
            Ok(())
        };
        run()?;
        sync_all()?;
        // A slice at the start, the middle and the end of every output against the host sum.
        let size = dtype.size_in_bytes();
        let read = |device: u32, b: BufferId, at: usize, len: usize| -> R<Vec<f64>> {
            let mut out = vec![0u8; len * size];
            (m.read())(device, b, (at * size) as u64, out.as_mut_slice().into())
                .into_result()
                .map_err(BackendError::from)?;
            Ok(values(dtype, &out))
        };
        let mut ck = Verdict::default();
        for at in [0, n / 2 + 7, n - 4096] {
            let mut want = vec![0.0; 4096];
            let mut scale = vec![0.0; 4096];
            for a in &args {
                for (i, x) in read(a.device, a.input.buffer, at, 4096)?.into_iter().enumerate() {
                    want[i] += x;
                    scale[i] += x.abs();
                }
            }
            for a in &args {
                ck.add(
                    &format!("cuda:{} output", a.device),
                    &read(a.device, a.output.buffer, at, 4096)?,
                    &want,
                    &scale,
                    rtol(dtype, 1e-6),
                );
            }
        }
        let mut samples = Vec::new();
        for _ in 0..ROUNDS {
            let t = Instant::now();
            for _ in 0..ALL_REDUCE_REPS {
                run()?;
            }
            sync_all()?;
            samples.push(t.elapsed().as_secs_f64() * 1e3 / ALL_REDUCE_REPS as f64);
        }
        samples.sort_by(f64::total_cmp);
        let ms = samples[ROUNDS / 2];
        // NCCL's "bus bandwidth": what each link carries for a ring all-reduce.
        let bus = bytes as f64 * 2.0 * (count as f64 - 1.0) / count as f64 / (ms * 1e-3) / 1e9;
        Ok((ms, ck.done().map(|d| format!("{d}; bus bandwidth {bus:.0} GB/s"))))
    })();
    for (device, b) in buffers {
        let _ = (m.free())(device, b);
    }
    result
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn write_json(path: &str, device: &str, rows: &[Row]) -> std::io::Result<()> {
    let mut s = format!("{{\n  \"device\": {},\n  \"rows\": [\n", json_str(device));
    for (i, r) in rows.iter().enumerate() {
        let ms = r.ms.filter(|m| m.is_finite()).map_or("null".to_string(), |m| format!("{m:.6}"));
        s += &format!(
            "    {{\"work\": {}, \"ms\": {ms}, \"unit\": {}, \"status\": {}, \"detail\": {}}}{}\n",
            json_str(&r.work),
            json_str(r.unit),
            json_str(r.status),
            json_str(&r.detail),
            if i + 1 < rows.len() { "," } else { "" }
        );
    }
    s += "  ]\n}\n";
    std::fs::write(path, s)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut path = "dist-cuda/libgenesis_backend_cuda.so".to_string();
    let (mut json, mut filter) = (None, None);
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json = it.next().cloned(),
            "--filter" => filter = it.next().cloned(),
            "--cpu" => {}
            "-h" | "--help" => {
                println!("usage: cuda_bench <plugin.so> [--json FILE] [--filter SUBSTR]");
                return;
            }
            p => path = p.to_string(),
        }
    }
    // `--cpu` runs the rows on the CPU backend: a check of the host references where there
    // is no GPU (slow at these sizes; use --filter).
    let module = if args.iter().any(|a| a == "--cpu") {
        Ok(genesis_backend_cpu::genesis_plugin_module())
    } else {
        load_plugin(&path)
    };
    let module = match module {
        Ok(m) => m,
        Err(e) => {
            eprintln!("cannot load {path}: {e}");
            std::process::exit(2);
        }
    };
    let device = match (module.device_properties())(0).into_result() {
        Ok(p) => genesis_backend_api::DeviceProperties::from(p),
        Err(e) => {
            eprintln!("no device: {}", BackendError::from(e));
            std::process::exit(3);
        }
    };
    println!("cuda:0: {device:?}");
    let dev = Dev { m: module };
    let caps = match dev.caps() {
        Ok(c) => c.into_iter().collect(),
        Err(e) => {
            eprintln!("capabilities: {e}");
            std::process::exit(3);
        }
    };
    let mut cx = Cx { dev, caps, rng: Rng(0x2545_F491_4F6C_DD1D), owned: Vec::new(), rows: Vec::new(), filter };
    println!("| work | genesis | status | check |");
    println!("|---|---|---|---|");
    let (f32_, bf16_) = (DType::F32, DType::BF16);
    let add_op = Op::Binary(BinaryOp::Add);
    // The copy row comes first: torch_bench.py derives the bandwidth floors from it.
    cx.row("copy 4096x4096 f32", "ms", &[(Op::Copy, f32_)], |cx| copy(cx, false));
    cx.row("transpose copy 4096x4096 f32", "ms", &[(Op::Copy, f32_)], |cx| copy(cx, true));
    for d in [f32_, bf16_] {
        cx.row(&format!("add 4096x4096 {}", short(d)), "ms", &[(add_op, d)], |cx| add(cx, d, false));
    }
    cx.row("broadcast add 4096x4096 + 4096 f32", "ms", &[(add_op, f32_)], |cx| add(cx, f32_, true));
    for d in [f32_, bf16_] {
        let op = Op::Reduce(ReduceOp::Sum);
        cx.row(&format!("sum over rows 4096x4096 {}", short(d)), "ms", &[(op, d)], |cx| sum(cx, d, true));
        cx.row(&format!("sum over columns 4096x4096 {}", short(d)), "ms", &[(op, d)], |cx| sum(cx, d, false));
    }
    cx.row("matmul 4096^3 bf16", "ms", &[(Op::Matmul, bf16_)], |cx| matmul(cx, bf16_, false));
    cx.row("matmul 4096^3 f32 (IEEE)", "ms", &[(Op::Matmul, f32_)], |cx| matmul(cx, f32_, false));
    cx.row("matmul 4096^3 f32 (TF32)", "ms", &[(Op::Matmul, f32_)], |cx| matmul(cx, f32_, true));
    for d in [f32_, bf16_] {
        cx.row(&format!("softmax 8192x8192 {}", short(d)), "ms", &[(Op::Softmax, d)], |cx| softmax(cx, d));
    }
    for d in [f32_, bf16_] {
        let needs = [(Op::SoftmaxBackward, d)];
        cx.row(&format!("softmax backward 8192x8192 {}", short(d)), "ms", &needs, |cx| softmax_backward(cx, d));
    }
    for (name, rms) in [("layer norm", false), ("rms norm", true)] {
        let eps = 1e-5;
        let fwd = if rms { Op::RmsNorm { eps } } else { Op::LayerNorm { eps } };
        let bwd = if rms { Op::RmsNormBackward } else { Op::LayerNormBackward };
        for d in [f32_, bf16_] {
            cx.row(&format!("{name} 4096x4096 {} forward", short(d)), "ms", &[(fwd, d)], |cx| norm(cx, d, rms, false));
            cx.row(&format!("{name} 4096x4096 {} backward", short(d)), "ms", &[(fwd, d), (bwd, d)], |cx| {
                norm(cx, d, rms, true)
            });
        }
    }
    let fwd = Op::Attention { causal: true, scale: 0.125 };
    let bwd = Op::AttentionBackward { causal: true, scale: 0.125 };
    let att = "causal attention B8 H16 S1024 D64 bf16";
    cx.row(&format!("{att} forward"), "ms", &[(fwd, bf16_)], |cx| attention(cx, false));
    cx.row(&format!("{att} forward+backward"), "ms", &[(fwd, bf16_), (bwd, bf16_)], |cx| attention(cx, true));
    let ce = Op::CrossEntropy { ignore_index: -100, label_smoothing: 0.0 };
    let ceb = Op::CrossEntropyBackward { ignore_index: -100, label_smoothing: 0.0 };
    for d in [f32_, bf16_] {
        cx.row(&format!("cross-entropy 8192x32000 {} forward", short(d)), "ms", &[(ce, d)], |cx| {
            cross_entropy(cx, d, false)
        });
        let needs = [(ce, d), (ceb, d)];
        cx.row(&format!("cross-entropy 8192x32000 {} forward+backward", short(d)), "ms", &needs, |cx| {
            cross_entropy(cx, d, true)
        });
    }
    let (lr, beta1, beta2, eps, weight_decay) = ADAMW;
    let adam = Op::AdamW { lr, beta1, beta2, eps, weight_decay, step: 1 };
    cx.row("adamw step 24 tensors 503M params f32", "ms", &[(adam, f32_)], adamw);
    cx.row("caching allocator 1000 mixed alloc/free", "ms", &[], allocator);
    cx.row("small-op overhead (tiny add, host per op)", "us", &[(add_op, f32_)], small_op);
    // Multi-GPU rows only where there are several GPUs (torch_bench.py does the same).
    let count = (cx.dev.m.probe())().into_result().map_or(0, |p| p.device_count);
    if count >= 2 {
        for d in [f32_, bf16_] {
            let work = format!("all-reduce sum 64M {} over {count} GPUs", short(d));
            cx.row(&work, "ms", &[], |cx| all_reduce(cx, d, count));
        }
    }
    if let Some(path) = json {
        if let Err(e) = write_json(&path, &device.name, &cx.rows) {
            eprintln!("cannot write {path}: {e}");
            std::process::exit(2);
        }
        println!("wrote {path}");
    }
    let bad = cx.rows.iter().filter(|r| r.status == "wrong" || r.status == "error").count();
    std::process::exit(if bad == 0 { 0 } else { 1 });
}
