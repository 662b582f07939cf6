//! Suite `reduce`: sum, mean, max, min, prod, argmax, argmin and cumsum.

use super::{no_deps, op_cases};
use crate::case::{Case, OpCase, Tier};
use crate::gen::{tensor, ValueRange};
use crate::oracle::tensor::{cumsum, reduce_groups, sum};
use crate::target::{Layout, Spec, Target};
use crate::tolerance::Expected;
use crate::values::{quantize, Rng, FLOATS};
use genesis_backend_api::{DType, Op, OpKind, ReduceOp};

fn reduce_one(r: ReduceOp, g: &[f64]) -> f64 {
    let first_index = |better: fn(f64, f64) -> bool| {
        let mut best = 0;
        for (i, &v) in g.iter().enumerate() {
            if g[best].is_nan() {
                break;
            }
            if v.is_nan() || better(v, g[best]) {
                best = i;
            }
        }
        best as f64
    };
    match r {
        ReduceOp::Sum => sum(g),
        ReduceOp::Mean => sum(g) / g.len() as f64,
        ReduceOp::SumSquares => g.iter().map(|v| v * v).sum(),
        ReduceOp::Prod => g.iter().product(),
        ReduceOp::Max => {
            g.iter().fold(f64::NEG_INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) })
        }
        ReduceOp::Min => {
            g.iter().fold(f64::INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) })
        }
        ReduceOp::ArgMax => first_index(|v, b| v > b),
        ReduceOp::ArgMin => first_index(|v, b| v < b),
    }
}

fn reduce_case(r: ReduceOp, x: Spec, reduced: &[bool]) -> OpCase {
    let dtype = x.dtype;
    let groups = reduce_groups(&x.values, &x.shape, reduced);
    let values: Vec<f64> = groups.iter().map(|g| reduce_one(r, g)).collect();
    let k = groups.first().map_or(0, |g| g.len());
    let is_arg = matches!(r, ReduceOp::ArgMax | ReduceOp::ArgMin);
    let exp = match r {
        ReduceOp::Sum | ReduceOp::Mean => {
            let scale = if r == ReduceOp::Mean { 1.0 / k.max(1) as f64 } else { 1.0 };
            let mag: Vec<f64> = groups.iter().map(|g| g.iter().map(|v| v.abs()).sum::<f64>() * scale).collect();
            Expected::accumulated(dtype, values, &mag, k, 1.0)
        }
        // Every term is positive: the sum is its own magnitude.
        ReduceOp::SumSquares => Expected::accumulated(dtype, values.clone(), &values, k, 1.0),
        ReduceOp::Prod => {
            let mag: Vec<f64> = values.iter().map(|v| v.abs() * (k.max(1) as f64).sqrt()).collect();
            Expected::accumulated(dtype, values, &mag, k, 1.0)
        }
        _ if is_arg => Expected::exact(DType::I64, values),
        _ => Expected::exact(dtype, values),
    };
    let out_shape: Vec<usize> = x.shape.iter().zip(reduced).map(|(&n, &r)| if r { 1 } else { n }).collect();
    let out = Spec::out(if is_arg { DType::I64 } else { dtype }, &out_shape);
    OpCase::single(Op::Reduce(r), vec![x], out, exp)
}

fn samples(r: ReduceOp, dtype: DType, rng: &mut Rng) -> Vec<(String, Tier, OpCase)> {
    let range = ValueRange::normal(if dtype.is_float() { 2.0 } else { 20.0 });
    let is_arg = matches!(r, ReduceOp::ArgMax | ReduceOp::ArgMin);
    let mut v = vec![
        (
            "rows".to_string(),
            Tier::Smoke,
            reduce_case(r, tensor(rng, dtype, &[13, 17], Layout::Contiguous, range), &[false, true]),
        ),
        (
            "cols_transposed".into(),
            Tier::Core,
            reduce_case(r, tensor(rng, dtype, &[13, 17], Layout::Transposed, range), &[true, false]),
        ),
        (
            "middle_strided".into(),
            Tier::Core,
            reduce_case(r, tensor(rng, dtype, &[4, 9, 3], Layout::Strided, range), &[false, true, false]),
        ),
        ("long1029".into(), Tier::Core, reduce_case(r, tensor(rng, dtype, &[1029], Layout::Offset, range), &[true])),
    ];
    if !is_arg {
        v.push((
            "all".into(),
            Tier::Core,
            reduce_case(r, tensor(rng, dtype, &[5, 6, 7], Layout::Contiguous, range), &[true, true, true]),
        ));
    }
    if matches!(r, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Mean | ReduceOp::SumSquares) {
        v.push(("empty".into(), Tier::Core, reduce_case(r, Spec::new(dtype, &[3, 0], vec![]), &[false, true])));
    }
    if dtype.is_float() && matches!(r, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin) {
        // Row 0: a NaN (propagates, and arg* picks the first NaN); row 1: a tie (first index).
        let mut x = tensor(rng, dtype, &[3, 8], Layout::Contiguous, range);
        x.values[2] = f64::NAN;
        x.values[5] = f64::NAN;
        x.values[9] = quantize(dtype, 50.0);
        x.values[13] = quantize(dtype, 50.0);
        x.values[10] = quantize(dtype, -50.0);
        x.values[14] = quantize(dtype, -50.0);
        v.push(("nan_and_ties".into(), Tier::Core, reduce_case(r, x, &[false, true])));
    }
    v
}

