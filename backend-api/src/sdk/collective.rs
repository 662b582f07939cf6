//! Collectives for backend authors: the checks every backend's collectives share (the
//! export layer runs them before [`crate::Backend::collective`] is called), and [`staged`], a
//! correct host-staged implementation any backend gets by default.
//!
//! The rules, per [`CollectiveOp`], for `n` ranks:
//! - every descriptor is dense and row-major, and all have one dtype;
//! - `AllReduceSum`, `Broadcast`: every input and output has one shape;
//! - `AllGather`: inputs share a shape `[d, ...]`; outputs are `[n*d, ...]`, rank r's input at
//!   rows `r*d..(r+1)*d`;
//! - `ReduceScatterSum`: inputs share `[n*d, ...]`; outputs are `[d, ...]`;
//! - the sums refuse `bool`; integers wrap;
//! - the ranks' devices are distinct;
//! - a rank's output is either exactly its input (in place, `AllReduceSum` and `Broadcast`
//!   only) or shares no byte with it.

use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::op::CollectiveOp;
use crate::tensor::TensorDesc;
use crate::traits::{CollectiveArg, Device, Rank};
use half::{bf16, f16};

/// Check `args` against the rules above. The error names the collective and the rank.
pub fn check(op: CollectiveOp, args: &[CollectiveArg]) -> Result<()> {
    check_ranks(op, args, args.len())
}

/// Check one process's part of a collective over a group of `world_size` processes
/// ([`crate::Backend::comm_collective`]): the same rules, with `n` the group's size.
pub fn check_member(op: CollectiveOp, world_size: usize, arg: &CollectiveArg) -> Result<()> {
    if world_size == 0 {
        return Err(BackendError::invalid(format!("{}: a group of no processes", op.name())));
    }
    check_ranks(op, std::slice::from_ref(arg), world_size)
}

fn check_ranks(op: CollectiveOp, args: &[CollectiveArg], n: usize) -> Result<()> {
    let name = op.name();
    let Some(first) = args.first() else {
        return Err(BackendError::invalid(format!("{name}: no participating devices")));
    };
    let dtype = first.input.dtype()?;
    if dtype == DType::Bool && matches!(op, CollectiveOp::AllReduceSum | CollectiveOp::ReduceScatterSum) {
        return Err(BackendError::dtype(format!("{name}: a sum of bool is not defined")));
    }
    let in_shape = first.input.shape();
    let out_shape = match op {
        CollectiveOp::AllReduceSum | CollectiveOp::Broadcast => in_shape.clone(),
        CollectiveOp::AllGather | CollectiveOp::ReduceScatterSum => {
            let Some(&rows) = in_shape.first() else {
                return Err(BackendError::shape(format!("{name}: needs tensors of rank 1 or more (dim 0 is split)")));
            };
            let rows = if op == CollectiveOp::AllGather {
                rows.checked_mul(n).ok_or_else(|| BackendError::shape(format!("{name}: output too large")))?
            } else if rows % n == 0 {
                rows / n
            } else {
                return Err(BackendError::shape(format!(
                    "{name}: dim 0 of the input ({rows}) does not split into {n} equal chunks"
                )));
            };
            std::iter::once(rows).chain(in_shape[1..].iter().copied()).collect()
        }
    };
    for (rank, arg) in args.iter().enumerate() {
        if args[..rank].iter().any(|earlier| earlier.device == arg.device) {
            return Err(BackendError::invalid(format!(
                "{name}: device {} appears twice (each rank needs its own device)",
                arg.device
            )));
        }
        for (what, desc, shape) in [("input", &arg.input, &in_shape), ("output", &arg.output, &out_shape)] {
            let actual = desc.dtype()?;
            if actual != dtype {
                return Err(BackendError::dtype(format!(
                    "{name}: rank {rank}'s {what} is {actual}, rank 0's input {dtype}"
                )));
            }
            if desc.shape() != *shape {
                return Err(BackendError::shape(format!(
                    "{name}: rank {rank}'s {what} has shape {:?}, expected {shape:?}",
                    desc.shape()
                )));
            }
            if !desc.is_contiguous() {
                return Err(BackendError::invalid(format!(
                    "{name}: rank {rank}'s {what} is not contiguous (strides {:?})",
                    desc.strides()
                )));
            }
        }
        let in_place = arg.input.buffer == arg.output.buffer && arg.input.offset_bytes == arg.output.offset_bytes;
        let allows_in_place = matches!(op, CollectiveOp::AllReduceSum | CollectiveOp::Broadcast);
        if !(in_place && allows_in_place) && overlap(&arg.input, &arg.output)? {
            return Err(BackendError::invalid(format!(
                "{name}: rank {rank}'s output overlaps its input{}",
                if allows_in_place { " (only exactly in place is allowed)" } else { "" }
            )));
        }
    }
    Ok(())
}

