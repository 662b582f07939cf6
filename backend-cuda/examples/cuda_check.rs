//! The GPU checker: loads the CUDA plugin from its file (as the core does) and the CPU
//! backend (linked in), runs every op the CUDA device claims on random inputs in several
//! layouts (dense, transposed, broadcast, offset, large and aligned), compares the results
//! with the CPU reference, and checks the error paths and the allocator. Timings are
//! `cuda_bench`'s.
//!
//! `cuda_check <plugin.so>`; exits non-zero when any check fails.

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use common::{load_plugin, random_bytes, values, Dev, Rng, R};
use genesis_backend_api::{
    contiguous_strides, BackendError, BinaryOp, BufferId, DType, ErrorKind, Op, OpKind, ReduceOp, TensorDesc, UnaryOp,
};
use std::collections::BTreeMap;
use std::time::Instant;

/// An operand layout: the view's shape and strides, its buffer's element count and offset.
#[derive(Clone, Debug)]
struct Layout {
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
    elems: usize,
}

impl Layout {
    fn dense(shape: &[usize]) -> Layout {
        Layout { shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0, elems: shape.iter().product() }
    }
    /// The transpose of a dense (cols, rows) buffer seen as (rows, cols).
    fn transposed(rows: usize, cols: usize) -> Layout {
        Layout { shape: vec![rows, cols], strides: vec![1, rows as isize], offset: 0, elems: rows * cols }
    }
    /// A (rows, cols) view of a length-`cols` vector repeated along rows.
    fn broadcast_rows(rows: usize, cols: usize) -> Layout {
        Layout { shape: vec![rows, cols], strides: vec![0, 1], offset: 0, elems: cols }
    }
    /// Dense, starting `offset` elements into the buffer (unaligned for vector loads).
    fn offset(shape: &[usize], offset: usize) -> Layout {
        let mut l = Layout::dense(shape);
        l.offset = offset;
        l.elems += offset;
        l
    }
}

/// Both backends, plus the tally.
struct Checker {
    cuda: Dev,
    cpu: Dev,
    rng: Rng,
    passed: BTreeMap<String, usize>,
    failed: Vec<String>,
    /// Cases the CPU reference itself could not run (a reference bug, not a CUDA failure).
    unreferenced: Vec<String>,
    /// Claimed pairs this checker has no sample for; the conformance harness checks them.
    unsampled: Vec<String>,
}

const REFERENCE_FAILED: &str = "CPU reference failed";

/// Tolerance of a comparison: exact bits (NaN equal to NaN) or |a-b| <= atol + rtol |b|.
#[derive(Clone, Copy)]
enum Tol {
    Exact,
    Close(f64, f64),
}

fn float_tol(dtype: DType, scale: f64) -> Tol {
    match dtype {
        DType::F64 => Tol::Close(1e-12 * scale, 1e-12 * scale),
        DType::F32 => Tol::Close(2e-6 * scale, 1e-6 * scale),
        DType::F16 => Tol::Close(2e-3 * scale, 1e-3 * scale),
        DType::BF16 => Tol::Close(1.6e-2 * scale, 8e-3 * scale),
        _ => Tol::Exact,
    }
}

impl Checker {
    /// Count a device check that ran to an outcome: under `passed` when it held, else as a
    /// failure of `what` (or, when the check itself could not run, that).
    fn tally(&mut self, passed: &str, what: &str, result: R<Result<(), String>>) {
        match result {
            Ok(Ok(())) => *self.passed.entry(passed.into()).or_default() += 1,
            Ok(Err(e)) => self.failed.push(format!("{what}: {e}")),
            Err(e) => self.failed.push(format!("{what} could not run: {e}")),
        }
    }

    /// Put the same random inputs on both devices, run `op` on each, compare every output.
    fn case(&mut self, label: &str, op: &Op, ins: &[(DType, Layout, bool)], outs: &[(DType, Layout)], tol: Tol) {
        let result = self.try_case(op, ins, outs, tol);
        let key = label.to_string();
        match result {
            Ok(()) => *self.passed.entry(key).or_default() += 1,
            Err(e) if e.message.starts_with(REFERENCE_FAILED) => self.unreferenced.push(format!("{label}: {e}")),
            Err(e) => self.failed.push(format!("{label}: {e}")),
        }
    }

