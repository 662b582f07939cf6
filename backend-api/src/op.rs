//! The operations a backend can run, grouped in families of open enums.
//!
//! On the wire an operation is a [`RawOp`]: a `u32` kind code (family in the high byte of the
//! low half, member in the low byte) plus a fixed block of attributes. [`Op`] is the typed
//! form both sides use; [`Op::encode`] and [`Op::decode`] are the only places that know the
//! attribute slots. A kind code a receiver does not know is refused with `Unsupported`, which
//! is what lets a minor version add operations.
//!
//! Conventions shared by every op (normative):
//! - Inputs are read-only; outputs are written and may not overlap each other or the inputs
//!   unless the op says "in place".
//! - Broadcasting is resolved by the core: inputs arrive with the output's shape and stride 0
//!   on broadcast dims.
//! - "last dim" ops (softmax, norms, cross-entropy) treat all leading dims as rows.
//! - f16/bf16 reductions and contractions accumulate in f32.

use crate::error::{BackendError, Result};
use abi_stable::StableAbi;

macro_rules! open_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $code:literal => $text:literal,)* }) => {
        $(#[$meta])*
        #[repr(u32)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vmeta])* $variant = $code,)* }

        impl $name {
            /// Every member of this interface version.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];
            /// The member for a code, if this version knows it.
            pub fn from_code(code: u32) -> Option<$name> {
                match code { $($code => Some($name::$variant),)* _ => None }
            }
            /// A short lowercase name for reports.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }
            // The name of the op with a scalar operand (only binary ops have one; a static
            // string so that naming an op never allocates on the launch path).
            #[allow(dead_code)]
            fn scalar_name(self) -> &'static str {
                match self { $($name::$variant => concat!($text, "_scalar"),)* }
            }
        }
    };
}

open_enum! {
    /// Elementwise functions of one operand. Output dtype equals input dtype except `Not`
    /// (bool in, bool out) and `IsNan` (any in, bool out).
    UnaryOp {
        /// `-x`
        Neg = 0 => "neg",
        /// `|x|`
        Abs = 1 => "abs",
        /// `e^x`
        Exp = 2 => "exp",
        /// natural logarithm
        Log = 3 => "log",
        /// square root
        Sqrt = 4 => "sqrt",
        /// `1/sqrt(x)`
        Rsqrt = 5 => "rsqrt",
        /// sine
        Sin = 6 => "sin",
        /// cosine
        Cos = 7 => "cos",
        /// hyperbolic tangent
        Tanh = 8 => "tanh",
        /// `1/(1+e^-x)`
        Sigmoid = 9 => "sigmoid",
        /// `max(x, 0)`, NaN propagates
        Relu = 10 => "relu",
        /// `x*Φ(x)` with the exact erf
        Gelu = 11 => "gelu",
        /// the tanh approximation of GELU
        GeluTanh = 12 => "gelu_tanh",
        /// `x*sigmoid(x)`
        Silu = 13 => "silu",
        /// `1/x`
        Recip = 14 => "reciprocal",
        /// `x*x`
        Square = 15 => "square",
        /// -1, 0 or 1 (NaN stays NaN)
        Sign = 16 => "sign",
        /// round toward -inf
        Floor = 17 => "floor",
        /// round toward +inf
        Ceil = 18 => "ceil",
        /// round half to even
        Round = 19 => "round",
        /// error function
        Erf = 20 => "erf",
        /// `ln(1+x)`
        Log1p = 21 => "log1p",
        /// `e^x - 1`
        Expm1 = 22 => "expm1",
        /// logical not (bool)
        Not = 23 => "logical_not",
        /// NaN test, bool output
        IsNan = 24 => "isnan",
    }
}

