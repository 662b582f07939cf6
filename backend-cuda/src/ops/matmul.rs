//! Batched matrix products through cuBLAS, and products with a few rows against a weight read
//! along its rows through the plugin's own kernel (`kernels/gemv.cu`). `AddRmsNormLinear`
//! takes that kernel with its norm prologue when it applies, and otherwise runs the ops it
//! stands for (`AddRmsNorm`, `Matmul`, `Add`) on scratch buffers.
//!
//! cuBLAS is column-major; a row-major `y = a·b` is the column-major `yᵀ = bᵀ·aᵀ`, and a
//! row-major operand read column-major is its transpose, so dense or transposed views go to
//! cuBLAS as they are (`N` or `T`), other layouts are first copied dense. f16/bf16 accumulate
//! in f32 and f32 is IEEE (no TF32) unless `GENESIS_CUDA_ALLOW_TF32=1`.

use super::launch::Scratch;
use super::{arity, resolve, Family};
use crate::blas::{gemm_types, Blas, Gemm};
use crate::device::CudaDevice;
use crate::kernels::{merge_dims, set_geometry, Args, Operand};
use genesis_backend_api::sdk::checks;
use genesis_backend_api::{
    contiguous_strides, BackendError, BinaryOp, BufferId, DType, Op, OpKind, Result, TensorDesc,
};

kernel_module! {
    /// Products with one or two rows against a weight stored (n, k): decode's linear layers,
    /// with or without the residual norm before them.
    MODULE = "gemv", for &DType::FLOATS,
    from "gemv.cu"
}
inventory::submit! { Family { claims, run } }

/// Mirror of `struct GemvArgs` in gemv.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GemvArgs {
    a: u64,
    w: u64,
    y: u64,
    bias: u64,
    res: u64,
    g: u64,
    sum: u64,
    lda: i64,
    ldw: i64,
    ys0: i64,
    ys1: i64,
    ldr: i64,
    lds: i64,
    eps: f64,
    m: i32,
    n: i32,
    k: i32,
    slices: i32,
}

/// The most rows of `a` the few-row kernel takes. Each row of `a` adds a load per pack of the
/// weight; from 4 rows on, cuBLAS's tiles are faster (H100, Qwen2.5-0.5B decode at batch 4:
/// 1,785 against 1,990 tokens/s; batch 2: 1,194 against 1,093).
const GEMV_MAX_ROWS: usize = 2;
/// Warps per block of `gemv_{1,2}` (`WARPS` in gemv.cu): outputs per block times warps per output.
const GEMV_WARPS: usize = 8;

/// Shared memory `gemv_norm` may hold its normed rows in: the 48 KiB a block has by default,
/// less room for its static arrays.
const GEMV_NORM_SMEM: usize = 40 << 10;

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    let ops = [Op::Matmul.kind(), Op::AddRmsNormLinear { eps: 0.0, gated: false }.kind(), Op::Addmm.kind()];
    ops.iter().flat_map(|&op| DType::FLOATS.iter().map(move |&d| (op, d))).collect()
}

