//! Reductions against a naive f64 reference, for every dtype and op the backend claims, over
//! dense, transposed, padded (offset) and broadcast inputs, small and large (parallel, blocked)
//! shapes, plus the empty, tie, NaN and error rules of the interface.

mod common;

use common::*;
use genesis_backend_api::{DType, Device, ErrorKind, Op, OpKind, ReduceOp};
use rstest::rstest;

const ALL_OPS: [ReduceOp; 8] = [
    ReduceOp::Sum,
    ReduceOp::Mean,
    ReduceOp::SumSquares,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Prod,
    ReduceOp::ArgMax,
    ReduceOp::ArgMin,
];

fn claimed(op: ReduceOp, dtype: DType) -> bool {
    match op {
        ReduceOp::Sum | ReduceOp::Prod => dtype != DType::Bool,
        ReduceOp::Mean | ReduceOp::SumSquares => dtype.is_float(),
        _ => true,
    }
}

fn is_arg(op: ReduceOp) -> bool {
    matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin)
}

/// Wrap an exact integer result to the dtype, as the kernel's wrapping arithmetic does.
fn wrap(dtype: DType, v: i128) -> i128 {
    match dtype {
        DType::I64 => v as i64 as i128,
        DType::I32 => v as i32 as i128,
        DType::U8 => v as u8 as i128,
        _ => v,
    }
}

/// The accumulator's epsilon: f64 for f32 and f64, f32 for f16/bf16.
fn acc_eps(dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => f32::EPSILON as f64,
        _ => f64::EPSILON,
    }
}

/// Expected outputs (row-major over the output shape) and a per-output tolerance.
fn reference(op: ReduceOp, dtype: DType, x: &[f64], shape: &[usize], axes: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let out_shape: Vec<usize> = shape.iter().enumerate().map(|(d, &n)| if axes.contains(&d) { 1 } else { n }).collect();
    let mut groups: Vec<Vec<(usize, f64)>> = vec![Vec::new(); numel(&out_shape)];
    for (flat, &v) in x.iter().enumerate() {
        let (mut rest, mut out, mut stride, mut along) = (flat, 0, 1, 0);
        for d in (0..shape.len()).rev() {
            let i = rest % shape[d];
            rest /= shape[d];
            if axes.contains(&d) {
                along = i;
            } else {
                out += i * stride;
            }
            stride *= out_shape[d];
        }
        groups[out].push((along, v));
    }
    let float = dtype.is_float();
    groups
        .iter()
        .map(|g| {
            let vals: Vec<f64> = g.iter().map(|p| p.1).collect();
            let n = vals.len();
            let sum_abs: f64 = vals.iter().map(|v| v.abs()).sum();
            let tol_sum = |e: f64| 2.0 * eps(dtype) * e.abs() + 32.0 * acc_eps(dtype) * sum_abs;
            let pick = |max: bool| {
                let mut best: Option<(f64, usize)> = None;
                for &(i, v) in g {
                    best = match best {
                        None => Some((v, i)),
                        Some((b, _)) if b.is_nan() => best,
                        Some((b, _)) if v.is_nan() || (max && v > b) || (!max && v < b) => Some((v, i)),
                        _ => best,
                    };
                }
                best.expect("non-empty")
            };
            match op {
                ReduceOp::Sum if float => {
                    let e = round_to(dtype, vals.iter().sum());
                    (e, tol_sum(e))
                }
                ReduceOp::Sum => (wrap(dtype, vals.iter().fold(0i128, |a, &v| wrap(dtype, a + v as i128))) as f64, 0.0),
                ReduceOp::SumSquares => {
                    let e = round_to(dtype, vals.iter().map(|v| v * v).sum());
                    // Positive terms: a sequential sum's error grows with about sqrt(n) roundings.
                    (e, 2.0 * eps(dtype) * e + (32.0 + 4.0 * (n as f64).sqrt()) * acc_eps(dtype) * e)
                }
                ReduceOp::Mean => {
                    let e = round_to(dtype, vals.iter().sum::<f64>() / n as f64);
                    (e, tol_sum(e) / n.max(1) as f64 + 2.0 * eps(dtype) * e.abs())
                }
                ReduceOp::Prod if float => {
                    let e = round_to(dtype, vals.iter().product());
                    (e, (2.0 * eps(dtype) + 4.0 * n as f64 * acc_eps(dtype)) * e.abs())
                }
                ReduceOp::Prod => (vals.iter().fold(1i128, |a, &v| wrap(dtype, a * v as i128)) as f64, 0.0),
                ReduceOp::Max => (pick(true).0, 0.0),
                ReduceOp::Min => (pick(false).0, 0.0),
                ReduceOp::ArgMax => (pick(true).1 as f64, 0.0),
                ReduceOp::ArgMin => (pick(false).1 as f64, 0.0),
            }
        })
        .unzip()
}