open_enum! {
    /// Elementwise functions of two operands of one dtype. Comparisons and logical ops write
    /// bool; the rest write the operands' dtype.
    BinaryOp {
        /// `a + b`
        Add = 0 => "add",
        /// `a - b`
        Sub = 1 => "sub",
        /// `a * b`
        Mul = 2 => "mul",
        /// `a / b` (true division for floats, truncation for integers)
        Div = 3 => "div",
        /// `a ^ b`
        Pow = 4 => "pow",
        /// larger of the two, NaN propagates
        Maximum = 5 => "maximum",
        /// smaller of the two, NaN propagates
        Minimum = 6 => "minimum",
        /// remainder with the sign of the divisor (Python's `%`)
        Remainder = 7 => "remainder",
        /// `a == b`
        Eq = 8 => "eq",
        /// `a != b`
        Ne = 9 => "ne",
        /// `a < b`
        Lt = 10 => "lt",
        /// `a <= b`
        Le = 11 => "le",
        /// `a > b`
        Gt = 12 => "gt",
        /// `a >= b`
        Ge = 13 => "ge",
        /// logical and (non-zero is true)
        And = 14 => "logical_and",
        /// logical or (non-zero is true)
        Or = 15 => "logical_or",
    }
}

impl BinaryOp {
    /// True when the output is bool.
    pub fn is_predicate(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq
                | BinaryOp::Ne
                | BinaryOp::Lt
                | BinaryOp::Le
                | BinaryOp::Gt
                | BinaryOp::Ge
                | BinaryOp::And
                | BinaryOp::Or
        )
    }
}

open_enum! {
    /// Reductions. The reduced axes are those where the output (same rank as the input) has
    /// size 1 and the input does not; an empty input reduces to the op's identity (sum 0,
    /// prod 1) or is an error for max/min/arg* as in PyTorch. Arg reductions reduce one axis,
    /// write i64 and pick the first index on ties and the first NaN.
    ReduceOp {
        /// sum
        Sum = 0 => "sum",
        /// arithmetic mean
        Mean = 1 => "mean",
        /// maximum, NaN propagates
        Max = 2 => "max",
        /// minimum, NaN propagates
        Min = 3 => "min",
        /// product
        Prod = 4 => "prod",
        /// index of the maximum
        ArgMax = 5 => "argmax",
        /// index of the minimum
        ArgMin = 6 => "argmin",
    }
}

/// Collective operations across devices of one backend.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveOp {
    /// Every rank ends with the sum of all inputs.
    AllReduceSum = 0,
    /// Every rank ends with rank 0's input.
    Broadcast = 1,
    /// Every rank ends with the inputs of all ranks concatenated along dim 0.
    AllGather = 2,
    /// Rank r ends with chunk r (along dim 0) of the sum of all inputs.
    ReduceScatterSum = 3,
}

impl CollectiveOp {
    /// Every collective of this interface version, in wire-code order.
    pub const ALL: [CollectiveOp; 4] =
        [CollectiveOp::AllReduceSum, CollectiveOp::Broadcast, CollectiveOp::AllGather, CollectiveOp::ReduceScatterSum];

    /// The op for a wire code.
    pub fn from_code(code: u32) -> Option<CollectiveOp> {
        Self::ALL.get(code as usize).copied()
    }

    /// The name in messages and reports (`"all_reduce_sum"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllReduceSum => "all_reduce_sum",
            CollectiveOp::Broadcast => "broadcast",
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::ReduceScatterSum => "reduce_scatter_sum",
        }
    }
}

/// Window geometry of 2-D convolution and pooling, (height, width) pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window2d {
    /// Kernel size (pooling only; convolution reads it from the weight).
    pub kernel: [i64; 2],
    /// Step between windows.
    pub stride: [i64; 2],
    /// Zero (conv, avg pool) or -inf (max pool) padding on each side.
    pub padding: [i64; 2],
    /// Spacing between kernel taps.
    pub dilation: [i64; 2],
}

