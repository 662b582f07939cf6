//! Guard regions: every output is placed inside a larger buffer, with a strided layout that
//! leaves gaps, and the bytes before, after and between its elements must be untouched.

use genesis_backend_api::{Backend, BinaryOp, BufferId, DType, Device, Op, ReduceOp, TensorDesc, UnaryOp, Window2d};
use genesis_backend_cpu::{CpuBackend, CpuDevice};

const SENTINEL: u8 = 0xA5;
const GUARD: usize = 256;

fn device() -> CpuDevice {
    CpuBackend::new().open_device(0).unwrap()
}

fn input(dev: &CpuDevice, values: &[f32], shape: &[usize]) -> TensorDesc {
    let buf = dev.allocate(values.len() * 4).unwrap();
    dev.write(buf, 0, bytemuck_bytes(values)).unwrap();
    TensorDesc::contiguous(buf, 0, DType::F32, shape).unwrap()
}

fn bytemuck_bytes(values: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, values.len() * 4) }
}

/// An output of `shape` whose last dim is strided by 2 (gaps between elements), starting
/// `GUARD` bytes into a buffer with `GUARD` spare bytes at the end, all set to the sentinel.
fn guarded_output(dev: &CpuDevice, shape: &[usize], dtype: DType) -> (BufferId, usize, TensorDesc) {
    let esize = dtype.size_in_bytes();
    let numel: usize = shape.iter().product();
    let len = GUARD * 2 + numel * 2 * esize;
    let buf = dev.allocate(len).unwrap();
    dev.write(buf, 0, &vec![SENTINEL; len]).unwrap();
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 2isize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc *= shape[i] as isize;
    }
    (buf, len, TensorDesc::new(buf, GUARD, dtype, shape, &strides).unwrap())
}

fn check_guards(dev: &CpuDevice, buf: BufferId, len: usize, out: &TensorDesc, what: &str) {
    let mut bytes = vec![0u8; len];
    dev.read(buf, 0, &mut bytes).unwrap();
    let esize = out.dtype().unwrap().size_in_bytes();
    let mut written = vec![false; len];
    for o in genesis_backend_api::sdk::offsets(&out.shape(), &out.strides()) {
        let start = out.offset_bytes as usize + o as usize * esize;
        written[start..start + esize].iter_mut().for_each(|w| *w = true);
    }
    for (i, (&b, &w)) in bytes.iter().zip(&written).enumerate() {
        assert!(w || b == SENTINEL, "{what}: byte {i} outside the output was overwritten");
    }
    assert!(written.iter().zip(&bytes).any(|(&w, &b)| w && b != SENTINEL), "{what}: nothing was written");
}

/// (name, op, inputs, output shape, output dtype)
type GuardCase = (&'static str, Op, Vec<TensorDesc>, Vec<usize>, DType);

#[test]
fn kernels_write_only_their_output_elements() {
    let dev = device();
    let a = input(&dev, &(0..24).map(|i| i as f32 * 0.1 - 1.0).collect::<Vec<_>>(), &[4, 6]);
    let b = input(&dev, &(0..24).map(|i| (i % 5) as f32 * 0.3).collect::<Vec<_>>(), &[4, 6]);
    let w = input(&dev, &(0..18).map(|i| i as f32 * 0.05).collect::<Vec<_>>(), &[6, 3]);
    let idx_buf = dev.allocate(4 * 8).unwrap();
    dev.write(idx_buf, 0, &[3i64, 0, 2, 2].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()).unwrap();
    let idx = TensorDesc::contiguous(idx_buf, 0, DType::I64, &[4]).unwrap();
    let img = input(&dev, &(0..2 * 3 * 5 * 5).map(|i| (i % 7) as f32).collect::<Vec<_>>(), &[2, 3, 5, 5]);
    let kernel = input(&dev, &(0..4 * 3 * 3 * 3).map(|i| (i % 3) as f32 * 0.1).collect::<Vec<_>>(), &[4, 3, 3, 3]);
    let window = Window2d { kernel: [3, 3], stride: [1, 1], padding: [1, 1], dilation: [1, 1] };

    let cases: Vec<GuardCase> = vec![
        ("add", Op::Binary(BinaryOp::Add), vec![a, b], vec![4, 6], DType::F32),
        ("lt", Op::Binary(BinaryOp::Lt), vec![a, b], vec![4, 6], DType::Bool),
        ("exp", Op::Unary(UnaryOp::Exp), vec![a], vec![4, 6], DType::F32),
        ("sum rows", Op::Reduce(ReduceOp::Sum), vec![a], vec![4, 1], DType::F32),
        ("argmax", Op::Reduce(ReduceOp::ArgMax), vec![a], vec![1, 6], DType::I64),
        ("matmul", Op::Matmul, vec![a, w], vec![4, 3], DType::F32),
        ("softmax", Op::Softmax, vec![a], vec![4, 6], DType::F32),
        ("index_select", Op::IndexSelect { dim: 0 }, vec![a, idx], vec![4, 6], DType::F32),
        ("cast", Op::Cast, vec![a], vec![4, 6], DType::F64),
        ("rand", Op::RandUniform { seed: 1, offset: 0, low: 0.0, high: 1.0 }, vec![], vec![4, 6], DType::F32),
        ("conv2d", Op::Conv2d { window, groups: 1 }, vec![img, kernel], vec![2, 4, 5, 5], DType::F32),
    ];
    for (what, op, inputs, shape, dtype) in cases {
        let (buf, len, out) = guarded_output(&dev, &shape, dtype);
        dev.execute(&op, &inputs, &[out]).unwrap_or_else(|e| panic!("{what}: {e}"));
        check_guards(&dev, buf, len, &out, what);
    }
}

#[test]
fn an_output_that_leaves_its_buffer_is_refused_before_any_write() {
    let dev = device();
    let a = input(&dev, &[1.0; 8], &[8]);
    let buf = dev.allocate(16).unwrap();
    let too_long = TensorDesc::contiguous(buf, 0, DType::F32, &[8]).unwrap();
    let e = dev.execute(&Op::Unary(UnaryOp::Neg), &[a], &[too_long]).unwrap_err();
    assert_eq!(e.kind, genesis_backend_api::ErrorKind::InvalidArgument);
}
