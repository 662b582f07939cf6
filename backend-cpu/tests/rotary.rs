//! Rotary position embedding and its inverse (its backward) against the f64 reference below
//! (see `common::fused` for the method and the tolerances).

mod common;

use common::fused::*;
use common::reference::*;
use genesis_backend_api::sdk::offsets;
use genesis_backend_api::{DType, Device, ErrorKind, Op, TensorDesc};
use rstest::rstest;

fn rotary_ref(x: &[f64], cos: &[f64], sin: &[f64], s: usize, d: usize, inverse: bool) -> Vec<f64> {
    let half = d / 2;
    let mut y = vec![0.0; x.len()];
    for (row, (xr, yr)) in x.chunks(d).zip(y.chunks_mut(d)).enumerate() {
        let pos = row % s;
        for i in 0..half {
            let (c, sn) = (cos[pos * half + i], sin[pos * half + i] * if inverse { -1.0 } else { 1.0 });
            yr[i] = xr[i] * c - xr[i + half] * sn;
            yr[i + half] = xr[i + half] * c + xr[i] * sn;
        }
    }
    y
}

fn rotary_tables(s: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
    let half = d / 2;
    let angle = |p: usize, i: usize| p as f64 / 10000f64.powf(2.0 * i as f64 / d as f64);
    let cos = (0..s * half).map(|k| angle(k / half, k % half).cos()).collect();
    let sin = (0..s * half).map(|k| angle(k / half, k % half).sin()).collect();
    (cos, sin)
}

#[test]
fn reference_rotary_inverse_is_its_backward() {
    let mut rng = Rng(10);
    let (s, d) = (3, 4);
    let (cos, sin) = rotary_tables(s, d);
    let (x, dy) = (rng.vec(2 * s * d, 1.0), rng.vec(2 * s * d, 1.0));
    let grad = rotary_ref(&dy, &cos, &sin, s, d, true);
    check_fd("rotary", |x| dot(&rotary_ref(x, &cos, &sin, s, d, false), &dy), &x, &grad);
}

#[rstest]
fn rotary(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    #[values(false, true)] inverse: bool,
    #[values([2, 3, 5, 8], [2, 4, 64, 128])] shape: [usize; 4],
) {
    let h = Harness::new();
    let mut rng = Rng(11);
    let [_, _, s, d] = shape;
    let (cos, sin) = rotary_tables(s, d);
    let (cos, sin) = (round(dtype, &cos), round(dtype, &sin));
    let x = round(dtype, &rng.vec(shape.iter().product(), 2.0));
    let xt = h.input(dtype, &shape, layout, &x);
    let (ct, st) = (h.input(dtype, &[s, d / 2], layout, &cos), h.input(dtype, &[s, d / 2], layout, &sin));
    let yt = h.output(dtype, &shape, layout);
    h.ok(Op::Rotary { inverse }, &[&xt, &ct, &st], &[&yt]);
    assert_close("rotary", &h.download(&yt), &rotary_ref(&x, &cos, &sin, s, d, inverse), 4.0 * eps(dtype));
}

#[test]
fn rotary_takes_a_transposed_input() {
    // x laid out as (b, s, h, d) in memory and viewed as (b, h, s, d): the usual layout after
    // a QKV projection.
    let h = Harness::new();
    let mut rng = Rng(12);
    let (b, nh, s, d) = (2, 3, 4, 6);
    let mem = rng.vec(b * s * nh * d, 1.0);
    let buffer = h.dev.allocate(mem.len() * 4).unwrap();
    let bytes: Vec<u8> = mem.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
    h.dev.write(buffer, 0, &bytes).unwrap();
    let strides = [(s * nh * d) as isize, d as isize, (nh * d) as isize, 1];
    let xt = TensorDesc::new(buffer, 0, F32, &[b, nh, s, d], &strides).unwrap();
    let x: Vec<f64> = offsets(&[b, nh, s, d], &strides).map(|o| mem[o as usize] as f32 as f64).collect();
    let (cos, sin) = rotary_tables(s, d);
    let (cos, sin) = (round(F32, &cos), round(F32, &sin));
    let (ct, st) = (h.input(F32, &[s, d / 2], Dense, &cos), h.input(F32, &[s, d / 2], Dense, &sin));
    let yt = h.output(F32, &[b, nh, s, d], Dense);
    h.ok(Op::Rotary { inverse: false }, &[&xt, &ct, &st], &[&yt]);
    assert_close("rotary", &h.download(&yt), &rotary_ref(&x, &cos, &sin, s, d, false), 4.0 * eps(F32));
}