/// One operation with its attributes. Operands are listed as `inputs -> outputs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// `[x] -> [y]`, see [`UnaryOp`].
    Unary(UnaryOp),
    /// `[a, b] -> [y]`, see [`BinaryOp`].
    Binary(BinaryOp),
    /// `[a] -> [y]` with `b` a scalar; `scalar_first` computes `op(scalar, a)`.
    BinaryScalar {
        /// The operation.
        op: BinaryOp,
        /// The scalar operand, converted to the tensor's dtype first.
        scalar: f64,
        /// True for `op(scalar, a)`.
        scalar_first: bool,
    },
    /// `[x] -> [y]`, `min(max(x, min), max)`; NaN propagates.
    Clamp {
        /// Lower bound (`-inf` for none).
        min: f64,
        /// Upper bound (`+inf` for none).
        max: f64,
    },
    /// `[cond(bool), a, b] -> [y]`, `cond ? a : b`.
    Where,
    /// `[x] -> [y]`, see [`ReduceOp`].
    Reduce(ReduceOp),
    /// `[x] -> [y]`, same shape and dtype, any strides: the strided copy.
    Copy,
    /// `[x] -> [y]`, same shape, dtype converted (floats to ints truncate toward zero,
    /// to bool is `!= 0`).
    Cast,
    /// `[] -> [y]`, every element set to `value`.
    Fill {
        /// The value, converted to the output dtype.
        value: f64,
    },
    /// `[] -> [y]` (rank 1), `y[i] = start + i*step`.
    Arange {
        /// First value.
        start: f64,
        /// Increment.
        step: f64,
    },
    /// `[a (.., m, k), b (.., k, n)] -> [y (.., m, n)]`; batch dims equal (broadcast ones have
    /// stride 0); transposes arrive as strides.
    Matmul,
    /// `[x, index(i64)] -> [y]`, `y[..i..] = x[..index[..i..]..]` along `dim`.
    Gather {
        /// The indexed dimension.
        dim: u32,
    },
    /// `[src, index(i64)] -> [y]` in place: `y[..index[..i..]..] += src[..i..]` along `dim`.
    ScatterAdd {
        /// The indexed dimension.
        dim: u32,
    },
    /// `[x, index(i64, rank 1)] -> [y]`, rows of `x` along `dim` picked by `index`.
    IndexSelect {
        /// The indexed dimension.
        dim: u32,
    },
    /// `[src, index(i64, rank 1)] -> [y]` in place: `y.select(dim, index[i]) += src.select(dim, i)`.
    IndexAdd {
        /// The indexed dimension.
        dim: u32,
    },
    /// `[x] -> [y]`, inclusive prefix sum along `dim`.
    CumSum {
        /// The scanned dimension.
        dim: u32,
    },
    /// `[] -> [y]` uniform in `[low, high)` from Philox4x32-10 at `(seed, offset)`: element
    /// `i` (row-major) is `low + (high-low)*u` computed in f64 and rounded to the dtype, with
    /// `u` = `sdk::philox::uniform_f64` for f64 outputs and `uniform_f32` otherwise.
    RandUniform {
        /// Philox key.
        seed: u64,
        /// Philox counter start, in 128-bit blocks.
        offset: u64,
        /// Inclusive lower bound.
        low: f64,
        /// Exclusive upper bound.
        high: f64,
    },
    /// `[] -> [y]` normal(mean, std) from Philox4x32-10 at `(seed, offset)`: element `i` is
    /// `mean + std*sdk::philox::normal_f64(seed, offset, i)` in f64, rounded to the dtype.
    RandNormal {
        /// Philox key.
        seed: u64,
        /// Philox counter start, in 128-bit blocks.
        offset: u64,
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// `[x] -> [y]`, `y = x * keep / (1-p)` computed in the compute type, with element `i`
    /// kept when `u >= p` (compared in f64), `u` drawn as in `RandUniform` for y's dtype.
    /// The same call on the gradient is the backward.
    Dropout {
        /// Philox key.
        seed: u64,
        /// Philox counter start.
        offset: u64,
        /// Drop probability in `[0, 1)`.
        p: f64,
    },
    /// `[x] -> [y]`, softmax over the last dim; an all `-inf` row gives NaN.
    Softmax,
    /// `[x] -> [y]`, log-softmax over the last dim.
    LogSoftmax,
    /// `[y, dy] -> [dx]` given the softmax output `y`.
    SoftmaxBackward,
    /// `[y, dy] -> [dx]` given the log-softmax output `y`.
    LogSoftmaxBackward,
    /// `[x, weight, bias] -> [y, mean(f32), rstd(f32)]` over the last dim; `mean` and `rstd`
    /// have the leading dims of `x` (`rstd = 1/sqrt(var + eps)`, biased variance).
    LayerNorm {
        /// Added to the variance.
        eps: f64,
    },
    /// `[dy, x, weight, mean, rstd] -> [dx, dweight, dbias]`.
    LayerNormBackward,
    /// `[x, weight] -> [y, rstd(f32)]` over the last dim, `y = x * rstd * weight` with
    /// `rstd = 1/sqrt(mean(x²) + eps)` of shape `x.shape[..-1]`.
    RmsNorm {
        /// Added to the mean square.
        eps: f64,
    },
    /// `[dy, x, weight, rstd] -> [dx, dweight]`.
    RmsNormBackward,
    /// `[x (b, h, s, d), cos (s, d/2), sin (s, d/2)] -> [y]`, rotating pairs `(i, i+d/2)`
    /// (the Hugging Face "rotate half" layout): `y_i = x_i cos - x_{i+d/2} sin`,
    /// `y_{i+d/2} = x_{i+d/2} cos + x_i sin`; `inverse` rotates by `-θ` (the backward).
    Rotary {
        /// Rotate by the negative angle.
        inverse: bool,
    },
    /// `[q (b, hq, s, d), k (b, hk, t, d), v (b, hk, t, d)] -> [o (b, hq, s, d), lse(f32, b, hq, s)]`
    /// with `hq` a multiple of `hk` (grouped-query: query head `h` reads kv head
    /// `h / (hq/hk)`); `lse` is the log-sum-exp of the scaled, masked scores of each query. A
    /// fully masked row gives NaN.
    Attention {
        /// Mask keys after the query position (bottom-right aligned when `t > s`).
        causal: bool,
        /// Multiplies `q·k`; usually `1/sqrt(d)`.
        scale: f64,
    },
    /// `[q, k, v, o, lse, do] -> [dq, dk, dv]`.
    AttentionBackward {
        /// As in the forward.
        causal: bool,
        /// As in the forward.
        scale: f64,
    },
    /// `[logits (n, c), target(i64, n)] -> [loss(f32, n), lse(f32, n)]` per row:
    /// `loss = (1-ε)(lse - x_t) + ε(lse - mean_j x_j)` with ε the label smoothing; rows whose
    /// target is `ignore_index` get loss 0; any other target outside `[0, c)` is an error.
    CrossEntropy {
        /// Target value that contributes nothing.
        ignore_index: i64,
        /// Label smoothing in `[0, 1)`.
        label_smoothing: f64,
    },
    /// `[logits, target, lse, dloss(f32, n)] -> [dlogits]`,
    /// `dlogits = dloss * (softmax - (1-ε) onehot(t) - ε/c)`, zero on ignored rows.
    CrossEntropyBackward {
        /// As in the forward.
        ignore_index: i64,
        /// As in the forward.
        label_smoothing: f64,
    },
    /// Multi-tensor AdamW, in place, PyTorch's update rule. `inputs = [grad_0, .., grad_n-1]`,
    /// `outputs = [param_0, exp_avg_0, exp_avg_sq_0, param_1, ..]` (moments in the param's
    /// dtype or f32); `step` counts from 1:
    /// `p *= 1 - lr·wd; m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²;
    /// p -= lr/(1-β1^step) · m / (sqrt(v)/sqrt(1-β2^step) + eps)`.
    AdamW {
        /// Learning rate.
        lr: f64,
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Denominator term.
        eps: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
        /// The step number after this update (bias correction).
        step: u64,
    },
    /// `[x (n, c, h, w), weight (o, c/groups, kh, kw)]` or with a third input `bias (o)`
    /// `-> [y (n, o, oh, ow)]`, zero padding, `oh = (h + 2p - d(kh-1) - 1)/s + 1`.
    Conv2d {
        /// Stride, padding and dilation (`kernel` unused).
        window: Window2d,
        /// Channel groups.
        groups: u32,
    },
    /// `[dy, weight] -> [dx]`.
    Conv2dBackwardInput {
        /// As in the forward.
        window: Window2d,
        /// As in the forward.
        groups: u32,
    },
    /// `[dy, x] -> [dweight]` (and `[dbias]` as a second output when given).
    Conv2dBackwardWeight {
        /// As in the forward.
        window: Window2d,
        /// As in the forward.
        groups: u32,
    },
    /// `[x (n, c, h, w)] -> [y, argmax(i64)]`, -inf padding, floor output size; `argmax` is the
    /// flat index `ih*w + iw` of the chosen input element in its plane (PyTorch's convention);
    /// NaN wins.
    MaxPool2d {
        /// Kernel, stride, padding, dilation.
        window: Window2d,
    },
    /// `[dy, argmax] -> [dx]`.
    MaxPool2dBackward {
        /// As in the forward.
        window: Window2d,
    },
    /// `[x (n, c, h, w)] -> [y]`, zero padding that counts toward the divisor
    /// (`count_include_pad`), floor output size.
    AvgPool2d {
        /// Kernel, stride, padding.
        window: Window2d,
    },
    /// `[dy] -> [dx]`.
    AvgPool2dBackward {
        /// As in the forward.
        window: Window2d,
    },
}

