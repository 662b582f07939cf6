//! Layer norm and RMS norm over the last dim, forward and backward, and RMS norm after a
//! residual addition (`kernels/norm.cu`), with
//! the CPU backend's checks and dtype rules: float tensors, f32 `mean`/`rstd`, statistics in
//! f32 (f64 for f64).
//!
//! Every operand may be strided: the kernels take per-operand strides (leading dims merged
//! across operands, plus the stride along the row), so no copies are made; the vectorized
//! path applies when the rows are dense and 16-byte aligned. The mixed-precision forms of
//! `AddRmsNorm` and `RmsNormBackward` (interface 1.12: an f32 stream with an f16/bf16
//! residual, y or dy) run modes 0 to 2 of their own kernels in the half dtype's module, whose
//! packs hold the half type's 8 elements in every operand (32 bytes of f32). The weight gradients go through
//! per-group partial sums in a scratch buffer and a column-sum kernel, which makes them
//! deterministic (no float atomics).

use super::resolve;
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::{merge_dims, Operand};
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc, MAX_DIMS};

kernel_module! {
    /// Layer norm and RMS norm, forward and backward.
    MODULE = "norm", for &DType::FLOATS,
    from "norm.cu"
}
inventory::submit! { Family { claims, run } }

/// Most threads per row group and per block (`MAXG` in norm.cu, the kernels' launch bound).
const MAX_GROUP: usize = 512;

/// Packs of 16 bytes per thread in the forward's fast path (`norm_fwd_vec<LN, 4>`).
const VEC_PACKS: usize = 4;

/// Rows in flight per thread group in the backward's pipelined path (`NORM_PIPE_S` in
/// norm.cu): each thread stages its x and dy packs of that many rows in shared memory.
const PIPE_STAGES: usize = 2;

/// Columns per thread in the backward's fast path (`norm_bwd_pipe`: 1 pack of bf16/f16, 2 of
/// f32): the count measured fastest, on the kernel this path replaced (RESULTS.md, "Kernel
/// design notes").
const BWD_COLS: usize = 8;

// Operand slots of `RowArgs::p` (the S_* defines of norm.cu).
const S_X: usize = 0;
const S_Y: usize = 1;
const S_MEAN: usize = 2;
const S_RSTD: usize = 3;
const S_W: usize = 4;
const S_B: usize = 5;
const S_DY: usize = 6;
const S_PART: usize = 7;
// add_rms_norm's residual and sum (slots only the backward otherwise uses).
const S_RES: usize = S_DY;
const S_SUM: usize = S_PART;
// rms_norm_backward's dsum (the slot only layer norm's mean uses), and the flag bit that says
// it is there (`NORM_DSUM` in norm.cu).
const S_DSUM: usize = S_MEAN;
const NORM_DSUM: i32 = 4;
// rms_norm_backward's dx_half in the mixed form (the slot only layer norm's bias uses), and its
// flag bit (`NORM_DXH` in norm.cu).
const S_DXH: usize = S_B;
const NORM_DXH: i32 = 8;

/// An operand in its slot.
type Slot<'a> = (usize, &'a Operand);

/// Mirror of `struct RowArgs` in norm.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RowArgs {
    p: [u64; 8],
    rows: i64,
    d: i64,
    eps: f64,
    flag: i32,
    ndim: i32,
    group: i32,
    parts: i32,
    shape: [i64; MAX_DIMS],
    st: [[i64; MAX_DIMS]; 8],
    cs: [i64; 8],
}

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    let ops = [
        Op::LayerNorm { eps: 0.0 },
        Op::LayerNormBackward,
        Op::RmsNorm { eps: 0.0 },
        Op::RmsNormBackward,
        Op::AddRmsNorm { eps: 0.0 },
    ];
    domain::claims(&ops)
}