/// How one matrix (rows × cols, strides rs, cs) is handed to cuBLAS as its transpose in
/// column-major terms: `(op, leading dimension)`, or `None` when it must be copied dense.
fn layout(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<(i32, i32)> {
    let (rs, cs) = (rs as usize, cs as usize);
    if cols <= 1 || cs == 1 {
        let ld = if rows <= 1 { cols.max(1) } else { rs };
        if ld >= cols.max(1) && ld <= i32::MAX as usize {
            return Some((0, ld as i32));
        }
    }
    if rows <= 1 || rs == 1 {
        let ld = if cols <= 1 { rows.max(1) } else { cs };
        if ld >= rows.max(1) && ld <= i32::MAX as usize {
            return Some((1, ld as i32));
        }
    }
    None
}

fn blas(device: &CudaDevice) -> Result<&Blas> {
    device.blas.get_or_init(|| Blas::open(device.stream() as *mut _)).as_ref().map_err(Clone::clone)
}

/// A dense row-major copy of `x` in a scratch buffer.
fn dense_copy(device: &CudaDevice, x: &Operand) -> Result<(Operand, BufferId)> {
    let bytes = x.numel() * x.dtype.size_in_bytes();
    let (id, ptr) = device.scratch(bytes)?;
    let y = Operand { ptr, dtype: x.dtype, shape: x.shape.clone(), strides: contiguous_strides(&x.shape) };
    copy(device, "matmul (dense copy)", x, &y)?;
    Ok((y, id))
}

/// Copy `from` into `to` (one shape and dtype, any strides).
fn copy(device: &CudaDevice, what: &str, from: &Operand, to: &Operand) -> Result<()> {
    let mut args = Args::default();
    set_geometry(&mut args, &[from, to]);
    device.launch(what, from.dtype, "copy_s", &mut args, 1)
}

/// Run one op of this family.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    match *op {
        Op::AddRmsNormLinear { eps, gated } => add_rms_norm_linear(device, op, (eps, gated), inputs, outputs),
        Op::Addmm => addmm(device, op, inputs, outputs),
        _ => matmul(device, op, inputs, outputs),
    }
}

/// Run one matrix product.
fn matmul(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    arity(op, 2, 1, inputs, outputs)?;
    let (a, b, y) = (device.operand(&inputs[0])?, device.operand(&inputs[1])?, device.operand(&outputs[0])?);
    // The widened form (an f32 y of f16/bf16 operands): cuBLAS's C in f32.
    let [m, k, n] = checks::matmul_widened(op, &a, &b, &y)?;
    if y.numel() == 0 {
        return Ok(());
    }
    let limit = i32::MAX as usize;
    if m > limit || n > limit || k > limit {
        return Err(BackendError::unsupported(format!("matmul: dims {m}, {n}, {k} exceed cuBLAS's 32-bit sizes")));
    }
    if k == 0 {
        // An empty sum: y = 0.
        return super::elementwise::run(device, &Op::Fill { value: 0.0 }, &[], outputs);
    }
    let (a, b, y, m) = fold_shared_batch(a, b, y);
    if y.dtype == a.dtype && gemv(device, &a, &b, &y, (m, n, k))? {
        return Ok(());
    }
    let mut scratch = Vec::new();
    let result = product(device, a, b, y, (m, n, k), &mut scratch);
    for id in scratch {
        device.free_scratch(id)?;
    }
    result
}

/// `b` shared by every batch position (stride 0, as a broadcast weight) with `a` and `y`
/// laid out so that the batch and row dims merge into one: one product of `batch × m` rows,
/// as PyTorch folds `x (.., k) @ w`. Otherwise the operands as they are.
fn fold_shared_batch(a: Operand, b: Operand, y: Operand) -> (Operand, Operand, Operand, usize) {
    let r = a.shape.len();
    let m = a.shape[r - 2];
    if r == 2 || b.strides[..r - 2].iter().zip(&b.shape).any(|(&s, &d)| s != 0 && d != 1) {
        return (a, b, y, m);
    }
    let (rows, merged) = merge_dims(&a.shape[..r - 1], &[&a.strides[..r - 1], &y.strides[..r - 1]]);
    if rows.len() > 1 {
        return (a, b, y, m);
    }
    let total = rows.first().copied().unwrap_or(1);
    let stride = |j: usize| merged[j].first().copied().unwrap_or(0);
    let two_d = |x: &Operand, rows: usize, cols: usize, rs: isize| Operand {
        ptr: x.ptr,
        dtype: x.dtype,
        shape: vec![rows, cols],
        strides: vec![rs, x.strides[r - 1]],
    };
    let (k, n) = (a.shape[r - 1], b.shape[r - 1]);
    let a2 = two_d(&a, total, k, stride(0));
    let y2 = two_d(&y, total, n, stride(1));
    let b2 = two_d(&b, k, n, b.strides[r - 2]);
    (a2, b2, y2, total)
}

