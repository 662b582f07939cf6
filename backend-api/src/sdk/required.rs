//! The required set: the `(op, dtype)` pairs a backend must claim for the core's tensors,
//! autograd and training to work in a dtype.
//!
//! The core has two kinds of ops. For the fused ones (softmax, the norms, attention,
//! convolution, pooling, cross-entropy, dropout, AdamW, ...) it checks the claim first and
//! computes the same function from other ops when the backend does not claim it, so none of
//! them is required. Every other op it simply issues, and an unclaimed one fails the user's
//! call. Of those, the required set is what the basic workflow issues, read from the core:
//! making tensors, copying and converting them, arithmetic, reductions, matmul, their
//! gradients, a loss and an optimizer step. It is grouped by what needs each pair
//! ([`groups`]), and a pair may serve several groups; [`pairs`] is their union.
//!
//! The set is defined for the float dtypes ([`DType::FLOATS`]): autograd differentiates only
//! floats, so there is no training to support in an integer or bool dtype. A few pairs in it
//! are in another dtype than the one trained in (comparisons write bool masks, which the core
//! casts back). Ops outside the set are still needed by the functions that use them: `exp` by
//! `exp` and by the composite softmax, the index ops by embeddings and by cross-entropy's
//! targets, `arange` and `where` by causal masks, and so on.
//!
//! Layers of `genesis::nn` are created in f32 and converted afterwards, so building one
//! directly on a device for another dtype also uses `fill`, `rand_uniform`, `rand_normal`,
//! `copy` and `cast` in f32 (all in f32's set).
//!
//! The conformance harness reports, for every float dtype, whether a backend's claims cover
//! this set and lists what is missing; a backend can check the same in its own tests with
//! [`missing`].

use crate::{BinaryOp, Capability, DType, Op, OpKind, ReduceOp, UnaryOp};

/// Part of the required set: what in the core needs it, and its pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// A short name: `tensors`, `arithmetic`, `reductions`, `matmul`, `autograd` or
    /// `training`.
    pub name: &'static str,
    /// What in the core issues these pairs, in one sentence.
    pub why: &'static str,
    /// The pairs, as capabilities name them: an op and the dtype of its first input (of its
    /// output when it has none).
    pub pairs: Vec<(OpKind, DType)>,
}

/// The groups of the required set for training in `dtype`; empty for a dtype that is not a
/// float (see the module documentation).
///
/// - `tensors`: `zeros`, `ones`, `full` and the `*_like` tensors are a `fill`; contiguous
///   copies of views, `clone`, `cat` and `stack` are a `copy`; `to_dtype`, and reading values
///   back as another type (as printing does), are a `cast` from the dtype; `rand`, `randn`
///   and the initializers of `genesis::nn::init` are `rand_uniform` and `rand_normal`.
/// - `arithmetic`: the operators `+ - * /` between tensors and with a scalar (the scalar
///   forms are ops of their own), and negation.
/// - `reductions`: `sum`, `max`, `min`, `prod`, `argmax` and `argmin`, which the core cannot
///   compute any other way (`mean`, `var` and `std` are a sum and a division; the core never
///   issues `mean`).
/// - `matmul`: `matmul` and linear layers; its gradient is two more matmuls on transposed
///   views.
/// - `autograd`: a backward pass is seeded with ones (`fill`), accumulates gradients with
///   `add`, applies the chain rule with `mul`, `div` and `neg`, and sums a gradient back to
///   its operand's shape after broadcasting (`sum`); the gradient of `max` and `min` finds
///   the extremes with `eq` and casts that bool mask to the dtype (`cast` under bool) to share
///   the gradient among ties.
/// - `training`: `mse_loss` squares the error (`square`); SGD (with momentum), Adam and
///   AdamW keep their state in zero-filled tensors (`fill`) and a clone of the first gradient
///   (`copy`), update the parameters in place with tensor and scalar arithmetic, and Adam's
///   denominator is a square root (`sqrt`). This is the optimizers' own update, which the core
///   runs when the backend claims no fused `adamw`.
pub fn groups(dtype: DType) -> Vec<Group> {
    if !dtype.is_float() {
        return Vec::new();
    }
    let d = |kind: OpKind| (kind, dtype);
    let unary = |op: UnaryOp| d(OpKind::unary(op));
    let binary = |op: BinaryOp| d(OpKind::binary(op));
    let scalar = |op: BinaryOp| d(OpKind::binary_scalar(op));
    let reduce = |op: ReduceOp| d(OpKind::reduce(op));
    let fill = d(Op::Fill { value: 0.0 }.kind());
    let copy = d(Op::Copy.kind());
    let cast = d(Op::Cast.kind());
    use BinaryOp::{Add, Div, Mul, Sub};
    vec![
        Group {
            name: "tensors",
            why: "zeros/ones/full (fill), contiguous copies and clones (copy), to_dtype and reading values back \
                  (cast), rand/randn and parameter initialization (rand_uniform, rand_normal)",
            pairs: vec![
                fill,
                copy,
                cast,
                d(Op::RandUniform { seed: 0, offset: 0, low: 0.0, high: 0.0 }.kind()),
                d(Op::RandNormal { seed: 0, offset: 0, mean: 0.0, std: 0.0 }.kind()),
            ],
        },
        Group {
            name: "arithmetic",
            why: "the operators + - * / between tensors and with scalars, and negation",
            pairs: vec![
                binary(Add),
                binary(Sub),
                binary(Mul),
                binary(Div),
                scalar(Add),
                scalar(Sub),
                scalar(Mul),
                scalar(Div),
                unary(UnaryOp::Neg),
            ],
        },
        Group {
            name: "reductions",
            why: "the reductions the core cannot build from other ops (mean, var and std are a sum and a division)",
            pairs: vec![
                reduce(ReduceOp::Sum),
                reduce(ReduceOp::Max),
                reduce(ReduceOp::Min),
                reduce(ReduceOp::Prod),
                reduce(ReduceOp::ArgMax),
                reduce(ReduceOp::ArgMin),
            ],
        },
        Group {
            name: "matmul",
            why: "matmul and linear layers, forward and backward",
            pairs: vec![d(Op::Matmul.kind())],
        },
        Group {
            name: "autograd",
            why: "seeding (fill), accumulating (add) and chaining (mul, div, neg) gradients, summing them back \
                  after broadcasting (sum), and the gradient of max and min (eq, then a cast of the bool mask)",
            pairs: vec![
                fill,
                binary(Add),
                binary(Mul),
                binary(Div),
                unary(UnaryOp::Neg),
                reduce(ReduceOp::Sum),
                binary(BinaryOp::Eq),
                (Op::Cast.kind(), DType::Bool),
            ],
        },
        Group {
            name: "training",
            why: "mse_loss (square) and the updates of SGD, Adam and AdamW without a fused adamw: state in \
                  zero-filled tensors and clones, in-place arithmetic, Adam's square root (sqrt)",
            pairs: vec![
                unary(UnaryOp::Square),
                unary(UnaryOp::Sqrt),
                fill,
                copy,
                binary(Add),
                binary(Sub),
                binary(Mul),
                binary(Div),
                scalar(Add),
                scalar(Mul),
                scalar(Div),
                unary(UnaryOp::Neg),
            ],
        },
    ]
}