/// The argument block for rows of `x`: `rows` operands (x's shape) and `stats` (its leading
/// dims) in their slots, `params` (shape `[d]`) in theirs. Also picks the thread group per
/// row and the vectorized and big-row paths; `pack_dtype` is the kernel module's (x's, or the
/// half dtype of a mixed form), whose 16-byte pack sets the elements per pack of every
/// operand. Returns the block and threads per block.
fn row_args(x: &Operand, pack_dtype: DType, rows_ops: &[Slot], stats: &[Slot], params: &[Slot]) -> (RowArgs, u32) {
    let r = x.shape.len();
    let lead = &x.shape[..r - 1];
    let d = x.shape[r - 1];
    let mut lists: Vec<Vec<isize>> = vec![vec![0; lead.len()]; 8];
    let mut a = RowArgs { d: d as i64, rows: lead.iter().product::<usize>() as i64, ..RowArgs::default() };
    for &(slot, o) in rows_ops {
        lists[slot].copy_from_slice(&o.strides[..r - 1]);
        a.cs[slot] = o.strides[r - 1] as i64;
        a.p[slot] = o.ptr;
    }
    for &(slot, o) in stats {
        lists[slot].copy_from_slice(&o.strides);
        a.p[slot] = o.ptr;
    }
    for &(slot, o) in params {
        a.cs[slot] = o.strides[0] as i64;
        a.p[slot] = o.ptr;
    }
    let refs: Vec<&[isize]> = lists.iter().map(|l| l.as_slice()).collect();
    let (merged, merged_st) = merge_dims(lead, &refs);
    a.ndim = merged.len() as i32;
    for (dd, &n) in merged.iter().enumerate() {
        a.shape[dd] = n as i64;
        for (slot, st) in merged_st.iter().enumerate() {
            a.st[slot][dd] = st[dd] as i64;
        }
    }
    // Packs of `pack` elements when every row and parameter is dense along the row and every
    // row starts aligned for its pack (16 bytes, 32 for the f32 operands of a mixed form).
    let size = x.dtype.size_in_bytes();
    let pack = 16 / pack_dtype.size_in_bytes();
    let align = (pack * size).max(16) as u64;
    let vec = d % pack == 0
        && rows_ops.iter().all(|&(slot, o)| {
            a.cs[slot] == 1 && o.ptr % align == 0 && merged_st[slot].iter().all(|&s| s % pack as isize == 0)
        })
        && params.iter().all(|&(slot, o)| a.cs[slot] == 1 && o.ptr % align == 0);
    // Threads per row: enough that each holds at most `per_thread` elements in registers.
    let per_thread = if size == 8 { 8 } else { 16 };
    let need = d.div_ceil(per_thread).max(1);
    let (group, big) = if need > MAX_GROUP { (MAX_GROUP, true) } else { (need.next_power_of_two().max(32), false) };
    a.group = group as i32;
    // The mode of norm.cu (kernel suffix): 0 registers, 1 registers in packs, 2 big rows (the
    // forward and backward may then switch mode 1 to their fast paths, mode 3).
    a.flag = if big { 2 } else { vec as i32 };
    (a, group.max(128) as u32)
}

/// Blocks for `rows` rows with `threads` per block, `per_sm` threads resident per SM.
fn blocks(device: &CudaDevice, a: &RowArgs, threads: u32, per_sm: u32) -> u32 {
    let rpb = (threads / a.group as u32) as i64;
    let wanted = (a.rows + rpb - 1) / rpb;
    let cap = device.facts.sm_count as i64 * (per_sm / threads).max(1) as i64;
    wanted.min(cap).max(0) as u32
}

