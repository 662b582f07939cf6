//! Fused ops of the interface in f64, over rows of the last dim, and their vector-Jacobian
//! products (checked against central finite differences in the tests below).

use super::tensor::sum;
use crate::values::quantize;
use genesis_backend_api::sdk::checks::AttentionDims;
use genesis_backend_api::DType;

/// Softmax of each row of length `n`; an all `-inf` row gives NaN.
pub fn softmax(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n.max(1))
        .flat_map(|row| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|&v| (v - m).exp()).collect();
            let s = sum(&e);
            e.into_iter().map(move |v| v / s)
        })
        .collect()
}

/// Log-softmax of each row.
pub fn log_softmax(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n.max(1))
        .flat_map(|row| {
            let lse = logsumexp(row);
            row.iter().map(move |&v| v - lse)
        })
        .collect()
}

/// `log Σ e^x`, max-shifted.
pub fn logsumexp(row: &[f64]) -> f64 {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return f64::NAN;
    }
    m + sum(&row.iter().map(|&v| (v - m).exp()).collect::<Vec<_>>()).ln()
}

/// Softmax VJP from the output: `y·(dy - Σ dy·y)`.
pub fn softmax_vjp(y: &[f64], dy: &[f64], n: usize) -> Vec<f64> {
    y.chunks(n)
        .zip(dy.chunks(n))
        .flat_map(|(y, g)| {
            let dot = sum(&y.iter().zip(g).map(|(a, b)| a * b).collect::<Vec<_>>());
            y.iter().zip(g).map(move |(a, b)| a * (b - dot)).collect::<Vec<_>>()
        })
        .collect()
}

/// Log-softmax VJP from the output: `dy - e^y·Σ dy`.
pub fn log_softmax_vjp(y: &[f64], dy: &[f64], n: usize) -> Vec<f64> {
    y.chunks(n)
        .zip(dy.chunks(n))
        .flat_map(|(y, g)| {
            let s = sum(g);
            y.iter().zip(g).map(move |(a, b)| b - a.exp() * s).collect::<Vec<_>>()
        })
        .collect()
}

/// Layer norm of rows: `(y, mean, rstd)` with the biased variance (two-pass).
pub fn layer_norm(x: &[f64], w: &[f64], b: &[f64], n: usize, eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut means, mut rstds) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks(n) {
        let mean = sum(row) / n as f64;
        let var = sum(&row.iter().map(|v| (v - mean).powi(2)).collect::<Vec<_>>()) / n as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        y.extend(row.iter().enumerate().map(|(j, v)| (v - mean) * rstd * w[j] + b[j]));
        means.push(mean);
        rstds.push(rstd);
    }
    (y, means, rstds)
}

/// Layer norm VJP: `(dx, dweight, dbias)`.
pub fn layer_norm_vjp(x: &[f64], w: &[f64], dy: &[f64], n: usize, eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (_, means, rstds) = layer_norm(x, w, &vec![0.0; n], n, eps);
    let (mut dx, mut dw, mut db) = (Vec::new(), vec![0.0; n], vec![0.0; n]);
    for (r, (row, g)) in x.chunks(n).zip(dy.chunks(n)).enumerate() {
        let xhat: Vec<f64> = row.iter().map(|v| (v - means[r]) * rstds[r]).collect();
        let dxhat: Vec<f64> = g.iter().zip(w).map(|(a, b)| a * b).collect();
        let m1 = sum(&dxhat) / n as f64;
        let m2 = sum(&dxhat.iter().zip(&xhat).map(|(a, b)| a * b).collect::<Vec<_>>()) / n as f64;
        dx.extend((0..n).map(|j| rstds[r] * (dxhat[j] - m1 - xhat[j] * m2)));
        for j in 0..n {
            dw[j] += g[j] * xhat[j];
            db[j] += g[j];
        }
    }
    (dx, dw, db)
}

