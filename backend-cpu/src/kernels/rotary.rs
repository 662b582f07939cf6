//! Rotary position embedding in the "rotate half" layout, and its inverse (the backward); and
//! the decode step's fused form, which rotates q and k and writes k and v into the caches at a
//! position read from an operand (`RotaryKvWrite`).
//!
//! `cos` and `sin` have x's dtype. Any operand may be strided: inputs are gathered into dense
//! copies and a strided output is staged (see `Dense`).

use super::fused::{dense, min_rows, with_float, Dense, Float, C};
use super::{unsupported, Kernel, View};
use genesis_backend_api::sdk::checks::{self, AttentionDims};
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::Rotary { inverse: false }, Op::RotaryKvWrite])
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match *op {
        Op::Rotary { inverse } => {
            let (_, [x, cos, sin], [y]) = checks::rotary(op, inputs, outputs)?;
            with_float!(op, x.dtype, T => rotate::<T>(op, inverse, [x, cos, sin], y))
        }
        Op::RotaryKvWrite => {
            let (dims, [q, k, v, cos, sin, position], outs) = checks::rotary_kv_write(op, inputs, outputs)?;
            // Checked before anything is written, so a bad position leaves the caches as
            // they were.
            let p = cache_position(op, position, &dims)?;
            with_float!(op, q.dtype, T => kv_write::<T>(op, p, [q, k, v, cos, sin], outs))
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
}

fn rotate<T: Float>(op: &Op, inverse: bool, [x, cos, sin]: [&View; 3], y: &View) -> Result<()> {
    let (cs, ss) = (dense::<T>(op, cos)?, dense::<T>(op, sin)?);
    rotate_into::<T>(op, inverse, x, &cs, &ss, y)
}

/// `y = rotary(x)` for `x, y (b, h, s, d)` (any strides) with the dense `(s, d/2)` tables
/// `cs` and `ss`, in the compute type, rounded once.
fn rotate_into<T: Float>(op: &Op, inverse: bool, x: &View, cs: &[T], ss: &[T], y: &View) -> Result<()> {
    let xs = dense::<T>(op, x)?;
    let mut out = Dense::<T>::output(op, y)?;
    let (s, d) = (x.shape[2], x.shape[3]);
    let half = d / 2;
    if d > 0 {
        out.slice().par_chunks_mut(d).zip(xs.par_chunks(d)).enumerate().with_min_len(min_rows(d)).for_each(
            |(row, (yr, xr))| {
                // Rows are (b, h, s) in row-major order, so the position is the row mod s.
                let pos = row % s;
                let (cr, sr) = (&cs[pos * half..][..half], &ss[pos * half..][..half]);
                for i in 0..half {
                    let (c, sn): (C<T>, C<T>) = (cr[i].compute(), sr[i].compute());
                    let sn = if inverse { -sn } else { sn };
                    let (a, b) = (xr[i].compute(), xr[i + half].compute());
                    yr[i] = T::store(a * c - b * sn);
                    yr[i + half] = T::store(b * c + a * sn);
                }
            },
        );
    }
    out.finish();
    Ok(())
}

/// The position operand's value `p`, or `InvalidArgument` unless `0 <= p <= t - s`.
fn cache_position(op: &Op, position: &View, dims: &AttentionDims) -> Result<usize> {
    let p = dense::<i64>(op, position)?.first().copied().unwrap_or(-1);
    let bound = dims.positions_free();
    match usize::try_from(p) {
        Ok(p) if p < bound => Ok(p),
        _ => Err(BackendError::invalid(format!(
            "{}: position {p} is out of range [0, {bound}) for {} new positions in caches of {} (the op wrote nothing)",
            op.name(),
            dims.s,
            dims.t
        ))),
    }
}

/// Positions `p..p + s` of a cache `(b, hk, t, d)`: a view `(b, hk, s, d)` with the cache's
/// strides.
fn positions(cache: &View, p: usize, s: usize) -> View {
    let step = (p as isize).wrapping_mul(cache.strides[2]).wrapping_mul(cache.dtype.size_in_bytes() as isize);
    let mut shape = cache.shape.clone();
    shape[2] = s;
    // `wrapping_offset`: with no new position (s = 0, p = t) the address may be one row past
    // the cache, and the empty view is never dereferenced.
    View { base: cache.base.wrapping_offset(step), dtype: cache.dtype, shape, strides: cache.strides.clone() }
}

/// `q_out = rotary(q)`, `k_cache[:, :, p..p + s] = rotary(k)`, `v_cache[:, :, p..p + s] = v`.
fn kv_write<T: Float>(
    op: &Op,
    p: usize,
    [q, k, v, cos, sin]: [&View; 5],
    [q_out, k_cache, v_cache]: &[View; 3],
) -> Result<()> {
    let (cs, ss) = (dense::<T>(op, cos)?, dense::<T>(op, sin)?);
    let s = q.shape[2];
    rotate_into::<T>(op, false, q, &cs, &ss, q_out)?;
    rotate_into::<T>(op, false, k, &cs, &ss, &positions(k_cache, p, s))?;
    let values = dense::<T>(op, v)?;
    let v_at = positions(v_cache, p, s);
    let mut out = Dense::<T>::output(op, &v_at)?;
    out.slice().copy_from_slice(&values);
    out.finish();
    Ok(())
}

inventory::submit! { Kernel { claims, run } }
