//! The ops of the example backend.
//!
//! Every kernel follows one pattern: check the operands with the SDK helpers, read each
//! input into a row-major `Vec` (whatever its strides), compute on plain slices, and store
//! the result through the output's strides. That costs copies but keeps each kernel a few
//! lines long, and no kernel ever has to think about strides or byte offsets.
//!
//! Kernels index their `Vec`s directly only where the shape checks above them (or a checked
//! index value) guarantee the position is in range.

use crate::memory::{Memory, Values};
use genesis_backend_api::sdk::checks::{self, Geometry, Meta};
use genesis_backend_api::sdk::{self, philox, scalar};
use genesis_backend_api::{
    contiguous_strides, BackendError, BinaryOp, Capability, DType, Op, OpKind, ReduceOp, Result, TensorDesc, UnaryOp,
};

/// Every (op, dtype) pair [`execute`] runs. The dtype is that of the first input, or of the
/// output for ops without inputs (fill, arange, the random fills).
pub fn capabilities() -> Vec<Capability> {
    let mut caps = Vec::new();
    let mut claim = |op: OpKind, dtype: DType| caps.push(Capability { op, dtype: dtype as u32 });

    for &op in UnaryOp::ALL {
        // Logical not takes bool tensors, which this backend does not compute on.
        if op != UnaryOp::Not {
            claim(OpKind::unary(op), DType::F32);
        }
    }
    for &op in BinaryOp::ALL {
        claim(OpKind::binary(op), DType::F32);
        claim(OpKind::binary_scalar(op), DType::F32);
    }
    for &op in ReduceOp::ALL {
        claim(OpKind::reduce(op), DType::F32);
    }
    // The attribute values are irrelevant: only the kind is claimed.
    let f32_ops = [
        Op::Clamp { min: 0.0, max: 0.0 },
        Op::Arange { start: 0.0, step: 0.0 },
        Op::Matmul,
        Op::Gather { dim: 0 },
        Op::ScatterAdd { dim: 0 },
        Op::IndexSelect { dim: 0 },
        Op::IndexAdd { dim: 0 },
        Op::CumSum { dim: 0 },
        Op::RandUniform { seed: 0, offset: 0, low: 0.0, high: 0.0 },
        Op::RandNormal { seed: 0, offset: 0, mean: 0.0, std: 0.0 },
        Op::Dropout { seed: 0, offset: 0, p: 0.0 },
    ];
    for op in f32_ops {
        claim(op.kind(), DType::F32);
    }
    // `where`'s first input is the bool condition; its values must be f32.
    claim(Op::Where.kind(), DType::Bool);
    for dtype in [DType::F32, DType::I64, DType::Bool] {
        claim(Op::Copy.kind(), dtype);
        claim(Op::Cast.kind(), dtype);
        claim(Op::Fill { value: 0.0 }.kind(), dtype);
    }
    caps
}

