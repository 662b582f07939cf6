//! gather, scatter_add, index_select, index_add and cumsum against naive references, for every
//! claimed dtype, every dim, strided (transposed, padded with offset) operands, sizes that take
//! the parallel path, and the error cases (out-of-range and negative indices, shape and dtype
//! mismatches, overlapping in-place outputs).

mod common;

use common::*;
use genesis_backend_api::{contiguous_strides, DType, ErrorKind, Op, TensorDesc};
use genesis_backend_cpu::CpuDevice;
use rstest::rstest;

/// Multi-index of row-major position `flat` of `shape`.
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    idx
}

/// Row-major position of `idx` in `shape`.
fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    let cs = contiguous_strides(shape);
    idx.iter().zip(&cs).map(|(&i, &s)| i * s as usize).sum()
}

/// Data that every dtype holds exactly and whose sums stay exact (small integers; 0/1 for bool).
fn data(dtype: DType, n: usize, seed: u64) -> Vec<f64> {
    match dtype {
        DType::Bool => int_values(n, seed, 0, 2),
        DType::U8 => int_values(n, seed, 0, 20),
        _ => int_values(n, seed, -20, 20),
    }
}

fn index_tensor(dev: &CpuDevice, idx: &[f64], shape: &[usize], layout: &Layout) -> TensorDesc {
    upload_layout(dev, idx, DType::I64, shape, layout)
}

const ALL: [DType; 8] = DType::ALL;

#[rstest]
fn gather_matches_reference(
    #[values(ALL[0], ALL[1], ALL[2], ALL[3], ALL[4], ALL[5], ALL[6], ALL[7])] dtype: DType,
    #[values(Layout::Dense, Layout::Transposed, Layout::Padded)] layout: Layout,
) {
    let dev = device();
    let xs = [4, 5, 6];
    let xv = data(dtype, numel(&xs), 1);
    let x = upload_layout(&dev, &xv, dtype, &xs, &layout);
    for dim in 0..3 {
        // The index may be smaller than x outside `dim` and longer along it.
        let mut is = [3, 4, 2];
        is[dim] = 7;
        let iv = int_values(numel(&is), 10 + dim as u64, 0, xs[dim] as i64);
        let index = index_tensor(&dev, &iv, &is, &layout);
        let y = output_layout(&dev, dtype, &is, &Layout::Padded);
        run(&dev, Op::Gather { dim: dim as u32 }, &[x, index], &[y]).unwrap();
        let want: Vec<f64> = (0..numel(&is))
            .map(|p| {
                let mut i = unravel(p, &is);
                i[dim] = iv[p] as usize;
                xv[ravel(&i, &xs)]
            })
            .collect();
        assert_exact(&download(&dev, &y), &want, &format!("gather {dtype} dim {dim} {layout:?}"));
    }
}

#[rstest]
fn scatter_add_matches_reference(
    #[values(ALL[0], ALL[1], ALL[2], ALL[3], ALL[4], ALL[5], ALL[6], ALL[7])] dtype: DType,
    #[values(Layout::Dense, Layout::Transposed, Layout::Padded)] layout: Layout,
) {
    let dev = device();
    let ys = [4, 5, 6];
    for dim in 0..3 {
        let mut ss = [4, 5, 3];
        ss[dim] = 9;
        let mut is = [3, 4, 2];
        is[dim] = 8; // Many repeats along `dim`: accumulation into shared targets.
        let yv = data(dtype, numel(&ys), 2);
        let sv = data(dtype, numel(&ss), 3);
        let iv = int_values(numel(&is), 20 + dim as u64, 0, ys[dim] as i64);
        let y = upload_layout(&dev, &yv, dtype, &ys, &layout);
        let src = upload_layout(&dev, &sv, dtype, &ss, &Layout::Padded);
        let index = index_tensor(&dev, &iv, &is, &layout);
        run(&dev, Op::ScatterAdd { dim: dim as u32 }, &[src, index], &[y]).unwrap();
        let mut want = yv.clone();
        for (p, &ip) in iv.iter().enumerate() {
            let i = unravel(p, &is);
            let mut t = i.clone();
            t[dim] = ip as usize;
            let w = &mut want[ravel(&t, &ys)];
            *w = round_to(dtype, *w + sv[ravel(&i, &ss)]);
        }
        assert_exact(&download(&dev, &y), &want, &format!("scatter_add {dtype} dim {dim} {layout:?}"));
    }
}

