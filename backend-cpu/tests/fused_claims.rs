//! The fused ops (softmax, norms, cross-entropy, AdamW, rotary, attention, convolution,
//! pooling) are claimed for the float dtypes only, and an unclaimed dtype is a clean
//! `Unsupported`.

mod common;

use common::fused::*;
use genesis_backend_api::{DType, Device, ErrorKind, Op, Window2d};

#[test]
fn fused_ops_are_claimed_for_float_dtypes_only() {
    let h = Harness::new();
    let caps = h.dev.capabilities();
    let w = Window2d::default();
    let ops = [
        Op::Softmax,
        Op::LogSoftmax,
        Op::SoftmaxBackward,
        Op::LogSoftmaxBackward,
        Op::LayerNorm { eps: 0.0 },
        Op::LayerNormBackward,
        Op::RmsNorm { eps: 0.0 },
        Op::RmsNormBackward,
        Op::Rotary { inverse: false },
        Op::Attention { causal: false, scale: 1.0 },
        Op::AttentionBackward { causal: false, scale: 1.0 },
        Op::CrossEntropy { ignore_index: 0, label_smoothing: 0.0 },
        Op::CrossEntropyBackward { ignore_index: 0, label_smoothing: 0.0 },
        Op::AdamW { lr: 0.0, beta1: 0.0, beta2: 0.0, eps: 0.0, weight_decay: 0.0, step: 1 },
        Op::Conv2d { window: w, groups: 1 },
        Op::Conv2dBackwardInput { window: w, groups: 1 },
        Op::Conv2dBackwardWeight { window: w, groups: 1 },
        Op::MaxPool2d { window: w },
        Op::MaxPool2dBackward { window: w },
        Op::AvgPool2d { window: w },
        Op::AvgPool2dBackward { window: w },
    ];
    for op in ops {
        for dtype in DType::ALL {
            let claimed = caps.iter().any(|c| c.op == op.kind() && c.dtype == dtype as u32);
            assert_eq!(claimed, dtype.is_float(), "{} for {dtype}", op.name());
        }
    }
    // Not claimed means a clean Unsupported.
    let x = h.input(I64, &[2, 3], Dense, &[0.0; 6]);
    let y = h.output(I64, &[2, 3], Dense);
    h.fails(Op::Softmax, &[&x], &[&y], ErrorKind::Unsupported);
    assert!(caps.iter().all(|c| c.op.name().is_some()));
}