/// `foreach_sum_squares` of `xs`: each output element the sum of squares of one input.
fn foreach_case(xs: Vec<Spec>) -> OpCase {
    let dtype = xs[0].dtype;
    let values: Vec<f64> = xs.iter().map(|x| x.values.iter().map(|v| v * v).sum()).collect();
    let k = xs.iter().map(|x| x.values.len()).max().unwrap_or(0);
    // Every term is positive: each sum is its own magnitude.
    let exp = Expected::accumulated(dtype, values.clone(), &values, k, 1.0);
    OpCase::single(Op::ForeachSumSquares, xs, Spec::out(dtype, &[values.len()]), exp)
}

/// Dense, strided, broadcast, offset, rank-0 and empty inputs in one list; a list longer than a
/// backend's table (130 inputs); and inputs longer than a chunk.
fn foreach_samples(dtype: DType, rng: &mut Rng) -> Vec<(String, Tier, OpCase)> {
    let range = ValueRange::normal(2.0);
    let mut x = |shape: &[usize], layout| tensor(rng, dtype, shape, layout, range);
    let mixed = vec![
        x(&[13, 17], Layout::Contiguous),
        x(&[], Layout::Contiguous),
        Spec::new(dtype, &[0, 4], vec![]),
        x(&[5, 7], Layout::Transposed),
        x(&[300], Layout::Offset),
        x(&[4, 6, 5], Layout::Broadcast(0)),
        x(&[3, 9], Layout::Strided),
    ];
    let single = vec![x(&[64, 33], Layout::Contiguous)];
    let many: Vec<Spec> = (0..130).map(|i| x(&[1 + (i * 7) % 50], Layout::Contiguous)).collect();
    // Small values, so that f16 sums of 10^5 squares stay finite.
    let small = ValueRange::normal(0.25);
    let long = vec![
        tensor(rng, dtype, &[70_000], Layout::Contiguous, small),
        tensor(rng, dtype, &[65_536], Layout::Offset, small),
        tensor(rng, dtype, &[131_073], Layout::Contiguous, small),
    ];
    vec![
        ("one".to_string(), Tier::Smoke, foreach_case(single)),
        ("mixed_layouts".to_string(), Tier::Core, foreach_case(mixed)),
        ("130_inputs".to_string(), Tier::Full, foreach_case(many)),
        ("longer_than_a_chunk".to_string(), Tier::Full, foreach_case(long)),
    ]
}

pub fn cases(t: &Target) -> Vec<Case> {
    let mut cases = Vec::new();
    for &r in ReduceOp::ALL {
        let domain = match r {
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min => [&FLOATS[..], &[DType::I64]].concat(),
            _ => FLOATS.to_vec(),
        };
        cases.extend(op_cases(t, "reduce", r.name(), OpKind::reduce(r), &domain, &no_deps, &|dtype, rng| {
            samples(r, dtype, rng)
        }));
    }
    cases.extend(op_cases(
        t,
        "reduce",
        "foreach_sum_squares",
        Op::ForeachSumSquares.kind(),
        &FLOATS,
        &no_deps,
        &foreach_samples,
    ));
    let domain = [&FLOATS[..], &[DType::I64]].concat();
    cases.extend(op_cases(t, "reduce", "cumsum", Op::CumSum { dim: 0 }.kind(), &domain, &no_deps, &|dtype, rng| {
        let range = ValueRange::normal(if dtype.is_float() { 2.0 } else { 20.0 });
        [
            (vec![9, 13], 1u32, Layout::Contiguous, "last_dim"),
            (vec![9, 13], 0, Layout::Transposed, "first_dim_transposed"),
            (vec![300], 0, Layout::Offset, "long"),
        ]
        .into_iter()
        .map(|(shape, dim, layout, name)| {
            let x = tensor(rng, dtype, &shape, layout, range);
            let (values, mag) = cumsum(&x.values, &shape, dim as usize);
            let exp = Expected::accumulated(dtype, values, &mag, shape[dim as usize], 1.0);
            let out = Spec::out(dtype, &shape);
            (name.to_string(), Tier::Core, OpCase::single(Op::CumSum { dim }, vec![x], out, exp))
        })
        .collect()
    }));
    cases
}