#[rstest]
fn index_select_and_index_add_match_reference(
    #[values(ALL[0], ALL[1], ALL[2], ALL[3], ALL[4], ALL[5], ALL[6], ALL[7])] dtype: DType,
    #[values(Layout::Dense, Layout::Transposed, Layout::Padded)] layout: Layout,
) {
    let dev = device();
    let xs = [5, 7, 3];
    let xv = data(dtype, numel(&xs), 4);
    let x = upload_layout(&dev, &xv, dtype, &xs, &layout);
    for dim in 0..3 {
        let iv: Vec<f64> = int_values(6, 30 + dim as u64, 0, xs[dim] as i64);
        let index = upload_strided(&dev, &iv, DType::I64, &[6], &[3], 1);
        let mut ss = xs;
        ss[dim] = 6;
        // index_select: y.select(dim, i) = x.select(dim, index[i]).
        let y = output_layout(&dev, dtype, &ss, &layout);
        run(&dev, Op::IndexSelect { dim: dim as u32 }, &[x, index], &[y]).unwrap();
        let want: Vec<f64> = (0..numel(&ss))
            .map(|p| {
                let mut i = unravel(p, &ss);
                i[dim] = iv[i[dim]] as usize;
                xv[ravel(&i, &xs)]
            })
            .collect();
        assert_exact(&download(&dev, &y), &want, &format!("index_select {dtype} dim {dim} {layout:?}"));

        // index_add: acc.select(dim, index[i]) += src.select(dim, i), in place.
        let sv = data(dtype, numel(&ss), 5);
        let src = upload_layout(&dev, &sv, dtype, &ss, &Layout::Padded);
        let acc = upload_layout(&dev, &xv, dtype, &xs, &layout);
        run(&dev, Op::IndexAdd { dim: dim as u32 }, &[src, index], &[acc]).unwrap();
        let mut want = xv.clone();
        for (p, &s) in sv.iter().enumerate() {
            let mut t = unravel(p, &ss);
            t[dim] = iv[t[dim]] as usize;
            let w = &mut want[ravel(&t, &xs)];
            *w = round_to(dtype, *w + s);
        }
        assert_exact(&download(&dev, &acc), &want, &format!("index_add {dtype} dim {dim} {layout:?}"));
    }
}

#[rstest]
fn cumsum_matches_reference(
    #[values(ALL[0], ALL[1], ALL[2], ALL[3], ALL[4], ALL[5], ALL[6])] dtype: DType,
    #[values(Layout::Dense, Layout::Transposed, Layout::Padded)] layout: Layout,
) {
    let dev = device();
    let shape = [4, 6, 5];
    let xv: Vec<f64> = if dtype.is_float() {
        values(numel(&shape), 6, -2.0, 2.0).into_iter().map(|v| round_to(dtype, v)).collect()
    } else {
        int_values(numel(&shape), 6, 0, 8)
    };
    let x = upload_layout(&dev, &xv, dtype, &shape, &layout);
    for dim in 0..3 {
        let y = output_layout(&dev, dtype, &shape, &Layout::Padded);
        run(&dev, Op::CumSum { dim: dim as u32 }, &[x], &[y]).unwrap();
        // Exact prefix sums in f64 (the inputs are short), rounded once; the kernel rounds a
        // wider running sum at each position, so it is within one output ulp plus the
        // accumulator's error.
        let (mut want, mut scale) = (vec![0.0; xv.len()], vec![0.0; xv.len()]);
        for p in 0..xv.len() {
            let mut i = unravel(p, &shape);
            let (mut s, mut a) = (0.0, 0.0);
            for j in 0..=i[dim] {
                i[dim] = j;
                s += xv[ravel(&i, &shape)];
                a += xv[ravel(&i, &shape)].abs();
            }
            want[p] = round_to(dtype, s);
            scale[p] = a;
        }
        let got = download(&dev, &y);
        for (p, ((&g, &w), &a)) in got.iter().zip(&want).zip(&scale).enumerate() {
            let tol = 1.01 * eps(dtype) * w.abs() + 8.0 * f32::EPSILON as f64 * a * (dtype.is_float() as u8 as f64);
            assert!((g - w).abs() <= tol, "cumsum {dtype} dim {dim} {layout:?} at {p}: got {g}, expected {w}");
        }
    }
}

