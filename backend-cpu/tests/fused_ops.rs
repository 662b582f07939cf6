//! The fused CPU kernels (softmax, norms, cross-entropy, AdamW, rotary, attention,
//! convolution, pooling) against naive f64 references written here, for every float dtype,
//! with dense and strided (padded, offset) operands.
//!
//! Each reference backward is itself checked against central finite differences of the
//! reference forward (the `reference_*` tests), so a kernel agreeing with a reference is
//! agreeing with the mathematics rather than with a second copy of the same mistake.
//!
//! Low-precision inputs are rounded to their dtype before the reference sees them, and saved
//! statistics (f32 mean/rstd/lse) are fed to kernel and reference alike, so the remaining
//! differences are the kernel's own rounding: tolerances are a small multiple of the output
//! dtype's epsilon, relative to the magnitude of the expected values.

use genesis_backend_api::sdk::offsets;
use genesis_backend_api::{
    contiguous_strides, Backend, BackendError, DType, Device, ErrorKind, Op, TensorDesc, Window2d,
};
use genesis_backend_cpu::{CpuBackend, CpuDevice};
use half::{bf16, f16};
use rstest::rstest;

// ---------------------------------------------------------------------------------------------
// Harness: upload f64 data as any dtype and layout, run an op, download as f64.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// Row-major.
    Dense,
    /// Every dim padded, the last one with stride 2, and an element offset: nothing is
    /// contiguous, and the gaps hold garbage that must never be read.
    Strided,
}
use Layout::{Dense, Strided};

fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f32::EPSILON as f64,
        DType::F64 => f64::EPSILON,
        DType::F16 => f16::EPSILON.to_f64(),
        DType::BF16 => bf16::EPSILON.to_f64(),
        other => panic!("no epsilon for {other}"),
    }
}

fn encode(dtype: DType, v: f64, out: &mut [u8]) {
    match dtype {
        DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out.copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        DType::I64 => out.copy_from_slice(&(v as i64).to_le_bytes()),
        other => panic!("no encoding for {other}"),
    }
}

fn decode(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        other => panic!("no decoding for {other}"),
    }
}

/// `v` as the dtype stores it.
fn round(dtype: DType, v: &[f64]) -> Vec<f64> {
    let mut b = vec![0u8; dtype.size_in_bytes()];
    v.iter()
        .map(|&x| {
            encode(dtype, x, &mut b);
            decode(dtype, &b)
        })
        .collect()
}

fn geometry(shape: &[usize], layout: Layout) -> (Vec<isize>, usize) {
    match layout {
        Dense => (contiguous_strides(shape), 0),
        Strided => {
            let mut strides = vec![0isize; shape.len()];
            let mut acc = 2isize;
            for i in (0..shape.len()).rev() {
                strides[i] = acc;
                acc = acc * shape[i].max(1) as isize + 3;
            }
            (strides, 5)
        }
    }
}

struct Harness {
    dev: CpuDevice,
}

impl Harness {
    fn new() -> Harness {
        Harness { dev: CpuBackend::new().open_device(0).expect("open the cpu device") }
    }

    /// A tensor filled with `data` (garbage when `None`: all-ones bytes, NaN for floats, -1
    /// for i64, so an element a kernel forgets to write shows up).
    fn tensor(&self, dtype: DType, shape: &[usize], layout: Layout, data: Option<&[f64]>) -> TensorDesc {
        let (strides, offset) = geometry(shape, layout);
        let size = dtype.size_in_bytes();
        let numel: usize = shape.iter().product();
        let extent = if numel == 0 {
            0
        } else {
            1 + shape.iter().zip(&strides).map(|(&n, &s)| (n - 1) * s as usize).sum::<usize>()
        };
        let mut bytes = vec![0xffu8; (offset + extent) * size];
        if let Some(data) = data {
            assert_eq!(data.len(), numel, "data for shape {shape:?}");
            for (o, &v) in offsets(shape, &strides).zip(data) {
                let at = (offset + o as usize) * size;
                encode(dtype, v, &mut bytes[at..at + size]);
            }
        }
        let buffer = self.dev.allocate(bytes.len()).unwrap();
        self.dev.write(buffer, 0, &bytes).unwrap();
        TensorDesc::new(buffer, offset * size, dtype, shape, &strides).unwrap()
    }

    fn input(&self, dtype: DType, shape: &[usize], layout: Layout, data: &[f64]) -> TensorDesc {
        self.tensor(dtype, shape, layout, Some(data))
    }

    fn output(&self, dtype: DType, shape: &[usize], layout: Layout) -> TensorDesc {
        self.tensor(dtype, shape, layout, None)
    }

    fn download(&self, t: &TensorDesc) -> Vec<f64> {
        let dtype = t.dtype().unwrap();
        let Some((_, end)) = t.byte_extent().unwrap() else { return Vec::new() };
        let mut bytes = vec![0u8; end];
        self.dev.read(t.buffer, 0, &mut bytes).unwrap();
        let size = dtype.size_in_bytes();
        offsets(&t.shape(), &t.strides())
            .map(|o| {
                let at = t.offset_bytes as usize + o as usize * size;
                decode(dtype, &bytes[at..at + size])
            })
            .collect()
    }

    fn run(&self, op: Op, inputs: &[&TensorDesc], outputs: &[&TensorDesc]) -> Result<(), BackendError> {
        let ins: Vec<TensorDesc> = inputs.iter().map(|&&t| t).collect();
        let outs: Vec<TensorDesc> = outputs.iter().map(|&&t| t).collect();
        self.dev.execute(&op, &ins, &outs)
    }

    fn ok(&self, op: Op, inputs: &[&TensorDesc], outputs: &[&TensorDesc]) {
        if let Err(e) = self.run(op, inputs, outputs) {
            panic!("{op:?} failed: {e}");
        }
    }

    fn fails(&self, op: Op, inputs: &[&TensorDesc], outputs: &[&TensorDesc], kind: ErrorKind) -> String {
        match self.run(op, inputs, outputs) {
            Ok(()) => panic!("{op:?} succeeded, expected {kind}"),
            Err(e) => {
                assert_eq!(e.kind, kind, "{op:?}: {e}");
                e.message
            }
        }
    }
}

/// `|got - want| <= tol * (max|want| + |want|)` elementwise; NaN must match NaN and infinities
/// must match exactly.
fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= tol * (scale + w.abs())
        };
        assert!(ok, "{what}[{i}]: got {g}, want {w} (tol {tol:e}, scale {scale})");
    }
}

/// A deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| scale * self.uniform()).collect()
    }
}