/// Run one op of this family.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    match *op {
        Op::LayerNorm { eps } | Op::RmsNorm { eps } | Op::AddRmsNorm { eps } => {
            let (ins, outs) = resolve(device, inputs, outputs)?;
            let x = &ins[0];
            // The mixed form of add_rms_norm (checked below): its kernels live in the module of
            // the residual's half dtype.
            let mixed = matches!(op, Op::AddRmsNorm { .. }) && ins[1].dtype != x.dtype;
            let module_dtype = if mixed { ins[1].dtype } else { x.dtype };
            let mut rows: Vec<Slot> = vec![(S_X, x), (S_Y, &outs[0])];
            let (stem, stats, params): (_, Vec<Slot>, Vec<Slot>) = match op {
                Op::LayerNorm { .. } => {
                    checks::layer_norm(op, eps, &ins, &outs)?;
                    ("norm_fwd_ln", vec![(S_MEAN, &outs[1]), (S_RSTD, &outs[2])], vec![(S_W, &ins[1]), (S_B, &ins[2])])
                }
                Op::RmsNorm { .. } => {
                    checks::rms_norm(op, eps, &ins, &outs)?;
                    ("norm_fwd_rms", vec![(S_RSTD, &outs[1])], vec![(S_W, &ins[1])])
                }
                _ => {
                    checks::add_rms_norm_mixed(op, eps, &ins, &outs)?;
                    rows.extend([(S_RES, &ins[1]), (S_SUM, &outs[1])]);
                    ("norm_fwd_add_rms", vec![(S_RSTD, &outs[2])], vec![(S_W, &ins[2])])
                }
            };
            let (mut a, mut threads) = row_args(x, module_dtype, &rows, &stats, &params);
            a.eps = eps;
            let mut per_sm = 2048;
            let stem = if mixed { "norm_fwd_add_rms_mixed" } else { stem };
            let mut name = format!("{stem}_{}", a.flag & 3);
            // The fast path (mode 3): dense aligned rows whose leading dims merge into one, in
            // groups sized for VEC_PACKS packs per thread. One block per row group (up to 64
            // per SM): the hardware hands rows to SMs as blocks finish.
            if a.flag == 1 && a.ndim <= 1 && !mixed {
                let need = (a.d as usize).div_ceil(VEC_PACKS * (16 / x.dtype.size_in_bytes())).max(1);
                if need <= MAX_GROUP {
                    let group = need.next_power_of_two().max(32);
                    a.group = group as i32;
                    a.flag = 3;
                    threads = group.max(128) as u32;
                    per_sm = 8192;
                    name = format!("{stem}_v");
                }
            }
            let grid = blocks(device, &a, threads, per_sm);
            // Every operand was validated against its buffer with the shapes the kernel is given.
            device.launch_with(op.name(), &MODULE, module_dtype, &name, &mut a, ((grid, 1), (threads, 1), 0), false)
        }
        Op::LayerNormBackward | Op::RmsNormBackward => {
            let ln = *op == Op::LayerNormBackward;
            let (ins, outs) = resolve(device, inputs, outputs)?;
            let (dsum, dx_half) = if ln {
                checks::layer_norm_backward(op, &ins, &outs)?;
                (None, None)
            } else {
                let ((_, dsum, _), dx_half) = checks::rms_norm_backward_half_dx(op, &ins, &outs)?;
                (dsum, dx_half)
            };
            backward(device, op, ln, &ins, (dsum, dx_half), &outs)
        }
        _ => Err(BackendError::unsupported(format!("cuda: {} is not a norm op", op.name()))),
    }
}

