//! Rust types that map to Genesis dtypes.

use genesis_backend_api::DType;
use half::{bf16, f16};

/// A Rust type stored as a Genesis dtype, for building tensors from host data and reading
/// them back.
pub trait Element: Copy + Send + Sync + 'static + std::fmt::Debug {
    /// The matching dtype.
    const DTYPE: DType;
    /// Append the element's little-endian bytes.
    fn write_bytes(values: &[Self], out: &mut Vec<u8>);
    /// Decode elements from little-endian bytes.
    fn read_bytes(bytes: &[u8]) -> Vec<Self>;
    /// Lossy conversion for printing and scalar arguments.
    fn to_f64(self) -> f64;
}

macro_rules! pod_element {
    ($t:ty, $dtype:expr, |$v:ident| $to_f64:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn write_bytes(values: &[Self], out: &mut Vec<u8>) {
                out.extend_from_slice(bytemuck::cast_slice(values));
            }
            fn read_bytes(bytes: &[u8]) -> Vec<Self> {
                // Device bytes arrive unaligned in a Vec<u8>; copy element by element.
                bytes.chunks_exact(std::mem::size_of::<$t>()).map(bytemuck::pod_read_unaligned).collect()
            }
            fn to_f64(self) -> f64 {
                let $v = self;
                $to_f64
            }
        }
    };
}

pod_element!(f32, DType::F32, |v| v as f64);
pod_element!(f64, DType::F64, |v| v);
pod_element!(f16, DType::F16, |v| v.to_f64());
pod_element!(bf16, DType::BF16, |v| v.to_f64());
pod_element!(i64, DType::I64, |v| v as f64);
pod_element!(i32, DType::I32, |v| v as f64);
pod_element!(u8, DType::U8, |v| v as f64);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn write_bytes(values: &[Self], out: &mut Vec<u8>) {
        out.extend(values.iter().map(|&b| b as u8));
    }
    fn read_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
}
