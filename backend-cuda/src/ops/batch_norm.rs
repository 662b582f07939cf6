//! Batch normalization with the batch's statistics, forward and backward
//! (`kernels/batch_norm.cu`), with the SDK's checks.
//!
//! The kernels read dense `(n, c, s)` tensors and dense per-channel vectors; other layouts are
//! copied to dense scratch first (inputs) or written through it (outputs). Each pass over the
//! data splits every channel's `n` rows over several blocks so that a layer with few channels
//! still fills the GPU; a small kernel then adds each channel's partial sums in order.

use super::launch::{self, compute_dtype, with_scratch};
use super::{resolve, Family};
use crate::device::CudaDevice;
use crate::kernels::Operand;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

kernel_module! {
    /// Batch normalization, forward and backward.
    MODULE = "batch_norm", for &DType::FLOATS,
    from "batch_norm.cu"
}
inventory::submit! { Family { claims, run } }

/// Mirror of `struct BnArgs` in batch_norm.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct BnArgs {
    p: [u64; 9],
    n: u64,
    c: u64,
    s: u64,
    rows: u64,
    splits: u64,
    eps: f64,
    packed: i32,
}

/// Threads per block of the statistics passes.
const THREADS: u32 = 256;

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::BatchNorm { eps: 0.0 }, Op::BatchNormBackward])
}

/// `(rows per split, splits)`: about four blocks per SM over all channels, each block at
/// least 4096 values, and fewer than 2³¹ values per block (the kernels count in 32 bits).
fn splits(device: &CudaDevice, [n, c, s]: [usize; 3]) -> (usize, usize) {
    let n1 = n.max(1);
    let target = (4 * device.facts.sm_count as usize).div_ceil(c.max(1));
    let splits = target.min((n * s / 4096).max(1)).clamp(1, n1);
    let max_rows = ((1usize << 31) / s.max(1)).max(1);
    let rows = n1.div_ceil(splits.max(n1.div_ceil(max_rows)).min(n1));
    (rows, n1.div_ceil(rows))
}

fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (ins, outs) = resolve(device, inputs, outputs)?;
    let (ins, outs, eps) = match *op {
        Op::BatchNorm { eps } => {
            let (ins, outs) = checks::batch_norm(op, eps, &ins, &outs)?;
            (ins.to_vec(), outs.to_vec(), eps)
        }
        Op::BatchNormBackward => {
            let (ins, outs) = checks::batch_norm_backward(op, &ins, &outs)?;
            (ins.to_vec(), outs.to_vec(), 0.0)
        }
        _ => return Err(BackendError::unsupported(format!("cuda: {} is not batch_norm", op.name()))),
    };
    let x = if matches!(op, Op::BatchNorm { .. }) { &ins[0] } else { &ins[1] };
    let (shape, dtype) = ([x.shape[0], x.shape[1], x.shape[2]], x.dtype);
    with_scratch(device, |scratch| {
        let dense_ins = ins.iter().map(|t| scratch.contiguous(device, op, t)).collect::<Result<Vec<_>>>()?;
        let dense_outs = outs.iter().map(|t| scratch.dense_output(device, t)).collect::<Result<Vec<_>>>()?;
        let (rows, splits) = splits(device, shape);
        let partial = scratch.dense(device, compute_dtype(dtype), &[shape[1] * splits * 2])?;
        let stats = scratch.dense(device, compute_dtype(dtype), &[shape[1] * 2])?;
        let [n, c, s] = shape;
        let pack = 16 / dtype.size_in_bytes();
        let mut args = BnArgs {
            n: n as u64,
            c: c as u64,
            s: s as u64,
            rows: rows as u64,
            splits: splits as u64,
            eps,
            ..BnArgs::default()
        };
        let operands: Vec<&Operand> = dense_ins.iter().chain(&dense_outs).collect();
        let aligned = operands.iter().filter(|o| o.dtype == dtype).all(|o| o.ptr % 16 == 0);
        args.packed = (s % pack == 0 && aligned) as i32;
        let stats_grid = (splits as u32, c as u32);
        let per_channel = (c as u32).div_ceil(128);
        let total = (n * c * s) as u64;
        let apply_blocks =
            launch::grid(device, (total / if args.packed != 0 { pack as u64 } else { 1 }).div_ceil(256), 8);
        let name = op.name();
        let m = &MODULE;
        for (slot, o) in args.p.iter_mut().zip(&operands) {
            *slot = o.ptr;
        }
        // Both directions run the same three passes: per-split sums, a per-channel finalize,
        // then the elementwise pass.
        let [sums, finalize, elementwise] = if matches!(op, Op::BatchNorm { .. }) {
            // p: x, w, b, y, mean, rstd, partial, stats (mean and rstd in the compute type)
            args.p[6] = partial.ptr;
            args.p[7] = stats.ptr;
            ["bn_stats", "bn_finalize", "bn_apply"]
        } else {
            // p: dy, x, w, mean, rstd, dx, dw, db, partial
            args.p[8] = partial.ptr;
            ["bn_bwd_stats", "bn_bwd_finalize", "bn_dx"]
        };
        if n * s > 0 {
            device.launch_with(name, m, dtype, sums, &mut args, (stats_grid, (THREADS, 1), 0), false)?;
        } else {
            args.splits = 0;
        }
        launch::launch_1d(device, name, m, dtype, finalize, &mut args, (per_channel, 128, 0))?;
        launch::launch_1d(device, name, m, dtype, elementwise, &mut args, (apply_blocks.max(1), 256, 0))?;
        launch::copy_back(device, op, &outs, &dense_outs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_block_has_the_c_layout() {
        use crate::kernels::layout::assert_c_layout;
        assert_c_layout!(BnArgs { p, n, c, s, rows, splits, eps, packed }, MODULE.source(), "BnArgs");
    }
}
