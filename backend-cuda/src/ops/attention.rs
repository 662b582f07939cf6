//! Scaled dot-product attention and its backward (`kernels/attention.cu`): flash-style tiled
//! kernels with an online softmax in the compute type (f32, f64 for f64), grouped-query and
//! bottom-right aligned causal masking, with the CPU backend's checks and dtype rules (`lse`
//! is f32 whatever the element type).
//!
//! Operands are read and written through their strides (no contiguous copies): a tile's rows
//! are loaded a warp per row, so views with a dense head dim stay coalesced.

use super::launch::{compute_dtype, grid, launch_1d, with_scratch, Scratch};
use super::resolve;
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::Operand;
use genesis_backend_api::sdk::checks::{attention, attention_backward, masked_attention, AttentionDims as Dims};
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

kernel_module! {
    /// Flash-style attention forward and backward.
    MODULE = "attention", for &DType::FLOATS,
    from "attention.cu"
}
inventory::submit! { Family { claims, run } }

/// Threads per block: 8 warps (`WARPS` in attention.cu).
const THREADS: u32 = 256;
/// Resident rows per block (`BR`) and streamed rows per tile (`BC`).
const BR: usize = 32;
const BC: usize = 32;

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    let ops = [
        Op::Attention { causal: false, scale: 1.0 },
        Op::AttentionBackward { causal: false, scale: 1.0 },
        Op::MaskedAttention { scale: 1.0 },
    ];
    domain::claims(&ops)
}

/// Mirror of `struct AttnArgs` in attention.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AttnArgs {
    /// q k v o lse do dq dk dv (those the op has).
    p: [u64; 9],
    /// Backward scratch: rowsum(do ∘ o), dense (b, hq, s), compute type; the tensor-core
    /// backward adds lse·log2 e (f32) after it.
    delta: u64,
    /// Element strides of each operand.
    st: [[i64; 4]; 9],
    b: i64,
    hq: i64,
    hk: i64,
    s: i64,
    t: i64,
    d: i64,
    scale: f64,
    causal: i64,
    /// Masked attention: keys per block. The Hopper dk/dv pass: blocks that share out the
    /// query heads of a group (`head_split`).
    split: i64,
    /// Masked attention over several splits, the Hopper dk/dv pass with a head split: the
    /// partial results (scratch).
    partial: u64,
}

impl AttnArgs {
    fn set(&mut self, slot: usize, o: &Operand) {
        self.p[slot] = o.ptr;
        for (d, &s) in o.strides.iter().enumerate() {
            self.st[slot][d] = s as i64;
        }
    }
}

/// The kernel variant for head dim `d` (its `DMAX`), or `Unsupported` past the largest one.
/// f64 stops at 128: its shared tiles at 256 exceed what a block may have.
fn variant(op: &Op, d: usize, dtype: DType) -> Result<usize> {
    let max = if dtype == DType::F64 { 128 } else { 256 };
    match [32, 64, 128, 256].into_iter().find(|&v| d <= v && v <= max) {
        Some(v) => Ok(v),
        None => Err(BackendError::unsupported(format!(
            "cuda: {} supports head dims up to {max} for {dtype}, got {d}",
            op.name()
        ))),
    }
}

/// `attn_masked_{dmax}`: keys per chunk (`MA_CHUNK`) and warps (`MA_WARPS`, also
/// `attn_decode_{d}`'s `MD_WARPS`).
const MA_CHUNK: usize = 1024;
const MA_WARPS: usize = 8;
/// The fewest keys a block of `attn_masked` takes when a row's keys are split.
const MA_MIN_SPLIT: usize = 64;
/// Shared memory of `attn_masked_combine`: one row's partials and scales, splits · (d + 3)
/// values.
const MA_COMBINE_SMEM: usize = 48 * 1024;

/// The most query heads per key head `attn_decode_{d}` serves (`MD_GMAX`).
const MD_GMAX: usize = 8;

/// (batch, key head) pairs whose blocks `attn_decode_{d}` counts to find the last one, which
/// merges the key ranges (`MD_COUNTERS` in attention.cu).
const MD_COUNTERS: usize = 4096;

