//! Element types and their arithmetic, written once for every dtype.
//!
//! Kernels are generic over [`Element`]; [`with_dtype!`] is the one place that turns a runtime
//! [`DType`] into a type. f16 and bf16 compute through f32 (their `Compute` type), which is
//! also what the interface's accumulation rule asks for.

use genesis_backend_api::DType;
use half::{bf16, f16};

/// A stored element type.
pub trait Element: Copy + Send + Sync + 'static + PartialEq {
    /// Its dtype.
    const DTYPE: DType;
    /// The type arithmetic runs in.
    type Compute: Arith;
    /// Widen for computing.
    fn compute(self) -> Self::Compute;
    /// Narrow a result (round to nearest for floats).
    fn store(value: Self::Compute) -> Self;
    /// Conversion for casts and scalars; floats to ints truncate toward zero and saturate.
    fn to_f64(self) -> f64;
    /// See [`Element::to_f64`].
    fn from_f64(value: f64) -> Self;
    /// The value of an integer element (`None` for floats and bool), exact for every i64.
    fn integer(self) -> Option<i64>;
    /// An integer in this type: its low bits for a narrower integer type (wrapping, as
    /// PyTorch's integer casts do), the nearest value for a float type.
    fn from_integer(value: i64) -> Self;
}

/// Arithmetic on compute types.
pub trait Arith: Copy + PartialOrd + Send + Sync + 'static {
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// True for floating-point types.
    const IS_FLOAT: bool;
    /// `a + b` (wrapping for integers).
    fn add(self, b: Self) -> Self;
    /// `a - b`.
    fn sub(self, b: Self) -> Self;
    /// `a * b`.
    fn mul(self, b: Self) -> Self;
    /// `a / b`; integer division by zero yields 0 rather than trapping.
    fn div(self, b: Self) -> Self;
    /// `a % b` with the sign of `b`.
    fn rem(self, b: Self) -> Self;
    /// `a ^ b`.
    fn pow(self, b: Self) -> Self;
    /// True for NaN.
    fn is_nan(self) -> bool;
    /// Via f64, for transcendental functions.
    fn to_f64(self) -> f64;
    /// Via f64.
    fn from_f64(v: f64) -> Self;
    /// `e^x`; f32 has a vectorizable version of its own (`crate::math`).
    fn exp(self) -> Self {
        Self::from_f64(self.to_f64().exp())
    }
}