fn overlap(a: &TensorDesc, b: &TensorDesc) -> Result<bool> {
    Ok(match (a.byte_extent()?, b.byte_extent()?) {
        (Some(x), Some(y)) => a.buffer == b.buffer && x.0 < y.1 && y.0 < x.1,
        _ => false,
    })
}

/// Run a collective by copying through the host: read every input, combine, write every
/// output. Correct on any backend (what [`crate::Backend::collective`] does by default), and
/// as slow as two host transfers per rank; a backend with a device-to-device path overrides
/// it. Float sums accumulate in f64 and round once, so the result does not depend on the
/// order of the ranks. Expects `ranks` to have passed [`check`].
pub fn staged<D: Device>(op: CollectiveOp, ranks: &[Rank<'_, D>]) -> Result<()> {
    let Some(first) = ranks.first() else { return Ok(()) };
    let dtype = first.input.dtype()?;
    let size = dtype.size_in_bytes();
    let inputs: Vec<Vec<u8>> = match op {
        // Only the root's input matters.
        CollectiveOp::Broadcast => vec![read(first.device, &first.input, size)?],
        _ => ranks.iter().map(|r| read(r.device, &r.input, size)).collect::<Result<_>>()?,
    };
    let result = match op {
        CollectiveOp::AllReduceSum | CollectiveOp::ReduceScatterSum => sum(dtype, &inputs),
        CollectiveOp::Broadcast => inputs.into_iter().next().unwrap_or_default(),
        CollectiveOp::AllGather => inputs.concat(),
    };
    let chunk = result.len() / ranks.len();
    for (r, rank) in ranks.iter().enumerate() {
        let bytes = match op {
            CollectiveOp::ReduceScatterSum => &result[r * chunk..(r + 1) * chunk],
            _ => &result[..],
        };
        rank.device.write(rank.output.buffer, rank.output.offset_bytes as usize, bytes)?;
    }
    Ok(())
}

fn read<D: Device>(device: &D, desc: &TensorDesc, size: usize) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; desc.numel() * size];
    device.read(desc.buffer, desc.offset_bytes as usize, &mut bytes)?;
    Ok(bytes)
}

/// The elementwise sum of equally long byte images of `dtype` values, accumulated wide (f64
/// for floats, wrapping i64 for integers; bool as logical or). Host transports use it too.
pub fn sum(dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
    match dtype {
        DType::F32 => sum_as::<f32, f64>(inputs, |x| x as f64, |s| s as f32),
        DType::F64 => sum_as::<f64, f64>(inputs, |x| x, |s| s),
        DType::F16 => sum_as::<f16, f64>(inputs, f64::from, f16::from_f64),
        DType::BF16 => sum_as::<bf16, f64>(inputs, f64::from, bf16::from_f64),
        DType::I64 => sum_as::<i64, i64>(inputs, |x| x, |s| s),
        DType::I32 => sum_as::<i32, i64>(inputs, i64::from, |s| s as i32),
        DType::U8 => sum_as::<u8, i64>(inputs, i64::from, |s| s as u8),
        // `check` refuses sums of bool; the logical-or is what a sum would saturate to.
        DType::Bool => sum_as::<u8, i64>(inputs, i64::from, |s| (s != 0) as u8),
    }
}

/// Sum in the accumulator type `A` (f64 for floats; i64 with wrapping for integers, whose
/// truncation back gives the wrapped sum of the narrow type).
fn sum_as<T: bytemuck::Pod, A: Accumulate>(inputs: &[Vec<u8>], widen: fn(T) -> A, narrow: fn(A) -> T) -> Vec<u8> {
    let size = std::mem::size_of::<T>();
    let n = inputs.first().map_or(0, |b| b.len() / size);
    let mut acc = vec![A::ZERO; n];
    for bytes in inputs {
        for (a, chunk) in acc.iter_mut().zip(bytes.chunks_exact(size)) {
            *a = a.add(widen(bytemuck::pod_read_unaligned(chunk)));
        }
    }
    let mut out = Vec::with_capacity(n * size);
    for a in acc {
        out.extend_from_slice(bytemuck::bytes_of(&narrow(a)));
    }
    out
}

trait Accumulate: Copy {
    const ZERO: Self;
    fn add(self, other: Self) -> Self;
}

impl Accumulate for f64 {
    const ZERO: f64 = 0.0;
    fn add(self, other: f64) -> f64 {
        self + other
    }
}