/// Keys per pass of `attn_decode_{d}` when it applies to this masked attention: one query per
/// row (a decode step), a head dim of 64 or 128, at most [`MD_GMAX`] query heads per key head,
/// at most [`MD_COUNTERS`] (batch, key head) pairs, and key and value rows dense along the head
/// dim and 16-byte aligned (it loads 16-byte packs). `GENESIS_CUDA_DECODE_ATTENTION=0` sends
/// every masked attention to `attn_masked`.
fn decode_pass(device: &CudaDevice, dm: &Dims, dtype: DType, k: &Operand, v: &Operand) -> Option<usize> {
    if !device.switches.decode_attention {
        return None;
    }
    let pack = 16 / dtype.size_in_bytes();
    let packed =
        |x: &Operand| x.strides[3] == 1 && x.ptr % 16 == 0 && x.strides[..3].iter().all(|&s| s % pack as isize == 0);
    let fits = dm.s == 1
        && matches!(dm.d, 64 | 128)
        && dm.hk > 0
        && dm.hq % dm.hk == 0
        && dm.hq / dm.hk <= MD_GMAX
        && dm.b * dm.hk <= MD_COUNTERS
        && packed(k)
        && packed(v);
    // A key row is `min(32, d / pack)` lanes; each of the block's warps takes 32 / that many.
    fits.then(|| MA_WARPS * 32 / (dm.d / pack).min(32))
}

/// Tensor-core kernels (`attn_*_tc_*`): threads per block (4 warps), rows of a 64-row tile.
const TC_THREADS: u32 = 128;
const TC_ROWS: usize = 64;

/// The padded head dim (64 or 128) of the tensor-core kernels, when they apply: f16 or bf16
/// on sm_80 or newer, a head dim that is a multiple of 8 up to 128, sequence lengths that fit
/// the kernels' 32-bit row indices, the operands they `load` (q, k, v and, backward, do) with
/// a dense head dim and 16-byte aligned rows (cp.async moves 8 elements at a time), those
/// they `store` (o; dq, dk, dv) with a dense head dim and 4-byte aligned pairs. Everything
/// else takes the general kernels.
fn tensor_core_dim(arch: u32, dm: &Dims, load: &[&Operand], store: &[&Operand]) -> Option<usize> {
    let dtype = store.first()?.dtype;
    let half = matches!(dtype, DType::F16 | DType::BF16);
    if !half || arch < 80 || dm.d == 0 || dm.d % 8 != 0 || dm.d > 128 || dm.hk == 0 {
        return None;
    }
    if dm.s.max(dm.t) >= 1 << 30 {
        return None;
    }
    let aligned = |x: &Operand, elems: isize| {
        x.dtype == dtype
            && x.strides[3] == 1
            && x.strides[..3].iter().all(|&s| s % elems == 0)
            && x.ptr % (2 * elems as u64) == 0
    };
    let dense = load.iter().all(|x| aligned(x, 8)) && store.iter().all(|x| aligned(x, 2));
    dense.then_some(if dm.d <= 64 { 64 } else { 128 })
}

/// Query rows per block of `attn_fwd_tc_{dpad}`: at d = 64 each warp takes two 16-row m-tiles
/// (they share every K and V fragment read from shared memory), at d = 128 one (two would not
/// fit in registers).
fn tc_fwd_rows(dpad: usize) -> usize {
    if dpad <= 64 {
        2 * TC_ROWS
    } else {
        TC_ROWS
    }
}

/// K/V pipeline stages of `attn_fwd_tc_{dpad}` and `attn_bwd_dq_tc_{dpad}` (their `S`): three
/// at d = 64, two at d = 128, where three would pass the 99 KiB a block may have on
/// sm_86/sm_89 (forward) and leave shared memory for one dq block per SM instead of two.
fn tc_stages(dpad: usize) -> usize {
    if dpad <= 64 {
        3
    } else {
        2
    }
}

/// Shared memory of `attn_fwd_tc_{dpad}` (its Q tile, up to 128 rows, is staged in the
/// last stage first): the stages of a K and a V tile of 64 rows, each row `dpad + 8` 2-byte
/// elements.
fn tc_smem(dpad: usize) -> u32 {
    (tc_stages(dpad) * 2 * 64 * (dpad + 8) * 2) as u32
}

