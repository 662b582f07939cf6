//! The harness of the fused-op tests (softmax.rs, norm.rs, cross_entropy.rs, adamw.rs,
//! rotary.rs, attention.rs, conv.rs, pool.rs, fused_claims.rs): upload f64 data as any float
//! dtype in a dense or strided layout, run an op, download as f64, compare with a tolerance
//! relative to the magnitude of the expected values, and check reference gradients by finite
//! differences.
//!
//! Those files test the fused CPU kernels (softmax, norms, cross-entropy, AdamW, rotary,
//! attention, convolution, pooling) against naive f64 references written there, for every
//! float dtype, with dense and strided (padded, offset) operands.
//!
//! Each reference backward is itself checked against central finite differences of the
//! reference forward (the `reference_*` tests), so a kernel agreeing with a reference is
//! agreeing with the mathematics rather than with a second copy of the same mistake.
//!
//! Low-precision inputs are rounded to their dtype before the reference sees them, and saved
//! statistics (f32 mean/rstd/lse) are fed to kernel and reference alike, so the remaining
//! differences are the kernel's own rounding: tolerances are a small multiple of the output
//! dtype's epsilon, relative to the magnitude of the expected values.

pub use super::eps;
use genesis_backend_api::sdk::offsets;
use genesis_backend_api::{contiguous_strides, Backend, BackendError, DType, Device, ErrorKind, Op, TensorDesc};
use genesis_backend_cpu::{CpuBackend, CpuDevice};
use half::{bf16, f16};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Layout {
    /// Row-major.
    Dense,
    /// Every dim padded, the last one with stride 2, and an element offset: nothing is
    /// contiguous, and the gaps hold garbage that must never be read.
    Strided,
}
pub use Layout::{Dense, Strided};

/// Little-endian bytes of `v` as `dtype`. Unlike [`super::encode`], f16 and bf16 take
/// `half`'s `from_f64` as it is (it may be one ulp off on near-ties): the fused tests were
/// written with it, and keeping it keeps their data bit for bit.
fn encode(dtype: DType, v: f64, out: &mut [u8]) {
    match dtype {
        DType::F16 => out.copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        _ => super::encode(dtype, v, out),
    }
}

/// `v` as the dtype stores it.
pub fn round(dtype: DType, v: &[f64]) -> Vec<f64> {
    let mut b = vec![0u8; dtype.size_in_bytes()];
    v.iter()
        .map(|&x| {
            encode(dtype, x, &mut b);
            super::decode(dtype, &b)
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

pub struct Harness {
    pub dev: CpuDevice,
}

impl Harness {
    pub fn new() -> Harness {
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

    pub fn input(&self, dtype: DType, shape: &[usize], layout: Layout, data: &[f64]) -> TensorDesc {
        self.tensor(dtype, shape, layout, Some(data))
    }

    pub fn output(&self, dtype: DType, shape: &[usize], layout: Layout) -> TensorDesc {
        self.tensor(dtype, shape, layout, None)
    }

    pub fn download(&self, t: &TensorDesc) -> Vec<f64> {
        let dtype = t.dtype().unwrap();
        let Some((_, end)) = t.byte_extent().unwrap() else { return Vec::new() };
        let mut bytes = vec![0u8; end];
        self.dev.read(t.buffer, 0, &mut bytes).unwrap();
        let size = dtype.size_in_bytes();
        offsets(&t.shape(), &t.strides())
            .map(|o| {
                let at = t.offset_bytes as usize + o as usize * size;
                super::decode(dtype, &bytes[at..at + size])
            })
            .collect()
    }

    pub fn run(&self, op: Op, inputs: &[&TensorDesc], outputs: &[&TensorDesc]) -> Result<(), BackendError> {
        let ins: Vec<TensorDesc> = inputs.iter().map(|&&t| t).collect();
        let outs: Vec<TensorDesc> = outputs.iter().map(|&&t| t).collect();
        self.dev.execute(&op, &ins, &outs)
    }

    pub fn ok(&self, op: Op, inputs: &[&TensorDesc], outputs: &[&TensorDesc]) {
        if let Err(e) = self.run(op, inputs, outputs) {
            panic!("{op:?} failed: {e}");
        }
    }

    pub fn fails(&self, op: Op, inputs: &[&TensorDesc], outputs: &[&TensorDesc], kind: ErrorKind) -> String {
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
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = super::matches(g, w, tol * (scale + w.abs()));
        assert!(ok, "{what}[{i}]: got {g}, want {w} (tol {tol:e}, scale {scale})");
    }
}

/// A deterministic generator (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| scale * self.uniform()).collect()
    }
}

/// Check `grad` against central differences of the scalar function `f` at `x`.
pub fn check_fd(what: &str, f: impl Fn(&[f64]) -> f64, x: &[f64], grad: &[f64]) {
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

pub const F32: DType = DType::F32;
pub const F64: DType = DType::F64;
pub const F16: DType = DType::F16;
pub const BF16: DType = DType::BF16;
pub const I64: DType = DType::I64;

/// Statistics are f32 whatever the dtype; they come from f32 (or f64) accumulation over a
/// short row, so a few f32 epsilons cover them.
pub const STAT_TOL: f64 = 32.0 * f32::EPSILON as f64;

/// The larger of the dtype's epsilon and its compute type's accumulation error over rows of
/// a few hundred elements.
pub fn eps_of_compute(dtype: DType) -> f64 {
    match dtype {
        F64 => 64.0 * eps(F64),
        _ => eps(dtype).max(8.0 * eps(F32)),
    }
}
