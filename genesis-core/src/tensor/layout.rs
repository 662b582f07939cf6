//! Shapes and strides: the arithmetic behind views, broadcasting and dim arguments.

use crate::error::{Error, ErrorKind, Result};
use crate::ops::shape_err;

/// Where a tensor's elements live in its storage: shape, strides (in elements) and the offset
/// of element zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub offset: usize,
}

impl Layout {
    /// A dense row-major layout.
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout { shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0 }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_contiguous(&self) -> bool {
        genesis_backend_api::is_contiguous(&self.shape, &self.strides)
    }

    /// The layout seen with `shape` by broadcasting (stride 0 on new or size-1 dims).
    pub fn broadcast_to(&self, shape: &[usize]) -> Option<Layout> {
        let lead = shape.len().checked_sub(self.shape.len())?;
        let mut strides = vec![0isize; shape.len()];
        for (i, (&n, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
            match (n, shape[lead + i]) {
                (a, b) if a == b => strides[lead + i] = s,
                (1, _) => strides[lead + i] = 0,
                _ => return None,
            }
        }
        Some(Layout { shape: shape.to_vec(), strides, offset: self.offset })
    }

    /// The same elements with dims reordered.
    pub fn permute(&self, dims: &[usize]) -> Layout {
        Layout {
            shape: dims.iter().map(|&d| self.shape[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        }
    }

    /// A view of `len` elements of `dim` starting at `start`, every `step`-th.
    pub fn slice(&self, dim: usize, start: usize, len: usize, step: usize) -> Layout {
        let mut l = self.clone();
        l.offset = (l.offset as isize + start as isize * l.strides[dim]) as usize;
        l.shape[dim] = len;
        l.strides[dim] *= step as isize;
        l
    }

    /// A view with `shape` sharing the storage, when the strides allow it (as
    /// `torch.Tensor.view`); `None` when a copy is needed.
    pub fn view(&self, shape: &[usize]) -> Option<Layout> {
        if self.is_contiguous() {
            return Some(Layout { shape: shape.to_vec(), strides: contiguous_strides(shape), offset: self.offset });
        }
        // Split the old dims into chunks that are contiguous among themselves; each new dim
        // must fall within one chunk.
        let mut strides = vec![0isize; shape.len()];
        let (mut old_i, mut new_i) = (self.shape.len(), shape.len());
        while new_i > 0 || old_i > 0 {
            // Skip size-1 dims, which take any stride.
            if new_i > 0 && shape[new_i - 1] == 1 {
                strides[new_i - 1] = 1;
                new_i -= 1;
                continue;
            }
            if old_i > 0 && self.shape[old_i - 1] == 1 {
                old_i -= 1;
                continue;
            }
            if old_i == 0 || new_i == 0 {
                return None;
            }
            // Gather one chunk of old dims and the new dims covering the same elements.
            let (mut old_n, mut new_n) = (self.shape[old_i - 1], shape[new_i - 1]);
            let chunk_stride = self.strides[old_i - 1];
            let mut old_end = old_i - 1;
            let mut new_end = new_i - 1;
            let mut s = chunk_stride;
            strides[new_end] = s;
            while old_n != new_n {
                if old_n < new_n {
                    if old_end == 0 {
                        return None;
                    }
                    old_end -= 1;
                    if self.strides[old_end] != self.strides[old_end + 1] * self.shape[old_end + 1] as isize {
                        return None;
                    }
                    old_n *= self.shape[old_end];
                } else {
                    if new_end == 0 {
                        return None;
                    }
                    s *= shape[new_end] as isize;
                    new_end -= 1;
                    strides[new_end] = s;
                    new_n *= shape[new_end];
                }
            }
            old_i = old_end;
            new_i = new_end;
        }
        Some(Layout { shape: shape.to_vec(), strides, offset: self.offset })
    }
}

/// Merge adjacent dims that are contiguous with each other in every layout (all of one
/// shape), so elementwise descriptors need as few dims as possible (the interface carries at
/// most 8) and backends see long contiguous runs. Size-1 dims are dropped.
pub fn coalesce(layouts: &[Layout]) -> Vec<Layout> {
    let Some(first) = layouts.first() else { return Vec::new() };
    let mut out: Vec<Layout> =
        layouts.iter().map(|l| Layout { shape: vec![], strides: vec![], offset: l.offset }).collect();
    for d in 0..first.shape.len() {
        let n = first.shape[d];
        if n == 1 {
            continue;
        }
        let mergeable = !out[0].shape.is_empty()
            && layouts.iter().zip(&out).all(|(l, o)| o.strides.last() == Some(&(l.strides[d] * n as isize)));
        for (l, o) in layouts.iter().zip(out.iter_mut()) {
            if mergeable {
                *o.shape.last_mut().expect("non-empty") *= n;
                *o.strides.last_mut().expect("non-empty") = l.strides[d];
            } else {
                o.shape.push(n);
                o.strides.push(l.strides[d]);
            }
        }
    }
    out
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    genesis_backend_api::contiguous_strides(shape)
}

/// The broadcast of two shapes (NumPy rules), or `None`.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            match (x, y) {
                (x, y) if x == y => Some(x),
                (1, y) => Some(y),
                (x, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// The broadcast shape of `a` and `b`, or a `ShapeMismatch` naming `op`.
pub fn broadcast_or_err(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    broadcast_shapes(a, b)
        .ok_or_else(|| shape_err(format!("{op}: shapes {a:?} and {b:?} cannot be broadcast together")))
}

/// Resolve a possibly negative dim against `rank` (PyTorch's wrapping rule).
pub fn wrap_dim(op: &str, dim: isize, rank: usize) -> Result<usize> {
    let r = rank.max(1) as isize;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{op}: dimension {dim} is out of range for a tensor of rank {rank} (expected [{}, {}])", -r, r - 1),
        ));
    }
    Ok(d as usize)
}

/// Resolve a list of dims; duplicates are an error.
pub fn wrap_dims(op: &str, dims: &[isize], rank: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let w = wrap_dim(op, d, rank)?;
        if out.contains(&w) {
            return Err(Error::invalid(format!("{op}: dimension {d} appears twice in {dims:?}")));
        }
        out.push(w);
    }
    Ok(out)
}