/// Input values suited to `op` on `dtype`, already rounded to the dtype.
fn inputs(op: ReduceOp, dtype: DType, n: usize, seed: u64) -> Vec<f64> {
    let raw = match (dtype, op) {
        (DType::Bool, _) => int_values(n, seed, 0, 2),
        (DType::U8, _) => int_values(n, seed, 0, 12),
        (_, ReduceOp::Prod) if dtype.is_float() => values(n, seed, 0.8, 1.25),
        // Squares of 100,000 values stay below f16's largest finite value.
        (_, ReduceOp::SumSquares) => values(n, seed, -0.5, 0.5),
        (_, ReduceOp::Prod) => int_values(n, seed, -2, 3),
        // Few distinct integers make ties common, which exercises the first-index rule.
        (_, ReduceOp::ArgMax | ReduceOp::ArgMin) => int_values(n, seed, -4, 4),
        _ if dtype.is_float() => values(n, seed, -2.0, 2.0),
        _ => int_values(n, seed, -50, 50),
    };
    raw.into_iter().map(|v| round_to(dtype, v)).collect()
}

fn check(
    dev: &genesis_backend_cpu::CpuDevice,
    op: ReduceOp,
    dtype: DType,
    x: &genesis_backend_api::TensorDesc,
    xv: &[f64],
    axes: &[usize],
    out_layout: &Layout,
) {
    let shape = x.shape();
    let out_shape: Vec<usize> = shape.iter().enumerate().map(|(d, &n)| if axes.contains(&d) { 1 } else { n }).collect();
    let out_dtype = if is_arg(op) { DType::I64 } else { dtype };
    let y = output_layout(dev, out_dtype, &out_shape, out_layout);
    run(dev, Op::Reduce(op), &[*x], &[y]).unwrap_or_else(|e| panic!("{op:?} {dtype} {shape:?} axes {axes:?}: {e}"));
    let got = download(dev, &y);
    let (want, tol) = reference(op, dtype, xv, &shape, axes);
    for (i, ((&g, &w), &t)) in got.iter().zip(&want).zip(&tol).enumerate() {
        let ok = if w.is_nan() { g.is_nan() } else { (g - w).abs() <= t };
        assert!(
            ok,
            "{op:?} {dtype} {shape:?} axes {axes:?} {:?}: output {i}: got {g}, expected {w} (tol {t})",
            x.strides()
        );
    }
}

#[rstest]
fn small_reductions_match_reference(
    #[values(DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool)]
    dtype: DType,
) {
    for op in ALL_OPS.into_iter().filter(|&op| claimed(op, dtype)) {
        small_reduction_matches_reference(op, dtype);
    }
}

