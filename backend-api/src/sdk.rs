//! Helpers for backend authors: operand checks and strided iteration, so every backend
//! validates the same way and kernels stay short.

pub mod checks;
pub mod collective;
pub mod domain;
pub mod graph;
pub mod philox;
pub mod required;
pub mod scalar;
pub mod window;

use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::op::Op;
use crate::tensor::TensorDesc;

/// Check the operand counts of `op`.
pub fn expect_arity(op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc], n_in: usize, n_out: usize) -> Result<()> {
    if inputs.len() != n_in || outputs.len() != n_out {
        return Err(arity_error(op, n_in, n_out, inputs.len(), outputs.len()));
    }
    Ok(())
}

/// The wrong-operand-count error of [`expect_arity`] and [`checks::operands`].
fn arity_error(op: &Op, n_in: usize, n_out: usize, got_in: usize, got_out: usize) -> BackendError {
    BackendError::invalid(format!(
        "{}: expected {n_in} input(s) and {n_out} output(s), got {got_in} and {got_out}",
        op.name()
    ))
}

/// Check that `a` and `b` have one shape.
pub fn expect_same_shape(op: &Op, a: &TensorDesc, b: &TensorDesc) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(BackendError::shape(format!("{}: shapes {:?} and {:?} differ", op.name(), a.shape(), b.shape())));
    }
    Ok(())
}

/// Check that `t` has dtype `dtype`.
pub fn expect_dtype(op: &Op, t: &TensorDesc, dtype: DType) -> Result<()> {
    let actual = t.dtype()?;
    if actual != dtype {
        return Err(BackendError::dtype(format!("{}: expected {dtype}, got {actual}", op.name())));
    }
    Ok(())
}

/// Refuse outputs whose bytes overlap each other or an input (in-place ops pass
/// `allow_inputs = true` to skip the input check). Exactly aliasing an input is allowed for
/// elementwise ops via `allow_identical`.
pub fn expect_no_overlap(op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc], allow_identical: bool) -> Result<()> {
    for (i, out) in outputs.iter().enumerate() {
        if out.numel() > 1 && out.strides().iter().zip(out.shape()).any(|(&s, n)| s == 0 && n > 1) {
            return Err(BackendError::invalid(format!(
                "{}: output {i} has a zero stride (it would overlap itself)",
                op.name()
            )));
        }
        let Some(o) = out.byte_extent()? else { continue };
        for (j, other) in outputs.iter().enumerate().skip(i + 1) {
            if let Some(p) = other.byte_extent()? {
                if other.buffer == out.buffer && o.0 < p.1 && p.0 < o.1 && !interleaved_rows(out, other)? {
                    return Err(BackendError::invalid(format!("{}: outputs {i} and {j} overlap", op.name())));
                }
            }
        }
        for (j, input) in inputs.iter().enumerate() {
            if allow_identical && input == out {
                continue;
            }
            if let Some(p) = input.byte_extent()? {
                if input.buffer == out.buffer && o.0 < p.1 && p.0 < o.1 {
                    return Err(BackendError::invalid(format!("{}: output {i} overlaps input {j}", op.name())));
                }
            }
        }
    }
    Ok(())
}

/// Whether `a` and `b`, whose byte ranges overlap, still share no byte because their rows
/// interleave: one shape, strides and dtype; every element at `m·S + c` (elements from the
/// operand's start) for an integer `m` and `0 <= c < len`, with the innermost dim dense of
/// length `len` and every other stride a multiple of `S >= len`; and the starts `d` elements
/// apart with `len <= d mod S <= S - len`. The two halves of a stacked projection's rows
/// (`p[.., :n]` and `p[.., n:]`) are such a pair. Anything else is reported as shared.
fn interleaved_rows(a: &TensorDesc, b: &TensorDesc) -> Result<bool> {
    if a.dtype != b.dtype || a.shape() != b.shape() || a.strides() != b.strides() {
        return Ok(false);
    }
    let size = a.dtype()?.size_in_bytes() as u64;
    let dims: Vec<(usize, isize)> = a.shape().into_iter().zip(a.strides()).filter(|&(n, _)| n > 1).collect();
    let Some(&(len, 1)) = dims.last() else { return Ok(false) };
    let outer = &dims[..dims.len() - 1];
    let Some(row) = outer.iter().map(|&(_, s)| s.unsigned_abs()).min() else { return Ok(false) };
    if row < len || outer.iter().any(|&(_, s)| s.unsigned_abs() % row != 0) {
        return Ok(false);
    }
    let apart = a.offset_bytes.abs_diff(b.offset_bytes);
    if apart % size != 0 {
        return Ok(false);
    }
    let within = (apart / size) % row as u64;
    Ok(within >= len as u64 && row as u64 - within >= len as u64)
}

/// One operand's memory for [`expect_disjoint_updates`]: a region key (the buffer id, or 0
/// when the extents are absolute addresses) and the half-open byte range it touches.
pub type Extent = (u64, usize, usize);

