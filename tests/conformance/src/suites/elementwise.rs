//! Suite `elementwise`: unary, binary, binary-with-scalar, clamp and where.

use super::{no_deps, op_cases};
use crate::case::{Case, OpCase, Tier};
use crate::gen::{elementwise_samples, tensor, ValueRange};
use crate::oracle::scalar::{binary, binary_int, unary};
use crate::target::{Layout, Spec, Target};
use crate::tolerance::Expected;
use crate::values::{quantize, ulp, FLOATS};
use genesis_backend_api::{BinaryOp, DType, Op, OpKind, UnaryOp};

const INTS: [DType; 2] = [DType::I64, DType::I32];

fn unary_domain(op: UnaryOp) -> Vec<DType> {
    match op {
        UnaryOp::Not => vec![DType::Bool],
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Square | UnaryOp::Sign | UnaryOp::Relu => [&FLOATS[..], &INTS].concat(),
        _ => FLOATS.to_vec(),
    }
}

/// The accuracy class of a unary op (NUMERICS.md).
fn unary_expected(op: UnaryOp, dtype: DType, values: Vec<f64>) -> Expected {
    use UnaryOp::*;
    match op {
        Neg | Abs => Expected::exact_signed(dtype, values),
        Relu | Sign | Floor | Ceil | Round | Not | IsNan => Expected::exact(dtype, values),
        Sqrt | Recip | Square => Expected::correctly_rounded(dtype, values),
        // 1 + erf / 1 + tanh cancel for negative inputs: errors are measured at |result| ≥ 1.
        Gelu | GeluTanh => Expected::transcendental(dtype, values, 1.0),
        _ => Expected::transcendental(dtype, values, 0.0),
    }
}

fn positive_domain(op: UnaryOp) -> bool {
    matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Log1p)
}

fn binary_domain(op: BinaryOp) -> Vec<DType> {
    match op {
        BinaryOp::And | BinaryOp::Or => vec![DType::Bool],
        BinaryOp::Pow => FLOATS.to_vec(),
        _ => [&FLOATS[..], &INTS].concat(),
    }
}

fn binary_expected(op: BinaryOp, dtype: DType, a: &[f64], b: &[f64], scalar_first: bool) -> Expected {
    let f = |x: f64, y: f64| {
        let (x, y) = if scalar_first { (y, x) } else { (x, y) };
        if dtype.is_float() {
            binary(op, x, y)
        } else {
            binary_int(op, x, y)
        }
    };
    let values: Vec<f64> = a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
    if op.is_predicate() {
        return Expected::exact(DType::Bool, values);
    }
    match op {
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div => Expected::correctly_rounded(dtype, values),
        BinaryOp::Maximum | BinaryOp::Minimum => Expected::exact(dtype, values),
        BinaryOp::Pow => Expected::transcendental(dtype, values, 0.0),
        _ => {
            // Remainder: exact in principle, but `a - b·floor(a/b)` is a valid implementation
            // whose error scales with the operands: 2 ULP of max(|a|, |b|).
            let mut e = Expected::correctly_rounded(dtype, values);
            if dtype.is_float() {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    e.allowed[i] = e.allowed[i].max(2.0 * ulp(dtype, x.abs().max(y.abs())));
                }
                e.describe = "2 ulp of max(|a|, |b|)".into();
            }
            e
        }
    }
}

fn range_for_binary(op: BinaryOp, dtype: DType) -> ValueRange {
    let mut r = ValueRange::normal(if dtype.is_float() { 3.0 } else { 40.0 });
    if matches!(op, BinaryOp::Div | BinaryOp::Remainder) && !dtype.is_float() {
        r.nonzero = true;
    }
    if op == BinaryOp::Pow {
        r.positive = true;
    }
    r
}

