//! Test-only: the SDK's required set (`sdk::required`) checked against what the core issues.
//! A recorder notes the `(op, dtype)` of every op the calling thread issues, and while it
//! records, the device claims only the required set (`Device::supports` says no to every
//! fused op), so the composites run as they would on a backend that claims nothing else.
//! The basic workflow the set is defined by must then issue exactly the set.

use crate::error::Result;
use crate::nn::functional::{mse_loss, Reduction};
use crate::optim::{Adam, AdamOptions, AdamW, Optimizer, SgdOptions, SGD};
use crate::tensor::Tensor;
use crate::Device;
use genesis_backend_api::sdk::required;
use genesis_backend_api::{DType, Op, OpKind, TensorDesc};
use std::cell::RefCell;
use std::collections::BTreeSet;

/// What a recording holds: the claims the device pretends to have, and the `(kind code,
/// dtype code)` pairs issued so far.
struct Recording {
    allowed: Vec<(OpKind, DType)>,
    issued: BTreeSet<(u32, u32)>,
}

thread_local! {
    static RECORDING: RefCell<Option<Recording>> = const { RefCell::new(None) };
}

/// Note an op about to run (from `ops::exec_views`): its kind and the dtype of its first
/// input, or of its output when it has no input, as capabilities name them.
pub(crate) fn record(op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) {
    let Some(first) = inputs.first().or(outputs.first()) else { return };
    RECORDING.with(|r| {
        if let Some(rec) = r.borrow_mut().as_mut() {
            rec.issued.insert((op.kind().0, first.dtype));
        }
    });
}

/// While recording: whether `op` on `dtype` is in the claims the device pretends to have
/// (`None` when not recording).
pub(crate) fn claimed(op: &Op, dtype: DType) -> Option<bool> {
    RECORDING.with(|r| r.borrow().as_ref().map(|rec| rec.allowed.contains(&(op.kind(), dtype))))
}

/// Run `f` with the device claiming only `allowed`; returns the pairs it issued.
fn recording(allowed: Vec<(OpKind, DType)>, f: impl FnOnce() -> Result<()>) -> Result<BTreeSet<(u32, u32)>> {
    RECORDING.with(|r| *r.borrow_mut() = Some(Recording { allowed, issued: BTreeSet::new() }));
    let result = f();
    let issued = RECORDING.with(|r| r.borrow_mut().take()).map(|rec| rec.issued).unwrap_or_default();
    result.map(|()| issued)
}

/// The workflow `sdk::required` describes, in `dtype`: making, copying and converting
/// tensors, arithmetic, reductions, matmul, a backward pass through all of them (max and
/// min included) and the updates of SGD with momentum, Adam and AdamW.
fn basic_workflow(dtype: DType) -> Result<()> {
    let dev = Device::cpu()?;
    // Tensors.
    let ones = Tensor::ones(&[2, 3], dtype, &dev)?;
    let uniform = Tensor::rand(&[3, 2], dtype, &dev)?;
    let normal = Tensor::randn(&[3, 2], dtype, &dev)?;
    let transposed = normal.t()?.contiguous()?;
    let _clone = uniform.copy()?;
    let other = if dtype == DType::F64 { DType::F32 } else { DType::F64 };
    let _converted = uniform.to_dtype(other)?;
    // Arithmetic, with tensors and with scalars.
    let a = ones.add(&transposed)?.sub(&ones)?.mul(&transposed)?.div(&ones)?;
    let b = a.add_scalar(1.0)?.sub_scalar(2.0)?.mul_scalar(3.0)?.div_scalar(4.0)?.neg()?;
    // Reductions.
    for r in [b.sum()?, b.max()?, b.min()?, b.prod_dims(&[1], false)?] {
        r.to_vec::<f64>()?;
    }
    // Indices are i64; read as such, they need no op.
    for r in [b.argmax(Some(1), false)?, b.argmin(None, false)?] {
        r.to_vec::<i64>()?;
    }
    // A model, a loss with every reduction's gradient in it, and three optimizers.
    let x = Tensor::randn(&[8, 3], dtype, &dev)?;
    let target = Tensor::randn(&[8, 2], dtype, &dev)?;
    let w = Tensor::randn(&[3, 2], dtype, &dev)?.requires_grad_(true)?;
    let bias = Tensor::zeros(&[2], dtype, &dev)?.requires_grad_(true)?;
    let params = vec![w.clone(), bias.clone()];
    let mut sgd = SGD::new(params.clone(), SgdOptions { lr: 0.1, momentum: 0.9, ..Default::default() })?;
    let mut adam = Adam::new(params.clone(), AdamOptions::default())?;
    let mut adamw = AdamW::new(params, AdamOptions::adamw())?;
    for step in 0..2 {
        let y = x.matmul(&w)?.add(&bias)?;
        let extremes = y.max_dims(&[1], false)?.sum()?.sub(&y.min_dims(&[0], false)?.mean()?)?;
        let loss = mse_loss(&y, &target, Reduction::Mean)?.add(&extremes.mul_scalar(0.01)?)?;
        loss.backward()?;
        sgd.step()?;
        if step == 1 {
            adam.step()?;
            adamw.step()?;
        }
        sgd.zero_grad();
    }
    Ok(())
}

fn names(pairs: &BTreeSet<(u32, u32)>) -> Vec<String> {
    pairs
        .iter()
        .map(|&(op, d)| {
            let dtype = DType::from_code(d).map_or_else(|_| format!("dtype {d}"), |d| d.to_string());
            format!("{} {dtype}", OpKind(op).name().unwrap_or("unknown"))
        })
        .collect()
}

#[test]
fn the_basic_workflow_issues_exactly_the_required_set() {
    for dtype in DType::FLOATS {
        let set = required::pairs(dtype);
        let issued = recording(set.clone(), || basic_workflow(dtype))
            .unwrap_or_else(|e| panic!("the workflow in {dtype} failed: {e}"));
        let expected: BTreeSet<(u32, u32)> = set.iter().map(|&(op, d)| (op.0, d as u32)).collect();
        let beyond: BTreeSet<_> = issued.difference(&expected).copied().collect();
        let unused: BTreeSet<_> = expected.difference(&issued).copied().collect();
        assert!(beyond.is_empty(), "{dtype}: the core issued pairs outside the required set: {:?}", names(&beyond));
        assert!(unused.is_empty(), "{dtype}: required pairs the workflow never issued: {:?}", names(&unused));
    }
}