/// Batch norm of `x (n, c, s)` with the batch's statistics: `(y, mean, rstd)` per channel,
/// biased variance (two-pass).
pub fn batch_norm(x: &[f64], w: &[f64], b: &[f64], [n, c, s]: [usize; 3], eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let at = |i: usize, ch: usize, j: usize| (i * c + ch) * s + j;
    let channel = |ch: usize| -> Vec<f64> { (0..n).flat_map(|i| (0..s).map(move |j| x[at(i, ch, j)])).collect() };
    let (mut means, mut rstds) = (Vec::new(), Vec::new());
    for ch in 0..c {
        let v = channel(ch);
        let mean = sum(&v) / v.len() as f64;
        let var = sum(&v.iter().map(|a| (a - mean).powi(2)).collect::<Vec<_>>()) / v.len() as f64;
        means.push(mean);
        rstds.push(1.0 / (var + eps).sqrt());
    }
    let y = (0..x.len()).map(|k| {
        let ch = (k / s) % c;
        (x[k] - means[ch]) * rstds[ch] * w[ch] + b[ch]
    });
    (y.collect(), means, rstds)
}

/// Batch norm VJP: `(dx, dweight, dbias)`.
pub fn batch_norm_vjp(x: &[f64], w: &[f64], dy: &[f64], shape: [usize; 3], eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let [n, c, s] = shape;
    let (_, means, rstds) = batch_norm(x, w, &vec![0.0; c], shape, eps);
    let xhat: Vec<f64> = (0..x.len()).map(|k| (x[k] - means[(k / s) % c]) * rstds[(k / s) % c]).collect();
    let (mut dw, mut db) = (vec![0.0; c], vec![0.0; c]);
    for k in 0..x.len() {
        let ch = (k / s) % c;
        db[ch] += dy[k];
        dw[ch] += dy[k] * xhat[k];
    }
    let m = (n * s) as f64;
    let dx = (0..x.len())
        .map(|k| {
            let ch = (k / s) % c;
            w[ch] * rstds[ch] * (dy[k] - db[ch] / m - xhat[k] * dw[ch] / m)
        })
        .collect();
    (dx, dw, db)
}

/// RMS norm of rows: `(y, rstd)`.
pub fn rms_norm(x: &[f64], w: &[f64], n: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut rstds) = (Vec::new(), Vec::new());
    for row in x.chunks(n) {
        let rstd = 1.0 / (sum(&row.iter().map(|v| v * v).collect::<Vec<_>>()) / n as f64 + eps).sqrt();
        y.extend(row.iter().enumerate().map(|(j, v)| v * rstd * w[j]));
        rstds.push(rstd);
    }
    (y, rstds)
}

/// RMS norm after a residual addition: `(y, sum, rstd)` with `sum = x + residual` rounded to
/// `dtype` (what the op stores) and `y, rstd` the RMS norm of that rounded sum.
pub fn add_rms_norm(
    x: &[f64],
    residual: &[f64],
    w: &[f64],
    n: usize,
    eps: f64,
    dtype: DType,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let sum: Vec<f64> = x.iter().zip(residual).map(|(a, b)| quantize(dtype, a + b)).collect();
    let (y, rstd) = rms_norm(&sum, w, n, eps);
    (y, sum, rstd)
}

