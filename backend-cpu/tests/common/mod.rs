//! Shared harness of the CPU backend's integration tests: open the device, upload `f64` data
//! as any dtype in any layout (dense, transposed, padded with an offset, broadcast with stride
//! 0), run an op through the `Device` trait, download the result as `f64`, compare.
//!
//! Each test file includes it with `mod common;`. Unused helpers are fine (`dead_code` is
//! allowed, here and in the submodules): every test binary uses a different subset.
//!
//! The fused-op tests have a harness of their own, [`fused`], and share the reference math in
//! [`reference`].
#![allow(dead_code)]

pub mod fused;
pub mod reference;

use genesis_backend_api::sdk::offsets;
use genesis_backend_api::{
    contiguous_strides, Backend, BackendError, BufferId, DType, Device, ErrorKind, Op, TensorDesc,
};
use genesis_backend_cpu::{CpuBackend, CpuDevice};
use half::{bf16, f16};

/// Device 0 of a fresh CPU backend.
pub fn device() -> CpuDevice {
    CpuBackend::new().open_device(0).expect("the CPU device opens")
}

/// Every dtype, and subsets tests parameterize over.
pub const FLOATS: [DType; 4] = DType::FLOATS;
/// The integer dtypes (not bool).
pub const INTS: [DType; 3] = [DType::I64, DType::I32, DType::U8];

/// Machine epsilon of a float dtype; 0 for integers and bool (their ops are exact).
pub fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f32::EPSILON as f64,
        DType::F64 => f64::EPSILON,
        DType::F16 => f16::EPSILON.to_f64(),
        DType::BF16 => bf16::EPSILON.to_f64(),
        _ => 0.0,
    }
}

/// `v` correctly rounded to a half-precision format: `from_f64` of the `half` crate may be off
/// by one ulp on near-ties (it narrows through f32), so pick the nearest of its neighbours.
fn round_half<H: Copy>(
    v: f64,
    from: impl Fn(f64) -> H,
    to: impl Fn(H) -> f64,
    bits: impl Fn(H) -> u16,
    from_bits: impl Fn(u16) -> H,
) -> H {
    let guess = from(v);
    if !v.is_finite() || to(guess).is_nan() {
        return guess;
    }
    let b = bits(guess);
    let mut best = guess;
    for nb in [b.wrapping_sub(1), b.wrapping_add(1)] {
        let cand = from_bits(nb);
        let (c, g) = (to(cand), to(best));
        if !c.is_finite() {
            continue;
        }
        let (dc, dg) = ((c - v).abs(), (g - v).abs());
        if dc < dg || (dc == dg && bits(cand) & 1 == 0) {
            best = cand;
        }
    }
    best
}

/// `v` as the dtype stores it (round to nearest even for floats, truncation toward zero with
/// saturation for integers, `!= 0` for bool), back as `f64`.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    let mut b = vec![0u8; dtype.size_in_bytes()];
    encode(dtype, v, &mut b);
    decode(dtype, &b)
}

/// Little-endian bytes of `v` as `dtype` (see [`round_to`] for the conversion).
pub fn encode(dtype: DType, v: f64, out: &mut [u8]) {
    match dtype {
        DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&v.to_le_bytes()),
        DType::F16 => {
            out.copy_from_slice(&round_half(v, f16::from_f64, f16::to_f64, f16::to_bits, f16::from_bits).to_le_bytes())
        }
        DType::BF16 => out.copy_from_slice(
            &round_half(v, bf16::from_f64, bf16::to_f64, bf16::to_bits, bf16::from_bits).to_le_bytes(),
        ),
        DType::I64 => out.copy_from_slice(&(v as i64).to_le_bytes()),
        DType::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
        DType::U8 => out[0] = v as u8,
        DType::Bool => out[0] = (v != 0.0) as u8,
    }
}

/// The value of the little-endian bytes `b` of a `dtype` element.
pub fn decode(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U8 => b[0] as f64,
        DType::Bool => (b[0] != 0) as u8 as f64,
    }
}

/// Number of elements of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Deterministic pseudo-random values in `[lo, hi)` (an LCG: tests need variety, not quality).
pub fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

/// Like [`values`], rounded to integers (exactly representable in every dtype of the range).
pub fn int_values(n: usize, seed: u64, lo: i64, hi: i64) -> Vec<f64> {
    values(n, seed, lo as f64, hi as f64).into_iter().map(f64::floor).collect()
}