/// Run `op`. Anything [`capabilities`] does not claim fails with `Unsupported`.
pub fn execute(mem: &mut Memory, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    check_supported(op, inputs, outputs)?;
    for t in inputs.iter().chain(outputs) {
        mem.check_view(t)?;
    }
    match *op {
        Op::Unary(f) => unary(mem, op, f, inputs, outputs),
        Op::Binary(f) => binary(mem, op, f, inputs, outputs),
        Op::BinaryScalar { op: f, scalar, scalar_first } => {
            binary_scalar(mem, op, f, scalar, scalar_first, inputs, outputs)
        }
        Op::Clamp { min, max } => clamp(mem, op, min, max, inputs, outputs),
        Op::Where => where_(mem, op, inputs, outputs),
        Op::Reduce(r) => reduce(mem, op, r, inputs, outputs),
        Op::Copy => copy(mem, op, inputs, outputs),
        Op::Cast => cast(mem, op, inputs, outputs),
        Op::Fill { value } => fill(mem, op, value, inputs, outputs),
        Op::Arange { start, step } => arange(mem, op, start, step, inputs, outputs),
        Op::Matmul => matmul(mem, op, inputs, outputs),
        Op::Gather { dim } => gather(mem, op, dim, inputs, outputs),
        Op::ScatterAdd { dim } => scatter_add(mem, op, dim, inputs, outputs),
        Op::IndexSelect { dim } => index_select(mem, op, dim, inputs, outputs),
        Op::IndexAdd { dim } => index_add(mem, op, dim, inputs, outputs),
        Op::CumSum { dim } => cumsum(mem, op, dim, inputs, outputs),
        Op::RandUniform { seed, offset, low, high } => {
            random_fill(mem, op, inputs, outputs, |i| low + (high - low) * philox::uniform_f32(seed, offset, i) as f64)
        }
        Op::RandNormal { seed, offset, mean, std } => {
            random_fill(mem, op, inputs, outputs, |i| mean + std * philox::normal_f64(seed, offset, i))
        }
        Op::Dropout { seed, offset, p } => dropout(mem, op, seed, offset, p, inputs, outputs),
        // Not reachable past `check_supported`; listed so that claiming a new op without
        // writing its kernel fails cleanly instead of silently doing nothing.
        _ => Err(BackendError::unsupported(format!("the example backend does not implement {}", op.name()))),
    }
}

fn check_supported(op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let kind = op.kind();
    let dtypes: Vec<u32> = capabilities().iter().filter(|c| c.op == kind).map(|c| c.dtype).collect();
    if dtypes.is_empty() {
        return Err(BackendError::unsupported(format!("the example backend does not implement {}", op.name())));
    }
    let first = inputs
        .first()
        .or(outputs.first())
        .ok_or_else(|| BackendError::invalid(format!("{}: called without operands", op.name())))?;
    if !dtypes.contains(&first.dtype) {
        let dtype = DType::from_code(first.dtype)
            .map(|d| d.to_string())
            .unwrap_or_else(|_| format!("dtype code {}", first.dtype));
        return Err(BackendError::unsupported(format!(
            "the example backend does not implement {} on {dtype}",
            op.name()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------

fn unary(mem: &mut Memory, op: &Op, f: UnaryOp, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 1, 1)?;
    let (x, y) = (&inputs[0], &outputs[0]);
    sdk::expect_same_shape(op, x, y)?;
    sdk::expect_no_overlap(op, inputs, outputs, true)?;
    let xs = mem.load::<f32>(x)?;
    if f == UnaryOp::IsNan {
        sdk::expect_dtype(op, y, DType::Bool)?;
        let out: Vec<bool> = xs.iter().map(|v| v.is_nan()).collect();
        return mem.store(y, &out);
    }
    sdk::expect_dtype(op, y, DType::F32)?;
    let out: Vec<f32> = xs.iter().map(|&v| scalar::unary(f, v as f64) as f32).collect();
    mem.store(y, &out)
}

fn binary(mem: &mut Memory, op: &Op, f: BinaryOp, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 2, 1)?;
    let (a, b, y) = (&inputs[0], &inputs[1], &outputs[0]);
    sdk::expect_dtype(op, b, DType::F32)?;
    sdk::expect_same_shape(op, a, y)?;
    sdk::expect_same_shape(op, b, y)?;
    sdk::expect_no_overlap(op, inputs, outputs, true)?;
    let (av, bv) = (mem.load::<f32>(a)?, mem.load::<f32>(b)?);
    let out: Vec<f64> = av.iter().zip(&bv).map(|(&p, &q)| scalar::binary(f, p as f64, q as f64)).collect();
    store_elementwise(mem, op, y, f.is_predicate(), &out)
}

fn binary_scalar(
    mem: &mut Memory,
    op: &Op,
    f: BinaryOp,
    scalar: f64,
    scalar_first: bool,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 1, 1)?;
    let (a, y) = (&inputs[0], &outputs[0]);
    sdk::expect_same_shape(op, a, y)?;
    sdk::expect_no_overlap(op, inputs, outputs, true)?;
    // The interface converts the scalar to the tensor's dtype before the op.
    let s = scalar as f32 as f64;
    let av = mem.load::<f32>(a)?;
    let out: Vec<f64> = av
        .iter()
        .map(|&v| if scalar_first { scalar::binary(f, s, v as f64) } else { scalar::binary(f, v as f64, s) })
        .collect();
    store_elementwise(mem, op, y, f.is_predicate(), &out)
}

/// Store f64 results as f32, or as bool (non-zero is true) for predicates.
fn store_elementwise(mem: &mut Memory, op: &Op, y: &TensorDesc, predicate: bool, values: &[f64]) -> Result<()> {
    if predicate {
        sdk::expect_dtype(op, y, DType::Bool)?;
        mem.store(y, &values.iter().map(|&v| v != 0.0).collect::<Vec<bool>>())
    } else {
        sdk::expect_dtype(op, y, DType::F32)?;
        mem.store(y, &values.iter().map(|&v| v as f32).collect::<Vec<f32>>())
    }
}

fn clamp(mem: &mut Memory, op: &Op, min: f64, max: f64, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 1, 1)?;
    let (x, y) = (&inputs[0], &outputs[0]);
    sdk::expect_same_shape(op, x, y)?;
    sdk::expect_dtype(op, y, DType::F32)?;
    sdk::expect_no_overlap(op, inputs, outputs, true)?;
    let (lo, hi) = (min as f32 as f64, max as f32 as f64);
    // NaN-propagating max then min, so a NaN input (or bound) gives NaN.
    let out: Vec<f32> =
        mem.load::<f32>(x)?.iter().map(|&v| scalar::minimum(scalar::maximum(v as f64, lo), hi) as f32).collect();
    mem.store(y, &out)
}

fn where_(mem: &mut Memory, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 3, 1)?;
    let (cond, a, b, y) = (&inputs[0], &inputs[1], &inputs[2], &outputs[0]);
    let dtype = a.dtype()?;
    sdk::expect_dtype(op, b, dtype)?;
    sdk::expect_dtype(op, y, dtype)?;
    if dtype != DType::F32 {
        return Err(unsupported_dtype(op, dtype));
    }
    for t in [cond, a, b] {
        sdk::expect_same_shape(op, t, y)?;
    }
    sdk::expect_no_overlap(op, inputs, outputs, true)?;
    let (c, av, bv) = (mem.load::<bool>(cond)?, mem.load::<f32>(a)?, mem.load::<f32>(b)?);
    let out: Vec<f32> = c.iter().zip(av.iter().zip(&bv)).map(|(&c, (&p, &q))| if c { p } else { q }).collect();
    mem.store(y, &out)
}

