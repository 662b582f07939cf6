//! Suite `data`: strided copy, cast, fill and arange (everything later suites lean on).

use super::{no_deps, op_cases};
use crate::case::{Case, OpCase, Tier};
use crate::gen::{special_values, tensor, ValueRange};
use crate::target::{Layout, Spec, Target};
use crate::tolerance::Expected;
use crate::values::{cast_value, quantize, quantize_all, short_name, FLOATS};
use genesis_backend_api::{DType, Op};

fn copy_case(input: Spec, out_layout: Layout) -> OpCase {
    let expected = Expected::exact_signed(input.dtype, input.values.clone());
    let out = Spec::out(input.dtype, &input.shape).with_layout(out_layout);
    OpCase::single(Op::Copy, vec![input], out, expected)
}

pub fn cases(t: &Target) -> Vec<Case> {
    let all = DType::ALL;
    let mut cases = op_cases(t, "data", "copy", Op::Copy.kind(), &all, &no_deps, &|dtype, rng| {
        let r = ValueRange::normal(20.0);
        let c = Layout::Contiguous;
        let mut v = vec![
            ("contig".to_string(), Tier::Smoke, copy_case(tensor(rng, dtype, &[7, 5], c, r), c)),
            ("noncontig_in".into(), Tier::Core, copy_case(tensor(rng, dtype, &[6, 11], Layout::Transposed, r), c)),
            ("strided_in".into(), Tier::Core, copy_case(tensor(rng, dtype, &[3, 4, 9], Layout::Strided, r), c)),
            (
                "offset_in_strided_out".into(),
                Tier::Core,
                copy_case(tensor(rng, dtype, &[5, 8], Layout::Offset, r), Layout::Strided),
            ),
            ("broadcast_in".into(), Tier::Core, copy_case(tensor(rng, dtype, &[4, 6], Layout::Broadcast(0), r), c)),
            ("transposed_out".into(), Tier::Core, copy_case(tensor(rng, dtype, &[9, 7], c, r), Layout::Transposed)),
            // Row-strided views with unit-stride rows (a backend may move such rows in words
            // wider than an element): rows of 16 elements, and of 6 (12 to 48 bytes).
            ("half_rows_in".into(), Tier::Core, copy_case(tensor(rng, dtype, &[6, 16], Layout::HalfRows, r), c)),
            ("half_rows_out".into(), Tier::Core, copy_case(tensor(rng, dtype, &[5, 6], c, r), Layout::HalfRows)),
            ("scalar".into(), Tier::Core, copy_case(tensor(rng, dtype, &[], c, r), c)),
            ("empty".into(), Tier::Core, copy_case(tensor(rng, dtype, &[3, 0], c, r), c)),
            ("large".into(), Tier::Full, copy_case(tensor(rng, dtype, &[257, 129], Layout::Transposed, r), c)),
        ];
        if dtype.is_float() {
            let specials = quantize_all(dtype, &special_values(dtype));
            let n = specials.len();
            v.push(("special".into(), Tier::Core, copy_case(Spec::new(dtype, &[n], specials), Layout::Strided)));
        }
        v
    });

    // Cast from each dtype to every dtype the backend casts from (the claim names the input).
    let targets: Vec<DType> = all.iter().copied().filter(|&d| t.claims(Op::Cast.kind(), d)).collect();
    cases.extend(op_cases(t, "data", "cast", Op::Cast.kind(), &all, &no_deps, &|dtype, rng| {
        let dests = if targets.is_empty() { vec![dtype] } else { targets.clone() };
        dests
            .iter()
            .map(|&to| {
                let mut x = tensor(rng, dtype, &[5, 7], Layout::Transposed, ValueRange::normal(60.0));
                if dtype.is_float() && to.is_float() {
                    let specials = quantize_all(dtype, &special_values(dtype));
                    x = Spec::new(dtype, &[x.values.len() + specials.len()], [x.values, specials].concat());
                }
                let expected: Vec<f64> = x.values.iter().map(|&v| cast_value(dtype, to, v)).collect();
                let exp =
                    if to.is_float() { Expected::exact_signed(to, expected) } else { Expected::exact(to, expected) };
                let out = Spec::out(to, &x.shape);
                (format!("to_{}", short_name(to)), Tier::Core, OpCase::single(Op::Cast, vec![x], out, exp))
            })
            .collect()
    }));

    cases.extend(op_cases(t, "data", "fill", Op::Fill { value: 0.0 }.kind(), &all, &no_deps, &|dtype, _| {
        let values: Vec<f64> = match dtype {
            DType::Bool => vec![1.0, 0.0],
            DType::U8 => vec![200.0, 0.0],
            d if d.is_int() => vec![-7.0, 42.0],
            d => vec![1.5, -0.0, f64::NAN, f64::NEG_INFINITY, crate::values::min_subnormal(d)],
        };
        values
            .into_iter()
            .enumerate()
            .map(|(i, value)| {
                let shape = if i == 0 { vec![37] } else { vec![4, 6] };
                let layout = if i == 0 { Layout::Contiguous } else { Layout::Strided };
                let n: usize = shape.iter().product();
                let exp = Expected::exact_signed(dtype, vec![quantize(dtype, value); n]);
                let out = Spec::out(dtype, &shape).with_layout(layout);
                (format!("value{i}"), Tier::Core, OpCase::single(Op::Fill { value }, vec![], out, exp))
            })
            .collect()
    }));

    let arange_domain = [FLOATS.as_slice(), &[DType::I64, DType::I32]].concat();
    cases.extend(op_cases(
        t,
        "data",
        "arange",
        Op::Arange { start: 0.0, step: 0.0 }.kind(),
        &arange_domain,
        &no_deps,
        &|dtype, _| {
            let (start, step) = if dtype.is_float() { (0.5, 0.25) } else { (-3.0, 2.0) };
            [
                (37usize, Layout::Contiguous, "n37"),
                (20, Layout::Strided, "strided_out"),
                (0, Layout::Contiguous, "empty"),
            ]
            .into_iter()
            .map(|(n, layout, name)| {
                let values: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
                let exp = Expected::correctly_rounded(dtype, values);
                let out = Spec::out(dtype, &[n]).with_layout(layout);
                (name.to_string(), Tier::Core, OpCase::single(Op::Arange { start, step }, vec![], out, exp))
            })
            .collect()
        },
    ));
    cases
}
