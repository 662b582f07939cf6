//! Capability lists from the ops' domains ([`Op::domain`], declared with each op): the
//! `(op, dtype)` pairs a backend claims when it runs an op on its whole domain, and the test
//! whether a pair is inside one.

use crate::{BinaryOp, DType, Op, OpAttrs, OpKind, RawOp, UnaryOp};

/// Whether `dtype` is in the domain of `kind` (false for a kind this version does not know).
pub fn contains(kind: OpKind, dtype: DType) -> bool {
    Op::decode(&RawOp { kind, attrs: OpAttrs::default() }).is_ok_and(|op| op.domain().contains(dtype))
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

/// Every index-family pair: gather, scatter-add, index-select, index-add and cumsum.
pub fn index_claims() -> Vec<(OpKind, DType)> {
    claims(&[
        Op::Gather { dim: 0 },
        Op::ScatterAdd { dim: 0 },
        Op::IndexSelect { dim: 0 },
        Op::IndexAdd { dim: 0 },
        Op::CumSum { dim: 0 },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReduceOp;

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
