//! Philox fills: bit-exact against `sdk::philox` for every float dtype (dense, strided, and
//! large enough to run in parallel), offsets that compose, dropout's exact values and mask
//! statistics, and the argument checks.

mod common;

use common::*;
use genesis_backend_api::sdk::philox;
use genesis_backend_api::{DType, ErrorKind, Op};
use rstest::rstest;

/// The uniform `RandUniform` and `Dropout` draw for element `i` of a `dtype` fill.
fn u(dtype: DType, seed: u64, offset: u64, i: u64) -> f64 {
    if dtype == DType::F64 {
        philox::uniform_f64(seed, offset, i)
    } else {
        philox::uniform_f32(seed, offset, i) as f64
    }
}

#[rstest]
fn uniform_fills_reproduce_philox_exactly(
    #[values(DType::F32, DType::F64, DType::F16, DType::BF16)] dtype: DType,
    #[values(Layout::Dense, Layout::Padded, Layout::Transposed)] layout: Layout,
) {
    let dev = device();
    let (seed, offset, low, high) = (0x1234_5678_9abc_def0u64, 5u64, -3.0, 7.5);
    // 1001 elements: not a multiple of the 4 (or 2) elements per Philox block.
    for shape in [vec![7, 11, 13], vec![1001], vec![]] {
        let y = output_layout(&dev, dtype, &shape, &layout);
        run(&dev, Op::RandUniform { seed, offset, low, high }, &[], &[y]).unwrap();
        let want: Vec<f64> = (0..numel(&shape) as u64)
            .map(|i| round_to(dtype, low + (high - low) * u(dtype, seed, offset, i)))
            .collect();
        assert_exact(&download(&dev, &y), &want, &format!("uniform {dtype} {shape:?} {layout:?}"));
    }
}

#[rstest]
fn normal_fills_reproduce_philox_exactly(
    #[values(DType::F32, DType::F64, DType::F16, DType::BF16)] dtype: DType,
    #[values(Layout::Dense, Layout::Padded)] layout: Layout,
) {
    let dev = device();
    let (seed, offset, mean, std) = (42u64, 3u64, 0.5, 2.0);
    let shape = [33, 31];
    let y = output_layout(&dev, dtype, &shape, &layout);
    run(&dev, Op::RandNormal { seed, offset, mean, std }, &[], &[y]).unwrap();
    let want: Vec<f64> =
        (0..numel(&shape) as u64).map(|i| round_to(dtype, mean + std * philox::normal_f64(seed, offset, i))).collect();
    assert_exact(&download(&dev, &y), &want, &format!("normal {dtype} {layout:?}"));
}

#[rstest]
fn large_fills_are_exact_and_plausible(#[values(DType::F32, DType::F64, DType::F16, DType::BF16)] dtype: DType) {
    // 200 003 elements: many parallel chunks, a ragged last block.
    let dev = device();
    let n = 200_003;
    let got = run1(&dev, Op::RandUniform { seed: 9, offset: u64::MAX - 10, low: 0.0, high: 1.0 }, &[], dtype, &[n]);
    // The counter wraps past u64::MAX like `sdk::philox` does.
    let want: Vec<f64> = (0..n as u64).map(|i| round_to(dtype, u(dtype, 9, u64::MAX - 10, i))).collect();
    assert_exact(&got, &want, "large uniform");
    let mean = got.iter().sum::<f64>() / n as f64;
    assert!((mean - 0.5).abs() < 0.005, "uniform mean {mean}");

    let got = run1(&dev, Op::RandNormal { seed: 9, offset: 0, mean: 0.0, std: 1.0 }, &[], dtype, &[n]);
    let want: Vec<f64> = (0..n as u64).map(|i| round_to(dtype, philox::normal_f64(9, 0, i))).collect();
    assert_exact(&got, &want, "large normal");
    let m = got.iter().sum::<f64>() / n as f64;
    let var = got.iter().map(|v| (v - m).powi(2)).sum::<f64>() / n as f64;
    assert!(m.abs() < 0.01 && (var - 1.0).abs() < 0.02, "normal moments {m} {var}");
}

#[test]
fn offsets_compose() {
    // Elements 4.. of a fill at offset 0 are the fill at offset 1 (four f32 draws per block),
    // elements 2.. of an f64 fill the f64 fill at offset 1 (two per block).
    let dev = device();
    for (dtype, per_block) in [(DType::F32, 4usize), (DType::F64, 2)] {
        let op = |offset| Op::RandUniform { seed: 77, offset, low: 0.0, high: 1.0 };
        let a = run1(&dev, op(0), &[], dtype, &[12]);
        let b = run1(&dev, op(1), &[], dtype, &[12 - per_block]);
        assert_eq!(a[per_block..], b[..], "{dtype}");
        assert_eq!(philox::blocks_used(philox::Draw::Uniform, dtype, 12), (12 / per_block) as u64);
    }
}

