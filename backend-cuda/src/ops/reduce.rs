//! Reductions (`kernels/reduce.cu`): sum, mean, prod, max, min over any set of axes and
//! argmax/argmin over one, with the CPU backend's dtype rules and empty-input behaviour.

use super::arity;
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::{merge_dims, Args};
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, ReduceOp, Result, TensorDesc};

inventory::submit! { Family { claims, run } }

/// What this family runs: every reduction, on its whole domain, and the multi-tensor sum of
/// squares.
fn claims() -> Vec<(OpKind, DType)> {
    let mut kinds: Vec<OpKind> = ReduceOp::ALL.iter().map(|&r| OpKind::reduce(r)).collect();
    kinds.push(Op::ForeachSumSquares.kind());
    domain::kind_claims(&kinds)
}

/// Run one reduction.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    if *op == Op::ForeachSumSquares {
        return foreach_sum_squares(device, op, inputs, outputs);
    }
    let Op::Reduce(r) = *op else {
        return Err(BackendError::unsupported(format!("cuda: {} is not a reduction", op.name())));
    };
    arity(op, 1, 1, inputs, outputs)?;
    let (x, y) = (device.operand(&inputs[0])?, device.operand(&outputs[0])?);
    let reduced = checks::reduce(op, r, &x, &y)?;
    let n_red: usize = (0..reduced.len()).filter(|&d| reduced[d]).map(|d| x.shape[d]).product();
    // Split the dims into kept (with input and output strides) and reduced, then merge each.
    let (mut ks, mut kx, mut ky, mut rs, mut rx) = (vec![], vec![], vec![], vec![], vec![]);
    for (d, &is_reduced) in reduced.iter().enumerate() {
        if is_reduced {
            rs.push(x.shape[d]);
            rx.push(x.strides[d]);
        } else {
            ks.push(x.shape[d]);
            kx.push(x.strides[d]);
            ky.push(y.strides[d]);
        }
    }
    let (ks, kst) = merge_dims(&ks, &[&kx, &ky]);
    let (rs, rst) = merge_dims(&rs, &[&rx]);
    let mut args = Args {
        p: [x.ptr, y.ptr, 0, 0],
        n: y.numel() as u64,
        u: [n_red as u64, 0],
        ndim: ks.len() as i32,
        flag: rs.len() as i32,
        ..Args::default()
    };
    if args.n == 0 {
        return Ok(());
    }
    for (d, &n) in ks.iter().enumerate() {
        args.shape[d] = n as i64;
        args.st[0][d] = kst[0][d] as i64;
        args.st[1][d] = kst[1][d] as i64;
    }
    for (d, &n) in rs.iter().enumerate() {
        args.shape[ks.len() + d] = n as i64;
        args.st[2][d] = rst[0][d] as i64;
    }
    // One reduced axis (after merging) and no empty one: the row or column kernels when the
    // layout fits them.
    if rs.len() == 1 && n_red > 0 {
        if rst[0][0] == 1 {
            return rows(device, op, r, x.dtype, args);
        }
        if kst[0].last() == Some(&1) {
            let pack = 16 / x.dtype.size_in_bytes() as i64;
            let packs = x.ptr % 16 == 0
                && args.shape[ks.len() - 1] % pack == 0
                && rst[0][0] as i64 % pack == 0
                && kst[0][..ks.len() - 1].iter().all(|&s| s as i64 % pack == 0);
            return cols(device, op, r, x.dtype, args, packs);
        }
    }
    // One block per output: as many threads as the reduction can use, a power of two.
    let threads = (n_red as u32).next_power_of_two().clamp(32, 256);
    device.launch_blocks(op.name(), x.dtype, &format!("reduce_{}", r.name()), &mut args, threads)
}

/// Threads per block of the row and column kernels, and the shared memory they get (the
/// widest partial state is 16 bytes).
const THREADS: u32 = 256;
const SMEM: u32 = THREADS * 16;

