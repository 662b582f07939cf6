//! Matmul against a naive f64 reference: every claimed dtype, transposed/padded/offset operands
//! and outputs, batch broadcast (stride 0), sizes on both sides of the threading threshold,
//! k = 0 and empty outputs, and the error cases.

mod common;

use common::*;
use genesis_backend_api::{DType, ErrorKind, Op, TensorDesc};
use genesis_backend_cpu::CpuDevice;
use rstest::rstest;

/// Naive batched product of logical row-major operands; also `Σ|a||b|` per output, the scale
/// of its rounding error.
fn reference(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut mag) = (vec![0.0; batch * m * n], vec![0.0; batch * m * n]);
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut g) = (0.0, 0.0);
                for p in 0..k {
                    let prod = a[(t * m + i) * k + p] * b[(t * k + p) * n + j];
                    s += prod;
                    g += prod.abs();
                }
                y[(t * m + i) * n + j] = s;
                mag[(t * m + i) * n + j] = g;
            }
        }
    }
    (y, mag)
}

fn data(dtype: DType, n: usize, seed: u64) -> Vec<f64> {
    let raw = if dtype.is_float() { values(n, seed, -1.0, 1.0) } else { int_values(n, seed, -9, 10) };
    raw.into_iter().map(|v| round_to(dtype, v)).collect()
}

/// Compare a kernel result with the reference: exact for integers; for floats the output's
/// rounding plus an accumulation error growing like sqrt(k) (f32 accumulation for
/// f32/f16/bf16, f64 for f64).
fn compare(dtype: DType, got: &[f64], want: &[f64], mag: &[f64], k: usize, what: &str) {
    let acc = if dtype == DType::F64 { f64::EPSILON } else { f32::EPSILON as f64 };
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(mag).enumerate() {
        let tol = if dtype.is_float() { 1.01 * eps(dtype) * w.abs() + 4.0 * acc * (k as f64).sqrt() * s } else { 0.0 };
        let expected = if dtype.is_float() { w } else { round_to(dtype, w) };
        assert!((g - expected).abs() <= tol, "{what}: element {i}: got {g}, expected {expected} (tol {tol})");
    }
}

/// Upload `(batch.., rows, cols)` values so the matrix dims have `layout` ("transposed"
/// swaps only the last two dims, as a `.mT` view would).
fn upload_mat(dev: &CpuDevice, v: &[f64], dtype: DType, shape: &[usize], layout: &Layout) -> TensorDesc {
    let layout = match layout {
        Layout::Transposed => {
            let r = shape.len();
            let mut perm: Vec<usize> = (0..r).collect();
            perm.swap(r - 2, r - 1);
            Layout::Permuted(perm)
        }
        other => other.clone(),
    };
    upload_layout(dev, v, dtype, shape, &layout)
}

#[rstest]
fn products_match_reference(
    #[values(DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32)] dtype: DType,
    #[values(Layout::Dense, Layout::Transposed, Layout::Padded)] a_layout: Layout,
    #[values(Layout::Dense, Layout::Transposed, Layout::Padded)] b_layout: Layout,
) {
    let dev = device();
    // (m, k, n): tiny, odd, vector-shaped (gemv paths), and one past the threading threshold.
    let sizes = [(1, 1, 1), (3, 4, 5), (17, 33, 9), (1, 100, 7), (9, 50, 1), (70, 65, 66)];
    for (idx, &(m, k, n)) in sizes.iter().enumerate() {
        let (av, bv) = (data(dtype, m * k, idx as u64), data(dtype, k * n, 50 + idx as u64));
        let a = upload_mat(&dev, &av, dtype, &[m, k], &a_layout);
        let b = upload_mat(&dev, &bv, dtype, &[k, n], &b_layout);
        for y_layout in [Layout::Dense, Layout::Transposed] {
            let y = output_layout(&dev, dtype, &[m, n], &y_layout);
            run(&dev, Op::Matmul, &[a, b], &[y]).unwrap();
            let (want, mag) = reference(&av, &bv, 1, m, k, n);
            let what = format!("{dtype} ({m}, {k}) x ({k}, {n}) a {a_layout:?} b {b_layout:?} y {y_layout:?}");
            compare(dtype, &download(&dev, &y), &want, &mag, k, &what);
        }
    }
}

