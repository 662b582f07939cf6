//! Tests through the `Device` trait, as the core would call it (minus the plugin boundary).

use super::*;
use genesis_backend_api::sdk::{philox, scalar};
use genesis_backend_api::{BinaryOp, DType, ErrorKind, OpKind, ReduceOp, UnaryOp};

fn device() -> ExampleDevice {
    ExampleBackend::new().open_device(0).expect("device 0 opens")
}

fn upload(dev: &ExampleDevice, bytes: &[u8]) -> BufferId {
    let id = dev.allocate(bytes.len()).expect("allocate");
    dev.write(id, 0, bytes).expect("write");
    id
}

/// A contiguous f32 tensor holding `values`.
fn f32_tensor(dev: &ExampleDevice, values: &[f32], shape: &[usize]) -> TensorDesc {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    TensorDesc::contiguous(upload(dev, &bytes), 0, DType::F32, shape).expect("desc")
}

fn i64_tensor(dev: &ExampleDevice, values: &[i64], shape: &[usize]) -> TensorDesc {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    TensorDesc::contiguous(upload(dev, &bytes), 0, DType::I64, shape).expect("desc")
}

/// A fresh contiguous tensor (zero-filled).
fn empty(dev: &ExampleDevice, dtype: DType, shape: &[usize]) -> TensorDesc {
    let bytes = shape.iter().product::<usize>() * dtype.size_in_bytes();
    TensorDesc::contiguous(dev.allocate(bytes).expect("allocate"), 0, dtype, shape).expect("desc")
}

/// The kind of the error with which `op` must fail on these operands.
fn error_kind(dev: &ExampleDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> ErrorKind {
    dev.execute(op, inputs, outputs).expect_err("the op must fail").kind
}

/// The raw bytes of a contiguous tensor.
fn bytes_of(dev: &ExampleDevice, t: &TensorDesc) -> Vec<u8> {
    let mut bytes = vec![0u8; t.numel() * t.dtype().expect("dtype").size_in_bytes()];
    dev.read(t.buffer, t.offset_bytes as usize, &mut bytes).expect("read");
    bytes
}

fn f32s(dev: &ExampleDevice, t: &TensorDesc) -> Vec<f32> {
    bytes_of(dev, t).chunks(4).map(|c| f32::from_ne_bytes(c.try_into().expect("4 bytes"))).collect()
}

fn i64s(dev: &ExampleDevice, t: &TensorDesc) -> Vec<i64> {
    bytes_of(dev, t).chunks(8).map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes"))).collect()
}

fn bools(dev: &ExampleDevice, t: &TensorDesc) -> Vec<bool> {
    bytes_of(dev, t).iter().map(|&b| b != 0).collect()
}

#[test]
fn strided_add_with_a_broadcast_input() {
    let dev = device();
    // a is the transpose of the 3x2 buffer [[1, 2], [3, 4], [5, 6]]: (2, 3) with strides (1, 2).
    let a_buf = f32_tensor(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[6]).buffer;
    let a = TensorDesc::new(a_buf, 0, DType::F32, &[2, 3], &[1, 2]).unwrap();
    // b is one row [10, 20, 30] behind a padding element (byte offset 4), repeated over the
    // rows with stride 0.
    let b_buf = f32_tensor(&dev, &[-1.0, 10.0, 20.0, 30.0], &[4]).buffer;
    let b = TensorDesc::new(b_buf, 4, DType::F32, &[2, 3], &[0, 1]).unwrap();
    let y = empty(&dev, DType::F32, &[2, 3]);

    dev.execute(&Op::Binary(BinaryOp::Add), &[a, b], &[y]).unwrap();
    assert_eq!(f32s(&dev, &y), [11.0, 23.0, 35.0, 12.0, 24.0, 36.0]);

    // A comparison writes bools.
    let mask = empty(&dev, DType::Bool, &[2, 3]);
    dev.execute(&Op::BinaryScalar { op: BinaryOp::Gt, scalar: 3.5, scalar_first: false }, &[a], &[mask]).unwrap();
    assert_eq!(bools(&dev, &mask), [false, false, true, false, true, true]);
}

#[test]
fn transposed_matmul_matches_a_hand_computed_product() {
    let dev = device();
    // a = [[1, 2, 3], [4, 5, 6]] stored column-major, i.e. as the transpose of a 3x2 buffer.
    let a_buf = f32_tensor(&dev, &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0], &[6]).buffer;
    let a = TensorDesc::new(a_buf, 0, DType::F32, &[2, 3], &[1, 2]).unwrap();
    let b = f32_tensor(&dev, &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2]);
    let y = empty(&dev, DType::F32, &[2, 2]);

    dev.execute(&Op::Matmul, &[a, b], &[y]).unwrap();
    // [1*7 + 2*9 + 3*11, 1*8 + 2*10 + 3*12; 4*7 + 5*9 + 6*11, 4*8 + 5*10 + 6*12]
    assert_eq!(f32s(&dev, &y), [58.0, 64.0, 139.0, 154.0]);

    let bad = empty(&dev, DType::F32, &[2, 3]);
    assert_eq!(dev.execute(&Op::Matmul, &[a, b], &[bad]).unwrap_err().kind, ErrorKind::ShapeMismatch);
}