/// The Hopper forward `attn_fwd_wg_64` (wgmma, sm_90 only: the products are sm_90a
/// instructions, absent from Ampere and from Blackwell): threads per block (two warpgroups)
/// and query rows per block (`WG_THREADS`, `WG_BM` in attention.cu).
const WG_THREADS: u32 = 256;
const WG_ROWS: usize = 128;

/// Whether the forward and the backward take the wgmma kernels (`attn_fwd_wg_64`,
/// `attn_bwd_dq_wg_64`, `attn_bwd_dkv_wg_64`): on sm_90 with its modules compiled for sm_90a
/// (`arch_specific`; otherwise the kernels are compiled empty), where the tensor-core path
/// applies at the padded head dim 64.
fn hopper_wgmma(arch: u32, arch_specific: bool, dpad: usize) -> bool {
    arch == 90 && arch_specific && dpad == 64
}

/// K/V pipeline stages of `attn_fwd_wg_64` (`WG_STAGES` in attention.cu).
const WG_STAGES: usize = 5;

/// Shared memory of `attn_fwd_wg_64`: Q (128 rows of 64 elements) and `WG_STAGES` stages of a
/// K and a V tile of 64 rows, plus 1 KiB to start on a 1024-byte boundary (the period of the
/// swizzled layout).
fn wg_smem() -> u32 {
    ((WG_ROWS * 64 + WG_STAGES * 2 * 64 * 64) * 2 + 1024) as u32
}

/// The Hopper backward passes (`attn_bwd_dq_wg_64`, `attn_bwd_dkv_wg_64`): one warpgroup
/// per block, which takes 64 query rows (dq) or 64 keys (dk/dv) (`WG_BWD_THREADS` in
/// attention.cu).
const WG_BWD_THREADS: u32 = 128;
const WG_BWD_ROWS: usize = 64;
/// K/V stages of `attn_bwd_dq_wg_64` and Q/dO stages of `attn_bwd_dkv_wg_64`
/// (`WG_DQ_STAGES`, `WG_DKV_STAGES` in attention.cu).
const WG_DQ_STAGES: usize = 3;
const WG_DKV_STAGES: usize = 3;

/// Blocks per SM of the Hopper backward passes (their `__launch_bounds__`).
const WG_BWD_BLOCKS_PER_SM: u64 = 3;

/// How many blocks share out the query heads of a group in `attn_bwd_dkv_wg_64`, which
/// otherwise has one block per (batch, kv head, key tile) and a group's worth of steps in
/// each: a grouped-query model then fills few of the GPU's block slots, the first key tiles'
/// blocks running long after the rest. The fewest parts that give `blocks` two waves of the
/// GPU, each part `ceil(group / split)` heads (so that no part is empty); 1 keeps the single
/// pass, above 1 the parts' sums are added by `attn_bwd_dkv_sum`, whose f32 reads grow with
/// the parts (SFT step shape on an H200, pass + sum: 0.140 ms unsplit, 0.117 / 0.097 /
/// 0.112 ms in 2 / 4 / 7 parts; backend-cuda/RESULTS.md).
fn head_split(blocks: u64, group: usize, sms: u64) -> usize {
    let wanted = 2 * WG_BWD_BLOCKS_PER_SM * sms;
    let split = (1..=group).find(|&parts| blocks * parts as u64 >= wanted).unwrap_or(group);
    let per = group.div_ceil(split.max(1)).max(1);
    group.div_ceil(per).max(1)
}

/// Shared memory of `attn_bwd_dq_wg_64`: 1 KiB of alignment slack, Q and dO (64 rows of 64
/// elements each), the stages of a K and a V tile, and the rows' D and lse (f32).
fn wg_dq_smem() -> u32 {
    (1024 + 2 * WG_BWD_ROWS * 64 * 2 + WG_DQ_STAGES * 2 * 64 * 64 * 2 + 2 * WG_BWD_ROWS * 4) as u32
}