/// How a tensor's elements are laid out in its buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// Row-major, offset 0.
    Dense,
    /// Stored with the dims in reverse order (a transposed view: the last dim has the largest
    /// stride).
    Transposed,
    /// Stored with dims in the order `perm` (perm[0] outermost); the view's strides follow.
    Permuted(Vec<usize>),
    /// Every dim padded (the last one with stride 2) and an element offset: nothing is
    /// contiguous, and the gaps hold garbage that must never be read.
    Padded,
}

/// Strides (in elements) and the element offset of `layout` for `shape`.
pub fn layout_strides(shape: &[usize], layout: &Layout) -> (Vec<isize>, usize) {
    match layout {
        Layout::Dense => (contiguous_strides(shape), 0),
        Layout::Transposed => layout_strides(shape, &Layout::Permuted((0..shape.len()).rev().collect())),
        Layout::Permuted(perm) => {
            assert_eq!(perm.len(), shape.len(), "permutation rank");
            let stored: Vec<usize> = perm.iter().map(|&d| shape[d]).collect();
            let cs = contiguous_strides(&stored);
            let mut strides = vec![0isize; shape.len()];
            for (i, &d) in perm.iter().enumerate() {
                strides[d] = cs[i];
            }
            (strides, 0)
        }
        Layout::Padded => {
            let mut strides = vec![0isize; shape.len()];
            let mut acc = 2isize;
            for d in (0..shape.len()).rev() {
                strides[d] = acc;
                acc *= shape[d] as isize + 1;
            }
            (strides, 3)
        }
    }
}

/// The byte garbage fills gaps and fresh outputs with: 0xFF is NaN for every float dtype, -1
/// for signed integers, and an invalid (non 0/1) bool, so reading a gap shows.
pub const GARBAGE: u8 = 0xFF;

/// Upload `values` (row-major logical order) as `dtype` viewed with `shape`, `strides` and an
/// element `offset`. Gaps hold [`GARBAGE`]. With stride 0 several positions share an element
/// and the last write wins: pass values that agree (see [`broadcast`] for the usual way).
pub fn upload_strided(
    dev: &CpuDevice,
    values: &[f64],
    dtype: DType,
    shape: &[usize],
    strides: &[isize],
    offset: usize,
) -> TensorDesc {
    assert_eq!(values.len(), numel(shape), "values for shape {shape:?}");
    let size = dtype.size_in_bytes();
    let probe = TensorDesc::new(BufferId(0), offset * size, dtype, shape, strides).expect("descriptor");
    let len = probe.byte_extent().expect("extent").map_or(offset * size, |(_, end)| end);
    let buffer = dev.allocate(len).expect("allocate");
    let mut bytes = vec![GARBAGE; len];
    for (&v, off) in values.iter().zip(offsets(shape, strides)) {
        let at = (offset as isize + off) as usize * size;
        encode(dtype, v, &mut bytes[at..at + size]);
    }
    dev.write(buffer, 0, &bytes).expect("write");
    TensorDesc::new(buffer, offset * size, dtype, shape, strides).expect("descriptor")
}

/// Upload `values` as a dense row-major tensor.
pub fn upload(dev: &CpuDevice, values: &[f64], dtype: DType, shape: &[usize]) -> TensorDesc {
    upload_layout(dev, values, dtype, shape, &Layout::Dense)
}

/// Upload `values` in `layout`.
pub fn upload_layout(dev: &CpuDevice, values: &[f64], dtype: DType, shape: &[usize], layout: &Layout) -> TensorDesc {
    let (strides, offset) = layout_strides(shape, layout);
    upload_strided(dev, values, dtype, shape, &strides, offset)
}

/// A fresh output of `shape` in `layout`, filled with [`GARBAGE`].
pub fn output_layout(dev: &CpuDevice, dtype: DType, shape: &[usize], layout: &Layout) -> TensorDesc {
    let n = numel(shape);
    let desc = upload_layout(dev, &vec![0.0; n], dtype, shape, layout);
    // Overwrite the zeros with garbage too: outputs must be fully written by the kernel.
    let (_, end) = desc.byte_extent().expect("extent").unwrap_or((0, desc.offset_bytes as usize));
    dev.write(desc.buffer, 0, &vec![GARBAGE; end]).expect("write");
    desc
}