fn small_reduction_matches_reference(op: ReduceOp, dtype: DType) {
    let dev = device();
    let shape = [4, 5, 6];
    let xv = inputs(op, dtype, numel(&shape), 7);
    let axes_sets: &[&[usize]] =
        if is_arg(op) { &[&[0], &[1], &[2], &[]] } else { &[&[2], &[0], &[1], &[0, 2], &[0, 1], &[0, 1, 2], &[]] };
    for layout in [Layout::Dense, Layout::Transposed, Layout::Padded, Layout::Permuted(vec![1, 2, 0])] {
        let x = upload_layout(&dev, &xv, dtype, &shape, &layout);
        for axes in axes_sets {
            check(&dev, op, dtype, &x, &xv, axes, &Layout::Dense);
        }
    }
    // A strided output, and a rank-0-like full reduction of a rank-1 tensor.
    let x = upload(&dev, &xv, dtype, &shape);
    check(&dev, op, dtype, &x, &xv, &[1], &Layout::Padded);
    let x1 = upload(&dev, &xv[..7], dtype, &[7]);
    check(&dev, op, dtype, &x1, &xv[..7], &[0], &Layout::Dense);
}

/// Shapes that take the parallel, blocked and column paths.
#[rstest]
fn large_reductions_match_reference(
    #[values(DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32)] dtype: DType,
    #[values(ReduceOp::Sum, ReduceOp::Max, ReduceOp::ArgMin, ReduceOp::Mean, ReduceOp::SumSquares)] op: ReduceOp,
) {
    if !claimed(op, dtype) {
        return;
    }
    let dev = device();
    let cases: &[(&[usize], &[usize], Layout)] = &[
        // Rows: last axis, contiguous, many outputs in parallel tasks.
        (&[64, 3000], &[1], Layout::Dense),
        // Columns: leading axis of a contiguous tensor, with several row blocks to merge.
        (&[40000, 3], &[0], Layout::Dense),
        (&[3000, 64], &[0], Layout::Dense),
        // Middle axis: columns with an outer dim.
        (&[6, 2000, 20], &[1], Layout::Dense),
        // One long reduction split into blocks (also strided: the general path).
        (&[100_000], &[0], Layout::Dense),
        (&[300, 300], &[1], Layout::Transposed),
    ];
    for (i, (shape, axes, layout)) in cases.iter().enumerate() {
        if is_arg(op) && axes.len() != 1 {
            continue;
        }
        let xv = inputs(op, dtype, numel(shape), 100 + i as u64);
        let x = upload_layout(&dev, &xv, dtype, shape, layout);
        check(&dev, op, dtype, &x, &xv, axes, &Layout::Dense);
    }
    // The full reduction of a 2-D transposed tensor (general path, blocked).
    if !is_arg(op) {
        let shape = [400, 300];
        let xv = inputs(op, dtype, numel(&shape), 5);
        let x = upload_layout(&dev, &xv, dtype, &shape, &Layout::Transposed);
        check(&dev, op, dtype, &x, &xv, &[0, 1], &Layout::Dense);
    }
}

#[test]
fn long_f32_sums_stay_accurate() {
    // A million copies of f32(0.1): a naive f32 loop is off by ~1% here; the kernel must give
    // the correctly rounded exact sum.
    let dev = device();
    let n = 1 << 20;
    let v = 0.1f32 as f64;
    for layout in [Layout::Dense, Layout::Padded] {
        let x = upload_layout(&dev, &vec![v; n], DType::F32, &[n], &layout);
        let got = run1(&dev, Op::Reduce(ReduceOp::Sum), &[x], DType::F32, &[1]);
        assert_eq!(got[0], (v * n as f64) as f32 as f64, "{layout:?}");
    }
    // f16 accumulates in f32, so 4096 ones sum exactly (an f16 accumulator stops at 2048).
    let x = upload(&dev, &vec![1.0; 4096], DType::F16, &[4096]);
    assert_eq!(run1(&dev, Op::Reduce(ReduceOp::Sum), &[x], DType::F16, &[1]), vec![4096.0]);
}