/// Shared memory of `attn_bwd_dkv_wg_64`: 1 KiB of alignment slack, K and V (64 rows of 64
/// elements each), and per stage a Q and a dO tile of 64 rows with their lse and D (f32).
fn wg_dkv_smem() -> u32 {
    (1024 + 2 * WG_BWD_ROWS * 64 * 2 + WG_DKV_STAGES * (2 * 64 * 64 * 2 + 2 * 64 * 4)) as u32
}

/// Queries per step of `attn_bwd_dkv_tc_{dpad}` (`BM` in attention.cu).
fn tc_dkv_rows(dpad: usize) -> usize {
    if dpad <= 64 {
        64
    } else {
        32
    }
}

/// Q/dO pipeline stages of `attn_bwd_dkv_tc_{dpad}` (its `S`; two measured fastest, see
/// RESULTS.md, "Kernel design notes").
const TC_DKV_STAGES: usize = 2;

/// Shared memory of `attn_bwd_dkv_tc_{dpad}`: the block's K and V (64 rows each), and per
/// stage a Q and a dO tile and the tile's lse and D (f32).
fn tc_dkv_smem(dpad: usize) -> u32 {
    let bm = tc_dkv_rows(dpad);
    ((2 * 64 + TC_DKV_STAGES * 2 * bm) * (dpad + 8) * 2 + TC_DKV_STAGES * 2 * bm * 4) as u32
}

/// Shared memory of `attn_bwd_dq_tc_{dpad}`: the block's Q and dO (64 rows each) and the
/// stages of a K and a V tile (as many as the forward's, `tc_stages`).
fn tc_dq_smem(dpad: usize) -> u32 {
    ((2 * 64 + tc_stages(dpad) * 2 * 64) * (dpad + 8) * 2) as u32
}

fn args(dm: &Dims, causal: bool, scale: f64) -> AttnArgs {
    AttnArgs {
        b: dm.b as i64,
        hq: dm.hq as i64,
        hk: dm.hk as i64,
        s: dm.s as i64,
        t: dm.t as i64,
        d: dm.d as i64,
        scale,
        causal: causal as i64,
        ..AttnArgs::default()
    }
}

/// Shared memory of a kernel whose tiles hold `rows` rows of the padded head dim, plus
/// `extra` single values, in the compute type of `dtype`.
fn smem(dtype: DType, d: usize, rows: usize, extra: usize) -> u32 {
    ((rows * (d | 1) + extra) * compute_dtype(dtype).size_in_bytes()) as u32
}