fn copy(mem: &mut Memory, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 1, 1)?;
    let (x, y) = (&inputs[0], &outputs[0]);
    sdk::expect_same_shape(op, x, y)?;
    sdk::expect_dtype(op, y, x.dtype()?)?;
    sdk::expect_no_overlap(op, inputs, outputs, true)?;
    let values = mem.load_values(x)?;
    mem.store_values(y, &values)
}

fn cast(mem: &mut Memory, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 1, 1)?;
    let (x, y) = (&inputs[0], &outputs[0]);
    sdk::expect_same_shape(op, x, y)?;
    sdk::expect_no_overlap(op, inputs, outputs, true)?;
    let to = y.dtype()?;
    // `as` from float to int truncates toward zero (and saturates, with NaN becoming 0).
    let converted = match (mem.load_values(x)?, to) {
        (Values::F32(v), DType::F32) => Values::F32(v),
        (Values::F32(v), DType::I64) => Values::I64(v.iter().map(|&x| x as i64).collect()),
        (Values::F32(v), DType::Bool) => Values::Bool(v.iter().map(|&x| x != 0.0).collect()),
        (Values::I64(v), DType::F32) => Values::F32(v.iter().map(|&x| x as f32).collect()),
        (Values::I64(v), DType::I64) => Values::I64(v),
        (Values::I64(v), DType::Bool) => Values::Bool(v.iter().map(|&x| x != 0).collect()),
        (Values::Bool(v), DType::F32) => Values::F32(v.iter().map(|&x| f32::from(u8::from(x))).collect()),
        (Values::Bool(v), DType::I64) => Values::I64(v.iter().map(|&x| i64::from(x)).collect()),
        (Values::Bool(v), DType::Bool) => Values::Bool(v),
        (_, other) => return Err(BackendError::unsupported(format!("the example backend cannot cast to {other}"))),
    };
    mem.store_values(y, &converted)
}

