//! Element values on the host: every tensor the harness builds is a `Vec<f64>` of logical
//! values, rounded to the tested dtype before upload, so the oracle sees exactly what the
//! backend sees.

use genesis_backend_api::DType;
use half::{bf16, f16};

/// Round `x` to the nearest value of `dtype` (round-to-nearest-even for floats, truncation
/// toward zero for integers, `!= 0` for bool), widened back to f64.
pub fn quantize(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::I64 => x as i64 as f64,
        DType::I32 => x as i32 as f64,
        DType::U8 => x as u8 as f64,
        DType::Bool => (x != 0.0) as u8 as f64,
    }
}

/// `x` of dtype `from` cast to `to` by the interface's rule: integer to integer wraps (the
/// low bits, as PyTorch), everything else as [`quantize`] (floats to integers truncate and
/// saturate).
pub fn cast_value(from: DType, to: DType, x: f64) -> f64 {
    if from.is_int() && to.is_int() {
        let v = x as i64;
        match to {
            DType::I32 => v as i32 as f64,
            DType::U8 => v as u8 as f64,
            _ => v as f64,
        }
    } else {
        quantize(to, x)
    }
}

/// Round every value of `xs` to `dtype`.
pub fn quantize_all(dtype: DType, xs: &[f64]) -> Vec<f64> {
    xs.iter().map(|&x| quantize(dtype, x)).collect()
}

/// Write `x` (already representable) as one element of `dtype` into `out`.
pub fn encode(dtype: DType, x: f64, out: &mut [u8]) {
    match dtype {
        DType::F64 => out.copy_from_slice(&x.to_le_bytes()),
        DType::F32 => out.copy_from_slice(&(x as f32).to_le_bytes()),
        DType::F16 => out.copy_from_slice(&f16::from_f64(x).to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&bf16::from_f64(x).to_le_bytes()),
        DType::I64 => out.copy_from_slice(&(x as i64).to_le_bytes()),
        DType::I32 => out.copy_from_slice(&(x as i32).to_le_bytes()),
        DType::U8 => out[0] = x as u8,
        DType::Bool => out[0] = (x != 0.0) as u8,
    }
}

/// Read one element of `dtype` from `bytes` (exactly `dtype.size_in_bytes()` long).
pub fn decode(dtype: DType, bytes: &[u8]) -> f64 {
    let arr = |n: usize| {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&bytes[..n]);
        a
    };
    match dtype {
        DType::F64 => f64::from_le_bytes(arr(8)),
        DType::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as f64,
        DType::F16 => f16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
        DType::BF16 => bf16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
        DType::I64 => i64::from_le_bytes(arr(8)) as f64,
        DType::I32 => i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as f64,
        // Bool is decoded as its byte so that a backend writing 2 for true is caught.
        DType::U8 | DType::Bool => bytes[0] as f64,
    }
}

/// Significand bits (with the implicit one) and minimum normal exponent of a float dtype.
fn format(dtype: DType) -> (i32, i32) {
    match dtype {
        DType::F64 => (53, -1022),
        DType::F32 => (24, -126),
        DType::F16 => (11, -14),
        DType::BF16 => (8, -126),
        _ => (53, -1022),
    }
}

/// Unit roundoff of `dtype` (half the spacing at 1.0).
pub fn unit_roundoff(dtype: DType) -> f64 {
    2f64.powi(-format(dtype).0)
}

/// The spacing of `dtype` at magnitude `x` (one ULP), subnormal range included.
pub fn ulp(dtype: DType, x: f64) -> f64 {
    let (bits, emin) = format(dtype);
    let x = x.abs();
    let e = if x == 0.0 || !x.is_finite() { emin } else { (x.log2().floor() as i32).max(emin) };
    // log2 may round up just below a power of two; correct by checking the binade.
    let e = if e > emin && 2f64.powi(e) > x { e - 1 } else { e };
    2f64.powi(e - bits + 1)
}

/// Largest finite value of a float dtype.
pub fn max_finite(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::MAX,
        DType::F32 => f32::MAX as f64,
        DType::F16 => f16::MAX.to_f64(),
        DType::BF16 => bf16::MAX.to_f64(),
        DType::I64 => i64::MAX as f64,
        DType::I32 => i32::MAX as f64,
        DType::U8 => 255.0,
        DType::Bool => 1.0,
    }
}

/// Smallest positive subnormal of a float dtype.
pub fn min_subnormal(dtype: DType) -> f64 {
    let (bits, emin) = format(dtype);
    2f64.powi(emin - bits + 1)
}

/// Short dtype names used in case ids.
pub fn short_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::U8 => "u8",
        DType::Bool => "bool",
    }
}

/// The dtype for a short name.
pub fn from_short_name(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| short_name(d) == name)
}

/// Float dtypes in report order.
pub const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

/// A small deterministic generator (SplitMix64) so every case is reproducible from its id.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from a case id.
    pub fn for_id(id: &str) -> Rng {
        // FNV-1a: stable across platforms and Rust versions, unlike the std hasher.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in id.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        Rng(h)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform(f64::MIN_POSITIVE, 1.0);
        let u2 = self.uniform(0.0, 1.0);
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// An integer in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// `n` values for `dtype`: normals times `scale` for floats, integers in `[-scale, scale]`
    /// for integer dtypes, 0/1 for bool; rounded to the dtype.
    pub fn values(&mut self, dtype: DType, n: usize, scale: f64) -> Vec<f64> {
        (0..n)
            .map(|_| match dtype {
                DType::Bool => (self.next_u64() & 1) as f64,
                DType::U8 => self.below(scale as usize + 1) as f64,
                d if d.is_int() => self.below(2 * scale as usize + 1) as f64 - scale.floor(),
                d => quantize(d, self.normal() * scale),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(DType::F32, 1.0, f32::EPSILON as f64)]
    #[case(DType::F32, 1.5, f32::EPSILON as f64)]
    #[case(DType::F32, 0.999, f32::EPSILON as f64 / 2.0)]
    #[case(DType::F16, 1.0, 2f64.powi(-10))]
    #[case(DType::BF16, 1.0, 2f64.powi(-7))]
    #[case(DType::F16, 0.0, 2f64.powi(-24))]
    #[case(DType::F32, 1e-40, 2f64.powi(-149))]
    #[case(DType::F64, 2.0, 2f64.powi(-51))]
    fn ulp_matches_the_format(#[case] dtype: DType, #[case] x: f64, #[case] expected: f64) {
        assert_eq!(ulp(dtype, x), expected);
    }

    #[rstest]
    fn quantize_is_round_to_nearest_even() {
        // 1 + 2^-11 is exactly between two f16 values; even wins.
        assert_eq!(quantize(DType::F16, 1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(quantize(DType::F16, 1.0 + 3.0 * 2f64.powi(-11)), 1.0 + 2f64.powi(-9));
        assert_eq!(quantize(DType::BF16, 1.0 + 2f64.powi(-8)), 1.0);
        assert_eq!(quantize(DType::F16, 70000.0), f64::INFINITY);
        assert_eq!(quantize(DType::I64, -2.7), -2.0);
    }

    #[rstest]
    fn encode_decode_round_trips() {
        for dtype in DType::ALL {
            let mut buf = vec![0u8; dtype.size_in_bytes()];
            for x in [0.0, 1.0, -3.0, 100.0] {
                let q = quantize(dtype, x);
                encode(dtype, q, &mut buf);
                assert_eq!(decode(dtype, &buf), q, "{dtype} {x}");
            }
        }
    }
}
