//! The shared elementwise machinery (`map1`/`map2`) on sizes that take the parallel paths:
//! contiguous, strided and broadcast operands, exact in-place aliasing, and an output that
//! overlaps itself (which must fall back to one thread, not race). Also the element-level
//! rules the kernels rely on: f64 -> f16/bf16 rounds once, and misaligned views are refused.

mod common;

use common::*;
use genesis_backend_api::{BinaryOp, DType, ErrorKind, Op, TensorDesc, UnaryOp};
use rstest::rstest;

#[rstest]
fn large_binary_ops_match_reference(
    #[values(DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64)] dtype: DType,
    #[values(Layout::Dense, Layout::Transposed, Layout::Padded)] layout: Layout,
) {
    let dev = device();
    let shape = [300, 257];
    let n = numel(&shape);
    let (av, bv) = (int_values(n, 1, -100, 100), int_values(n, 2, -100, 100));
    let a = upload_layout(&dev, &av, dtype, &shape, &layout);
    let b = upload(&dev, &bv, dtype, &shape);
    let y = output_layout(&dev, dtype, &shape, &layout);
    run(&dev, Op::Binary(BinaryOp::Sub), &[a, b], &[y]).unwrap();
    let want: Vec<f64> = av.iter().zip(&bv).map(|(x, y)| round_to(dtype, x - y)).collect();
    assert_exact(&download(&dev, &y), &want, &format!("sub {dtype} {layout:?}"));

    // A broadcast row (stride 0 on dim 0) against a full tensor.
    let row = int_values(shape[1], 3, -5, 5);
    let r = broadcast(&upload(&dev, &row, dtype, &[1, shape[1]]), &shape);
    let y = output(&dev, dtype, &shape);
    run(&dev, Op::Binary(BinaryOp::Mul), &[a, r], &[y]).unwrap();
    let rf = expand(&row, &[1, shape[1]], &shape);
    let want: Vec<f64> = av.iter().zip(&rf).map(|(x, y)| round_to(dtype, x * y)).collect();
    assert_exact(&download(&dev, &y), &want, &format!("broadcast mul {dtype} {layout:?}"));
}

#[rstest]
fn in_place_updates_read_each_element_before_writing_it(#[values(Layout::Dense, Layout::Padded)] layout: Layout) {
    let dev = device();
    let shape = [200, 300];
    let n = numel(&shape);
    let av = values(n, 4, -3.0, 3.0).into_iter().map(|v| round_to(DType::F32, v)).collect::<Vec<_>>();
    let bv = values(n, 5, -3.0, 3.0).into_iter().map(|v| round_to(DType::F32, v)).collect::<Vec<_>>();
    let a = upload_layout(&dev, &av, DType::F32, &shape, &layout);
    let b = upload(&dev, &bv, DType::F32, &shape);
    // a += b, then a = -a, both with the output exactly the first input.
    run(&dev, Op::Binary(BinaryOp::Add), &[a, b], &[a]).unwrap();
    run(&dev, Op::Unary(UnaryOp::Neg), &[a], &[a]).unwrap();
    let want: Vec<f64> = av.iter().zip(&bv).map(|(x, y)| -((*x as f32 + *y as f32) as f64)).collect();
    assert_exact(&download(&dev, &a), &want, &format!("in place {layout:?}"));
}

#[test]
fn self_overlapping_outputs_do_not_race() {
    // Shape [200, 200] with strides [1, 1]: positions share elements. The op is meaningless
    // but allowed by the device's overlap check; it must run (on one thread) and write only
    // inside the view.
    let dev = device();
    let buf = upload(&dev, &vec![0.0; 399], DType::F32, &[399]);
    let y = TensorDesc::new(buf.buffer, 0, DType::F32, &[200, 200], &[1, 1]).unwrap();
    let x = upload(&dev, &vec![2.0; 40_000], DType::F32, &[200, 200]);
    run(&dev, Op::Unary(UnaryOp::Square), &[x], &[y]).unwrap();
    assert_eq!(download(&dev, &buf), vec![4.0; 399]);
}