/// The shape after removing a reduction over `dims` (kept as size 1 when `keepdim`).
pub fn reduced_shape(shape: &[usize], dims: &[usize], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &n)| match (dims.contains(&i), keepdim) {
            (false, _) => Some(n),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// Infer a `-1` in a reshape target.
pub fn infer_shape(op: &str, numel: usize, shape: &[isize]) -> Result<Vec<usize>> {
    let unknown: Vec<usize> = shape.iter().enumerate().filter(|(_, &n)| n == -1).map(|(i, _)| i).collect();
    if unknown.len() > 1 || shape.iter().any(|&n| n < -1) {
        return Err(Error::invalid(format!("{op}: invalid shape {shape:?}")));
    }
    let known: usize = shape.iter().filter(|&&n| n >= 0).map(|&n| n as usize).product();
    let mut out: Vec<usize> = shape.iter().map(|&n| n.max(0) as usize).collect();
    if let Some(&i) = unknown.first() {
        if known == 0 || numel % known != 0 {
            return Err(shape_err(format!("{op}: shape {shape:?} is invalid for {numel} elements")));
        }
        out[i] = numel / known;
    }
    if out.iter().product::<usize>() != numel {
        return Err(shape_err(format!("{op}: shape {shape:?} is invalid for {numel} elements")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_of_transposed_and_sliced_layouts() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.view(&[6, 4]).unwrap().strides, vec![4, 1]);
        let t = l.permute(&[1, 0, 2]); // (3, 2, 4) with strides (4, 12, 1)
        assert!(t.view(&[6, 4]).is_none());
        assert_eq!(t.view(&[3, 2, 2, 2]).unwrap().strides, vec![4, 12, 2, 1]);
        let s = l.slice(2, 1, 2, 1); // (2, 3, 2) strides (12, 4, 1)
        assert_eq!(s.view(&[6, 2]).unwrap().strides, vec![4, 1]);
        assert!(s.view(&[12]).is_none());
        assert_eq!(Layout::contiguous(&[2, 1, 3]).view(&[3, 2]).unwrap().strides, vec![2, 1]);
    }

    #[test]
    fn coalescing_merges_only_runs_contiguous_in_every_operand() {
        let c = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(coalesce(&[c.clone(), c.clone()])[0].shape, vec![24]);
        let t = c.permute(&[1, 0, 2]);
        let both = coalesce(&[t.clone(), Layout::contiguous(&[3, 2, 4])]);
        assert_eq!((both[0].shape.clone(), both[0].strides.clone()), (vec![3, 2, 4], vec![4, 12, 1]));
        let b = Layout::contiguous(&[4]).broadcast_to(&[3, 4]).unwrap();
        let merged = coalesce(&[b, Layout::contiguous(&[3, 4])]);
        assert_eq!((merged[0].shape.clone(), merged[0].strides.clone()), (vec![3, 4], vec![0, 1]));
        assert_eq!(coalesce(&[Layout::contiguous(&[])])[0].shape, Vec::<usize>::new());
    }

    #[test]
    fn dims_and_shapes() {
        assert_eq!(wrap_dim("t", -1, 3).unwrap(), 2);
        assert!(wrap_dim("t", 3, 3).is_err());
        assert_eq!(infer_shape("r", 12, &[-1, 4]).unwrap(), vec![3, 4]);
        assert!(infer_shape("r", 12, &[5, -1]).is_err());
        assert_eq!(broadcast_shapes(&[3, 1], &[4]), Some(vec![3, 4]));
        assert_eq!(reduced_shape(&[2, 3, 4], &[1], false), vec![2, 4]);
    }
}