/// An op kind: the wire code of an [`Op`] without its attributes. Used in capability lists.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpKind(pub u32);

/// Code families, high byte of the kind code.
mod family {
    pub const UNARY: u32 = 0x100;
    pub const BINARY: u32 = 0x200;
    pub const BINARY_SCALAR: u32 = 0x300;
    pub const REDUCE: u32 = 0x400;
    pub const OTHER: u32 = 0x500;
}

// Members of the OTHER family, in the order of the `Op` variants. Never reorder: append.
const OTHER_NAMES: &[&str] = &[
    "clamp",
    "where",
    "copy",
    "cast",
    "fill",
    "arange",
    "matmul",
    "gather",
    "scatter_add",
    "index_select",
    "index_add",
    "cumsum",
    "rand_uniform",
    "rand_normal",
    "dropout",
    "softmax",
    "log_softmax",
    "softmax_backward",
    "log_softmax_backward",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
    "rotary",
    "attention",
    "attention_backward",
    "cross_entropy",
    "cross_entropy_backward",
    "adamw",
    "conv2d",
    "conv2d_backward_input",
    "conv2d_backward_weight",
    "max_pool2d",
    "max_pool2d_backward",
    "avg_pool2d",
    "avg_pool2d_backward",
];

impl OpKind {
    /// The kind of a unary op.
    pub const fn unary(op: UnaryOp) -> OpKind {
        OpKind(family::UNARY + op as u32)
    }
    /// The kind of a binary op.
    pub const fn binary(op: BinaryOp) -> OpKind {
        OpKind(family::BINARY + op as u32)
    }
    /// The kind of a binary op with a scalar operand.
    pub const fn binary_scalar(op: BinaryOp) -> OpKind {
        OpKind(family::BINARY_SCALAR + op as u32)
    }
    /// The kind of a reduction.
    pub const fn reduce(op: ReduceOp) -> OpKind {
        OpKind(family::REDUCE + op as u32)
    }

