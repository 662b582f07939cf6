//! The f64 reference oracle: naive, obviously correct implementations fed the inputs
//! already rounded to the tested dtype. Vector-Jacobian products of the backward ops live next to
//! their forward functions (`nn`, `conv`) and are checked against finite differences in the
//! unit tests ([`fd`]).

pub mod conv;
pub mod nn;
pub mod scalar;
pub mod tensor;

/// Finite-difference checks of the vector-Jacobian products (unit tests only).
#[cfg(test)]
pub(crate) mod fd {
    use crate::values::Rng;

    /// `<dy, f(x)>` differentiated by central differences in f64 (step 1e-6).
    pub fn fd_vjp(f: &dyn Fn(&[f64]) -> Vec<f64>, x: &[f64], dy: &[f64]) -> Vec<f64> {
        let h = 1e-6;
        (0..x.len())
            .map(|j| {
                let (mut xp, mut xm) = (x.to_vec(), x.to_vec());
                xp[j] += h;
                xm[j] -= h;
                let dot = |y: Vec<f64>| y.iter().zip(dy).map(|(a, b)| a * b).sum::<f64>();
                (dot(f(&xp)) - dot(f(&xm))) / (2.0 * h)
            })
            .collect()
    }

    /// gradcheck's rule: |analytic - numeric| ≤ atol + rtol·|numeric|.
    pub fn assert_close(analytic: &[f64], numeric: &[f64], what: &str) {
        assert_eq!(analytic.len(), numeric.len(), "{what}: length");
        for (i, (a, n)) in analytic.iter().zip(numeric).enumerate() {
            assert!((a - n).abs() <= 1e-5 + 1e-3 * n.abs(), "{what}[{i}]: analytic {a}, finite difference {n}");
        }
    }

    /// `n` standard normals, reproducible from `id`.
    pub fn data(id: &str, n: usize) -> Vec<f64> {
        let mut r = Rng::for_id(id);
        (0..n).map(|_| r.normal()).collect()
    }
}