fn dropout(
    mem: &mut Memory,
    op: &Op,
    seed: u64,
    offset: u64,
    p: f64,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 1, 1)?;
    let (x, y) = (&inputs[0], &outputs[0]);
    sdk::expect_same_shape(op, x, y)?;
    sdk::expect_dtype(op, y, DType::F32)?;
    sdk::expect_no_overlap(op, inputs, outputs, true)?;
    if !(0.0..1.0).contains(&p) {
        return Err(BackendError::invalid(format!("{}: p = {p} is outside [0, 1)", op.name())));
    }
    let scale = 1.0 / (1.0 - p);
    let xs = mem.load::<f32>(x)?;
    // Multiplying by 0 rather than writing 0 keeps a dropped NaN or inf NaN, as
    // `x * keep / (1 - p)` does in PyTorch.
    let out: Vec<f32> = xs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let keep = philox::uniform_f32(seed, offset, i as u64) as f64 >= p;
            (v as f64 * if keep { scale } else { 0.0 }) as f32
        })
        .collect();
    mem.store(y, &out)
}

// ---------------------------------------------------------------------------------------
// Fills
// ---------------------------------------------------------------------------------------

fn fill(mem: &mut Memory, op: &Op, value: f64, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 0, 1)?;
    sdk::expect_no_overlap(op, inputs, outputs, false)?;
    let y = &outputs[0];
    let n = y.numel();
    let values = match y.dtype()? {
        DType::F32 => Values::F32(vec![value as f32; n]),
        DType::I64 => Values::I64(vec![value as i64; n]),
        DType::Bool => Values::Bool(vec![value != 0.0; n]),
        other => return Err(unsupported_dtype(op, other)),
    };
    mem.store_values(y, &values)
}

fn arange(
    mem: &mut Memory,
    op: &Op,
    start: f64,
    step: f64,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 0, 1)?;
    sdk::expect_no_overlap(op, inputs, outputs, false)?;
    let y = &outputs[0];
    if y.rank() != 1 {
        return Err(BackendError::shape(format!("{}: output must have rank 1, got {:?}", op.name(), y.shape())));
    }
    // start + i*step rather than a running sum, so error does not accumulate along the range.
    let out: Vec<f32> = (0..y.numel()).map(|i| (start + i as f64 * step) as f32).collect();
    mem.store(y, &out)
}

/// RandUniform and RandNormal: element `i` (row-major) of the output is `value(i)`.
fn random_fill(
    mem: &mut Memory,
    op: &Op,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    value: impl Fn(u64) -> f64,
) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 0, 1)?;
    sdk::expect_no_overlap(op, inputs, outputs, false)?;
    let y = &outputs[0];
    let out: Vec<f32> = (0..y.numel() as u64).map(|i| value(i) as f32).collect();
    mem.store(y, &out)
}

// ---------------------------------------------------------------------------------------
// Reductions and scans
// ---------------------------------------------------------------------------------------