#[test]
fn argmax_and_argmin_take_the_first_tie_and_the_first_nan() {
    let dev = device();
    let nan = f32::NAN;
    #[rustfmt::skip]
    let x = f32_tensor(&dev, &[
        1.0, 3.0, 3.0, 2.0,
        1.0, nan, 5.0, nan,
        2.0, 2.0, 2.0, 2.0,
    ], &[3, 4]);
    let y = empty(&dev, DType::I64, &[3, 1]);
    dev.execute(&Op::Reduce(ReduceOp::ArgMax), &[x], &[y]).unwrap();
    assert_eq!(i64s(&dev, &y), [1, 1, 0]);
    dev.execute(&Op::Reduce(ReduceOp::ArgMin), &[x], &[y]).unwrap();
    assert_eq!(i64s(&dev, &y), [0, 1, 0]);

    // Along a leading axis: column 0 is [1, 1, 2], column 1 is [3, NaN, 2].
    let cols = empty(&dev, DType::I64, &[1, 4]);
    dev.execute(&Op::Reduce(ReduceOp::ArgMax), &[x], &[cols]).unwrap();
    assert_eq!(i64s(&dev, &cols), [2, 1, 1, 1]);

    // Max propagates NaN; an empty max is an error while an empty sum is 0.
    let m = empty(&dev, DType::F32, &[3, 1]);
    dev.execute(&Op::Reduce(ReduceOp::Max), &[x], &[m]).unwrap();
    let maxes = f32s(&dev, &m);
    assert!(maxes[0] == 3.0 && maxes[1].is_nan() && maxes[2] == 2.0, "{maxes:?}");
    let nothing = f32_tensor(&dev, &[], &[2, 0]);
    let two = empty(&dev, DType::F32, &[2, 1]);
    assert_eq!(error_kind(&dev, &Op::Reduce(ReduceOp::Max), &[nothing], &[two]), ErrorKind::InvalidArgument);
    dev.execute(&Op::Reduce(ReduceOp::Sum), &[nothing], &[two]).unwrap();
    assert_eq!(f32s(&dev, &two), [0.0, 0.0]);

    // Arg reductions reduce one axis only.
    let one = empty(&dev, DType::I64, &[1, 1]);
    assert_eq!(error_kind(&dev, &Op::Reduce(ReduceOp::ArgMax), &[x], &[one]), ErrorKind::InvalidArgument);
}