pub fn cases(t: &Target) -> Vec<Case> {
    let mut cases = Vec::new();
    for &u in UnaryOp::ALL {
        cases.extend(op_cases(
            t,
            "elementwise",
            u.name(),
            OpKind::unary(u),
            &unary_domain(u),
            &no_deps,
            &|dtype, rng| {
                let mut range = ValueRange::normal(if dtype.is_float() { 3.0 } else { 40.0 });
                range.positive = positive_domain(u);
                let out_dtype = if matches!(u, UnaryOp::IsNan) { DType::Bool } else { dtype };
                elementwise_samples(rng, dtype, 1, range)
                    .into_iter()
                    .map(|s| {
                        let values = s.inputs[0].values.iter().map(|&x| unary(u, x)).collect();
                        let exp = unary_expected(u, out_dtype, values);
                        let out = Spec::out(out_dtype, &s.out_shape).with_layout(s.out_layout);
                        (s.name, s.tier, OpCase::single(Op::Unary(u), s.inputs, out, exp))
                    })
                    .collect()
            },
        ));
    }
    for &b in BinaryOp::ALL {
        let out_dtype = |d: DType| if b.is_predicate() { DType::Bool } else { d };
        cases.extend(op_cases(
            t,
            "elementwise",
            b.name(),
            OpKind::binary(b),
            &binary_domain(b),
            &no_deps,
            &|dtype, rng| {
                elementwise_samples(rng, dtype, 2, range_for_binary(b, dtype))
                    .into_iter()
                    .map(|s| {
                        let exp = binary_expected(b, dtype, &s.inputs[0].values, &s.inputs[1].values, false);
                        let out = Spec::out(out_dtype(dtype), &s.out_shape).with_layout(s.out_layout);
                        (s.name, s.tier, OpCase::single(Op::Binary(b), s.inputs, out, exp))
                    })
                    .collect()
            },
        ));
        let name = format!("{}_scalar", b.name());
        cases.extend(op_cases(
            t,
            "elementwise",
            &name,
            OpKind::binary_scalar(b),
            &binary_domain(b),
            &no_deps,
            &|dtype, rng| {
                let range = range_for_binary(b, dtype);
                let scalar = quantize(dtype, if dtype == DType::Bool { 1.0 } else { 2.5 });
                [(false, Layout::Contiguous, "tensor_op_scalar"), (true, Layout::Transposed, "scalar_op_tensor")]
                    .into_iter()
                    .map(|(scalar_first, layout, sample)| {
                        let mut x = tensor(rng, dtype, &[7, 9], layout, range);
                        if scalar_first && range.nonzero {
                            x.values.iter_mut().filter(|v| **v == 0.0).for_each(|v| *v = 1.0);
                        }
                        let s = vec![scalar; x.values.len()];
                        let exp = binary_expected(b, dtype, &x.values, &s, scalar_first);
                        let out = Spec::out(out_dtype(dtype), &x.shape);
                        let op = Op::BinaryScalar { op: b, scalar, scalar_first };
                        (sample.to_string(), Tier::Core, OpCase::single(op, vec![x], out, exp))
                    })
                    .collect()
            },
        ));
    }
    let clamp_domain = [&FLOATS[..], &INTS].concat();
    cases.extend(op_cases(
        t,
        "elementwise",
        "clamp",
        Op::Clamp { min: 0.0, max: 0.0 }.kind(),
        &clamp_domain,
        &no_deps,
        &|dtype, rng| {
            let range = ValueRange::normal(if dtype.is_float() { 3.0 } else { 40.0 });
            let bounds = [(-1.0, 2.0, "both"), (f64::NEG_INFINITY, 0.5, "max_only"), (-0.5, f64::INFINITY, "min_only")];
            let mut samples = elementwise_samples(rng, dtype, 1, range);
            samples.truncate(bounds.len());
            samples
                .into_iter()
                .zip(bounds)
                .map(|(s, (lo, hi, name))| {
                    let (lo, hi) = if dtype.is_float() {
                        (lo, hi)
                    } else {
                        (lo.max(-1e9).round() * 10.0, hi.min(1e9).round() * 10.0)
                    };
                    let values =
                        s.inputs[0].values.iter().map(|&x| if x.is_nan() { x } else { x.max(lo).min(hi) }).collect();
                    let out = Spec::out(dtype, &s.out_shape).with_layout(s.out_layout);
                    let exp = Expected::exact(dtype, values);
                    (
                        format!("{name}_{}", s.name),
                        s.tier,
                        OpCase::single(Op::Clamp { min: lo, max: hi }, s.inputs, out, exp),
                    )
                })
                .collect()
        },
    ));
    // The interface names the condition's dtype (bool) as the claim; backends that read the
    // claim as the values' dtype are tested with those values too.
    // Only bool is probed for honesty: for other dtypes the claim's meaning is ambiguous.
    let where_domain: Vec<DType> =
        DType::ALL.into_iter().filter(|&d| d == DType::Bool || t.claims(Op::Where.kind(), d)).collect();
    cases.extend(op_cases(t, "elementwise", "where", Op::Where.kind(), &where_domain, &no_deps, &|dtype, rng| {
        let values_dtype = if dtype == DType::Bool { DType::F32 } else { dtype };
        let mut out = Vec::new();
        for (name, layouts) in
            [("contig", [Layout::Contiguous; 3]), ("mixed", [Layout::Transposed, Layout::Broadcast(0), Layout::Offset])]
        {
            let cond = tensor(rng, DType::Bool, &[6, 5], layouts[0], ValueRange::normal(1.0));
            let a = tensor(rng, values_dtype, &[6, 5], layouts[1], ValueRange::normal(3.0));
            let b = tensor(rng, values_dtype, &[6, 5], layouts[2], ValueRange::normal(3.0));
            let values = cond
                .values
                .iter()
                .zip(a.values.iter().zip(&b.values))
                .map(|(&c, (&x, &y))| if c != 0.0 { x } else { y })
                .collect();
            let exp = Expected::exact_signed(values_dtype, values);
            let y = Spec::out(values_dtype, &[6, 5]);
            out.push((name.to_string(), Tier::Core, OpCase::single(Op::Where, vec![cond, a, b], y, exp)));
        }
        out
    }));
    cases
}
