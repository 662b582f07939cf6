//! Comparison of a backend's output with the oracle, per op class (see NUMERICS.md, the
//! normative contract). Every expected output carries its values and, per element, the
//! largest error it allows.

use crate::values::{quantize, ulp, unit_roundoff};
use genesis_backend_api::DType;

/// The constant `c` of the reduction and contraction bounds.
pub const GROWTH_C: f64 = 4.0;

/// The values one output must hold and how close it must be.
#[derive(Debug, Clone)]
pub struct Expected {
    /// Oracle values (f64, already rounded to ±inf where the exact value overflows the dtype).
    pub values: Vec<f64>,
    /// Allowed absolute error per element (0 for exact classes).
    pub allowed: Vec<f64>,
    /// Whether the sign of a zero must match.
    pub signed_zero: bool,
    /// A description of the tolerance for reports (`"exact"`, `"4 ulp"`, ...).
    pub describe: String,
}

/// Round oracle values to ±inf when they overflow `dtype`, so overflow is expected exactly.
fn overflow_aware(dtype: DType, values: &[f64]) -> Vec<f64> {
    values
        .iter()
        .map(|&r| {
            let q = quantize(dtype, r);
            if r.is_finite() && q.is_infinite() {
                q
            } else {
                r
            }
        })
        .collect()
}

/// u used by the ULP classes: for f64 the oracle is f64 too, so it can only certify ~44 bits.
fn class_ulp(dtype: DType, x: f64) -> f64 {
    if dtype == DType::F64 {
        ulp(dtype, x) * 512.0
    } else {
        ulp(dtype, x)
    }
}

impl Expected {
    /// Bitwise-equal class (copies, comparisons, max/min, indexing, integer math).
    pub fn exact(dtype: DType, values: Vec<f64>) -> Expected {
        let values = if dtype.is_float() { overflow_aware(dtype, &values) } else { values };
        let n = values.len();
        Expected { values, allowed: vec![0.0; n], signed_zero: false, describe: "exact".into() }
    }

    /// Exact, and the sign of zero must match (neg, abs, copy, fill).
    pub fn exact_signed(dtype: DType, values: Vec<f64>) -> Expected {
        let mut e = Expected::exact(dtype, values);
        // Integers have no negative zero; the f64 oracle's -0 is just 0 there.
        e.signed_zero = dtype.is_float();
        e.describe = "exact (signed zero)".into();
        e
    }

    /// Within `n` ULPs (of `dtype`, measured at the exact result, or at `floor` when the
    /// result is smaller: functions with documented cancellation near zero).
    pub fn ulps(dtype: DType, values: Vec<f64>, n: f64, floor: f64) -> Expected {
        if !dtype.is_float() {
            return Expected::exact(dtype, values);
        }
        let values = overflow_aware(dtype, &values);
        let allowed = values.iter().map(|&r| n * class_ulp(dtype, r.abs().max(floor))).collect();
        let describe = if floor > 0.0 { format!("{n} ulp (floor |x|={floor})") } else { format!("{n} ulp") };
        Expected { values, allowed, signed_zero: false, describe }
    }

    /// Correctly rounded ops (add, sub, mul, div, sqrt, casts): 1 ULP of the exact value.
    pub fn correctly_rounded(dtype: DType, values: Vec<f64>) -> Expected {
        Expected::ulps(dtype, values, 1.0, 0.0)
    }

    /// Transcendental functions: 4 ULP in f32, 2 ULP in f16/bf16.
    pub fn transcendental(dtype: DType, values: Vec<f64>, floor: f64) -> Expected {
        let n = if matches!(dtype, DType::F16 | DType::BF16) { 2.0 } else { 4.0 };
        Expected::ulps(dtype, values, n, floor)
    }

    /// Reductions and contractions over `k` terms whose absolute values sum to
    /// `magnitude[i]`: `c·u_acc·√k·magnitude + u·|ref|` (f16/bf16 accumulate in f32).
    pub fn accumulated(dtype: DType, values: Vec<f64>, magnitude: &[f64], k: usize, floor_factor: f64) -> Expected {
        if !dtype.is_float() {
            return Expected::exact(dtype, values);
        }
        let u = unit_roundoff(dtype);
        let u_acc = if dtype == DType::F64 { unit_roundoff(DType::F64) * 512.0 } else { unit_roundoff(DType::F32) };
        let values = overflow_aware(dtype, &values);
        let growth = GROWTH_C * u_acc * (k.max(1) as f64).sqrt();
        let allowed = values
            .iter()
            .zip(magnitude)
            .map(|(&r, &m)| floor_factor * (growth * m + u * r.abs() + crate::values::min_subnormal(dtype)))
            .collect();
        Expected { values, allowed, signed_zero: false, describe: format!("accumulated c={GROWTH_C} K={k}") }
    }

    /// In-place accumulation into an output of `dtype` (scatter_add, index_add): every one of
    /// the `k` additions may round in the output dtype, so the bound is `k·u·magnitude`.
    pub fn accumulated_in_place(dtype: DType, values: Vec<f64>, magnitude: &[f64], k: usize) -> Expected {
        let mut e = Expected::accumulated(dtype, values, magnitude, k, 1.0);
        let u = unit_roundoff(dtype) * if dtype == DType::F64 { 512.0 } else { 1.0 };
        for (a, m) in e.allowed.iter_mut().zip(magnitude) {
            *a = a.max(k as f64 * u * m);
        }
        e.describe = format!("in-place accumulation K={k}: K·u·Σ|terms|");
        e
    }