/// For in-place multi-tensor updates (AdamW): no output may share a byte with another output
/// or with an input (inputs may overlap each other; they are only read). `None` marks an
/// empty operand. A sweep over the extents sorted by start, so a step over hundreds of
/// tensors costs microseconds instead of the pairwise check of [`expect_no_overlap`]. The
/// error names the operands as `input_name`/`output` and their indices.
pub fn expect_disjoint_updates(
    op: &Op,
    input_name: &str,
    inputs: &[Option<Extent>],
    outputs: &[Option<Extent>],
) -> Result<()> {
    let mut spans: Vec<(u64, usize, usize, bool, usize)> = Vec::with_capacity(inputs.len() + outputs.len());
    for (is_out, list) in [(false, inputs), (true, outputs)] {
        for (i, e) in list.iter().enumerate() {
            if let Some((region, start, end)) = *e {
                spans.push((region, start, end, is_out, i));
            }
        }
    }
    spans.sort_unstable();
    let name = |is_out: bool| if is_out { "output" } else { input_name };
    // Per region, by start: a span overlaps an earlier one iff it starts before that one's
    // end, so the largest end so far (over outputs, and over everything) decides.
    let mut region = None;
    let (mut end_out, mut end_all) = ((0usize, 0usize), (0usize, 0usize, false));
    for &(r, start, end, is_out, i) in &spans {
        if region != Some(r) {
            region = Some(r);
            (end_out, end_all) = ((0, 0), (0, 0, false));
        }
        let clash = if start < end_out.0 {
            Some((true, end_out.1))
        } else if is_out && start < end_all.0 {
            Some((end_all.2, end_all.1))
        } else {
            None
        };
        if let Some((other_out, j)) = clash {
            return Err(BackendError::invalid(format!(
                "{}: {} {i} overlaps {} {j} (outputs are updated in place and must be disjoint)",
                op.name(),
                name(is_out),
                name(other_out)
            )));
        }
        if is_out && end > end_out.0 {
            end_out = (end, i);
        }
        if end > end_all.0 {
            end_all = (end, i, is_out);
        }
    }
    Ok(())
}

/// The reduced axes of a reduction: where the output has size 1 and the input does not.
/// Fails when ranks differ or a kept axis changes size.
pub fn reduced_axes(op: &Op, input: &TensorDesc, output: &TensorDesc) -> Result<Vec<bool>> {
    reduced_by_shape(op, &input.shape(), &output.shape())
}

/// [`reduced_axes`] on bare shapes (also the rule of [`checks::reduce`]).
pub(crate) fn reduced_by_shape(op: &Op, is: &[usize], os: &[usize]) -> Result<Vec<bool>> {
    if is.len() != os.len() {
        return Err(BackendError::shape(format!("{}: input {is:?} and output {os:?} differ in rank", op.name())));
    }
    is.iter()
        .zip(os)
        .map(|(&i, &o)| match (i, o) {
            (i, o) if i == o => Ok(false),
            (_, 1) => Ok(true),
            _ => Err(BackendError::shape(format!("{}: cannot reduce {is:?} to {os:?}", op.name()))),
        })
        .collect()
}

/// Element offsets of a strided view in row-major order: `offsets(&[2, 3], &[1, 2])` yields
/// 0, 2, 4, 1, 3, 5. An empty shape yields nothing; rank 0 yields one offset.
pub fn offsets(shape: &[usize], strides: &[isize]) -> StridedOffsets {
    StridedOffsets {
        shape: shape.to_vec(),
        remaining: shape.iter().product(),
        strides: strides.to_vec(),
        index: vec![0; shape.len()],
        offset: 0,
    }
}

/// Iterator returned by [`offsets`].
pub struct StridedOffsets {
    shape: Vec<usize>,
    strides: Vec<isize>,
    index: Vec<usize>,
    offset: isize,
    remaining: usize,
}

impl Iterator for StridedOffsets {
    type Item = isize;

    fn next(&mut self) -> Option<isize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let current = self.offset;
        // Odometer step: bump the last axis, carrying into earlier ones.
        // Wrapping arithmetic: an axis of size 1 may carry any stride, and stepping past it is
        // undone at once, so a transient overflow must not trap.
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            self.offset = self.offset.wrapping_add(self.strides[d]);
            if self.index[d] < self.shape[d] {
                break;
            }
            self.offset = self.offset.wrapping_sub(self.strides[d].wrapping_mul(self.shape[d] as isize));
            self.index[d] = 0;
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for StridedOffsets {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BufferId;

    #[test]
    fn offsets_walk_row_major() {
        assert_eq!(offsets(&[2, 3], &[1, 2]).collect::<Vec<_>>(), vec![0, 2, 4, 1, 3, 5]);
        assert_eq!(offsets(&[], &[]).collect::<Vec<_>>(), vec![0]);
        assert_eq!(offsets(&[2, 0], &[1, 1]).count(), 0);
        assert_eq!(offsets(&[3, 2], &[0, 1]).collect::<Vec<_>>(), vec![0, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn interleaved_rows_share_no_byte_and_overlapping_ones_do() {
        let op = Op::SwiGluBackward;
        let f32_at = |shape: &[usize], strides: &[isize], start: usize| {
            TensorDesc::new(BufferId(1), 4 * start, DType::F32, shape, strides).unwrap()
        };
        // The halves of (3, 2, 8) rows: [.., :4] and [.., 4:].
        let (gate, up) = (f32_at(&[3, 2, 4], &[16, 8, 1], 0), f32_at(&[3, 2, 4], &[16, 8, 1], 4));
        assert!(expect_no_overlap(&op, &[], &[gate, up], false).is_ok());
        // Starts 3 elements apart: rows of 4 share elements.
        let shifted = f32_at(&[3, 2, 4], &[16, 8, 1], 3);
        assert!(expect_no_overlap(&op, &[], &[gate, shifted], false).unwrap_err().message.contains("overlap"));
        // A row stride that is not a multiple of the smallest outer stride.
        let odd = |start| f32_at(&[2, 2, 4], &[12, 8, 1], start);
        assert!(expect_no_overlap(&op, &[], &[odd(0), odd(4)], false).is_err());
        // Different strides, and an input: the range rule.
        assert!(expect_no_overlap(&op, &[], &[gate, f32_at(&[3, 2, 4], &[8, 4, 1], 4)], false).is_err());
        assert!(expect_no_overlap(&op, &[up], &[gate], false).is_err());
    }
}