/// Rows (`args.u[0]` contiguous elements each, `args.n` of them): a warp per row when there
/// are enough rows to fill the device with warps, else a block per row, and when even blocks
/// are too few each row is cut into parts finished by a second pass.
fn rows(device: &CudaDevice, op: &Op, r: ReduceOp, dtype: DType, mut args: Args) -> Result<()> {
    let sms = device.facts.sm_count as u64;
    let (n_rows, len) = (args.n, args.u[0]);
    // Elements a block should have at least per part: four 16-byte packs per thread.
    let min_part = THREADS as u64 * 4 * (16 / dtype.size_in_bytes() as u64);
    let (block, parts) = if n_rows >= sms * 16 {
        (false, 1)
    } else if n_rows >= sms * 2 || len <= min_part {
        (true, 1)
    } else {
        (true, (sms * 4).div_ceil(n_rows).min(len.div_ceil(min_part)).max(1))
    };
    args.u[1] = parts;
    args.flag = block as i32;
    let units = n_rows * parts;
    let blocks = if block { units } else { units.div_ceil(THREADS as u64 / 32) };
    let grid = (blocks.min(sms * 64) as u32, 1);
    launch_parts(device, op, r, dtype, args, parts, "rows", grid)
}

/// Columns: the last kept dim is contiguous in the input; threads lie side by side along it
/// and the reduced axis is split over blocks (grid y) when the columns alone would leave the
/// device idle.
fn cols(device: &CudaDevice, op: &Op, r: ReduceOp, dtype: DType, mut args: Args, packs: bool) -> Result<()> {
    let sms = device.facts.sm_count as u64;
    let inner = args.shape[args.ndim as usize - 1] as u64;
    let v = if packs { 16 / dtype.size_in_bytes() as u64 } else { 1 };
    let vecs = inner.div_ceil(v);
    let tx = vecs.next_power_of_two().min(32);
    let ty = THREADS as u64 / tx;
    let tiles = (args.n / inner) * vecs.div_ceil(tx);
    // About eight blocks per SM in all, each thread folding at least eight reduced positions.
    let n_red = args.u[0];
    let wanted = (sms * 8).div_ceil(tiles).min(n_red / (ty * 8)).max(1);
    let chunk = n_red.div_ceil(wanted);
    let parts = n_red.div_ceil(chunk);
    args.u[1] = parts;
    args.flag = (tx.trailing_zeros() << 8) as i32 | if packs { 2 } else { 0 };
    let grid = (tiles.min(sms * 64) as u32, parts as u32);
    launch_parts(device, op, r, dtype, args, parts, "cols", grid)
}

/// Entries per launch of the multi-tensor sum of squares (`FS_MAX` in reduce.cu: the table
/// fills most of the 4 KiB of kernel parameters).
const FS_MAX: usize = 120;

/// Elements per chunk of the multi-tensor sum of squares (`FS_CHUNK`); a block folds one.
const FS_CHUNK: u64 = 65536;

/// Mirror of `struct FsEntry` in reduce.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FsEntry {
    x: u64,
    n: u64,
    chunk0: u64,
    out: u64,
}

/// Mirror of `struct FsArgs` in reduce.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct FsArgs {
    y: u64,
    ystride: i64,
    part: u64,
    count: u64,
    chunks: u64,
    e: [FsEntry; FS_MAX],
}