/// Check `grad` against central differences of the scalar function `f` at `x`.
fn check_fd(what: &str, f: impl Fn(&[f64]) -> f64, x: &[f64], grad: &[f64]) {
    let h = 1e-5;
    let fd: Vec<f64> = (0..x.len())
        .map(|i| {
            let (mut xp, mut xm) = (x.to_vec(), x.to_vec());
            xp[i] += h;
            xm[i] -= h;
            (f(&xp) - f(&xm)) / (2.0 * h)
        })
        .collect();
    assert_close(what, grad, &fd, 1e-6);
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

const F32: DType = DType::F32;
const F64: DType = DType::F64;
const F16: DType = DType::F16;
const BF16: DType = DType::BF16;
const I64: DType = DType::I64;

// ---------------------------------------------------------------------------------------------
// Capabilities.
// ---------------------------------------------------------------------------------------------

#[test]
fn fused_ops_are_claimed_for_float_dtypes_only() {
    let h = Harness::new();
    let caps = h.dev.capabilities();
    let w = Window2d::default();
    let ops = [
        Op::Softmax,
        Op::LogSoftmax,
        Op::SoftmaxBackward,
        Op::LogSoftmaxBackward,
        Op::LayerNorm { eps: 0.0 },
        Op::LayerNormBackward,
        Op::RmsNorm { eps: 0.0 },
        Op::RmsNormBackward,
        Op::Rotary { inverse: false },
        Op::Attention { causal: false, scale: 1.0 },
        Op::AttentionBackward { causal: false, scale: 1.0 },
        Op::CrossEntropy { ignore_index: 0, label_smoothing: 0.0 },
        Op::CrossEntropyBackward { ignore_index: 0, label_smoothing: 0.0 },
        Op::AdamW { lr: 0.0, beta1: 0.0, beta2: 0.0, eps: 0.0, weight_decay: 0.0, step: 1 },
        Op::Conv2d { window: w, groups: 1 },
        Op::Conv2dBackwardInput { window: w, groups: 1 },
        Op::Conv2dBackwardWeight { window: w, groups: 1 },
        Op::MaxPool2d { window: w },
        Op::MaxPool2dBackward { window: w },
        Op::AvgPool2d { window: w },
        Op::AvgPool2dBackward { window: w },
    ];
    for op in ops {
        for dtype in DType::ALL {
            let claimed = caps.iter().any(|c| c.op == op.kind() && c.dtype == dtype as u32);
            assert_eq!(claimed, dtype.is_float(), "{} for {dtype}", op.name());
        }
    }
    // Not claimed means a clean Unsupported.
    let x = h.input(I64, &[2, 3], Dense, &[0.0; 6]);
    let y = h.output(I64, &[2, 3], Dense);
    h.fails(Op::Softmax, &[&x], &[&y], ErrorKind::Unsupported);
    assert!(caps.iter().all(|c| c.op.name().is_some()));
}

// ---------------------------------------------------------------------------------------------
// Softmax.
// ---------------------------------------------------------------------------------------------

fn softmax_ref(x: &[f64], d: usize, log: bool) -> Vec<f64> {
    x.chunks(d)
        .flat_map(|r| {
            let m = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = r.iter().map(|v| (v - m).exp()).sum();
            r.iter().map(move |v| if log { v - m - s.ln() } else { (v - m).exp() / s }).collect::<Vec<_>>()
        })
        .collect()
}

fn softmax_backward_ref(y: &[f64], dy: &[f64], d: usize, log: bool) -> Vec<f64> {
    y.chunks(d)
        .zip(dy.chunks(d))
        .flat_map(|(y, dy)| {
            if log {
                let s: f64 = dy.iter().sum();
                y.iter().zip(dy).map(|(y, g)| g - y.exp() * s).collect::<Vec<_>>()
            } else {
                let s = dot(y, dy);
                y.iter().zip(dy).map(|(y, g)| y * (g - s)).collect()
            }
        })
        .collect()
}

#[test]
fn reference_softmax_backward_matches_finite_differences() {
    let mut rng = Rng(1);
    let (x, dy) = (rng.vec(12, 2.0), rng.vec(12, 1.0));
    for log in [false, true] {
        let y = softmax_ref(&x, 4, log);
        let grad = softmax_backward_ref(&y, &dy, 4, log);
        check_fd("softmax", |x| dot(&softmax_ref(x, 4, log), &dy), &x, &grad);
    }
}

#[rstest]
fn softmax_forward(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(false, true)] log: bool,
    #[values(&[3, 2, 7][..], &[64, 600][..], &[5][..])] shape: &[usize],
) {
    let h = Harness::new();
    let mut rng = Rng(2);
    let n: usize = shape.iter().product();
    let d = shape[shape.len() - 1];
    let mut x = rng.vec(n, 4.0);
    // A shifted row (exp would overflow without the max subtraction) and, when there are
    // several rows, an all -inf row (NaN, as in PyTorch).
    x[..d].iter_mut().for_each(|v| *v += 100.0);
    if n > d {
        x[d..2 * d].fill(f64::NEG_INFINITY);
    }
    let x = round(dtype, &x);
    let (xt, yt) = (h.input(dtype, shape, layout, &x), h.output(dtype, shape, layout));
    h.ok(if log { Op::LogSoftmax } else { Op::Softmax }, &[&xt], &[&yt]);
    let want = softmax_ref(&x, d, log);
    if n > d {
        assert!(want[d..2 * d].iter().all(|v| v.is_nan()));
    }
    assert_close("softmax", &h.download(&yt), &want, 4.0 * eps_of_compute(dtype));
}

#[rstest]
fn softmax_backward(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(false, true)] log: bool,
    #[values(&[3, 2, 7][..], &[64, 600][..])] shape: &[usize],
) {
    let h = Harness::new();
    let mut rng = Rng(3);
    let n: usize = shape.iter().product();
    let d = shape[shape.len() - 1];
    let y = round(dtype, &softmax_ref(&rng.vec(n, 3.0), d, log));
    let dy = round(dtype, &rng.vec(n, 1.0));
    let (yt, dyt, dxt) =
        (h.input(dtype, shape, layout, &y), h.input(dtype, shape, layout, &dy), h.output(dtype, shape, layout));
    h.ok(if log { Op::LogSoftmaxBackward } else { Op::SoftmaxBackward }, &[&yt, &dyt], &[&dxt]);
    assert_close("softmax backward", &h.download(&dxt), &softmax_backward_ref(&y, &dy, d, log), 8.0 * eps(dtype));
}