    /// The same random bytes for `layout` in a new buffer on each device (CUDA, then CPU), each
    /// with its descriptor, and their length.
    fn mirrored(&mut self, dtype: DType, layout: &Layout, positive: bool) -> R<([(BufferId, TensorDesc); 2], usize)> {
        let bytes = random_bytes(&mut self.rng, dtype, layout.elems, positive);
        let off = layout.offset * dtype.size_in_bytes();
        let put = |dev: &Dev| -> R<(BufferId, TensorDesc)> {
            let b = dev.alloc(bytes.len())?;
            dev.write(b, &bytes)?;
            Ok((b, TensorDesc::new(b, off, dtype, &layout.shape, &layout.strides)?))
        };
        Ok(([put(&self.cuda)?, put(&self.cpu)?], bytes.len()))
    }

    fn try_case(&mut self, op: &Op, ins: &[(DType, Layout, bool)], outs: &[(DType, Layout)], tol: Tol) -> R<()> {
        let mut bufs: Vec<(BufferId, BufferId)> = Vec::new();
        let mut in_descs = (Vec::new(), Vec::new());
        for (dtype, layout, positive) in ins {
            let ([(g, on_cuda), (c, on_cpu)], _) = self.mirrored(*dtype, layout, *positive)?;
            in_descs.0.push(on_cuda);
            in_descs.1.push(on_cpu);
            bufs.push((g, c));
        }
        let mut out_descs = (Vec::new(), Vec::new());
        let mut out_bufs = Vec::new();
        for (dtype, layout) in outs {
            // Outputs start with the same garbage so untouched elements compare too.
            let ([(g, on_cuda), (c, on_cpu)], len) = self.mirrored(*dtype, layout, false)?;
            out_descs.0.push(on_cuda);
            out_descs.1.push(on_cpu);
            out_bufs.push((g, c, *dtype, len));
        }
        let reference = self.cpu.exec(op, &in_descs.1, &out_descs.1);
        let ours = self.cuda.exec(op, &in_descs.0, &out_descs.0);
        let mut outcome = Ok(());
        match (&reference, &ours) {
            (Err(r), _) => outcome = Err(BackendError::internal(format!("{REFERENCE_FAILED}: {r}"))),
            (Ok(()), Err(e)) => outcome = Err(e.clone()),
            (Ok(()), Ok(())) => {
                for (j, &(g, c, dtype, len)) in out_bufs.iter().enumerate() {
                    let (a, b) = (self.cuda.read(g, len)?, self.cpu.read(c, len)?);
                    if let Err(e) = compare(dtype, &a, &b, tol) {
                        outcome = Err(BackendError::internal(format!("output {j}: {e}")));
                        break;
                    }
                }
            }
        }
        for (g, c) in bufs.into_iter().chain(out_bufs.iter().map(|&(g, c, _, _)| (g, c))) {
            self.cuda.free(g)?;
            self.cpu.free(c)?;
        }
        outcome
    }
}

fn compare(dtype: DType, ours: &[u8], reference: &[u8], tol: Tol) -> Result<(), String> {
    let (a, b) = (values(dtype, ours), values(dtype, reference));
    let mut bad = 0usize;
    let mut first = None;
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        let ok = match tol {
            _ if x.is_nan() && y.is_nan() => true,
            Tol::Exact => x.to_bits() == y.to_bits() || (x == 0.0 && y == 0.0 && !dtype.is_float()),
            Tol::Close(rtol, atol) => x == y || (x - y).abs() <= atol + rtol * y.abs(),
        };
        if !ok {
            bad += 1;
            first.get_or_insert((i, x, y));
        }
    }
    match first {
        None => Ok(()),
        Some((i, x, y)) => Err(format!("{bad} of {} elements differ; first at {i}: cuda {x:e}, cpu {y:e}", a.len())),
    }
}

fn exact_unary(u: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(u, Neg | Abs | Relu | Recip | Square | Sign | Floor | Ceil | Round | Not | IsNan | Sqrt)
}

/// Ops whose inputs should be positive (logs, roots, powers).
fn wants_positive(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Log1p)
            | Op::Binary(BinaryOp::Pow)
            | Op::BinaryScalar { op: BinaryOp::Pow, .. }
    )
}

fn elementwise_layouts(n_in: usize) -> Vec<(&'static str, Vec<Layout>, Layout)> {
    let (r, c) = (37, 129);
    let mut cases = vec![
        ("dense", vec![Layout::dense(&[r, c]); n_in], Layout::dense(&[r, c])),
        ("transposed", vec![Layout::transposed(r, c); n_in], Layout::dense(&[r, c])),
        ("offset", vec![Layout::offset(&[r, c], 3); n_in], Layout::offset(&[r, c], 1)),
        ("large", vec![Layout::dense(&[1 << 20]); n_in], Layout::dense(&[1 << 20])),
        ("strided out", vec![Layout::dense(&[r, c]); n_in], Layout::transposed(r, c)),
        ("scalar", vec![Layout::dense(&[]); n_in], Layout::dense(&[])),
    ];
    if n_in >= 1 {
        let mut ins = vec![Layout::dense(&[r, c]); n_in];
        ins[n_in - 1] = Layout::broadcast_rows(r, c);
        cases.push(("broadcast", ins, Layout::dense(&[r, c])));
    }
    cases
}

