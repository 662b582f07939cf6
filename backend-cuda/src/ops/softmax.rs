//! Softmax and log-softmax over the last dim, forward and backward (`kernels/softmax.cu`),
//! for the float dtypes, with the CPU backend's checks.
//!
//! Rows that fit in registers (up to 32768 elements of f32, or f64; 16384 of f16/bf16, and
//! in the backward half that, or all of it when the rows are kept as loaded packs) are read once and written once; longer rows take the looping
//! kernels, which read the input again per pass. Any strides: the column stride is a kernel
//! argument and the rows only need to be evenly spaced (`with_rows` copies the rare layouts
//! where they are not).

use super::resolve;
use super::rows::{rows_of, with_rows, RowView};
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::Args;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

kernel_module! {
    /// Softmax, log-softmax, their backward ops and cross-entropy, with the deferred index check
    /// for targets.
    MODULE = "softmax", for &DType::FLOATS,
    from "index_check.cu", "rows.cuh", "softmax.cu", "cross_entropy.cu"
}
inventory::submit! { Family { claims, run } }

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::Softmax, Op::LogSoftmax, Op::SoftmaxBackward, Op::LogSoftmaxBackward])
}

/// Columns per 16-byte pack of `dtype`.
pub(super) fn pack_width(dtype: DType) -> usize {
    16 / dtype.size_in_bytes()
}

/// Threads per row and packs per thread of the register kernels for rows of `d` columns, or
/// the threads per row of the looping kernel (`None` packs). `arrays` is how many rows a
/// thread keeps (1 forward, 2 backward): at most 32 registers of data per thread, so that the
/// kernels fit 1024-thread blocks without spilling. `raw`: the rows are kept as loaded
/// (the backward's vector path), so an f16/bf16 value takes half a register.
fn plan(dtype: DType, d: usize, arrays: usize, raw: bool) -> (u32, Option<u32>) {
    let vw = pack_width(dtype);
    let packs = d.div_ceil(vw);
    // Registers of data per pack and array, times 2 (half registers for raw 2-byte values).
    let half_words = match dtype {
        DType::F64 => 4,
        DType::F16 | DType::BF16 if raw => 1,
        _ => 2,
    };
    let max_p = [8usize, 4, 2, 1]
        .into_iter()
        .find(|&p| p * vw * half_words * arrays <= 64 && (arrays == 1 || p <= 4))
        .unwrap_or(1);
    let threads = |p: usize| packs.div_ceil(p).next_power_of_two().max(32);
    // Prefer blocks of at most 256 threads per row (several blocks per SM hide latency),
    // then up to 1024 with the most packs per thread.
    for p in [1usize, 2, 4, 8].into_iter().filter(|&p| p <= max_p) {
        if threads(p) <= 256 {
            return (threads(p) as u32, Some(p as u32));
        }
    }
    // Wider blocks run the 1024-thread kernels (64 registers), where 4 raw 2-byte packs
    // still spill: at most 2 there.
    let wide_p = if raw { max_p.min(2) } else { max_p };
    if threads(wide_p) <= 1024 {
        return (threads(wide_p) as u32, Some(wide_p as u32));
    }
    (1024, None)
}

