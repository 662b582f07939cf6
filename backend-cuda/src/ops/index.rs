//! Index ops (`kernels/index.cu`): gather, scatter_add, index_select, index_add and cumsum
//! along one dim, with the SDK's shape rules, dtypes and errors.
//!
//! Every index is checked on the device before the op writes anything (`check_indices`: an
//! out-of-range index is an `InvalidArgument` error and in-place outputs stay untouched, as on
//! the CPU); the host does not wait for that check, the error comes from the next
//! synchronization. The kernels take any strides, so no operand is
//! copied. index_select and index_add run the gather and scatter kernels with the rank-1
//! index seen as a tensor of the iteration shape (stride 0 off the indexed dim).

use super::arity;
use super::rows::{check_indices, fill_geometry, launch_flat, lift};
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::{Args, Operand};
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

kernel_module! {
    /// The index kernels (gather, scatter-add, index-select, index-add, cumsum) and the deferred
    /// index check, for every dtype.
    MODULE = "index", for &DType::ALL,
    from "index_check.cu", "index.cu"
}
inventory::submit! { Family { claims, run } }

/// What this family runs: every dtype, as on the CPU (cumsum: all but bool).
fn claims() -> Vec<(OpKind, DType)> {
    domain::index_claims()
}

/// Run one index op.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let n_in = if matches!(op, Op::CumSum { .. }) { 1 } else { 2 };
    arity(op, n_in, 1, inputs, outputs)?;
    let a = lift(&device.operand(&inputs[0])?);
    let y = lift(&device.operand(&outputs[0])?);
    match *op {
        Op::Gather { dim } => gather(device, op, &a, &lift(&device.operand(&inputs[1])?), &y, dim as usize),
        Op::ScatterAdd { dim } => scatter_add(device, op, &a, &lift(&device.operand(&inputs[1])?), &y, dim as usize),
        Op::IndexSelect { dim } => index_select(device, op, &a, &lift(&device.operand(&inputs[1])?), &y, dim as usize),
        Op::IndexAdd { dim } => index_add(device, op, &a, &lift(&device.operand(&inputs[1])?), &y, dim as usize),
        Op::CumSum { dim } => cumsum(device, op, &a, &y, dim as usize),
        _ => Err(BackendError::unsupported(format!("cuda: {} is not an index op", op.name()))),
    }
}

/// `strides` with the entry of `dim` zeroed (the indexed operand's base geometry).
fn without(strides: &[isize], dim: usize) -> Vec<isize> {
    let mut s = strides.to_vec();
    s[dim] = 0;
    s
}

/// The rank-1 index seen over `shape`: stride 0 except along `dim`.
fn spread(index: &Operand, rank: usize, dim: usize) -> Vec<isize> {
    let mut s = vec![0isize; rank];
    s[dim] = index.strides[0];
    s
}

/// Launch the gather (`scatter` false) or scatter-add kernel over `shape` with stride sets
/// (index, walked operand, indexed operand with `dim` zeroed); `indexed` is the indexed
/// operand (its size and stride along `dim` complete the address).
#[allow(clippy::too_many_arguments)]
fn launch(
    device: &CudaDevice,
    op: &Op,
    scatter: bool,
    shape: &[usize],
    index: (&Operand, &[isize]),
    walked: &Operand,
    indexed: &Operand,
    dim: usize,
) -> Result<()> {
    let zeroed = without(&indexed.strides, dim);
    let mut args = Args::default();
    fill_geometry(&mut args, shape, &[index.1, &walked.strides, &zeroed]);
    args.p = [index.0.ptr, walked.ptr, indexed.ptr, 0];
    args.u = [indexed.shape[dim] as u64, indexed.strides[dim] as i64 as u64];
    let name = if scatter { "scatter_add" } else { "gather" };
    launch_flat(device, op, &MODULE, walked.dtype, name, &mut args)
}

fn gather(device: &CudaDevice, op: &Op, x: &Operand, index: &Operand, y: &Operand, dim: usize) -> Result<()> {
    checks::gather(op, x, index, y, dim)?;
    check_indices(device, op, &MODULE, x.dtype, index, x.shape[dim], None, "index")?;
    launch(device, op, false, &index.shape, (index, &index.strides), y, x, dim)
}

fn scatter_add(device: &CudaDevice, op: &Op, src: &Operand, index: &Operand, y: &Operand, dim: usize) -> Result<()> {
    checks::scatter_add(op, src, index, y, dim)?;
    check_indices(device, op, &MODULE, src.dtype, index, y.shape[dim], None, "index")?;
    // The index may be smaller than src: walk src over the index's shape.
    let walked = Operand { shape: index.shape.clone(), ..src.clone() };
    launch(device, op, true, &index.shape, (index, &index.strides), &walked, y, dim)
}

fn index_select(device: &CudaDevice, op: &Op, x: &Operand, index: &Operand, y: &Operand, dim: usize) -> Result<()> {
    checks::index_select(op, x, index, y, dim)?;
    check_indices(device, op, &MODULE, x.dtype, index, x.shape[dim], None, "index")?;
    let spread = spread(index, y.shape.len(), dim);
    launch(device, op, false, &y.shape, (index, &spread), y, x, dim)
}

fn index_add(device: &CudaDevice, op: &Op, src: &Operand, index: &Operand, y: &Operand, dim: usize) -> Result<()> {
    checks::index_add(op, src, index, y, dim)?;
    check_indices(device, op, &MODULE, src.dtype, index, y.shape[dim], None, "index")?;
    let spread = spread(index, src.shape.len(), dim);
    launch(device, op, true, &src.shape, (index, &spread), src, y, dim)
}

fn cumsum(device: &CudaDevice, op: &Op, x: &Operand, y: &Operand, dim: usize) -> Result<()> {
    checks::cumsum(op, x, y, dim)?;
    let steps = x.shape[dim];
    let drop_dim = |v: &[usize]| [&v[..dim], &v[dim + 1..]].concat();
    let drop_stride = |v: &[isize]| [&v[..dim], &v[dim + 1..]].concat();
    let lines = drop_dim(&x.shape);
    let mut args = Args::default();
    fill_geometry(&mut args, &lines, &[&drop_stride(&x.strides), &drop_stride(&y.strides)]);
    if args.n == 0 || steps == 0 {
        return Ok(());
    }
    args.p[0] = x.ptr;
    args.p[1] = y.ptr;
    args.st[2][0] = x.strides[dim] as i64;
    args.st[3][0] = y.strides[dim] as i64;
    args.u[0] = steps as u64;
    // A thread per line walks it in order when there are enough lines to fill the GPU or
    // they are short; otherwise a block scans each line in chunks.
    let sm = device.facts.sm_count as u64;
    if steps >= 64 && args.n < sm * 1024 {
        let blocks = args.n.min(sm * 32) as u32;
        let threads = (steps.div_ceil(4).min(1024) as u32).next_power_of_two().clamp(32, 1024);
        device.launch_with(op.name(), &MODULE, x.dtype, "cumsum_scan", &mut args, ((blocks, 1), (threads, 1), 0), false)
    } else {
        launch_flat(device, op, &MODULE, x.dtype, "cumsum_lines", &mut args)
    }
}