#[test]
fn softmax_validates_operands() {
    let h = Harness::new();
    let x = h.input(F32, &[2, 3], Dense, &[0.0; 6]);
    let bad_shape = h.output(F32, &[3, 2], Dense);
    let bad_dtype = h.output(F64, &[2, 3], Dense);
    h.fails(Op::Softmax, &[&x], &[&bad_shape], ErrorKind::ShapeMismatch);
    h.fails(Op::Softmax, &[&x], &[&bad_dtype], ErrorKind::DtypeMismatch);
    h.fails(Op::SoftmaxBackward, &[&x], &[&bad_dtype], ErrorKind::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm and RmsNorm.
// ---------------------------------------------------------------------------------------------

/// (y, mean, rstd)
fn layer_norm_ref(x: &[f64], w: &[f64], b: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = w.len();
    let (mut y, mut mean, mut rstd) = (vec![], vec![], vec![]);
    for r in x.chunks(d) {
        let mu = r.iter().sum::<f64>() / d as f64;
        let var = r.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / d as f64;
        let rs = 1.0 / (var + eps).sqrt();
        y.extend(r.iter().zip(w).zip(b).map(|((v, w), b)| (v - mu) * rs * w + b));
        mean.push(mu);
        rstd.push(rs);
    }
    (y, mean, rstd)
}

/// (dx, dweight, dbias) from the saved statistics, PyTorch's formula.
fn layer_norm_backward_ref(
    dy: &[f64],
    x: &[f64],
    w: &[f64],
    mean: &[f64],
    rstd: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = w.len();
    let (mut dx, mut dw, mut db) = (vec![], vec![0.0; d], vec![0.0; d]);
    for (i, (xr, gr)) in x.chunks(d).zip(dy.chunks(d)).enumerate() {
        let xhat: Vec<f64> = xr.iter().map(|v| (v - mean[i]) * rstd[i]).collect();
        let g: Vec<f64> = gr.iter().zip(w).map(|(a, b)| a * b).collect();
        let mg = g.iter().sum::<f64>() / d as f64;
        let mgx = dot(&g, &xhat) / d as f64;
        dx.extend((0..d).map(|j| rstd[i] * (g[j] - mg - xhat[j] * mgx)));
        for j in 0..d {
            dw[j] += gr[j] * xhat[j];
            db[j] += gr[j];
        }
    }
    (dx, dw, db)
}

/// (y, rstd)
fn rms_norm_ref(x: &[f64], w: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>) {
    let d = w.len();
    let (mut y, mut rstd) = (vec![], vec![]);
    for r in x.chunks(d) {
        let rs = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
        y.extend(r.iter().zip(w).map(|(v, w)| v * rs * w));
        rstd.push(rs);
    }
    (y, rstd)
}

fn rms_norm_backward_ref(dy: &[f64], x: &[f64], w: &[f64], rstd: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let d = w.len();
    let (mut dx, mut dw) = (vec![], vec![0.0; d]);
    for (i, (xr, gr)) in x.chunks(d).zip(dy.chunks(d)).enumerate() {
        let xhat: Vec<f64> = xr.iter().map(|v| v * rstd[i]).collect();
        let g: Vec<f64> = gr.iter().zip(w).map(|(a, b)| a * b).collect();
        let mgx = dot(&g, &xhat) / d as f64;
        dx.extend((0..d).map(|j| rstd[i] * (g[j] - xhat[j] * mgx)));
        for j in 0..d {
            dw[j] += gr[j] * xhat[j];
        }
    }
    (dx, dw)
}

#[test]
fn reference_norm_backwards_match_finite_differences() {
    let mut rng = Rng(4);
    let (d, rows, eps) = (5, 3, 1e-5);
    let (x, w, b, dy) = (rng.vec(rows * d, 2.0), rng.vec(d, 1.0), rng.vec(d, 1.0), rng.vec(rows * d, 1.0));
    let (_, mean, rstd) = layer_norm_ref(&x, &w, &b, eps);
    let (dx, dw, db) = layer_norm_backward_ref(&dy, &x, &w, &mean, &rstd);
    check_fd("layer_norm dx", |x| dot(&layer_norm_ref(x, &w, &b, eps).0, &dy), &x, &dx);
    check_fd("layer_norm dw", |w| dot(&layer_norm_ref(&x, w, &b, eps).0, &dy), &w, &dw);
    check_fd("layer_norm db", |b| dot(&layer_norm_ref(&x, &w, b, eps).0, &dy), &b, &db);
    let (_, rstd) = rms_norm_ref(&x, &w, eps);
    let (dx, dw) = rms_norm_backward_ref(&dy, &x, &w, &rstd);
    check_fd("rms_norm dx", |x| dot(&rms_norm_ref(x, &w, eps).0, &dy), &x, &dx);
    check_fd("rms_norm dw", |w| dot(&rms_norm_ref(&x, w, eps).0, &dy), &w, &dw);
}

/// Statistics are f32 whatever the dtype; they come from f32 (or f64) accumulation over a
/// short row, so a few f32 epsilons cover them.
const STAT_TOL: f64 = 32.0 * f32::EPSILON as f64;

#[rstest]
fn layer_norm(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(&[4, 3, 10][..], &[300, 128][..])] shape: &[usize],
) {
    let h = Harness::new();
    let mut rng = Rng(5);
    let (n, d) = (shape.iter().product::<usize>(), shape[shape.len() - 1]);
    let lead = &shape[..shape.len() - 1];
    let mut x = rng.vec(n, 2.0);
    // A row far from zero: the variance must come from deviations, not E[x²] - E[x]².
    x[..d].iter_mut().for_each(|v| *v += 30.0);
    let (x, w, b) = (round(dtype, &x), round(dtype, &rng.vec(d, 1.5)), round(dtype, &rng.vec(d, 1.0)));
    let eps = 1e-5;
    let (xt, wt, bt) =
        (h.input(dtype, shape, layout, &x), h.input(dtype, &[d], layout, &w), h.input(dtype, &[d], layout, &b));
    let (yt, mt, rt) = (h.output(dtype, shape, layout), h.output(F32, lead, layout), h.output(F32, lead, layout));
    h.ok(Op::LayerNorm { eps }, &[&xt, &wt, &bt], &[&yt, &mt, &rt]);
    let (y, mean, rstd) = layer_norm_ref(&x, &w, &b, eps);
    assert_close("y", &h.download(&yt), &y, 8.0 * eps_of_compute(dtype));
    assert_close("mean", &h.download(&mt), &mean, STAT_TOL);
    assert_close("rstd", &h.download(&rt), &rstd, STAT_TOL);

    // Backward from the saved (f32) statistics, which the reference uses too.
    let (mean, rstd) = (round(F32, &mean), round(F32, &rstd));
    let dy = round(dtype, &rng.vec(n, 1.0));
    let dyt = h.input(dtype, shape, layout, &dy);
    let (mt, rt) = (h.input(F32, lead, layout, &mean), h.input(F32, lead, layout, &rstd));
    let (dxt, dwt, dbt) =
        (h.output(dtype, shape, layout), h.output(dtype, &[d], layout), h.output(dtype, &[d], layout));
    h.ok(Op::LayerNormBackward, &[&dyt, &xt, &wt, &mt, &rt], &[&dxt, &dwt, &dbt]);
    let (dx, dw, db) = layer_norm_backward_ref(&dy, &x, &w, &mean, &rstd);
    assert_close("dx", &h.download(&dxt), &dx, 16.0 * eps_of_compute(dtype));
    assert_close("dweight", &h.download(&dwt), &dw, 16.0 * eps_of_compute(dtype));
    assert_close("dbias", &h.download(&dbt), &db, 16.0 * eps_of_compute(dtype));
}

/// The larger of the dtype's epsilon and its compute type's accumulation error over rows of
/// a few hundred elements.
fn eps_of_compute(dtype: DType) -> f64 {
    match dtype {
        F64 => 64.0 * eps(F64),
        _ => eps(dtype).max(8.0 * eps(F32)),
    }
}

#[rstest]
fn rms_norm(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(&[4, 3, 10][..], &[300, 128][..])] shape: &[usize],
) {
    let h = Harness::new();
    let mut rng = Rng(6);
    let (n, d) = (shape.iter().product::<usize>(), shape[shape.len() - 1]);
    let lead = &shape[..shape.len() - 1];
    let (x, w) = (round(dtype, &rng.vec(n, 2.0)), round(dtype, &rng.vec(d, 1.5)));
    let eps = 1e-6;
    let (xt, wt) = (h.input(dtype, shape, layout, &x), h.input(dtype, &[d], layout, &w));
    let (yt, rt) = (h.output(dtype, shape, layout), h.output(F32, lead, layout));
    h.ok(Op::RmsNorm { eps }, &[&xt, &wt], &[&yt, &rt]);
    let (y, rstd) = rms_norm_ref(&x, &w, eps);
    assert_close("y", &h.download(&yt), &y, 8.0 * eps_of_compute(dtype));
    assert_close("rstd", &h.download(&rt), &rstd, STAT_TOL);

    let rstd = round(F32, &rstd);
    let dy = round(dtype, &rng.vec(n, 1.0));
    let (dyt, rt) = (h.input(dtype, shape, layout, &dy), h.input(F32, lead, layout, &rstd));
    let (dxt, dwt) = (h.output(dtype, shape, layout), h.output(dtype, &[d], layout));
    h.ok(Op::RmsNormBackward, &[&dyt, &xt, &wt, &rt], &[&dxt, &dwt]);
    let (dx, dw) = rms_norm_backward_ref(&dy, &x, &w, &rstd);
    assert_close("dx", &h.download(&dxt), &dx, 16.0 * eps_of_compute(dtype));
    assert_close("dweight", &h.download(&dwt), &dw, 16.0 * eps_of_compute(dtype));
}