#[test]
fn an_out_of_range_gather_index_is_an_error() {
    let dev = device();
    let x = f32_tensor(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let y = empty(&dev, DType::F32, &[2, 2]);

    let index = i64_tensor(&dev, &[2, 0, 1, 1], &[2, 2]);
    dev.execute(&Op::Gather { dim: 1 }, &[x, index], &[y]).unwrap();
    assert_eq!(f32s(&dev, &y), [3.0, 1.0, 5.0, 5.0]);

    for bad in [3, -1] {
        let index = i64_tensor(&dev, &[0, bad, 1, 1], &[2, 2]);
        let err = dev.execute(&Op::Gather { dim: 1 }, &[x, index], &[y]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains("gather") && err.message.contains(&bad.to_string()), "{}", err.message);
    }
}

#[test]
fn scatter_and_index_ops_accumulate_in_place() {
    let dev = device();
    let src = f32_tensor(&dev, &[1.0, 2.0, 3.0, 4.0], &[1, 4]);
    let index = i64_tensor(&dev, &[0, 2, 0, 1], &[1, 4]);
    let y = f32_tensor(&dev, &[10.0, 10.0, 10.0], &[1, 3]);
    dev.execute(&Op::ScatterAdd { dim: 1 }, &[src, index], &[y]).unwrap();
    assert_eq!(f32s(&dev, &y), [14.0, 14.0, 12.0]);

    let rows = i64_tensor(&dev, &[2, 0], &[2]);
    let x = f32_tensor(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let picked = empty(&dev, DType::F32, &[2, 2]);
    dev.execute(&Op::IndexSelect { dim: 0 }, &[x, rows], &[picked]).unwrap();
    assert_eq!(f32s(&dev, &picked), [5.0, 6.0, 1.0, 2.0]);

    let acc = f32_tensor(&dev, &[0.0; 6], &[3, 2]);
    dev.execute(&Op::IndexAdd { dim: 0 }, &[picked, rows], &[acc]).unwrap();
    assert_eq!(f32s(&dev, &acc), [1.0, 2.0, 0.0, 0.0, 5.0, 6.0]);

    let sums = empty(&dev, DType::F32, &[3, 2]);
    dev.execute(&Op::CumSum { dim: 0 }, &[x], &[sums]).unwrap();
    assert_eq!(f32s(&dev, &sums), [1.0, 2.0, 4.0, 6.0, 9.0, 12.0]);
}

#[test]
fn casts_fills_and_random_fills() {
    let dev = device();
    let x = f32_tensor(&dev, &[-1.7, 0.0, 2.9], &[3]);
    let as_int = empty(&dev, DType::I64, &[3]);
    dev.execute(&Op::Cast, &[x], &[as_int]).unwrap();
    assert_eq!(i64s(&dev, &as_int), [-1, 0, 2]);
    let as_bool = empty(&dev, DType::Bool, &[3]);
    dev.execute(&Op::Cast, &[x], &[as_bool]).unwrap();
    assert_eq!(bools(&dev, &as_bool), [true, false, true]);

    dev.execute(&Op::Fill { value: 7.0 }, &[], &[as_int]).unwrap();
    assert_eq!(i64s(&dev, &as_int), [7, 7, 7]);

    let u = empty(&dev, DType::F32, &[5]);
    dev.execute(&Op::RandUniform { seed: 42, offset: 3, low: 2.0, high: 4.0 }, &[], &[u]).unwrap();
    let expected: Vec<f32> = (0..5).map(|i| (2.0 + 2.0 * philox::uniform_f32(42, 3, i) as f64) as f32).collect();
    assert_eq!(f32s(&dev, &u), expected);

    let ones = f32_tensor(&dev, &[1.0; 64], &[64]);
    let dropped = empty(&dev, DType::F32, &[64]);
    dev.execute(&Op::Dropout { seed: 1, offset: 0, p: 0.5 }, &[ones], &[dropped]).unwrap();
    for (i, v) in f32s(&dev, &dropped).into_iter().enumerate() {
        let kept = philox::uniform_f32(1, 0, i as u64) >= 0.5;
        assert_eq!(v, if kept { 2.0 } else { 0.0 });
    }
}

#[test]
fn elementwise_edge_cases() {
    let dev = device();
    let x = f32_tensor(&dev, &[-1.0, f32::NAN, 2.5, -7.5], &[4]);
    let y = empty(&dev, DType::F32, &[4]);
    dev.execute(&Op::Unary(UnaryOp::Relu), &[x], &[y]).unwrap();
    let relu = f32s(&dev, &y);
    assert!(relu[0] == 0.0 && relu[1].is_nan() && relu[2] == 2.5);
    dev.execute(&Op::Unary(UnaryOp::Round), &[x], &[y]).unwrap();
    assert_eq!(f32s(&dev, &y)[2..], [2.0, -8.0]);
    dev.execute(&Op::BinaryScalar { op: BinaryOp::Remainder, scalar: 2.0, scalar_first: false }, &[x], &[y]).unwrap();
    assert_eq!(f32s(&dev, &y)[2..], [0.5, 0.5]);
    let nan = empty(&dev, DType::Bool, &[4]);
    dev.execute(&Op::Unary(UnaryOp::IsNan), &[x], &[nan]).unwrap();
    assert_eq!(bools(&dev, &nan), [false, true, false, false]);
}

#[test]
fn erf_is_accurate() {
    // Reference values from mpmath.
    let cases = [
        (1e-8, 1.1283791670955126e-8),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (2.0, 0.9953222650189527),
        (2.9, 0.9999589021219005),
        (-1.5, -0.9661051464753108),
    ];
    for (x, want) in cases {
        let got = scalar::erf(x);
        assert!(((got - want) / want).abs() < 1e-13, "erf({x}) = {got}, want {want}");
    }
    let tail = [(3.0, 2.209049699858544e-5), (3.5, 7.430983723414128e-7), (5.0, 1.537459794428035e-12)];
    for (x, want) in tail {
        let got = scalar::erfc(x);
        assert!(((got - want) / want).abs() < 1e-12, "erfc({x}) = {got}, want {want}");
    }
}

#[test]
fn unknown_buffers_are_errors() {
    let dev = device();
    assert_eq!(dev.free(BufferId(12345)).unwrap_err().kind, ErrorKind::InvalidArgument);
    let id = dev.allocate(16).unwrap();
    dev.free(id).unwrap();
    assert_eq!(dev.free(id).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(dev.write(id, 0, &[1]).unwrap_err().kind, ErrorKind::InvalidArgument);
}

#[test]
fn out_of_range_transfers_and_views_are_errors() {
    let dev = device();
    let id = dev.allocate(8).unwrap();
    let mut four = [0u8; 4];
    assert_eq!(dev.write(id, 5, &four).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(dev.read(id, usize::MAX, &mut four).unwrap_err().kind, ErrorKind::InvalidArgument);
    dev.read(id, 4, &mut four).unwrap();

    // Three f32s do not fit in 8 bytes; nor does a view with a huge stride.
    let x = TensorDesc::contiguous(id, 0, DType::F32, &[3]).unwrap();
    let y = empty(&dev, DType::F32, &[3]);
    assert_eq!(error_kind(&dev, &Op::Unary(UnaryOp::Neg), &[x], &[y]), ErrorKind::InvalidArgument);
    let x = TensorDesc::new(id, 0, DType::F32, &[2, 2], &[isize::MAX, 1]).unwrap();
    let y = empty(&dev, DType::F32, &[2, 2]);
    assert_eq!(error_kind(&dev, &Op::Unary(UnaryOp::Neg), &[x], &[y]), ErrorKind::InvalidArgument);
}

#[test]
fn memory_is_accounted_and_impossible_allocations_fail_cleanly() {
    let dev = device();
    let a = dev.allocate(100).unwrap();
    let b = dev.allocate(50).unwrap();
    dev.free(a).unwrap();
    let stats = dev.memory_stats().unwrap();
    assert_eq!((stats.allocated_bytes, stats.reserved_bytes, stats.peak_allocated_bytes), (50, 50, 150));
    assert_eq!((stats.active_allocations, stats.allocation_requests, stats.cache_misses), (1, 2, 2));
    dev.reset_peak_memory().unwrap();
    assert_eq!(dev.memory_stats().unwrap().peak_allocated_bytes, 50);

    let err = dev.allocate((u64::MAX / 2) as usize).unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutOfMemory);
    assert_eq!(dev.memory_stats().unwrap().oom_count, 1);
    dev.free(b).unwrap();
}

#[test]
fn unclaimed_ops_and_dtypes_are_unsupported() {
    let dev = device();
    let caps = dev.capabilities();
    let x = f32_tensor(&dev, &[1.0, 2.0], &[1, 2]);
    let y = empty(&dev, DType::F32, &[1, 2]);
    assert!(!caps.iter().any(|c| c.op == Op::Softmax.kind()));
    assert_eq!(dev.execute(&Op::Softmax, &[x], &[y]).unwrap_err().kind, ErrorKind::Unsupported);

    let ints = i64_tensor(&dev, &[1, 2], &[1, 2]);
    let out = empty(&dev, DType::I64, &[1, 2]);
    assert!(!caps.contains(&Capability { op: OpKind::binary(BinaryOp::Add), dtype: DType::I64 as u32 }));
    let err = dev.execute(&Op::Binary(BinaryOp::Add), &[ints, ints], &[out]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unsupported);
    assert!(err.message.contains("add") && err.message.contains("int64"), "{}", err.message);

    assert!(caps.contains(&Capability { op: OpKind::unary(UnaryOp::Gelu), dtype: DType::F32 as u32 }));
    assert!(!caps.contains(&Capability { op: OpKind::unary(UnaryOp::Not), dtype: DType::Bool as u32 }));
}

#[test]
fn gelu_keeps_its_precision_in_the_tails() {
    // Reference values from mpmath: exact GELU, then its tanh approximation.
    let exact = [(-5.0, -1.4332578593959695e-6), (-1.0, -0.15865525393145705), (0.5, 0.34573123063700656)];
    for (x, want) in exact {
        let got = scalar::unary(UnaryOp::Gelu, x);
        assert!(((got - want) / want).abs() < 1e-12, "gelu({x}) = {got}, want {want}");
    }
    let tanh = [(-5.0, -2.2917961966295044e-7), (3.0, 2.996362607918227)];
    for (x, want) in tanh {
        let got = scalar::unary(UnaryOp::GeluTanh, x);
        assert!(((got - want) / want).abs() < 1e-9, "gelu_tanh({x}) = {got}, want {want}");
    }
}

#[test]
fn malformed_descriptors_are_errors_not_panics() {
    let dev = device();
    let y = empty(&dev, DType::F32, &[2]);
    let good = f32_tensor(&dev, &[1.0, 2.0], &[2]);
    let mut huge = good;
    huge.ndim = 3;
    huge.shape[..3].copy_from_slice(&[u64::MAX, u64::MAX, 0]);
    let mut negative = good;
    negative.strides[0] = -1;
    let mut rank_too_big = good;
    rank_too_big.ndim = 100;
    let mut unknown_buffer = good;
    unknown_buffer.buffer = BufferId(0);
    let mut past_the_end = good;
    past_the_end.offset_bytes = u64::MAX;
    for bad in [huge, negative, rank_too_big, unknown_buffer, past_the_end] {
        let err = dev.execute(&Op::Unary(UnaryOp::Exp), &[bad], &[y]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{bad:?}: {err}");
    }
    let mut unknown_dtype = good;
    unknown_dtype.dtype = 99;
    assert_eq!(error_kind(&dev, &Op::Unary(UnaryOp::Exp), &[unknown_dtype], &[y]), ErrorKind::Unsupported);

    // An output that overlaps its input (other than exactly) is refused.
    let buf = f32_tensor(&dev, &[1.0, 2.0, 3.0], &[3]).buffer;
    let x = TensorDesc::contiguous(buf, 0, DType::F32, &[2]).unwrap();
    let shifted = TensorDesc::contiguous(buf, 4, DType::F32, &[2]).unwrap();
    assert_eq!(error_kind(&dev, &Op::Unary(UnaryOp::Exp), &[x], &[shifted]), ErrorKind::InvalidArgument);
    dev.execute(&Op::Unary(UnaryOp::Exp), &[x], &[x]).unwrap();
}

#[test]
fn the_exported_module_answers_through_the_wire_functions() {
    let module = genesis_plugin_module();
    let probe = module.probe()().into_result().unwrap();
    assert_eq!(probe.device_count, 1);
    let info = genesis_backend_api::BackendInfo::from(module.info()().into_result().unwrap());
    assert_eq!(info.name, "example");
    assert_eq!(genesis_plugin_declaration.name(), Some("example"));
    // An op this backend does not claim comes back as a clean Unsupported error.
    let err =
        module.execute()(0, &Op::Softmax.encode(), Default::default(), Default::default()).into_result().unwrap_err();
    assert_eq!(ErrorKind::from_code(err.kind), ErrorKind::Unsupported);
}
