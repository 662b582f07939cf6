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
