//! Suite `linalg`: matmul, addmm and the index ops (gather, scatter_add, index_select,
//! index_add).

use super::{no_deps, only_sample, op_cases};
use crate::case::{Case, OpCase, Tier};
use crate::gen::{tensor, ValueRange};
use crate::oracle::tensor::{matmul, ravel, take_along};
use crate::target::{Layout, Spec, Target};
use crate::tolerance::Expected;
use crate::values::{Rng, FLOATS};
use genesis_backend_api::{DType, Op};

fn matmul_case(rng: &mut Rng, dtype: DType, batch: &[usize], mkn: [usize; 3], la: Layout, lb: Layout) -> OpCase {
    widened_matmul_case(rng, dtype, dtype, batch, mkn, la, lb)
}

/// `a @ b` with `y` of `y_dtype`: the operands' dtype, or f32 for f16/bf16 operands (the
/// widened form of interface 1.13).
fn widened_matmul_case(
    rng: &mut Rng,
    dtype: DType,
    y_dtype: DType,
    batch: &[usize],
    mkn: [usize; 3],
    la: Layout,
    lb: Layout,
) -> OpCase {
    let [m, k, n] = mkn;
    let r = ValueRange::normal(1.0);
    let a = tensor(rng, dtype, &[batch, &[m, k]].concat(), la, r);
    let b = tensor(rng, dtype, &[batch, &[k, n]].concat(), lb, r);
    let nb: usize = batch.iter().product();
    let (y, mag) = matmul(&a.values, &b.values, nb, m, k, n);
    let exp = Expected::accumulated(y_dtype, y, &mag, k, 1.0);
    let out = Spec::out(y_dtype, &[batch, &[m, n]].concat());
    OpCase::single(Op::Matmul, vec![a, b], out, exp)
}

/// `y += a · b` with `y` of `y_dtype` (the products' dtype, or f32 for f16/bf16 products).
fn addmm_case(rng: &mut Rng, dtype: DType, y_dtype: DType, mkn: [usize; 3], lb: Layout, ly: Layout) -> OpCase {
    let [m, k, n] = mkn;
    let r = ValueRange::normal(1.0);
    let a = tensor(rng, dtype, &[m, k], Layout::Contiguous, r);
    let b = tensor(rng, dtype, &[k, n], lb, r);
    let y0 = tensor(rng, y_dtype, &[m, n], ly, r);
    let (product, mag) = matmul(&a.values, &b.values, 1, m, k, n);
    let values = y0.values.iter().zip(&product).map(|(y, p)| y + p).collect();
    let mag: Vec<f64> = y0.values.iter().zip(&mag).map(|(y, m)| y.abs() + m).collect();
    let exp = Expected::accumulated(y_dtype, values, &mag, k + 1, 1.0);
    OpCase::single(Op::Addmm, vec![a, b], y0, exp)
}

fn index_values(rng: &mut Rng, n: usize, bound: usize) -> Vec<f64> {
    (0..n).map(|_| rng.below(bound) as f64).collect()
}