fn check_ops(ck: &mut Checker, caps: &[(OpKind, DType)]) {
    for &(kind, dtype) in caps {
        let Some(name) = kind.name() else { continue };
        let op = match sample_op(kind) {
            Some(op) => op,
            None => {
                ck.unsampled.push(format!("{name} {dtype}"));
                continue;
            }
        };
        let label = format!("{name} {dtype}");
        let float_or = |t: Tol| if dtype.is_float() { t } else { Tol::Exact };
        match op {
            Op::Unary(u) => {
                let out = if u == UnaryOp::IsNan { DType::Bool } else { dtype };
                let tol = if exact_unary(u) { Tol::Exact } else { float_or(float_tol(dtype, 4.0)) };
                for (what, ins, o) in elementwise_layouts(1) {
                    let ins: Vec<_> = ins.into_iter().map(|l| (dtype, l, wants_positive(&op))).collect();
                    ck.case(&format!("{label} [{what}]"), &op, &ins, &[(out, o)], tol);
                }
            }
            Op::Binary(b) | Op::BinaryScalar { op: b, .. } => {
                let n_in = if matches!(op, Op::Binary(_)) { 2 } else { 1 };
                let out = if b.is_predicate() { DType::Bool } else { dtype };
                let tol = if b == BinaryOp::Pow { float_or(float_tol(dtype, 8.0)) } else { Tol::Exact };
                let ops: Vec<Op> = match op {
                    Op::BinaryScalar { op, scalar, .. } => {
                        (0..2).map(|f| Op::BinaryScalar { op, scalar, scalar_first: f == 1 }).collect()
                    }
                    _ => vec![op],
                };
                for op in ops {
                    for (what, ins, o) in elementwise_layouts(n_in) {
                        let ins: Vec<_> = ins.into_iter().map(|l| (dtype, l, wants_positive(&op))).collect();
                        ck.case(&format!("{label} [{what}]"), &op, &ins, &[(out, o.clone())], tol);
                    }
                }
            }
            // One input and an output of its dtype (a cast's of every dtype), exact.
            Op::Clamp { .. } | Op::Copy | Op::Dropout { .. } | Op::Cast => {
                let cast = matches!(op, Op::Cast);
                for to in if cast { DType::ALL.to_vec() } else { vec![dtype] } {
                    let name = if cast { format!("cast {dtype}->{to}") } else { label.clone() };
                    for (what, ins, o) in elementwise_layouts(1) {
                        let ins = [(dtype, ins[0].clone(), false)];
                        ck.case(&format!("{name} [{what}]"), &op, &ins, &[(to, o)], Tol::Exact);
                    }
                }
            }
            Op::Where => {
                for value in DType::ALL {
                    for (what, ins, o) in elementwise_layouts(3) {
                        let ins = vec![
                            (DType::Bool, ins[0].clone(), false),
                            (value, ins[1].clone(), false),
                            (value, ins[2].clone(), false),
                        ];
                        ck.case(&format!("where {value} [{what}]"), &op, &ins, &[(value, o)], Tol::Exact);
                    }
                }
            }
            Op::Fill { .. } => {
                for (what, _, o) in elementwise_layouts(1) {
                    ck.case(&format!("{label} [{what}]"), &op, &[], &[(dtype, o)], Tol::Exact);
                }
            }
            Op::Arange { .. } => {
                let strided = Layout { shape: vec![50], strides: vec![3], offset: 0, elems: 150 };
                for o in [Layout::dense(&[1000]), strided] {
                    ck.case(&label, &op, &[], &[(dtype, o)], Tol::Exact);
                }
            }
            Op::RandUniform { .. } | Op::RandNormal { .. } => {
                let tol = if matches!(op, Op::RandNormal { .. }) { float_tol(dtype, 0.5) } else { Tol::Exact };
                for (what, _, o) in elementwise_layouts(1) {
                    ck.case(&format!("{label} [{what}]"), &op, &[], &[(dtype, o)], tol);
                }
            }
            Op::Matmul => {
                let (b, m, k, n) = (3, 67, 45, 33);
                let tol = float_tol(dtype, if dtype == DType::F32 { 50.0 } else { 2.0 });
                let bt = Layout {
                    shape: vec![b, k, n],
                    strides: vec![(k * n) as isize, 1, k as isize],
                    offset: 0,
                    elems: b * k * n,
                };
                let bcast = Layout { shape: vec![b, k, n], strides: vec![0, n as isize, 1], offset: 0, elems: k * n };
                let a_odd = Layout {
                    shape: vec![b, m, k],
                    strides: vec![(2 * m * k) as isize, (2 * k) as isize, 2],
                    offset: 1,
                    elems: 2 * b * m * k + 1,
                };
                let y_t = Layout {
                    shape: vec![b, m, n],
                    strides: vec![(m * n) as isize, 1, m as isize],
                    offset: 0,
                    elems: b * m * n,
                };
                let cases = [
                    ("dense", Layout::dense(&[b, m, k]), Layout::dense(&[b, k, n]), Layout::dense(&[b, m, n])),
                    ("b transposed", Layout::dense(&[b, m, k]), bt, Layout::dense(&[b, m, n])),
                    ("b broadcast", Layout::dense(&[b, m, k]), bcast, Layout::dense(&[b, m, n])),
                    ("a strided", a_odd, Layout::dense(&[b, k, n]), Layout::dense(&[b, m, n])),
                    ("y transposed", Layout::dense(&[b, m, k]), Layout::dense(&[b, k, n]), y_t),
                    ("k = 0", Layout::dense(&[b, m, 0]), Layout::dense(&[b, 0, n]), Layout::dense(&[b, m, n])),
                ];
                for (what, la, lb, ly) in cases {
                    ck.case(
                        &format!("{label} [{what}]"),
                        &op,
                        &[(dtype, la, false), (dtype, lb, false)],
                        &[(dtype, ly)],
                        tol,
                    );
                }
            }
            Op::Reduce(r) => {
                let is_arg = matches!(r, ReduceOp::ArgMax | ReduceOp::ArgMin);
                let out = if is_arg { DType::I64 } else { dtype };
                let exact = matches!(r, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin);
                let tol = if exact { Tol::Exact } else { float_or(float_tol(dtype, 4.0)) };
                // Products of many factors over- or underflow at order-dependent places.
                let c = if r == ReduceOp::Prod { 5 } else { 129 };
                let d = Layout::dense;
                let strided_out = Layout { shape: vec![37, 1], strides: vec![2, 1], offset: 0, elems: 74 };
                let mut cases = vec![
                    ("last axis", d(&[37, c]), d(&[37, 1])),
                    ("first axis", d(&[37, c]), d(&[1, c])),
                    ("transposed input", Layout::transposed(37, c), d(&[37, 1])),
                    ("strided output", d(&[37, c]), strided_out),
                    ("long rows", d(&[4, if r == ReduceOp::Prod { 7 } else { 1 << 18 }]), d(&[4, 1])),
                ];
                if !is_arg {
                    cases.push(("all", d(&[37, c]), d(&[1, 1])));
                    cases.push(("outer and inner", d(&[5, 7, c]), d(&[1, 7, 1])));
                }
                if matches!(r, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod | ReduceOp::SumSquares) {
                    cases.push(("empty", d(&[3, 0]), d(&[3, 1])));
                }
                for (what, input, output) in cases {
                    ck.case(&format!("{label} [{what}]"), &op, &[(dtype, input, false)], &[(out, output)], tol);
                }
            }
            _ => ck.unsampled.push(label),
        }
    }
}