    /// Every kind this interface version defines.
    pub fn all() -> Vec<OpKind> {
        let mut kinds: Vec<OpKind> = UnaryOp::ALL.iter().map(|&u| OpKind::unary(u)).collect();
        kinds.extend(BinaryOp::ALL.iter().map(|&b| OpKind::binary(b)));
        kinds.extend(BinaryOp::ALL.iter().map(|&b| OpKind::binary_scalar(b)));
        kinds.extend(ReduceOp::ALL.iter().map(|&r| OpKind::reduce(r)));
        kinds.extend((0..OTHER_NAMES.len() as u32).map(|i| OpKind(family::OTHER + i)));
        kinds
    }

    /// A readable name (`"add"`, `"add_scalar"`, `"softmax"`); `None` for unknown codes.
    pub fn name(self) -> Option<&'static str> {
        let (fam, member) = (self.0 & !0xff, self.0 & 0xff);
        match fam {
            family::UNARY => UnaryOp::from_code(member).map(UnaryOp::name),
            family::BINARY => BinaryOp::from_code(member).map(BinaryOp::name),
            family::BINARY_SCALAR => BinaryOp::from_code(member).map(BinaryOp::scalar_name),
            family::REDUCE => ReduceOp::from_code(member).map(ReduceOp::name),
            family::OTHER => OTHER_NAMES.get(member as usize).copied(),
            _ => None,
        }
    }

    /// The kind named `name`, as [`OpKind::name`] prints it.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::all().into_iter().find(|k| k.name() == Some(name))
    }
}

