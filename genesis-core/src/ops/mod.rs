//! Tensor ops. Each op is defined once: its forward through backend calls (or a composition
//! of other ops when the backend does not claim a fused kernel) and its backward in terms of
//! other ops, recorded with `autograd::record`. One file per family.

pub(crate) mod attention;
pub(crate) mod conv;
mod convert;
pub(crate) mod dropout;
mod elementwise;
pub(crate) mod fused;
mod index;
pub(crate) mod linear;
pub(crate) mod linear_loss;
pub(crate) mod loss;
mod matmul;
pub(crate) mod norm;
mod reduce;
#[cfg(test)]
pub(crate) mod required_set;
pub(crate) mod rotary;
pub(crate) mod shape;
mod softmax;
pub(crate) mod swiglu;

pub use elementwise::Scalar;
pub(crate) use reduce::reduce_all_into;

use crate::device::Device;
use crate::error::{Error, ErrorKind, Result};
use crate::tensor::{Layout, Tensor};
use genesis_backend_api::{DType, Op};

/// The device all `tensors` live on, or an error naming the op and the devices.
pub(crate) fn common_device<'a>(op: &str, tensors: &[&'a Tensor]) -> Result<&'a Device> {
    let first = tensors[0].device();
    if let Some(other) = tensors.iter().find(|t| t.device() != first) {
        return Err(Error::invalid(format!(
            "{op}: expected all tensors on one device, found {first} and {} (move them with .to(device))",
            other.device()
        )));
    }
    Ok(first)
}

/// Run `op` on `inputs` (each with the layout the backend should see) into `outputs`.
pub(crate) fn exec(op: &Op, inputs: &[(&Tensor, &Layout)], outputs: &[&Tensor]) -> Result<()> {
    let outs: Vec<(&Tensor, &Layout)> = outputs.iter().map(|t| (*t, t.layout())).collect();
    exec_views(op, inputs, &outs)
}

/// [`exec`] with explicit output layouts (in-place ops, coalesced elementwise calls).
pub(crate) fn exec_views(op: &Op, inputs: &[(&Tensor, &Layout)], outputs: &[(&Tensor, &Layout)]) -> Result<()> {
    let device = match (inputs.first(), outputs.first()) {
        (Some((t, _)), _) | (None, Some((t, _))) => t.device(),
        (None, None) => return Ok(()),
    };
    let ins = inputs.iter().map(|(t, l)| t.desc_with(l)).collect::<Result<Vec<_>>>()?;
    let outs = outputs.iter().map(|(t, l)| t.desc_with(l)).collect::<Result<Vec<_>>>()?;
    let _trace = tracing::trace_span!("genesis::op", name = op.name()).entered();
    #[cfg(test)]
    required_set::record(op, &ins, &outs);
    if crate::graph::capturing() {
        crate::graph::keep_alive(inputs.iter().map(|(t, _)| *t).chain(outputs.iter().map(|(t, _)| *t)));
    }
    if !crate::profiler::active() {
        return device.execute(op, &ins, &outs);
    }
    let _span =
        crate::profiler::Span::op(device, op.name(), inputs.iter().map(|(t, l)| (l.shape.as_slice(), t.dtype())));
    device.execute(op, &ins, &outs)
}

/// PyTorch's type promotion for two tensors: bool < integers < floats; within floats the
/// wider wins and f16 with bf16 gives f32; within integers the wider signed type wins.
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    let rank = |d: DType| match d {
        Bool => 0,
        U8 => 1,
        I32 => 2,
        I64 => 3,
        F16 | BF16 => 4,
        F32 => 5,
        F64 => 6,
    };
    match (a, b) {
        (F16, BF16) | (BF16, F16) => F32,
        (U8, _) | (_, U8) if a.is_int() && b.is_int() => {
            // uint8 with a signed type widens to that signed type (i32 or i64).
            if rank(a) > rank(b) {
                a
            } else {
                b
            }
        }
        _ => {
            if rank(a) >= rank(b) {
                a
            } else {
                b
            }
        }
    }
}

/// The dtype of `tensor op scalar`: a scalar only lifts the category (bool → int → float).
pub fn promote_with_scalar(tensor: DType, scalar_is_float: bool, scalar_is_bool: bool) -> DType {
    if scalar_is_float && !tensor.is_float() {
        DType::F32
    } else if !scalar_is_bool && tensor == DType::Bool {
        if scalar_is_float {
            DType::F32
        } else {
            DType::I64
        }
    } else {
        tensor
    }
}

/// Sum `grad` down to `shape` (undoing broadcasting), for the backward of broadcasting ops.
pub(crate) fn sum_to(grad: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if grad.shape() == shape {
        return Ok(grad.clone());
    }
    let lead = grad.rank() - shape.len();
    let mut dims: Vec<isize> = (0..lead as isize).collect();
    for (i, &n) in shape.iter().enumerate() {
        if n == 1 && grad.shape()[lead + i] != 1 {
            dims.push((lead + i) as isize);
        }
    }
    let summed = if dims.is_empty() { grad.clone() } else { grad.sum_dims(&dims, true)? };
    summed.reshape(&shape.iter().map(|&n| n as isize).collect::<Vec<_>>())
}

/// A `ShapeMismatch` error (shapes of operands that do not fit together).
pub(crate) fn shape_err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::ShapeMismatch, message)
}

pub(crate) fn dtype_err(message: String) -> Error {
    Error::new(ErrorKind::DtypeMismatch, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_pytorch() {
        use DType::*;
        assert_eq!(promote_types(F16, BF16), F32);
        assert_eq!(promote_types(I64, F16), F16);
        assert_eq!(promote_types(U8, I32), I32);
        assert_eq!(promote_types(Bool, U8), U8);
        assert_eq!(promote_types(F32, F64), F64);
        assert_eq!(promote_with_scalar(I64, true, false), F32);
        assert_eq!(promote_with_scalar(F16, true, false), F16);
        assert_eq!(promote_with_scalar(I32, false, false), I32);
    }
}
