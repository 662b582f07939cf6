//! Scalar functions behind the binary elementwise ops and the reductions; the unary ones are
//! the SDK's (`sdk::scalar`).
//!
//! They take and return f64 although tensors are f32. For `+ - * /`, rounding the f64 result
//! of f32 operands to f32 gives exactly the f32 answer (f64 has more than twice f32's
//! precision), and for `pow` the extra precision makes the f32 result as good as it can be.
//! So one version serves both and no care is needed elsewhere.

use genesis_backend_api::BinaryOp;

/// A binary op; predicates return 1.0 for true and 0.0 for false.
pub fn binary(op: BinaryOp, a: f64, b: f64) -> f64 {
    let truth = |p: bool| if p { 1.0 } else { 0.0 };
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => maximum(a, b),
        BinaryOp::Minimum => minimum(a, b),
        // Python's `%`: Rust's `%` is C's fmod (sign of the dividend), so shift a non-zero
        // result whose sign differs from the divisor's by one divisor.
        BinaryOp::Remainder => {
            let r = a % b;
            if r != 0.0 && (r < 0.0) != (b < 0.0) {
                r + b
            } else {
                r
            }
        }
        BinaryOp::Eq => truth(a == b),
        BinaryOp::Ne => truth(a != b),
        BinaryOp::Lt => truth(a < b),
        BinaryOp::Le => truth(a <= b),
        BinaryOp::Gt => truth(a > b),
        BinaryOp::Ge => truth(a >= b),
        BinaryOp::And => truth(a != 0.0 && b != 0.0),
        BinaryOp::Or => truth(a != 0.0 || b != 0.0),
    }
}

/// The larger of `a` and `b`, NaN if either is NaN (`f64::max` would drop the NaN).
pub fn maximum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The smaller of `a` and `b`, NaN if either is NaN.
pub fn minimum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}