/// Launch the row kernel `base` ("softmax_fwd" / "softmax_bwd") over `views`.
fn launch(
    device: &CudaDevice,
    op: &Op,
    dtype: DType,
    base: &str,
    rows: usize,
    d: usize,
    views: &[RowView],
) -> Result<()> {
    let log = matches!(op, Op::LogSoftmax | Op::LogSoftmaxBackward);
    let backward = base == "softmax_bwd";
    let arrays = if backward { 2 } else { 1 };
    let vec = RowView::vectorizable(views, rows);
    let raw = backward && vec && dtype.size_in_bytes() == 2;
    let (tx, p) = plan(dtype, d, arrays, raw);
    let mut args = Args { n: rows as u64, flag: if vec { 2 } else { 0 }, ..Args::default() };
    args.u[0] = d as u64;
    for (k, v) in views.iter().enumerate() {
        args.p[k] = v.ptr;
        args.st[k][0] = v.row;
        args.st[k][1] = v.col;
    }
    // The forward's blocks of at most 256 threads get kernels bounded for 256 threads and 3
    // blocks per SM (85 registers): the 1024-thread bound caps them at 64, where the f32 reg8
    // kernel (8192 columns) spills. The contiguous f16/bf16 softmax (not log-softmax) is
    // bounded for 4 blocks (64 registers, enough for its 4 packs; kernels/softmax.cu).
    // The backward of f16/bf16 rows kept as loaded packs likewise: 4 packs at 256 threads
    // measured faster than 2 at 512 (RESULTS.md, "Kernel design notes").
    let t256 = (base == "softmax_fwd" || raw) && tx <= 256;
    let kind = p.map_or("loop".to_string(), |p| if t256 { format!("reg{p}_t256") } else { format!("reg{p}") });
    let name = format!("{base}_{kind}_v{}_l{}", vec as u8, log as u8);
    // Short rows: several rows (a warp each, or more) per 256-thread block.
    let ty = (256 / tx).max(1);
    let blocks = rows.div_ceil(ty as usize).min(i32::MAX as usize) as u32;
    device.launch_with(op.name(), &MODULE, dtype, &name, &mut args, ((blocks, 1), (tx, ty), 0), false)
}

/// Run one op of this family.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    match op {
        Op::Softmax | Op::LogSoftmax => {
            let (ins, outs) = resolve(device, inputs, outputs)?;
            let ([x], [y]) = checks::softmax(op, &ins, &outs)?;
            let (lead, d) = rows_of(&x.shape);
            let rows: usize = lead.iter().product();
            if rows == 0 || d == 0 {
                return Ok(());
            }
            with_rows(device, op, lead, &[(x, true, false), (y, true, true)], |views| {
                launch(device, op, x.dtype, "softmax_fwd", rows, d, views)
            })
        }
        Op::SoftmaxBackward | Op::LogSoftmaxBackward => {
            let (ins, outs) = resolve(device, inputs, outputs)?;
            let ([y, dy], [dx]) = checks::softmax_backward(op, &ins, &outs)?;
            let (lead, d) = rows_of(&y.shape);
            let rows: usize = lead.iter().product();
            if rows == 0 || d == 0 {
                return Ok(());
            }
            with_rows(device, op, lead, &[(y, true, false), (dy, true, false), (dx, true, true)], |views| {
                launch(device, op, y.dtype, "softmax_bwd", rows, d, views)
            })
        }
        _ => Err(BackendError::unsupported(format!("cuda: {} is not a softmax op", op.name()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_that_fit_stay_in_registers() {
        // 8192 f32: 2048 packs of 4, 8 per thread over 256 threads.
        assert_eq!(plan(DType::F32, 8192, 1, false), (256, Some(8)));
        assert_eq!(plan(DType::BF16, 8192, 1, false), (256, Some(4)));
        // Backward holds two rows: fewer packs per thread, more threads.
        assert_eq!(plan(DType::F32, 8192, 2, false), (512, Some(4)));
        assert_eq!(plan(DType::BF16, 8192, 2, false), (512, Some(2)));
        // Unless they are kept as loaded 2-byte packs.
        assert_eq!(plan(DType::BF16, 8192, 2, true), (256, Some(4)));
        assert_eq!(plan(DType::BF16, 16384, 2, true), (1024, Some(2)));
        // Short rows: a warp per row, one pack per thread.
        assert_eq!(plan(DType::F32, 7, 1, false), (32, Some(1)));
        assert_eq!(plan(DType::F64, 130, 1, false), (128, Some(1)));
        // The register limit, then the looping kernel.
        assert_eq!(plan(DType::F32, 32768, 1, false), (1024, Some(8)));
        assert_eq!(plan(DType::F32, 32769, 1, false), (1024, None));
    }
}