fn reduce(mem: &mut Memory, op: &Op, r: ReduceOp, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 1, 1)?;
    let (x, y) = (&inputs[0], &outputs[0]);
    let reduced = checks::reduce(op, r, &Geometry::of(x)?, &Geometry::of(y)?)?;
    let is_arg = matches!(r, ReduceOp::ArgMax | ReduceOp::ArgMin);
    sdk::expect_dtype(op, y, if is_arg { DType::I64 } else { DType::F32 })?;
    sdk::expect_no_overlap(op, inputs, outputs, false)?;

    let x_shape = x.shape();
    let groups = group_by_output(&mem.load::<f32>(x)?, &x_shape, &y.shape(), &reduced);
    if is_arg {
        let better: fn(f32, f32) -> bool = if r == ReduceOp::ArgMax { |a, b| a > b } else { |a, b| a < b };
        let out: Vec<i64> = groups.iter().map(|g| first_best(g, better) as i64).collect();
        mem.store(y, &out)
    } else {
        let out: Vec<f32> = groups.iter().map(|g| reduce_group(r, g) as f32).collect();
        mem.store(y, &out)
    }
}

/// The input values that reduce into each output element, in input row-major order, so the
/// k-th value of a group sits at position k along the (single) reduced axis.
fn group_by_output(values: &[f32], x_shape: &[usize], y_shape: &[usize], reduced: &[bool]) -> Vec<Vec<f32>> {
    // Walking the input with the output's row-major strides, zeroed on reduced axes, yields
    // for each input element the row-major position of the output element it reduces into.
    let mut strides = contiguous_strides(y_shape);
    for (s, &r) in strides.iter_mut().zip(reduced) {
        if r {
            *s = 0;
        }
    }
    let mut groups = vec![Vec::new(); y_shape.iter().product()];
    for (&v, slot) in values.iter().zip(sdk::offsets(x_shape, &strides)) {
        groups[slot as usize].push(v);
    }
    groups
}

/// Sum, mean, sum of squares, prod, max or min of one group. Sums run in f64 so that long reductions stay
/// accurate without pairwise summation.
fn reduce_group(r: ReduceOp, group: &[f32]) -> f64 {
    let values = group.iter().map(|&v| v as f64);
    match r {
        ReduceOp::Sum => values.sum(),
        // An empty mean is 0/0 = NaN, as in PyTorch.
        ReduceOp::Mean => values.sum::<f64>() / group.len() as f64,
        ReduceOp::SumSquares => values.map(|v| v * v).sum(),
        ReduceOp::Prod => values.product(),
        ReduceOp::Max => values.fold(f64::NEG_INFINITY, scalar::maximum),
        ReduceOp::Min => values.fold(f64::INFINITY, scalar::minimum),
        // Handled by `first_best`.
        ReduceOp::ArgMax | ReduceOp::ArgMin => f64::NAN,
    }
}

/// The index of the first value that no later value is `better` than. As in PyTorch a NaN
/// beats everything, and the first NaN wins.
fn first_best(values: &[f32], better: fn(f32, f32) -> bool) -> usize {
    let Some(&first) = values.first() else { return 0 };
    let (mut best_index, mut best) = (0, first);
    for (i, &v) in values.iter().enumerate().skip(1) {
        if best.is_nan() {
            break;
        }
        if v.is_nan() || better(v, best) {
            (best_index, best) = (i, v);
        }
    }
    best_index
}

fn cumsum(mem: &mut Memory, op: &Op, dim: u32, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 1, 1)?;
    let (x, y) = (&inputs[0], &outputs[0]);
    sdk::expect_same_shape(op, x, y)?;
    sdk::expect_dtype(op, y, DType::F32)?;
    sdk::expect_no_overlap(op, inputs, outputs, false)?;
    let shape = x.shape();
    let d = axis(op, dim, shape.len())?;
    let stride = contiguous_strides(&shape)[d] as usize;
    let xs = mem.load::<f32>(x)?;
    let mut sums: Vec<f64> = Vec::with_capacity(xs.len());
    for ((pos, &v), c) in xs.iter().enumerate().zip(coordinates_along(&shape, d)) {
        // Row-major order visits the previous element along `dim`, one stride back, first.
        let previous = if c > 0 { sums[pos - stride] } else { 0.0 };
        sums.push(previous + v as f64);
    }
    mem.store(y, &sums.iter().map(|&s| s as f32).collect::<Vec<f32>>())
}

