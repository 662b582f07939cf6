//! Rotary position embedding, forward and inverse (`kernels/rotary.cu`), with the SDK's
//! checks: x `(b, h, s, d)` with `d` even, cos and sin `(s, d/2)`, all of x's dtype.
//!
//! Strided operands are handled in the kernel (per-operand strides over the merged
//! `(b, h, s, d/2)` pair space), so no copies are made; dense, aligned operands take a
//! vectorized kernel.

use super::resolve;
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::{merge_dims, Args, Operand};
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

kernel_module! {
    /// Rotary position embedding.
    MODULE = "rotary", for &DType::FLOATS,
    from "rotary.cu"
}
inventory::submit! { Family { claims, run } }

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::Rotary { inverse: false }])
}

fn is_dense(o: &Operand) -> bool {
    genesis_backend_api::is_contiguous(&o.shape, &o.strides)
}

/// Run the rotation.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let Op::Rotary { inverse } = *op else {
        return Err(BackendError::unsupported(format!("cuda: {} is not rotary", op.name())));
    };
    let (ins, outs) = resolve(device, inputs, outputs)?;
    let ([b, h, s, d], [x, cos, sin], [y]) = checks::rotary(op, &ins, &outs)?;
    let half = d / 2;
    let n = b * h * s * half;
    if n == 0 {
        return Ok(());
    }
    let mut args = Args { p: [x.ptr, y.ptr, cos.ptr, sin.ptr], n: n as u64, flag: inverse as i32, ..Args::default() };
    let pack = 16 / x.dtype.size_in_bytes();
    let operands = [x, y, cos, sin];
    let (kernel, per_thread) = if operands.iter().all(|o| is_dense(o) && o.ptr % 16 == 0) && half % pack == 0 {
        args.u = [half as u64, s as u64];
        ("rotary_c", pack as u64)
    } else {
        // The pair space (b, h, s, d/2): cos and sin broadcast over b and h. The second half
        // of a row is d/2 steps along the last dim.
        let pair_shape = [b, h, s, half];
        let (xs, ys, cs, ss) = (&x.strides, &y.strides, &cos.strides, &sin.strides);
        let lists = [xs.to_vec(), ys.to_vec(), vec![0, 0, cs[0], cs[1]], vec![0, 0, ss[0], ss[1]]];
        let refs: Vec<&[isize]> = lists.iter().map(|l| l.as_slice()).collect();
        let (merged, merged_st) = merge_dims(&pair_shape, &refs);
        args.ndim = merged.len() as i32;
        for (dd, &m) in merged.iter().enumerate() {
            args.shape[dd] = m as i64;
            for (j, st) in merged_st.iter().enumerate() {
                args.st[j][dd] = st[dd] as i64;
            }
        }
        args.u = [(half as isize * xs[3]) as u64, (half as isize * ys[3]) as u64];
        ("rotary_s", 1)
    };
    let threads = 256u64;
    let wanted = (n as u64).div_ceil(threads * per_thread);
    let grid = wanted.min(device.facts.sm_count as u64 * 32).max(1) as u32;
    // Every operand was validated against its buffer with the shapes and strides in `args`.
    device.launch_grid("rotary", &MODULE, x.dtype, kernel, &mut args, (grid, 1), (threads as u32, 1), 0)
}
