//! Scaled dot-product attention.

use super::{dims, expect_dtype, expect_meta, expect_shape, operands, Meta};
use crate::dtype::DType;
use crate::error::{BackendError, Result};
use crate::op::Op;

/// The problem sizes of one attention call: batch, query heads, kv heads, queries, keys and
/// head dim (q is `(b, hq, s, d)`, k and v `(b, hk, t, d)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch.
    pub b: usize,
    /// Query heads, a multiple of `hk`.
    pub hq: usize,
    /// Key/value heads (≥ 1).
    pub hk: usize,
    /// Queries.
    pub s: usize,
    /// Keys.
    pub t: usize,
    /// Head dim.
    pub d: usize,
}

impl AttentionDims {
    /// Where `s` new positions can start in a cache of `t`: positions `p` in `[0, t - s]`,
    /// this many (`RotaryKvWrite`'s bound).
    pub fn positions_free(&self) -> usize {
        self.t - self.s + 1
    }

    /// Query heads per kv head: query head `h` reads kv head `h / group()`.
    pub fn group(&self) -> usize {
        self.hq / self.hk
    }

    /// How many keys query `i` sees: all of them, or under the causal mask aligned to the
    /// bottom right, those with `j <= i + t - s` (none at all for the first `s - t` queries
    /// when there are fewer keys than queries).
    pub fn visible(&self, causal: bool, i: usize) -> usize {
        if causal {
            (i + self.t + 1).saturating_sub(self.s).min(self.t)
        } else {
            self.t
        }
    }
}

/// q, k and v: rank 4, one batch and head dim, `hq` a multiple of `hk`, one dtype.
fn expect_qkv(op: &Op, q: &impl Meta, k: &impl Meta, v: &impl Meta) -> Result<AttentionDims> {
    let [b, hq, s, d] = dims::<4>(op, "q (b, hq, s, d)", q)?;
    let [bk, hk, t, dk] = dims::<4>(op, "k (b, hk, t, d)", k)?;
    expect_shape(op, "v", v, k.shape())?;
    if bk != b || dk != d {
        return Err(BackendError::shape(format!(
            "{}: q {:?} and k {:?} differ in batch or head dim",
            op.name(),
            q.shape(),
            k.shape()
        )));
    }
    if hk == 0 || hq % hk != 0 {
        return Err(BackendError::shape(format!(
            "{}: the query heads ({hq}) must be a multiple of the kv heads ({hk} in k {:?})",
            op.name(),
            k.shape()
        )));
    }
    expect_dtype(op, "k", k, q.dtype())?;
    expect_dtype(op, "v", v, q.dtype())?;
    Ok(AttentionDims { b, hq, hk, s, t, d })
}

/// lse: f32 of shape `(b, hq, s)`.
fn expect_lse(op: &Op, lse: &impl Meta, q: &impl Meta) -> Result<()> {
    expect_meta(op, "lse", lse, &q.shape()[..3], DType::F32)
}

/// Operands of `Attention`, `[q, k, v] -> [o, lse]`: see [`AttentionDims`]; o like q, lse f32
/// `(b, hq, s)`.
#[allow(clippy::type_complexity)]
pub fn attention<'a, T: Meta>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<(AttentionDims, &'a [T; 3], &'a [T; 2])> {
    let (ins @ [q, k, v], outs @ [o, lse]) = operands(op, inputs, outputs)?;
    let dims = expect_qkv(op, q, k, v)?;
    expect_meta(op, "o", o, q.shape(), q.dtype())?;
    expect_lse(op, lse, q)?;
    Ok((dims, ins, outs))
}

/// Operands of `AttentionBackward`, `[q, k, v, o, lse, do] -> [dq, dk, dv]`, with the
/// forward's rules; every gradient is shaped like its operand.
#[allow(clippy::type_complexity)]
pub fn attention_backward<'a, T: Meta>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<(AttentionDims, &'a [T; 6], &'a [T; 3])> {
    let (ins @ [q, k, v, o, lse, d_o], outs @ [dq, dk, dv]) = operands(op, inputs, outputs)?;
    let dims = expect_qkv(op, q, k, v)?;
    for (name, t, like) in [("o", o, q), ("do", d_o, q), ("dq", dq, q), ("dk", dk, k), ("dv", dv, v)] {
        expect_meta(op, name, t, like.shape(), q.dtype())?;
    }
    expect_lse(op, lse, q)?;
    Ok((dims, ins, outs))
}

/// Operands of `MaskedAttention`, `[q, k, v, keep] -> [o]`: q, k, v as for `Attention`, keep
/// bool `(b, s, t)`, o like q.
#[allow(clippy::type_complexity)]
pub fn masked_attention<'a, T: Meta>(
    op: &Op,
    inputs: &'a [T],
    outputs: &'a [T],
) -> Result<(AttentionDims, &'a [T; 4], &'a [T; 1])> {
    let (ins @ [q, k, v, keep], outs @ [o]) = operands(op, inputs, outputs)?;
    let dims = expect_qkv(op, q, k, v)?;
    expect_meta(op, "keep", keep, &[dims.b, dims.s, dims.t], DType::Bool)?;
    expect_meta(op, "o", o, q.shape(), q.dtype())?;
    Ok((dims, ins, outs))
}

#[cfg(test)]
mod tests {
    use super::super::Fake;
    use super::*;

    #[test]
    fn masked_attention_takes_a_bool_mask_per_batch_query_and_key() {
        let op = Op::MaskedAttention { scale: 1.0 };
        let f = |shape: &[usize]| Fake::new(DType::F32, shape);
        let qkv = [f(&[2, 4, 1, 8]), f(&[2, 2, 5, 8]), f(&[2, 2, 5, 8])];
        let with = |keep: Fake| [qkv[0].clone(), qkv[1].clone(), qkv[2].clone(), keep];
        let (dm, _, _) = masked_attention(&op, &with(Fake::new(DType::Bool, &[2, 1, 5])), &[f(&[2, 4, 1, 8])]).unwrap();
        assert_eq!((dm.s, dm.t, dm.group()), (1, 5, 2));
        let err = masked_attention(&op, &with(Fake::new(DType::Bool, &[2, 5])), &[f(&[2, 4, 1, 8])]).unwrap_err();
        assert!(err.message.contains("keep"), "{}", err.message);
        let err = masked_attention(&op, &with(f(&[2, 1, 5])), &[f(&[2, 4, 1, 8])]).unwrap_err();
        assert!(err.message.contains("keep"), "{}", err.message);
    }

    #[test]
    fn grouped_heads_and_causal_visibility() {
        let op = Op::Attention { causal: true, scale: 1.0 };
        let f = |shape: &[usize]| Fake::new(DType::F32, shape);
        let (ins, outs) = ([f(&[1, 4, 3, 8]), f(&[1, 2, 5, 8]), f(&[1, 2, 5, 8])], [f(&[1, 4, 3, 8]), f(&[1, 4, 3])]);
        let (dm, _, _) = attention(&op, &ins, &outs).unwrap();
        assert_eq!((dm.group(), dm.visible(true, 0), dm.visible(false, 0)), (2, 3, 5));
        let ins = [f(&[1, 3, 3, 8]), f(&[1, 2, 5, 8]), f(&[1, 2, 5, 8])];
        let err = attention(&op, &ins, &[f(&[1, 3, 3, 8]), f(&[1, 3, 3])]).unwrap_err();
        assert!(err.message.contains("must be a multiple of the kv heads"));
    }
}