#[test]
fn rotary_validates_operands() {
    let h = Harness::new();
    let x = h.input(F32, &[1, 1, 2, 5], Dense, &[0.0; 10]);
    let c = h.input(F32, &[2, 2], Dense, &[0.0; 4]);
    let y = h.output(F32, &[1, 1, 2, 5], Dense);
    h.fails(Op::Rotary { inverse: false }, &[&x, &c, &c], &[&y], ErrorKind::ShapeMismatch);
    let x = h.input(F32, &[1, 2, 4], Dense, &[0.0; 8]);
    let y = h.output(F32, &[1, 2, 4], Dense);
    h.fails(Op::Rotary { inverse: false }, &[&x, &c, &c], &[&y], ErrorKind::ShapeMismatch);
    let x = h.input(F32, &[1, 1, 2, 4], Dense, &[0.0; 8]);
    let y = h.output(F32, &[1, 1, 2, 4], Dense);
    let c16 = h.input(F16, &[2, 2], Dense, &[0.0; 4]);
    h.fails(Op::Rotary { inverse: false }, &[&x, &c16, &c16], &[&y], ErrorKind::DtypeMismatch);
    let c3 = h.input(F32, &[3, 2], Dense, &[0.0; 6]);
    h.fails(Op::Rotary { inverse: false }, &[&x, &c3, &c3], &[&y], ErrorKind::ShapeMismatch);
}

/// The expected caches of `RotaryKvWrite`: `cache` (b, hk, t, d) with `new` (b, hk, s, d)
/// written at positions `p..p + s`.
fn written(cache: &[f64], new: &[f64], [b, hk, s, t, d]: [usize; 5], p: usize) -> Vec<f64> {
    let mut out = cache.to_vec();
    for row in 0..b * hk {
        for i in 0..s {
            let (to, from) = ((row * t + p + i) * d, (row * s + i) * d);
            out[to..to + d].copy_from_slice(&new[from..from + d]);
        }
    }
    out
}

#[rstest]
fn rotary_kv_write(
    #[values(F32, F64, F16, BF16)] dtype: DType,
    #[values(Dense, Strided)] layout: Layout,
    // (b, hq, hk, s, t, d) and the position: a decode step (Qwen2.5-0.5B's heads) at the
    // first, a middle and the last position, and several new positions filling the cache's end.
    #[values(([2, 14, 2, 1, 40, 64], 0), ([2, 14, 2, 1, 40, 64], 17), ([2, 14, 2, 1, 40, 128], 39), ([1, 4, 2, 5, 9, 8], 4))]
    case: ([usize; 6], usize),
) {
    let ([b, hq, hk, s, t, d], p) = case;
    let h = Harness::new();
    let mut rng = Rng(13);
    let (cos, sin) = rotary_tables(s, d);
    let (cos, sin) = (round(dtype, &cos), round(dtype, &sin));
    let (qs, kvs, cs) = ([b, hq, s, d], [b, hk, s, d], [b, hk, t, d]);
    let data = |rng: &mut Rng, shape: &[usize]| round(dtype, &rng.vec(shape.iter().product(), 2.0));
    let (q, k, v) = (data(&mut rng, &qs), data(&mut rng, &kvs), data(&mut rng, &kvs));
    let (kc0, vc0) = (data(&mut rng, &cs), data(&mut rng, &cs));
    let [qt, kt, vt] = [(&qs, &q), (&kvs, &k), (&kvs, &v)].map(|(shape, x)| h.input(dtype, shape, layout, x));
    let (ct, st) = (h.input(dtype, &[s, d / 2], layout, &cos), h.input(dtype, &[s, d / 2], layout, &sin));
    let pt = h.input(I64, &[1], Dense, &[p as f64]);
    let qo = h.output(dtype, &qs, layout);
    let (kc, vc) = (h.input(dtype, &cs, layout, &kc0), h.input(dtype, &cs, layout, &vc0));
    h.ok(Op::RotaryKvWrite, &[&qt, &kt, &vt, &ct, &st, &pt], &[&qo, &kc, &vc]);
    let tol = 4.0 * eps(dtype);
    assert_close("q_out", &h.download(&qo), &rotary_ref(&q, &cos, &sin, s, d, false), tol);
    let dims = [b, hk, s, t, d];
    let k_want = written(&kc0, &rotary_ref(&k, &cos, &sin, s, d, false), dims, p);
    assert_close("k_cache", &h.download(&kc), &k_want, tol);
    // The other positions are left bit for bit, and v is copied exactly.
    let k_got = h.download(&kc);
    let untouched = |i: usize| (i / d) % t < p || (i / d) % t >= p + s;
    assert!((0..k_got.len()).filter(|&i| untouched(i)).all(|i| k_got[i] == kc0[i]), "k_cache changed elsewhere");
    assert_eq!(h.download(&vc), written(&vc0, &v, dims, p));
}

