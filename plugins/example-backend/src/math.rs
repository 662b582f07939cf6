//! Scalar functions behind the elementwise ops.
//!
//! They take and return f64 although tensors are f32. For `+ - * /` and `sqrt`, rounding the
//! f64 result of f32 operands to f32 gives exactly the f32 answer (f64 has more than twice
//! f32's precision), and for the transcendental functions the extra precision makes the f32
//! result as good as it can be. So one version serves both and no care is needed elsewhere.

use genesis_backend_api::{BinaryOp, UnaryOp};
use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, PI};

pub fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        // Written as a comparison so that NaN (for which it is false) passes through.
        UnaryOp::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        // erfc(-x/√2) rather than 1 + erf(x/√2): for very negative x the latter is a
        // difference of nearly equal numbers and loses all its digits.
        UnaryOp::Gelu => 0.5 * x * erfc(-x * FRAC_1_SQRT_2),
        // FRAC_2_SQRT_PI * FRAC_1_SQRT_2 is sqrt(2/π).
        UnaryOp::GeluTanh => 0.5 * x * (1.0 + (FRAC_2_SQRT_PI * FRAC_1_SQRT_2 * (x + 0.044715 * x * x * x)).tanh()),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Square => x * x,
        // Zeros and NaN are their own sign.
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Erf => erf(x),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Expm1 => x.exp_m1(),
        // Bool-valued: the unary kernel handles these itself and never calls this.
        UnaryOp::Not | UnaryOp::IsNan => f64::NAN,
    }
}

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

/// The error function (Rust's standard library has none on stable).
///
/// Below |x| = 3 the Taylor series converges quickly and is accurate to f64 rounding; beyond
/// it erf is 1 - erfc(|x|) with erfc < 2.3e-5, so the continued fraction's small relative
/// error is negligible there.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        x
    } else if x.abs() < 3.0 {
        erf_series(x)
    } else {
        x.signum() * (1.0 - erfc_continued_fraction(x.abs()))
    }
}

/// The complementary error function 1 - erf(x), without cancellation for large x.
pub fn erfc(x: f64) -> f64 {
    if x < 3.0 {
        // erfc(x) >= erfc(3) here, so 1 - erf(x) keeps at least 11 significant digits.
        1.0 - erf(x)
    } else {
        erfc_continued_fraction(x)
    }
}

/// erf(x) = 2/√π · Σ (-1)^n x^(2n+1) / (n! (2n+1)).
fn erf_series(x: f64) -> f64 {
    let x2 = x * x;
    let mut power = x; // (-1)^n x^(2n+1) / n!
    let mut sum = x;
    for n in 1..100 {
        power *= -x2 / n as f64;
        let term = power / (2 * n + 1) as f64;
        sum += term;
        if term.abs() < 1e-17 * sum.abs() {
            break;
        }
    }
    FRAC_2_SQRT_PI * sum
}

/// erfc(x) for x >= 3 from the continued fraction
/// erfc(x) = e^(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + ...))))),
/// evaluated from the tail; 60 levels are far more than x >= 3 needs.
fn erfc_continued_fraction(x: f64) -> f64 {
    let mut tail = x;
    for k in (1..=60).rev() {
        tail = x + (k as f64 / 2.0) / tail;
    }
    (-x * x).exp() / (PI.sqrt() * tail)
}