/// Sizes past the parallel threshold: embedding-style lookups and their backward, a long scan.
#[rstest]
fn large_operands(#[values(DType::F32, DType::BF16, DType::I64)] dtype: DType) {
    let dev = device();
    let (vocab, width, tokens) = (300, 64, 700);
    let table = data(dtype, vocab * width, 7);
    let x = upload(&dev, &table, dtype, &[vocab, width]);
    let iv = int_values(tokens, 8, 0, vocab as i64);
    let index = upload(&dev, &iv, DType::I64, &[tokens]);
    let got = run1(&dev, Op::IndexSelect { dim: 0 }, &[x, index], dtype, &[tokens, width]);
    let want: Vec<f64> = (0..tokens * width).map(|p| table[iv[p / width] as usize * width + p % width]).collect();
    assert_exact(&got, &want, "embedding lookup");

    let grads = data(dtype, tokens * width, 9);
    let src = upload(&dev, &grads, dtype, &[tokens, width]);
    let acc = upload(&dev, &vec![0.0; vocab * width], dtype, &[vocab, width]);
    run(&dev, Op::IndexAdd { dim: 0 }, &[src, index], &[acc]).unwrap();
    let mut want = vec![0.0; vocab * width];
    for t in 0..tokens {
        for c in 0..width {
            let w = &mut want[iv[t] as usize * width + c];
            *w = round_to(dtype, *w + grads[t * width + c]);
        }
    }
    assert_exact(&download(&dev, &acc), &want, "embedding backward");

    // Gather and scatter along the last dim of a [rows, 64] tensor.
    let rows = 800;
    let gi = int_values(rows * 64, 10, 0, 64);
    let xv = data(dtype, rows * 64, 11);
    let (x, index) = (upload(&dev, &xv, dtype, &[rows, 64]), upload(&dev, &gi, DType::I64, &[rows, 64]));
    let got = run1(&dev, Op::Gather { dim: 1 }, &[x, index], dtype, &[rows, 64]);
    let want: Vec<f64> = (0..rows * 64).map(|p| xv[p / 64 * 64 + gi[p] as usize]).collect();
    assert_exact(&got, &want, "large gather");
    let y = upload(&dev, &vec![0.0; rows * 64], dtype, &[rows, 64]);
    run(&dev, Op::ScatterAdd { dim: 1 }, &[x, index], &[y]).unwrap();
    let mut want = vec![0.0; rows * 64];
    for p in 0..rows * 64 {
        let w = &mut want[p / 64 * 64 + gi[p] as usize];
        *w = round_to(dtype, *w + xv[p]);
    }
    assert_exact(&download(&dev, &y), &want, "large scatter_add");

    // A long scan along dim 0 of small integers (exact in every dtype here).
    let (n, c) = (5000, 12);
    let sv: Vec<f64> = int_values(n * c, 12, -1, 2);
    let x = upload(&dev, &sv, dtype, &[n, c]);
    let got = run1(&dev, Op::CumSum { dim: 0 }, &[x], dtype, &[n, c]);
    let mut want = sv.clone();
    for p in c..n * c {
        want[p] += want[p - c];
    }
    assert_exact(&got, &want, "long cumsum");
}