#[test]
fn norms_validate_operands() {
    let h = Harness::new();
    let x = h.input(F32, &[2, 4], Dense, &[1.0; 8]);
    let w3 = h.input(F32, &[3], Dense, &[1.0; 3]);
    let w4 = h.input(F32, &[4], Dense, &[1.0; 4]);
    let w4h = h.input(F16, &[4], Dense, &[1.0; 4]);
    let y = h.output(F32, &[2, 4], Dense);
    let (r2, r3, r2h) = (h.output(F32, &[2], Dense), h.output(F32, &[3], Dense), h.output(F16, &[2], Dense));
    let m = h.fails(Op::RmsNorm { eps: 1e-5 }, &[&x, &w3], &[&y, &r2], ErrorKind::ShapeMismatch);
    assert!(m.contains("rms_norm") && m.contains("[3]"), "{m}");
    h.fails(Op::RmsNorm { eps: 1e-5 }, &[&x, &w4], &[&y, &r3], ErrorKind::ShapeMismatch);
    h.fails(Op::RmsNorm { eps: 1e-5 }, &[&x, &w4], &[&y, &r2h], ErrorKind::DtypeMismatch);
    h.fails(Op::RmsNorm { eps: 1e-5 }, &[&x, &w4h], &[&y, &r2], ErrorKind::DtypeMismatch);
    h.fails(Op::RmsNorm { eps: -1.0 }, &[&x, &w4], &[&y, &r2], ErrorKind::InvalidArgument);
    h.fails(Op::LayerNorm { eps: 1e-5 }, &[&x, &w4], &[&y, &r2], ErrorKind::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy.
// ---------------------------------------------------------------------------------------------

const IGNORE: i64 = -100;

/// (loss, lse)
fn cross_entropy_ref(x: &[f64], target: &[i64], c: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let (mut loss, mut lse) = (vec![], vec![]);
    for (r, &t) in x.chunks(c).zip(target) {
        let m = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let l = m + r.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        lse.push(l);
        let mean = r.iter().sum::<f64>() / c as f64;
        loss.push(if t == IGNORE { 0.0 } else { (1.0 - eps) * (l - r[t as usize]) + eps * (l - mean) });
    }
    (loss, lse)
}

fn cross_entropy_backward_ref(x: &[f64], target: &[i64], lse: &[f64], dloss: &[f64], c: usize, eps: f64) -> Vec<f64> {
    let mut out = vec![];
    for (i, (r, &t)) in x.chunks(c).zip(target).enumerate() {
        for (j, v) in r.iter().enumerate() {
            out.push(if t == IGNORE {
                0.0
            } else {
                let onehot = if j as i64 == t { 1.0 - eps } else { 0.0 };
                dloss[i] * ((v - lse[i]).exp() - onehot - eps / c as f64)
            });
        }
    }
    out
}

#[test]
fn reference_cross_entropy_backward_matches_finite_differences() {
    let mut rng = Rng(7);
    let (n, c) = (4, 5);
    let x = rng.vec(n * c, 3.0);
    let target = [2, IGNORE, 0, 4];
    let dloss = rng.vec(n, 1.0);
    for eps in [0.0, 0.2] {
        let (_, lse) = cross_entropy_ref(&x, &target, c, eps);
        let grad = cross_entropy_backward_ref(&x, &target, &lse, &dloss, c, eps);
        check_fd("cross_entropy", |x| dot(&cross_entropy_ref(x, &target, c, eps).0, &dloss), &x, &grad);
    }
}

#[rstest]
fn cross_entropy(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(0.0, 0.1)] smoothing: f64,
    #[values((6, 5), (70, 500))] nc: (usize, usize),
) {
    let (n, c) = nc;
    let h = Harness::new();
    let mut rng = Rng(8);
    let mut x = rng.vec(n * c, 4.0);
    x[..c].iter_mut().for_each(|v| *v += 100.0);
    let x = round(dtype, &x);
    let target: Vec<i64> = (0..n).map(|i| if i % 4 == 1 { IGNORE } else { (rng.next() % c as u64) as i64 }).collect();
    let target_f: Vec<f64> = target.iter().map(|&t| t as f64).collect();
    let op = Op::CrossEntropy { ignore_index: IGNORE, label_smoothing: smoothing };
    let (xt, tt) = (h.input(dtype, &[n, c], layout, &x), h.input(I64, &[n], layout, &target_f));
    let (lt, st) = (h.output(F32, &[n], layout), h.output(F32, &[n], layout));
    h.ok(op, &[&xt, &tt], &[&lt, &st]);
    let (loss, lse) = cross_entropy_ref(&x, &target, c, smoothing);
    assert_close("loss", &h.download(&lt), &loss, STAT_TOL);
    assert_close("lse", &h.download(&st), &lse, STAT_TOL);

    let lse = round(F32, &lse);
    let dloss = round(F32, &rng.vec(n, 1.0));
    let (st, dt) = (h.input(F32, &[n], layout, &lse), h.input(F32, &[n], layout, &dloss));
    let gt = h.output(dtype, &[n, c], layout);
    let op = Op::CrossEntropyBackward { ignore_index: IGNORE, label_smoothing: smoothing };
    h.ok(op, &[&xt, &tt, &st, &dt], &[&gt]);
    let want = cross_entropy_backward_ref(&x, &target, &lse, &dloss, c, smoothing);
    assert_close("dlogits", &h.download(&gt), &want, 8.0 * eps_of_compute(dtype));
}

#[test]
fn cross_entropy_refuses_targets_out_of_range() {
    let h = Harness::new();
    let x = h.input(F32, &[2, 3], Dense, &[0.0; 6]);
    let (loss, lse) = (h.output(F32, &[2], Dense), h.output(F32, &[2], Dense));
    let dloss = h.input(F32, &[2], Dense, &[1.0; 2]);
    let dx = h.output(F32, &[2, 3], Dense);
    for bad in [3.0, -1.0] {
        let t = h.input(I64, &[2], Dense, &[0.0, bad]);
        let op = Op::CrossEntropy { ignore_index: IGNORE, label_smoothing: 0.0 };
        let m = h.fails(op, &[&x, &t], &[&loss, &lse], ErrorKind::InvalidArgument);
        assert!(m.contains(&format!("{}", bad as i64)), "{m}");
        let op = Op::CrossEntropyBackward { ignore_index: IGNORE, label_smoothing: 0.0 };
        h.fails(op, &[&x, &t, &lse, &dloss], &[&dx], ErrorKind::InvalidArgument);
    }
    // -1 is fine when it is the ignore index, and its row's loss is 0.
    let t = h.input(I64, &[2], Dense, &[0.0, -1.0]);
    h.ok(Op::CrossEntropy { ignore_index: -1, label_smoothing: 0.0 }, &[&x, &t], &[&loss, &lse]);
    assert_close("loss", &h.download(&loss), &[3f64.ln(), 0.0], STAT_TOL);
    let op = Op::CrossEntropy { ignore_index: IGNORE, label_smoothing: 1.0 };
    h.fails(op, &[&x, &t], &[&loss, &lse], ErrorKind::InvalidArgument);
    let t32 = h.input(F32, &[2], Dense, &[0.0; 2]);
    h.fails(
        Op::CrossEntropy { ignore_index: -1, label_smoothing: 0.0 },
        &[&x, &t32],
        &[&loss, &lse],
        ErrorKind::DtypeMismatch,
    );
}

// ---------------------------------------------------------------------------------------------
// AdamW.
// ---------------------------------------------------------------------------------------------

struct Adam {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    wd: f64,
}

/// One step in f64 from the given state; returns (param, m, v).
fn adamw_ref(a: &Adam, step: u64, p: &[f64], m: &[f64], v: &[f64], g: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let bc1 = 1.0 - a.beta1.powi(step as i32);
    let bc2 = 1.0 - a.beta2.powi(step as i32);
    let mut out = (vec![], vec![], vec![]);
    for i in 0..p.len() {
        let mi = a.beta1 * m[i] + (1.0 - a.beta1) * g[i];
        let vi = a.beta2 * v[i] + (1.0 - a.beta2) * g[i] * g[i];
        let pi = p[i] * (1.0 - a.lr * a.wd) - a.lr / bc1 * mi / (vi.sqrt() / bc2.sqrt() + a.eps);
        out.0.push(pi);
        out.1.push(mi);
        out.2.push(vi);
    }
    out
}

#[rstest]
fn adamw(#[values(F32, F64, F16, BF16)] dtype: DType, #[values(Dense, Strided)] layout: Layout) {
    let h = Harness::new();
    let mut rng = Rng(9);
    let a = Adam { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, wd: 0.1 };
    // Two groups: moments in the param's dtype, and in f32; one large enough to go parallel.
    let groups = [(vec![3usize, 4], dtype), (vec![40_000usize], F32)];
    let mut state: Vec<[Vec<f64>; 3]> = groups
        .iter()
        .map(|(shape, mdt)| {
            let n = shape.iter().product();
            [
                round(dtype, &rng.vec(n, 1.0)),
                round(*mdt, &rng.vec(n, 0.1)),
                round(*mdt, &rng.vec(n, 0.01).iter().map(|v| v.abs()).collect::<Vec<_>>()),
            ]
        })
        .collect();
    let tensors: Vec<[TensorDesc; 3]> = groups
        .iter()
        .zip(&state)
        .map(|((shape, mdt), [p, m, v])| {
            [h.input(dtype, shape, layout, p), h.input(*mdt, shape, layout, m), h.input(*mdt, shape, layout, v)]
        })
        .collect();
    for step in 1..=3u64 {
        let grads: Vec<Vec<f64>> =
            groups.iter().map(|(s, _)| round(dtype, &rng.vec(s.iter().product(), 1.0))).collect();
        let gt: Vec<TensorDesc> = groups.iter().zip(&grads).map(|((s, _), g)| h.input(dtype, s, layout, g)).collect();
        let op = Op::AdamW { lr: a.lr, beta1: a.beta1, beta2: a.beta2, eps: a.eps, weight_decay: a.wd, step };
        let outs: Vec<&TensorDesc> = tensors.iter().flatten().collect();
        h.ok(op, &gt.iter().collect::<Vec<_>>(), &outs);
        for (i, ((_, mdt), ts)) in groups.iter().zip(&tensors).enumerate() {
            let [p, m, v] = &state[i];
            let (wp, wm, wv) = adamw_ref(&a, step, p, m, v, &grads[i]);
            let got: Vec<Vec<f64>> = ts.iter().map(|t| h.download(t)).collect();
            assert_close(&format!("param {i} step {step}"), &got[0], &wp, 4.0 * eps_of_compute(dtype));
            assert_close(&format!("exp_avg {i} step {step}"), &got[1], &wm, 4.0 * eps_of_compute(*mdt));
            assert_close(&format!("exp_avg_sq {i} step {step}"), &got[2], &wv, 4.0 * eps_of_compute(*mdt));
            state[i] = [got[0].clone(), got[1].clone(), got[2].clone()];
        }
    }
}

#[test]
fn adamw_validates_operands() {
    let h = Harness::new();
    let g = h.input(F32, &[4], Dense, &[0.5; 4]);
    let (p, m, v) = (
        h.input(F32, &[4], Dense, &[1.0; 4]),
        h.input(F32, &[4], Dense, &[0.0; 4]),
        h.input(F32, &[4], Dense, &[0.0; 4]),
    );
    let op = |step| Op::AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, step };
    let m0 = h.fails(op(0), &[&g], &[&p, &m, &v], ErrorKind::InvalidArgument);
    assert!(m0.contains("step"), "{m0}");
    h.fails(op(1), &[&g], &[&p, &m], ErrorKind::InvalidArgument);
    // The grad aliasing its param, or two outputs sharing memory, is refused.
    h.fails(op(1), &[&p], &[&p, &m, &v], ErrorKind::InvalidArgument);
    h.fails(op(1), &[&g], &[&p, &m, &m], ErrorKind::InvalidArgument);
    let m16 = h.input(F16, &[4], Dense, &[0.0; 4]);
    h.fails(op(1), &[&g], &[&p, &m16, &v], ErrorKind::DtypeMismatch);
    let p5 = h.input(F32, &[5], Dense, &[0.0; 5]);
    h.fails(op(1), &[&g], &[&p5, &m, &v], ErrorKind::ShapeMismatch);
    let bad_beta = Op::AdamW { lr: 1e-3, beta1: 1.0, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, step: 1 };
    h.fails(bad_beta, &[&g], &[&p, &m, &v], ErrorKind::InvalidArgument);
    // Nothing was modified by the refused calls.
    assert_eq!(h.download(&p), vec![1.0; 4]);
    h.ok(op(1), &[], &[]);
}