// ---------------------------------------------------------------------------------------
// Matmul
// ---------------------------------------------------------------------------------------

fn matmul(mem: &mut Memory, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    sdk::expect_arity(op, inputs, outputs, 2, 1)?;
    let (a, b, y) = (&inputs[0], &inputs[1], &outputs[0]);
    // `check_supported` accepted a's dtype (f32); `matmul` holds b and y to it.
    let [m, k, n] = checks::matmul(op, &Geometry::of(a)?, &Geometry::of(b)?, &Geometry::of(y)?)?;
    let sy = y.shape();
    let batch = &sy[..sy.len() - 2];
    sdk::expect_no_overlap(op, inputs, outputs, false)?;

    // Loading makes both operands row-major, so transposes and broadcast batches (which
    // arrive as strides) need no special case here.
    let (av, bv) = (mem.load::<f32>(a)?, mem.load::<f32>(b)?);
    let batches: usize = batch.iter().product();
    let mut out = Vec::with_capacity(y.numel());
    for t in 0..batches {
        let (a_mat, b_mat) = (&av[t * m * k..(t + 1) * m * k], &bv[t * k * n..(t + 1) * k * n]);
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k).map(|p| a_mat[i * k + p] as f64 * b_mat[p * n + j] as f64).sum();
                out.push(dot as f32);
            }
        }
    }
    mem.store(y, &out)
}

// ---------------------------------------------------------------------------------------
// Indexing
// ---------------------------------------------------------------------------------------

// The index ops check shapes with the SDK's family checks (through `Geometry`, the `Meta`
// view of a descriptor); this backend adds its own dtype limit (f32 data).

/// The family check of one index op, on the `Meta` views of its descriptors.
type IndexCheck = fn(&Op, &Geometry, &Geometry, &Geometry, usize) -> Result<()>;