/// Attribute slots of a [`RawOp`]. Which slot means what is private to [`Op::encode`] and
/// [`Op::decode`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Default)]
pub struct OpAttrs {
    /// Float attributes.
    pub floats: [f64; 8],
    /// Integer attributes (u64 values are stored bit-cast).
    pub ints: [i64; 8],
}

/// The wire form of an [`Op`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq)]
pub struct RawOp {
    /// The [`OpKind`] code.
    pub kind: OpKind,
    /// Its attributes.
    pub attrs: OpAttrs,
}

fn window_ints(w: &Window2d, extra: i64) -> [i64; 8] {
    [
        w.kernel[0],
        w.kernel[1],
        w.stride[0],
        w.stride[1],
        w.padding[0],
        w.padding[1],
        w.dilation[0],
        w.dilation[1] + (extra << 32),
    ]
}

fn window_from(ints: &[i64; 8]) -> (Window2d, u32) {
    let w = Window2d {
        kernel: [ints[0], ints[1]],
        stride: [ints[2], ints[3]],
        padding: [ints[4], ints[5]],
        dilation: [ints[6], ints[7] & 0xffff_ffff],
    };
    (w, (ints[7] >> 32) as u32)
}

impl Op {
    /// This op's kind code.
    pub fn kind(&self) -> OpKind {
        self.encode().kind
    }