// ---------------------------------------------------------------------------------------------
// Rotary.
// ---------------------------------------------------------------------------------------------

fn rotary_ref(x: &[f64], cos: &[f64], sin: &[f64], s: usize, d: usize, inverse: bool) -> Vec<f64> {
    let half = d / 2;
    let mut y = vec![0.0; x.len()];
    for (row, (xr, yr)) in x.chunks(d).zip(y.chunks_mut(d)).enumerate() {
        let pos = row % s;
        for i in 0..half {
            let (c, sn) = (cos[pos * half + i], sin[pos * half + i] * if inverse { -1.0 } else { 1.0 });
            yr[i] = xr[i] * c - xr[i + half] * sn;
            yr[i + half] = xr[i + half] * c + xr[i] * sn;
        }
    }
    y
}

fn rotary_tables(s: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
    let half = d / 2;
    let angle = |p: usize, i: usize| p as f64 / 10000f64.powf(2.0 * i as f64 / d as f64);
    let cos = (0..s * half).map(|k| angle(k / half, k % half).cos()).collect();
    let sin = (0..s * half).map(|k| angle(k / half, k % half).sin()).collect();
    (cos, sin)
}

#[test]
fn reference_rotary_inverse_is_its_backward() {
    let mut rng = Rng(10);
    let (s, d) = (3, 4);
    let (cos, sin) = rotary_tables(s, d);
    let (x, dy) = (rng.vec(2 * s * d, 1.0), rng.vec(2 * s * d, 1.0));
    let grad = rotary_ref(&dy, &cos, &sin, s, d, true);
    check_fd("rotary", |x| dot(&rotary_ref(x, &cos, &sin, s, d, false), &dy), &x, &grad);
}

#[rstest]
fn rotary(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(false, true)] inverse: bool,
    #[values([2, 3, 5, 8], [2, 4, 64, 128])] shape: [usize; 4],
) {
    let h = Harness::new();
    let mut rng = Rng(11);
    let [_, _, s, d] = shape;
    let (cos, sin) = rotary_tables(s, d);
    let (cos, sin) = (round(dtype, &cos), round(dtype, &sin));
    let x = round(dtype, &rng.vec(shape.iter().product(), 2.0));
    let xt = h.input(dtype, &shape, layout, &x);
    let (ct, st) = (h.input(dtype, &[s, d / 2], layout, &cos), h.input(dtype, &[s, d / 2], layout, &sin));
    let yt = h.output(dtype, &shape, layout);
    h.ok(Op::Rotary { inverse }, &[&xt, &ct, &st], &[&yt]);
    assert_close("rotary", &h.download(&yt), &rotary_ref(&x, &cos, &sin, s, d, inverse), 4.0 * eps(dtype));
}

#[test]
fn rotary_takes_a_transposed_input() {
    // x laid out as (b, s, h, d) in memory and viewed as (b, h, s, d): the usual layout after
    // a QKV projection.
    let h = Harness::new();
    let mut rng = Rng(12);
    let (b, nh, s, d) = (2, 3, 4, 6);
    let mem = rng.vec(b * s * nh * d, 1.0);
    let buffer = h.dev.allocate(mem.len() * 4).unwrap();
    let bytes: Vec<u8> = mem.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
    h.dev.write(buffer, 0, &bytes).unwrap();
    let strides = [(s * nh * d) as isize, d as isize, (nh * d) as isize, 1];
    let xt = TensorDesc::new(buffer, 0, F32, &[b, nh, s, d], &strides).unwrap();
    let x: Vec<f64> = offsets(&[b, nh, s, d], &strides).map(|o| mem[o as usize] as f32 as f64).collect();
    let (cos, sin) = rotary_tables(s, d);
    let (cos, sin) = (round(F32, &cos), round(F32, &sin));
    let (ct, st) = (h.input(F32, &[s, d / 2], Dense, &cos), h.input(F32, &[s, d / 2], Dense, &sin));
    let yt = h.output(F32, &[b, nh, s, d], Dense);
    h.ok(Op::Rotary { inverse: false }, &[&xt, &ct, &st], &[&yt]);
    assert_close("rotary", &h.download(&yt), &rotary_ref(&x, &cos, &sin, s, d, false), 4.0 * eps(F32));
}

#[test]
fn rotary_validates_operands() {
    let h = Harness::new();
    let x = h.input(F32, &[1, 1, 2, 5], Dense, &[0.0; 10]);
    let c = h.input(F32, &[2, 2], Dense, &[0.0; 4]);
    let y = h.output(F32, &[1, 1, 2, 5], Dense);
    h.fails(Op::Rotary { inverse: false }, &[&x, &c, &c], &[&y], ErrorKind::ShapeMismatch);
    let x = h.input(F32, &[1, 2, 4], Dense, &[0.0; 8]);
    let y = h.output(F32, &[1, 2, 4], Dense);
    h.fails(Op::Rotary { inverse: false }, &[&x, &c, &c], &[&y], ErrorKind::ShapeMismatch);
    let x = h.input(F32, &[1, 1, 2, 4], Dense, &[0.0; 8]);
    let y = h.output(F32, &[1, 1, 2, 4], Dense);
    let c16 = h.input(F16, &[2, 2], Dense, &[0.0; 4]);
    h.fails(Op::Rotary { inverse: false }, &[&x, &c16, &c16], &[&y], ErrorKind::DtypeMismatch);
    let c3 = h.input(F32, &[3, 2], Dense, &[0.0; 6]);
    h.fails(Op::Rotary { inverse: false }, &[&x, &c3, &c3], &[&y], ErrorKind::ShapeMismatch);
}

// ---------------------------------------------------------------------------------------------
// Attention.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Attn {
    b: usize,
    hq: usize,
    hk: usize,
    s: usize,
    t: usize,
    d: usize,
    causal: bool,
}

impl Attn {
    fn q_shape(&self) -> [usize; 4] {
        [self.b, self.hq, self.s, self.d]
    }
    fn kv_shape(&self) -> [usize; 4] {
        [self.b, self.hk, self.t, self.d]
    }
    fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }
    /// Keys visible to query i.
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            ((i + self.t + 1) as i64 - self.s as i64).clamp(0, self.t as i64) as usize
        } else {
            self.t
        }
    }
    fn kv_head(&self, b: usize, h: usize) -> usize {
        b * self.hk + h / (self.hq / self.hk)
    }
}

/// (o, lse); a query that sees no key gets NaN in both.
fn attention_ref(a: &Attn, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (s, t, d) = (a.s, a.t, a.d);
    let (mut o, mut lse) = (vec![], vec![]);
    for b in 0..a.b {
        for h in 0..a.hq {
            let kv = a.kv_head(b, h) * t * d;
            for i in 0..s {
                let qi = &q[((b * a.hq + h) * s + i) * d..][..d];
                let n = a.visible(i);
                let scores: Vec<f64> = (0..n).map(|j| a.scale() * dot(qi, &k[kv + j * d..][..d])).collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                for c in 0..d {
                    let weighted: f64 = (0..n).map(|j| (scores[j] - m).exp() / sum * v[kv + j * d + c]).sum();
                    o.push(if n == 0 { f64::NAN } else { weighted });
                }
                lse.push(if n == 0 { f64::NAN } else { m + sum.ln() });
            }
        }
    }
    (o, lse)
}

