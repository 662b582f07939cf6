//! Suite `rng`: Philox4x32-10 known answers, (seed, offset) determinism, offsets that shift
//! the stream, distribution statistics, dropout. The interface's generator is counter based:
//! its whole state is (seed, offset), which the core owns, so "state round trip" is the same
//! bits for the same (seed, offset).

use super::memory_deps;
use crate::case::{Case, OpCase, Outcome, Tier};
use crate::target::{Scope, Spec, Target};
use crate::tolerance::Expected;
use crate::values::{quantize, short_name, FLOATS};
use genesis_backend_api::sdk::philox;
use genesis_backend_api::{DType, Op};

/// The Random123 known-answer vectors for Philox4x32-10 (counter, key, output).
const KAT: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
    ([0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
    ([u32::MAX; 4], [u32::MAX; 2], [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
    (
        [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
        [0xa4093822, 0x299f31d0],
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
    ),
];

fn uniform_expected(dtype: DType, seed: u64, offset: u64, n: usize, low: f64, high: f64) -> Vec<f64> {
    (0..n as u64)
        .map(|i| {
            let u = if dtype == DType::F64 {
                philox::uniform_f64(seed, offset, i)
            } else {
                philox::uniform_f32(seed, offset, i) as f64
            };
            quantize(dtype, low + (high - low) * u)
        })
        .collect()
}

fn fill(t: &Target, op: Op, dtype: DType, n: usize) -> Result<Vec<f64>, Box<Outcome>> {
    let mut scope = Scope::new(t);
    let out = scope.place(&Spec::out(dtype, &[n])).map_err(|e| Box::new(Outcome::error(e)))?;
    t.device.execute(&op, &[], &[out.desc]).map_err(|e| Box::new(Outcome::error(format!("{e}"))))?;
    let (values, stray) = scope.fetch(&out).map_err(|e| Box::new(Outcome::error(e)))?;
    if !stray.is_empty() {
        return Err(Box::new(Outcome::fail("a random fill wrote outside its output")));
    }
    Ok(values)
}

pub fn cases(t: &Target) -> Vec<Case> {
    let mut cases = vec![Case::new(
        "rng",
        "philox_kat",
        Tier::Smoke,
        Box::new(|_| {
            // The harness's own generator (the SDK's) against Random123: every other check
            // here trusts it.
            let bad = KAT.iter().find(|(c, k, out)| philox::philox4x32_10(*c, *k) != *out);
            Outcome::check(bad.is_none(), format!("the SDK's Philox disagrees with Random123 on {bad:?}"))
        }),
    )];
    let uniform_kind = Op::RandUniform { seed: 0, offset: 0, low: 0.0, high: 0.0 }.kind();
    let normal_kind = Op::RandNormal { seed: 0, offset: 0, mean: 0.0, std: 0.0 }.kind();
    for dtype in FLOATS {
        let dt = short_name(dtype);
        let deps = [memory_deps(dtype), vec!["rng/philox_kat".into()]].concat();
        let uniform_claimed = t.claims(uniform_kind, dtype);
        // Known answers: element i at (seed, offset) is the interface's formula, bit for bit.
        for (name, seed, offset) in [
            ("kat_seed42", 42u64, 0u64),
            ("kat_offset7", 0x5eed_1234_abcd, 7),
            ("kat_offset_wrap", u64::MAX, u64::MAX - 1),
        ] {
            let n = 1003;
            let (low, high) = (-2.0, 3.0);
            let case = OpCase::single(
                Op::RandUniform { seed, offset, low, high },
                vec![],
                Spec::out(dtype, &[n]),
                Expected::exact(dtype, uniform_expected(dtype, seed, offset, n, low, high)),
            );
            cases.push(
                Case::op("rng", format!("rand_uniform/{dt}/{name}"), Tier::Smoke, uniform_claimed, case)
                    .after(deps.clone()),
            );
        }
        let normal_claimed = t.claims(normal_kind, dtype);
        let (seed, offset, n) = (99u64, 3u64, 501usize);
        let values: Vec<f64> =
            (0..n as u64).map(|i| quantize(dtype, 0.5 + 2.0 * philox::normal_f64(seed, offset, i))).collect();
        // Box-Muller in f64 may differ in the last bits between libms: 1 ULP of the dtype.
        let case = OpCase::single(
            Op::RandNormal { seed, offset, mean: 0.5, std: 2.0 },
            vec![],
            Spec::out(dtype, &[n]),
            Expected::correctly_rounded(dtype, values),
        );
        cases.push(
            Case::op("rng", format!("rand_normal/{dt}/kat"), Tier::Smoke, normal_claimed, case).after(deps.clone()),
        );
        if uniform_claimed {
            cases.push(
                Case::new(
                    "rng",
                    format!("rand_uniform/{dt}/offset_shifts_stream"),
                    Tier::Core,
                    Box::new(move |t| {
                        let per_block = if dtype == DType::F64 { 2 } else { 4 };
                        let op = |offset| Op::RandUniform { seed: 5, offset, low: 0.0, high: 1.0 };
                        let (a, b) = match (fill(t, op(0), dtype, 64), fill(t, op(3), dtype, 64)) {
                            (Ok(a), Ok(b)) => (a, b),
                            (Err(e), _) | (_, Err(e)) => return *e,
                        };
                        let shift = 3 * per_block;
                        Outcome::check(
                            a[shift..] == b[..64 - shift] && a != b,
                            format!("a fill at offset 3 must equal the fill at offset 0 from element {shift} on"),
                        )
                    }),
                )
                .after(deps.clone()),
            );
            cases.push(
                Case::new(
                    "rng",
                    format!("rand_uniform/{dt}/same_seed_same_bits"),
                    Tier::Core,
                    Box::new(move |t| {
                        let op = Op::RandUniform { seed: 77, offset: 11, low: 0.0, high: 1.0 };
                        match (fill(t, op, dtype, 300), fill(t, op, dtype, 300)) {
                            (Ok(a), Ok(b)) => Outcome::check(
                                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                                "two fills with one (seed, offset) differ",
                            ),
                            (Err(e), _) | (_, Err(e)) => *e,
                        }
                    }),
                )
                .after(deps.clone()),
            );
            cases.push(
                Case::new(
                    "rng",
                    format!("rand_uniform/{dt}/statistics"),
                    Tier::Core,
                    Box::new(move |t| {
                        let n = 20000;
                        let v = match fill(t, Op::RandUniform { seed: 1234, offset: 0, low: 0.0, high: 1.0 }, dtype, n)
                        {
                            Ok(v) => v,
                            Err(e) => return *e,
                        };
                        let mean = v.iter().sum::<f64>() / n as f64;
                        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
                        // 6 standard errors: mean sd 0.289/√n ≈ 0.002; bf16's coarse grid biases a little.
                        let in_range = v.iter().all(|&x| (0.0..=1.0).contains(&x));
                        Outcome::check(
                            in_range && (mean - 0.5).abs() < 0.013 && (var - 1.0 / 12.0).abs() < 0.01,
                            format!("uniform[0,1): mean {mean:.4}, variance {var:.4}, all in range: {in_range}"),
                        )
                    }),
                )
                .after(deps.clone()),
            );
        }
        let dropout_claimed = t.claims(Op::Dropout { seed: 0, offset: 0, p: 0.0 }.kind(), dtype);
        let (seed, offset, p, n) = (31u64, 2u64, 0.3, 400usize);
        let x: Vec<f64> = (0..n).map(|i| quantize(dtype, 1.0 + (i % 7) as f64 * 0.25)).collect();
        let scale = 1.0 / (1.0 - p);
        let y: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let u = if dtype == DType::F64 {
                    philox::uniform_f64(seed, offset, i as u64)
                } else {
                    philox::uniform_f32(seed, offset, i as u64) as f64
                };
                if u >= p {
                    v * scale
                } else {
                    0.0
                }
            })
            .collect();
        let case = OpCase::single(
            Op::Dropout { seed, offset, p },
            vec![Spec::new(dtype, &[n], x)],
            Spec::out(dtype, &[n]),
            Expected::ulps(dtype, y, 2.0, 0.0),
        );
        cases.push(
            Case::op("rng", format!("dropout/{dt}/mask_and_scale"), Tier::Smoke, dropout_claimed, case)
                .after(deps.clone()),
        );
    }
    cases
}