fn sample_op(kind: OpKind) -> Option<Op> {
    let name = kind.name()?;
    let ops = [
        Op::Clamp { min: -1.0, max: 2.0 },
        Op::Where,
        Op::Copy,
        Op::Cast,
        Op::Fill { value: 2.5 },
        Op::Arange { start: -3.0, step: 0.5 },
        Op::Matmul,
        Op::RandUniform { seed: 42, offset: 7, low: -2.0, high: 3.0 },
        Op::RandNormal { seed: 42, offset: 7, mean: 1.0, std: 2.0 },
        Op::Dropout { seed: 42, offset: 7, p: 0.3 },
    ];
    if let Some(op) = ops.iter().find(|o| o.kind() == kind) {
        return Some(*op);
    }
    if let Some(&u) = UnaryOp::ALL.iter().find(|u| OpKind::unary(**u) == kind) {
        return Some(Op::Unary(u));
    }
    if let Some(&b) = BinaryOp::ALL.iter().find(|b| OpKind::binary(**b) == kind) {
        return Some(Op::Binary(b));
    }
    if let Some(&b) = BinaryOp::ALL.iter().find(|b| OpKind::binary_scalar(**b) == kind) {
        return Some(Op::BinaryScalar { op: b, scalar: 1.75, scalar_first: false });
    }
    if let Some(&r) = ReduceOp::ALL.iter().find(|r| OpKind::reduce(**r) == kind) {
        return Some(Op::Reduce(r));
    }
    let _ = name;
    None
}