#[test]
fn f64_to_half_precision_rounds_once() {
    // 1 + 2^-11 + 2^-40 is just above the midpoint between 1 and the next f16 (1 + 2^-10):
    // rounding through f32 first lands exactly on the midpoint and ties to 1.0.
    let dev = device();
    let above = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    let below = 1.0 + 2f64.powi(-11) - 2f64.powi(-40);
    let x = upload(&dev, &[above, below, -above], DType::F64, &[3]);
    let got = run1(&dev, Op::Cast, &[x], DType::F16, &[3]);
    assert_eq!(got, vec![1.0 + 2f64.powi(-10), 1.0, -(1.0 + 2f64.powi(-10))]);
    let above = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    let x = upload(&dev, &[above, 1e300, -1e-300, f64::NAN], DType::F64, &[4]);
    let got = run1(&dev, Op::Cast, &[x], DType::BF16, &[4]);
    assert_eq!(got[..3], [1.0 + 2f64.powi(-7), f64::INFINITY, -0.0]);
    assert!(got[3].is_nan());
}

#[test]
fn integer_casts_wrap_and_float_casts_saturate() {
    // Integer to integer keeps the low bits, as PyTorch (i64 -55 to u8 is 201).
    let dev = device();
    let big = 2f64.powi(40) + 3.0;
    let x = upload(&dev, &[-55.0, 263.0, big, -(2f64.powi(33)) - 1.0], DType::I64, &[4]);
    assert_eq!(run1(&dev, Op::Cast, &[x], DType::U8, &[4]), [201.0, 7.0, 3.0, 255.0]);
    assert_eq!(run1(&dev, Op::Cast, &[x], DType::I32, &[4]), [-55.0, 263.0, 3.0, -1.0]);
    let x = upload(&dev, &[-1.0, 300.0], DType::I32, &[2]);
    assert_eq!(run1(&dev, Op::Cast, &[x], DType::U8, &[2]), [255.0, 44.0]);
    // Float to integer truncates and saturates; NaN gives 0.
    let x = upload(&dev, &[-5.5, 300.0, f64::NAN, 1e10], DType::F32, &[4]);
    assert_eq!(run1(&dev, Op::Cast, &[x], DType::U8, &[4]), [0.0, 255.0, 0.0, 255.0]);
    assert_eq!(run1(&dev, Op::Cast, &[x], DType::I32, &[4]), [-5.0, 300.0, 0.0, 2147483647.0]);
}

#[test]
fn misaligned_views_are_refused() {
    let dev = device();
    let x = upload(&dev, &[1.0; 4], DType::F32, &[4]);
    let odd = TensorDesc::new(x.buffer, 2, DType::F32, &[3], &[1]).unwrap();
    let y = output(&dev, DType::F32, &[3]);
    expect_err(run(&dev, Op::Unary(UnaryOp::Neg), &[odd], &[y]), ErrorKind::InvalidArgument, &["offset 2", "float32"]);
}

/// Negation flips the sign of zero (IEEE), and wraps for integers.
#[rstest]
fn neg_flips_the_sign_of_zero(#[values(DType::F32, DType::F64, DType::F16, DType::BF16)] dtype: DType) {
    let dev = device();
    let x = upload(&dev, &[0.0, -0.0, 1.5], dtype, &[3]);
    let y = run1(&dev, Op::Unary(UnaryOp::Neg), &[x], dtype, &[3]);
    assert_eq!(y, vec![-0.0, 0.0, -1.5]);
    assert!(y[0].is_sign_negative() && y[1].is_sign_positive(), "{dtype}: neg(+0) = {}, neg(-0) = {}", y[0], y[1]);
}

/// Integer powers of every integer dtype: negative exponents count as 0, results wrap.
#[rstest]
fn integer_pow_clamps_negative_exponents(#[values(DType::I32, DType::I64, DType::U8)] dtype: DType) {
    let dev = device();
    let (base, exp) = if dtype == DType::U8 {
        (vec![3.0, 2.0, 0.0], vec![2.0, 9.0, 0.0])
    } else {
        (vec![3.0, -2.0, 5.0], vec![2.0, 3.0, -1.0])
    };
    let a = upload(&dev, &base, dtype, &[3]);
    let b = upload(&dev, &exp, dtype, &[3]);
    let y = output(&dev, dtype, &[3]);
    run(&dev, Op::Binary(BinaryOp::Pow), &[a, b], &[y]).unwrap();
    let want = if dtype == DType::U8 { vec![9.0, 0.0, 1.0] } else { vec![9.0, -8.0, 1.0] };
    assert_exact(&download(&dev, &y), &want, &format!("pow {dtype}"));
}
