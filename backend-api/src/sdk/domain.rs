//! Each op's domain: the dtypes it is defined for (the dtype of its first input, or of its
//! output when it has none, as in [`Capability`](crate::Capability)). One table for every
//! backend and the conformance harness: a backend claims pairs inside the domain (all of them,
//! or the subset it implements); the core never issues a pair outside it (it casts first, for
//! example bool to i64 before a sum).

use crate::{BinaryOp, DType, Op, OpAttrs, OpKind, RawOp, ReduceOp, UnaryOp};

/// The integer dtypes with a sign (arithmetic negation is defined on them).
const SIGNED_INTS: [DType; 2] = [DType::I64, DType::I32];

/// Whether `dtype` is in the domain of `kind` (false for a kind this version does not know).
pub fn contains(kind: OpKind, dtype: DType) -> bool {
    let Ok(op) = Op::decode(&RawOp { kind, attrs: OpAttrs::default() }) else {
        return false;
    };
    match op {
        Op::Unary(u) => unary_contains(u, dtype),
        Op::Binary(b) | Op::BinaryScalar { op: b, .. } => binary_contains(b, dtype),
        Op::Reduce(r) => reduce_contains(r, dtype),
        Op::Where
        | Op::Copy
        | Op::Cast
        | Op::Fill { .. }
        | Op::Arange { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::IndexSelect { .. }
        | Op::IndexAdd { .. } => true,
        Op::Clamp { .. } | Op::CumSum { .. } => dtype != DType::Bool,
        Op::Matmul => dtype.is_float() || SIGNED_INTS.contains(&dtype),
        Op::RandUniform { .. }
        | Op::RandNormal { .. }
        | Op::Dropout { .. }
        | Op::Softmax
        | Op::LogSoftmax
        | Op::SoftmaxBackward
        | Op::LogSoftmaxBackward
        | Op::LayerNorm { .. }
        | Op::LayerNormBackward
        | Op::RmsNorm { .. }
        | Op::RmsNormBackward
        | Op::Rotary { .. }
        | Op::Attention { .. }
        | Op::AttentionBackward { .. }
        | Op::CrossEntropy { .. }
        | Op::CrossEntropyBackward { .. }
        | Op::AdamW { .. }
        | Op::Conv2d { .. }
        | Op::Conv2dBackwardInput { .. }
        | Op::Conv2dBackwardWeight { .. }
        | Op::MaxPool2d { .. }
        | Op::MaxPool2dBackward { .. }
        | Op::AvgPool2d { .. }
        | Op::AvgPool2dBackward { .. } => dtype.is_float(),
    }
}

/// Every `(op, dtype)` pair of the domains of `ops`, for a backend's capability list.
pub fn claims(ops: &[Op]) -> Vec<(OpKind, DType)> {
    let kinds: Vec<OpKind> = ops.iter().map(Op::kind).collect();
    kind_claims(&kinds)
}

/// [`claims`] for op kinds.
pub fn kind_claims(kinds: &[OpKind]) -> Vec<(OpKind, DType)> {
    let mut pairs = Vec::new();
    for &kind in kinds {
        pairs.extend(DType::ALL.into_iter().filter(|&d| contains(kind, d)).map(|d| (kind, d)));
    }
    pairs
}

/// Every elementwise pair: unary, binary and binary-scalar ops, clamp and where.
pub fn elementwise_claims() -> Vec<(OpKind, DType)> {
    let mut kinds: Vec<OpKind> = UnaryOp::ALL.iter().map(|&u| OpKind::unary(u)).collect();
    kinds.extend(BinaryOp::ALL.iter().flat_map(|&b| [OpKind::binary(b), OpKind::binary_scalar(b)]));
    kinds.extend([Op::Clamp { min: 0.0, max: 0.0 }.kind(), Op::Where.kind()]);
    kind_claims(&kinds)
}

/// The domain of a unary op.
pub fn unary_contains(op: UnaryOp, dtype: DType) -> bool {
    match op {
        UnaryOp::Not => dtype == DType::Bool,
        UnaryOp::IsNan => true,
        UnaryOp::Neg | UnaryOp::Sign => dtype.is_float() || SIGNED_INTS.contains(&dtype),
        UnaryOp::Abs | UnaryOp::Square => dtype != DType::Bool,
        _ => dtype.is_float(),
    }
}

/// The domain of a binary op (tensor or scalar form): equality and logic on every dtype,
/// the rest on every dtype but bool.
pub fn binary_contains(op: BinaryOp, dtype: DType) -> bool {
    match op {
        BinaryOp::And | BinaryOp::Or | BinaryOp::Eq | BinaryOp::Ne => true,
        _ => dtype != DType::Bool,
    }
}

/// The domain of a reduction. Bool sums and products are the core's business (it casts to an
/// integer first); integer means need a float output, so the core casts before calling.
pub fn reduce_contains(op: ReduceOp, dtype: DType) -> bool {
    match op {
        ReduceOp::Sum | ReduceOp::Prod => dtype != DType::Bool,
        ReduceOp::Mean => dtype.is_float(),
        ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_domain() {
        for kind in OpKind::all() {
            assert!(DType::ALL.into_iter().any(|d| contains(kind, d)), "{:?} has an empty domain", kind.name());
        }
        assert!(!contains(OpKind(0x9999), DType::F32));
    }

    #[test]
    fn domains_follow_the_op_definitions() {
        assert!(contains(OpKind::unary(UnaryOp::Not), DType::Bool));
        assert!(!contains(OpKind::unary(UnaryOp::Not), DType::F32));
        assert!(!contains(OpKind::unary(UnaryOp::Neg), DType::U8));
        assert!(contains(OpKind::binary_scalar(BinaryOp::Eq), DType::Bool));
        assert!(!contains(OpKind::binary(BinaryOp::Add), DType::Bool));
        assert!(!contains(OpKind::reduce(ReduceOp::Mean), DType::I64));
        assert!(contains(Op::Matmul.kind(), DType::I32) && !contains(Op::Matmul.kind(), DType::U8));
        assert!(contains(Op::CumSum { dim: 0 }.kind(), DType::I64));
        assert!(!contains(Op::CumSum { dim: 0 }.kind(), DType::Bool));
        assert!(contains(Op::Softmax.kind(), DType::BF16) && !contains(Op::Softmax.kind(), DType::I64));
        assert_eq!(claims(&[Op::RmsNorm { eps: 0.0 }]).len(), 4);
    }
}