#[rstest]
fn broadcast_inputs_reduce_like_their_expansion(#[values(DType::F32, DType::F16, DType::I64)] dtype: DType) {
    let dev = device();
    let small = inputs(ReduceOp::Sum, dtype, 6, 3);
    let row = upload(&dev, &small, dtype, &[1, 6]);
    let x = broadcast(&row, &[5, 6]);
    let full = expand(&small, &[1, 6], &[5, 6]);
    for axes in [&[0usize][..], &[1], &[0, 1]] {
        check(&dev, ReduceOp::Sum, dtype, &x, &full, axes, &Layout::Dense);
        check(&dev, ReduceOp::Max, dtype, &x, &full, axes, &Layout::Dense);
    }
    check(&dev, ReduceOp::ArgMax, dtype, &x, &full, &[0], &Layout::Dense);
}

#[test]
fn empty_reductions_give_identities_or_errors() {
    let dev = device();
    let x = upload(&dev, &[], DType::F32, &[3, 0]);
    let sum = run1(&dev, Op::Reduce(ReduceOp::Sum), &[x], DType::F32, &[3, 1]);
    assert_eq!(sum, vec![0.0; 3]);
    let prod = run1(&dev, Op::Reduce(ReduceOp::Prod), &[x], DType::F32, &[3, 1]);
    assert_eq!(prod, vec![1.0; 3]);
    let mean = run1(&dev, Op::Reduce(ReduceOp::Mean), &[x], DType::F32, &[3, 1]);
    assert!(mean.iter().all(|v| v.is_nan()), "{mean:?}");
    let xi = upload(&dev, &[], DType::I32, &[3, 0]);
    assert_eq!(run1(&dev, Op::Reduce(ReduceOp::Sum), &[xi], DType::I32, &[3, 1]), vec![0.0; 3]);
    for (op, name) in
        [(ReduceOp::Max, "max"), (ReduceOp::Min, "min"), (ReduceOp::ArgMax, "argmax"), (ReduceOp::ArgMin, "argmin")]
    {
        let out = if is_arg(op) { DType::I64 } else { DType::F32 };
        let y = output(&dev, out, &[3, 1]);
        expect_err(run(&dev, Op::Reduce(op), &[x], &[y]), ErrorKind::InvalidArgument, &[name, "empty", "[3, 0]"]);
    }
    // An empty output with a non-empty reduced axis is fine and writes nothing.
    let e = upload(&dev, &[], DType::F32, &[0, 4]);
    let y = output(&dev, DType::F32, &[0, 1]);
    run(&dev, Op::Reduce(ReduceOp::Max), &[e], &[y]).unwrap();
}

#[rstest]
fn arg_reductions_pick_the_first_tie_and_the_first_nan(
    #[values(DType::F32, DType::F64, DType::F16, DType::BF16)] dtype: DType,
) {
    let dev = device();
    let nan = f64::NAN;
    let rows: [(&[f64], usize, usize, f64, f64); 4] = [
        // values, argmax, argmin, max, min
        (&[1.0, 3.0, 3.0, -2.0, -2.0], 1, 3, 3.0, -2.0),
        (&[1.0, nan, 5.0, nan], 1, 1, nan, nan),
        (&[f64::NEG_INFINITY, f64::NEG_INFINITY], 0, 0, f64::NEG_INFINITY, f64::NEG_INFINITY),
        (&[2.0, 2.0, 2.0, nan], 3, 3, nan, nan),
    ];
    for (vals, amax, amin, max, min) in rows {
        let x = upload(&dev, vals, dtype, &[vals.len()]);
        let run_op = |op, out| run1(&dev, Op::Reduce(op), &[x], out, &[1])[0];
        assert_eq!(run_op(ReduceOp::ArgMax, DType::I64), amax as f64, "{vals:?}");
        assert_eq!(run_op(ReduceOp::ArgMin, DType::I64), amin as f64, "{vals:?}");
        let (gmax, gmin) = (run_op(ReduceOp::Max, dtype), run_op(ReduceOp::Min, dtype));
        assert!(gmax == max || (gmax.is_nan() && max.is_nan()), "max of {vals:?}: {gmax}");
        assert!(gmin == min || (gmin.is_nan() && min.is_nan()), "min of {vals:?}: {gmin}");
    }
    // Along axis 0 of a 2-D tensor, with the NaN past the first row block of a long column.
    let n = 50_000;
    let mut col: Vec<f64> = (0..n).map(|i| (i % 7) as f64).collect();
    col[40_001] = nan;
    col[45_000] = nan;
    let both: Vec<f64> = col.iter().flat_map(|&v| [v, -v]).collect();
    let x = upload(&dev, &both, dtype, &[n, 2]);
    assert_eq!(run1(&dev, Op::Reduce(ReduceOp::ArgMax), &[x], DType::I64, &[1, 2]), vec![40_001.0, 40_001.0]);
    let finite: Vec<f64> = both.iter().map(|v| if v.is_nan() { 0.0 } else { *v }).collect();
    let x = upload(&dev, &finite, dtype, &[n, 2]);
    assert_eq!(run1(&dev, Op::Reduce(ReduceOp::ArgMax), &[x], DType::I64, &[1, 2]), vec![6.0, 0.0]);
    assert_eq!(run1(&dev, Op::Reduce(ReduceOp::ArgMin), &[x], DType::I64, &[1, 2]), vec![0.0, 6.0]);
}