#[rstest]
fn batches_broadcast_with_stride_zero(
    #[values(DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32)] dtype: DType,
) {
    let dev = device();
    let (m, k, n) = (5, 6, 4);
    // a: (1, 3, m, k) broadcast to (2, 3, m, k); b: (2, 1, k, n) broadcast along dim 1 and
    // transposed.
    let (av, bv) = (data(dtype, 3 * m * k, 1), data(dtype, 2 * k * n, 2));
    let a = broadcast(&upload(&dev, &av, dtype, &[1, 3, m, k]), &[2, 3, m, k]);
    let b = broadcast(&upload_mat(&dev, &bv, dtype, &[2, 1, k, n], &Layout::Transposed), &[2, 3, k, n]);
    let y = output_layout(&dev, dtype, &[2, 3, m, n], &Layout::Padded);
    run(&dev, Op::Matmul, &[a, b], &[y]).unwrap();
    let (af, bf) = (expand(&av, &[1, 3, m, k], &[2, 3, m, k]), expand(&bv, &[2, 1, k, n], &[2, 3, k, n]));
    let (want, mag) = reference(&af, &bf, 6, m, k, n);
    compare(dtype, &download(&dev, &y), &want, &mag, k, &format!("{dtype} broadcast batch"));

    // Many small products: spread over the pool one matrix per task.
    let (batch, m, k, n) = (96, 16, 16, 16);
    let (av, bv) = (data(dtype, batch * m * k, 3), data(dtype, batch * k * n, 4));
    let a = upload(&dev, &av, dtype, &[batch, m, k]);
    let b = upload_mat(&dev, &bv, dtype, &[batch, k, n], &Layout::Transposed);
    let got = run1(&dev, Op::Matmul, &[a, b], dtype, &[batch, m, n]);
    let (want, mag) = reference(&av, &bv, batch, m, k, n);
    compare(dtype, &got, &want, &mag, k, &format!("{dtype} batched"));

    // A row broadcast inside the matrix: every row of a is the same vector (stride 0 on m).
    let row = data(dtype, k, 5);
    let a = broadcast(&upload(&dev, &row, dtype, &[1, k]), &[m, k]);
    let bv = data(dtype, k * n, 6);
    let b = upload(&dev, &bv, dtype, &[k, n]);
    let got = run1(&dev, Op::Matmul, &[a, b], dtype, &[m, n]);
    let (want, mag) = reference(&expand(&row, &[1, k], &[m, k]), &bv, 1, m, k, n);
    compare(dtype, &got, &want, &mag, k, &format!("{dtype} row broadcast"));
}

#[rstest]
fn empty_dims(#[values(DType::F32, DType::F16, DType::BF16, DType::I64)] dtype: DType) {
    let dev = device();
    // k = 0: the empty sum, zeros (the output starts as garbage).
    let a = upload(&dev, &[], dtype, &[2, 3, 0]);
    let b = upload(&dev, &[], dtype, &[2, 0, 4]);
    assert_eq!(run1(&dev, Op::Matmul, &[a, b], dtype, &[2, 3, 4]), vec![0.0; 24]);
    // m = 0 and batch = 0: nothing to write, no error.
    let a = upload(&dev, &[], dtype, &[0, 5]);
    let b = upload(&dev, &data(dtype, 15, 1), dtype, &[5, 3]);
    assert!(run1(&dev, Op::Matmul, &[a, b], dtype, &[0, 3]).is_empty());
    let a = upload(&dev, &[], dtype, &[0, 2, 5]);
    let b = upload(&dev, &[], dtype, &[0, 5, 3]);
    assert!(run1(&dev, Op::Matmul, &[a, b], dtype, &[0, 2, 3]).is_empty());
}

#[test]
fn large_f32_product_is_accurate() {
    // 200 x 300 x 150: threaded gemm with transposed lhs; tolerance ~1e-5 relative scaled by
    // sqrt(k) against the f64 reference.
    let dev = device();
    let (m, k, n) = (200, 300, 150);
    let (av, bv) = (data(DType::F32, m * k, 8), data(DType::F32, k * n, 9));
    let a = upload_mat(&dev, &av, DType::F32, &[m, k], &Layout::Transposed);
    let b = upload(&dev, &bv, DType::F32, &[k, n]);
    let got = run1(&dev, Op::Matmul, &[a, b], DType::F32, &[m, n]);
    let (want, mag) = reference(&av, &bv, 1, m, k, n);
    compare(DType::F32, &got, &want, &mag, k, "large f32");
}

#[test]
fn bad_operands_are_refused() {
    let dev = device();
    let f = |shape: &[usize], dtype| upload(&dev, &vec![1.0; numel(shape)], dtype, shape);
    let mm = |a, b, y| run(&dev, Op::Matmul, &[a, b], &[y]);
    let y = output(&dev, DType::F32, &[2, 4]);
    expect_err(
        mm(f(&[2, 3], DType::F32), f(&[5, 4], DType::F32), y),
        ErrorKind::ShapeMismatch,
        &["matmul", "[2, 3]", "[5, 4]"],
    );
    expect_err(
        mm(f(&[2, 3], DType::F32), f(&[3, 4], DType::F32), output(&dev, DType::F32, &[4, 2])),
        ErrorKind::ShapeMismatch,
        &["matmul"],
    );
    expect_err(
        mm(f(&[3], DType::F32), f(&[3], DType::F32), output(&dev, DType::F32, &[1])),
        ErrorKind::ShapeMismatch,
        &["matmul"],
    );
    expect_err(
        mm(f(&[2, 2, 3], DType::F32), f(&[3, 3, 4], DType::F32), output(&dev, DType::F32, &[2, 2, 4])),
        ErrorKind::ShapeMismatch,
        &["matmul"],
    );
    expect_err(mm(f(&[2, 3], DType::F32), f(&[3, 4], DType::F64), y), ErrorKind::DtypeMismatch, &["matmul"]);
    expect_err(
        mm(f(&[2, 3], DType::U8), f(&[3, 4], DType::U8), output(&dev, DType::U8, &[2, 4])),
        ErrorKind::Unsupported,
        &["matmul"],
    );
    expect_err(run(&dev, Op::Matmul, &[f(&[2, 3], DType::F32)], &[y]), ErrorKind::InvalidArgument, &["matmul"]);
}