/// Run one attention op.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    match *op {
        Op::Attention { causal, scale } => {
            let (ins, outs) = resolve(device, inputs, outputs)?;
            let (dm, [q, k, v], [o, lse]) = attention(op, &ins, &outs)?;
            let dmax = variant(op, dm.d, q.dtype)?;
            let mut a = args(&dm, causal, scale);
            for (slot, x) in [q, k, v, o, lse].into_iter().enumerate() {
                a.set(slot, x);
            }
            if let Some(tc) = tensor_core_dim(device.facts.arch, &dm, &[q, k, v], &[o]) {
                if hopper_wgmma(device.facts.arch, device.arch_specific(), tc) {
                    let work = (dm.b * dm.hq * dm.s.div_ceil(WG_ROWS)) as u64;
                    if work <= i32::MAX as u64 {
                        let shape = (work as u32, WG_THREADS, wg_smem());
                        return launch_1d(device, op.name(), &MODULE, q.dtype, "attn_fwd_wg_64", &mut a, shape);
                    }
                }
                let rows = tc_fwd_rows(tc);
                let work = (dm.b * dm.hq * dm.s.div_ceil(rows)) as u64;
                if work <= i32::MAX as u64 {
                    let shape = (work as u32, TC_THREADS, tc_smem(tc));
                    let name = format!("attn_fwd_tc_{tc}");
                    return launch_1d(device, op.name(), &MODULE, q.dtype, &name, &mut a, shape);
                }
            }
            let work = (dm.b * dm.hq * dm.s.div_ceil(BR)) as u64;
            let shape = (grid(device, work, 8), THREADS, smem(q.dtype, dm.d, BR + 2 * BC, 0));
            launch_1d(device, op.name(), &MODULE, q.dtype, &format!("attn_fwd_{dmax}"), &mut a, shape)
        }
        Op::AttentionBackward { causal, scale } => {
            let (ins, outs) = resolve(device, inputs, outputs)?;
            let (dm, [q, k, v, o, lse, d_o], [dq, dk, dv]) = attention_backward(op, &ins, &outs)?;
            let dmax = variant(op, dm.d, q.dtype)?;
            let mut a = args(&dm, causal, scale);
            for (slot, x) in [q, k, v, o, lse, d_o, dq, dk, dv].into_iter().enumerate() {
                a.set(slot, x);
            }
            // sm_86/sm_89 allow 99 KiB of shared memory per block: too little for the d = 128 dq pass.
            let fits = |tc: &usize| tc_dq_smem(*tc).max(tc_dkv_smem(*tc)) <= device.facts.max_smem_optin;
            let tc = tensor_core_dim(device.facts.arch, &dm, &[q, k, v, d_o], &[dq, dk, dv]).filter(fits);
            with_scratch(device, |scratch| match tc {
                Some(tc) => backward_tc(device, op, &dm, tc, q.dtype, &mut a, scratch),
                None => backward(device, op, &dm, dmax, q.dtype, &mut a, scratch),
            })
        }
        Op::MaskedAttention { scale } => {
            let (ins, outs) = resolve(device, inputs, outputs)?;
            let (dm, [q, k, v, keep], [o]) = masked_attention(op, &ins, &outs)?;
            let dmax = variant(op, dm.d, q.dtype)?;
            let mut a = args(&dm, false, scale);
            for (slot, x) in [q, k, v, o, keep].into_iter().enumerate() {
                a.set(slot, x);
            }
            // Key ranges of at least a minimum of keys. `attn_masked`: a block per (query row,
            // range), enough for 4 per SM. `attn_decode`: a block per (batch, key head, range),
            // at most one wave of them (the blocks an SM holds at once, which its registers
            // for the group's queries and sums make few): each range's block pays a fixed cost
            // (its group's queries, the final sums, the merge), so more blocks than run at once
            // only add rounds of that cost.
            let decode = decode_pass(device, &dm, q.dtype, k, v);
            let rows = dm.b * dm.hq * dm.s;
            let elem = compute_dtype(q.dtype).size_in_bytes();
            let decode_smem = (MA_WARPS * (dm.hq / dm.hk.max(1)) * dm.d * elem) as u32;
            let sms = device.facts.sm_count as usize;
            let wanted = match decode {
                Some(_) => {
                    let kernel = format!("attn_decode_{}", dm.d);
                    let wave = device.resident_blocks(&MODULE, q.dtype, &kernel, THREADS, decode_smem)? as usize * sms;
                    (wave / (dm.b * dm.hk).max(1)).max(1)
                }
                // `attn_masked_combine` holds a row's partials in shared memory.
                None => (4 * sms).div_ceil(rows.max(1)).min(MA_COMBINE_SMEM / ((dm.d + 3) * elem)),
            };
            let min_split = decode.unwrap_or(MA_MIN_SPLIT);
            let splits = wanted.clamp(1, dm.t.div_ceil(min_split).max(1));
            a.split = dm.t.div_ceil(splits).max(1) as i64;
            let splits = dm.t.div_ceil(a.split as usize).max(1);
            with_scratch(device, |scratch| {
                if splits > 1 {
                    a.partial = scratch.dense(device, compute_dtype(q.dtype), &[rows * splits, dm.d + 2])?.ptr;
                }
                if decode.is_some() {
                    // Dynamic shared memory: the warps' outputs for the group's heads.
                    let work = (dm.b * dm.hk * splits) as u64;
                    let shape = ((grid(device, work, 8), 1), (THREADS, 1), decode_smem);
                    let kernel = format!("attn_decode_{}", dm.d);
                    device.launch_with(op.name(), &MODULE, q.dtype, &kernel, &mut a, shape, true)?;
                } else {
                    // Shared: a chunk of scores, the reduction slots, the warps' outputs.
                    let smem = ((MA_CHUNK + 32 + MA_WARPS * dm.d) * elem) as u32;
                    let work = (rows * splits) as u64;
                    let shape = (grid(device, work, 8), THREADS, smem);
                    launch_1d(device, op.name(), &MODULE, q.dtype, &format!("attn_masked_{dmax}"), &mut a, shape)?;
                }
                // The decode kernel merges its own key ranges.
                if splits > 1 && decode.is_none() {
                    let smem = (splits * (dm.d + 3) * elem) as u32;
                    let shape = (grid(device, rows as u64, 8), 128, smem);
                    launch_1d(device, op.name(), &MODULE, q.dtype, "attn_masked_combine", &mut a, shape)?;
                }
                Ok(())
            })
        }
        _ => Err(BackendError::unsupported(format!("cuda: {} is not an attention op", op.name()))),
    }
}

