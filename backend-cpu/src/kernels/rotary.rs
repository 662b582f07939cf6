//! Rotary position embedding in the "rotate half" layout, and its inverse (the backward).
//!
//! `cos` and `sin` have x's dtype. Any operand may be strided: inputs are gathered into dense
//! copies and a strided output is staged (see `Dense`).

use super::fused::{dense, min_rows, with_float, Dense, Float, C};
use super::{unsupported, Kernel, View};
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{DType, Op, OpKind, Result};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::Rotary { inverse: false }])
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    let Op::Rotary { inverse } = *op else {
        return Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype)));
    };
    let (_, [x, cos, sin], [y]) = checks::rotary(op, inputs, outputs)?;
    with_float!(op, x.dtype, T => rotate::<T>(op, inverse, [x, cos, sin], y))
}

fn rotate<T: Float>(op: &Op, inverse: bool, [x, cos, sin]: [&View; 3], y: &View) -> Result<()> {
    let (xs, cs, ss) = (dense::<T>(op, x)?, dense::<T>(op, cos)?, dense::<T>(op, sin)?);
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

inventory::submit! { Kernel { claims, run } }
