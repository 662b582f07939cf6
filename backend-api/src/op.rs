//! The operations a backend can run, grouped in families of open enums.
//!
//! On the wire an operation is a [`RawOp`]: a `u32` kind code (family in the high byte of the
//! low half, member in the low byte) plus a fixed block of attributes. [`Op`] is the typed
//! form both sides use; [`Op::encode`] and [`Op::decode`] are the only places that know the
//! attribute slots. A kind code a receiver does not know is refused with `Unsupported`, which
//! is what lets a minor version add operations.
//!
//! The conventions shared by every op are normative and stated in the crate documentation
//! (section "Operations"), where a backend author reads them.

use crate::dtype::DType;
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
        /// `a / b` (true division for floats, truncation for integers). An integer division or
        /// remainder by zero is an `InvalidArgument` error where the backend can tell before
        /// returning (the CPU does, as PyTorch's CPU ops raise); a device that would have to
        /// synchronize for it may write an unspecified value instead (CUDA, as PyTorch's CUDA).
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
        /// sum of the squares, accumulated as `sum` (floats; interface 1.10): a gradient
        /// norm's part in one pass, without a squared copy
        SumSquares = 7 => "sum_squares",
    }
}

open_enum! {
    /// Collective operations across devices of one backend.
    CollectiveOp {
        /// Every rank ends with the sum of all inputs.
        AllReduceSum = 0 => "all_reduce_sum",
        /// Every rank ends with rank 0's input.
        Broadcast = 1 => "broadcast",
        /// Every rank ends with the inputs of all ranks concatenated along dim 0.
        AllGather = 2 => "all_gather",
        /// Rank r ends with chunk r (along dim 0) of the sum of all inputs.
        ReduceScatterSum = 3 => "reduce_scatter_sum",
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

/// The dtypes an op is defined for: those of its first input, or of its output when it has
/// none (as in [`Capability`]). A backend claims pairs inside its ops' domains (all of them or
/// a subset); the core never issues a pair outside them (it casts first, for example bool to
/// i64 before a sum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// Every dtype.
    All,
    /// Every dtype but bool.
    NotBool,
    /// The float dtypes.
    Floats,
    /// The float dtypes and the signed integers (i64, i32).
    Signed,
    /// Bool only.
    Bool,
}

impl Domain {
    /// Whether `dtype` is in the domain.
    pub fn contains(self, dtype: DType) -> bool {
        match self {
            Domain::All => true,
            Domain::NotBool => dtype != DType::Bool,
            Domain::Floats => dtype.is_float(),
            Domain::Signed => dtype.is_float() || matches!(dtype, DType::I64 | DType::I32),
            Domain::Bool => dtype == DType::Bool,
        }
    }
}

impl UnaryOp {
    /// The dtypes this function is defined for.
    pub fn domain(self) -> Domain {
        match self {
            UnaryOp::Not => Domain::Bool,
            UnaryOp::IsNan => Domain::All,
            UnaryOp::Neg | UnaryOp::Sign => Domain::Signed,
            UnaryOp::Abs | UnaryOp::Square => Domain::NotBool,
            _ => Domain::Floats,
        }
    }
}

impl BinaryOp {
    /// The dtypes this function is defined for (tensor and scalar forms): equality and logic
    /// on every dtype, the rest on every dtype but bool.
    pub fn domain(self) -> Domain {
        match self {
            BinaryOp::And | BinaryOp::Or | BinaryOp::Eq | BinaryOp::Ne => Domain::All,
            _ => Domain::NotBool,
        }
    }
}

impl ReduceOp {
    /// The dtypes this reduction is defined for. Bool sums and products are the core's
    /// business (it casts to an integer first); an integer mean needs a float output, so the
    /// core casts before calling.
    pub fn domain(self) -> Domain {
        match self {
            ReduceOp::Sum | ReduceOp::Prod => Domain::NotBool,
            ReduceOp::Mean | ReduceOp::SumSquares => Domain::Floats,
            ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin => Domain::All,
        }
    }
}

/// Declares [`Op`] and its wire form in one place. Each member of the "other" family is one
/// entry: its doc, its attributes with the [`OpAttrs`] slot each travels in, its code, its
/// name and its [`Domain`]. The code is the member's index (a compile-time check): append, never reorder.
macro_rules! declare_ops {
    ($(
        $(#[$doc:meta])*
        $variant:ident $({ $($(#[$field_doc:meta])* $field:ident: $ty:ty => $slot:ident[$k:literal],)* })?
            = $code:literal => $name:literal in $domain:ident,
    )*) => {
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
            /// `[x] -> [y]`, see [`ReduceOp`].
            Reduce(ReduceOp),
            $($(#[$doc])* $variant $({ $($(#[$field_doc])* $field: $ty,)* })?,)*
        }

        /// Names of the "other" family, by member code.
        const OTHER_NAMES: &[&str] = &[$($name,)*];

        // Member codes are their positions in the table.
        const _: () = {
            let codes: &[u32] = &[$($code,)*];
            let mut i = 0;
            while i < codes.len() {
                assert!(codes[i] == i as u32, "op codes of the other family must count up from 0");
                i += 1;
            }
        };

        impl Op {
            /// The member code of an op of the "other" family, its attributes written to `a`.
            fn encode_other(&self, a: &mut OpAttrs) -> Option<u32> {
                match *self {
                    $(Op::$variant $({ $($field,)* })? => {
                        $($(slot::$slot::put(a, $k, $field);)*)?
                        Some($code)
                    })*
                    _ => None,
                }
            }

            /// The domain of an op of the "other" family.
            fn other_domain(&self) -> Option<Domain> {
                match self {
                    $(Op::$variant { .. } => Some(Domain::$domain),)*
                    _ => None,
                }
            }

            /// The op of the "other" family with member code `member`, attributes from `a`.
            fn decode_other(member: u32, a: &OpAttrs) -> Option<Op> {
                match member {
                    $($code => Some(Op::$variant $({ $($field: slot::$slot::get(a, $k),)* })?),)*
                    _ => None,
                }
            }
        }
    };
}

/// How attributes travel in [`OpAttrs`]: `float[k]` is `floats[k]`; `int[k]` is `ints[k]`
/// (bools as 0/1, unsigned values bit-cast); `window[0]` is a [`Window2d`] in `ints[0..8]`;
/// `high[k]` is a u32 in the high half of `ints[k]` (the groups of a convolution, beside the
/// last dilation).
mod slot {
    use super::{OpAttrs, Window2d};

    /// A value stored in an integer slot.
    pub trait IntAttr: Copy {
        fn to_slot(self) -> i64;
        fn from_slot(v: i64) -> Self;
    }
    impl IntAttr for bool {
        fn to_slot(self) -> i64 {
            self as i64
        }
        fn from_slot(v: i64) -> bool {
            v != 0
        }
    }
    // Unsigned values travel bit-cast, so u64::MAX round-trips through the i64 slot.
    macro_rules! int_attr {
        ($($t:ty),*) => {$(
            impl IntAttr for $t {
                fn to_slot(self) -> i64 {
                    self as i64
                }
                fn from_slot(v: i64) -> $t {
                    v as $t
                }
            }
        )*};
    }
    int_attr!(u32, u64, i64);

    pub mod float {
        use super::OpAttrs;
        pub fn put(a: &mut OpAttrs, k: usize, v: f64) {
            a.floats[k] = v;
        }
        pub fn get(a: &OpAttrs, k: usize) -> f64 {
            a.floats[k]
        }
    }

    pub mod int {
        use super::{IntAttr, OpAttrs};
        pub fn put<T: IntAttr>(a: &mut OpAttrs, k: usize, v: T) {
            a.ints[k] = v.to_slot();
        }
        pub fn get<T: IntAttr>(a: &OpAttrs, k: usize) -> T {
            T::from_slot(a.ints[k])
        }
    }

    pub mod window {
        use super::{OpAttrs, Window2d};
        pub fn put(a: &mut OpAttrs, k: usize, w: Window2d) {
            let values = [w.kernel, w.stride, w.padding, w.dilation];
            for (slot, v) in a.ints[k..k + 8].iter_mut().zip(values.iter().flatten()) {
                *slot = *v;
            }
        }
        pub fn get(a: &OpAttrs, k: usize) -> Window2d {
            let i = &a.ints[k..k + 8];
            Window2d {
                kernel: [i[0], i[1]],
                stride: [i[2], i[3]],
                padding: [i[4], i[5]],
                dilation: [i[6], i[7] & 0xffff_ffff],
            }
        }
    }

    pub mod high {
        use super::OpAttrs;
        pub fn put(a: &mut OpAttrs, k: usize, v: u32) {
            a.ints[k] += (v as i64) << 32;
        }
        pub fn get(a: &OpAttrs, k: usize) -> u32 {
            (a.ints[k] >> 32) as u32
        }
    }
}

declare_ops! {
    /// `[x] -> [y]`, `min(max(x, min), max)`; NaN propagates.
    Clamp {
        /// Lower bound (`-inf` for none).
        min: f64 => float[0],
        /// Upper bound (`+inf` for none).
        max: f64 => float[1],
    } = 0 => "clamp" in NotBool,
    /// `[cond(bool), a, b] -> [y]`, `cond ? a : b`. Its capability is keyed by the first
    /// input, the bool condition: a backend claims `(where, bool)` and refuses value dtypes it
    /// does not run with `Unsupported`.
    Where = 1 => "where" in All,
    /// `[x] -> [y]`, same shape and dtype, any strides: the strided copy.
    Copy = 2 => "copy" in All,
    /// `[x] -> [y]`, same shape, dtype converted: integer to integer keeps the low bits (wraps
    /// modulo 2^bits in two's complement, as PyTorch: i64 -55 to u8 is 201); float to integer
    /// truncates toward zero and saturates at the target's range, NaN giving 0 (PyTorch leaves
    /// out-of-range values undefined); to a float rounds to nearest even; to bool is `!= 0`.
    Cast = 3 => "cast" in All,
    /// `[] -> [y]`, every element set to `value`.
    Fill {
        /// The value, converted to the output dtype.
        value: f64 => float[0],
    } = 4 => "fill" in All,
    /// `[] -> [y]` (rank 1), `y[i] = start + i*step`.
    Arange {
        /// First value.
        start: f64 => float[0],
        /// Increment.
        step: f64 => float[1],
    } = 5 => "arange" in All,
    /// `[a (.., m, k), b (.., k, n)] -> [y (.., m, n)]`; batch dims equal (broadcast ones have
    /// stride 0); transposes arrive as strides. Widened (interface 1.13): `y` may be f32 when
    /// `a` and `b` are f16 or bf16 (the claimed dtype), the f32 sums stored without rounding to
    /// the operands' dtype (a weight's gradient under autocast).
    Matmul = 6 => "matmul" in Signed,
    /// `[x, index(i64)] -> [y]`, `y[..i..] = x[..index[..i..]..]` along `dim`.
    Gather {
        /// The indexed dimension.
        dim: u32 => int[0],
    } = 7 => "gather" in All,
    /// `[src, index(i64)] -> [y]` in place: `y[..index[..i..]..] += src[..i..]` along `dim`.
    ScatterAdd {
        /// The indexed dimension.
        dim: u32 => int[0],
    } = 8 => "scatter_add" in All,
    /// `[x, index(i64, rank 1)] -> [y]`, rows of `x` along `dim` picked by `index`.
    IndexSelect {
        /// The indexed dimension.
        dim: u32 => int[0],
    } = 9 => "index_select" in All,
    /// `[src, index(i64, rank 1)] -> [y]` in place: `y.select(dim, index[i]) += src.select(dim, i)`.
    IndexAdd {
        /// The indexed dimension.
        dim: u32 => int[0],
    } = 10 => "index_add" in All,
    /// `[x] -> [y]`, inclusive prefix sum along `dim`.
    CumSum {
        /// The scanned dimension.
        dim: u32 => int[0],
    } = 11 => "cumsum" in NotBool,
    /// `[] -> [y]` uniform in `[low, high)` from Philox4x32-10 at `(seed, offset)`: element
    /// `i` (row-major) is `low + (high-low)*u` computed in f64 and rounded to the dtype, with
    /// `u` = `sdk::philox::uniform_f64` for f64 outputs and `uniform_f32` otherwise.
    RandUniform {
        /// Philox key.
        seed: u64 => int[0],
        /// Philox counter start, in 128-bit blocks.
        offset: u64 => int[1],
        /// Inclusive lower bound.
        low: f64 => float[0],
        /// Exclusive upper bound.
        high: f64 => float[1],
    } = 12 => "rand_uniform" in Floats,
    /// `[] -> [y]` normal(mean, std) from Philox4x32-10 at `(seed, offset)`: element `i` is
    /// `mean + std*sdk::philox::normal_f64(seed, offset, i)` in f64, rounded to the dtype.
    RandNormal {
        /// Philox key.
        seed: u64 => int[0],
        /// Philox counter start, in 128-bit blocks.
        offset: u64 => int[1],
        /// Mean.
        mean: f64 => float[0],
        /// Standard deviation.
        std: f64 => float[1],
    } = 13 => "rand_normal" in Floats,
    /// `[x] -> [y]`, `y = x * keep / (1-p)` computed in the compute type, with element `i`
    /// kept when `u >= p` (compared in f64), `u` drawn as in `RandUniform` for y's dtype.
    /// The same call on the gradient is the backward.
    Dropout {
        /// Philox key.
        seed: u64 => int[0],
        /// Philox counter start.
        offset: u64 => int[1],
        /// Drop probability in `[0, 1)`.
        p: f64 => float[0],
    } = 14 => "dropout" in Floats,
    /// `[x] -> [y]`, softmax over the last dim; an all `-inf` row gives NaN.
    Softmax = 15 => "softmax" in Floats,
    /// `[x] -> [y]`, log-softmax over the last dim.
    LogSoftmax = 16 => "log_softmax" in Floats,
    /// `[y, dy] -> [dx]` given the softmax output `y`.
    SoftmaxBackward = 17 => "softmax_backward" in Floats,
    /// `[y, dy] -> [dx]` given the log-softmax output `y`.
    LogSoftmaxBackward = 18 => "log_softmax_backward" in Floats,
    /// `[x, weight, bias] -> [y, mean(f32), rstd(f32)]` over the last dim; `mean` and `rstd`
    /// have the leading dims of `x` (`rstd = 1/sqrt(var + eps)`, biased variance).
    LayerNorm {
        /// Added to the variance.
        eps: f64 => float[0],
    } = 19 => "layer_norm" in Floats,
    /// `[dy, x, weight, mean, rstd] -> [dx, dweight, dbias]`.
    LayerNormBackward = 20 => "layer_norm_backward" in Floats,
    /// `[x, weight] -> [y, rstd(f32)]` over the last dim, `y = x * rstd * weight` with
    /// `rstd = 1/sqrt(mean(x²) + eps)` of shape `x.shape[..-1]`.
    RmsNorm {
        /// Added to the mean square.
        eps: f64 => float[0],
    } = 21 => "rms_norm" in Floats,
    /// `[dy, x, weight, rstd] -> [dx, dweight]`, or with a fifth input `dsum` (like `x`,
    /// interface 1.11) whose `dx` is the norm's gradient rounded to the dtype plus `dsum`,
    /// rounded again (what an `add` op stores): the gradient of a pre-norm residual stream,
    /// which reaches the normalized sum through the norm and directly (`AddRmsNorm`'s
    /// backward), in one pass. Mixed precision (interface 1.12): `dy` may be f16 or bf16 (the
    /// claimed dtype) while `x` and everything else is f32, the gradient of `AddRmsNorm`'s
    /// mixed form; `dy` is widened to f32 as it is read. In the mixed form a third output
    /// `dx_half` like `dy` may follow (interface 1.13): `dx` rounded to `dy`'s dtype, the
    /// gradient of `AddRmsNorm`'s half-precision residual, written in the same pass.
    RmsNormBackward = 22 => "rms_norm_backward" in Floats,
    /// `[x (b, h, s, d), cos (s, d/2), sin (s, d/2)] -> [y]`, rotating pairs `(i, i+d/2)`
    /// (the Hugging Face "rotate half" layout): `y_i = x_i cos - x_{i+d/2} sin`,
    /// `y_{i+d/2} = x_{i+d/2} cos + x_i sin`; `inverse` rotates by `-θ` (the backward).
    Rotary {
        /// Rotate by the negative angle.
        inverse: bool => int[0],
    } = 23 => "rotary" in Floats,
    /// `[q (b, hq, s, d), k (b, hk, t, d), v (b, hk, t, d)] -> [o (b, hq, s, d), lse(f32, b, hq, s)]`
    /// with `hq` a multiple of `hk` (grouped-query: query head `h` reads kv head
    /// `h / (hq/hk)`); `lse` is the log-sum-exp of the scaled, masked scores of each query. A
    /// fully masked row gives NaN.
    Attention {
        /// Mask keys after the query position (bottom-right aligned when `t > s`).
        causal: bool => int[0],
        /// Multiplies `q·k`; usually `1/sqrt(d)`.
        scale: f64 => float[0],
    } = 24 => "attention" in Floats,
    /// `[q, k, v, o, lse, do] -> [dq, dk, dv]`.
    AttentionBackward {
        /// As in the forward.
        causal: bool => int[0],
        /// As in the forward.
        scale: f64 => float[0],
    } = 25 => "attention_backward" in Floats,
    /// `[logits (n, c), target(i64, n)] -> [loss(f32, n), lse(f32, n)]` per row:
    /// `loss = (1-ε)(lse - x_t) + ε(lse - mean_j x_j)` with ε the label smoothing; rows whose
    /// target is `ignore_index` get loss 0; any other target outside `[0, c)` is an error.
    CrossEntropy {
        /// Target value that contributes nothing.
        ignore_index: i64 => int[0],
        /// Label smoothing in `[0, 1)`.
        label_smoothing: f64 => float[0],
    } = 26 => "cross_entropy" in Floats,
    /// `[logits, target, lse, dloss(f32, n)] -> [dlogits]`,
    /// `dlogits = dloss * (softmax - (1-ε) onehot(t) - ε/c)`, zero on ignored rows.
    CrossEntropyBackward {
        /// As in the forward.
        ignore_index: i64 => int[0],
        /// As in the forward.
        label_smoothing: f64 => float[0],
    } = 27 => "cross_entropy_backward" in Floats,
    /// Multi-tensor AdamW, in place, PyTorch's update rule. `inputs = [grad_0, .., grad_n-1]`,
    /// optionally followed by `scale` (one f32 element every gradient is multiplied by as it
    /// is read, interface 1.10), `outputs = [param_0, exp_avg_0, exp_avg_sq_0, param_1, ..]`
    /// (moments in the param's dtype or f32); `step` counts from 1:
    /// `p *= 1 - lr·wd; m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²;
    /// p -= lr/(1-β1^step) · m / (sqrt(v)/sqrt(1-β2^step) + eps)`.
    AdamW {
        /// Learning rate.
        lr: f64 => float[0],
        /// First-moment decay.
        beta1: f64 => float[1],
        /// Second-moment decay.
        beta2: f64 => float[2],
        /// Denominator term.
        eps: f64 => float[3],
        /// Decoupled weight decay.
        weight_decay: f64 => float[4],
        /// The step number after this update (bias correction).
        step: u64 => int[0],
    } = 28 => "adamw" in Floats,
    /// `[x (n, c, h, w), weight (o, c/groups, kh, kw)]` or with a third input `bias (o)`
    /// `-> [y (n, o, oh, ow)]`, zero padding, `oh = (h + 2p - d(kh-1) - 1)/s + 1`.
    Conv2d {
        /// Stride, padding and dilation (`kernel` unused).
        window: Window2d => window[0],
        /// Channel groups.
        groups: u32 => high[7],
    } = 29 => "conv2d" in Floats,
    /// `[dy, weight] -> [dx]`.
    Conv2dBackwardInput {
        /// As in the forward.
        window: Window2d => window[0],
        /// As in the forward.
        groups: u32 => high[7],
    } = 30 => "conv2d_backward_input" in Floats,
    /// `[dy, x] -> [dweight]` (and `[dbias]` as a second output when given).
    Conv2dBackwardWeight {
        /// As in the forward.
        window: Window2d => window[0],
        /// As in the forward.
        groups: u32 => high[7],
    } = 31 => "conv2d_backward_weight" in Floats,
    /// `[x (n, c, h, w)] -> [y, argmax(i64)]`, -inf padding, floor output size; `argmax` is the
    /// flat index `ih*w + iw` of the chosen input element in its plane (PyTorch's convention);
    /// NaN wins.
    MaxPool2d {
        /// Kernel, stride, padding, dilation.
        window: Window2d => window[0],
    } = 32 => "max_pool2d" in Floats,
    /// `[dy, argmax] -> [dx]`.
    MaxPool2dBackward {
        /// As in the forward.
        window: Window2d => window[0],
    } = 33 => "max_pool2d_backward" in Floats,
    /// `[x (n, c, h, w)] -> [y]`, zero padding that counts toward the divisor
    /// (`count_include_pad`), floor output size.
    AvgPool2d {
        /// Kernel, stride, padding.
        window: Window2d => window[0],
    } = 34 => "avg_pool2d" in Floats,
    /// `[dy] -> [dx]`.
    AvgPool2dBackward {
        /// As in the forward.
        window: Window2d => window[0],
    } = 35 => "avg_pool2d_backward" in Floats,
    /// `[gate, up] -> [y]`, all of one shape and dtype: `y = silu(gate) · up` with
    /// `silu(g) = g · sigmoid(g)` (the gated feed-forward of LLaMA and Qwen2, "SwiGLU").
    SwiGlu = 36 => "swiglu" in Floats,
    /// `[dy, gate, up] -> [dgate, dup]`, all of gate's shape and dtype, with
    /// `s = sigmoid(gate)`: `dgate = dy · up · s · (1 + gate · (1 - s))`, `dup = dy · gate · s`.
    SwiGluBackward = 37 => "swiglu_backward" in Floats,
    /// `[q (b, hq, s, d), k (b, hk, t, d), v (b, hk, t, d), keep (bool, b, s, t)] -> [o]` (o
    /// like q), `hq` a multiple of `hk` (query head `h` reads kv head `h / (hq/hk)`):
    /// attention in which query `i` of batch row `b` sees exactly the keys `j` with
    /// `keep[b, i, j]`, `o = Σ_j softmax_j(scale · q·k_j) v_j` over those keys, in the compute
    /// type. A query that keeps no key gets NaN. Forward only: the attention of inference with
    /// padding, or of a decode step whose position lives on the device.
    MaskedAttention {
        /// Multiplies `q·k`; usually `1/sqrt(d)`.
        scale: f64 => float[0],
    } = 38 => "masked_attention" in Floats,
    /// `[x (n, c, s), weight (c, f32), bias (c, f32)] -> [y (like x), mean (c, f32), rstd (c,
    /// f32)]`: batch normalization with the batch's statistics, per channel over the `n · s`
    /// values of the batch and spatial dims: `mean` and the biased variance `var` of channel
    /// `ch`, `rstd = 1/sqrt(var + eps)`, `y = (x - mean) · rstd · weight + bias`, in the compute
    /// type. A channel with no values gets NaN statistics.
    BatchNorm {
        /// Added to the variance.
        eps: f64 => float[0],
    } = 39 => "batch_norm" in Floats,
    /// `[dy (n, c, s), x, weight (c, f32), mean (c, f32), rstd (c, f32)] -> [dx (like x),
    /// dweight (c, f32), dbias (c, f32)]`, with `x̂ = (x - mean) · rstd` and `m = n · s`:
    /// `dbias = Σ dy`, `dweight = Σ dy · x̂` (sums per channel), `dx = weight · rstd · (dy -
    /// dbias/m - x̂ · dweight/m)`.
    BatchNormBackward = 40 => "batch_norm_backward" in Floats,
    /// `[x, residual, weight (d)] -> [y, sum, rstd(f32)]`, `x` and `residual` of one shape
    /// `(.., d)` and dtype, `y` and `sum` like them: the residual addition of a pre-norm
    /// transformer fused with the RMS norm that follows it. `sum = x + residual`, rounded to
    /// the dtype (what an `add` op stores), then `RmsNorm` of `sum`: `y = sum · rstd · weight`
    /// with `rstd = 1/sqrt(mean(sum²) + eps)` over the last dim, in the compute type. The
    /// backward is `RmsNormBackward` on `sum` with the gradient of `sum` as its `dsum`, for
    /// both inputs. Mixed precision (interface 1.12): `x` f32 (a residual stream kept in f32)
    /// while `residual` is f16 or bf16 (the claimed dtype); then `weight`, `sum` and `rstd` are
    /// f32, `sum` is the f32 sum of `x` and the widened `residual`, and `y` is in `residual`'s
    /// dtype, the norm computed in f32 and rounded once (what a half-precision layer reading
    /// the norm casts it to under autocast).
    AddRmsNorm {
        /// Added to the mean square.
        eps: f64 => float[0],
    } = 41 => "add_rms_norm" in Floats,
    /// `[q (b, hq, s, d), k (b, hk, s, d), v (b, hk, s, d), cos (s, d/2), sin (s, d/2),
    /// position (i64, 1)] -> [q_out (like q), k_cache (b, hk, t, d), v_cache (b, hk, t, d)]`,
    /// all float operands of one dtype, the caches written in place: with `p = position[0]`,
    /// `q_out = rotary(q)`, `k_cache[:, :, p + i] = rotary(k)[:, :, i]` and
    /// `v_cache[:, :, p + i] = v[:, :, i]` for `i < s`, `rotary` as in `Rotary` (the angle of
    /// row `i` of `cos`/`sin`); the caches' other positions are left as they are. A `p`
    /// outside `[0, t - s]` is an error and writes nothing. The step of incremental decoding
    /// whose position lives on the device (a captured graph). Forward only.
    RotaryKvWrite = 42 => "rotary_kv_write" in Floats,
    /// `[x (.., k), residual (.., k), norm_weight (k), weight (n, k)]`, or with a fifth input
    /// `bias (n)`, `-> [y (.., n), sum (.., k)]`, all of one dtype: a pre-norm transformer's
    /// residual addition, the RMS norm after it and the linear layer that reads the norm, in
    /// one op. Exactly `AddRmsNorm { eps }` (`sum`, and its `y` as `h`, both rounded to the
    /// dtype), then `p = h · weightᵀ` as `Matmul` computes and rounds it, then `p + bias`
    /// rounded again as `Add` stores it. With `gated`, `n` is even, the weight's first `n/2`
    /// rows are a gate's and the others an up projection's (as a gated feed-forward's stacked
    /// weights), and `y (.., n/2)` is `SwiGlu` of the two halves of that result. Forward only:
    /// the norm-and-projection of a decode step, where the norm's own launch would cost as
    /// much as its arithmetic.
    AddRmsNormLinear {
        /// Added to the mean square.
        eps: f64 => float[0],
        /// The result's halves go through `SwiGlu`.
        gated: bool => int[0],
    } = 43 => "add_rms_norm_linear" in Floats,
    /// `[a (m, k), b (k, n)] -> [y (m, n)]`, `y` read and written: `y += a · b` (PyTorch's
    /// `y.addmm_(a, b)`), the products summed in f32 (f64 for f64) with `y`'s old value and
    /// rounded once to `y`'s dtype. `a` and `b` share a float dtype; `y` has it too, or is f32
    /// when it is f16 or bf16 (a low-precision product accumulated into an f32 buffer, as a
    /// gradient summed over blocks of rows is). Transposes arrive as strides; `y` overlaps
    /// neither input nor itself. The claimed dtype is that of `a` and `b`.
    Addmm = 44 => "addmm" in Floats,
    /// `[x_0, .., x_{n-1}] -> [y (n)]` (interface 1.13), `n >= 1` inputs of one float dtype
    /// (the claimed one) with any shapes and strides, `y` of that dtype: `y[i]` is the sum of
    /// the squares of `x_i`'s elements, accumulated as `Reduce(SumSquares)` accumulates and
    /// rounded once (0 for an empty `x_i`). The parts of a gradient norm in a few launches
    /// rather than one per gradient (PyTorch's `_foreach_norm` before its root); `y` overlaps
    /// no input.
    ForeachSumSquares = 45 => "foreach_sum_squares" in Floats,
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

impl Op {
    /// This op's kind code.
    pub fn kind(&self) -> OpKind {
        self.encode().kind
    }

    /// A readable name for messages.
    pub fn name(&self) -> &'static str {
        self.kind().name().unwrap_or("unknown")
    }

    /// The dtypes this op is defined for.
    pub fn domain(&self) -> Domain {
        match *self {
            Op::Unary(u) => u.domain(),
            Op::Binary(b) | Op::BinaryScalar { op: b, .. } => b.domain(),
            Op::Reduce(r) => r.domain(),
            _ => self.other_domain().unwrap_or(Domain::All),
        }
    }

    /// The wire form.
    pub fn encode(&self) -> RawOp {
        let mut attrs = OpAttrs::default();
        let kind = match *self {
            Op::Unary(u) => OpKind::unary(u),
            Op::Binary(b) => OpKind::binary(b),
            Op::BinaryScalar { op, scalar, scalar_first } => {
                attrs.floats[0] = scalar;
                attrs.ints[0] = scalar_first as i64;
                OpKind::binary_scalar(op)
            }
            Op::Reduce(r) => OpKind::reduce(r),
            _ => OpKind(family::OTHER + self.encode_other(&mut attrs).unwrap_or(0xff)),
        };
        RawOp { kind, attrs }
    }

    /// The typed form of a wire op; an unknown kind is `Unsupported`.
    pub fn decode(raw: &RawOp) -> Result<Op> {
        let (fam, member) = (raw.kind.0 & !0xff, raw.kind.0 & 0xff);
        let op = match fam {
            family::UNARY => UnaryOp::from_code(member).map(Op::Unary),
            family::BINARY => BinaryOp::from_code(member).map(Op::Binary),
            family::BINARY_SCALAR => BinaryOp::from_code(member).map(|op| Op::BinaryScalar {
                op,
                scalar: raw.attrs.floats[0],
                scalar_first: raw.attrs.ints[0] != 0,
            }),
            family::REDUCE => ReduceOp::from_code(member).map(Op::Reduce),
            family::OTHER => Op::decode_other(member, &raw.attrs),
            _ => None,
        };
        op.ok_or_else(|| BackendError::unsupported(format!("unknown op kind {:#x}", raw.kind.0)))
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

    /// Every op with distinct attribute values, for the wire-layout test.
    fn one_of_each() -> Vec<Op> {
        let w = Window2d { kernel: [3, 2], stride: [2, 1], padding: [1, 0], dilation: [1, 2] };
        vec![
            Op::Unary(UnaryOp::Gelu),
            Op::Binary(BinaryOp::Remainder),
            Op::BinaryScalar { op: BinaryOp::Sub, scalar: 2.5, scalar_first: true },
            Op::Reduce(ReduceOp::ArgMin),
            Op::Clamp { min: -1.5, max: 2.5 },
            Op::Where,
            Op::Copy,
            Op::Cast,
            Op::Fill { value: 3.25 },
            Op::Arange { start: -2.0, step: 0.5 },
            Op::Matmul,
            Op::Gather { dim: 1 },
            Op::ScatterAdd { dim: 2 },
            Op::IndexSelect { dim: 3 },
            Op::IndexAdd { dim: 4 },
            Op::CumSum { dim: 5 },
            Op::RandUniform { seed: u64::MAX, offset: 7, low: -1.0, high: 2.0 },
            Op::RandNormal { seed: 11, offset: 13, mean: 1.0, std: 2.0 },
            Op::Dropout { seed: 17, offset: 19, p: 0.25 },
            Op::Softmax,
            Op::LogSoftmax,
            Op::SoftmaxBackward,
            Op::LogSoftmaxBackward,
            Op::LayerNorm { eps: 1e-5 },
            Op::LayerNormBackward,
            Op::RmsNorm { eps: 1e-6 },
            Op::RmsNormBackward,
            Op::Rotary { inverse: true },
            Op::Attention { causal: true, scale: 0.125 },
            Op::AttentionBackward { causal: false, scale: 0.25 },
            Op::CrossEntropy { ignore_index: -100, label_smoothing: 0.1 },
            Op::CrossEntropyBackward { ignore_index: 3, label_smoothing: 0.2 },
            Op::AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, step: 3 },
            Op::Conv2d { window: w, groups: 4 },
            Op::Conv2dBackwardInput { window: w, groups: 5 },
            Op::Conv2dBackwardWeight { window: w, groups: 6 },
            Op::MaxPool2d { window: w },
            Op::MaxPool2dBackward { window: w },
            Op::AvgPool2d { window: w },
            Op::AvgPool2dBackward { window: w },
            Op::SwiGlu,
            Op::SwiGluBackward,
            Op::MaskedAttention { scale: 0.125 },
            Op::BatchNorm { eps: 1e-5 },
            Op::BatchNormBackward,
            Op::AddRmsNorm { eps: 1e-6 },
            Op::RotaryKvWrite,
            Op::AddRmsNormLinear { eps: 1e-5, gated: true },
            Op::Addmm,
            Op::ForeachSumSquares,
        ]
    }

    /// The wire form is frozen: kind codes and attribute slots of every op, written out.
    #[test]
    fn the_wire_form_is_pinned() {
        let mut text = String::new();
        for op in one_of_each() {
            let raw = op.encode();
            let (f, i) = (&raw.attrs.floats, &raw.attrs.ints);
            let used_f = f.iter().rposition(|&v| v != 0.0).map_or(0, |k| k + 1);
            let used_i = i.iter().rposition(|&v| v != 0).map_or(0, |k| k + 1);
            text += &format!("{} {:#x} {:?} {:?}\n", op.name(), raw.kind.0, &f[..used_f], &i[..used_i]);
            assert_eq!(Op::decode(&raw).unwrap(), op);
        }
        println!("{text}");
        assert_eq!(text, PINNED_WIRE_FORM);
    }

    const PINNED_WIRE_FORM: &str = "\
        gelu 0x10b [] []\n\
        remainder 0x207 [] []\n\
        sub_scalar 0x301 [2.5] [1]\n\
        argmin 0x406 [] []\n\
        clamp 0x500 [-1.5, 2.5] []\n\
        where 0x501 [] []\n\
        copy 0x502 [] []\n\
        cast 0x503 [] []\n\
        fill 0x504 [3.25] []\n\
        arange 0x505 [-2.0, 0.5] []\n\
        matmul 0x506 [] []\n\
        gather 0x507 [] [1]\n\
        scatter_add 0x508 [] [2]\n\
        index_select 0x509 [] [3]\n\
        index_add 0x50a [] [4]\n\
        cumsum 0x50b [] [5]\n\
        rand_uniform 0x50c [-1.0, 2.0] [-1, 7]\n\
        rand_normal 0x50d [1.0, 2.0] [11, 13]\n\
        dropout 0x50e [0.25] [17, 19]\n\
        softmax 0x50f [] []\n\
        log_softmax 0x510 [] []\n\
        softmax_backward 0x511 [] []\n\
        log_softmax_backward 0x512 [] []\n\
        layer_norm 0x513 [1e-5] []\n\
        layer_norm_backward 0x514 [] []\n\
        rms_norm 0x515 [1e-6] []\n\
        rms_norm_backward 0x516 [] []\n\
        rotary 0x517 [] [1]\n\
        attention 0x518 [0.125] [1]\n\
        attention_backward 0x519 [0.25] []\n\
        cross_entropy 0x51a [0.1] [-100]\n\
        cross_entropy_backward 0x51b [0.2] [3]\n\
        adamw 0x51c [0.001, 0.9, 0.999, 1e-8, 0.01] [3]\n\
        conv2d 0x51d [] [3, 2, 2, 1, 1, 0, 1, 17179869186]\n\
        conv2d_backward_input 0x51e [] [3, 2, 2, 1, 1, 0, 1, 21474836482]\n\
        conv2d_backward_weight 0x51f [] [3, 2, 2, 1, 1, 0, 1, 25769803778]\n\
        max_pool2d 0x520 [] [3, 2, 2, 1, 1, 0, 1, 2]\n\
        max_pool2d_backward 0x521 [] [3, 2, 2, 1, 1, 0, 1, 2]\n\
        avg_pool2d 0x522 [] [3, 2, 2, 1, 1, 0, 1, 2]\n\
        avg_pool2d_backward 0x523 [] [3, 2, 2, 1, 1, 0, 1, 2]\n\
        swiglu 0x524 [] []\n\
        swiglu_backward 0x525 [] []\n\
        masked_attention 0x526 [0.125] []\n\
        batch_norm 0x527 [1e-5] []\n\
        batch_norm_backward 0x528 [] []\n\
        add_rms_norm 0x529 [1e-6] []\n\
        rotary_kv_write 0x52a [] []\n\
        add_rms_norm_linear 0x52b [1e-5] [1]\n\
        addmm 0x52c [] []\n\
        foreach_sum_squares 0x52d [] []\n";
}
