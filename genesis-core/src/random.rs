//! Random numbers: generators hold `(seed, offset)`; backends fill tensors statelessly with
//! Philox4x32-10 at that position, so a seed gives the same numbers on every backend.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::sdk::philox::{blocks_used, Draw};
use genesis_backend_api::{DType, Op};
use std::sync::{Arc, Mutex, OnceLock};

/// The state of a generator: the Philox key and the next counter block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RngState {
    /// Philox key.
    pub seed: u64,
    /// Next counter block.
    pub offset: u64,
}

/// A random number generator (`torch.Generator`). Clones share state.
#[derive(Clone, Debug)]
pub struct Generator {
    state: Arc<Mutex<RngState>>,
}

const DEFAULT_SEED: u64 = 67280421310721;

impl Generator {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Generator {
        Generator { state: Arc::new(Mutex::new(RngState { seed, offset: 0 })) }
    }

    /// The default generator. One for the process, whatever the device: fills are a pure
    /// function of `(seed, offset)`, so one stream serves every backend identically.
    pub fn default_for(_device: &Device) -> Generator {
        default_generator()
    }

    /// Reseed and rewind.
    pub fn manual_seed(&self, seed: u64) {
        *self.lock() = RngState { seed, offset: 0 };
    }

    /// The current state.
    pub fn get_state(&self) -> RngState {
        *self.lock()
    }

    /// Restore a state.
    pub fn set_state(&self, state: RngState) {
        *self.lock() = state;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RngState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserve the counter blocks for a draw of `numel` elements; returns `(seed, offset)`.
    pub(crate) fn advance(&self, draw: Draw, dtype: DType, numel: usize) -> (u64, u64) {
        let mut s = self.lock();
        let at = (s.seed, s.offset);
        s.offset = s.offset.wrapping_add(blocks_used(draw, dtype, numel as u64));
        at
    }

    fn fill(&self, shape: &[usize], dtype: DType, device: &Device, make: impl Fn(u64, u64) -> Op) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(Error::invalid(format!("random fill: {dtype} is not a floating-point dtype")));
        }
        let t = Tensor::empty(shape, dtype, device)?;
        let (seed, offset) = self.advance(
            if matches!(make(0, 0), Op::RandNormal { .. }) { Draw::Normal } else { Draw::Uniform },
            dtype,
            t.numel(),
        );
        crate::ops::exec(&make(seed, offset), &[], &[&t])?;
        Ok(t)
    }

    /// Uniform in `[low, high)`.
    pub fn uniform(&self, shape: &[usize], low: f64, high: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        self.fill(shape, dtype, device, |seed, offset| Op::RandUniform { seed, offset, low, high })
    }

    /// Normal with `mean` and `std`.
    pub fn normal(&self, shape: &[usize], mean: f64, std: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        self.fill(shape, dtype, device, |seed, offset| Op::RandNormal { seed, offset, mean, std })
    }
}

pub(crate) fn default_generator() -> Generator {
    static DEFAULT: OnceLock<Generator> = OnceLock::new();
    DEFAULT.get_or_init(|| Generator::new(DEFAULT_SEED)).clone()
}

/// Seed the default generator (`torch.manual_seed`).
pub fn manual_seed(seed: u64) {
    default_generator().manual_seed(seed);
}

/// The default generator's state (`torch.get_rng_state`).
pub fn get_rng_state() -> RngState {
    default_generator().get_state()
}

/// Restore the default generator's state (`torch.set_rng_state`).
pub fn set_rng_state(state: RngState) {
    default_generator().set_state(state);
}

/// Run `f`, then put the default generator back as it was (`torch.random.fork_rng`).
pub fn fork_rng<T>(f: impl FnOnce() -> T) -> T {
    let saved = get_rng_state();
    let out = f();
    set_rng_state(saved);
    out
}
