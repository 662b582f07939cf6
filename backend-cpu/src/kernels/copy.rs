//! Copy, cast, fill and arange.

use super::{map1, unsupported, Kernel, View};
use crate::element::Element;
use crate::with_dtype;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result};

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::Copy, Op::Cast, Op::Fill { value: 0.0 }, Op::Arange { start: 0.0, step: 1.0 }])
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match *op {
        Op::Copy | Op::Cast => {
            let ([x], [y]) = (inputs, outputs) else { return Err(arity(op)) };
            if x.shape != y.shape {
                return Err(BackendError::shape(format!(
                    "{}: shapes {:?} and {:?} differ",
                    op.name(),
                    x.shape,
                    y.shape
                )));
            }
            if *op == Op::Copy && x.dtype != y.dtype {
                return Err(BackendError::dtype(format!("copy: {} to {} needs cast", x.dtype, y.dtype)));
            }
            with_dtype!(x.dtype, A => with_dtype!(y.dtype, O => cast::<A, O>(x, y)));
            Ok(())
        }
        Op::Fill { value } => {
            let ([], [y]) = (inputs, outputs) else { return Err(arity(op)) };
            with_dtype!(y.dtype, T => fill::<T>(y, value));
            Ok(())
        }
        Op::Arange { start, step } => {
            let ([], [y]) = (inputs, outputs) else { return Err(arity(op)) };
            if y.shape.len() != 1 {
                return Err(BackendError::shape(format!("arange: output must be rank 1, got {:?}", y.shape)));
            }
            with_dtype!(y.dtype, T => arange::<T>(y, start, step));
            Ok(())
        }
        _ => Err(unsupported(op, inputs.first().or(outputs.first()).map_or(DType::F32, |v| v.dtype))),
    }
}

fn arity(op: &Op) -> BackendError {
    BackendError::invalid(format!("{}: wrong number of operands", op.name()))
}

fn cast<A: Element, O: Element>(x: &View, y: &View) {
    if A::DTYPE == O::DTYPE {
        map1::<A, A>(x, y, |v| v);
    } else if O::DTYPE == DType::Bool {
        map1::<A, O>(x, y, |v| O::from_f64((v.to_f64() != 0.0) as u8 as f64));
    } else if A::DTYPE.is_int() && O::DTYPE.is_int() {
        // Integer to integer wraps (the low bits), as in PyTorch; exact for every i64.
        map1::<A, O>(x, y, |v| O::from_integer(v.integer().unwrap_or(0)));
    } else {
        map1::<A, O>(x, y, |v| O::from_f64(v.to_f64()));
    }
}

fn fill<T: Element>(y: &View, value: f64) {
    let v = if T::DTYPE == DType::Bool { T::from_f64((value != 0.0) as u8 as f64) } else { T::from_f64(value) };
    // SAFETY: the view is bounds-checked; offsets come from its geometry.
    unsafe {
        for o in y.offsets() {
            *y.at::<T>(o) = v;
        }
    }
}

fn arange<T: Element>(y: &View, start: f64, step: f64) {
    // SAFETY: as in `fill`.
    unsafe {
        for (i, o) in y.offsets().enumerate() {
            *y.at::<T>(o) = T::from_f64(start + i as f64 * step);
        }
    }
}

inventory::submit! { Kernel { claims, run } }