/// The exact dropout value: `x * keep / (1-p)` in the compute type (f32 for f16/bf16).
fn dropout_ref(dtype: DType, x: f64, keep: bool, p: f64) -> f64 {
    let k = keep as u8 as f64;
    match dtype {
        DType::F64 => x * k / (1.0 - p),
        _ => round_to(dtype, ((x as f32 * k as f32) / (1.0 - p) as f32) as f64),
    }
}

#[rstest]
fn dropout_is_exact(
    #[values(DType::F32, DType::F64, DType::F16, DType::BF16)] dtype: DType,
    #[values(Layout::Dense, Layout::Transposed, Layout::Padded)] layout: Layout,
) {
    let dev = device();
    let (seed, offset, p) = (1234u64, 17u64, 0.3);
    let shape = [9, 14];
    let xv: Vec<f64> = values(numel(&shape), 3, -4.0, 4.0).into_iter().map(|v| round_to(dtype, v)).collect();
    let x = upload_layout(&dev, &xv, dtype, &shape, &layout);
    let y = output_layout(&dev, dtype, &shape, &layout);
    run(&dev, Op::Dropout { seed, offset, p }, &[x], &[y]).unwrap();
    let want: Vec<f64> =
        xv.iter().enumerate().map(|(i, &v)| dropout_ref(dtype, v, u(dtype, seed, offset, i as u64) >= p, p)).collect();
    assert_exact(&download(&dev, &y), &want, &format!("dropout {dtype} {layout:?}"));
}

#[rstest]
fn dropout_mask_statistics(#[values(DType::F32, DType::F16)] dtype: DType) {
    let dev = device();
    let n = 300_000;
    let x = upload(&dev, &vec![1.0; n], dtype, &[n]);
    for p in [0.1, 0.5, 0.9] {
        let y = run1(&dev, Op::Dropout { seed: 5, offset: 0, p }, &[x], dtype, &[n]);
        let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
        // Binomial standard deviation is under 0.001 here; allow five of them.
        assert!((kept - (1.0 - p)).abs() < 0.005, "p {p}: kept {kept}");
        let scale = round_to(dtype, 1.0 / (1.0 - p) as f32 as f64);
        assert!(y.iter().all(|&v| v == 0.0 || (v - scale).abs() <= 2.0 * eps(dtype) * scale), "p {p}: values");
        // The expectation is preserved.
        let mean = y.iter().sum::<f64>() / n as f64;
        assert!((mean - 1.0).abs() < 0.02, "p {p}: mean {mean}");
    }
    // Same call, same mask: the backward is the same op on the gradient.
    let a = run1(&dev, Op::Dropout { seed: 5, offset: 0, p: 0.5 }, &[x], dtype, &[n]);
    let b = run1(&dev, Op::Dropout { seed: 5, offset: 0, p: 0.5 }, &[x], dtype, &[n]);
    assert_eq!(a, b);
    // p = 0 keeps everything unchanged.
    let xv = values(100, 1, -1.0, 1.0).into_iter().map(|v| round_to(dtype, v)).collect::<Vec<_>>();
    let x = upload(&dev, &xv, dtype, &[100]);
    assert_eq!(run1(&dev, Op::Dropout { seed: 5, offset: 0, p: 0.0 }, &[x], dtype, &[100]), xv);
}

#[test]
fn dropped_nans_stay_nan() {
    // `x * keep` with keep = 0 is NaN for a NaN x: the literal formula of the interface.
    let dev = device();
    let x = upload(&dev, &vec![f64::NAN; 64], DType::F32, &[64]);
    let y = run1(&dev, Op::Dropout { seed: 1, offset: 0, p: 0.5 }, &[x], DType::F32, &[64]);
    assert!(y.iter().all(|v| v.is_nan()));
}

#[test]
fn bad_arguments_are_refused() {
    let dev = device();
    let x = upload(&dev, &[1.0; 4], DType::F32, &[4]);
    for p in [1.0, -0.1, f64::NAN, 2.0] {
        let y = output(&dev, DType::F32, &[4]);
        expect_err(
            run(&dev, Op::Dropout { seed: 0, offset: 0, p }, &[x], &[y]),
            ErrorKind::InvalidArgument,
            &["dropout", "p"],
        );
    }
    let op = Op::Dropout { seed: 0, offset: 0, p: 0.5 };
    expect_err(run(&dev, op, &[x], &[output(&dev, DType::F64, &[4])]), ErrorKind::DtypeMismatch, &["dropout"]);
    expect_err(run(&dev, op, &[x], &[output(&dev, DType::F32, &[2, 2])]), ErrorKind::ShapeMismatch, &["dropout"]);
    let xi = upload(&dev, &[1.0; 4], DType::I64, &[4]);
    expect_err(run(&dev, op, &[xi], &[output(&dev, DType::I64, &[4])]), ErrorKind::Unsupported, &["dropout"]);
    let uni = Op::RandUniform { seed: 0, offset: 0, low: 0.0, high: 1.0 };
    expect_err(run(&dev, uni, &[], &[output(&dev, DType::I32, &[4])]), ErrorKind::Unsupported, &["rand_uniform"]);
    expect_err(run(&dev, uni, &[x], &[output(&dev, DType::F32, &[4])]), ErrorKind::InvalidArgument, &["rand_uniform"]);
}
