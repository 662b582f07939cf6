//! Reductions (`kernels/reduce.cu`): sum, mean, prod, max, min over any set of axes and
//! argmax/argmin over one, with the CPU backend's dtype rules and empty-input behaviour.

use super::arity;
use crate::device::CudaDevice;
use crate::kernels::{merge_dims, Args};
use genesis_backend_api::{sdk, BackendError, DType, Op, OpKind, ReduceOp, Result, TensorDesc};

fn supported(op: ReduceOp, dtype: DType) -> bool {
    match op {
        // Bool sums and products are the core's business (it casts to an integer first).
        ReduceOp::Sum | ReduceOp::Prod => dtype != DType::Bool,
        ReduceOp::Mean => dtype.is_float(),
        ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin => true,
    }
}

/// What this family runs.
pub fn claims() -> Vec<(OpKind, DType)> {
    let mut claims = Vec::new();
    for dtype in DType::ALL {
        for &r in ReduceOp::ALL {
            if supported(r, dtype) {
                claims.push((OpKind::reduce(r), dtype));
            }
        }
    }
    claims
}

/// Run one reduction.
pub fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let Op::Reduce(r) = *op else {
        return Err(BackendError::unsupported(format!("cuda: {} is not a reduction", op.name())));
    };
    arity(op, 1, 1, inputs, outputs)?;
    let (x, y) = (device.operand(&inputs[0])?, device.operand(&outputs[0])?);
    let is_arg = matches!(r, ReduceOp::ArgMax | ReduceOp::ArgMin);
    let out_dtype = if is_arg { DType::I64 } else { x.dtype };
    if y.dtype != out_dtype {
        return Err(BackendError::dtype(format!(
            "{}: a {} input needs a {out_dtype} output, got {}",
            op.name(),
            x.dtype,
            y.dtype
        )));
    }
    let reduced = sdk::reduced_axes(op, &inputs[0], &outputs[0])?;
    let axes: Vec<usize> = (0..reduced.len()).filter(|&d| reduced[d]).collect();
    let n_red: usize = axes.iter().map(|&d| x.shape[d]).product();
    if is_arg && axes.len() > 1 {
        return Err(BackendError::invalid(format!(
            "{}: reduces exactly one axis, but input {:?} -> output {:?} reduces axes {axes:?}",
            op.name(),
            x.shape,
            y.shape
        )));
    }
    if n_red == 0 && !matches!(r, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod) {
        return Err(BackendError::invalid(format!(
            "{}: cannot reduce an empty axis (input {:?}, output {:?}): the op has no identity",
            op.name(),
            x.shape,
            y.shape
        )));
    }
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
    for (d, &n) in ks.iter().enumerate() {
        args.shape[d] = n as i64;
        args.st[0][d] = kst[0][d] as i64;
        args.st[1][d] = kst[1][d] as i64;
    }
    for (d, &n) in rs.iter().enumerate() {
        args.shape[ks.len() + d] = n as i64;
        args.st[2][d] = rst[0][d] as i64;
    }
    // One block per output: as many threads as the reduction can use, a power of two.
    let threads = (n_red as u32).next_power_of_two().clamp(32, 256);
    device.launch_blocks(&op.name(), x.dtype, &format!("reduce_{}", r.name()), &mut args, threads)
}