/// Error paths: each must be a clean error of the right kind, and the device must go on.
fn check_errors(ck: &mut Checker) {
    let expect = |what: &str, r: R<()>, kind: ErrorKind, ck: &mut Checker| match r {
        Err(e) if e.kind == kind => *ck.passed.entry(format!("error: {what}")).or_default() += 1,
        Err(e) => ck.failed.push(format!("error: {what}: got {e}, expected {kind}")),
        Ok(()) => ck.failed.push(format!("error: {what}: succeeded, expected {kind}")),
    };
    let dev = &ck.cuda;
    let run = || -> R<(BufferId, TensorDesc, TensorDesc)> {
        let b = dev.alloc(4 * 64)?;
        Ok((b, TensorDesc::contiguous(b, 0, DType::F32, &[8, 8])?, TensorDesc::contiguous(b, 0, DType::F32, &[64])?))
    };
    let Ok((b, d88, d64)) = run() else {
        ck.failed.push("error checks: setup failed".into());
        return;
    };
    let b2 = dev.alloc(4 * 64).unwrap();
    let y = TensorDesc::contiguous(b2, 0, DType::F32, &[8, 8]).unwrap();
    let yi = TensorDesc::contiguous(b2, 0, DType::I32, &[8, 8]).unwrap();
    let xi = TensorDesc { dtype: DType::I32 as u32, ..d88 };
    let far = TensorDesc::contiguous(b2, 4, DType::F32, &[8, 8]).unwrap();
    let results = vec![
        // relu on integers is claimed by no backend (the interface defines it for floats).
        ("unclaimed op", dev.exec(&Op::Unary(UnaryOp::Relu), &[xi], &[yi]), ErrorKind::Unsupported),
        ("shape mismatch", dev.exec(&Op::Unary(UnaryOp::Exp), &[d64], &[y]), ErrorKind::ShapeMismatch),
        ("dtype mismatch", dev.exec(&Op::Unary(UnaryOp::Exp), &[d88], &[yi]), ErrorKind::DtypeMismatch),
        ("view past the buffer", dev.exec(&Op::Unary(UnaryOp::Exp), &[d88], &[far]), ErrorKind::InvalidArgument),
        ("unknown buffer", dev.free(BufferId(987654321)), ErrorKind::InvalidArgument),
        ("read past the end", dev.read(b, 1000).map(|_| ()), ErrorKind::InvalidArgument),
        (
            "dropout p = 1",
            dev.exec(&Op::Dropout { seed: 1, offset: 0, p: 1.0 }, &[d88], &[y]),
            ErrorKind::InvalidArgument,
        ),
        ("matmul shapes", dev.exec(&Op::Matmul, &[d88, d64], &[y]), ErrorKind::ShapeMismatch),
        (
            "output overlaps input",
            dev.exec(&Op::Unary(UnaryOp::Exp), &[d88], &[TensorDesc::contiguous(b, 4, DType::F32, &[7, 8]).unwrap()]),
            ErrorKind::InvalidArgument,
        ),
        ("out of memory", dev.alloc(1 << 47).map(|_| ()), ErrorKind::OutOfMemory),
    ];
    for (what, r, kind) in results {
        expect(what, r, kind, ck);
    }
    check_deferred_index_error(ck);
    check_deferred_index_error_in_scratch(ck);
    check_index_check_list_full(ck);
    if let Err(e) = ck.cuda.alloc(1 << 47) {
        println!("out-of-memory message: {}", e.message);
    }
    // The device still works after all of that.
    match ck.cuda.alloc(1 << 20).and_then(|x| ck.cuda.free(x)).and_then(|()| ck.cuda.sync()) {
        Ok(()) => *ck.passed.entry("error: device usable afterwards".into()).or_default() += 1,
        Err(e) => ck.failed.push(format!("error: device unusable after the error checks: {e}")),
    }
    let _ = ck.cuda.free(b);
    let _ = ck.cuda.free(b2);
}