#[test]
fn rotary_kv_write_takes_the_projections_views() {
    // q, k and v as the decode step has them: (b, h, s, d) views of one stacked projection
    // laid out (b, s, (hq + 2 hk) d), and a cache holding more positions than the step needs.
    let h = Harness::new();
    let mut rng = Rng(14);
    let (b, hq, hk, s, t, d, p) = (2, 4, 2, 3, 11, 6, 5);
    let width = (hq + 2 * hk) * d;
    let mem = rng.vec(b * s * width, 1.0);
    let buffer = h.dev.allocate(mem.len() * 4).unwrap();
    let bytes: Vec<u8> = mem.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
    h.dev.write(buffer, 0, &bytes).unwrap();
    let view = |start: usize, heads: usize| {
        let strides = [(s * width) as isize, d as isize, width as isize, 1];
        let desc = TensorDesc::new(buffer, start * 4, F32, &[b, heads, s, d], &strides).unwrap();
        let values: Vec<f64> =
            offsets(&[b, heads, s, d], &strides).map(|o| mem[start + o as usize] as f32 as f64).collect();
        (desc, values)
    };
    let ((qt, q), (kt, k), (vt, v)) = (view(0, hq), view(hq * d, hk), view((hq + hk) * d, hk));
    let (cos, sin) = rotary_tables(s, d);
    let (cos, sin) = (round(F32, &cos), round(F32, &sin));
    let (ct, st) = (h.input(F32, &[s, d / 2], Dense, &cos), h.input(F32, &[s, d / 2], Dense, &sin));
    let pt = h.input(I64, &[1], Dense, &[p as f64]);
    let cs = [b, hk, t, d];
    let (kc0, vc0) = (round(F32, &rng.vec(b * hk * t * d, 1.0)), round(F32, &rng.vec(b * hk * t * d, 1.0)));
    let (kc, vc) = (h.input(F32, &cs, Dense, &kc0), h.input(F32, &cs, Dense, &vc0));
    let qo = h.output(F32, &[b, hq, s, d], Dense);
    h.ok(Op::RotaryKvWrite, &[&qt, &kt, &vt, &ct, &st, &pt], &[&qo, &kc, &vc]);
    let tol = 4.0 * eps(F32);
    assert_close("q_out", &h.download(&qo), &rotary_ref(&q, &cos, &sin, s, d, false), tol);
    let dims = [b, hk, s, t, d];
    assert_close("k_cache", &h.download(&kc), &written(&kc0, &rotary_ref(&k, &cos, &sin, s, d, false), dims, p), tol);
    assert_eq!(h.download(&vc), written(&vc0, &v, dims, p));
}

#[test]
fn rotary_kv_write_refuses_a_position_outside_the_cache_and_writes_nothing() {
    let h = Harness::new();
    let mut rng = Rng(15);
    let (b, hq, hk, s, t, d) = (1, 2, 1, 2, 6, 4);
    let (cos, sin) = rotary_tables(s, d);
    let q = h.input(F32, &[b, hq, s, d], Dense, &rng.vec(b * hq * s * d, 1.0));
    let kv = rng.vec(b * hk * s * d, 1.0);
    let (k, v) = (h.input(F32, &[b, hk, s, d], Dense, &kv), h.input(F32, &[b, hk, s, d], Dense, &kv));
    let (ct, st) = (h.input(F32, &[s, d / 2], Dense, &cos), h.input(F32, &[s, d / 2], Dense, &sin));
    let cache0 = round(F32, &rng.vec(b * hk * t * d, 1.0));
    let (kc, vc) = (h.input(F32, &[b, hk, t, d], Dense, &cache0), h.input(F32, &[b, hk, t, d], Strided, &cache0));
    let qo = h.input(F32, &[b, hq, s, d], Dense, &vec![0.25; b * hq * s * d]);
    for p in [-1i64, (t - s + 1) as i64, i64::MIN, i64::MAX] {
        let pt = h.input(I64, &[1], Dense, &[p as f64]);
        let message =
            h.fails(Op::RotaryKvWrite, &[&q, &k, &v, &ct, &st, &pt], &[&qo, &kc, &vc], ErrorKind::InvalidArgument);
        assert!(message.contains(&format!("position {p} is out of range [0, 5)")), "{message}");
        assert_eq!(h.download(&kc), cache0);
        assert_eq!(h.download(&vc), cache0);
        assert!(h.download(&qo).iter().all(|&x| x == 0.25));
    }
    // The last position that fits is fine, and so is a cache of exactly the new positions.
    let pt = h.input(I64, &[1], Dense, &[(t - s) as f64]);
    h.ok(Op::RotaryKvWrite, &[&q, &k, &v, &ct, &st, &pt], &[&qo, &kc, &vc]);
    let exact = h.input(F32, &[b, hk, s, d], Dense, &kv);
    let exact_v = h.input(F32, &[b, hk, s, d], Dense, &kv);
    let zero = h.input(I64, &[1], Dense, &[0.0]);
    h.ok(Op::RotaryKvWrite, &[&q, &k, &v, &ct, &st, &zero], &[&qo, &exact, &exact_v]);
    assert_eq!(h.download(&exact_v), round(F32, &kv));
    // Operand rules come from the SDK check (one message on every backend).
    let short = [0, 1].map(|_| h.input(F32, &[b, hk, 1, d], Dense, &vec![0.0; b * hk * d]));
    let message = h.fails(
        Op::RotaryKvWrite,
        &[&q, &k, &v, &ct, &st, &zero],
        &[&qo, &short[0], &short[1]],
        ErrorKind::ShapeMismatch,
    );
    assert!(message.starts_with("rotary_kv_write: k_cache [1, 1, 1, 4]"), "{message}");
}
