//! Batch normalization: per-channel statistics over the batch and spatial dims of `(n, c, s)`.

use super::rows::{affine_norm, affine_norm_backward};
use super::{dims, expect_meta, operands, Meta, Operands};
use crate::dtype::DType;
use crate::error::Result;
use crate::op::Op;

/// A per-channel f32 operand (weight, bias, statistics and their gradients): shape `[c]`.
fn expect_channel(op: &Op, name: &str, t: &impl Meta, c: usize) -> Result<()> {
    expect_meta(op, name, t, &[c], DType::F32)
}

/// Operands of `BatchNorm { eps }`, `[x, weight, bias] -> [y, mean, rstd]`: x `(n, c, s)`,
/// eps >= 0, y like x, the others f32 `[c]`.
pub fn batch_norm<'a, T: Meta>(op: &Op, eps: f64, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 3, 3>> {
    let (ins, outs) = operands(op, inputs, outputs)?;
    let [_, c, _] = dims::<3>(op, "x", &ins[0])?;
    let channel = |name: &str, t: &T| expect_channel(op, name, t, c);
    affine_norm(op, eps, ins, outs, channel, channel)?;
    Ok((ins, outs))
}

/// Operands of `BatchNormBackward`, `[dy, x, weight, mean, rstd] -> [dx, dweight, dbias]`, with
/// the forward's rules (dy and dx like x).
pub fn batch_norm_backward<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<Operands<'a, T, 5, 3>> {
    let (ins, outs) = operands(op, inputs, outputs)?;
    let [_, c, _] = dims::<3>(op, "x", &ins[1])?;
    let channel = |name: &str, t: &T| expect_channel(op, name, t, c);
    affine_norm_backward(op, ins, outs, channel, channel)?;
    Ok((ins, outs))
}

#[cfg(test)]
mod tests {
    use super::super::Fake;
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn batch_norm_rules() {
        let op = Op::BatchNorm { eps: 1e-5 };
        let x = Fake::new(DType::BF16, &[2, 3, 4]);
        let c = |n: usize| Fake::new(DType::F32, &[n]);
        let y = Fake::new(DType::BF16, &[2, 3, 4]);
        assert!(batch_norm(&op, 1e-5, &[x.clone(), c(3), c(3)], &[y.clone(), c(3), c(3)]).is_ok());
        let err =
            batch_norm(&op, 1e-5, &[Fake::new(DType::F32, &[2, 3]), c(3), c(3)], &[y.clone(), c(3), c(3)]).unwrap_err();
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::ShapeMismatch, "batch_norm: x must have rank 3, got shape [2, 3]")
        );
        let err = batch_norm(&op, 1e-5, &[x.clone(), c(4), c(3)], &[y.clone(), c(3), c(3)]).unwrap_err();
        assert_eq!(err.message, "batch_norm: weight has shape [4], expected [3]");
        let bf = Fake::new(DType::BF16, &[3]);
        let err = batch_norm(&op, 1e-5, &[x.clone(), bf, c(3)], &[y.clone(), c(3), c(3)]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::DtypeMismatch);
        let err = batch_norm(&op, -1.0, &[x.clone(), c(3), c(3)], &[y, c(3), c(3)]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        let back = Op::BatchNormBackward;
        assert!(batch_norm_backward(&back, &[x.clone(), x.clone(), c(3), c(3), c(3)], &[x.clone(), c(3), c(3)]).is_ok());
        let err = batch_norm_backward(&back, &[x.clone(), x.clone(), c(3), c(3), c(2)], &[x, c(3), c(3)]).unwrap_err();
        assert_eq!(err.message, "batch_norm_backward: rstd has shape [2], expected [3]");
    }
}