/// A gather with an index out of range is accepted by the call (the host does not wait for
/// the device's check) and fails at the next synchronization, naming the op and the index;
/// it and the gather queued after it write nothing; once reported, gathers work again.
fn check_deferred_index_error(ck: &mut Checker) {
    let dev = &ck.cuda;
    let run = || -> R<Result<(), String>> {
        let x = dev.alloc(4 * 8)?;
        let idx = dev.alloc(8 * 4)?;
        let y = dev.alloc(4 * 4)?;
        dev.write(x, &(0..8).flat_map(|i| (i as f32).to_le_bytes()).collect::<Vec<_>>())?;
        dev.write(y, &[0xA7; 16])?;
        let xd = TensorDesc::contiguous(x, 0, DType::F32, &[8])?;
        let id = TensorDesc::contiguous(idx, 0, DType::I64, &[4])?;
        let yd = TensorDesc::contiguous(y, 0, DType::F32, &[4])?;
        let gather = Op::Gather { dim: 0 };
        let put = |v: [i64; 4]| dev.write(idx, &v.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<_>>());
        put([1, 9, 2, 3])?;
        if let Err(e) = dev.exec(&gather, &[xd, id], &[yd]) {
            return Ok(Err(format!("the call failed at once: {e}")));
        }
        put([0, 1, 2, 3])?;
        dev.exec(&gather, &[xd, id], &[yd])?;
        let outcome = match dev.sync() {
            Ok(()) => Err("synchronize succeeded after a bad index".to_string()),
            Err(e) if e.kind != ErrorKind::InvalidArgument || !e.message.contains("gather: index 9") => {
                Err(format!("expected InvalidArgument naming gather and 9, got {e}"))
            }
            Err(_) if dev.read(y, 16)? != [0xA7; 16] => Err("the gathers wrote their output".to_string()),
            Err(_) => {
                put([3, 2, 1, 0])?;
                dev.exec(&gather, &[xd, id], &[yd])?;
                let back: Vec<f32> =
                    dev.read(y, 16)?.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                if back == [3.0, 2.0, 1.0, 0.0] {
                    Ok(())
                } else {
                    Err(format!("a good gather after the error gave {back:?}"))
                }
            }
        };
        for b in [x, idx, y] {
            dev.free(b)?;
        }
        Ok(outcome)
    };
    let result = run();
    ck.tally("error: index out of range reported at synchronize", "error: deferred index check", result);
}

/// The row ops' slow path (leading dims that do not merge, so inputs and outputs go through
/// dense scratch copies) with a deferred index fault: cross-entropy over a permuted batch with
/// a target out of range must leave its outputs as they were; with good targets it must give
/// the host's losses.
fn check_deferred_index_error_in_scratch(ck: &mut Checker) {
    let dev = &ck.cuda;
    let (b0, b1, c) = (2usize, 3usize, 4usize);
    let run = || -> R<Result<(), String>> {
        let logits: Vec<f32> = (0..b0 * b1 * c).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let x = dev.alloc(logits.len() * 4)?;
        let t = dev.alloc(b0 * b1 * 8)?;
        let outs = [dev.alloc(b0 * b1 * 4)?, dev.alloc(b0 * b1 * 4)?];
        dev.write(x, &logits.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())?;
        // Stored as [b1, b0, c], seen as [b0, b1, c]: dims 0 and 1 swapped do not merge.
        let xd = TensorDesc::new(x, 0, DType::F32, &[b0, b1, c], &[c as isize, (b0 * c) as isize, 1])?;
        let td = TensorDesc::contiguous(t, 0, DType::I64, &[b0, b1])?;
        let od = [
            TensorDesc::contiguous(outs[0], 0, DType::F32, &[b0, b1])?,
            TensorDesc::contiguous(outs[1], 0, DType::F32, &[b0, b1])?,
        ];
        let op = Op::CrossEntropy { ignore_index: -100, label_smoothing: 0.0 };
        let put = |v: &[i64]| dev.write(t, &v.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<_>>());
        for o in outs {
            dev.write(o, &vec![0xA7; b0 * b1 * 4])?;
        }
        put(&[0, 1, 9, 3, 2, 1])?;
        dev.exec(&op, &[xd, td], &od)?;
        let outcome = match dev.sync() {
            Ok(()) => Err("synchronize succeeded after a bad target".to_string()),
            Err(e) if e.kind != ErrorKind::InvalidArgument || !e.message.contains("target 9") => {
                Err(format!("expected InvalidArgument naming target 9, got {e}"))
            }
            Err(_) if outs.iter().any(|&o| dev.read(o, b0 * b1 * 4).map_or(true, |v| v != vec![0xA7; b0 * b1 * 4])) => {
                Err("the outputs changed".to_string())
            }
            Err(_) => {
                let target = [0i64, 1, 2, 3, 2, 1];
                put(&target)?;
                dev.exec(&op, &[xd, td], &od)?;
                let got: Vec<f32> = dev
                    .read(outs[0], b0 * b1 * 4)?
                    .chunks(4)
                    .map(|q| f32::from_le_bytes([q[0], q[1], q[2], q[3]]))
                    .collect();
                let want: Vec<f32> = (0..b0 * b1)
                    .map(|r| {
                        let (i, j) = (r / b1, r % b1);
                        let row = &logits[(j * b0 + i) * c..][..c];
                        let lse = row.iter().map(|v| (*v as f64).exp()).sum::<f64>().ln();
                        (lse - row[target[r] as usize] as f64) as f32
                    })
                    .collect();
                if got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-5 * (1.0 + w.abs())) {
                    Ok(())
                } else {
                    Err(format!("losses {got:?}, host {want:?}"))
                }
            }
        };
        for b in [x, t].into_iter().chain(outs) {
            dev.free(b)?;
        }
        Ok(outcome)
    };
    let result = run();
    let passed = "error: deferred index fault on the row ops' scratch path";
    ck.tally(passed, "error: deferred index fault on the scratch path", result);
}