/// The few-row kernel, when it applies: at most [`GEMV_MAX_ROWS`] rows, no batch, `b` the
/// transpose of a weight stored (n, k) with unit stride along k, and `a` and that weight
/// packed (16-byte aligned, row strides and k multiples of the 16-byte pack), unless
/// `GENESIS_CUDA_GEMV=0` turned it off. Returns whether it ran.
fn gemv(device: &CudaDevice, a: &Operand, b: &Operand, y: &Operand, (m, n, k): (usize, usize, usize)) -> Result<bool> {
    if !device.switches.gemv {
        return Ok(false);
    }
    let r = a.shape.len();
    let pack = 16 / a.dtype.size_in_bytes();
    let batch: usize = y.shape[..r - 2].iter().product();
    let (lda, ldw) = (a.strides[r - 2], b.strides[r - 1]);
    let packed = |ptr: u64, ld: isize| ptr % 16 == 0 && (ld as usize) % pack == 0;
    let fits = batch == 1
        && m <= GEMV_MAX_ROWS
        && k % pack == 0
        && a.strides[r - 1] == 1
        && b.strides[r - 2] == 1
        && ldw >= k as isize
        && (m == 1 || lda >= k as isize)
        && packed(a.ptr, if m == 1 { 0 } else { lda })
        && packed(b.ptr, ldw);
    if !fits {
        return Ok(false);
    }
    let args = GemvArgs {
        a: a.ptr,
        w: b.ptr,
        y: y.ptr,
        lda: lda as i64,
        ldw: ldw as i64,
        ys0: y.strides[r - 2] as i64,
        ys1: y.strides[r - 1] as i64,
        ..GemvArgs::default()
    };
    launch_gemv(device, a.dtype, args, (m, n, k), Prologue::None)?;
    Ok(true)
}

/// What the few-row kernel does before and after its products.
#[derive(Clone, Copy, PartialEq)]
enum Prologue {
    /// `gemv_{m}`: the rows of `a` as they are.
    None,
    /// `gemv_norm_{m}`: the rows are made by the residual RMS norm.
    Norm,
    /// `gemv_norm_glu_{m}`: as `Norm`, and each output is the SwiGLU of a gate and an up row.
    NormGlu,
}

/// Launch the few-row kernel of `prologue` with `args`' operands and strides filled in, for
/// `n` outputs per row.
fn launch_gemv(
    device: &CudaDevice,
    dtype: DType,
    mut args: GemvArgs,
    (m, n, k): (usize, usize, usize),
    prologue: Prologue,
) -> Result<()> {
    // Warps per output: enough blocks to fill the device (about four per SM) while each warp
    // still reads at least one whole load per lane.
    let pack = 16 / dtype.size_in_bytes();
    let sms = device.facts.sm_count as usize;
    let chunks = k.div_ceil(32 * pack);
    let mut slices = 1;
    while slices < GEMV_WARPS && slices * 2 <= chunks && n.div_ceil(GEMV_WARPS / slices) < 4 * sms {
        slices *= 2;
    }
    let rows = GEMV_WARPS / slices;
    let stem = match prologue {
        Prologue::None => "gemv",
        Prologue::Norm => "gemv_norm",
        Prologue::NormGlu => "gemv_norm_glu",
    };
    let name = format!("{stem}_{m}");
    (args.m, args.n, args.k, args.slices) = (m as i32, n as i32, k as i32, slices as i32);
    let blocks = u32::try_from(n.div_ceil(rows))
        .map_err(|_| BackendError::unsupported(format!("matmul: {n} outputs exceed one grid")))?;
    let threads = 32 * GEMV_WARPS as u32;
    let smem = if prologue == Prologue::None { 0 } else { (m * k * dtype.size_in_bytes()) as u32 };
    device.launch_with("matmul", &MODULE, dtype, &name, &mut args, ((blocks, 1), (threads, 1), smem), true)
}