#[test]
fn bad_indices_are_refused_and_leave_outputs_untouched() {
    let dev = device();
    let x = upload(&dev, &values(20, 1, 0.0, 1.0), DType::F32, &[4, 5]);
    for bad in [7.0, -1.0, 4.0] {
        let index = upload(&dev, &[0.0, bad, 1.0], DType::I64, &[3]);
        let y = output(&dev, DType::F32, &[3, 5]);
        let needle = format!("{bad}");
        expect_err(
            run(&dev, Op::IndexSelect { dim: 0 }, &[x, index], &[y]),
            ErrorKind::InvalidArgument,
            &["index_select", &needle, "size 4", "dim 0"],
        );
        // In place: nothing is added when any index is bad.
        let acc = upload(&dev, &[1.0; 20], DType::F32, &[4, 5]);
        let src = upload(&dev, &[2.0; 15], DType::F32, &[3, 5]);
        expect_err(
            run(&dev, Op::IndexAdd { dim: 0 }, &[src, index], &[acc]),
            ErrorKind::InvalidArgument,
            &["index_add", &needle],
        );
        assert_eq!(download(&dev, &acc), vec![1.0; 20]);
    }
    let gi = upload(&dev, &[0.0, 1.0, 5.0, 2.0], DType::I64, &[2, 2]);
    let y = output(&dev, DType::F32, &[2, 2]);
    expect_err(
        run(&dev, Op::Gather { dim: 1 }, &[x, gi], &[y]),
        ErrorKind::InvalidArgument,
        &["gather", "5", "size 5"],
    );
    let acc = upload(&dev, &[0.0; 20], DType::F32, &[4, 5]);
    let src = upload(&dev, &[1.0; 4], DType::F32, &[2, 2]);
    expect_err(
        run(&dev, Op::ScatterAdd { dim: 1 }, &[src, gi], &[acc]),
        ErrorKind::InvalidArgument,
        &["scatter_add", "5"],
    );
    assert_eq!(download(&dev, &acc), vec![0.0; 20]);
}

#[test]
fn bad_shapes_and_dtypes_are_refused() {
    let dev = device();
    let x = upload(&dev, &values(20, 1, 0.0, 1.0), DType::F32, &[4, 5]);
    let i1 = upload(&dev, &[0.0, 1.0], DType::I64, &[2]);
    let i2 = upload(&dev, &[0.0, 1.0], DType::I64, &[1, 2]);
    // Gather: rank mismatch, output shape mismatch, index larger than x outside dim.
    expect_err(
        run(&dev, Op::Gather { dim: 0 }, &[x, i1], &[output(&dev, DType::F32, &[2])]),
        ErrorKind::ShapeMismatch,
        &["gather", "[2]", "[4, 5]"],
    );
    expect_err(
        run(&dev, Op::Gather { dim: 0 }, &[x, i2], &[output(&dev, DType::F32, &[2, 1])]),
        ErrorKind::ShapeMismatch,
        &["gather"],
    );
    let wide = upload(&dev, &[0.0; 6], DType::I64, &[1, 6]);
    expect_err(
        run(&dev, Op::Gather { dim: 0 }, &[x, wide], &[output(&dev, DType::F32, &[1, 6])]),
        ErrorKind::ShapeMismatch,
        &["gather"],
    );
    // Dim out of range, index dtype, output dtype.
    expect_err(
        run(&dev, Op::IndexSelect { dim: 2 }, &[x, i1], &[output(&dev, DType::F32, &[4, 2])]),
        ErrorKind::InvalidArgument,
        &["index_select", "dim 2"],
    );
    let i32_index = upload(&dev, &[0.0, 1.0], DType::I32, &[2]);
    expect_err(
        run(&dev, Op::IndexSelect { dim: 0 }, &[x, i32_index], &[output(&dev, DType::F32, &[2, 5])]),
        ErrorKind::DtypeMismatch,
        &["index_select", "int64"],
    );
    expect_err(
        run(&dev, Op::IndexSelect { dim: 0 }, &[x, i1], &[output(&dev, DType::F64, &[2, 5])]),
        ErrorKind::DtypeMismatch,
        &["index_select"],
    );
    expect_err(
        run(&dev, Op::IndexSelect { dim: 0 }, &[x, i2], &[output(&dev, DType::F32, &[2, 5])]),
        ErrorKind::ShapeMismatch,
        &["index_select", "rank 1"],
    );
    expect_err(
        run(&dev, Op::IndexSelect { dim: 0 }, &[x, i1], &[output(&dev, DType::F32, &[3, 5])]),
        ErrorKind::ShapeMismatch,
        &["index_select"],
    );
    expect_err(
        run(&dev, Op::CumSum { dim: 0 }, &[x], &[output(&dev, DType::F32, &[5, 4])]),
        ErrorKind::ShapeMismatch,
        &["cumsum"],
    );
    let b = upload(&dev, &[1.0, 0.0], DType::Bool, &[2]);
    expect_err(
        run(&dev, Op::CumSum { dim: 0 }, &[b], &[output(&dev, DType::Bool, &[2])]),
        ErrorKind::Unsupported,
        &["cumsum"],
    );
    expect_err(
        run(&dev, Op::Gather { dim: 0 }, &[x], &[output(&dev, DType::F32, &[4, 5])]),
        ErrorKind::InvalidArgument,
        &["gather"],
    );
}