/// A loop that never synchronizes still gets a deferred index error: once the device's list
/// of pending index checks is full, the next index op reports the earlier fault; after that
/// the lists start over (synchronize succeeds, gathers work).
fn check_index_check_list_full(ck: &mut Checker) {
    let dev = &ck.cuda;
    let run = || -> R<Result<(), String>> {
        let x = dev.alloc(4 * 8)?;
        let idx = [dev.alloc(8 * 4)?, dev.alloc(8 * 4)?];
        let y = dev.alloc(4 * 4)?;
        dev.write(x, &(0..8).flat_map(|i| (i as f32).to_le_bytes()).collect::<Vec<_>>())?;
        let put = |b, v: [i64; 4]| dev.write(b, &v.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<_>>());
        put(idx[0], [1, 9, 2, 3])?;
        put(idx[1], [3, 2, 1, 0])?;
        let xd = TensorDesc::contiguous(x, 0, DType::F32, &[8])?;
        let ids = [
            TensorDesc::contiguous(idx[0], 0, DType::I64, &[4])?,
            TensorDesc::contiguous(idx[1], 0, DType::I64, &[4])?,
        ];
        let yd = TensorDesc::contiguous(y, 0, DType::F32, &[4])?;
        let gather = Op::Gather { dim: 0 };
        dev.exec(&gather, &[xd, ids[0]], &[yd])?;
        // The list holds 65536 checks (device.rs); allow a few more calls than that.
        let mut reported = None;
        for call in 1..=70_000 {
            if let Err(e) = dev.exec(&gather, &[xd, ids[1]], &[yd]) {
                reported = Some((call, e));
                break;
            }
        }
        let outcome = match reported {
            None => Err("70000 gathers after a bad one and no error".to_string()),
            Some((_, e)) if e.kind != ErrorKind::InvalidArgument || !e.message.contains("gather: index 9") => {
                Err(format!("expected InvalidArgument naming gather and 9, got {e}"))
            }
            Some((call, _)) => match dev.sync() {
                Err(e) => Err(format!("synchronize after the report failed: {e}")),
                Ok(()) => {
                    dev.exec(&gather, &[xd, ids[1]], &[yd])?;
                    dev.sync()?;
                    let back: Vec<f32> =
                        dev.read(y, 16)?.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                    if back == [3.0, 2.0, 1.0, 0.0] {
                        println!("deferred index error reported by gather call {call} after the bad one");
                        Ok(())
                    } else {
                        Err(format!("a good gather after the error gave {back:?}"))
                    }
                }
            },
        };
        for b in [x, idx[0], idx[1], y] {
            dev.free(b)?;
        }
        Ok(outcome)
    };
    let result = run();
    ck.tally("error: index checks list full reports the fault", "error: index check list full", result);
}