pub fn cases(t: &Target) -> Vec<Case> {
    let c = Layout::Contiguous;
    let mut cases = op_cases(t, "linalg", "matmul", Op::Matmul.kind(), &FLOATS, &no_deps, &|dtype, rng| {
        let mut v = vec![("m3k5n4".to_string(), Tier::Smoke, matmul_case(rng, dtype, &[], [3, 5, 4], c, c))];
        for (name, batch, mkn, la, lb) in [
            ("m17k33n9", vec![], [17, 33, 9], c, c),
            ("k1", vec![], [4, 1, 5], c, c),
            ("m0", vec![], [0, 3, 4], c, c),
            ("k0_zeros", vec![], [3, 0, 4], c, c),
            ("transposed_b", vec![], [7, 11, 5], c, Layout::Transposed),
            ("transposed_a_offset_b", vec![], [6, 9, 8], Layout::Transposed, Layout::Offset),
            ("batched_broadcast_b", vec![3], [4, 6, 5], c, Layout::Broadcast(0)),
            ("m64k64n64", vec![], [64, 64, 64], c, c),
            ("k1000", vec![], [5, 1000, 3], c, Layout::Transposed),
            // A few rows against a weight stored (n, k), as a decode step's linear layers.
            ("m1_weight", vec![], [1, 256, 40], c, Layout::Transposed),
            ("m2_weight", vec![], [2, 520, 17], c, Layout::Transposed),
        ] {
            v.push((name.to_string(), Tier::Core, matmul_case(rng, dtype, &batch, mkn, la, lb)));
        }
        v.push(("m128k256n96".into(), Tier::Full, matmul_case(rng, dtype, &[], [128, 256, 96], c, Layout::Transposed)));
        if matches!(dtype, DType::F16 | DType::BF16) {
            // The widened form: the f32 sums of a low-precision product (a weight's gradient
            // under autocast), kept in f32.
            let f32_ = DType::F32;
            for (name, batch, mkn, la, lb, tier) in [
                ("widened_transposed_a", vec![], [9, 40, 6], Layout::Transposed, c, Tier::Core),
                ("widened_batched_broadcast_b", vec![3], [4, 6, 5], c, Layout::Broadcast(0), Tier::Core),
                ("widened_batched_offset", vec![2], [5, 7, 3], Layout::Offset, Layout::Transposed, Tier::Core),
                ("widened_k1000", vec![], [5, 1000, 3], Layout::Transposed, c, Tier::Full),
            ] {
                v.push((name.to_string(), tier, widened_matmul_case(rng, dtype, f32_, &batch, mkn, la, lb)));
            }
        }
        v
    });
    cases.extend(op_cases(t, "linalg", "addmm", Op::Addmm.kind(), &FLOATS, &no_deps, &|dtype, rng| {
        let t = Layout::Transposed;
        let mut v = vec![
            ("m3k5n4".to_string(), Tier::Smoke, addmm_case(rng, dtype, dtype, [3, 5, 4], c, c)),
            (
                "transposed_b_offset_y".to_string(),
                Tier::Core,
                addmm_case(rng, dtype, dtype, [6, 9, 7], t, Layout::Offset),
            ),
            ("k300_strided_y".to_string(), Tier::Core, addmm_case(rng, dtype, dtype, [5, 300, 3], t, Layout::Strided)),
        ];
        if matches!(dtype, DType::F16 | DType::BF16) {
            // A low-precision product accumulated into f32, as a gradient summed over blocks.
            v.push(("into_f32".to_string(), Tier::Core, addmm_case(rng, dtype, DType::F32, [7, 33, 5], t, c)));
            v.push(("into_f32_k1000".to_string(), Tier::Full, addmm_case(rng, dtype, DType::F32, [4, 1000, 6], t, c)));
        }
        v
    }));
    let domain = [&FLOATS[..], &[DType::I64]].concat();
    let r = |dtype: DType| ValueRange::normal(if dtype.is_float() { 3.0 } else { 30.0 });
    cases.extend(op_cases(t, "linalg", "gather", Op::Gather { dim: 0 }.kind(), &domain, &no_deps, &|dtype, rng| {
        [(0u32, c, "dim0"), (1, Layout::Transposed, "dim1_transposed")]
            .into_iter()
            .map(|(dim, layout, name)| {
                let x = tensor(rng, dtype, &[5, 4], layout, r(dtype));
                let ishape = [3usize, 4];
                let bound = x.shape[dim as usize];
                let idx = Spec::new(DType::I64, &ishape, index_values(rng, 12, bound));
                let values = take_along(&x.values, &x.shape, &ishape, dim as usize, |i, _| idx.values[i] as usize);
                let exp = Expected::exact_signed(dtype, values);
                let out = Spec::out(dtype, &ishape);
                (name.to_string(), Tier::Core, OpCase::single(Op::Gather { dim }, vec![x, idx], out, exp))
            })
            .collect()
    }));
    cases.extend(op_cases(
        t,
        "linalg",
        "index_select",
        Op::IndexSelect { dim: 0 }.kind(),
        &domain,
        &no_deps,
        &|dtype, rng| {
            [(0u32, "dim0"), (1, "dim1")]
                .into_iter()
                .map(|(dim, name)| {
                    let x = tensor(rng, dtype, &[6, 5], Layout::Strided, r(dtype));
                    let d = dim as usize;
                    let idx = Spec::new(DType::I64, &[4], index_values(rng, 4, x.shape[d]));
                    let mut oshape = x.shape.clone();
                    oshape[d] = 4;
                    let values = take_along(&x.values, &x.shape, &oshape, d, |_, at| idx.values[at[d]] as usize);
                    let exp = Expected::exact_signed(dtype, values);
                    let out = Spec::out(dtype, &oshape);
                    (name.to_string(), Tier::Core, OpCase::single(Op::IndexSelect { dim }, vec![x, idx], out, exp))
                })
                .collect()
        },
    ));
    cases.extend(op_cases(
        t,
        "linalg",
        "scatter_add",
        Op::ScatterAdd { dim: 0 }.kind(),
        &FLOATS,
        &no_deps,
        &|dtype, rng| {
            let y0 = tensor(rng, dtype, &[5, 4], c, r(dtype));
            let src = tensor(rng, dtype, &[6, 4], Layout::Transposed, r(dtype));
            let idx = Spec::new(DType::I64, &[6, 4], index_values(rng, 24, 5));
            let (mut values, mut mag) = (y0.values.clone(), y0.values.iter().map(|v| v.abs()).collect::<Vec<_>>());
            for i in 0..24 {
                let at = ravel(&[idx.values[i] as usize, i % 4], &[5, 4]);
                values[at] += src.values[i];
                mag[at] += src.values[i].abs();
            }
            let exp = Expected::accumulated_in_place(dtype, values, &mag, 7);
            only_sample("dim0_duplicates", OpCase::single(Op::ScatterAdd { dim: 0 }, vec![src, idx], y0, exp))
        },
    ));
    cases.extend(op_cases(
        t,
        "linalg",
        "index_add",
        Op::IndexAdd { dim: 0 }.kind(),
        &FLOATS,
        &no_deps,
        &|dtype, rng| {
            let y0 = tensor(rng, dtype, &[5, 3], c, r(dtype));
            let src = tensor(rng, dtype, &[4, 3], Layout::Offset, r(dtype));
            let idx = Spec::new(DType::I64, &[4], vec![1.0, 3.0, 1.0, 0.0]);
            let (mut values, mut mag) = (y0.values.clone(), y0.values.iter().map(|v| v.abs()).collect::<Vec<_>>());
            for i in 0..4 {
                for j in 0..3 {
                    let at = idx.values[i] as usize * 3 + j;
                    values[at] += src.values[i * 3 + j];
                    mag[at] += src.values[i * 3 + j].abs();
                }
            }
            let exp = Expected::accumulated_in_place(dtype, values, &mag, 3);
            only_sample("dim0_duplicates", OpCase::single(Op::IndexAdd { dim: 0 }, vec![src, idx], y0, exp))
        },
    ));
    cases
}
