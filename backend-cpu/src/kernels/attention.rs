//! Scaled dot-product attention (causal or not, grouped-query) and its backward.
//!
//! A direct implementation, one query row at a time: scores, max-subtracted softmax, weighted
//! sum, everything in the compute type (f32 for f16/bf16). The backward recomputes the
//! probabilities from the saved log-sum-exp, as flash-attention does, so the two directions
//! agree with the saved statistics of any backend.

use super::fused::{dense, dense_compute, row_max, split_mut, with_float, Dense, Float, Real, C, PAR_MIN_ELEMS};
use super::{unsupported, Kernel, View};
use crate::element::{Arith, Bool};
use genesis_backend_api::sdk::checks::{self, AttentionDims as Dims};
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{DType, Op, OpKind, Result};
use rayon::prelude::*;

fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[
        Op::Attention { causal: false, scale: 1.0 },
        Op::AttentionBackward { causal: false, scale: 1.0 },
        Op::MaskedAttention { scale: 1.0 },
    ])
}

/// Queries per parallel task so that a task has enough work to be worth scheduling.
fn min_tasks(dm: &Dims, per_task: usize) -> usize {
    (PAR_MIN_ELEMS / (per_task * dm.t.max(1) * dm.d.max(1)).max(1)).max(1)
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    match *op {
        Op::Attention { causal, scale } => {
            let (dm, [q, k, v], [o, lse]) = checks::attention(op, inputs, outputs)?;
            with_float!(op, q.dtype, T => forward::<T>(op, dm, causal, scale, [q, k, v], [o, lse]))
        }
        Op::AttentionBackward { causal, scale } => {
            let (dm, [q, k, v, o, lse, d_o], [dq, dk, dv]) = checks::attention_backward(op, inputs, outputs)?;
            with_float!(op, q.dtype, T => backward::<T>(op, dm, causal, scale, [q, k, v, o, lse, d_o], [dq, dk, dv]))
        }
        Op::MaskedAttention { scale } => {
            let (dm, [q, k, v, keep], [o]) = checks::masked_attention(op, inputs, outputs)?;
            with_float!(op, q.dtype, T => masked::<T>(op, dm, scale, [q, k, v, keep], o))
        }
        _ => Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype))),
    }
}

fn dot<R: Real>(a: &[R], b: &[R]) -> R {
    a.iter().zip(b).fold(R::ZERO, |acc, (&x, &y)| acc + x * y)
}

fn forward<T: Float>(
    op: &Op,
    dm: Dims,
    causal: bool,
    scale: f64,
    [q, k, v]: [&View; 3],
    [o, lse]: [&View; 2],
) -> Result<()> {
    let (qs, ks, vs) = (dense_compute::<T>(op, q)?, dense_compute::<T>(op, k)?, dense_compute::<T>(op, v)?);
    let (mut os, mut lses) = (Dense::<T>::output(op, o)?, Dense::<f32>::output(op, lse)?);
    let Dims { hq, hk, s, t, d, .. } = dm;
    let (group, scale) = (dm.group(), C::<T>::from_f64(scale));
    let tasks: Vec<_> =
        split_mut(os.slice(), dm.b * hq, s * d).into_iter().zip(split_mut(lses.slice(), dm.b * hq, s)).collect();
    tasks.into_par_iter().enumerate().with_min_len(min_tasks(&dm, s)).for_each(|(bh, (o_head, lse_head))| {
        let kv = (bh / hq * hk + bh % hq / group) * t * d;
        let (q_head, k_head, v_head) = (&qs[bh * s * d..][..s * d], &ks[kv..][..t * d], &vs[kv..][..t * d]);
        let mut scores = vec![C::<T>::ZERO; t];
        let mut acc = vec![C::<T>::ZERO; d];
        for i in 0..s {
            let n = dm.visible(causal, i);
            let o_row = &mut o_head[i * d..][..d];
            if n == 0 {
                o_row.fill(T::store(C::<T>::NAN));
                lse_head[i] = f32::NAN;
                continue;
            }
            let q_row = &q_head[i * d..][..d];
            for (j, sc) in scores[..n].iter_mut().enumerate() {
                *sc = scale * dot(q_row, &k_head[j * d..][..d]);
            }
            let m = row_max(scores[..n].iter().copied());
            let mut sum = C::<T>::ZERO;
            acc.fill(C::<T>::ZERO);
            for (j, &sc) in scores[..n].iter().enumerate() {
                let p = (sc - m).exp();
                sum += p;
                for (a, &vv) in acc.iter_mut().zip(&v_head[j * d..][..d]) {
                    *a += p * vv;
                }
            }
            for (out, &a) in o_row.iter_mut().zip(&acc) {
                *out = T::store(a / sum);
            }
            lse_head[i] = (m + sum.ln()).to_f32();
        }
    });
    os.finish();
    lses.finish();
    Ok(())
}