    /// Fused normalization, softmax, attention: `atol + rtol·|ref|` per dtype, times `factor`
    /// (1 forward, 2 for backward and attention).
    pub fn normalized(dtype: DType, values: Vec<f64>, n: usize, factor: f64) -> Expected {
        let (rtol, atol) = match dtype {
            DType::F32 => (1.3e-6 * (n.max(1) as f64).sqrt(), 1e-5),
            DType::F16 => (1e-3, 1e-3),
            DType::BF16 => (1.6e-2, 1e-3),
            _ => (1e-10 * (n.max(1) as f64).sqrt(), 1e-12),
        };
        let values = overflow_aware(dtype, &values);
        let allowed = values.iter().map(|&r| factor * (atol + rtol * r.abs())).collect();
        Expected {
            values,
            allowed,
            signed_zero: false,
            describe: format!("rtol {:.2e} atol {:.0e}", rtol * factor, atol * factor),
        }
    }
}

/// The worst element of a comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Worst {
    /// Flat (row-major) index.
    pub index: usize,
    /// Oracle value.
    pub expected: f64,
    /// Backend value.
    pub actual: f64,
    /// Allowed absolute error there.
    pub allowed: f64,
}

/// What a comparison found.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Elements compared.
    pub numel: usize,
    /// Elements out of tolerance.
    pub mismatches: usize,
    /// Largest absolute error among finite pairs.
    pub max_abs_err: f64,
    /// The element that is furthest out of tolerance (or the first special-value mismatch).
    pub worst: Option<Worst>,
}

fn mismatch_score(e: f64, a: f64, allowed: f64, signed_zero: bool) -> Option<f64> {
    if e.is_nan() || a.is_nan() {
        return (e.is_nan() != a.is_nan()).then_some(f64::INFINITY);
    }
    if e.is_infinite() || a.is_infinite() {
        return (e != a).then_some(f64::INFINITY);
    }
    if signed_zero && e == 0.0 && a == 0.0 && e.is_sign_negative() != a.is_sign_negative() {
        return Some(f64::INFINITY);
    }
    let err = (a - e).abs();
    (err > allowed).then(|| err / allowed.max(f64::MIN_POSITIVE))
}

/// Compare `actual` with `expected` element by element.
pub fn compare(expected: &Expected, actual: &[f64]) -> Comparison {
    let mut c = Comparison { numel: actual.len(), mismatches: 0, max_abs_err: 0.0, worst: None };
    let mut worst_score = 0.0;
    if actual.len() != expected.values.len() {
        c.mismatches = actual.len().max(expected.values.len());
        return c;
    }
    for (i, (&a, (&e, &allowed))) in actual.iter().zip(expected.values.iter().zip(&expected.allowed)).enumerate() {
        if a.is_finite() && e.is_finite() {
            c.max_abs_err = c.max_abs_err.max((a - e).abs());
        }
        if let Some(score) = mismatch_score(e, a, allowed, expected.signed_zero) {
            c.mismatches += 1;
            if c.worst.is_none() || score > worst_score {
                worst_score = score;
                c.worst = Some(Worst { index: i, expected: e, actual: a, allowed });
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(f64::NAN, f64::NAN, true)]
    #[case(f64::NAN, 1.0, false)]
    #[case(f64::INFINITY, f64::INFINITY, true)]
    #[case(f64::INFINITY, f64::MAX, false)]
    #[case(1.0, 1.0 + f32::EPSILON as f64, true)]
    #[case(1.0, 1.0 + 2.0 * f32::EPSILON as f64, false)]
    fn one_ulp_comparison(#[case] e: f64, #[case] a: f64, #[case] ok: bool) {
        let exp = Expected::correctly_rounded(DType::F32, vec![e]);
        assert_eq!(compare(&exp, &[a]).mismatches == 0, ok);
    }

    #[rstest]
    fn signed_zero_is_checked_only_when_asked() {
        assert_eq!(compare(&Expected::exact(DType::F32, vec![0.0]), &[-0.0]).mismatches, 0);
        assert_eq!(compare(&Expected::exact_signed(DType::F32, vec![0.0]), &[-0.0]).mismatches, 1);
    }

    #[rstest]
    fn overflow_is_expected_as_infinity() {
        let exp = Expected::transcendental(DType::F16, vec![1e6], 0.0);
        assert_eq!(exp.values[0], f64::INFINITY);
        assert_eq!(compare(&exp, &[65504.0]).mismatches, 1);
    }

    #[rstest]
    fn the_worst_element_is_reported() {
        let exp = Expected::exact(DType::F32, vec![1.0, 2.0, 3.0]);
        let c = compare(&exp, &[1.0, 2.5, 7.0]);
        assert_eq!(c.mismatches, 2);
        assert_eq!(c.worst.map(|w| w.index), Some(2));
    }
}