/// `AddRmsNormLinear`: `gemv_norm` (`gemv_norm_glu` when gated) for one or two packed rows,
/// else its ops one by one.
fn add_rms_norm_linear(
    device: &CudaDevice,
    op: &Op,
    (eps, gated): (f64, bool),
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<()> {
    let (ins, outs) = resolve(device, inputs, outputs)?;
    let ([x, residual, norm_weight, w], bias, [y, sum]) = checks::add_rms_norm_linear(op, eps, gated, &ins, &outs)?;
    if y.numel() == 0 && sum.numel() == 0 {
        return Ok(());
    }
    let (k, n) = (w.shape[1], w.shape[0]);
    let m = sum.numel() / k.max(1);
    let pack = 16 / x.dtype.size_in_bytes();
    // The stride between the (at most two) rows of `t (.., d)`: that of its leading dim of size 2.
    let row_stride = |t: &Operand| {
        let lead = t.shape.len() - 1;
        t.shape[..lead].iter().zip(&t.strides).find(|(&d, _)| d > 1).map_or(0, |(_, &s)| s)
    };
    let packed_rows = |t: &Operand| {
        let ld = row_stride(t);
        t.ptr % 16 == 0 && t.strides.last() == Some(&1) && ld % pack as isize == 0 && (m == 1 || ld >= k as isize)
    };
    // (No outputs but a sum to store takes the composition: a grid of no blocks is no launch.)
    let fits = device.switches.gemv
        && (1..=GEMV_MAX_ROWS).contains(&m)
        && n > 0
        && k % pack == 0
        && m * k * x.dtype.size_in_bytes() <= GEMV_NORM_SMEM
        && [x, residual, sum].into_iter().all(packed_rows)
        && norm_weight.ptr % 16 == 0
        && norm_weight.strides == [1]
        && w.ptr % 16 == 0
        && w.strides[1] == 1
        && w.strides[0] % pack as isize == 0
        && w.strides[0] >= k as isize
        && bias.is_none_or(|b| b.strides == [1]);
    if !fits {
        return compose_add_rms_norm_linear(device, eps, gated, inputs, outputs);
    }
    let args = GemvArgs {
        a: x.ptr,
        w: w.ptr,
        y: y.ptr,
        bias: bias.map_or(0, |b| b.ptr),
        res: residual.ptr,
        g: norm_weight.ptr,
        sum: sum.ptr,
        lda: row_stride(x) as i64,
        ldw: w.strides[0] as i64,
        ys0: row_stride(y) as i64,
        ys1: *y.strides.last().unwrap_or(&1) as i64,
        ldr: row_stride(residual) as i64,
        lds: row_stride(sum) as i64,
        eps,
        ..GemvArgs::default()
    };
    if gated {
        launch_gemv(device, x.dtype, args, (m, n / 2, k), Prologue::NormGlu)
    } else {
        launch_gemv(device, x.dtype, args, (m, n, k), Prologue::Norm)
    }
}

/// `AddRmsNormLinear` as the ops it is defined by, on scratch buffers: `AddRmsNorm`, then
/// `Matmul` against the weight's transpose (into `y` itself when it is dense and not gated),
/// `Add` of the bias broadcast over the rows, and `SwiGlu` of the halves when gated (or a
/// `Copy` out of scratch).
fn compose_add_rms_norm_linear(
    device: &CudaDevice,
    eps: f64,
    gated: bool,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<()> {
    let (x, w, y, sum) = (&inputs[0], &inputs[3], &outputs[0], &outputs[1]);
    let dtype = x.dtype()?;
    let shape = x.shape();
    let (lead, k, n) = (&shape[..shape.len() - 1], shape[shape.len() - 1], w.shape()[0]);
    let rows: usize = lead.iter().product();
    let mut scratch = Scratch::default();
    let result = (|| -> Result<()> {
        let mut desc = |dtype: DType, shape: &[usize]| scratch.desc(device, dtype, shape);
        let (h, rstd) = (desc(dtype, &[rows, k])?, desc(DType::F32, &[rows])?);
        let as_x = |t: &TensorDesc| TensorDesc::contiguous(t.buffer, 0, dtype, &shape);
        let rstd_lead = TensorDesc::contiguous(rstd.buffer, 0, DType::F32, lead)?;
        super::execute(device, &Op::AddRmsNorm { eps }, &inputs[..3], &[as_x(&h)?, *sum, rstd_lead])?;
        let ws = w.strides();
        let w_t = TensorDesc::new(w.buffer, w.offset_bytes as usize, dtype, &[k, n], &[ws[1], ws[0]])?;
        let direct = !gated && y.strides() == contiguous_strides(&y.shape());
        let product = if direct {
            TensorDesc::contiguous(y.buffer, y.offset_bytes as usize, dtype, &[rows, n])?
        } else {
            desc(dtype, &[rows, n])?
        };
        super::execute(device, &Op::Matmul, &[h, w_t], std::slice::from_ref(&product))?;
        let full_shape = [lead, &[n]].concat();
        let product = TensorDesc::contiguous(product.buffer, product.offset_bytes as usize, dtype, &full_shape)?;
        if let Some(b) = inputs.get(4) {
            let mut strides = vec![0; full_shape.len()];
            *strides.last_mut().unwrap_or(&mut 0) = b.strides()[0];
            let b = TensorDesc::new(b.buffer, b.offset_bytes as usize, dtype, &full_shape, &strides)?;
            super::execute(device, &Op::Binary(BinaryOp::Add), &[product, b], std::slice::from_ref(&product))?;
        }
        if gated {
            // The gate and up halves of each row, as views of the product.
            let half_shape = [lead, &[n / 2]].concat();
            let strides = contiguous_strides(&full_shape);
            let half = |first: usize| {
                let offset = product.offset_bytes as usize + first * dtype.size_in_bytes();
                TensorDesc::new(product.buffer, offset, dtype, &half_shape, &strides)
            };
            return super::execute(device, &Op::SwiGlu, &[half(0)?, half(n / 2)?], std::slice::from_ref(y));
        }
        if direct {
            return Ok(());
        }
        super::execute(device, &Op::Copy, &[product], std::slice::from_ref(y))
    })();
    let freed = scratch.free(device);
    result.and(freed)
}

fn product(
    device: &CudaDevice,
    mut a: Operand,
    mut b: Operand,
    y: Operand,
    (m, n, k): (usize, usize, usize),
    scratch: &mut Vec<BufferId>,
) -> Result<()> {
    let r = a.shape.len();
    let (op_a, ld_a) = cublas_matrix(device, &mut a, (m, k), scratch)?;
    let (op_b, ld_b) = cublas_matrix(device, &mut b, (k, n), scratch)?;
    // The output must be row-major with unit column stride; otherwise compute into scratch.
    let (out, copy_back) = match layout(m, n, y.strides[r - 2], y.strides[r - 1]) {
        Some((0, ld)) => ((y.clone(), ld), None),
        _ => {
            let bytes = y.numel() * y.dtype.size_in_bytes();
            let (id, ptr) = device.scratch(bytes)?;
            scratch.push(id);
            let dense = Operand { ptr, dtype: y.dtype, shape: y.shape.clone(), strides: contiguous_strides(&y.shape) };
            ((dense.clone(), n.max(1) as i32), Some(dense))
        }
    };
    let (yo, ld_y) = out;
    let (dtype_code, compute_type) = gemm_types(a.dtype, "matmul")?;
    // Batch dims merged across the three operands; all but the last merged dim loop here.
    let batch_shape = &yo.shape[..r - 2];
    let (bshape, bstrides) = merge_dims(batch_shape, &[&a.strides[..r - 2], &b.strides[..r - 2], &yo.strides[..r - 2]]);
    let (inner, outer_shape) = match bshape.split_last() {
        Some((&last, rest)) => (last, rest.to_vec()),
        None => (1, Vec::new()),
    };
    let inner_stride = |j: usize| bstrides[j].last().copied().unwrap_or(0) as i64;
    let c_dtype = if yo.dtype == a.dtype { dtype_code } else { gemm_types(yo.dtype, "matmul")?.0 };
    let elems = [a.dtype, b.dtype, yo.dtype].map(|d| d.size_in_bytes() as u64);
    let outer: usize = outer_shape.iter().product();
    let blas = blas(device)?;
    for index in 0..outer.max(1) {
        // Offsets of this outer batch position in each operand, in elements.
        let mut rest = index;
        let mut off = [0i64; 3];
        for d in (0..outer_shape.len()).rev() {
            let i = (rest % outer_shape[d]) as i64;
            rest /= outer_shape[d];
            for (j, o) in off.iter_mut().enumerate() {
                *o += i * bstrides[j][d] as i64;
            }
        }
        let addr = |j: usize, base: u64, o: i64| base.wrapping_add((o as u64).wrapping_mul(elems[j]));
        for start in (0..inner).step_by(i32::MAX as usize) {
            let count = (inner - start).min(i32::MAX as usize);
            let shift = |j: usize| off[j] + start as i64 * inner_stride(j);
            let g = Gemm {
                trans: (op_b, op_a),
                m: n as i32,
                n: m as i32,
                k: k as i32,
                a: (addr(1, b.ptr, shift(1)), ld_b, inner_stride(1)),
                b: (addr(0, a.ptr, shift(0)), ld_a, inner_stride(0)),
                c: (addr(2, yo.ptr, shift(2)), ld_y, inner_stride(2)),
                batch: count as i32,
                dtype: dtype_code,
                compute: compute_type,
            };
            // SAFETY: every matrix lies inside its validated view (or a scratch buffer of its
            // size); the handle is on this device's stream.
            unsafe { blas.gemm_into(&g, c_dtype, false)? };
        }
    }
    if let Some(dense) = copy_back {
        copy(device, "matmul (copy out)", &dense, &y)?;
    }
    Ok(())
}

/// How the last two dims of `x` (`rows × cols`) go to cuBLAS ([`layout`]), after replacing
/// `x` by a dense copy in a scratch buffer (pushed on `scratch`) when they cannot as they are.
fn cublas_matrix(
    device: &CudaDevice,
    x: &mut Operand,
    (rows, cols): (usize, usize),
    scratch: &mut Vec<BufferId>,
) -> Result<(i32, i32)> {
    let r = x.shape.len();
    if let Some(l) = layout(rows, cols, x.strides[r - 2], x.strides[r - 1]) {
        return Ok(l);
    }
    let (dense, id) = dense_copy(device, x)?;
    scratch.push(id);
    *x = dense;
    layout(rows, cols, x.strides[r - 2], x.strides[r - 1])
        .ok_or_else(|| BackendError::internal("matmul: dense copy has no cuBLAS layout"))
}

/// `Addmm`, `y += a · b`: one cuBLAS product with `beta = 1` whose C is `y` itself, of `y`'s
/// dtype (f32 for an f16/bf16 product accumulated into f32), accumulated in f32 (f64 for
/// f64). A `y` that is not row-major with unit column stride is accumulated in a dense copy
/// and copied back.
fn addmm(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (ins, outs) = resolve(device, inputs, outputs)?;
    let (([a, b], [y]), [m, k, n]) = checks::addmm(op, &ins, &outs)?;
    if m == 0 || n == 0 || k == 0 {
        return Ok(());
    }
    if [m, n, k].iter().any(|&d| d > i32::MAX as usize) {
        return Err(BackendError::unsupported(format!("addmm: dims {m}, {k}, {n} exceed cuBLAS's 32-bit sizes")));
    }
    let mut scratch = Vec::new();
    let mut run = || -> Result<()> {
        let (mut a, mut b) = (a.clone(), b.clone());
        let (op_a, ld_a) = cublas_matrix(device, &mut a, (m, k), &mut scratch)?;
        let (op_b, ld_b) = cublas_matrix(device, &mut b, (k, n), &mut scratch)?;
        // `y` itself as C, or a dense copy of it that is copied back afterwards.
        let (dense_y, ld_c) = match layout(m, n, y.strides[0], y.strides[1]) {
            Some((0, ld)) => (None, ld),
            _ => {
                let (dense, id) = dense_copy(device, y)?;
                scratch.push(id);
                (Some(dense), n as i32)
            }
        };
        let c = dense_y.as_ref().unwrap_or(y);
        let (dtype, compute) = gemm_types(a.dtype, "addmm")?;
        let c_dtype = if c.dtype == a.dtype { dtype } else { gemm_types(c.dtype, "addmm")?.0 };
        let g = Gemm {
            trans: (op_b, op_a),
            m: n as i32,
            n: m as i32,
            k: k as i32,
            a: (b.ptr, ld_b, 0),
            b: (a.ptr, ld_a, 0),
            c: (c.ptr, ld_c, 0),
            batch: 1,
            dtype,
            compute,
        };
        // SAFETY: every matrix lies inside its validated view or a scratch buffer of its
        // size, `y` overlaps neither input (checked by the device); the handle is on this
        // device's stream.
        unsafe { blas(device)?.gemm_into(&g, c_dtype, true)? };
        if let Some(dense) = &dense_y {
            copy(device, "addmm (copy out)", dense, y)?;
        }
        Ok(())
    };
    let result = run();
    for id in scratch {
        device.free_scratch(id)?;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_block_has_the_c_layout() {
        use crate::kernels::layout::assert_c_layout;
        assert_c_layout!(
            GemvArgs { a, w, y, bias, res, g, sum, lda, ldw, ys0, ys1, ldr, lds, eps, m, n, k, slices },
            MODULE.source(),
            "GemvArgs"
        );
    }

    fn operand(shape: &[usize], strides: &[isize]) -> Operand {
        Operand { ptr: 0, dtype: DType::BF16, shape: shape.to_vec(), strides: strides.to_vec() }
    }

    #[test]
    fn a_broadcast_weight_folds_the_batch_into_rows() {
        // x (3, 2, 8) @ wᵀ broadcast to (3, 8, 5): one product of 6 rows.
        let (a, b, y) =
            (operand(&[3, 2, 8], &[16, 8, 1]), operand(&[3, 8, 5], &[0, 1, 8]), operand(&[3, 2, 5], &[10, 5, 1]));
        let (a, b, y, m) = fold_shared_batch(a, b, y);
        assert_eq!((m, a.shape, a.strides, b.shape, b.strides), (6, vec![6, 8], vec![8, 1], vec![8, 5], vec![1, 8]));
        assert_eq!((y.shape, y.strides), (vec![6, 5], vec![5, 1]));
        // A weight per batch position, or rows that do not merge, stay batched.
        let a = operand(&[3, 2, 8], &[16, 8, 1]);
        let (_, _, _, m) =
            fold_shared_batch(a.clone(), operand(&[3, 8, 5], &[40, 5, 1]), operand(&[3, 2, 5], &[10, 5, 1]));
        assert_eq!(m, 2);
        let (_, _, _, m) = fold_shared_batch(
            operand(&[3, 2, 8], &[32, 8, 1]),
            operand(&[3, 8, 5], &[0, 1, 8]),
            operand(&[3, 2, 5], &[10, 5, 1]),
        );
        assert_eq!(m, 2);
    }

    #[test]
    fn layouts_map_row_major_and_transposed_views() {
        // Row-major 3x4: N with ld 4. Its transpose view (4x3, strides 1, 4): T with ld 4.
        assert_eq!(layout(3, 4, 4, 1), Some((0, 4)));
        assert_eq!(layout(4, 3, 1, 4), Some((1, 4)));
        // Padded rows are fine; overlapping rows and doubly strided views are not.
        assert_eq!(layout(3, 4, 6, 1), Some((0, 6)));
        assert_eq!(layout(3, 4, 2, 1), None);
        assert_eq!(layout(3, 4, 8, 2), None);
        // Vectors take any stride on their size-1 dim.
        assert_eq!(layout(1, 5, 999, 1), Some((0, 5)));
    }
}
