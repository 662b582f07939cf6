//! Philox fills and dropout (`kernels/random.cu`), bit-compatible with the CPU backend.

use super::arity;
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::{set_geometry, Args};
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

inventory::submit! { Family { claims, run } }

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    let ops = [
        Op::RandUniform { seed: 0, offset: 0, low: 0.0, high: 1.0 },
        Op::RandNormal { seed: 0, offset: 0, mean: 0.0, std: 1.0 },
        Op::Dropout { seed: 0, offset: 0, p: 0.5 },
    ];
    domain::claims(&ops)
}

/// Run one op of this family.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let mut args = Args::default();
    match *op {
        Op::RandUniform { seed, offset, low: a, high: b } | Op::RandNormal { seed, offset, mean: a, std: b } => {
            arity(op, 0, 1, inputs, outputs)?;
            let y = device.operand(&outputs[0])?;
            args.s[0] = a;
            args.s[1] = b;
            args.u = [seed, offset];
            set_geometry(&mut args, &[&y]);
            let kernel = if matches!(op, Op::RandUniform { .. }) { "rand_uniform_s" } else { "rand_normal_s" };
            device.launch(op.name(), y.dtype, kernel, &mut args, 1)
        }
        Op::Dropout { seed, offset, p } => {
            arity(op, 1, 1, inputs, outputs)?;
            if !(0.0..1.0).contains(&p) {
                return Err(BackendError::invalid(format!("dropout: p must be in [0, 1), got {p}")));
            }
            let (x, y) = (device.operand(&inputs[0])?, device.operand(&outputs[0])?);
            if x.dtype != y.dtype {
                return Err(BackendError::dtype(format!("dropout: input {} and output {} differ", x.dtype, y.dtype)));
            }
            if x.shape != y.shape {
                return Err(BackendError::shape(format!("dropout: shapes {:?} and {:?} differ", x.shape, y.shape)));
            }
            args.s[0] = p;
            args.u = [seed, offset];
            set_geometry(&mut args, &[&x, &y]);
            device.launch("dropout", y.dtype, "dropout_s", &mut args, 1)
        }
        _ => Err(BackendError::unsupported(format!("cuda: {} is not a random op", op.name()))),
    }
}