fn backward(
    device: &CudaDevice,
    op: &Op,
    dm: &Dims,
    dmax: usize,
    dtype: DType,
    a: &mut AttnArgs,
    scratch: &mut Scratch,
) -> Result<()> {
    let name = op.name();
    let rows = dm.b * dm.hq * dm.s;
    if rows > 0 {
        delta(device, name, rows, dtype, a, scratch)?;
        let work = (dm.b * dm.hq * dm.s.div_ceil(BR)) as u64;
        let shape = (grid(device, work, 8), THREADS, smem(dtype, dm.d, 2 * BR + 2 * BC, 0));
        launch_1d(device, name, &MODULE, dtype, &format!("attn_bwd_dq_{dmax}"), a, shape)?;
    }
    // dk and dv are written for every key (zeros where no query sees it), even when s = 0.
    let work = (dm.b * dm.hk * dm.t.div_ceil(BR)) as u64;
    let shape = (grid(device, work, 8), THREADS, smem(dtype, dm.d, 2 * BR + 2 * BC, 2 * BC));
    launch_1d(device, name, &MODULE, dtype, &format!("attn_bwd_dkv_{dmax}"), a, shape)
}

/// D = rowsum(do ∘ o) into scratch (`a.delta`), a warp per row.
fn delta(
    device: &CudaDevice,
    name: &str,
    rows: usize,
    dtype: DType,
    a: &mut AttnArgs,
    scratch: &mut Scratch,
) -> Result<()> {
    a.delta = scratch.dense(device, compute_dtype(dtype), &[rows])?.ptr;
    let warps_per_block = (THREADS / 32) as u64;
    let shape = (grid(device, (rows as u64).div_ceil(warps_per_block), 32), THREADS, 0);
    launch_1d(device, name, &MODULE, dtype, "attn_bwd_delta_k", a, shape)
}