    /// A readable name for messages.
    pub fn name(&self) -> &'static str {
        self.kind().name().unwrap_or("unknown")
    }

    /// The wire form.
    pub fn encode(&self) -> RawOp {
        let mut a = OpAttrs::default();
        let other = |i: u32| OpKind(family::OTHER + i);
        let kind = match *self {
            Op::Unary(u) => OpKind::unary(u),
            Op::Binary(b) => OpKind::binary(b),
            Op::BinaryScalar { op, scalar, scalar_first } => {
                a.floats[0] = scalar;
                a.ints[0] = scalar_first as i64;
                OpKind::binary_scalar(op)
            }
            Op::Reduce(r) => OpKind::reduce(r),
            Op::Clamp { min, max } => {
                a.floats[..2].copy_from_slice(&[min, max]);
                other(0)
            }
            Op::Where => other(1),
            Op::Copy => other(2),
            Op::Cast => other(3),
            Op::Fill { value } => {
                a.floats[0] = value;
                other(4)
            }
            Op::Arange { start, step } => {
                a.floats[..2].copy_from_slice(&[start, step]);
                other(5)
            }
            Op::Matmul => other(6),
            Op::Gather { dim }
            | Op::ScatterAdd { dim }
            | Op::IndexSelect { dim }
            | Op::IndexAdd { dim }
            | Op::CumSum { dim } => {
                a.ints[0] = dim as i64;
                other(match self {
                    Op::Gather { .. } => 7,
                    Op::ScatterAdd { .. } => 8,
                    Op::IndexSelect { .. } => 9,
                    Op::IndexAdd { .. } => 10,
                    _ => 11,
                })
            }
            Op::RandUniform { seed, offset, low, high } | Op::RandNormal { seed, offset, mean: low, std: high } => {
                a.ints[..2].copy_from_slice(&[seed as i64, offset as i64]);
                a.floats[..2].copy_from_slice(&[low, high]);
                other(if matches!(self, Op::RandUniform { .. }) { 12 } else { 13 })
            }
            Op::Dropout { seed, offset, p } => {
                a.ints[..2].copy_from_slice(&[seed as i64, offset as i64]);
                a.floats[0] = p;
                other(14)
            }
            Op::Softmax => other(15),
            Op::LogSoftmax => other(16),
            Op::SoftmaxBackward => other(17),
            Op::LogSoftmaxBackward => other(18),
            Op::LayerNorm { eps } => {
                a.floats[0] = eps;
                other(19)
            }
            Op::LayerNormBackward => other(20),
            Op::RmsNorm { eps } => {
                a.floats[0] = eps;
                other(21)
            }
            Op::RmsNormBackward => other(22),
            Op::Rotary { inverse } => {
                a.ints[0] = inverse as i64;
                other(23)
            }
            Op::Attention { causal, scale } | Op::AttentionBackward { causal, scale } => {
                a.ints[0] = causal as i64;
                a.floats[0] = scale;
                other(if matches!(self, Op::Attention { .. }) { 24 } else { 25 })
            }
            Op::CrossEntropy { ignore_index, label_smoothing }
            | Op::CrossEntropyBackward { ignore_index, label_smoothing } => {
                a.ints[0] = ignore_index;
                a.floats[0] = label_smoothing;
                other(if matches!(self, Op::CrossEntropy { .. }) { 26 } else { 27 })
            }
            Op::AdamW { lr, beta1, beta2, eps, weight_decay, step } => {
                a.floats[..5].copy_from_slice(&[lr, beta1, beta2, eps, weight_decay]);
                a.ints[0] = step as i64;
                other(28)
            }
            Op::Conv2d { window, groups } => {
                a.ints = window_ints(&window, groups as i64);
                other(29)
            }
            Op::Conv2dBackwardInput { window, groups } => {
                a.ints = window_ints(&window, groups as i64);
                other(30)
            }
            Op::Conv2dBackwardWeight { window, groups } => {
                a.ints = window_ints(&window, groups as i64);
                other(31)
            }
            Op::MaxPool2d { window } => {
                a.ints = window_ints(&window, 0);
                other(32)
            }
            Op::MaxPool2dBackward { window } => {
                a.ints = window_ints(&window, 0);
                other(33)
            }
            Op::AvgPool2d { window } => {
                a.ints = window_ints(&window, 0);
                other(34)
            }
            Op::AvgPool2dBackward { window } => {
                a.ints = window_ints(&window, 0);
                other(35)
            }
        };
        RawOp { kind, attrs: a }
    }

    /// The typed form of a wire op; an unknown kind is `Unsupported`.
    pub fn decode(raw: &RawOp) -> Result<Op> {
        let unknown = || BackendError::unsupported(format!("unknown op kind {:#x}", raw.kind.0));
        let (fam, member) = (raw.kind.0 & !0xff, raw.kind.0 & 0xff);
        let (f, i) = (&raw.attrs.floats, &raw.attrs.ints);
        let dim = i[0] as u32;
        let (window, groups) = window_from(i);
        let op = match fam {
            family::UNARY => Op::Unary(UnaryOp::from_code(member).ok_or_else(unknown)?),
            family::BINARY => Op::Binary(BinaryOp::from_code(member).ok_or_else(unknown)?),
            family::BINARY_SCALAR => Op::BinaryScalar {
                op: BinaryOp::from_code(member).ok_or_else(unknown)?,
                scalar: f[0],
                scalar_first: i[0] != 0,
            },
            family::REDUCE => Op::Reduce(ReduceOp::from_code(member).ok_or_else(unknown)?),
            family::OTHER => match member {
                0 => Op::Clamp { min: f[0], max: f[1] },
                1 => Op::Where,
                2 => Op::Copy,
                3 => Op::Cast,
                4 => Op::Fill { value: f[0] },
                5 => Op::Arange { start: f[0], step: f[1] },
                6 => Op::Matmul,
                7 => Op::Gather { dim },
                8 => Op::ScatterAdd { dim },
                9 => Op::IndexSelect { dim },
                10 => Op::IndexAdd { dim },
                11 => Op::CumSum { dim },
                12 => Op::RandUniform { seed: i[0] as u64, offset: i[1] as u64, low: f[0], high: f[1] },
                13 => Op::RandNormal { seed: i[0] as u64, offset: i[1] as u64, mean: f[0], std: f[1] },
                14 => Op::Dropout { seed: i[0] as u64, offset: i[1] as u64, p: f[0] },
                15 => Op::Softmax,
                16 => Op::LogSoftmax,
                17 => Op::SoftmaxBackward,
                18 => Op::LogSoftmaxBackward,
                19 => Op::LayerNorm { eps: f[0] },
                20 => Op::LayerNormBackward,
                21 => Op::RmsNorm { eps: f[0] },
                22 => Op::RmsNormBackward,
                23 => Op::Rotary { inverse: i[0] != 0 },
                24 => Op::Attention { causal: i[0] != 0, scale: f[0] },
                25 => Op::AttentionBackward { causal: i[0] != 0, scale: f[0] },
                26 => Op::CrossEntropy { ignore_index: i[0], label_smoothing: f[0] },
                27 => Op::CrossEntropyBackward { ignore_index: i[0], label_smoothing: f[0] },
                28 => {
                    Op::AdamW { lr: f[0], beta1: f[1], beta2: f[2], eps: f[3], weight_decay: f[4], step: i[0] as u64 }
                }
                29 => Op::Conv2d { window, groups },
                30 => Op::Conv2dBackwardInput { window, groups },
                31 => Op::Conv2dBackwardWeight { window, groups },
                32 => Op::MaxPool2d { window },
                33 => Op::MaxPool2dBackward { window },
                34 => Op::AvgPool2d { window },
                35 => Op::AvgPool2dBackward { window },
                _ => return Err(unknown()),
            },
            _ => return Err(unknown()),
        };
        Ok(op)
    }
}