#[test]
fn in_place_outputs_must_not_overlap_inputs_or_themselves() {
    let dev = device();
    let acc = upload(&dev, &[0.0; 20], DType::F32, &[4, 5]);
    let index = upload(&dev, &[0.0, 1.0], DType::I64, &[2]);
    // src is a view of acc's own buffer.
    let mut src = acc;
    src.shape[0] = 2;
    expect_err(
        run(&dev, Op::IndexAdd { dim: 0 }, &[src, index], &[acc]),
        ErrorKind::InvalidArgument,
        &["index_add", "overlaps"],
    );
    // A broadcast (stride 0) output.
    let row = upload(&dev, &[0.0; 5], DType::F32, &[1, 5]);
    let wide = broadcast(&row, &[4, 5]);
    let src = upload(&dev, &[1.0; 10], DType::F32, &[2, 5]);
    expect_err(
        run(&dev, Op::IndexAdd { dim: 0 }, &[src, index], &[wide]),
        ErrorKind::InvalidArgument,
        &["index_add", "overlaps itself"],
    );
}

#[test]
fn empty_operands_are_fine() {
    let dev = device();
    let x = upload(&dev, &values(20, 1, 0.0, 1.0), DType::F32, &[4, 5]);
    let index = upload(&dev, &[], DType::I64, &[0]);
    assert!(run1(&dev, Op::IndexSelect { dim: 0 }, &[x, index], DType::F32, &[0, 5]).is_empty());
    let e = upload(&dev, &[], DType::F32, &[0, 3]);
    assert!(run1(&dev, Op::CumSum { dim: 1 }, &[e], DType::F32, &[0, 3]).is_empty());
    // Selecting from an empty dim with an empty index is fine; any index into it is not.
    let e = upload(&dev, &[], DType::F32, &[0, 3]);
    assert!(run1(&dev, Op::IndexSelect { dim: 0 }, &[e, index], DType::F32, &[0, 3]).is_empty());
    let one = upload(&dev, &[0.0], DType::I64, &[1]);
    let y = output(&dev, DType::F32, &[1, 3]);
    expect_err(run(&dev, Op::IndexSelect { dim: 0 }, &[e, one], &[y]), ErrorKind::InvalidArgument, &["size 0"]);
}