/// `ForeachSumSquares`: dense inputs in tables of [`FS_MAX`] (two launches each: the chunks'
/// partial sums, then each entry's in chunk order); an input with any other layout is one
/// `Reduce(SumSquares)` of its own into its entry of `y`.
fn foreach_sum_squares(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (ins, outs) = super::resolve(device, inputs, outputs)?;
    let (xs, y) = checks::foreach_sum_squares(op, &ins, &outs)?;
    let esize = y.dtype.size_in_bytes();
    let mut dense = Vec::new();
    for (i, x) in xs.iter().enumerate() {
        if super::launch::is_dense(x) {
            dense.push(FsEntry { x: x.ptr, n: x.numel() as u64, chunk0: 0, out: i as u64 });
            continue;
        }
        let rank = x.shape.len();
        let offset = outputs[0].offset_bytes as usize + i * y.strides[0] as usize * esize;
        let entry = TensorDesc::new(outputs[0].buffer, offset, y.dtype, &vec![1; rank], &vec![0; rank])?;
        run(device, &Op::Reduce(ReduceOp::SumSquares), &inputs[i..i + 1], &[entry])?;
    }
    // Partial states: f64 for f32 and f64 inputs, f32 for f16/bf16 (`Acc` in reduce.cu).
    let acc = if matches!(y.dtype, DType::F16 | DType::BF16) { 4 } else { 8 };
    let sms = device.facts.sm_count as u64;
    for batch in dense.chunks(FS_MAX) {
        let mut a = FsArgs {
            y: y.ptr,
            ystride: y.strides[0] as i64,
            part: 0,
            count: batch.len() as u64,
            chunks: 0,
            e: [FsEntry::default(); FS_MAX],
        };
        for (slot, e) in a.e.iter_mut().zip(batch) {
            *slot = FsEntry { chunk0: a.chunks, ..*e };
            a.chunks += e.n.div_ceil(FS_CHUNK);
        }
        let scratch = if a.chunks > 0 { Some(device.scratch(a.chunks as usize * acc)?) } else { None };
        let name = op.name();
        let launched = (|| {
            if let Some((_, ptr)) = scratch {
                a.part = ptr;
                let grid = a.chunks.min(sms * 8) as u32;
                // Each entry's dense `n` elements were validated against its buffer.
                let shape = ((grid, 1), (THREADS, 1), SMEM);
                device.launch_with(
                    name,
                    &super::ELEMENTWISE,
                    y.dtype,
                    "foreach_sum_squares_part",
                    &mut a,
                    shape,
                    false,
                )?;
            }
            // A warp per entry (empty entries get 0).
            let blocks = (a.count * 32).div_ceil(THREADS as u64) as u32;
            let shape = ((blocks, 1), (THREADS, 1), 0);
            device.launch_with(name, &super::ELEMENTWISE, y.dtype, "foreach_sum_squares_finish", &mut a, shape, false)
        })();
        // Stream order keeps the scratch alive for the queued kernels.
        let freed = scratch.map_or(Ok(()), |(id, _)| device.free_scratch(id));
        launched.and(freed)?;
    }
    Ok(())
}

/// Launch `reduce_{kind}_{r}` on `grid` (blocks of `THREADS`), with a scratch array for
/// `parts` partial states per output when `parts > 1`, then fold them into the output.
#[allow(clippy::too_many_arguments)]
fn launch_parts(
    device: &CudaDevice,
    op: &Op,
    r: ReduceOp,
    dtype: DType,
    mut args: Args,
    parts: u64,
    kind: &str,
    grid: (u32, u32),
) -> Result<()> {
    let main = |a: &mut Args| {
        let kernel = format!("reduce_{kind}_{}", r.name());
        device.launch_with(op.name(), &super::ELEMENTWISE, dtype, &kernel, a, (grid, (THREADS, 1), SMEM), false)
    };
    if parts == 1 {
        return main(&mut args);
    }
    let (id, ptr) = device.scratch(args.n as usize * parts as usize * 16)?;
    args.p[2] = ptr;
    // The finish runs a warp per output.
    let warps = (args.n * 32).div_ceil(THREADS as u64).min(device.facts.sm_count as u64 * 32).max(1) as u32;
    let finish = format!("reduce_finish_{}", r.name());
    let done = main(&mut args).and_then(|_| {
        let shape = ((warps, 1), (THREADS, 1), 0);
        device.launch_with(op.name(), &super::ELEMENTWISE, dtype, &finish, &mut args, shape, false)
    });
    // Stream order keeps the scratch alive for the queued kernels.
    let freed = device.free_scratch(id);
    done.and(freed)
}

#[cfg(test)]
mod tests {
    use super::*;

    impl crate::kernels::layout::CField for FsEntry {
        fn scalar() -> (char, usize) {
            ('s', std::mem::size_of::<FsEntry>())
        }
    }

    #[test]
    fn the_argument_blocks_have_the_c_layout() {
        use crate::kernels::layout::assert_c_layout;
        let source = super::super::ELEMENTWISE.source();
        assert_c_layout!(FsEntry { x, n, chunk0, out }, source, "FsEntry");
        assert_c_layout!(FsArgs { y, ystride, part, count, chunks, e }, source, "FsArgs");
        // The table and the header fit the 4 KiB of kernel parameters.
        assert!(std::mem::size_of::<FsArgs>() <= 4096);
    }
}
