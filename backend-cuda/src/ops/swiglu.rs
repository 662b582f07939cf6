//! SwiGLU, forward and backward (`kernels/swiglu.cu`), with the SDK's checks: every operand
//! has gate's shape and dtype.
//!
//! The kernels take rows of contiguous elements with a row stride per operand, which covers
//! dense tensors and the gate and up halves of one stacked projection; any other layout is
//! copied to dense scratch buffers first (inputs) or written through one (outputs).

use super::launch::{self, with_scratch};
use super::{resolve, Family};
use crate::device::CudaDevice;
use crate::kernels::{merge_dims, Operand};
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

kernel_module! {
    /// SwiGLU, forward and backward.
    MODULE = "swiglu", for &DType::FLOATS,
    from "swiglu.cu"
}
inventory::submit! { Family { claims, run } }

/// Mirror of `struct SwiGluArgs` in swiglu.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct SwiGluArgs {
    p: [u64; 5],
    n: u64,
    d: u64,
    rs: [i64; 5],
    packed: i32,
}

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::SwiGlu, Op::SwiGluBackward])
}

/// The operands as rows: `(d, row strides)` when every operand is rows of `d` contiguous
/// elements over one merged row dim (a 1-D strided geometry is rows of one element).
fn rows(operands: &[&Operand]) -> Option<(usize, [i64; 5])> {
    let strides: Vec<&[isize]> = operands.iter().map(|o| o.strides.as_slice()).collect();
    let (shape, merged) = merge_dims(&operands[0].shape, &strides);
    let mut rs = [0i64; 5];
    match shape.len() {
        0 => Some((1, rs)),
        // Dense: one row.
        1 if merged.iter().all(|m| m[0] == 1) => Some((shape[0], rs)),
        1 => {
            for (r, m) in rs.iter_mut().zip(&merged) {
                *r = m[0] as i64;
            }
            Some((1, rs))
        }
        2 if merged.iter().all(|m| m[1] == 1) => {
            for (r, m) in rs.iter_mut().zip(&merged) {
                *r = m[0] as i64;
            }
            Some((shape[1], rs))
        }
        _ => None,
    }
}

fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (ins, outs) = resolve(device, inputs, outputs)?;
    let (ins, outs, kernel): (&[Operand], &[Operand], &str) = match op {
        Op::SwiGlu => {
            let (ins, outs) = checks::swiglu(op, &ins, &outs)?;
            (ins, outs, "swiglu_fwd")
        }
        Op::SwiGluBackward => {
            let (ins, outs) = checks::swiglu_backward(op, &ins, &outs)?;
            (ins, outs, "swiglu_bwd")
        }
        _ => return Err(BackendError::unsupported(format!("cuda: {} is not swiglu", op.name()))),
    };
    let (n, dtype) = (outs[0].numel(), outs[0].dtype);
    if n == 0 {
        return Ok(());
    }
    with_scratch(device, |scratch| {
        let all: Vec<&Operand> = ins.iter().chain(outs).collect();
        // Rows as they are, or dense copies when the layout is more irregular.
        let (dense_ins, dense_outs) = if rows(&all).is_some() {
            (ins.to_vec(), outs.to_vec())
        } else {
            let dense_ins = ins.iter().map(|x| scratch.contiguous(device, op, x)).collect::<Result<Vec<_>>>()?;
            let dense_outs = outs.iter().map(|y| scratch.dense_output(device, y)).collect::<Result<Vec<_>>>()?;
            (dense_ins, dense_outs)
        };
        let operands: Vec<&Operand> = dense_ins.iter().chain(&dense_outs).collect();
        let (d, rs) = rows(&operands).ok_or_else(|| BackendError::internal("swiglu: dense operands are not rows"))?;
        let mut args = SwiGluArgs { n: n as u64, d: d as u64, rs, ..SwiGluArgs::default() };
        for (slot, o) in args.p.iter_mut().zip(&operands) {
            *slot = o.ptr;
        }
        let pack = 16 / dtype.size_in_bytes();
        let packed = d % pack == 0 && operands.iter().zip(&rs).all(|(o, &r)| o.ptr % 16 == 0 && r % pack as i64 == 0);
        args.packed = packed as i32;
        let work = n.div_ceil(if packed { pack } else { 1 }) as u64;
        let blocks = launch::grid(device, work.div_ceil(256), 32).max(1);
        launch::launch_1d(device, op.name(), &MODULE, dtype, kernel, &mut args, (blocks, 256, 0))?;
        launch::copy_back(device, op, outs, &dense_outs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_block_has_the_c_layout() {
        use crate::kernels::layout::assert_c_layout;
        assert_c_layout!(SwiGluArgs { p, n, d, rs, packed }, MODULE.source(), "SwiGluArgs");
    }
}