/// (dq, dk, dv) from the saved o and lse.
fn attention_backward_ref(a: &Attn, [q, k, v, o, lse, d_o]: [&[f64]; 6]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (s, t, d) = (a.s, a.t, a.d);
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for b in 0..a.b {
        for h in 0..a.hq {
            let kv = a.kv_head(b, h) * t * d;
            for i in 0..s {
                let row = ((b * a.hq + h) * s + i) * d;
                let (qi, oi, doi) = (&q[row..][..d], &o[row..][..d], &d_o[row..][..d]);
                let big_d = dot(doi, oi);
                for j in 0..a.visible(i) {
                    let (kj, vj) = (&k[kv + j * d..][..d], &v[kv + j * d..][..d]);
                    let p = (a.scale() * dot(qi, kj) - lse[(b * a.hq + h) * s + i]).exp();
                    let ds = p * (dot(doi, vj) - big_d);
                    for c in 0..d {
                        dq[row + c] += a.scale() * ds * kj[c];
                        dk[kv + j * d + c] += a.scale() * ds * qi[c];
                        dv[kv + j * d + c] += p * doi[c];
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}

#[rstest]
#[case(Attn { b: 1, hq: 2, hk: 1, s: 3, t: 4, d: 3, causal: false })]
#[case(Attn { b: 1, hq: 2, hk: 1, s: 3, t: 4, d: 3, causal: true })]
#[case(Attn { b: 2, hq: 2, hk: 2, s: 3, t: 3, d: 2, causal: true })]
fn reference_attention_backward_matches_finite_differences(#[case] a: Attn) {
    let mut rng = Rng(13);
    let (nq, nk) = (a.b * a.hq * a.s * a.d, a.b * a.hk * a.t * a.d);
    let (q, k, v, d_o) = (rng.vec(nq, 1.0), rng.vec(nk, 1.0), rng.vec(nk, 1.0), rng.vec(nq, 1.0));
    let (o, lse) = attention_ref(&a, &q, &k, &v);
    let (dq, dk, dv) = attention_backward_ref(&a, [&q, &k, &v, &o, &lse, &d_o]);
    check_fd("dq", |q| dot(&attention_ref(&a, q, &k, &v).0, &d_o), &q, &dq);
    check_fd("dk", |k| dot(&attention_ref(&a, &q, k, &v).0, &d_o), &k, &dk);
    check_fd("dv", |v| dot(&attention_ref(&a, &q, &k, v).0, &d_o), &v, &dv);
}

#[rstest]
#[case::plain(Attn { b: 2, hq: 3, hk: 3, s: 5, t: 7, d: 8, causal: false })]
#[case::causal_gqa(Attn { b: 2, hq: 4, hk: 2, s: 5, t: 5, d: 8, causal: true })]
#[case::causal_more_keys(Attn { b: 1, hq: 2, hk: 1, s: 3, t: 6, d: 4, causal: true })]
#[case::causal_fewer_keys(Attn { b: 1, hq: 2, hk: 2, s: 6, t: 3, d: 4, causal: true })]
#[case::large(Attn { b: 2, hq: 4, hk: 1, s: 40, t: 48, d: 32, causal: true })]
fn attention(#[values(F32, F64, F16, BF16)] dtype: DType, #[values(Dense, Strided)] layout: Layout, #[case] a: Attn) {
    let h = Harness::new();
    let mut rng = Rng(14);
    let (qs, ks) = (a.q_shape(), a.kv_shape());
    let (nq, nk) = (qs.iter().product(), ks.iter().product());
    let (q, k, v) = (round(dtype, &rng.vec(nq, 2.0)), round(dtype, &rng.vec(nk, 2.0)), round(dtype, &rng.vec(nk, 1.0)));
    let (qt, kt, vt) =
        (h.input(dtype, &qs, layout, &q), h.input(dtype, &ks, layout, &k), h.input(dtype, &ks, layout, &v));
    let (ot, lt) = (h.output(dtype, &qs, layout), h.output(F32, &qs[..3], layout));
    h.ok(Op::Attention { causal: a.causal, scale: a.scale() }, &[&qt, &kt, &vt], &[&ot, &lt]);
    let (o, lse) = attention_ref(&a, &q, &k, &v);
    if a.s > a.t && a.causal {
        assert!(lse[0].is_nan() && o[0].is_nan(), "the first query sees no key");
    }
    assert_close("o", &h.download(&ot), &o, 4.0 * eps_of_compute(dtype));
    assert_close("lse", &h.download(&lt), &lse, STAT_TOL);

    let (o, lse) = (round(dtype, &o), round(F32, &lse));
    let d_o = round(dtype, &rng.vec(nq, 1.0));
    let (ot, lt, dot_) =
        (h.input(dtype, &qs, layout, &o), h.input(F32, &qs[..3], layout, &lse), h.input(dtype, &qs, layout, &d_o));
    let (dqt, dkt, dvt) = (h.output(dtype, &qs, layout), h.output(dtype, &ks, layout), h.output(dtype, &ks, layout));
    let op = Op::AttentionBackward { causal: a.causal, scale: a.scale() };
    h.ok(op, &[&qt, &kt, &vt, &ot, &lt, &dot_], &[&dqt, &dkt, &dvt]);
    let (dq, dk, dv) = attention_backward_ref(&a, [&q, &k, &v, &o, &lse, &d_o]);
    let tol = 16.0 * eps_of_compute(dtype);
    assert_close("dq", &h.download(&dqt), &dq, tol);
    assert_close("dk", &h.download(&dkt), &dk, tol);
    assert_close("dv", &h.download(&dvt), &dv, tol);
}

#[test]
fn attention_validates_operands() {
    let h = Harness::new();
    let q = h.input(F32, &[1, 3, 2, 4], Dense, &[0.0; 24]);
    let k = h.input(F32, &[1, 2, 2, 4], Dense, &[0.0; 16]);
    let o = h.output(F32, &[1, 3, 2, 4], Dense);
    let lse = h.output(F32, &[1, 3, 2], Dense);
    let op = Op::Attention { causal: false, scale: 0.5 };
    let m = h.fails(op, &[&q, &k, &k], &[&o, &lse], ErrorKind::ShapeMismatch);
    assert!(m.contains("multiple"), "{m}");
    let k = h.input(F32, &[1, 1, 2, 3], Dense, &[0.0; 6]);
    h.fails(op, &[&q, &k, &k], &[&o, &lse], ErrorKind::ShapeMismatch);
    let k = h.input(F32, &[1, 1, 5, 4], Dense, &[0.0; 20]);
    let lse16 = h.output(F16, &[1, 3, 2], Dense);
    h.fails(op, &[&q, &k, &k], &[&o, &lse16], ErrorKind::DtypeMismatch);
    h.ok(op, &[&q, &k, &k], &[&o, &lse]);
}

// ---------------------------------------------------------------------------------------------
// Convolution.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Conv {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    k: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
}

impl Conv {
    fn out(&self, a: usize) -> usize {
        let len = [self.h, self.w][a];
        (len + 2 * self.pad[a] - self.dil[a] * (self.k[a] - 1) - 1) / self.stride[a] + 1
    }
    fn x_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.h, self.w]
    }
    fn w_shape(&self) -> [usize; 4] {
        [self.o, self.c / self.groups, self.k[0], self.k[1]]
    }
    fn y_shape(&self) -> [usize; 4] {
        [self.n, self.o, self.out(0), self.out(1)]
    }
    fn window(&self) -> Window2d {
        let i = |a: [usize; 2]| [a[0] as i64, a[1] as i64];
        Window2d { kernel: i(self.k), stride: i(self.stride), padding: i(self.pad), dilation: i(self.dil) }
    }
    /// Visit every (x index, weight index, y index) product of the convolution.
    fn for_each(&self, mut f: impl FnMut(usize, usize, usize)) {
        let (cg, og) = (self.c / self.groups, self.o / self.groups);
        let (oh, ow) = (self.out(0), self.out(1));
        for n in 0..self.n {
            for oc in 0..self.o {
                let g = oc / og;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let yi = ((n * self.o + oc) * oh + oy) * ow + ox;
                        for ci in 0..cg {
                            for ky in 0..self.k[0] {
                                for kx in 0..self.k[1] {
                                    let iy = (oy * self.stride[0] + ky * self.dil[0]) as i64 - self.pad[0] as i64;
                                    let ix = (ox * self.stride[1] + kx * self.dil[1]) as i64 - self.pad[1] as i64;
                                    if iy < 0 || ix < 0 || iy >= self.h as i64 || ix >= self.w as i64 {
                                        continue;
                                    }
                                    let xi = ((n * self.c + g * cg + ci) * self.h + iy as usize) * self.w + ix as usize;
                                    let wi = ((oc * cg + ci) * self.k[0] + ky) * self.k[1] + kx;
                                    f(xi, wi, yi);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn conv_ref(cv: &Conv, x: &[f64], w: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
    let mut y = vec![0.0; cv.y_shape().iter().product()];
    cv.for_each(|xi, wi, yi| y[yi] += x[xi] * w[wi]);
    if let Some(b) = bias {
        let plane = cv.out(0) * cv.out(1);
        for (i, v) in y.iter_mut().enumerate() {
            *v += b[i / plane % cv.o];
        }
    }
    y
}

/// (dx, dweight, dbias)
fn conv_backward_ref(cv: &Conv, x: &[f64], w: &[f64], dy: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; cv.o]);
    cv.for_each(|xi, wi, yi| {
        dx[xi] += dy[yi] * w[wi];
        dw[wi] += dy[yi] * x[xi];
    });
    let plane = cv.out(0) * cv.out(1);
    for (i, g) in dy.iter().enumerate() {
        db[i / plane % cv.o] += g;
    }
    (dx, dw, db)
}

const CONV_SMALL: Conv =
    Conv { n: 2, c: 4, h: 7, w: 6, o: 4, k: [3, 2], stride: [2, 1], pad: [1, 2], dil: [2, 1], groups: 2 };

#[test]
fn reference_conv_backward_matches_finite_differences() {
    let cv = CONV_SMALL;
    let mut rng = Rng(15);
    let (x, w, b) =
        (rng.vec(cv.x_shape().iter().product(), 1.0), rng.vec(cv.w_shape().iter().product(), 1.0), rng.vec(cv.o, 1.0));
    let dy = rng.vec(cv.y_shape().iter().product(), 1.0);
    let (dx, dw, db) = conv_backward_ref(&cv, &x, &w, &dy);
    check_fd("dx", |x| dot(&conv_ref(&cv, x, &w, Some(&b)), &dy), &x, &dx);
    check_fd("dw", |w| dot(&conv_ref(&cv, &x, w, Some(&b)), &dy), &w, &dw);
    check_fd("db", |b| dot(&conv_ref(&cv, &x, &w, Some(b)), &dy), &b, &db);
}

#[rstest]
#[case::plain(Conv { n: 2, c: 3, h: 7, w: 6, o: 4, k: [3, 3], stride: [1, 1], pad: [1, 1], dil: [1, 1], groups: 1 }, true)]
#[case::grouped_strided_dilated(CONV_SMALL, false)]
#[case::depthwise(Conv { n: 1, c: 6, h: 5, w: 5, o: 6, k: [3, 3], stride: [1, 2], pad: [1, 1], dil: [1, 1], groups: 6 }, true)]
#[case::pointwise(Conv { n: 3, c: 5, h: 4, w: 3, o: 2, k: [1, 1], stride: [1, 1], pad: [0, 0], dil: [1, 1], groups: 1 }, false)]
#[case::large(Conv { n: 3, c: 8, h: 16, w: 16, o: 8, k: [3, 3], stride: [1, 1], pad: [1, 1], dil: [1, 1], groups: 1 }, true)]
fn conv2d(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[case] cv: Conv,
    #[case] with_bias: bool,
) {
    let h = Harness::new();
    let mut rng = Rng(16);
    let (xs, ws, ys) = (cv.x_shape(), cv.w_shape(), cv.y_shape());
    let x = round(dtype, &rng.vec(xs.iter().product(), 1.0));
    let w = round(dtype, &rng.vec(ws.iter().product(), 1.0));
    let b = round(dtype, &rng.vec(cv.o, 1.0));
    let (xt, wt, bt) =
        (h.input(dtype, &xs, layout, &x), h.input(dtype, &ws, layout, &w), h.input(dtype, &[cv.o], layout, &b));
    let yt = h.output(dtype, &ys, layout);
    let (window, groups) = (cv.window(), cv.groups as u32);
    let inputs: Vec<&TensorDesc> = if with_bias { vec![&xt, &wt, &bt] } else { vec![&xt, &wt] };
    h.ok(Op::Conv2d { window, groups }, &inputs, &[&yt]);
    let tol = 8.0 * eps_of_compute(dtype);
    assert_close("y", &h.download(&yt), &conv_ref(&cv, &x, &w, with_bias.then_some(&b[..])), tol);

    let dy = round(dtype, &rng.vec(ys.iter().product(), 1.0));
    let dyt = h.input(dtype, &ys, layout, &dy);
    let (dx, dw, db) = conv_backward_ref(&cv, &x, &w, &dy);
    let dxt = h.output(dtype, &xs, layout);
    h.ok(Op::Conv2dBackwardInput { window, groups }, &[&dyt, &wt], &[&dxt]);
    assert_close("dx", &h.download(&dxt), &dx, tol);
    let (dwt, dbt) = (h.output(dtype, &ws, layout), h.output(dtype, &[cv.o], layout));
    let outputs: Vec<&TensorDesc> = if with_bias { vec![&dwt, &dbt] } else { vec![&dwt] };
    h.ok(Op::Conv2dBackwardWeight { window, groups }, &[&dyt, &xt], &outputs);
    assert_close("dweight", &h.download(&dwt), &dw, tol);
    if with_bias {
        assert_close("dbias", &h.download(&dbt), &db, tol);
    }
}

#[test]
fn conv2d_validates_geometry() {
    let h = Harness::new();
    let cv = CONV_SMALL;
    let (window, groups) = (cv.window(), cv.groups as u32);
    let x = h.input(F32, &cv.x_shape(), Dense, &vec![0.0; cv.x_shape().iter().product()]);
    let w = h.input(F32, &cv.w_shape(), Dense, &vec![0.0; cv.w_shape().iter().product()]);
    let [n, o, oh, ow] = cv.y_shape();
    let y = h.output(F32, &[n, o, oh, ow], Dense);
    let bad = h.output(F32, &[n, o, oh + 1, ow], Dense);
    let m = h.fails(Op::Conv2d { window, groups }, &[&x, &w], &[&bad], ErrorKind::ShapeMismatch);
    assert!(m.contains("conv2d") && m.contains(&format!("{:?}", [n, o, oh, ow])), "{m}");
    h.fails(Op::Conv2d { window, groups: 3 }, &[&x, &w], &[&y], ErrorKind::InvalidArgument);
    h.fails(Op::Conv2d { window, groups: 1 }, &[&x, &w], &[&y], ErrorKind::ShapeMismatch);
    let unset = Window2d { dilation: [0, 0], ..window };
    h.fails(Op::Conv2d { window: unset, groups }, &[&x, &w], &[&y], ErrorKind::InvalidArgument);
    // (Axis 0: the wire form packs `groups` into the high half of dilation[1].)
    let huge = Window2d { dilation: [i64::MAX, 1], ..window };
    h.fails(Op::Conv2d { window: huge, groups }, &[&x, &w], &[&y], ErrorKind::InvalidArgument);
    let b = h.input(F32, &[o + 1], Dense, &vec![0.0; o + 1]);
    h.fails(Op::Conv2d { window, groups }, &[&x, &w, &b], &[&y], ErrorKind::ShapeMismatch);
    let w16 = h.input(F16, &cv.w_shape(), Dense, &vec![0.0; cv.w_shape().iter().product()]);
    h.fails(Op::Conv2d { window, groups }, &[&x, &w16], &[&y], ErrorKind::DtypeMismatch);
    let dx = h.output(F32, &cv.x_shape(), Dense);
    h.fails(Op::Conv2dBackwardInput { window, groups }, &[&bad, &w], &[&dx], ErrorKind::ShapeMismatch);
}

// ---------------------------------------------------------------------------------------------
// Pooling.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Pool {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
}

impl Pool {
    fn out(&self, a: usize) -> usize {
        let len = [self.h, self.w][a];
        (len + 2 * self.pad[a] - self.dil[a] * (self.k[a] - 1) - 1) / self.stride[a] + 1
    }
    fn x_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.h, self.w]
    }
    fn y_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.out(0), self.out(1)]
    }
    fn window(&self) -> Window2d {
        let i = |a: [usize; 2]| [a[0] as i64, a[1] as i64];
        Window2d { kernel: i(self.k), stride: i(self.stride), padding: i(self.pad), dilation: i(self.dil) }
    }
    /// For every output element (plane, oy, ox) in order, the in-bounds flat plane indices of
    /// its window.
    fn windows(&self) -> Vec<(usize, Vec<usize>)> {
        let mut out = vec![];
        for p in 0..self.n * self.c {
            for oy in 0..self.out(0) {
                for ox in 0..self.out(1) {
                    let mut taps = vec![];
                    for ky in 0..self.k[0] {
                        for kx in 0..self.k[1] {
                            let iy = (oy * self.stride[0] + ky * self.dil[0]) as i64 - self.pad[0] as i64;
                            let ix = (ox * self.stride[1] + kx * self.dil[1]) as i64 - self.pad[1] as i64;
                            if iy >= 0 && ix >= 0 && iy < self.h as i64 && ix < self.w as i64 {
                                taps.push(iy as usize * self.w + ix as usize);
                            }
                        }
                    }
                    out.push((p, taps));
                }
            }
        }
        out
    }
}

/// (y, argmax): the first maximum, or the first NaN.
fn max_pool_ref(pl: &Pool, x: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let plane = pl.h * pl.w;
    let (mut y, mut idx) = (vec![], vec![]);
    for (p, taps) in pl.windows() {
        let (mut best, mut at) = (f64::NEG_INFINITY, taps[0]);
        for &t in &taps {
            let v = x[p * plane + t];
            if !best.is_nan() && (v > best || v.is_nan()) {
                best = v;
                at = t;
            }
        }
        y.push(best);
        idx.push(at as f64);
    }
    (y, idx)
}

fn max_pool_backward_ref(pl: &Pool, dy: &[f64], idx: &[f64]) -> Vec<f64> {
    let plane = pl.h * pl.w;
    let mut dx = vec![0.0; pl.n * pl.c * plane];
    for (i, ((p, _), g)) in pl.windows().iter().zip(dy).enumerate() {
        dx[p * plane + idx[i] as usize] += g;
    }
    dx
}

fn avg_pool_ref(pl: &Pool, x: &[f64]) -> Vec<f64> {
    let plane = pl.h * pl.w;
    let div = (pl.k[0] * pl.k[1]) as f64;
    pl.windows().iter().map(|(p, taps)| taps.iter().map(|&t| x[p * plane + t]).sum::<f64>() / div).collect()
}

fn avg_pool_backward_ref(pl: &Pool, dy: &[f64]) -> Vec<f64> {
    let plane = pl.h * pl.w;
    let div = (pl.k[0] * pl.k[1]) as f64;
    let mut dx = vec![0.0; pl.n * pl.c * plane];
    for ((p, taps), g) in pl.windows().iter().zip(dy) {
        for &t in taps {
            dx[p * plane + t] += g / div;
        }
    }
    dx
}

const POOL_SMALL: Pool = Pool { n: 2, c: 2, h: 7, w: 6, k: [3, 2], stride: [2, 1], pad: [1, 1], dil: [1, 2] };

#[test]
fn reference_pool_backwards_match_finite_differences() {
    let pl = POOL_SMALL;
    let mut rng = Rng(17);
    let x = rng.vec(pl.x_shape().iter().product(), 1.0);
    let dy = rng.vec(pl.y_shape().iter().product(), 1.0);
    let (_, idx) = max_pool_ref(&pl, &x);
    check_fd("max_pool", |x| dot(&max_pool_ref(&pl, x).0, &dy), &x, &max_pool_backward_ref(&pl, &dy, &idx));
    let pl = Pool { dil: [1, 1], ..pl };
    check_fd("avg_pool", |x| dot(&avg_pool_ref(&pl, x), &dy), &x, &avg_pool_backward_ref(&pl, &dy));
}

#[rstest]
#[case::padded_dilated(POOL_SMALL)]
#[case::overlapping(Pool { n: 1, c: 3, h: 9, w: 8, k: [3, 3], stride: [1, 1], pad: [1, 1], dil: [1, 1] })]
#[case::large(Pool { n: 4, c: 16, h: 32, w: 32, k: [2, 2], stride: [2, 2], pad: [0, 0], dil: [1, 1] })]
fn max_pool(#[values(F32, F64, F16, BF16)] dtype: DType, #[values(Dense, Strided)] layout: Layout, #[case] pl: Pool) {
    let h = Harness::new();
    let mut rng = Rng(18);
    let (xs, ys) = (pl.x_shape(), pl.y_shape());
    let x = round(dtype, &rng.vec(xs.iter().product(), 4.0));
    let xt = h.input(dtype, &xs, layout, &x);
    let (yt, it) = (h.output(dtype, &ys, layout), h.output(I64, &ys, layout));
    h.ok(Op::MaxPool2d { window: pl.window() }, &[&xt], &[&yt, &it]);
    let (y, idx) = max_pool_ref(&pl, &x);
    assert_eq!(h.download(&yt), y, "y");
    assert_eq!(h.download(&it), idx, "argmax");

    let dy = round(dtype, &rng.vec(ys.iter().product(), 1.0));
    let (dyt, it) = (h.input(dtype, &ys, layout, &dy), h.input(I64, &ys, layout, &idx));
    let dxt = h.output(dtype, &xs, layout);
    h.ok(Op::MaxPool2dBackward { window: pl.window() }, &[&dyt, &it], &[&dxt]);
    assert_close("dx", &h.download(&dxt), &max_pool_backward_ref(&pl, &dy, &idx), 4.0 * eps(dtype));
}

#[rstest]
#[case::padded(Pool { dil: [1, 1], ..POOL_SMALL })]
#[case::overlapping(Pool { n: 1, c: 3, h: 9, w: 8, k: [3, 3], stride: [1, 1], pad: [1, 1], dil: [1, 1] })]
#[case::large(Pool { n: 4, c: 16, h: 32, w: 32, k: [3, 3], stride: [2, 2], pad: [1, 1], dil: [1, 1] })]
fn avg_pool(#[values(F32, F64, F16, BF16)] dtype: DType, #[values(Dense, Strided)] layout: Layout, #[case] pl: Pool) {
    let h = Harness::new();
    let mut rng = Rng(19);
    let (xs, ys) = (pl.x_shape(), pl.y_shape());
    let x = round(dtype, &rng.vec(xs.iter().product(), 4.0));
    let xt = h.input(dtype, &xs, layout, &x);
    let yt = h.output(dtype, &ys, layout);
    // Average pooling has no dilation; an unset (0) field is accepted like 1.
    let window = Window2d { dilation: [0, 0], ..pl.window() };
    h.ok(Op::AvgPool2d { window }, &[&xt], &[&yt]);
    assert_close("y", &h.download(&yt), &avg_pool_ref(&pl, &x), 4.0 * eps_of_compute(dtype));

    let dy = round(dtype, &rng.vec(ys.iter().product(), 1.0));
    let dyt = h.input(dtype, &ys, layout, &dy);
    let dxt = h.output(dtype, &xs, layout);
    h.ok(Op::AvgPool2dBackward { window: pl.window() }, &[&dyt], &[&dxt]);
    assert_close("dx", &h.download(&dxt), &avg_pool_backward_ref(&pl, &dy), 4.0 * eps_of_compute(dtype));
}

#[rstest]
fn max_pool_picks_first_maximum_and_first_nan(#[values(F32, F64, F16, BF16)] dtype: DType) {
    let h = Harness::new();
    let pl = Pool { n: 1, c: 1, h: 2, w: 4, k: [2, 2], stride: [2, 2], pad: [0, 0], dil: [1, 1] };
    let ninf = f64::NEG_INFINITY;
    // Window 0: a tie (the first wins); window 1: two NaNs after a larger value (the first NaN wins).
    let x = [1.0, 3.0, 5.0, f64::NAN, 3.0, 2.0, f64::NAN, 9.0];
    let xt = h.input(dtype, &pl.x_shape(), Dense, &x);
    let (yt, it) = (h.output(dtype, &pl.y_shape(), Dense), h.output(I64, &pl.y_shape(), Dense));
    h.ok(Op::MaxPool2d { window: pl.window() }, &[&xt], &[&yt, &it]);
    let y = h.download(&yt);
    assert_eq!(y[0], 3.0);
    assert!(y[1].is_nan());
    assert_eq!(h.download(&it), vec![1.0, 3.0]);
    // An all -inf window still points at its first in-bounds element.
    let pl = Pool { n: 1, c: 1, h: 2, w: 2, k: [2, 2], stride: [1, 1], pad: [1, 1], dil: [1, 1] };
    let xt = h.input(dtype, &pl.x_shape(), Dense, &[ninf; 4]);
    let (yt, it) = (h.output(dtype, &pl.y_shape(), Dense), h.output(I64, &pl.y_shape(), Dense));
    h.ok(Op::MaxPool2d { window: pl.window() }, &[&xt], &[&yt, &it]);
    assert_eq!(h.download(&yt), vec![ninf; 9]);
    assert_eq!(h.download(&it), vec![0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 3.0]);
}

#[test]
fn pools_validate_operands() {
    let h = Harness::new();
    let pl = POOL_SMALL;
    let x = h.input(F32, &pl.x_shape(), Dense, &vec![0.0; pl.x_shape().iter().product()]);
    let (y, idx) = (h.output(F32, &pl.y_shape(), Dense), h.output(I64, &pl.y_shape(), Dense));
    let idx32 = h.output(F32, &pl.y_shape(), Dense);
    h.fails(Op::MaxPool2d { window: pl.window() }, &[&x], &[&y, &idx32], ErrorKind::DtypeMismatch);
    let [n, c, oh, ow] = pl.y_shape();
    let bad = h.output(F32, &[n, c, oh, ow + 1], Dense);
    h.fails(Op::MaxPool2d { window: pl.window() }, &[&x], &[&bad, &idx], ErrorKind::ShapeMismatch);
    h.fails(Op::AvgPool2d { window: pl.window() }, &[&x], &[&y], ErrorKind::InvalidArgument);
    let zero_stride = Window2d { stride: [0, 1], ..pl.window() };
    h.fails(Op::MaxPool2d { window: zero_stride }, &[&x], &[&y, &idx], ErrorKind::InvalidArgument);
    // A window that covers only padding has no argmax.
    let tiny = Pool { n: 1, c: 1, h: 2, w: 2, k: [2, 1], stride: [1, 1], pad: [1, 0], dil: [3, 1] };
    let (xt, yt, it) = (
        h.input(F32, &tiny.x_shape(), Dense, &[0.0; 4]),
        h.output(F32, &tiny.y_shape(), Dense),
        h.output(I64, &tiny.y_shape(), Dense),
    );
    let m = h.fails(Op::MaxPool2d { window: tiny.window() }, &[&xt], &[&yt, &it], ErrorKind::InvalidArgument);
    assert!(m.contains("padding"), "{m}");
    // Backward refuses an argmax outside the plane.
    let dy = h.input(F32, &pl.y_shape(), Dense, &vec![1.0; pl.y_shape().iter().product()]);
    let mut bad_idx = vec![0.0; pl.y_shape().iter().product()];
    bad_idx[3] = (pl.h * pl.w) as f64;
    let it = h.input(I64, &pl.y_shape(), Dense, &bad_idx);
    let dx = h.output(F32, &pl.x_shape(), Dense);
    h.fails(Op::MaxPool2dBackward { window: pl.window() }, &[&dy, &it], &[&dx], ErrorKind::InvalidArgument);
}
