//! Test helpers: gradient checks by finite differences in f64.

use crate::autograd::grad;
use crate::error::{Error, ErrorKind, Result};
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use std::cell::Cell;
use std::thread::LocalKey;

pub use crate::ops::fused::composites_only;

/// Run `f` on this thread as if every backend reported interface `1.minor` where that decides
/// what the core sends to an op it claims: from 1.9 interleaved outputs (`swiglu_backward`'s
/// two halves in one buffer), from 1.10 `adamw`'s gradient `scale` input, from 1.11
/// `rms_norm_backward`'s `dsum` input, from 1.12 the mixed-precision `add_rms_norm` and
/// `rms_norm_backward` (an f32 stream with a half-precision residual, y or dy), from 1.13 the
/// widened `matmul` (a linear layer's f32 weight gradient under autocast) and the mixed
/// `rms_norm_backward`'s half-precision dx. Below those
/// minors the core does that work with other ops first, as it does for an older plugin. For
/// tests of those paths; claims are not changed.
pub fn as_interface<T>(minor: u32, f: impl FnOnce() -> T) -> T {
    scoped(&crate::backend::INTERFACE_CAP, Some(minor), f)
}

/// `f` with the thread-local `key` set to `value`, and its previous value put back afterwards
/// (also when `f` unwinds): the switches of this module.
pub(crate) fn scoped<V: Copy + 'static, T>(key: &'static LocalKey<Cell<V>>, value: V, f: impl FnOnce() -> T) -> T {
    struct Restore<V: Copy + 'static>(&'static LocalKey<Cell<V>>, V);
    impl<V: Copy + 'static> Drop for Restore<V> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(key, key.with(|c| c.replace(value)));
    f()
}

/// Tolerances and step of [`gradcheck`].
#[derive(Debug, Clone, Copy)]
pub struct GradcheckOptions {
    /// Finite-difference step.
    pub eps: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions { eps: 1e-6, atol: 1e-5, rtol: 1e-3 }
    }
}

/// Compare the gradients autograd computes for `f` at `inputs` with central finite
/// differences, as `torch.autograd.gradcheck` does. Inputs must be f64; those that require
/// grad are checked. A non-scalar output is reduced with fixed pseudo-random weights so every
/// output element takes part. Returns an error describing the first mismatch.
pub fn gradcheck(f: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor], options: GradcheckOptions) -> Result<()> {
    for (i, t) in inputs.iter().enumerate() {
        if t.dtype() != DType::F64 {
            return Err(Error::new(
                ErrorKind::DtypeMismatch,
                format!("gradcheck: input {i} is {}, expected float64", t.dtype()),
            ));
        }
    }
    let out = f(inputs)?;
    let weights: Vec<f64> = (0..out.numel()).map(|k| 0.5 + ((k * 7919 % 101) as f64) / 101.0).collect();
    let w = Tensor::from_vec(weights.clone(), out.shape(), out.device())?.to_dtype(out.dtype())?;
    let objective = |xs: &[Tensor]| -> Result<f64> {
        let y = f(xs)?.to_vec::<f64>()?;
        Ok(y.iter().zip(&weights).map(|(a, b)| a * b).sum())
    };
    let scalar = out.mul(&w)?.sum()?;
    let differentiable: Vec<usize> = (0..inputs.len()).filter(|&i| inputs[i].requires_grad()).collect();
    let wrt: Vec<Tensor> = differentiable.iter().map(|&i| inputs[i].clone()).collect();
    let analytical = grad(&[scalar], &wrt, None, false, false)?;

    for (slot, &i) in differentiable.iter().enumerate() {
        let x = &inputs[i];
        let base = x.to_vec::<f64>()?;
        let got = match &analytical[slot] {
            Some(g) => g.to_vec::<f64>()?,
            None => vec![0.0; base.len()],
        };
        for k in 0..base.len() {
            let shifted = |delta: f64| -> Result<f64> {
                let mut values = base.clone();
                values[k] += delta;
                let mut xs: Vec<Tensor> = inputs.iter().map(Tensor::detach).collect();
                xs[i] = Tensor::from_vec(values, x.shape(), x.device())?;
                crate::autograd::no_grad(|| objective(&xs))
            };
            let numerical = (shifted(options.eps)? - shifted(-options.eps)?) / (2.0 * options.eps);
            let analytic = got[k];
            if (numerical - analytic).abs() > options.atol + options.rtol * numerical.abs() {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!(
                        "gradcheck: input {i} element {k}: autograd gives {analytic:.8e}, finite differences give \
                         {numerical:.8e}"
                    ),
                ));
            }
        }
    }
    Ok(())
}