macro_rules! float_arith {
    ($t:ty, $exp:path) => {
        impl Arith for $t {
            // Inlined so that loops over it vectorize (a call per element does not).
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const IS_FLOAT: bool = true;
            fn add(self, b: Self) -> Self {
                self + b
            }
            fn sub(self, b: Self) -> Self {
                self - b
            }
            fn mul(self, b: Self) -> Self {
                self * b
            }
            fn div(self, b: Self) -> Self {
                self / b
            }
            fn rem(self, b: Self) -> Self {
                let r = self % b;
                if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
                    r + b
                } else {
                    r
                }
            }
            fn pow(self, b: Self) -> Self {
                self.powf(b)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}
float_arith!(f32, crate::math::exp_f32);
float_arith!(f64, f64::exp);

macro_rules! int_arith {
    ($t:ty) => {
        impl Arith for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const IS_FLOAT: bool = false;
            fn add(self, b: Self) -> Self {
                self.wrapping_add(b)
            }
            fn sub(self, b: Self) -> Self {
                self.wrapping_sub(b)
            }
            fn mul(self, b: Self) -> Self {
                self.wrapping_mul(b)
            }
            fn div(self, b: Self) -> Self {
                if b == 0 {
                    0
                } else {
                    self.wrapping_div(b)
                }
            }
            #[allow(unused_comparisons)]
            fn rem(self, b: Self) -> Self {
                if b == 0 {
                    return 0;
                }
                let r = self.wrapping_rem(b);
                if r != 0 && ((r < 0) != (b < 0)) {
                    r.wrapping_add(b)
                } else {
                    r
                }
            }
            fn pow(self, b: Self) -> Self {
                // Negative exponents count as 0 (x^0 = 1); widen first, since `u32::MAX as i32`
                // is -1 and would make the clamp's bounds cross.
                self.wrapping_pow((b as i128).clamp(0, u32::MAX as i128) as u32)
            }
            fn is_nan(self) -> bool {
                false
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}
int_arith!(i64);
int_arith!(i32);
int_arith!(u8);

macro_rules! element {
    ($t:ty, $dtype:expr, $compute:ty, |$x:ident| $widen:expr, |$y:ident| $narrow:expr, $int:tt) => {
        element!($t, $dtype, $compute, |$x| $widen, |$y| $narrow, |v| Self::store(<$compute as Arith>::from_f64(v)), $int);
    };
    ($t:ty, $dtype:expr, $compute:ty, |$x:ident| $widen:expr, |$y:ident| $narrow:expr, |$v:ident| $from:expr, $int:tt) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            type Compute = $compute;
            fn compute(self) -> $compute {
                let $x = self;
                $widen
            }
            fn store(value: $compute) -> Self {
                let $y = value;
                $narrow
            }
            fn to_f64(self) -> f64 {
                Arith::to_f64(self.compute())
            }
            fn from_f64(value: f64) -> Self {
                let $v = value;
                $from
            }
            element!(@integer $t, $int);
        }
    };
    (@integer $t:ty, int) => {
        fn integer(self) -> Option<i64> {
            Some(self as i64)
        }
        fn from_integer(value: i64) -> Self {
            value as $t
        }
    };
    (@integer $t:ty, float) => {
        fn integer(self) -> Option<i64> {
            None
        }
        fn from_integer(value: i64) -> Self {
            <Self as Element>::from_f64(value as f64)
        }
    };
}
element!(f32, DType::F32, f32, |x| x, |y| y, float);
element!(f64, DType::F64, f64, |x| x, |y| y, float);
// f64 -> f16/bf16 must round once: going through a round-to-nearest f32 rounds twice and
// breaks ties the wrong way (1 + 2^-11 + 2^-40 would become 1.0 in f16 instead of 1 + 2^-10).
// `half::f16::from_f64` has the same flaw (it narrows to f32 first on F16C hardware and
// truncates the low mantissa bits in software), hence `f32_round_to_odd`.
element!(f16, DType::F16, f32, |x| x.to_f32(), |y| f16::from_f32(y), |v| f16::from_f32(f32_round_to_odd(v)), float);
element!(bf16, DType::BF16, f32, |x| x.to_f32(), |y| bf16::from_f32(y), |v| bf16::from_f32(f32_round_to_odd(v)), float);
element!(i64, DType::I64, i64, |x| x, |y| y, int);
element!(i32, DType::I32, i32, |x| x, |y| y, int);
element!(u8, DType::U8, u8, |x| x, |y| y, int);

/// `v` narrowed to f32 with round-to-odd: truncate toward zero and set the last mantissa bit
/// when the result is inexact. Rounding that to a format with at most 22 significant bits
/// (f16 has 11, bf16 8) gives the correctly rounded value of `v` (Boldo & Melquiond, "When
/// double rounding is odd", 2005), so `f16::from_f32(f32_round_to_odd(v))` rounds `v` once.
pub fn f32_round_to_odd(v: f64) -> f32 {
    let nearest = v as f32;
    if nearest.is_infinite() || nearest.is_nan() || nearest as f64 == v {
        // Exact, NaN, or beyond f32's range (and so beyond f16's and bf16's too).
        return nearest;
    }
    let mut bits = nearest.to_bits();
    if (nearest as f64).abs() > v.abs() {
        // Rounded away from zero: step one ulp back toward zero (magnitude bits - 1).
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// The type sums, means, products and scans accumulate in. f32 accumulates in f64 (as
/// PyTorch's CPU kernels do), so long f32 sums keep ~f32 accuracy without compensated
/// summation; f16 and bf16 accumulate in f32 (the interface rule); integers accumulate in
/// their own type with wrapping arithmetic, which gives the same bits as summing wide and
/// truncating to the output dtype.
pub trait Accumulate: Element {
    /// The accumulator.
    type Acc: Arith;
    /// Widen into the accumulator.
    fn to_acc(self) -> Self::Acc;
    /// Round an accumulated value back to the element type.
    fn from_acc(acc: Self::Acc) -> Self;
}

macro_rules! accumulate {
    ($t:ty, $acc:ty, |$x:ident| $widen:expr, |$y:ident| $narrow:expr) => {
        impl Accumulate for $t {
            type Acc = $acc;
            #[inline(always)]
            fn to_acc(self) -> $acc {
                let $x = self;
                $widen
            }
            #[inline(always)]
            fn from_acc(acc: $acc) -> Self {
                let $y = acc;
                $narrow
            }
        }
    };
}
accumulate!(f32, f64, |x| x as f64, |y| y as f32);
accumulate!(f64, f64, |x| x, |y| y);
accumulate!(f16, f32, |x| x.to_f32(), |y| f16::from_f32(y));
accumulate!(bf16, f32, |x| x.to_f32(), |y| bf16::from_f32(y));
accumulate!(i64, i64, |x| x, |y| y);
accumulate!(i32, i32, |x| x, |y| y);
accumulate!(u8, u8, |x| x, |y| y);
accumulate!(Bool, u8, |x| x.0, |y| Bool((y != 0) as u8));

/// A bool element, stored as one byte holding 0 or 1.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Default)]
pub struct Bool(pub u8);

element!(Bool, DType::Bool, u8, |x| (x.0 != 0) as u8, |y| Bool((y != 0) as u8), float);

/// A `match` on `$dtype` with an arm per listed `DType` variant that runs `$body` with `$T`
/// bound to the variant's element type, and an optional last arm for the other dtypes: the
/// dispatch behind `with_dtype!` and the float-only `with_float!` of the fused kernels.
#[macro_export]
macro_rules! match_dtype {
    ($dtype:expr, $T:ident => $body:expr; $($variant:ident: $ty:ty),+ $(; $other:pat => $fallback:expr)?) => {
        match $dtype {
            $(
                genesis_backend_api::DType::$variant => {
                    type $T = $ty;
                    $body
                }
            )+
            $($other => $fallback,)?
        }
    };
}

/// Run `$body` with `$T` bound to the element type of `$dtype`.
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        $crate::match_dtype!($dtype, $T => $body;
            F32: f32, F64: f64, F16: half::f16, BF16: half::bf16,
            I64: i64, I32: i32, U8: u8, Bool: $crate::element::Bool)
    };
}