/// The required set for training in `dtype`: the union of [`groups`], each pair once, in the
/// order the groups first list them. Empty for a dtype that is not a float.
pub fn pairs(dtype: DType) -> Vec<(OpKind, DType)> {
    let mut all: Vec<(OpKind, DType)> = Vec::new();
    for pair in groups(dtype).into_iter().flat_map(|g| g.pairs) {
        if !all.contains(&pair) {
            all.push(pair);
        }
    }
    all
}

/// The pairs of [`pairs`]`(dtype)` that `capabilities` does not claim, in the same order:
/// empty when a backend with these capabilities covers the required set for `dtype`.
pub fn missing(dtype: DType, capabilities: &[Capability]) -> Vec<(OpKind, DType)> {
    pairs(dtype)
        .into_iter()
        .filter(|&(op, d)| !capabilities.iter().any(|c| c.op == op && c.dtype == d as u32))
        .collect()
}

/// A pair as reports print it: the op's name, with the dtype in parentheses when it is not
/// `dtype` (`"add"`, `"cast(bool)"` for the set of f32).
pub fn pair_name((op, d): (OpKind, DType), dtype: DType) -> String {
    let name = op.name().unwrap_or("unknown");
    if d == dtype {
        name.to_string()
    } else {
        format!("{name}({d})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sdk::domain;

    #[test]
    fn the_set_is_defined_for_floats_only() {
        for dtype in DType::FLOATS {
            assert_eq!(pairs(dtype).len(), 25, "{dtype}");
        }
        for dtype in [DType::I64, DType::I32, DType::U8, DType::Bool] {
            assert!(groups(dtype).is_empty() && pairs(dtype).is_empty(), "{dtype}");
        }
    }

    #[test]
    fn every_pair_is_inside_its_ops_domain() {
        for dtype in DType::FLOATS {
            for (op, d) in pairs(dtype) {
                assert!(domain::contains(op, d), "{} {d} is outside its domain", pair_name((op, d), dtype));
            }
        }
    }

    #[test]
    fn no_fused_op_is_required() {
        // The core computes these from primitives when they are not claimed.
        let fused = [
            Op::Softmax.kind(),
            Op::AdamW { lr: 0.0, beta1: 0.0, beta2: 0.0, eps: 0.0, weight_decay: 0.0, step: 0 }.kind(),
            Op::Dropout { seed: 0, offset: 0, p: 0.0 }.kind(),
            OpKind::reduce(ReduceOp::Mean),
        ];
        let set = pairs(DType::F32);
        for kind in fused {
            assert!(set.iter().all(|&(op, _)| op != kind), "{:?} is required", kind.name());
        }
    }

    #[test]
    fn groups_list_each_pair_once() {
        for g in groups(DType::F64) {
            let mut seen = Vec::new();
            for p in &g.pairs {
                assert!(!seen.contains(p), "{} lists {} twice", g.name, pair_name(*p, DType::F64));
                seen.push(*p);
            }
            assert!(!g.why.is_empty());
        }
    }

    #[test]
    fn missing_names_what_is_not_claimed() {
        let claim = |(op, d): (OpKind, DType)| Capability { op, dtype: d as u32 };
        assert_eq!(missing(DType::F32, &[]), pairs(DType::F32));
        let all: Vec<Capability> = pairs(DType::F32).into_iter().map(claim).collect();
        assert!(missing(DType::F32, &all).is_empty());
        // Claims in f32 do not cover f16.
        assert_eq!(missing(DType::F16, &all).len(), 24, "only cast(bool) is shared");
        let without_sqrt: Vec<Capability> =
            all.iter().copied().filter(|c| c.op != OpKind::unary(UnaryOp::Sqrt)).collect();
        let gap = missing(DType::F32, &without_sqrt);
        assert_eq!(gap, vec![(OpKind::unary(UnaryOp::Sqrt), DType::F32)]);
        assert_eq!(pair_name(gap[0], DType::F32), "sqrt");
        assert_eq!(pair_name((Op::Cast.kind(), DType::Bool), DType::F32), "cast(bool)");
    }
}
