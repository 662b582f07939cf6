//! Scalar functions in f64: the elementwise part of the oracle.
//!
//! The suites check the backends against this file, and the CPU and example backends compute
//! their unary ops (the example its binary ops too) with the SDK's `sdk::scalar`: where a
//! result depends on the algorithm (erf, GELU, sigmoid) this file has its own, so the two are
//! checked against each other; its erf is a series of its own, not `libm`'s.

use genesis_backend_api::sdk::scalar;
use genesis_backend_api::{BinaryOp, UnaryOp};

const FRAC_2_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;

/// The error function, to ~1e-15 absolute: a Taylor series below 2.5, the complement's
/// continued fraction above.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() < 2.5 {
        // erf(x) = 2/√π · Σ (-1)^n x^(2n+1) / (n! (2n+1)); terms shrink fast enough here.
        let (mut term, mut sum, x2) = (x, x, x * x);
        for n in 1..200 {
            term *= -x2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        FRAC_2_SQRT_PI * sum
    } else {
        x.signum() * (1.0 - erfc_tail(x.abs()))
    }
}

/// The complementary error function, accurate in relative terms for large positive `x`.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        x
    } else if x >= 2.5 {
        erfc_tail(x)
    } else if x <= -2.5 {
        2.0 - erfc_tail(-x)
    } else {
        1.0 - erf(x)
    }
}

/// erfc(x) for x ≥ 2.5 by the continued fraction
/// `e^{-x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`, evaluated from the tail.
fn erfc_tail(x: f64) -> f64 {
    if x.is_infinite() {
        return 0.0;
    }
    let mut f = x;
    for k in (1..=80).rev() {
        f = x + (k as f64 / 2.0) / f;
    }
    (-x * x).exp() / (std::f64::consts::PI.sqrt() * f)
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `op(x)` exactly as the interface defines it, in f64.
///
/// The functions whose value depends on how they are computed (erf and GELU through this
/// file's own series, sigmoid and SiLU in the form that cannot overflow) and ReLU's sign of
/// zero are computed here, independently of the backends under test. The rest are one call
/// of the standard library or a comparison, the same in any implementation, and are
/// `sdk::scalar`'s definitions.
pub fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Relu => {
            if x.is_nan() {
                x
            } else {
                x.max(0.0)
            }
        }
        // 0.5·x·erfc(-x/√2) avoids the cancellation of 1 + erf for negative x.
        UnaryOp::Gelu => 0.5 * x * erfc(-x / std::f64::consts::SQRT_2),
        UnaryOp::GeluTanh => {
            let z = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            0.5 * x * (1.0 + z.tanh())
        }
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Erf => erf(x),
        _ => scalar::unary(op, x),
    }
}

/// `op(a, b)` for float operands, in f64 (comparisons and logical ops give 0 or 1): each is
/// one operation or comparison, the same in any implementation, so it is the SDK's definition.
pub use scalar::binary;

/// `op(a, b)` for integer operands: division truncates, remainder follows the divisor's sign.
pub fn binary_int(op: BinaryOp, a: f64, b: f64) -> f64 {
    let (x, y) = (a as i64, b as i64);
    match op {
        BinaryOp::Div => x.checked_div(y).map(|q| q as f64).unwrap_or(f64::NAN),
        BinaryOp::Remainder => {
            x.checked_rem(y).map(|r| if r != 0 && (r < 0) != (y < 0) { r + y } else { r } as f64).unwrap_or(f64::NAN)
        }
        _ => binary(op, a, b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    // Reference values from the closed forms in Abramowitz & Stegun tables (7.1).
    #[rstest]
    #[case(0.5, 0.5204998778130465)]
    #[case(1.0, 0.8427007929497149)]
    #[case(2.0, 0.9953222650189527)]
    #[case(3.0, 0.9999779095030014)]
    #[case(-1.0, -0.8427007929497149)]
    fn erf_known_values(#[case] x: f64, #[case] expected: f64) {
        assert!((erf(x) - expected).abs() < 1e-14, "erf({x}) = {}", erf(x));
    }

    #[rstest]
    #[case(3.0, 2.209049699858544e-05)]
    #[case(5.0, 1.537459794428035e-12)]
    fn erfc_tail_is_relatively_accurate(#[case] x: f64, #[case] expected: f64) {
        assert!((erfc(x) / expected - 1.0).abs() < 1e-13, "erfc({x}) = {}", erfc(x));
    }

    #[rstest]
    fn erf_is_continuous_at_the_switch() {
        assert!((erf(2.5 - 1e-12) - erf(2.5)).abs() < 1e-12);
    }

    #[rstest]
    fn remainder_takes_the_divisor_sign() {
        assert_eq!(binary(BinaryOp::Remainder, -7.0, 3.0), 2.0);
        assert_eq!(binary(BinaryOp::Remainder, 7.0, -3.0), -2.0);
        assert_eq!(binary_int(BinaryOp::Remainder, -7.0, 3.0), 2.0);
        assert_eq!(binary_int(BinaryOp::Div, -7.0, 2.0), -3.0);
    }
}