impl Accumulate for i64 {
    const ZERO: i64 = 0;
    fn add(self, other: i64) -> i64 {
        self.wrapping_add(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::BufferId;

    fn arg(device: u32, buffer: u64, shape_in: &[usize], shape_out: &[usize], dtype: DType) -> CollectiveArg {
        CollectiveArg {
            device,
            input: TensorDesc::contiguous(BufferId(buffer), 0, dtype, shape_in).unwrap(),
            output: TensorDesc::contiguous(BufferId(buffer + 100), 0, dtype, shape_out).unwrap(),
        }
    }

    #[test]
    fn shapes_follow_the_op() {
        let f = DType::F32;
        let ok = |op, args: &[CollectiveArg]| check(op, args).map_err(|e| e.to_string());
        ok(CollectiveOp::AllReduceSum, &[arg(0, 1, &[4, 3], &[4, 3], f), arg(1, 2, &[4, 3], &[4, 3], f)]).unwrap();
        ok(CollectiveOp::AllGather, &[arg(0, 1, &[2, 3], &[4, 3], f), arg(1, 2, &[2, 3], &[4, 3], f)]).unwrap();
        ok(CollectiveOp::ReduceScatterSum, &[arg(0, 1, &[4, 3], &[2, 3], f), arg(1, 2, &[4, 3], &[2, 3], f)]).unwrap();
        let e = check(CollectiveOp::ReduceScatterSum, &[arg(0, 1, &[3], &[1], f), arg(1, 2, &[3], &[1], f)]);
        assert!(e.unwrap_err().message.contains("does not split into 2"));
        let e = check(CollectiveOp::AllGather, &[arg(0, 1, &[2, 3], &[2, 3], f), arg(1, 2, &[2, 3], &[4, 3], f)]);
        assert!(e.unwrap_err().message.contains("rank 0's output has shape [2, 3], expected [4, 3]"));
        let e = check(CollectiveOp::AllGather, &[arg(0, 1, &[], &[], f)]);
        assert!(e.unwrap_err().message.contains("rank 1 or more"));
    }

    #[test]
    fn bad_participants_are_refused() {
        let f = DType::F32;
        assert!(check(CollectiveOp::Broadcast, &[]).unwrap_err().message.contains("no participating"));
        let twice = [arg(3, 1, &[2], &[2], f), arg(3, 2, &[2], &[2], f)];
        assert!(check(CollectiveOp::Broadcast, &twice).unwrap_err().message.contains("device 3 appears twice"));
        let mixed = [arg(0, 1, &[2], &[2], f), arg(1, 2, &[2], &[2], DType::F16)];
        assert!(check(CollectiveOp::AllReduceSum, &mixed).unwrap_err().message.contains("rank 1's input is float16"));
        let bools = [arg(0, 1, &[2], &[2], DType::Bool)];
        assert!(check(CollectiveOp::AllReduceSum, &bools).is_err());
        assert!(check(CollectiveOp::Broadcast, &bools).is_ok());
        let mut strided = arg(0, 1, &[2, 2], &[2, 2], f);
        strided.input.strides[..2].copy_from_slice(&[1, 2]);
        assert!(check(CollectiveOp::AllReduceSum, &[strided]).unwrap_err().message.contains("not contiguous"));
    }

    #[test]
    fn in_place_only_where_allowed() {
        let f = DType::F32;
        let mut same = arg(0, 1, &[4], &[4], f);
        same.output = same.input;
        assert!(check(CollectiveOp::AllReduceSum, &[same]).is_ok());
        let mut gather = arg(0, 1, &[4], &[4], f);
        gather.output = gather.input;
        assert!(check(CollectiveOp::AllGather, &[gather]).unwrap_err().message.contains("overlaps"));
        let mut shifted = same;
        shifted.output.offset_bytes = 4;
        assert!(check(CollectiveOp::AllReduceSum, &[shifted]).unwrap_err().message.contains("exactly in place"));
    }

    #[test]
    fn sums_round_once_and_integers_wrap() {
        let f16s = |v: &[f32]| v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect::<Vec<u8>>();
        // 2048 + 1 + 1 in f16 steps would stay 2048 (spacing 2); rounding once gives 2050.
        let out = sum(DType::F16, &[f16s(&[2048.0]), f16s(&[1.0]), f16s(&[1.0])]);
        assert_eq!(f16::from_le_bytes([out[0], out[1]]).to_f32(), 2050.0);
        let out = sum(DType::U8, &[vec![200, 1], vec![100, 2]]);
        assert_eq!(out, vec![44, 3]);
        let i32s = |v: i32| v.to_le_bytes().to_vec();
        assert_eq!(sum(DType::I32, &[i32s(i32::MAX), i32s(2)]), i32s(i32::MIN + 1));
    }
}