/// [`add_rms_norm`] then a linear layer over its output: `(y, magnitude, rounded, sum)` for
/// `x` and `residual` of rows of `k`, `w (n, k)` and an optional bias `(n)`. The normed rows
/// are rounded to `dtype`, as the op rounds them. Per output, `magnitude` is `Σ |h·w| +
/// |bias|`, the scale of the accumulation error, and `rounded` is what the op's own
/// roundings act on: the product and the sum before their rounding, plus the largest term
/// (a normed element whose rounding went the other way, as a statistic one ulp off makes it).
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_linear(
    x: &[f64],
    residual: &[f64],
    g: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    (k, n): (usize, usize),
    eps: f64,
    dtype: DType,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (h, sum, _) = add_rms_norm(x, residual, g, k, eps, dtype);
    let h: Vec<f64> = h.into_iter().map(|v| quantize(dtype, v)).collect();
    let w_t: Vec<f64> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
    let (mut y, mut magnitude) = super::tensor::matmul(&h, &w_t, 1, x.len() / k.max(1), k, n);
    let mut rounded: Vec<f64> = y
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let row = &h[(i / n) * k..(i / n + 1) * k];
            let largest = row.iter().zip(&w[(i % n) * k..]).map(|(a, b)| (a * b).abs()).fold(0.0, f64::max);
            p.abs() + largest
        })
        .collect();
    if let Some(b) = bias {
        for (i, ((v, m), r)) in y.iter_mut().zip(&mut magnitude).zip(&mut rounded).enumerate() {
            *v += b[i % n];
            *m += b[i % n].abs();
            *r += v.abs();
        }
    }
    (y, magnitude, rounded, sum)
}

/// RMS norm VJP: `(dx, dweight)`.
pub fn rms_norm_vjp(x: &[f64], w: &[f64], dy: &[f64], n: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let (_, rstds) = rms_norm(x, w, n, eps);
    let (mut dx, mut dw) = (Vec::new(), vec![0.0; n]);
    for (r, (row, g)) in x.chunks(n).zip(dy.chunks(n)).enumerate() {
        let xhat: Vec<f64> = row.iter().map(|v| v * rstds[r]).collect();
        let dxhat: Vec<f64> = g.iter().zip(w).map(|(a, b)| a * b).collect();
        let m2 = sum(&dxhat.iter().zip(&xhat).map(|(a, b)| a * b).collect::<Vec<_>>()) / n as f64;
        dx.extend((0..n).map(|j| rstds[r] * (dxhat[j] - xhat[j] * m2)));
        for j in 0..n {
            dw[j] += g[j] * xhat[j];
        }
    }
    (dx, dw)
}

/// Cross-entropy per row with label smoothing `eps`: `(loss, lse)`; ignored rows lose 0.
pub fn cross_entropy(logits: &[f64], target: &[f64], c: usize, ignore: i64, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let (mut loss, mut lses) = (Vec::new(), Vec::new());
    for (row, &t) in logits.chunks(c).zip(target) {
        let lse = logsumexp(row);
        lses.push(lse);
        if t as i64 == ignore {
            loss.push(0.0);
        } else {
            let mean = sum(row) / c as f64;
            loss.push((1.0 - eps) * (lse - row[t as usize]) + eps * (lse - mean));
        }
    }
    (loss, lses)
}

/// Cross-entropy VJP: `dloss·(softmax - (1-ε)·onehot - ε/c)`, zero on ignored rows.
pub fn cross_entropy_vjp(logits: &[f64], target: &[f64], dloss: &[f64], c: usize, ignore: i64, eps: f64) -> Vec<f64> {
    let p = softmax(logits, c);
    let mut d = Vec::new();
    for (r, &t) in target.iter().enumerate() {
        for j in 0..c {
            d.push(if t as i64 == ignore {
                0.0
            } else {
                let onehot = if j == t as usize { 1.0 } else { 0.0 };
                dloss[r] * (p[r * c + j] - (1.0 - eps) * onehot - eps / c as f64)
            });
        }
    }
    d
}