/// A fresh dense output filled with [`GARBAGE`].
pub fn output(dev: &CpuDevice, dtype: DType, shape: &[usize]) -> TensorDesc {
    output_layout(dev, dtype, shape, &Layout::Dense)
}

/// View `desc` with the larger `shape` by broadcasting: leading dims are added and size-1 dims
/// expanded, both with stride 0 (what the core hands a backend).
pub fn broadcast(desc: &TensorDesc, shape: &[usize]) -> TensorDesc {
    let (small, strides) = (desc.shape(), desc.strides());
    assert!(small.len() <= shape.len(), "cannot broadcast {small:?} to {shape:?}");
    let lead = shape.len() - small.len();
    let mut new_strides = vec![0isize; shape.len()];
    for (i, (&n, &s)) in small.iter().zip(&strides).enumerate() {
        assert!(n == shape[lead + i] || n == 1, "cannot broadcast {small:?} to {shape:?}");
        new_strides[lead + i] = if n == 1 && shape[lead + i] != 1 { 0 } else { s };
    }
    TensorDesc::new(desc.buffer, desc.offset_bytes as usize, desc.dtype().unwrap(), shape, &new_strides).unwrap()
}

/// The logical values of `values` (row-major, `small` shape) broadcast to `shape`: the
/// reference side of [`broadcast`].
pub fn expand(values: &[f64], small: &[usize], shape: &[usize]) -> Vec<f64> {
    let lead = shape.len() - small.len();
    let cs = contiguous_strides(small);
    let strides: Vec<isize> =
        (0..shape.len()).map(|d| if d < lead || small[d - lead] == 1 { 0 } else { cs[d - lead] }).collect();
    offsets(shape, &strides).map(|o| values[o as usize]).collect()
}

/// The tensor's elements in row-major order, as `f64`.
pub fn download(dev: &CpuDevice, desc: &TensorDesc) -> Vec<f64> {
    let dtype = desc.dtype().expect("dtype");
    let size = dtype.size_in_bytes();
    let Some((start, end)) = desc.byte_extent().expect("extent") else { return Vec::new() };
    let mut bytes = vec![0u8; end - start];
    dev.read(desc.buffer, start, &mut bytes).expect("read");
    offsets(&desc.shape(), &desc.strides())
        .map(|o| {
            let at = o as usize * size;
            decode(dtype, &bytes[at..at + size])
        })
        .collect()
}

/// Run `op` on the device.
pub fn run(dev: &CpuDevice, op: Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<(), BackendError> {
    dev.execute(&op, inputs, outputs)
}

/// Run `op` into one fresh dense output of `dtype` and `shape`; return its values.
pub fn run1(dev: &CpuDevice, op: Op, inputs: &[TensorDesc], dtype: DType, shape: &[usize]) -> Vec<f64> {
    let y = output(dev, dtype, shape);
    run(dev, op, inputs, &[y]).unwrap_or_else(|e| panic!("{op:?} failed: {e}"));
    download(dev, &y)
}

/// Expect `result` to fail with `kind` and a message containing every one of `needles`.
pub fn expect_err(result: Result<(), BackendError>, kind: ErrorKind, needles: &[&str]) {
    let err = result.expect_err("expected an error");
    assert_eq!(err.kind, kind, "wrong kind for: {}", err.message);
    for n in needles {
        assert!(err.message.contains(n), "message {:?} lacks {n:?}", err.message);
    }
}

/// Whether `got` matches `want`: NaN only NaN, an infinity only itself, a finite value anything
/// within `limit` of it (the comparison of both harnesses' `assert_close`).
pub fn matches(got: f64, want: f64, limit: f64) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else if want.is_infinite() {
        got == want
    } else {
        (got - want).abs() <= limit
    }
}

/// Compare elementwise: `|a - e| <= atol + rtol * |e|`, NaN matching NaN and infinities
/// matching exactly. Panics naming the first bad index.
pub fn assert_close(actual: &[f64], expected: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let ok = matches(a, e, atol + rtol * e.abs());
        assert!(ok, "{what}: element {i}: got {a}, expected {e} (rtol {rtol}, atol {atol})");
    }
}

/// Compare bit-for-bit in value (NaN matching NaN): for integer, index and copying ops.
pub fn assert_exact(actual: &[f64], expected: &[f64], what: &str) {
    assert_close(actual, expected, 0.0, 0.0, what);
}
