//! Elementwise ops: unary functions, binary arithmetic and comparisons (tensor and scalar
//! forms), clamp and where. One generic body per op family; dtypes come from `with_dtype!`.

use super::{for_chunks, map1, map2, unsupported, Kernel, SyncPtr, View};
use crate::element::{Arith, Bool, Element};
use crate::with_dtype;
use genesis_backend_api::sdk::{checks, domain, scalar};
use genesis_backend_api::{BackendError, BinaryOp, DType, Op, OpKind, Result, UnaryOp};

fn claims() -> Vec<(OpKind, DType)> {
    domain::elementwise_claims()
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    let wrong = || BackendError::invalid(format!("{}: wrong number of operands", op.name()));
    match *op {
        Op::Unary(u) => {
            let ([x], [y]) = (inputs, outputs) else { return Err(wrong()) };
            checks::same_shapes(op, &[x, y])?;
            if !u.domain().contains(x.dtype) {
                return Err(unsupported(op, x.dtype));
            }
            let out_dtype = if u == UnaryOp::IsNan { DType::Bool } else { x.dtype };
            checks::expect_dtype(op, "the output", y, out_dtype)?;
            with_dtype!(x.dtype, T => unary::<T>(u, x, y));
        }
        Op::Binary(b) => {
            let ([x, z], [y]) = (inputs, outputs) else { return Err(wrong()) };
            checks::same_shapes(op, &[x, z, y])?;
            checks::expect_dtype(op, "the second operand", z, x.dtype)?;
            if !b.domain().contains(x.dtype) {
                return Err(unsupported(op, x.dtype));
            }
            checks::expect_dtype(op, "the output", y, if b.is_predicate() { DType::Bool } else { x.dtype })?;
            refuse_integer_division_by_zero(op, b, z)?;
            with_dtype!(x.dtype, T => binary::<T>(b, x, Operand::Tensor(z), false, y));
        }
        Op::BinaryScalar { op: b, scalar, scalar_first } => {
            let ([x], [y]) = (inputs, outputs) else { return Err(wrong()) };
            checks::same_shapes(op, &[x, y])?;
            if !b.domain().contains(x.dtype) {
                return Err(unsupported(op, x.dtype));
            }
            checks::expect_dtype(op, "the output", y, if b.is_predicate() { DType::Bool } else { x.dtype })?;
            if scalar_first {
                refuse_integer_division_by_zero(op, b, x)?;
            } else if matches!(b, BinaryOp::Div | BinaryOp::Remainder) && !x.dtype.is_float() {
                // The scalar as the kernel will divide by it (0.5 converts to 0).
                if with_dtype!(x.dtype, T => Element::to_f64(<T as Element>::from_f64(scalar)) == 0.0) {
                    return Err(division_by_zero(op));
                }
            }
            with_dtype!(x.dtype, T => binary::<T>(b, x, Operand::Scalar(scalar), scalar_first, y));
        }
        Op::Clamp { min, max } => {
            let ([x], [y]) = (inputs, outputs) else { return Err(wrong()) };
            checks::same_shapes(op, &[x, y])?;
            checks::expect_dtype(op, "the output", y, x.dtype)?;
            with_dtype!(x.dtype, T => clamp::<T>(x, y, min, max));
        }
        Op::Where => {
            let ([c, a, b], [y]) = (inputs, outputs) else { return Err(wrong()) };
            checks::same_shapes(op, &[c, a, b, y])?;
            checks::expect_dtype(op, "the condition", c, DType::Bool)?;
            checks::expect_dtype(op, "the second operand", b, a.dtype)?;
            checks::expect_dtype(op, "the output", y, a.dtype)?;
            with_dtype!(a.dtype, T => where_::<T>(c, a, b, y));
        }
        _ => return Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
    Ok(())
}

fn unary<T: Element>(op: UnaryOp, x: &View, y: &View) {
    match op {
        UnaryOp::IsNan => map1::<T, Bool>(x, y, |v| Bool(v.compute().is_nan() as u8)),
        // Integer-exact ops stay in the compute type so i64 keeps all its bits.
        // `-1 * x`, not `0 - x`: IEEE negation flips the sign of zero (0 - (+0) is +0), and
        // for integers both wrap the same way.
        UnaryOp::Neg => {
            let minus_one = T::Compute::ZERO.sub(T::Compute::ONE);
            map1::<T, T>(x, y, |v| T::store(minus_one.mul(v.compute())))
        }
        UnaryOp::Square => map1::<T, T>(x, y, |v| T::store(v.compute().mul(v.compute()))),
        UnaryOp::Abs if !T::Compute::IS_FLOAT => map1::<T, T>(x, y, |v| {
            let c = v.compute();
            T::store(if c < T::Compute::ZERO { T::Compute::ZERO.sub(c) } else { c })
        }),
        // Float exp and the functions built on it use the compute type's exp: for f32/f16/bf16
        // a vectorizable one (crate::math) instead of a libm call per element through f64.
        UnaryOp::Exp if T::DTYPE == DType::F32 && x.is_contiguous() && y.is_contiguous() => {
            let (px, py) = (SyncPtr(x.base as *mut f32), SyncPtr(y.base as *mut f32));
            // SAFETY: both views are contiguous f32 of y.numel() elements (checked by the
            // dispatch), and an output that overlaps its input is the input itself.
            for_chunks(y.numel(), true, |s, e| unsafe {
                crate::math::exp_f32_run(px.get().add(s), py.get().add(s), e - s)
            });
        }
        UnaryOp::Exp if T::Compute::IS_FLOAT => map1::<T, T>(x, y, |v| T::store(v.compute().exp())),
        UnaryOp::Sigmoid if T::Compute::IS_FLOAT => map1::<T, T>(x, y, |v| {
            let one = T::Compute::ONE;
            T::store(one.div(one.add(T::Compute::ZERO.sub(v.compute()).exp())))
        }),
        UnaryOp::Silu if T::Compute::IS_FLOAT => map1::<T, T>(x, y, |v| {
            let (one, c) = (T::Compute::ONE, v.compute());
            T::store(c.div(one.add(T::Compute::ZERO.sub(c).exp())))
        }),
        _ => map1::<T, T>(x, y, |v| T::from_f64(scalar::unary(op, v.to_f64()))),
    }
}

/// Integer division and remainder by zero raise, as PyTorch's CPU ops do ("ZeroDivisionError");
/// float division follows IEEE (inf, NaN).
fn refuse_integer_division_by_zero(op: &Op, b: BinaryOp, divisor: &View) -> Result<()> {
    if !matches!(b, BinaryOp::Div | BinaryOp::Remainder) || divisor.dtype.is_float() {
        return Ok(());
    }
    let zero = with_dtype!(divisor.dtype, T => super::fused::dense::<T>(op, divisor)?.iter().any(|&v| Element::to_f64(v) == 0.0));
    if zero {
        return Err(division_by_zero(op));
    }
    Ok(())
}

fn division_by_zero(op: &Op) -> BackendError {
    BackendError::invalid(format!("{}: integer division by zero (ZeroDivisionError)", op.name()))
}

enum Operand<'a> {
    Tensor(&'a View),
    Scalar(f64),
}

fn binary<T: Element>(op: BinaryOp, x: &View, other: Operand, scalar_first: bool, y: &View) {
    // The common arithmetic gets loops of its own: with the op fixed at compile time the loop
    // vectorizes, while the `match` on it inside the generic closure below keeps it scalar
    // (benches/RESULTS.md: a contiguous f32 add ran 2.9x faster for it).
    match op {
        BinaryOp::Add => return arith::<T>(x, other, scalar_first, y, |a, b| a.add(b)),
        BinaryOp::Sub => return arith::<T>(x, other, scalar_first, y, |a, b| a.sub(b)),
        BinaryOp::Mul => return arith::<T>(x, other, scalar_first, y, |a, b| a.mul(b)),
        BinaryOp::Div => return arith::<T>(x, other, scalar_first, y, |a, b| a.div(b)),
        _ => {}
    }
    let f = move |a: T::Compute, b: T::Compute| -> T::Compute {
        match op {
            BinaryOp::Add => a.add(b),
            BinaryOp::Sub => a.sub(b),
            BinaryOp::Mul => a.mul(b),
            BinaryOp::Div => a.div(b),
            BinaryOp::Pow => a.pow(b),
            BinaryOp::Remainder => a.rem(b),
            BinaryOp::Maximum => {
                if a.is_nan() || a > b {
                    a
                } else {
                    b
                }
            }
            BinaryOp::Minimum => {
                if a.is_nan() || a < b {
                    a
                } else {
                    b
                }
            }
            _ => unreachable!("predicates are handled below"),
        }
    };
    let zero = T::Compute::ZERO;
    let p = move |a: T::Compute, b: T::Compute| -> Bool {
        Bool(match op {
            BinaryOp::Eq => a == b,
            BinaryOp::Ne => a != b,
            BinaryOp::Lt => a < b,
            BinaryOp::Le => a <= b,
            BinaryOp::Gt => a > b,
            BinaryOp::Ge => a >= b,
            BinaryOp::And => a != zero && b != zero,
            BinaryOp::Or => a != zero || b != zero,
            _ => false,
        } as u8)
    };
    match other {
        Operand::Tensor(z) if op.is_predicate() => map2::<T, T, Bool>(x, z, y, |a, b| p(a.compute(), b.compute())),
        Operand::Tensor(z) => map2::<T, T, T>(x, z, y, |a, b| T::store(f(a.compute(), b.compute()))),
        Operand::Scalar(s) => {
            let s = T::from_f64(s).compute();
            let order = move |a: T::Compute| if scalar_first { (s, a) } else { (a, s) };
            if op.is_predicate() {
                map1::<T, Bool>(x, y, |a| {
                    let (l, r) = order(a.compute());
                    p(l, r)
                })
            } else {
                map1::<T, T>(x, y, |a| {
                    let (l, r) = order(a.compute());
                    T::store(f(l, r))
                })
            }
        }
    }
}

/// `y = f(x, other)` (or `f(scalar, x)` when `scalar_first`) for one arithmetic op `f`.
fn arith<T: Element>(
    x: &View,
    other: Operand,
    scalar_first: bool,
    y: &View,
    f: impl Fn(T::Compute, T::Compute) -> T::Compute + Sync,
) {
    match other {
        Operand::Tensor(z) => map2::<T, T, T>(x, z, y, |a, b| T::store(f(a.compute(), b.compute()))),
        Operand::Scalar(s) => {
            let s = T::from_f64(s).compute();
            if scalar_first {
                map1::<T, T>(x, y, |a| T::store(f(s, a.compute())))
            } else {
                map1::<T, T>(x, y, |a| T::store(f(a.compute(), s)))
            }
        }
    }
}

fn clamp<T: Element>(x: &View, y: &View, min: f64, max: f64) {
    map1::<T, T>(x, y, |v| {
        let c = v.to_f64();
        if c.is_nan() {
            v
        } else {
            T::from_f64(c.max(min).min(max))
        }
    });
}

fn where_<T: Element>(c: &View, a: &View, b: &View, y: &View) {
    // SAFETY: all four views are bounds-checked and have one shape.
    unsafe {
        for (((ic, ia), ib), iy) in c.offsets().zip(a.offsets()).zip(b.offsets()).zip(y.offsets()) {
            let pick = (*c.at::<Bool>(ic)).0 != 0;
            *y.at::<T>(iy) = if pick { *a.at::<T>(ia) } else { *b.at::<T>(ib) };
        }
    }
}

inventory::submit! { Kernel { claims, run } }