/// No driver allocation in steady state: mixed sizes, allocated and freed many times.
fn check_allocator(ck: &mut Checker) -> R<()> {
    let sizes = [4usize << 20, 123, 64 << 20, 3000, 1 << 20, 17 << 20, 512, 40_000, 9 << 20, 1];
    let round = |dev: &Dev| -> R<()> {
        let ids = sizes.iter().map(|&s| dev.alloc(s)).collect::<R<Vec<_>>>()?;
        for id in ids.into_iter().rev() {
            dev.free(id)?;
        }
        Ok(())
    };
    round(&ck.cuda)?;
    let before = ck.cuda.stats()?;
    let t = Instant::now();
    for _ in 0..100 {
        round(&ck.cuda)?;
    }
    let per_1000 = t.elapsed().as_secs_f64() * 1e3 / (100.0 * sizes.len() as f64 / 1000.0);
    let after = ck.cuda.stats()?;
    println!("allocator: 1000 mixed-size alloc/free pairs take {per_1000:.3} ms; stats {after:?}");
    if after.cache_misses != before.cache_misses || after.reserved_bytes != before.reserved_bytes {
        ck.failed.push(format!("allocator: driver allocations in steady state: {before:?} -> {after:?}"));
    } else {
        *ck.passed.entry("allocator: no driver allocation in steady state".into()).or_default() += 1;
    }
    ck.cuda.empty_cache()?;
    let emptied = ck.cuda.stats()?;
    if emptied.reserved_bytes != 0 {
        ck.failed.push(format!("allocator: empty_cache left {} bytes reserved", emptied.reserved_bytes));
    } else {
        *ck.passed.entry("allocator: empty_cache releases everything".into()).or_default() += 1;
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or_else(|| "dist-cuda/libgenesis_backend_cuda.so".into());
    let module = match load_plugin(&path) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("cannot load {path}: {e}");
            std::process::exit(2);
        }
    };
    let probe = (module.probe())().into_result().map(genesis_backend_api::Probe::from);
    println!("probe: {probe:?}");
    match (module.device_properties())(0).into_result() {
        Ok(p) => println!("cuda:0: {:?}", genesis_backend_api::DeviceProperties::from(p)),
        Err(e) => {
            println!("no device: {}", BackendError::from(e));
            std::process::exit(if args.iter().any(|a| a == "--expect-unavailable") { 0 } else { 3 });
        }
    }
    let cuda = Dev { m: module };
    if args.iter().any(|a| a == "--fault") {
        // Run with GENESIS_CUDA_PLANT_FAULT=exp: the exp launch faults; the error must come
        // back (not hang) and name the op.
        let t = Instant::now();
        let r = (|| -> R<()> {
            let b = cuda.alloc(1024)?;
            let x = TensorDesc::contiguous(b, 0, DType::F32, &[16])?;
            let y = TensorDesc::contiguous(b, 512, DType::F32, &[16])?;
            cuda.exec(&Op::Unary(UnaryOp::Exp), &[x], &[y])?;
            cuda.sync()
        })();
        let secs = t.elapsed().as_secs_f64();
        match r {
            Err(e) if e.message.contains("exp") => {
                println!("fault check ok after {secs:.2} s: {e}");
                std::process::exit(0);
            }
            other => {
                println!("fault check FAILED after {secs:.2} s: {other:?}");
                std::process::exit(1);
            }
        }
    }
    let cpu = Dev { m: genesis_backend_cpu::genesis_plugin_module() };
    let caps = match cuda.caps() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("capabilities: {e}");
            std::process::exit(3);
        }
    };
    println!("cuda claims {} (op, dtype) pairs", caps.len());
    let mut ck = Checker {
        cuda,
        cpu,
        rng: Rng(0x9E37_79B9_7F4A_7C15),
        passed: BTreeMap::new(),
        failed: Vec::new(),
        unreferenced: Vec::new(),
        unsampled: Vec::new(),
    };
    let t = Instant::now();
    check_ops(&mut ck, &caps);
    println!("op checks took {:.1} s (includes first-use kernel compilation)", t.elapsed().as_secs_f64());
    check_errors(&mut ck);
    if let Err(e) = check_allocator(&mut ck) {
        ck.failed.push(format!("allocator: {e}"));
    }
    if let Err(e) = ck.cuda.sync() {
        ck.failed.push(format!("final synchronize: {e}"));
    }
    // Summary per op family: "name dtype" -> cases passed.
    let mut per_op: BTreeMap<String, usize> = BTreeMap::new();
    for (k, v) in &ck.passed {
        let key = k.split(" [").next().unwrap_or(k).to_string();
        *per_op.entry(key).or_default() += v;
    }
    println!("\npassed ({} op/dtype groups, {} cases):", per_op.len(), ck.passed.values().sum::<usize>());
    for (k, v) in &per_op {
        println!("  ok {k}: {v}");
    }
    println!("\nnot checked: the CPU reference failed ({}):", ck.unreferenced.len());
    for f in &ck.unreferenced {
        println!("  NOREF {f}");
    }
    println!(
        "\nnot checked here, no sample in this checker ({}; the conformance harness covers them): {}",
        ck.unsampled.len(),
        ck.unsampled.join(", ")
    );
    println!("\nfailed ({}):", ck.failed.len());
    for f in &ck.failed {
        println!("  FAIL {f}");
    }
    std::process::exit(if ck.failed.is_empty() { 0 } else { 1 });
}
