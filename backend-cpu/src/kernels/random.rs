//! Counter-based random fills: uniform, normal and dropout from Philox4x32-10.
//!
//! Element `i` (row-major position in the output) is a pure function of `(seed, offset, i)`
//! with the element-to-counter mapping of `sdk::philox` (see the `Op` docs), so any split of
//! the work gives the same bits: the fills run in parallel chunks with no shared state.

use super::{for_chunks, for_each_run, merge_dims, unsupported, Kernel, SyncPtr, View};
use crate::element::{Arith, Element};
use crate::with_dtype;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::sdk::philox;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result};

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[
        Op::RandUniform { seed: 0, offset: 0, low: 0.0, high: 1.0 },
        Op::RandNormal { seed: 0, offset: 0, mean: 0.0, std: 1.0 },
        Op::Dropout { seed: 0, offset: 0, p: 0.5 },
    ])
}

/// The draws of one fill. Four (uniform f32/f16/bf16) or two (uniform f64, normal)
/// consecutive elements share a Philox block, so the last block is cached: elements are
/// visited in order within a chunk, which makes that a 4x (2x) saving. The word-to-number
/// formulas are those of `sdk::philox`; the tests check the results bit for bit against it.
struct Stream {
    seed: u64,
    offset: u64,
    cached: Option<(u64, [u32; 4])>,
}

impl Stream {
    fn new(seed: u64, offset: u64) -> Self {
        Stream { seed, offset, cached: None }
    }

    fn words(&mut self, block: u64) -> [u32; 4] {
        match self.cached {
            Some((b, w)) if b == block => w,
            _ => {
                let w = philox::block(self.seed, block);
                self.cached = Some((block, w));
                w
            }
        }
    }

    /// `philox::uniform_f32`: block `offset + i/4`, word `i%4`, 24 bits.
    fn uniform_f32(&mut self, i: u64) -> f32 {
        let word = self.words(self.offset.wrapping_add(i / 4))[(i % 4) as usize];
        (word >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Words `2*(i%2)` and `2*(i%2)+1` of block `offset + i/2`.
    fn pair(&mut self, i: u64) -> (u32, u32) {
        let words = self.words(self.offset.wrapping_add(i / 2));
        let lane = 2 * (i % 2) as usize;
        (words[lane], words[lane + 1])
    }

    /// `philox::uniform_f64`: 53 bits from a pair.
    fn uniform_f64(&mut self, i: u64) -> f64 {
        let (hi, lo) = self.pair(i);
        let bits = ((hi as u64) << 21) ^ ((lo as u64) >> 11);
        bits as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// The uniform of element `i` of a `dtype` fill, as `RandUniform` and `Dropout` draw it.
    fn uniform(&mut self, dtype: DType, i: u64) -> f64 {
        if dtype == DType::F64 {
            self.uniform_f64(i)
        } else {
            self.uniform_f32(i) as f64
        }
    }

    /// `philox::normal_f64`: Box-Muller (cosine branch) in f64.
    fn normal(&mut self, i: u64) -> f64 {
        let (a, b) = self.pair(i);
        let u1 = ((a >> 8) as f64 + 1.0) * (1.0 / (1u32 << 24) as f64);
        let u2 = (b >> 8) as f64 * (1.0 / (1u32 << 24) as f64);
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    let name = op.name();
    let dtype = inputs.first().or(outputs.first()).map_or(DType::F32, |v| v.dtype);
    if !dtype.is_float() {
        return Err(unsupported(op, dtype));
    }
    match *op {
        Op::RandUniform { seed, offset, low, high } => {
            let ([], [y]) = (inputs, outputs) else { return Err(arity(op, 0, inputs, outputs)) };
            // `low + (high-low)*u` in f64, rounded once to the dtype.
            with_dtype!(y.dtype, T => fill::<T>(y, seed, offset, |s, i| low + (high - low) * s.uniform(T::DTYPE, i)));
        }
        Op::RandNormal { seed, offset, mean, std } => {
            let ([], [y]) = (inputs, outputs) else { return Err(arity(op, 0, inputs, outputs)) };
            with_dtype!(y.dtype, T => fill::<T>(y, seed, offset, |s, i| mean + std * s.normal(i)));
        }
        Op::Dropout { seed, offset, p } => {
            let ([x], [y]) = (inputs, outputs) else { return Err(arity(op, 1, inputs, outputs)) };
            if !(0.0..1.0).contains(&p) {
                return Err(BackendError::invalid(format!("{name}: p must be in [0, 1), got {p}")));
            }
            if y.dtype != x.dtype {
                return Err(BackendError::dtype(format!("{name}: input {} and output {} differ", x.dtype, y.dtype)));
            }
            if x.shape != y.shape {
                return Err(BackendError::shape(format!("{name}: shapes {:?} and {:?} differ", x.shape, y.shape)));
            }
            with_dtype!(x.dtype, T => dropout::<T>(x, y, seed, offset, p));
        }
        _ => return Err(unsupported(op, dtype)),
    }
    Ok(())
}

fn arity(op: &Op, n_in: usize, inputs: &[View], outputs: &[View]) -> BackendError {
    BackendError::invalid(format!(
        "{}: expected {n_in} input(s) and 1 output, got {} and {}",
        op.name(),
        inputs.len(),
        outputs.len()
    ))
}

/// `y[i] = T::from_f64(draw(stream, i))` in row-major order, in parallel chunks.
fn fill<T: Element>(y: &View, seed: u64, offset: u64, draw: impl Fn(&mut Stream, u64) -> f64 + Sync) {
    let yp = SyncPtr(y.base as *mut T);
    let (shape, [ys]) = merge_dims(&y.shape, [&y.strides]);
    for_chunks(y.numel(), y.is_non_overlapping(), |start, end| {
        let (mut stream, mut i) = (Stream::new(seed, offset), start as u64);
        for_each_run(&shape, [&ys], start, end, |[o], [st], len| {
            for j in 0..len as isize {
                // SAFETY: positions of the validated output view; chunks are disjoint and the
                // view was checked not to overlap itself before going parallel.
                unsafe { *yp.get().offset(o + j * st) = T::from_f64(draw(&mut stream, i)) };
                i += 1;
            }
        });
    });
}

/// `y = x * keep / (1-p)` in the compute type, `keep = u >= p` compared in f64.
fn dropout<T: Element>(x: &View, y: &View, seed: u64, offset: u64, p: f64) {
    let (xp, yp) = (SyncPtr(x.base as *mut T), SyncPtr(y.base as *mut T));
    let (shape, [xs, ys]) = merge_dims(&y.shape, [&x.strides, &y.strides]);
    // `1 - p` is formed in f64 and rounded once to the compute type.
    let scale = <T::Compute as Arith>::from_f64(1.0 - p);
    let (one, zero) = (<T::Compute as Arith>::ONE, <T::Compute as Arith>::ZERO);
    for_chunks(y.numel(), y.is_non_overlapping(), |start, end| {
        let (mut stream, mut i) = (Stream::new(seed, offset), start as u64);
        for_each_run(&shape, [&xs, &ys], start, end, |[ox, oy], [sx, sy], len| {
            for j in 0..len as isize {
                let keep = if stream.uniform(T::DTYPE, i) >= p { one } else { zero };
                // SAFETY: as in `fill`; `x` is a validated input that `y` does not overlap.
                unsafe {
                    let v = (*xp.get().offset(ox + j * sx)).compute();
                    *yp.get().offset(oy + j * sy) = T::store(v.mul(keep).div(scale));
                }
                i += 1;
            }
        });
    });
}

inventory::submit! { Kernel { claims, run } }
