//! Op dispatch and the capability list. Each family file registers a [`Family`]: which
//! (op, dtype) pairs it runs (`claims`) and the function that runs them (`run`), next to the
//! kernel [`Module`](crate::kernels::Module)s it owns. The capability list is the union of the
//! claims, and an op outside them is refused with `Unsupported` before anything is launched.

/// Declare a kernel module (see [`crate::kernels::Module`]) and register it:
/// `kernel_module! { /// doc  MODULE = "norm", for &DType::FLOATS, from "norm.cu" }` (files in
/// `kernels/`, compiled in order after `common.cuh`).
macro_rules! kernel_module {
    ($(#[$doc:meta])* $item:ident = $name:literal, for $dtypes:expr, from $($file:literal),+ $(,)?) => {
        $(#[$doc])*
        pub const $item: crate::kernels::Module = crate::kernels::Module {
            name: $name,
            sources: &[$(include_str!(concat!("../kernels/", $file))),+],
            dtypes: $dtypes,
        };
        inventory::submit! { $item }
    };
}

mod adamw;
mod attention;
mod batch_norm;
mod conv;
mod cross_entropy;
mod elementwise;
mod index;
mod launch;
mod matmul;
mod norm;
mod pool;
mod random;
mod reduce;
mod rotary;
mod rows;
mod softmax;
mod swiglu;

use crate::device::CudaDevice;
use crate::kernels::Operand;
use genesis_backend_api::sdk::expect_no_overlap;
use genesis_backend_api::{BackendError, Capability, DType, Op, OpKind, Result, TensorDesc};
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

pub use elementwise::MODULE as ELEMENTWISE;

type Run = fn(&CudaDevice, &Op, &[TensorDesc], &[TensorDesc]) -> Result<()>;

/// A family of ops, registered by its file with `inventory::submit!`.
pub struct Family {
    /// The (op, dtype) pairs it runs.
    pub claims: fn() -> Vec<(OpKind, DType)>,
    /// Runs one of them (operands checked by the family).
    pub run: Run,
}

inventory::collect!(Family);

fn claimed() -> &'static HashSet<(OpKind, DType)> {
    static CLAIMED: OnceLock<HashSet<(OpKind, DType)>> = OnceLock::new();
    CLAIMED.get_or_init(|| inventory::iter::<Family>.into_iter().flat_map(|f| (f.claims)()).collect())
}

/// The family that runs each op kind, built once (dispatch is on every op's path).
fn runner(kind: OpKind) -> Option<Run> {
    static RUNNERS: OnceLock<HashMap<OpKind, Run>> = OnceLock::new();
    RUNNERS
        .get_or_init(|| {
            let families = inventory::iter::<Family>.into_iter();
            families.flat_map(|f| (f.claims)().into_iter().map(move |(k, _)| (k, f.run))).collect()
        })
        .get(&kind)
        .copied()
}

/// Every (op, dtype) pair this backend runs.
pub fn capabilities() -> Vec<Capability> {
    let mut caps: Vec<Capability> =
        claimed().iter().map(|&(op, dtype)| Capability { op, dtype: dtype as u32 }).collect();
    caps.sort();
    caps
}

/// Check and run one op.
pub fn execute(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    // The claim's dtype is that of the first input, or of the output for ops without inputs.
    let first = inputs.first().or(outputs.first());
    let dtype = first.map(|d| d.dtype()).transpose()?;
    let kind = op.kind();
    let (Some(dtype), Some(run)) = (dtype, runner(kind)) else {
        return Err(BackendError::unsupported(format!("cuda: {} is not implemented", op.name())));
    };
    if !claimed().contains(&(kind, dtype)) {
        return Err(BackendError::unsupported(format!("cuda: {} is not implemented for {dtype}", op.name())));
    }
    let elementwise = matches!(
        op,
        Op::Unary(_) | Op::Binary(_) | Op::BinaryScalar { .. } | Op::Clamp { .. } | Op::Where | Op::Copy | Op::Cast
    );
    // AdamW checks its (in-place, many-tensor) operands itself, in n log n.
    if !matches!(op, Op::AdamW { .. }) {
        expect_no_overlap(op, inputs, outputs, elementwise)?;
    }
    run(device, op, inputs, outputs)
}

/// Every operand of a call, resolved against its buffer (for the SDK's family checks, which
/// count the operands themselves).
pub fn resolve(
    device: &CudaDevice,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<(Vec<Operand>, Vec<Operand>)> {
    let all = |descs: &[TensorDesc]| descs.iter().map(|d| device.operand(d)).collect::<Result<Vec<_>>>();
    Ok((all(inputs)?, all(outputs)?))
}

/// The operand-count error every family uses.
pub fn arity(op: &Op, n_in: usize, n_out: usize, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    genesis_backend_api::sdk::expect_arity(op, inputs, outputs, n_in, n_out)
}
