//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
//! a counter-based generator, so element `i` of a fill is a pure function of
//! `(seed, offset, i)` and every backend can reproduce the same bits without shared state.
//!
//! The mapping from elements to counters is part of the interface contract:
//! - the key is `seed` split into two 32-bit words (low first);
//! - the counter is `[block_lo, block_hi, 0, 0]` where `block` counts 128-bit blocks;
//! - uniform f32/f16/bf16 element `i` uses block `offset + i/4`, word `i%4`;
//! - uniform f64 and normal (any dtype) element `i` use block `offset + i/2`, words
//!   `2*(i%2)` and `2*(i%2)+1`;
//! - [`blocks_used`] is how far the core advances the offset after a fill.

use crate::dtype::DType;

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Ten rounds of Philox4x32 on `counter` with `key`.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        c = [((p1 >> 32) as u32) ^ c[1] ^ k[0], p1 as u32, ((p0 >> 32) as u32) ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// The four words of block `block` for `seed`.
pub fn block(seed: u64, block: u64) -> [u32; 4] {
    philox4x32_10([block as u32, (block >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32])
}

/// Uniform in `[0, 1)` with 24 random bits: element `index` of an f32 fill at `offset`.
pub fn uniform_f32(seed: u64, offset: u64, index: u64) -> f32 {
    let word = block(seed, offset.wrapping_add(index / 4))[(index % 4) as usize];
    (word >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// Uniform in `[0, 1)` with 53 random bits: element `index` of an f64 fill at `offset`.
pub fn uniform_f64(seed: u64, offset: u64, index: u64) -> f64 {
    let (hi, lo) = pair(seed, offset, index);
    let bits = ((hi as u64) << 21) ^ ((lo as u64) >> 11);
    bits as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Standard normal by Box-Muller (the cosine branch), computed in f64: element `index` of a
/// fill at `offset`. f32 results round the f64 value, so backends agree bit for bit as long
/// as their f64 `ln`, `sqrt` and `cos` are accurate to well under an f32 ULP.
pub fn normal_f64(seed: u64, offset: u64, index: u64) -> f64 {
    let (a, b) = pair(seed, offset, index);
    // u1 in (0, 1] so the logarithm is finite.
    let u1 = ((a >> 8) as f64 + 1.0) * (1.0 / (1u32 << 24) as f64);
    let u2 = (b >> 8) as f64 * (1.0 / (1u32 << 24) as f64);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// [`normal_f64`] rounded to f32.
pub fn normal_f32(seed: u64, offset: u64, index: u64) -> f32 {
    normal_f64(seed, offset, index) as f32
}

fn pair(seed: u64, offset: u64, index: u64) -> (u32, u32) {
    let words = block(seed, offset.wrapping_add(index / 2));
    let lane = 2 * (index % 2) as usize;
    (words[lane], words[lane + 1])
}

/// Which draw a fill makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draw {
    /// `RandUniform` and `Dropout` (dropout draws uniforms of the output's dtype).
    Uniform,
    /// `RandNormal`.
    Normal,
}

/// Blocks a fill of `numel` elements of `dtype` consumes; the next fill starts after them.
pub fn blocks_used(draw: Draw, dtype: DType, numel: u64) -> u64 {
    let per_block = match (draw, dtype) {
        (Draw::Uniform, DType::F64) | (Draw::Normal, _) => 2,
        (Draw::Uniform, _) => 4,
    };
    numel.div_ceil(per_block)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors of the Random123 distribution (kat_vectors, philox4x32 10 rounds).
    #[test]
    fn known_answer_vectors() {
        assert_eq!(philox4x32_10([0, 0, 0, 0], [0, 0]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn offsets_shift_the_stream() {
        // Element 4 at offset 0 is element 0 at offset 1: fills compose.
        assert_eq!(uniform_f32(7, 0, 4), uniform_f32(7, 1, 0));
        assert_eq!(normal_f32(7, 0, 2), normal_f32(7, 1, 0));
        assert_ne!(uniform_f32(7, 0, 0), uniform_f32(8, 0, 0));
    }

    #[test]
    fn moments_are_plausible() {
        let n = 100_000u64;
        let mean_u: f64 = (0..n).map(|i| uniform_f32(1, 0, i) as f64).sum::<f64>() / n as f64;
        let normals: Vec<f64> = (0..n).map(|i| normal_f64(1, 0, i)).collect();
        let mean_n = normals.iter().sum::<f64>() / n as f64;
        let var_n = normals.iter().map(|x| (x - mean_n).powi(2)).sum::<f64>() / n as f64;
        assert!((mean_u - 0.5).abs() < 0.005, "{mean_u}");
        assert!(mean_n.abs() < 0.01 && (var_n - 1.0).abs() < 0.02, "{mean_n} {var_n}");
        assert!((0..n).all(|i| (0.0..1.0).contains(&uniform_f64(3, 5, i))));
    }
}
