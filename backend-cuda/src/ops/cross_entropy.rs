//! Fused cross-entropy and its backward (`kernels/cross_entropy.cu`) for float logits
//! `(.., c)` with i64 targets of the leading shape; loss, lse and dloss are f32. The forward
//! reads the logits once (online max and sum per thread) and never stores the softmax; the
//! backward reads them once more and writes the gradient.
//!
//! Targets are checked on the device first: one outside `[0, c)` that is not `ignore_index`
//! makes the op write nothing and is reported as `InvalidArgument` at the next read or
//! synchronize (the deferred check the index ops share, `rows::check_indices`).

use super::resolve;
use super::rows::{check_indices, rows_of, with_rows, RowView};
use super::softmax::{self, pack_width};
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::Args;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

inventory::submit! { Family { claims, run } }

/// Packs a thread loads per step of the forward (CE_P in the kernel).
const CHUNK_PACKS: usize = 4;

/// Packs a thread loads per step of the backward (CE_B in the kernel).
const BACKWARD_PACKS: usize = 4;

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[
        Op::CrossEntropy { ignore_index: 0, label_smoothing: 0.0 },
        Op::CrossEntropyBackward { ignore_index: 0, label_smoothing: 0.0 },
    ])
}

fn set_views(args: &mut Args, views: &[RowView]) {
    for (k, v) in views.iter().take(4).enumerate() {
        args.p[k] = v.ptr;
        args.st[k][0] = v.row;
        args.st[k][1] = v.col;
    }
}

/// Run one op of this family.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    match *op {
        Op::CrossEntropy { ignore_index, label_smoothing } => {
            let (ins, outs) = resolve(device, inputs, outputs)?;
            let ([logits, target], [loss, lse]) = checks::cross_entropy(op, label_smoothing, &ins, &outs)?;
            let (lead, c) = rows_of(&logits.shape);
            let dtype = logits.dtype;
            check_indices(device, op, &softmax::MODULE, dtype, target, c, Some(ignore_index), "target")?;
            let rows: usize = lead.iter().product();
            if rows == 0 {
                return Ok(());
            }
            let operands = [(logits, true, false), (target, false, false), (loss, false, true), (lse, false, true)];
            with_rows(device, op, lead, &operands, |views| {
                let vec = RowView::vectorizable(views, rows);
                let mut args = Args { n: rows as u64, flag: if vec { 2 } else { 0 }, ..Args::default() };
                set_views(&mut args, views);
                args.u = [c as u64, ignore_index as u64];
                args.s[0] = label_smoothing;
                // Enough threads per row for CHUNK_PACKS packs each per step, 32 to 256.
                let tx = (c.div_ceil(pack_width(dtype) * CHUNK_PACKS).next_power_of_two()).clamp(32, 256) as u32;
                let ty = 256 / tx;
                let blocks = rows.div_ceil(ty as usize).min(i32::MAX as usize) as u32;
                let shape = ((blocks, 1), (tx, ty), 0);
                let name = format!("cross_entropy_fwd_v{}", vec as u8);
                device.launch_with(op.name(), &softmax::MODULE, dtype, &name, &mut args, shape, false)
            })
        }
        Op::CrossEntropyBackward { ignore_index, label_smoothing } => {
            let (ins, outs) = resolve(device, inputs, outputs)?;
            let ([logits, target, lse, dloss], [dlogits]) =
                checks::cross_entropy_backward(op, label_smoothing, &ins, &outs)?;
            let (lead, c) = rows_of(&logits.shape);
            let dtype = logits.dtype;
            check_indices(device, op, &softmax::MODULE, dtype, target, c, Some(ignore_index), "target")?;
            let rows: usize = lead.iter().product();
            if rows == 0 || c == 0 {
                return Ok(());
            }
            let operands = [
                (logits, true, false),
                (target, false, false),
                (lse, false, false),
                (dloss, false, false),
                (dlogits, true, true),
            ];
            with_rows(device, op, lead, &operands, |views| {
                let vec = RowView::vectorizable(views, rows);
                let mut args = Args { n: rows as u64, flag: if vec { 2 } else { 0 }, ..Args::default() };
                set_views(&mut args, views);
                // The fifth operand rides in slots the row kernels leave free (see the kernel).
                args.shape[0] = views[4].ptr as i64;
                args.st[0][2] = views[4].row;
                args.st[0][3] = views[4].col;
                args.u = [c as u64, ignore_index as u64];
                args.s[0] = label_smoothing;
                const THREADS: usize = 256;
                let chunks = c.div_ceil(pack_width(dtype) * THREADS * BACKWARD_PACKS).min(i32::MAX as usize) as u32;
                let shape = ((chunks, rows.min(65535) as u32), (THREADS as u32, 1), 0);
                let name = format!("cross_entropy_bwd_v{}", vec as u8);
                device.launch_with(op.name(), &softmax::MODULE, dtype, &name, &mut args, shape, false)
            })
        }
        _ => Err(BackendError::unsupported(format!("cuda: {} is not a cross-entropy op", op.name()))),
    }
}