#[test]
fn arg_reductions_reduce_one_axis() {
    let dev = device();
    let x = upload(&dev, &values(12, 1, 0.0, 1.0), DType::F32, &[3, 4]);
    let y = output(&dev, DType::I64, &[1, 1]);
    expect_err(run(&dev, Op::Reduce(ReduceOp::ArgMax), &[x], &[y]), ErrorKind::InvalidArgument, &["argmax", "[3, 4]"]);
    // No reduced axis (a size-1 dim "reduced"): every index is 0.
    let x = upload(&dev, &[5.0, 1.0, 7.0], DType::F32, &[3, 1]);
    assert_eq!(run1(&dev, Op::Reduce(ReduceOp::ArgMin), &[x], DType::I64, &[3, 1]), vec![0.0; 3]);
}

#[test]
fn bad_operands_are_refused() {
    let dev = device();
    let x = upload(&dev, &values(20, 1, 0.0, 1.0), DType::F32, &[4, 5]);
    let sum = Op::Reduce(ReduceOp::Sum);
    expect_err(run(&dev, sum, &[x], &[output(&dev, DType::F32, &[5])]), ErrorKind::ShapeMismatch, &["sum", "[4, 5]"]);
    expect_err(
        run(&dev, sum, &[x], &[output(&dev, DType::F32, &[2, 5])]),
        ErrorKind::ShapeMismatch,
        &["sum", "[2, 5]"],
    );
    expect_err(run(&dev, sum, &[x], &[output(&dev, DType::F64, &[4, 1])]), ErrorKind::DtypeMismatch, &["sum"]);
    let y = output(&dev, DType::F32, &[4, 1]);
    expect_err(run(&dev, Op::Reduce(ReduceOp::ArgMax), &[x], &[y]), ErrorKind::DtypeMismatch, &["argmax", "int64"]);
    expect_err(run(&dev, sum, &[x, x], &[y]), ErrorKind::InvalidArgument, &["sum"]);
    let xi = upload(&dev, &[1.0, 2.0], DType::I32, &[2]);
    expect_err(
        run(&dev, Op::Reduce(ReduceOp::Mean), &[xi], &[output(&dev, DType::I32, &[1])]),
        ErrorKind::Unsupported,
        &["mean"],
    );
    let xb = upload(&dev, &[1.0, 0.0], DType::Bool, &[2]);
    expect_err(run(&dev, sum, &[xb], &[output(&dev, DType::Bool, &[1])]), ErrorKind::Unsupported, &["sum"]);
}

#[test]
fn capabilities_list_exactly_the_implemented_pairs() {
    let caps = device().capabilities();
    for &op in &ALL_OPS {
        for dtype in DType::ALL {
            let has = caps.iter().any(|c| c.op == OpKind::reduce(op) && c.dtype == dtype as u32);
            assert_eq!(has, claimed(op, dtype), "{op:?} {dtype}");
        }
    }
}
