//! Shape helpers and the tensor-level oracle functions (reductions, scans, contractions,
//! indexing). Values are row-major `Vec<f64>`.

/// Row-major multi-index of flat index `i` in `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d].max(1);
        i /= shape[d].max(1);
    }
    idx
}

/// Flat index of `idx` in `shape`.
pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

/// What gather and index_select read: for each position of an output of shape `out`, the
/// element of `x` (shape `xs`) at that position with its coordinate along `dim` replaced by
/// `index(flat position, coordinates)`.
pub fn take_along(
    x: &[f64],
    xs: &[usize],
    out: &[usize],
    dim: usize,
    index: impl Fn(usize, &[usize]) -> usize,
) -> Vec<f64> {
    (0..out.iter().product())
        .map(|i| {
            let mut at = unravel(i, out);
            at[dim] = index(i, &at);
            x[ravel(&at, xs)]
        })
        .collect()
}

/// The elements of each output position of a reduction over the axes marked in `reduced`,
/// in output row-major order, each group in input row-major order.
pub fn reduce_groups(x: &[f64], shape: &[usize], reduced: &[bool]) -> Vec<Vec<f64>> {
    let out_shape: Vec<usize> = shape.iter().zip(reduced).map(|(&n, &r)| if r { 1 } else { n }).collect();
    let mut groups = vec![Vec::new(); out_shape.iter().product()];
    for (i, &v) in x.iter().enumerate() {
        let mut idx = unravel(i, shape);
        for (d, &r) in reduced.iter().enumerate() {
            if r {
                idx[d] = 0;
            }
        }
        groups[ravel(&idx, &out_shape)].push(v);
    }
    groups
}

/// Neumaier-compensated sum.
pub fn sum(xs: &[f64]) -> f64 {
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for &x in xs {
        let t = s + x;
        c += if s.abs() >= x.abs() { (s - t) + x } else { (x - t) + s };
        s = t;
    }
    s + c
}

/// `a (.., m, k) @ b (.., k, n)` with equal batch dims; also returns `|a| @ |b|`.
pub fn matmul(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut mag) = (vec![0.0; batch * m * n], vec![0.0; batch * m * n]);
    for p in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let terms: Vec<f64> = (0..k).map(|l| a[p * m * k + i * k + l] * b[p * k * n + l * n + j]).collect();
                y[p * m * n + i * n + j] = sum(&terms);
                mag[p * m * n + i * n + j] = terms.iter().map(|t| t.abs()).sum();
            }
        }
    }
    (y, mag)
}

/// Inclusive prefix sums along `dim`, and the prefix sums of absolute values.
pub fn cumsum(x: &[f64], shape: &[usize], dim: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut mag) = (vec![0.0; x.len()], vec![0.0; x.len()]);
    for i in 0..x.len() {
        let mut idx = unravel(i, shape);
        let upto = idx[dim];
        let terms: Vec<f64> = (0..=upto)
            .map(|j| {
                idx[dim] = j;
                x[ravel(&idx, shape)]
            })
            .collect();
        y[i] = sum(&terms);
        mag[i] = terms.iter().map(|t| t.abs()).sum();
    }
    (y, mag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_groups_follow_the_output_order() {
        let x: Vec<f64> = (0..6).map(|v| v as f64).collect();
        assert_eq!(reduce_groups(&x, &[2, 3], &[false, true]), vec![vec![0.0, 1.0, 2.0], vec![3.0, 4.0, 5.0]]);
        assert_eq!(reduce_groups(&x, &[2, 3], &[true, false])[1], vec![1.0, 4.0]);
    }

    #[test]
    fn compensated_sum_recovers_cancellation() {
        assert_eq!(sum(&[1e16, 1.0, -1e16]), 1.0);
    }

    #[test]
    fn matmul_of_identity() {
        let (y, _) = matmul(&[1.0, 0.0, 0.0, 1.0], &[3.0, 4.0, 5.0, 6.0], 1, 2, 2, 2);
        assert_eq!(y, vec![3.0, 4.0, 5.0, 6.0]);
    }
}