/// The tensor-core backward: dq (and D) per 64-query tile, then dk, dv per 64-key tile (one
/// block per tile: the grids are the work, heaviest tiles first).
fn backward_tc(
    device: &CudaDevice,
    op: &Op,
    dm: &Dims,
    dpad: usize,
    dtype: DType,
    a: &mut AttnArgs,
    scratch: &mut Scratch,
) -> Result<()> {
    let name = op.name();
    let hopper = hopper_wgmma(device.facts.arch, device.arch_specific(), dpad);
    // Both generations take blocks of 64 rows (queries or keys); the Hopper dk/dv pass may
    // share a group's query heads out among `split` blocks per key tile.
    let q_work = (dm.b * dm.hq * dm.s.div_ceil(TC_ROWS)) as u64;
    let k_work = (dm.b * dm.hk * dm.t.div_ceil(TC_ROWS)) as u64;
    let split = if hopper { head_split(k_work, dm.hq / dm.hk.max(1), device.facts.sm_count as u64) } else { 1 };
    let k_blocks = k_work * split as u64;
    if q_work.max(k_blocks) > i32::MAX as u64 {
        return Err(BackendError::unsupported(format!("cuda: {name} has too many tiles for one launch")));
    }
    let (dq_pass, dkv_pass) = if hopper {
        let dq = ("attn_bwd_dq_wg_64".to_string(), WG_BWD_THREADS, wg_dq_smem());
        (dq, ("attn_bwd_dkv_wg_64".to_string(), WG_BWD_THREADS, wg_dkv_smem()))
    } else {
        let dq = (format!("attn_bwd_dq_tc_{dpad}"), TC_THREADS, tc_dq_smem(dpad));
        (dq, (format!("attn_bwd_dkv_tc_{dpad}"), TC_THREADS, tc_dkv_smem(dpad)))
    };
    let rows = dm.b * dm.hq * dm.s;
    if rows > 0 {
        // The dq pass computes D = rowsum(do ∘ o) itself and writes it here for the dk/dv
        // pass, followed by lse·log2 e, so that the dk/dv pass fetches both per-query scalars
        // with cp.async.
        a.delta = scratch.dense(device, compute_dtype(dtype), &[2 * rows])?.ptr;
        let (kernel, threads, smem) = dq_pass;
        launch_1d(device, name, &MODULE, dtype, &kernel, a, (q_work as u32, threads, smem))?;
    }
    // dk and dv are written for every key (zeros where no query sees it), even when s = 0.
    let key_rows = dm.b * dm.hk * dm.t;
    if split > 1 {
        a.split = split as i64;
        a.partial = scratch.dense(device, DType::F32, &[split, 2, key_rows, 64])?.ptr;
    }
    let (kernel, threads, smem) = dkv_pass;
    launch_1d(device, name, &MODULE, dtype, &kernel, a, (k_blocks as u32, threads, smem))?;
    if split > 1 {
        // A thread per pair of columns of a key row, grid-stride.
        let shape = (grid(device, (key_rows as u64 * 32).div_ceil(256), 16), 256, 0);
        launch_1d(device, name, &MODULE, dtype, "attn_bwd_dkv_sum", a, shape)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_block_has_the_c_layout() {
        use crate::kernels::layout::assert_c_layout;
        assert_c_layout!(
            AttnArgs { p, delta, st, b, hq, hk, s, t, d, scale, causal, split, partial },
            MODULE.source(),
            "AttnArgs"
        );
    }

    #[test]
    fn head_dims_pick_the_smallest_variant() {
        let op = Op::Attention { causal: false, scale: 1.0 };
        assert_eq!(variant(&op, 0, DType::F32).unwrap(), 32);
        assert_eq!(variant(&op, 33, DType::F16).unwrap(), 64);
        assert_eq!(variant(&op, 128, DType::F64).unwrap(), 128);
        assert_eq!(variant(&op, 256, DType::BF16).unwrap(), 256);
        assert!(variant(&op, 129, DType::F64).is_err());
        assert!(variant(&op, 257, DType::F32).is_err());
    }

    #[test]
    fn the_tensor_core_forward_takes_dense_half_operands() {
        let dense = |dtype, d: usize| Operand {
            ptr: 1 << 20,
            dtype,
            shape: vec![2, 4, 16, d],
            strides: vec![(64 * d) as isize, (16 * d) as isize, d as isize, 1],
        };
        let dm = |d| Dims { b: 2, hq: 4, hk: 4, s: 16, t: 16, d };
        let pick = |arch, dtype, d: usize| {
            let x = dense(dtype, d);
            tensor_core_dim(arch, &dm(d), &[&x, &x, &x], &[&x])
        };
        assert_eq!(pick(90, DType::BF16, 64), Some(64));
        assert_eq!(pick(80, DType::F16, 128), Some(128));
        assert_eq!(pick(80, DType::F16, 40), Some(64));
        assert_eq!(pick(80, DType::F16, 72), Some(128));
        assert_eq!(pick(75, DType::F16, 64), None);
        assert_eq!(pick(90, DType::F32, 64), None);
        assert_eq!(pick(90, DType::BF16, 60), None);
        assert_eq!(pick(90, DType::BF16, 256), None);
        // A strided head dim, or rows that are not 16-byte aligned, take the general kernel.
        let mut x = dense(DType::BF16, 64);
        x.strides[3] = 2;
        assert_eq!(tensor_core_dim(90, &dm(64), &[&x, &x, &x], &[&x]), None);
        let mut x = dense(DType::BF16, 64);
        x.ptr += 2;
        assert_eq!(tensor_core_dim(90, &dm(64), &[&x, &x, &x], &[&dense(DType::BF16, 64)]), None);
    }

    #[test]
    fn the_tensor_core_backward_takes_aligned_gradients_and_32_bit_rows() {
        let x = Operand { ptr: 1 << 20, dtype: DType::F16, shape: vec![1, 2, 8, 64], strides: vec![1024, 512, 64, 1] };
        let dm = Dims { b: 1, hq: 2, hk: 2, s: 8, t: 8, d: 64 };
        assert_eq!(tensor_core_dim(90, &dm, &[&x, &x, &x, &x], &[&x, &x, &x]), Some(64));
        // A gradient at a 2-byte offset cannot take 4-byte pair stores.
        let mut odd = x.clone();
        odd.ptr += 2;
        assert_eq!(tensor_core_dim(90, &dm, &[&x, &x, &x, &x], &[&x, &odd, &x]), None);
        // A gradient in another dtype.
        let mut other = x.clone();
        other.dtype = DType::BF16;
        assert_eq!(tensor_core_dim(90, &dm, &[&x, &x, &x, &x], &[&x, &x, &other]), None);
        let long = Dims { t: 1 << 30, ..dm };
        assert_eq!(tensor_core_dim(90, &long, &[&x, &x, &x, &x], &[&x, &x, &x]), None);
    }

    #[test]
    fn the_tensor_core_kernels_fit_in_shared_memory() {
        // Within sm_80's opt-in limit (163 KiB); sm_86/sm_89 (99 KiB) take the general
        // backward at d > 64 (see `run`), the forward fits there at every head dim.
        for dpad in [64, 128] {
            for smem in [tc_smem(dpad), tc_dkv_smem(dpad), tc_dq_smem(dpad)] {
                assert!(smem <= 163 * 1024, "{dpad}: {smem}");
            }
            assert!(tc_smem(dpad) <= 99 * 1024, "{dpad}: {}", tc_smem(dpad));
        }
        assert_eq!(tc_smem(64), 3 * 2 * 64 * 72 * 2);
        assert_eq!(tc_dq_smem(64), (128 + 3 * 128) * 72 * 2);
        assert_eq!(tc_dkv_smem(64), (128 + 256) * 72 * 2 + 64 * 16);
        assert_eq!(tc_dq_smem(128), 384 * 136 * 2);
        // The Hopper forward: two blocks per SM within sm_90's 228 KiB (1 KiB of it reserved
        // per block).
        assert_eq!(wg_smem(), 97 * 1024);
        assert!(2 * (wg_smem() + 1024) <= 228 * 1024);
        // The Hopper backward passes: three blocks per SM each.
        assert_eq!(wg_dq_smem(), 1024 + 16 * 1024 + 48 * 1024 + 512);
        assert_eq!(wg_dkv_smem(), 1024 + 16 * 1024 + 3 * (16 * 1024 + 512));
        for smem in [wg_dq_smem(), wg_dkv_smem()] {
            assert!(3 * (smem + 1024) <= 228 * 1024, "{smem}");
        }
    }

    #[test]
    fn grouped_query_heads_are_shared_out_until_the_gpu_has_two_waves() {
        // Qwen2.5-0.5B at batch 8 × 1024: 2 kv heads, 16 key tiles, groups of 7 query heads.
        assert_eq!(head_split(8 * 2 * 16, 7, 132), 4);
        assert_eq!(head_split(8 * 2 * 16, 7, 20), 1);
        assert_eq!(head_split(8 * 2 * 16, 7, 60), 2);
        assert_eq!(head_split(8 * 2 * 16, 7, 100), 3);
        // Five parts would be wanted, but parts of ceil(7 / 5) = 2 heads make four.
        assert_eq!(head_split(8 * 2 * 16, 7, 200), 4);
        // Enough blocks already, or no group to share out.
        assert_eq!(head_split(2048, 4, 132), 1);
        assert_eq!(head_split(16, 1, 132), 1);
    }

    #[test]
    fn only_hopper_takes_the_wgmma_kernels() {
        assert!(hopper_wgmma(90, true, 64));
        assert!(!hopper_wgmma(90, false, 64));
        assert!(!hopper_wgmma(90, true, 128));
        assert!(!hopper_wgmma(80, false, 64));
        assert!(!hopper_wgmma(89, false, 64));
        assert!(!hopper_wgmma(100, false, 64));
    }
}