/// A claim that a device runs `op` on tensors of `dtype` (the dtype of the first input, or of
/// the output for ops without inputs).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Capability {
    /// The op kind.
    pub op: OpKind,
    /// A dtype code.
    pub dtype: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_unique_name_and_round_trips() {
        let kinds = OpKind::all();
        let mut names: Vec<&str> = kinds.iter().map(|k| k.name().expect("named")).collect();
        for k in &kinds {
            assert_eq!(OpKind::from_name(k.name().unwrap()), Some(*k));
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), kinds.len());
    }

    #[test]
    fn ops_round_trip_through_the_wire_form() {
        let window = Window2d { kernel: [3, 2], stride: [2, 1], padding: [1, 0], dilation: [1, 2] };
        let ops = [
            Op::Unary(UnaryOp::Gelu),
            Op::BinaryScalar { op: BinaryOp::Sub, scalar: 2.5, scalar_first: true },
            Op::Reduce(ReduceOp::ArgMin),
            Op::RandNormal { seed: u64::MAX, offset: 7, mean: 1.0, std: 2.0 },
            Op::AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, step: 3 },
            Op::Conv2d { window, groups: 4 },
            Op::MaxPool2dBackward { window },
            Op::CrossEntropyBackward { ignore_index: -100, label_smoothing: 0.1 },
        ];
        for op in ops {
            assert_eq!(Op::decode(&op.encode()).unwrap(), op);
        }
    }

    #[test]
    fn unknown_codes_are_unsupported() {
        for code in [0x1ff, 0x2ff, 0x5ff, 0x9900] {
            let raw = RawOp { kind: OpKind(code), attrs: OpAttrs::default() };
            assert_eq!(Op::decode(&raw).unwrap_err().kind, crate::ErrorKind::Unsupported);
        }
    }
}
