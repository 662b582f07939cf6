//! Element types.

use crate::error::{BackendError, Result};
use std::fmt;

/// The element type of a tensor. On the wire a `u32` code; unknown codes are rejected with
/// `Unsupported`, so new dtypes can be added in a minor version.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32 = 0,
    /// IEEE binary64.
    F64 = 1,
    /// IEEE binary16.
    F16 = 2,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16 = 3,
    /// Signed 64-bit integer (the index type).
    I64 = 4,
    /// Signed 32-bit integer.
    I32 = 5,
    /// Unsigned 8-bit integer.
    U8 = 6,
    /// Boolean stored as one byte, 0 or 1.
    Bool = 7,
}

impl DType {
    /// Every dtype of this interface version.
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool];

    /// The floating-point dtypes, the domain of the fused ops (norms, softmax, attention, ...).
    pub const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

    /// The dtype for a wire code.
    pub fn from_code(code: u32) -> Result<DType> {
        DType::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| BackendError::unsupported(format!("unknown dtype code {code}")))
    }

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// True for the floating-point dtypes.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// True for the integer dtypes (not bool).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::U8)
    }

    /// The name PyTorch users know (`"float32"`, `"bfloat16"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