/// The operands of an index op, `[x or src, index] -> [y]`: counted, checked by the SDK's
/// family `check`, held to this backend's f32 data and to outputs that overlap no input.
/// Returns the descriptors, their geometries and `dim` as an axis.
fn index_operands<'a>(
    op: &Op,
    dim: u32,
    inputs: &'a [TensorDesc],
    outputs: &'a [TensorDesc],
    check: IndexCheck,
) -> Result<([&'a TensorDesc; 3], [Geometry; 3], usize)> {
    let ([data, index], [y]) = checks::operands(op, inputs, outputs)?;
    let (gd, gi, gy) = (Geometry::of(data)?, Geometry::of(index)?, Geometry::of(y)?);
    let d = dim as usize;
    check(op, &gd, &gi, &gy, d)?;
    sdk::expect_dtype(op, y, DType::F32)?;
    sdk::expect_no_overlap(op, inputs, outputs, false)?;
    Ok(([data, index, y], [gd, gi, gy], d))
}

fn gather(mem: &mut Memory, op: &Op, dim: u32, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let ([x, index, y], [gx, gi, _], d) = index_operands(op, dim, inputs, outputs, checks::gather)?;

    let (xs, is) = (gx.shape(), gi.shape());
    let (xv, idx) = (mem.load::<f32>(x)?, mem.load::<i64>(index)?);
    let x_strides = contiguous_strides(xs);
    // Walking the index with x's strides, zeroed on `dim`, gives each element's position in
    // x without its `dim` coordinate; the index value supplies that coordinate.
    let bases = sdk::offsets(is, &zero_at(&x_strides, d));
    let mut out = Vec::with_capacity(idx.len());
    for (&i, base) in idx.iter().zip(bases) {
        let i = checked_index(op, i, xs[d])?;
        out.push(xv[base as usize + i * x_strides[d] as usize]);
    }
    mem.store(y, &out)
}

fn scatter_add(mem: &mut Memory, op: &Op, dim: u32, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let ([src, index, y], [gs, gi, gy], d) = index_operands(op, dim, inputs, outputs, checks::scatter_add)?;

    let (ss, is, ys) = (gs.shape(), gi.shape(), gy.shape());
    let (sv, idx, mut out) = (mem.load::<f32>(src)?, mem.load::<i64>(index)?, mem.load::<f32>(y)?);
    let y_strides = contiguous_strides(ys);
    let src_positions = sdk::offsets(is, &contiguous_strides(ss));
    let bases = sdk::offsets(is, &zero_at(&y_strides, d));
    for ((&i, s), base) in idx.iter().zip(src_positions).zip(bases) {
        let i = checked_index(op, i, ys[d])?;
        out[base as usize + i * y_strides[d] as usize] += sv[s as usize];
    }
    // Nothing was written before every index was checked, so an error leaves y untouched.
    mem.store(y, &out)
}

fn index_select(mem: &mut Memory, op: &Op, dim: u32, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let ([x, index, y], [gx, _, gy], d) = index_operands(op, dim, inputs, outputs, checks::index_select)?;

    let (xs, ys) = (gx.shape(), gy.shape());
    let xv = mem.load::<f32>(x)?;
    let rows = checked_indices(op, &mem.load::<i64>(index)?, xs[d])?;
    let x_strides = contiguous_strides(xs);
    // Each y element's coordinate along `dim` picks an index entry; the rest of its position
    // in x comes from walking y with x's strides zeroed on `dim`.
    let bases = sdk::offsets(ys, &zero_at(&x_strides, d));
    let out: Vec<f32> = coordinates_along(ys, d)
        .zip(bases)
        .map(|(c, base)| xv[base as usize + rows[c] * x_strides[d] as usize])
        .collect();
    mem.store(y, &out)
}

fn index_add(mem: &mut Memory, op: &Op, dim: u32, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let ([src, index, y], [gs, _, gy], d) = index_operands(op, dim, inputs, outputs, checks::index_add)?;

    let (ss, ys) = (gs.shape(), gy.shape());
    let sv = mem.load::<f32>(src)?;
    let rows = checked_indices(op, &mem.load::<i64>(index)?, ys[d])?;
    let mut out = mem.load::<f32>(y)?;
    let y_strides = contiguous_strides(ys);
    let bases = sdk::offsets(ss, &zero_at(&y_strides, d));
    for ((&v, c), base) in sv.iter().zip(coordinates_along(ss, d)).zip(bases) {
        out[base as usize + rows[c] * y_strides[d] as usize] += v;
    }
    mem.store(y, &out)
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn unsupported_dtype(op: &Op, dtype: DType) -> BackendError {
    BackendError::unsupported(format!("the example backend does not implement {} on {dtype}", op.name()))
}

/// `dim` checked against `rank`.
fn axis(op: &Op, dim: u32, rank: usize) -> Result<usize> {
    let d = dim as usize;
    if d >= rank {
        return Err(BackendError::invalid(format!("{}: dim {dim} is out of range for rank {rank}", op.name())));
    }
    Ok(d)
}

/// An index value as a position along an axis of `size`. Negative values are errors too:
/// wrapping them PyTorch-style is the core's job, not the backend's.
fn checked_index(op: &Op, value: i64, size: usize) -> Result<usize> {
    usize::try_from(value).ok().filter(|&i| i < size).ok_or_else(|| {
        BackendError::invalid(format!("{}: index {value} is out of range for a dimension of size {size}", op.name()))
    })
}

fn checked_indices(op: &Op, values: &[i64], size: usize) -> Result<Vec<usize>> {
    values.iter().map(|&v| checked_index(op, v, size)).collect()
}

/// `strides` with the entry of `dim` set to 0.
fn zero_at(strides: &[isize], dim: usize) -> Vec<isize> {
    let mut s = strides.to_vec();
    s[dim] = 0;
    s
}

/// The coordinate along `dim` of each element of `shape`, in row-major order.
fn coordinates_along(shape: &[usize], dim: usize) -> impl Iterator<Item = usize> {
    let mut unit = vec![0isize; shape.len()];
    unit[dim] = 1;
    sdk::offsets(shape, &unit).map(|c| c as usize)
}