/// Rotary embedding of `x (rows, s, d)` by `cos`/`sin (s, d/2)` in the rotate-half layout;
/// `inverse` rotates by the negative angle (which is also the VJP of the forward).
pub fn rotary(x: &[f64], cos: &[f64], sin: &[f64], s: usize, d: usize, inverse: bool) -> (Vec<f64>, Vec<f64>) {
    let h = d / 2;
    let sign = if inverse { -1.0 } else { 1.0 };
    let (mut y, mut mag) = (vec![0.0; x.len()], vec![0.0; x.len()]);
    for (r, row) in x.chunks(d).enumerate() {
        let p = r % s;
        for i in 0..h {
            let (c, sn) = (cos[p * h + i], sign * sin[p * h + i]);
            let (a, b) = (row[i], row[i + h]);
            y[r * d + i] = a * c - b * sn;
            y[r * d + i + h] = b * c + a * sn;
            mag[r * d + i] = (a * c).abs() + (b * sn).abs();
            mag[r * d + i + h] = (b * c).abs() + (a * sn).abs();
        }
    }
    (y, mag)
}

/// What `RotaryKvWrite` leaves: `q_out` and its term magnitudes, the caches after the write,
/// the key cache's term magnitudes, and which cache elements were written.
#[derive(Debug, Clone, PartialEq)]
pub struct KvWrite {
    /// `rotary(q)`, `(b, hq, s, d)`.
    pub q_out: Vec<f64>,
    /// The magnitudes of `q_out`'s two terms (as [`rotary`]).
    pub q_mag: Vec<f64>,
    /// The key cache `(b, hk, t, d)`, `rotary(k)` at positions `p..p + s`.
    pub k_cache: Vec<f64>,
    /// The magnitudes of the key cache's rotated elements (0 elsewhere).
    pub k_mag: Vec<f64>,
    /// The value cache `(b, hk, t, d)`, `v` at positions `p..p + s`.
    pub v_cache: Vec<f64>,
    /// True for the cache elements at positions `p..p + s`.
    pub written: Vec<bool>,
}