/// The backward of either norm on checked operands: dx row by row (plus `dsum`, and the mixed
/// form's `dx_half`, RMS only), then the weight (and bias) gradients as column sums of the
/// per-group partial sums.
fn backward(
    device: &CudaDevice,
    op: &Op,
    ln: bool,
    ins: &[Operand],
    (dsum, dx_half): (Option<&Operand>, Option<&Operand>),
    outs: &[Operand],
) -> Result<()> {
    let (dy, x, w) = (&ins[0], &ins[1], &ins[2]);
    // The mixed form (checked): a half dy against f32 rows, in the half dtype's module.
    let mixed = dy.dtype != x.dtype;
    let d = x.shape[x.shape.len() - 1];
    if d == 0 {
        return Ok(()); // dx, dweight and dbias are all empty
    }
    let stats: Vec<Slot> = if ln { vec![(S_MEAN, &ins[3]), (S_RSTD, &ins[4])] } else { vec![(S_RSTD, &ins[3])] };
    let mut rows: Vec<Slot> = vec![(S_X, x), (S_DY, dy), (S_Y, &outs[0])];
    rows.extend(dsum.map(|o| (S_DSUM, o)));
    rows.extend(dx_half.map(|o| (S_DXH, o)));
    let (mut a, threads) = row_args(x, dy.dtype, &rows, &stats, &[(S_W, w)]);
    let nout = if ln { 2 } else { 1 };
    let mut threads = threads;
    let mut stem = format!("{}", a.flag & 3);
    // Resident threads per SM the grid is sized for: the backward holds more row shares per
    // thread than the forward.
    let mut per_sm = 1024;
    let mut smem = 0u32;
    // The fast path (mode 3, `norm_bwd_pipe`: cp.async, sm_80+) for f32/f16/bf16: dense
    // aligned rows whose leading dims merge into one, in groups sized for BWD_COLS columns per
    // thread, x and dy of PIPE_STAGES rows staged in shared memory per thread (16-byte packs).
    // f64 and older GPUs keep mode 1.
    let size = x.dtype.size_in_bytes();
    if mixed {
        stem = format!("mixed_{}", a.flag); // modes 0 to 2, as in the forward
    } else if a.flag == 1 && a.ndim <= 1 && size < 8 && device.facts.arch >= 80 {
        let need = d.div_ceil(BWD_COLS).max(1);
        if need <= MAX_GROUP {
            let group = need.next_power_of_two().max(32);
            a.group = group as i32;
            a.flag = 3;
            threads = group.max(128) as u32;
            let packs = BWD_COLS / (16 / size);
            stem = format!("p{packs}");
            smem = (PIPE_STAGES * 2 * packs * 16) as u32 * threads;
            // The f32 kernels (2 packs) take 87-96 registers: five 128-thread blocks, two of
            // 256 or one of 512 per SM.
            if packs == 2 {
                per_sm = 640;
            }
        }
    }
    if dsum.is_some() {
        a.flag |= NORM_DSUM;
    }
    if dx_half.is_some() {
        a.flag |= NORM_DXH;
    }
    let grid = blocks(device, &a, threads, per_sm);
    let parts = grid as usize * (threads / a.group as u32) as usize;
    let acc = if x.dtype == DType::F64 { 8 } else { 4 };
    let scratch = if parts > 0 { Some(device.scratch(parts * nout * d * acc)?) } else { None };
    let name = &op.name();
    let result = (|| {
        if let Some((_, ptr)) = scratch {
            a.p[S_PART] = ptr;
            a.parts = parts as i32;
            let kernel = format!("{}_{stem}", if ln { "norm_bwd_ln" } else { "norm_bwd_rms" });
            // As in the forward; the scratch holds `parts` partial rows of `nout * d`.
            device.launch_with(name, &MODULE, dy.dtype, &kernel, &mut a, ((grid, 1), (threads, 1), smem), false)?;
        }
        // Column sums (zeros when there are no rows).
        let mut c = RowArgs { rows: parts as i64, d: d as i64, parts: nout as i32, ..RowArgs::default() };
        c.p[S_PART] = a.p[S_PART];
        for (j, o) in outs[1..1 + nout].iter().enumerate() {
            c.p[j] = o.ptr;
            c.cs[j] = o.strides[0] as i64;
        }
        // The outputs `[d]` were validated.
        device.launch_with(
            name,
            &MODULE,
            x.dtype,
            "norm_colsum",
            &mut c,
            ((d.div_ceil(32) as u32, nout as u32), (512, 1), 0),
            false,
        )
    })();
    // Stream order keeps the scratch alive for the queued kernels.
    if let Some((id, _)) = scratch {
        device.free_scratch(id)?;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_blocks_have_the_c_layout() {
        use crate::kernels::layout::assert_c_layout;
        assert_c_layout!(
            RowArgs { p, rows, d, eps, flag, ndim, group, parts, shape, st, cs },
            MODULE.source(),
            "RowArgs"
        );
    }
}
