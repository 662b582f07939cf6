//! Attention (causal or not, grouped-query heads), forward and backward, against the f64
//! references below (see `common::fused` for the method and the tolerances).

mod common;

use common::fused::*;
use common::reference::*;
use genesis_backend_api::{DType, ErrorKind, Op};
use rstest::rstest;

#[derive(Debug, Clone, Copy)]
struct Attn {
    b: usize,
    hq: usize,
    hk: usize,
    s: usize,
    t: usize,
    d: usize,
    causal: bool,
}

impl Attn {
    fn q_shape(&self) -> [usize; 4] {
        [self.b, self.hq, self.s, self.d]
    }
    fn kv_shape(&self) -> [usize; 4] {
        [self.b, self.hk, self.t, self.d]
    }
    fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }
    /// Keys visible to query i.
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            ((i + self.t + 1) as i64 - self.s as i64).clamp(0, self.t as i64) as usize
        } else {
            self.t
        }
    }
    fn kv_head(&self, b: usize, h: usize) -> usize {
        b * self.hk + h / (self.hq / self.hk)
    }
}

/// (o, lse); a query that sees no key gets NaN in both.
fn attention_ref(a: &Attn, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (s, t, d) = (a.s, a.t, a.d);
    let (mut o, mut lse) = (vec![], vec![]);
    for b in 0..a.b {
        for h in 0..a.hq {
            let kv = a.kv_head(b, h) * t * d;
            for i in 0..s {
                let qi = &q[((b * a.hq + h) * s + i) * d..][..d];
                let n = a.visible(i);
                let scores: Vec<f64> = (0..n).map(|j| a.scale() * dot(qi, &k[kv + j * d..][..d])).collect();
                let (m, sum) = max_and_exp_sum(&scores);
                for c in 0..d {
                    let weighted: f64 = (0..n).map(|j| (scores[j] - m).exp() / sum * v[kv + j * d + c]).sum();
                    o.push(if n == 0 { f64::NAN } else { weighted });
                }
                lse.push(if n == 0 { f64::NAN } else { m + sum.ln() });
            }
        }
    }
    (o, lse)
}