/// `RotaryKvWrite` at position `p` of `q (b, hq, s, d)`, `k, v (b, hk, s, d)` with `cos`/`sin
/// (s, d/2)` into caches `(b, hk, t, d)` holding `k_cache`/`v_cache` (`g.t` is the caches'
/// length); `p + s <= t`.
#[allow(clippy::too_many_arguments)]
pub fn rotary_kv_write(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    cos: &[f64],
    sin: &[f64],
    k_cache: &[f64],
    v_cache: &[f64],
    g: AttentionDims,
    p: usize,
) -> KvWrite {
    let (q_out, q_mag) = rotary(q, cos, sin, g.s, g.d, false);
    let (k_rot, k_rot_mag) = rotary(k, cos, sin, g.s, g.d, false);
    let mut out = KvWrite {
        q_out,
        q_mag,
        k_cache: k_cache.to_vec(),
        k_mag: vec![0.0; k_cache.len()],
        v_cache: v_cache.to_vec(),
        written: vec![false; k_cache.len()],
    };
    for row in 0..g.b * g.hk {
        for i in 0..g.s {
            for j in 0..g.d {
                let (at, from) = ((row * g.t + p + i) * g.d + j, (row * g.s + i) * g.d + j);
                out.k_cache[at] = k_rot[from];
                out.k_mag[at] = k_rot_mag[from];
                out.v_cache[at] = v[from];
                out.written[at] = true;
            }
        }
    }
    out
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// SwiGLU `y = g·sigmoid(g)·u` elementwise, with each result's magnitude (for the tolerance).
pub fn swiglu(gate: &[f64], up: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let y: Vec<f64> = gate.iter().zip(up).map(|(&g, &u)| g * sigmoid(g) * u).collect();
    let mag = y.iter().map(|v| v.abs()).collect();
    (y, mag)
}

/// The gated form of `add_rms_norm_linear`: SwiGLU of the two halves of each row of `n`
/// products `p`, each first rounded to `dtype` as the op stores it, with `allowed` (the
/// products' allowed error) carried through: `(y, allowed_y)`. A product within its bound
/// may round one ulp apart from the oracle's, hence `2u·|p|` more before the gate; the
/// result's own rounding may flush to zero (a very negative gate).
pub fn swiglu_halves(p: &[f64], allowed: &[f64], n: usize, dtype: DType) -> (Vec<f64>, Vec<f64>) {
    let u = crate::values::unit_roundoff(dtype);
    let half = n / 2;
    let (mut y, mut bound) = (Vec::new(), Vec::new());
    for (row, tol) in p.chunks(n.max(1)).zip(allowed.chunks(n.max(1))) {
        for j in 0..half {
            let (g, up) = (quantize(dtype, row[j]), quantize(dtype, row[half + j]));
            let (eg, eu) = (tol[j] + 2.0 * u * g.abs(), tol[half + j] + 2.0 * u * up.abs());
            let s = sigmoid(g);
            let v = g * s * up;
            y.push(v);
            let rounding = 2.0 * u * v.abs() + crate::values::min_subnormal(dtype);
            bound.push((s * (1.0 + g * (1.0 - s)) * up).abs() * eg + (g * s).abs() * eu + rounding);
        }
    }
    (y, bound)
}

/// The VJP of [`swiglu`]: `(dgate, dup)` for the output gradient `dy`, with magnitudes.
#[allow(clippy::type_complexity)]
pub fn swiglu_vjp(dy: &[f64], gate: &[f64], up: &[f64]) -> ((Vec<f64>, Vec<f64>), (Vec<f64>, Vec<f64>)) {
    let (mut dgate, mut dup, mut mag_gate, mut mag_up) = (vec![], vec![], vec![], vec![]);
    for ((&d, &g), &u) in dy.iter().zip(gate).zip(up) {
        let s = sigmoid(g);
        dgate.push(d * u * s * (1.0 + g * (1.0 - s)));
        mag_gate.push((d * u * s).abs() * (1.0 + (g * (1.0 - s)).abs()));
        dup.push(d * g * s);
        mag_up.push((d * g * s).abs());
    }
    ((dgate, mag_gate), (dup, mag_up))
}

/// Scaled dot-product attention with grouped heads and bottom-right causal masking:
/// `(o, lse)`.
pub fn attention(q: &[f64], k: &[f64], v: &[f64], g: AttentionDims, causal: bool, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let AttentionDims { b, hq, hk, s, t, d } = g;
    let (mut o, mut lse) = (vec![0.0; b * hq * s * d], vec![0.0; b * hq * s]);
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hk);
            for i in 0..s {
                let scores: Vec<f64> = (0..t)
                    .map(|j| {
                        if j >= visible(g, causal, i) {
                            return f64::NEG_INFINITY;
                        }
                        let qi = &q[((bi * hq + h) * s + i) * d..][..d];
                        let kj = &k[((bi * hk + kh) * t + j) * d..][..d];
                        scale * sum(&qi.iter().zip(kj).map(|(a, b)| a * b).collect::<Vec<_>>())
                    })
                    .collect();
                let p = softmax(&scores, t);
                lse[(bi * hq + h) * s + i] = logsumexp(&scores);
                for c in 0..d {
                    let terms: Vec<f64> = (0..t).map(|j| p[j] * v[((bi * hk + kh) * t + j) * d + c]).collect();
                    o[((bi * hq + h) * s + i) * d + c] = sum(&terms);
                }
            }
        }
    }
    (o, lse)
}

/// Attention in which query `i` of batch row `b` sees the keys `j` with
/// `keep[(b * s + i) * t + j] != 0` (`MaskedAttention`): the output, NaN for a query that
/// keeps no key.
pub fn masked_attention(q: &[f64], k: &[f64], v: &[f64], keep: &[f64], g: AttentionDims, scale: f64) -> Vec<f64> {
    let AttentionDims { b, hq, hk, s, t, d } = g;
    let mut o = vec![0.0; b * hq * s * d];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hk);
            for i in 0..s {
                let kept: Vec<usize> = (0..t).filter(|&j| keep[(bi * s + i) * t + j] != 0.0).collect();
                let qi = &q[((bi * hq + h) * s + i) * d..][..d];
                let scores: Vec<f64> = kept
                    .iter()
                    .map(|&j| {
                        let kj = &k[((bi * hk + kh) * t + j) * d..][..d];
                        scale * sum(&qi.iter().zip(kj).map(|(a, b)| a * b).collect::<Vec<_>>())
                    })
                    .collect();
                let p = softmax(&scores, kept.len().max(1));
                for c in 0..d {
                    let terms: Vec<f64> =
                        kept.iter().enumerate().map(|(n, &j)| p[n] * v[((bi * hk + kh) * t + j) * d + c]).collect();
                    o[((bi * hq + h) * s + i) * d + c] = if kept.is_empty() { f64::NAN } else { sum(&terms) };
                }
            }
        }
    }
    o
}

