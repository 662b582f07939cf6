//! The argument block of the elementwise-style kernels ([`Args`]), operands resolved against
//! their buffers, and the strided geometry: dims merged across operands so most launches see
//! one or two dims.

use genesis_backend_api::{BackendError, DType, Result, TensorDesc, MAX_DIMS};

/// Mirror of `struct Args` in common.cuh (a test compares the layouts): one argument block per
/// launch.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Args {
    /// Operand addresses (element zero of each view).
    pub p: [u64; 4],
    /// Output elements.
    pub n: u64,
    /// Float attributes.
    pub s: [f64; 4],
    /// Integer attributes.
    pub u: [u64; 2],
    /// Op-specific flags (bit 0: scalar first; bit 1: packs are aligned).
    pub flag: i32,
    /// Rank of the merged geometry.
    pub ndim: i32,
    /// Merged shape.
    pub shape: [i64; MAX_DIMS],
    /// Strides of each operand over the merged shape.
    pub st: [[i64; MAX_DIMS]; 4],
}

/// A resolved operand: a validated view with its device address.
#[derive(Debug, Clone)]
pub struct Operand {
    /// Address of element zero.
    pub ptr: u64,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Strides in elements.
    pub strides: Vec<isize>,
}

genesis_backend_api::impl_meta!(Operand);

impl Operand {
    /// Check `desc` against a buffer of `len` bytes at `base`.
    pub fn resolve(desc: &TensorDesc, base: u64, len: usize) -> Result<Operand> {
        desc.validate(len)?;
        let dtype = desc.dtype()?;
        if desc.offset_bytes % dtype.size_in_bytes() as u64 != 0 {
            return Err(BackendError::invalid(format!(
                "tensor view byte offset {} is not a multiple of the {dtype} element size",
                desc.offset_bytes
            )));
        }
        Ok(Operand { ptr: base + desc.offset_bytes, dtype, shape: desc.shape(), strides: desc.strides() })
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Most stride sets [`merge_dims`] takes (operands of one launch).
const MAX_SETS: usize = 8;

/// Drop size-1 dims and merge neighbours contiguous in every stride set (row-major order is
/// kept, so linear positions are unchanged). Returns the shape and one stride list per set.
pub fn merge_dims(shape: &[usize], strides: &[&[isize]]) -> (Vec<usize>, Vec<Vec<isize>>) {
    let (mut out_shape, mut out) = ([0; MAX_DIMS], [[0; MAX_DIMS]; MAX_SETS]);
    let ndim = merge_into(shape, strides, &mut out_shape, &mut out);
    (out_shape[..ndim].to_vec(), out[..strides.len()].iter().map(|s| s[..ndim].to_vec()).collect())
}

/// [`merge_dims`] into fixed arrays (no allocation: this runs on every elementwise launch);
/// returns the merged rank. At most [`MAX_SETS`] stride sets, each as long as `shape`
/// (at most `MAX_DIMS`, which descriptors guarantee).
fn merge_into(
    shape: &[usize],
    strides: &[&[isize]],
    out_shape: &mut [usize; MAX_DIMS],
    out: &mut [[isize; MAX_DIMS]; MAX_SETS],
) -> usize {
    let k = strides.len().min(MAX_SETS);
    let mut ndim = 0;
    for (d, &n) in shape.iter().enumerate().take(MAX_DIMS) {
        if n == 1 {
            continue;
        }
        if ndim > 0 && (0..k).all(|j| out[j][ndim - 1] == strides[j][d].wrapping_mul(n as isize)) {
            out_shape[ndim - 1] *= n;
            for j in 0..k {
                out[j][ndim - 1] = strides[j][d];
            }
            continue;
        }
        out_shape[ndim] = n;
        for j in 0..k {
            out[j][ndim] = strides[j][d];
        }
        ndim += 1;
    }
    ndim
}

/// Fill the geometry of `args` for `operands` (all of the output's shape, at most 4). Returns
/// true when every operand is dense in row-major order (the contiguous kernels apply).
pub fn set_geometry(args: &mut Args, operands: &[&Operand]) -> bool {
    let shape = &operands[operands.len() - 1].shape;
    let mut strides: [&[isize]; 4] = [&[]; 4];
    let k = operands.len().min(4);
    for (slot, o) in strides.iter_mut().zip(operands) {
        *slot = &o.strides;
    }
    let (mut merged, mut merged_strides) = ([0; MAX_DIMS], [[0; MAX_DIMS]; MAX_SETS]);
    let ndim = merge_into(shape, &strides[..k], &mut merged, &mut merged_strides);
    args.n = shape.iter().product::<usize>() as u64;
    args.ndim = ndim as i32;
    for d in 0..ndim {
        args.shape[d] = merged[d] as i64;
        for (st, merged) in args.st.iter_mut().zip(&merged_strides[..k]) {
            st[d] = merged[d] as i64;
        }
    }
    for (j, o) in operands.iter().enumerate().take(4) {
        args.p[j] = o.ptr;
    }
    ndim == 0 || (ndim == 1 && merged_strides[..k].iter().all(|s| s[0] == 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_row_major_order() {
        // A contiguous 2x3x4 merges to one dim; a transposed operand stops the merge.
        let (shape, s) = merge_dims(&[2, 3, 4], &[&[12, 4, 1], &[12, 4, 1]]);
        assert_eq!((shape, s), (vec![24], vec![vec![1], vec![1]]));
        let (shape, s) = merge_dims(&[2, 3, 4], &[&[12, 4, 1], &[1, 6, 2]]);
        assert_eq!(shape, vec![2, 3, 4]);
        assert_eq!(s[1], vec![1, 6, 2]);
        // Dims that are contiguous with each other in every operand merge even when the
        // operand as a whole is not dense.
        let (shape, s) = merge_dims(&[2, 3, 4], &[&[12, 4, 1], &[1, 8, 2]]);
        assert_eq!((shape, s), (vec![2, 12], vec![vec![12, 1], vec![1, 2]]));
        // Broadcast rows: the zero stride merges with nothing but size-1 dims vanish.
        let (shape, s) = merge_dims(&[1, 5, 6], &[&[30, 0, 1], &[30, 6, 1]]);
        assert_eq!((shape, s), (vec![5, 6], vec![vec![0, 1], vec![6, 1]]));
    }

    #[test]
    fn the_argument_block_has_the_c_layout() {
        crate::kernels::layout::assert_c_layout!(
            Args { p, n, s, u, flag, ndim, shape, st },
            crate::kernels::COMMON,
            "Args"
        );
    }
}