/// (dq, dk, dv) from the saved o and lse.
fn attention_backward_ref(a: &Attn, [q, k, v, o, lse, d_o]: [&[f64]; 6]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (s, t, d) = (a.s, a.t, a.d);
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for b in 0..a.b {
        for h in 0..a.hq {
            let kv = a.kv_head(b, h) * t * d;
            for i in 0..s {
                let row = ((b * a.hq + h) * s + i) * d;
                let (qi, oi, doi) = (&q[row..][..d], &o[row..][..d], &d_o[row..][..d]);
                let big_d = dot(doi, oi);
                for j in 0..a.visible(i) {
                    let (kj, vj) = (&k[kv + j * d..][..d], &v[kv + j * d..][..d]);
                    let p = (a.scale() * dot(qi, kj) - lse[(b * a.hq + h) * s + i]).exp();
                    let ds = p * (dot(doi, vj) - big_d);
                    for c in 0..d {
                        dq[row + c] += a.scale() * ds * kj[c];
                        dk[kv + j * d + c] += a.scale() * ds * qi[c];
                        dv[kv + j * d + c] += p * doi[c];
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}

#[rstest]
#[case(Attn { b: 1, hq: 2, hk: 1, s: 3, t: 4, d: 3, causal: false })]
#[case(Attn { b: 1, hq: 2, hk: 1, s: 3, t: 4, d: 3, causal: true })]
#[case(Attn { b: 2, hq: 2, hk: 2, s: 3, t: 3, d: 2, causal: true })]
fn reference_attention_backward_matches_finite_differences(#[case] a: Attn) {
    let mut rng = Rng(13);
    let (nq, nk) = (a.b * a.hq * a.s * a.d, a.b * a.hk * a.t * a.d);
    let (q, k, v, d_o) = (rng.vec(nq, 1.0), rng.vec(nk, 1.0), rng.vec(nk, 1.0), rng.vec(nq, 1.0));
    let (o, lse) = attention_ref(&a, &q, &k, &v);
    let (dq, dk, dv) = attention_backward_ref(&a, [&q, &k, &v, &o, &lse, &d_o]);
    check_fd("dq", |q| dot(&attention_ref(&a, q, &k, &v).0, &d_o), &q, &dq);
    check_fd("dk", |k| dot(&attention_ref(&a, &q, k, &v).0, &d_o), &k, &dk);
    check_fd("dv", |v| dot(&attention_ref(&a, &q, &k, v).0, &d_o), &v, &dv);
}

#[rstest]
#[case::plain(Attn { b: 2, hq: 3, hk: 3, s: 5, t: 7, d: 8, causal: false })]
#[case::causal_gqa(Attn { b: 2, hq: 4, hk: 2, s: 5, t: 5, d: 8, causal: true })]
#[case::causal_more_keys(Attn { b: 1, hq: 2, hk: 1, s: 3, t: 6, d: 4, causal: true })]
#[case::causal_fewer_keys(Attn { b: 1, hq: 2, hk: 2, s: 6, t: 3, d: 4, causal: true })]
#[case::large(Attn { b: 2, hq: 4, hk: 1, s: 40, t: 48, d: 32, causal: true })]
fn attention(#[values(F32, F64, F16, BF16)] dtype: DType, #[values(Dense, Strided)] layout: Layout, #[case] a: Attn) {
    let h = Harness::new();
    let mut rng = Rng(14);
    let (qs, ks) = (a.q_shape(), a.kv_shape());
    let (nq, nk) = (qs.iter().product(), ks.iter().product());
    let (q, k, v) = (round(dtype, &rng.vec(nq, 2.0)), round(dtype, &rng.vec(nk, 2.0)), round(dtype, &rng.vec(nk, 1.0)));
    let (qt, kt, vt) =
        (h.input(dtype, &qs, layout, &q), h.input(dtype, &ks, layout, &k), h.input(dtype, &ks, layout, &v));
    let (ot, lt) = (h.output(dtype, &qs, layout), h.output(F32, &qs[..3], layout));
    h.ok(Op::Attention { causal: a.causal, scale: a.scale() }, &[&qt, &kt, &vt], &[&ot, &lt]);
    let (o, lse) = attention_ref(&a, &q, &k, &v);
    if a.s > a.t && a.causal {
        assert!(lse[0].is_nan() && o[0].is_nan(), "the first query sees no key");
    }
    assert_close("o", &h.download(&ot), &o, 4.0 * eps_of_compute(dtype));
    assert_close("lse", &h.download(&lt), &lse, STAT_TOL);

    let (o, lse) = (round(dtype, &o), round(F32, &lse));
    let d_o = round(dtype, &rng.vec(nq, 1.0));
    let (ot, lt, dot_) =
        (h.input(dtype, &qs, layout, &o), h.input(F32, &qs[..3], layout, &lse), h.input(dtype, &qs, layout, &d_o));
    let (dqt, dkt, dvt) = (h.output(dtype, &qs, layout), h.output(dtype, &ks, layout), h.output(dtype, &ks, layout));
    let op = Op::AttentionBackward { causal: a.causal, scale: a.scale() };
    h.ok(op, &[&qt, &kt, &vt, &ot, &lt, &dot_], &[&dqt, &dkt, &dvt]);
    let (dq, dk, dv) = attention_backward_ref(&a, [&q, &k, &v, &o, &lse, &d_o]);
    let tol = 16.0 * eps_of_compute(dtype);
    assert_close("dq", &h.download(&dqt), &dq, tol);
    assert_close("dk", &h.download(&dkt), &dk, tol);
    assert_close("dv", &h.download(&dvt), &dv, tol);
}

#[test]
fn attention_validates_operands() {
    let h = Harness::new();
    let q = h.input(F32, &[1, 3, 2, 4], Dense, &[0.0; 24]);
    let k = h.input(F32, &[1, 2, 2, 4], Dense, &[0.0; 16]);
    let o = h.output(F32, &[1, 3, 2, 4], Dense);
    let lse = h.output(F32, &[1, 3, 2], Dense);
    let op = Op::Attention { causal: false, scale: 0.5 };
    let m = h.fails(op, &[&q, &k, &k], &[&o, &lse], ErrorKind::ShapeMismatch);
    assert!(m.contains("multiple"), "{m}");
    let k = h.input(F32, &[1, 1, 2, 3], Dense, &[0.0; 6]);
    h.fails(op, &[&q, &k, &k], &[&o, &lse], ErrorKind::ShapeMismatch);
    let k = h.input(F32, &[1, 1, 5, 4], Dense, &[0.0; 20]);
    let lse16 = h.output(F16, &[1, 3, 2], Dense);
    h.fails(op, &[&q, &k, &k], &[&o, &lse16], ErrorKind::DtypeMismatch);
    h.ok(op, &[&q, &k, &k], &[&o, &lse]);
}