/// Keys visible to query `i` (bottom-right aligned causal mask): `j < visible`.
fn visible(g: AttentionDims, causal: bool, i: usize) -> usize {
    if causal {
        (i + g.t + 1).saturating_sub(g.s).min(g.t)
    } else {
        g.t
    }
}

/// `(dq, dk, dv)`, or per-element values of the same shapes.
pub type Grads = (Vec<f64>, Vec<f64>, Vec<f64>);

/// Attention VJP `(dq, dk, dv)` from the saved `o` and `lse`, as the interface passes them
/// (`[q, k, v, o, lse, do] -> [dq, dk, dv]`): over the visible keys
/// `P = exp(scale·q·kᵀ - lse)`, `dv = Pᵀ·do`, `dS = P∘(do·vᵀ - rowsum(do∘o))`,
/// `dq = scale·dS·k`, `dk = scale·dSᵀ·q`; the query heads of a group add into their kv head,
/// and a query that sees no key contributes nothing. With the exact `o` and `lse` of
/// [`attention`] this is its VJP (checked by finite differences below).
///
/// Second, per element, the sum of the absolute values of its terms (`Σ|scale·dS·k|`,
/// `Σ|scale·dS·q|`, `Σ|P·do|`): the scale of the error a backend makes when it rounds P and
/// dS to the input dtype before the products, as flash-style kernels do to feed tensor cores.
#[allow(clippy::too_many_arguments)]
pub fn attention_vjp(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    o: &[f64],
    lse: &[f64],
    d_o: &[f64],
    g: AttentionDims,
    causal: bool,
    scale: f64,
) -> (Grads, Grads) {
    let AttentionDims { b, hq, hk, s, t, d } = g;
    let dot = |a: &[f64], b: &[f64]| sum(&a.iter().zip(b).map(|(x, y)| x * y).collect::<Vec<_>>());
    // dk and dv collect their terms (from every query of the group) and sum them at the end.
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![Vec::new(); k.len()], vec![Vec::new(); v.len()]);
    let mut dq_magnitude = vec![0.0; q.len()];
    for bi in 0..b {
        for h in 0..hq {
            let kv = bi * hk + h / (hq / hk);
            for i in 0..s {
                let row = ((bi * hq + h) * s + i) * d;
                let (qi, oi, doi) = (&q[row..][..d], &o[row..][..d], &d_o[row..][..d]);
                let l = lse[(bi * hq + h) * s + i];
                let big_d = dot(doi, oi);
                let mut dq_terms = vec![Vec::new(); d];
                for j in 0..visible(g, causal, i) {
                    let at = (kv * t + j) * d;
                    let (kj, vj) = (&k[at..][..d], &v[at..][..d]);
                    let p = (scale * dot(qi, kj) - l).exp();
                    let ds = p * (dot(doi, vj) - big_d);
                    for c in 0..d {
                        dq_terms[c].push(scale * ds * kj[c]);
                        dk[at + c].push(scale * ds * qi[c]);
                        dv[at + c].push(p * doi[c]);
                    }
                }
                for (c, terms) in dq_terms.iter().enumerate() {
                    dq[row + c] = sum(terms);
                    dq_magnitude[row + c] = terms.iter().map(|x| x.abs()).sum();
                }
            }
        }
    }
    let magnitude = |all: &[Vec<f64>]| all.iter().map(|terms| terms.iter().map(|x| x.abs()).sum()).collect();
    let (dk_magnitude, dv_magnitude) = (magnitude(&dk), magnitude(&dv));
    let dk = dk.iter().map(|terms| sum(terms)).collect();
    let dv = dv.iter().map(|terms| sum(terms)).collect();
    ((dq, dk, dv), (dq_magnitude, dk_magnitude, dv_magnitude))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::fd::{assert_close, data, fd_vjp};

    #[test]
    fn softmax_vjps_match_finite_differences() {
        let (x, dy) = (data("sx", 15), data("sdy", 15));
        assert_close(&softmax_vjp(&softmax(&x, 5), &dy, 5), &fd_vjp(&|x| softmax(x, 5), &x, &dy), "softmax");
        let ls = log_softmax(&x, 5);
        assert_close(&log_softmax_vjp(&ls, &dy, 5), &fd_vjp(&|x| log_softmax(x, 5), &x, &dy), "log_softmax");
    }

    #[test]
    fn norm_vjps_match_finite_differences() {
        let (x, w, b, dy) = (data("lx", 12), data("lw", 4), data("lb", 4), data("ldy", 12));
        let (dx, dw, db) = layer_norm_vjp(&x, &w, &dy, 4, 1e-5);
        assert_close(&dx, &fd_vjp(&|x| layer_norm(x, &w, &b, 4, 1e-5).0, &x, &dy), "layer_norm dx");
        assert_close(&dw, &fd_vjp(&|w| layer_norm(&x, w, &b, 4, 1e-5).0, &w, &dy), "layer_norm dw");
        assert_close(&db, &fd_vjp(&|b| layer_norm(&x, &w, b, 4, 1e-5).0, &b, &dy), "layer_norm db");
        let (w3, b3) = (data("bw", 3), data("bb", 3));
        let (x, dy) = (data("bx", 12), data("bdy", 12));
        let (dx, dw, db) = batch_norm_vjp(&x, &w3, &dy, [2, 3, 2], 1e-5);
        assert_close(&dx, &fd_vjp(&|x| batch_norm(x, &w3, &b3, [2, 3, 2], 1e-5).0, &x, &dy), "batch_norm dx");
        assert_close(&dw, &fd_vjp(&|w| batch_norm(&x, w, &b3, [2, 3, 2], 1e-5).0, &w3, &dy), "batch_norm dw");
        assert_close(&db, &fd_vjp(&|b| batch_norm(&x, &w3, b, [2, 3, 2], 1e-5).0, &b3, &dy), "batch_norm db");
        let (dx, dw) = rms_norm_vjp(&x, &w, &dy, 4, 1e-5);
        assert_close(&dx, &fd_vjp(&|x| rms_norm(x, &w, 4, 1e-5).0, &x, &dy), "rms_norm dx");
        assert_close(&dw, &fd_vjp(&|w| rms_norm(&x, w, 4, 1e-5).0, &w, &dy), "rms_norm dw");
    }

    #[test]
    fn cross_entropy_vjp_matches_finite_differences() {
        let (x, dl) = (data("cx", 18), data("cdl", 3));
        let target = [2.0, -100.0, 5.0];
        let d = cross_entropy_vjp(&x, &target, &dl, 6, -100, 0.1);
        assert_close(&d, &fd_vjp(&|x| cross_entropy(x, &target, 6, -100, 0.1).0, &x, &dl), "cross_entropy");
    }

    #[test]
    fn swiglu_vjp_matches_finite_differences() {
        let (g, u, dy) = (data("sg", 12), data("su", 12), data("sdy", 12));
        let ((dg, _), (du, _)) = swiglu_vjp(&dy, &g, &u);
        assert_close(&dg, &fd_vjp(&|g| swiglu(g, &u).0, &g, &dy), "swiglu dgate");
        assert_close(&du, &fd_vjp(&|u| swiglu(&g, u).0, &u, &dy), "swiglu dup");
    }

    #[test]
    fn rotary_inverse_is_the_vjp() {
        let (x, cos, sin, dy) = (data("rx", 24), data("rc", 6), data("rs", 6), data("rdy", 24));
        let vjp = rotary(&dy, &cos, &sin, 3, 4, true).0;
        assert_close(&vjp, &fd_vjp(&|x| rotary(x, &cos, &sin, 3, 4, false).0, &x, &dy), "rotary");
    }

    #[test]
    fn rotary_kv_write_writes_only_the_new_positions() {
        // b 1, hq 2, hk 1, s 2, t 4, d 2, written at p = 1; angles 0 and π/2.
        let g = AttentionDims { b: 1, hq: 2, hk: 1, s: 2, t: 4, d: 2 };
        let (cos, sin) = ([1.0, 0.0], [0.0, 1.0]);
        let (q, k, v) = (data("kq", 8), [1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
        let cache: Vec<f64> = (0..8).map(|i| -(i as f64)).collect();
        let out = rotary_kv_write(&q, &k, &v, &cos, &sin, &cache, &cache, g, 1);
        assert_eq!(out.q_out, rotary(&q, &cos, &sin, 2, 2, false).0);
        // Position 1 keeps (1, 2) (angle 0); position 2 gets (3, 4) rotated by π/2: (-4, 3).
        assert_eq!(out.k_cache, [-0.0, -1.0, 1.0, 2.0, -4.0, 3.0, -6.0, -7.0]);
        assert_eq!(out.v_cache, [-0.0, -1.0, 5.0, 6.0, 7.0, 8.0, -6.0, -7.0]);
        assert_eq!(out.written, [false, false, true, true, true, true, false, false]);
        assert_eq!(out.k_mag[..4], [0.0, 0.0, 1.0, 2.0]);
    }

    #[test]
    fn attention_of_one_key_returns_its_value() {
        let g = AttentionDims { b: 1, hq: 2, hk: 1, s: 1, t: 1, d: 2 };
        let (o, lse) = attention(&[1.0, 2.0, 3.0, 4.0], &[0.5, 0.5], &[7.0, -1.0], g, false, 1.0);
        assert_eq!(o, vec![7.0, -1.0, 7.0, -1.0]);
        assert_eq!(lse, vec![1.5, 3.5]);
    }

    #[test]
    fn attention_vjp_matches_finite_differences() {
        for (g, causal) in [
            (AttentionDims { b: 1, hq: 4, hk: 2, s: 3, t: 5, d: 3 }, false),
            (AttentionDims { b: 1, hq: 4, hk: 2, s: 3, t: 5, d: 3 }, true),
            (AttentionDims { b: 2, hq: 3, hk: 1, s: 4, t: 4, d: 2 }, true),
        ] {
            let (nq, nk) = (g.b * g.hq * g.s * g.d, g.b * g.hk * g.t * g.d);
            let (q, k, v, d_o) = (data("aq", nq), data("ak", nk), data("av", nk), data("ado", nq));
            let scale = 0.7;
            let (o, lse) = attention(&q, &k, &v, g, causal, scale);
            let (dq, dk, dv) = attention_vjp(&q, &k, &v, &o, &lse, &d_o, g, causal, scale).0;
            let what = format!("attention {g:?} causal {causal}");
            assert_close(&dq, &fd_vjp(&|q| attention(q, &k, &v, g, causal, scale).0, &q, &d_o), &format!("{what} dq"));
            assert_close(&dk, &fd_vjp(&|k| attention(&q, k, &v, g, causal, scale).0, &k, &d_o), &format!("{what} dk"));
            assert_close(&dv, &fd_vjp(&|v| attention(&q, &k, v, g, causal, scale).0, &v, &d_o), &format!("{what} dv"));
        }
    }
}