/// `MaskedAttention`: as [`forward`], with the keys of each query given by `keep (b, s, t)`.
fn masked<T: Float>(op: &Op, dm: Dims, scale: f64, [q, k, v, keep]: [&View; 4], o: &View) -> Result<()> {
    let (qs, ks, vs) = (dense_compute::<T>(op, q)?, dense_compute::<T>(op, k)?, dense_compute::<T>(op, v)?);
    let keep = dense::<Bool>(op, keep)?;
    let mut os = Dense::<T>::output(op, o)?;
    let Dims { hq, hk, s, t, d, .. } = dm;
    let (group, scale) = (dm.group(), C::<T>::from_f64(scale));
    let tasks = split_mut(os.slice(), dm.b * hq, s * d);
    tasks.into_par_iter().enumerate().with_min_len(min_tasks(&dm, s)).for_each(|(bh, o_head)| {
        let kv = (bh / hq * hk + bh % hq / group) * t * d;
        let (q_head, k_head, v_head) = (&qs[bh * s * d..][..s * d], &ks[kv..][..t * d], &vs[kv..][..t * d]);
        let mut scores = vec![C::<T>::ZERO; t];
        let mut acc = vec![C::<T>::ZERO; d];
        for i in 0..s {
            let kept = &keep[(bh / hq * s + i) * t..][..t];
            let q_row = &q_head[i * d..][..d];
            for (j, sc) in scores.iter_mut().enumerate() {
                *sc = if kept[j].0 != 0 { scale * dot(q_row, &k_head[j * d..][..d]) } else { C::<T>::NEG_INFINITY };
            }
            // No kept key: the max is -inf and every term below is NaN, as the op says.
            let m = row_max(scores.iter().copied());
            let mut sum = C::<T>::ZERO;
            acc.fill(C::<T>::ZERO);
            for (j, &sc) in scores.iter().enumerate().filter(|&(j, _)| kept[j].0 != 0) {
                let p = (sc - m).exp();
                sum += p;
                for (a, &vv) in acc.iter_mut().zip(&v_head[j * d..][..d]) {
                    *a += p * vv;
                }
            }
            for (out, &a) in o_head[i * d..][..d].iter_mut().zip(&acc) {
                *out = T::store(a / sum);
            }
        }
    });
    os.finish();
    Ok(())
}

fn backward<T: Float>(
    op: &Op,
    dm: Dims,
    causal: bool,
    scale: f64,
    [q, k, v, o, lse, d_o]: [&View; 6],
    [dq, dk, dv]: [&View; 3],
) -> Result<()> {
    let (qs, ks, vs) = (dense_compute::<T>(op, q)?, dense_compute::<T>(op, k)?, dense_compute::<T>(op, v)?);
    let (os, dos, lses) = (dense_compute::<T>(op, o)?, dense_compute::<T>(op, d_o)?, dense::<f32>(op, lse)?);
    let (mut dqs, mut dks, mut dvs) =
        (Dense::<T>::output(op, dq)?, Dense::<T>::output(op, dk)?, Dense::<T>::output(op, dv)?);
    let Dims { hk, s, t, d, .. } = dm;
    let (group, scale) = (dm.group(), C::<T>::from_f64(scale));
    // One task per (batch, kv head): it owns the dq rows of the group's query heads (adjacent
    // in memory) and the whole dk/dv head, which the group's heads all add into, so no two
    // tasks write the same element.
    let n_tasks = dm.b * hk;
    let tasks: Vec<_> = split_mut(dqs.slice(), n_tasks, group * s * d)
        .into_iter()
        .zip(split_mut(dks.slice(), n_tasks, t * d).into_iter().zip(split_mut(dvs.slice(), n_tasks, t * d)))
        .collect();
    tasks.into_par_iter().enumerate().with_min_len(min_tasks(&dm, group * s)).for_each(
        |(bg, (dq_group, (dk_head, dv_head)))| {
            let kv = bg * t * d;
            let (k_head, v_head) = (&ks[kv..][..t * d], &vs[kv..][..t * d]);
            let mut dk_acc = vec![C::<T>::ZERO; t * d];
            let mut dv_acc = vec![C::<T>::ZERO; t * d];
            let mut dq_acc = vec![C::<T>::ZERO; d];
            for hh in 0..group {
                // Query heads of kv head g of batch b are h = g*group + hh, so (b*hq + h) is this.
                let bh = bg * group + hh;
                for i in 0..s {
                    let row = (bh * s + i) * d;
                    let (q_row, o_row, do_row) = (&qs[row..][..d], &os[row..][..d], &dos[row..][..d]);
                    let n = dm.visible(causal, i);
                    let l = C::<T>::from_f32(lses[bh * s + i]);
                    // D_i = <do_i, o_i> = sum_j P_ij <do_i, v_j>, the softmax Jacobian's rank-1 term.
                    let big_d = dot(do_row, o_row);
                    dq_acc.fill(C::<T>::ZERO);
                    for j in 0..n {
                        let (k_row, v_row) = (&k_head[j * d..][..d], &v_head[j * d..][..d]);
                        let p = (scale * dot(q_row, k_row) - l).exp();
                        let ds = p * (dot(do_row, v_row) - big_d);
                        let sds = scale * ds;
                        for c in 0..d {
                            dq_acc[c] += ds * k_row[c];
                            dk_acc[j * d + c] += sds * q_row[c];
                            dv_acc[j * d + c] += p * do_row[c];
                        }
                    }
                    for (out, &a) in dq_group[(hh * s + i) * d..][..d].iter_mut().zip(&dq_acc) {
                        *out = T::store(scale * a);
                    }
                }
            }
            for (out, &a) in dk_head.iter_mut().zip(&dk_acc) {
                *out = T::store(a);
            }
            for (out, &a) in dv_head.iter_mut().zip(&dv_acc) {
                *out = T::store(a);
            }
        },
    );
    dqs.finish();
    dks.finish();
    dvs.finish();
    Ok(())
}

inventory::submit! { Kernel { claims, run } }
